"""Canonical hook names (TransformerLens names) and the patterns that select them.

A canonical name is ``hook_embed``, ``blocks.{l}.<hook>`` or ``ln_final.hook_scale|hook_normalized``. Patterns are
shell globs (``blocks.*.hook_resid_post``); a bare hook suffix such as ``hook_resid_post`` matches that
hook in every block. Unknown names raise :class:`UnknownHookError` naming the closest valid ones.
"""
from __future__ import annotations

import difflib
import fnmatch
import re
from typing import Iterable, Sequence

#: Per-block hooks in execution order, with the rank used to order them within a block.
BLOCK_HOOKS: tuple[str, ...] = (
    "hook_resid_pre",
    "ln1.hook_scale",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_rot_q",
    "attn.hook_rot_k",
    "attn.hook_attn_scores",
    "attn.hook_pattern",
    "attn.hook_z",
    "attn.hook_result",
    "hook_attn_out",
    "hook_resid_mid",
    "ln2.hook_scale",
    "ln2.hook_normalized",
    "mlp.hook_pre",
    "mlp.hook_pre_linear",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
)
#: Hooks whose tensors have a head axis, and where it is: ``[batch, pos, head, d_head]`` or ``[batch, head, q, k]``.
HEAD_AXIS: dict[str, int] = {"attn.hook_q": 2, "attn.hook_k": 2, "attn.hook_v": 2, "attn.hook_z": 2, "attn.hook_pattern": 1,
                              "attn.hook_rot_q": 2, "attn.hook_rot_k": 2, "attn.hook_attn_scores": 1,
                              "attn.hook_result": 2}

_BLOCK_RE = re.compile(r"^blocks\.(\d+)\.(.+)$")


class UnknownHookError(KeyError):
    """A requested hook name (or pattern) matches nothing the model offers."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class HookNotFiredError(RuntimeError):
    """A hook that was asked for did not run during the forward pass."""


def parse(name: str) -> tuple[int | None, str]:
    """Split ``blocks.3.attn.hook_z`` into ``(3, "attn.hook_z")``; global hooks give ``(None, name)``."""
    m = _BLOCK_RE.match(name)
    if m:
        return int(m.group(1)), m.group(2)
    return None, name


def layer_of(name: str) -> int | None:
    return parse(name)[0]


def order_key(name: str, n_layers: int) -> tuple[int, int]:
    """Execution order of a canonical hook: ``hook_embed`` (then ``hook_pos_embed``) first, ``ln_final`` last."""
    layer, hook = parse(name)
    if layer is None:
        if name in ("hook_embed", "hook_pos_embed"):
            return (-1, 0 if name == "hook_embed" else 1)
        return (n_layers + 1, 0 if name.endswith("hook_scale") else 1)
    rank = BLOCK_HOOKS.index(hook) if hook in BLOCK_HOOKS else len(BLOCK_HOOKS)
    return (layer, rank)


def expand(patterns: str | Iterable[str] | None, available: Sequence[str], strict: bool = True) -> list[str]:
    """Resolve names/patterns against ``available``, in the caller's order.

    A pattern may also be a callable name filter ``fn(name) -> bool`` (as in TransformerLens).
    The result lists the matches of the first pattern, then those of the second, and so on (duplicates
    kept once, at their first place); the matches of one glob come in the order of ``available`` (the
    model's execution order). So ``expand(["blocks.2.x", "blocks.0.x"], ...)`` is
    ``["blocks.2.x", "blocks.0.x"]``: code may zip the result with the list it asked for. ``None``
    selects everything, in ``available`` order.

    A pattern without wildcard that is not itself a name is tried as a block-hook suffix
    (``hook_resid_post`` → every ``blocks.*.hook_resid_post``). With ``strict`` a pattern that matches
    nothing raises :class:`UnknownHookError` naming the closest valid names.
    """
    if patterns is None:
        return list(available)
    if isinstance(patterns, str) or callable(patterns):
        patterns = [patterns]
    elif not isinstance(patterns, Iterable):
        raise TypeError(f"hook names must be a string or a list of strings, got {type(patterns).__name__}")
    avail = set(available)
    chosen: dict[str, None] = {}
    for pat in patterns:
        if callable(pat):  # a name filter, as TransformerLens accepts: fn(name) -> bool
            matched = [n for n in available if pat(n)]
            if not matched and strict:
                raise UnknownHookError(f"the name filter {getattr(pat, '__name__', pat)!r} matches no hook "
                                       "name (see model.hook_names())")
            for n in matched:
                chosen.setdefault(n)
            continue
        if not isinstance(pat, str):
            raise TypeError(f"hook names must be strings, got {type(pat).__name__}: {pat!r}")
        if pat in avail:
            chosen.setdefault(pat)
            continue
        matched = [n for n in available if fnmatch.fnmatchcase(n, pat)]
        if not matched and not any(c in pat for c in "*?["):
            matched = [n for n in available if fnmatch.fnmatchcase(n, f"blocks.*.{pat}")]
        if not matched and strict:
            raise UnknownHookError(unknown_message(pat, available))
        for n in matched:
            chosen.setdefault(n)
    return list(chosen)


def unknown_message(name: str, available: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, available, n=5, cutoff=0.5)
    if not close:
        _, hook = parse(name)
        close = [n for n in available if n.endswith(hook.split(".")[-1])][:5]
    hint = ", ".join(close) if close else ", ".join(list(available)[:5]) + ", ..."
    return f"unknown hook name {name!r}; closest valid names: {hint} (see model.hook_names())"
