"""Running recipes: :func:`reproduce` (one paper or all), the local and Ray engines, and the records.

``reproduce("repit", preset="quick", out="repro")`` runs the recipe (resuming stored stages), judges every
claim, writes ``repro/index.html`` (the report, self-contained) and ``repro/<paper>/`` (the record) through
the toolkit's writer rule (writer ``interp reproduce``), and returns the records. An exception inside a
recipe is caught and recorded: every claim of that paper is then ``error`` (never ``not reproduced``).
"""
from __future__ import annotations

import datetime as _dt
import os
import shlex
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..configs import config_from_dict, config_to_dict, digest
from ..progress import progress
from ..stages import Stages, code_version
from .recipe import Outcome, Recipe, get_recipe, resolve
from .record import ReproductionRecord, committed_record, compare, verdict_rows

ENGINES = ("local", "ray")


@dataclass
class Run:
    """One paper's run: its record, the figures of the report, and (with ``check``) the differences from the
    committed record (``None``: not checked; ``[]``: identical within tolerance)."""

    record: ReproductionRecord
    figures: list[tuple[str, Any]] = field(default_factory=list)
    differences: list[str] | None = None

    @property
    def ok(self) -> bool:
        return self.record.error is None and not self.differences


def _versions() -> dict[str, str]:
    import interp
    from ..audit.report import environment

    return {"interp": interp.__version__, **environment()}


def command_line(name: str, preset: str, engine: str = "local") -> str:
    """The command that reruns a record."""
    cmd = ["interp", "reproduce", name, "--preset", preset]
    if engine != "local":
        cmd += ["--engine", engine]
    return shlex.join(cmd)


def _stages(recipe: type[Recipe], config: Any, fresh: bool = False) -> Stages:
    return Stages(f"reproduce/{recipe.name}", config, code=recipe.code_sources(), fresh=fresh)


def _unit_task(name: str, config: dict, unit: Any, cache_dir: str | None, fresh: bool) -> Any:
    """One unit, on a Ray worker: rebuild the recipe and its typed config from plain data, run the unit."""
    if cache_dir is not None:
        os.environ["INTERP_CACHE_DIR"] = cache_dir
    from ..progress import set_progress

    set_progress(False)
    recipe = get_recipe(name)
    cfg = config_from_dict(recipe.Config, config, f"{name} config")
    return recipe().run_unit(cfg, unit, _stages(recipe, cfg, fresh))


def _run_units(recipe: type[Recipe], config: Any, engine: str, fresh: bool) -> list[Any]:
    inst = recipe()
    units = inst.units(config)
    if engine == "local":
        stages = _stages(recipe, config, fresh)
        return [inst.run_unit(config, u, stages) for u in progress(units, desc=f"{recipe.name} units")]
    from ..store.ray_engine import ensure_ray

    ray = ensure_ray()
    task = ray.remote(num_cpus=1)(_unit_task)
    cfg = config_to_dict(config)
    cache = os.environ.get("INTERP_CACHE_DIR")
    return ray.get([task.remote(recipe.name, cfg, u, cache, fresh) for u in units])


def run_recipe(name: str, preset: str = "quick", config: Any = None, engine: str = "local", check: bool = False,
               fresh: bool = False) -> Run:
    """Run one recipe and judge its claims (no files written; see :func:`reproduce`).

    ``config`` replaces the preset's config (a ``Config`` instance; the record still names the preset);
    ``fresh`` recomputes every stage; ``check`` compares the run with the committed record of the preset.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    recipe = get_recipe(name)
    claims = recipe.claims()  # a malformed claims file fails before any work
    cfg = recipe.preset(preset) if config is None else config
    if not isinstance(cfg, recipe.Config):
        raise TypeError(f"recipe {name!r} takes a {recipe.Config.__name__}, got {type(cfg).__name__}")
    t0, started = time.perf_counter(), time.time()
    outcome: Outcome | None = None
    error = None
    try:
        outputs = _run_units(recipe, cfg, engine, fresh)
        outcome = recipe().combine(cfg, outputs)
        if not isinstance(outcome, Outcome):
            raise TypeError(f"recipe {name!r}: combine() returned a {type(outcome).__name__}, not an Outcome")
    except KeyboardInterrupt:
        raise
    except Exception:  # noqa: BLE001 - a crash is recorded as the verdict "error", never "not reproduced"
        error = traceback.format_exc(limit=20)
        outcome = None
    seconds = time.perf_counter() - t0
    resumed = 0.0 if fresh else _stages(recipe, cfg).stored_seconds(before=started)
    measured = config_to_dict(outcome.measured) if outcome is not None else {}
    record = ReproductionRecord(
        paper=recipe.name, title=recipe.title, preset=preset, config=config_to_dict(cfg),
        config_type=f"{recipe.Config.__module__}.{recipe.Config.__qualname__}", config_key=digest(cfg),
        code_version=code_version(*recipe.code_sources()), measured=measured,
        verdicts=verdict_rows(claims, measured if outcome is not None else None,
                              None if error is None else error.strip().splitlines()[-1]),
        tables=config_to_dict(outcome.tables) if outcome is not None else {},
        notes=outcome.notes if outcome is not None else "", error=error, seconds=round(seconds, 1),
        resumed_seconds=round(resumed, 1),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), versions=_versions(),
        command=command_line(name, preset, engine))
    run = Run(record, list(outcome.figures) if outcome is not None else [])
    if check:
        ref = committed_record(recipe, preset)
        run.differences = (["no committed record for this preset (benchmarks/{}/records/{}/)".format(name, preset)]
                           if ref is None else compare(record, ref, claims))
    return run


def reproduce(papers: Sequence[str] | str = "all", preset: str = "quick", out: str | Path | None = None,
              engine: str = "local", check: bool = False, fresh: bool = False, overwrite: bool = False,
              on_done: Any = None) -> list[Run]:
    """Run the recipes ``papers`` (``"all"`` or names) with ``preset``; write the report to ``out`` after each
    paper (so an interrupted ``all`` keeps what finished; rerunning resumes from the stored stages).

    ``on_done(run)`` is called after each paper (the CLI prints a line there).
    """
    from .report import prepare_output, write_report

    names = resolve(papers)
    if out is not None:
        out = prepare_output(out, overwrite=overwrite)  # refuse a bad folder before any work
    runs: list[Run] = []
    for name in names:
        run = run_recipe(name, preset, engine=engine, check=check, fresh=fresh)
        runs.append(run)
        if out is not None:
            write_report(out, runs, overwrite=overwrite)
        if on_done is not None:
            on_done(run)
    return runs


def update_record(run: Run) -> Path:
    """Write a run's record as the committed record of its preset (``benchmarks/<paper>/records/<preset>/``)."""
    recipe = get_recipe(run.record.paper)
    if run.record.error is not None:
        raise ValueError(f"{run.record.paper}: the run raised; an error is not committed as a record")
    folder = recipe.records_dir() / run.record.preset
    run.record.save(folder)
    return folder


__all__ = ["ENGINES", "Run", "command_line", "reproduce", "run_recipe", "update_record"]
