"""Where audit checks come from: the entry-point group ``interp.checks``, in one place.

A package declares its checks in its ``pyproject.toml``::

    [project.entry-points."interp.checks"]
    heads = "interp.probes.heads.audit_check:HeadsCheck"

and ``interp audit --checks heads`` finds it; the built-in checks are declared the same way, so
``interp`` itself imports no analyzer package. A check module is named ``audit_check.py`` (beside the analyzer
it runs). Entry points are read from the installed package's metadata, so a new one is visible only after
reinstalling (``pip install -e .``). :func:`register_check` adds a check for the current process only (handy in
notebooks and tests).
"""
from __future__ import annotations

from typing import Any

from interp.registry import Registry

GROUP = "interp.checks"


class UnknownCheckError(ValueError):
    """A requested check name is not registered."""


def _validate(cls: Any, name: str) -> None:
    missing = [a for a in ("run", "render") if not callable(getattr(cls, a, None))]
    if not name or missing or not isinstance(cls, type):
        raise TypeError(f"{cls!r} is not an audit check: it needs a class with a `name`, `run(model, data)` and "
                        f"`render(result)` (missing: {', '.join(missing) or 'name'})")


#: the audit checks (entry-point group ``interp.checks``), under the shared registry rules
CHECKS: Registry[type] = Registry("audit check", GROUP, validate=_validate, error=UnknownCheckError)


def available_checks() -> list[str]:
    """Names of every check: entry points plus :func:`register_check` ones, sorted."""
    return CHECKS.available()


def register_check(cls: type, name: str | None = None, replace: bool = False) -> type:
    """Register ``cls`` under ``name`` (default ``cls.name``) for this process; usable as a decorator."""
    return CHECKS.register(cls, name, replace)


def unregister_check(name: str) -> None:
    CHECKS.unregister(name)


def get_check(name: str) -> type:
    """The check class registered as ``name`` (loads its entry point)."""
    try:
        return CHECKS.get(name)
    except UnknownCheckError as exc:
        if not available_checks():
            raise UnknownCheckError(f"{exc} — is the project installed (pip install -e .)?") from None
        raise


def _opt_in(name: str) -> bool:
    try:
        return bool(getattr(get_check(name), "opt_in", False))
    except ImportError:
        return False  # a broken plug-in is kept, so that running it reports why


def parse_checks(spec: str | None) -> list[str]:
    """``"heads,foo"`` -> ``["heads", "foo"]`` validated; ``"all"`` -> every available check; ``None`` /
    ``"default"`` -> every check except the opt-in ones (a check whose class sets ``opt_in = True`` runs only
    when named or with ``"all"``: ``gavel`` needs a rule file, ``raptor`` a vision transformer). Under ``"all"``
    a check that does not apply to the model (its ``missing()`` / ``applies(model)``) is recorded as ``skipped``."""
    key = None if spec is None else spec.strip().lower()
    if key in (None, "default", "all"):
        names = available_checks()
        if not names:
            raise UnknownCheckError("no audit checks are registered — is the project installed (pip install -e .)?")
        if key != "all":
            names = [n for n in names if not _opt_in(n)]
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
