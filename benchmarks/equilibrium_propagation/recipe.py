"""``interp reproduce equilibrium_propagation``: the FRE-RNN trained with equilibrium propagation on digits, the
digest's four CPU-scale validations (section 7): EP vs BP, convergence vs feedback strength, gradient alignment,
residual links at depth."""
from __future__ import annotations

import numpy as np

from interp.models.equilibrium_propagation import EPConfig
from interp.apps.reproduce import Outcome, Recipe

from .experiment import EPRunConfig, assemble, run_beta, run_depth, run_seed


class EquilibriumPropagationRecipe(Recipe):
    name = "equilibrium_propagation"
    title = ("Toward Practical Equilibrium Propagation: Brain-inspired Recurrent Neural Network with Feedback "
             "Regulation and Residual Connections")
    method = "models/equilibrium_propagation.py"
    doc = "docs/models/equilibrium_propagation.md"
    notebook = "notebooks/equilibrium_propagation.ipynb"
    Config = EPRunConfig
    presets = {
        # every unit kind once, small: 1 seed x 8 epochs, two betas x 2 epochs, a 5-layer depth study x 2 epochs
        "quick": EPRunConfig(model=EPConfig(epochs=8), seeds=(0,), betas=(0.01, 1.0), convergence_epochs=2,
                             depth_layers=5, depth_epochs=2, depth_seeds=(0,), max_steps=400),
        # the digest's recipe: 64-64-64-10, 100 epochs, 5 seeds; beta sweep; 8 layers with/without skips, 3 seeds
        "full": EPRunConfig(),
    }
    cost = {"quick": "about 10 s", "full": "about 32 minutes on a loaded 2-core machine (one thread)"}
    code = ("interp.benchmarks.equilibrium_propagation", "interp.models.equilibrium_propagation",
            "interp.models.common")

    def units(self, config: EPRunConfig) -> list:
        return ([["seed", int(s)] for s in config.seeds] + [["beta", float(b)] for b in config.betas]
                + [["depth", int(s)] for s in config.depth_seeds])

    def run_unit(self, config: EPRunConfig, unit, stages) -> dict:
        kind, value = unit
        fn = {"seed": run_seed, "beta": run_beta, "depth": run_depth}[kind]

        def compute() -> dict:
            return fn(config, value)

        return {"kind": kind, **stages(f"{kind}-{value:g}", compute)}

    def combine(self, config: EPRunConfig, outputs: list) -> Outcome:
        by = {k: [o for o in outputs if o["kind"] == k] for k in ("seed", "beta", "depth")}
        res = assemble(config, by["seed"], by["beta"], by["depth"])
        steps = dict(zip(res.betas, res.convergence_steps))
        ep, bp = np.array(res.accuracy["ep"]), np.array(res.accuracy["bp"])
        skip, plain = np.array(res.depth_accuracy["skip"]), np.array(res.depth_accuracy["no_skip"])
        gain = float(skip.mean() - plain.mean())
        radius = res.spectral_radius
        measured = {
            "ep_accuracy": [float(a) for a in ep], "bp_accuracy": [float(a) for a in bp],
            "bp_minus_ep": float(bp.mean() - ep.mean()),
            "steps_ratio_beta_0.01_over_1": float(steps[0.01] / steps[1.0]) if 0.01 in steps and 1.0 in steps
            else float("nan"),
            "spectral_radius_increasing": float(all(a < b for a, b in zip(radius, radius[1:]))),
            "cos_W_f": res.alignment["W_f"], "cos_W_top": res.alignment[f"W.{config.model.n_layers - 1}"],
            "depth_skip_gain": gain,
            "depth_skip_helps": float(gain >= 0.02 or skip.std() < plain.std()),
        }
        per_seed = [{"seed": s, "EP": a, "BP": b} for s, a, b in zip(res.seeds, res.accuracy["ep"], res.accuracy["bp"])]
        sweep = [{"beta": b, "steps to converge": s, "spectral radius": r, "test accuracy": a}
                 for b, s, r, a in zip(res.betas, res.convergence_steps, res.spectral_radius, res.beta_accuracy)]
        depth = [{"seed": s, "no skip links": a, "skip links": b}
                 for s, a, b in zip(res.depth_seeds, res.depth_accuracy["no_skip"], res.depth_accuracy["skip"])]
        align = [{"parameter": k, "cosine(EP update, -BP gradient)": v} for k, v in res.alignment.items()]
        return Outcome(
            measured=measured,
            tables={"EP vs BP test accuracy per seed": per_seed,
                    "feedback strength: one network trained per beta": sweep,
                    "gradient alignment (first seed's trained EP network)": align,
                    f"{res.depth_layers} hidden layers, skip links {res.depth_skips}": depth},
            figures=[("FRE-RNN + EP on digits", res.figure())],
            notes=f"{config.model.hidden} hidden units, {config.model.epochs} epochs, seeds {list(config.seeds)}; "
                  f"beta sweep {list(config.betas)} ({config.convergence_epochs} epochs each); depth "
                  f"{config.depth_layers} layers, {config.depth_epochs} epochs, seeds {list(config.depth_seeds)}.")


RECIPE = EquilibriumPropagationRecipe
