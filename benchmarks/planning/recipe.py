"""``interp reproduce planning``: the digest's validations of "Internal Planning in Language Models" (VQ-VAE summary
codes and mutual information) at CPU scale.

Units (independent; each a stage): the estimator sanity check with no language model (one per codebook size K),
the horizon toy, the horizon-curve shapes of the grammar and of path finding, branch awareness on the paper's
path-finding instances (one per model), and the block x layer map of a real model on real text. The ``full``
preset uses the ``zoo:planning-*`` entries and ``zoo:smollm2-135m`` with the documented settings (:mod:`.validation`);
``quick`` trains seconds-sized models of the same tasks inside stages and maps the quick grammar model on its own
task text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from interp.apps.reproduce import Outcome, Recipe

from .validation import BRANCH_RUN, HORIZON_RUN, SMOLLM_RUN, decay_criteria, estimator_sanity, horizon_criteria

#: the models of the analyses (zoo entries; the quick preset trains small variants of them in stages)
HORIZON_MODEL = "planning-horizon-ntp"
CFG_MODEL = "planning-cfg-ntp"
PF_MODEL = "planning-pf-short-nodead-ntp"
BRANCH_MODELS = ("planning-pf-short-nodead-ntp", "planning-pf-short-nodead-mtp")


@dataclass
class PlanningReproConfig:
    """What ``interp reproduce planning`` runs (defaults: the documented runs, docs/planning.md sections 1-5).

    ``train``: ``None`` loads the zoo entries; a dict trains each model in a stage with
    ``fast_params(entry, **train)`` (the quick preset). ``map_model``: a model spec for the block x layer map, or
    ``"train:<entry>"`` for a model trained like the others; ``map_texts``: ``"kjv"`` (100-word King James passages)
    or ``"task"`` (prompt + target of the map model's own task).
    """

    sanity_codes: tuple[int, ...] = (16, 64)
    sanity_n: int = 2000
    sanity_train: dict = field(default_factory=lambda: {"steps": 800})
    sanity_vqvae: dict = field(default_factory=dict)
    sanity_noise: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    sanity_symbols: int = 32
    horizon_model: str = HORIZON_MODEL
    cfg_model: str = CFG_MODEL
    pf_model: str = PF_MODEL
    branch_models: tuple[str, ...] = BRANCH_MODELS
    horizon_run: dict = field(default_factory=lambda: dict(HORIZON_RUN))
    branch_run: dict = field(default_factory=lambda: dict(BRANCH_RUN))
    map_model: str = "zoo:smollm2-135m"
    map_texts: str = "kjv"
    map_run: dict = field(default_factory=lambda: dict(SMOLLM_RUN))
    train: dict | None = None
    threads: int | None = 1

    def __post_init__(self) -> None:
        self.sanity_codes = tuple(self.sanity_codes)
        self.sanity_noise = tuple(self.sanity_noise)
        self.branch_models = tuple(self.branch_models)
        if self.map_texts not in ("kjv", "task"):
            raise ValueError(f"map_texts must be 'kjv' or 'task', got {self.map_texts!r}")
        if self.map_texts == "task" and not self.map_model.startswith("train:"):
            raise ValueError("map_texts='task' needs map_model='train:<planning entry>' (its task gives the texts)")
        if not self.sanity_codes or not self.branch_models:
            raise ValueError("sanity_codes and branch_models must not be empty")


def _tuples(run: dict) -> dict:
    """JSON lists back to the tuples the analysis configs expect (``map_layers``, ``layers``, ...)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in run.items()}


def _model(config: PlanningReproConfig, entry: str, stages) -> tuple[Any, Any]:
    """``(model, task)`` of a planning entry: the zoo's, or one trained in a stage (``config.train``)."""
    import interp

    from .tasks import task_for, task_from_params
    from .zoo import build_planning, fast_params

    if config.train is None:
        return interp.load(f"zoo:{entry}", backend="torch"), task_for(entry)
    params = fast_params(entry, **config.train)
    folder = stages.path(f"model-{entry}", lambda d: build_planning(d, params))
    return interp.load(str(folder), backend="torch"), task_from_params(params["task"])


def _map_texts(config: PlanningReproConfig, task) -> list[str]:
    run = config.map_run
    n_texts = -(-run["n_examples"] // run["anchors_per_text"])
    if config.map_texts == "kjv":
        from interp.data import kjv_text

        words = kjv_text().split()
        return [" ".join(words[i:i + 100]) for i in range(0, 100 * n_texts, 100)]
    return [f"{ex.prompt} {ex.target}" for ex in task.examples(n_texts, seed=0)]


def map_measurements(r) -> dict[str, Any]:
    """The block x layer criteria as numbers: the most recent block carries most (``recent_minus_older``), late
    layers more than early ones (``late_minus_early``), and each earlier block adds information given the last
    position (``cond_margin``: per block k >= 2, its largest conditional MI minus 3 null std)."""
    blocks = np.asarray(r.nmi_t)[1:]
    half = blocks.shape[1] // 2
    cond = np.asarray(r.cmi_t)[1:] - np.asarray(r.null_cond)[1:]
    std = np.asarray(r.null_std)
    finite = np.where(np.isfinite(cond), cond, -np.inf)
    margin = [float(finite[k].max() - 3 * std[k + 1].max()) for k in range(1, cond.shape[0])]
    return {"map_recent_minus_older": float(blocks[0].mean() - blocks[1:].mean()),
            "map_late_minus_early": float(blocks[:, half:].mean() - blocks[:, :half].mean()),
            "map_cond_margin": margin}


class PlanningRecipe(Recipe):
    name = "planning"
    title = "Internal Planning in Language Models: Characterizing Horizon and Branch Awareness"
    method = "probes/planning/"
    doc = "docs/planning.md"
    notebook = "notebooks/planning.ipynb"
    Config = PlanningReproConfig
    _tiny_vq = {"d_model": 32, "d_latent": 8, "n_encoder_layers": 1, "n_heads": 2}
    presets = {
        # seconds-sized models (2 layers, d 32, 60 steps) trained in stages, small VQ-VAEs and N: every unit runs
        "quick": PlanningReproConfig(
            sanity_codes=(8,), sanity_n=300, sanity_train={"steps": 60, "eval_every": 30}, sanity_vqvae=_tiny_vq,
            sanity_noise=(0.0, 0.5, 1.0), sanity_symbols=16, branch_models=(PF_MODEL,),
            horizon_run={"n_examples": 200, "n_codes": 8, "max_tau": 6, "vqvae": _tiny_vq, "train": {"steps": 80},
                         "n_perm": 5, "n_seeds": 1, "continuation": "target"},
            # the 60-step PF model solves nothing: the quick branch run takes the reference paths
            branch_run={"n_examples": 200, "n_codes": 8, "vqvae": _tiny_vq, "train": {"steps": 30}, "n_perm": 5,
                        "n_seeds": 1, "continuation": "target"},
            map_model=f"train:{CFG_MODEL}", map_texts="task",
            map_run={"n_examples": 200, "n_codes": 8, "block_size": 4, "n_blocks": 3, "map_layers": (0, 1),
                     "anchors_per_text": 2, "max_tokens": 40, "vqvae": _tiny_vq, "train": {"steps": 30}, "n_perm": 5,
                     "batch_size": 32},
            train={"steps": 60, "n_layers": 2, "d_model": 32, "d_mlp": 64, "n_eval": 32}),
        # docs/planning.md sections 1-5: the zoo's planning models and SmolLM2-135M, HORIZON_RUN / BRANCH_RUN /
        # SMOLLM_RUN (N = 8000 for the branch runs)
        "full": PlanningReproConfig(),
    }
    cost = {"quick": "about 40 s on the loaded 2-core machine (one thread)",
            "full": "about 45 CPU-minutes (documented CPU times: branch 412 + 416 s, SmolLM2 map 859 s, PF horizon "
                    "167 s; estimator, horizon toy and CFG a few minutes each) plus building the zoo models "
                    "(~25 CPU-minutes, once: planning-pf-short-nodead-mtp alone 1,043 s)"}
    code = ("interp.benchmarks.planning", "interp.probes.planning")

    def units(self, config: PlanningReproConfig) -> list:
        return ([f"sanity-{k}" for k in config.sanity_codes] + ["horizon", "shape-cfg", "shape-pf"]
                + [f"branch-{m}" for m in config.branch_models] + ["map"])

    def run_unit(self, config: PlanningReproConfig, unit: str, stages) -> Any:
        import interp
        from interp.probes.planning import (BlockMapConfig, BranchConfig, HorizonConfig, block_layer_map,
                                            branch_awareness, horizon_curve)
        from interp.training import limit_threads

        from .validation import horizon_run_for

        interp.set_progress(False)
        if stages.done(unit):
            return stages(unit, lambda: None)
        with limit_threads(config.threads, blas=False):
            if unit.startswith("sanity-"):
                k = int(unit.split("-")[1])
                return stages(unit, lambda: estimator_sanity(
                    noise_levels=config.sanity_noise, n_codes=k, n=config.sanity_n, n_symbols=config.sanity_symbols,
                    vqvae=config.sanity_vqvae or None, train=config.sanity_train))
            if unit == "horizon":
                model, task = _model(config, config.horizon_model, stages)
                return stages(unit, lambda: horizon_curve(model, task, HorizonConfig(**_tuples(config.horizon_run))))
            if unit.startswith("shape-"):
                entry = config.cfg_model if unit == "shape-cfg" else config.pf_model
                model, task = _model(config, entry, stages)
                run = horizon_run_for(task, **{k: v for k, v in config.horizon_run.items() if k != "max_tau"})
                run["max_tau"] = min(run["max_tau"], config.horizon_run.get("max_tau", 10))
                return stages(unit, lambda: horizon_curve(model, task, HorizonConfig(**_tuples(run))))
            if unit.startswith("branch-"):
                model, task = _model(config, unit.removeprefix("branch-"), stages)
                return stages(unit, lambda: branch_awareness(model, task, BranchConfig(**_tuples(config.branch_run))))
            if unit == "map":
                if config.map_model.startswith("train:"):
                    model, task = _model(config, config.map_model.removeprefix("train:"), stages)
                else:
                    model, task = interp.load(config.map_model, backend="torch"), None
                texts = _map_texts(config, task)
                return stages(unit, lambda: block_layer_map(model, texts, BlockMapConfig(**_tuples(config.map_run))))
        raise ValueError(f"unknown unit {unit!r}")

    def combine(self, config: PlanningReproConfig, outputs: list) -> Outcome:
        out = dict(zip(self.units(config), outputs))
        m: dict[str, Any] = {}
        tables: dict[str, list] = {}
        figures = []
        san = [out[f"sanity-{k}"] for k in config.sanity_codes]
        m["sanity_spearman"] = [float(r.spearman) for r in san]
        m["sanity_independent_abs_z"] = [abs(float(r.independent_z)) for r in san]
        for k, r in zip(config.sanity_codes, san):
            tables[f"estimator sanity, K = {k} (nats)"] = r.to_frame().to_dict("records")
        h = out["horizon"]
        c = horizon_criteria(h)
        m.update(horizon_accuracy=float(h.accuracy), horizon_early_late_ratio=float(c["ratio"]),
                 horizon_late_within_noise=float(c["late_within_noise"]),
                 horizon_early_significant=float(c["early_significant"]))
        tables[f"horizon toy ({config.horizon_model})"] = h.to_frame().to_dict("records")
        figures.append((f"horizon toy ({config.horizon_model})", h.figure()))
        for unit, entry, key in (("shape-cfg", config.cfg_model, "cfg"), ("shape-pf", config.pf_model, "pf")):
            r = out[unit]
            d = decay_criteria(r)
            m[f"{key}_tail_over_tau1"] = d["nmi_tail_mean"] / d["nmi_tau1"] if d["nmi_tau1"] else float("nan")
            m[f"{key}_min_after_tau1_over_tau1"] = d["min_after_1"] / d["nmi_tau1"] if d["nmi_tau1"] else float("nan")
            tables[f"horizon curve, {entry}"] = r.to_frame().to_dict("records")
            figures.append((f"horizon curve, {entry}", r.figure()))
        branch = [out[f"branch-{e}"] for e in config.branch_models]
        m["branch_accuracy"] = [float(r.accuracy) for r in branch]
        m["branch_ratio"] = [float(r.ratio) for r in branch]
        m["branch_control_ratio"] = [float(r.control_ratio) for r in branch]
        # null-corrected ratio: inf where the decoy's corrected MI is not above 0 (left out then)
        m["branch_ratio_corrected"] = [float(r.ratio_corrected) for r in branch if np.isfinite(r.ratio_corrected)]
        tables["branch awareness (raw plug-in ratio I(Z_H; Z_alt) / I(Z_H; Z_decoy))"] = [
            {"model": e, "N": config.branch_run.get("n_examples"), "accuracy": r.accuracy, "mi_alt": r.mi_alt,
             "mi_decoy": r.mi_decoy, "mi_generated": r.mi_generated, "null_alt": r.null_alt,
             "null_decoy": r.null_decoy, "ratio": r.ratio, "ratio_corrected": r.ratio_corrected,
             "control_ratio": r.control_ratio, "n_solved": r.n} for e, r in zip(config.branch_models, branch)]
        bm = out["map"]
        m.update(map_measurements(bm))
        tables[f"block x layer map, null-corrected nMI(B_k^l; Z_T^L) ({config.map_model})"] = [
            {"block": b, **{f"layer {l}": float(v) for l, v in zip(bm.layers, row)}}
            for b, row in zip(bm.blocks, np.asarray(bm.nmi_t))]
        figures.append((f"block x layer map ({config.map_model})", bm.figure()))
        notes = ("MI in nats, plug-in with a 20-permutation shuffled-pairing null (fewer in quick); the branch ratio is "
                 "the paper's raw plug-in ratio. Models: " + ("the zoo's planning entries" if config.train is None
                                                               else f"trained in stages with {config.train}")
                 + f"; map: {config.map_model} on {config.map_texts} texts.")
        return Outcome(measured=m, tables=tables, figures=figures, notes=notes)


RECIPE = PlanningRecipe
