"""Moved: the training kit is :mod:`interp.training`. This module re-exports its former names for one release
(each access warns); import them from :mod:`interp.training`."""
from __future__ import annotations

import warnings
from typing import Any

_MOVED = ("LMTrainConfig", "SCHEDULES", "SPECIALS", "default_loss", "train_lm", "warmup_cosine", "word_level_tokenizer")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(f"interp.zoo.training.{name} moved to interp.training.{name}; the old path goes in the next "
                      "release", DeprecationWarning, stacklevel=2)
        from .. import training

        return getattr(training, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(_MOVED)
