"""Input checks shared by the capture layer's entry points (token-id dtypes, devices).

A leaf module of the kernel: it imports only torch, so :mod:`interp.model`, :mod:`interp.cache`,
:mod:`interp.habits` and :mod:`interp.patching` can all use the same rule without importing one another
(``interp.model`` re-exports these names).
"""
from __future__ import annotations

from typing import Any

import torch


class TokenIdsError(TypeError, ValueError):
    """Token ids of a dtype that is not an integer (a ``TypeError``, and a ``ValueError`` as the input checks'
    other refusals)."""


def check_token_ids(ids: Any, what: str = "token ids") -> None:
    """The one rule for token-id dtypes, at every entry point (model calls, ``run_with_cache``, ``generate``,
    ``gradients``, patching, ``pad_token_ids``, ``loss_fn``, ``tokens_to_residual_directions``, ...): ids are an
    integer tensor; bool, float and complex tensors are refused in one line (a bool tensor would otherwise index
    tokens 0 and 1, a float one fail deep inside the embedding)."""
    t = ids if isinstance(ids, torch.Tensor) else None
    if t is None:
        return
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        kind = "bool" if t.dtype == torch.bool else str(t.dtype).replace("torch.", "")
        images = " (float inputs of shape [batch, channel, height, width] are images)" if t.is_floating_point() else ""
        raise TokenIdsError(f"{what} must be an integer tensor (torch.long), got {kind} of shape {tuple(t.shape)}{images}; "
                        "convert with .long() if these are ids")


def check_device(device: Any) -> torch.device | None:
    """``device=`` of a run, checked before any forward: a torch device that exists here (``"cpu"``, ``"cuda"``,
    ``"cuda:1"``, ``"mps"`` ...), else one line saying so. ``None`` stays ``None``."""
    if device is None:
        return None
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device {device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:0', 'mps')") from None
    if d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (d.index is not None and d.index >= n):
            raise ValueError(f"device {device!r} is not available here ({n} CUDA device(s))")
    elif d.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {device!r} is not available here (no MPS)")
    elif d.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=d)
        except Exception:  # noqa: BLE001 - any backend's own complaint: not usable here
            raise ValueError(f"device {device!r} is not available here") from None
    return d


__all__ = ["TokenIdsError", "check_device", "check_token_ids"]
