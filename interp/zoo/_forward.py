"""Old module paths of the zoo's builders, kept working for one release (removed in interp 0.2).

The built-in entries' builders moved to the applications (:mod:`interp.apps.zoo`, issue #45) and the toy grammar
to :mod:`interp.data.grammar`. The old modules forward attribute access with a ``DeprecationWarning``; the
targets are module *names*, imported only when old code reads an old name, so the kernel never imports the
applications by itself.
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Mapping


def forward(old: str, targets: Mapping[str, str], default: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old``: attribute ``name`` comes from module ``targets.get(name, default)``."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        new = targets.get(name, default)
        module = importlib.import_module(new)
        if not hasattr(module, name):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(f"{old}.{name} moved to {new}.{name}; the old path works until interp 0.2",
                      DeprecationWarning, stacklevel=2)
        return getattr(module, name)

    return __getattr__
