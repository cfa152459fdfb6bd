"""Shared base of the backends that run a Hugging Face module (torch hooks and nnsight)."""
from __future__ import annotations

import contextlib
from collections import defaultdict
from functools import partial
from typing import Any, Iterator

import torch
from torch import nn

from ..architectures import ArchSpec, NormLens, Site, arch_spec, norm_parts
from ..model import HookSet, Model, ModelConfig, _Opened
from ..names import parse
from ..run import current_pass
from ..validation import check_padded_output
from .attention import ImplSwitch, Slots


def _image_size(hf_cfg: Any, modality: str) -> int | None:
    """A vision config's ``image_size`` as one int (None for text models or when the config has none)."""
    size = getattr(hf_cfg, "image_size", None) if modality == "vision" else None
    if isinstance(size, (tuple, list)):
        size = size[0]
    return int(size) if isinstance(size, int) else None


class HFModel(Model):
    """A Model over a ``transformers`` module with an :class:`ArchSpec` locating the canonical hooks."""

    def __init__(self, hf_model: nn.Module, tokenizer=None, spec: ArchSpec | None = None) -> None:
        self.hf_model = hf_model.eval()
        self.spec = spec or arch_spec(hf_model)
        self.sites: dict[str, Site] = self.spec.sites()
        hf_cfg = getattr(hf_model, "config", None)
        vocab = getattr(hf_cfg, "vocab_size", None) if hf_cfg is not None else None
        is_lm = hasattr(hf_model, "get_output_embeddings") and hf_model.get_output_embeddings() is not None \
            and self.spec.family not in ("bert", "esm")  # masked LMs: no generation
        modality = "vision" if self.spec.family in ("vit", "dinov2") else "text"
        super().__init__(tokenizer, ModelConfig(self.spec.family, self.spec.n_layers, self.spec.n_heads,
                                                self.spec.n_kv_heads, self.spec.d_model, self.spec.d_head,
                                                vocab, bool(is_lm), modality, _image_size(hf_cfg, modality)))

    #: causal LMs generate with the key-value cache (see Model._generate_ids)
    @property
    def _kv_cache(self) -> bool:  # type: ignore[override]
        return bool(self.cfg.is_causal_lm)

    def _all_hook_names(self) -> list[str]:
        return list(self.sites)

    def _why_not_offered(self, hook: str) -> str:
        spec = self.spec
        if hook.startswith("attn.hook_rot") and not spec.rotary:
            return "the model has no rotary position embeddings"
        if hook.startswith(("attn.hook_rot", "attn.hook_attn_scores", "attn.hook_pattern")) and not spec.attention_hooks:
            return ("its attention module computes attention inline, not through transformers' attention interface "
                    "where this backend reads it")
        if hook.startswith("mlp.") and spec.mlp_out is None:
            return "its MLP is a mixture of experts (no single hidden layer)"
        if hook == "hook_resid_mid" and spec.parallel:
            return "attention and MLP run in parallel from the same residual stream (there is no resid_mid)"
        if hook.startswith(("ln1.", "ln2.")):
            return f"its blocks have no {hook.split('.')[0]} (pre-)norm"
        return super()._why_not_offered(hook)

    def _residual_identities(self) -> bool:
        """Whether ``resid_mid = resid_pre + attn_out`` etc. hold (not in post-norm encoders such as BERT)."""
        return self.spec.resid_mid_from is None

    def _final_softcap(self) -> float | None:
        """Gemma-2/3's final logit soft-capping (``tanh(x / c) * c``), or ``None``."""
        cap = getattr(getattr(self.hf_model, "config", None), "final_logit_softcapping", None)
        return float(cap) if cap else None

    def parameters(self):
        return self.hf_model.parameters()

    def named_parameters(self):
        return self.hf_model.named_parameters()

    def _weight(self, name: str) -> torch.Tensor:
        from ..weights import hf_weight
        return hf_weight(self, name)

    @torch.no_grad()
    def add_to_weight(self, name: str, layer: int, delta: torch.Tensor) -> None:
        """See :meth:`interp.Model.add_to_weight`."""
        mod, current = self._edit_target(name, layer)
        delta = torch.as_tensor(delta)
        if tuple(delta.shape) != tuple(current.shape):
            raise ValueError(f"delta for {name}[{layer}] has shape {tuple(delta.shape)}; expected {tuple(current.shape)}")
        if not bool(torch.isfinite(delta).all()):
            raise ValueError(f"delta for {name}[{layer}] has non-finite entries")
        if name.startswith("b_"):
            _add_rounded_once(mod.bias, delta)
            return
        d = delta.flatten(0, 1) if name == "W_O" else delta  # W_O [H, d_head, d] -> [H * d_head, d] = [in, out]
        _add_rounded_once(mod.weight, d if type(mod).__name__ == "Conv1D" else d.T)  # weights are read as [in, out]

    @torch.no_grad()
    def write_weight_rows(self, name: str, layer: int, rows: torch.Tensor, values: torch.Tensor) -> None:
        """See :meth:`interp.Model.write_weight_rows`."""
        mod, current = self._edit_target(name, layer)
        rows = torch.as_tensor(rows)
        if rows.dim() != 1 or rows.dtype in (torch.bool, torch.float16, torch.float32, torch.float64, torch.bfloat16):
            raise ValueError(f"rows must be a 1-D tensor of integer indices, got {rows.dtype} {tuple(rows.shape)}")
        rows = rows.long()
        n = current.shape[0] if name != "W_O" else current.shape[0] * current.shape[1]
        if rows.numel() and not (0 <= int(rows.min()) and int(rows.max()) < n):
            raise IndexError(f"rows of {name}[{layer}] must lie in 0..{n - 1}")
        if rows.unique().numel() != rows.numel():
            raise ValueError(f"rows of {name}[{layer}] must not repeat")
        tail = tuple(current.shape[2:] if name == "W_O" else current.shape[1:])
        values = torch.as_tensor(values)
        if tuple(values.shape) != (rows.numel(), *tail):
            raise ValueError(f"values for {rows.numel()} rows of {name}[{layer}] have shape {tuple(values.shape)}; "
                             f"expected {(rows.numel(), *tail)}")
        if values.dtype != current.dtype:
            raise TypeError(f"values for {name}[{layer}] are {values.dtype}; the weight is {current.dtype} (rows are "
                            "written as given, never rounded: cast them first)")
        if name.startswith("b_"):
            mod.bias.index_copy_(0, rows.to(mod.bias.device), values.to(mod.bias.device))
            return
        w = mod.weight  # TransformerLens [in, out] is Conv1D's own layout and nn.Linear's transpose
        if type(mod).__name__ == "Conv1D":
            w.index_copy_(0, rows.to(w.device), values.to(w.device))
        else:
            w.index_copy_(1, rows.to(w.device), values.to(w.device).T)

    def _edit_target(self, name: str, layer: int) -> tuple[nn.Module, torch.Tensor]:
        """The module holding ``weight(name)[layer]`` for :meth:`add_to_weight` / :meth:`write_weight_rows`,
        and that weight now (TransformerLens shape); refuses names, layers and missing biases clearly."""
        spec = self.spec
        paths = {"W_in": spec.mlp_in, "b_in": spec.mlp_in, "W_gate": spec.mlp_gate_path, "W_out": spec.mlp_out,
                 "b_out": spec.mlp_out, "W_O": spec.o, "b_O": spec.o}
        if name not in paths or paths[name] is None:
            raise KeyError(f"weight edits support {', '.join(k for k, v in paths.items() if v)} on this "
                           f"architecture, not {name!r}")
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < spec.n_layers:
            raise ValueError(f"layer must be an integer in 0..{spec.n_layers - 1}, got {layer!r}")
        mod = self.hf_model.get_submodule(f"{spec.blocks}.{layer}.{paths[name]}")
        if name.startswith("b_") and getattr(mod, "bias", None) is None:
            raise KeyError(f"{name}: this architecture's module has no bias to edit")
        return mod, self._weight(name)[layer]

    @torch.no_grad()
    def project_out_of_residual_writers(self, direction: torch.Tensor) -> list[str]:
        """See :meth:`interp.Model.project_out_of_residual_writers`."""
        spec, hf = self.spec, self.hf_model
        if spec.attn_out_norm or spec.mlp_out_norm or spec.resid_mid_from:
            raise ValueError(f"{spec.family!r} normalises or rescales sub-layer outputs before the residual add "
                             "(post-norms / layer scale), so editing the weights is not equivalent to ablating "
                             "the direction from the residual stream; ablate activations instead")
        r = torch.as_tensor(direction, dtype=torch.float32).detach().cpu()
        if r.shape != (spec.d_model,):
            raise ValueError(f"direction has shape {tuple(r.shape)}, expected [{spec.d_model}]")
        if r.norm() == 0 or not bool(torch.isfinite(r).all()):
            raise ValueError("direction must be finite and non-zero")
        r_hat = r / r.norm()
        edited: list[str] = []
        out_emb = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
        if out_emb is not None and spec.embed is not None:
            in_emb = hf.get_submodule(spec.embed)
            if getattr(out_emb, "weight", None) is not None and out_emb.weight is getattr(in_emb, "weight", None):
                # the final norm's gain can rotate an r_hat-free residual back onto r_hat: keep W_U as it is
                out_emb.weight = nn.Parameter(out_emb.weight.detach().clone(), requires_grad=out_emb.weight.requires_grad)
                for c in {id(c): c for c in (hf.config, getattr(hf.config, "get_text_config", lambda: None)())
                          if c is not None}.values():
                    if hasattr(c, "tie_word_embeddings"):
                        c.tie_word_embeddings = False
                edited.append("(untied output embedding)")
        prefix = spec.blocks + "."
        for path, module in hf.named_modules():
            if isinstance(module, nn.Embedding) and module.embedding_dim == spec.d_model \
                    and not path.startswith(prefix) and module is not out_emb:
                w = module.weight
                wf, rr = w.float(), r_hat.to(w.device)
                w.copy_((wf - (wf @ rr)[:, None] * rr[None, :]).to(w.dtype))
                edited.append(path)
        for layer in range(spec.n_layers):
            for sub in (spec.o, spec.mlp_out):
                path = f"{spec.blocks}.{layer}.{sub}"
                _project_output_off(hf.get_submodule(path), r_hat)
                edited.append(path)
        return edited

    def can_write(self, name: str) -> bool:
        return all(self.sites[n].lens.writable if n in self.sites else True for n in self._resolve(name))

    def _final_norm(self):
        if not self.spec.ln_final:
            raise KeyError(f"this {self.spec.family} model has no final norm of the residual stream")
        return norm_parts(self.hf_model.get_submodule(self.spec.ln_final), self.spec.norm_offset)

    def _block_norm(self, layer: int, which: str):
        path = self.spec.ln1 if which == "ln1" else self.spec.ln2
        if not path:
            raise KeyError(f"this {self.spec.family} model has no {which} norm in its blocks")
        return norm_parts(self.hf_model.get_submodule(f"{self.spec.blocks}.{layer}.{path}"), self.spec.norm_offset)


    def _max_positions(self) -> int | None:
        return hf_max_positions(self.hf_model)

    @property
    def device(self) -> torch.device:
        try:
            return next(self.hf_model.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def _float_dtype(self) -> torch.dtype:
        for p in self.hf_model.parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.float32

    # ------------------------------------------------------------------ helpers for subclasses
    def _groups(self, hooks: HookSet) -> dict[tuple[str, str], list[tuple[str, Site, list]]]:
        """Hooks grouped by (module path, "input"/"output"), in canonical order within a group (sites inside
        the attention function are left out: :meth:`_attention_slots` installs those)."""
        groups: dict[tuple[str, str], list] = defaultdict(list)
        for name in self.sites:
            if name in hooks and hooks[name]:
                site = self.sites[name]
                if site.io != "attention":
                    groups[(site.module, site.io)].append((name, site, hooks[name]))
        unknown = [n for n in hooks if n not in self.sites]
        if unknown:
            from ..names import UnknownHookError, unknown_message
            raise UnknownHookError(unknown_message(unknown[0], list(self.sites)))
        return groups

    def _apply(self, entries: list[tuple[str, Site, list]], raw: Any, pass_ctx=None, module=None,
               inp: Any = None) -> tuple[Any, bool]:
        """Run the hook functions of one module call on its raw input/output value (``module`` and its
        first input ``inp`` are needed by derived sites such as ``ln1.hook_normalized``)."""
        changed_any = False
        scale = None  # a norm's hooked (edited, or in the graph) hook_scale: its hook_normalized divides by it, as TL's
        for name, site, fns in entries:
            lens = site.lens
            if isinstance(lens, NormLens) and lens.part == "normalized":
                t = lens.get_io(module, inp, raw, scale)
            else:
                t = lens.get_io(module, inp, raw) if site.needs_input else lens.get(raw)
            if site.token_rows:  # [batch * pos, ...] rows (OPT's MLP half): hooks see [batch, pos, ...]
                t = t.unflatten(0, (self._pass_batch(name, pass_ctx), -1))
            version = _version(t)
            t, changed = self._call_hooks(name, t, fns, lens.writable, pass_ctx)
            # a hook that edited the tensor in place and returned None (TransformerLens allows it) changed it too:
            # a lens that copies (fused q/k/v columns, scaled outputs) must then write it back
            changed = changed or _version(t) != version
            # with a graph, the forward continues from the hooked tensor itself (a lens view such as the
            # per-head z, or a derived tensor such as hook_result, is otherwise off the path and its
            # gradient would be zero)
            changed = changed or (lens.writable and t.requires_grad and torch.is_grad_enabled())
            if changed and isinstance(lens, NormLens) and lens.part == "scale":
                scale = t
            if changed:
                if site.token_rows:
                    t = t.flatten(0, 1)
                raw = lens.set_io(module, inp, raw, t) if site.needs_input else lens.set(raw, t)
                changed_any = True
        return raw, changed_any

    def _pass_batch(self, name: str, pass_ctx=None) -> int:
        """The batch size of the running pass (to unflatten a site whose module sees token rows)."""
        ctx = pass_ctx or current_pass(self)
        mask = getattr(ctx, "attention_mask", None)
        if mask is None:
            raise RuntimeError(f"{name!r} is computed on flattened token rows in the {self.spec.family} model, and "
                               "this forward pass was not run through the interp Model (no batch shape known): run "
                               "it with model(...) / model.run_with_cache(...)")
        return int(mask.shape[0])

    def _output(self, out: Any, batch: dict[str, Any] | None = None) -> Any:
        if batch is not None and batch.get("use_cache"):
            return out.logits, getattr(out, "past_key_values", None) or getattr(out, "cache", None)
        if hasattr(out, "logits") and out.logits is not None:
            if batch is not None:
                impl = getattr(self.hf_model.config, "_attn_implementation", None)
                check_padded_output(out.logits, batch.get("attention_mask"), self.backend, self.cfg.family,
                                    f"Hugging Face's {impl} attention over fully padded rows",
                                    "load with attn_implementation='sdpa'")
            return out.logits
        if hasattr(out, "last_hidden_state"):
            return out.last_hidden_state
        return out[0] if isinstance(out, (tuple, list)) else out

    def _kwargs(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        if "pixel_values" in batch:
            return {"pixel_values": batch["pixel_values"]}
        kw = dict(batch)
        if self.spec.family == "bert":
            kw["token_type_ids"] = torch.zeros_like(kw["input_ids"])
        kw["use_cache"] = bool(batch.get("use_cache", False))
        past = kw.pop("past_key_values", None)
        if past is not None:  # transformers >= 5.24 names it ``cache``; older versions ``past_key_values``
            kw["cache" if self._accepts("cache") else "past_key_values"] = past
        if not self._accepts("position_ids"):
            kw.pop("position_ids", None)
        return kw

    def _submodule(self, path: str) -> nn.Module:
        """``hf_model.get_submodule(path)`` through the ``_modules`` dicts directly (always current; about
        5x cheaper than ``get_submodule``'s attribute lookups, which cost ~60 us per hook per forward)."""
        mod = self.hf_model
        try:
            for part in path.split("."):
                mod = mod._modules[part]
        except KeyError:
            return self.hf_model.get_submodule(path)
        return mod

    def _accepts(self, kwarg: str) -> bool:
        """Whether the HF model's forward takes ``kwarg`` (memoised per forward function: ``inspect.signature``
        costs ~0.1 ms, paid on every forward before)."""
        fwd = self.hf_model.forward
        key = (getattr(fwd, "__func__", fwd), kwarg)
        memo = self.__dict__.setdefault("_accepts_memo", {})
        if key not in memo:
            import inspect
            try:
                memo[key] = kwarg in inspect.signature(fwd).parameters
            except (TypeError, ValueError):
                memo[key] = False
        return memo[key]

    def _attention_hooks(self, hooks: HookSet) -> list[str]:
        return [n for n in hooks if hooks[n] and n in self.sites and self.sites[n].io == "attention"]

    def _attention_modules(self, layer: int) -> list[nn.Module]:
        """The attention module of ``layer`` and every module inside it (the attention function is called
        with the module that calls the interface: ``self_attn``, BERT's ``attention.self``, ...)."""
        cache = self.__dict__.setdefault("_attn_modules", {})
        if layer not in cache:
            cache[layer] = list(self.hf_model.get_submodule(f"{self.spec.blocks}.{layer}.{self.spec.attn}").modules())
        return cache[layer]

    def _foreign(self, run) -> bool:
        """Whether hooks installed for ``run`` must stay out of the current forward: ``run`` a
        :class:`~interp.run.Run` -- a pass that is not that run's; ``run`` an open context -- a forward in a
        thread that did not open it (or after it closed); ``None`` -- never."""
        if run is None:
            return False
        if isinstance(run, _Opened):
            return not run.visible()
        p = current_pass(self)
        return p is None or p.run is not run

    def _attention_install(self, hooks: HookSet, run=None, pass_ctx=None) -> tuple["ImplSwitch", "Slots"]:
        """The hooks of ``attn.hook_rot_q/rot_k/attn_scores/pattern`` (see :mod:`interp.backends.attention`): a
        switch of the model to the hook-calling attention implementation, and the per-module dispatch of
        the hooks (both not yet entered; ``enter()`` / ``remove()``). Nothing to switch when none is hooked."""
        names = self._attention_hooks(hooks)
        if not names:
            return ImplSwitch(None), Slots(())
        by_layer: dict[int, dict[str, tuple[str, list, bool]]] = defaultdict(dict)
        for n in names:
            layer, hook = parse(n)
            by_layer[layer][hook.rsplit("hook_", 1)[1]] = (n, hooks[n], self.sites[n].lens.writable)

        def dispatch(table, kind: str, t: torch.Tensor):
            entry = table.get(kind)
            if entry is None or self._foreign(run):
                return None
            new, changed = self._call_hooks(entry[0], t, entry[1], entry[2], pass_ctx)
            return new if changed else None
        items = [(m, partial(dispatch, table)) for layer, table in by_layer.items()
                 for m in self._attention_modules(layer)]
        return ImplSwitch(self.hf_model), Slots(items)

    @contextlib.contextmanager
    def _attention_hooks_installed(self, hooks: HookSet, run=None, pass_ctx=None) -> Iterator[None]:
        switch, slots = self._attention_install(hooks, run, pass_ctx)
        try:
            switch.enter()
            slots.enter()
            yield
        finally:
            try:
                slots.remove()
            finally:
                switch.remove()

    def _sweep_hooks(self, fns: list[Any]) -> None:
        """Remove the hook functions ``fns`` wherever they are still registered on the module tree (an
        interruption can land between registering a hook and recording its handle)."""
        ids = {id(f) for f in fns}
        for m in self.hf_model.modules():
            for d in (m._forward_hooks, m._forward_pre_hooks):
                for k in [k for k, fn in d.items() if id(fn) in ids]:
                    d.pop(k, None)


def _version(t: torch.Tensor) -> int:
    """The in-place version counter of ``t`` (-1 for inference-mode tensors, which keep none)."""
    try:
        return t._version
    except RuntimeError:
        return -1


def hf_max_positions(hf_model: Any) -> int | None:
    """The longest input a Hugging Face model's learned position table takes (``n_positions`` /
    ``max_position_embeddings``), or ``None`` when it has none to run off the end of (rotary embeddings)."""
    c = getattr(hf_model, "config", None)
    if c is None or getattr(c, "rope_theta", None) is not None or getattr(c, "rope_parameters", None):
        return None
    for key in ("n_positions", "max_position_embeddings"):
        v = getattr(c, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _project_output_off(module: nn.Module, r_hat: torch.Tensor) -> None:
    """Make the OUTPUT of a linear map orthogonal to ``r_hat`` (``nn.Linear``: ``W [out, in]``; GPT-2
    ``Conv1D``: ``W [in, out]``), bias included."""
    w = module.weight
    r = r_hat.to(w.device, torch.float32)
    wf = w.float()
    if type(module).__name__ == "Conv1D":  # y = x W + b
        w.copy_((wf - (wf @ r)[:, None] * r[None, :]).to(w.dtype))
    elif isinstance(module, nn.Linear):
        w.copy_((wf - r[:, None] * (r @ wf)[None, :]).to(w.dtype))
    else:
        raise TypeError(f"cannot project the output of a {type(module).__name__} (expected nn.Linear or Conv1D)")
    b = getattr(module, "bias", None)
    if b is not None:
        bf = b.float()
        b.copy_((bf - (bf @ r) * r).to(b.dtype))


def _add_rounded_once(param: torch.Tensor, delta: torch.Tensor) -> None:
    """``param += delta`` in place. A float64 ``delta`` is added at float64 and rounded once to the parameter's
    dtype, so ``add(saved.double() - now.double())`` restores ``saved`` up to float64 round-off (``|d| · 2⁻⁵³``),
    where ``w + d - d`` in float32 drifts by ``|d| · 2⁻²⁴`` per entry, which large edits make visible."""
    if delta.dtype == torch.float64 and param.dtype != torch.float64:
        param.copy_((param.double() + delta).to(param.dtype))
    else:
        param.add_(delta.to(param))
