"""``interp reproduce raptor``: "Block-Recurrent Dynamics in Vision Transformers" (Jacobs, Fel, Hakim et al.,
ICLR 2026) at CPU scale: the digest's digits recipe (section 7), one unit per stochastic-depth teacher; optionally
(``RaptorRecipeConfig(dinov2=DinoV2Config())``) the real DINOv2 ViT-S/14 on Fashion-MNIST as one more unit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from interp.apps.reproduce import Outcome, Recipe

from .experiments import DigitsConfig, DinoV2Config, digits_unit, dinov2_unit


@dataclass
class RaptorRecipeConfig:
    """``p_drops``: the teachers' stochastic depths (one unit each); ``digits``: the digits recipe;
    ``dinov2``: the real-ViT run (not part of the presets: about an hour of CPU; docs/raptor.md)."""

    p_drops: tuple[float, ...] = (0.0, 0.2, 0.4)
    digits: DigitsConfig = field(default_factory=DigitsConfig)
    dinov2: DinoV2Config | None = None

    def __post_init__(self) -> None:
        if len(self.p_drops) < 2 or len(set(self.p_drops)) != len(self.p_drops):
            raise ValueError(f"RaptorRecipeConfig.p_drops needs >= 2 distinct values (Spearman), got {self.p_drops}")
        if any(not 0 <= p < 1 for p in self.p_drops):
            raise ValueError(f"RaptorRecipeConfig.p_drops must lie in [0, 1), got {self.p_drops}")


QUICK = RaptorRecipeConfig(p_drops=(0.0, 0.4), digits=DigitsConfig(n_layers=6, d_model=16, n_heads=2, epochs=1,
                                                                   steps=4, batch_size=32, n_random=2, extra_k=(3,)))


def _spearman(x, y) -> float:
    from scipy.stats import spearmanr
    return float(spearmanr(x, y)[0])


class RaptorRecipe(Recipe):
    name = "raptor"
    title = "Block-Recurrent Dynamics in Vision Transformers"
    method = "dynamics/raptor/"
    doc = "docs/raptor.md"
    notebook = "notebooks/raptor.ipynb"
    Config = RaptorRecipeConfig
    presets = {"quick": QUICK, "full": RaptorRecipeConfig()}
    cost = {"quick": "about 12 CPU-s (one thread)",
            "full": "about 23 wall-minutes on 2 free cores (3 teachers of 60 epochs, 3 x 10 Raptor fits of 300 steps "
                    "per unit; about 75 CPU-minutes on one idle thread)"}
    code = ("interp.benchmarks.raptor", "interp.dynamics.raptor", "interp.data.digits")

    def units(self, config: RaptorRecipeConfig) -> list:
        return [float(p) for p in config.p_drops] + (["dinov2"] if config.dinov2 is not None else [])

    def run_unit(self, config: RaptorRecipeConfig, unit, stages) -> dict:
        if unit == "dinov2":
            return dinov2_unit(config.dinov2, stages)
        return digits_unit(config.digits, float(unit), stages)

    def combine(self, config: RaptorRecipeConfig, outputs: list) -> Outcome:
        digits = [o for u, o in zip(self.units(config), outputs) if u != "dinov2"]
        runs = [d["runs"] for d in digits]
        ps = [d["p_drop"] for d in digits]
        k2 = [r["k2"] for r in runs]
        measured = {
            "teacher_test_acc": [d["test_acc"] for d in digits],
            # R²: the official one (overcomplete's r2_score at each layer of the rollout from a_0: its mean over
            # layers, and its value at the last layer, what the official trainer logs) and ours (per feature)
            "kL_mean_r2_official": [r["kL"]["mean_r2_official"] for r in runs],
            "kL_end_r2_official": [r["kL"]["end_r2_official"] for r in runs],
            "kL_mean_r2": [r["kL"]["mean_r2"] for r in runs],
            "k2_mean_r2_official": [r["mean_r2_official"] for r in k2],
            "k2_end_r2_official": [r["end_r2_official"] for r in k2],
            "k2_mean_r2": [r["mean_r2"] for r in k2],
            "k2_probe_relative": [r["probe_acc_raptor"] / r["probe_acc_teacher"] for r in k2],
            "block0_probe_relative": [d["probe_acc_block0"] / d["probe_acc_last"] for d in digits],
            "input_probe_relative": [d["probe_acc_input"] / d["probe_acc_last"] for d in digits],
            "tf_only_minus_tf_ar_probe": [r["k2 TF only"]["probe_acc_raptor"]
                                          - r["k2 TF->AR stage 1 only"]["probe_acc_raptor"] for r in runs],
            "tf_only_minus_tf_ar_r2_official": [r["k2 TF only"]["mean_r2_official"]
                                                - r["k2 TF->AR stage 1 only"]["mean_r2_official"] for r in runs],
            "tf_only_minus_tf_ar_r2": [r["k2 TF only"]["mean_r2"] - r["k2 TF->AR stage 1 only"]["mean_r2"]
                                       for r in runs],
            "maxcut_minus_random_r2_official": [r["mean_r2_official"] - d["random_mean_r2_official"]
                                                for r, d in zip(k2, digits)],
            "maxcut_minus_random_r2": [r["mean_r2"] - d["random_mean_r2"] for r, d in zip(k2, digits)],
            "offdiag_similarity": [d["mean_offdiag_similarity"] for d in digits],
            "spearman_p_similarity": _spearman(ps, [d["mean_offdiag_similarity"] for d in digits]),
            "spearman_p_k2_r2_official": _spearman(ps, [r["mean_r2_official"] for r in k2]),
            "spearman_p_k2_r2": _spearman(ps, [r["mean_r2"] for r in k2]),
        }
        table = []
        for d in digits:
            for name, r in d["runs"].items():
                table.append({"p": d["p_drop"], "run": name, "thresholds": str(r["thresholds"]),
                              "mean R² official": r["mean_r2_official"], "end R² official": r["end_r2_official"],
                              "mean R² ours": r["mean_r2"],
                              "official R² per layer": " ".join(f"{v:.2f}" for v in r["r2_official"]),
                              "our R² per layer": " ".join(f"{v:.2f}" for v in r["r2"]),
                              "probe_teacher": r["probe_acc_teacher"], "probe_raptor": r["probe_acc_raptor"]})
            for th, r2o, r2 in zip(d["random_thresholds"], d["random_r2_official"], d["random_r2"]):
                table.append({"p": d["p_drop"], "run": f"k2 random threshold {th[0]}", "thresholds": str(th),
                              "mean R² official": r2o, "mean R² ours": r2})
        baselines = [{"p": d["p_drop"], "teacher test acc": d["test_acc"], "probe block input": d["probe_acc_input"],
                      "probe block-0 output": d["probe_acc_block0"], "probe last layer": d["probe_acc_last"],
                      "probe k2 rollout": d["runs"]["k2"]["probe_acc_raptor"], "max-cut k2": str(d["maxcut_k2"]),
                      "max-cut k2, the other split rule": str(d["maxcut_k2_other_rule"]),
                      "off-diag. similarity": d["mean_offdiag_similarity"]} for d in digits]
        tables = {"Raptor fits per teacher (held-out digits)": table,
                  "teachers and linear-probe baselines": baselines}
        notes = (f"Digits teachers p = {ps}: L = {config.digits.n_layers}, d = {config.digits.d_model}, "
                 f"{config.digits.epochs} epochs; Raptor {config.digits.steps} steps per unit (the paper: 312,500). "
                 "R² official: the official code's r2_score (1 - MSE / variance of the rollout around one scalar "
                 "mean) at every layer of the rollout from a_0 (mean over layers; 'end' = last layer, what the "
                 "official trainer logs); R² ours: per feature, the teacher's variance, averaged over features. "
                 f"Max-cut split rule: {config.digits.maxcut_rule}. "
                 "Linear-probe accuracy is compared with a probe on the teacher's block-0 output (block0_probe_relative): "
                 "where that baseline already keeps >= 90% of the teacher's accuracy, a rollout's probe accuracy says "
                 "nothing about its fidelity.")
        dino = [o for u, o in zip(self.units(config), outputs) if u == "dinov2"]
        if dino:
            dn = dino[0]
            by = {r["name"]: r for r in dn["runs"]}
            for name, r in by.items():
                if name.startswith("k") and " " not in name:
                    measured[f"dinov2_{name}_mean_r2_official"] = r["mean_r2_official"]
                    measured[f"dinov2_{name}_end_r2_official"] = r["end_r2_official"]
                    measured[f"dinov2_{name}_mean_r2"] = r["mean_r2"]
                    measured[f"dinov2_{name}_probe_relative"] = r["relative_acc"]
            measured["dinov2_block0_probe_relative"] = dn["probe_acc_block0"] / dn["probe_acc_last"]
            tables[f"DINOv2 ({config.dinov2.spec}) on {dn['dataset']}: Raptor fits"] = [
                {k: r[k] for k in ("name", "thresholds", "mean_r2_official", "end_r2_official", "mean_r2",
                                   "mean_r2_pooled", "probe_acc_teacher", "probe_acc_raptor")} for r in dn["runs"]]
            tables[f"DINOv2 ({config.dinov2.spec}): linear-probe baselines"] = [
                {k: dn[k] for k in ("probe_acc_input", "probe_acc_block0", "probe_acc_last")}]
        import plotly.graph_objects as go
        fig = go.Figure()
        for d in digits:
            for name in ("kL", "k2"):
                r = d["runs"][name]
                fig.add_trace(go.Scatter(x=list(range(1, len(r["r2_official"]) + 1)), y=r["r2_official"],
                                         mode="lines+markers", name=f"p={d['p_drop']:g} {name}"))
        fig.update_layout(xaxis_title="teacher layer", yaxis_title="R² (held-out, official definition)")
        figures = [("per-layer R² of the Raptor rollouts", fig)]
        return Outcome(measured=measured, tables=tables, figures=figures, notes=notes)


RECIPE = RaptorRecipe
