"""RepIt isolation, localisation and rho search on hand-built tensors with known answers."""
import math

import pytest
import torch

from interp.steering.repit import isolate, isolate_with_info, localize, search_rho, tail_only


def _whitened(v, R, reweight="invnorm"):
    """Independent re-derivation of the whitened metric: L^-1 v and an orthonormal basis of L^-1 Rw^T."""
    v, R = v.double(), R.double()
    w = 1 / (R.norm(dim=1) + 1e-8)
    w = w / w.sum()
    Rw = w[:, None] * R
    lam = 1e-4 * (Rw ** 2).mean() + 1e-12
    C = Rw.T @ Rw / R.shape[0] + lam * torch.eye(R.shape[1], dtype=torch.float64)
    L = torch.linalg.cholesky(C)
    Q, _ = torch.linalg.qr(torch.linalg.solve_triangular(L, Rw.T, upper=False))
    return L, Q


def test_axis_aligned_known_answer():
    # non-target span = span(e1, e2); the target has a component 3 e1 in it and 2 e3 outside it.
    R = torch.tensor([[2.0, 0, 0, 0], [0, 5.0, 0, 0]])
    v = torch.tensor([3.0, 0, 2, 0])
    assert torch.equal(isolate(v, R, 0.0), v)  # rho = 0: unchanged
    assert torch.allclose(isolate(v, R, 1.0), torch.tensor([0.0, 0, 2, 0]), atol=1e-6)  # in-span part removed
    for rho in (0.25, 0.5, 0.9):
        # alpha = 1 - sqrt(1 - rho): the in-span coordinate shrinks by sqrt(1 - rho)
        expect = torch.tensor([3.0 * math.sqrt(1 - rho), 0, 2, 0])
        assert torch.allclose(isolate(v, R, rho), expect, atol=1e-6)
        info = isolate_with_info(v, R, rho)
        assert info.removed_fraction == pytest.approx(rho, abs=1e-9)
        assert torch.allclose(info.correction, v - expect, atol=1e-6)


def test_rotated_known_answer_is_basis_independent():
    g = torch.Generator().manual_seed(1)
    U, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    R = torch.tensor([[1.0, 0, 0, 0, 0, 0], [0, 4.0, 0, 0, 0, 0], [0, 0, 2.0, 0, 0, 0]], dtype=torch.float64)
    v = torch.tensor([1.0, -2.0, 0.5, 3.0, 0, 1.0], dtype=torch.float64)
    out = isolate(v @ U, R @ U, 1.0)
    # exact answer: the span(e1, e2, e3) part is gone, the rest is untouched (rotated into the new basis)
    expect = torch.tensor([0, 0, 0, 3.0, 0, 1.0], dtype=torch.float64) @ U
    assert torch.allclose(out, expect, atol=1e-8)


def test_random_case_properties():
    # the digest's recipe: d = 64, n = 6 non-targets
    g = torch.Generator().manual_seed(0)
    d, n = 64, 6
    R = torch.randn(n, d, generator=g) * torch.rand(n, 1, generator=g) * 3
    v = torch.randn(d, generator=g) + R[0] + 0.5 * R[3]
    assert torch.equal(isolate(v, R, 0.0), v)
    L, Q = _whitened(v, R)

    def energy(x):
        return float(((Q.T @ torch.linalg.solve_triangular(L, x.double()[:, None], upper=False)) ** 2).sum())
    for rho in (0.33, 0.66, 0.99):
        ratio = energy(isolate(v, R, rho)) / energy(v)
        assert abs(ratio - (1 - rho)) / (1 - rho) < 1e-4
    v1 = isolate(v, R, 1.0).double()
    v1_w = torch.linalg.solve_triangular(L, v1[:, None], upper=False)[:, 0]
    w = 1 / (R.double().norm(dim=1) + 1e-8)
    Rw_w = torch.linalg.solve_triangular(L, (w[:, None] * R.double()).T, upper=False)  # [d, n]
    cos = (v1_w @ Rw_w) / (v1_w.norm() * Rw_w.norm(dim=0))
    assert cos.abs().max() < 1e-4
    # the correction lies in the span of the non-target vectors
    corr = (v - isolate(v, R, 0.7)).double()
    coef = torch.linalg.lstsq(R.double().T, corr[:, None]).solution
    assert torch.allclose(R.double().T @ coef, corr[:, None], atol=1e-8)


def test_target_in_span_vanishes():
    g = torch.Generator().manual_seed(3)
    R = torch.randn(5, 32, generator=g)
    v = 0.7 * R[1] - 1.3 * R[4]
    assert isolate(v, R, 1.0).norm() < 1e-6 * v.norm()
    assert isolate(v, R, 0.99).norm() < isolate(v, R, 0.5).norm() < v.norm()


def test_reweight_options_and_validation():
    g = torch.Generator().manual_seed(4)
    R, v = torch.randn(4, 16, generator=g), torch.randn(16, generator=g)
    for rw in ("invnorm", "uniform", "sim"):
        info = isolate_with_info(v, R, 0.5, reweight=rw)
        assert info.removed_fraction == pytest.approx(0.5, abs=1e-9)
    # C = Rw^T Rw / n + lambda I has span(R) as an invariant subspace, so the whitened projection is the
    # Euclidean orthogonal projection onto span(R) whatever the weights: v' = v - (1 - sqrt(1 - rho)) P v
    P = R.T.double() @ torch.linalg.pinv(R.T.double())
    for rw in ("invnorm", "uniform", "sim"):
        for rho in (0.3, 1.0):
            expect = v.double() - (1 - math.sqrt(1 - rho)) * (P @ v.double())
            assert torch.allclose(isolate(v.double(), R.double(), rho, rw), expect, atol=1e-8)
    with pytest.raises(ValueError, match="rho"):
        isolate(v, R, 1.5)
    with pytest.raises(ValueError, match="non_targets"):
        isolate(v, R[:, :8], 0.5)
    with pytest.raises(ValueError, match="reweight"):
        isolate(v, R, 0.5, reweight="bogus")
    # linearly dependent non-targets: the duplicate adds nothing
    dup = torch.cat([R, R[:1] * 2])
    assert torch.allclose(isolate(v, dup, 1.0, "uniform"), isolate(v, torch.cat([R, R[:1]]), 1.0, "uniform"),
                          atol=1e-4)


def test_localize_known_answer():
    p = torch.zeros(100)
    p[[3, 17, 42]] = torch.tensor([4.0, -3.0, 1.0])  # energies 16, 9, 1 of 26 (+ tiny rest)
    p[50:] = 0.01
    loc = localize(p, share=0.9)
    assert loc.k_for_share == 2 and loc.dims == [3, 17]
    assert loc.share == pytest.approx(25 / (26 + 50 * 1e-4), rel=1e-6)
    assert loc.heavy_tail == 2 and loc.gini > 0.8  # threshold mean + 2 std = 1.10 > 1
    assert localize(torch.ones(10), 0.9).k_for_share == 9
    v = torch.arange(100.0)
    assert torch.equal(tail_only(v, p, 2), v - p * (torch.arange(100) == 3) - p * (torch.arange(100) == 17))


def test_search_rho_bracket_and_choice():
    # non-target ASR falls linearly from 0.5 (rho = 0) to 0 (rho = 1); target ASR falls more slowly
    calls = []

    def ev(r):
        calls.append(r)
        return 0.9 - 0.3 * r, 0.5 * (1 - r)
    s = search_rho(ev, ceiling=0.1)
    assert [p["rho"] for p in s.points][:1] == [0.0] and len(s.points) == 7  # 4 grid + 3 refinements
    assert s.rho == pytest.approx(0.8, abs=0.01)  # the smallest feasible rho maximises target ASR
    assert s.feasible and all(p["nontarget_asr"] <= 0.1 + 1e-12 for p in s.points if p["rho"] == s.rho)
    assert all(round(r, 2) == r for r in calls)
    # nothing feasible: lowest non-target ASR
    s2 = search_rho(lambda r: (1.0, 0.5 + 0.1 * r), ceiling=0.1)
    assert not s2.feasible and s2.rho == 0.0
    # ties on target ASR go to the smaller rho
    s3 = search_rho(lambda r: (0.5, 0.0), ceiling=0.1)
    assert s3.rho == 0.0
    # no finite evaluation: fallback 0.99
    assert search_rho(lambda r: (float("nan"), float("nan"))).rho == 0.99
