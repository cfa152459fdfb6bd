"""``interp reproduce PAPER|all [--preset quick|full] [--out DIR] [--engine ray] [--check] [--list]``."""
from __future__ import annotations

from typing import List, Optional

import typer


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _list() -> None:
    from .recipe import available_recipes, get_recipe
    from .record import committed_record

    for name in available_recipes():
        try:
            recipe = get_recipe(name)
        except Exception as exc:  # noqa: BLE001 - a broken recipe is listed as such, the others still are
            typer.echo(f"{name}\t(broken: {exc})")
            continue
        last = []
        for preset in ("full", "quick"):
            try:
                rec = committed_record(recipe, preset)
            except Exception as exc:  # noqa: BLE001 - a malformed record is listed as such
                last.append(f"{preset}: record unreadable ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
                continue
            if rec is not None:
                last.append(f"{preset}: {rec.summary()}")
        typer.echo(f"{name}\t{recipe.title}\t{'; '.join(last) or 'no committed record'}")


def reproduce(papers: Optional[List[str]] = typer.Argument(None, help="Paper name(s) or 'all' (see --list)."),
              preset: str = typer.Option("quick", help="quick (minutes, every stage) | full (the documented run)."),
              out: str = typer.Option("reproduce-report", "--out", "-o", help="Folder for index.html and the records."),
              engine: str = typer.Option("local", help="local | ray: run each recipe's independent units as Ray tasks."),
              check: bool = typer.Option(False, "--check", help="Compare with the committed record of the preset; "
                                         "exit 3 on a difference."),
              list_: bool = typer.Option(False, "--list", help="List the papers and their committed verdicts."),
              fresh: bool = typer.Option(False, "--fresh", help="Recompute every stage (ignore stored ones)."),
              threads: int = typer.Option(1, "--threads", help="Threads for torch, BLAS and OpenMP in every unit "
                                          "(recorded; the committed records use 1)."),
              strict_stages: bool = typer.Option(False, "--strict-stages", help="Refuse (error) a stored stage that "
                                                 "fails its key or checksum check instead of recomputing it."),
              update_record: bool = typer.Option(False, "--update-record",
                                                 help="Write the run's record into benchmarks/<paper>/records/<preset>/ "
                                                 "(refused from a tree with uncommitted code changes)."),
              force: bool = typer.Option(False, "--force", help="Write into a folder that holds no earlier report.")) -> None:
    """Run papers' reproduction recipes; write DIR/index.html with paper | criterion | ours | verdict per claim.

    Exit status: 0 all ran (and, with --check, agree); 1 a paper raised; 2 bad input (an option, a paper
    name, a claims file, a committed record, the output folder, a refused --update-record); 3 --check found
    a difference. Every error is one line starting with ``error:``.
    """
    if list_:
        _list()
        return
    if not papers:
        _fail("name a paper or 'all' (interp reproduce --list shows them)")
    from interp.io import OutputError
    from .recipe import PRESETS, resolve
    from .runner import ENGINES
    from .runner import reproduce as run_all
    from .runner import update_record as write_record

    if preset not in PRESETS:
        _fail(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    if engine not in ENGINES:
        _fail(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if threads < 1:
        _fail(f"--threads must be at least 1, got {threads}")
    try:
        names = resolve(papers)
    except Exception as exc:  # noqa: BLE001 - an unknown or broken paper name is bad input: one line
        _fail(str(exc.args[0]) if exc.args else str(exc))
    input_errors: list[str] = []

    def done(run) -> None:
        rec = run.record
        state = "ERROR" if rec.error else rec.summary()
        typer.echo(f"{rec.paper:24s} {rec.preset:5s} {rec.seconds:8.1f} s  {state}")
        if run.input_error:
            input_errors.append(run.input_error)
            typer.echo(f"error: {run.input_error}", err=True)
        elif rec.error:
            typer.echo(f"error: {rec.paper}: " + rec.error.strip().splitlines()[-1], err=True)
        for d in run.differences or []:
            typer.echo(f"  differs: {d}", err=True)
        if update_record and not rec.error:
            try:
                typer.echo(f"  record written to {write_record(run)}")
            except (ValueError, OSError) as exc:
                input_errors.append(str(exc))
                typer.echo(f"error: {exc}", err=True)

    try:
        runs = run_all(names, preset=preset, out=out, engine=engine, check=check, fresh=fresh, overwrite=force,
                       on_done=done, threads=threads, on_mismatch="refuse" if strict_stages else None)
    except OutputError as exc:
        _fail(str(exc))
    typer.echo(f"report: {out}/index.html")
    if input_errors:
        raise typer.Exit(2)
    if any(r.record.error for r in runs):
        raise typer.Exit(1)
    if check and any(r.differences for r in runs):
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.command(name="reproduce")(reproduce)
