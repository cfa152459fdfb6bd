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

from interp.configs import ConfigError, config_from_dict, config_to_dict, digest
from interp.io import OutputError, SerializationError
from interp.progress import progress
from interp.stages import Stages, code_version
from .claims import ClaimsError
from .recipe import Outcome, Recipe, get_recipe, resolve
from .record import ReproductionRecord, committed_record, compare, json_ready, verdict_rows

ENGINES = ("local", "ray")


@dataclass
class Run:
    """One paper's run: its record, the figures of the report, and (with ``check``) the differences from the
    committed record (``None``: not checked; ``[]``: identical within tolerance)."""

    record: ReproductionRecord
    figures: list[tuple[str, Any]] = field(default_factory=list)
    differences: list[str] | None = None
    #: a problem with what the run was given (claims file, committed record): the CLI exits 2
    input_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.record.error is None and not self.differences


def _versions() -> dict[str, str]:
    import interp
    from interp.apps.audit.report import environment

    return {"interp": interp.__version__, **environment()}


def command_line(name: str, preset: str, engine: str = "local", threads: int = 1) -> str:
    """The command that reruns a record."""
    cmd = ["interp", "reproduce", name, "--preset", preset]
    if engine != "local":
        cmd += ["--engine", engine]
    if threads != DEFAULT_THREADS:
        cmd += ["--threads", str(threads)]
    return shlex.join(cmd)


#: the thread count a run uses unless told otherwise (the committed records' setting)
DEFAULT_THREADS = 1


def _stages(recipe: type[Recipe], config: Any, fresh: bool = False, on_mismatch: str | None = None) -> Stages:
    return Stages(f"reproduce/{recipe.name}", config, code=recipe.code_sources(), fresh=fresh, on_mismatch=on_mismatch)


def _unit_task(name: str, config: dict, unit: Any, cache_dir: str | None, fresh: bool, threads: int = DEFAULT_THREADS,
               on_mismatch: str | None = None) -> Any:
    """One unit, on a Ray worker: rebuild the recipe and its typed config from plain data, run the unit under
    the run's thread count and deterministic settings."""
    if cache_dir is not None:
        os.environ["INTERP_CACHE_DIR"] = cache_dir
    from interp.progress import set_progress
    from .provenance import numeric_settings

    set_progress(False)
    recipe = get_recipe(name)
    cfg = config_from_dict(recipe.Config, config, f"{name} config")
    with numeric_settings(threads):
        return recipe().run_unit(cfg, unit, _stages(recipe, cfg, fresh, on_mismatch))


def _run_units(recipe: type[Recipe], config: Any, engine: str, fresh: bool, threads: int = DEFAULT_THREADS,
               on_mismatch: str | None = None) -> list[Any]:
    inst = recipe()
    units = inst.units(config)
    if engine == "local":
        stages = _stages(recipe, config, fresh, on_mismatch)
        return [inst.run_unit(config, u, stages) for u in progress(units, desc=f"{recipe.name} units")]
    from interp.apps.ray_engine import ensure_ray

    ray = ensure_ray()
    task = ray.remote(num_cpus=threads)(_unit_task)
    cfg = config_to_dict(config)
    cache = os.environ.get("INTERP_CACHE_DIR")
    return ray.get([task.remote(recipe.name, cfg, u, cache, fresh, threads, on_mismatch) for u in units])


#: errors in what the user or the repository gives a run (a claims file, a committed record, an option):
#: the CLI reports them as one ``error:`` line and exit status 2
INPUT_ERRORS: tuple[type[BaseException], ...] = (ClaimsError, SerializationError, ConfigError, OutputError)


def run_recipe(name: str, preset: str = "quick", config: Any = None, engine: str = "local", check: bool = False,
               fresh: bool = False, threads: int = DEFAULT_THREADS, on_mismatch: str | None = None) -> Run:
    """Run one recipe and judge its claims (no files written; see :func:`reproduce`).

    ``config`` replaces the preset's config (a ``Config`` instance; the record still names the preset);
    ``fresh`` recomputes every stage; ``check`` compares the run with the committed record of the preset.
    Every unit runs with ``threads`` threads (torch, BLAS, OpenMP) and torch's deterministic algorithms;
    the record stores them with the rest of :func:`interp.apps.reproduce.provenance.provenance`. ``on_mismatch``:
    what a stored stage that fails its check does (:class:`interp.stages.Stages`). A malformed claims file
    raises :class:`ClaimsError` before any work; anything the recipe raises, and any measured value that
    is not a number, string, list or mapping of them (tensors and arrays are converted), becomes the
    run's ``error`` (every verdict ``error``).
    """
    from .provenance import numeric_settings, provenance

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    recipe = get_recipe(name)
    claims = recipe.claims()  # a malformed claims file fails before any work
    cfg = recipe.preset(preset) if config is None else config
    if not isinstance(cfg, recipe.Config):
        raise TypeError(f"recipe {name!r} takes a {recipe.Config.__name__}, got {type(cfg).__name__}")
    t0, started = time.perf_counter(), time.time()
    error = None
    measured: dict = {}
    tables: dict = {}
    notes = ""
    figures: list = []
    with numeric_settings(threads):
        try:
            outputs = _run_units(recipe, cfg, engine, fresh, threads, on_mismatch)
            outcome = recipe().combine(cfg, outputs)
            if not isinstance(outcome, Outcome):
                raise TypeError(f"recipe {name!r}: combine() returned a {type(outcome).__name__}, not an Outcome")
            if not isinstance(outcome.measured, dict):
                raise TypeError(f"recipe {name!r}: Outcome.measured is a {type(outcome.measured).__name__}, not a dict")
            measured = json_ready(outcome.measured, "measured")
            tables = json_ready(outcome.tables, "tables")
            notes, figures = str(outcome.notes or ""), list(outcome.figures)
        except KeyboardInterrupt:
            raise
        except Exception:  # noqa: BLE001 - a crash is recorded as the verdict "error", never "not reproduced"
            error = traceback.format_exc(limit=20)
            measured, tables, notes, figures = {}, {}, "", []
        where = provenance(threads)
        # a recipe whose config sets its own thread count (heads, planning, repit: threads; gavel, tcpe: num_threads)
        # runs its units with that count: recorded beside the run's
        own = {k: getattr(cfg, k) for k in ("threads", "num_threads") if hasattr(cfg, k)}
        if own:
            where["config_threads"] = own
    seconds = time.perf_counter() - t0
    resumed = 0.0 if fresh else _stages(recipe, cfg).stored_seconds(before=started)
    record = ReproductionRecord(
        paper=recipe.name, title=recipe.title, preset=preset, config=config_to_dict(cfg),
        config_type=f"{recipe.Config.__module__}.{recipe.Config.__qualname__}", config_key=digest(cfg),
        code_version=code_version(*recipe.code_sources()), measured=measured,
        verdicts=verdict_rows(claims, measured if error is None else None,
                              None if error is None else error.strip().splitlines()[-1]),
        tables=tables, notes=notes, error=error, seconds=round(seconds, 1), resumed_seconds=round(resumed, 1),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), versions=_versions(),
        command=command_line(name, preset, engine, threads), provenance=where)
    run = Run(record, figures)
    if check:
        try:
            ref = committed_record(recipe, preset)
        except (SerializationError, TypeError, OSError) as exc:
            run.input_error = f"{name}: the committed {preset} record cannot be read: {exc}"
            run.differences = [run.input_error]
            return run
        run.differences = (["no committed record for this preset (benchmarks/{}/records/{}/)".format(name, preset)]
                           if ref is None else compare(record, ref, claims))
    return run


def failed_run(name: str, preset: str, exc: BaseException, engine: str = "local",
               threads: int = DEFAULT_THREADS) -> Run:
    """The run of a paper that could not start (its recipe does not load, its claims file is malformed):
    an ``error`` record without verdicts, so that the other papers of ``all`` still run and report."""
    try:
        title = get_recipe(name).title
    except Exception:  # noqa: BLE001 - the recipe itself may be what fails
        title = ""
    msg = f"{type(exc).__name__}: {exc}"
    record = ReproductionRecord(
        paper=name, title=title, preset=preset, config={}, config_type="", config_key="", code_version="",
        measured={}, verdicts=[], error=msg + "\n", created=_dt.datetime.now(_dt.timezone.utc).isoformat(
            timespec="seconds"), versions=_versions(), command=command_line(name, preset, engine, threads))
    return Run(record, [], input_error=str(exc) if isinstance(exc, INPUT_ERRORS) else None)


def reproduce(papers: Sequence[str] | str = "all", preset: str = "quick", out: str | Path | None = None,
              engine: str = "local", check: bool = False, fresh: bool = False, overwrite: bool = False,
              on_done: Any = None, threads: int = DEFAULT_THREADS, on_mismatch: str | None = None) -> list[Run]:
    """Run the recipes ``papers`` (``"all"`` or names) with ``preset``; write the report to ``out`` after each
    paper (so an interrupted ``all`` keeps what finished; rerunning resumes from the stored stages).

    Each paper is isolated from the others: one that cannot start (a malformed claims file, a recipe that
    does not import) or that raises becomes an ``error`` record and the next paper runs. ``on_done(run)``
    is called after each paper (the CLI prints a line there).
    """
    from .report import prepare_output, write_report

    names = resolve(papers)
    if out is not None:
        out = prepare_output(out, overwrite=overwrite)  # refuse a bad folder before any work
    runs: list[Run] = []
    for name in names:
        try:
            run = run_recipe(name, preset, engine=engine, check=check, fresh=fresh, threads=threads,
                             on_mismatch=on_mismatch)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - one paper's failure never stops the others
            run = failed_run(name, preset, exc, engine, threads)
        runs.append(run)
        if out is not None:
            write_report(out, runs, overwrite=overwrite)
        if on_done is not None:
            on_done(run)
    return runs


def update_record(run: Run) -> Path:
    """Write a run's record as the committed record of its preset (``benchmarks/<paper>/records/<preset>/``).

    Refused (``ValueError``) for a run that raised and for a run whose code had uncommitted changes (its
    record could not be traced to a commit)."""
    recipe = get_recipe(run.record.paper)
    if run.record.error is not None:
        raise ValueError(f"{run.record.paper}: the run raised; an error is not committed as a record")
    where = run.record.provenance or {}
    if where.get("dirty"):
        files = where.get("dirty_files") or []
        raise ValueError(f"{run.record.paper}: the run's code has uncommitted changes ({', '.join(files[:5])}"
                         f"{', ...' if len(files) > 5 else ''}); a committed record names the commit it ran: commit "
                         "first, then rerun with --update-record")
    folder = recipe.records_dir() / run.record.preset
    run.record.save(folder)
    return folder


__all__ = ["DEFAULT_THREADS", "ENGINES", "INPUT_ERRORS", "Run", "command_line", "failed_run", "reproduce", "run_recipe",
           "update_record"]
