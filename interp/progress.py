"""The one progress helper of the toolkit: tqdm bars that a user (or a test) can silence.

Analyzers never print; long loops go through :func:`progress`. Silence globally with
``interp.set_progress(False)`` or the environment variable ``INTERP_PROGRESS=0``.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
_enabled: bool = os.environ.get("INTERP_PROGRESS", "1") not in {"0", "false", "False", "no"}


def set_progress(enabled: bool) -> None:
    """Turn progress bars on or off for the whole process."""
    global _enabled
    _enabled = bool(enabled)


def progress_enabled() -> bool:
    return _enabled


def progress(iterable: Iterable[T] | None = None, desc: str | None = None, total: int | None = None,
             leave: bool = False, **kwargs) -> Iterator[T]:
    """Wrap ``iterable`` in a tqdm bar unless progress is silenced. Also usable with ``total`` only."""
    return tqdm(iterable, desc=desc, total=total, leave=leave, disable=not _enabled, **kwargs)
