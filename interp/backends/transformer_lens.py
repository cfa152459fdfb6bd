"""The ``transformer_lens`` backend: a TransformerBridge (TL 3.x/4.x) or a HookedTransformer (TL 3.x).

Canonical names are TransformerLens's own names, so hooks map one to one. A bridge is put in
compatibility mode (without weight processing, so its outputs equal the HF model's) to expose the
classic hook names with their classic shapes.
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from functools import partial
from typing import Any

import torch

from ..model import HookSet, Model, ModelConfig
from .hf import _image_size
from ..names import BLOCK_HOOKS, order_key
from ..validation import check_padded_output


#: Where a bridge's compatibility alias means something else than the canonical hook, the canonical
#: tensor is read from another bridge hook point (``None``: not offered). BERT is post-norm: the bridge
#: aliases ``hook_attn_out`` to the attention block's post-LayerNorm output and ``hook_embed`` to the
#: summed embeddings, while TransformerLens's own HookedEncoder (and the other backends) mean the
#: attention output before the residual add and the token embeddings; its ``ln_final`` is the MLM
#: head's transform, not a final norm of the residual stream.
_BRIDGE_ALIASES: dict[str, dict[str, str | None]] = {
    "bert": {"hook_embed": "embed.hook_out", "hook_attn_out": "attn.o.hook_out", "hook_resid_mid": "ln1.hook_out",
             "ln_final.hook_normalized": None, "ln_final.hook_scale": None},
    # OLMo-2/3 blocks are post-norm (x + norm(attn(x))): the bridge's ln1/ln2 are those output norms, not
    # the norms of the attention / MLP inputs that ln1/ln2 mean (the conformance suite's norms check)
    **{family: {f"{ln}.hook_{part}": None for ln in ("ln1", "ln2") for part in ("scale", "normalized")}
       for family in ("olmo2", "olmo3")},
}


#: canonical hooks that TransformerLens computes only while a config flag is on (``set_<flag>(True)``): the
#: flag is switched on for the runs that use them and back off afterwards (their extra cost is paid only then)
_GATED: dict[str, str] = {"attn.hook_result": "use_attn_result"}
_GATED_SUFFIXES = tuple(_GATED)


def _canonical_set(n_layers: int) -> list[str]:
    names = ["hook_embed", "hook_pos_embed"] + [f"blocks.{l}.{h}" for l in range(n_layers) for h in BLOCK_HOOKS]
    return names + ["ln_final.hook_scale", "ln_final.hook_normalized"]


def _gated(name: str) -> str | None:
    """The flag a canonical hook name needs (see ``_GATED``), or ``None``."""
    return _GATED.get(name.split(".", 2)[2]) if name.startswith("blocks.") else None


class TLModel(Model):
    backend = "transformer_lens"

    def __init__(self, tl_model, tokenizer=None, use_own_tokenizer: bool = True) -> None:
        from transformer_lens import HookedTransformer

        self.tl = tl_model.eval()
        self.is_bridge = not isinstance(tl_model, HookedTransformer)
        if self.is_bridge and not getattr(tl_model, "compatibility_mode", False):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tl_model.enable_compatibility_mode(no_processing=True)
        c = tl_model.cfg
        offered = set(tl_model.hook_dict)
        self.hf_model = getattr(tl_model, "original_model", None)
        model_type = getattr(getattr(self.hf_model, "config", None), "model_type", None)
        aliases = _BRIDGE_ALIASES.get(model_type, {}) if not isinstance(tl_model, HookedTransformer) else {}
        #: canonical name -> the TransformerLens hook point that carries it
        self._points: dict[str, str] = {}
        for name in _canonical_set(c.n_layers):
            layer, hook = (name.split(".", 2)[1], name.split(".", 2)[2]) if name.startswith("blocks.") else (None, name)
            alias = aliases.get(hook, hook) if hook in aliases else hook
            if alias is None:
                continue
            point = f"blocks.{layer}.{alias}" if layer is not None else alias
            if point in offered:
                self._points[name] = point
        self._names = sorted(self._points, key=lambda n: order_key(n, c.n_layers))
        #: canonical name -> the name the hook point reports to hook functions (``hook.name``; a bridge alias
        #: such as ``blocks.0.hook_resid_pre`` reports its canonical point ``blocks.0.hook_in``)
        points = tl_model.hook_dict
        self._reported = {n: points[p].name or p for n, p in self._points.items()}
        self._vision = bool(getattr(c, "is_visual_model", False)) or \
            getattr(getattr(tl_model, "original_model", None), "main_input_name", "input_ids") == "pixel_values"
        family = getattr(c, "original_architecture", None) or getattr(c, "architecture", None) or "transformer_lens"
        n_kv = getattr(c, "n_key_value_heads", None) or c.n_heads
        # a bridge booted by interp around a tokenizer-less model holds a placeholder (loading._boot_bridge)
        own = getattr(tl_model, "tokenizer", None) if use_own_tokenizer else None
        super().__init__(tokenizer if tokenizer is not None else own,
                         ModelConfig(str(family), c.n_layers, c.n_heads, n_kv, c.d_model, c.d_head,
                                     getattr(c, "d_vocab", None), not self._vision,
                                     "vision" if self._vision else "text",
                                     _image_size(getattr(self.hf_model, "config", None),
                                                 "vision" if self._vision else "text")))
        self._attention_bridges: list[Any] | None = None  # found on the first cached generation step
        if self.is_bridge:
            self._names = self._firing_names()

    def _firing_names(self) -> list[str]:
        """A bridge declares some hook points that its implementation of an architecture never runs (e.g.
        ``hook_pattern`` where HF computes attention internally); offer only the ones that fire."""
        fired: set[str] = set()
        if self._vision:
            size = getattr(getattr(self.hf_model, "config", None), "image_size", 32)
            probe: Any = torch.zeros(1, 3, size, size, device=self.device)
        else:
            probe = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        names = self._names
        try:  # gated hooks (attn.hook_result) are offered where TransformerLens can compute them
            with self._gates_on(names):
                pass
        except Exception:  # noqa: BLE001 - e.g. an architecture without a per-head attention fork
            names = [n for n in names if _gated(n) is None]
        # one filter hook, as in _forward: a bridge rebuilds its hook_dict for every string hook it is given
        # (one hook per name made loading SmolLM2 take ~20 s, 8x the bridge's own boot)
        by_reported: dict[str, list[str]] = {}
        for n in names:
            by_reported.setdefault(self._reported[n], []).append(n)
        wanted = {self._points[n] for n in names}

        def mark(tensor, hook):
            fired.update(by_reported.get(hook.name, ()))

        with torch.no_grad(), warnings.catch_warnings(), self._gates_on(names):
            warnings.simplefilter("ignore")
            self.tl.run_with_hooks(probe, fwd_hooks=[(wanted.__contains__, mark)])
        return [n for n in self._names if n in fired]

    @contextlib.contextmanager
    def _gates_on(self, names):
        """Switch on, for the block, the TransformerLens flags that the gated hooks among ``names`` need."""
        flags = {f for f in map(_gated, names) if f is not None and not getattr(self.tl.cfg, f, False)}
        turned: list[str] = []
        try:
            for f in sorted(flags):
                getattr(self.tl, f"set_{f}")(True)
                turned.append(f)
            yield
        finally:
            for f in reversed(turned):
                getattr(self.tl, f"set_{f}")(False)

    def _all_hook_names(self) -> list[str]:
        return self._names

    def _why_not_offered(self, hook: str) -> str:
        return "TransformerLens does not offer it (or it never fires) for this architecture"

    def _residual_identities(self) -> bool:
        """Whether the residual identities hold (not in post-norm encoders such as BERT)."""
        model_type = getattr(getattr(self.hf_model, "config", None), "model_type", None)
        return model_type != "bert" and "bert" not in str(self.cfg.family).lower()

    def _final_softcap(self) -> float | None:
        """The final logit soft-capping of the model (TransformerLens's ``output_logits_soft_cap``), or ``None``."""
        cap = getattr(self.tl.cfg, "output_logits_soft_cap", None)
        return float(cap) if cap and cap > 0 else None

    #: Causal LMs generate with a key-value cache here too (see :meth:`Model._generate_ids`): pass 0 reads
    #: the prompt, pass ``k`` only the ``k``-th new token. A HookedTransformer uses its own
    #: ``HookedTransformerKeyValueCache``; a bridge uses the HF model's cache object (a ``DynamicCache``)
    #: read and written by the bridge's own attention components (see :meth:`_cache_kwarg_alias`).
    @property
    def _kv_cache(self) -> bool:  # type: ignore[override]
        return bool(self.cfg.is_causal_lm)

    def parameters(self):
        return self.tl.parameters()

    def named_parameters(self):
        return self.tl.named_parameters()

    def _weight(self, name: str) -> torch.Tensor:
        try:
            w = getattr(self.tl, name)
        except (AttributeError, TypeError):
            w = None
        if isinstance(w, torch.Tensor):
            if name in ("W_U", "b_U") and self.hf_model is not None:  # the head's fixed logit scale (Cohere, Granite)
                from ..weights import _logit_multiplier
                return w.detach() * _logit_multiplier(self.hf_model)
            return w.detach().clone()
        if name == "W_pos":  # a bridge has no W_pos attribute: the table of its position-embedding component
            table = getattr(getattr(self.tl, "pos_embed", None), "weight", None)
            if isinstance(table, torch.Tensor):
                return table.detach().clone()
            raise KeyError("W_pos: this model has no learned position table (rotary or no position embedding)")
        if name.startswith("b_"):  # TransformerLens gives zeros where the architecture has no bias
            ref = {"b_Q": "W_Q", "b_K": "W_K", "b_V": "W_V", "b_O": "W_O", "b_in": "W_in", "b_out": "W_out",
                   "b_U": "W_U"}[name]
            W = self._weight(ref)
            shape = {"b_O": (W.shape[0], W.shape[-1]), "b_out": (W.shape[0], W.shape[-1]),
                     "b_U": (W.shape[-1],)}.get(name, W.shape[:-2] + W.shape[-1:] if name != "b_in" else (W.shape[0], W.shape[-1]))
            return torch.zeros(shape, dtype=W.dtype, device=W.device)
        raise KeyError(f"{name}: this model has no such weight")

    def _final_norm(self):
        mod = getattr(self.tl, "ln_final", None)
        if mod is None:
            raise KeyError("this model has no final norm of the residual stream")
        return self._norm_of(mod)

    def _block_norm(self, layer: int, which: str):
        mod = getattr(self.tl.blocks[layer], which, None)
        if mod is None:
            raise KeyError(f"this model has no {which} norm in its blocks")
        return self._norm_of(mod)

    def _norm_of(self, mod):
        from ..architectures import norm_parts
        orig = getattr(mod, "original_component", None)
        if orig is not None:  # a bridge: the HF norm module it wraps (Gemma's multiplies by 1 + w)
            return norm_parts(orig, 1.0 if "gemma" in self.cfg.family.lower() else 0.0)
        return norm_parts(mod)  # HookedTransformer: its own LayerNorm/RMSNorm (w, b)


    def _max_positions(self) -> int | None:
        """The context length of a learned position table: the HF model's for a bridge (as on the other
        backends), ``cfg.n_ctx`` for a HookedTransformer with standard positional embeddings; ``None`` for
        rotary and other position schemes without a table."""
        if self.hf_model is not None:
            from .hf import hf_max_positions
            return hf_max_positions(self.hf_model)
        c = self.tl.cfg
        n_ctx = getattr(c, "n_ctx", None)
        if getattr(c, "positional_embedding_type", None) == "standard" and isinstance(n_ctx, int) and n_ctx > 0:
            return n_ctx
        return None

    @property
    def device(self) -> torch.device:
        try:
            return next(self.tl.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def _tl_hook(self, by_point: dict[str, list], live: list[bool], grad: bool, tensor: torch.Tensor, hook: Any
                 ) -> torch.Tensor | None:
        """Run our hooks at one TransformerLens hook point. In a graph-keeping run the hooked tensor is always
        handed back as a new tensor object (a view): some bridge hook points give hooks a reshaped or derived
        copy and continue from the hook's return value only (``hook_z``), or only when that value is a
        different object than the one they passed (``ln*.hook_scale/hook_normalized``: identity means "no
        edit" there), so a read would otherwise be off the forward path and its gradient silently zero."""
        if not live[0]:  # left registered by an interruption inside TransformerLens's own removal: inert
            return None
        changed_any = False
        for name, fns in by_point[hook.name]:
            tensor, changed = self._call_hooks(name, tensor, fns)
            changed_any |= changed
        if changed_any:
            return tensor
        return tensor.view_as(tensor) if grad else None

    def _forward(self, batch, hooks: HookSet, stop_at_layer, grad):
        unknown = [n for n in hooks if n not in self._names]
        if unknown:
            from ..names import UnknownHookError, unknown_message
            raise UnknownHookError(unknown_message(unknown[0], self._names))
        # One filter hook instead of one hook per name: a bridge rebuilds its hook_dict (with every alias) for
        # each string hook it is given, which cost ~1 ms per hook per call; the filter needs it once.
        by_point: dict[str, list] = {}
        for n, fns in hooks.items():
            if fns:
                by_point.setdefault(self._reported[n], []).append((n, fns))
        wanted = {self._points[n] for n, fns in hooks.items() if fns}
        live = [True]
        fwd_hooks = [(wanted.__contains__, partial(self._tl_hook, by_point, live, grad))] if wanted else []
        kwargs: dict[str, Any] = {"return_type": "logits", "stop_at_layer": stop_at_layer}
        cached = bool(batch.get("use_cache")) and "input_ids" in batch
        if "pixel_values" in batch:
            inputs = batch["pixel_values"]
        else:
            inputs = batch["input_ids"]
            kwargs["attention_mask"] = batch["attention_mask"]
            if self.is_bridge:
                kwargs["position_ids"] = batch["position_ids"]
        undo: list[Any] = []
        if cached:
            past = batch.get("past_key_values")
            if self.is_bridge:
                kwargs.update(return_type="logits_and_cache", use_cache=True)
                if past is not None:
                    kwargs[self._hf_cache_kwarg] = past
                undo = self._cache_kwarg_alias()
            else:
                if past is None:
                    from transformer_lens import TransformerLensKeyValueCache
                    past = TransformerLensKeyValueCache.init_cache(self.tl.cfg, self.device, inputs.shape[0])
                # a HookedTransformer takes the mask of the new tokens only and appends it to the cache's
                kwargs.update(past_kv_cache=past, attention_mask=batch["attention_mask"][:, -inputs.shape[1]:])
        gates = self._gates_on(hooks) if any(n.endswith(_GATED_SUFFIXES) for n in hooks) else contextlib.nullcontext()
        try:
            with (torch.enable_grad() if grad else torch.no_grad()), warnings.catch_warnings(), gates:
                warnings.simplefilter("ignore")
                out = self.tl.run_with_hooks(inputs, fwd_hooks=fwd_hooks, **kwargs)
        except BaseException:
            live[0] = False
            # an interruption inside TransformerLens's own hook handling can leave hooks registered (ours are
            # inert by the live flag): remove every non-permanent hook, TransformerLens's own reset
            with contextlib.suppress(Exception):
                self.tl.reset_hooks(including_permanent=False)
            raise
        finally:
            live[0] = False
            for h in undo:
                h.remove()
        if stop_at_layer is not None:
            return None
        if not cached:
            self._check_padded_output(out, batch)
            return out
        if self.is_bridge:
            out, past = out
        self._check_cache(past, batch["attention_mask"].shape[1])
        return out, past

    def _check_padded_output(self, out: Any, batch: dict[str, Any]) -> None:
        """The bridge of some families (OPT's) gives fully masked padding rows NaN attention, which then reaches
        the real rows: refused (:func:`interp.validation.check_padded_output`)."""
        check_padded_output(out, batch.get("attention_mask"), "transformer_lens", self.cfg.family,
                            "the bridge's attention over fully padded rows", "use backend='torch' or 'nnsight'")

    @functools.cached_property
    def _hf_cache_kwarg(self) -> str:
        """The HF model's name for the key-value cache argument (transformers >= 5.24: ``cache``)."""
        import inspect
        try:
            params = inspect.signature(self.hf_model.forward).parameters
        except (TypeError, ValueError):
            return "past_key_values"
        return "cache" if "cache" in params else "past_key_values"

    def _cache_kwarg_alias(self) -> list[Any]:
        """Make the bridge's attention components find the HF cache, for one forward; returns the handles.

        A bridge's attention components (compatibility mode or not) recompute attention themselves and
        update the cache in ``_update_kv_cache``, which reads it from ``past_key_values`` (or
        ``layer_past``). transformers 5.24 renamed that argument ``cache``, so the components found no cache:
        they neither stored the prompt's keys and values nor read them back (a 3.9 bridge's own
        ``generate(use_past_kv_cache=True)`` diverges from the HF model's text from the second new token).
        A forward pre-hook on each attention component passes the HF cache under the old name too."""
        if self._hf_cache_kwarg != "cache":
            return []
        from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

        def alias(module, args, kwargs):
            if kwargs.get("past_key_values") is None and kwargs.get("cache") is not None:
                kwargs = dict(kwargs)
                kwargs["past_key_values"] = kwargs.pop("cache")
                return args, kwargs
            return None
        if self._attention_bridges is None:
            self._attention_bridges = [m for m in self.tl.modules() if isinstance(m, AttentionBridge)]
        handles: list[Any] = []
        try:
            for m in self._attention_bridges:
                handles.append(m.register_forward_pre_hook(alias, with_kwargs=True))
        except BaseException:
            for h in handles:
                h.remove()
            raise
        return handles

    def _check_cache(self, past: Any, length: int) -> None:
        """Refuse loudly when a forward did not fill the key-value cache (an architecture whose bridge
        attention keeps no cache would otherwise generate text that ignores the prompt)."""
        if past is None:
            raise RuntimeError("TransformerLens returned no key-value cache for a cached generation step")
        got = past.get_seq_length() if hasattr(past, "get_seq_length") else past[0].past_keys.shape[1]
        if int(got) != int(length):
            raise RuntimeError(f"the TransformerLens key-value cache holds {int(got)} positions after a pass over "
                               f"{length}: this architecture's attention does not keep the cache, so cached "
                               "generation would ignore earlier tokens; use backend='torch' or 'nnsight' to generate")
