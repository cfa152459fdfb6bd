"""POLCA (Kangaslahti et al.): identities, exactness of the second-order term, Lanczos, clustering helpers."""
import numpy as np
import pytest
import torch
from torch import nn

from interp.benchmarks.polca.addition import addition_carry_summary
from interp.dynamics.polca import (CheckpointRecorder, ParamSpace, PolcaResult, analyse, breakthrough_step, build_basis, cluster_direction, exact_losses, first_order,
                                   homogeneity, hvp_fn, label_fraction, lanczos_top, load_checkpoints, plateau_step,
                                   polca_trajectories, second_order, span_diagnostics)


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))


def _data(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)


def loss_fn(model, ex):
    x, y = ex
    return nn.functional.cross_entropy(model(x), y, reduction="none")


def test_complete_basis_first_order_identity():
    """Σ_b POLCA₁(x, b) = ⟨∇L(x), Δθ⟩ for a random complete orthonormal basis (rel. err < 1e-5)."""
    model = _mlp()
    space = ParamSpace(model)
    ex = _data()
    theta = space.flatten()
    theta2 = theta + 0.01 * torch.randn(space.numel, generator=torch.Generator().manual_seed(1))
    basis, _ = torch.linalg.qr(torch.randn(space.numel, space.numel, generator=torch.Generator().manual_seed(2)))
    p1 = first_order(model, loss_fn, ex, basis, theta, theta2)
    assert p1.shape == (16, space.numel)
    grads = torch.func.jacrev(space.losses(loss_fn, ex))(theta)            # [n, P] per-example gradients
    want = grads @ (theta2 - theta)
    rel = (p1.sum(1) - want).abs().max() / want.abs().max()
    assert rel < 1e-5
    # a single basis vector is a rank-one projection, not the whole change
    assert (p1[:, 0] - want).abs().max() > 1e-4


def test_second_order_is_exact_per_example_curvature():
    model = _mlp()
    space = ParamSpace(model)
    ex = _data(6)
    theta = space.flatten()
    B, _ = torch.linalg.qr(torch.randn(space.numel, 3, generator=torch.Generator().manual_seed(3)))
    theta2 = theta + B @ torch.tensor([0.02, -0.01, 0.03])
    p1, h = second_order(space, loss_fn, ex, B, theta, theta2)
    f = space.losses(loss_fn, ex)
    for i in range(6):
        H = torch.func.hessian(lambda th: f(th)[i])(theta)
        for j in range(3):
            b = B[:, j]
            s = float(b @ (theta2 - theta))
            torch.testing.assert_close(h[i, j], 0.5 * (b @ H @ b) * s * s, rtol=1e-4, atol=1e-9)
    torch.testing.assert_close(p1, first_order(space, loss_fn, ex, B, theta, theta2))
    # the step lies in span(B): first + second order predict the exact change to third order
    change = f(theta2) - f(theta)
    assert (p1.sum(1) + h.sum(1) - change).abs().max() < 0.05 * change.abs().max() + 1e-6


def test_lanczos_matches_dense_eigenvectors_and_projection():
    model = _mlp()
    space = ParamSpace(model)
    ex = _data(32)
    theta = space.flatten()
    H = torch.func.hessian(lambda th: space.losses(loss_fn, ex)(th).mean())(theta).double()
    evals, evecs = torch.linalg.eigh(H)
    hvp = hvp_fn(space, loss_fn, ex, theta)
    lam, vec = lanczos_top(hvp, space.numel, k=2, n_iter=space.numel)
    torch.testing.assert_close(lam, evals.flip(0)[:2], rtol=1e-4, atol=1e-6)
    assert abs(float(vec[:, 0] @ evecs[:, -1].double())) > 0.999
    # projected away from the top eigenvector, the next one is the second
    lam2, vec2 = lanczos_top(hvp, space.numel, k=1, n_iter=space.numel, project=evecs[:, -1:])
    torch.testing.assert_close(lam2[0], evals[-2], rtol=1e-4, atol=1e-6)
    assert abs(float(vec2[:, 0] @ evecs[:, -1])) < 1e-8
    # Algorithm 1 over two checkpoints gives an orthonormal basis
    B = build_basis(space, loss_fn, ex, torch.stack([theta, theta]), at=[0, 1], k=2, n_iter=space.numel)
    torch.testing.assert_close(B.T @ B, torch.eye(4), atol=1e-5, rtol=0)


def test_trajectories_track_loss_change_small_lr(tmp_path):
    """Learned Hessian subspace + second order tracks the per-example loss change (R² ≥ 0.8) at small lr."""
    model = _mlp()
    ex = _data(64)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = CheckpointRecorder(model, tmp_path / "ckpt", every=5)
    for step in range(61):
        rec(step)
        loss = loss_fn(model, ex).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    steps, thetas = load_checkpoints(tmp_path / "ckpt")
    assert steps == list(range(0, 61, 5)) and thetas.shape[0] == 13
    space = ParamSpace(model)
    B = build_basis(space, loss_fn, ex, thetas, at=range(0, 13, 2), k=2, n_iter=20)
    traj = polca_trajectories(space, loss_fn, ex, B, thetas)
    exact = exact_losses(space, loss_fn, ex, thetas)
    pred, true = traj[:, :, -1].sum(1), exact[:, -1] - exact[:, 0]
    r2 = 1 - ((pred - true) ** 2).sum() / ((true - true.mean()) ** 2).sum()
    assert r2 >= 0.8, float(r2)
    # a random subspace of the same size tracks it far worse
    R, _ = torch.linalg.qr(torch.randn(space.numel, B.shape[1], generator=torch.Generator().manual_seed(0)))
    rnd = polca_trajectories(space, loss_fn, ex, R, thetas)[:, :, -1].sum(1)
    assert 1 - ((rnd - true) ** 2).sum() / ((true - true.mean()) ** 2).sum() < r2 - 0.2


def test_breakthrough_plateau_homogeneity_and_clusters():
    steps = list(range(0, 200, 10))
    t = torch.tensor(steps, dtype=torch.float)
    late = 1 - torch.sigmoid((t - 150) / 3)           # drops at 150
    early = 1 - torch.sigmoid((t - 40) / 3)           # drops at 40
    f = torch.stack([late, early])
    brk = breakthrough_step(f, steps, delta=20)
    assert abs(int(brk[0]) - 140) <= 10 and abs(int(brk[1]) - 30) <= 10
    assert plateau_step(early, steps) == 50      # loss 0.034 <= 5 % of the drop from step 50 on, 0.5 at 40
    assert homogeneity(np.array([0, 0, 0, 1, 1, -1]), np.array([1, 1, 0, 0, 0, 1])) == {0: 2 / 3, 1: 1.0}
    g = torch.Generator().manual_seed(0)
    traj = torch.cat([late.expand(40, -1) + 0.01 * torch.randn(40, 20, generator=g),
                      early.expand(40, -1) + 0.01 * torch.randn(40, 20, generator=g),
                      -early.expand(10, -1)])   # 10 rising examples: dropped
    lab = cluster_direction(traj - traj[:, :1])
    assert (lab[-10:] == -2).all()
    assert len(set(lab[:40])) == 1 and len(set(lab[40:80])) == 1 and lab[0] != lab[40] and lab[0] >= 0
    res = analyse(torch.stack([traj - traj[:, :1]], 1), traj.abs() + 2, steps,
                  {"kind": np.array([0] * 40 + [1] * 50)}, delta=20, tau=100)
    df = res.to_frame()
    polca = df[df.source == "polca:0"]
    assert set(polca.hom_kind) == {1.0} and polca.hidden.sum() == 1
    assert res.figure().data and res.summary("kind")["polca_max_kind_homogeneity"] == 1.0


def test_paper_carry_homogeneity_definition():
    """Our reading of the paper's carry homogeneity (Table 1; UNCERTAIN, see addition_carry_summary): the fraction
    of a cluster's tokens that carry, over clusters whose carry tokens are > 85 % 10s/100s digits; a cluster of units
    digits (never a carry) scores 0, not 1."""
    # 12 tokens: digit 0 = 1000s ... 3 = units
    digit = np.array([3, 3, 3, 3, 2, 2, 1, 1, 0, 0, 0, 0])
    carry = np.array([0, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 0])
    lab = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    assert homogeneity(lab, carry)[0] == 1.0                    # majority-label share: units cluster looks pure
    assert label_fraction(lab, carry) == {0: 0.0, 1: 0.75, 2: 0.75}
    res = PolcaResult(steps=[0], tau=0, kept=torch.ones(1, dtype=torch.bool), traj=torch.zeros(12, 1, 1),
                      exact=torch.zeros(12, 1), assignments={"polca:0": lab, "exact": np.zeros(12, dtype=int),
                                                             "exact_change": -np.ones(12, dtype=int)},
                      clusters=[{"source": "polca:0", "cluster": c, "hidden": c == 1} for c in range(3)]
                      + [{"source": "exact", "cluster": 0, "hidden": False}])
    s = addition_carry_summary(res, digit, carry)
    # cluster 2 (1000s carries) is not eligible; cluster 0 has no carry token; cluster 1: 3 of 4 carry
    assert s["polca"]["max_carry_fraction"] == 0.75 and s["polca"]["cluster"] == 1 and s["polca"]["n_eligible"] == 1
    assert s["polca"]["recall"] == 3 / 6 and abs(s["polca"]["hidden_fraction"] - 1 / 3) < 1e-12
    # one cluster of everything: 6 carries, only 3 of them 10s/100s (50 % <= 85 %): not eligible
    assert np.isnan(s["exact"]["max_carry_fraction"]) and s["exact"]["n_clusters"] == 1
    assert s["exact_change"]["n_clusters"] == 0


def test_exact_baselines_cluster_loss_and_its_changes():
    """The paper's baselines: "exact" clusters the raw loss trajectories L(x, θ_t) (so two groups with the same loss
    drop but different loss levels separate), "exact_change" their per-interval changes (which do not differ)."""
    steps = list(range(0, 200, 10))
    t = torch.tensor(steps, dtype=torch.float)
    drop = 1 - torch.sigmoid((t - 60) / 5)
    g = torch.Generator().manual_seed(0)
    exact = torch.cat([3 + drop.expand(60, -1), 1 + drop.expand(60, -1)]) + 0.01 * torch.randn(120, 20, generator=g)
    traj = (exact - exact[:, :1])[:, None]
    res = analyse(traj, exact, steps, {"level": np.array([0] * 60 + [1] * 60)}, delta=20, tau=100)
    ex = res.assignments["exact"]
    assert (ex[:60] >= 0).mean() > 0.9 and (ex[60:] >= 0).mean() > 0.9
    assert set(ex[:60][ex[:60] >= 0]).isdisjoint(ex[60:][ex[60:] >= 0])
    ch = res.assignments["exact_change"]           # same changes: no split by level (here: one noisy blob)
    split = ((ch[:60] >= 0).mean() > 0.9 and (ch[60:] >= 0).mean() > 0.9
             and set(ch[:60][ch[:60] >= 0]).isdisjoint(ch[60:][ch[60:] >= 0]))
    assert not split
    assert "exact" in set(res.to_frame().source)


def test_span_diagnostics_interval_hook():
    """Each interval's terms go through the ``interval`` hook (the recipe stores them as stages): values handed back
    by the hook are used as they are, and the result equals the plain run and polca_trajectories."""
    model = _mlp()
    space = ParamSpace(model)
    ex = _data(8)
    theta = space.flatten()
    thetas = torch.stack([theta, theta + 0.01 * torch.randn(space.numel, generator=torch.Generator().manual_seed(4)),
                          theta + 0.02 * torch.randn(space.numel, generator=torch.Generator().manual_seed(5))])
    B, _ = torch.linalg.qr(torch.randn(space.numel, 3, generator=torch.Generator().manual_seed(6)))
    store: dict = {}

    def keep(t, compute):
        return store.setdefault(t, compute())
    a = span_diagnostics(space, loss_fn, ex, B, thetas, interval=keep)
    assert sorted(store) == [0, 1]
    b = span_diagnostics(space, loss_fn, ex, B, thetas, interval=lambda t, compute: store[t])   # read back only
    torch.testing.assert_close(a["trajectories"], b["trajectories"], atol=0, rtol=0)
    torch.testing.assert_close(a["trajectories"], span_diagnostics(space, loss_fn, ex, B, thetas)["trajectories"],
                               atol=0, rtol=0)
    torch.testing.assert_close(a["trajectories"], polca_trajectories(space, loss_fn, ex, B, thetas))
    torch.testing.assert_close(a["exact"], exact_losses(space, loss_fn, ex, thetas))
    with pytest.raises(ValueError, match="lack"):
        span_diagnostics(space, loss_fn, ex, B, thetas, interval=lambda t, compute: {"first": store[t]["first"]})


def test_bad_inputs(tmp_path):
    model = _mlp()
    space = ParamSpace(model)
    theta = space.flatten()
    with pytest.raises(ValueError, match="basis"):
        first_order(model, loss_fn, _data(), torch.zeros(3, 2), theta, theta)
    with pytest.raises(ValueError, match="theta_next"):
        first_order(model, loss_fn, _data(), torch.zeros(space.numel, 2), theta, theta[:-1])
    with pytest.raises(ValueError, match="every"):
        CheckpointRecorder(model, tmp_path, every=0)
    with pytest.raises(FileNotFoundError):
        load_checkpoints(tmp_path / "none")
    with pytest.raises(ValueError, match="per-example"):
        first_order(model, lambda m, e: loss_fn(m, e).mean(), _data(), torch.zeros(space.numel, 1), theta, theta)


class _Quad(nn.Module):
    """Per-example quadratics ``L_x(θ) = ½ θᵀA_xθ − g_xᵀθ`` of a 2-parameter θ (examples = indices)."""

    def __init__(self, A, g):
        super().__init__()
        self.theta = nn.Parameter(torch.tensor([1.0, 1.0]))
        self.A, self.g = A, g

    def forward(self, idx):
        A, g, th = self.A[idx], self.g[idx], self.theta
        return 0.5 * torch.einsum("i,nij,j->n", th, A, th) - g @ th


def _quad_loss(model, idx):
    return model(idx)


def test_two_parameter_quadratic_by_hand():
    """Hand computation (issue #18): θ_t = (1, 1) -> θ_{t+1} = (0.5, 2), Δθ = (−0.5, 1).
    x1: A = diag(4, 1), g = (1, 0): ∇L = (3, 1), ΔL = 2.0 − 1.5 = 0.5;
    x2: A = diag(2, 3), g = (0, 1): ∇L = (2, 2), ΔL = 4.25 − 1.5 = 2.75.
    Mean Hessian diag(3, 2): Algorithm 1 picks e1 (λ = 3) then e2.
    POLCA₁ = ⟨b,∇L⟩⟨b,Δθ⟩: x1 (−1.5, 1), x2 (−1, 2); h = ½ bᵀA_x b ⟨b,Δθ⟩²: x1 (0.5, 0.5), x2 (0.25, 1.5);
    sums 0.5 and 2.75 = the exact change (a quadratic whose Hessians share the basis' eigenvectors)."""
    A = torch.stack([torch.diag(torch.tensor([4.0, 1.0])), torch.diag(torch.tensor([2.0, 3.0])),
                     torch.tensor([[2.0, 1.0], [1.0, 2.0]])])
    g = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    model = _Quad(A, g)
    space = ParamSpace(model)
    th0, th1 = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 2.0])
    two = torch.tensor([0, 1])
    B = build_basis(space, _quad_loss, two, torch.stack([th0, th1]), at=[0, 1], k=1, n_iter=2)
    torch.testing.assert_close(B.abs(), torch.eye(2), atol=1e-6, rtol=0)
    p1, h = second_order(space, _quad_loss, two, B, th0, th1)
    torch.testing.assert_close(p1, torch.tensor([[-1.5, 1.0], [-1.0, 2.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(h, torch.tensor([[0.5, 0.5], [0.25, 1.5]]), atol=1e-6, rtol=0)
    change = exact_losses(space, _quad_loss, two, torch.stack([th0, th1]))
    torch.testing.assert_close(change[:, 1] - change[:, 0], torch.tensor([0.5, 2.75]))
    torch.testing.assert_close((p1 + h).sum(1), torch.tensor([0.5, 2.75]), atol=1e-6, rtol=0)
    traj = polca_trajectories(space, _quad_loss, two, B, torch.stack([th0, th1]))
    torch.testing.assert_close(traj[:, :, -1], p1 + h)
    # x3: A = [[2, 1], [1, 2]] is not diagonal in the basis: POLCA keeps only the diagonal curvature terms, so it
    # misses the cross term s1·s2·A_12 = (−0.5)(1)(1): POLCA 2.75 (= −1.5 + 0.25 + 3 + 1) vs exact 5.25 − 3 = 2.25
    p1, h = second_order(space, _quad_loss, torch.tensor([2]), torch.eye(2), th0, th1)
    torch.testing.assert_close(p1 + h, torch.tensor([[-1.25, 4.0]]), atol=1e-6, rtol=0)
    ex3 = exact_losses(space, _quad_loss, torch.tensor([2]), torch.stack([th0, th1]))
    torch.testing.assert_close(ex3[0, 1] - ex3[0, 0], torch.tensor(2.25))


def test_span_diagnostics_on_quadratic():
    """Complete eigenbasis of commuting quadratics: POLCA, the exact change along each b and in the span all equal
    the exact change (R² = 1, the whole step in span). One basis vector (e1): the span holds |Δθ_1|/|Δθ| of the step
    and POLCA equals the exact change along e1 (a quadratic: second order is exact), but not the total change."""
    from interp.dynamics import span_diagnostics
    A = torch.stack([torch.diag(torch.tensor([4.0, 1.0])), torch.diag(torch.tensor([2.0, 3.0])),
                     torch.diag(torch.tensor([1.0, 5.0]))])
    g = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    space = ParamSpace(_Quad(A, g))
    thetas = torch.tensor([[1.0, 1.0], [0.5, 2.0], [0.0, 1.5]])
    ex = torch.arange(3)
    d = span_diagnostics(space, _quad_loss, ex, torch.eye(2), thetas)
    assert all(abs(v["total"] - 1) < 1e-5 and abs(v["per_interval"] - 1) < 1e-5
               for k, v in d["r2"].items() if k != "polca_first_order")
    torch.testing.assert_close(d["frac_in_span"], torch.ones(2))
    e1 = span_diagnostics(space, _quad_loss, ex, torch.tensor([[1.0], [0.0]]), thetas)
    torch.testing.assert_close(e1["frac_in_span"], torch.tensor([0.5 / 1.25 ** 0.5, 0.5 / 0.5 ** 0.5]))
    torch.testing.assert_close((e1["first"] + e1["second"])[:, 0], e1["exact_along_b"][:, 0], atol=1e-6, rtol=0)
    assert abs(e1["r2_taylor"] - 1) < 1e-5 and e1["r2"]["polca"]["total"] < 0.9
