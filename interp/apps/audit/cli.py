"""``interp audit``: load a model, run the selected checks, write an HTML + JSON report.

Exit codes (:data:`interp.apps.audit.gate.EXIT_CODES`): 0 pass (every check ran or was skipped, no threshold failed),
1 a check or a checkpoint errored (what could be written is written), 2 bad input (nothing audited), 3 a
``--fail-if`` threshold failed.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional

import typer

from .gate import EXIT_BAD_INPUT

DEFAULT_MODEL = "zoo:smollm2-135m"


def _fail(msg: str, code: int = EXIT_BAD_INPUT) -> None:
    typer.echo(f"error: {' '.join(msg.split())}", err=True)
    raise typer.Exit(code)


def _parse_sets(items: list[str] | None) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        check, dot, field = key.strip().partition(".")
        if not sep or not dot or not check or not field:
            raise ValueError(f"--set expects CHECK.FIELD=VALUE (e.g. heads.fraction=0.2), got {item!r}")
        out.setdefault(check, {})[field] = value.strip()
    return out


def _check_line(c: Any) -> str:
    """``  name: status (1.2 s): reason`` (the reason on the same line, for skipped and errored checks)."""
    name, status, seconds, reason = ((c["name"], c["status"], c["seconds"], c.get("reason")) if isinstance(c, dict)
                                     else (c.name, c.status, c.seconds, c.reason))
    tail = f": {' '.join(str(reason).split())}" if reason and status != "ok" else ""
    return f"  {name}: {status} ({seconds:.1f} s){tail}"


def audit(models: Optional[List[str]] = typer.Argument(None, help=f"Model spec(s): zoo:NAME, a local Hugging Face folder "
                                                                  f"or a hub name (default {DEFAULT_MODEL}); several "
                                                                  "checkpoints (or a run folder holding them) give "
                                                                  "one report each plus an index with trends."),
          checks: str = typer.Option("default", "--checks", "-c",
                                     help="Comma-separated checks, 'default' (those that need no options) or 'all' "
                                          "(every check: those that do not apply are skipped)."),
          out: str = typer.Option("audit-report", "--out", "-o", help="Output folder for index.html and results.json."),
          force: bool = typer.Option(False, "--force", help="Write into a folder that holds no earlier report, or "
                                     "through a symbolic link, replacing same-named files (nothing else is "
                                     "removed; a file is never replaced by a folder)."),
          backend: str = typer.Option("torch", help="torch | nnsight | transformer_lens"),
          texts: Optional[str] = typer.Option(None, help="Text file, one input per line (default: built-in set)."),
          max_texts: Optional[int] = typer.Option(None, help="Use only the first N texts."),
          dtype: Optional[str] = typer.Option(None, help="Load the weights in this dtype (e.g. float32, bfloat16)."),
          device: Optional[str] = typer.Option(None, help="Device to load the model on (e.g. cpu, cuda)."),
          tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer to use (a folder, zoo:NAME or "
                                                  "hub name), for checkpoints saved without one."),
          set_: Optional[List[str]] = typer.Option(None, "--set", "-s",
                                                   help="Override a check option: CHECK.FIELD=VALUE (repeatable)."),
          fail_if: Optional[List[str]] = typer.Option(None, "--fail-if", help="Fail (exit 3) when a headline metric "
                                                      "meets a condition, e.g. 'heads.flagged_fraction > 0.2' "
                                                      "(repeatable)."),
          steps: Optional[str] = typer.Option(None, "--steps", help="Training steps of the checkpoints, comma-separated "
                                              "in the order given (default: trainer_state.json or the folder name)."),
          compare: Optional[str] = typer.Option(None, "--compare", help="Another checkpoint: write a diff report of "
                                                "MODEL (A) against this one (B)."),
          engine: str = typer.Option("local", help="local | ray: run one audit per model as a Ray task."),
          list_checks: bool = typer.Option(False, "--list", help="List the available checks and exit.")) -> None:
    """Audit a model: run checks (inactive heads, steering, ...) and write DIR/index.html and DIR/results.json.

    Exit codes: 0 pass; 1 a check or a checkpoint errored; 2 bad input; 3 a --fail-if threshold failed.
    """
    from interp.checks import AuditData, configure
    from .gate import parse_thresholds
    from .multi import expand_specs, parse_steps, resolve_tokenizer
    from .registry import available_checks, get_check, parse_checks
    from .report import prepare_output

    if list_checks:
        for name in available_checks():
            try:
                cls = get_check(name)
                typer.echo(f"{name}\t{getattr(cls, 'title', '')}")
            except (ImportError, TypeError) as exc:
                typer.echo(f"{name}\t(broken: {exc})")
        return
    try:
        names = parse_checks(checks)
        explicit = checks.strip().lower() not in ("default", "all")
        options = _parse_sets(set_)
        extra = set(options) - set(names)
        if extra:
            raise ValueError(f"--set given for checks that are not selected: {', '.join(sorted(extra))}")
        metrics: dict[str, dict[str, str]] = {}
        configs: dict[str, object] = {}
        for name in names:  # load every plug-in and parse its options once, into the config it runs with
            cls = get_check(name)
            cfg = configs[name] = configure(cls, options.get(name, {}))
            missing = cls(cfg).missing() if callable(getattr(cls, "missing", None)) else None
            if missing and explicit:  # named on purpose but cannot run: bad input (with 'all' it is skipped)
                raise ValueError(f"check {name!r}: {missing}")
            metrics[name] = dict(getattr(cls, "METRICS", {}) or {})
        thresholds = parse_thresholds(fail_if, metrics)
        if engine not in ("local", "ray"):
            raise ValueError(f"--engine must be local or ray, got {engine!r}")
        from ...validation import check_device

        check_device(device, "--device")
        if tokenizer is not None:
            resolve_tokenizer(tokenizer)
        specs = expand_specs(models or [DEFAULT_MODEL])
        if compare is not None:
            if len(specs) != 1:
                raise ValueError(f"--compare diffs one checkpoint against another; give one MODEL, got {len(specs)}")
            specs = [specs[0], compare]
        step_list = parse_steps(steps, len(specs))
        multi = len(specs) > 1 or engine == "ray"
        out_path = None if multi else prepare_output(out, overwrite=force)
        data = AuditData.from_file(texts) if texts else AuditData.builtin()
        if max_texts is not None:
            if max_texts < 1:
                raise ValueError(f"--max-texts must be at least 1, got {max_texts}")
            data = data.head(max_texts)
    except (ValueError, ImportError, TypeError) as exc:
        _fail(str(exc))
        return
    load_kwargs = {k: v for k, v in (("dtype", dtype), ("device", device)) if v is not None}
    if multi:
        _audit_many(specs, names, data, out, configs, backend, engine, load_kwargs, force, thresholds, step_list,
                    tokenizer, compare is not None)
        return
    from .multi import ModelLoadError, load_model
    from .runner import run_audit

    spec = specs[0]
    typer.echo(f"loading {spec} (backend {backend}) ...", err=True)
    t0 = time.perf_counter()
    try:
        m = load_model(spec, backend, load_kwargs, tokenizer)
    except ModelLoadError as exc:
        _fail(str(exc))
        return
    except ValueError as exc:  # the --tokenizer could not be read
        _fail(str(exc))
        return
    load_s = time.perf_counter() - t0
    typer.echo(f"running {', '.join(names)} on {len(data.texts)} texts ...", err=True)
    try:
        report = run_audit(m, names, data, None, configs, spec=spec, timings={"load_model": load_s},
                           thresholds=thresholds, step=step_list[0] if step_list else None)
        report.write(out_path, overwrite=force)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
        return
    for c in report.checks:
        typer.echo(_check_line(c), err=True)
    for t in report.thresholds:
        typer.echo(f"  fail-if {t['expr']}: {'FAILED (' + t['reason'] + ')' if t['failed'] else 'pass'}", err=True)
    typer.echo(f"wrote {out_path / 'index.html'} and {out_path / 'results.json'}")
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def _audit_many(specs, names, data, out, options, backend, engine, load_kwargs, force, thresholds, steps, tokenizer,
                compare) -> None:
    from .multi import exit_code_of, run_audits

    what = "comparing 2 checkpoints" if compare else f"auditing {len(specs)} checkpoints"
    typer.echo(f"{what} with {', '.join(names)} on {len(data.texts)} texts (engine {engine}) ...", err=True)
    try:
        summaries = run_audits(specs, names, data, out, options, backend=backend, engine=engine,
                               load_kwargs=load_kwargs, overwrite=force, thresholds=thresholds, steps=steps,
                               tokenizer=tokenizer, compare=compare)
    except Exception as exc:  # noqa: BLE001 - an unwritable output or a broken engine is reported, not a traceback
        _fail(f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc))
        return
    for s in summaries:
        step = f" (step {s['step']})" if s.get("step") is not None else ""
        if s.get("error"):
            typer.echo(f"  {s['spec']}{step}: error: {s['error']}", err=True)
            continue
        typer.echo(f"  {s['spec']}{step}:", err=True)
        for c in s["checks"]:
            typer.echo("  " + _check_line(c), err=True)
        for t in s.get("thresholds", []):
            if t["failed"]:
                typer.echo(f"    fail-if {t['expr']}: FAILED ({t['reason']})", err=True)
    typer.echo(f"wrote {out}/index.html and one report per checkpoint")
    code = exit_code_of(summaries)
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the ``audit`` command to the ``interp`` CLI."""
    app.command(name="audit")(audit)


__all__ = ["register", "audit", "DEFAULT_MODEL"]
