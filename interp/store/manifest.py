"""The store's folder layout, its JSON manifest, shard files and checksums.

A store is one folder::

    manifest.json                 what was harvested, how, from what, and which shards are complete
    shard_000000.safetensors      rows of contexts [0, C), C = contexts_per_shard
    shard_000001.safetensors      rows of contexts [C, 2C) ...

A shard holds, for every hook name, a tensor ``[n_contexts * context_size, *feature_shape]`` (rows in
context order, positions in order), plus ``tokens`` ``[n_contexts, context_size]`` (int32), ``doc``
(int64, document index) and ``pos`` (int32, position in the tokenized document, -1 for an inserted
BOS/separator) of the same shape, and ``context_id`` ``[n_contexts]``. Shards are written atomically
(temporary file + rename) and only then recorded in the manifest, itself replaced atomically; so after
a crash at any instant every shard listed in the manifest is complete, and a shard file that is not
listed is simply written again.

The manifest is untrusted input (:func:`read_manifest` validates it, :func:`check_shard` holds each shard
to it): shard entries name only the store's own files (``shard_{index:06d}.safetensors`` for the entry's
index, resolving inside the folder), counts agree with each other and with ``context_size`` and
``contexts_per_shard``, a complete store lists every shard from 0 on, the top-level ``names``, ``shapes``,
``dtype`` and ``context_size`` equal the harvest's recorded identity, and every shard's safetensors header
holds exactly those tensors with those shapes and dtypes, its size the recorded one. Each entry also records
the shard's *sample hash* (the zoo's: SHA-256 over the size, the first and last MiB and 4 KiB of every MiB
in between; all of a shard up to 4 MiB), which the reader checks before it first reads a shard.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

import torch

from interp.io import atomic_write_bytes, atomic_write_json

MANIFEST = "manifest.json"
SCHEMA = "interp.store"
SCHEMA_VERSION = 1
META_KEYS = ("tokens", "doc", "pos", "context_id")  # tensors in a shard that are not activations
#: the stored dtypes and their safetensors header codes
HEADER_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
#: the harvest's lock file inside the store folder (held while a harvest writes into it)
LOCK = ".interp-harvest.lock"
#: temporary files the store writes (``atomic_write_bytes``: ``.NAME.XXXXXXXX.tmp``), the only ones it removes
OWN_TEMPORARY = re.compile(r"\.(shard_\d{6}\.safetensors|manifest\.json)\.[a-z0-9_]{8}\.tmp")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_HEADER = 1 << 24  # a shard's JSON header is a few hundred bytes per tensor


class StoreError(ValueError):
    """A store folder cannot be used as asked (not a store, incomplete, unknown name ...)."""


class IncompatibleStoreError(StoreError):
    """Resuming a harvest whose model, data or configuration differ from the store's."""


class CorruptShardError(StoreError):
    """A shard file is missing, unreadable or does not match the checksum in the manifest."""


class StoreWriteError(OSError):
    """Writing a shard or the manifest failed with an operating-system error: a full disk (``ENOSPC``), a
    quota (``EDQUOT``), a file-size limit (``EFBIG``, ``ulimit -f``), an I/O error ... ``errno``,
    ``strerror`` and ``filename`` are the original error's (it is also the ``__cause__``). Shards are written
    atomically and recorded only once complete, so what the manifest lists is intact and rerunning the same
    harvest resumes."""


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Turn an ``OSError`` with an errno raised while writing ``path`` into a :class:`StoreWriteError` (errno
    kept), the one class the command line reports in one line, whatever the errno."""
    try:
        yield
    except StoreWriteError:
        raise
    except OSError as exc:
        if exc.errno is None:
            raise
        raise StoreWriteError(exc.errno, exc.strerror or os.strerror(exc.errno), str(exc.filename or path)) from exc


def shard_file(index: int) -> str:
    return f"shard_{index:06d}.safetensors"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def write_shard(folder: Path, index: int, first_context: int, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Serialize ``tensors`` to ``folder/shard_{index}.safetensors`` atomically; return its manifest entry."""
    from safetensors.torch import save

    n_contexts = int(tensors["context_id"].shape[0])
    # no safetensors metadata: its header order is not stable across processes (and the manifest has it all)
    data = save({k: v.contiguous() for k, v in tensors.items()})
    name = shard_file(index)
    with _writing(folder / name):
        atomic_write_bytes(folder / name, data)
    rows = int(tensors["tokens"].numel())
    return {"file": name, "sha256": sha256_bytes(data), "sample": sample_hash(folder / name, len(data)),
            "bytes": len(data), "first_context": first_context, "n_contexts": n_contexts, "n_rows": rows}


def sample_hash(path: Path, size: int) -> str:
    """The zoo's sample hash of a file (:func:`interp.zoo.registry._sample_hash`, the one implementation)."""
    from interp.zoo.registry import _sample_hash

    return _sample_hash(Path(path), int(size))


def _bad(folder: Path, entry: dict[str, Any], why: str) -> CorruptShardError:
    return CorruptShardError(f"shard {entry['file']} of store {str(folder)!r} {why}; rerun the harvest with "
                             "repair=True (--repair) to recompute it")


def shard_path(folder: Path, entry: dict[str, Any]) -> Path:
    """The file of a (validated) shard entry; refuses one that resolves outside the store folder (a link)."""
    folder = Path(folder)
    path = folder / entry["file"]
    try:
        inside = path.resolve().parent == folder.resolve()
    except OSError:
        inside = False
    if not inside:
        raise CorruptShardError(f"shard {entry['file']} of store {str(folder)!r} resolves outside the store "
                                f"(to {str(path.resolve())!r}); refusing to read it")
    return path


def read_header(path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """``({name: {"dtype", "shape", "data_offsets"}}, end of data)`` from a safetensors file's header only.

    Raises ``ValueError`` when the header is malformed (too short, not JSON, offsets outside the file).
    """
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        n = int.from_bytes(head, "little")
        if n > _MAX_HEADER:
            raise ValueError(f"header length {n} is not plausible")
        raw = fh.read(n)
    if len(raw) < n:
        raise ValueError("truncated header")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header.pop("__metadata__", None)
    end = 0
    for k, v in header.items():
        if not (isinstance(v, dict) and isinstance(v.get("dtype"), str) and isinstance(v.get("shape"), list)
                and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2):
            raise ValueError(f"header entry {k!r} is malformed")
        end = max(end, int(v["data_offsets"][1]))
    return header, 8 + n + end


def shard_layout(manifest: dict[str, Any], entry: dict[str, Any]) -> dict[str, tuple[str, list[int]]]:
    """What a shard of ``manifest`` must hold: ``{tensor: (safetensors dtype, shape)}``."""
    rows, n_ctx, ctx = entry["n_rows"], entry["n_contexts"], manifest["context_size"]
    code = HEADER_DTYPES[manifest["dtype"]]
    out = {n: (code, [rows, *manifest["shapes"][n]]) for n in manifest["names"]}
    out.update(tokens=("I32", [n_ctx, ctx]), doc=("I64", [n_ctx, ctx]), pos=("I32", [n_ctx, ctx]),
               context_id=("I64", [n_ctx]))
    return out


def check_shard(folder: Path, manifest: dict[str, Any], entry: dict[str, Any], sample: bool = False,
                full: bool = False) -> Path:
    """Hold one shard to the manifest; raise :class:`CorruptShardError` naming it otherwise. Returns its path.

    Always (cheap, a stat and the header): the file is the store's own, present, of the recorded size, and its
    safetensors header holds exactly the manifest's tensors with their shapes and dtypes. ``sample``: also its
    sample hash (the whole file up to 4 MiB; entries from before sample hashes get the full SHA-256 instead);
    ``full``: also its full SHA-256.
    """
    path = shard_path(folder, entry)
    if not path.is_file():
        raise _bad(folder, entry, "is missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise _bad(folder, entry, f"has {size} bytes, the manifest records {entry['bytes']}")
    try:
        header, end = read_header(path)
    except (OSError, ValueError) as exc:
        raise _bad(folder, entry, f"is not a readable safetensors file ({exc})") from None
    if end != size:
        raise _bad(folder, entry, f"is damaged (its header describes {end} bytes, the file has {size})")
    want = shard_layout(manifest, entry)
    if set(header) != set(want):
        extra, missing = sorted(set(header) - set(want)), sorted(set(want) - set(header))
        raise _bad(folder, entry, f"does not hold what the manifest lists (missing {missing}, unexpected {extra})")
    for k, (code, shape) in want.items():
        got = header[k]
        if got["dtype"] != code or got["shape"] != shape:
            raise _bad(folder, entry, f"holds {k!r} as {got['dtype']} {got['shape']}, the manifest says "
                                      f"{code} {shape}")
    if full or (sample and "sample" not in entry):
        if sha256_file(path) != entry["sha256"]:
            raise _bad(folder, entry, "is corrupt (checksum mismatch)")
    elif sample and sample_hash(path, size) != entry["sample"]:
        raise _bad(folder, entry, "is corrupt (sample hash mismatch)")
    return path


def verify_shard(folder: Path, entry: dict[str, Any], manifest: dict[str, Any] | None = None) -> None:
    """Raise :class:`CorruptShardError` naming the file if it is missing or its sha256 differs (and, given
    the ``manifest``, if its header does not match it)."""
    if manifest is not None:
        check_shard(folder, manifest, entry, full=True)
        return
    path = shard_path(folder, entry)
    if not path.is_file():
        raise _bad(folder, entry, "is missing")
    if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
        raise _bad(folder, entry, "is corrupt (checksum mismatch)")


def _int(v: Any, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def validate_manifest(man: Any, where: str | os.PathLike) -> dict[str, Any]:
    """Check a parsed store manifest as untrusted input; return it or raise :class:`StoreError` naming the
    field. Shard files are checked against it by :func:`check_shard`."""
    def fail(why: str) -> StoreError:
        return StoreError(f"{where}: {why}; the store's manifest is damaged or was edited (harvest into a new "
                          "folder, or rerun the harvest that wrote it)")

    if not isinstance(man, dict):
        raise StoreError(f"{where} is not an interp store manifest (a JSON {type(man).__name__}, not an object)")
    if man.get("schema") != SCHEMA:
        raise StoreError(f"{where} is not an interp store manifest (schema {man.get('schema')!r})")
    version = man.get("schema_version", 0)
    if not _int(version):
        raise fail(f"'schema_version' must be an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise StoreError(f"{where} has schema version {version}; this interp reads <= {SCHEMA_VERSION}")
    for key in ("names", "shapes", "dtype", "context_size", "contexts_per_shard", "shards", "complete", "identity"):
        if key not in man:
            raise fail(f"missing {key!r}")
    names, shapes = man["names"], man["shapes"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names) \
            or len(set(names)) != len(names) or set(names) & set(META_KEYS):
        raise fail(f"'names' must be a non-empty list of distinct hook names, got {names!r}")
    if not isinstance(shapes, dict) or set(shapes) != set(names) or not all(
            isinstance(s, list) and all(_int(d, 1) for d in s) for s in shapes.values()):
        raise fail(f"'shapes' must give a list of positive sizes for each of {names}, got {shapes!r}")
    if man["dtype"] not in HEADER_DTYPES:
        raise fail(f"'dtype' must be one of {', '.join(HEADER_DTYPES)}, got {man['dtype']!r}")
    for key in ("context_size", "contexts_per_shard"):
        if not _int(man[key], 1):
            raise fail(f"{key!r} must be a positive integer, got {man[key]!r}")
    if not isinstance(man["complete"], bool):
        raise fail(f"'complete' must be true or false, got {man['complete']!r}")
    ident = man["identity"]
    if not isinstance(ident, dict) or not isinstance(ident.get("config"), dict):
        raise fail("'identity' must be an object with the harvest's 'config'")
    recorded = {"names": ident.get("names"), "shapes": ident.get("shapes"), "dtype": ident.get("dtype"),
                "contexts_per_shard": ident.get("contexts_per_shard"),
                "context_size": ident["config"].get("context_size")}
    for key, value in recorded.items():
        if man[key] != value:
            raise fail(f"{key!r} is {man[key]!r} but the harvest recorded {value!r} in 'identity'")
    shards = man["shards"]
    if not isinstance(shards, dict):
        raise fail(f"'shards' must be an object {{index: entry}}, got a JSON {type(shards).__name__}")
    ctx, per = man["context_size"], man["contexts_per_shard"]
    for key, e in shards.items():
        if not re.fullmatch(r"0|[1-9][0-9]*", key):
            raise fail(f"shard key {key!r} is not a shard index")
        k = int(key)
        if not isinstance(e, dict):
            raise fail(f"shard {key} must be an object, got {e!r}")
        if e.get("file") != shard_file(k):
            raise fail(f"shard {key} names the file {e.get('file')!r}; a store's shard {key} is {shard_file(k)!r} "
                       "inside the store folder")
        if not (isinstance(e.get("sha256"), str) and _HEX64.fullmatch(e["sha256"])) or (
                "sample" in e and not (isinstance(e["sample"], str) and _HEX64.fullmatch(e["sample"]))):
            raise fail(f"shard {key} has no valid checksum")
        if not _int(e.get("bytes"), 9):
            raise fail(f"shard {key}: 'bytes' must be a positive integer, got {e.get('bytes')!r}")
        if e.get("first_context") != k * per:
            raise fail(f"shard {key}: 'first_context' is {e.get('first_context')!r}, shard {key} of "
                       f"{per} contexts each starts at {k * per}")
        n_ctx = e.get("n_contexts")
        if not (_int(n_ctx, 1) and n_ctx <= per):
            raise fail(f"shard {key}: 'n_contexts' must be between 1 and {per}, got {n_ctx!r}")
        if e.get("n_rows") != n_ctx * ctx:
            raise fail(f"shard {key}: 'n_rows' is {e.get('n_rows')!r}, but {n_ctx} contexts of {ctx} tokens are "
                       f"{n_ctx * ctx} rows")
    if man["complete"]:
        keys = sorted(int(k) for k in shards)
        if keys != list(range(len(keys))):
            missing = sorted(set(range(max(keys, default=-1) + 1)) - set(keys))
            raise fail(f"it is marked complete but shard(s) {missing[:10]} are not listed")
        if any(shards[str(k)]["n_contexts"] != per for k in keys[:-1]):
            raise fail(f"it is marked complete but a shard before the last holds fewer than {per} contexts")
        n_ctx = sum(e["n_contexts"] for e in shards.values())
        totals = {"n_shards": len(keys), "n_contexts": n_ctx, "n_tokens": n_ctx * ctx}
        for key, value in totals.items():
            if man.get(key) != value:
                raise fail(f"{key!r} is {man.get(key)!r}, the shards listed make {value}")
    return man


def read_manifest(folder: Path) -> dict[str, Any]:
    """The store's manifest, validated (:func:`validate_manifest`); :class:`StoreError` otherwise."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise StoreError(f"{str(folder)!r} is not an activation store (no {MANIFEST})")
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:
        raise StoreError(f"{path} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise StoreError(f"{path} cannot be read: {exc}") from None
    return validate_manifest(man, path)


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Replace the store's manifest atomically; an OS error is a :class:`StoreWriteError` (errno kept)."""
    with _writing(Path(folder) / MANIFEST):
        atomic_write_json(Path(folder) / MANIFEST, manifest)


__all__ = ["MANIFEST", "SCHEMA", "SCHEMA_VERSION", "META_KEYS", "HEADER_DTYPES", "LOCK", "StoreError",
           "IncompatibleStoreError", "CorruptShardError", "StoreWriteError", "shard_file", "shard_path", "write_shard", "verify_shard",
           "check_shard", "read_header", "shard_layout", "sample_hash", "read_manifest", "validate_manifest",
           "write_manifest", "sha256_file", "sha256_bytes"]
