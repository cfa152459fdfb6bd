"""Risk Phase Transitions in Spiked Regression: Alignment-Driven Benign and Catastrophic Overfitting (Li & Sonthalia, ICLR 2026).

The min-norm interpolator ``beta_int = (X^T)^+ y`` on spiked-covariance data, its closed-form
generalization risk and a Monte-Carlo simulator that draws data under the same convention.

Model (columns of ``X`` are the data points)::

    X = Z + A in R^{d x n},   Z = theta u v^T,  u a fixed unit vector,  v ~ N(0, I_n),
    A has i.i.d. N(0, tau^2) entries,            theta^2 = gamma tau^2  (operator-norm scaling),
    y_i = alpha_Z z_i^T beta* + alpha_A a_i^T beta* + eps_i,   eps_i ~ N(0, tau_eps^2),
    c = d / n (aspect ratio).

So a data point is ``x ~ N(0, tau^2 (I + gamma u u^T))``. In the well-specified case
(``alpha_Z = alpha_A = alpha``) and for ``c > 1`` the risk of the min-norm interpolator in the
proportional limit is (the digest's closed form, verified numerically here)::

    R(c, gamma) = alpha^2 tau^2 (1 - 1/c) [ ||beta*||^2 + (gamma c^2 - 2 gamma c - gamma^2)/(gamma + c)^2 (beta*^T u)^2 ]
                  + tau_eps^2 / (c - 1).

``R`` is the *excess* risk ``E_x[(y_clean(x) - beta_int^T x)^2]`` (the test-noise floor is excluded),
averaged over the training noise. Alignment ``(beta*^T u)^2`` helps iff its coefficient is negative,
i.e. iff ``gamma > c (c - 2)``.

Regimes as ``c -> infinity`` along ``gamma = g c^kappa`` (well-specified, operator-norm scaling):
tempered at ``kappa = 0`` (``R -> ||beta*||^2 + g (beta*^T u)^2``), catastrophic for ``0 < kappa < 2`` when
``beta*`` is not orthogonal to ``u`` (``R ~ gamma``), tempered at ``kappa = 2`` and benign for ``kappa > 2``
when ``beta* || u`` (``R -> tau_eps^2/(c-1) -> 0``).

Choices where the sources were unclear (see ``docs/models/spiked_regression.md``):

* normalisation: i.i.d. ``N(0, tau^2)`` bulk entries, ``theta = sqrt(gamma) tau``, ``v_i ~ N(0, 1)``; this
  convention reproduces the closed form (the paper's may differ by a rescaling);
* the simulator evaluates the test expectation exactly given the fitted ``beta_int`` (a Gaussian
  quadratic form) and draws the training data and training noise;
* ``c < 1`` (under-parameterised) uses the classical least-squares risk ``tau_eps^2 c / (1 - c)``
  (bias vanishes in the well-specified case), which the paper does not discuss;
* Frobenius scaling (``theta^2 = d tau^2``) is simulated exactly; its theory curve is the operator-norm
  formula with ``gamma = d`` plugged in (a finite-``n`` reading, not a formula from the paper);
* the misspecified / shifted closed forms are not in the sources; the simulator supports
  ``alpha_Z != alpha_A`` and test-time ``alpha~`` but :func:`theory_risk` covers the well-specified case only.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from interp.configs import config_from_call, is_int, is_number, is_sequence, require
from interp.training import limit_threads

__all__ = [
    "SpikedData",
    "SpikedSimulationConfig",
    "alignment_coefficient",
    "alignment_flip_gamma",
    "asymptotic_risk",
    "asymptotic_regime",
    "gamma_from_rule",
    "theory_risk",
    "sample_spiked_data",
    "min_norm_interpolator",
    "excess_risk",
    "make_target",
    "make_targets",
    "simulate_risk",
    "phase_diagram_figure",
]

REGIMES = ("benign", "tempered", "catastrophic")


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------
SPIKE_SCALINGS = ("operator", "frobenius")


@dataclass(frozen=True)
class SpikedSimulationConfig:
    """Options of :func:`simulate_risk` (everything but the random generator), validated on construction.

    ``d = round(c * n)``; ``alignments`` are the targets' ``(beta*^T u)^2``, each in ``[0, beta_norm^2]``
    (a list is stored as a tuple). ``alpha_z``/``alpha_a`` (train) and ``test_alpha_*`` (test) default to
    ``alpha`` (well-specified). ``num_threads`` caps the BLAS pools while fitting (``None``: leave them
    alone); it does not change the numbers.
    """

    c: float  #: aspect ratio d / n (> 0)
    gamma: float  #: spike strength, theta^2 = gamma tau^2 (>= 0; unused under "frobenius")
    alignments: tuple[float, ...]  #: one target per alignment, sharing X and the noise draw
    n: int  #: points per draw
    repeats: int  #: Monte-Carlo repeats
    beta_norm: float = 1.0
    alpha: float = 1.0
    tau: float = 1.0  #: bulk entry std
    noise_std: float = 0.0  #: training label noise std (tau_eps)
    alpha_z: float | None = None
    alpha_a: float | None = None
    test_alpha_z: float | None = None
    test_alpha_a: float | None = None
    spike_scaling: str = "operator"  #: "operator" (theta^2 = gamma tau^2) or "frobenius" (theta^2 = d tau^2)
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        name = type(self).__name__
        require(is_number(self.c) and self.c > 0, f"{name}.c", self.c, "a positive number (the aspect ratio d/n)")
        require(is_number(self.gamma) and self.gamma >= 0, f"{name}.gamma", self.gamma, "a number >= 0")
        require(is_int(self.n) and self.n >= 1, f"{name}.n", self.n, "a positive integer")
        require(round(self.c * self.n) >= 1, f"{name}.c", self.c,
                f"large enough that d = round(c * n) >= 1 (n = {self.n})")
        require(is_int(self.repeats) and self.repeats >= 1, f"{name}.repeats", self.repeats, "a positive integer")
        require(is_number(self.beta_norm) and self.beta_norm >= 0, f"{name}.beta_norm", self.beta_norm,
                "a number >= 0")
        al = self.alignments
        top = self.beta_norm ** 2
        require(is_sequence(al) and len(al) > 0 and all(is_number(a) and 0 <= a <= top + 1e-12 for a in al),
                f"{name}.alignments", al, f"a non-empty sequence of numbers in [0, beta_norm^2 = {top}]")
        object.__setattr__(self, "alignments", tuple(al))
        require(is_number(self.tau) and self.tau > 0, f"{name}.tau", self.tau, "a positive number")
        require(is_number(self.noise_std) and self.noise_std >= 0, f"{name}.noise_std", self.noise_std,
                "a number >= 0")
        require(is_number(self.alpha), f"{name}.alpha", self.alpha, "a finite number")
        for field in ("alpha_z", "alpha_a", "test_alpha_z", "test_alpha_a"):
            v = getattr(self, field)
            require(v is None or is_number(v), f"{name}.{field}", v, "a finite number or None (= alpha)")
        require(self.spike_scaling in SPIKE_SCALINGS, f"{name}.spike_scaling", self.spike_scaling,
                " or ".join(map(repr, SPIKE_SCALINGS)))
        require(self.num_threads is None or (is_int(self.num_threads) and self.num_threads >= 1),
                f"{name}.num_threads", self.num_threads, "a positive integer or None")

    @property
    def d(self) -> int:
        """The dimension ``round(c * n)``."""
        return int(round(self.c * self.n))

# ----------------------------------------------------------------------------------------------
# closed forms
# ----------------------------------------------------------------------------------------------
_RULE = re.compile(r"^\s*(?P<k>[0-9]*\.?[0-9]*)\s*\*?\s*(?P<c>c)?\s*(\^\s*(?P<p>[0-9]*\.?[0-9]+))?\s*$")


def gamma_from_rule(rule: str | float, c: float) -> float:
    """Spike strength ``gamma`` from a rule in ``c``.

    Accepted: a number (``"0"``, ``"2.5"``), ``"c"``, ``"4c"``, ``"c^2"``, ``"0.5c^1.5"`` and
    ``"c(c-2)"`` (the alignment flip point). No ``eval`` is used.
    """
    if isinstance(rule, (int, float)):
        return float(rule)
    text = rule.replace(" ", "")
    if text == "c(c-2)":
        return alignment_flip_gamma(c)
    m = _RULE.match(text)
    if m is None or (not m.group("k") and not m.group("c")):
        raise ValueError(f"cannot read gamma rule {rule!r}; expected e.g. '0', '1', 'c', '4c', 'c^2', 'c^1.5', 'c(c-2)'")
    k = float(m.group("k")) if m.group("k") else 1.0
    if not m.group("c"):
        if m.group("p"):
            raise ValueError(f"gamma rule {rule!r} has an exponent but no 'c'")
        return k
    p = float(m.group("p")) if m.group("p") else 1.0
    return k * float(c) ** p


def alignment_coefficient(c, gamma):
    """Coefficient of ``(beta*^T u)^2`` in the risk bracket: ``(gamma c^2 - 2 gamma c - gamma^2) / (gamma + c)^2``."""
    c = np.asarray(c, dtype=float)
    gamma = np.asarray(gamma, dtype=float)
    return (gamma * c ** 2 - 2 * gamma * c - gamma ** 2) / (gamma + c) ** 2


def alignment_flip_gamma(c):
    """Spike strength ``c (c - 2)`` above which aligning ``beta*`` with the spike lowers the risk."""
    c = np.asarray(c, dtype=float)
    out = c * (c - 2.0)
    return float(out) if out.ndim == 0 else out


def theory_risk(c, gamma, alignment, beta_norm2: float = 1.0, alpha: float = 1.0, tau: float = 1.0,
                noise_std: float = 0.0):
    """Closed-form excess risk of the min-norm interpolator (well-specified, operator-norm scaling).

    Args (broadcast together):
        c: aspect ratio ``d / n``. ``c > 1``: the paper's formula; ``c < 1``: least-squares risk
            ``tau_eps^2 c / (1 - c)``; ``c == 1``: ``inf``.
        gamma: spike strength (``theta^2 = gamma tau^2``), ``>= 0``.
        alignment: ``(beta*^T u)^2`` in ``[0, beta_norm2]``.
        beta_norm2: ``||beta*||^2``.
        alpha, tau, noise_std: target scale, bulk standard deviation, training-noise std ``tau_eps``.
    Returns:
        ndarray (or float) of the broadcast shape.
    """
    c = np.asarray(c, dtype=float)
    gamma = np.asarray(gamma, dtype=float)
    alignment = np.asarray(alignment, dtype=float)
    if np.any(c <= 0):
        raise ValueError("aspect ratio c = d/n must be positive")
    if np.any(gamma < 0):
        raise ValueError("spike strength gamma must be >= 0")
    if np.any(alignment < -1e-12) or np.any(alignment > beta_norm2 + 1e-12):
        raise ValueError(f"alignment (beta*^T u)^2 must lie in [0, ||beta*||^2 = {beta_norm2}]")
    with np.errstate(divide="ignore", invalid="ignore"):
        over = alpha ** 2 * tau ** 2 * (1 - 1 / c) * (beta_norm2 + alignment_coefficient(c, gamma) * alignment) \
            + noise_std ** 2 / (c - 1)
        under = noise_std ** 2 * c / (1 - c)
        out = np.where(c > 1, over, np.where(c < 1, under, np.inf))
    return float(out) if out.ndim == 0 else out


def asymptotic_risk(kappa: float, alignment: float, prefactor: float = 1.0, beta_norm2: float = 1.0,
                    alpha: float = 1.0, tau: float = 1.0) -> float:
    """Limit of :func:`theory_risk` as ``c -> inf`` along ``gamma = prefactor * c^kappa`` (``inf`` if it diverges).

    The noise term ``tau_eps^2/(c-1)`` vanishes; the alignment coefficient tends to ``prefactor`` at
    ``kappa = 0``, to ``+inf`` for ``0 < kappa < 2``, to ``1/prefactor - 1`` at ``kappa = 2`` and to ``-1``
    for ``kappa > 2``.
    """
    if kappa < 0:
        raise ValueError("kappa must be >= 0 (gamma = prefactor * c^kappa with gamma not vanishing)")
    if prefactor <= 0:
        raise ValueError("prefactor must be > 0")
    scale = alpha ** 2 * tau ** 2
    if kappa == 0:
        coef = prefactor
    elif kappa < 2:
        if alignment == 0:
            return scale * beta_norm2
        return math.inf
    elif kappa == 2:
        coef = 1.0 / prefactor - 1.0
    else:
        coef = -1.0
    return max(scale * (beta_norm2 + coef * alignment), 0.0)


def asymptotic_regime(kappa: float, alignment: float, prefactor: float = 1.0, beta_norm2: float = 1.0,
                      atol: float = 1e-12) -> str:
    """``"benign"`` (limit risk 0), ``"tempered"`` (finite, > 0) or ``"catastrophic"`` (diverges)."""
    r = asymptotic_risk(kappa, alignment, prefactor, beta_norm2)
    if math.isinf(r):
        return "catastrophic"
    return "benign" if r <= atol else "tempered"


# ----------------------------------------------------------------------------------------------
# simulator
# ----------------------------------------------------------------------------------------------
@dataclass
class SpikedData:
    """One training set: ``x`` ``[d, n]`` (columns are points), ``y`` ``[n, m]`` (``m`` targets sharing ``x``)."""

    x: np.ndarray
    y: np.ndarray
    u: np.ndarray       # [d] unit spike direction
    theta: float        # spike amplitude
    v: np.ndarray       # [n] spike coefficients
    a: np.ndarray       # [d, n] bulk


def make_target(u: np.ndarray, alignment: float, beta_norm: float = 1.0,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """A target ``beta*`` ``[d]`` with ``||beta*|| = beta_norm`` and ``(beta*^T u)^2 = alignment``.

    The orthogonal part points in a uniformly random direction orthogonal to ``u``.
    """
    if not 0 <= alignment <= beta_norm ** 2 + 1e-12:
        raise ValueError(f"alignment must lie in [0, beta_norm^2 = {beta_norm ** 2}], got {alignment}")
    rng = np.random.default_rng() if rng is None else rng
    w = rng.standard_normal(u.shape[0])
    w -= (w @ u) * u
    w /= np.linalg.norm(w)
    return math.sqrt(alignment) * u + math.sqrt(max(beta_norm ** 2 - alignment, 0.0)) * w


def make_targets(u: np.ndarray, alignments: Sequence[float], beta_norm: float = 1.0,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """Targets ``[d, m]`` for several alignments sharing one orthogonal direction (common random numbers).

    Column ``j`` is ``sqrt(a_j) u + sqrt(||beta*||^2 - a_j) w`` with one random unit ``w`` orthogonal to ``u``,
    so differences between alignments are not blurred by independent directions.
    """
    rng = np.random.default_rng() if rng is None else rng
    w = make_target(u, 0.0, 1.0, rng)
    cols = []
    for a in alignments:
        if not 0 <= a <= beta_norm ** 2 + 1e-12:
            raise ValueError(f"alignment must lie in [0, beta_norm^2 = {beta_norm ** 2}], got {a}")
        cols.append(math.sqrt(a) * u + math.sqrt(max(beta_norm ** 2 - a, 0.0)) * w)
    return np.stack(cols, axis=1)


def sample_spiked_data(n: int, d: int, gamma: float, betas: np.ndarray, u: np.ndarray, rng: np.random.Generator,
                       tau: float = 1.0, noise_std: float = 0.0, alpha_z: float = 1.0, alpha_a: float = 1.0,
                       spike_scaling: str = "operator") -> SpikedData:
    """Draw ``X = theta u v^T + A`` and targets ``y = alpha_Z Z^T beta* + alpha_A A^T beta* + eps``.

    Args:
        n, d: number of points and dimension.
        gamma: spike strength (``theta^2 = gamma tau^2``; ignored under ``spike_scaling="frobenius"``,
            where ``theta^2 = d tau^2``).
        betas: ``[d]`` or ``[d, m]`` targets sharing the same ``X`` and the same noise draw.
        u: ``[d]`` unit spike direction.
    """
    if spike_scaling not in SPIKE_SCALINGS:
        raise ValueError(f"spike_scaling must be 'operator' or 'frobenius', got {spike_scaling!r}")
    if u.shape != (d,) or abs(np.linalg.norm(u) - 1) > 1e-8:
        raise ValueError(f"u must be a unit vector of shape ({d},)")
    betas = betas[:, None] if betas.ndim == 1 else betas
    if betas.shape[0] != d:
        raise ValueError(f"betas must have {d} rows, got shape {betas.shape}")
    theta = tau * math.sqrt(d if spike_scaling == "frobenius" else gamma)
    v = rng.standard_normal(n)
    a = tau * rng.standard_normal((d, n))
    x = theta * np.outer(u, v) + a
    y = alpha_z * theta * np.outer(v, u @ betas) + alpha_a * (a.T @ betas)
    if noise_std > 0:  # one noise draw shared by all targets (each column is still correctly distributed)
        y = y + noise_std * rng.standard_normal((n, 1))
    return SpikedData(x=x, y=y, u=u, theta=theta, v=v, a=a)


def min_norm_interpolator(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Minimum-norm least-squares solution ``(X^T)^+ y``.

    Args:
        x: ``[d, n]`` data (columns are points). y: ``[n]`` or ``[n, m]``.
    Returns:
        ``[d]`` or ``[d, m]``. Uses the ``n x n`` Gram matrix when ``d > n`` (interpolation),
        the ``d x d`` normal equations when ``d < n`` and falls back to ``lstsq`` if Cholesky fails.
    """
    import scipy.linalg as sl

    d, n = x.shape
    if y.shape[0] != n:
        raise ValueError(f"y must have {n} rows (one per column of x), got shape {y.shape}")
    try:
        if d > n:
            return x @ sl.cho_solve(sl.cho_factor(x.T @ x), y)
        if d < n:
            return sl.cho_solve(sl.cho_factor(x @ x.T), x @ y)
    except np.linalg.LinAlgError:
        pass
    return np.linalg.lstsq(x.T, y, rcond=None)[0]


def excess_risk(beta_hat: np.ndarray, betas: np.ndarray, u: np.ndarray, theta: float, tau: float = 1.0,
                test_alpha_z: float = 1.0, test_alpha_a: float = 1.0) -> np.ndarray:
    """Exact test excess risk ``E_x[(y_clean - beta_hat^T x)^2]`` for ``x = theta v u + a``.

    ``= theta^2 (alpha~_Z u^T beta* - u^T beta_hat)^2 + tau^2 ||alpha~_A beta* - beta_hat||^2``.
    ``beta_hat``/``betas``: ``[d, m]`` (or ``[d]``); returns ``[m]`` (or a scalar).
    """
    spike = theta ** 2 * (test_alpha_z * (u @ betas) - u @ beta_hat) ** 2
    bulk = tau ** 2 * ((test_alpha_a * betas - beta_hat) ** 2).sum(0)
    return spike + bulk


def simulate_risk(c: float | None = None, gamma: float | None = None, alignments: Sequence[float] | None = None,
                  n: int | None = None, repeats: int | None = None, rng: np.random.Generator | None = None, *,
                  config: SpikedSimulationConfig | None = None, **options: Any) -> np.ndarray:
    """Monte-Carlo excess risk of the min-norm interpolator.

    Each repeat draws a fresh spike direction ``u`` (uniform on the sphere), one target per
    alignment (:func:`make_targets`), one ``X`` and one noise draw shared by all targets, fits ``(X^T)^+ y``
    and evaluates :func:`excess_risk`.

    The options are the fields of :class:`SpikedSimulationConfig`: given as arguments (``c, gamma,
    alignments, n, repeats`` positionally or by name, the rest by name, e.g. ``noise_std=0.5``) or as one
    ready ``config=`` (then no option may be given besides it). ``rng`` (a NumPy ``Generator``) is always
    needed: it is the run's random state, not an option.

    Returns:
        ``[repeats, len(alignments)]`` risks.
    """
    given = {k: v for k, v in (("c", c), ("gamma", gamma), ("alignments", alignments), ("n", n),
                               ("repeats", repeats)) if v is not None}
    cfg = config_from_call(SpikedSimulationConfig, config, {**given, **options}, "simulate_risk")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"simulate_risk: rng must be a numpy.random.Generator, got {type(rng).__name__}")
    d = cfg.d
    az = cfg.alpha if cfg.alpha_z is None else cfg.alpha_z
    aa = cfg.alpha if cfg.alpha_a is None else cfg.alpha_a
    taz = az if cfg.test_alpha_z is None else cfg.test_alpha_z
    taa = aa if cfg.test_alpha_a is None else cfg.test_alpha_a
    out = np.empty((cfg.repeats, len(cfg.alignments)))
    with limit_threads(cfg.num_threads):
        for r in range(cfg.repeats):
            u = rng.standard_normal(d)
            u /= np.linalg.norm(u)
            betas = make_targets(u, cfg.alignments, cfg.beta_norm, rng)
            data = sample_spiked_data(cfg.n, d, cfg.gamma, betas, u, rng, tau=cfg.tau, noise_std=cfg.noise_std,
                                      alpha_z=az, alpha_a=aa, spike_scaling=cfg.spike_scaling)
            beta_hat = min_norm_interpolator(data.x, data.y)
            out[r] = excess_risk(beta_hat, betas, u, data.theta, cfg.tau, taz, taa)
    return out


# ----------------------------------------------------------------------------------------------
# figures
# ----------------------------------------------------------------------------------------------
_REGIME_COLOR = {"benign": "#2ca02c", "tempered": "#1f77b4", "catastrophic": "#d62728"}


def phase_diagram_figure(result=None, c_range: tuple[float, float] = (1.1, 1e3),
                         gamma_range: tuple[float, float] = (1e-2, 1e8), resolution: int = 120, noise_std: float = 0.5):
    """Phase diagram of benign / tempered / catastrophic overfitting (plotly).

    Panels: (a) ``log10`` theory risk for an aligned target over ``(c, gamma)`` with the regime boundaries
    ``gamma = Theta(1)``, ``gamma = c^2`` and the flip curve ``gamma = c(c - 2)``; (b) the asymptotic regime
    as a function of the exponent ``kappa`` (``gamma = c^kappa``) and the alignment; and, given a simulation
    ``result`` (the reproduction's ``SpikedRegressionResult``: ``.config``, ``.paths``, ``.to_frame()``), (c)
    simulated vs theory risk along the regime paths and (d) the grid's parity plot.
    """
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    if result is not None:
        noise_std = result.config["noise_std"]
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "(a) log10 risk, aligned target (theory)", "(b) asymptotic regime, gamma = c^kappa",
        "(c) regime paths: simulation (markers) vs theory", "(d) simulation vs theory on the grid"),
        horizontal_spacing=0.12, vertical_spacing=0.14)

    cs = np.logspace(math.log10(c_range[0]), math.log10(c_range[1]), resolution)
    gs = np.logspace(math.log10(gamma_range[0]), math.log10(gamma_range[1]), resolution)
    risk = theory_risk(cs[None, :], gs[:, None], 1.0, noise_std=noise_std)
    fig.add_trace(go.Heatmap(x=np.log10(cs), y=np.log10(gs), z=np.log10(risk), colorscale="RdYlGn_r",
                             colorbar=dict(title="log10 R", x=0.44, len=0.42, y=0.79), name="log10 R"), 1, 1)
    for label, curve, dash in (("gamma = c^2", cs ** 2, "dash"), ("gamma = c(c-2) (flip)", np.maximum(cs * (cs - 2), 1e-9), "dot"),
                               ("gamma = c^1.5", cs ** 1.5, "dashdot"), ("gamma = c^3", cs ** 3, "longdash")):
        keep = (curve >= gamma_range[0]) & (curve <= gamma_range[1])
        fig.add_trace(go.Scatter(x=np.log10(cs[keep]), y=np.log10(curve[keep]), mode="lines", name=label,
                                 line=dict(color="black", dash=dash, width=1.5)), 1, 1)
    for text, x, y in (("tempered", 2.2, -1.0), ("catastrophic", 2.4, 2.6), ("benign", 1.0, 6.5)):
        fig.add_annotation(text=text, x=x, y=y, showarrow=False, font=dict(size=13, color="black"), row=1, col=1)
    fig.update_xaxes(title_text="log10 c", row=1, col=1)
    fig.update_yaxes(title_text="log10 gamma", row=1, col=1)

    kappas = np.linspace(0, 4, 161)
    aligns = np.linspace(0, 1, 101)
    codes = np.array([[REGIMES.index(asymptotic_regime(k, a)) for k in kappas] for a in aligns])
    scale = [[0.0, _REGIME_COLOR["benign"]], [1 / 3, _REGIME_COLOR["benign"]], [1 / 3, _REGIME_COLOR["tempered"]],
             [2 / 3, _REGIME_COLOR["tempered"]], [2 / 3, _REGIME_COLOR["catastrophic"]], [1.0, _REGIME_COLOR["catastrophic"]]]
    fig.add_trace(go.Heatmap(x=kappas, y=aligns, z=codes, zmin=-0.5, zmax=2.5, colorscale=scale, showscale=True,
                             colorbar=dict(title="regime", tickvals=[0, 1, 2], ticktext=list(REGIMES), x=1.0, len=0.42, y=0.79),
                             name="regime"), 1, 2)
    fig.update_xaxes(title_text="kappa (gamma = c^kappa)", row=1, col=2)
    fig.update_yaxes(title_text="(beta*^T u)^2, ||beta*|| = 1", row=1, col=2)
    fig.add_annotation(text="benign only at beta* || u, kappa > 2", x=3.0, y=0.93, showarrow=False,
                       font=dict(size=11, color="white"), row=1, col=2)

    if result is not None:
        palette = {"1": _REGIME_COLOR["tempered"], "c^1.5": _REGIME_COLOR["catastrophic"], "c^3": _REGIME_COLOR["benign"]}
        for rule, cols in result.paths.items():
            color = palette.get(rule, "gray")
            fig.add_trace(go.Scatter(x=cols["c"], y=cols["sim_mean"], mode="markers", name=f"sim gamma={rule}",
                                     marker=dict(color=color, size=9),
                                     error_y=dict(type="data", array=[2 * s for s in cols["sim_se"]])), 2, 1)
            fine = np.logspace(math.log10(min(cols["c"])), math.log10(max(cols["c"])), 60)
            fig.add_trace(go.Scatter(x=fine, y=theory_risk(fine, [gamma_from_rule(rule, c) for c in fine], 1.0,
                                                           noise_std=noise_std),
                                     mode="lines", name=f"theory gamma={rule}", line=dict(color=color)), 2, 1)
        fig.update_xaxes(title_text="c = d/n", type="log", row=2, col=1)
        fig.update_yaxes(title_text="excess risk", type="log", row=2, col=1)

        df = result.to_frame()
        for a in sorted(df["alignment"].unique()):
            sub = df[df["alignment"] == a]
            fig.add_trace(go.Scatter(x=sub["theory"], y=sub["sim_mean"], mode="markers", name=f"(b^T u)^2={a:g}",
                                     text=[f"c={c:g}, gamma={r}" for c, r in zip(sub["c"], sub["rule"])],
                                     error_y=dict(type="data", array=2 * sub["sim_se"])), 2, 2)
        lo, hi = float(df["theory"].min()) * 0.9, float(df["theory"].max()) * 1.1
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(color="black", dash="dash")), 2, 2)
        fig.update_xaxes(title_text="theory", type="log", row=2, col=2)
        fig.update_yaxes(title_text="simulation", type="log", row=2, col=2)
    fig.update_layout(height=850, width=1150, title="Spiked regression: min-norm interpolation risk phases",
                      legend=dict(font=dict(size=10)))
    return fig
