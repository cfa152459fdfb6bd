"""Interventions: small composable objects that rewrite an activation during a forward pass.

Every intervention is called as ``fn(tensor, ctx) -> tensor`` on the canonical tensor of a hook
(``[batch, pos, d]``, ``[batch, pos, head, d_head]`` or ``[batch, head, q, k]``); any plain callable with
that signature is an intervention too. ``positions`` select sequence positions of the current pass
(negative indices count from the end; indices outside the pass are skipped, so ``positions=[-1]``
means "the last position" also during cached generation). ``heads`` restrict head-indexed hooks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .names import HEAD_AXIS, parse

InterventionFn = Callable[[torch.Tensor, "HookContext"], "torch.Tensor | None"]


@dataclass
class HookContext:
    """What an intervention knows about the activation it receives."""

    name: str
    attention_mask: torch.Tensor | None = None  # [batch, pos] of the current pass, when known
    pass_index: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def layer(self) -> int | None:
        return parse(self.name)[0]

    @property
    def hook(self) -> str:
        return parse(self.name)[1]

    @property
    def head_axis(self) -> int | None:
        return HEAD_AXIS.get(self.hook)

    @property
    def pos_axis(self) -> int:
        return 2 if self.hook == "attn.hook_pattern" else 1


def _index(tensor: torch.Tensor, ctx: HookContext, positions: Sequence[int] | None,
           heads: Sequence[int] | None) -> tuple:
    """An index tuple selecting ``positions`` and ``heads`` of ``tensor`` (``slice(None)`` elsewhere)."""
    idx: list[Any] = [slice(None)] * tensor.dim()
    if positions is not None:
        n = tensor.shape[ctx.pos_axis]
        pos = [p if p >= 0 else n + p for p in positions]
        idx[ctx.pos_axis] = torch.tensor([p for p in pos if 0 <= p < n], dtype=torch.long, device=tensor.device)
    if heads is not None:
        if ctx.head_axis is None:
            raise ValueError(f"heads={list(heads)} given for {ctx.name!r}, which has no head axis "
                             f"(head-indexed hooks: {', '.join(HEAD_AXIS)})")
        idx[ctx.head_axis] = torch.as_tensor(list(heads), dtype=torch.long, device=tensor.device)
    tensors = [i for i, x in enumerate(idx) if isinstance(x, torch.Tensor)]
    if len(tensors) == 2:  # two advanced indices must broadcast against each other
        a, b = tensors
        idx[a] = idx[a].view(-1, *([1] * (b - a)))
    return tuple(idx)


def _apply(tensor: torch.Tensor, ctx: HookContext, positions, heads,
           fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    if positions is None and heads is None:
        return fn(tensor)
    idx = _index(tensor, ctx, positions, heads)
    out = tensor.clone()
    out[idx] = fn(tensor[idx]).to(tensor.dtype)
    return out


def _check_vector(vec: torch.Tensor, tensor: torch.Tensor, ctx: HookContext, what: str) -> torch.Tensor:
    vec = vec.to(device=tensor.device, dtype=tensor.dtype)
    trailing = tuple(tensor.shape[2:]) if ctx.hook != "attn.hook_pattern" else tuple(tensor.shape[3:])
    try:
        torch.broadcast_shapes(vec.shape, tensor.shape)
    except RuntimeError:
        raise ValueError(f"{what} of shape {tuple(vec.shape)} does not broadcast to {ctx.name!r}, whose "
                         f"activation is {tuple(tensor.shape)}; expected a vector of shape {trailing} "
                         f"(or anything broadcastable to {tuple(tensor.shape)})") from None
    return vec


class Intervention:
    """Base class; subclasses implement ``__call__(tensor, ctx)``. Compose with ``a + b`` (a then b)."""

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:  # pragma: no cover
        raise TypeError("Intervention subclasses implement __call__")

    def __add__(self, other: InterventionFn) -> "Compose":
        return Compose([self, other])


class Compose(Intervention):
    """Apply several interventions in order."""

    def __init__(self, steps: Sequence[InterventionFn]):
        self.steps = list(steps)

    def __call__(self, tensor, ctx):
        for step in self.steps:
            out = step(tensor, ctx)
            tensor = tensor if out is None else out
        return tensor


class Add(Intervention):
    """Add ``scale * vector`` (broadcast over batch and positions) at ``positions`` / ``heads``."""

    def __init__(self, vector: torch.Tensor, scale: float = 1.0, positions: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None):
        self.vector = torch.as_tensor(vector)
        self.scale, self.positions, self.heads = float(scale), positions, heads

    def __call__(self, tensor, ctx):
        target = tensor[_index(tensor, ctx, self.positions, self.heads)] if (self.positions or self.heads) else tensor
        vec = _check_vector(self.vector, target, ctx, "Add vector") * self.scale
        return _apply(tensor, ctx, self.positions, self.heads, lambda t: t + vec)


class Scale(Intervention):
    """Multiply the activation by ``factor`` (a number or a broadcastable tensor)."""

    def __init__(self, factor: float | torch.Tensor, positions: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None):
        self.factor, self.positions, self.heads = factor, positions, heads

    def __call__(self, tensor, ctx):
        f = self.factor
        if isinstance(f, torch.Tensor):
            f = _check_vector(f, tensor, ctx, "Scale factor")
        return _apply(tensor, ctx, self.positions, self.heads, lambda t: t * f)


class Ablate(Intervention):
    """Zero-ablate, or mean-ablate with the mean taken from ``mean_from`` (a Cache or a tensor).

    The mean is over batch and positions of the cached activation (padding excluded when the cache was
    captured with an attention mask passed as ``mask``), so it has the shape of one position.
    """

    def __init__(self, method: str = "zero", mean_from=None, positions: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None, mask: torch.Tensor | None = None):
        if method not in ("zero", "mean"):
            raise ValueError(f"Ablate method must be 'zero' or 'mean', got {method!r}")
        if method == "mean" and mean_from is None:
            raise ValueError("Ablate('mean') needs mean_from=<Cache or tensor>")
        self.method, self.mean_from, self.positions, self.heads, self.mask = method, mean_from, positions, heads, mask

    def _mean(self, ctx: HookContext) -> torch.Tensor:
        src = self.mean_from
        if isinstance(src, torch.Tensor):
            return src
        if ctx.hook == "attn.hook_pattern":
            raise ValueError("mean ablation of attention patterns is not defined; ablate hook_z instead")
        return src.mean(ctx.name, self.mask)

    def __call__(self, tensor, ctx):
        if self.method == "zero":
            return _apply(tensor, ctx, self.positions, self.heads, torch.zeros_like)
        mean = self._mean(ctx)
        mean = _check_vector(mean, tensor, ctx, "mean")
        if self.heads is not None and ctx.head_axis is not None:
            mean = mean[torch.as_tensor(list(self.heads), device=mean.device)] if mean.dim() == 2 else mean
        return _apply(tensor, ctx, self.positions, self.heads, lambda t: torch.zeros_like(t) + mean)


class ProjectOut(Intervention):
    """Remove the components along ``directions`` (``[d]`` or ``[k, d]``) from the last axis.

    The directions are orthonormalised (QR) first, so several directions are removed jointly:
    ``x <- x - (x Q) Q^T``.
    """

    def __init__(self, directions: torch.Tensor, positions: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None):
        d = torch.as_tensor(directions, dtype=torch.float32)
        if d.dim() == 1:
            d = d[None]
        if d.dim() != 2:
            raise ValueError(f"ProjectOut directions must be [d] or [k, d], got {tuple(d.shape)}")
        q, _ = torch.linalg.qr(d.T)  # [d, k]
        self.basis = q
        self.positions, self.heads = positions, heads

    def __call__(self, tensor, ctx):
        if tensor.shape[-1] != self.basis.shape[0]:
            raise ValueError(f"ProjectOut directions have dimension {self.basis.shape[0]}, but {ctx.name!r} "
                             f"has last axis {tensor.shape[-1]} (activation {tuple(tensor.shape)})")
        q = self.basis.to(tensor.device, torch.float32)

        def project(t):
            tf = t.float()
            return (tf - (tf @ q) @ q.T).to(t.dtype)
        return _apply(tensor, ctx, self.positions, self.heads, project)


class Patch(Intervention):
    """Replace the activation with the one stored in ``cache`` (same hook name) at ``positions``/``heads``.

    ``cache`` is a :class:`~interp.Cache` (from another run) or a tensor. Shapes must match the current
    activation, except that a single source example (batch 1) is broadcast over the batch.
    """

    def __init__(self, cache, positions: Sequence[int] | None = None, heads: Sequence[int] | None = None):
        self.cache, self.positions, self.heads = cache, positions, heads

    def __call__(self, tensor, ctx):
        src = self.cache if isinstance(self.cache, torch.Tensor) else self.cache[ctx.name]
        src = src.to(device=tensor.device, dtype=tensor.dtype)
        if src.shape != tensor.shape:
            if src.shape[1:] == tensor.shape[1:] and src.shape[0] == 1:
                src = src.expand_as(tensor)
            else:
                raise ValueError(f"Patch source for {ctx.name!r} has shape {tuple(src.shape)}, but the "
                                 f"activation is {tuple(tensor.shape)}; expected the same shape "
                                 "(or batch 1 to broadcast)")
        if self.positions is None and self.heads is None:
            return src.clone()
        idx = _index(tensor, ctx, self.positions, self.heads)
        out = tensor.clone()
        out[idx] = src[idx]
        return out
