"""``interp reproduce reverse_distillation``: the digest's synthetic latent-factor family (exactness and scaling
criteria) and a locally trained protein MLM family probed beside the paper's ProteinGym percentages (models digest,
section 4)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from interp.models.reverse_distillation.plm import PLMConfig, build_plm
from interp.apps.reproduce import Outcome, Recipe

from .experiment import PAPER_PROTEINGYM, ProteinRDConfig, ProteinRDResult, protein_experiment
from .synthetic import SyntheticConfig, SyntheticResult, synthetic_experiment


@dataclass
class ReverseDistillationRun:
    """One run of the recipe: the synthetic validation and the protein validation.

    ``train_family``: protein MLMs trained inside the run's stages, ascending width (the quick preset's tiny family);
    empty: the zoo family of ``protein.toy`` (``protein-mlm-{32,64,128}``, or the toy ``protein-mlm-toy-{8,16,24}``),
    built and cached by the zoo.
    """

    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    protein: ProteinRDConfig = field(default_factory=ProteinRDConfig)
    train_family: tuple[PLMConfig, ...] = ()

    def __post_init__(self) -> None:
        if self.train_family and len(self.train_family) < 2:
            raise ValueError(f"train_family needs at least two models (a chain), got {len(self.train_family)}")
        widths = [c.width for c in self.train_family]
        if widths != sorted(set(widths)):
            raise ValueError(f"train_family must be in strictly ascending width, got widths {widths}")


def _tiny(width: int) -> PLMConfig:
    # one layer, 30 steps on 200 proteins: beats the uniform 20-letter baseline (ln 20) in seconds
    return PLMConfig(width=width, n_layers=1, n_heads=2, steps=30, batch_size=8, crop=64, lr=1e-2, max_proteins=200,
                     n_eval_proteins=20, max_heldout_loss=2.996)


class ReverseDistillationRecipe(Recipe):
    name = "reverse_distillation"
    title = "Reverse Distillation: Consistently Scaling Protein Language Model Representations"
    method = "models/reverse_distillation/"
    doc = "docs/models/reverse_distillation.md"
    notebook = "notebooks/reverse_distillation.ipynb"
    Config = ReverseDistillationRun
    presets = {
        # every stage and verdict: a small synthetic family, a tiny protein family trained in stages, few probes
        "quick": ReverseDistillationRun(
            synthetic=SyntheticConfig(n_fit=1500, n_pool=300, n_test=500, n_tasks=6, n_repeats=1),
            protein=ProteinRDConfig(n_fit_proteins=30, max_heldout_proteins=50, n_repeats=1, n_label_proteins=8,
                                    n_label_sequences=20, max_test_residues=2000),
            train_family=(_tiny(8), _tiny(16), _tiny(24))),
        # the digest's synthetic recipe (50 tasks, 5,000 fit samples) and the zoo family protein-mlm-{32,64,128}
        "full": ReverseDistillationRun(),
    }
    cost = {"quick": "about 25 s",
            "full": "about 30 CPU-minutes from an empty cache (building protein-mlm-32/64/128: 105 + 281 + 983 s on "
                    "2 loaded cores; the experiment: about 3 CPU-minutes)"}
    code = ("interp.benchmarks.reverse_distillation", "interp.models.reverse_distillation", "interp.models.common")

    def units(self, config: ReverseDistillationRun) -> list:
        return ["synthetic", "protein"]

    def run_unit(self, config: ReverseDistillationRun, unit: str, stages):
        if unit == "synthetic":
            def synthetic():
                return synthetic_experiment(config.synthetic)

            return stages("synthetic", synthetic)
        models, metrics = None, None
        if config.train_family:
            models, metrics = [], {}
            for cfg in config.train_family:
                folder = stages.path(f"plm-{cfg.width}", lambda tmp, cfg=cfg: _build(tmp, cfg))
                models.append(str(folder))
                metrics[f"plm-{cfg.width}"] = json.loads((folder / "metrics.json").read_text())

        def protein():
            return protein_experiment(config.protein, models=models, model_metrics=metrics)

        return stages("protein", protein)

    def combine(self, config: ReverseDistillationRun, outputs: list) -> Outcome:
        syn, prot = outputs
        syn = syn if isinstance(syn, SyntheticResult) else SyntheticResult(**syn)
        prot = prot if isinstance(prot, ProteinRDResult) else ProteinRDResult(**prot)
        w = prot.widths
        ex = list(prot.exactness.values())
        measured = {
            "synthetic_prefix_exact": float(syn.checks["prefix_exact"]),
            "synthetic_pcr_residual_uncorrelated": float(syn.checks["pcr_residual_uncorrelated_with_retained_pcs"]),
            "synthetic_ols_residual_uncorrelated": float(syn.checks["ols_residual_uncorrelated"]),
            "synthetic_reconstruction_beats_random": float(syn.checks["reconstruction_beats_random"]),
            "protein_prefix_exact": float(all(e["prefix_exact"] for e in ex)),
            "protein_max_abs_corr_retained": float(max(e["max_abs_corr_retained"] for e in ex)),
            "protein_reconstruction_beats_random": float(all(e["beats_random"] for e in ex)),
            "synthetic_monotone_fraction": syn.summary["monotone_fraction"],
            "synthetic_raw_large_loses_fraction": syn.summary["raw_large_loses_fraction"],
            "synthetic_rd_beats_raw": [syn.summary["rd_beats_raw"][str(x)] for x in config.synthetic.widths[1:]],
            "protein_rd_beats_raw_larger": [prot.comparisons[f"rd.{x} > raw.{x}"] for x in w[1:]],
            "protein_rd_chain_monotone": [prot.comparisons[f"rd.{x} > {'rd' if i > 1 else 'raw'}.{w[i - 1]}"]
                                          for i, x in enumerate(w[1:], start=1)],
            "protein_raw_larger_beats_smaller": [prot.comparisons[f"raw.{x} > raw.{w[i - 1]}"]
                                                 for i, x in enumerate(w[1:], start=1)],
            "protein_chain_beats_direct": prot.comparisons[f"rd.{w[-1]} > direct.{w[-1]}"],
        }
        mean = prot.to_frame().groupby("representation").score.mean()
        return Outcome(
            measured=measured,
            tables={"protein: mean probe score per task and representation": _score_rows(prot),
                    "protein: fraction of tasks where one representation beats another":
                        [{"comparison": k, "ours": v} for k, v in prot.comparisons.items()],
                    "paper: ProteinGym DMS, fraction of 28 sets": [{"comparison": k, "paper_percent": v}
                                                                   for k, v in PAPER_PROTEINGYM.items()],
                    "protein: exactness per chain step": [
                        {"step": k, **{a: (float(b) if isinstance(b, (bool, int, float)) else str(b))
                                       for a, b in e.items()}} for k, e in prot.exactness.items()],
                    "synthetic: mean probe Spearman per representation":
                        [{"representation": k, "mean_spearman": v} for k, v in syn.summary["mean_scores"].items()],
                    "protein models": [{"model": k, **{a: b for a, b in m.items() if isinstance(b, (int, float))}}
                                       for k, m in prot.model_metrics.items()]},
            figures=[("protein family: mean probe score vs width", prot.figure()),
                     ("synthetic family: probe Spearman per representation", syn.figure())],
            notes=f"Protein family widths {w}; mean score over tasks: "
                  + ", ".join(f"{k} {mean[k]:.3f}" for k in mean.index) + ". Probes: few-shot ridge on held-out "
                  "proteins (our protocol; the paper's ProteinGym protocol is not in the sources).")


def _build(tmp: Path, cfg: PLMConfig) -> None:
    metrics = build_plm(tmp, cfg.to_params())
    (tmp / "metrics.json").write_text(json.dumps({k: (float(v) if isinstance(v, (int, float, np.floating)) else v)
                                                  for k, v in metrics.items()}))


def _score_rows(prot: ProteinRDResult) -> list[dict]:
    return [{"task": t, **{r: float(s) for r, s in reps.items()}} for t, reps in prot.scores.items()]


RECIPE = ReverseDistillationRecipe
