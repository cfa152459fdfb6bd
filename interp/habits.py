"""TransformerLens spellings on an interp :class:`~interp.Model`, on every backend.

What a TransformerLens user writes first, working as written:

* weights as attributes, in TransformerLens shapes: ``model.W_U``, ``model.W_E``, ``model.b_U``,
  ``model.blocks[l].attn.W_Q`` (``W_K``, ``W_V``, ``W_O``, ``b_Q`` ...), ``model.blocks[l].mlp.W_in``
  (``W_out``, ``W_gate``, ``b_in``, ``b_out``), ``model.blocks[l].ln1.w`` / ``.ln2.w`` / ``.b``,
  ``model.ln_final.w`` / ``.b``, ``model.W_pos`` (learned position tables); stacked over layers as
  ``model.W_Q`` etc. (grouped key/value heads are repeated to one per query head, as TransformerLens's
  ``W_K``/``W_V`` properties do);
* ``model.OV`` and ``model.QK`` as TransformerLens ``FactoredMatrix`` objects ``[layer, head, d_model, d_model]``
  (``.AB``, ``.eigenvalues``, ``.svd()``, composition scores via ``transformer_lens.utils.composition_scores``);
* ``model.tokens_to_residual_directions(tokens)``, ``model.test_prompt(prompt, answer)``;
* ``return_type="logits" | "loss" | "both" | None`` on ``model(...)``, ``run_with_hooks`` and
  ``run_with_cache`` (see :func:`lm_loss`);
* ``model.embed.W_E``, ``model.unembed.W_U`` / ``.b_U``, ``model.pos_embed.W_pos`` (:class:`Weights`),
  ``model.tl_named_parameters()`` (:func:`tl_named_parameters`), ``model.get_token_position``
  (:func:`get_token_position`), ``model.loss_fn``;
* ``model.hook_dict[name]`` (:class:`HookPoint`: ``.add_hook``, ``.remove_hooks``, ``.layer()``, ``.ctx``),
  ``model.accumulated_bias`` (:func:`accumulated_bias`), ``model.all_head_labels`` (:class:`Labels`).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

#: weights that hang off the model itself (not per layer)
GLOBAL_WEIGHTS = ("W_E", "W_U", "b_U")
ATTN_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
MLP_WEIGHTS = ("W_in", "W_out", "W_gate", "b_in", "b_out")
RETURN_TYPES = ("logits", "loss", "both", None)


def per_query_head(model, name: str) -> torch.Tensor:
    """``weight(name)`` with grouped key/value heads repeated to one per query head (TransformerLens's view)."""
    w = model.weight(name)
    if name in ("W_K", "W_V", "b_K", "b_V") and w.shape[1] != model.cfg.n_heads:
        w = w.repeat_interleave(model.cfg.n_heads // w.shape[1], dim=1)
    return w


class _Component:
    """``model.blocks[l].attn`` / ``.mlp``: the layer's slice of each weight, read on access."""

    def __init__(self, model, layer: int, names: Sequence[str], kind: str) -> None:
        self._model, self._layer, self._names, self._kind = model, layer, names, kind

    def __getattr__(self, name: str) -> torch.Tensor:
        if name.startswith("_") or name not in self._names:
            raise AttributeError(f"blocks[{self._layer}].{self._kind} has no weight {name!r}; "
                                 f"available: {', '.join(self._names)}")
        return per_query_head(self._model, name)[self._layer]

    def __dir__(self):
        return list(self._names)


class _Block:
    def __init__(self, model, layer: int) -> None:
        self.attn = _Component(model, layer, ATTN_WEIGHTS, "attn")
        self.mlp = _Component(model, layer, MLP_WEIGHTS, "mlp")
        self.ln1, self.ln2 = Norm(model, "ln1", layer), Norm(model, "ln2", layer)
        self.layer = layer

    def __repr__(self) -> str:
        return (f"<block {self.layer}: .attn ({', '.join(ATTN_WEIGHTS)}), .mlp ({', '.join(MLP_WEIGHTS)}), "
                ".ln1 / .ln2 (w, b)>")


class Blocks(Sequence):
    """``model.blocks``: ``model.blocks[l].attn.W_Q`` etc. (negative layers count from the end)."""

    def __init__(self, model) -> None:
        self._model = model

    def __len__(self) -> int:
        return self._model.cfg.n_layers

    def __getitem__(self, layer):
        n = len(self)
        if isinstance(layer, slice):
            return [self[i] for i in range(*layer.indices(n))]
        if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
            raise IndexError(f"layer {layer!r} out of range: the model has {n} layers")
        return _Block(self._model, layer % n)


class Norm:
    """``model.ln_final`` / ``model.blocks[l].ln1`` / ``.ln2``: ``.w`` (gain, ``[d_model]``; ones where absent)
    and ``.b`` (bias; zeros for RMSNorm), as :meth:`Model.norm_parts` reads them."""

    def __init__(self, model, which: str, layer: int | None = None) -> None:
        self._model, self._which, self._layer = model, which, layer

    @property
    def w(self) -> torch.Tensor:
        w, _, _ = self._model.norm_parts(self._which, self._layer)
        return w if w is not None else torch.ones(self._model.cfg.d_model)

    @property
    def b(self) -> torch.Tensor:
        _, b, _ = self._model.norm_parts(self._which, self._layer)
        return b if b is not None else torch.zeros(self._model.cfg.d_model)

    def __call__(self, resid: torch.Tensor) -> torch.Tensor:
        """``model.ln_final(resid)``: the final norm applied to ``resid [..., d_model]`` with its own scale (weight
        and bias included), as TransformerLens's module call (the logit lens: ``model.unembed(model.ln_final(x))``)."""
        if self._which != "ln_final":
            raise TypeError(f"model.blocks[{self._layer}].{self._which} holds weights (.w, .b); it is not callable "
                            "(cache.apply_ln_to_stack(stack, layer) applies a block's norm with the run's scale)")
        return self._model.apply_ln_final(resid)

    def __repr__(self) -> str:
        where = self._which if self._layer is None else f"blocks[{self._layer}].{self._which}"
        return f"<{where}: .w, .b>"


class Weights:
    """``model.embed`` / ``model.unembed`` / ``model.pos_embed``: TransformerLens's module attributes that hold
    weights (``model.embed.W_E``, ``model.unembed.W_U`` / ``.b_U``, ``model.pos_embed.W_pos``), read on access."""

    def __init__(self, model, where: str, names: dict[str, str], call=None) -> None:
        self._model, self._where, self._names, self._call = model, where, names, call

    def __call__(self, *args, **kwargs):
        if self._call is None:
            raise TypeError(f"model.{self._where} holds weights ({', '.join(self._names)}); it is not callable")
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> torch.Tensor:
        if name.startswith("_") or name not in self._names:
            raise AttributeError(f"model.{self._where} has no weight {name!r}; available: {', '.join(self._names)}")
        return self._model.weight(self._names[name])

    def __dir__(self):
        return list(self._names)

    def __repr__(self) -> str:
        return f"<model.{self._where}: {', '.join(self._names)}>"


class Labels(list):
    """A list of labels that is also callable (``labels()`` returns it): TransformerLens's ``all_head_labels`` is a
    method on ``HookedTransformer`` and a property on the bridge; both spellings work."""

    def __call__(self) -> list[str]:
        return list(self)


def accumulated_bias(model, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
    """TransformerLens's ``accumulated_bias``: the biases written into the residual stream before ``layer``'s
    attention (``[d_model]``): each earlier layer's ``b_O`` and (``include_mlp_biases``) ``b_out``, plus ``layer``'s
    own ``b_O`` with ``mlp_input`` (the input of its MLP)."""
    n = model.cfg.n_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n:
        raise ValueError(f"accumulated_bias: layer must be in 0..{n}, got {layer!r}")
    if mlp_input and layer == n:
        raise ValueError("accumulated_bias: mlp_input needs a block's layer (0..n_layers-1)")
    b_O = model.weight("b_O").float()  # [L, d]
    total = b_O[:layer + (1 if mlp_input else 0)].sum(0)
    if include_mlp_biases and layer and not model.cfg.attn_only:
        total = total + model.weight("b_out").float()[:layer].sum(0)
    return total.to(b_O.device)


class HookPoint:
    """TransformerLens's hook point object, as ``model.hook_dict[name]`` gives it: ``.name``, ``.layer()``,
    ``.ctx``, ``.add_hook(fn, dir="fwd", is_permanent=False)`` (``model.add_hook(name, ...)``),
    ``.remove_hooks(dir="fwd", including_permanent=False)`` (only this point's hooks; ``dir="both"`` too),
    ``.clear_context()``. Hooks added here run on every later run of the model, as TL's."""

    def __init__(self, model, name: str) -> None:
        self._model, self.name = model, name

    def add_hook(self, hook, dir: str = "fwd", is_permanent: bool = False, level: int | None = None,
                 prepend: bool = False) -> None:
        """TL's ``HookPoint.add_hook``: ``hook(tensor, hook)`` at this point (``dir="bwd"``: on its gradient);
        ``prepend=True`` runs it before the hooks already added here. ``level`` (TL's context level) is not
        supported: anything but ``None`` is refused."""
        if level is not None:
            raise ValueError("HookPoint.add_hook(level=...) (TL's hook context levels) is not supported by interp")
        self._model.add_hook(self.name, hook, dir=dir, is_permanent=is_permanent, prepend=prepend)

    def remove_hooks(self, dir: str = "fwd", including_permanent: bool = False, level: int | None = None) -> None:
        """TL's ``HookPoint.remove_hooks``: remove the hooks added at this point (``dir`` ``"fwd"``, ``"bwd"`` or
        ``"both"``; permanent ones too with ``including_permanent``)."""
        if level is not None:
            raise ValueError("HookPoint.remove_hooks(level=...) (TL's hook context levels) is not supported by interp")
        self._model._remove_hooks(self.name, dir, including_permanent)

    def layer(self) -> int:
        """The block index of this point (TL raises for points outside the blocks; so does this)."""
        from .names import parse

        layer = parse(self.name)[0]
        if layer is None:
            raise ValueError(f"{self.name!r} is not in a block: it has no layer")
        return layer

    @property
    def ctx(self) -> dict:
        """TL's ``hook.ctx``: the dict kept for this point across runs (cleared by ``model.reset_hooks()``)."""
        from collections import defaultdict

        return self._model.__dict__.setdefault("_hook_ctx", defaultdict(dict))[self.name]

    def clear_context(self) -> None:
        self.ctx.clear()

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r})"


def tl_named_parameters(model):
    """``(TransformerLens name, weight in TL shape)`` for each weight the model has (see
    :meth:`interp.Model.tl_named_parameters`); grouped key/value weights as ``_W_K`` / ``_W_V`` where the model
    has fewer key/value heads than query heads (as HookedTransformer names them)."""
    def maybe(name: str):
        try:
            return model.weight(name)
        except KeyError:
            return None

    out = [("embed.W_E", maybe("W_E")), ("pos_embed.W_pos", maybe("W_pos"))]
    grouped = model.cfg.n_kv_heads != model.cfg.n_heads
    stacked = {n: maybe(n) for n in (*ATTN_WEIGHTS, *MLP_WEIGHTS)}
    norms = {n: model.weight(n) for n in ("ln1.w", "ln1.b", "ln2.w", "ln2.b")}
    rms = model.cfg.normalization_type == "RMS"
    for l in range(model.cfg.n_layers):
        for ln in ("ln1", "ln2"):
            out.append((f"blocks.{l}.{ln}.w", norms[f"{ln}.w"][l]))
            if not rms:
                out.append((f"blocks.{l}.{ln}.b", norms[f"{ln}.b"][l]))
        for n in ATTN_WEIGHTS:
            if stacked[n] is not None:
                tl_name = f"_{n}" if grouped and n in ("W_K", "W_V", "b_K", "b_V") else n
                out.append((f"blocks.{l}.attn.{tl_name}", stacked[n][l]))
        for n in MLP_WEIGHTS:
            if stacked[n] is not None:
                out.append((f"blocks.{l}.mlp.{n}", stacked[n][l]))
    out.append(("ln_final.w", model.weight("ln_final.w")))
    if not rms:
        out.append(("ln_final.b", model.weight("ln_final.b")))
    out += [("unembed.W_U", maybe("W_U")), ("unembed.b_U", maybe("b_U"))]
    return iter([(n, t) for n, t in out if t is not None])


def get_token_position(model, single_token, input, mode: str = "first", prepend_bos: bool | None = None,
                       padding_side: str | None = None) -> int:
    """TransformerLens's ``get_token_position`` (see :meth:`interp.Model.get_token_position`)."""
    if mode not in ("first", "last"):
        raise ValueError(f"mode must be 'first' or 'last', got {mode!r}")
    if isinstance(input, str):
        tokens = model.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)
    else:
        tokens = torch.as_tensor(input)
        from .validation import check_token_ids
        check_token_ids(tokens, what="input")
    if tokens.dim() == 2:
        if tokens.shape[0] != 1:
            raise ValueError(f"get_token_position takes one sequence, got a batch of {tokens.shape[0]}")
        tokens = tokens[0]
    if tokens.dim() != 1:
        raise ValueError(f"input tokens must be [pos] or [1, pos], got shape {tuple(tokens.shape)}")
    if isinstance(single_token, str):
        single_token = model.to_single_token(single_token)
    elif isinstance(single_token, torch.Tensor):
        single_token = int(single_token.item())
    elif isinstance(single_token, bool) or not isinstance(single_token, int):
        raise TypeError(f"single_token must be a string or an integer id, got {single_token!r}")
    hits = (tokens == single_token).nonzero().flatten()
    if len(hits) == 0:
        raise ValueError(f"the token {single_token} ({model.to_string(single_token)!r}) is not in the input")
    return int(hits[0] if mode == "first" else hits[-1])


def factored(model, which: str):
    """``OV`` = W_V W_O or ``QK`` = W_Q W_Kᵀ as a TransformerLens ``FactoredMatrix`` ``[layer, head, d, d]``."""
    from transformer_lens import FactoredMatrix

    if which == "OV":
        return FactoredMatrix(per_query_head(model, "W_V"), model.weight("W_O"))
    return FactoredMatrix(model.weight("W_Q"), per_query_head(model, "W_K").transpose(-2, -1))


def tokens_to_residual_directions(model, tokens) -> torch.Tensor:
    """The unembedding direction of each token: ``W_U[:, token]`` (``[d_model]`` for one token, ``[..., d_model]``
    for a tensor of ids); strings are tokenized as one token each."""
    if isinstance(tokens, str):
        tokens = model.to_single_token(tokens)
    from .validation import check_token_ids

    ids = torch.as_tensor(tokens)
    check_token_ids(ids, what="tokens")
    return model.weight("W_U")[:, ids.long()].movedim(0, -1)


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
            per_token: bool = False) -> torch.Tensor:
    """TransformerLens's language-model loss: mean cross-entropy of each next token given the ones before
    (``[batch, pos - 1]`` with ``per_token``); padding (``attention_mask`` 0) is left out of the mean."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, input_ids[:, 1:, None].to(logp.device)).squeeze(-1)
    if per_token:
        return nll
    if attention_mask is None:
        return nll.mean()
    m = (attention_mask[:, 1:] * attention_mask[:, :-1]).to(nll.device, nll.dtype)
    return (nll * m).sum() / m.sum().clamp_min(1)


def shape_output(logits: torch.Tensor, batch: dict, return_type: str | None, per_token: bool = False):
    """``logits``, the loss, both, or ``None``, as ``return_type`` asks (the loss per token, ``[batch, pos - 1]``,
    with ``per_token``: TransformerLens's ``loss_per_token``)."""
    if return_type not in RETURN_TYPES:
        raise ValueError(f"return_type must be one of 'logits', 'loss', 'both' or None, got {return_type!r}")
    if return_type is None:
        return None
    if return_type == "logits":
        return logits
    if "input_ids" not in batch:
        raise ValueError("return_type='loss' needs token inputs (a language model's loss)")
    loss = lm_loss(logits, batch["input_ids"], batch.get("attention_mask"), per_token=per_token)
    return loss if return_type == "loss" else (logits, loss)


def test_prompt(model, prompt: str, answer: str | Sequence[str], prepend_space_to_answer: bool = True,
                top_k: int = 10, print_details: bool = True, prepend_bos: bool | None = None) -> list[dict[str, Any]]:
    """TransformerLens's ``test_prompt``: how the model ranks each answer token after the prompt, and its top
    ``top_k`` next tokens. Returns one dict per answer token (``token``, ``rank``, ``logit``, ``prob``,
    ``top``); prints them like TransformerLens with ``print_details`` (a notebook helper)."""
    answers = [answer] if isinstance(answer, str) else list(answer)
    rows = []
    for ans in answers:
        text = (" " + ans.lstrip()) if prepend_space_to_answer else ans
        prompt_ids = model.to_tokens(prompt, prepend_bos=prepend_bos)[0]
        ans_ids = torch.as_tensor(model.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        ids = torch.cat([prompt_ids, ans_ids])[None]
        logits = model(ids)[0].float()
        for i, tok in enumerate(ans_ids.tolist()):
            row = logits[len(prompt_ids) - 1 + i]
            probs = row.softmax(-1)
            top = probs.topk(top_k)
            rows.append({"token": model.tokenizer.decode([tok]), "rank": int((row > row[tok]).sum()),
                         "logit": float(row[tok]), "prob": float(probs[tok]),
                         "top": [(model.tokenizer.decode([int(t)]), float(p)) for p, t in zip(top.values, top.indices)]})
    if print_details:
        print("Tokenized prompt:", model.to_str_tokens(prompt, prepend_bos=prepend_bos))
        for r in rows:
            print(f"Performance on answer token: Rank: {r['rank']:<8} Logit: {r['logit']:5.2f} Prob: {r['prob']:6.2%} "
                  f"Token: |{r['token']}|")
            for k, (t, p) in enumerate(r["top"]):
                print(f"Top {k}th token. Prob: {p:6.2%} Token: |{t}|")
    return rows


__all__ = ["ATTN_WEIGHTS", "Blocks", "GLOBAL_WEIGHTS", "MLP_WEIGHTS", "Norm", "RETURN_TYPES", "Weights", "factored",
           "get_token_position", "lm_loss", "per_query_head", "shape_output", "test_prompt", "tl_named_parameters",
           "tokens_to_residual_directions"]
