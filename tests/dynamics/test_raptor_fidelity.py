"""Raptor against the official code (issue #33 items 4-6): the max-cut split rule, the R² definition, the block sizes.

The references below are re-implemented from reading the official sources (``KempnerInstitute/raptor``:
``max_cut_dinov2_base.ipynb`` ``recursive_max_cut`` / ``max_cut_bruteforce``, ``block.py``, ``trainer.py``
``validation_step``; ``KempnerInstitute/overcomplete``: ``metrics.r2_score``), written plainly (loops) so that they
are checked independently of the vectorised library code.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from interp.dynamics.raptor import (Raptor, RaptorConfig, layer_r2, layer_r2_official, maxcut_phases, phases,
                                    r2_score_official)

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------ max-cut
def _official_recursive_max_cut(W: np.ndarray, eps: float, min_size: int = 2) -> list[list[int]]:
    """The official recursive bisection with the brute-force solver, as read: a dict of pending gains (the
    parent's cut for both children, ``inf`` at the start); take the largest; stop when it is ``<= eps``; a cluster
    of fewer than ``2 * min_size`` layers, or whose max-cut is ``<= eps``, is retired (gain ``-inf``); otherwise
    split it along its max-cut, *whatever the sizes of the two sides*. The max-cut scans
    ``itertools.product([0, 1], repeat=n - 1)`` with vertex 0 pinned to side 0 and keeps the first strict maximum;
    the cut weight is the sum of ``W`` over the pairs on different sides divided by 2."""
    clusters = [list(range(W.shape[0]))]
    gains = {0: np.inf}
    while True:
        tgt = max(gains, key=gains.get)
        if gains[tgt] <= eps:
            break
        idx = clusters[tgt]
        if len(idx) < 2 * min_size:
            gains[tgt] = -np.inf
            continue
        sub = W[np.ix_(idx, idx)]
        best_val, best_side = -np.inf, None
        for bits in itertools.product([0, 1], repeat=len(idx) - 1):
            side = np.array((0, *bits), dtype=bool)
            val = sub[np.logical_xor.outer(side, side)].sum() / 2
            if val > best_val:
                best_val, best_side = val, side
        if best_val <= eps:
            gains[tgt] = -np.inf
            continue
        clusters[tgt] = [i for i, s in zip(idx, best_side) if not s]
        clusters.append([i for i, s in zip(idx, best_side) if s])
        gains[tgt] = best_val
        gains[len(clusters) - 1] = best_val
    return sorted((sorted(c) for c in clusters), key=lambda p: p[0])


def _random_distance(rng, L: int) -> np.ndarray:
    """A symmetric non-negative matrix with zero diagonal; half of the draws get an outlier layer (as DINOv2's
    last block), which is where a single-layer phase appears."""
    X = rng.uniform(size=(L, L))
    D = (X + X.T) / 2
    if rng.uniform() < 0.5:
        o = int(rng.integers(L))
        D[o, :] += rng.uniform(0.5, 2.0)
        D[:, o] += rng.uniform(0.5, 2.0)
    np.fill_diagonal(D, 0.0)
    return D


def test_maxcut_matches_the_official_rule_on_random_matrices():
    """450 random matrices (L = 5..9, frac 0.05 / 0.1 / 0.2): the default rule gives the official partition on
    every one; our earlier rule (``rule="min_side"``, both sides >= 2 layers, the only rule before the fix) gives
    another partition on some of them (36 of the 450), every one with a single-layer phase in the official
    partition. So this test fails on the code as it was (``min_side`` was then the behaviour)."""
    rng = np.random.default_rng(33)
    n_diff = 0
    for trial in range(150):
        L = int(rng.integers(5, 10))
        D = _random_distance(rng, L)
        for frac in (0.05, 0.1, 0.2):
            want = _official_recursive_max_cut(D, eps=frac * D.sum() / 2)
            got = maxcut_phases(D, frac=frac)
            assert got.parts == want, (trial, frac, got.parts, want)
            assert phases(D, frac=frac, method="maxcut").parts == want
            old = maxcut_phases(D, frac=frac, rule="min_side").parts
            if old != want:
                n_diff += 1
                assert min(map(len, want)) == 1, (want, old)
                assert min(map(len, old)) >= 2
    assert n_diff >= 5, n_diff


def test_official_split_leaves_a_single_layer_by_hand():
    """Layers 0-3 a chain (D = 0.1 |i - j|), layer 4 an outlier (D[i, 4] = 1.2 - 0.05 i). Cuts of the 5 layers:
    {4} | rest = 1.2 + 1.15 + 1.1 + 1.05 = 4.5 (the maximum); the best with both sides >= 2 layers is
    {3, 4} | {0, 1, 2} = (0.3 + 0.2 + 0.1) + (1.2 + 1.15 + 1.1) = 4.05 ({0, 4}: 3.9, {2, 4}: 3.8, {1, 4}: 3.75).
    ΣD/2 = 0.1 x (3 + 2 x 2 + 3) + 4.5 = 5.5; frac 0.5 -> eps 2.75. Official: split off {4} (4.5 > 2.75); then
    {0..3} (4 layers, so splittable) has max-cut {0, 1} | {2, 3} = 0.8 <= 2.75: phases [0-3][4] (the shape of the
    official DINOv2 split [8-11][12]). Ours before: [0-2][3-4] (4.05 > 2.75; 3 layers are not split)."""
    D = np.zeros((5, 5))
    for i in range(4):
        for j in range(4):
            D[i, j] = 0.1 * abs(i - j)
        D[i, 4] = D[4, i] = 1.2 - 0.05 * i
    res = maxcut_phases(D, frac=0.5)
    assert res.parts == [[0, 1, 2, 3], [4]]
    assert res.gains == [pytest.approx(4.5)] and res.eps == pytest.approx(2.75)
    assert res.thresholds == [3]                                  # Raptor routing: block 0 up to layer 4 (1-based)
    assert maxcut_phases(D, frac=0.5, rule="min_side").parts == [[0, 1, 2], [3, 4]]
    assert _official_recursive_max_cut(D, eps=2.75) == [[0, 1, 2, 3], [4]]
    # min_size only stops clusters under 2 * min_size layers from being split: 3 layers never split with 2 ...
    D3 = np.array([[0, 5, 5], [5, 0, 5], [5, 5, 0]], dtype=float)
    assert maxcut_phases(D3, frac=0.0).parts == [[0, 1, 2]]
    # ... and with min_size 1 every cluster of >= 2 layers may split: {0, 1} | {2} (first of the ties), then {0} | {1}
    assert maxcut_phases(D3, frac=0.0, min_size=1).parts == [[0], [1], [2]]
    assert _official_recursive_max_cut(D3, eps=0.0, min_size=1) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="rule"):
        maxcut_phases(D, frac=0.1, rule="balanced")


def test_maxcut_ties_resolve_in_the_official_order():
    """All off-diagonal distances 1, 4 layers: every 2 | 2 split cuts 4 (the maximum), 1 | 3 cuts 3. The official
    scan (vertex 0 pinned, ``product`` over vertices 1..3 with vertex 3 fastest: 000, 001, 010, 011, ...) meets
    ``011`` = {0, 1} | {2, 3} first. (The earlier scan, vertex 1 as the lowest bit, met {0, 3} | {1, 2} first.)"""
    D = np.ones((4, 4)) - np.eye(4)
    assert _official_recursive_max_cut(D, eps=0.5 * D.sum() / 2) == [[0, 1], [2, 3]]
    assert maxcut_phases(D, frac=0.5).parts == [[0, 1], [2, 3]]
    assert maxcut_phases(D, frac=0.5, rule="min_side").parts == [[0, 3], [1, 2]]


def test_maxcut_n_phases_never_makes_an_empty_phase():
    """``n_phases`` (ours; the official code has only the threshold): when no cut is positive, no split."""
    D = np.zeros((6, 6))
    assert maxcut_phases(D, n_phases=3).parts == [list(range(6))]


#: The DINOv2-S / Fashion-MNIST cosine-distance matrix printed (2 decimals) in docs/raptor.md.
DINOV2S_FASHION_COSINE = np.array([
    [0.00, 0.23, 0.32, 0.38, 0.37, 0.39, 0.63, 0.76, 0.84, 0.84, 0.86, 0.99],
    [0.23, 0.00, 0.23, 0.30, 0.33, 0.37, 0.65, 0.78, 0.82, 0.85, 0.88, 0.98],
    [0.32, 0.23, 0.00, 0.13, 0.21, 0.28, 0.40, 0.51, 0.56, 0.58, 0.62, 1.07],
    [0.38, 0.30, 0.13, 0.00, 0.11, 0.20, 0.37, 0.50, 0.53, 0.58, 0.62, 1.06],
    [0.37, 0.33, 0.21, 0.11, 0.00, 0.11, 0.36, 0.50, 0.56, 0.63, 0.65, 1.05],
    [0.39, 0.37, 0.28, 0.20, 0.11, 0.00, 0.33, 0.50, 0.56, 0.64, 0.66, 1.02],
    [0.63, 0.65, 0.40, 0.37, 0.36, 0.33, 0.00, 0.15, 0.31, 0.38, 0.39, 1.30],
    [0.76, 0.78, 0.51, 0.50, 0.50, 0.50, 0.15, 0.00, 0.23, 0.34, 0.35, 1.27],
    [0.84, 0.82, 0.56, 0.53, 0.56, 0.56, 0.31, 0.23, 0.00, 0.20, 0.28, 1.16],
    [0.84, 0.85, 0.58, 0.58, 0.63, 0.64, 0.38, 0.34, 0.20, 0.00, 0.17, 1.17],
    [0.86, 0.88, 0.62, 0.62, 0.65, 0.66, 0.39, 0.35, 0.28, 0.17, 0.00, 1.18],
    [0.99, 0.98, 1.07, 1.06, 1.05, 1.02, 1.30, 1.27, 1.16, 1.17, 1.18, 0.00],
])


def test_documented_dinov2_partitions_hold_under_the_official_rule():
    """The max-cut partitions docs/raptor.md lists for DINOv2-S / Fashion-MNIST (measured with our former rule)
    are what the official rule gives on the printed matrix too, and the official reference agrees."""
    D = DINOV2S_FASHION_COSINE
    want = {0.2: [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]], 0.1: [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9], [10, 11]],
            0.09: [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9], [10, 11]], 0.05: [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9], [10, 11]]}
    for frac, parts in want.items():
        assert maxcut_phases(D, frac=frac).parts == parts, frac
        assert maxcut_phases(D, frac=frac, rule="min_side").parts == parts, frac
        assert _official_recursive_max_cut(D, eps=frac * D.sum() / 2) == parts, frac


# ------------------------------------------------------------------------------------------------ R²
def test_r2_score_official_by_hand():
    """The official ``overcomplete.metrics.r2_score(x, x_hat)``, called as ``r2_score(pred, a_end)``:
    ``1 - mean((x - x_hat)²) / (mean((x - mean(x))²) + 1e-6)`` with ``mean(x)`` ONE scalar over all entries of the
    FIRST argument, the prediction. pred = [[1, 3], [3, 5]], target = [[1, 2], [3, 6]]:
    residuals 0, 1, 0, -1 -> MSE 0.5; mean(pred) = 3, (pred - 3)² = 4, 0, 0, 4 -> 2; R² = 1 - 0.5 / 2.000001.
    Not the teacher's variance (target around its scalar mean 3: 4, 1, 0, 9 -> 3.5, R² 0.857), and not ours per
    feature (feature 0: SSE 0 -> 1; feature 1: SSE 2 / SST 8 -> 0.75; mean 0.875)."""
    pred = torch.tensor([[1.0, 3.0], [3.0, 5.0]])
    target = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    assert r2_score_official(pred, target) == pytest.approx(1 - 0.5 / 2.000001, rel=1e-12)
    assert r2_score_official(target, pred) == pytest.approx(1 - 0.5 / 3.500001, rel=1e-12)
    # the shape does not matter (means over all entries): [b, t, d] as [(b t), d]
    assert r2_score_official(pred.view(1, 2, 2), target.view(1, 2, 2)) == r2_score_official(pred, target)
    # a per-feature offset counts as explained variance: ours is 0 here, the official one close to 1
    y = torch.tensor([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0]])
    x = torch.tensor([[1.0, 11.0], [1.0, 11.0], [1.0, 11.0]])     # predicts every feature's mean
    # mean(x) = 6, (x - 6)² = 25 each -> 25; MSE = (1 + 0 + 1) / 3 = 2/3
    assert r2_score_official(x, y) == pytest.approx(1 - (2 / 3) / (25 + 1e-6), rel=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        r2_score_official(pred, target[:1])


def test_layer_r2_official_is_the_batch_weighted_official_score_per_layer():
    """Entry l - 1 is the official ``validation_step(start_layer=0, end_layer=l)``: rollout from a_0 to layer l,
    r2_score per batch, averaged weighted by batch size (5 images in batches of 2, 2, 1). Differs from ours."""
    torch.manual_seed(0)
    L, N, T, d = 3, 5, 4, 8
    raptor = Raptor(RaptorConfig(d_model=d, n_heads=2, n_layers=L, thresholds=[1], layerscale_init=0.5))
    acts = torch.randn(L + 1, N, T, d) + torch.linspace(-2, 2, d)       # per-feature offsets
    got = layer_r2_official(raptor, acts, batch_size=2)
    with torch.no_grad():
        want = []
        for l in range(1, L + 1):
            total = 0.0
            for s in range(0, N, 2):
                x = acts[0, s:s + 2]
                for t in range(1, l + 1):
                    x = raptor.step(x, t)
                total += r2_score_official(x.reshape(-1, d), acts[l, s:s + 2].reshape(-1, d)) * x.shape[0]
            want.append(total / N)
    assert got.tolist() == pytest.approx(want, rel=1e-5)
    ours, _ = layer_r2(raptor, acts)
    assert not np.allclose(got.numpy(), ours.numpy(), atol=1e-2)
    with pytest.raises(ValueError, match="batch_size"):
        layer_r2_official(raptor, acts, batch_size=0)


# ------------------------------------------------------------------------------------------------ block sizes
def test_block_sizes_and_t_proj_init_are_the_official_ones():
    """Official ``block.py``: SwiGLU ``Linear(d, 2 * hid), Linear(hid, d)`` with ``hid = int(d * mlp_ratio)`` = 4d;
    ``t_proj``'s last layer weight AND bias ~ N(0, 1e-4). Ours before the fix: hid = int(2/3 * 4d), bias 0."""
    d = 64
    blk = Raptor(RaptorConfig(d_model=d, n_heads=4, n_layers=2)).blocks[0]
    assert tuple(blk.mlp.w12.weight.shape) == (2 * 4 * d, d) and tuple(blk.mlp.w3.weight.shape) == (d, 4 * d)
    # parameters per block by hand: 2 LN (2 x 2d), attention (4 d² + 4 d), 2 LayerScale (2 d), SwiGLU
    # (d x 8d + 8d + 4d x d + d), t_proj (16 + 16 + 16 x 3d + 3d)
    want = 4 * d + (4 * d * d + 4 * d) + 2 * d + (8 * d * d + 8 * d + 4 * d * d + d) + (32 + 48 * d + 3 * d)
    assert sum(p.numel() for p in blk.parameters()) == want
    bias = blk.t_proj[2].bias.detach()
    assert bool((bias != 0).all()) and 0.5e-4 < float(bias.std()) < 2e-4
    old = Raptor(RaptorConfig(d_model=d, n_heads=4, n_layers=2, swiglu_hidden="two_thirds",
                              t_bias_init="zeros")).blocks[0]
    assert tuple(old.mlp.w3.weight.shape) == (d, int(4 * d * 2 / 3))
    assert bool((old.t_proj[2].bias == 0).all())
    # the GELU MLP is 4d either way
    gelu = Raptor(RaptorConfig(d_model=d, n_heads=4, n_layers=2, mlp="gelu")).blocks[0]
    assert tuple(gelu.mlp[0].weight.shape) == (4 * d, d)
    with pytest.raises(ValueError, match="swiglu_hidden"):
        RaptorConfig(d_model=d, n_heads=4, n_layers=2, swiglu_hidden="half")
    with pytest.raises(ValueError, match="t_bias_init"):
        RaptorConfig(d_model=d, n_heads=4, n_layers=2, t_bias_init="ones")


def test_a_model_saved_before_the_fix_still_loads(tmp_path):
    """A ``config.json`` without ``swiglu_hidden`` was written with the 2/3 width: it is read so."""
    import json
    old = Raptor(RaptorConfig(d_model=16, n_heads=2, n_layers=3, thresholds=[1], swiglu_hidden="two_thirds"))
    path = old.save(tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    for k in ("swiglu_hidden", "t_bias_init"):
        cfg.pop(k)
    (path / "config.json").write_text(json.dumps(cfg))
    back = Raptor.load(path)
    assert back.cfg.swiglu_hidden == "two_thirds"
    x = torch.randn(2, 4, 16)
    assert torch.allclose(back(x), old(x))
