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
        except (ImportError, KeyError, TypeError, ValueError) as exc:
            typer.echo(f"{name}\t(broken: {exc})")
            continue
        last = []
        for preset in ("full", "quick"):
            rec = committed_record(recipe, preset)
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
              update_record: bool = typer.Option(False, "--update-record",
                                                 help="Write the run's record into benchmarks/<paper>/records/<preset>/."),
              force: bool = typer.Option(False, "--force", help="Write into a folder that holds no earlier report.")) -> None:
    """Run papers' reproduction recipes; write DIR/index.html with paper | criterion | ours | verdict per claim."""
    if list_:
        _list()
        return
    if not papers:
        _fail("name a paper or 'all' (interp reproduce --list shows them)")
    from ..io import OutputError
    from .recipe import PRESETS, resolve
    from .runner import ENGINES
    from .runner import reproduce as run_all
    from .runner import update_record as write_record

    if preset not in PRESETS:
        _fail(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    if engine not in ENGINES:
        _fail(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    try:
        names = resolve(papers)
    except (KeyError, ImportError, ValueError, TypeError) as exc:
        _fail(str(exc.args[0]) if exc.args else str(exc))

    def done(run) -> None:
        rec = run.record
        state = "ERROR" if rec.error else rec.summary()
        typer.echo(f"{rec.paper:24s} {rec.preset:5s} {rec.seconds:8.1f} s  {state}")
        if rec.error:
            typer.echo("  " + rec.error.strip().splitlines()[-1], err=True)
        for d in run.differences or []:
            typer.echo(f"  differs: {d}", err=True)
        if update_record and not rec.error:
            typer.echo(f"  record written to {write_record(run)}")

    try:
        runs = run_all(names, preset=preset, out=out, engine=engine, check=check, fresh=fresh, overwrite=force,
                       on_done=done)
    except OutputError as exc:
        _fail(str(exc))
    typer.echo(f"report: {out}/index.html")
    if any(r.record.error for r in runs):
        raise typer.Exit(1)
    if check and any(r.differences for r in runs):
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.command(name="reproduce")(reproduce)
