"""``interp reproduce gavel``: the digest's CPU-scale CE world (section 2's validation recipe) end to end: the
CE-world LM trained by next-token prediction, CE detectors on its attention readouts, the rule
``all of {A} and 1 of {B, C}`` against the monolithic classifier and keywords on 200 positive / 200 hard-negative
/ 200 random-negative conversations, and the monitor inside ``model.generate``.

The SmolLM2-135M runs of docs/gavel.md (template CE library, unseen rule, own replies, monitor) are not part of
a preset (about an hour on 2 cores, see ``cost``); :func:`interp.benchmarks.gavel.smollm2.run_smollm2` runs them
through stages.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from interp.probes.gavel import DetectorConfig
from interp.apps.reproduce import Outcome, Recipe

from .ce_world import FAMILIES, CEWorldConfig, build_ce_world_model, ce_world_detector, run_ce_world, \
    run_ce_world_monitor


#: our earlier detector behaviour (issue #35): random window split, no class cap, best epoch, one joined span
#: with an overlapping tail window, calibrated patience at inference, every calibration dialogue counted
OURS = {"split": "random", "balance": "none", "restore": "best", "window_layout": "overlap",
        "inference_patience": True, "calibration": "all"}


def _detector(seed: int = 0, **kw) -> DetectorConfig:
    return DetectorConfig(**{"hidden": 64, "rnn_layers": 2, "lr": 3e-3, "max_epochs": 25, "seed": seed, **kw})


@dataclass
class GavelConfig:
    """The CE-world validation (defaults: the run of docs/gavel.md, Validation 1).

    ``world``: the LM (the zoo entry ``gavel-ce-world``'s parameters); ``n_train`` training conversations per CE
    (plus as many CE-free), ``n_cal`` calibration dialogues per CE, ``n_test`` test conversations per kind
    (positive, hard negative, random negative); ``detector``: the window GRU (2 x 64 on both layers' readouts);
    the monitor check trains its own detector on ``monitor_n_train`` / ``monitor_n_cal`` and continues
    ``monitor_harmless`` random negatives.
    """

    world: CEWorldConfig = field(default_factory=CEWorldConfig)
    n_train: int = 150
    n_cal: int = 50
    n_test: int = 200
    detector: DetectorConfig = field(default_factory=_detector)
    monitor_n_train: int = 80
    monitor_n_cal: int = 30
    monitor_harmless: int = 40
    seed: int = 0
    num_threads: int = 1  #: torch CPU threads during the run (tiny models: one thread is fastest on a shared machine)

    def __post_init__(self) -> None:
        for name in ("n_train", "n_cal", "n_test", "monitor_n_train", "monitor_n_cal", "monitor_harmless",
                     "num_threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GavelConfig.{name} must be a positive integer, got {v!r}")


class GavelRecipe(Recipe):
    name = "gavel"
    title = "GAVEL: Towards Rule-Based Safety Through Activation Monitoring"
    method = "probes/gavel/"
    doc = "docs/gavel.md"
    notebook = "notebooks/gavel.ipynb"
    Config = GavelConfig
    presets = {
        # every stage (LM, detectors, calibration, rule evaluation, baselines, monitor) on a small world
        "quick": GavelConfig(world=CEWorldConfig(steps=150, min_phrase_accuracy=0.0), n_train=20, n_cal=8,
                             n_test=30, detector=_detector(max_epochs=4), monitor_n_train=15, monitor_n_cal=6,
                             monitor_harmless=5),
        # the digest's CE world as documented (docs/gavel.md, Validation 1)
        "full": GavelConfig(),
    }
    cost = {"quick": "about 10 s CPU",
            "full": "about 45 s CPU (the detector trained twice: official and ours), 4 min wall on the shared 2 cores (the SmolLM2 runs: about 1 h, not a preset)"}
    code = ("interp.benchmarks.gavel", "interp.probes.gavel")

    def run_unit(self, config: GavelConfig, unit: None, stages) -> dict:
        from interp.training import limit_threads

        with limit_threads(config.num_threads, blas=False):
            return self._run(config, stages)

    def _run(self, config: GavelConfig, stages) -> dict:
        import json

        import interp

        def build(tmp):
            metrics = build_ce_world_model(tmp, dataclasses.asdict(config.world))
            (tmp / "build.json").write_text(json.dumps(metrics))

        folder = stages.path("lm", build)
        model = interp.load(str(folder), backend="torch")
        lm = json.loads((folder / "build.json").read_text())
        res = stages("validation", lambda: run_ce_world(model, n_train=config.n_train, n_cal=config.n_cal,
                                                        n_test=config.n_test, seed=config.seed,
                                                        detector_config=config.detector))
        # the same run with every detector option at our earlier behaviour, reported beside the official one
        ours = dataclasses.replace(config.detector, **OURS)
        res_ours = stages("validation-ours", lambda: run_ce_world(model, n_train=config.n_train, n_cal=config.n_cal,
                                                                  n_test=config.n_test, seed=config.seed,
                                                                  detector_config=ours))

        def monitor():
            det = ce_world_detector(model, n_train=config.monitor_n_train, n_cal=config.monitor_n_cal,
                                    seed=config.seed, detector_config=config.detector)
            return run_ce_world_monitor(model, det, n_harmless=config.monitor_harmless)
        mon = stages("monitor", monitor)
        return {"lm": lm, "validation": res, "validation_ours": res_ours, "monitor": mon}

    def combine(self, config: GavelConfig, outputs: list) -> Outcome:
        (out,) = outputs
        res, mon, lm = out["validation"], out["monitor"], out["lm"]
        rows = {r["method"]: r for r in res.rules}
        g, m = rows["gavel"], rows["monolithic"]
        measured = {
            "phrase_accuracy": float(lm["phrase_accuracy"]),
            "min_window_auc": float(min(res.window_auc.values())),
            "rule_auc": float(g["auc"]), "fpr_hard": float(g["fpr_hard"]), "fpr_random": float(g["fpr_random"]),
            "balanced_accuracy": float(g["balanced_accuracy"]),
            "monolithic_fpr_hard": float(m["fpr_hard"]),
            "monolithic_fpr_hard_excess": float(m["fpr_hard"] - g["fpr_hard"]),
            "keywords_auc": float(rows["keywords"]["auc"]),
            "monitor_completed_phrase": float(bool(mon["completed_phrase"])),
            "monitor_blocked_mid": float(bool(mon["blocked_mid"])),
            "monitor_harmless_fired_frac": mon["harmless_fired"] / mon["harmless"],
        }
        go = {r["method"]: r for r in out["validation_ours"].rules}["gavel"]
        measured.update({"ours_rule_auc": float(go["auc"]), "ours_fpr_hard": float(go["fpr_hard"]),
                         "ours_tpr": float(go["tpr"]), "ours_balanced_accuracy": float(go["balanced_accuracy"]),
                         "ours_min_window_auc": float(min(out["validation_ours"].window_auc.values()))})
        cols = ("method", "auc", "balanced_accuracy", "tpr", "fpr", "fpr_hard", "fpr_random")
        tables = {
            "window AUC per CE (test conversations)": [{"ce": c, "window_auc": v} for c, v in res.window_auc.items()],
            "rule all of {A} and 1 of {B, C}: GAVEL, monolithic GRU, keywords": [
                {k: r[k] for k in cols if k in r} for r in res.rules],
            "GAVEL with the official detector protocol vs ours (issue #35)": [
                {"protocol": name, **{k: r[k] for k in cols[1:] if k in r}}
                for name, r in (("official (default)", g), ("ours (DetectorConfig options)", go))],
            "calibration (Youden's J)": [{"ce": c, "threshold": res.thresholds[c], "patience": res.patience[c],
                                          "threshold (ours)": out["validation_ours"].thresholds[c],
                                          "patience (ours)": out["validation_ours"].patience[c]}
                                         for c in FAMILIES],
            "monitor (block inside model.generate)": [{
                "steered positive: model completed the B phrase": bool(mon["completed_phrase"]),
                "blocked": bool(mon["blocked"]), "stop token": mon["stop_token"],
                "fired CEs": ",".join(mon["fired_ces"]),
                "harmless fired": f"{mon['harmless_fired']} / {mon['harmless']}"}],
        }
        notes = (f"CE-world LM: phrase accuracy {lm['phrase_accuracy']:.3f} after {config.world.steps} steps; "
                 f"{res.sizes['train_windows']} training windows, {res.sizes['calibration']} calibration dialogues, "
                 f"{res.sizes['test']} test conversations. The monitor-overhead number of docs/gavel.md is a speed "
                 "benchmark (benchmarks/speed/gavel_monitor.py), not a claim of this recipe: wall-clock ratios on "
                 "the shared machine spread too widely to judge.")
        return Outcome(measured=measured, tables=tables, figures=[("rule metrics per method", res.figure())],
                       notes=notes)


RECIPE = GavelRecipe
