"""``interp reproduce dequantization``: the A1W1 digits validation of denoising dequantization (models digest,
section 6): STE vs ridge dequantization vs ridge + 2:4 weight sparsity, 5 seeds, plus a stability probe."""
from __future__ import annotations

import numpy as np

from interp.apps.reproduce import Outcome, Recipe

from .experiment import DequantConfig, assemble, run_seed


def _frac(flags: list) -> float:
    return float(np.mean([bool(f) for f in flags])) if flags else float("nan")


class DequantizationRecipe(Recipe):
    name = "dequantization"
    title = "Robust Training of Neural Networks at Arbitrary Precision and Sparsity"
    method = "models/dequantization.py"
    doc = "docs/models/dequantization.md"
    notebook = "notebooks/dequantization.ipynb"
    Config = DequantConfig
    presets = {
        # every variant, the stability probe and every verdict on two seeds and a few epochs: seconds
        "quick": DequantConfig(epochs=10, seeds=(0, 1), stability_epochs=5),
        # the digest's recipe: 64-256-256-10 A1W1, Adam 1e-3, 200 epochs, 5 seeds, + STE/ridge at lr 0.05
        "full": DequantConfig(),
    }
    cost = {"quick": "about 10 s", "full": "about 27 CPU-minutes (the committed record: 1,613 s on one thread)"}
    code = ("interp.benchmarks.dequantization", "interp.models.dequantization", "interp.models.common")

    def units(self, config: DequantConfig) -> list:
        return list(config.seeds)

    def run_unit(self, config: DequantConfig, seed: int, stages) -> dict:
        def compute() -> dict:
            return run_seed(config, seed)

        return stages(f"seed-{seed}", compute)

    def combine(self, config: DequantConfig, outputs: list) -> Outcome:
        res = assemble(config, outputs)
        acc = {v: res.mean_accuracy(v) for v in res.variants}
        key = {v: v.replace(":", "_") for v in res.variants}  # metric names: ridge_2:4 -> ridge_2_4
        measured: dict = {f"{key[v]}_mean_accuracy": a for v, a in acc.items()}
        measured.update({f"{key[v]}_accuracy": [float(x) for x in res.accuracy[v]] for v in res.variants})
        gap = 100 * (acc["ridge"] - acc["ste"])
        ste_div, ridge_div = _frac(res.diverged["ste"]), _frac(res.diverged["ridge"])
        measured.update(
            ridge_minus_ste_points=gap, ste_diverged_fraction=ste_div, ridge_diverged_fraction=ridge_div,
            ridge_2_4_diverged_fraction=_frac(res.diverged["ridge_2:4"]),
            # the digest's accuracy criterion: (b) >= (a) + 2 points, or (a) diverges while (b) never does
            ridge_beats_ste_or_ste_diverges=float(gap >= 2.0 or (ste_div > 0 and ridge_div == 0)),
            roughness_ratio_ridge_over_ste=res.mean_roughness("ridge") / res.mean_roughness("ste"),
            log_roughness_ratio_ridge_over_ste=(res.mean_roughness("ridge", log=True)
                                                / res.mean_roughness("ste", log=True)),
            sparsity_cost_points=100 * (acc["ridge"] - acc["ridge_2:4"]))
        if res.stability_lr is not None:
            measured.update(ste_high_lr_diverged_fraction=_frac(res.stability_diverged["ste"]),
                            ridge_high_lr_diverged_fraction=_frac(res.stability_diverged["ridge"]))
        frame = res.to_frame()
        summary = [{"variant": v, "mean_test_accuracy": acc[v], "diverged_seeds": int(sum(res.diverged[v])),
                    "var_dloss": res.mean_roughness(v), "var_dlogloss": res.mean_roughness(v, log=True)}
                   for v in res.variants]
        return Outcome(
            measured=measured,
            tables={"per variant (mean over seeds)": summary,
                    "per run (main runs and the stability probe)": frame.to_dict("records")},
            figures=[("training loss, test accuracy and the large-learning-rate probe", res.figure())],
            notes=f"{len(config.seeds)} seeds x {config.epochs} epochs (Adam, lr {config.lr}); stability probe: "
                  f"{', '.join(config.stability_methods)} at lr {config.stability_lr} for {config.stability_epochs} "
                  "epochs. At the digest's lr 1e-3 neither method diverges on this small MLP, so the accuracy "
                  "criterion reduces to ridge >= STE + 2 points.")


RECIPE = DequantizationRecipe
