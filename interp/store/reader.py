"""``ActivationStore``: read a store written by :func:`interp.store.harvest`.

Rows are tokens: row ``r`` is position ``r % context_size`` of context ``r // context_size``. Shards
are read through ``safetensors.safe_open`` (memory-mapped; a row range reads only those rows).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .manifest import META_KEYS, CorruptShardError, StoreError, check_shard, read_manifest

Index = int | slice | Sequence[int] | np.ndarray | torch.Tensor


class ActivationStore:
    """A harvested store: ``len(store)`` rows; ``store[name]`` a lazy column; ``store.batches(...)``.

    The manifest is validated as untrusted input (see :mod:`interp.store.manifest`) and every shard is
    held to it when the store is opened: its size and its safetensors header (names, shapes, dtypes). Each
    shard's sample hash (all of a shard up to 4 MiB) is checked before the shard is first read. A failed
    check raises :class:`CorruptShardError` naming the shard. ``verify=True`` checks every shard's full
    sha256 now as well; ``allow_incomplete=True`` opens a store whose harvest has not finished (its completed
    shards only, which need not be contiguous, so rows are renumbered densely).
    """

    def __init__(self, path: str | Path, verify: bool = False, allow_incomplete: bool = False) -> None:
        self.path = Path(path).expanduser().absolute()
        self.manifest = read_manifest(self.path)
        if not self.manifest.get("complete") and not allow_incomplete:
            raise StoreError(f"the harvest into {str(self.path)!r} has not finished ({len(self.manifest['shards'])} "
                             "shards so far); rerun it to complete, or pass allow_incomplete=True")
        self.names: list[str] = list(self.manifest["names"])
        self.shapes: dict[str, tuple[int, ...]] = {k: tuple(v) for k, v in self.manifest["shapes"].items()}
        self.dtype: str = self.manifest["dtype"]
        self.context_size: int = int(self.manifest["context_size"])
        self.shards: list[dict[str, Any]] = sorted(self.manifest["shards"].values(), key=lambda e: e["first_context"])
        self._offsets = np.concatenate([[0], np.cumsum([e["n_rows"] for e in self.shards])]).astype(np.int64)
        self._handles: dict[int, Any] = {}
        self._pid = os.getpid()
        self._sampled: set[int] = set()  # shards whose sample hash was checked (kept across a fork)
        for e in self.shards:  # size and header of every shard: a stat and a few hundred bytes each
            check_shard(self.path, self.manifest, e)
        if verify:
            self.verify()

    # ------------------------------------------------------------------ facts
    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __contains__(self, name: object) -> bool:
        return name in self.shapes

    def __repr__(self) -> str:
        return (f"ActivationStore({str(self.path)!r}, rows={len(self)}, shards={len(self.shards)}, "
                f"names={self.names}, dtype={self.dtype})")

    @property
    def n_contexts(self) -> int:
        return len(self) // self.context_size

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.manifest.get("model", {}))

    def verify(self) -> None:
        """Check every shard's full sha256 (and header); raise :class:`CorruptShardError` naming the shard
        otherwise."""
        for k, e in enumerate(self.shards):
            check_shard(self.path, self.manifest, e, full=True)
            self._sampled.add(k)

    # ------------------------------------------------------------------ shard access
    def _handle(self, k: int):
        from safetensors import safe_open

        if self._pid != os.getpid():  # forked (DataLoader workers): reopen
            self._handles, self._pid = {}, os.getpid()
        if k not in self._handles:
            if k not in self._sampled:
                path = check_shard(self.path, self.manifest, self.shards[k], sample=True)
                self._sampled.add(k)
            else:
                path = self.path / self.shards[k]["file"]
            try:
                self._handles[k] = safe_open(str(path), framework="pt")
            except Exception as exc:  # noqa: BLE001 - any failure to open is a damaged shard
                raise CorruptShardError(f"shard {self.shards[k]['file']} of store {str(self.path)!r} cannot be "
                                        f"read ({type(exc).__name__}: {exc})") from None
        return self._handles[k]

    def _names(self, names: str | Sequence[str] | None) -> list[str]:
        wanted = self.names if names is None else [names] if isinstance(names, str) else list(names)
        for n in wanted:
            if n not in self.shapes and n not in META_KEYS:
                raise KeyError(f"{n!r} is not in this store; it holds {self.names}")
        return wanted

    def _read(self, k: int, name: str, lo: int, hi: int) -> torch.Tensor:
        """Rows ``lo:hi`` (shard-local) of ``name``; meta keys are expanded to one value per row."""
        h = self._handle(k)
        try:
            if name in ("tokens", "doc", "pos"):
                return h.get_tensor(name).reshape(-1)[lo:hi]
            if name == "context_id":
                return torch.arange(lo, hi) // self.context_size + self.shards[k]["first_context"]
            return h.get_slice(name)[lo:hi]
        except Exception as exc:  # noqa: BLE001
            raise CorruptShardError(f"shard {self.shards[k]['file']} of store {str(self.path)!r} cannot be "
                                    f"read ({type(exc).__name__}: {exc})") from None

    def shard(self, k: int, names: str | Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """All rows of shard ``k``: ``{name: [n_rows, *shape]}``."""
        return {n: self._read(k, n, 0, self.shards[k]["n_rows"]) for n in self._names(names)}

    def _rows_array(self, index: Index) -> np.ndarray:
        n = len(self)
        if isinstance(index, slice):
            return np.arange(n, dtype=np.int64)[index]
        arr = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index, dtype=np.int64).reshape(-1)
        if arr.size and (arr.min() < -n or arr.max() >= n):
            raise IndexError(f"row index out of range for a store of {n} rows")
        return np.where(arr < 0, arr + n, arr)

    def rows(self, index: Index, names: str | Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """``{name: tensor [len(index), *shape]}`` for global rows ``index`` (int, slice, or array), in order."""
        wanted = self._names(names)
        scalar = isinstance(index, (int, np.integer))
        rows = self._rows_array([index] if scalar else index)
        shard_of = np.searchsorted(self._offsets, rows, side="right") - 1
        out: dict[str, list[torch.Tensor]] = {n: [] for n in wanted}
        order = np.argsort(shard_of, kind="stable")
        for k in np.unique(shard_of):
            local = rows[shard_of == k] - self._offsets[k]
            lo, hi = int(local.min()), int(local.max()) + 1
            sel = torch.from_numpy(local - lo)
            for n in wanted:
                out[n].append(self._read(int(k), n, lo, hi)[sel])
        inverse = torch.from_numpy(np.argsort(order, kind="stable"))
        result = {n: (torch.cat(v)[inverse] if v else torch.empty(0, *self.shapes.get(n, ()))) for n, v in out.items()}
        return {n: t[0] for n, t in result.items()} if scalar else result

    def __getitem__(self, name: str) -> "StoreColumn":
        self._names([name])
        return StoreColumn(self, name)

    # ------------------------------------------------------------------ iteration
    def batches(self, batch_size: int, shuffle: bool = True, seed: int = 0, names: str | Sequence[str] | None = None,
                buffer_rows: int | None = None, drop_last: bool = False, with_rows: bool = False
                ) -> Iterator[torch.Tensor | dict[str, torch.Tensor]]:
        """Batches of rows. ``names`` a string yields tensors ``[batch, *shape]``; a list (or ``None``: all)
        yields dicts (``"row"`` added with ``with_rows=True``, for provenance).

        With ``shuffle`` the shards are visited in a seeded random order and rows are mixed in a shuffle
        buffer of ``buffer_rows`` rows (default: two shards' worth) spanning shards, as sae-lens's mixing
        buffer does: when the buffer is full it is permuted and the half that leaves is emitted. The
        sequence is a pure function of ``seed``. Memory: about ``buffer_rows`` rows.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        single = isinstance(names, str)
        wanted = self._names(names)
        keys = wanted + (["row"] if with_rows else [])
        max_shard = max((e["n_rows"] for e in self.shards), default=0)
        buffer_rows = buffer_rows or max(2 * max_shard, 2 * batch_size)
        if buffer_rows < 2 * batch_size:
            raise ValueError(f"buffer_rows must be at least 2 * batch_size ({2 * batch_size}), got {buffer_rows}")
        gen = torch.Generator().manual_seed(int(seed))
        order = torch.randperm(len(self.shards), generator=gen).tolist() if shuffle else range(len(self.shards))
        buf: dict[str, torch.Tensor] | None = None

        def emit(b: dict[str, torch.Tensor], n: int) -> Iterator[Any]:
            for i in range(0, n, batch_size):
                part = {k: v[i:i + batch_size] for k, v in b.items()}
                if drop_last and part[keys[0]].shape[0] < batch_size:
                    return
                yield part[wanted[0]] if single else part

        for k in order:
            chunk = self.shard(k, wanted)
            if with_rows:
                chunk["row"] = torch.arange(self._offsets[k], self._offsets[k + 1])
            buf = chunk if buf is None else {n: torch.cat([buf[n], chunk[n]]) for n in keys}
            n_buf = buf[keys[0]].shape[0]
            if shuffle and n_buf >= buffer_rows:
                perm = torch.randperm(n_buf, generator=gen)
                buf = {n: v[perm] for n, v in buf.items()}
                out = (n_buf - buffer_rows // 2) // batch_size * batch_size
            elif not shuffle:
                out = n_buf // batch_size * batch_size
            else:
                continue
            yield from emit({n: v[:out] for n, v in buf.items()}, out)
            buf = {n: v[out:] for n, v in buf.items()}
        if buf is not None and buf[keys[0]].shape[0]:
            n_buf = buf[keys[0]].shape[0]
            if shuffle:
                perm = torch.randperm(n_buf, generator=gen)
                buf = {n: v[perm] for n, v in buf.items()}
            yield from emit(buf, n_buf)

    def dataset(self, names: str | Sequence[str] | None = None) -> "StoreDataset":
        """A ``torch.utils.data.Dataset`` over the rows (map-style; keeps the last-read shard in memory)."""
        return StoreDataset(self, names)

    # ------------------------------------------------------------------ provenance
    def provenance(self, rows: Index):
        """A DataFrame with, per row: ``row``, ``context`` (context id), ``offset`` (position in the
        context), ``document`` (index in the source), ``position`` (in the tokenized document, -1 for an
        inserted BOS/separator) and ``token`` (id)."""
        import pandas as pd

        arr = self._rows_array(rows)
        meta = self.rows(arr, ["context_id", "doc", "pos", "tokens"])
        return pd.DataFrame({"row": arr, "context": meta["context_id"].numpy(), "offset": arr % self.context_size,
                             "document": meta["doc"].numpy(), "position": meta["pos"].numpy(),
                             "token": meta["tokens"].numpy()})

    def context_tokens(self, context: int) -> torch.Tensor:
        """Token ids ``[context_size]`` of one context."""
        start = int(context) * self.context_size
        return self.rows(slice(start, start + self.context_size), "tokens")["tokens"]

    def text(self, row: int, tokenizer, window: int = 16, marker: tuple[str, str] = ("[[", "]]")) -> str:
        """The text around ``row`` (``window`` tokens on each side inside its context), the row's token
        wrapped in ``marker``: for showing a feature's top activations."""
        row = int(self._rows_array([row])[0])
        ctx, off = divmod(row, self.context_size)
        toks = self.context_tokens(ctx).tolist()
        lo, hi = max(0, off - window), min(self.context_size, off + window + 1)
        return (tokenizer.decode(toks[lo:off]) + marker[0] + tokenizer.decode(toks[off:off + 1]) + marker[1]
                + tokenizer.decode(toks[off + 1:hi]))


class StoreColumn:
    """One stored name, indexable like a tensor along rows without loading the store: ``col[i]``,
    ``col[a:b]``, ``col[index_tensor]``; ``col.load()`` reads it all."""

    def __init__(self, store: ActivationStore, name: str) -> None:
        self.store, self.name = store, name

    def __len__(self) -> int:
        return len(self.store)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.store), *self.store.shapes.get(self.name, ()))

    def __getitem__(self, index: Index) -> torch.Tensor:
        return self.store.rows(index, self.name)[self.name]

    def load(self) -> torch.Tensor:
        return torch.cat([self.store.shard(k, self.name)[self.name] for k in range(len(self.store.shards))])


class StoreDataset(torch.utils.data.Dataset):
    """Map-style dataset: item ``i`` is row ``i`` (a tensor for one name given as a string, else a dict)."""

    def __init__(self, store: ActivationStore, names: str | Sequence[str] | None = None) -> None:
        self.store = store
        self.single = isinstance(names, str)
        self.names = store._names(names)
        self._cached: tuple[int, dict[str, torch.Tensor]] | None = None

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int):
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} out of range for a store of {len(self)} rows")
        i = i % len(self)
        k = int(np.searchsorted(self.store._offsets, i, side="right") - 1)
        if self._cached is None or self._cached[0] != k:
            self._cached = (k, self.store.shard(k, self.names))
        local = i - int(self.store._offsets[k])
        item = {n: v[local] for n, v in self._cached[1].items()}
        return item[self.names[0]] if self.single else item


__all__ = ["ActivationStore", "StoreColumn", "StoreDataset"]
