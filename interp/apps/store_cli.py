"""``interp harvest``: stream a model's activations over a corpus into a resumable store folder."""
from __future__ import annotations

from typing import List, Optional

import typer


def harvest_cmd(model: str = typer.Argument(..., help="Model spec: zoo:NAME or a local Hugging Face folder."),
                names: List[str] = typer.Option(..., "--names", "-n",
                                                help="Hook names or globs (repeatable or comma-separated), "
                                                     "e.g. 'blocks.*.hook_resid_post'."),
                data: str = typer.Option(..., "--data", "-d",
                                         help="Corpus: .txt (a document per line), .jsonl, .npy token array, "
                                              "or a datasets folder (save_to_disk)."),
                out: str = typer.Option(..., "--out", "-o", help="Store folder (rerun the same command to resume)."),
                context_size: int = typer.Option(128, help="Tokens per context (BOS included)."),
                batch_size: int = typer.Option(8, help="Contexts per forward pass."),
                dtype: str = typer.Option("float32", help="Stored dtype: float32 | float16 | bfloat16 | float64."),
                max_tokens: Optional[int] = typer.Option(None, help="Stop after this many tokens."),
                shard_mb: float = typer.Option(64.0, help="Target shard size in MiB."),
                backend: str = typer.Option("torch", help="torch | nnsight | transformer_lens"),
                engine: str = typer.Option("local", help="local | ray (RAY_ADDRESS selects a cluster)."),
                workers: int = typer.Option(2, help="Ray workers (each loads the model once)."),
                gpus_per_worker: float = typer.Option(0.0, help="GPUs each Ray worker reserves (with --device cuda)."),
                text_column: str = typer.Option("text", help="Text field of JSON lines / datasets."),
                no_bos: bool = typer.Option(False, "--no-bos", help="Do not start contexts with BOS."),
                repair: bool = typer.Option(False, help="Recompute shards whose checksum fails."),
                model_dtype: Optional[str] = typer.Option(None, help="Load the weights in this dtype."),
                device: Optional[str] = typer.Option(None, help="Device to load the model on (cpu, cuda ...).")) -> None:
    """Harvest activations to a sharded safetensors store with a JSON manifest (resumable by rerunning)."""
    from pathlib import Path

    from interp.store.harvest import HarvestConfig, harvest
    from interp.store.manifest import StoreError

    hooks = [n.strip() for item in names for n in item.split(",") if n.strip()]
    load_kwargs = {k: v for k, v in (("dtype", model_dtype), ("device", device)) if v is not None}
    try:
        check_load_options(model_dtype, device)  # before the model loads (minutes for a large one)
        # the options, built and validated once into the typed config the harvest (and its engine) runs with
        config = HarvestConfig(names=hooks, context_size=context_size, batch_size=batch_size, dtype=dtype,
                               max_tokens=max_tokens, shard_mb=shard_mb, prepend_bos=not no_bos,
                               text_column=text_column, engine=engine, num_workers=workers,
                               gpus_per_worker=gpus_per_worker, repair=repair, backend=backend,
                               load_kwargs=load_kwargs)
        res = harvest(model, data, out=out, config=config)
    except (StoreError, ValueError, KeyError, FileNotFoundError, TypeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        if exc.errno is None:  # not an error of the operating system: a bug, shown in full
            raise
        typer.echo(f"error: {write_error_message(exc, Path(out).expanduser().absolute())}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{res.path}: {res.n_tokens} tokens ({res.n_contexts} contexts) in {res.n_shards} shards; "
               f"this run wrote {res.shards_written}, kept {res.shards_skipped}"
               + (f", {res.tokens_per_s:.0f} tokens/s" if res.tokens_computed else ""))


def write_error_message(exc: OSError, store: "Path") -> str:
    """The one line ``interp harvest`` prints for an ``OSError`` with an errno (exit code 1).

    Disk full (``ENOSPC``, ``EDQUOT``) and a file-size limit (``EFBIG``) say what to do about them; any other
    errno (a failed write of a shard or the manifest, a :class:`~interp.store.manifest.StoreWriteError`, or a
    file that cannot be read) is named with its message and file. Shards are written atomically and recorded
    only once complete, so after a failed write the store resumes when the same command is rerun.
    """
    import errno
    import os

    from interp.store.manifest import StoreWriteError

    code = exc.errno
    name = errno.errorcode.get(code, str(code))
    resumes = "the store resumes: {} and rerun the same command"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full at {store}; " + resumes.format("free some space")
    if code == errno.EFBIG:
        return (f"file too large at {store} (EFBIG: a file-size limit such as 'ulimit -f', or the file system's "
                "largest file); " + resumes.format("raise the limit"))
    what = exc.strerror or os.strerror(code)
    where = f" ({exc.filename})" if exc.filename else ""
    if isinstance(exc, StoreWriteError):
        return f"cannot write the store at {store}: {what} [{name}]{where}; " + resumes.format("fix the cause")
    return f"{what} [{name}]{where}"


def check_load_options(model_dtype: Optional[str], device: Optional[str]) -> None:
    """Raise ``ValueError`` naming the option unless ``--model-dtype`` is a floating-point torch dtype and
    ``--device`` a device this machine has (checked before any model is loaded)."""
    import torch

    if model_dtype is not None:
        dt = getattr(torch, model_dtype, None) if model_dtype.isidentifier() else None
        if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
            raise ValueError(f"--model-dtype {model_dtype!r} is not a floating-point torch dtype (e.g. float32, "
                             "float16, bfloat16)")
    from ..validation import check_device

    check_device(device, "--device")


def register(app: typer.Typer) -> None:
    """Add the ``harvest`` command to the ``interp`` CLI."""
    app.command(name="harvest")(harvest_cmd)


__all__ = ["register", "harvest_cmd", "check_load_options", "write_error_message"]
