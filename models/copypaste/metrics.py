"""Copying metrics of CopyPasteLLM (Eq. 1, after Grusky et al. 2018) and the CP-Refine copy score.

Answers and contexts are compared as whitespace tokens (``str.split()``): the digest leaves the token unit
open and Grusky et al. count words, so words it is (implementation choice).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def _tokens(text: str | Sequence[str]) -> list[str]:
    if isinstance(text, str):
        return text.split()
    if not all(isinstance(t, str) for t in text):
        raise TypeError("a token sequence must hold strings")
    return list(text)


def copy_fragments(answer: str | Sequence[str], context: str | Sequence[str]) -> list[list[str]]:
    """Copy fragments ``F`` of ``answer`` in ``context`` (Alg. 4, greedy longest match).

    From ``i = 0``: take the longest ``l`` with ``A[i:i+l] == C[m:m+l]`` for some ``m``; if ``l > 0`` record
    ``A[i:i+l]`` and jump ``i += l``, else ``i += 1``. (Alg. 4 prints the slice as ``a_i..a_{l_max-1}``; the
    digest's correction ``A[i:i+l]`` is used.) Strings are split on whitespace.

    One ``O(|A| |C|)`` dynamic programme, a match-length table filled row by row (vectorised over ``C``) from the end
    (``L[i, m] = A[i]==C[m] ? 1 + L[i+1, m+1] : 0``), gives the longest match at every answer position.
    """
    a, c = _tokens(answer), _tokens(context)
    n, k = len(a), len(c)
    if n == 0 or k == 0:
        return []
    vocab: dict[str, int] = {}
    a_ids = np.array([vocab.setdefault(t, len(vocab)) for t in a])
    c_ids = np.array([vocab.setdefault(t, len(vocab)) for t in c])
    eq = a_ids[:, None] == c_ids[None, :]                       # [|A|, |C|]
    length = np.zeros((n + 1, k + 1), dtype=np.int64)
    for i in range(n - 1, -1, -1):                              # one vectorised row per answer token
        length[i, :k] = eq[i] * (length[i + 1, 1:] + 1)
    longest = length[:n, :k].max(1)                             # [|A|] longest match starting at each i
    fragments, i = [], 0
    while i < n:
        best = int(longest[i])
        if best > 0:
            fragments.append(a[i:i + best])
            i += best
        else:
            i += 1
    return fragments


def copy_metrics(answer: str | Sequence[str], context: str | Sequence[str]) -> tuple[float, float]:
    """``(kappa, delta)``: copy coverage ``(1/|A|) sum_f |f|`` and copy density ``(1/|A|) sum_f |f|^2``.

    An answer identical to the context gives ``kappa = 1, delta = |A|``; a disjoint one ``0, 0``. An empty
    answer is refused (both metrics divide by ``|A|``).
    """
    a = _tokens(answer)
    if not a:
        raise ValueError("answer is empty: kappa and delta are undefined for |A| = 0")
    frags = copy_fragments(a, context)
    n = len(a)
    return sum(len(f) for f in frags) / n, sum(len(f) ** 2 for f in frags) / n


def copy_score(kappa: float, delta: float, alpha: float = 1.0, beta: float = 0.5, gamma: float = 4.0,
               epsilon: float = 1.0) -> float:
    """CP-Refine's copy score ``sigma = alpha kappa + min(delta^beta / gamma, epsilon)``.

    The paper does not give alpha, beta, gamma, epsilon (UNKNOWN in the digest). Defaults (implementation
    choice): ``alpha = 1`` (coverage in [0, 1]), ``beta = 0.5`` and ``gamma = 4`` (``sqrt(delta)`` is a typical
    fragment length; a 16-word mean fragment earns the full bonus), ``epsilon = 1`` (the bonus never outweighs
    coverage). So ``sigma`` lies in [0, 2].
    """
    if kappa < 0 or delta < 0:
        raise ValueError(f"kappa and delta must be >= 0, got {kappa}, {delta}")
    if gamma <= 0 or beta <= 0:
        raise ValueError(f"gamma and beta must be > 0, got gamma={gamma}, beta={beta}")
    return alpha * kappa + min(delta ** beta / gamma, epsilon)
