"""``interp reproduce polca``: "Hidden Breakthroughs in Language Model Training" (Kangaslahti, Rosenfeld & Saphra,
ICLR 2026) at CPU scale: POLCA on 3-digit addition with the digest's CPU recipe (section 8). One unit; the
training, every Lanczos batch and every checkpoint interval's POLCA terms are stages.
"""
from __future__ import annotations

import math

from interp.apps.reproduce import Outcome, Recipe

from .addition import AdditionConfig, run_addition

QUICK = AdditionConfig(n_layers=1, d_model=16, n_heads=2, steps=40, batch=16, every=10, basis_every=10, k=1,
                       lanczos_iter=4, n_hessian=16, n_eval=16, delta=10)


def _num(x) -> float:
    """A maximum over no eligible cluster is NaN in :func:`addition_carry_summary`; here it counts as 0 (no cluster
    of that kind exists), so the verdict is judged rather than 'error'."""
    return 0.0 if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


class PolcaRecipe(Recipe):
    name = "polca"
    title = "Hidden Breakthroughs in Language Model Training"
    method = "dynamics/polca.py"
    doc = "docs/dynamics.md"
    notebook = "notebooks/polca.ipynb"
    Config = AdditionConfig
    presets = {"quick": QUICK, "full": AdditionConfig()}
    cost = {"quick": "about 6 CPU-s (one thread)",
            "full": "about 17 CPU-minutes (the record: 1,039 s on one thread of the 2-core machine; an earlier run "
                    "under load took 2,711 s wall: training ~2 min, basis 7.8 min, POLCA terms and span diagnostics "
                    "35 min)"}
    code = ("interp.benchmarks.polca", "interp.dynamics.polca", "interp.dynamics.tasks")

    def run_unit(self, config: AdditionConfig, unit, stages) -> dict:
        res = run_addition(config, stages)
        d = res.diagnostics
        return {"diagnostics": d, "clusters": res.clusters, "tau": res.tau, "steps": res.steps,
                "mean_exact_loss": res.exact.mean(0).tolist(), "kept": res.kept.tolist()}

    def combine(self, config: AdditionConfig, outputs: list) -> Outcome:
        (out,) = outputs
        d = out["diagnostics"]
        carry = d["carry"]
        measured = {
            "r2_total": d["r2"]["polca"]["total"],
            "r2_per_interval": d["r2"]["polca"]["per_interval"],
            "r2_exact_in_span_total": d["r2"]["exact_in_span"]["total"],
            "r2_taylor_along_b": d["r2_taylor"],
            "frac_in_span_mean": d["frac_in_span"]["mean"],
            "polca_max_carry_fraction": _num(carry["polca"]["max_carry_fraction"]),
            "exact_max_carry_fraction": _num(carry["exact"]["max_carry_fraction"]),
            "exact_change_max_carry_fraction": _num(carry["exact_change"]["max_carry_fraction"]),
            "polca_hidden_fraction": _num(carry["polca"]["hidden_fraction"]),
            "exact_hidden_fraction": _num(carry["exact"]["hidden_fraction"]),
            "hidden_fraction_polca_minus_exact": _num(carry["polca"]["hidden_fraction"])
                                                 - _num(carry["exact"]["hidden_fraction"]),
            "n_kept_directions": d["n_kept"],
            "tau": out["tau"],
        }
        carry_rows = [{"decomposition": k, **{c: v for c, v in row.items()}} for k, row in carry.items()]
        import plotly.graph_objects as go
        fig = go.Figure(go.Scatter(x=out["steps"], y=out["mean_exact_loss"], mode="lines+markers", name="exact"))
        fig.add_vline(x=out["tau"], line_dash="dash")
        fig.update_layout(xaxis_title="step", yaxis_title="mean answer-token loss (held-out problems)")
        return Outcome(
            measured=measured,
            tables={"carry clusters per decomposition (addition_carry_summary)": carry_rows,
                    "clusters (all sources)": out["clusters"],
                    "R² against the exact per-token loss change": [
                        {"prediction": k, **v} for k, v in d["r2"].items()]},
            figures=[("aggregate exact loss and tau (dashed)", fig)],
            notes=(f"{config.n_layers} layers, d {config.d_model}, {config.steps} steps, checkpoints every "
                   f"{config.every}, {d['n_basis']} basis vectors ({d['n_kept']} kept), {4 * config.n_eval} answer "
                   f"tokens; tau = {out['tau']}. The basis holds {d['frac_in_span']['mean']:.1%} of each step "
                   "(||B B^T dtheta|| / ||dtheta||, mean). A maximum carry fraction over no eligible cluster "
                   "counts as 0; so does the hidden fraction of a decomposition without clusters."))


RECIPE = PolcaRecipe
