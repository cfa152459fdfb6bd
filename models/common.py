"""Training utilities shared by the ``models/`` papers: seeding, data splits and mini-batch loops.

Keep paper-independent helpers here so each paper module holds only its own method.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
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
