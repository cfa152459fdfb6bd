"""Interventions: small composable objects that rewrite an activation during a forward pass.

Every intervention is called as ``fn(tensor, ctx) -> tensor`` on the canonical tensor of a hook
(``[batch, pos, d]``, ``[batch, pos, head, d_head]`` or ``[batch, head, q, k]``); any plain callable with
that signature is an intervention too. ``positions`` select sequence positions row by row: negative
indices count back from each row's last real (non-padding) token, so ``[-1]`` is the last real token
with left or right padding alike, and during cached generation the new token of each pass;
non-negative indices are absolute positions in the padded sequence (see
:meth:`HookContext.position_mask`). ``heads`` restrict head-indexed hooks. Constructors validate their
arguments (integer positions and heads, real finite vectors and scales) and refuse bad ones at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from .names import HEAD_AXIS, parse

InterventionFn = Callable[[torch.Tensor, "HookContext"], "torch.Tensor | None"]


class LayerIndex(int):
    """An ``int`` that can also be called (``ctx.layer`` and TransformerLens's ``hook.layer()`` both work)."""

    def __call__(self) -> int:
        return int(self)


@dataclass
class HookContext:
    """What an intervention knows about the activation it receives (built per hook call from the pass).

    ``attention_mask`` is the mask of the positions this pass computes, ``[batch, pos]`` matching the
    activation's position axis (``None`` for images). ``key_mask`` is the mask of the whole sequence
    so far, ``[batch, past_length + pos]`` (they differ during cached generation). ``pass_index`` counts
    the passes of the current run (a plain forward: 0; ``generate``: 0 for the prompt, ``k`` for the
    ``k``-th new token), ``past_length`` the positions already in the key-value cache.
    """

    name: str
    attention_mask: torch.Tensor | None = None
    pass_index: int = 0
    past_length: int = 0
    key_mask: torch.Tensor | None = None
    generating: bool = False
    run_id: int = -1
    extra: dict[str, Any] = field(default_factory=dict)
    #: TransformerLens's ``hook.ctx``: a dict kept per hook name across calls (``model.reset_hooks()`` clears it)
    ctx: dict[str, Any] = field(default_factory=dict)

    @property
    def layer(self) -> "LayerIndex | None":
        """The hook's layer (``None`` outside the blocks); also callable, ``hook.layer()``, as TransformerLens's
        hook points spell it."""
        layer = parse(self.name)[0]
        return None if layer is None else LayerIndex(layer)

    @property
    def hook(self) -> str:
        return parse(self.name)[1]

    @property
    def head_axis(self) -> int | None:
        return HEAD_AXIS.get(self.hook)

    @property
    def pos_axis(self) -> int:
        return 2 if self.hook in ("attn.hook_pattern", "attn.hook_attn_scores") else 1

    def position_mask(self, tensor: torch.Tensor, positions: Sequence[int]) -> torch.Tensor:
        """Boolean ``[batch, pos]``: which positions of this pass ``positions`` select, row by row.

        Negative positions count back from the last real (non-padding) token of each row, so ``-1`` is
        each row's last real token with left or right padding alike; during cached generation the pass
        holds only the new token, which is then the last real token. Non-negative positions are
        absolute indices into the (padded) token axis of the whole sequence, ``past_length`` included;
        positions outside this pass select nothing.
        """
        batch, n = tensor.shape[0], tensor.shape[self.pos_axis]
        dev = tensor.device
        pos = torch.as_tensor(list(positions), dtype=torch.long, device=dev)  # [k]
        idx = torch.arange(n, device=dev)
        mask = self.attention_mask
        if mask is not None and tuple(mask.shape) == (batch, n):
            real = mask.to(dev).bool()
            last = torch.where(real.any(1), (real.long() * (idx + 1)).amax(1) - 1, torch.full((batch,), -10**9, device=dev))
        else:
            real = torch.ones(batch, n, dtype=torch.bool, device=dev)
            last = torch.full((batch,), n - 1, device=dev)
        neg = pos < 0
        want = torch.where(neg[None], last[:, None] + 1 + pos[None], (pos - self.past_length)[None].expand(batch, -1))
        hit = want[:, :, None] == idx[None, None]  # [batch, k, pos]
        # a position counted back from the last real token never lands on (left) padding
        return (hit & ~neg[None, :, None]).any(1) | ((hit & neg[None, :, None]).any(1) & real)


def check_positions(positions, what: str = "positions") -> tuple[int, ...] | None:
    """Validate ``positions``/``heads``: ``None`` or a list/tuple/range of ints (bools refused)."""
    if positions is None:
        return None
    if isinstance(positions, (int, torch.Tensor)) and not isinstance(positions, bool) and \
            (not isinstance(positions, torch.Tensor) or positions.dim() == 0):
        raise TypeError(f"{what} must be a list of integers, e.g. [{int(positions)}], not a single "
                        f"{type(positions).__name__}")
    if isinstance(positions, torch.Tensor):
        positions = positions.tolist()
    if isinstance(positions, (str, bytes)) or not isinstance(positions, (list, tuple, range)):
        raise TypeError(f"{what} must be a list of integers, got {type(positions).__name__}: {positions!r}")
    out = []
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, (int,)) and not (hasattr(p, "__index__") and not isinstance(p, float)):
            raise TypeError(f"{what} must be integers, got {p!r} ({type(p).__name__}) in {list(positions)!r}")
        out.append(int(p))
    if not out:
        raise ValueError(f"{what} is empty; pass None to select every {what[:-1]}")
    return tuple(out)


def check_tensor(value, what: str) -> torch.Tensor:
    """A real, finite floating tensor (refuses complex, bool/int-free NaN/inf input with a clear message)."""
    t = torch.as_tensor(value)
    if t.is_complex():
        raise TypeError(f"{what} must be real, got a complex tensor ({t.dtype})")
    if t.dtype == torch.bool:
        raise TypeError(f"{what} must be numeric, got a bool tensor")
    t = t if t.is_floating_point() else t.float()
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{what} has {int((~torch.isfinite(t)).sum())} non-finite entries (NaN or inf)")
    return t


def check_number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not (isinstance(value, torch.Tensor) and value.dim() == 0):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}: {value!r}")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{what} must be finite, got {v}")
    return v


def resolve_heads(heads: Sequence[int], n_heads: int, where: str = "this hook") -> tuple[int, ...]:
    """Head indices as non-negative ones: negative indices count from the end, as Python indexing does
    (``-1`` is the last head); an index outside ``-n_heads..n_heads-1`` is an ``IndexError`` naming the range."""
    bad = [h for h in heads if not -n_heads <= h < n_heads]
    if bad:
        raise IndexError(f"head index {bad[0]} out of range for {where!r}, which has {n_heads} heads "
                         f"(valid: -{n_heads}..{n_heads - 1}; negative indices count from the last head)")
    return tuple(h % n_heads for h in heads)


def _select(tensor: torch.Tensor, ctx: HookContext, positions, heads):
    """``(view, put)``: the selected entries of ``tensor`` and a function writing new values back.

    The view has the selected positions flattened with the batch (``[k, ...]``, head axis first after
    it when the hook has one) and ``heads`` picked on the head axis."""
    if positions is None and heads is None:
        return tensor, lambda new: new
    if heads is not None and ctx.head_axis is None:
        raise ValueError(f"heads={list(heads)} given for {ctx.name!r}, which has no head axis "
                         f"(head-indexed hooks: {', '.join(HEAD_AXIS)})")
    if heads is not None:
        heads = resolve_heads(heads, tensor.shape[ctx.head_axis], ctx.name)
    moved = tensor.movedim(ctx.pos_axis, 1)  # [batch, pos, ...]; pattern: [batch, q, head, k]
    sel = ctx.position_mask(tensor, positions) if positions is not None else None
    hidx = None if heads is None else torch.as_tensor(list(heads), dtype=torch.long, device=tensor.device)

    def view(t: torch.Tensor) -> torch.Tensor:
        m = t.movedim(ctx.pos_axis, 1)
        m = m[sel] if sel is not None else m.flatten(0, 1)  # [k, ...] with the head axis at 1
        return m.index_select(1, hidx) if hidx is not None else m

    def put(new: torch.Tensor) -> torch.Tensor:
        out = moved.clone()
        flat = out[sel] if sel is not None else out.flatten(0, 1).clone()
        if hidx is not None:
            flat[:, hidx] = new.to(tensor.dtype)
        else:
            flat = new.to(tensor.dtype)
        if sel is not None:
            out[sel] = flat
        else:
            out = flat.unflatten(0, moved.shape[:2])
        return out.movedim(1, ctx.pos_axis)

    return view, put


def _apply(tensor: torch.Tensor, ctx: HookContext, positions, heads,
           fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    if positions is None and heads is None:
        return fn(tensor)
    view, put = _select(tensor, ctx, positions, heads)
    return put(fn(view(tensor)))


def _check_vector(vec: torch.Tensor, tensor: torch.Tensor, ctx: HookContext, what: str) -> torch.Tensor:
    vec = vec.to(device=tensor.device, dtype=tensor.dtype)
    try:
        torch.broadcast_shapes(vec.shape, tensor.shape)
    except RuntimeError:
        raise ValueError(f"{what} of shape {tuple(vec.shape)} does not broadcast to {ctx.name!r} (selected "
                         f"activation {tuple(tensor.shape)}); expected a vector of shape "
                         f"{tuple(tensor.shape[-1:])}") from None
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
        self.vector = check_tensor(vector, "Add vector")
        if self.vector.dim() == 0:
            raise ValueError("Add vector must have at least one axis (the activation's last axis); "
                             "use Scale for a scalar factor")
        self.scale = check_number(scale, "Add scale")
        self.positions, self.heads = check_positions(positions), check_positions(heads, "heads")

    def __call__(self, tensor, ctx):
        def add(t):
            return t + _check_vector(self.vector, t, ctx, "Add vector") * self.scale
        return _apply(tensor, ctx, self.positions, self.heads, add)


class Scale(Intervention):
    """Multiply the activation by ``factor`` (a number or a broadcastable tensor)."""

    def __init__(self, factor: float | torch.Tensor, positions: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None):
        if isinstance(factor, torch.Tensor) and factor.dim() > 0:
            self.factor: float | torch.Tensor = check_tensor(factor, "Scale factor")
        else:
            self.factor = check_number(factor, "Scale factor")
        self.positions, self.heads = check_positions(positions), check_positions(heads, "heads")

    def __call__(self, tensor, ctx):
        def scale(t):
            f = self.factor
            return t * (_check_vector(f, t, ctx, "Scale factor") if isinstance(f, torch.Tensor) else f)
        return _apply(tensor, ctx, self.positions, self.heads, scale)


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
        if isinstance(mean_from, torch.Tensor):
            mean_from = check_tensor(mean_from, "Ablate mean")
        self.method, self.mean_from, self.mask = method, mean_from, mask
        self.positions, self.heads = check_positions(positions), check_positions(heads, "heads")

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
        mean = self._mean(ctx).to(tensor.device, tensor.dtype)
        if self.heads is not None and ctx.head_axis is not None and mean.dim() == 2:
            heads = resolve_heads(self.heads, mean.shape[0], ctx.name)
            mean = mean[torch.as_tensor(list(heads), device=mean.device)]
        return _apply(tensor, ctx, self.positions, self.heads,
                      lambda t: torch.zeros_like(t) + _check_vector(mean, t, ctx, "mean"))


class ProjectOut(Intervention):
    """Remove the components along ``directions`` (``[d]`` or ``[k, d]``) from the last axis.

    The span of the directions is projected out jointly, ``x <- x - (x Q) Q^T`` with ``Q`` an orthonormal
    basis of the span (from an SVD). Linearly dependent directions (``[v, 2v]``) are dropped: singular
    values below ``rtol`` times the largest count as zero, so the projection removes exactly the span
    and never an arbitrary extra direction (``self.rank`` says how many remain). Zero and non-finite
    directions are refused.
    """

    def __init__(self, directions: torch.Tensor, positions: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None, rtol: float = 1e-5):
        d = check_tensor(directions, "ProjectOut directions").to(torch.float64)
        if d.dim() == 1:
            d = d[None]
        if d.dim() != 2 or d.shape[1] == 0:
            raise ValueError(f"ProjectOut directions must be [d] or [k, d], got {tuple(d.shape)}")
        norms = d.norm(dim=1)
        zero = (norms == 0).nonzero().flatten().tolist()
        if zero:
            raise ValueError(f"ProjectOut direction {zero[0]} is the zero vector; it has no direction to remove")
        u, sv, _ = torch.linalg.svd(d.T, full_matrices=False)  # d.T: [d, k]
        keep = sv > rtol * sv.max()
        self.basis = u[:, keep].to(torch.float32)  # [d, rank]
        self.rank = int(keep.sum())
        self.positions, self.heads = check_positions(positions), check_positions(heads, "heads")

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
    activation, except that a single source example (batch 1) is broadcast over the batch. Positions
    are selected on the *current* run's rows (negative ones from each row's last real token) and the
    source is read at the same places.
    """

    def __init__(self, cache, positions: Sequence[int] | None = None, heads: Sequence[int] | None = None):
        if isinstance(cache, torch.Tensor):
            cache = check_tensor(cache, "Patch source")
        elif not isinstance(cache, Mapping):
            raise TypeError(f"Patch source must be a Cache or a tensor, got {type(cache).__name__}")
        self.cache = cache
        self.positions, self.heads = check_positions(positions), check_positions(heads, "heads")

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
        view, put = _select(tensor, ctx, self.positions, self.heads)
        return put(view(src))
