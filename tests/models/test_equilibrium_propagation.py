"""Tests for models.equilibrium_propagation (FRE-RNN trained with equilibrium propagation) and its reproduction
(interp.benchmarks.equilibrium_propagation). The paper's criteria on the full run are the recipe's claims
(benchmarks/equilibrium_propagation/claims.yaml), checked by tests/reproduce."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from interp.benchmarks.equilibrium_propagation import EPResult, EPRunConfig, experiment
from interp.models.common import digits_split
from interp.models.equilibrium_propagation import (
    EPConfig, FRERNN, bp_gradients, convergence_profile, default_skips, ep_gradients, gradient_alignment, train,
)


def _net(seed: int = 0, **kw) -> FRERNN:
    cfg = EPConfig(**kw)
    return FRERNN(64, 10, cfg, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def digits():
    return digits_split(seed=0, test_size=0.2)


def test_step_matches_the_papers_equations():
    torch.manual_seed(1)
    net = _net(hidden=(5, 4), beta=0.3, alpha=0.7, bias=True)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_()
    x, s = torch.randn(3, 64, dtype=torch.float64), torch.randn(3, 9, dtype=torch.float64)
    s1, s2 = s[:, :5], s[:, 5:]
    W0, W1, Wf = net.W[0], net.W[1], net.W_f
    h1 = x @ W0.T + 0.3 * s2 @ W1 + net.b[0]                       # W0 s0 + β1 W1ᵀ s2 + b
    h2 = 0.7 * s1 @ W1.T + net.b[1]                                 # α W1 s1 + b
    with torch.no_grad():
        free = net.step(s, net.drive(x), net.coupling())
        torch.testing.assert_close(free, torch.tanh(torch.cat([h1, h2], 1)))
        target = F.one_hot(torch.tensor([1, 0, 7]), 10).double()
        e = target - torch.softmax(s2 @ Wf.T + net.b_f, -1)
        nudged = net.step(s, net.drive(x), net.coupling(), target, beta_f=0.2)
        torch.testing.assert_close(nudged, torch.tanh(torch.cat([h1, h2 + 0.2 * e @ Wf], 1)))


def test_random_feedback_and_skip_links_follow_the_equations():
    net = _net(hidden=(6, 6, 6), beta=(0.2, 0.5), feedback="random", skips=((1, 3), (0, 2)), bias=False)
    x, s = torch.randn(2, 64, dtype=torch.float64), torch.randn(2, 18, dtype=torch.float64)
    s1, s2, s3 = s[:, :6], s[:, 6:12], s[:, 12:]
    S13, S02 = net.S[0], net.S[1]
    h1 = x @ net.W[0].T + 0.2 * s2 @ net.B_1.T + 0.2 * s3 @ net.SB_0.T
    h2 = s1 @ net.W[1].T + 0.5 * s3 @ net.B_2.T + x @ S02.T
    h3 = s2 @ net.W[2].T + s1 @ S13.T
    with torch.no_grad():
        out = net.step(s, net.drive(x), net.coupling())
        torch.testing.assert_close(out, torch.tanh(torch.cat([h1, h2, h3], 1)))
        # the banded fast path equals the dense recurrent matrix
        torch.testing.assert_close(net.coupling()(s), s @ net.recurrent_matrix().T)
    # random feedback matrices are fixed buffers, not trained
    assert "B_1" in dict(net.named_buffers()) and all("B_" not in n for n, _ in net.named_parameters())


def test_unequal_widths_use_the_dense_matrix():
    net = _net(hidden=(7, 5, 3), beta=0.1, skips=((1, 3),))
    s = torch.randn(4, 15, dtype=torch.float64)
    M = net.recurrent_matrix()
    assert M.shape == (15, 15)
    torch.testing.assert_close(M[7:12, 0:7], net.W[1].detach())                     # 1 -> 2
    torch.testing.assert_close(M[0:7, 7:12], 0.1 * net.W[1].detach().T)             # 2 -> 1 (β B1)
    torch.testing.assert_close(M[12:15, 0:7], net.S[0].detach())                    # skip 1 -> 3
    torch.testing.assert_close(net.coupling()(s), s @ M.T)


def test_zero_feedback_is_a_feedforward_tanh_net():
    net = _net(hidden=(32, 32, 32), beta=0.0)
    x = torch.rand(5, 64, dtype=torch.float64)
    h = x
    for W, b in zip(net.W, net.b):
        h = torch.tanh(h @ W.T + b)
    with torch.no_grad():
        s = net.free_phase(x, 3)
        torch.testing.assert_close(net.layers(s)[-1], h)
        torch.testing.assert_close(net.free_phase(x, 10), s)   # a fixed point after L steps


def test_ep_equals_backprop_in_the_small_nudge_limit(digits):
    """β_i = 0 and β_f -> 0: the nudge only moves the top layer and ΔW_{L-1}/β_f -> -∂L/∂W_{L-1}."""
    net = _net(hidden=(64, 64), beta=0.0, beta_f=1e-5)
    x, y = digits.x_train[:128], digits.y_train[:128]
    ep, bp = ep_gradients(net, x, y), bp_gradients(net, x, y)
    for name in ("W.1", "b.1", "W_f", "b_f"):
        torch.testing.assert_close(ep[name], -bp[name], rtol=1e-3, atol=1e-7)
    assert float(ep["W.0"].abs().max()) == 0.0     # no feedback: nothing reaches layer 1


def test_ep_update_aligns_with_negative_bp_gradient(digits):
    net = _net(hidden=(64, 64), beta=0.01)
    cos = gradient_alignment(net, digits.x_test, digits.y_test)
    assert cos["W_f"] > 0.99 and cos["W.1"] > 0.9 and cos["W.0"] > 0.9
    trained = train(EPConfig(), "ep", seed=0, epochs=2).model
    cos = gradient_alignment(trained, digits.x_test, digits.y_test)
    assert cos["W_f"] > 0.9 and cos["W.1"] > 0.9


def test_spectral_radius_is_sqrt_beta_times_top_singular_value():
    """For two layers M = [[0, β W1ᵀ], [W1, 0]], so eig(M)² = eig(β W1ᵀ W1): ρ = sqrt(β) σ_max(W1)."""
    net = _net(hidden=(64, 64), beta=0.01)
    sigma = float(torch.linalg.matrix_norm(net.W[1].detach(), ord=2))
    _, radius = convergence_profile(net, torch.rand(4, 64, dtype=torch.float64), [0.01, 0.1, 1.0, 2.0])
    np.testing.assert_allclose(radius, np.sqrt([0.01, 0.1, 1.0, 2.0]) * sigma, rtol=1e-8)
    assert net.betas == [0.01]  # restored


def test_weak_feedback_converges_fast(digits):
    net = train(EPConfig(), "ep", seed=0, epochs=1).model
    steps, radius = convergence_profile(net, digits.x_test, [0.01, 0.1, 1.0, 2.0], max_steps=500)
    assert steps[0] <= steps[2] / 3
    assert all(a < b for a, b in zip(radius, radius[1:]))
    assert steps[0] <= 10   # nearly feedforward: about L steps plus a few


def test_skip_links_carry_the_nudge_to_deep_layers(digits):
    """At 8 layers with β = 0.01 the nudge reaching layer 1 shrinks like β^7; skips shorten the path."""
    x, y = digits.x_train[:64], digits.y_train[:64]
    plain = ep_gradients(_net(hidden=(64,) * 8), x, y)
    skip = ep_gradients(_net(hidden=(64,) * 8, skips=default_skips(8)), x, y)
    assert default_skips(8) == ((5, 8), (2, 5))
    ratio = float(skip["W.0"].norm() / plain["W.0"].norm().clamp_min(1e-300))
    assert ratio > 1e3
    assert float(skip["W.3"].norm() / plain["W.3"].norm().clamp_min(1e-300)) > 10


def test_agt_random_skips_and_training_step():
    net = _net(hidden=(8,) * 5, feedback="random", skip_probability=1.0)
    assert sorted(net.skips) == [(i, j) for i in range(1, 6) for j in range(i + 2, 6)]
    x, y = torch.rand(6, 64), torch.randint(0, 10, (6,))
    delta = ep_gradients(net, x, y)
    assert set(delta) == {n for n, _ in net.named_parameters()}
    assert all(delta[n].shape == p.shape for n, p in net.named_parameters())


def test_training_is_reproducible():
    a = train(EPConfig(hidden=(16, 16)), "ep", seed=3, epochs=1)
    b = train(EPConfig(hidden=(16, 16)), "ep", seed=3, epochs=1)
    np.testing.assert_array_equal(a.train_loss, b.train_loss)


def test_reduced_experiment(tmp_path):
    """Every validation at reduced scale: EP within 1.5 points of BP, faster convergence with weak
    feedback, growing spectral radius, aligned top-layer updates, skips help a deeper net."""
    res = experiment(EPRunConfig(model=EPConfig(epochs=8), seeds=(0,), convergence_epochs=2, depth_layers=5,
                                 depth_epochs=2, depth_seeds=(0,), max_steps=400))
    assert res.accuracy["ep"][0] > 0.85
    assert abs(res.accuracy["ep"][0] - res.accuracy["bp"][0]) <= 0.015
    assert res.convergence_steps[0] <= res.convergence_steps[2] / 3
    assert all(a < b for a, b in zip(res.spectral_radius, res.spectral_radius[1:]))
    assert res.alignment["W_f"] > 0.9 and res.alignment["W.1"] > 0.9
    assert res.depth_accuracy["skip"][0] > res.depth_accuracy["no_skip"][0]
    frame = res.to_frame()
    assert {"accuracy", "convergence_steps", "spectral_radius", "alignment"} <= set(frame["part"])
    assert len(res.figure().data) > 4
    back = EPResult.load(res.save(tmp_path / "ep"))
    assert back.accuracy == res.accuracy and back.depth_skips == res.depth_skips


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="non-adjacent"):
        EPConfig(hidden=(8, 8, 8), skips=((1, 2),))
    with pytest.raises(ValueError, match="beta needs"):
        EPConfig(hidden=(8, 8, 8), beta=(0.1,))
    with pytest.raises(ValueError, match="T and K"):
        EPConfig(T=0)
    with pytest.raises(ValueError, match="feedback"):
        EPConfig(feedback="mirror")
    with pytest.raises(ValueError, match="method"):
        train(EPConfig(), "hebb", epochs=1)
    with pytest.raises(ValueError, match="seeds"):
        EPRunConfig(seeds=())
