"""The activation cache: canonical keys, detached tensors, stacking helpers."""
from __future__ import annotations

import fnmatch
from typing import Iterator, Mapping

import torch

from .names import UnknownHookError, expand, parse, unknown_message


class Cache(Mapping[str, torch.Tensor]):
    """Activations keyed by canonical hook name.

    Each forward pass that a capture sees adds one entry per hook. ``cache[name]`` returns the
    tensor of a single pass, or the passes concatenated along the batch axis (axis 0) when there were
    several with matching shapes (e.g. several batches); use :meth:`passes` to keep them apart (e.g. the
    steps of ``generate``, whose sequence lengths differ).
    """

    def __init__(self, data: Mapping[str, list[torch.Tensor]] | None = None) -> None:
        self._data: dict[str, list[torch.Tensor]] = {k: list(v) for k, v in (data or {}).items()}

    # -- filling
    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._data.setdefault(name, []).append(tensor)

    def clear(self) -> None:
        self._data.clear()

    # -- mapping protocol
    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._data:
            raise UnknownHookError(unknown_message(name, list(self._data)) if self._data else
                                   f"{name!r} is not in this cache (it is empty)")
        parts = self._data[name]
        if len(parts) == 1:
            return parts[0]
        shapes = {tuple(p.shape[1:]) for p in parts}
        if len(shapes) != 1:
            raise ValueError(f"{name!r} was captured in {len(parts)} passes of different shapes "
                             f"{sorted(shapes)}; use cache.passes({name!r})")
        return torch.cat(parts, dim=0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {tuple(v[0].shape)}" + (f" x{len(v)}" if len(v) > 1 else "")
                          for k, v in self._data.items())
        return f"Cache({inner})"

    def passes(self, name: str) -> list[torch.Tensor]:
        """The tensors of ``name``, one per forward pass, in the order they ran."""
        if name not in self._data:
            raise UnknownHookError(unknown_message(name, list(self._data)))
        return list(self._data[name])

    # -- helpers
    def stack(self, pattern: str) -> torch.Tensor:
        """Stack a per-layer hook over layers: ``cache.stack("hook_resid_post")`` -> ``[layer, ...]``.

        ``pattern`` is a block-hook suffix or a glob over the cache's keys; layers are sorted.
        """
        names = [n for n in self._data if fnmatch.fnmatchcase(n, pattern)
                 or fnmatch.fnmatchcase(n, f"blocks.*.{pattern}")]
        if not names:
            raise UnknownHookError(unknown_message(pattern, list(self._data)))
        names.sort(key=lambda n: (parse(n)[0] if parse(n)[0] is not None else -1, n))
        return torch.stack([self[n] for n in names])

    def select(self, patterns) -> "Cache":
        """A new cache with only the keys matching ``patterns``."""
        keep = expand(patterns, list(self._data))
        return Cache({k: self._data[k] for k in keep})

    def to(self, device=None, dtype=None) -> "Cache":
        return Cache({k: [t.to(device=device, dtype=dtype if t.is_floating_point() else None) for t in v]
                      for k, v in self._data.items()})

    def mean(self, name: str, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mean of ``cache[name]`` over batch and positions.

        ``mask`` (``[batch, pos]``, 1 = real token) excludes padding; it must match the activation's
        batch and position axes (``[batch, pos, ...]``, or ``[batch, head, q, k]`` for patterns, whose
        query axis is used), otherwise a ``ValueError`` says what was expected.
        """
        t = self[name]
        if mask is None:
            return t.float().mean(dim=tuple(range(min(2, t.dim() - 1)))).to(t.dtype)
        hook = parse(name)[1]
        pos_axis = 2 if hook in ("attn.hook_pattern", "attn.hook_attn_scores") else 1
        if t.dim() < 3 or (t.shape[0], t.shape[pos_axis]) != tuple(mask.shape):
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not match {name!r}, whose activation is "
                             f"{tuple(t.shape)}; expected [batch, pos] = "
                             f"{(t.shape[0], t.shape[pos_axis]) if t.dim() >= 3 else 'n/a (no position axis)'}")
        t = t.movedim(pos_axis, 1)
        m = mask.to(t.device, torch.float32).reshape(*mask.shape, *([1] * (t.dim() - 2)))
        return ((t.float() * m).sum((0, 1)) / m.sum((0, 1)).clamp_min(1)).to(t.dtype)
