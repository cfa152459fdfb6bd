"""One registry helper for everything that plugs in by name: backends, audit checks, steering methods
and zoo entries all follow the same rules.

* **Registering**: ``reg.register(obj, name)`` for this process (also usable as a decorator); a second,
  different object under a taken name is refused (``replace=True`` overrides). Entry points of the
  registry's group (``[project.entry-points."<group>"]`` in a package's ``pyproject.toml``) are found
  without importing them.
* **Listing**: ``reg.available()`` is every name, registered or declared, sorted; listing never imports a
  plug-in, so a broken one cannot hide the others.
* **Getting**: ``reg.get(name)`` imports a declared plug-in on first use and validates it; an unknown
  name raises ``reg.error`` naming the closest names; a plug-in that fails to import or validate raises
  ``ImportError`` naming the plug-in, its target and the cause (never silently dropped).
"""
from __future__ import annotations

import difflib
import threading
from importlib import metadata
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name is not in a registry (both a KeyError and a ValueError, for callers expecting either)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Named objects of one ``kind`` (e.g. ``"audit check"``), with entry-point group ``group``."""

    def __init__(self, kind: str, group: str | None = None, validate: Callable[[Any, str], None] | None = None,
                 error: type[Exception] = UnknownNameError) -> None:
        self.kind, self.group, self._validate, self.error = kind, group, validate, error
        self._items: dict[str, T] = {}
        self._lock = threading.RLock()

    # -- registering
    def register(self, obj: T | None = None, name: str | None = None, replace: bool = False):
        """Register ``obj`` as ``name`` (default ``obj.name``); returns ``obj`` (or a decorator)."""
        if obj is None:
            return lambda o: self.register(o, name, replace)
        name = name or getattr(obj, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {self.kind} needs a non-empty string name, got {name!r}")
        if self._validate is not None:
            self._validate(obj, name)
        with self._lock:
            old = self._items.get(name)
            if old is not None and old is not obj and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered (pass replace=True to override)")
            self._items[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        with self._lock:
            self._items.pop(name, None)

    # -- listing
    def entry_points(self) -> dict[str, metadata.EntryPoint]:
        if self.group is None:
            return {}
        return {ep.name: ep for ep in metadata.entry_points(group=self.group)}

    def available(self) -> list[str]:
        """Every registered or declared name, sorted (nothing is imported)."""
        return sorted(set(self._items) | set(self.entry_points()))

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self.entry_points()

    # -- getting
    def get(self, name: str) -> T:
        if not isinstance(name, str):
            raise TypeError(f"a {self.kind} name must be a string, got {type(name).__name__}: {name!r}")
        with self._lock:
            if name in self._items:
                return self._items[name]
        eps = self.entry_points()
        if name not in eps:
            known = self.available()
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise self.error(f"unknown {self.kind} {name!r}{hint}; available: {', '.join(known) or '(none)'}")
        ep = eps[name]
        try:
            obj = ep.load()
            if self._validate is not None:
                self._validate(obj, name)
        except Exception as exc:  # noqa: BLE001 - a broken plug-in must say which one and why
            raise ImportError(f"{self.kind} plug-in {name!r} ({ep.value}) failed to load: "
                              f"{type(exc).__name__}: {exc}") from exc
        with self._lock:
            return self._items.setdefault(name, obj)


__all__ = ["Registry", "UnknownNameError"]
