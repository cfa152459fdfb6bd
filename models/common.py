"""Training utilities shared by the ``models/`` papers: seeding, data splits and mini-batch loops.

Keep paper-independent helpers here so each paper module holds only its own method.
"""
from __future__ import annotations

import contextlib
import functools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch


def set_seed(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a torch generator seeded the same way."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


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


def warmup_cosine(step: int, total_steps: int, warmup_frac: float = 0.1, final_frac: float = 0.1) -> float:
    """Learning-rate factor at ``step`` (0-based): linear warm-up over ``warmup_frac`` of the run, then a
    cosine decay from 1 to ``final_frac`` at the last step."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    warmup = int(round(warmup_frac * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    span = max(total_steps - 1 - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + float(np.cos(np.pi * progress)))


@contextlib.contextmanager
def limit_threads(num_threads: int | None) -> Iterator[None]:
    """Temporarily cap torch's intra-op threads and the BLAS/OpenMP pools of NumPy/SciPy (``None``: no change).

    Small-matrix workloads (batched QR, tiny einsums, many small least-squares fits) run far faster
    single-threaded on a busy CPU, where spinning BLAS threads otherwise dominate. Restores on exit.
    """
    if num_threads is None:
        yield
        return
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        with threadpool_limits(limits=num_threads):
            yield
    finally:
        torch.set_num_threads(before)


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
