"""Bayesian-TPNN sampler: priors, reversible-jump architecture moves, MALA, Gibbs / Polya-Gamma steps.

See the package docstring (:mod:`interp.models.bayesian_tpnn`) for the model and every choice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import stats
from scipy.linalg import cho_solve, solve_triangular
from scipy.special import gammaln, polygamma
from threadpoolctl import threadpool_limits

from interp.progress import progress

from .basis import TPNNNode, _norm_logpdf, _pad_nodes, logsumexp, node_forward, tpnn_basis
from .polya_gamma import sample_polya_gamma

MOVES: tuple[str, ...] = ("birth", "stepwise", "death", "add", "delete", "change")
LIKELIHOODS: tuple[str, ...] = ("gaussian", "logistic")


# ----------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------
@dataclass
class BayesianTPNNConfig:
    """Defaults of the paper (where known) and of the digest's CPU-scale validation.

    ``likelihood``: ``"gaussian"`` (regression, ``sigma^2 ~ IG``) or ``"logistic"`` (binary classification,
    Polya-Gamma augmentation). ``c0``: node-sparsity constant in ``pi(K) ∝ exp(-c0 K log n)`` (digest: 0.5).
    ``max_order``: the largest interaction order a node may have (default 4, the order of the paper's top
    MADELON component; ``None`` means no cap, i.e. the number of inputs). ``order_weights``: prior weights of
    the orders ``1..max_order`` (uniform when None). ``gamma_shape``/``gamma_scale``: Gamma prior of the sigmoid
    temperatures (paper: a=1, b=0.01). ``stepwise_proposal``: ``"laplace"`` (copied parameters jittered with a
    Gaussian whose sd is the parent's Laplace posterior spread times ``stepwise_scale``) or ``"fixed"`` (the
    earlier fixed jitter ``stepwise_jitter_b`` / ``stepwise_jitter_log_gamma``). ``n_iter``/``burn_in``: MCMC
    length (digest: 3000 / 1000). The package docstring lists every choice the paper leaves open.
    """

    likelihood: str = "gaussian"
    n_iter: int = 3000
    burn_in: int = 1000
    thin: int = 2
    c0: float = 0.5
    max_nodes: int = 100
    max_order: int | None = 4
    order_weights: tuple[float, ...] | None = None
    gamma_shape: float = 1.0
    gamma_scale: float = 0.01
    beta_prior_sd: float = 1.0
    intercept_prior_sd: float = 10.0
    sigma_nu: float = 3.0
    sigma_quantile: float = 0.9
    p_birth: float = 0.2
    p_stepwise: float = 0.2
    p_death: float = 0.3
    p_add: float = 0.1
    p_delete: float = 0.1
    p_change: float = 0.1
    stepwise: bool = True
    structure_moves_per_iter: int = 10
    stepwise_proposal: str = "laplace"
    stepwise_scale: float = 1.0
    stepwise_jitter_b: float = 0.02
    stepwise_jitter_log_gamma: float = 0.1
    langevin_step: float = 0.1
    adapt_langevin: bool = True
    target_accept: float = 0.574
    input_importance: str = "gbr"
    input_uniform_mix: float = 0.5
    sample_prior: bool = False

    def __post_init__(self) -> None:
        if self.likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {self.likelihood!r}")
        if self.n_iter < 1 or self.burn_in < 0 or self.burn_in >= self.n_iter:
            raise ValueError(f"need n_iter >= 1 and 0 <= burn_in < n_iter, got n_iter={self.n_iter}, "
                             f"burn_in={self.burn_in}")
        if self.thin < 1:
            raise ValueError(f"thin must be >= 1, got {self.thin}")
        if self.c0 < 0:
            raise ValueError(f"c0 must be >= 0, got {self.c0}")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")
        if self.max_order is not None and (not isinstance(self.max_order, (int, np.integer)) or self.max_order < 1):
            raise ValueError(f"max_order must be a positive integer or None (no cap), got {self.max_order!r}")
        if self.order_weights is not None:
            w = np.asarray(self.order_weights, dtype=float)
            if self.max_order is None:
                raise ValueError("order_weights needs an explicit max_order (one weight per order 1..max_order)")
            if len(w) != self.max_order or (w < 0).any() or w.sum() <= 0:
                raise ValueError(f"order_weights must hold max_order={self.max_order} non-negative weights, "
                                 f"got {self.order_weights}")
        for name in ("gamma_shape", "gamma_scale", "beta_prior_sd", "intercept_prior_sd", "sigma_nu",
                     "stepwise_scale", "stepwise_jitter_b", "stepwise_jitter_log_gamma"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.sigma_quantile < 1:
            raise ValueError(f"sigma_quantile must lie in (0, 1), got {self.sigma_quantile}")
        probs = [self.p_birth, self.p_stepwise, self.p_death, self.p_add, self.p_delete, self.p_change]
        if min(probs) < 0 or self.p_birth + self.p_stepwise <= 0 or self.p_death <= 0:
            raise ValueError(f"move probabilities must be >= 0 with positive birth and death, got {probs}")
        if (self.p_add > 0) != (self.p_delete > 0):
            raise ValueError("p_add and p_delete must be both positive or both zero (they reverse each other)")
        if self.structure_moves_per_iter < 1:
            raise ValueError(f"structure_moves_per_iter must be >= 1, got {self.structure_moves_per_iter}")
        if self.stepwise_proposal not in ("laplace", "fixed"):
            raise ValueError(f"stepwise_proposal must be 'laplace' or 'fixed', got {self.stepwise_proposal!r}")
        if self.langevin_step <= 0 or not 0 < self.target_accept < 1:
            raise ValueError("langevin_step must be > 0 and target_accept in (0, 1)")
        if self.input_importance not in {"gbr", "uniform"}:
            raise ValueError(f"input_importance must be 'gbr' or 'uniform', got {self.input_importance!r}")
        if not 0 <= self.input_uniform_mix <= 1:
            raise ValueError(f"input_uniform_mix must lie in [0, 1], got {self.input_uniform_mix}")


# ----------------------------------------------------------------------------------------------------------
# Sampler state
# ----------------------------------------------------------------------------------------------------------
@dataclass
class _State:
    nodes: list[TPNNNode]
    Phi: np.ndarray            # [n, K]
    G: np.ndarray              # [K, K] = Phi^T W Phi  (W = I for the Gaussian likelihood, diag(omega) logistic)
    c: np.ndarray              # [K] = Phi^T W z       (z: the (working) response, see BayesianTPNN.prepare)
    beta: np.ndarray           # [K]
    sigma2: float              # 1 for the logistic likelihood

    @property
    def K(self) -> int:
        return len(self.nodes)


class BayesianTPNN:
    """Bayesian-TPNN regressor or binary classifier: ``fit(X, y)`` runs the MCMC; ``predict(X)`` (posterior mean
    of ``f`` for regression, the label for classification) and ``predict_proba(X)`` average the kept draws.

    After fitting: ``importance_`` (component tuple -> posterior importance: variance of ``f_S`` on the original
    ``y`` scale, or on the logit scale for classification), ``inclusion_`` (component -> fraction of kept draws
    containing it), ``trace_`` (per-iteration ``K``, ``sigma2``, train RMSE or log-loss and the node sets),
    ``acceptance_`` (move -> acceptance rate), ``move_counts_`` (move -> number of proposals),
    ``stepwise_born_`` (node set -> number of accepted stepwise births that created it).

    Internally every likelihood is handled in one Gaussian form: ``log L = -1/2 sum_i w_i (z_i - f_i)^2 /
    sigma^2 + const`` with ``w = 1, z = standardised y`` (Gaussian) or ``w = omega, z = (y - 1/2)/omega - beta_0``
    given Polya-Gamma variables ``omega`` (logistic), so the collapsed architecture moves, the exact ``beta``
    draws and MALA are shared.
    """

    def __init__(self, config: BayesianTPNNConfig | None = None) -> None:
        self.config = config or BayesianTPNNConfig()

    # ---------------------------------------------------------------- set-up
    def prepare(self, X: np.ndarray, y: np.ndarray, input_weights: np.ndarray | None = None, seed: int = 0) -> None:
        """Scale the data, build ``p_input`` and the priors; ``fit`` calls it (tests call it alone)."""
        cfg = self.config
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
            raise ValueError(f"expected X [n, p] and y [n], got X {X.shape} and y {y.shape}")
        if X.shape[0] < 3:
            raise ValueError(f"need at least 3 samples, got {X.shape[0]}")
        if not (np.isfinite(X).all() and np.isfinite(y).all()):
            raise ValueError("X and y must be finite (no NaN/inf)")
        self.logistic = cfg.likelihood == "logistic"
        if self.logistic and not np.isin(y, (0.0, 1.0)).all():
            raise ValueError(f"likelihood='logistic' needs binary labels y in {{0, 1}}, got values {np.unique(y)[:5]}")
        if self.logistic and not cfg.sample_prior and y.min() == y.max():
            raise ValueError("likelihood='logistic' needs both classes in y")
        self.rng = np.random.default_rng(seed)
        self.n, self.p = X.shape
        self.x_min = X.min(axis=0)
        span = X.max(axis=0) - self.x_min
        self.x_span = np.where(span > 0, span, 1.0)
        self.X = (X - self.x_min) / self.x_span
        if self.logistic:
            # Polya-Gamma form: kappa = y - 1/2, working response z = kappa/omega - beta0, weights omega
            self.y_mean, self.y_scale = 0.0, 1.0
            self.labels = y
            self.kappa = y - 0.5
            self.beta0 = 0.0 if cfg.sample_prior else float(np.log(y.mean() / (1 - y.mean())))
            self.set_omega(np.full(self.n, 0.25))
        else:
            self.y_mean = float(y.mean())
            self.y_scale = float(y.std()) or 1.0
            self.y = (y - self.y_mean) / self.y_scale
            self.w = None
            self.wz = self.y
            self.yy = float(self.y @ self.y)
        self.tau2 = cfg.beta_prior_sd ** 2
        self.log_n = math.log(self.n)

        # input-importance distribution p_input (mixed with uniform for irreducibility)
        if input_weights is not None:
            w = np.asarray(input_weights, dtype=np.float64)
            if w.shape != (self.p,) or (w < 0).any() or w.sum() <= 0:
                raise ValueError(f"input_weights must be {self.p} non-negative numbers with a positive sum")
            w = w / w.sum()
        elif cfg.input_importance == "gbr" and not cfg.sample_prior:
            from sklearn.ensemble import GradientBoostingClassifier, GradientBoostingRegressor
            gb = GradientBoostingClassifier if self.logistic else GradientBoostingRegressor
            w = gb(random_state=seed).fit(self.X, y if self.logistic else self.y).feature_importances_
            w = w / w.sum() if w.sum() > 0 else np.full(self.p, 1.0 / self.p)
        else:
            w = np.full(self.p, 1.0 / self.p)
        self.p_input = (1 - cfg.input_uniform_mix) * w + cfg.input_uniform_mix / self.p
        self.p_input = self.p_input / self.p_input.sum()
        if (self.p_input <= 0).any():
            raise ValueError("p_input gives some input zero probability; use input_uniform_mix > 0 or positive "
                             "input_weights so the chain can reach every input")
        self.log_p_input = np.log(self.p_input)

        # prior on |S| and the elementary-symmetric tables of P(S | d) ∝ prod p_input(j)
        self.max_order = self.p if cfg.max_order is None else min(cfg.max_order, self.p)
        ow = np.ones(self.max_order) if cfg.order_weights is None else np.asarray(cfg.order_weights, float)
        ow = ow[: self.max_order]
        if ow.sum() <= 0:
            raise ValueError("order_weights put no mass on orders <= number of inputs")
        self.log_order_prob = np.full(self.max_order + 1, -np.inf)
        with np.errstate(divide="ignore"):
            self.log_order_prob[1:] = np.log(ow / ow.sum())
        E = np.zeros((self.p + 1, self.max_order + 1))
        E[self.p, 0] = 1.0
        for j in range(self.p - 1, -1, -1):
            E[j, 0] = 1.0
            E[j, 1:] = E[j + 1, 1:] + self.p_input[j] * E[j + 1, :-1]
        self._esym = E

        # sigma^2 prior IG(nu/2, nu*lambda/2), lambda calibrated as in BART
        if cfg.sample_prior or self.logistic:
            sigma_hat2 = 1.0
        else:
            design = np.column_stack([np.ones(self.n), self.X])
            resid = self.y - design @ np.linalg.lstsq(design, self.y, rcond=None)[0]
            dof = self.n - design.shape[1]
            sigma_hat2 = float(resid @ resid / dof) if dof > 0 else float(self.y.var())
            sigma_hat2 = max(sigma_hat2, 1e-6)
        self.sig_a = cfg.sigma_nu / 2
        self.sig_b = cfg.sigma_nu * (sigma_hat2 * stats.chi2.ppf(1 - cfg.sigma_quantile, cfg.sigma_nu)
                                     / cfg.sigma_nu) / 2
        self.log_eta = math.log(cfg.langevin_step)
        self.stepwise_born_: dict[tuple[int, ...], int] = {}   # node set -> accepted stepwise births creating it
        # Gaussian approximation of the priors of (b, u = log gamma), used by the stepwise-birth proposal:
        # precision 12 = 1/Var U(0, 1) and 1/trigamma(a) = 1/Var(log gamma)
        self.prior_prec_b = 12.0
        self.prior_prec_u = 1.0 / float(polygamma(1, cfg.gamma_shape))

    def set_omega(self, omega: np.ndarray) -> None:
        """Logistic likelihood: install Polya-Gamma weights ``omega`` ``[n]`` (working response and ``W z``)."""
        self.w = omega
        self.wz = self.kappa - omega * self.beta0          # W z with z = kappa/omega - beta0
        self.y = self.wz / omega                           # z itself (used for residuals)
        self.yy = float(self.wz @ self.y)

    # ---------------------------------------------------------------- priors
    def log_prior_S(self, S: Sequence[int]) -> float:
        """``log pi(S) = log P(|S|) + sum_{j in S} log p_input(j) - log e_|S|(p_input)``."""
        d = len(S)
        if d < 1 or d > self.max_order:
            return -np.inf
        return float(self.log_order_prob[d] + self.log_p_input[list(S)].sum() - math.log(self._esym[0, d]))

    def log_prior_u(self, u: np.ndarray) -> np.ndarray:
        """Log density of ``u = log gamma`` when ``gamma ~ Gamma(shape, scale)`` (Jacobian included)."""
        a, th = self.config.gamma_shape, self.config.gamma_scale
        return a * u - np.exp(u) / th - a * math.log(th) - gammaln(a)

    def log_prior_node(self, node: TPNNNode) -> float:
        """``log pi(S) + sum_j [log U(b_j; 0, 1) + log pi_u(u_j)]``."""
        if ((node.b <= 0) | (node.b >= 1)).any():
            return -np.inf
        return self.log_prior_S(node.S) + float(self.log_prior_u(node.u).sum())

    def _sample_S(self) -> tuple[int, ...]:
        lp = np.exp(self.log_order_prob[1:])
        d = 1 + self._draw(lp)
        E, S, r = self._esym, [], d
        for j in range(self.p):
            if r == 0:
                break
            if self.rng.random() < self.p_input[j] * E[j + 1, r - 1] / E[j, r]:
                S.append(j)
                r -= 1
        return tuple(S)

    def _draw(self, weights: np.ndarray) -> int:
        """Index drawn with probability proportional to ``weights``."""
        cum = np.cumsum(weights)
        return min(int(np.searchsorted(cum, self.rng.random() * cum[-1], side="right")), len(cum) - 1)

    def _sample_u(self, size: int) -> np.ndarray:
        cfg = self.config
        return np.log(np.maximum(self.rng.gamma(cfg.gamma_shape, cfg.gamma_scale, size=size), 1e-300))

    def _make_node(self, S: Sequence[int], b: np.ndarray, u: np.ndarray) -> tuple[TPNNNode, np.ndarray]:
        order = np.argsort(S)
        S = tuple(int(S[i]) for i in order)
        b, u = np.asarray(b, float)[order], np.asarray(u, float)[order]
        phi, log_m, _ = node_forward(self.X[:, list(S)], b, u, need_grad=False)
        return TPNNNode(S, b, u, log_m), phi

    # ---------------------------------------------------------------- moves
    def move_probs(self, K: int) -> dict[str, float]:
        """Architecture-move probabilities in a state with ``K`` nodes (only birth when ``K = 0``)."""
        cfg = self.config
        if K == 0:
            return {"birth": 1.0}
        raw = {"birth": cfg.p_birth, "stepwise": cfg.p_stepwise if cfg.stepwise else 0.0, "death": cfg.p_death,
               "add": cfg.p_add,
               "delete": cfg.p_delete, "change": cfg.p_change}
        tot = sum(raw.values())
        return {k: v / tot for k, v in raw.items() if v > 0}

    def log_ml(self, G: np.ndarray, c: np.ndarray, sigma2: float) -> float:
        """Log marginal likelihood with ``beta ~ N(0, tau^2 I)`` integrated out:
        ``log N(y; 0, sigma^2 I + tau^2 Phi Phi^T)`` from ``G = Phi^T Phi`` and ``c = Phi^T y``."""
        if self.config.sample_prior:
            return 0.0
        K = len(c)
        base = -0.5 * (self.n * math.log(2 * math.pi * sigma2) + self.yy / sigma2)
        if K == 0:
            return base
        A = G / sigma2 + np.eye(K) / self.tau2
        L = np.linalg.cholesky(A)
        v = solve_triangular(L, c / sigma2, lower=True)
        return base - 0.5 * K * math.log(self.tau2) - float(np.log(np.diag(L)).sum()) + 0.5 * float(v @ v)

    def beta_hat(self, G: np.ndarray, c: np.ndarray, sigma2: float) -> np.ndarray:
        """Conditional posterior mean of ``beta`` ``[K]`` given the nodes (``A^{-1} c / sigma^2``,
        ``A = G / sigma^2 + I / tau^2``); a function of the collapsed state only, so proposals may use it."""
        K = len(c)
        if K == 0:
            return np.zeros(0)
        L = np.linalg.cholesky(G / sigma2 + np.eye(K) / self.tau2)
        return cho_solve((L, True), c / sigma2)

    def stepwise_sd(self, parent: TPNNNode, beta_k: float, sigma2: float) -> tuple[np.ndarray, np.ndarray]:
        """Proposal sd ``([d], [d])`` of the copied ``(b, log gamma)`` in a stepwise birth from ``parent``.

        ``"laplace"``: ``stepwise_scale / sqrt(F + P0)``, the spread of a Gaussian (Laplace) approximation of
        the parent's conditional posterior: ``F = beta_k^2 / sigma^2 * sum_i w_i (d phi_i / d theta)^2`` is the
        Fisher information of the parent's parameters at its conditional-mean weight ``beta_k`` (see
        :meth:`beta_hat`) and ``P0`` the precision of the prior (12 for ``b ~ U(0, 1)``, ``1/trigamma(a)`` for
        ``log gamma``). Where the data pin a threshold down, the copy stays close to it; where they do not, the
        copy spreads as widely as the prior. ``"fixed"``: the constants ``stepwise_jitter_b`` /
        ``stepwise_jitter_log_gamma``.
        """
        cfg = self.config
        d = parent.order
        if cfg.stepwise_proposal == "fixed":
            return np.full(d, cfg.stepwise_jitter_b), np.full(d, cfg.stepwise_jitter_log_gamma)
        _, _, J = node_forward(self.X[:, list(parent.S)], parent.b, parent.u, need_grad=True)
        JJ = (J * J).sum(axis=0) if self.w is None else self.w @ (J * J)
        F = (beta_k * beta_k / sigma2) * JJ
        sd = cfg.stepwise_scale / np.sqrt(F + np.concatenate([np.full(d, self.prior_prec_b),
                                                                 np.full(d, self.prior_prec_u)]))
        return sd[:d], sd[d:]

    def log_q_stepwise(self, node: TPNNNode, parents: Sequence[TPNNNode], G: np.ndarray, c: np.ndarray,
                       sigma2: float) -> float:
        """Log density that a stepwise birth from the state with nodes ``parents`` (``G``, ``c`` its
        sufficient statistics) creates ``node``:
        ``(1/K) sum_{parent k: S_k ⊂ S, |S| = |S_k|+1} p_in(j)/Z_k * U(b_j) pi_u(u_j) *
        prod_{l in S_k} N(b_l; b_kl, sd_b,kl^2) N(u_l; u_kl, sd_u,kl^2)`` with the sds of :meth:`stepwise_sd`."""
        K = len(parents)
        if K == 0 or node.order < 2:
            return -np.inf
        if ((node.b <= 0) | (node.b >= 1)).any():
            return -np.inf
        terms = []
        Sset = set(node.S)
        bh = None
        for k, par in enumerate(parents):
            if par.order != node.order - 1 or not set(par.S) <= Sset:
                continue
            if bh is None:
                bh = self.beta_hat(G, c, sigma2)
            (j,) = Sset - set(par.S)
            jpos = node.S.index(j)
            keep = [i for i in range(node.order) if i != jpos]
            Z = 1.0 - float(self.p_input[list(par.S)].sum())
            sd_b, sd_u = self.stepwise_sd(par, float(bh[k]), sigma2)
            t = self.log_p_input[j] - math.log(Z) + float(self.log_prior_u(node.u[jpos]))
            t += _norm_logpdf(node.b[keep], par.b, sd_b) + _norm_logpdf(node.u[keep], par.u, sd_u)
            terms.append(t)
        if not terms:
            return -np.inf
        return float(logsumexp(terms)) - math.log(K)

    def log_q_create(self, node: TPNNNode, others: Sequence[TPNNNode], G: np.ndarray, c: np.ndarray,
                     sigma2: float) -> float:
        """Mixture density of creating ``node`` from the state ``others`` (statistics ``G``, ``c``) by a birth
        or a stepwise birth: both have death as their reverse."""
        mp = self.move_probs(len(others))
        parts = []
        if mp.get("birth", 0) > 0:
            parts.append(math.log(mp["birth"]) + self.log_prior_node(node))
        if mp.get("stepwise", 0) > 0:
            parts.append(math.log(mp["stepwise"]) + self.log_q_stepwise(node, others, G, c, sigma2))
        return float(logsumexp(parts)) if parts else -np.inf

    def _wcol(self, phi: np.ndarray) -> np.ndarray:
        return phi if self.w is None else self.w * phi

    def _grow(self, st: _State, phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        wphi = self._wcol(phi)
        g = st.Phi.T @ wphi
        K = st.K
        G = np.empty((K + 1, K + 1))
        G[:K, :K], G[:K, K], G[K, :K], G[K, K] = st.G, g, g, phi @ wphi
        return G, np.append(st.c, phi @ self.wz)

    def _replace(self, st: _State, k: int, phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        wphi = self._wcol(phi)
        g = st.Phi.T @ wphi
        G = st.G.copy()
        G[:, k] = g
        G[k, :] = g
        G[k, k] = phi @ wphi
        c = st.c.copy()
        c[k] = phi @ self.wz
        return G, c

    def refresh_stats(self, st: _State) -> None:
        """Recompute ``G = Phi^T W Phi`` and ``c = Phi^T W z`` (after MALA or new Polya-Gamma weights)."""
        st.G = st.Phi.T @ (st.Phi if self.w is None else self.w[:, None] * st.Phi)
        st.c = st.Phi.T @ self.wz

    def log_accept_birth(self, st: _State, node: TPNNNode, phi: np.ndarray) -> float:
        """``log`` acceptance ratio of adding ``node`` (column ``phi`` ``[n]``) to ``st`` (birth or stepwise)."""
        K = st.K
        if K + 1 > self.config.max_nodes:
            return -np.inf
        lp = self.log_prior_node(node)
        if not np.isfinite(lp):
            return -np.inf
        G, c = self._grow(st, phi)
        d_ll = self.log_ml(G, c, st.sigma2) - self.log_ml(st.G, st.c, st.sigma2)
        log_pd = math.log(self.move_probs(K + 1)["death"])
        return (d_ll - self.config.c0 * self.log_n + lp + log_pd
                - self.log_q_create(node, st.nodes, st.G, st.c, st.sigma2))

    def log_accept_death(self, st: _State, k: int) -> float:
        """``log`` acceptance ratio of deleting node ``k`` from ``st`` (reverse of birth and stepwise birth)."""
        K = st.K
        keep = [i for i in range(K) if i != k]
        G, c = st.G[np.ix_(keep, keep)], st.c[keep]
        d_ll = self.log_ml(G, c, st.sigma2) - self.log_ml(st.G, st.c, st.sigma2)
        others = [st.nodes[i] for i in keep]
        log_pd = math.log(self.move_probs(K)["death"])
        return (d_ll + self.config.c0 * self.log_n + self.log_q_create(st.nodes[k], others, G, c, st.sigma2)
                - self.log_prior_node(st.nodes[k]) - log_pd)

    def log_accept_add(self, st: _State, k: int, new: TPNNNode, phi: np.ndarray, j: int) -> float:
        """Edge add of variable ``j`` to node ``k`` (``new`` is the extended node, ``phi`` its column)."""
        old = st.nodes[k]
        mp = self.move_probs(st.K)
        G, c = self._replace(st, k, phi)
        d_ll = self.log_ml(G, c, st.sigma2) - self.log_ml(st.G, st.c, st.sigma2)
        Z = 1.0 - float(self.p_input[list(old.S)].sum())
        return (d_ll + self.log_prior_S(new.S) - self.log_prior_S(old.S)
                + math.log(mp["delete"]) - math.log(new.order)
                - math.log(mp["add"]) - (self.log_p_input[j] - math.log(Z)))

    def log_accept_delete(self, st: _State, k: int, new: TPNNNode, phi: np.ndarray, j: int) -> float:
        """Edge delete of variable ``j`` from node ``k`` (reverse of edge add)."""
        old = st.nodes[k]
        mp = self.move_probs(st.K)
        G, c = self._replace(st, k, phi)
        d_ll = self.log_ml(G, c, st.sigma2) - self.log_ml(st.G, st.c, st.sigma2)
        Z = 1.0 - float(self.p_input[list(new.S)].sum())
        return (d_ll + self.log_prior_S(new.S) - self.log_prior_S(old.S)
                + math.log(mp["add"]) + (self.log_p_input[j] - math.log(Z))
                - math.log(mp["delete"]) + math.log(old.order))

    def log_accept_change(self, st: _State, k: int, new: TPNNNode, phi: np.ndarray, j_out: int,
                          j_in: int) -> float:
        """Edge change (swap ``j_out`` for ``j_in`` in node ``k``, fresh ``(b, gamma)`` for ``j_in``)."""
        old = st.nodes[k]
        G, c = self._replace(st, k, phi)
        d_ll = self.log_ml(G, c, st.sigma2) - self.log_ml(st.G, st.c, st.sigma2)
        Z_fwd = 1.0 - float(self.p_input[list(old.S)].sum())
        Z_rev = 1.0 - float(self.p_input[list(new.S)].sum())
        return (d_ll + self.log_prior_S(new.S) - self.log_prior_S(old.S)
                + (self.log_p_input[j_out] - math.log(Z_rev)) - (self.log_p_input[j_in] - math.log(Z_fwd)))

    def _apply_replace(self, st: _State, k: int, node: TPNNNode, phi: np.ndarray) -> None:
        st.G, st.c = self._replace(st, k, phi)
        st.Phi[:, k] = phi
        st.nodes[k] = node

    def structure_move(self, st: _State) -> tuple[str, bool]:
        """One reversible-jump architecture proposal; returns ``(move, accepted)``."""
        cfg, rng = self.config, self.rng
        mp = self.move_probs(st.K)
        names = list(mp)
        move = names[self._draw(np.array([mp[m] for m in names]))]
        K = st.K
        if move in ("birth", "stepwise"):
            if K + 1 > cfg.max_nodes:
                return move, False
            if move == "birth":
                S = self._sample_S()
                d = len(S)
                node, phi = self._make_node(S, rng.random(d), self._sample_u(d))
            else:
                kp = int(rng.integers(K))
                par = st.nodes[kp]
                if par.order >= self.max_order:
                    return move, False
                free = np.setdiff1d(np.arange(self.p), par.S)
                j = int(free[self._draw(self.p_input[free])])
                sd_b, sd_u = self.stepwise_sd(par, float(self.beta_hat(st.G, st.c, st.sigma2)[kp]), st.sigma2)
                b = np.append(par.b + sd_b * rng.standard_normal(par.order), rng.random())
                u = np.append(par.u + sd_u * rng.standard_normal(par.order), self._sample_u(1))
                node, phi = self._make_node(par.S + (j,), b, u)
            if math.log(rng.random()) < self.log_accept_birth(st, node, phi):
                if move == "stepwise":
                    born = self.stepwise_born_
                    born[node.S] = born.get(node.S, 0) + 1
                st.G, st.c = self._grow(st, phi)
                st.Phi = np.column_stack([st.Phi, phi])
                st.nodes.append(node)
                st.beta = np.append(st.beta, 0.0)
                return move, True
            return move, False
        k = int(rng.integers(K))
        old = st.nodes[k]
        if move == "death":
            if math.log(rng.random()) < self.log_accept_death(st, k):
                keep = [i for i in range(K) if i != k]
                st.G, st.c = st.G[np.ix_(keep, keep)], st.c[keep]
                st.Phi = st.Phi[:, keep]
                st.beta = st.beta[keep]
                del st.nodes[k]
                return move, True
            return move, False
        if move == "add":
            if old.order >= self.max_order:
                return move, False
            free = np.setdiff1d(np.arange(self.p), old.S)
            j = int(free[self._draw(self.p_input[free])])
            node, phi = self._make_node(old.S + (j,), np.append(old.b, rng.random()),
                                        np.append(old.u, self._sample_u(1)))
            la = self.log_accept_add(st, k, node, phi, j)
        elif move == "delete":
            if old.order < 2:
                return move, False
            pos = int(rng.integers(old.order))
            j = old.S[pos]
            keep = [i for i in range(old.order) if i != pos]
            node, phi = self._make_node([old.S[i] for i in keep], old.b[keep], old.u[keep])
            la = self.log_accept_delete(st, k, node, phi, j)
        else:  # change
            if old.order >= self.p:
                return move, False
            pos = int(rng.integers(old.order))
            j_out = old.S[pos]
            free = np.setdiff1d(np.arange(self.p), old.S)
            j_in = int(free[self._draw(self.p_input[free])])
            S = list(old.S)
            S[pos] = j_in
            b, u = old.b.copy(), old.u.copy()
            b[pos], u[pos] = rng.random(), self._sample_u(1)[0]
            node, phi = self._make_node(S, b, u)
            la = self.log_accept_change(st, k, node, phi, j_out, j_in)
        if math.log(rng.random()) < la:
            self._apply_replace(st, k, node, phi)
            return move, True
        return move, False

    # ---------------------------------------------------------------- continuous parameters
    def gibbs_beta(self, st: _State) -> None:
        """Draw ``beta ~ N(A^{-1} Phi^T W z / sigma^2, A^{-1})``, ``A = Phi^T W Phi / sigma^2 + I / tau^2``."""
        K = st.K
        if K == 0:
            st.beta = np.zeros(0)
            return
        if self.config.sample_prior:
            st.beta = math.sqrt(self.tau2) * self.rng.standard_normal(K)
            return
        A = st.G / st.sigma2 + np.eye(K) / self.tau2
        L = np.linalg.cholesky(A)
        mean = cho_solve((L, True), st.c / st.sigma2)
        st.beta = mean + solve_triangular(L.T, self.rng.standard_normal(K), lower=False)

    def gibbs_sigma2(self, st: _State) -> None:
        """Draw ``sigma^2 ~ IG(nu/2 + n/2, nu lambda/2 + RSS/2)`` (Gaussian likelihood; fixed at 1 for logistic)."""
        if self.logistic:
            st.sigma2 = 1.0
            return
        if self.config.sample_prior:
            st.sigma2 = float(self.sig_b / self.rng.gamma(self.sig_a))
            return
        r = self.y - st.Phi @ st.beta
        st.sigma2 = float((self.sig_b + 0.5 * r @ r) / self.rng.gamma(self.sig_a + 0.5 * self.n))

    def _mala_target(self, node_S: tuple[int, ...], theta: np.ndarray, r: np.ndarray, beta: float,
                     sigma2: float) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Log target, gradient, preconditioner ``M`` (inverse Fisher + 1), ``phi`` and ``log_m`` at ``theta``."""
        d = len(node_S)
        b, u = theta[:d], theta[d:]
        phi, log_m, J = node_forward(self.X[:, list(node_S)], b, u, need_grad=True)
        lp_u = self.log_prior_u(u)
        dlp = np.concatenate([np.zeros(d), self.config.gamma_shape - np.exp(u) / self.config.gamma_scale])
        curv = np.concatenate([np.zeros(d), np.exp(u) / self.config.gamma_scale])
        if self.config.sample_prior:
            ll, grad_ll, fisher = 0.0, np.zeros(2 * d), np.zeros(2 * d)
        else:
            e = r - beta * phi
            we = e if self.w is None else self.w * e
            ll = -0.5 * float(e @ we) / sigma2
            grad_ll = (beta / sigma2) * (J.T @ we)
            fisher = (beta * beta / sigma2) * ((J * J).sum(axis=0) if self.w is None else self.w @ (J * J))
        inside = bool(((b > 0) & (b < 1)).all())
        logp = ll + float(lp_u.sum()) if inside else -np.inf
        return logp, grad_ll + dlp, 1.0 / (fisher + curv + 1.0), phi, log_m

    def langevin_sweep(self, st: _State, adapt_t: int | None = None) -> float:
        """One preconditioned-MALA update of every node's ``(b, log gamma)`` given ``beta`` and ``sigma^2``.

        Proposal ``theta' ~ N(theta + eta M g, 2 eta M)`` with ``M = diag(1/(F + 1))`` (``F`` the node's Fisher
        information), accepted with the usual MH ratio including both proposal densities. Returns the mean
        acceptance probability; during burn-in (``adapt_t`` given) ``log eta`` moves towards the target rate.
        """
        if st.K == 0:
            return float("nan")
        eta = math.exp(self.log_eta)
        pred = st.Phi @ st.beta
        accs = []
        for k, node in enumerate(st.nodes):
            beta = float(st.beta[k])
            r = self.y - pred + beta * st.Phi[:, k]
            theta = np.concatenate([node.b, node.u])
            lp0, g0, M0, _, _ = self._mala_target(node.S, theta, r, beta, st.sigma2)
            mean0 = theta + eta * M0 * g0
            prop = mean0 + np.sqrt(2 * eta * M0) * self.rng.standard_normal(theta.shape)
            lp1, g1, M1, phi1, log_m1 = self._mala_target(node.S, prop, r, beta, st.sigma2)
            if not np.isfinite(lp1):
                accs.append(0.0)
                continue
            mean1 = prop + eta * M1 * g1
            lq_fwd = float(np.sum(-0.5 * np.log(M0) - (prop - mean0) ** 2 / (4 * eta * M0)))
            lq_rev = float(np.sum(-0.5 * np.log(M1) - (theta - mean1) ** 2 / (4 * eta * M1)))
            log_a = lp1 - lp0 + lq_rev - lq_fwd
            accs.append(math.exp(min(0.0, log_a)))
            if math.log(self.rng.random()) < log_a:
                d = node.order
                new = TPNNNode(node.S, prop[:d].copy(), prop[d:].copy(), log_m1)
                pred += beta * (phi1 - st.Phi[:, k])
                st.Phi[:, k] = phi1
                st.nodes[k] = new
        self.refresh_stats(st)
        rate = float(np.mean(accs))
        if adapt_t is not None and self.config.adapt_langevin:
            self.log_eta += (rate - self.config.target_accept) / (adapt_t + 1) ** 0.6
            self.log_eta = float(np.clip(self.log_eta, math.log(1e-5), math.log(10.0)))
        return rate

    def gibbs_intercept_omega(self, st: _State) -> None:
        """Logistic likelihood: draw ``beta_0 | beta, omega ~ N`` (prior ``N(0, intercept_prior_sd^2)``), then the
        Polya-Gamma weights ``omega_i | f ~ PG(1, f_i)``, and refresh the working response and ``G``, ``c``."""
        f = st.Phi @ st.beta
        if self.config.sample_prior:
            self.beta0 = self.config.intercept_prior_sd * float(self.rng.standard_normal())
        else:
            prec = float(self.w.sum()) + 1.0 / self.config.intercept_prior_sd ** 2
            mean = float((self.kappa - self.w * f).sum()) / prec
            self.beta0 = mean + float(self.rng.standard_normal()) / math.sqrt(prec)
        self.set_omega(sample_polya_gamma(self.beta0 + f, self.rng))
        self.refresh_stats(st)

    # ---------------------------------------------------------------- diagnostics
    def check_state(self, st: _State, atol: float = 1e-8) -> None:
        """Raise ``AssertionError`` if the sampler state is invalid (used by the tests after every move)."""
        K = st.K
        assert K <= self.config.max_nodes, f"K={K} exceeds max_nodes"
        assert st.Phi.shape == (self.n, K) and st.G.shape == (K, K) and st.c.shape == (K,)
        assert st.beta.shape == (K,) and st.sigma2 > 0
        for k, nd in enumerate(st.nodes):
            assert 1 <= nd.order <= self.max_order, f"node {k} has order {nd.order}"
            assert list(nd.S) == sorted(set(nd.S)), f"node {k} has unsorted/duplicate inputs {nd.S}"
            assert all(0 <= j < self.p for j in nd.S)
            assert ((nd.b > 0) & (nd.b < 1)).all(), f"node {k} threshold outside (0, 1): {nd.b}"
            assert nd.b.shape == nd.u.shape == nd.log_m.shape == (nd.order,)
            phi, log_m, _ = node_forward(self.X[:, list(nd.S)], nd.b, nd.u, need_grad=False)
            assert np.allclose(log_m, nd.log_m, atol=atol), f"node {k} has a stale log_m"
            assert np.allclose(phi, st.Phi[:, k], atol=atol), f"node {k} has a stale basis column"
        W = np.ones(self.n) if self.w is None else self.w
        assert np.allclose(st.G, st.Phi.T @ (W[:, None] * st.Phi), atol=1e-6 * max(1.0, self.n))
        assert np.allclose(st.c, st.Phi.T @ (W * self.y), atol=1e-6 * max(1.0, self.n))

    def empty_state(self) -> _State:
        return _State([], np.zeros((self.n, 0)), np.zeros((0, 0)), np.zeros(0), np.zeros(0),
                      1.0 if self.config.sample_prior or self.logistic else float(self.y.var()))

    def state_from_nodes(self, nodes: Sequence[tuple[Sequence[int], Sequence[float], Sequence[float]]],
                         sigma2: float) -> _State:
        """A sampler state from ``(S, b, gamma)`` triples (0-based ``S``), for tests and warm starts."""
        st = self.empty_state()
        st.sigma2 = float(sigma2)
        for S, b, g in nodes:
            node, phi = self._make_node(list(S), np.asarray(b, float), np.log(np.asarray(g, float)))
            st.G, st.c = self._grow(st, phi)
            st.Phi = np.column_stack([st.Phi, phi])
            st.nodes.append(node)
        st.beta = np.zeros(st.K)
        return st

    # ---------------------------------------------------------------- fit / predict
    def fit(self, X: np.ndarray, y: np.ndarray, input_weights: np.ndarray | None = None, seed: int = 0,
            callback: Any = None) -> "BayesianTPNN":
        """Run the MCMC on ``X`` ``[n, p]``, ``y`` ``[n]``. ``input_weights`` ``[p]`` overrides ``p_input``;
        ``callback(iteration, state)`` is called after every iteration (tests use it to check invariants)."""
        # the sampler's linear algebra is on tiny matrices: BLAS/OpenMP threads only add contention
        with threadpool_limits(limits=1):
            return self._fit(X, y, input_weights, seed, callback)

    def iterate(self, st: _State, counts: dict[str, list[int]] | None = None, adapt_t: int | None = None) -> float:
        """One MCMC iteration on ``st``: ``structure_moves_per_iter`` architecture proposals (``beta``
        collapsed), ``beta | rest``, a MALA sweep, ``beta | rest``, then ``sigma^2 | rest`` (Gaussian) or
        ``beta_0, omega | rest`` (logistic). ``counts[move]`` accumulates ``[proposed, accepted]``; returns the
        MALA acceptance rate."""
        for _ in range(self.config.structure_moves_per_iter):
            move, acc = self.structure_move(st)
            if counts is not None:
                counts[move][0] += 1
                counts[move][1] += int(acc)
        self.gibbs_beta(st)
        rate = self.langevin_sweep(st, adapt_t=adapt_t)
        self.gibbs_beta(st)
        if self.logistic:
            self.gibbs_intercept_omega(st)
        else:
            self.gibbs_sigma2(st)
        return rate

    def _fit(self, X, y, input_weights, seed, callback) -> "BayesianTPNN":
        cfg = self.config
        self.prepare(X, y, input_weights, seed)
        st = self.empty_state()
        counts = {m: [0, 0] for m in MOVES}
        trace_K, trace_s2, trace_rmse, trace_sets, trace_mala = [], [], [], [], []
        self.draws_: list[dict[str, np.ndarray]] = []
        imp_sum: dict[tuple[int, ...], float] = {}
        inc_sum: dict[tuple[int, ...], int] = {}
        for it in progress(range(cfg.n_iter), desc="Bayesian-TPNN MCMC", total=cfg.n_iter):
            rate = self.iterate(st, counts, adapt_t=it if it < cfg.burn_in else None)
            if callback is not None:
                callback(it, st)
            fit_ = st.Phi @ st.beta
            trace_K.append(st.K)
            trace_s2.append(st.sigma2 * self.y_scale ** 2)
            if self.logistic:      # training log-loss of the current draw
                eta = self.beta0 + fit_
                trace_rmse.append(float(np.mean(np.logaddexp(0.0, eta) - self.labels * eta)))
            else:
                trace_rmse.append(float(np.sqrt(np.mean((self.y - fit_) ** 2))) * self.y_scale)
            trace_sets.append([nd.S for nd in st.nodes])
            trace_mala.append(rate)
            if it >= cfg.burn_in and (it - cfg.burn_in) % cfg.thin == 0:
                S_pad, mask, b, u, log_m = _pad_nodes(st.nodes)
                self.draws_.append({"S_pad": S_pad, "mask": mask, "b": b, "u": u, "log_m": log_m,
                                    "beta": st.beta.copy(), "sigma2": st.sigma2,
                                    "beta0": self.beta0 if self.logistic else 0.0})
                groups: dict[tuple[int, ...], list[int]] = {}
                for k, nd in enumerate(st.nodes):
                    groups.setdefault(nd.S, []).append(k)
                for S, idx in groups.items():
                    f_S = st.Phi[:, idx] @ st.beta[idx] * self.y_scale
                    imp_sum[S] = imp_sum.get(S, 0.0) + float(f_S.var())
                    inc_sum[S] = inc_sum.get(S, 0) + 1
        nd_ = len(self.draws_)
        self.importance_ = dict(sorted(((S, v / nd_) for S, v in imp_sum.items()), key=lambda t: -t[1]))
        self.inclusion_ = {S: inc_sum[S] / nd_ for S in self.importance_}
        self.acceptance_ = {m: (a / t if t else float("nan")) for m, (t, a) in counts.items()}
        self.move_counts_ = {m: t for m, (t, _) in counts.items()}
        self.trace_ = {"K": np.asarray(trace_K), "sigma2": np.asarray(trace_s2),
                       "logloss" if self.logistic else "rmse": np.asarray(trace_rmse),
                       "mala_accept": np.asarray(trace_mala), "sets": trace_sets}
        self.state_ = st
        return self

    def _scale(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.p:
            raise ValueError(f"expected X [n, {self.p}], got {X.shape}")
        return (X - self.x_min) / self.x_span

    def _check_fitted(self) -> None:
        if not getattr(self, "draws_", None):
            raise RuntimeError("call fit() first (no posterior draws kept)")

    def draw_values(self, X: np.ndarray) -> np.ndarray:
        """``f`` of every kept draw at ``X`` ``[m, p]`` (original ``y`` scale; logit scale with the intercept for
        classification). Returns ``[n_draws, m]``."""
        self._check_fitted()
        Xs = self._scale(X)
        out = np.empty((len(self.draws_), Xs.shape[0]))
        for i, dr in enumerate(self.draws_):
            Phi = tpnn_basis(Xs, dr["S_pad"], dr["mask"], dr["b"], dr["u"], dr["log_m"])
            out[i] = dr["beta0"] + Phi @ dr["beta"]
        return self.y_mean + self.y_scale * out

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Classification: posterior predictive ``P(y = 1 | x)`` at ``X`` ``[m, p]``, the average of
        ``sigmoid(f)`` over the kept draws. Returns ``[m]``."""
        if not self.config.likelihood == "logistic":
            raise ValueError("predict_proba needs likelihood='logistic'")
        from scipy.special import expit

        return expit(self.draw_values(X)).mean(axis=0)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Regression: posterior mean of ``f`` at ``X`` ``[m, p]`` (original scale); classification: the label
        with the larger posterior predictive probability. Returns ``[m]``."""
        if self.config.likelihood == "logistic":
            return (self.predict_proba(X) >= 0.5).astype(np.int64)
        return self.draw_values(X).mean(axis=0)

    def component_effect(self, S: Sequence[int], X: np.ndarray) -> np.ndarray:
        """Posterior mean of the component ``f_S`` (0-based ``S``) at ``X`` ``[m, p]``. Returns ``[m]``."""
        self._check_fitted()
        S = tuple(sorted(int(j) for j in S))
        Xs = self._scale(X)
        out = np.zeros(Xs.shape[0])
        for dr in self.draws_:
            sel = [k for k in range(len(dr["beta"])) if tuple(dr["S_pad"][k, dr["mask"][k]]) == S]
            if sel:
                Phi = tpnn_basis(Xs, dr["S_pad"][sel], dr["mask"][sel], dr["b"][sel], dr["u"][sel],
                                 dr["log_m"][sel])
                out += Phi @ dr["beta"][sel]
        return self.y_scale * out / len(self.draws_)
