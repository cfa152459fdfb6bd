"""Pack documents into fixed-length contexts the way sae-lens does, keeping row provenance.

sae-lens (``sae_lens.tokenization_and_batching.concat_and_batch_sequences`` as called by its
``ActivationsStore`` with ``prepend_bos=True`` and the default ``sequence_separator_token="bos"``)
tokenizes every document *without* special tokens, concatenates the documents and cuts the stream into
contexts of exactly ``context_size`` tokens:

- every context starts with BOS (``begin_batch_token``), unless its first token already is BOS;
- between two documents inside one context a separator (BOS by default) is inserted, unless the next
  document already starts with it;
- a document longer than the room left continues in the next context (after that context's BOS);
- the last, incomplete context is dropped.

:func:`pack` reproduces exactly this token stream (a test compares it with sae-lens's own function) and
records for every token its document index and its position in the tokenized document (``-1`` for an
inserted BOS/separator), which the store keeps as row provenance.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

TOKENIZE_CHUNK = 64  # documents tokenized per call of the (fast, batched) tokenizer


@dataclass
class Context:
    """One packed context: ``tokens``, ``doc`` and ``pos`` are int64 arrays of length ``context_size``."""

    tokens: np.ndarray
    doc: np.ndarray
    pos: np.ndarray


def special_token_id(tokenizer, which: str | int | None) -> int | None:
    """``"bos"``/``"eos"``/``"sep"``/an id/``None`` -> token id (``ValueError`` if the tokenizer has none)."""
    if which is None or isinstance(which, int):
        return which
    if which not in ("bos", "eos", "sep"):
        raise ValueError(f"special token must be 'bos', 'eos', 'sep', an int or None; got {which!r}")
    if tokenizer is None:
        raise ValueError(f"a {which!r} token needs a tokenizer; pass token ids for the special tokens instead")
    tid = getattr(tokenizer, f"{which}_token_id", None)
    if tid is None:
        raise ValueError(f"the tokenizer has no {which} token; set the option to an explicit id or None")
    return int(tid)


def tokenized(documents: Iterable[str | np.ndarray], tokenizer) -> Iterator[np.ndarray]:
    """Token ids (1-D int64) per document; text is tokenized in chunks without special tokens."""
    pending: list[str] = []

    def flush() -> Iterator[np.ndarray]:
        if pending:
            enc = tokenizer(pending, add_special_tokens=False)["input_ids"]
            for ids in enc:
                yield np.asarray(ids, dtype=np.int64)
            pending.clear()

    for d in documents:
        if isinstance(d, str):
            if tokenizer is None:
                raise ValueError("text data needs a model with a tokenizer; pass token ids instead")
            pending.append(d)
            if len(pending) >= TOKENIZE_CHUNK:
                yield from flush()
        else:
            yield from flush()
            yield np.asarray(d, dtype=np.int64).reshape(-1)
    yield from flush()


def pack(token_docs: Iterable[np.ndarray], context_size: int, bos_id: int | None,
         separator_id: int | None) -> Iterator[Context]:
    """Pack token documents into :class:`Context` objects of ``context_size`` tokens (sae-lens rules)."""
    if context_size < 1 or (bos_id is not None and context_size < 2):
        raise ValueError(f"context_size must be >= 2 with a BOS token (>= 1 without), got {context_size}")
    tokens = np.empty(context_size, np.int64)
    doc = np.empty(context_size, np.int64)
    pos = np.empty(context_size, np.int64)
    n = 0

    def put(ids: np.ndarray, d: int, p: np.ndarray) -> None:
        nonlocal n
        k = len(ids)
        tokens[n:n + k], doc[n:n + k], pos[n:n + k] = ids, d, p
        n += k

    for d, toks in enumerate(token_docs):
        offset, length = 0, len(toks)
        while offset < length:
            if n == 0:
                marker = bos_id
                room = context_size
            else:
                marker = separator_id
                room = context_size - n
            if marker is not None and toks[offset] != marker:
                put(np.array([marker], np.int64), d, np.array([-1], np.int64))
                room -= 1
            take = min(room, length - offset)
            put(toks[offset:offset + take], d, np.arange(offset, offset + take))
            offset += take
            if n == context_size:
                yield Context(tokens.copy(), doc.copy(), pos.copy())
                n = 0


__all__ = ["Context", "pack", "tokenized", "special_token_id", "TOKENIZE_CHUNK"]
