"""``interp reproduce sdm``: submodular distribution matching on the digest's imbalanced, noisy digits pool
(section 11's CPU-scale validation), with the objective's brute-force and apricot sanity checks."""
from __future__ import annotations

import math

import numpy as np

from interp.models.sdm import SAEConfig
from interp.apps.reproduce import Outcome, Recipe

from .experiment import SDMConfig, assemble, objective_checks, run_seed

METHODS = ("sdm", "random", "top_quality", "apricot")


class SDMRecipe(Recipe):
    name = "sdm"
    title = "Matched Data, Better Models: Target Aligned Data Filtering with Sparse Features"
    method = "models/sdm.py"
    doc = "docs/models/sdm.md"
    notebook = "notebooks/sdm.ipynb"
    Config = SDMConfig
    presets = {
        # one seed, a small SAE and budget, no apricot baseline (the apricot agreement check still runs)
        "quick": SDMConfig(seeds=(0,), sae=SAEConfig(d_sae=64, k=4, epochs=3), budget=50, apricot=False,
                           check_seeds=(0,), check_lams=(0.8,), check_budgets=(4,)),
        # the digest's recipe: b = 200, lambda = 0.8, SAE d = 256, k = 8, 50 epochs, 5 seeds, apricot baseline
        "full": SDMConfig(),
    }
    cost = {"quick": "about 15 s", "full": "about 2 minutes (30 CPU-seconds; one thread)"}
    code = ("interp.benchmarks.sdm.experiment", "interp.benchmarks.sdm.recipe", "interp.models.sdm",
            "interp.models.common")

    def units(self, config: SDMConfig) -> list:
        return [["seed", int(s)] for s in config.seeds] + [["checks", 0]]

    def run_unit(self, config: SDMConfig, unit, stages) -> dict:
        kind, value = unit

        def compute() -> dict:
            return run_seed(config, value) if kind == "seed" else objective_checks(config)

        return {"kind": kind, **stages(f"{kind}-{value}", compute)}

    def combine(self, config: SDMConfig, outputs: list) -> Outcome:
        seeds = [o for o in outputs if o["kind"] == "seed"]
        (checks,) = [o for o in outputs if o["kind"] == "checks"]
        res = assemble(config, seeds)
        kl = {m: np.array(v) for m, v in res.kl.items()}
        bacc = {m: np.array(v) for m, v in res.balanced_accuracy.items()}
        measured = {f"kl_{m}": [float(x) for x in kl[m]] for m in METHODS if m in kl}
        measured.update({f"balanced_accuracy_{m}": [float(x) for x in bacc[m]] for m in METHODS if m in bacc})
        measured.update({
            "mean_kl_sdm_minus_random": float(kl["sdm"].mean() - kl["random"].mean()),
            "mean_kl_sdm_minus_top_quality": float(kl["sdm"].mean() - kl["top_quality"].mean()),
            "mean_accuracy_gain_over_random": float(bacc["sdm"].mean() - bacc["random"].mean()),
            "mean_accuracy_gain_over_top_quality": float(bacc["sdm"].mean() - bacc["top_quality"].mean()),
            "seeds_sdm_above_random": float((bacc["sdm"] > bacc["random"]).sum()),
            "noisy_share_sdm": float(np.mean(res.noisy_share["sdm"])),
            "noisy_share_random": float(np.mean(res.noisy_share["random"])),
            "min_dr_slack": float(checks["min_dr_slack"]), "monotone": float(checks["monotone"]),
            "min_greedy_over_opt": float(checks["min_greedy_ratio"]),
            "apricot_agreement": float(checks["apricot_agreement"]),
        })
        df = res.to_frame()
        means = (df.groupby("method", sort=False)[["kl", "balanced_accuracy", "noisy_share", "duplicate_share"]]
                 .mean().reset_index().to_dict("records"))
        per_seed = [{"seed": int(sd), **{m: float(bacc[m][i]) for m in METHODS if m in bacc},
                     "SDM above random": bool(bacc["sdm"][i] > bacc["random"][i])}
                    for i, sd in enumerate(res.seeds)]
        return Outcome(
            measured=measured,
            tables={"mean over seeds per method": means, "balanced accuracy per seed": per_seed,
                    "brute-force checks of the objective": checks["rows"]},
            figures=[("SDM on the imbalanced noisy digits pool", res.figure())],
            notes=f"{len(config.seeds)} seed(s), budget {config.budget}, lambda {config.lam}, SAE d = {config.sae.d_sae}, "
                  f"k = {config.sae.k}, {config.sae.epochs} epochs; SDM above random in "
                  f"{int((bacc['sdm'] > bacc['random']).sum())} of {len(config.seeds)} seeds. The (1 - 1/e) bound is "
                  f"{1 - 1 / math.e:.4f}.")


RECIPE = SDMRecipe
