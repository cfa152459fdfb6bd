"""``interp reproduce influence``: "Understanding the Emergence of Seemingly Useless Features in Next-Token
Predictors" (Rofin, Naghiyev & Hahn, ICLR 2026) at CPU scale (digest section 6).

Units: one per Majority seed (the four variants, the influence re-run on the standard model), one per
conditioned-Majority (variant, seed) at the paper's width, batch and length, and one Q(w)-by-domain run on a real
LM. Every training run is a stage.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from interp.dynamics.influence import bootstrap_ci
from interp.dynamics.tasks import majority
from interp.reproduce import Outcome, Recipe

from .majority import VARIANTS, MajorityConfig, influence_summary, majority_record, mean_probe_accuracy
from .q_domains import QDomainsConfig, analyse_q_domains, harvest_domains, load_lm


@dataclass
class InfluenceConfig:
    """The run. ``majority``: the settings of every Majority run (its ``variant`` and ``seed`` are set per run);
    ``variants`` trained per seed of ``seeds`` (the influence re-run is on ``standard``); ``conditioned``: the
    conditioned-Majority setting, standard and myopic per seed of ``conditioned_seeds``; ``q_domains``: the Q(w)
    run; ``n_boot``: bootstrap resamples of the CIs over seeds."""

    majority: MajorityConfig = field(default_factory=lambda: MajorityConfig(steps=200, influence_steps=200))
    seeds: tuple[int, ...] = tuple(range(10))
    variants: tuple[str, ...] = VARIANTS
    conditioned: MajorityConfig = field(default_factory=lambda: MajorityConfig(
        task="conditioned_majority", d_model=128, batch=256, steps=3000))
    conditioned_seeds: tuple[int, ...] = (0,)
    q_domains: QDomainsConfig = field(default_factory=QDomainsConfig)
    n_boot: int = 10_000

    def __post_init__(self) -> None:
        if len(self.seeds) < 2:
            raise ValueError(f"InfluenceConfig.seeds needs at least two seeds (bootstrap CIs), got {self.seeds}")
        if set(self.variants) != set(VARIANTS):
            raise ValueError(f"InfluenceConfig.variants must be the four variants {VARIANTS}, got {self.variants}")
        if self.majority.task != "majority" or self.conditioned.task != "conditioned_majority":
            raise ValueError("InfluenceConfig: majority.task must be 'majority', conditioned.task 'conditioned_majority'")
        if not self.conditioned_seeds:
            raise ValueError("InfluenceConfig.conditioned_seeds is empty")


QUICK = InfluenceConfig(
    majority=MajorityConfig(d_model=16, n_heads=2, steps=20, batch=16, n_probe=128, influence_steps=4),
    seeds=(0, 1),
    conditioned=MajorityConfig(task="conditioned_majority", d_model=16, n_heads=2, steps=20, batch=16, n_probe=128,
                               influence_steps=1),
    q_domains=QDomainsConfig(spec="tiny-gpt2", layer=0, n_ctx=4, length=16, d_sae=32, k=4, sae_steps=4,
                             n_features=8, q_contexts=1, q_length=8, q_position=4, extreme=0.25, max_chars=20_000),
    n_boot=1000)


def _positions() -> tuple[int, int]:
    """(first output position, n positions) of the Majority sequences (BOS at 0)."""
    b = majority(1)
    return min(b.output_positions), b.tokens.shape[1]


class InfluenceRecipe(Recipe):
    name = "influence"
    title = "Understanding the Emergence of Seemingly Useless Features in Next-Token Predictors"
    method = "dynamics/influence.py"
    doc = "docs/dynamics.md"
    notebook = "notebooks/influence.ipynb"
    Config = InfluenceConfig
    presets = {"quick": QUICK, "full": InfluenceConfig()}
    cost = {"quick": "about 10 CPU-s (one thread)",
            "full": "about 90 CPU-minutes: 10 Majority seeds (~85 CPU-s standard with the influence re-run, ~10 CPU-s "
                    "per other variant), conditioned Majority at the paper's 3000 x 256 (~15 CPU-min per variant), "
                    "Q(w) on zoo:smollm2-135m (~25 min on one core)"}
    code = ("interp.benchmarks.influence", "interp.dynamics.influence", "interp.dynamics.untied",
            "interp.dynamics.tasks")

    def units(self, config: InfluenceConfig) -> list:
        return ([["majority", s] for s in config.seeds]
                + [["conditioned", v, s] for s in config.conditioned_seeds for v in ("standard", "myopic")]
                + [["q_domains"]])

    def run_unit(self, config: InfluenceConfig, unit, stages):
        kind = unit[0]
        if kind == "majority":
            s = unit[1]
            return {v: stages(f"majority-{v}-seed{s}", lambda v=v: majority_record(
                dataclasses.replace(config.majority, variant=v, seed=s), track_influence=v == "standard"))
                for v in config.variants}
        if kind == "conditioned":
            _, v, s = unit
            return stages(f"conditioned-{v}-seed{s}", lambda: majority_record(
                dataclasses.replace(config.conditioned, variant=v, seed=s), track_influence=False))
        qc = config.q_domains
        model = load_lm(qc.spec)
        store = stages.path("q-store", lambda tmp: harvest_domains(model, qc, tmp / "store"))
        res = stages("q-domains", lambda: analyse_q_domains(model, qc, store / "store"))
        return {"summary": res.summary, "sae_stats": res.sae_stats, "q": res.q.tolist()}

    def combine(self, config: InfluenceConfig, outputs: list) -> Outcome:
        import pandas as pd

        units = self.units(config)
        maj = [o for u, o in zip(units, outputs) if u[0] == "majority"]
        cond = [(u, o) for u, o in zip(units, outputs) if u[0] == "conditioned"]
        (q,) = [o for u, o in zip(units, outputs) if u[0] == "q_domains"]

        acc = {v: np.array([mean_probe_accuracy(m[v]) for m in maj]) for v in config.variants}
        first_out, _ = _positions()
        ipos = sorted(config.majority.influence_positions)
        inp = [p for p in ipos if p < first_out - 1]          # NTP-useless input positions (not the last input)
        out = [p for p in ipos if p >= first_out]
        if not inp or not out:
            raise ValueError(f"influence_positions {ipos} need an input position < {first_out - 1} and an output "
                             f"position >= {first_out}")
        p_in, p_out = inp[0], out[0]
        rows = influence_summary([m["standard"] for m in maj], n_boot=config.n_boot)
        ci = {r["quantity"]: r for r in rows}
        direct_in = ci[f"influence_direct@{p_in}"]
        drops = {v: acc["standard"] - acc[v] for v in ("myopic", "untied", "myopic+untied")}
        drop_ci = {v: bootstrap_ci(d, n_boot=config.n_boot) for v, d in drops.items()}
        first = {v: [o["first_output_accuracy"] for u, o in cond if u[1] == v] for v in ("standard", "myopic")}
        groups = {r["group"]: r for r in q["summary"]}
        top = next(k for k in groups if k.startswith("top"))
        measured = {
            "probe_acc_standard_mean": float(acc["standard"].mean()),
            "probe_acc_standard": acc["standard"].tolist(),
            "probe_acc_myopic_untied": acc["myopic+untied"].tolist(),
            "probe_drop_myopic_untied_mean": float(drops["myopic+untied"].mean()),
            "myopic_untied_below_best_single": (np.minimum(acc["myopic"], acc["untied"])
                                                - acc["myopic+untied"]).tolist(),
            "probe_drop_myopic_ci_lo": drop_ci["myopic"][1],
            "probe_drop_untied_ci_lo": drop_ci["untied"][1],
            "influence_direct_output_ci_lo": ci[f"influence_direct@{p_out}"]["lo"],
            "influence_precached_shared_input_ci_lo": ci[f"influence_precached+shared@{p_in}"]["lo"],
            "influence_direct_input_mean": direct_in["mean"],
            "influence_direct_input_ci_contains_zero": float(direct_in["lo"] <= 0 <= direct_in["hi"]),
            "conditioned_first_output_standard": first["standard"],
            "conditioned_first_output_myopic": first["myopic"],
            "q_top_minus_all_formal_share": groups[top]["code+legal share"] - groups["all"]["code+legal share"],
            "q_spearman_formal": q["sae_stats"]["spearman_Q_vs_formal_pref"],
        }
        per_seed = [{"seed": s, **{f"probe_acc_{v}": float(acc[v][k]) for v in config.variants},
                     "first_output_standard": m["standard"]["first_output_accuracy"],
                     "first_output_myopic+untied": m["myopic+untied"]["first_output_accuracy"]}
                    for k, (s, m) in enumerate(zip(config.seeds, maj))]
        variants = [{"variant": v, "mean_probe_acc": float(acc[v].mean()),
                     **({} if v == "standard" else dict(zip(("drop_mean", "drop_lo", "drop_hi"), drop_ci[v])))}
                    for v in config.variants]
        cond_rows = [{"variant": u[1], "seed": u[2], "first_output_accuracy": o["first_output_accuracy"],
                      "output_accuracy": o["output_accuracy"], "final_loss": o["final_loss"],
                      **{f"probe@{p}": a for p, a in o["probe_accuracy"].items()}} for u, o in cond]
        df = pd.DataFrame(per_seed).melt(id_vars="seed", value_vars=[f"probe_acc_{v}" for v in config.variants],
                                         var_name="variant", value_name="probe accuracy")
        import plotly.express as px
        fig = px.strip(df, x="variant", y="probe accuracy", hover_data=["seed"],
                       title="is_majority probe accuracy (layer 2, input positions) per seed")
        return Outcome(
            measured=measured,
            tables={"Majority probe accuracy per seed": per_seed,
                    "Majority variants: mean probe accuracy and paired drop vs standard (95% bootstrap CI)": variants,
                    "cumulative Adam influence at layer 1 over seeds (mean, 95% bootstrap CI)": rows,
                    "conditioned Majority": cond_rows,
                    "Q(w) of SAE features by text domain": q["summary"]},
            figures=[("Majority probe accuracy per variant and seed", fig)],
            notes=(f"Majority: {len(config.seeds)} seeds, {config.majority.steps} steps of {config.majority.batch}, "
                   f"d {config.majority.d_model}; influence tracked at input position {p_in} and output position "
                   f"{p_out} (layer {config.majority.influence_layer}). The official risk is uncentred: most of the "
                   "direct influence at input positions is credit for moving the batch mean of <w, r> (the "
                   "centred_influence rows; docs/dynamics.md). Q(w): " + str(q["sae_stats"])))


RECIPE = InfluenceRecipe
