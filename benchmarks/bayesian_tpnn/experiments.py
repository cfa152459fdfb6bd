"""Validation of Bayesian-TPNN (digest section 9): the digest's synthetic function, the stepwise-birth ablations,
diabetes (regression) and breast cancer (classification), with their typed results. The method (basis, priors,
moves, sampler) is :mod:`interp.models.bayesian_tpnn`; ``interp reproduce bayesian_tpnn`` runs these pieces as
stages."""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from interp.results import Result

from interp.models.bayesian_tpnn import BayesianTPNN, BayesianTPNNConfig, component_name

# ----------------------------------------------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------------------------------------------
SYNTHETIC_TRUE_COMPONENTS: tuple[tuple[int, ...], ...] = ((0,), (1,), (2, 3), (4, 5, 6))


def synthetic_anova(n: int, seed: int, noise: float = 0.1, p: int = 8,
                    hierarchical: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The digest's function on ``x ~ U[0, 1]^p`` (``p >= 7``; inputs beyond x7 are noise):
    ``sin(2 pi x1) + (x2 - .5)^2 + 2(x3 - .5)(x4 - .5) + 4(x5 - .5)(x6 - .5)(x7 - .5) + N(0, noise^2)``.

    With ``hierarchical=True`` the term ``2(x5 - .5)(x6 - .5)`` is added, i.e. the three-way part becomes
    ``2(x5 - .5)(x6 - .5)(1 + 2(x7 - .5))``: the x5:x6 interaction, modulated by x7, so the three-way component
    has a lower-order parent that carries signal (the situation stepwise birth is designed for). The true
    components are then ``SYNTHETIC_TRUE_COMPONENTS + ((4, 5),)``.
    Returns ``X`` ``[n, p]``, noisy ``y`` ``[n]`` and the noiseless ``f`` ``[n]``."""
    if p < 7:
        raise ValueError(f"the synthetic function uses 7 inputs, got p={p}")
    rng = np.random.default_rng(seed)
    X = rng.random((n, p))
    f = (np.sin(2 * np.pi * X[:, 0]) + (X[:, 1] - 0.5) ** 2 + 2 * (X[:, 2] - 0.5) * (X[:, 3] - 0.5)
         + 4 * (X[:, 4] - 0.5) * (X[:, 5] - 0.5) * (X[:, 6] - 0.5))
    if hierarchical:
        f = f + 2 * (X[:, 4] - 0.5) * (X[:, 5] - 0.5)
    return X, f + noise * rng.standard_normal(n), f


def selection_auroc(importance: dict[tuple[int, ...], float], true: Sequence[tuple[int, ...]], p: int,
                    max_order: int, order: int | None = None) -> float:
    """AUROC of posterior importance for separating the ``true`` components from every other subset of
    ``range(p)`` of size ``<= max_order`` (or of exactly ``order``); unseen subsets score 0."""
    from sklearn.metrics import roc_auc_score

    true_set = {tuple(sorted(t)) for t in true}
    orders = [order] if order is not None else range(1, max_order + 1)
    labels, scores = [], []
    for d in orders:
        for S in itertools.combinations(range(p), d):
            labels.append(S in true_set)
            scores.append(importance.get(S, 0.0))
    if not any(labels) or all(labels):
        return float("nan")
    return float(roc_auc_score(labels, scores))


def _first_hit(sets_trace: list[list[tuple[int, ...]]], target: tuple[int, ...]) -> int:
    for it, sets in enumerate(sets_trace):
        if target in sets:
            return it
    return -1


# ----------------------------------------------------------------------------------------------------------
# Experiment
# ----------------------------------------------------------------------------------------------------------
@dataclass
class BayesianTPNNResult(Result):
    """Validation of Bayesian-TPNN: synthetic component selection, RMSE vs HistGradientBoosting, the stepwise-
    birth ablations and the diabetes analysis. Component names are 1-based (``x5:x6:x7``).

    ``ablation`` (the digest's function) and ``ablation_hierarchical`` (its variant in which x5:x6 carries
    signal, see :func:`synthetic_anova`) hold per-seed lists ``<metric>_on`` / ``<metric>_off`` for
    ``importance_567``, ``inclusion_567`` (posterior, after burn-in), ``first_hit_567`` (first iteration whose
    state holds an x5:x6:x7 node, -1 = never), ``auroc_order3``, ``stepwise_accept`` and ``stepwise_born_567``
    (accepted stepwise births that created an x5:x6:x7 node), plus ``n_iter``.
    """

    config: dict
    seed: int
    n_train: int
    n_test: int
    true_components: list
    importance: dict                 # synthetic: component -> posterior importance (all seen components)
    inclusion: dict                  # synthetic: component -> posterior inclusion frequency
    selection_auroc: float
    auroc_by_order: dict
    true_ranked_first: bool
    rmse: float
    hgb_rmse: float
    rmse_noiseless: float
    hgb_rmse_noiseless: float
    acceptance: dict
    trace_K: np.ndarray
    trace_rmse: np.ndarray
    ablation: dict
    ablation_hierarchical: dict
    diabetes: dict                   # rmse, hgb_rmse, importance, inclusion, components

    kind = "bayesian_tpnn"

    @property
    def rmse_ratio(self) -> float:
        return self.rmse / self.hgb_rmse

    def to_frame(self):
        """Rows ``(dataset, component, order, importance, inclusion, is_true)`` for both data sets."""
        import pandas as pd

        true = set(self.true_components)
        rows = [{"dataset": "synthetic", "component": c, "order": c.count(":") + 1, "importance": v,
                 "inclusion": self.inclusion.get(c, 0.0), "is_true": c in true}
                for c, v in self.importance.items()]
        dia = self.diabetes or {}
        rows += [{"dataset": "diabetes", "component": c, "order": c.count(":") + 1, "importance": v,
                  "inclusion": dia.get("inclusion", {}).get(c, 0.0), "is_true": None}
                 for c, v in dia.get("importance", {}).items()]
        return pd.DataFrame(rows)

    def ablation_frame(self):
        """One row per (function, seed, stepwise on/off) with the x5:x6:x7 detection metrics."""
        import pandas as pd

        rows = []
        for fn, ab in (("digest", self.ablation), ("hierarchical", self.ablation_hierarchical)):
            for i, seed in enumerate((ab or {}).get("seeds", [])):
                for arm in ("on", "off"):
                    rows.append({"function": fn, "seed": seed, "stepwise": arm == "on",
                                 **{m: ab[f"{m}_{arm}"][i] for m in ABLATION_METRICS}})
        return pd.DataFrame(rows)

    def summary(self) -> dict:
        """Headline numbers against the validation criteria (first hits censored at ``n_iter``)."""
        out = {"selection_auroc": self.selection_auroc, "true_ranked_first": self.true_ranked_first,
               "rmse": self.rmse, "hgb_rmse": self.hgb_rmse, "rmse_ratio": self.rmse_ratio}
        for tag, ab in (("digest", self.ablation), ("hier", self.ablation_hierarchical)):
            out.update({f"{tag}_{k}": v for k, v in ablation_means(ab).items()})
        if self.diabetes:
            out["diabetes_rmse"] = self.diabetes.get("rmse")
            out["diabetes_hgb_rmse"] = self.diabetes.get("hgb_rmse")
        return out

    def figure(self):
        """Four panels: synthetic importances (true in colour), the K trace, the stepwise-birth ablations
        (mean posterior inclusion of x5:x6:x7, on/off) and the diabetes component importances."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=2, cols=2, subplot_titles=(
            f"Synthetic: posterior importance (AUROC {self.selection_auroc:.3f})",
            "MCMC trace: number of TPNN nodes K",
            "Stepwise-birth ablation: inclusion of x5:x6:x7",
            "Diabetes: posterior importance"))
        true = set(self.true_components)
        top = list(self.importance.items())[:15]
        fig.add_trace(go.Bar(x=[c for c, _ in top], y=[v for _, v in top],
                             marker_color=["crimson" if c in true else "grey" for c, _ in top],
                             name="importance", showlegend=False), row=1, col=1)
        fig.add_trace(go.Scatter(y=np.asarray(self.trace_K).tolist(), mode="lines", name="K",
                                 showlegend=False), row=1, col=2)
        labels, means = [], {"on": [], "off": []}
        for fn, ab in (("digest f", self.ablation), ("hierarchical f", self.ablation_hierarchical)):
            if ab and ab.get("seeds"):
                labels.append(f"{fn} ({len(ab['seeds'])} seeds)")
                for arm in ("on", "off"):
                    means[arm].append(float(np.mean(ab[f"inclusion_567_{arm}"])))
        if labels:
            fig.add_trace(go.Bar(x=labels, y=means["on"], name="stepwise birth on"), row=2, col=1)
            fig.add_trace(go.Bar(x=labels, y=means["off"], name="stepwise birth off"), row=2, col=1)
        dia = self.diabetes or {}
        dtop = list(dia.get("importance", {}).items())[:12]
        if dtop:
            fig.add_trace(go.Bar(x=[c for c, _ in dtop], y=[v for _, v in dtop], name="diabetes",
                                 marker_color="steelblue", showlegend=False), row=2, col=2)
        fig.update_layout(height=750, width=1100, barmode="group",
                          title=f"Bayesian-TPNN (seed {self.seed}): test RMSE {self.rmse:.3f} vs HGB {self.hgb_rmse:.3f}")
        return fig


ABLATION_METRICS: tuple[str, ...] = ("importance_567", "inclusion_567", "first_hit_567", "auroc_order3",
                                     "stepwise_accept", "stepwise_born_567")


def ablation_means(ab: dict | None) -> dict[str, float]:
    """Seed-averaged ablation metrics ``<metric>_<on|off>``; a never-reached first hit counts as ``n_iter``."""
    out: dict[str, float] = {}
    if not ab or not ab.get("seeds"):
        return out
    for m in ABLATION_METRICS:
        for arm in ("on", "off"):
            vals = np.asarray([np.nan if v is None else v for v in ab[f"{m}_{arm}"]], dtype=float)
            if m == "first_hit_567":
                vals = np.where(vals < 0, ab["n_iter"], vals)
            if m in ("stepwise_accept", "stepwise_born_567") and arm == "off":
                continue
            out[f"{m}_{arm}"] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
    return out


def _hgb_rmse(Xtr, ytr, Xte, yte, seed: int) -> tuple[float, np.ndarray]:
    from sklearn.ensemble import HistGradientBoostingRegressor

    with threadpool_limits(limits=1):   # same predictions; avoids OpenMP stalls on a busy machine
        pred = HistGradientBoostingRegressor(random_state=seed).fit(Xtr, ytr).predict(Xte)
    return float(np.sqrt(np.mean((pred - yte) ** 2))), pred


def stepwise_ablation(config: BayesianTPNNConfig, seeds: Sequence[int], n_train: int, noise: float = 0.1,
                      hierarchical: bool = False, reuse: dict[tuple[int, bool], BayesianTPNN] | None = None,
                      n_generate: int | None = None) -> dict:
    """Run the sampler with and without stepwise birth on the synthetic data of each seed and record how
    well it detects x5:x6:x7 (see :class:`BayesianTPNNResult`). Each seed's data set is
    ``synthetic_anova(n_generate or n_train, seed)`` cut to its first ``n_train`` points; ``reuse`` maps
    ``(seed, stepwise)`` to a model already fitted with ``config`` on exactly that data."""
    target = (4, 5, 6)
    true = [tuple(t) for t in SYNTHETIC_TRUE_COMPONENTS] + ([(4, 5)] if hierarchical else [])
    ab: dict[str, Any] = {"seeds": [], "n_iter": config.n_iter, "hierarchical": hierarchical}
    for s in seeds:
        s = int(s)
        ab["seeds"].append(s)
        X, y, _ = synthetic_anova(n_generate or n_train, s, noise, hierarchical=hierarchical)
        X, y = X[:n_train], y[:n_train]
        for arm, flag in (("on", True), ("off", False)):
            m = (reuse or {}).get((s, flag))
            if m is None:
                m = BayesianTPNN(dataclasses.replace(config, stepwise=flag)).fit(X, y, seed=s)
            vals = {"importance_567": m.importance_.get(target, 0.0),
                    "inclusion_567": m.inclusion_.get(target, 0.0),
                    "first_hit_567": _first_hit(m.trace_["sets"], target),
                    "auroc_order3": selection_auroc(m.importance_, true, m.p, m.max_order, order=3),
                    "stepwise_accept": (m.acceptance_["stepwise"] if m.move_counts_["stepwise"] else None),
                    "stepwise_born_567": int(m.stepwise_born_.get(target, 0))}
            for k, v in vals.items():
                ab.setdefault(f"{k}_{arm}", []).append(v)
    return ab


def experiment(config: BayesianTPNNConfig | None = None, seed: int = 0, n_train: int = 2000,
               n_test: int = 1000, noise: float = 0.1, ablation_seeds: Sequence[int] = (0, 1, 2),
               hierarchical_seeds: Sequence[int] = tuple(range(8)), hierarchical_n: int = 1000,
               hierarchical_iter: int = 400, diabetes: bool = True,
               diabetes_test_size: float = 0.25) -> BayesianTPNNResult:
    """Reproduce the digest's validation.

    1. Synthetic data (``n_train`` + ``n_test`` points, :func:`synthetic_anova`): fit Bayesian-TPNN, rank
       components by posterior importance (selection AUROC over all subsets up to ``max_order``), compare the
       test RMSE with scikit-learn's ``HistGradientBoostingRegressor``.
    2. Stepwise-birth ablation on the same function, one data set per seed in ``ablation_seeds``, with the
       full ``config`` (the main run is reused for ``seed``).
    3. The same ablation on the hierarchical variant (x5:x6 carries signal), ``hierarchical_n`` points and
       ``hierarchical_iter`` iterations (half burn-in) per run, over ``hierarchical_seeds``.
    4. scikit-learn's diabetes data: test RMSE against the same baseline and the detected components
       (posterior inclusion >= 0.5 and at least 1% of the total importance).
    """
    cfg = config or BayesianTPNNConfig()
    X, y, f = synthetic_anova(n_train + n_test, seed, noise)
    Xtr, ytr, Xte, yte, fte = X[:n_train], y[:n_train], X[n_train:], y[n_train:], f[n_train:]
    model = BayesianTPNN(cfg).fit(Xtr, ytr, seed=seed)
    pred = model.predict(Xte)
    rmse = float(np.sqrt(np.mean((pred - yte) ** 2)))
    hgb, hgb_pred = _hgb_rmse(Xtr, ytr, Xte, yte, seed)
    p = X.shape[1]
    true = [tuple(t) for t in SYNTHETIC_TRUE_COMPONENTS]
    auroc = selection_auroc(model.importance_, true, p, model.max_order)
    by_order = {str(d): selection_auroc(model.importance_, true, p, model.max_order, order=d)
                for d in range(1, model.max_order + 1)}
    by_order = {k: v for k, v in by_order.items() if not math.isnan(v)}
    imp_true = [model.importance_.get(t, 0.0) for t in true]
    imp_false = [v for S, v in model.importance_.items() if S not in true]
    ranked_first = min(imp_true) > max(imp_false, default=0.0)

    # the ablation regenerates each seed's data with n_train + n_test points and fits on the first n_train,
    # exactly as the main run, so the main run can be reused for its own seed
    ab = stepwise_ablation(cfg, ablation_seeds, n_train, noise, reuse={(seed, cfg.stepwise): model},
                           n_generate=n_train + n_test)
    hier_cfg = dataclasses.replace(cfg, n_iter=hierarchical_iter, burn_in=hierarchical_iter // 2)
    ab_h = stepwise_ablation(hier_cfg, hierarchical_seeds, hierarchical_n, noise, hierarchical=True)

    dia: dict[str, Any] = {}
    if diabetes:
        from sklearn.datasets import load_diabetes
        from sklearn.model_selection import train_test_split

        data = load_diabetes()
        dXtr, dXte, dytr, dyte = train_test_split(data.data, data.target, test_size=diabetes_test_size,
                                                  random_state=seed)
        dm = BayesianTPNN(cfg).fit(dXtr, dytr, seed=seed)
        d_rmse = float(np.sqrt(np.mean((dm.predict(dXte) - dyte) ** 2)))
        d_hgb, _ = _hgb_rmse(dXtr, dytr, dXte, dyte, seed)
        names = list(data.feature_names)
        total = sum(dm.importance_.values()) or 1.0
        dia = {"rmse": d_rmse, "hgb_rmse": d_hgb, "n_train": len(dytr), "n_test": len(dyte),
               "importance": {component_name(S, names): v for S, v in dm.importance_.items()},
               "inclusion": {component_name(S, names): v for S, v in dm.inclusion_.items()},
               "components": [component_name(S, names) for S, v in dm.importance_.items()
                              if dm.inclusion_[S] >= 0.5 and v / total >= 0.01]}

    return BayesianTPNNResult(
        config=dataclasses.asdict(cfg), seed=seed, n_train=n_train, n_test=n_test,
        true_components=[component_name(t) for t in true],
        importance={component_name(S): v for S, v in model.importance_.items()},
        inclusion={component_name(S): v for S, v in model.inclusion_.items()},
        selection_auroc=auroc, auroc_by_order=by_order, true_ranked_first=bool(ranked_first),
        rmse=rmse, hgb_rmse=hgb,
        rmse_noiseless=float(np.sqrt(np.mean((pred - fte) ** 2))),
        hgb_rmse_noiseless=float(np.sqrt(np.mean((hgb_pred - fte) ** 2))),
        acceptance=model.acceptance_, trace_K=model.trace_["K"], trace_rmse=model.trace_["rmse"],
        ablation=ab, ablation_hierarchical=ab_h, diabetes=dia)


# ----------------------------------------------------------------------------------------------------------
# Classification (logistic likelihood)
# ----------------------------------------------------------------------------------------------------------
CLASSIFIERS: tuple[str, ...] = ("bayesian_tpnn", "logistic_regression", "gradient_boosting")
CLASSIFICATION_METRICS: tuple[str, ...] = ("auroc", "accuracy", "log_loss")


@dataclass
class BayesianTPNNClassificationResult(Result):
    """Bayesian-TPNN with the logistic likelihood against logistic regression and gradient boosting on a real
    binary task, one stratified held-out split per seed.

    ``metrics[model][metric]`` is the per-seed list (``model`` in :data:`CLASSIFIERS`, ``metric`` in
    :data:`CLASSIFICATION_METRICS`); ``importance`` / ``inclusion`` are the posterior component importances
    (variance of ``f_S`` on the logit scale) and inclusion frequencies of the first seed's fit, by feature name;
    ``acceptance`` its move acceptance rates.
    """

    config: dict
    dataset: str
    seeds: list
    test_size: float
    n_train: int
    n_test: int
    metrics: dict
    importance: dict
    inclusion: dict
    acceptance: dict

    kind = "bayesian_tpnn_classification"

    def to_frame(self):
        """One row per (model, seed) with AUROC, accuracy and log-loss on the held-out split."""
        import pandas as pd

        return pd.DataFrame([{"model": m, "seed": s, **{k: self.metrics[m][k][i] for k in CLASSIFICATION_METRICS}}
                             for m in self.metrics for i, s in enumerate(self.seeds)])

    def summary(self) -> dict:
        """``{model: {metric: (mean, sd)}}`` over seeds."""
        return {m: {k: (float(np.mean(v[k])), float(np.std(v[k]))) for k in CLASSIFICATION_METRICS}
                for m, v in self.metrics.items()}

    def figure(self):
        """Mean (± sd over seeds) AUROC, accuracy and log-loss per model, and the top posterior importances."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=1, cols=4, subplot_titles=("AUROC", "accuracy", "log-loss",
                                                            "Bayesian-TPNN importance (logit scale)"))
        summ = self.summary()
        for col, metric in enumerate(CLASSIFICATION_METRICS, start=1):
            fig.add_trace(go.Bar(x=list(summ), y=[summ[m][metric][0] for m in summ],
                                 error_y=dict(array=[summ[m][metric][1] for m in summ]), showlegend=False,
                                 marker_color=["crimson", "grey", "steelblue"][: len(summ)]), row=1, col=col)
        top = list(self.importance.items())[:10]
        fig.add_trace(go.Bar(x=[c for c, _ in top], y=[v for _, v in top], showlegend=False,
                             marker_color="crimson"), row=1, col=4)
        fig.update_layout(height=420, width=1300,
                          title=f"{self.dataset}: held-out metrics over {len(self.seeds)} splits")
        return fig


def classification_experiment(config: BayesianTPNNConfig | None = None, seeds: Sequence[int] = (0, 1, 2),
                              test_size: float = 0.3, dataset: str = "breast_cancer") -> BayesianTPNNClassificationResult:
    """Fit Bayesian-TPNN (logistic likelihood) on scikit-learn's bundled ``breast_cancer`` set (569 x 30) and
    compare it on a stratified held-out split per seed with ``LogisticRegression`` (standardised inputs,
    default ``C = 1``) and ``GradientBoostingClassifier`` (defaults). ``config`` must have
    ``likelihood="logistic"`` (the default config here: 1500 iterations, burn-in 500)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if dataset != "breast_cancer":
        raise ValueError(f"dataset must be 'breast_cancer' (the bundled binary set), got {dataset!r}")
    cfg = config or BayesianTPNNConfig(likelihood="logistic", n_iter=1500, burn_in=500)
    if cfg.likelihood != "logistic":
        raise ValueError("classification_experiment needs a config with likelihood='logistic'")
    if not seeds:
        raise ValueError("seeds must name at least one split")
    data = load_breast_cancer()
    names = list(data.feature_names)
    metrics = {m: {k: [] for k in CLASSIFICATION_METRICS} for m in CLASSIFIERS}
    first: BayesianTPNN | None = None
    for seed in seeds:
        Xtr, Xte, ytr, yte = train_test_split(data.data, data.target, test_size=test_size, random_state=int(seed),
                                              stratify=data.target)
        model = BayesianTPNN(cfg).fit(Xtr, ytr, seed=int(seed))
        first = first or model
        with threadpool_limits(limits=1):
            probs = {
                "bayesian_tpnn": model.predict_proba(Xte),
                "logistic_regression": make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
                .fit(Xtr, ytr).predict_proba(Xte)[:, 1],
                "gradient_boosting": GradientBoostingClassifier(random_state=int(seed)).fit(Xtr, ytr)
                .predict_proba(Xte)[:, 1],
            }
        for m, pr in probs.items():
            pr = np.clip(pr, 1e-12, 1 - 1e-12)
            metrics[m]["auroc"].append(float(roc_auc_score(yte, pr)))
            metrics[m]["accuracy"].append(float(accuracy_score(yte, pr >= 0.5)))
            metrics[m]["log_loss"].append(float(log_loss(yte, pr, labels=[0, 1])))
    assert first is not None
    return BayesianTPNNClassificationResult(
        config=dataclasses.asdict(cfg), dataset=dataset, seeds=[int(s) for s in seeds], test_size=test_size,
        n_train=len(ytr), n_test=len(yte), metrics=metrics,
        importance={component_name(S, names): v for S, v in first.importance_.items()},
        inclusion={component_name(S, names): v for S, v in first.inclusion_.items()},
        acceptance=first.acceptance_)
