"""``interp audit``: load a model, run the selected checks, write an HTML + JSON report."""
from __future__ import annotations

import time
from typing import List, Optional

import typer

DEFAULT_MODEL = "zoo:smollm2-135m"


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
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


def audit(models: Optional[List[str]] = typer.Argument(None, help=f"Model spec(s): zoo:NAME, a local Hugging Face folder "
                                                                  f"or a hub name (default {DEFAULT_MODEL}); several "
                                                                  "give one report each plus an index page."),
          checks: str = typer.Option("default", "--checks", "-c",
                                     help="Comma-separated checks, 'default' (those that need no options) or 'all'."),
          out: str = typer.Option("audit-report", "--out", "-o", help="Output folder for index.html and results.json."),
          force: bool = typer.Option(False, "--force", help="Write into a folder that holds no earlier report, or "
                                     "through a symbolic link, replacing same-named files (nothing else is "
                                     "removed; a file is never replaced by a folder)."),
          backend: str = typer.Option("torch", help="torch | nnsight | transformer_lens"),
          texts: Optional[str] = typer.Option(None, help="Text file, one input per line (default: built-in set)."),
          max_texts: Optional[int] = typer.Option(None, help="Use only the first N texts."),
          dtype: Optional[str] = typer.Option(None, help="Load the weights in this dtype (e.g. float32, bfloat16)."),
          device: Optional[str] = typer.Option(None, help="Device to load the model on (e.g. cpu, cuda)."),
          set_: Optional[List[str]] = typer.Option(None, "--set", "-s",
                                                   help="Override a check option: CHECK.FIELD=VALUE (repeatable)."),
          engine: str = typer.Option("local", help="local | ray: run one audit per model as a Ray task."),
          list_checks: bool = typer.Option(False, "--list", help="List the available checks and exit.")) -> None:
    """Audit a model: run checks (inactive heads, ...) and write DIR/index.html and DIR/results.json."""
    from .base import AuditData, configure
    from .registry import available_checks, get_check, parse_checks
    from .report import prepare_output
    from .runner import run_audit

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
        options = _parse_sets(set_)
        extra = set(options) - set(names)
        if extra:
            raise ValueError(f"--set given for checks that are not selected: {', '.join(sorted(extra))}")
        for name in names:  # load every plug-in and validate its options before any slow work
            configure(get_check(name), options.get(name, {}))
        if engine not in ("local", "ray"):
            raise ValueError(f"--engine must be local or ray, got {engine!r}")
        multi = len(models or []) > 1 or engine == "ray"
        out_path = None if multi else prepare_output(out, overwrite=force)
        data = AuditData.from_file(texts) if texts else AuditData.builtin()
        if max_texts is not None:
            if max_texts < 1:
                raise ValueError(f"--max-texts must be at least 1, got {max_texts}")
            data = data.head(max_texts)
    except (ValueError, ImportError, TypeError) as exc:
        _fail(str(exc))
        return
    if multi:
        _audit_many(models or [DEFAULT_MODEL], names, data, out, options, backend, engine, dtype, device, force)
        return
    spec = (models or [DEFAULT_MODEL])[0]
    typer.echo(f"loading {spec} (backend {backend}) ...", err=True)
    t0 = time.perf_counter()
    try:
        import interp

        m = interp.load(spec, backend=backend, dtype=dtype, device=device)
    except Exception as exc:  # noqa: BLE001 - any load failure is a bad model spec for the user
        _fail(f"cannot load model {spec!r}: {exc}")
        return
    load_s = time.perf_counter() - t0
    typer.echo(f"running {', '.join(names)} on {len(data.texts)} texts ...", err=True)
    try:
        report = run_audit(m, names, data, None, options, spec=spec, timings={"load_model": load_s})
        report.write(out_path, overwrite=force)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
        return
    for c in report.checks:
        typer.echo(f"  {c.name}: {c.status} ({c.seconds:.1f} s)", err=True)
    typer.echo(f"wrote {out_path / 'index.html'} and {out_path / 'results.json'}")
    if not report.ok:
        raise typer.Exit(1)


def _audit_many(specs, names, data, out, options, backend, engine, dtype, device, force) -> None:
    from .multi import run_audits

    typer.echo(f"auditing {len(specs)} models with {', '.join(names)} on {len(data.texts)} texts "
               f"(engine {engine}) ...", err=True)
    load_kwargs = {k: v for k, v in (("dtype", dtype), ("device", device)) if v is not None}
    try:
        summaries = run_audits(specs, names, data, out, options, backend=backend, engine=engine,
                               load_kwargs=load_kwargs, overwrite=force)
    except Exception as exc:  # noqa: BLE001 - a failing load or worker is reported, not a traceback
        _fail(f"{type(exc).__name__}: {exc}")
        return
    for s in summaries:
        typer.echo(f"  {s['spec']}: " + ", ".join(f"{c['name']} {c['status']}" for c in s["checks"]), err=True)
    typer.echo(f"wrote {out}/index.html and one report per model")
    if not all(s["ok"] for s in summaries):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``audit`` command to the ``interp`` CLI."""
    app.command(name="audit")(audit)


__all__ = ["register", "audit", "DEFAULT_MODEL"]
