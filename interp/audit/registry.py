"""Where audit checks come from: the entry-point group ``interp.checks``, in one place.

A package declares its checks in its ``pyproject.toml``::

    [project.entry-points."interp.checks"]
    heads = "probes.audit_checks:HeadsCheck"

and ``interp audit --checks heads`` finds it; the built-in checks are declared the same way, so
``interp`` itself imports no analyzer package. :func:`register_check` adds a check for the current
process only (handy in notebooks and tests).
"""
from __future__ import annotations

from importlib import metadata
from typing import Any

GROUP = "interp.checks"
_registered: dict[str, type] = {}


class UnknownCheckError(ValueError):
    """A requested check name is not registered."""


def _entry_points() -> dict[str, metadata.EntryPoint]:
    eps = metadata.entry_points()
    selected = eps.select(group=GROUP) if hasattr(eps, "select") else eps.get(GROUP, [])  # type: ignore[union-attr]
    return {ep.name: ep for ep in selected}


def available_checks() -> list[str]:
    """Names of every check: entry points plus :func:`register_check` ones, sorted."""
    return sorted(set(_entry_points()) | set(_registered))


def register_check(cls: type, name: str | None = None) -> type:
    """Register ``cls`` under ``name`` (default ``cls.name``) for this process; usable as a decorator."""
    _validate(cls, name or getattr(cls, "name", ""))
    _registered[name or cls.name] = cls
    return cls


def unregister_check(name: str) -> None:
    _registered.pop(name, None)


def _validate(cls: Any, name: str) -> None:
    missing = [a for a in ("run", "render") if not callable(getattr(cls, a, None))]
    if not name or missing or not isinstance(cls, type):
        raise TypeError(f"{cls!r} is not an audit check: it needs a class with a `name`, `run(model, data)` and "
                        f"`render(result)` (missing: {', '.join(missing) or 'name'})")


def get_check(name: str) -> type:
    """The check class registered as ``name`` (loads its entry point)."""
    if name in _registered:
        return _registered[name]
    eps = _entry_points()
    if name not in eps:
        known = available_checks()
        raise UnknownCheckError(f"unknown check {name!r}; available checks: {', '.join(known) or '(none registered)'}"
                                + ("" if known else " — is the project installed (pip install -e .)?"))
    try:
        cls = eps[name].load()
    except Exception as exc:  # noqa: BLE001 - a broken plug-in must say which one
        raise ImportError(f"check {name!r} ({eps[name].value}) failed to load: {exc}") from exc
    _validate(cls, name)
    return cls


def parse_checks(spec: str | None) -> list[str]:
    """``"heads,foo"`` -> ``["heads", "foo"]`` validated; ``None``/``"all"`` -> every available check."""
    if spec is None or spec.strip().lower() == "all":
        names = available_checks()
        if not names:
            raise UnknownCheckError("no audit checks are registered — is the project installed (pip install -e .)?")
        return names
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise UnknownCheckError("--checks is empty; give a comma-separated list such as 'heads'")
    known = set(available_checks())
    bad = [n for n in names if n not in known]
    if bad:
        raise UnknownCheckError(f"unknown check{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))}; available "
                                f"checks: {', '.join(sorted(known)) or '(none registered)'}")
    return list(dict.fromkeys(names))


__all__ = ["GROUP", "available_checks", "register_check", "unregister_check", "get_check", "parse_checks",
           "UnknownCheckError"]
