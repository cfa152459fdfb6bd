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
from interp.apps.reproduce import Outcome, Recipe

from .majority import (VARIANTS, MajorityConfig, influence_summary, majority_record, mean_probe_accuracy,
                       mean_probe_pearson, summary_row)
from .q_domains import QDomainsConfig, analyse_q_domains, harvest_domains, load_lm


@dataclass
class InfluenceConfig:
    """The run. ``majority``: the settings of every Majority run (its ``variant`` and ``seed`` are set per run);
    ``variants`` trained per seed of ``seeds`` (the influence re-run is on ``standard``); ``conditioned``: the
    conditioned-Majority setting, standard and myopic per seed of ``conditioned_seeds``; ``q_domains``: the Q(w)
    run; ``n_boot``: bootstrap resamples of the CIs over seeds."""

    majority: MajorityConfig = field(default_factory=lambda: MajorityConfig(steps=200))   # influence: every step
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


QUICK = InfluenceConfig(     # subsamples the influence: its first 4 of 20 steps (full coverage otherwise)
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
    cost = {"quick": "about 10 CPU-s (one thread; 8 CPU-s before issue #33's full influence coverage); its influence "
                     "re-run subsamples: the first 4 of 20 steps (all 108 probes)",
            "full": "about 6 CPU-hours (the record of 2026-12-07: 8,770 s + 16,213 s of stored stages, wall time of "
                    "two Ray workers at one thread each on a shared 2-core machine; the workers' CPU time was ~31 "
                    "CPU-min per Majority seed with the influence re-run at 108 probes over all 200 steps, 10 "
                    "seeds; conditioned Majority at 3000 x 256; Q(w) on zoo:smollm2-135m); estimated at 3.2 "
                    "CPU-hours from pieces measured 2026-12-02"}
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

        # the official probe metric (Ridge Pearson r, mean over features); ours (logistic accuracy) as a second column
        acc = {v: np.array([mean_probe_pearson(m[v]) for m in maj]) for v in config.variants}
        logit = {v: np.array([mean_probe_accuracy(m[v]) for m in maj]) for v in config.variants}
        first_out, _ = _positions()
        mc = config.majority
        ipos = sorted(mc.influence_positions)
        inp = [p for p in ipos if p < first_out - 1]          # NTP-useless input positions (not the last input)
        out = [p for p in ipos if p >= first_out]
        if not inp or not out or 1 not in mc.influence_layers:
            raise ValueError(f"influence_positions {ipos} need an input position < {first_out - 1} and an output "
                             f"position >= {first_out}, and influence_layers {mc.influence_layers} layer 1")
        # the claims' probe (fixed before the run, unchanged by #33): is_majority_0 at layer 1, input position 8
        # (or the nearest tracked input position), output position 15 (or the nearest tracked output position)
        p_in = min(inp, key=lambda p: abs(p - 8))
        p_out = min(out, key=lambda p: abs(p - 15))
        feat, lsite = "is_majority_0", "blocks.0.hook_resid_post"
        rows = influence_summary([m["standard"] for m in maj], n_boot=config.n_boot)

        def ci(c, p):
            return summary_row(rows, c, p, lsite, feat)
        direct_in = ci("direct", p_in)
        drops = {v: acc["standard"] - acc[v] for v in ("myopic", "untied", "myopic+untied")}
        drop_ci = {v: bootstrap_ci(d, n_boot=config.n_boot) for v, d in drops.items()}
        ldrops = {v: logit["standard"] - logit[v] for v in ("myopic", "untied", "myopic+untied")}
        ldrop_ci = {v: bootstrap_ci(d, n_boot=config.n_boot) for v, d in ldrops.items()}
        first = {v: [o["first_output_accuracy"] for u, o in cond if u[1] == v] for v in ("standard", "myopic")}
        groups = {r["group"]: r for r in q["summary"]}
        top = next(k for k in groups if k.startswith("top"))
        measured = {
            "probe_r_standard_mean": float(acc["standard"].mean()),
            "probe_r_standard": acc["standard"].tolist(),
            "probe_r_myopic_untied": acc["myopic+untied"].tolist(),
            "probe_r_drop_myopic_untied_mean": float(drops["myopic+untied"].mean()),
            "myopic_untied_r_below_best_single": (np.minimum(acc["myopic"], acc["untied"])
                                                  - acc["myopic+untied"]).tolist(),
            "probe_r_drop_myopic_ci_lo": drop_ci["myopic"][1],
            "probe_r_drop_untied_ci_lo": drop_ci["untied"][1],
            "probe_acc_standard_mean": float(logit["standard"].mean()),
            "probe_acc_drop_myopic_untied_mean": float(ldrops["myopic+untied"].mean()),
            "probe_acc_drop_myopic_ci_lo": ldrop_ci["myopic"][1],
            "probe_acc_drop_untied_ci_lo": ldrop_ci["untied"][1],
            "influence_direct_output_ci_lo": ci("direct", p_out)["lo"],
            "influence_precached_shared_input_ci_lo": ci("precached+shared", p_in)["lo"],
            "influence_direct_input_mean": direct_in["mean"],
            "influence_direct_input_ci_contains_zero": float(direct_in["lo"] <= 0 <= direct_in["hi"]),
            "conditioned_first_output_standard": first["standard"],
            "conditioned_first_output_myopic": first["myopic"],
            "q_top_minus_all_formal_share": groups[top]["code+legal share"] - groups["all"]["code+legal share"],
            "q_spearman_formal": q["sae_stats"]["spearman_Q_vs_formal_pref"],
        }
        per_seed = [{"seed": s, **{f"probe_r_{v}": float(acc[v][k]) for v in config.variants},
                     **{f"probe_acc_{v}": float(logit[v][k]) for v in config.variants},
                     "first_output_standard": m["standard"]["first_output_accuracy"],
                     "first_output_myopic+untied": m["myopic+untied"]["first_output_accuracy"]}
                    for k, (s, m) in enumerate(zip(config.seeds, maj))]
        variants = [{"variant": v, "mean_probe_r": float(acc[v].mean()),
                     **({} if v == "standard" else dict(zip(("drop_mean", "drop_lo", "drop_hi"), drop_ci[v]))),
                     "mean_probe_acc (ours)": float(logit[v].mean()),
                     **({} if v == "standard" else {"acc_drop_mean (ours)": ldrop_ci[v][0]})}
                    for v in config.variants]
        cond_rows = [{"variant": u[1], "seed": u[2], "first_output_accuracy": o["first_output_accuracy"],
                      "output_accuracy": o["output_accuracy"], "final_loss": o["final_loss"],
                      **{f"probe_r@{p}": a for p, a in o["probe_pearson"].items()},
                      **{f"probe_acc@{p}": a for p, a in o["probe_accuracy"].items()}} for u, o in cond]
        df = pd.DataFrame(per_seed).melt(id_vars="seed", value_vars=[f"probe_r_{v}" for v in config.variants],
                                         var_name="variant", value_name="probe Pearson r")
        import plotly.express as px
        fig = px.strip(df, x="variant", y="probe Pearson r", hover_data=["seed"],
                       title="is_majority probe (Ridge Pearson r; layer 2, input positions) per seed")
        return Outcome(
            measured=measured,
            tables={"Majority probe per seed (Ridge Pearson r, official; logistic accuracy, ours)": per_seed,
                    "Majority variants: mean probe r and paired drop vs standard (95% bootstrap CI)": variants,
                    "cumulative Adam influence over seeds per feature, layer, position (mean, 95% bootstrap CI)": rows,
                    "conditioned Majority": cond_rows,
                    "Q(w) of SAE features by text domain": q["summary"]},
            figures=[("Majority probe Pearson r per variant and seed", fig)],
            notes=(f"Majority: {len(config.seeds)} seeds, {mc.steps} steps of {mc.batch}, d {mc.d_model}; influence "
                   f"(official MSE risk x {mc.influence_risk_scale}) tracked over "
                   f"{'every step' if mc.influence_steps is None else f'the first {mc.influence_steps} steps'} at "
                   f"layers {list(mc.influence_layers)}, positions {ipos[0]}-{ipos[-1]}, "
                   f"{'every feature' if mc.influence_features is None else f'features {list(mc.influence_features)}'}"
                   f"; claims read {feat} at layer 1, input position {p_in}, output position {p_out}. Probe metric: "
                   "Ridge(alpha=1) Pearson r (official); logistic accuracy kept as a second column. The official "
                   "risk is uncentred: most of the "
                   "direct influence at input positions is credit for moving the batch mean of <w, r> (the "
                   "centred_influence rows; docs/dynamics.md). Q(w): " + str(q["sae_stats"])))


RECIPE = InfluenceRecipe
