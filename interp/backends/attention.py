"""Hook points inside Hugging Face attention: ``attn.hook_rot_q``, ``hook_rot_k``, ``hook_attn_scores``, ``hook_pattern``.

Hugging Face computes these tensors inside one attention function call (no module boundary), so the torch
and nnsight backends register their own ``transformers`` attention implementation, :func:`attention`
(name :data:`IMPL`, through ``AttentionInterface``), and switch a model's configs to it only while one of
these names is hooked (:class:`ImplSwitch`; the plain forward keeps its own implementation, sdpa or
flash, and its speed). The function receives the query and key *after* rotary embeddings and the key/value
cache, runs eager attention and calls the hooks registered for the calling attention module
(:class:`Slots`), in TransformerLens's shapes and conventions (those of the TransformerBridge):

- ``hook_rot_q`` ``[batch, pos, head, d_head]``; ``hook_rot_k`` ``[batch, pos, kv_head, d_head]`` (grouped-query
  models keep their ``n_kv_heads``, as on the bridge); only the positions this pass computes (the new
  token against a key/value cache). A write to ``hook_rot_k`` without grad mode is written into the
  key/value cache too (the bridge's hook also fires before the cache update), so later generation passes
  see it.
- ``hook_attn_scores`` ``[batch, head, q, k]``: ``q k^T * scaling`` (Gemma-2's logit soft-capping applied),
  with every masked entry (causal, padding, sliding window) set to ``-inf``, before the softmax.
- ``hook_pattern`` ``[batch, head, q, k]``: the softmax of the (possibly edited) scores in float32; a row
  with every key masked (a left-padding query) is all zeros, as on the bridge (its gradient is zero, not NaN).

All four are writable: the attention output is computed from the edited tensors.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterable

import torch
from torch import nn

#: the name of the attention implementation (and its mask) in ``transformers``' interfaces
IMPL = "interp_hooks"
#: the hook kinds the attention function offers, in the order they fire
KINDS = ("rot_q", "rot_k", "attn_scores", "pattern")

Dispatch = Callable[[str, torch.Tensor], "torch.Tensor | None"]

#: attention module -> dispatch functions installed for it, outermost (earliest installed) first
_SLOTS: "weakref.WeakKeyDictionary[nn.Module, list[Dispatch]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_REGISTERED = False


def register() -> str:
    """Register :func:`attention` and its mask builder with ``transformers`` under :data:`IMPL` (once)."""
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
        AttentionInterface.register(IMPL, attention)
        AttentionMaskInterface.register(IMPL, _mask)
        _REGISTERED = True
    return IMPL


def _mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """Boolean 4-D mask ``[batch, 1, q, k]`` (``True`` = attend), never skipped for causal models, so the
    attention function always knows which entries are masked."""
    from transformers.masking_utils import sdpa_mask
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def _fire(slots: list[Dispatch], kind: str, t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    changed = False
    for fn in slots:
        new = fn(kind, t)
        if new is not None:
            t, changed = new, True
    return t, changed


def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
              softcap: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention that calls the hooks of ``module`` (see the module docstring).

    ``query`` ``[B, H, Q, D]``, ``key``/``value`` ``[B, H_kv, K, D]`` (after rotary and the cache update),
    ``attention_mask`` boolean ``[B, 1, Q, K]`` (or an additive float mask) -> ``(output [B, Q, H, D],
    pattern [B, H, Q, K])``, as ``transformers``' eager attention returns them."""
    slots = _SLOTS.get(module) or []
    B, H, Q, D = query.shape
    K = key.shape[-2]
    if slots:  # the computation continues from the hooked tensors (so gradients reach them)
        query = _fire(slots, "rot_q", query.transpose(1, 2))[0].transpose(1, 2)
        k, changed = _fire(slots, "rot_k", key[:, :, K - Q:].transpose(1, 2))
        grad = torch.is_grad_enabled()
        if changed or grad:
            new = k.transpose(1, 2).to(key.dtype)
            if grad:
                key = new if K == Q else torch.cat([key[:, :, :K - Q], new], dim=2)
            else:  # the tensor the key/value cache holds: later passes read the edited keys
                key[:, :, K - Q:] = new
    if key.shape[1] != H:
        rep = H // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    scaling = D ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    blocked = _blocked(module, attention_mask, Q, K, scores)
    dead = None  # rows with every key masked (left-padding queries): [B|1, 1|H, Q, 1]
    if blocked is not None:
        if isinstance(blocked, tuple):  # an additive float mask: its finite part is added
            add, blocked = blocked
            scores = scores + add.to(scores.dtype)
        scores = scores.masked_fill(blocked, float("-inf"))
        dead = blocked.all(-1, keepdim=True)  # from the mask: a head axis smaller than the scores'
    if slots:
        scores, changed = _fire(slots, "attn_scores", scores)
        if changed:  # a write may mask more
            dead = torch.isneginf(scores).all(-1, keepdim=True)
    if dead is not None and bool(dead.any()):
        pattern = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1, dtype=torch.float32)
        pattern = pattern.masked_fill(dead, 0.0).to(value.dtype)
    else:
        pattern = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    if dropout and module.training:
        pattern = nn.functional.dropout(pattern, p=dropout)
    if slots:
        pattern, _ = _fire(slots, "pattern", pattern)
    out = torch.matmul(pattern, value)
    return out.transpose(1, 2).contiguous(), pattern


def _blocked(module: nn.Module, mask: torch.Tensor | None, Q: int, K: int, scores: torch.Tensor):
    """Where attention is blocked: a boolean ``[B|1, 1|H, Q, K]`` tensor, ``(additive, blocked)`` for a float
    mask, or ``None`` (nothing masked)."""
    if mask is None:
        if getattr(module, "is_causal", False) and Q > 1:
            q = torch.arange(Q, device=scores.device)[:, None] + (K - Q)
            return torch.arange(K, device=scores.device)[None, :] > q
        return None
    if mask.shape[-1] != K:
        mask = mask[..., :K]
    if mask.dtype == torch.bool:
        return ~mask
    blocked = mask <= torch.finfo(mask.dtype).min
    return mask.masked_fill(blocked, 0.0), blocked


class Slots:
    """The dispatch functions of one install, registered on attention modules until :meth:`remove`.

    ``per_module`` maps each attention module (and every module inside it: the function is called with
    the module that calls the attention interface) to a dispatch ``fn(kind, tensor) -> new | None``."""

    def __init__(self, per_module: Iterable[tuple[nn.Module, Dispatch]]) -> None:
        self.items = list(per_module)
        self.added: list[tuple[nn.Module, Dispatch]] = []

    def enter(self) -> None:
        with _LOCK:
            for module, fn in self.items:
                self.added.append((module, fn))  # recorded first: remove() is safe at any point
                _SLOTS.setdefault(module, []).append(fn)

    def remove(self) -> None:
        with _LOCK:
            while self.added:
                module, fn = self.added.pop()
                lst = _SLOTS.get(module)
                if lst is not None:
                    for i in range(len(lst) - 1, -1, -1):
                        if lst[i] is fn:
                            del lst[i]
                            break
                    if not lst:
                        _SLOTS.pop(module, None)


#: config -> [number of active switches, implementation before the first]
_SWITCHED: dict[int, list[Any]] = {}


class ImplSwitch:
    """Switch every attention config of ``module`` to :data:`IMPL` while at least one switch is active.

    Reference-counted per config, so nested and overlapping installs (contexts, runs, threads) may end in
    any order; ``remove()`` is idempotent and restores the original implementation when the last one
    ends. ``module=None`` is a no-op switch."""

    def __init__(self, module: nn.Module | None) -> None:
        self.module = module
        self.held: list[Any] = []

    def enter(self) -> None:
        if self.module is None:
            return
        register()
        seen = set()
        with _LOCK:
            for m in self.module.modules():
                c = getattr(m, "config", None)
                if c is None or id(c) in seen or not hasattr(c, "_attn_implementation"):
                    continue
                seen.add(id(c))
                entry = _SWITCHED.get(id(c))
                if entry is None:
                    entry = _SWITCHED[id(c)] = [0, c._attn_implementation, c]
                    c._attn_implementation = IMPL
                entry[0] += 1
                self.held.append(c)

    def remove(self) -> None:
        with _LOCK:
            while self.held:
                c = self.held.pop()
                entry = _SWITCHED.get(id(c))
                if entry is None:
                    continue
                entry[0] -= 1
                if entry[0] <= 0:
                    c._attn_implementation = entry[1]
                    del _SWITCHED[id(c)]
