"""Tests of interp.dynamics.raptor: layer distances, phases (planted block recurrence), Raptor training."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import interp
import interp.testing
from interp.dynamics.raptor import (cut_value, distances_from_stack, dp_phases, layer_distances, maxcut_phases, phases,
                                    token_summaries)

torch.set_num_threads(1)
interp.set_progress(False)

PLANTED = [[0, 1], [2, 3, 4], [5, 6, 7]]


def planted_vit(arch: str = "dinov2", parts=PLANTED, seed: int = 0):
    """A tiny ViT whose blocks are tied copies, one block per planted phase; each phase's block adds a large
    constant (MLP output bias) along its own direction, 10x larger than the previous phase's, so the block outputs
    of one phase point alike and differ from the other phases'. Norm weights perturbed (non-unit)."""
    L = sum(len(p) for p in parts)
    hf, _ = interp.testing.tiny_model(arch, n_layers=L, perturb_norms=True, seed=seed)
    layers = hf.encoder.layer if hasattr(hf, "encoder") else hf.vit.encoder.layer
    g = torch.Generator().manual_seed(seed)
    d = hf.config.hidden_size
    dirs = torch.linalg.qr(torch.randn(d, len(parts), generator=g))[0].T
    with torch.no_grad():
        for k, p in enumerate(parts):
            src = layers[p[0]]
            fc2 = src.mlp.fc2 if hasattr(src.mlp, "fc2") else None
            if fc2 is None:  # HF ViT: output.dense carries the MLP's second projection
                src.output.dense.bias.copy_(dirs[k] * 5.0 * 10 ** k)
            else:
                fc2.bias.copy_(dirs[k] * 5.0 * 10 ** k)
            for l in p[1:]:
                layers[l].load_state_dict(src.state_dict())
    return hf


@pytest.fixture(scope="module")
def planted():
    hf = planted_vit()
    return interp.wrap(hf, None, backend="torch")


def test_token_summaries_and_distance_hand_computation():
    # 2 layers, 1 image, CLS + 1 register + 2 patches, d = 2
    resid = torch.tensor([[[[1., 0.], [9., 9.], [0., 1.], [0., 3.]]],
                          [[[0., 2.], [9., 9.], [0., 2.], [0., 2.]]]])
    s = token_summaries(resid, n_registers=1)
    assert torch.allclose(s[0, 0], torch.tensor([[1., 0.], [0., 2.]]))
    cos, mse = distances_from_stack(s)
    # cls: cos((1,0),(0,2)) = 0 -> 1; patch-mean: (0,2) vs (0,2) -> 0; mean 0.5
    assert cos[0, 1].item() == pytest.approx(0.5)
    assert cos[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    # mse: cls ((1-0)^2 + (0-2)^2)/2 = 2.5; patches 0 -> 1.25
    assert mse[0, 1].item() == pytest.approx(1.25)
    with pytest.raises(ValueError, match="CLS token"):
        token_summaries(torch.zeros(1, 1, 2, 4), n_registers=1)


def test_maxcut_hand_matrix():
    # two obvious blocks {0,1,2} and {3,4}, interleaved order must not matter for max-cut
    D = np.ones((5, 5)) - np.eye(5)
    for a, b in itertools.product(range(3), range(3)):
        D[a, b] = 0.0 if a == b else 0.1
    D[3, 4] = D[4, 3] = 0.1
    res = maxcut_phases(D, frac=0.1)
    assert res.parts == [[0, 1, 2], [3, 4]]
    assert res.cut == pytest.approx(6.0)
    assert res.gains == [pytest.approx(6.0)]
    # threshold 0.95 * 6.4 = 6.08 > gain 6 keeps one phase; 0.9 * 6.4 = 5.76 splits
    assert maxcut_phases(D, frac=0.95).parts == [[0, 1, 2, 3, 4]]
    # permuting the layers permutes the phases (max-cut does not assume contiguity)
    perm = [3, 0, 4, 1, 2]
    Dp = D[np.ix_(perm, perm)]
    got = maxcut_phases(Dp, frac=0.1).parts
    assert sorted(sorted(perm[i] for i in p) for p in got) == [[0, 1, 2], [3, 4]]
    assert not maxcut_phases(Dp, frac=0.1).contiguous


def test_dp_is_exact_against_enumeration():
    rng = np.random.default_rng(0)
    for L in (6, 7, 9):
        X = rng.normal(size=(L, L))
        D = np.abs(X + X.T)
        np.fill_diagonal(D, 0)
        for k in (2, 3):
            best = -1.0
            for cuts in itertools.combinations(range(1, L), k - 1):
                bounds = (0,) + cuts + (L,)
                parts = [list(range(bounds[i], bounds[i + 1])) for i in range(k)]
                if min(map(len, parts)) < 2:
                    continue
                best = max(best, cut_value(D, parts))
            res = dp_phases(D, n_phases=k)
            assert res.cut == pytest.approx(best)
            assert res.contiguous and len(res.parts) == k


def test_bad_inputs():
    with pytest.raises(ValueError, match="square"):
        phases(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="method"):
        phases(np.zeros((4, 4)), method="spectral")
    with pytest.raises(ValueError, match="n_phases"):
        dp_phases(np.zeros((4, 4)), n_phases=3)
    with pytest.raises(ValueError, match="NaN"):
        phases(np.full((4, 4), np.nan))


@pytest.mark.parametrize("method", ["maxcut", "dp"])
def test_planted_recurrence_is_recovered(planted, method):
    images = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    dist = layer_distances(planted, images, batch_size=4)
    assert dist.cosine.shape == (8, 8)
    assert torch.allclose(dist.cosine, dist.cosine.T, atol=1e-5)
    assert phases(dist, n_phases=3, method=method).parts == PLANTED
    res = phases(dist, frac=0.05, method=method)
    assert res.parts == PLANTED, (res.parts, dist.cosine)
    assert res.thresholds == [1, 4]
    fig = dist.figure(res.parts)
    assert len(fig.layout.shapes) == 4


def test_layer_distances_batches_agree(planted):
    images = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    a = layer_distances(planted, images, batch_size=5)
    b = layer_distances(planted, images, batch_size=2)
    assert torch.allclose(a.cosine, b.cosine, atol=1e-5) and torch.allclose(a.mse, b.mse, rtol=1e-4)
