"""The ``interp`` command line: ``interp audit``, ``interp zoo ...``, ``interp hooks``, ``interp demo``."""
from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(help="interp: capture, intervene and audit transformer models.", no_args_is_help=True,
                  add_completion=False)


def _mount_optional() -> None:
    """Sub-commands that live beside their feature: the zoo (interp.zoo.cli), audit (interp.audit.cli) and
    harvest (interp.store.cli)."""
    try:
        app.add_typer(importlib.import_module("interp.zoo.cli").app, name="zoo", help="Built-in model zoo.")
    except ModuleNotFoundError:
        pass
    try:
        importlib.import_module("interp.audit.cli").register(app)
    except ModuleNotFoundError:
        pass
    try:
        importlib.import_module("interp.store.cli").register(app)
    except ModuleNotFoundError:
        pass


@app.command()
def hooks(model: str = typer.Argument("zoo:toy-grammar", help="Model spec (zoo:NAME, folder, hub name)."),
          pattern: str = typer.Option(None, help="Glob filter, e.g. 'blocks.*.hook_resid_post'."),
          backend: str = typer.Option("torch", help="torch | nnsight | transformer_lens")) -> None:
    """List the canonical hook names a model offers."""
    import interp

    m = _load_or_exit(model, backend)
    for name in m.hook_names(pattern):
        typer.echo(name)


@app.command()
def demo(model: str = typer.Argument(None, help="Model spec; default: a tiny Llama built in memory."),
         backend: str = typer.Option("torch", help="torch | nnsight | transformer_lens"),
         text: str = typer.Option("The quick brown fox jumps over the lazy dog", help="Input text.")) -> None:
    """Capture the residual stream of every block and print its norms (a capture-layer smoke run)."""
    import interp

    if model is None:
        from interp.testing import tiny_model
        hf, tok = tiny_model("llama")
        m = interp.wrap(hf, tok, backend=backend)
        model = "tiny random Llama (interp.testing)"
    else:
        m = _load_or_exit(model, backend)
    logits, cache = m.run_with_cache(text, names="blocks.*.hook_resid_post")
    resid = cache.stack("hook_resid_post")  # [layer, batch, pos, d]
    typer.echo(f"model: {model}  backend: {m.backend}  layers: {m.cfg.n_layers}  d_model: {m.cfg.d_model}")
    typer.echo(f"output {tuple(logits.shape)}; residual stream {tuple(resid.shape)}")
    for layer, norm in enumerate(resid.norm(dim=-1).mean(dim=(1, 2)).tolist()):
        typer.echo(f"  blocks.{layer}.hook_resid_post  mean norm {norm:8.3f}")


def _load_or_exit(spec: str, backend: str):
    import interp

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
