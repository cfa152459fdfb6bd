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
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from interp.io import atomic_write_bytes, atomic_write_json

MANIFEST = "manifest.json"
SCHEMA = "interp.store"
SCHEMA_VERSION = 1
META_KEYS = ("tokens", "doc", "pos", "context_id")  # tensors in a shard that are not activations


class StoreError(ValueError):
    """A store folder cannot be used as asked (not a store, incomplete, unknown name ...)."""


class IncompatibleStoreError(StoreError):
    """Resuming a harvest whose model, data or configuration differ from the store's."""


class CorruptShardError(StoreError):
    """A shard file is missing, unreadable or does not match the checksum in the manifest."""


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
    atomic_write_bytes(folder / name, data)
    rows = int(tensors["tokens"].numel())
    return {"file": name, "sha256": sha256_bytes(data), "bytes": len(data), "first_context": first_context,
            "n_contexts": n_contexts, "n_rows": rows}


def verify_shard(folder: Path, entry: dict[str, Any]) -> None:
    """Raise :class:`CorruptShardError` naming the file if it is missing or its sha256 differs."""
    path = folder / entry["file"]
    if not path.is_file():
        raise CorruptShardError(f"shard {entry['file']} of store {str(folder)!r} is missing")
    if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
        raise CorruptShardError(f"shard {entry['file']} of store {str(folder)!r} is corrupt (checksum mismatch); "
                                "rerun the harvest with repair=True (--repair) to recompute it")


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise StoreError(f"{str(folder)!r} is not an activation store (no {MANIFEST})")
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise StoreError(f"{path} is not valid JSON: {exc}") from None
    if man.get("schema") != SCHEMA:
        raise StoreError(f"{path} is not an interp store manifest (schema {man.get('schema')!r})")
    if man.get("schema_version", 0) > SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {man['schema_version']}; this interp reads <= {SCHEMA_VERSION}")
    return man


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(Path(folder) / MANIFEST, manifest)


__all__ = ["MANIFEST", "SCHEMA", "SCHEMA_VERSION", "META_KEYS", "StoreError", "IncompatibleStoreError",
           "CorruptShardError", "shard_file", "write_shard", "verify_shard", "read_manifest", "write_manifest",
           "sha256_file", "sha256_bytes"]
