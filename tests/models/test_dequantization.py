"""Tests for models.dequantization (denoising dequantization by ridge regression) and its digits validation
(interp.benchmarks.dequantization)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge
from torch import nn

from interp.benchmarks.dequantization import (DequantConfig, DequantResult, assemble, experiment, loss_roughness,
                                              run_seed, train_digits)
from interp.models.dequantization import (
    DequantLinear, QuantSpec, convert_linears, dequant_params, fake_quantize, fast_affine_matmul, nm_sparsity_mask,
    quantize, ridge_dequantize, ridge_fit, ste_dequantize,
)


@pytest.mark.parametrize("lam", [0.01, 0.5])
def test_closed_form_equals_sklearn_ridge(lam):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, generator=g, dtype=torch.float64) * 2 + 1
    q = (x + 0.7 * torch.randn(200, generator=g, dtype=torch.float64)).round()
    N = len(x)
    s, b = ridge_fit(x, q, lam=lam, affine=True)
    ref = Ridge(alpha=N * lam, fit_intercept=True).fit(q.numpy()[:, None], x.numpy())
    assert float(s) == pytest.approx(ref.coef_[0], rel=1e-10)
    assert float(b) == pytest.approx(ref.intercept_, rel=1e-10)
    s, b = ridge_fit(x, q, lam=lam, affine=False)
    ref = Ridge(alpha=N * lam, fit_intercept=False).fit(q.numpy()[:, None], x.numpy())
    assert float(s) == pytest.approx(ref.coef_[0], rel=1e-10) and float(b) == 0.0


def test_closed_form_is_blockwise():
    x, q = torch.randn(3, 4, 16, dtype=torch.float64), torch.randn(3, 4, 16, dtype=torch.float64).round()
    s, b = ridge_fit(x, q)
    s01, b01 = ridge_fit(x[0, 1], q[0, 1])
    assert s.shape == (3, 4, 1) and float(s[0, 1]) == pytest.approx(float(s01)) and float(b[0, 1]) == pytest.approx(float(b01))


@pytest.mark.parametrize("bits,transform", [(2, "affine"), (4, "affine"), (8, "affine"), (1.5, "linear"),
                                            (2, "linear"), (4, "linear")])
def test_forward_value_equals_rounded_transform(bits, transform):
    x = torch.randn(6, 32, dtype=torch.float64)
    qz = quantize(x, bits, transform)
    if transform == "affine":
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        f = (x - lo) / ((hi - lo) / (2 ** bits - 1))
        levels = (0, 2 ** bits - 1)
    else:
        qmax = 1 if bits == 1.5 else 2 ** (bits - 1) - 1
        f = x / (x.abs().amax(-1, keepdim=True) / qmax)
        levels = (-qmax, qmax)
    torch.testing.assert_close(qz.q, f.round())
    assert qz.q.min() >= levels[0] and qz.q.max() <= levels[1]
    assert torch.equal(qz.q, qz.q.round())


def test_one_bit_codes():
    x = torch.randn(4, 64, dtype=torch.float64)
    lin = quantize(x, 1, "linear")
    torch.testing.assert_close(lin.q, torch.where(x >= 0, 1.0, -1.0).double())
    torch.testing.assert_close(lin.scale, x.abs().mean(-1, keepdim=True))       # XNOR-Net scale
    aff = quantize(x, 1, "affine")                                                # sign around the block mean
    torch.testing.assert_close(aff.q, torch.where(x >= x.mean(-1, keepdim=True), 1.0, -1.0).double())


def test_quantizer_gradient_is_inverse_scale_and_ste_is_identity():
    x = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    qz = quantize(x, 2, "affine")
    qz.q.sum().backward()
    torch.testing.assert_close(x.grad, (1 / qz.scale).expand_as(x))
    x.grad = None
    c = torch.randn(3, 16, dtype=torch.float64)
    (ste_dequantize(quantize(x, 2, "affine")) * c).sum().backward()
    torch.testing.assert_close(x.grad, c)


def test_ridge_gradient_flows_through_the_statistics():
    """Hand derivative of the linear ridge dequantizer y = s q, s = <q,x>/(<q,q>+λ), q = x/s_f + δ."""
    torch.manual_seed(0)
    N, lam = 16, 0.01
    x = torch.randn(N, dtype=torch.float64, requires_grad=True)
    c = torch.randn(N, dtype=torch.float64)
    qz = quantize(x, 1.5, "linear")
    y = ridge_dequantize(x, qz.q, lam=lam, affine=False)
    (y * c).sum().backward()
    q, xv, sf = qz.q.detach(), x.detach(), qz.scale.detach()
    D = (q @ q) / N + lam
    s = (q @ xv) / N / D
    cq = c @ q
    dL_dq = s * c + cq * (xv / N / D - (q @ xv) / N * 2 * q / N / D ** 2)
    expected = dL_dq / sf + cq * q / N / D       # through q (1/s_f) and through the x-side statistic
    torch.testing.assert_close(x.grad, expected)
    # the error-aware gradient differs from the straight-through one (which would be s/s_f * c-ish)
    assert not torch.allclose(x.grad, c, atol=1e-3)
    # and with the x statistics detached only the q path remains
    x.grad = None
    (ridge_dequantize(x, quantize(x, 1.5, "linear").q, lam=lam, affine=False, detach_x_stats=True) * c).sum().backward()
    torch.testing.assert_close(x.grad, dL_dq / sf)


def test_large_lambda_returns_the_mean():
    x = torch.randn(5, 64, dtype=torch.float64) + 3
    y = fake_quantize(x, QuantSpec(1, "affine", 32), "ridge", lam=1e6)
    torch.testing.assert_close(y, x.reshape(5, 2, 32).mean(-1, keepdim=True).expand(5, 2, 32).reshape(5, 64),
                               atol=1e-5, rtol=0)


def test_many_bits_reconstruct_the_input():
    x = torch.randn(8, 128, dtype=torch.float64)
    for method in ("ridge", "ste"):
        y = fake_quantize(x, QuantSpec(8, "affine", 64), method, lam=0.01)
        assert float((y - x).abs().max()) < 0.03


def test_ridge_one_bit_is_the_two_group_means():
    """With λ -> 0 the affine fit on a two-level code reproduces each group's mean (least squares)."""
    x = torch.randn(1, 64, dtype=torch.float64)
    y = fake_quantize(x, QuantSpec(1, "affine", 64), "ridge", lam=0.0)[0]
    above = x[0] >= x[0].mean()
    torch.testing.assert_close(y[above], x[0][above].mean().expand(int(above.sum())))
    torch.testing.assert_close(y[~above], x[0][~above].mean().expand(int((~above).sum())))


def test_nm_sparsity_and_dense_statistics():
    x = torch.randn(4, 64, dtype=torch.float64)
    mask = nm_sparsity_mask(x, 2, 4)
    groups = mask.reshape(4, 16, 4)
    assert torch.equal(groups.sum(-1), torch.full((4, 16), 2.0, dtype=torch.float64))
    a = x.abs().reshape(4, 16, 4)
    kept = a.masked_fill(groups == 0, float("inf")).amin(-1)
    dropped = a.masked_fill(groups == 1, -1.0).amax(-1)
    assert bool((kept >= dropped).all())
    spec = QuantSpec(1, "linear", 64, sparsity=(2, 4))
    y = fake_quantize(x, spec, "ridge", lam=0.01)
    assert bool((y[mask == 0] == 0).all()) and bool((y[mask == 1] != 0).all())
    q = torch.where(x >= 0, 1.0, -1.0).double() * mask                   # ternary code with 2:4 zeros
    s = (q * x).mean(-1, keepdim=True) / ((q * q).mean(-1, keepdim=True) + 0.01)   # dense x in the statistic
    torch.testing.assert_close(y, s * q)


@pytest.mark.parametrize("wspec,aspec", [
    (QuantSpec(1, "affine", 16), QuantSpec(1, "affine", 16)),
    (QuantSpec(4, "affine", 16), QuantSpec(2, "affine", 16)),
    (QuantSpec(1, "linear", 16, (2, 4)), QuantSpec(4, "affine", 16)),
    (QuantSpec(1.5, "linear", None), QuantSpec(8, "affine", None)),
])
@pytest.mark.parametrize("method", ["ridge", "ste"])
def test_fast_affine_matmul_equals_dequantize_then_matmul(wspec, aspec, method):
    torch.manual_seed(0)
    X, W = torch.randn(7, 64, dtype=torch.float64), torch.randn(5, 64, dtype=torch.float64)
    explicit = fake_quantize(X, aspec, method) @ fake_quantize(W, wspec, method).T
    fast = fast_affine_matmul(*dequant_params(X, aspec, method), *dequant_params(W, wspec, method))
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


def test_dequant_linear_fast_path_matches_values_and_gradients():
    torch.manual_seed(0)
    kw = dict(weight_spec=QuantSpec(1, "affine", 32), act_spec=QuantSpec(2, "affine", 32), method="ridge")
    slow, fast = DequantLinear(64, 8, **kw).double(), DequantLinear(64, 8, fast=True, **kw).double()
    fast.load_state_dict(slow.state_dict())
    x = torch.randn(2, 3, 64, dtype=torch.float64)
    ys, yf = slow(x), fast(x)
    torch.testing.assert_close(yf, ys)
    ys.square().sum().backward()
    yf.square().sum().backward()
    torch.testing.assert_close(fast.weight.grad, slow.weight.grad)
    with pytest.raises(ValueError, match="same block size"):
        DequantLinear(64, 8, weight_spec=QuantSpec(1, "affine", 32), act_spec=QuantSpec(1, "affine", 64), fast=True)


def test_convert_linears_is_a_drop_in():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 32), nn.ReLU()), nn.Linear(32, 4))
    x = torch.randn(10, 64)
    ref = net(x)
    convert_linears(net, QuantSpec(16, "affine", 32), QuantSpec(16, "affine", 32), "ridge", lam=0.0,
                    quantize_first_input=False)
    layers = [m for m in net.modules() if isinstance(m, DequantLinear)]
    assert len(layers) == 3 and layers[0].act_spec is None and layers[1].act_spec is not None
    torch.testing.assert_close(net(x), ref, atol=1e-3, rtol=1e-3)
    convert_linears(net, None, None, "none")   # already converted: unchanged
    assert len([m for m in net.modules() if isinstance(m, DequantLinear)]) == 3


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="bits"):
        QuantSpec(bits=3.3)
    with pytest.raises(ValueError, match="linear"):
        QuantSpec(1, "affine", 64, sparsity=(2, 4))
    with pytest.raises(ValueError, match="multiple of block_size"):
        fake_quantize(torch.randn(2, 10), QuantSpec(1, "affine", 4))
    with pytest.raises(ValueError, match="same shape"):
        ridge_fit(torch.randn(4), torch.randn(5))
    with pytest.raises(ValueError, match="unknown methods"):
        DequantConfig(methods=("bitnet",))


def test_loss_roughness():
    assert loss_roughness(np.array([4.0, 3.0, 2.0, 1.0]), skip=0.0) == 0.0
    assert loss_roughness(np.array([1.0, 2.0, 1.0, 2.0]), skip=0.0) == pytest.approx(8 / 9)  # diffs 1, -1, 1
    assert np.isnan(loss_roughness(np.array([1.0, np.nan, 1.0, 2.0]), skip=0.0))


def test_reduced_experiment(tmp_path):
    """A1W1 digits at reduced scale: every variant learns; 2:4 sparsity costs little; at a large learning
    rate STE blows up while ridge dequantization keeps training."""
    cfg = DequantConfig(epochs=25, seeds=(0,), stability_epochs=8)
    res = experiment(cfg)
    for v in res.variants:
        assert res.accuracy[v][0] > 0.9, (v, res.accuracy[v])
    assert res.accuracy["ridge_2:4"][0] >= res.accuracy["ridge"][0] - 0.03
    assert res.stability_diverged["ste"] == [True] and res.stability_diverged["ridge"] == [False]
    assert np.isfinite(res.stability_losses["ridge"]).all()
    assert res.stability_losses["ridge"][0, -1] < res.stability_losses["ridge"][0, 0]
    frame = res.to_frame()
    assert set(frame["variant"]) == {"ste", "ridge", "ridge_2:4"} and len(frame) == 5
    assert len(res.figure().data) >= 6
    back = DequantResult.load(res.save(tmp_path / "dq"))
    assert back.accuracy == res.accuracy


def test_training_is_reproducible():
    cfg = DequantConfig(epochs=2, seeds=(0,))
    a, b = train_digits(cfg, "ridge", 1), train_digits(cfg, "ridge", 1)
    np.testing.assert_array_equal(a.losses, b.losses)


def test_run_seed_and_assemble_equal_experiment():
    """The recipe's unit (one seed) and its assembly give the experiment's result."""
    cfg = DequantConfig(epochs=2, seeds=(0, 1), methods=("ste", "ridge"), stability_epochs=2)
    whole = experiment(cfg)
    parts = assemble(cfg, [run_seed(cfg, s) for s in cfg.seeds])
    assert parts.accuracy == whole.accuracy and parts.stability_diverged == whole.stability_diverged
    np.testing.assert_array_equal(parts.losses["ridge"], whole.losses["ridge"])
    with pytest.raises(ValueError, match="one output per seed"):
        assemble(cfg, [run_seed(cfg, 0)])


# The digest's full-scale criteria (accuracy, loss variance, 2:4 cost, stability probe) are the claims of
# ``interp reproduce dequantization`` (benchmarks/dequantization/claims.yaml); the slow test of the recipes'
# full presets (tests/reproduce/) asserts the verdicts they expect.
