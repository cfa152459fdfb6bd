"""Spiked-covariance min-norm interpolation: closed form, simulator, regimes (Li & Sonthalia, ICLR 2026)."""
import math
import re

import numpy as np
import pytest

from interp.benchmarks.spiked_regression import SpikedRegressionConfig, SpikedRegressionResult, experiment
from interp.configs import ConfigError
from interp.models import SpikedSimulationConfig
from interp.models.spiked_regression import (alignment_coefficient, alignment_flip_gamma, asymptotic_regime,
                                             asymptotic_risk, excess_risk, gamma_from_rule, make_target, make_targets,
                                             min_norm_interpolator, sample_spiked_data, simulate_risk, theory_risk)


# ---------------------------------------------------------------- closed form, by hand
def test_theory_reduces_to_isotropic_result_without_spike():
    # Hastie et al.: bias ||beta||^2 (1 - 1/c), variance sigma^2 / (c - 1)
    for c in (1.5, 2.0, 5.0):
        for a in (0.0, 0.3, 1.0):
            assert theory_risk(c, 0.0, a, noise_std=0.5) == pytest.approx((1 - 1 / c) + 0.25 / (c - 1))


def test_theory_hand_values():
    # c = 8, gamma = c^3: coefficient = (512*64 - 2*512*8 - 512^2) / 520^2
    coef = (512 * 64 - 2 * 512 * 8 - 512 ** 2) / 520 ** 2
    assert alignment_coefficient(8, 512) == pytest.approx(coef)
    assert theory_risk(8, 512, 1.0, noise_std=0.5) == pytest.approx(7 / 8 * (1 + coef) + 0.25 / 7)
    assert theory_risk(8, 512, 1.0, noise_std=0.5) == pytest.approx(0.142, abs=1e-3)  # digest's number
    # scaling: alpha^2 tau^2 multiplies the signal part only
    base = theory_risk(3, 5, 0.5, noise_std=0.0)
    assert theory_risk(3, 5, 0.5, alpha=2.0, tau=1.5, noise_std=0.0) == pytest.approx(base * 4 * 2.25)
    # ||beta||^2 = 2 with alignment 1
    assert theory_risk(4, 4, 1.0, beta_norm2=2.0) == pytest.approx(0.75 * (2 + alignment_coefficient(4, 4)))
    # under-parameterised: least squares variance c / (1 - c)
    assert theory_risk(0.5, 10.0, 1.0, noise_std=0.5) == pytest.approx(0.25)
    assert math.isinf(theory_risk(1.0, 1.0, 1.0, noise_std=0.5))


def test_alignment_sign_flips_exactly_at_c_times_c_minus_2():
    for c in (2.5, 3.0, 4.0, 8.0, 20.0):
        g0 = alignment_flip_gamma(c)
        assert alignment_coefficient(c, g0) == pytest.approx(0.0, abs=1e-12)
        assert alignment_coefficient(c, 0.9 * g0) > 0 > alignment_coefficient(c, 1.1 * g0)
        # the risk gap between aligned and orthogonal targets has the same sign
        gap = lambda g: theory_risk(c, g, 1.0) - theory_risk(c, g, 0.0)  # noqa: E731
        assert gap(0.5 * g0) > 0 > gap(2 * g0)
    # for c <= 2 alignment always helps once gamma > 0
    assert all(alignment_coefficient(c, g) < 0 for c in (1.2, 2.0) for g in (0.1, 1, 10, 1e4))


def test_gamma_rules():
    assert gamma_from_rule("0", 4) == 0
    assert gamma_from_rule("1", 4) == 1
    assert gamma_from_rule("c", 4) == 4
    assert gamma_from_rule("4c", 4) == 16
    assert gamma_from_rule("c^2", 4) == 16
    assert gamma_from_rule("c^3", 4) == 64
    assert gamma_from_rule("c^1.5", 4) == pytest.approx(8)
    assert gamma_from_rule("0.5c^2", 4) == pytest.approx(8)
    assert gamma_from_rule("c(c-2)", 4) == 8
    assert gamma_from_rule(2.5, 4) == 2.5
    for bad in ("c**2", "import os", "2^3", "gamma"):
        with pytest.raises(ValueError):
            gamma_from_rule(bad, 4)


def test_asymptotic_regimes_match_the_paper_table():
    assert asymptotic_regime(0.0, 1.0) == "tempered"            # gamma = Theta(1)
    assert asymptotic_regime(1.0, 1.0) == "catastrophic"        # omega(1) <= gamma <= o(c^2), not orthogonal
    assert asymptotic_regime(1.5, 0.3) == "catastrophic"
    assert asymptotic_regime(1.5, 0.0) == "tempered"            # orthogonal target never diverges
    assert asymptotic_regime(2.0, 1.0) == "tempered"
    assert asymptotic_regime(3.0, 1.0) == "benign"              # gamma = omega(c^2) and beta* || u
    assert asymptotic_regime(3.0, 0.5) == "tempered"
    # digest: gamma = 4 c^2 is not benign, the coefficient tends to -0.75 so R -> 0.25
    assert asymptotic_risk(2.0, 1.0, prefactor=4.0) == pytest.approx(0.25)
    # gamma = 1: R -> ||beta||^2 + gamma (beta^T u)^2
    assert asymptotic_risk(0.0, 1.0, prefactor=1.0) == pytest.approx(2.0)


def test_asymptotic_limits_agree_with_closed_form_at_huge_c():
    c = 1e7
    for kappa, pref in ((0.0, 1.0), (0.0, 3.0), (2.0, 4.0), (2.0, 0.5), (3.0, 1.0)):
        for a in (0.0, 0.5, 1.0):
            assert theory_risk(c, pref * c ** kappa, a, noise_std=0.5) == pytest.approx(
                asymptotic_risk(kappa, a, pref), abs=2e-3)
    assert theory_risk(c, c ** 1.5, 1.0) > 1e3


def test_theory_rejects_bad_input():
    with pytest.raises(ValueError):
        theory_risk(-1.0, 1.0, 0.5)
    with pytest.raises(ValueError):
        theory_risk(2.0, -1.0, 0.5)
    with pytest.raises(ValueError):
        theory_risk(2.0, 1.0, 1.5)  # alignment above ||beta||^2
    with pytest.raises(ValueError):
        SpikedRegressionConfig(alignments=(2.0,))


# ---------------------------------------------------------------- simulator pieces
def test_targets_have_requested_norm_and_alignment():
    rng = np.random.default_rng(0)
    u = rng.standard_normal(50)
    u /= np.linalg.norm(u)
    b = make_target(u, 0.3, 2.0, rng)
    assert np.linalg.norm(b) == pytest.approx(2.0)
    assert (b @ u) ** 2 == pytest.approx(0.3)
    bs = make_targets(u, [0.0, 0.5, 1.0], 1.0, rng)
    assert bs.shape == (50, 3)
    np.testing.assert_allclose(np.linalg.norm(bs, axis=0), 1.0)
    np.testing.assert_allclose((u @ bs) ** 2, [0.0, 0.5, 1.0], atol=1e-12)


def test_min_norm_interpolator_is_the_pseudoinverse_solution():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((60, 20))       # d > n: interpolation
    y = rng.standard_normal((20, 2))
    b = min_norm_interpolator(x, y)
    np.testing.assert_allclose(x.T @ b, y, atol=1e-10)                 # interpolates
    np.testing.assert_allclose(b, np.linalg.pinv(x.T) @ y, atol=1e-10)   # minimum norm
    x = rng.standard_normal((10, 40))       # d < n: least squares
    y = rng.standard_normal(40)
    np.testing.assert_allclose(min_norm_interpolator(x, y), np.linalg.lstsq(x.T, y, rcond=None)[0], atol=1e-10)
    with pytest.raises(ValueError):
        min_norm_interpolator(x, y[:5])


def test_data_follow_the_convention():
    rng = np.random.default_rng(2)
    d, n, gamma = 40, 20000, 9.0
    u = np.eye(d)[0]
    beta = make_target(u, 1.0, 1.0, rng)
    data = sample_spiked_data(n, d, gamma, beta, u, rng, tau=2.0, noise_std=0.0)
    cov = data.x @ data.x.T / n
    assert cov[0, 0] == pytest.approx(4.0 * (1 + gamma), rel=0.05)     # tau^2 (1 + gamma) along u
    assert np.mean(np.diag(cov)[1:]) == pytest.approx(4.0, rel=0.02)
    np.testing.assert_allclose(data.y[:, 0], data.x.T @ beta, atol=1e-9)  # well-specified, noiseless
    with pytest.raises(ValueError):
        sample_spiked_data(10, d, 1.0, beta, 2 * u, rng)


def test_excess_risk_formula_matches_test_sampling():
    rng = np.random.default_rng(3)
    d, theta, tau = 6, 2.0, 1.3
    u = np.eye(d)[2]
    beta = rng.standard_normal((d, 1))
    beta_hat = rng.standard_normal((d, 1))
    taz, taa = 0.7, 1.2  # a shifted test distribution
    m = 400000
    v = rng.standard_normal(m)
    a = tau * rng.standard_normal((d, m))
    x = theta * np.outer(u, v) + a
    y = taz * theta * v * (u @ beta[:, 0]) + taa * (a.T @ beta[:, 0])
    mc = np.mean((y - x.T @ beta_hat[:, 0]) ** 2)
    exact = excess_risk(beta_hat, beta, u, theta, tau, taz, taa)[0]
    assert mc == pytest.approx(exact, rel=0.01)


# ---------------------------------------------------------------- theory vs simulation (reduced)
def test_simulation_matches_theory_on_a_small_grid():
    n, reps = 200, 30
    worst = 0.0
    for c in (2.0, 4.0):
        for gamma in (0.0, 1.0, c, 4 * c):
            rng = np.random.default_rng([7, int(c), int(gamma)])
            r = simulate_risk(c, gamma, [0.0, 1.0], n, reps, rng, noise_std=0.5)
            th = theory_risk(c, gamma, np.array([0.0, 1.0]), noise_std=0.5)
            worst = max(worst, float(np.max(np.abs(r.mean(0) - th) / th)))
    assert worst < 0.08


def test_underparameterised_and_frobenius_simulation():
    rng = np.random.default_rng(11)
    r = simulate_risk(0.5, 4.0, [0.0, 1.0], 400, 20, rng, noise_std=0.5)
    assert r.mean() == pytest.approx(0.25, rel=0.08)   # least squares: tau_eps^2 c / (1 - c)
    # Frobenius scaling theta^2 = d tau^2: aligned targets are (nearly) benign, orthogonal ones are not
    r = simulate_risk(4.0, 0.0, [0.0, 1.0], 150, 20, rng, noise_std=0.5, spike_scaling="frobenius")
    th = theory_risk(4.0, 600.0, np.array([0.0, 1.0]), noise_std=0.5)
    np.testing.assert_allclose(r.mean(0), th, rtol=0.08)
    assert r.mean(0)[1] < 0.2 * r.mean(0)[0]


def test_misspecified_training_changes_risk_in_simulator():
    rng = np.random.default_rng(5)
    well = simulate_risk(3.0, 12.0, [1.0], 150, 15, np.random.default_rng(5), noise_std=0.5)
    mis = simulate_risk(3.0, 12.0, [1.0], 150, 15, rng, noise_std=0.5, alpha_z=2.0, alpha_a=1.0,
                        test_alpha_z=1.0, test_alpha_a=1.0)
    # training on a doubled spike coefficient but testing on the original one inflates the risk
    assert mis.mean() > 1.5 * well.mean()


def test_simulate_risk_config_and_keywords_give_the_same_risks():
    opts = dict(beta_norm=1.2, alpha=0.9, tau=1.1, noise_std=0.5, alpha_z=1.3, test_alpha_a=0.8, num_threads=None)
    by_keywords = simulate_risk(3.0, 9.0, [0.0, 0.7, 1.44], 60, 4, np.random.default_rng(3), **opts)
    cfg = SpikedSimulationConfig(c=3.0, gamma=9.0, alignments=[0.0, 0.7, 1.44], n=60, repeats=4, **opts)
    assert cfg.alignments == (0.0, 0.7, 1.44) and cfg.d == 180
    hash(cfg)
    by_config = simulate_risk(config=cfg, rng=np.random.default_rng(3))
    assert by_config.shape == (4, 3)
    np.testing.assert_array_equal(by_config, by_keywords)
    # the options do reach the simulation: the defaults give other risks
    plain = simulate_risk(3.0, 9.0, [0.0, 0.7, 1.44], 60, 4, np.random.default_rng(3), beta_norm=1.2)
    assert not np.allclose(plain, by_config)


_GOOD = dict(c=2.0, gamma=1.0, alignments=(0.0, 1.0), n=20, repeats=2)


@pytest.mark.parametrize("field, value, expected", [
    ("c", 0.0, "SpikedSimulationConfig.c must be a positive number (the aspect ratio d/n); got 0.0"),
    ("c", 0.01, "SpikedSimulationConfig.c must be large enough that d = round(c * n) >= 1 (n = 20); got 0.01"),
    ("gamma", -1.0, "SpikedSimulationConfig.gamma must be a number >= 0; got -1.0"),
    ("gamma", float("inf"), "SpikedSimulationConfig.gamma must be a number >= 0; got inf"),
    ("n", 0, "SpikedSimulationConfig.n must be a positive integer; got 0"),
    ("n", 20.0, "SpikedSimulationConfig.n must be a positive integer; got 20.0"),
    ("repeats", 0, "SpikedSimulationConfig.repeats must be a positive integer; got 0"),
    ("alignments", (0.0, 1.5), "SpikedSimulationConfig.alignments must be a non-empty sequence of numbers in "
                               "[0, beta_norm^2 = 1.0]; got (0.0, 1.5)"),
    ("alignments", (), "SpikedSimulationConfig.alignments must be a non-empty sequence"),
    ("alignments", "01", "SpikedSimulationConfig.alignments must be a non-empty sequence"),
    ("beta_norm", -1.0, "SpikedSimulationConfig.beta_norm must be a number >= 0; got -1.0"),
    ("tau", 0.0, "SpikedSimulationConfig.tau must be a positive number; got 0.0"),
    ("noise_std", -0.5, "SpikedSimulationConfig.noise_std must be a number >= 0; got -0.5"),
    ("alpha", "1", "SpikedSimulationConfig.alpha must be a finite number; got '1'"),
    ("test_alpha_a", float("nan"), "SpikedSimulationConfig.test_alpha_a must be a finite number or None (= alpha)"),
    ("spike_scaling", "spectral", "SpikedSimulationConfig.spike_scaling must be 'operator' or 'frobenius'; "
                                  "got 'spectral'"),
    ("num_threads", 0, "SpikedSimulationConfig.num_threads must be a positive integer or None; got 0"),
])
def test_spiked_simulation_config_refuses_bad_fields(field, value, expected):
    with pytest.raises(ConfigError, match="^" + re.escape(expected)) as err:
        SpikedSimulationConfig(**{**_GOOD, field: value})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=re.escape(f"SpikedSimulationConfig.{field} must be")):
        simulate_risk(rng=np.random.default_rng(0), **{**_GOOD, field: value})


def test_simulate_risk_refuses_mixed_missing_unknown_options_and_a_missing_rng():
    cfg = SpikedSimulationConfig(**_GOOD)
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="simulate_risk: pass either config= or the options as keywords, not both; "
                                          "got config= and noise_std"):
        simulate_risk(rng=rng, config=cfg, noise_std=0.5)
    with pytest.raises(ConfigError, match="not both; got config= and c"):
        simulate_risk(2.0, rng=rng, config=cfg)
    with pytest.raises(ConfigError, match="simulate_risk: config must be a SpikedSimulationConfig, got dict"):
        simulate_risk(rng=rng, config=dict(_GOOD))
    with pytest.raises(ConfigError, match=re.escape("simulate_risk: missing n, repeats (fields of SpikedSimulationConfig "
                                                    "without default)")):
        simulate_risk(2.0, 1.0, [0.0], rng=rng)
    with pytest.raises(ConfigError, match=re.escape("unknown field(s) 'noise' (did you mean 'noise_std'?)")):
        simulate_risk(rng=rng, noise=0.5, **_GOOD)
    with pytest.raises(TypeError, match="simulate_risk: rng must be a numpy.random.Generator, got int"):
        simulate_risk(2.0, 1.0, [0.0], 20, 2, 0)


def test_reduced_experiment_regime_directions_and_result_io(tmp_path):
    cfg = SpikedRegressionConfig(n=150, aspect_ratios=(2.0, 4.0), gamma_rules=("1", "4c", "c^3"), alignments=(0.0, 1.0),
                                 repeats=20, path_aspect_ratios=(2.0, 4.0, 8.0), path_n=120, path_repeats=15,
                                 flip_aspect_ratios=(4.0, 8.0), seed=1)
    res = experiment(cfg)
    # catastrophic growth (gamma = c^1.5), benign decay (c^3), tempered approach (gamma = 1), the sign flip
    for key in ("path_c^1.5_catastrophic_increasing", "path_c^3_benign_decreasing", "path_1_tempered_bounded",
                "alignment_sign_flip"):
        assert res.checks[key], key
    df = res.to_frame()
    assert len(df) == 2 * 3 * 2
    assert (df["rel_error"].abs() < 0.12).all()
    fig = res.figure()
    assert len(fig.data) >= 8
    res.save(tmp_path / "r")
    back = SpikedRegressionResult.load(tmp_path / "r")
    assert back.checks == res.checks
    assert back.to_frame().equals(df)


def test_experiment_is_reproducible():
    cfg = SpikedRegressionConfig(n=60, aspect_ratios=(2.0,), gamma_rules=("c",), alignments=(1.0,), repeats=3,
                                 path_rules=("1",), path_aspect_ratios=(2.0, 4.0), path_n=40, path_repeats=2,
                                 flip_aspect_ratios=(), seed=3)
    a, b = experiment(cfg), experiment(cfg)
    assert a.grid == b.grid and a.paths == b.paths
    c = experiment(SpikedRegressionConfig(**{**cfg.__dict__, "seed": 4}))
    assert c.grid["sim_mean"] != a.grid["sim_mean"]
