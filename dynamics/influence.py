"""Gradient components of next-token training (Rofin, Naghiyev & Hahn, ICLR 2026, "seemingly useless features").

Fix a residual-stream site ``k`` (a hook name such as ``blocks.1.hook_resid_post``) and a position ``i``.
Let ``L = mean_{b, j} L_j`` be the next-token loss (``L_j``: logits at ``j`` predicting token ``j+1``) and
``L^{sg}`` the same loss from a forward in which the single vector ``r_i^k`` is replaced by
``stopgrad(r_i^k)`` (same values, no gradient through it; an out-of-place edit by an ``interp``
intervention). Then (Prop. 3.1)

* ``direct     = ∇ L_i/N − ∇ L_i^{sg}/N``                 (the immediate prediction, through ``r_i^k``),
* ``precached  = ∇ Σ_{j≠i} L_j/N − ∇ Σ_{j≠i} L_j^{sg}/N`` (future losses reaching ``r_i^k`` via attention),
* ``shared     = ∇ L^{sg}``                               (everything that bypasses ``r_i^k``),
* ``full       = ∇ L``,

with ``N`` the number of (row, position) loss terms (``B·(S−1)`` without padding; the official code's
``L_i/(S−1)`` for a batch-mean ``L_i``). Each part is computed by its *own* backward pass (it is not
obtained as a remainder), so ``direct + precached + shared == full`` is a real check of the hooks and
of the capture layer's gradient path, not an identity.

Also here: the myopic attention of Wu et al. (2024) as a ``transformers`` attention implementation
(:func:`register_myopic_attention`), which removes the pre-cached component.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, Mapping

import torch

from interp.results import Result

COMPONENTS = ("direct", "precached", "shared", "full")


# ----------------------------------------------------------------------------------------- result
@dataclasses.dataclass
class GradientDecomposition(Result):
    """The four gradients at one ``(site, position)``; each a dict parameter name -> gradient tensor
    (same shape as the parameter). Index like a dict: ``dec["direct"]``."""

    site: str
    position: int
    direct: dict[str, torch.Tensor]
    precached: dict[str, torch.Tensor]
    shared: dict[str, torch.Tensor]
    full: dict[str, torch.Tensor]
    loss: float

    kind = "gradient_decomposition"

    def __getitem__(self, key: str) -> dict[str, torch.Tensor]:
        if key not in COMPONENTS:
            raise KeyError(f"unknown component {key!r}; one of {COMPONENTS}")
        return getattr(self, key)

    def keys(self):
        return COMPONENTS

    def norm(self, component: str) -> float:
        """Global L2 norm of one component over all parameters."""
        return float(torch.sqrt(sum((g.double() ** 2).sum() for g in self[component].values())))

    def max_abs_error(self) -> float:
        """``max |direct + precached + shared − full|`` over all parameter entries."""
        return max(float((self.direct[n] + self.precached[n] + self.shared[n] - self.full[n]).abs().max())
                   for n in self.full) if self.full else 0.0

    def to_frame(self):
        """One row per (parameter, component): the gradient's L2 norm."""
        import pandas as pd
        rows = [{"parameter": n, "component": c, "norm": float(self[c][n].double().norm())}
                for n in self.full for c in COMPONENTS]
        return pd.DataFrame(rows)

    def figure(self):
        """Grouped bars: per-parameter gradient norm of each component."""
        import plotly.express as px
        fig = px.bar(self.to_frame(), x="parameter", y="norm", color="component", barmode="group",
                     title=f"Gradient components at {self.site}, position {self.position}")
        return fig


# ----------------------------------------------------------------------------------------- core
@contextlib.contextmanager
def _require_grad(params: Mapping[str, torch.Tensor]) -> Iterator[None]:
    frozen = [p for p in params.values() if not p.requires_grad]
    try:
        for p in frozen:
            p.requires_grad_(True)
        yield
    finally:
        for p in frozen:
            p.requires_grad_(False)


def stop_gradient_at(position: int):
    """An intervention ``fn(tensor, ctx)`` that detaches the vector at absolute ``position`` (out of place):
    ``[batch, pos, ...]`` -> same values, no gradient through that position."""
    def fn(t: torch.Tensor, ctx) -> torch.Tensor:
        if t.dim() < 2 or not -t.shape[1] <= position < t.shape[1]:
            raise ValueError(f"stop-gradient position {position} outside the activation's {t.shape[1] if t.dim() > 1 else 0} positions")
        keep = torch.ones(t.shape[1], dtype=torch.bool, device=t.device)
        keep[position] = False
        keep = keep.view(1, -1, *([1] * (t.dim() - 2)))
        return torch.where(keep, t, t.detach())
    return fn


def _per_position_nll(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[batch, pos-1]`` next-token NLL, zero where the pair is not two real tokens."""
    logp = logits[:, :-1].float().log_softmax(-1)
    nll = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return nll * (mask[:, 1:] * mask[:, :-1]).to(nll.dtype)


def decompose_gradient(model, tokens: torch.Tensor, site: str, position: int,
                       attention_mask: torch.Tensor | None = None,
                       params: Mapping[str, torch.Tensor] | None = None) -> GradientDecomposition:
    """Split the gradient of the mean next-token loss on ``tokens`` into direct / pre-cached / shared parts
    with respect to the residual vector at ``(site, position)``.

    Args:
        model: an ``interp`` :class:`~interp.Model` (any backend where gradients flow and ``site`` is writable).
        tokens: ``[batch, seq]`` token ids.
        site: one hook name (e.g. ``"blocks.1.hook_resid_post"``; ``"hook_embed"``-like sites work too).
        position: absolute position ``i`` in ``0..seq-2`` (the loss at ``i`` predicts token ``i+1``); every
            row must have a real token at ``i`` and ``i+1``.
        attention_mask: ``[batch, seq]`` (1 = real token), optional.
        params: name -> parameter tensors to differentiate (default: ``model.parameters()`` named ``p0, p1, ...``
            in order; pass ``dict(hf_model.named_parameters())`` for readable names).
    Returns:
        :class:`GradientDecomposition` with four dicts name -> gradient.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int):
        raise ValueError("tokens must be an integer tensor [batch, seq]")
    S = tokens.shape[1]
    if S < 2:
        raise ValueError(f"tokens need at least 2 positions to have a next-token loss, got {S}")
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position <= S - 2:
        raise ValueError(f"position must be an integer in 0..{S - 2} (seq={S}), got {position!r}")
    names = model.hook_names(site)
    if len(names) != 1:
        raise ValueError(f"site must name exactly one hook, {site!r} matches {len(names)}")
    site = names[0]
    if not model.can_write(site):
        raise ValueError(f"site {site!r} cannot be intervened on by this backend; pick a residual-stream hook")
    mask = torch.ones_like(tokens) if attention_mask is None else attention_mask.to(tokens.device)
    if mask.shape != tokens.shape:
        raise ValueError(f"attention_mask shape {tuple(mask.shape)} != tokens shape {tuple(tokens.shape)}")
    if not bool((mask[:, position] * mask[:, position + 1]).all()):
        raise ValueError(f"every row needs real tokens at positions {position} and {position + 1}")
    if params is None:
        params = {f"p{i}": p for i, p in enumerate(model.parameters()) if p.is_floating_point()}
    if not params:
        raise ValueError("no parameters to differentiate")
    names_p, tensors = list(params), list(params.values())

    with _require_grad(params):
        nll = _per_position_nll(model.forward_with_grad(tokens, attention_mask=mask), tokens, mask)
        with model.intervene({site: stop_gradient_at(position)}):
            nll_sg = _per_position_nll(model.forward_with_grad(tokens, attention_mask=mask), tokens, mask)
        n = (mask[:, 1:] * mask[:, :-1]).sum().clamp_min(1).to(nll.dtype)
        total, total_sg = nll.sum() / n, nll_sg.sum() / n
        imm, imm_sg = nll[:, position].sum() / n, nll_sg[:, position].sum() / n
        scalars = {"direct": imm - imm_sg, "precached": (total - imm) - (total_sg - imm_sg),
                   "shared": total_sg, "full": total}
        out = {}
        for c, s in scalars.items():
            gs = torch.autograd.grad(s, tensors, retain_graph=True, allow_unused=True)
            out[c] = {nm: (torch.zeros_like(p) if g is None else g).detach() for nm, p, g in zip(names_p, tensors, gs)}
    return GradientDecomposition(site=site, position=position, loss=float(total.detach()), **out)


# ----------------------------------------------------------------------------------------- myopic attention
def myopic_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention with myopic gradients (Wu et al. 2024): the forward values equal ordinary attention,
    but the keys and values of *other* positions enter detached, so the loss at ``j`` sends no gradient into
    the computation at positions ``< j``; only the diagonal (self) term keeps its key/value gradient.

    ``query`` ``[B, H, Q, D]``, ``key``/``value`` ``[B, H(kv), K, D]`` -> ``([B, Q, H, D], [B, H, Q, K])``.
    Grouped key/value heads are repeated to the query heads.
    """
    B, H, Q, D = query.shape
    if key.shape[1] != H:
        rep = H // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    K = key.shape[-2]
    scaling = D ** -0.5 if scaling is None else scaling
    qpos = torch.arange(Q, device=query.device)[:, None] + (K - Q)
    kpos = torch.arange(K, device=query.device)[None, :]
    diag = kpos == qpos                                                  # [Q, K]
    off = (query @ key.detach().transpose(-1, -2)) * scaling
    self_term = (query * key[..., K - Q:, :]).sum(-1, keepdim=True) * scaling   # [B, H, Q, 1], live key
    scores = torch.where(diag, self_term, off)
    scores = scores.masked_fill(kpos > qpos, float("-inf"))
    if attention_mask is not None:
        m = attention_mask[..., -K:]
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m
    probs = scores.softmax(-1, dtype=torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype)
    probs = probs.to(value.dtype)
    if dropout and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    p_diag = (probs * diag).sum(-1, keepdim=True)
    out = torch.where(diag, 0.0, probs) @ value.detach() + p_diag * value[..., K - Q:, :]
    return out.transpose(1, 2).contiguous(), probs


def register_myopic_attention(name: str = "myopic") -> str:
    """Register :func:`myopic_attention` with ``transformers`` (attention and mask interfaces) under ``name``;
    then ``config._attn_implementation = name`` (or ``model.set_attn_implementation(name)``) makes an HF
    model (GPT-2, Llama, ...) train myopically. Returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    AttentionInterface.register(name, myopic_attention)
    AttentionMaskInterface.register(name, eager_mask)
    return name
