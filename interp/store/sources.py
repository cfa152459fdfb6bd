"""Data sources for a harvest: documents from text files, JSON lines, a saved ``datasets`` dataset or token arrays.

Every source yields documents in a fixed order, either as text (tokenized later) or as token ids, and has
a :attr:`fingerprint` (sha256 of its content and of how it is read) so that a resumed harvest can refuse a
changed corpus. Documents are streamed: nothing here holds the corpus in memory.

Document boundaries (a choice; the packing adds a separator token between documents):

- ``.txt`` (or any other plain-text file): one document per non-empty line, as ``interp audit --texts``;
- ``.jsonl`` / ``.json`` lines: one document per line, the string under ``text_column``
  (or a list of token ids under ``tokens_column``);
- a folder written by ``datasets.Dataset.save_to_disk``: one document per row, ``text_column`` or, if the
  dataset has it, the pre-tokenized ``tokens_column`` (sae-lens's pretokenized datasets use ``input_ids``);
- ``.npy`` (2-D int array, one document per row) or a token array in memory (a 2-D tensor/array, or a list
  of 1-D ones);
- a list of strings in memory.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

_CHUNK = 1 << 20


def _hash_file(h: "hashlib._Hash", path: Path) -> None:
    h.update(path.name.encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)


@dataclass
class DataSource:
    """A deterministic stream of documents.

    ``kind`` is ``"text"``, ``"jsonl"``, ``"dataset"``, ``"tokens"`` or ``"texts"``; :meth:`documents`
    yields ``str`` (to be tokenized) or a 1-D ``int64`` numpy array (already token ids).
    """

    kind: str
    description: str
    fingerprint: str
    _iter: Any = field(repr=False, default=None)

    def documents(self) -> Iterator[str | np.ndarray]:
        return self._iter()

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "source": self.description, "fingerprint": self.fingerprint}


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").exists() or (path / "dataset_dict.json").exists())


def open_source(data: Any, text_column: str = "text", tokens_column: str = "input_ids") -> DataSource:
    """Turn ``data`` (a path, a list of strings, or token ids) into a :class:`DataSource`.

    Raises ``ValueError`` (naming what is accepted) for anything else, ``FileNotFoundError`` for a
    missing path.
    """
    if isinstance(data, DataSource):
        return data
    if isinstance(data, (str, Path)):
        return _path_source(Path(data).expanduser(), text_column, tokens_column)
    if isinstance(data, (torch.Tensor, np.ndarray)):
        arr = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
        if arr.ndim == 1:
            arr = arr[None]
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"token arrays must be integer [n_docs, n_tokens] or [n_tokens]; got {arr.dtype} "
                             f"{tuple(arr.shape)}")
        return _token_list_source([row for row in arr.astype(np.int64)], "token array")
    if isinstance(data, Sequence) and len(data) > 0:
        if all(isinstance(t, str) for t in data):
            texts = list(data)
            h = hashlib.sha256(b"texts\0")
            for t in texts:
                h.update(t.encode("utf-8") + b"\0")
            return DataSource("texts", f"{len(texts)} texts in memory", h.hexdigest(), lambda: iter(texts))
        if all(isinstance(t, (torch.Tensor, np.ndarray, list)) for t in data):
            rows = []
            for t in data:
                a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
                if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
                    raise ValueError(f"each token document must be a 1-D integer array; got {a.dtype} {a.shape}")
                rows.append(a.astype(np.int64))
            return _token_list_source(rows, f"{len(rows)} token documents in memory")
    raise ValueError("data must be a path (.txt, .jsonl, .npy, or a datasets folder from save_to_disk), a "
                     f"non-empty list of strings, or token ids; got {type(data).__name__}")


def _token_list_source(rows: list[np.ndarray], description: str) -> DataSource:
    h = hashlib.sha256(b"tokens\0")
    for r in rows:
        h.update(len(r).to_bytes(8, "little"))
        h.update(np.ascontiguousarray(r, dtype=np.int64).tobytes())
    return DataSource("tokens", description, h.hexdigest(), lambda: iter(rows))


def _path_source(path: Path, text_column: str, tokens_column: str) -> DataSource:
    if not path.exists():
        raise FileNotFoundError(f"data {str(path)!r} does not exist")
    if path.is_dir():
        if not _is_saved_dataset(path):
            raise ValueError(f"folder {str(path)!r} is not a datasets folder (save_to_disk writes state.json)")
        return _dataset_source(path, text_column, tokens_column)
    suffix = path.suffix.lower()
    h = hashlib.sha256(f"{suffix}\0{text_column}\0{tokens_column}\0".encode())
    _hash_file(h, path)
    if suffix == ".npy":
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{path.name}: a token file must hold an integer [n_docs, n_tokens] array, got "
                             f"{arr.dtype} {arr.shape}")
        return DataSource("tokens", str(path), h.hexdigest(),
                          lambda: (np.asarray(row, dtype=np.int64) for row in np.load(path, mmap_mode="r")))
    if suffix in (".jsonl", ".json", ".ndjson"):
        def jsonl() -> Iterator[str | np.ndarray]:
            with open(path, encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path.name}:{lineno}: not valid JSON ({exc.msg})") from None
                    yield _row_document(obj, text_column, tokens_column, f"{path.name}:{lineno}")
        return DataSource("jsonl", str(path), h.hexdigest(), jsonl)

    def lines() -> Iterator[str]:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.rstrip("\n")
                if line.strip():
                    yield line
    return DataSource("text", str(path), h.hexdigest(), lines)


def _row_document(obj: Any, text_column: str, tokens_column: str, where: str) -> str | np.ndarray:
    if isinstance(obj, dict):
        if text_column in obj and isinstance(obj[text_column], str):
            return obj[text_column]
        if tokens_column in obj:
            return np.asarray(obj[tokens_column], dtype=np.int64).reshape(-1)
        raise ValueError(f"{where}: no {text_column!r} (text) or {tokens_column!r} (token ids) field; "
                         f"keys are {sorted(obj)[:8]}")
    raise ValueError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")


def _dataset_source(path: Path, text_column: str, tokens_column: str) -> DataSource:
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ValueError(f"{str(path)!r} is a DatasetDict without a 'train' split (has {list(ds)})")
        ds = ds["train"]
    cols = ds.column_names
    if tokens_column in cols:
        column = tokens_column
    elif text_column in cols:
        column = text_column
    else:
        raise ValueError(f"dataset {str(path)!r} has no {text_column!r} or {tokens_column!r} column "
                         f"(columns: {cols})")
    h = hashlib.sha256(f"dataset\0{column}\0".encode())
    for f in sorted(path.rglob("*")):
        if f.is_file() and f.suffix in (".arrow", ".json"):
            _hash_file(h, f)

    def rows() -> Iterator[str | np.ndarray]:
        for batch in ds.iter(batch_size=256):
            for value in batch[column]:
                yield value if isinstance(value, str) else np.asarray(value, dtype=np.int64).reshape(-1)
    return DataSource("dataset", f"{path} [{column}]", h.hexdigest(), rows)


__all__ = ["DataSource", "open_source"]
