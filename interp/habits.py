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
  ``run_with_cache`` (see :func:`lm_loss`).
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

    def __repr__(self) -> str:
        where = self._which if self._layer is None else f"blocks[{self._layer}].{self._which}"
        return f"<{where}: .w, .b>"


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
    ids = torch.as_tensor(tokens, dtype=torch.long)
    return model.weight("W_U")[:, ids].movedim(0, -1)


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


def shape_output(logits: torch.Tensor, batch: dict, return_type: str | None):
    """``logits``, the loss, both, or ``None``, as ``return_type`` asks."""
    if return_type not in RETURN_TYPES:
        raise ValueError(f"return_type must be one of 'logits', 'loss', 'both' or None, got {return_type!r}")
    if return_type is None:
        return None
    if return_type == "logits":
        return logits
    if "input_ids" not in batch:
        raise ValueError("return_type='loss' needs token inputs (a language model's loss)")
    loss = lm_loss(logits, batch["input_ids"], batch.get("attention_mask"))
    return loss if return_type == "loss" else (logits, loss)


def test_prompt(model, prompt: str, answer: str | Sequence[str], prepend_space_to_answer: bool = True,
                top_k: int = 10, print_details: bool = True) -> list[dict[str, Any]]:
    """TransformerLens's ``test_prompt``: how the model ranks each answer token after the prompt, and its top
    ``top_k`` next tokens. Returns one dict per answer token (``token``, ``rank``, ``logit``, ``prob``,
    ``top``); prints them like TransformerLens with ``print_details`` (a notebook helper)."""
    answers = [answer] if isinstance(answer, str) else list(answer)
    rows = []
    for ans in answers:
        text = (" " + ans.lstrip()) if prepend_space_to_answer else ans
        prompt_ids = model.to_tokens(prompt)[0]
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
        print("Tokenized prompt:", model.to_str_tokens(prompt))
        for r in rows:
            print(f"Performance on answer token: Rank: {r['rank']:<8} Logit: {r['logit']:5.2f} Prob: {r['prob']:6.2%} "
                  f"Token: |{r['token']}|")
            for k, (t, p) in enumerate(r["top"]):
                print(f"Top {k}th token. Prob: {p:6.2%} Token: |{t}|")
    return rows


__all__ = ["ATTN_WEIGHTS", "Blocks", "GLOBAL_WEIGHTS", "MLP_WEIGHTS", "Norm", "RETURN_TYPES", "factored",
           "lm_loss", "per_query_head", "shape_output", "test_prompt", "tokens_to_residual_directions"]
