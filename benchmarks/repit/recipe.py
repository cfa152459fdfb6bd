"""``interp reproduce repit``: RepIt on the toy category-refusal model over seeds of its training recipe (full), on
one quickly trained toy model (quick), or on ``zoo:smollm2-135m-refusal`` (preset ``smollm2``).

Per unit (a training seed of the toy model, or the one real model) and per target set (the group bio, chem,
nuclear and the single target bio): RepIt fitted on ``train``, rho searched on ``val``, and held-out refusal
rates with no intervention, with the plain target vector (rho = 0) and with RepIt (:mod:`.experiment`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from interp.apps.reproduce import Outcome, Recipe

from .experiment import RepItExperimentConfig, RepItValidation, experiment, toy_config

#: the toy model's name in :attr:`RepItReproConfig.model` (trained per seed inside a stage)
TOY = "toy-refusal"


@dataclass
class RepItReproConfig:
    """What ``interp reproduce repit`` runs.

    ``model``: ``"toy-refusal"`` trains the toy model once per seed of ``seeds`` (``ToyRefusalConfig(seed=s,
    steps=toy_steps)``; seed 0 at 1,500 steps is ``zoo:toy-refusal``) and runs :func:`toy_config`; any other
    value is a model spec run with :class:`RepItExperimentConfig`'s defaults (``seeds`` is then ignored).
    ``target_sets``: each a tuple of target categories, at most one single target and one group (named
    ``single`` and ``group`` in the measurements). ``overrides``: fields of the experiment config to change.
    """

    model: str = TOY
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    toy_steps: int = 1500
    toy_min_accuracy: float = 0.98
    target_sets: tuple[tuple[str, ...], ...] = (("bio", "chem", "nuclear"), ("bio",))
    overrides: dict = field(default_factory=dict)
    threads: int | None = 1

    def __post_init__(self) -> None:
        self.seeds = tuple(self.seeds)
        self.target_sets = tuple(tuple(t) for t in self.target_sets)
        names = [set_name(t) for t in self.target_sets]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"target_sets needs at most one single target and one group, got {self.target_sets}")
        if self.model == TOY and not self.seeds:
            raise ValueError("the toy model needs at least one seed")
        if self.toy_steps < 1:
            raise ValueError(f"toy_steps must be >= 1, got {self.toy_steps}")


def set_name(targets: tuple[str, ...]) -> str:
    """``"single"`` for one target category, ``"group"`` for several."""
    if not targets:
        raise ValueError("a target set is a non-empty tuple of categories")
    return "single" if len(targets) == 1 else "group"


def _experiment_config(config: RepItReproConfig, targets: tuple[str, ...]) -> RepItExperimentConfig:
    if config.model == TOY:
        return toy_config(targets=targets, **config.overrides)
    return RepItExperimentConfig(model=config.model, targets=targets, **config.overrides)


def _build_toy(folder, config: RepItReproConfig, seed: int) -> None:
    from .toy_model import ToyRefusalConfig, build_toy_refusal

    build_toy_refusal(folder, ToyRefusalConfig(seed=seed, steps=config.toy_steps,
                                               min_accuracy=config.toy_min_accuracy).to_params())


def measurements(res: RepItValidation, prefix: str) -> dict[str, float]:
    """The numbers the claims read, from one validation (pooled held-out refusal rates, first mode)."""
    s, crit = res.summary, res.criteria
    mode = res.config["modes"][0]
    sfx = "" if mode == "affine" else f"_{mode}"
    loc = res.localization.get(mode) or {}
    d = float(loc.get("d", 0) or 0)
    return {
        f"{prefix}_target_before": s["none"]["target"],
        f"{prefix}_target_after": s["repit" + sfx]["target"],
        f"{prefix}_target_drop_points": s["none"]["target"] - s["repit" + sfx]["target"],
        f"{prefix}_target_drop": crit[f"repit{sfx}_target_drop"]["value"],
        f"{prefix}_nontarget_kept": crit[f"repit{sfx}_nontarget_retain"]["value"],
        f"{prefix}_natural_nontarget_kept": crit[f"natural{sfx}_collateral"]["value"],
        f"{prefix}_rho": float(res.rho[mode]),
        f"{prefix}_data_efficiency": min(res.data_efficiency.values()) if res.data_efficiency else float("nan"),
    } | ({f"{prefix}_dims90_share": res.dims_90[mode] / d} if d else {})  # no correction at rho = 0


class RepItRecipe(Recipe):
    name = "repit"
    title = "RepIt: Representing Isolated Targets to Steer Language Models"
    method = "steering/repit.py"
    doc = "docs/steering.md"
    notebook = "notebooks/repit.ipynb"
    Config = RepItReproConfig
    presets = {
        # one toy model trained briefly (200 steps; held-out accuracy 1.0 already at 150) inside a stage, group and
        # single target: every stage and verdict
        "quick": RepItReproConfig(seeds=(0,), toy_steps=200, toy_min_accuracy=0.9),
        # the toy recipe on six training seeds, group and single target (docs/steering.md, the seed table)
        "full": RepItReproConfig(),
        # the real-model validation (docs/steering.md, zoo:smollm2-135m-refusal): COSMIC selection, both modes
        "smollm2": RepItReproConfig(model="zoo:smollm2-135m-refusal", seeds=(0,),
                                    target_sets=(("bio", "chem", "nuclear"),)),
    }
    cost = {"quick": "about 30 s on the loaded 2-core machine (one thread)", "full": "about 5 CPU-minutes (six toy models and 12 validations; 12 min wall "
                                                 "on the loaded 2-core machine)",
            "smollm2": "about 80 CPU-minutes on one busy thread (16 min idle), plus building the refusal model"}
    code = ("interp.benchmarks.repit", "interp.steering.repit", "interp.steering.refusal", "interp.steering.base",
            "interp.steering.activations")

    def units(self, config: RepItReproConfig) -> list:
        return list(config.seeds) if config.model == TOY else [None]

    def run_unit(self, config: RepItReproConfig, seed: Any, stages) -> dict:
        import interp
        from interp.training import limit_threads

        interp.set_progress(False)
        tag = "" if seed is None else f"-seed{seed}"
        out = {}
        with limit_threads(config.threads, blas=False):
            model = None
            for targets in config.target_sets:
                name = set_name(targets)
                stage = f"{name}{tag}"
                if not stages.done(stage) and model is None:
                    if config.model == TOY:
                        folder = stages.path(f"toy-model{tag}", lambda d: _build_toy(d, config, seed))
                        model = interp.load(str(folder), backend="torch")
                    else:
                        model = interp.load(config.model, backend="torch")
                out[name] = stages(stage, lambda: experiment(_experiment_config(config, targets), model=model))
        return out

    def combine(self, config: RepItReproConfig, outputs: list) -> Outcome:
        units = self.units(config)
        measured: dict[str, list[float]] = {}
        rows: dict[str, list[dict]] = {}
        for unit, out in zip(units, outputs):
            for name, res in out.items():
                for k, v in measurements(res, name).items():
                    measured.setdefault(k, []).append(float(v))
                mode = res.config["modes"][0]
                sfx = "" if mode == "affine" else f"_{mode}"
                row = {"seed": unit, "rho": float(res.rho[mode])}
                for cond in ("none", "natural" + sfx, "repit" + sfx):
                    row[f"{cond}: target"] = res.summary[cond]["target"]
                    row[f"{cond}: non-target"] = res.summary[cond]["nontarget"]
                row["target categories after RepIt"] = ", ".join(
                    f"{c} {res.judged['repit' + sfx][c]:.2f}" for c in res.targets)
                rows.setdefault(name, []).append(row)
        tables = {f"{name}: held-out refusal rates per {'seed' if config.model == TOY else 'run'} (targets "
                  f"{', '.join(t)})": rows[name] for name, t in ((set_name(t), t) for t in config.target_sets)}
        figures = []
        for unit, out in zip(units, outputs):
            for name, res in out.items():
                figures.append((f"{name}, {'seed ' + str(unit) if unit is not None else config.model}: held-out "
                                f"refusal per category", res.figure()))
        model = f"toy models of seeds {list(config.seeds)} ({config.toy_steps} steps)" if config.model == TOY \
            else config.model
        notes = (f"{model}. Rates are pooled over held-out prompts (targets / non-targets); *_nontarget_kept is "
                 f"RepIt's non-target refusal over the baseline's, *_natural_nontarget_kept the plain target "
                 f"vector's (the collateral damage RepIt is meant to avoid: isolation is only shown where it is "
                 f"< 0.9). Judge: {'the first response token' if config.model == TOY else 'greedy generations'}.")
        return Outcome(measured=measured, tables=tables, figures=figures[:4], notes=notes)


RECIPE = RepItRecipe
