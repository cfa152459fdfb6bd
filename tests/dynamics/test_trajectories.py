"""Tests of interp.dynamics.trajectories against hand computations and a tiny ViT."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import interp
import interp.testing
from interp.dynamics.trajectories import (angular_speed, basin_perturbation, class_basin_accuracy, convergence,
                                          patch_coherence, residual_stream, speed_jumps, stable_rank,
                                          trajectory_metrics, update_stable_rank)

torch.set_num_threads(1)
interp.set_progress(False)


def circle_stream(angles, radius=3.0):
    """Points on a circle (times a radius, so norms are non-unit) at cumulative angles: [L + 1, d = 2]."""
    theta = torch.tensor(np.concatenate([[0.0], np.cumsum(angles)]), dtype=torch.float64)
    return (radius * torch.stack([torch.cos(theta), torch.sin(theta)], -1)).float()


def test_speed_and_convergence_by_hand():
    angles = [0.1, 0.4, 0.2, 0.3]
    x = circle_stream(angles)
    assert torch.allclose(angular_speed(x), torch.tensor(angles), atol=1e-5)
    total = sum(angles)
    expected = [math.cos(total - c) for c in np.concatenate([[0.0], np.cumsum(angles)])]
    g = convergence(x)
    assert torch.allclose(g, torch.tensor(expected, dtype=torch.float32), atol=1e-5)
    assert g[-1].item() == pytest.approx(1.0)
    # antiparallel and random vectors: s in [0, pi], gamma_L = 1
    y = torch.tensor([[1.0, 0.0], [-2.0, 0.0]])
    assert angular_speed(y)[0].item() == pytest.approx(math.pi, abs=1e-6)
    r = torch.randn(6, 5, 7, 16)
    s = angular_speed(r)
    assert (s >= 0).all() and (s <= math.pi).all() and s.shape == (5, 5, 7)
    assert torch.allclose(convergence(r)[-1], torch.ones(5, 7))


def test_stable_rank_by_hand():
    u = torch.randn(10, 1)
    v = torch.randn(1, 6)
    assert stable_rank(u @ v).item() == pytest.approx(1.0, abs=1e-5)
    q = torch.linalg.qr(torch.randn(8, 8))[0][:3]                 # 3 orthonormal rows
    assert stable_rank(q).item() == pytest.approx(3.0, abs=1e-5)
    m = torch.diag(torch.tensor([2.0, 1.0, 1.0]))               # (4 + 1 + 1) / 4
    assert stable_rank(m).item() == pytest.approx(1.5, abs=1e-6)
    # update field: X_{l+1} - X_l
    stream = torch.zeros(3, 1, 4, 3)
    stream[1, 0] = torch.outer(torch.arange(1.0, 5.0), torch.tensor([1.0, 2.0, 0.0]))  # rank-1 update
    stream[2] = stream[1] + torch.eye(4, 3)[None] * torch.tensor([3.0, 1.0, 1.0])       # diag(3,1,1) update
    assert torch.allclose(update_stable_rank(stream)[:, 0], torch.tensor([1.0, 11 / 9]), atol=1e-5)


def test_patch_coherence_and_speed_jumps_by_hand():
    stream = torch.zeros(2, 1, 3, 2)
    stream[0, 0, 1:] = torch.tensor([[1.0, 0.0], [0.0, 1.0]])   # patches at 90 degrees: cos to mean = 1/sqrt2
    stream[1, 0, 1:] = torch.tensor([[2.0, 2.0], [5.0, 5.0]])   # aligned
    stream[:, 0, 0] = torch.tensor([9.0, 9.0])                  # CLS ignored
    assert torch.allclose(patch_coherence(stream)[:, 0], torch.tensor([1 / math.sqrt(2), 1.0]), atol=1e-6)
    s = torch.tensor([0.1, 0.1, 0.5, 0.5, 0.5, 0.2])
    jumps = speed_jumps(s, [[0, 1], [2, 3, 4], [5]])
    assert jumps["boundary_jump"] == pytest.approx((0.4 + 0.3) / 2)
    assert jumps["inside_jump"] == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="phase starts"):
        speed_jumps(s, [[0], [7]])


def test_class_basins_by_hand():
    # two classes, final directions e1 / e2; at layer 0 one image of class 0 points at e2
    cls = torch.zeros(2, 4, 2)
    cls[1] = torch.tensor([[1.0, 0.0], [2.0, 0.1], [0.0, 1.0], [0.1, 3.0]])
    cls[0] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 2.0]])
    acc = class_basin_accuracy(cls, [0, 0, 1, 1])
    assert torch.allclose(acc, torch.tensor([0.75, 1.0]))
    with pytest.raises(ValueError, match="two classes"):
        class_basin_accuracy(cls, [0, 0, 0, 0])


@pytest.fixture(scope="module")
def vit():
    hf, _ = interp.testing.tiny_model("dinov2", n_layers=4, perturb_norms=True)
    return interp.wrap(hf, None, backend="torch")


def test_trajectory_metrics_on_a_vit(vit):
    images = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    stream = residual_stream(vit, images, batch_size=4)
    assert stream.shape == (5, 6, 17, 64)
    res = trajectory_metrics(vit, images, labels=[0, 1, 0, 1, 0, 1], phases=[[0, 1], [2, 3]])
    assert set(res.gamma) == {"cls", "patches"}
    assert res.gamma["cls"][-1].item() == pytest.approx(1.0, abs=1e-5)
    assert res.speed["patches"].shape == (4,)
    assert torch.allclose(res.speed["cls"], angular_speed(stream[:, :, :1]).mean(dim=(1, 2)), atol=1e-5)
    assert (res.update_stable_rank >= 1 - 1e-4).all() and (res.update_stable_rank <= 17).all()
    assert torch.allclose(res.basin_accuracy, class_basin_accuracy(stream[:, :, 0], [0, 1, 0, 1, 0, 1]))
    assert set(res.speed_jumps) == {"cls", "patches"}
    df = res.to_frame()
    assert len(df) == 5 and "gamma_cls" in df
    assert len(res.figure().data) >= 6
    with pytest.raises(ValueError, match="model and images"):
        trajectory_metrics()


def test_basin_perturbation_on_a_vit(vit):
    images = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    res = basin_perturbation(vit, images, layers=[0, 2], sigma=0.3, labels=[0, 1, 0, 1, 0, 1])
    assert res.angle_at_layer.shape == (2,)
    # the perturbation really moved the CLS at the layer: relative noise 0.3 gives an angle near atan(0.3)
    assert 0.1 < res.angle_at_layer[0].item() < 0.6
    assert (res.angle_final > 0).all()
    # perturbing the last layer's output moves the final direction by exactly the perturbation
    last = basin_perturbation(vit, images, layers=[3], sigma=0.3)
    assert last.angle_final[0].item() == pytest.approx(last.angle_at_layer[0].item(), rel=1e-4)
    with pytest.raises(ValueError, match="sigma"):
        basin_perturbation(vit, images, sigma=0)
