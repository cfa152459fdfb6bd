"""One registry helper for everything that plugs in by name: backends, audit checks, steering methods
and zoo entries all follow the same rules.

* **Registering**: ``reg.register(obj, name)`` for this process (also usable as a decorator); a second,
  different object under a taken name is refused (``replace=True`` overrides). Entry points of the
  registry's group (``[project.entry-points."<group>"]`` in a package's ``pyproject.toml``) are found
  without importing them.
* **Listing**: ``reg.available()`` is every name, registered or declared, sorted; it never imports a
  plug-in, so a broken one cannot hide the others. ``reg.available(load=True)`` first imports every
  declared plug-in (:meth:`Registry.load_all`): needed where one entry point declares a *family* of names
  (a zoo plug-in returning several entries), whose names are known only once it is imported. A plug-in that
  fails there is a ``RuntimeWarning`` naming it and the cause, and its name stays listed.
* **Getting**: ``reg.get(name)`` imports a declared plug-in on first use and validates it; an unknown
  name raises ``reg.error`` naming the closest names; a plug-in that fails to import or validate raises
  :class:`PluginError` (an ``ImportError``, and a ``KeyError`` for callers of a lookup) naming the plug-in,
  its target and the cause (never silently dropped; asking again raises the same error).
* **Families** (``expand=``): a registry whose entry points may yield several items passes
  ``expand(obj, entry_point_name) -> {name: item}``; every item is validated and registered when the plug-in
  loads. An item equal to one already registered (the plug-in's module registered it on import) is kept
  as it is; a *different* object under a taken name makes the plug-in fail (the duplicate rule).
"""
from __future__ import annotations

import difflib
import threading
import warnings
from importlib import metadata
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name is not in a registry (both a KeyError and a ValueError, for callers expecting either)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class PluginError(ImportError, KeyError):
    """A declared plug-in failed to import or validate (an ImportError; also a KeyError, for lookups)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _ep_key(ep: Any) -> Any:
    """Identity of an entry point across scans (objects without a name are keyed by identity)."""
    name = getattr(ep, "name", None)
    return (name, getattr(ep, "value", None), getattr(ep, "group", None)) if name else id(ep)


class Registry(Generic[T]):
    """Named objects of one ``kind`` (e.g. ``"audit check"``), with entry-point group ``group``.

    ``validate(obj, name)`` raises (``TypeError``/``ValueError``) for an object that may not be registered;
    ``error`` is the exception class of unknown names; ``expand`` turns a loaded entry point into several
    named items (see the module docstring).
    """

    def __init__(self, kind: str, group: str | None = None, validate: Callable[[Any, str], None] | None = None,
                 error: type[Exception] = UnknownNameError,
                 expand: Callable[[Any, str], Mapping[str, T]] | None = None) -> None:
        self.kind, self.group, self._validate, self.error, self._expand = kind, group, validate, error, expand
        self._items: dict[str, T] = {}
        self._loaded: dict[Any, tuple[str, ...]] = {}  # entry point -> names it provided
        self._failed: dict[Any, PluginError] = {}  # entry point -> why it failed
        self._lock = threading.RLock()

    # -- registering
    def register(self, obj: T | None = None, name: str | None = None, replace: bool = False):
        """Register ``obj`` as ``name`` (default ``obj.name``); returns ``obj`` (or a decorator)."""
        if obj is None:
            return lambda o: self.register(o, name, replace)
        name = name or getattr(obj, "name", None)
        if self._validate is not None:
            self._validate(obj, name)
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {self.kind} needs a non-empty string name, got {name!r}")
        with self._lock:
            old = self._items.get(name)
            if old is not None and old is not obj and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered ({_describe(old)}); pass "
                                 "replace=True to override it")
            self._items[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        """Forget ``name`` in this process (no error if absent); a plug-in declared under that name loads again
        on the next :meth:`get` (a member of a family stays forgotten: its plug-in is not loaded again)."""
        with self._lock:
            self._items.pop(name, None)
            for key, names in list(self._loaded.items()):
                if names == (name,):
                    del self._loaded[key]

    # -- listing
    def entry_points(self) -> dict[str, Any]:
        """Declared plug-ins of the group, by entry-point name (nothing is imported)."""
        if self.group is None:
            return {}
        out: dict[str, Any] = {}
        for i, ep in enumerate(metadata.entry_points(group=self.group)):
            out[getattr(ep, "name", None) or f"<{self.kind} plug-in {i}>"] = ep
        return out

    def available(self, load: bool = False) -> list[str]:
        """Every registered or declared name, sorted. Nothing is imported unless ``load`` (see
        :meth:`load_all`); a loaded family is listed by the names it provides, not by its entry point's."""
        if load:
            self.load_all()
        with self._lock:
            names = set(self._items)
            for n, ep in self.entry_points().items():
                provided = self._loaded.get(_ep_key(ep))
                if provided is None or n in provided:
                    names.add(n)
        return sorted(names)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self.entry_points()

    def load_all(self, warn: bool = True) -> dict[str, PluginError]:
        """Import every declared plug-in not loaded yet; returns ``{entry point: error}`` of those that failed
        (each a ``RuntimeWarning`` when it first fails, if ``warn``). The others are registered."""
        failed: dict[str, PluginError] = {}
        for n, ep in self.entry_points().items():
            key = _ep_key(ep)
            if key in self._loaded:
                continue
            fresh = key not in self._failed
            try:
                self._load(n, ep)
            except PluginError as exc:
                failed[n] = exc
                if warn and fresh:
                    warnings.warn(str(exc), RuntimeWarning, stacklevel=3)
        return failed

    # -- getting
    def _load(self, name: str, ep: Any) -> tuple[str, ...]:
        """Import entry point ``ep`` (declared as ``name``) and register what it provides; raises PluginError."""
        key = _ep_key(ep)
        with self._lock:
            if key in self._failed:
                raise self._failed[key]
            if key in self._loaded:
                return self._loaded[key]
            try:
                obj = ep.load()
                items = dict(self._expand(obj, name)) if self._expand is not None else {name: obj}
                for n, item in items.items():
                    if self._validate is not None:
                        self._validate(item, n)
                    old = self._items.get(n)
                    if old is not None and old is not item and old != item:
                        raise ValueError(f"it provides {self.kind} {n!r}, which is already registered as a "
                                         f"different object ({_describe(old)})")
            except Exception as exc:  # noqa: BLE001 - a broken plug-in must say which one and why
                err = PluginError(f"{self.kind} plug-in {name!r} ({getattr(ep, 'value', ep)}) failed to load: "
                                  f"{type(exc).__name__}: {exc}")
                err.__cause__ = exc
                self._failed[key] = err
                raise err from exc
            for n, item in items.items():
                self._items.setdefault(n, item)
            self._loaded[key] = tuple(items)
            return self._loaded[key]

    def get(self, name: str) -> T:
        """The object registered or declared as ``name`` (imports its plug-in on first use)."""
        if not isinstance(name, str):
            raise TypeError(f"a {self.kind} name must be a string, got {type(name).__name__}: {name!r}")
        with self._lock:
            if name in self._items:
                return self._items[name]
        eps = self.entry_points()
        if name in eps:
            provided = self._load(name, eps[name])
            if name in self._items:
                return self._items[name]
            raise self.error(f"{self.kind} plug-in {name!r} ({getattr(eps[name], 'value', '?')}) declares a family, "
                             f"not one {self.kind}; it provides: {', '.join(sorted(provided)) or '(nothing)'}")
        failed = self.load_all() if self._expand is not None else {}  # a family may provide it
        with self._lock:
            if name in self._items:
                return self._items[name]
        known = self.available()
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        broken = f"; plug-ins that failed to load: {'; '.join(map(str, failed.values()))}" if failed else ""
        raise self.error(f"unknown {self.kind} {name!r}{hint}; available: {', '.join(known) or '(none)'}{broken}")


def _describe(obj: Any) -> str:
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{mod}.{qual}" if mod and qual else type(obj).__name__


__all__ = ["PluginError", "Registry", "UnknownNameError"]
