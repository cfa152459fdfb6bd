"""``interp reproduce bayesian_tpnn``: Bayesian-TPNN on the digest's synthetic functional-ANOVA function (component
selection, RMSE against gradient boosting), the stepwise-birth ablations (the digest's function and a hierarchical
variant), diabetes, and breast cancer with the logistic likelihood (digest section 9)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from interp.models.bayesian_tpnn import BayesianTPNNConfig
from interp.apps.reproduce import Outcome, Recipe

from .experiments import ABLATION_METRICS, ablation_means, classification_experiment, experiment, stepwise_ablation


@dataclass
class BayesianTPNNRunConfig:
    """The validation run (defaults: the digest's, as documented). ``model``: the regression sampler (3000
    iterations, burn-in 1000); the main fit on ``synthetic_anova(n_train + n_test, seed)`` with the stepwise
    ablation of its own seed and diabetes; the ablation of the digest's function on each other ``ablation_seeds``
    (full config); the hierarchical variant's ablation over ``hierarchical_seeds`` (``hierarchical_n`` points,
    ``hierarchical_iter`` iterations, half burn-in); breast cancer over ``classification_seeds`` with
    ``classification`` (logistic likelihood, 1500 iterations, burn-in 500)."""

    model: BayesianTPNNConfig = field(default_factory=BayesianTPNNConfig)
    seed: int = 0
    n_train: int = 2000
    n_test: int = 1000
    noise: float = 0.1
    ablation_seeds: tuple[int, ...] = (0, 1, 2)
    hierarchical_seeds: tuple[int, ...] = tuple(range(8))
    hierarchical_n: int = 1000
    hierarchical_iter: int = 400
    diabetes: bool = True
    classification: BayesianTPNNConfig = field(
        default_factory=lambda: BayesianTPNNConfig(likelihood="logistic", n_iter=1500, burn_in=500))
    classification_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)

    def __post_init__(self) -> None:
        if self.classification.likelihood != "logistic":
            raise ValueError("classification needs a config with likelihood='logistic'")
        if self.model.likelihood != "gaussian":
            raise ValueError("model is the regression sampler: likelihood='gaussian'")


def merge_ablations(parts: list[dict], n_iter: int, hierarchical: bool) -> dict:
    """One ablation dict (the :func:`stepwise_ablation` layout) from per-seed parts, in order."""
    out: dict = {"seeds": [], "n_iter": n_iter, "hierarchical": hierarchical}
    for ab in parts:
        out["seeds"] += list(ab["seeds"])
        for m in ABLATION_METRICS:
            for arm in ("on", "off"):
                out.setdefault(f"{m}_{arm}", []).extend(ab.get(f"{m}_{arm}", []))
    return out


def _worse_without_stepwise(means: dict) -> float:
    """The digest's "detection of x5:x6:x7 is worse with stepwise birth disabled", made quantitative (the criterion
    of the earlier slow test): mean posterior inclusion lower by at least 0.05, or mean importance below 90 %."""
    return float(means["inclusion_567_off"] < means["inclusion_567_on"] - 0.05
                 or means["importance_567_off"] < 0.9 * means["importance_567_on"])


class BayesianTPNNRecipe(Recipe):
    name = "bayesian_tpnn"
    title = "Bayesian Neural Networks for Functional ANOVA Model"
    method = "models/bayesian_tpnn/"
    doc = "docs/models/bayesian_tpnn.md"
    notebook = "notebooks/bayesian_tpnn.ipynb"
    Config = BayesianTPNNRunConfig
    presets = {
        # every unit kind once, tiny chains (40 iterations): the pipeline and the verdicts, not the paper's test
        "quick": BayesianTPNNRunConfig(model=BayesianTPNNConfig(n_iter=40, burn_in=20), n_train=300, n_test=100,
                                       ablation_seeds=(0, 1), hierarchical_seeds=(0,), hierarchical_n=300,
                                       hierarchical_iter=20,
                                       classification=BayesianTPNNConfig(likelihood="logistic", n_iter=30, burn_in=15),
                                       classification_seeds=(0,)),
        # the documented runs: n = 2000, 3000 iterations; ablations on seeds 0-2 and 8 hierarchical seeds; diabetes;
        # breast cancer on 5 splits
        "full": BayesianTPNNRunConfig(),
    }
    cost = {"quick": "about 20 s",
            "full": "about 10 minutes on the loaded 2-core machine (3 CPU-minutes; every unit single-threaded)"}
    code = ("interp.benchmarks.bayesian_tpnn", "interp.models.bayesian_tpnn")

    def units(self, config: BayesianTPNNRunConfig) -> list:
        return ([["main", config.seed]] + [["ablation", int(s)] for s in config.ablation_seeds if s != config.seed]
                + [["hierarchical", int(s)] for s in config.hierarchical_seeds]
                + [["classification", int(s)] for s in config.classification_seeds])

    def run_unit(self, config: BayesianTPNNRunConfig, unit, stages):
        kind, seed = unit

        def compute():
            if kind == "main":   # the main fit, its own seed's ablation (reusing the fit) and diabetes
                own = (seed,) if seed in config.ablation_seeds else ()
                return experiment(config.model, seed=seed, n_train=config.n_train, n_test=config.n_test,
                                  noise=config.noise, ablation_seeds=own, hierarchical_seeds=(),
                                  diabetes=config.diabetes)
            if kind == "ablation":
                return stepwise_ablation(config.model, [seed], config.n_train, config.noise,
                                         n_generate=config.n_train + config.n_test)
            if kind == "hierarchical":
                hier = dataclasses.replace(config.model, n_iter=config.hierarchical_iter,
                                           burn_in=config.hierarchical_iter // 2)
                return stepwise_ablation(hier, [seed], config.hierarchical_n, config.noise, hierarchical=True)
            return classification_experiment(config.classification, seeds=(seed,))

        return {"kind": kind, "seed": seed, "value": stages(f"{kind}-{seed}", compute)}

    def combine(self, config: BayesianTPNNRunConfig, outputs: list) -> Outcome:
        by = {k: [o["value"] for o in outputs if o["kind"] == k]
              for k in ("main", "ablation", "hierarchical", "classification")}
        (main,) = by["main"]
        order = {s: i for i, s in enumerate(config.ablation_seeds)}
        parts = ([main.ablation] if main.ablation and main.ablation.get("seeds") else []) + by["ablation"]
        parts = sorted(parts, key=lambda ab: order.get(ab["seeds"][0], 0))
        ab = merge_ablations(parts, config.model.n_iter, False)
        ab_h = merge_ablations(by["hierarchical"], config.hierarchical_iter, True)
        m, m_h = ablation_means(ab), ablation_means(ab_h)
        measured = {
            "selection_auroc": float(main.selection_auroc), "true_ranked_first": float(main.true_ranked_first),
            "rmse_ratio_to_hgb": float(main.rmse_ratio),
            "digest_inclusion_567_on": ab["inclusion_567_on"], "digest_inclusion_567_off": ab["inclusion_567_off"],
            "digest_worse_without_stepwise": _worse_without_stepwise(m),
            "hier_inclusion_567_on": ab_h["inclusion_567_on"], "hier_inclusion_567_off": ab_h["inclusion_567_off"],
            "hier_worse_without_stepwise": _worse_without_stepwise(m_h),
            "hier_min_stepwise_accept": float(min((v or 0.0) for v in ab_h["stepwise_accept_on"])),
        }
        if main.diabetes:
            measured["diabetes_rmse"] = float(main.diabetes["rmse"])
            measured["diabetes_hgb_rmse"] = float(main.diabetes["hgb_rmse"])
            measured["diabetes_components"] = float(len(main.diabetes["components"]))
        cls = by["classification"]
        if cls:
            get = lambda model, metric: np.array([c.metrics[model][metric][0] for c in cls])
            tp_auc, lr_auc, gb_auc = (get(x, "auroc").mean() for x in
                                      ("bayesian_tpnn", "logistic_regression", "gradient_boosting"))
            measured.update({
                "cls_auroc_minus_best_baseline": float(tp_auc - max(lr_auc, gb_auc)),
                "cls_accuracy": float(get("bayesian_tpnn", "accuracy").mean()),
                "cls_log_loss_minus_boosting": float(get("bayesian_tpnn", "log_loss").mean()
                                                     - get("gradient_boosting", "log_loss").mean()),
            })
        summary = [{"quantity": k, "value": v} for k, v in main.summary().items() if isinstance(v, (int, float))]
        ablation_rows = [{"function": fn, **{k: v for k, v in mm.items()}} for fn, mm in
                         (("digest", m), ("hierarchical", m_h))]
        cls_rows = [{"seed": o["seed"], "model": mdl, **{k: v[0] for k, v in o["value"].metrics[mdl].items()}}
                    for o in outputs if o["kind"] == "classification" for mdl in o["value"].metrics]
        return Outcome(
            measured=measured,
            tables={"synthetic function (main run)": summary, "stepwise-birth ablations (means over seeds)":
                    ablation_rows, "breast cancer per split": cls_rows},
            figures=[("Bayesian-TPNN: importances, K trace, ablations, diabetes", main.figure())],
            notes=(f"Main run seed {config.seed}: n = {config.n_train}, {config.model.n_iter} iterations. The "
                   "digest's function has a pure three-way interaction (no lower-order parent), so stepwise birth "
                   "has nothing to extend there; the hierarchical variant gives x5:x6 signal."))


RECIPE = BayesianTPNNRecipe
