"""Tests for models.bayesian_tpnn (Bayesian-TPNN, ICLR 2026) and its validation (interp.benchmarks.bayesian_tpnn).

Default tests: basis identities, the analytic Langevin gradient against autograd, acceptance ratios against a
hand computation, a prior-only chain that must reproduce the prior (checks every reversible-jump ratio at
once), state invariants after every move, and a small run whose true components must outrank all others.
The digest's criteria on the full validation (selection, RMSE, the two stepwise ablations, breast cancer) are the
recipe's claims (benchmarks/bayesian_tpnn/claims.yaml, checked by tests/reproduce); ``slow`` keeps the planted-error
checks and the full-run assertions no claim makes (stepwise acceptance in every hierarchical seed, diabetes).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from interp.benchmarks.bayesian_tpnn import (
    BayesianTPNNResult, BayesianTPNNRunConfig, experiment, merge_ablations, selection_auroc, synthetic_anova,
)
from interp.models.bayesian_tpnn import (
    BayesianTPNN, BayesianTPNNConfig, TPNNNode, node_forward, sample_polya_gamma, tpnn_basis, tpnn_factors,
)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# ---------------------------------------------------------------------------------------------- basis
def test_factor_means_are_zero_even_for_extreme_thresholds():
    rng = np.random.default_rng(0)
    x = rng.random((500, 6))
    b = np.array([0.001, 0.2, 0.5, 0.8, 0.999, 0.5])
    u = np.log(np.array([1e-4, 0.01, 0.05, 0.3, 1e-3, 5.0]))
    h, log_m = tpnn_factors(x, b, u)
    assert np.isfinite(h).all()
    assert np.abs(h.mean(axis=0)).max() <= 1e-8
    # the same log_m reproduces the training factors when passed explicitly (test-time evaluation)
    h2, _ = tpnn_factors(x, b, u, log_m)
    assert np.allclose(h, h2)
    # paper form 1 - s + c s with c = -(1 - m)/m equals our 1 - s/m
    s = _sigmoid((x[:, 2] - b[2]) / np.exp(u[2]))
    m = s.mean()
    assert np.allclose(1 - s + (-(1 - m) / m) * s, h[:, 2])


def test_interaction_node_integrates_to_zero_along_each_input():
    rng = np.random.default_rng(1)
    x = rng.random((400, 4))
    S, b, u = (0, 2, 3), np.array([0.3, 0.6, 0.45]), np.log(np.array([0.02, 0.1, 0.01]))
    _, log_m, _ = node_forward(x[:, list(S)], b, u, need_grad=False)
    node = TPNNNode(S, b, u, log_m)
    args = [a[None] for a in (np.array(S), np.ones(3, bool), b, u, log_m)]
    for pos, j in enumerate(S):
        fixed = rng.random(4)
        grid = np.tile(fixed, (400, 1))
        grid[:, j] = x[:, j]          # x_j runs over its empirical marginal, the other inputs are held fixed
        phi = tpnn_basis(grid, *args)[:, 0]
        assert abs(phi.mean()) <= 1e-8, f"not centred along input {j}"
    assert node.order == 3


def test_vectorised_basis_matches_per_node_products():
    rng = np.random.default_rng(2)
    x = rng.random((300, 5))
    nodes = []
    for S in [(0,), (1, 3), (0, 2, 4), (4,)]:
        b, u = rng.uniform(0.1, 0.9, len(S)), np.log(rng.uniform(0.005, 0.2, len(S)))
        _, log_m, _ = node_forward(x[:, list(S)], b, u, need_grad=False)
        nodes.append(TPNNNode(S, b, u, log_m))
    from interp.models.bayesian_tpnn import _pad_nodes

    Phi = tpnn_basis(x, *_pad_nodes(nodes))
    x_new = rng.random((50, 5))
    Phi_new = tpnn_basis(x_new, *_pad_nodes(nodes))
    for k, nd in enumerate(nodes):
        h, _ = tpnn_factors(x[:, list(nd.S)], nd.b, nd.u)
        assert np.allclose(Phi[:, k], h.prod(axis=1), atol=1e-12)
        h_new, _ = tpnn_factors(x_new[:, list(nd.S)], nd.b, nd.u, nd.log_m)
        assert np.allclose(Phi_new[:, k], h_new.prod(axis=1), atol=1e-12)


def test_langevin_gradient_matches_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.random((200, 3))
    b, u = np.array([0.3, 0.55, 0.7]), np.log(np.array([0.05, 0.2, 0.02]))
    phi, log_m, J = node_forward(x, b, u)
    xt = torch.tensor(x, dtype=torch.float64)
    theta = torch.tensor(np.concatenate([b, u]), dtype=torch.float64, requires_grad=True)
    z = (xt - theta[:3]) / torch.exp(theta[3:])
    s = torch.sigmoid(z)
    phi_t = (1 - s / s.mean(0)).prod(1)
    assert np.allclose(phi_t.detach().numpy(), phi, atol=1e-12)
    J_t = torch.autograd.functional.jacobian(
        lambda th: (1 - torch.sigmoid((xt - th[:3]) / torch.exp(th[3:]))
                    / torch.sigmoid((xt - th[:3]) / torch.exp(th[3:])).mean(0)).prod(1), theta)
    assert np.allclose(J_t.numpy(), J, rtol=1e-8, atol=1e-8)


# ---------------------------------------------------------------------------------------------- priors
def _prepared(n=6, p=3, seed=0, weights=(0.5, 0.2, 0.3), **kw):
    rng = np.random.default_rng(seed)
    X = rng.random((n, p))
    y = rng.standard_normal(n)
    model = BayesianTPNN(BayesianTPNNConfig(n_iter=10, burn_in=0, **kw))
    model.prepare(X, y, input_weights=None if weights is None else np.array(weights), seed=seed)
    return model, X, y


def test_prior_on_sets_is_normalised_and_sampled_correctly():
    model, _, _ = _prepared(n=10, p=5, weights=(0.4, 0.1, 0.2, 0.05, 0.25))
    assert model.max_order == 4                    # the default cap admits order-4 components
    subsets = [S for d in range(1, 5) for S in itertools.combinations(range(5), d)]
    dens = np.array([math.exp(model.log_prior_S(S)) for S in subsets])
    assert abs(dens.sum() - 1.0) < 1e-12
    assert model.log_prior_S((0, 1, 2, 3, 4)) == -np.inf
    # P(S | d) ∝ prod p_input by brute force
    pin = model.p_input
    for d in range(1, 5):
        sub = [S for S in subsets if len(S) == d]
        w = np.array([np.prod(pin[list(S)]) for S in sub])
        got = np.array([math.exp(model.log_prior_S(S)) for S in sub]) * 4
        assert np.allclose(got, w / w.sum())
    draws = [model._sample_S() for _ in range(20000)]
    freq = np.array([sum(1 for s in draws if s == S) for S in subsets]) / len(draws)
    assert 0.5 * np.abs(freq - dens).sum() < 0.02


def _finite_diff_jacobian(fn, theta, h=1e-6):
    return np.stack([(fn(theta + h * e) - fn(theta - h * e)) / (2 * h) for e in np.eye(len(theta))], axis=1)


@pytest.mark.parametrize("proposal", ["laplace", "fixed"])
def test_birth_and_death_acceptance_match_hand_computation(proposal):
    model, X, y = _prepared(stepwise_proposal=proposal)
    cfg = model.config
    y_std = (y - y.mean()) / y.std()
    Xs = (X - X.min(0)) / (X.max(0) - X.min(0))
    n = len(y)
    sigma2, tau2 = 0.4, cfg.beta_prior_sd ** 2
    st = model.state_from_nodes([((0,), [0.4], [0.05])], sigma2)

    def col(S, b, g):
        out = np.ones(n)
        for j, bj, gj in zip(S, b, g):
            s = _sigmoid((Xs[:, j] - bj) / gj)
            out *= 1 - s / s.mean()
        return out

    S_new, b_new, g_new = (0, 2), np.array([0.41, 0.7]), np.array([0.06, 0.02])
    node, phi = model._make_node(list(S_new), b_new, np.log(g_new))
    assert np.allclose(phi, col(S_new, b_new, g_new))

    Phi_old = col((0,), [0.4], [0.05])[:, None]
    Phi_new = np.column_stack([Phi_old, phi])
    mvn = stats.multivariate_normal
    d_ll = (mvn.logpdf(y_std, np.zeros(n), sigma2 * np.eye(n) + tau2 * Phi_new @ Phi_new.T)
            - mvn.logpdf(y_std, np.zeros(n), sigma2 * np.eye(n) + tau2 * Phi_old @ Phi_old.T))
    pin = 0.5 * np.array([0.5, 0.2, 0.3]) + 0.5 / 3
    e2 = pin[0] * pin[1] + pin[0] * pin[2] + pin[1] * pin[2]
    log_pi_S = math.log(1 / 3) + math.log(pin[0] * pin[2] / e2)
    log_pi_bu = sum(stats.gamma.logpdf(g, cfg.gamma_shape, scale=cfg.gamma_scale) + math.log(g) for g in g_new)
    log_pi_node = log_pi_S + log_pi_bu
    tot = cfg.p_birth + cfg.p_stepwise + cfg.p_death + cfg.p_add + cfg.p_delete + cfg.p_change
    p_b, p_sb, p_d = cfg.p_birth / tot, cfg.p_stepwise / tot, cfg.p_death / tot
    # proposal sd of the copied (b, log gamma) of the parent {x1}
    if proposal == "fixed":
        sd_b, sd_u = 0.02, 0.1
    else:
        # Laplace spread: beta_hat = E[beta | parent, sigma^2] (one node: a scalar ridge solution), Fisher
        # information of (b, log gamma) by finite differences of the hand-written column, prior precisions
        # 12 (U(0,1)) and 1/trigamma(1) = 6/pi^2 (log of an exponential variable)
        ph = Phi_old[:, 0]
        beta_hat = (ph @ y_std / sigma2) / (ph @ ph / sigma2 + 1 / tau2)
        J = _finite_diff_jacobian(lambda th: col((0,), [th[0]], [math.exp(th[1])]),
                                  np.array([0.4, math.log(0.05)]))
        F = beta_hat ** 2 / sigma2 * (J ** 2).sum(axis=0)
        sd_b, sd_u = 1 / np.sqrt(F + np.array([12.0, 6 / math.pi ** 2]))
    # stepwise from the single parent {x1}: add x3 with prob pin[2] / (1 - pin[0]), new (b, gamma) from the prior
    log_q_sb = (math.log(pin[2] / (1 - pin[0]))
                + stats.gamma.logpdf(g_new[1], cfg.gamma_shape, scale=cfg.gamma_scale) + math.log(g_new[1])
                + stats.norm.logpdf(0.41, 0.4, sd_b) + stats.norm.logpdf(math.log(0.06), math.log(0.05), sd_u))
    log_q = math.log(p_b * math.exp(log_pi_node) + p_sb * math.exp(log_q_sb))
    hand = d_ll - cfg.c0 * math.log(n) + log_pi_node + math.log(p_d) - log_q
    got = model.log_accept_birth(st, node, phi)
    assert got == pytest.approx(hand, rel=1e-6, abs=1e-6)

    # the death of that node from the grown state is the exact reverse
    st2 = model.state_from_nodes([((0,), [0.4], [0.05]), (S_new, b_new, g_new)], sigma2)
    assert model.log_accept_death(st2, 1) == pytest.approx(-got, rel=1e-9, abs=1e-9)

    # from the empty state only birth is possible: ratio = LR e^{-C0 log n} p_death(1) / 1 (proposal = prior)
    st0 = model.state_from_nodes([], sigma2)
    node1, phi1 = model._make_node([1], np.array([0.3]), np.log(np.array([0.01])))
    d_ll1 = (mvn.logpdf(y_std, np.zeros(n), sigma2 * np.eye(n) + tau2 * np.outer(phi1, phi1))
             - mvn.logpdf(y_std, np.zeros(n), sigma2 * np.eye(n)))
    assert model.log_accept_birth(st0, node1, phi1) == pytest.approx(
        d_ll1 - cfg.c0 * math.log(n) + math.log(p_d), rel=1e-9, abs=1e-9)


def test_edge_moves_are_exact_reverses():
    model, X, y = _prepared(n=8, p=4, weights=(0.1, 0.4, 0.3, 0.2))
    st = model.state_from_nodes([((0, 2), [0.3, 0.6], [0.02, 0.05]), ((1,), [0.5], [0.01])], 0.3)
    # add x4 to node 0 and delete it again
    new, phi = model._make_node([0, 2, 3], np.array([0.3, 0.6, 0.8]), np.log(np.array([0.02, 0.05, 0.03])))
    la_add = model.log_accept_add(st, 0, new, phi, 3)
    st_big = model.state_from_nodes([((0, 2, 3), [0.3, 0.6, 0.8], [0.02, 0.05, 0.03]), ((1,), [0.5], [0.01])], 0.3)
    back, phi_b = model._make_node([0, 2], np.array([0.3, 0.6]), np.log(np.array([0.02, 0.05])))
    assert model.log_accept_delete(st_big, 0, back, phi_b, 3) == pytest.approx(-la_add, abs=1e-9)
    # hand value of the proposal part of the add ratio: p_del/|S'| / (p_add p_in(4)/Z)
    pin = model.p_input
    G, c = model._replace(st, 0, phi)
    d_ll = model.log_ml(G, c, 0.3) - model.log_ml(st.G, st.c, 0.3)
    hand = (d_ll + model.log_prior_S((0, 2, 3)) - model.log_prior_S((0, 2))
            + math.log(1 / 3) - math.log(pin[3] / (1 - pin[0] - pin[2])))   # p_add = p_delete
    assert la_add == pytest.approx(hand, abs=1e-9)
    # change x3 -> x2 in node 0 and back
    ch, phi_c = model._make_node([0, 1], np.array([0.3, 0.45]), np.log(np.array([0.02, 0.07])))
    la_ch = model.log_accept_change(st, 0, ch, phi_c, 2, 1)
    st_ch = model.state_from_nodes([((0, 1), [0.3, 0.45], [0.02, 0.07]), ((1,), [0.5], [0.01])], 0.3)
    assert model.log_accept_change(st_ch, 0, st.nodes[0], st.Phi[:, 0], 1, 2) == pytest.approx(-la_ch, abs=1e-9)


def _prior_only_chain(plant: str | None = None):
    """A chain with the likelihood switched off, non-uniform ``p_input`` and order prior, order cap 4 on 5
    inputs (so order-4 sets are reachable by birth, stepwise birth and edge add). ``plant="no_mixture"`` drops
    the stepwise term from the creation density (a planted detailed-balance error)."""
    rng = np.random.default_rng(0)
    X = rng.random((20, 5))
    cfg = BayesianTPNNConfig(n_iter=1500, burn_in=100, c0=0.25, max_nodes=6, sample_prior=True, max_order=4,
                             structure_moves_per_iter=8, order_weights=(0.4, 0.3, 0.2, 0.1), p_birth=0.1,
                             p_stepwise=0.1, p_death=0.1, p_add=0.3, p_delete=0.3, p_change=0.3)
    model = BayesianTPNN(cfg)
    if plant == "no_mixture":
        model.log_q_stepwise = lambda *a: -np.inf
    model.fit(X, rng.standard_normal(20), seed=0, input_weights=np.array([0.35, 0.25, 0.2, 0.12, 0.08]))
    K = model.trace_["K"][cfg.burn_in:]
    expected = np.exp(-cfg.c0 * math.log(20) * np.arange(7))
    expected /= expected.sum()
    tv_K = 0.5 * np.abs(np.bincount(K, minlength=7) / len(K) - expected).sum()
    sets = [S for state in model.trace_["sets"][cfg.burn_in:] for S in state]
    subsets = [S for d in range(1, 5) for S in itertools.combinations(range(5), d)]
    freq = np.array([sets.count(S) for S in subsets]) / len(sets)
    dens = np.array([math.exp(model.log_prior_S(S)) for S in subsets])
    tv_S = 0.5 * np.abs(freq - dens).sum()
    return model, tv_K, tv_S, freq, subsets


def test_prior_only_chain_samples_the_prior():
    """With the likelihood switched off the chain must sample the prior: K ~ exp(-C0 K log n) truncated at
    max_nodes, node sets ~ pi(S) (orders 1..4), thresholds U(0,1), log gamma ~ log Gamma(1, 0.01). This checks
    the birth / stepwise-birth mixture density (with the Laplace-scaled stepwise proposal), death and the three
    edge moves together. Correct code: TV(K) ~0.02, TV(S) ~0.05; the planted error of
    ``test_prior_only_chain_catches_a_planted_error`` moves them well above the thresholds."""
    model, tv_K, tv_S, freq, subsets = _prior_only_chain()
    assert tv_K < 0.06, tv_K
    assert tv_S < 0.08, tv_S
    order4 = sum(f for S, f in zip(subsets, freq) if len(S) == 4)
    assert 0.06 < order4 < 0.14, order4               # prior mass of order 4: 0.1
    # the stepwise birth is accepted (before the redesign: 0.2-0.3% of proposals in prior-only runs)
    assert model.acceptance_["stepwise"] > 0.005, model.acceptance_
    b = np.concatenate([dr["b"][dr["mask"]] for dr in model.draws_])
    u = np.concatenate([dr["u"][dr["mask"]] for dr in model.draws_])
    assert abs(b.mean() - 0.5) < 0.04
    assert abs(u.mean() - (np.log(0.01) - np.euler_gamma)) < 0.15


@pytest.mark.slow
def test_prior_only_chain_catches_a_planted_error():
    _, tv_K, tv_S, _, _ = _prior_only_chain(plant="no_mixture")
    assert tv_K > 0.06 or tv_S > 0.08, (tv_K, tv_S)


def _geweke_exact_start(n_rep: int = 600, n_steps: int = 2, seed: int = 0, plant: str | None = None,
                        likelihood: str = "gaussian") -> dict:
    """Exact-start Geweke test of the full posterior kernel (likelihood included): draw ``(theta, y)`` from the
    joint prior (K, node sets, thresholds, temperatures, beta, sigma^2 or the intercept, then y), run ``n_steps``
    MCMC iterations on ``y`` from the true ``theta``; the result must again follow the prior. For the logistic
    likelihood the Polya-Gamma weights start at their exact conditional ``omega ~ PG(1, f)``. Returns p-values of
    K (chi-square), node orders (chi-square), first thresholds ~ U(0,1), beta ~ N(0, 1) and sigma^2 ~ IG or
    beta_0 ~ N(0, 1) (KS)."""
    n, p = 15, 4
    rng0 = np.random.default_rng(seed)
    X = rng0.random((n, p))
    logistic = likelihood == "logistic"
    cfg = BayesianTPNNConfig(n_iter=10, burn_in=0, c0=0.25, max_nodes=5, max_order=3, structure_moves_per_iter=5,
                             order_weights=(0.5, 0.3, 0.2), likelihood=likelihood, intercept_prior_sd=1.0)
    model = BayesianTPNN(cfg)
    y0 = (np.arange(n) % 2).astype(float) if logistic else rng0.standard_normal(n)
    model.prepare(X, y0, input_weights=np.array([0.4, 0.3, 0.2, 0.1]), seed=seed)
    model.sig_a, model.sig_b = 3.0, 0.6                 # a data-free sigma^2 prior (the default is calibrated)
    if plant == "no_mixture":
        model.log_q_stepwise = lambda *a: -np.inf
    rng = model.rng
    pk = np.exp(-cfg.c0 * math.log(n) * np.arange(cfg.max_nodes + 1))
    pk /= pk.sum()
    Ks, s2, orders, bs, betas = [], [], [], [], []
    counts = {m: [0, 0] for m in ("birth", "stepwise", "death", "add", "delete", "change")}
    for _ in range(n_rep):
        K = int(rng.choice(len(pk), p=pk))
        nodes = []
        for _ in range(K):
            S = model._sample_S()
            nodes.append((S, rng.random(len(S)), np.exp(model._sample_u(len(S)))))
        sigma2 = 1.0 if logistic else model.sig_b / rng.gamma(model.sig_a)
        st = model.state_from_nodes(nodes, sigma2)
        st.beta = rng.standard_normal(K) * math.sqrt(model.tau2)
        if logistic:
            model.beta0 = float(rng.standard_normal())
            f = model.beta0 + st.Phi @ st.beta
            y = (rng.random(n) < 1 / (1 + np.exp(-f))).astype(float)
            model.labels, model.kappa = y, y - 0.5
            model.set_omega(sample_polya_gamma(f, rng))
        else:
            y = st.Phi @ st.beta + math.sqrt(sigma2) * rng.standard_normal(n)
            model.y, model.wz, model.yy = y, y, float(y @ y)
        model.refresh_stats(st)
        for _ in range(n_steps):
            model.iterate(st, counts)
        Ks.append(st.K)
        s2.append(model.beta0 if logistic else st.sigma2)
        orders += [nd.order for nd in st.nodes]
        bs += [float(nd.b[0]) for nd in st.nodes]
        betas += list(st.beta)
    oprob = np.array(cfg.order_weights) / sum(cfg.order_weights)
    last = stats.norm if logistic else stats.invgamma(model.sig_a, scale=model.sig_b)
    return {"K": stats.chisquare(np.bincount(Ks, minlength=len(pk)), pk * n_rep).pvalue,
            "order": stats.chisquare(np.bincount(orders, minlength=4)[1:], oprob * len(orders)).pvalue,
            "b": stats.kstest(bs, "uniform").pvalue, "beta": stats.kstest(betas, "norm").pvalue,
            "sigma2_or_beta0": stats.kstest(s2, last.cdf).pvalue,
            "stepwise_accept": counts["stepwise"][1] / max(counts["stepwise"][0], 1)}


@pytest.mark.parametrize("likelihood", ["gaussian", "logistic"])
def test_exact_start_geweke_full_kernel(likelihood):
    """Correct code, Gaussian: every p-value > 0.1 (K 0.88, order 0.13, b 0.37, beta 0.92, sigma^2 0.38 at
    seed 0). Logistic: the Polya-Gamma / intercept steps and the weighted moves and MALA keep the prior too."""
    res = _geweke_exact_start(likelihood=likelihood)
    assert min(v for k, v in res.items() if k != "stepwise_accept") > 1e-3, res
    assert res["stepwise_accept"] > 0.005, res


@pytest.mark.slow
@pytest.mark.parametrize("likelihood", ["gaussian", "logistic"])
def test_exact_start_geweke_catches_a_planted_error(likelihood):
    """Dropping the stepwise term from the creation density (so stepwise births and deaths use the wrong
    reverse density) is detected (measured: Gaussian order p = 5e-5, K p = 0.003; logistic K p = 2e-10)."""
    res = _geweke_exact_start(plant="no_mixture", likelihood=likelihood)
    assert min(v for k, v in res.items() if k != "stepwise_accept") < 1e-3, res


def test_moves_keep_a_valid_state_and_every_move_is_tried():
    X, y, _ = synthetic_anova(300, seed=4)
    cfg = BayesianTPNNConfig(n_iter=40, burn_in=20, structure_moves_per_iter=10)
    model = BayesianTPNN(cfg)
    checked = []

    def check(it, st):
        model.check_state(st)
        checked.append(it)

    model.fit(X, y, seed=4, callback=check)
    assert len(checked) == cfg.n_iter
    assert all(model.move_counts_[m] > 0 for m in ("birth", "stepwise", "death", "add", "delete", "change"))
    assert model.acceptance_["birth"] > 0


def test_order_four_interaction_is_reachable_and_found():
    """The default order cap (4) admits the paper's order-4 MADELON-type component: a pure 4-way interaction
    (a sign product, no lower-order projection) is found and dominates the posterior."""
    rng = np.random.default_rng(3)
    X = rng.random((300, 5))
    y = np.prod(np.sign(X[:, :4] - 0.5), axis=1) + 0.1 * rng.standard_normal(300)
    model = BayesianTPNN(BayesianTPNNConfig(n_iter=40, burn_in=20)).fit(X, y, seed=3)
    assert model.max_order == 4
    assert next(iter(model.importance_)) == (0, 1, 2, 3), model.importance_
    assert model.inclusion_[(0, 1, 2, 3)] >= 0.9
    with pytest.raises(ValueError, match="max_order"):
        BayesianTPNNConfig(max_order=0)
    assert BayesianTPNN(BayesianTPNNConfig(max_order=None, n_iter=2, burn_in=1)).fit(X[:20], y[:20]).max_order == 5


# ---------------------------------------------------------------------------------------------- logistic
@pytest.mark.parametrize("c", [0.0, 1.5, 8.0])
def test_polya_gamma_draws_match_moments_and_series_representation(c):
    rng = np.random.default_rng(11)
    w = sample_polya_gamma(np.full(20000, c), rng)
    mean = 0.25 if c == 0 else math.tanh(c / 2) / (2 * c)
    var = 1 / 24 if c == 0 else (math.sinh(c) - c) / (4 * c ** 3 * math.cosh(c / 2) ** 2)
    assert abs(w.mean() - mean) < 4 * math.sqrt(var / len(w))
    assert w.var() == pytest.approx(var, rel=0.05)
    # PG(1, c) = (1 / 2 pi^2) sum_k g_k / ((k - 1/2)^2 + c^2 / (4 pi^2)), g_k ~ Exp(1) (truncated at 2000 terms)
    k = np.arange(1, 2001)[:, None]
    ref = (rng.standard_exponential((2000, 4000)) / ((k - 0.5) ** 2 + c ** 2 / (4 * math.pi ** 2))).sum(0)
    assert stats.ks_2samp(w, ref / (2 * math.pi ** 2)).pvalue > 1e-3
    with pytest.raises(ValueError, match="finite"):
        sample_polya_gamma(np.array([np.nan]), rng)


def test_logistic_collapsed_ratio_and_langevin_gradient_match_hand_computation():
    """Given Polya-Gamma weights omega and intercept beta0 the logistic likelihood is the Gaussian kernel of
    z = (y - 1/2)/omega - beta0 with variances 1/omega; the birth ratio must be the ratio of
    N(z; 0, W^{-1} + tau^2 Phi Phi^T) densities, and MALA's gradient the derivative of its log target."""
    rng = np.random.default_rng(5)
    X = rng.random((12, 3))
    y = (rng.random(12) < 0.5).astype(float)
    y[:2] = [0, 1]
    model = BayesianTPNN(BayesianTPNNConfig(likelihood="logistic", n_iter=10, burn_in=0))
    model.prepare(X, y, input_weights=np.array([0.5, 0.2, 0.3]), seed=0)
    omega = rng.uniform(0.05, 0.3, 12)
    model.beta0 = 0.3
    model.set_omega(omega)
    z = (y - 0.5) / omega - 0.3
    tau2 = model.tau2
    st = model.state_from_nodes([((0,), [0.4], [0.05])], 1.0)
    node, phi = model._make_node([1, 2], np.array([0.5, 0.6]), np.log(np.array([0.03, 0.2])))
    Phi0 = st.Phi
    Phi1 = np.column_stack([Phi0, phi])
    mvn = stats.multivariate_normal
    d_ll = (mvn.logpdf(z, np.zeros(12), np.diag(1 / omega) + tau2 * Phi1 @ Phi1.T)
            - mvn.logpdf(z, np.zeros(12), np.diag(1 / omega) + tau2 * Phi0 @ Phi0.T))
    G, c = model._grow(st, phi)
    assert model.log_ml(G, c, 1.0) - model.log_ml(st.G, st.c, 1.0) == pytest.approx(d_ll, rel=1e-9, abs=1e-9)
    model.check_state(st)
    # MALA target: -1/2 sum omega (r - beta phi)^2 + log prior(u); its gradient by finite differences
    r = z - 0.7 * Phi0[:, 0]
    theta = np.array([0.5, 0.6, math.log(0.03), math.log(0.2)])
    lp, grad, _, _, _ = model._mala_target((1, 2), theta, r, -1.3, 1.0)
    fd = _finite_diff_jacobian(lambda th: np.array([model._mala_target((1, 2), th, r, -1.3, 1.0)[0]]), theta)[0]
    assert np.allclose(grad, fd, rtol=1e-5, atol=1e-5)
    # the intercept / omega step keeps W-weighted statistics consistent
    st.beta = np.array([0.5])
    model.gibbs_intercept_omega(st)
    model.check_state(st)
    assert (model.w > 0).all() and model.w is not omega


def test_small_logistic_run_finds_components_and_classifies():
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(8)
    X = rng.random((900, 4))
    f = 2.5 * np.sin(2 * np.pi * X[:, 0]) + 2 * np.sign(X[:, 1] - 0.5) * np.sign(X[:, 2] - 0.5)
    y = (rng.random(900) < 1 / (1 + np.exp(-f))).astype(float)
    checked = []
    model = BayesianTPNN(BayesianTPNNConfig(likelihood="logistic", n_iter=100, burn_in=50))
    model.fit(X[:600], y[:600], seed=8, callback=lambda it, st: checked.append(model.check_state(st)))
    assert len(checked) == 100
    top2 = set(list(model.importance_)[:2])
    assert top2 == {(0,), (1, 2)}, model.importance_
    proba = model.predict_proba(X[600:])
    assert ((proba > 0) & (proba < 1)).all()
    auc = roc_auc_score(y[600:], proba)
    auc_lr = roc_auc_score(y[600:], LogisticRegression().fit(X[:600], y[:600]).predict_proba(X[600:])[:, 1])
    auc_true = roc_auc_score(y[600:], f[600:])
    assert auc > auc_lr + 0.15 and auc > auc_true - 0.05, (auc, auc_lr, auc_true)   # measured 0.891, 0.660, 0.924
    assert set(np.unique(model.predict(X[600:]))) <= {0, 1}
    with pytest.raises(ValueError, match="binary"):
        BayesianTPNN(BayesianTPNNConfig(likelihood="logistic", n_iter=2, burn_in=1)).fit(X[:10], f[:10])
    with pytest.raises(ValueError, match="logistic"):
        BayesianTPNN(BayesianTPNNConfig(n_iter=2, burn_in=1)).fit(X[:10], f[:10]).predict_proba(X[:2])


# ---------------------------------------------------------------------------------------------- small run
@pytest.fixture(scope="module")
def small_run():
    rng = np.random.default_rng(7)
    X = rng.random((700, 5))
    f = np.sin(2 * np.pi * X[:, 0]) + 4 * (X[:, 1] - 0.5) * (X[:, 2] - 0.5)
    y = f + 0.1 * rng.standard_normal(700)
    cfg = BayesianTPNNConfig(n_iter=250, burn_in=125)
    model = BayesianTPNN(cfg).fit(X[:500], y[:500], seed=7)
    return model, X, y, f


def test_small_run_ranks_true_components_above_all_others(small_run):
    model, X, y, f = small_run
    true = [(0,), (1, 2)]
    imp = model.importance_
    assert min(imp.get(t, 0.0) for t in true) > max((v for S, v in imp.items() if S not in true), default=0.0)
    assert selection_auroc(imp, true, 5, 3) == 1.0
    # the fitted interaction is the true one, centred on the data
    eff = model.component_effect((1, 2), X[:500])
    truth = 4 * (X[:500, 1] - 0.5) * (X[:500, 2] - 0.5)
    assert np.corrcoef(eff, truth)[0, 1] > 0.9
    assert abs(model.component_effect((0,), X[:500]).mean()) < 1e-8


def test_small_run_predicts_as_well_as_gradient_boosting(small_run):
    from interp.benchmarks.bayesian_tpnn import _hgb_rmse

    model, X, y, _ = small_run
    rmse = np.sqrt(np.mean((model.predict(X[500:]) - y[500:]) ** 2))
    assert rmse <= 1.1 * _hgb_rmse(X[:500], y[:500], X[500:], y[500:], seed=0)[0]


def test_experiment_result_roundtrip(tmp_path):
    cfg = BayesianTPNNConfig(n_iter=40, burn_in=20)
    kw = dict(n_train=300, n_test=100, hierarchical_n=300, hierarchical_iter=20)
    res = experiment(cfg, seed=0, ablation_seeds=(0,), hierarchical_seeds=(0,), diabetes=True, **kw)
    assert isinstance(res, BayesianTPNNResult)
    for ab in (res.ablation, res.ablation_hierarchical):
        assert ab["seeds"] == [0] and len(ab["inclusion_567_on"]) == len(ab["inclusion_567_off"]) == 1
    assert res.diabetes["rmse"] > 0 and res.diabetes["hgb_rmse"] > 0
    frame = res.to_frame()
    assert {"dataset", "component", "importance", "is_true"} <= set(frame.columns)
    assert set(frame["dataset"]) == {"synthetic", "diabetes"}
    assert len(res.ablation_frame()) == 4
    assert "digest_inclusion_567_on" in res.summary()
    assert len(res.figure().data) >= 4
    loaded = BayesianTPNNResult.load(res.save(tmp_path / "r"))
    assert loaded.importance == res.importance and loaded.selection_auroc == res.selection_auroc
    assert loaded.ablation == res.ablation and loaded.diabetes == res.diabetes
    assert np.array_equal(loaded.trace_K, res.trace_K)
    # reproducible for a fixed seed
    again = experiment(cfg, seed=0, ablation_seeds=(), hierarchical_seeds=(), diabetes=False, **kw)
    assert again.importance == res.importance and again.rmse == res.rmse


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="burn_in"):
        BayesianTPNNConfig(n_iter=10, burn_in=10)
    with pytest.raises(ValueError, match="input_importance"):
        BayesianTPNNConfig(input_importance="shap")
    with pytest.raises(ValueError, match="likelihood"):
        BayesianTPNNConfig(likelihood="poisson")
    with pytest.raises(ValueError, match="stepwise_proposal"):
        BayesianTPNNConfig(stepwise_proposal="exact")
    with pytest.raises(ValueError, match="stepwise_scale"):
        BayesianTPNNConfig(stepwise_scale=0.0)
    with pytest.raises(ValueError, match="order_weights"):
        BayesianTPNNConfig(max_order=None, order_weights=(1.0,))
    model = BayesianTPNN(BayesianTPNNConfig(n_iter=5, burn_in=1))
    with pytest.raises(ValueError, match=r"X \[n, p\]"):
        model.fit(np.zeros((5, 2)), np.zeros(4))
    with pytest.raises(RuntimeError, match="fit"):
        model.predict(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="input_weights"):
        model.fit(np.random.rand(10, 2), np.random.rand(10), input_weights=np.array([1.0, -1.0]))


# ---------------------------------------------------------------------------------------------- full validation
def test_recipe_merges_per_seed_ablations_like_one_run():
    """The recipe runs the ablation one seed per unit; merged, the parts equal one run over both seeds."""
    from interp.benchmarks.bayesian_tpnn import stepwise_ablation

    cfg = BayesianTPNNConfig(n_iter=12, burn_in=6)
    both = stepwise_ablation(cfg, [0, 1], 150, hierarchical=True)
    parts = [stepwise_ablation(cfg, [s], 150, hierarchical=True) for s in (0, 1)]
    assert merge_ablations(parts, cfg.n_iter, True) == both
    with pytest.raises(ValueError, match="logistic"):
        BayesianTPNNRunConfig(classification=BayesianTPNNConfig())


@pytest.fixture(scope="module")
def full_result():
    return experiment(seed=0)      # digest defaults: n = 2000, 3000 iterations, burn-in 1000, C0 = 0.5


@pytest.mark.slow
@pytest.mark.xfail(raises=AssertionError, strict=True, reason=(
    "Stepwise births are accepted about once per 400-iteration run on the hierarchical variant (0.094% of ~800 "
    "proposals); seeds 0, 3 and 5 accepted none, so acceptance in every seed does not hold "
    "(see docs/models/bayesian_tpnn.md)."))
def test_full_stepwise_birth_accepted_in_every_hierarchical_seed(full_result):
    assert min(full_result.ablation_hierarchical["stepwise_accept_on"]) > 0


@pytest.mark.slow
def test_full_diabetes(full_result):
    dia = full_result.diabetes
    assert np.isfinite(dia["rmse"]) and dia["hgb_rmse"] > 0
    assert dia["rmse"] < 77.0          # sd of the diabetes target: better than predicting the mean
    assert dia["components"], dia
