"""Which backend offers which site group for which family: the support matrix, generated from the
conformance suite (``python scripts/support_matrix.py`` writes ``interp/support_matrix.json`` and
``docs/architectures.md``; ``tests/conformance/`` checks that the committed matrix is the suite's)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from .names import parse

#: the support matrix's file (package data)
MATRIX = Path(__file__).with_name("support_matrix.json")
BACKENDS = ("torch", "nnsight", "transformer_lens")

#: canonical hook (without ``blocks.L.``) -> its site group in the matrix
_GROUP_OF = {"hook_resid_pre": "residual", "hook_resid_mid": "residual", "hook_resid_post": "residual",
             "hook_attn_out": "attn_out", "hook_mlp_out": "mlp_out", "attn.hook_q": "qkv", "attn.hook_k": "qkv",
             "attn.hook_v": "qkv", "attn.hook_pattern": "pattern", "attn.hook_attn_scores": "pattern",
             "attn.hook_rot_q": "pattern", "attn.hook_rot_k": "pattern", "ln1.hook_normalized": "norms",
             "ln1.hook_scale": "norms", "ln2.hook_normalized": "norms", "ln2.hook_scale": "norms"}


def site_group(name: str) -> str | None:
    """The support-matrix group of a canonical hook name (``None`` for names the matrix does not cover)."""
    return _GROUP_OF.get(parse(name)[1])


@functools.lru_cache(maxsize=1)
def matrix() -> dict:
    """``{family: {backend: {group: status}}}`` as generated from the conformance suite (``{}`` if absent)."""
    try:
        return json.loads(MATRIX.read_text())["families"]
    except (OSError, ValueError, KeyError):
        return {}


def _family_key(family: str) -> str:
    """The matrix's family for a TransformerLens architecture name (``OPTForCausalLM`` -> ``opt``)."""
    squash = lambda s: s.lower().replace("_", "").replace("forcausallm", "").replace("lmheadmodel", "")  # noqa: E731
    return next((f for f in matrix() if squash(f) == squash(family)), family)


def offered_by(family: str, name: str, backend: str) -> str:
    """A clause naming the other backends on which ``name``'s site group is right for ``family`` (``""`` when the
    matrix does not say)."""
    group = site_group(name)
    row = matrix().get(family) or matrix().get(_family_key(family), {})
    if group is None or not row:
        return ""
    others = [b for b in BACKENDS if b != backend and row.get(b, {}).get(group) == "ok"]
    if not others:
        return f"; no backend offers it for {family} (docs/architectures.md)"
    return f"; the {' and '.join(others)} backend{'s' if len(others) > 1 else ''} offer{'' if len(others) > 1 else 's'} it (docs/architectures.md)"
