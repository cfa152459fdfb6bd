"""Data helpers shared by the ``models/`` papers: data splits, mini-batch loops, LM windows, Fashion-MNIST.

Keep paper-independent data helpers here so each paper module holds only its own method. Seeding, thread
limits and learning-rate schedules are the training kit's (:mod:`interp.training`); ``set_seed``,
``limit_threads`` and ``warmup_cosine`` (now :func:`interp.training.warmup_cosine_fraction`) are re-exported here
for one release (each access warns).
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch


@dataclass
class Split:
    """A train/test split of tensors: ``x_*`` ``[n, ...]`` and ``y_*`` ``[n]`` or ``[n, k]``."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def digits_split(seed: int = 0, test_size: float = 0.25, scale: bool = True) -> Split:
    """scikit-learn's bundled digits (1,797 images 8x8) as float tensors, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = data.data.astype(np.float32) / (16.0 if scale else 1.0)
    y = data.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_size, random_state=seed, stratify=y)
    return Split(torch.from_numpy(xtr), torch.from_numpy(ytr), torch.from_numpy(xte), torch.from_numpy(yte))


def minibatches(n: int, batch_size: int, generator: torch.Generator | None = None,
                shuffle: bool = True) -> Iterator[torch.Tensor]:
    """Yield index tensors covering ``range(n)`` in batches (shuffled with ``generator``)."""
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of rows whose argmax equals the label."""
    return (logits.argmax(-1) == labels).float().mean().item()


def random_windows(tokens: torch.Tensor, batch_size: int, seq_len: int,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token LM batch from a 1-D token stream ``tokens`` ``[N]``.

    Returns inputs and targets ``[batch_size, seq_len]`` (int64), the targets shifted by one position,
    from windows starting at uniformly random offsets drawn with ``generator``.
    """
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be a 1-D stream, got shape {tuple(tokens.shape)}")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size} and {seq_len}")
    high = tokens.numel() - seq_len
    if high < 1:
        raise ValueError(f"stream of {tokens.numel()} tokens is too short for windows of {seq_len + 1}")
    starts = torch.randint(0, high, (batch_size,), generator=generator)
    windows = tokens[starts[:, None] + torch.arange(seq_len + 1)].long()
    return windows[:, :-1], windows[:, 1:]


#: where Debian's ``dataset-fashion-mnist`` puts the idx files (``scripts/setup.sh`` installs it as root, offline)
FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"


def has_fashion_mnist(root: str = FASHION_MNIST_ROOT) -> bool:
    """Whether the Fashion-MNIST idx files are installed under ``root``."""
    return Path(root, "train-images-idx3-ubyte.gz").is_file() and Path(root, "t10k-images-idx3-ubyte.gz").is_file()


def load_fashion_mnist(split: str = "train", root: str = FASHION_MNIST_ROOT,
                       limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST images ``[n, 28, 28]`` uint8 and labels ``[n]`` from the idx ``*-ubyte.gz`` files (16-byte
    image header, 8-byte label header); ``limit``: only the first ``limit`` images (decompresses only those).
    Memoised per ``(split, root, limit)``; the arrays are read-only."""
    if split not in ("train", "t10k"):
        raise ValueError(f"split must be 'train' or 't10k', got {split!r}")
    return _fashion_cached(split, str(root), None if limit is None else int(limit))


@functools.lru_cache(maxsize=8)
def _fashion_cached(split: str, root: str, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    import gzip

    with gzip.open(Path(root) / f"{split}-images-idx3-ubyte.gz") as f:
        data = f.read(-1 if limit is None else 16 + 784 * limit)
        x = np.frombuffer(data, np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(Path(root) / f"{split}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)[:len(x)]
    y.setflags(write=False)
    return x, y


#: former names of this module -> their place in the training kit (re-exported for one release)
_MOVED = {"set_seed": "set_seed", "limit_threads": "limit_threads", "warmup_cosine": "warmup_cosine_fraction"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(f"interp.models.common.{name} moved to interp.training.{_MOVED[name]}; the old path goes in "
                      "the next release", DeprecationWarning, stacklevel=2)
        from interp import training

        return getattr(training, _MOVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
