"""``interp reproduce city_networks``: the digest's CPU-scale validation (grid city vs small world) and the real
Helsinki road graph beside the paper's table (models digest, section 2)."""
from __future__ import annotations

from dataclasses import dataclass, field

from interp.models.city_networks import TrainConfig
from interp.apps.reproduce import Outcome, Recipe

from .experiment import (PAPER_ACCURACY_L16, PAPER_R_GCN, CityValidationResult, SweepSpec, ValidationConfig,
                         road_validation, synthetic_validation)

GNN_KINDS = ("gcn", "sage", "gat")


def _road_full() -> ValidationConfig:
    # Helsinki (k = 16 as in the paper), every model at L = 2..16 on 2 seeds, influence of a 16-layer GCN
    return ValidationConfig(influence_depth=16,
                            sweeps={"main": [SweepSpec(("mlp", "gcn", "sage", "gat"), seeds=(0, 1))]},
                            influence_samples=300, control_influence_samples=60)


@dataclass
class CityNetworksRun:
    """One run of the recipe: ``synthetic`` (grid city vs small world) and ``road`` (Helsinki, with a small world of
    the same size and Zachary's karate club as controls for R)."""

    synthetic: ValidationConfig = field(default_factory=ValidationConfig)
    road: ValidationConfig = field(default_factory=_road_full)


def _tiny(**kw) -> ValidationConfig:
    return ValidationConfig(sweeps={"main": [SweepSpec(("mlp", "gcn", "sage", "gat"), depths=(2, 8))],
                                    "control": [SweepSpec(("gcn",), depths=(2,))]},
                            influence_samples=10, control_influence_samples=5,
                            train=TrainConfig(hidden=8, max_epochs=4), **kw)


class CityNetworksRecipe(Recipe):
    name = "city_networks"
    title = ("Towards Quantifying Long-Range Interactions in Graph Machine Learning: a Large Graph Dataset and a "
             "Measurement")
    method = "models/city_networks/"
    doc = "docs/models/city_networks.md"
    notebook = "notebooks/city_networks.ipynb"
    Config = CityNetworksRun
    presets = {
        # every stage and verdict: a 9x9 grid city and the Helsinki graph labelled with k = 4, 4 epochs, tiny GNNs
        "quick": CityNetworksRun(synthetic=_tiny(grid_side=9, grid_k=3), road=_tiny(road_k=4)),
        # the documented runs: 70x70 grid city (k = 8; MLP/GCN 3 seeds, SAGE/GAT 1) and Helsinki (k = 16, 2 seeds)
        "full": CityNetworksRun(),
    }
    cost = {"quick": "about 30 s from an empty cache",
            "full": "about 14 minutes on 2 shared cores (the committed record: 828 s of stages, 2026-12-02)"}
    code = ("interp.benchmarks.city_networks", "interp.models.city_networks", "interp.models.common")

    def units(self, config: CityNetworksRun) -> list:
        return ["synthetic", "road"]

    def run_unit(self, config: CityNetworksRun, unit: str, stages) -> CityValidationResult:
        if unit == "synthetic":
            return synthetic_validation(config.synthetic, stages=stages)
        return road_validation(config.road, stages=stages)

    def combine(self, config: CityNetworksRun, outputs: list) -> Outcome:
        syn, road = outputs
        sn, rn = syn.numbers, road.numbers
        L = config.synthetic.influence_depth
        kinds = [k for k in GNN_KINDS if f"helsinki_{k}_L2" in rn]
        measured = {
            # grid city (digest's recipe)
            "grid_gcn_gain_points": sn.get("grid_gcn_gain_points", float("nan")),
            "grid_mlp_best_acc": sn.get("grid_mlp_best_acc", float("nan")),
            "grid_R_over_small_world": sn["R_grid"] / sn["R_small_world"],
            "grid_decay_minus_small_world": sn["decay_grid"] - sn["decay_small_world"],
            # Helsinki
            "road_deep_gain_points": [rn[f"helsinki_{k}_best_deep"] - rn[f"helsinki_{k}_L2"] for k in kinds],
            "road_deep_gnn_minus_mlp_points": [rn[f"helsinki_{k}_best_deep"] - rn["helsinki_mlp_best_acc"]
                                               for k in kinds],
            "road_R_over_karate": rn["R_helsinki"] / rn["R_karate"],
            "road_R_over_small_world": road.influence["main"]["R"] / road.influence["control"]["R"],
            "R_helsinki": rn["R_helsinki"],
        }
        tables = {"grid city and small world: test accuracy (%) per model and depth":
                      syn.to_frame().to_dict("records"),
                  "Helsinki and controls: test accuracy (%) per model and depth": road.to_frame().to_dict("records"),
                  "receptive field R and influence decay per graph":
                      [*syn.influence_frame().to_dict("records"), *road.influence_frame().to_dict("records")],
                  "graphs (tie_ambiguous: labels that depend on how the sort breaks ties; ours is stable, the "
                  "official torch.sort is not)":
                      [{c: st[c] for c in ("name", "nodes", "edges", "k", "classes", "tie_ambiguous")}
                       for res in (syn, road) for st in res.graphs.values()],
                  "paper: best accuracy (%) at L = 16": [{"model": m, **v} for m, v in PAPER_ACCURACY_L16.items()],
                  "paper: R of a 16-layer GCN": [PAPER_R_GCN]}
        return Outcome(
            measured=measured, tables=tables,
            figures=[("grid city vs small world", syn.figure()), ("Helsinki and controls", road.figure())],
            notes=f"Grid: GCN depth gain L = 2 -> {L}, influence of a {L}-layer GCN over {config.synthetic.hops} "
                  f"hops; Helsinki: influence of a {config.road.influence_depth}-layer GCN over {config.road.hops} "
                  f"hops, GNN kinds {', '.join(kinds)}. Baselines: architecture "
                  f"'{config.synthetic.train.architecture}' ('pyg': the official PyG GCN / GraphSAGE / GAT / MLP with "
                  f"ReLU; 'projected': ours, Linear + SiLU projections). At most "
                  f"{config.synthetic.train.max_epochs} epochs with early stopping (the paper trains 30,000).")


RECIPE = CityNetworksRecipe
