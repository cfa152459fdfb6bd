"""Plug-in MI estimators: hand computations, sklearn agreement, sparse codes, nulls, normalisation."""
import math

import numpy as np
import pytest

from interp.probes.planning import mi as M
from interp.probes.planning import (conditional_mutual_information, miller_madow_bias, mutual_information,
                                    normalized_mi, null_corrected_mi, shuffled_null)


def test_hand_computed_mi():
    # joint table [[2, 1], [0, 1]] over N = 4: p(a=0)=3/4, p(b=0)=1/2
    a = [0, 0, 0, 1]
    b = [0, 0, 1, 1]
    p = {(0, 0): .5, (0, 1): .25, (1, 1): .25}
    pa = {0: .75, 1: .25}
    pb = {0: .5, 1: .5}
    want = sum(v * math.log(v / (pa[i] * pb[j])) for (i, j), v in p.items())
    assert mutual_information(a, b) == pytest.approx(want, abs=1e-12)
    # identical variables: I = H
    x = [0, 1, 2, 3, 0, 1, 2, 3]
    assert mutual_information(x, x) == pytest.approx(math.log(4))
    # independent by construction (product table): exactly 0
    assert mutual_information([0, 0, 1, 1], [0, 1, 0, 1]) == 0.0


@pytest.mark.parametrize("k", [2, 16, 300])
def test_matches_sklearn_and_relabels(k):
    from sklearn.metrics import mutual_info_score

    rng = np.random.default_rng(k)
    a = rng.integers(0, k, 2000)
    b = (a + rng.integers(0, 3, 2000)) % k
    ref = mutual_info_score(a, b)
    assert mutual_information(a, b) == pytest.approx(ref, rel=1e-10, abs=1e-12)
    # sparse, negative and huge labels give the same number
    assert mutual_information(a * 7919 - 5, b.astype(np.int64) * 10**12) == pytest.approx(ref, rel=1e-10)


def test_sparse_counting_path_equals_dense(monkeypatch):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 50, 500)
    b = (a * 3 + rng.integers(0, 5, 500)) % 50
    c = rng.integers(0, 4, 500)
    dense = mutual_information(a, b), conditional_mutual_information(a, b, c)
    monkeypatch.setattr(M, "_DENSE_LIMIT", 1)
    sparse = mutual_information(a, b), conditional_mutual_information(a, b, c)
    assert sparse == pytest.approx(dense, rel=1e-12)


def test_conditional_mi_brute_force():
    rng = np.random.default_rng(2)
    n = 400
    c = rng.integers(0, 3, n)
    a = (c + rng.integers(0, 2, n)) % 4
    b = (a + c + rng.integers(0, 2, n)) % 5
    want = 0.0
    for ci in np.unique(c):
        m = c == ci
        want += m.mean() * mutual_information(a[m], b[m])
    assert conditional_mutual_information(a, b, c) == pytest.approx(want, rel=1e-10)
    # conditioning on A itself leaves nothing; on a constant gives plain MI
    assert conditional_mutual_information(a, b, a) == pytest.approx(0.0, abs=1e-12)
    assert conditional_mutual_information(a, b, np.zeros(n, int)) == pytest.approx(mutual_information(a, b))
    # chain rule: I(A; (B,C)) = I(A;C) + I(A;B|C)
    bc = b * 10 + c
    assert mutual_information(a, bc) == pytest.approx(mutual_information(a, c) + conditional_mutual_information(a, b, c))


def test_null_matches_miller_madow_for_independent_sources():
    rng = np.random.default_rng(3)
    n, k = 4000, 16
    a, b = rng.integers(0, k, n), rng.integers(0, k, n)
    mean, std = shuffled_null(a, b, n_perm=50, seed=0)
    bias = miller_madow_bias(k, k, n)
    assert mean == pytest.approx(bias, rel=0.15)
    est = null_corrected_mi(a, b, n_perm=50)
    assert abs(est.corrected) < 3 * est.null_std + 1e-9   # independent: within noise of 0
    assert float(est) == est.corrected
    # dependent sources are far above the null
    dep = null_corrected_mi(a, (a + rng.integers(0, 2, n)) % k, n_perm=20)
    assert dep.z > 50


def test_conditional_null_permutes_within_strata():
    rng = np.random.default_rng(4)
    n = 3000
    c = rng.integers(0, 4, n)
    a = (c + rng.integers(0, 2, n)) % 8   # A and B both depend on C only
    b = (2 * c + rng.integers(0, 2, n)) % 8
    est = null_corrected_mi(a, b, n_perm=30, c=c)
    assert abs(est.corrected) < 4 * est.null_std
    # the permutation keeps every element inside its stratum
    perm = M._permute_within(c, np.random.default_rng(0))
    assert np.array_equal(c[perm], c) and sorted(perm) == list(range(n))


def test_normalized_mi():
    assert np.allclose(normalized_mi([0.2, 0.4, 0.1]), [0.5, 1.0, 0.25])
    assert np.allclose(normalized_mi([0.2, 0.4], i_max=0.8), [0.25, 0.5])
    assert np.allclose(normalized_mi([-0.1, 0.0]), [0, 0])


def test_input_errors():
    with pytest.raises(ValueError, match="same length"):
        mutual_information([0, 1], [0])
    with pytest.raises(TypeError, match="integers"):
        mutual_information([0.5, 1.0], [0, 1])
    with pytest.raises(ValueError, match="empty"):
        mutual_information([], [])
