"""Input checks shared by the capture layer's entry points (token-id dtypes, devices) and the one check of a
padded batch's output that every backend runs.

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


def check_device(device: Any, name: str = "device") -> torch.device | None:
    """``device=`` of a run, checked before any forward or load: a torch device that exists here (``"cpu"``,
    ``"cuda"``, ``"cuda:1"``, ``"mps"`` ...), else ``ValueError`` in one line that starts with ``name`` (the
    keyword, or a CLI option such as ``"--device"``) and says what this machine has. ``None`` stays ``None``.
    The one device rule of the library and of every CLI command."""
    if device is None:
        return None
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{name} {device!r} is not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    if d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"{name} {device!r} is not available: this machine has no CUDA device "
                             "(torch.cuda.is_available() is False); use cpu")
        if d.index is not None and d.index >= n:
            raise ValueError(f"{name} {device!r} is not available: this machine has {n} CUDA device(s), "
                             f"cuda:0 to cuda:{n - 1}")
    elif d.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"{name} {device!r} is not available: this machine has no MPS device")
    elif d.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=d)
        except Exception:  # noqa: BLE001 - any backend's own complaint: not usable here
            raise ValueError(f"{name} {device!r} is not available on this machine") from None
    return d


def check_padded_output(out: Any, attention_mask: torch.Tensor | None, backend: str, family: str, cause: str,
                        remedy: str) -> None:
    """Refuse (``RuntimeError``, one line) a padded batch whose output ``[batch, pos, ...]`` is NaN at real
    tokens: an attention implementation that gives fully padded query rows NaN (all keys masked) passes the
    NaN on to the real rows through the next layer's attention (``0 * NaN``), so every number of those rows
    would be silently wrong. ``cause`` names the implementation, ``remedy`` what to do instead; each backend
    calls this on the logits of its plain forward passes."""
    if not torch.is_tensor(out) or attention_mask is None or out.dim() < 3 or bool(attention_mask.all()):
        return
    real = attention_mask.bool().to(out.device)
    if out.shape[:2] != real.shape:
        return
    # a NaN anywhere in a position's row makes its sum NaN: [batch, pos] without copying the logits
    if bool((torch.isnan(out.detach().sum(dim=tuple(range(2, out.dim())))) & real).any()):
        side = "left" if bool((attention_mask[:, 0] == 0).any()) else "right"
        raise RuntimeError(f"the {backend} backend gives NaN at real tokens of this {side}-padded batch for the "
                           f"{family} family ({cause}); pad on the {'right' if side == 'left' else 'left'}, run the "
                           f"rows one by one, or {remedy}")


__all__ = ["TokenIdsError", "check_device", "check_padded_output", "check_token_ids"]
