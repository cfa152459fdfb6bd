"""``harvest``: stream a model's activations over a corpus into a sharded, resumable store on disk.

The corpus is packed into fixed-length contexts as sae-lens packs it (:mod:`interp.store.packing`), the
contexts are cut into shards of ``contexts_per_shard`` (from ``shard_mb``), and each shard is computed
in batches of ``batch_size`` contexts with ``model.run_with_cache(..., names, stop_at_layer=deepest+1)``
(any backend) and written atomically. The batches are aligned to shard boundaries, so every shard is
computed the same way whether the harvest runs in one go, is resumed after a crash, or runs on Ray
workers: the stores are bit-for-bit equal.

Memory stays bounded whatever the corpus size: the data is streamed, and at most three shards exist in
RAM at once (one being filled, one queued, one being written by the background writer thread that
overlaps disk I/O and hashing with the forward passes).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import numpy as np
import torch

from interp.configs import config_from_call, is_int, is_number, is_sequence, require
from interp.model import Model
from interp.names import parse
from interp.progress import progress
from interp.registry import Registry
from interp.results import Result

from .manifest import (
    LOCK, MANIFEST, OWN_TEMPORARY, SCHEMA, SCHEMA_VERSION, CorruptShardError, IncompatibleStoreError, StoreError,
    check_shard, read_manifest, write_manifest, write_shard,
)
from .packing import Context, pack, special_token_id, tokenized
from .sources import DataSource, open_source

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
#: the engines interp ships: ``local`` (this process, below) and ``ray`` (the application :mod:`interp.apps.ray_engine`,
#: found through :data:`HARVEST_ENGINES`)
ENGINES = ("local", "ray")
UNSTORABLE = ("attn.hook_pattern", "attn.hook_attn_scores")  # [batch, head, q, k]: not one row per token


def _check_engine(obj: Any, name: str) -> None:
    if not callable(obj):
        raise TypeError(f"harvest engine {name!r} must be a callable with the signature of "
                        f"interp.apps.ray_engine.run_shards, got {type(obj).__name__}")


#: engines that compute shards elsewhere than this process (entry-point group ``interp.harvest_engines``; the
#: built-in ``ray`` is declared there in pyproject.toml like a third party's): the kernel never imports them, it
#: looks them up by name when a harvest asks for one. An engine is a callable with the signature of
#: :func:`interp.apps.ray_engine.run_shards`, ``(todo, config, *, spec, folder, names, shapes, stop, record)``
#: (``config``: the harvest's :class:`HarvestConfig`, for its batch size, dtype, workers and loading options),
#: returning the number of shards written.
HARVEST_ENGINES: Registry = Registry("harvest engine", "interp.harvest_engines", validate=_check_engine)


def engine_names() -> list[str]:
    """``local`` and every registered or declared engine (nothing is imported)."""
    return ["local", *[n for n in HARVEST_ENGINES.available() if n != "local"]]


@dataclass(frozen=True)
class HarvestConfig:
    """How a harvest packs, runs and stores: the options of :func:`harvest`, validated once when built (a
    one-line :class:`~interp.configs.ConfigError` naming the field). Fields marked *identity* define the
    store: resuming with a different value is refused.

    - ``names`` (identity): hook names or globs to store, e.g. ``"blocks.*.hook_resid_post"`` (one string or
      several; kept as a tuple).
    - ``context_size`` (identity, default 128): tokens per context, BOS included.
    - ``batch_size`` (identity, default 8): contexts per forward pass.
    - ``dtype`` (identity): stored dtype, one of ``float32``, ``float16``, ``bfloat16``, ``float64``.
    - ``max_tokens`` (identity): stop after ``max_tokens // context_size`` contexts (``None``: whole corpus).
    - ``shard_mb`` (identity, default 64): target shard size; ``contexts_per_shard`` follows from it.
    - ``prepend_bos`` / ``separator`` (identity): sae-lens's ``prepend_bos`` (each context starts with BOS)
      and ``sequence_separator_token`` (``"bos"``, ``"eos"``, ``"sep"``, an id, or ``None``).
    - ``text_column`` / ``tokens_column`` (identity): fields read from JSON lines and datasets.
    - ``engine``: ``"local"`` or a registered engine (``"ray"``); ``num_workers``: its workers (each loads the
      model once); ``gpus_per_worker`` / ``threads_per_worker``: GPUs / CPU threads each reserves (pass
      ``load_kwargs={"device": "cuda"}`` or ``{"device_map": "auto"}`` to use the GPUs).
    - ``verify``: re-check the full sha256 of completed shards when resuming (without it: sizes, headers
      and sample hashes); ``repair``: recompute shards that fail it instead of stopping.
    - ``backend`` / ``load_kwargs``: how a model given as a spec is loaded (:func:`interp.load`), here and on
      an engine's workers.
    """

    names: str | Sequence[str]
    context_size: int = 128
    batch_size: int = 8
    dtype: str = "float32"
    max_tokens: int | None = None
    shard_mb: float = 64.0
    prepend_bos: bool = True
    separator: str | int | None = "bos"
    text_column: str = "text"
    tokens_column: str = "input_ids"
    engine: str = "local"
    num_workers: int = 2
    gpus_per_worker: float = 0.0
    verify: bool = True
    repair: bool = False
    backend: str = "torch"
    load_kwargs: Mapping[str, Any] = field(default_factory=dict)
    threads_per_worker: int = 1

    #: fields that say how to run, not what is stored (left out of the store's identity)
    RUN_FIELDS: ClassVar[tuple[str, ...]] = ("engine", "num_workers", "gpus_per_worker", "verify", "repair",
                                             "backend", "load_kwargs", "threads_per_worker")

    def __post_init__(self) -> None:
        name = type(self).__name__
        names = (self.names,) if isinstance(self.names, str) else self.names
        require(is_sequence(names) and len(names) > 0 and all(isinstance(n, str) and n for n in names),
                f"{name}.names", self.names, "one or more hook names or globs")
        object.__setattr__(self, "names", tuple(names))
        for flag in ("prepend_bos", "verify", "repair"):
            require(isinstance(getattr(self, flag), bool), f"{name}.{flag}", getattr(self, flag), "True or False")
        for fld, lo in (("context_size", 2 if self.prepend_bos else 1), ("batch_size", 1), ("num_workers", 1),
                        ("threads_per_worker", 1)):
            v = getattr(self, fld)
            require(is_int(v) and v >= lo, f"{name}.{fld}", v, f"an integer >= {lo}")
        require(self.max_tokens is None or (is_int(self.max_tokens) and self.max_tokens >= self.context_size),
                f"{name}.max_tokens", self.max_tokens, f"None or an integer >= context_size ({self.context_size})")
        require(self.dtype in DTYPES, f"{name}.dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        require(is_number(self.shard_mb) and self.shard_mb > 0, f"{name}.shard_mb", self.shard_mb, "a positive number")
        require(is_number(self.gpus_per_worker) and self.gpus_per_worker >= 0, f"{name}.gpus_per_worker",
                self.gpus_per_worker, "a number >= 0")
        require(isinstance(self.engine, str) and (self.engine == "local" or self.engine in HARVEST_ENGINES),
                f"{name}.engine", self.engine, f"one of {', '.join(engine_names())}")
        require(self.separator is None or is_int(self.separator) or self.separator in ("bos", "eos", "sep"),
                f"{name}.separator", self.separator, "'bos', 'eos', 'sep', a token id or None")
        for col in ("text_column", "tokens_column", "backend"):
            require(isinstance(getattr(self, col), str) and getattr(self, col), f"{name}.{col}", getattr(self, col),
                    "a non-empty string")
        require(isinstance(self.load_kwargs, Mapping) and all(isinstance(k, str) for k in self.load_kwargs),
                f"{name}.load_kwargs", self.load_kwargs, "a mapping of interp.load keyword arguments")
        object.__setattr__(self, "load_kwargs", dict(self.load_kwargs))

    def identity(self) -> dict[str, Any]:
        """The fields that define the store (recorded in its manifest; ``names`` as a list, as stored)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.RUN_FIELDS}
        out["names"] = list(self.names)
        return out

    @property
    def max_contexts(self) -> int | None:
        return None if self.max_tokens is None else self.max_tokens // self.context_size


@dataclass
class HarvestResult(Result):
    """What one call of :func:`harvest` did. ``shards`` has one row per shard of the store."""

    path: str
    names: list[str]
    n_contexts: int
    n_tokens: int
    n_shards: int
    shards_written: int
    shards_skipped: int
    tokens_computed: int
    seconds: float
    engine: str
    shards: list[dict[str, Any]] = field(default_factory=list)

    kind = "harvest"

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_computed / self.seconds if self.seconds > 0 else float("nan")

    @property
    def store(self):
        """The :class:`~interp.store.ActivationStore` written."""
        from .reader import ActivationStore
        return ActivationStore(self.path)

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.shards, columns=["file", "first_context", "n_contexts", "n_rows", "bytes", "sha256"])

    def figure(self):
        import plotly.graph_objects as go
        df = self.to_frame()
        fig = go.Figure(go.Bar(x=df["file"], y=df["n_rows"], name="rows"))
        fig.update_layout(title=f"{self.path}: {self.n_tokens} tokens in {self.n_shards} shards "
                                f"({self.tokens_per_s:.0f} tokens/s this run)", xaxis_title="shard",
                          yaxis_title="rows (tokens)")
        return fig


# ----------------------------------------------------------------------------------------- helpers
def stop_layer(names: Sequence[str], n_layers: int) -> int | None:
    """``deepest block + 1`` over ``names`` (``None`` when a name runs after the last block)."""
    deepest = -1
    for n in names:
        layer, _ = parse(n)
        if layer is None:
            if n != "hook_embed" and not n.startswith("hook_embed") and not n.startswith("hook_pos_embed"):
                return None
            continue
        deepest = max(deepest, layer)
    return min(max(deepest + 1, 1), n_layers)


def compute_shard(model: Model, contexts: Sequence[Context], first_context: int, names: Sequence[str],
                  shapes: dict[str, list[int]], stop_at_layer: int | None, batch_size: int,
                  dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Forward ``contexts`` in batches of ``batch_size`` and return the shard's tensors (see manifest)."""
    n, ctx = len(contexts), len(contexts[0].tokens)
    tokens = torch.from_numpy(np.stack([c.tokens for c in contexts]))
    out = {name: torch.empty(n * ctx, *shapes[name], dtype=dtype) for name in names}
    for i in range(0, n, batch_size):
        ids = tokens[i:i + batch_size]
        _, cache = model.run_with_cache(ids, names=list(names), stop_at_layer=stop_at_layer, device="cpu", dtype=dtype)
        for name in names:
            t = cache[name]
            out[name][i * ctx:(i + ids.shape[0]) * ctx] = t.reshape(ids.shape[0] * ctx, *shapes[name])
    out["tokens"] = tokens.to(torch.int32)
    out["doc"] = torch.from_numpy(np.stack([c.doc for c in contexts]))
    out["pos"] = torch.from_numpy(np.stack([c.pos for c in contexts])).to(torch.int32)
    out["context_id"] = torch.arange(first_context, first_context + n, dtype=torch.int64)
    return out


def _vocab_hash(tokenizer) -> str | None:
    if tokenizer is None:
        return None
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256("\n".join(f"{k}\t{v}" for k, v in vocab).encode("utf-8")).hexdigest()


def _probe(model: Model, first: Context, names: Sequence[str], stop: int | None) -> tuple[list[str], dict, dict]:
    """Run the first context alone: resolved names, feature shapes, and a per-name mean activation
    (the model's fingerprint, compared with tolerance on resume)."""
    _, cache = model.run_with_cache(torch.from_numpy(first.tokens)[None], names=list(names), stop_at_layer=stop,
                                    device="cpu", dtype=torch.float32)
    resolved = model.hook_names(list(names))
    shapes, probe = {}, {}
    ctx = len(first.tokens)
    for n in resolved:
        if any(n.endswith(s) for s in UNSTORABLE):
            raise ValueError(f"{n!r} is [batch, head, query, key], not one row per token; it cannot be stored")
        t = cache[n]
        if t.dim() < 3 or tuple(t.shape[:2]) != (1, ctx):
            raise ValueError(f"{n!r} has shape {tuple(t.shape)}; only [batch, pos, ...] activations can be stored")
        shapes[n] = list(t.shape[2:])
        probe[n] = t[0].reshape(ctx, -1).mean(0).tolist()
    return resolved, shapes, probe


#: how the harvest's ``identity["weights"]`` is computed: 2 = :func:`weights_fingerprint` without all-zero
#: biases (stores written before it record no scheme: their fingerprint includes them)
WEIGHTS_SCHEME = 2


def weights_fingerprint(model: Model, *, zero_biases: bool = True) -> str | None:
    """SHA-256 over the shape, dtype and bytes of every parameter of ``model``, in the module's order.

    Names are left out, so wrappers that prefix them (the torch and nnsight backends share the Hugging Face
    module; TransformerLens's bridge nests it under ``_original_component``) give the same fingerprint; a
    reordering of equal-shaped weights still changes it. ``zero_biases=False`` leaves out biases that are
    all zeros: a zero bias computes what no bias does, and TransformerLens's bridge adds one to an
    unembedding that has none, so the same weights then give the same fingerprint on every backend (the
    harvest's identity). ``None`` when the model exposes no parameters or some live on the ``meta`` device
    (offloaded): then nothing identifies its weights. Cost: one SHA-256 pass over the weights per call.
    """
    h = hashlib.sha256()
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = p.detach()
            if t.device.type == "meta":
                return None
            if not zero_biases and name.rsplit(".", 1)[-1] == "bias" and not bool(t.any()):
                continue
            h.update(f"{tuple(t.shape)}|{t.dtype}|".encode())
            flat = t.reshape(-1).contiguous().cpu()
            if flat.numel():
                h.update(flat.view(torch.uint8).numpy().data)
            n += 1
    return h.hexdigest() if n else None


def _harvest_weights(model: Model) -> str | None:
    """The harvest's weight identity (scheme :data:`WEIGHTS_SCHEME`): the same on every backend for equal weights."""
    return weights_fingerprint(model, zero_biases=False)


#: identity keys compared on their own terms, not by equality: the model's description (its ``family`` is the
#: backend's spelling, ``'llama'`` or ``'LlamaForCausalLM'``) and how it is identified (weights, else probe)
_OWN_TERMS = ("model", "probe", "weights", "weights_scheme")
#: the model's sizes that must agree whatever identifies it
_MODEL_SIZES = ("n_layers", "d_model", "d_vocab")


def _check_same(old: dict[str, Any], new: dict[str, Any], folder: Path, model: Model | None = None,
                backends: tuple[Any, Any] = (None, None)) -> None:
    """Refuse to resume when the store's identity ``old`` and this run's ``new`` differ.

    Configuration, names, shapes, data and tokenizer must be equal; the model must have the same sizes and,
    when both record one, the same weights (:func:`weights_fingerprint`; ``model`` recomputes it by the
    store's scheme for stores written before :data:`WEIGHTS_SCHEME`), else the same activations on the first
    context. The ``family`` string is only recorded: backends spell it differently for the same weights.
    ``backends``: the store's and this run's backend, named in the refusal when they differ.
    """
    changed = [k for k in sorted(set(old) | set(new)) if k not in _OWN_TERMS and old.get(k) != new.get(k)]
    old_m, new_m = old.get("model"), new.get("model")
    if not isinstance(old_m, dict) or not isinstance(new_m, dict):
        changed.append("model")
    else:
        changed += [f"model.{k}" for k in _MODEL_SIZES if old_m.get(k) != new_m.get(k)]

    def value(d: dict[str, Any], key: str) -> Any:
        head, _, tail = key.partition(".")
        return d.get(head) if not tail else (d.get(head) or {}).get(tail)

    if changed:
        lines = "; ".join(f"{k}: store has {value(old, k)!r}, this run {value(new, k)!r}" for k in changed[:6])
        raise IncompatibleStoreError(f"cannot resume the harvest in {str(folder)!r}: the {', '.join(changed)} "
                                     f"changed ({lines}). Use a new output folder, or delete this one to start over.")
    theirs, ours = old.get("weights"), new.get("weights")
    if theirs is not None and ours is not None and old.get("weights_scheme") != new.get("weights_scheme") \
            and model is not None:  # a store from before the current scheme: fingerprint the way it did
        ours = weights_fingerprint(model)
    if theirs is not None and ours is not None:  # the model, identified by its weights
        if theirs != ours:
            was, now = backends
            hint = (f" The store was harvested with backend {was!r}, this run uses {now!r}: a backend may hold the "
                    "weights differently (TransformerLens's bridge splits GPT-2's fused QKV weight, for example); "
                    f"resume with backend {was!r}." if was is not None and now is not None and was != now else "")
            raise IncompatibleStoreError(
                f"cannot resume the harvest in {str(folder)!r}: the model changed (its weights' fingerprint is "
                f"{ours[:12]}..., the store was harvested from {theirs[:12]}...: another "
                "checkpoint, weight dtype, or a backend that holds processed weights). Use a new output folder, "
                f"or resume with the model the store was harvested from.{hint}")
        return
    # a store from before weight fingerprints (or a model without accessible weights): the activation probe
    for n, vec in new["probe"].items():
        a, b = torch.tensor(old["probe"][n]), torch.tensor(vec)
        if not torch.allclose(a, b, rtol=1e-3, atol=1e-4 * (1 + a.abs().max().item())):
            raise IncompatibleStoreError(
                f"cannot resume the harvest in {str(folder)!r}: the model changed (its activations at {n!r} on the "
                f"first context differ by up to {(a - b).abs().max().item():.3g}). Use a new output folder.")


def _open_model(model: Model | str, backend: str, load_kwargs: dict[str, Any]) -> Model:
    if isinstance(model, Model):
        return model
    if isinstance(model, (str, Path)):
        import interp
        return interp.load(str(model), backend=backend, **load_kwargs)
    raise TypeError(f"model must be an interp.Model or a model spec string, got {type(model).__name__}")


def _contexts(source: DataSource, model: Model, cfg: HarvestConfig) -> Iterator[Context]:
    tok = model.tokenizer
    bos = special_token_id(tok, "bos") if cfg.prepend_bos else None
    sep = special_token_id(tok, cfg.separator) if cfg.separator is not None else None
    stream = pack(tokenized(source.documents(), tok), cfg.context_size, bos, sep)
    return itertools.islice(stream, cfg.max_contexts) if cfg.max_contexts is not None else stream


def _chunks(it: Iterator[Context], size: int) -> Iterator[list[Context]]:
    while chunk := list(itertools.islice(it, size)):
        yield chunk


# ----------------------------------------------------------------------------------------- harvest
def harvest(model: Model | str, data: Any, names: str | Sequence[str] | None = None, out: str | Path | None = None,
            *, config: HarvestConfig | None = None, **options: Any) -> HarvestResult:
    """Harvest the activations at ``names`` of ``model`` over ``data`` into the store folder ``out``.

    The options are the fields of :class:`HarvestConfig` (``names`` and ``context_size``, ``batch_size``,
    ``dtype``, ``max_tokens``, ``shard_mb``, ``engine``, ``backend``, ``load_kwargs`` ...): given as keywords
    (``harvest(model, data, names, out, context_size=16)``) or as one ready ``config=`` (then neither ``names``
    nor any option may be given besides it: ``harvest(model, data, out=folder, config=cfg)``). The config is
    built and validated once, before anything loads: a bad value is a one-line
    :class:`~interp.configs.ConfigError` (a ``ValueError``) naming the field.

    ``model`` is an :class:`interp.Model` or a spec for :func:`interp.load` (``zoo:NAME``, a folder; with
    ``backend`` and ``load_kwargs``); ``engine="ray"`` needs a spec (each worker loads the model itself).
    ``data``: see :func:`interp.store.sources.open_source`. Rerunning the same call on the same ``out``
    resumes: completed shards are kept (checksums verified), missing ones computed; the finished store is
    bit-for-bit the one an uninterrupted run writes. A store made with another model, corpus or
    configuration raises :class:`IncompatibleStoreError`; a damaged shard raises
    :class:`CorruptShardError` naming it (``repair=True`` recomputes it).

    Each stored name ``n`` becomes rows ``[n_tokens, *feature_shape]``; read them with
    :class:`~interp.store.ActivationStore`. Returns a :class:`HarvestResult`.
    """
    given = {"names": names} if names is not None else {}
    cfg = config_from_call(HarvestConfig, config, {**given, **options}, "harvest")
    if out is None:
        raise TypeError("harvest: out (the store folder) is required")
    spec = str(model) if isinstance(model, (str, Path)) else getattr(model, "source", None)
    if cfg.engine != "local" and spec is None:
        raise ValueError(f"engine={cfg.engine!r} needs a model spec (zoo:NAME or a folder) that the workers can load; "
                         "this Model has none (pass the spec string instead)")
    folder = Path(out).expanduser().absolute()
    if folder.is_symlink():  # the toolkit's writer rule (interp.io): never write through a link silently
        raise StoreError(f"output {str(folder)!r} is a symbolic link; refusing to write through it (pass its "
                         f"target {str(folder.resolve())!r} itself)")
    if folder.exists() and (not folder.is_dir() or (
            any(p.name != LOCK for p in folder.iterdir()) and not (folder / MANIFEST).exists())):
        raise StoreError(f"output {str(folder)!r} exists and is not an activation store; choose a new or empty folder")
    source = open_source(data, text_column=cfg.text_column, tokens_column=cfg.tokens_column)
    with _StoreLock(folder):
        return _harvest_locked(model, source, folder, cfg, spec)


class _StoreLock:
    """The store's lock (``LOCK`` in the folder, an OS file lock: released when the process dies, even by
    ``kill -9``). Taken before anything in the folder is touched; a second harvest into the folder while it
    is held is refused. A folder created for a harvest that failed before its manifest was written is
    removed again (with the parents created for it)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __enter__(self) -> "_StoreLock":
        from filelock import FileLock, Timeout

        from interp.io import _make_parents, _remove_if_empty

        self.created = _make_parents(self.folder)
        self.lock = FileLock(str(self.folder / LOCK), blocking=False)
        try:
            self.lock.acquire()
        except Timeout:
            _remove_if_empty(self.created)
            raise StoreError(f"another harvest is writing into {str(self.folder)!r} (it holds {LOCK}); wait for "
                             "it to finish (then rerun to resume or check it), or harvest into another "
                             "folder") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        from interp.io import _remove_if_empty

        try:
            if self.created and not (self.folder / MANIFEST).exists():
                (self.folder / LOCK).unlink(missing_ok=True)
        finally:
            self.lock.release()
        if self.created and not (self.folder / MANIFEST).exists():
            _remove_if_empty(self.created)


def _remove_own_temporaries(folder: Path) -> None:
    """Temporary shard and manifest files a killed harvest left (only the store's own names; the caller holds
    the store's lock, so none of them belongs to a harvest still running)."""
    for stray in folder.iterdir():
        if OWN_TEMPORARY.fullmatch(stray.name) and stray.is_file() and not stray.is_symlink():
            stray.unlink(missing_ok=True)


def _harvest_locked(model: Model | str, source: DataSource, folder: Path, cfg: HarvestConfig,
                    spec: str | None) -> HarvestResult:
    m = _open_model(model, cfg.backend, cfg.load_kwargs)
    t0 = time.perf_counter()
    contexts = _contexts(source, m, cfg)
    try:
        first = next(contexts)
    except StopIteration:
        raise ValueError(f"data {source.description!r} yields no complete context of {cfg.context_size} tokens") from None
    contexts = itertools.chain([first], contexts)

    stop = stop_layer(m.hook_names(list(cfg.names)) or cfg.names, m.cfg.n_layers)
    resolved, shapes, probe = _probe(m, first, cfg.names, stop)
    torch_dtype = DTYPES[cfg.dtype]
    row_bytes = sum(int(np.prod(s)) for s in shapes.values()) * torch_dtype.itemsize
    per_shard = max(1, int(cfg.shard_mb * 2**20) // (cfg.context_size * row_bytes))
    identity = {
        "config": cfg.identity(), "names": resolved, "shapes": shapes, "dtype": cfg.dtype,
        "contexts_per_shard": per_shard, "data": source.fingerprint, "tokenizer": _vocab_hash(m.tokenizer),
        "first_context": hashlib.sha256(first.tokens.tobytes()).hexdigest(),
        "model": {"family": m.cfg.family, "n_layers": m.cfg.n_layers, "d_model": m.cfg.d_model,
                  "d_vocab": m.cfg.d_vocab}, "probe": probe, "weights": _harvest_weights(m),
        "weights_scheme": WEIGHTS_SCHEME,
    }
    _remove_own_temporaries(folder)
    if (folder / MANIFEST).exists():
        manifest = read_manifest(folder)
        recorded = manifest.get("model")
        _check_same(manifest["identity"], identity, folder, m,
                    (recorded.get("backend") if isinstance(recorded, dict) else None, m.backend))
        if manifest["identity"].get("weights") is None:  # a store from before fingerprints: record it now
            manifest["identity"]["weights"] = identity["weights"]
            manifest["identity"]["weights_scheme"] = WEIGHTS_SCHEME
        for key, entry in list(manifest["shards"].items()):
            try:
                check_shard(folder, manifest, entry, sample=True, full=cfg.verify)
            except CorruptShardError:
                if not cfg.repair:
                    raise
                del manifest["shards"][key]
                manifest["complete"] = False
    else:
        manifest = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "identity": identity, "complete": False,
                    "model": {"spec": spec, "backend": m.backend}, "data": source.to_json(), "names": resolved,
                    "shapes": shapes, "dtype": cfg.dtype, "context_size": cfg.context_size,
                    "contexts_per_shard": per_shard, "shards": {}}
        write_manifest(folder, manifest)

    written = tokens_computed = 0
    if not manifest["complete"]:
        todo = _todo(contexts, per_shard, manifest)
        bar = progress(desc=f"harvest {folder.name}", total=None if cfg.max_tokens is None else cfg.max_contexts * cfg.context_size,
                       unit="tok", unit_scale=True)
        run = _run_local if cfg.engine == "local" else _run_engine
        counter = _Counter(bar)
        try:
            written = run(todo, m, folder, manifest, resolved, shapes, stop, cfg, torch_dtype, counter, spec)
        finally:
            bar.close()
        tokens_computed = counter.n
        entries = sorted(manifest["shards"].values(), key=lambda e: e["first_context"])
        n_ctx = sum(e["n_contexts"] for e in entries)
        manifest.update(complete=True, n_shards=len(entries), n_contexts=n_ctx, n_tokens=n_ctx * cfg.context_size,
                        n_documents=_n_documents(folder, entries))
        write_manifest(folder, manifest)
    entries = sorted(manifest["shards"].values(), key=lambda e: e["first_context"])
    return HarvestResult(path=str(folder), names=resolved, n_contexts=manifest["n_contexts"],
                         n_tokens=manifest["n_tokens"], n_shards=len(entries), shards_written=written,
                         shards_skipped=len(entries) - written, tokens_computed=tokens_computed,
                         seconds=time.perf_counter() - t0, engine=cfg.engine, shards=entries)


class _Counter:
    """Tokens computed this run (the progress bar may be disabled, so it cannot be the count)."""

    def __init__(self, bar) -> None:
        self.bar, self.n = bar, 0

    def update(self, n: int) -> None:
        self.n += n
        self.bar.update(n)


def _todo(contexts: Iterator[Context], per_shard: int, manifest: dict[str, Any]) -> Iterator[tuple[int, int, list[Context]]]:
    """``(shard index, first context id, contexts)`` for every shard not yet in the manifest."""
    for k, chunk in enumerate(_chunks(contexts, per_shard)):
        if str(k) not in manifest["shards"]:
            yield k, k * per_shard, chunk


def _n_documents(folder: Path, entries: list[dict[str, Any]]) -> int:
    from safetensors import safe_open

    if not entries:
        return 0
    with safe_open(str(folder / entries[-1]["file"]), framework="pt") as fh:
        return int(fh.get_tensor("doc").max().item()) + 1


def _run_local(todo, model, folder, manifest, names, shapes, stop, cfg, dtype, bar, *_unused) -> int:
    """Forward on this thread; serialize, hash, write and record shards on a writer thread."""
    jobs: queue.Queue = queue.Queue(maxsize=1)
    failure: list[BaseException] = []
    count = [0]

    def writer() -> None:
        while (job := jobs.get()) is not None:
            if failure:
                continue
            k, first_ctx, tensors = job
            try:
                manifest["shards"][str(k)] = write_shard(folder, k, first_ctx, tensors)
                write_manifest(folder, manifest)
                count[0] += 1
            except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
                failure.append(exc)

    thread = threading.Thread(target=writer, name="interp-store-writer", daemon=True)
    thread.start()
    try:
        for k, first_ctx, chunk in todo:
            if failure:
                break
            tensors = compute_shard(model, chunk, first_ctx, names, shapes, stop, cfg.batch_size, dtype)
            bar.update(len(chunk) * cfg.context_size)
            jobs.put((k, first_ctx, tensors))
    finally:
        jobs.put(None)
        thread.join()
    if failure:
        raise failure[0]
    return count[0]


def _run_engine(todo, model, folder, manifest, names, shapes, stop, cfg, dtype, bar, spec) -> int:
    """Hand the shards to the registered engine ``cfg.engine`` (:data:`HARVEST_ENGINES`); record them here."""
    run_shards = HARVEST_ENGINES.get(cfg.engine)

    def record(index: int, entry: dict[str, Any], n_tokens: int) -> None:
        manifest["shards"][str(index)] = entry
        write_manifest(folder, manifest)
        bar.update(n_tokens)

    return run_shards(todo, cfg, spec=spec, folder=folder, names=names, shapes=shapes, stop=stop, record=record)


__all__ = ["harvest", "HarvestConfig", "HARVEST_ENGINES", "engine_names", "HarvestResult", "compute_shard", "stop_layer", "weights_fingerprint", "DTYPES",
           "ENGINES"]
