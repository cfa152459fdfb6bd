"""Plug-in (co-occurrence count) mutual-information estimators over discrete codes.

Every function takes integer code arrays (any integers: codes are relabelled to ``0..K-1`` first, so
sparse labels such as ``[3, 900, 3]`` or negative values cost nothing) and works in **nats**.

Estimator and bias. With ``N`` paired samples, ``K_A`` and ``K_B`` distinct observed values, the
plug-in estimate ``I = sum_ab p(a,b) log p(a,b)/(p(a)p(b))`` is biased upwards; for independent
sources its expectation is about the Miller-Madow term ``(K_A-1)(K_B-1)/(2N)`` nats (the digest's
``/(2N ln 2)`` is the same in bits). :func:`miller_madow_bias` returns it; :func:`shuffled_null`
measures the bias of the actual data (permute one side, recompute) and is what the analyses subtract
(:func:`null_corrected_mi`), because it also holds when the asymptotic formula does not (``K`` close
to ``N``). Normalised MI follows the paper: ``nMI = I / I_max`` with ``I_max`` the largest MI of the
same analysis (:func:`normalized_mi`), a relative scale, not ``I / min(H_A, H_B)``.

Counting is vectorised: a dense ``bincount`` over ``K_A * K_B`` cells when that table is small, a sort
(``np.unique`` over combined keys) otherwise, so memory stays ``O(N)`` for any ``K``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["relabel", "entropy", "mutual_information", "conditional_mutual_information", "miller_madow_bias",
           "shuffled_null", "null_corrected_mi", "normalized_mi", "MIEstimate"]

_DENSE_LIMIT = 1 << 22  # cells of a dense joint table before switching to sorted (sparse) counting


def relabel(x) -> tuple[np.ndarray, int]:
    """Map any integer codes ``[N]`` to ``0..K-1`` (in sorted order of the values); returns ``(codes, K)``."""
    arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.bool_):
            arr = arr.astype(np.int64)
        elif np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0):
            arr = arr.astype(np.int64)
        else:
            raise TypeError(f"codes must be integers, got dtype {arr.dtype}")
    if arr.size and arr.min() >= 0 and arr.max() < 4 * arr.size + 1024:  # small labels: O(N) relabelling
        arr = arr.astype(np.int64, copy=False)
        present = np.bincount(arr) > 0
        lookup = np.cumsum(present) - 1
        return lookup[arr], int(present.sum())
    uniq, inv = np.unique(arr, return_inverse=True)
    return inv.astype(np.int64).reshape(-1), int(uniq.size)


def _pair(a: np.ndarray, ka: int, b: np.ndarray, kb: int) -> tuple[np.ndarray, int]:
    """Relabelled joint code of two relabelled arrays (``K`` = number of observed pairs)."""
    key = a * kb + b
    if ka * kb <= _DENSE_LIMIT:
        present = np.bincount(key, minlength=ka * kb) > 0
        lookup = np.cumsum(present) - 1
        return lookup[key], int(present.sum())
    uniq, inv = np.unique(key, return_inverse=True)
    return inv.reshape(-1), int(uniq.size)


def _counts(codes: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(codes, minlength=k).astype(np.float64)


def _check_same_length(*arrays: np.ndarray) -> int:
    n = {len(x) for x in arrays}
    if len(n) != 1:
        raise ValueError(f"code arrays must have the same length, got {[len(x) for x in arrays]}")
    n0 = n.pop()
    if n0 == 0:
        raise ValueError("code arrays are empty")
    return n0


def entropy(a) -> float:
    """Plug-in Shannon entropy (nats) of integer codes ``[N]``."""
    codes, k = relabel(a)
    _check_same_length(codes)
    p = _counts(codes, k) / len(codes)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def _mi_codes(a: np.ndarray, ka: int, b: np.ndarray, kb: int) -> float:
    n = len(a)
    ab, _ = _pair(a, ka, b, kb)
    n_ab = np.bincount(ab).astype(np.float64)
    first = np.empty(n_ab.size, dtype=np.int64)
    first[ab] = np.arange(n)  # one sample of each joint cell gives its (a, b)
    n_a = _counts(a, ka)[a[first]]
    n_b = _counts(b, kb)[b[first]]
    mi = float((n_ab / n * np.log(n_ab * n / (n_a * n_b))).sum())
    return max(mi, 0.0)


def mutual_information(a, b) -> float:
    """Plug-in mutual information ``I(A;B)`` in nats from paired integer codes ``a, b: [N]``.

    Equals ``sklearn.metrics.mutual_info_score(a, b)``. Clipped at 0 (round-off only)."""
    a, ka = relabel(a)
    b, kb = relabel(b)
    _check_same_length(a, b)
    return _mi_codes(a, ka, b, kb)


def conditional_mutual_information(a, b, c) -> float:
    """Plug-in conditional MI ``I(A;B|C) = sum p(a,b,c) log p(a,b,c) p(c) / (p(a,c) p(b,c))`` in nats.

    Computed from the triple counts as ``sum_c p(c) I(A;B | C=c)``, i.e. ``I((A,C);(B,C)) - H(C)``
    through the joint codes, vectorised; codes ``[N]`` each."""
    a, ka = relabel(a)
    b, kb = relabel(b)
    c, kc = relabel(c)
    n = _check_same_length(a, b, c)
    ac, kac = _pair(a, ka, c, kc)
    bc, kbc = _pair(b, kb, c, kc)
    abc, kabc = _pair(ac, kac, b, kb)
    n_abc = np.bincount(abc, minlength=kabc).astype(np.float64)
    f = np.empty(kabc, dtype=np.int64)
    f[abc] = np.arange(n)  # one sample of each (a, b, c) cell
    n_ac = _counts(ac, kac)[ac[f]]
    n_bc = _counts(bc, kbc)[bc[f]]
    n_c = _counts(c, kc)[c[f]]
    cmi = float((n_abc / n * np.log(n_abc * n_c / (n_ac * n_bc))).sum())
    return max(cmi, 0.0)


def miller_madow_bias(k_a: int, k_b: int, n: int) -> float:
    """Expected plug-in MI of independent sources, ``(K_A-1)(K_B-1)/(2N)`` nats (first order in ``1/N``)."""
    return (k_a - 1) * (k_b - 1) / (2.0 * n)


def _permute_within(groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A permutation of ``0..N-1`` that only moves indices inside their group (all of one group if None)."""
    n = len(groups)
    order = np.lexsort((rng.random(n), groups))  # shuffled within each group, groups in sorted order
    base = np.argsort(groups, kind="stable")
    perm = np.empty(n, dtype=np.int64)
    perm[base] = order
    return perm


def shuffled_null(a, b, n_perm: int = 20, seed: int = 0, c=None) -> tuple[float, float]:
    """Shuffled-pairing null: mean and standard deviation of the plug-in MI over ``n_perm`` permutations of ``b``.

    Breaking the pairing keeps both marginals (hence ``K_A``, ``K_B``, ``N``) and measures the estimator's
    bias on this very data. With ``c`` given, ``b`` is permuted *within* each value of ``c`` and the
    conditional MI ``I(A;B|C)`` is recomputed: that null keeps ``I(A;C)`` and ``I(B;C)`` and is the bias of
    :func:`conditional_mutual_information`. Returns ``(mean, std)`` in nats (``std`` with ``ddof=1``)."""
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    a_, ka = relabel(a)
    b_, kb = relabel(b)
    rng = np.random.default_rng(seed)
    vals = np.empty(n_perm)
    if c is None:
        _check_same_length(a_, b_)
        for i in range(n_perm):
            vals[i] = _mi_codes(a_, ka, b_[rng.permutation(len(b_))], kb)
    else:
        c_, _ = relabel(c)
        _check_same_length(a_, b_, c_)
        for i in range(n_perm):
            vals[i] = conditional_mutual_information(a_, b_[_permute_within(c_, rng)], c_)
    return float(vals.mean()), float(vals.std(ddof=1)) if n_perm > 1 else 0.0


@dataclass(frozen=True)
class MIEstimate:
    """A plug-in MI with its shuffled null (nats). ``corrected = mi - null_mean``; ``float(est)`` is ``corrected``."""

    mi: float
    null_mean: float
    null_std: float
    n: int
    k_a: int
    k_b: int

    @property
    def corrected(self) -> float:
        return self.mi - self.null_mean

    @property
    def z(self) -> float:
        """How many null standard deviations the estimate lies above the null mean."""
        return self.corrected / self.null_std if self.null_std > 0 else float("inf") if self.corrected > 0 else 0.0

    def __float__(self) -> float:
        return self.corrected


def null_corrected_mi(a, b, n_perm: int = 20, seed: int = 0, c=None) -> MIEstimate:
    """``I(A;B)`` (or ``I(A;B|C)`` with ``c``) together with its shuffled null; see :class:`MIEstimate`."""
    if c is None:
        mi = mutual_information(a, b)
    else:
        mi = conditional_mutual_information(a, b, c)
    mean, std = shuffled_null(a, b, n_perm=n_perm, seed=seed, c=c)
    a_, ka = relabel(a)
    _, kb = relabel(b)
    return MIEstimate(mi=mi, null_mean=mean, null_std=std, n=len(a_), k_a=ka, k_b=kb)


def normalized_mi(values, i_max: float | None = None) -> np.ndarray:
    """The paper's normalised MI: ``values / I_max`` with ``I_max`` the largest value of the same analysis.

    ``values`` are (usually null-corrected) MIs of one analysis, any shape; ``i_max`` defaults to their
    maximum (NaNs ignored and kept). Only ratios within one analysis are meaningful. Returns zeros when
    ``I_max <= 0`` (nothing above the null)."""
    v = np.asarray(values, dtype=np.float64)
    m = float(np.nanmax(v)) if i_max is None else float(i_max)
    if not np.isfinite(m) or m <= 0:
        return np.where(np.isnan(v), np.nan, 0.0)
    return v / m
