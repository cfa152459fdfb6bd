"""Old import paths of modules that moved, kept working for one release (deprecated in 0.1, removed in 0.2).

The applications moved out of the kernel into :mod:`interp.apps` (issue #45)::

    interp.audit            -> interp.apps.audit       (its ``base`` -> interp.checks)
    interp.reproduce        -> interp.apps.reproduce
    interp.cli              -> interp.apps.cli
    interp.store.cli        -> interp.apps.store_cli
    interp.store.ray_engine -> interp.apps.ray_engine
    interp.zoo.cli          -> interp.apps.zoo.cli

and the audit checks got one file name (``audit_check.py``)::

    interp.probes.audit_checks -> interp.probes.heads.audit_check
    interp.probes.gavel.audit  -> interp.probes.gavel.audit_check

Each old package or module is a thin alias (``interp/audit/__init__.py`` and so on) that calls :func:`alias`:
it emits a ``DeprecationWarning`` naming the new path and makes the old name *the same module object* as the
new one; a finder on ``sys.meta_path`` does the same for every old submodule (``import interp.audit.runner`` is
``interp.apps.audit.runner``), so a class imported under either name is one class (registries and
``isinstance`` agree).

A module whose names went to *several* new modules cannot be one module object; it stays as a thin module whose
``__getattr__`` is :func:`forward` (listed in :data:`FORWARDED`): each name read warns and returns the new
module's object (the same object, so identity holds name by name). The zoo's builders moved this way::

    interp.zoo.grammar -> interp.data.grammar (the grammar), interp.apps.zoo.grammar (the model and its metrics)
    interp.zoo.real    -> interp.apps.zoo.real
    interp.zoo.refusal -> interp.apps.zoo.refusal

This module is the one mechanism for every moved path. Nothing here imports an application by itself: the
targets are names, imported only when old code asks for an old path.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any, Callable

#: old module path -> new module path (a submodule of an old package maps to the same submodule of the new one,
#: unless it is listed itself)
MOVED: dict[str, str] = {
    "interp.audit.base": "interp.checks",
    "interp.audit": "interp.apps.audit",
    "interp.reproduce": "interp.apps.reproduce",
    "interp.cli": "interp.apps.cli",
    "interp.store.cli": "interp.apps.store_cli",
    "interp.store.ray_engine": "interp.apps.ray_engine",
    "interp.zoo.cli": "interp.apps.zoo.cli",
    # one file name per plug-in kind: an analyzer's audit check is its package's audit_check.py
    "interp.probes.audit_checks": "interp.probes.heads.audit_check",
    "interp.probes.gavel.audit": "interp.probes.gavel.audit_check",
}


def new_name(old: str) -> str | None:
    """The new path of module ``old`` (``None`` if it did not move); the longest listed prefix wins."""
    for prefix in sorted(MOVED, key=len, reverse=True):
        if old == prefix or old.startswith(prefix + "."):
            return MOVED[prefix] + old[len(prefix):]
    return None


#: the old modules that stay and forward each name read (their names went to several new modules): old path ->
#: (the new module of every name not listed, {name: its new module})
_GRAMMAR_APP = "interp.apps.zoo.grammar"
FORWARDED: dict[str, tuple[str, dict[str, str]]] = {
    "interp.zoo.grammar": ("interp.data.grammar", {n: _GRAMMAR_APP for n in ("ToyGrammarConfig", "make_tokenizer",
                                                                             "evaluate", "build_toy_grammar")}),
    "interp.zoo.real": ("interp.apps.zoo.real", {}),
    "interp.zoo.refusal": ("interp.apps.zoo.refusal", {}),
}


def _warn(old: str, new: str, stacklevel: int = 4, hint: str = "") -> None:
    """The one deprecation message of a moved path (``old`` a module, or ``module.name``)."""
    warnings.warn(f"{old} moved to {new}; the old path works until interp 0.2{hint}", DeprecationWarning,
                  stacklevel=stacklevel)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn(self.old, self.new, hint=f" (import {self.new} instead)")
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The target module ran already (imported under its new name)."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves an old submodule path to the module already imported (or imported now) under its new path."""

    def find_spec(self, fullname: str, path=None, target=None):
        new = new_name(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new))


_FINDER = _AliasFinder()


def alias(old: str) -> ModuleType:
    """Make module ``old`` (the caller's ``__name__``) an alias of its new module, with a deprecation warning;
    installs the finder that aliases its submodules. Returns the new module."""
    new = new_name(old)
    if new is None:
        raise ValueError(f"{old!r} is not a moved module; moved: {', '.join(MOVED)}")
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    _warn(old, new, hint=f" (import {new} instead)")
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module


def forward(old: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``old`` (the caller's ``__name__``, listed in :data:`FORWARDED`): name ``n``
    comes from its new module, with a ``DeprecationWarning`` naming ``new.n``; a name the new module lacks is an
    ``AttributeError`` naming the old module."""
    if old not in FORWARDED:
        raise ValueError(f"{old!r} is not a forwarded module; forwarded: {', '.join(FORWARDED)}")
    default, targets = FORWARDED[old]

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        new = targets.get(name, default)
        module = importlib.import_module(new)
        if not hasattr(module, name):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        _warn(f"{old}.{name}", f"{new}.{name}", stacklevel=3)
        return getattr(module, name)

    return __getattr__


__all__ = ["FORWARDED", "MOVED", "alias", "forward", "new_name"]
