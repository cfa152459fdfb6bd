"""``interp zoo list | build NAME [--force] | info NAME | verify [NAME]``: the zoo on the command line."""
from __future__ import annotations

import json
import time
from typing import Optional

import typer

from interp.registry import PluginError
from interp.zoo import registry

app = typer.Typer(help="Built-in model zoo: list the entries, build (and cache) one, or show what it is.",
                  no_args_is_help=True)


def _entry_or_exit(name: str) -> str:
    """The entry's name; an unknown name (or a broken plug-in) is one ``error:`` line and exit code 2, like
    every other mistake on the command line."""
    try:
        return registry.get_entry(name).name
    except KeyError as err:  # UnknownNameError and PluginError (both KeyErrors) carry their message as args[0]
        typer.echo(f"error: {err.args[0] if err.args else err}", err=True)
        raise typer.Exit(code=2) from None


def _built(name: str) -> bool:
    try:
        return registry.cached_path(name) is not None
    except PluginError:  # a broken plug-in has nothing built to verify
        return False


@app.command("list")
def list_entries() -> None:
    """List the zoo entries, whether each is cached, and what it is."""
    rows, broken = [], []
    for n in registry.available():
        try:
            rows.append(registry.info(n))
        except PluginError as err:  # a broken plug-in hides nothing: its row says why
            broken.append(str(err))
    width = max((len(r.name) for r in rows), default=4)
    typer.echo(f"{'name':<{width}}  {'cached':<6}  {'architecture':<17}  {'size':<28}  build")
    for r in rows:
        typer.echo(f"{r.name:<{width}}  {'yes' if r.path else 'no':<6}  {r.architecture:<17}  {r.size:<28}  "
                   f"{'slow (minutes)' if r.slow else 'fast'}")
    for b in broken:
        typer.echo(f"broken: {b}", err=True)
    typer.echo(f"\ncache: {registry.zoo_dir()}  (set ${registry.CACHE_ENV} to move it)")


@app.command()
def build(name: str = typer.Argument(..., help="zoo entry name, e.g. smollm2-135m"),
          force: bool = typer.Option(False, "--force", help="rebuild even if a cached folder exists")) -> None:
    """Build an entry into the cache (no-op when cached unless --force) and print its folder."""
    name = _entry_or_exit(name)
    try:
        folder = registry.build(name, force=force)
    except registry.ZooIntegrityError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(str(folder))


@app.command()
def verify(name: Optional[str] = typer.Argument(None, help="zoo entry name (default: every cached entry)")) -> None:
    """Fully verify cached entries: the SHA-256 of every file against the checksums recorded at build time.

    Prints one line per entry; exits 1 if any is damaged (the line names the file and the rebuild command).
    """
    names = [_entry_or_exit(name)] if name else [n for n in registry.available() if _built(n)]
    if name and registry.cached_path(names[0]) is None:
        typer.echo(f"error: zoo entry {names[0]!r} is not built (run: interp zoo build {names[0]})", err=True)
        raise typer.Exit(code=1)
    if not names:
        typer.echo(f"no cached zoo entries in {registry.zoo_dir()}")
        return
    damaged = 0
    for n in names:
        t0 = time.perf_counter()
        try:
            folder = registry.verify(n, full=True)
        except registry.ZooIntegrityError as err:
            damaged += 1
            typer.echo(f"DAMAGED  {n}: {err}")
            continue
        mib = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
        typer.echo(f"ok       {n}  ({mib:.0f} MiB, {time.perf_counter() - t0:.1f} s)  {folder}")
    if damaged:
        raise typer.Exit(code=1)


@app.command()
def info(name: str = typer.Argument(..., help="zoo entry name"),
         as_json: bool = typer.Option(False, "--json", help="print the full record as JSON")) -> None:
    """Describe an entry: source, architecture, size, recipe hash, cached folder and build metrics."""
    name = _entry_or_exit(name)
    i = registry.info(name)
    if as_json:
        record = {k: (str(v) if k == "path" and v is not None else v) for k, v in i.__dict__.items()}
        typer.echo(json.dumps(record, indent=2, default=str))
        return
    typer.echo(f"name:         {i.name}")
    typer.echo(f"description:  {i.description}")
    typer.echo(f"source:       {i.source}")
    typer.echo(f"architecture: {i.architecture}")
    typer.echo(f"size:         {i.size}")
    typer.echo(f"recipe hash:  {i.recipe_hash}")
    typer.echo(f"cached:       {i.path if i.path else 'no (run: interp zoo build ' + i.name + ')'}")
    if i.metrics:
        typer.echo("build metrics:")
        for k, v in i.metrics.items():
            typer.echo(f"  {k}: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}")
