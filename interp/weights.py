"""Weights in TransformerLens shapes, the same on every backend.

=========  =========================================  ===================================================
name       shape                                      meaning
=========  =========================================  ===================================================
W_E        ``[d_vocab, d_model]``                     token embedding
W_pos      ``[n_ctx, d_model]``                       learned position table (GPT-2, BERT; rotary models have
                                                      none: a ``KeyError`` says so)
W_U, b_U   ``[d_model, d_vocab]``, ``[d_vocab]``      unembedding (``logits = x @ W_U + b_U``)
W_Q, b_Q   ``[layer, head, d_model, d_head]``, ...    query projection per head
W_K, W_V   ``[layer, kv_head, d_model, d_head]``      key/value projections (``kv_head = n_kv_heads``
                                                      under grouped-query attention, as in the bridge)
W_O, b_O   ``[layer, head, d_head, d_model]``, ...    output projection per head
W_in       ``[layer, d_model, d_mlp]``                MLP input (the linear branch of a gated MLP)
W_gate     ``[layer, d_model, d_mlp]``                gate branch of a gated MLP (Llama, Gemma)
W_out      ``[layer, d_mlp, d_model]``                MLP output
ln1.w      ``[layer, d_model]`` (``ln1.b``, ``ln2.w``,  gain and bias of each block's norms (ones / zeros where
           ``ln2.b`` alike)                           absent; Gemma's ``1 + w`` included)
ln_final.w ``[d_model]`` (``ln_final.b`` alike)       the final norm's gain and bias
=========  =========================================  ===================================================

Missing biases are zeros of the right shape (as TransformerLens does). The tensors are detached
copies in the model's dtype: editing them does not edit the model (use :meth:`Model.add_to_weight`, or
:meth:`Model.project_out_of_residual_writers`, on the HF backends).
"""
from __future__ import annotations

import torch
from torch import nn

from .architectures import qkv_columns

#: norm gains and biases (read through :meth:`Model.norm_parts`, the same on every backend)
NORM_WEIGHT_NAMES = ("ln1.w", "ln1.b", "ln2.w", "ln2.b", "ln_final.w", "ln_final.b")
WEIGHT_NAMES = ("W_E", "W_pos", "W_U", "b_U", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O",
                "W_in", "b_in", "W_gate", "W_out", "b_out", *NORM_WEIGHT_NAMES)


def _is_conv1d(mod: nn.Module) -> bool:
    """GPT-2's ``Conv1D`` stores ``weight`` as ``[in, out]`` (a Linear stores ``[out, in]``)."""
    return type(mod).__name__ == "Conv1D"


def _w_in_out(mod: nn.Module) -> torch.Tensor:
    """The weight as ``[in, out]``."""
    return mod.weight if _is_conv1d(mod) else mod.weight.T


def _logit_multiplier(hf: nn.Module) -> float:
    """The fixed factor a family's LM head multiplies its logits by: Cohere's ``logit_scale``, Granite's
    ``1 / logits_scaling`` (1 elsewhere), so that ``logits = x @ W_U + b_U`` holds on every family."""
    cfg = getattr(hf, "config", None)
    scale = getattr(hf, "logit_scale", None) if "cohere" in str(getattr(cfg, "model_type", "")) else None
    if isinstance(scale, (int, float)):
        return float(scale)
    div = getattr(cfg, "logits_scaling", None)
    return 1.0 / float(div) if isinstance(div, (int, float)) and div else 1.0


def _bias(mod: nn.Module, n: int, like: torch.Tensor) -> torch.Tensor:
    b = getattr(mod, "bias", None)
    return b if b is not None else torch.zeros(n, dtype=like.dtype, device=like.device)


def hf_weight(model, name: str) -> torch.Tensor:
    """``name`` (see the module table) of a model on an HF backend, from its modules and ``spec``."""
    spec, hf = model.spec, model.hf_model
    L, H, Hkv, dh, d = spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head, spec.d_model
    blk = lambda l, p: hf.get_submodule(f"{spec.blocks}.{l}.{p}")  # noqa: E731
    if name == "W_E":
        if spec.embed is None:
            raise KeyError("this model has no token embedding")
        emb = hf.get_submodule(spec.embed)
        emb = emb if isinstance(emb, nn.Embedding) else hf.get_input_embeddings()
        return emb.weight.detach().clone()
    if name == "W_pos":
        if spec.pos_embed is None:
            raise KeyError("W_pos: this model has no learned position table (rotary or no position embedding)")
        return hf.get_submodule(spec.pos_embed).weight.detach().clone()
    if name in ("W_U", "b_U"):
        head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
        if head is None:
            raise KeyError(f"{name}: this model has no unembedding (language-model head)")
        w = head.weight.detach()
        scale = _logit_multiplier(hf)  # logits = (x @ W_U + b_U) including the head's fixed scale
        return w.T * scale if name == "W_U" else _bias(head, w.shape[0], w).detach() * scale

    def qkv(l: int, which: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``([d_model, heads * d_head], [heads * d_head])`` of q (0), k (1) or v (2)."""
        if spec.qkv_layout == "split":
            mod = blk(l, (spec.q, spec.k, spec.v)[which])
            w = _w_in_out(mod)
            return w, _bias(mod, w.shape[1], w)
        mod = blk(l, spec.qkv)
        w = _w_in_out(mod)
        b = _bias(mod, w.shape[1], w)
        cols = qkv_columns(spec.qkv_layout, which, H, Hkv, dh).to(w.device)  # fused layouts (architectures.py)
        return w[:, cols], b[cols]

    out: list[torch.Tensor] = []
    for l in range(L):
        if name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
            which = "QKV".index(name[-1])
            w, b = qkv(l, which)
            heads = H if which == 0 else Hkv
            out.append(w.unflatten(1, (heads, dh)).permute(1, 0, 2) if name[0] == "W" else b.unflatten(0, (heads, dh)))
        elif name in ("W_O", "b_O"):
            mod = blk(l, spec.o)
            w = _w_in_out(mod)  # [H * dh, d]
            out.append(w.unflatten(0, (H, dh)) if name == "W_O" else _bias(mod, d, w))
        elif name in ("W_in", "b_in", "W_gate", "W_out", "b_out"):
            path = {"W_in": spec.mlp_in, "b_in": spec.mlp_in, "W_out": spec.mlp_out, "b_out": spec.mlp_out,
                    "W_gate": spec.mlp_gate_path}[name]
            if path is None:
                raise KeyError(f"{name}: this architecture has no such MLP weight")
            mod = blk(l, path)
            w = _w_in_out(mod)
            out.append(w if name.startswith("W") else _bias(mod, w.shape[1], w))
        else:
            raise KeyError(f"unknown weight {name!r}; choose one of {', '.join(WEIGHT_NAMES)}")
    return torch.stack([t.detach() for t in out]).clone()


__all__ = ["NORM_WEIGHT_NAMES", "WEIGHT_NAMES", "hf_weight"]
