"""The ``interp`` command line: ``interp audit``, ``interp reproduce``, ``interp zoo ...``, ``interp hooks``,
``interp demo``."""
from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(help="interp: capture, intervene and audit transformer models.", no_args_is_help=True,
                  add_completion=False)


def _mount_optional() -> None:
    """Sub-commands that live beside their feature: the zoo (interp.apps.zoo.cli), audit (interp.apps.audit.cli),
    harvest (interp.apps.store_cli) and reproduce (interp.apps.reproduce.cli). One that fails to import is still listed, as a command that says why."""
    mounts = {"zoo": lambda: app.add_typer(importlib.import_module("interp.apps.zoo.cli").app, name="zoo",
                                           help="Built-in model zoo."),
              "audit": lambda: importlib.import_module("interp.apps.audit.cli").register(app),
              "harvest": lambda: importlib.import_module("interp.apps.store_cli").register(app),
              "reproduce": lambda: importlib.import_module("interp.apps.reproduce.cli").register(app)}
    for name, mount in mounts.items():
        try:
            mount()
        except Exception as exc:  # noqa: BLE001 - reported by the stand-in command below
            _unavailable(name, exc)


def _unavailable(name: str, exc: BaseException) -> None:
    reason = f"{type(exc).__name__}: {exc}"

    @app.command(name=name, context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                 help=f"(unavailable: {reason})")
    def stand_in() -> None:
        typer.echo(f"error: 'interp {name}' is unavailable because its module failed to import ({reason})",
                   err=True)
        raise typer.Exit(2)


@app.command()
def hooks(model: str = typer.Argument("zoo:toy-grammar", help="Model spec (zoo:NAME, folder, hub name)."),
          pattern: str = typer.Option(None, help="Glob filter, e.g. 'blocks.*.hook_resid_post'."),
          backend: str = typer.Option("torch", help="torch | nnsight | transformer_lens")) -> None:
    """List the canonical hook names a model offers."""
    import interp

    m = _load_or_exit(model, backend)
    names = m.hook_names(pattern)
    if not names:
        from interp.names import unknown_message
        typer.echo(f"error: {unknown_message(pattern, m.hook_names())}", err=True)
        raise typer.Exit(2)
    for name in names:
        typer.echo(name)


@app.command()
def demo(model: str = typer.Argument(None, help="Model spec; default: a tiny Llama built in memory."),
         backend: str = typer.Option("torch", help="torch | nnsight | transformer_lens"),
         text: str = typer.Option("The quick brown fox jumps over the lazy dog", help="Input text.")) -> None:
    """Capture the residual stream of every block and print its norms (a capture-layer smoke run)."""
    import interp

    if model is None:
        from interp.testing import tiny_model
        _check_backend_or_exit(backend)
        hf, tok = tiny_model("llama")
        m = interp.wrap(hf, tok, backend=backend)
        model = "tiny random Llama (interp.testing)"
    else:
        m = _load_or_exit(model, backend)
    logits, cache = _input_or_exit(lambda: m.run_with_cache(text, names="blocks.*.hook_resid_post"))
    resid = cache.stack("hook_resid_post")  # [layer, batch, pos, d]
    typer.echo(f"model: {model}  backend: {m.backend}  layers: {m.cfg.n_layers}  d_model: {m.cfg.d_model}")
    typer.echo(f"output {tuple(logits.shape)}; residual stream {tuple(resid.shape)}")
    for layer, norm in enumerate(resid.norm(dim=-1).mean(dim=(1, 2)).tolist()):
        typer.echo(f"  blocks.{layer}.hook_resid_post  mean norm {norm:8.3f}")


def _input_or_exit(run):
    """``run()``; a mistake in the user's input (empty or over-long text, ...) is one ``error:`` line, exit 2."""
    try:
        return run()
    except (ValueError, TypeError, KeyError) as exc:
        typer.echo(f"error: {exc.args[0] if isinstance(exc, KeyError) and exc.args else exc}", err=True)
        raise typer.Exit(2) from None


def _check_backend_or_exit(backend: str) -> None:
    from interp.loading import _check_backend
    try:
        _check_backend(backend)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _load_or_exit(spec: str, backend: str):
    import interp

    _check_backend_or_exit(backend)
    try:
        return interp.load(spec, backend=backend)
    except (ValueError, KeyError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


_mount_optional()


def main() -> None:
    app(prog_name="interp")


if __name__ == "__main__":
    sys.exit(main())
