"""The SDM digest's digits recipe (section 11): an imbalanced, noisy digits pool (class proportions 1:...:10, 20 %
near-duplicates, 10 % flipped labels) and a balanced target set; an SAE with the monotonicity loss; a budget-200
selection by SDM (lambda = 0.8, stochastic greedy) against random, top-quality and apricot selections, scored by
KL to the target feature distribution and by the balanced test accuracy of a logistic regression trained on the
selection; and the objective's sanity checks (brute force on 12-item instances, apricot agreement).

The method is :mod:`interp.models.sdm`; the real-embedding pools (Fashion-MNIST / DINOv2, KJV / MiniLM) are
:mod:`interp.benchmarks.sdm.pools`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from interp.models.sdm import (DEFAULT_BIN_WEIGHTS, SAEConfig, apricot_select, brute_force_check, encode,
                               greedy_select, kl_to_target, quality_bins, quality_scores, random_select,
                               target_distribution, top_quality_select, train_sae)
from interp.progress import progress
from interp.results import Result

__all__ = ["DigitsPool", "SDMConfig", "SDMResult", "assemble", "experiment", "make_digits_pool", "make_pool",
           "objective_checks", "run_seed"]

@dataclass
class DigitsPool:
    """The imbalanced, noisy source pool and the balanced target/test sets (standardised pixels ``[n, 64]``).
    ``y_pool`` holds the (noisy) labels; ``clean_pool`` the true ones; ``duplicate`` flags near-duplicates."""

    x_pool: np.ndarray
    y_pool: np.ndarray
    clean_pool: np.ndarray
    duplicate: np.ndarray
    x_target: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def make_digits_pool(seed: int = 0, dup_frac: float = 0.2, noise_frac: float = 0.1, target_per_class: int = 30,
                     test_frac: float = 0.3, dup_sigma: float = 0.05, featurize=None) -> DigitsPool:
    """Digits split into a stratified test set, a balanced target set and an imbalanced pool (class
    proportions 1:2:…:10 in a seed-dependent class order), plus ``dup_frac`` near-duplicates (Gaussian
    jitter ``dup_sigma`` on [0, 1] pixels) and ``noise_frac`` uniformly flipped labels.

    ``featurize`` (optional) maps ``[n, 64]`` pixels in [0, 1] to embeddings ``[n, D]`` (e.g. DINOv2 features,
    see :func:`interp.benchmarks.misd.zero_shot.image_features`); every set is featurized before the pool-fitted standardisation."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x, y = d.data.astype(np.float64) / 16.0, d.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=test_frac, random_state=seed, stratify=y)
    return make_pool(x_rest, y_rest, x_test, y_test, rng, dup_frac, noise_frac, target_per_class, dup_sigma, featurize)


def make_pool(x_rest: np.ndarray, y_rest: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
              rng: np.random.Generator, dup_frac: float = 0.2, noise_frac: float = 0.1, target_per_class: int = 30,
              dup_sigma: float = 0.05, featurize=None, perturb=None) -> DigitsPool:
    """The imbalanced noisy pool from labelled pixels ``x_rest`` ``[n, P]`` in [0, 1] (labels 0..9): per class a
    balanced target of ``target_per_class``, the rest kept in proportion ``(rank + 1) / 10`` (seeded class
    ranks), ``dup_frac`` jittered near-duplicates, ``noise_frac`` flipped labels; ``featurize`` as in
    :func:`make_digits_pool`; standardised on the pool. ``perturb(rows, rng) -> rows`` replaces the pixel jitter
    for other inputs (e.g. texts, see :func:`make_text_pool`)."""
    tgt, pool = [], []
    rank = rng.permutation(10)                                            # class c keeps (rank[c] + 1) / 10
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y_rest == c))
        tgt.extend(idx[:target_per_class])
        rest = idx[target_per_class:]
        pool.extend(rest[:max(1, int(round(len(rest) * (rank[c] + 1) / 10)))])
    pool = np.array(pool)
    xp, yp = x_rest[pool], y_rest[pool]
    n_dup = int(round(dup_frac * len(xp)))
    src = rng.integers(0, len(xp), n_dup)
    dups = (perturb(xp[src], rng) if perturb is not None
            else np.clip(xp[src] + dup_sigma * rng.standard_normal((n_dup, xp.shape[1])), 0, 1))
    xp = np.concatenate([xp, dups])
    yp = np.concatenate([yp, yp[src]])
    clean = yp.copy()
    flip = rng.permutation(len(yp))[:int(round(noise_frac * len(yp)))]
    yp[flip] = (yp[flip] + rng.integers(1, 10, len(flip))) % 10
    x_tgt = x_rest[np.array(tgt)]
    if featurize is not None:
        xp, x_tgt, x_test = (np.asarray(featurize(a), dtype=np.float64) for a in (xp, x_tgt, x_test))
    mu, sd = xp.mean(0), xp.std(0) + (0.1 if featurize is None else 0.1 * xp.std(0).mean())
    std = lambda a: ((a - mu) / sd).astype(np.float32)
    dup = np.zeros(len(xp), bool)
    dup[-n_dup:] = True
    return DigitsPool(std(xp), yp, clean, dup, std(x_tgt), std(x_test), y_test)


@dataclass
class SDMConfig:
    """The digest's digits recipe: b = 200, λ = 0.8, stochastic greedy, 5 seeds."""

    budget: int = 200
    lam: float = 0.8
    epsilon: float | None = 0.01
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    sae: SAEConfig = field(default_factory=SAEConfig)
    weights: tuple[float, ...] = DEFAULT_BIN_WEIGHTS
    apricot: bool = True  # the apricot baseline (its first call JIT-compiles with numba: slow)
    #: the sanity checks of the objective (recipe only): brute force on ``check_items``-item instances at
    #: ``check_lams`` x ``check_budgets`` over ``check_seeds``, and plain greedy (lambda = 1, uniform p) against
    #: apricot on a ``check_apricot_items``-item instance
    check_items: int = 12
    check_lams: tuple[float, ...] = (0.5, 0.8, 1.0)
    check_budgets: tuple[int, ...] = (3, 4, 5)
    check_seeds: tuple[int, ...] = (0, 1, 2)
    check_apricot_items: int = 60
    check_apricot: bool = True

    def __post_init__(self):
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if len(self.seeds) < 1:
            raise ValueError("seeds must not be empty")
        if len(self.weights) < 1 or any(w < 0 for w in self.weights):
            raise ValueError(f"weights must be non-negative bin weights, got {self.weights}")


@dataclass
class SDMResult(Result):
    """Per seed and method (``sdm``, ``random``, ``top_quality``, ``apricot``): ``kl`` (KL to the target feature
    distribution), ``balanced_accuracy`` of a logistic regression trained on the selection, ``noisy_share``
    (flipped labels selected), ``duplicate_share``; ``class_counts[method]`` ``[n_seeds, 10]`` (true classes)."""

    seeds: list[int]
    kl: dict[str, list[float]]
    balanced_accuracy: dict[str, list[float]]
    noisy_share: dict[str, list[float]]
    duplicate_share: dict[str, list[float]]
    class_counts: dict[str, np.ndarray]
    mono_history: list[list[float]] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"seed": s, "method": m, "kl": self.kl[m][i],
                              "balanced_accuracy": self.balanced_accuracy[m][i],
                              "noisy_share": self.noisy_share[m][i], "duplicate_share": self.duplicate_share[m][i]}
                             for m in self.kl for i, s in enumerate(self.seeds)])

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        df = self.to_frame()
        fig = make_subplots(rows=1, cols=3, subplot_titles=("KL(p_target ‖ p(A)) ↓", "balanced accuracy ↑",
                                                           "selected true classes (mean)"))
        for c, k in enumerate(("kl", "balanced_accuracy"), start=1):
            fig.add_trace(go.Box(x=df["method"], y=df[k], boxpoints="all", showlegend=False), row=1, col=c)
        for m, counts in self.class_counts.items():
            fig.add_trace(go.Bar(x=list(range(10)), y=np.asarray(counts).mean(0), name=m), row=1, col=3)
        fig.update_layout(title="SDM on the imbalanced noisy digits pool", height=420)
        return fig


def run_seed(config: SDMConfig, seed: int, featurize=None, pool=None) -> dict:
    """One seed of the digits recipe: build the pool (``pool(seed, featurize=...)``, default
    :func:`make_digits_pool`), train the SAE (MSE + L_mono), select ``budget`` items with SDM and the baselines and
    score each selection. Returns ``{"kl", "bacc", "noisy", "dup": {method: float}, "counts": {method: [10]},
    "mono": [epochs]}``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score

    data = (pool or make_digits_pool)(seed, featurize=featurize)
    sae, hist = train_sae(torch.from_numpy(data.x_pool), dataclasses.replace(config.sae, seed=seed))
    z_pool, z_tgt = encode(sae, torch.from_numpy(data.x_pool)), encode(sae, torch.from_numpy(data.x_target))
    p = target_distribution(z_tgt)
    q = quality_scores(data.x_pool, data.y_pool, seed=seed)
    bins = quality_bins(q, len(config.weights))
    sels = {"sdm": greedy_select(z_pool, config.budget, p, bins, config.weights, config.lam, config.epsilon, seed),
            "random": random_select(len(z_pool), config.budget, seed),
            "top_quality": top_quality_select(q, config.budget)}
    if config.apricot:
        sels["apricot"] = apricot_select(z_pool, config.budget)
    out: dict = {k: {} for k in ("kl", "bacc", "noisy", "dup", "counts")}
    for m, idx in sels.items():
        idx = idx.numpy()
        clf = LogisticRegression(max_iter=1000).fit(data.x_pool[idx], data.y_pool[idx])
        out["kl"][m] = float(kl_to_target(p, z_pool[idx]))
        out["bacc"][m] = float(balanced_accuracy_score(data.y_test, clf.predict(data.x_test)))
        out["noisy"][m] = float((data.y_pool[idx] != data.clean_pool[idx]).mean())
        out["dup"][m] = float(data.duplicate[idx].mean())
        out["counts"][m] = np.bincount(data.clean_pool[idx], minlength=10)
    out["mono"] = [float(v) for v in hist["mono"]]
    return out


def assemble(config: SDMConfig, outputs: list[dict]) -> SDMResult:
    """An :class:`SDMResult` from the :func:`run_seed` outputs in the order of ``config.seeds``."""
    from interp.configs import config_to_dict

    methods = list(outputs[0]["kl"])
    col = lambda k: {m: [float(o[k][m]) for o in outputs] for m in methods}
    return SDMResult(seeds=[int(s) for s in config.seeds], kl=col("kl"), balanced_accuracy=col("bacc"),
                     noisy_share=col("noisy"), duplicate_share=col("dup"),
                     class_counts={m: np.stack([np.asarray(o["counts"][m]) for o in outputs]) for m in methods},
                     mono_history=[list(o["mono"]) for o in outputs], config=config_to_dict(config))


def experiment(config: SDMConfig | None = None, featurize=None, pool=None) -> SDMResult:
    """The digits recipe over ``config.seeds`` (:func:`run_seed` per seed). ``featurize``: optional pixel ->
    embedding map for the pool (see :func:`make_digits_pool`); ``pool``: optional ``(seed, featurize) -> DigitsPool``
    builder (default :func:`make_digits_pool`; e.g. :func:`interp.benchmarks.sdm.pools.make_fashion_pool`)."""
    config = config or SDMConfig()
    return assemble(config, [run_seed(config, s, featurize, pool) for s in progress(list(config.seeds),
                                                                                   desc="sdm seeds")])


def objective_checks(config: SDMConfig) -> dict:
    """The digest's sanity checks of the objective: exhaustive diminishing-returns / monotonicity check and
    greedy vs OPT on random ``check_items``-item code sets (``d = 10``, 3 non-zeros per item; random ``p`` and
    quality bins) for every ``check_lams`` x ``check_budgets`` x ``check_seeds``; and, with
    ``config.check_apricot``, plain greedy at lambda = 1 with a uniform ``p`` against apricot's
    ``FeatureBasedSelection(concave_func='log')`` on a ``check_apricot_items``-item instance.

    Returns ``{"min_dr_slack", "min_greedy_ratio", "monotone" (1.0/0.0), "apricot_agreement"}`` (the share of
    the 15 selected positions where both agree, NaN without apricot) and a row per instance."""
    rows = []
    for seed in config.check_seeds:
        g = torch.Generator().manual_seed(int(seed))
        n, d, k = config.check_items, 10, 3
        z = torch.zeros(n, d, dtype=torch.float64)
        idx = torch.stack([torch.randperm(d, generator=g)[:k] for _ in range(n)])
        z.scatter_(1, idx, torch.rand(n, k, generator=g, dtype=torch.float64) * 2)
        p = torch.rand(d, generator=g, dtype=torch.float64)
        p = p / p.sum()
        bins = torch.randint(0, 3, (n,), generator=g)
        for lam in config.check_lams:
            for b in config.check_budgets:
                r = brute_force_check(z, p, int(b), bins, lam=float(lam))
                rows.append({"seed": int(seed), "lambda": float(lam), "budget": int(b), "monotone": float(r.monotone),
                             "min_dr_slack": r.min_dr_slack, "greedy / OPT": r.ratio})
    agreement = float("nan")
    if config.check_apricot:
        g = torch.Generator().manual_seed(5)
        n, d, k = config.check_apricot_items, 16, 4
        z = torch.zeros(n, d, dtype=torch.float64)
        idx = torch.stack([torch.randperm(d, generator=g)[:k] for _ in range(n)])
        z.scatter_(1, idx, torch.rand(n, k, generator=g, dtype=torch.float64) * 2)
        budget = min(15, n)
        ours = greedy_select(z, budget, torch.full((d,), 1 / d, dtype=torch.float64), bins=None, lam=1.0,
                             epsilon=None)
        theirs = apricot_select(z, budget)
        agreement = float((ours == theirs).double().mean())
    return {"min_dr_slack": min(r["min_dr_slack"] for r in rows), "min_greedy_ratio": min(r["greedy / OPT"] for r in rows),
            "monotone": min(r["monotone"] for r in rows), "apricot_agreement": agreement, "rows": rows}
