"""Small helpers shared by the zoo builders: package folders, quiet transformers, a few text utilities."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

from ..data._packages import package_dir  # noqa: F401  (re-used by the recipes)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own logging and progress bars inside the block (ours report progress)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    root_level = logging.getLogger("transformers").level
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
        logging.getLogger("transformers").setLevel(root_level)



@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op torch threads (``None``: leave as is); restores the old count."""
    import torch

    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def warmup_cosine_schedule(optimizer, warmup: int, steps: int, floor: float = 0.05):
    """``LambdaLR``: linear warm-up over ``warmup`` steps, then cosine decay from 1 to ``floor`` at ``steps``."""
    import torch

    from .training import warmup_cosine

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, warmup, steps, floor))
