"""The audit-check interface (kernel): what an analyzer implements to appear in ``interp audit``.

This module is the one place analyzers import the audit's types from: the application (:mod:`interp.apps.audit`:
the runner, the registry, the report, the CLI) imports it, never the other way round (``tests/test_import_layers.py``).

A check is a class with

* ``name`` (the CLI name, e.g. ``"heads"``), ``title`` and ``description``;
* ``Config``: a dataclass whose defaults are the method's defaults (``interp audit --set heads.fraction=0.2``
  overrides a field);
* ``run(model, data) -> Result``: the analysis, returning a typed :class:`interp.results.Result`;
* ``render(result) -> Rendered``: HTML text, plotly figures and tables for the report;
* optionally ``summary(result) -> dict`` (a few headline numbers for the overview and ``results.json``) and
  ``to_json(result) -> dict`` (the machine-readable payload; defaults to ``result.to_dict()``);
* optionally ``METRICS`` (``{name: description}``, the headline metrics a lab can gate on with
  ``--fail-if 'CHECK.NAME > X'``, plotted against the training step and diffed by ``--compare``),
  ``metrics(result) -> {name: float | None}`` (their values; ``None`` where not measured) and ``TRENDS``
  (``{panel title: (name, ...)}``: metrics the training-run index draws in one panel);
* optionally ``applies(model) -> str | None`` (why the check does not apply to this model, ``None`` if it does)
  and ``missing() -> str | None`` (what the instance's config lacks for the check to run, e.g. a rule file): a check
  that does not apply is recorded as ``skipped`` with the reason, never as ``ok``. ``run`` may also raise
  :class:`SkipCheck` (or return a result whose ``applicable`` is ``False`` with a ``reason``) once it finds out.

Checks are found through the entry-point group ``interp.checks`` (see :mod:`interp.apps.audit.registry`), so a
third-party package plugs in exactly as a built-in one does.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from interp.model import Model
from interp.results import Result


@dataclass
class AuditData:
    """The text set an audit runs on."""

    texts: list[str]
    source: str = "built-in"

    def __post_init__(self) -> None:
        if not self.texts:
            raise ValueError(f"the audit text set ({self.source}) is empty")
        if not all(isinstance(t, str) and t.strip() for t in self.texts):
            raise ValueError("audit texts must be non-empty strings")

    @classmethod
    def builtin(cls) -> "AuditData":
        """The built-in set: short, diverse English sentences shipped in ``interp/data/audit_texts.txt``."""
        text = resources.files("interp.data").joinpath("audit_texts.txt").read_text(encoding="utf-8")
        return cls([line for line in text.splitlines() if line.strip()], "built-in (interp/data/audit_texts.txt)")

    @classmethod
    def from_file(cls, path: str | Path) -> "AuditData":
        """One text per line (blank lines skipped)."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"text file {str(path)!r} does not exist (expected a UTF-8 file with one text per line)")
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return cls(lines, str(path))

    def digest(self) -> str:
        """SHA-256 of the texts (in order, each UTF-8 encoded and newline-terminated): the data set's hash."""
        import hashlib

        h = hashlib.sha256()
        for t in self.texts:
            h.update(t.encode("utf-8") + b"\n")
        return h.hexdigest()

    def head(self, n: int | None) -> "AuditData":
        return self if n is None else AuditData(self.texts[:n], self.source)


@dataclass
class Rendered:
    """What a check contributes to the HTML report."""

    html: str = ""  #: trusted HTML written by the check (paragraphs, lists)
    figures: list[tuple[str, Any]] = field(default_factory=list)  #: (caption, plotly figure)
    tables: list[tuple[str, Any]] = field(default_factory=list)  #: (caption, pandas DataFrame)


class SkipCheck(Exception):
    """Raised by a check's ``run`` when the check does not apply to the model or data: the audit records the
    check as ``skipped`` with ``str(exc)`` as the reason (not as an error, not as ``ok``)."""


@dataclass
class NoConfig:
    """Config of a check without options."""


class Check:
    """Base class of audit checks (subclassing is optional; the registry checks the attributes)."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Config: ClassVar[type] = NoConfig
    #: headline metrics ``{name: description}`` (``--fail-if``, trends across checkpoints, ``--compare``)
    METRICS: ClassVar[dict[str, str]] = {}
    #: metrics the training-run index draws in one panel: ``{panel title: (metric, metric, ...)}``
    TRENDS: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else self.Config()

    def run(self, model: Model, data: AuditData) -> Result:  # pragma: no cover - interface
        raise NotImplementedError

    def render(self, result: Result) -> Rendered:  # pragma: no cover - interface
        raise NotImplementedError

    def summary(self, result: Result) -> dict[str, Any]:
        return {}

    def to_json(self, result: Result) -> dict[str, Any]:
        return result.to_dict()

    def metrics(self, result: Result) -> dict[str, float | None]:
        """The values of :attr:`METRICS` for ``result`` (``None`` where not measured)."""
        return {}

    def applies(self, model: Model) -> str | None:
        """Why this check does not apply to ``model`` (``None``: it applies). Called before :meth:`run`."""
        return None

    def missing(self) -> str | None:
        """What this check's config lacks to run at all (``None``: nothing), checked before any model loads."""
        return None


def _coerce(value: str, annotation: Any) -> Any:
    """Parse a CLI string into the type of a config field."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if value.lower() in ("none", "null") and (type(None) in typing.get_args(annotation) or annotation is None):
        return None
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)) and args:
        last: Exception | None = None
        for a in args:
            try:
                return _coerce(value, a)
            except (TypeError, ValueError) as exc:
                last = exc
        raise ValueError(str(last))
    if origin in (tuple, list):
        inner = args[0] if args else str
        items = [v.strip() for v in value.split(",") if v.strip()]
        vals = [_coerce(v, inner) for v in items]
        return tuple(vals) if origin is tuple else vals
    if annotation is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true/false, got {value!r}")
    if annotation in (int, float, str):
        return annotation(value)
    return value


def parse_overrides(cfg_cls: type, overrides: dict[str, str], owner: str, prefix: str) -> dict[str, Any]:
    """Parse string ``overrides`` (field -> value) to the types of dataclass ``cfg_cls``'s fields.

    ``owner`` names the options in errors (``"check 'heads'"``), ``prefix`` the ``--set`` spelling (``"heads"``). Raises
    ``ValueError`` for a field ``cfg_cls`` does not have (listing those it has) or a value that does not parse.
    """
    fields = {f.name: f for f in dataclasses.fields(cfg_cls)}
    hints = typing.get_type_hints(cfg_cls)
    kwargs: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key not in fields:
            raise ValueError(f"{owner} has no option {key!r}; options: {', '.join(fields) or '(none)'}")
        try:
            kwargs[key] = _coerce(raw, hints.get(key, str))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad value {raw!r} for {prefix}.{key}: {exc}") from None
    return kwargs


def is_config(value: Any) -> bool:
    """Whether ``value`` is a check's config already built (a dataclass instance), not string overrides."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def configure(check_cls: type, overrides: dict[str, str]) -> Any:
    """Build ``check_cls.Config`` with string ``overrides`` (field -> value) parsed to the field types.

    A ``Config`` with a classmethod ``from_overrides(overrides) -> Config`` builds itself instead (for options
    that are not its own fields, e.g. the ``steering`` check passes the rest to the steering method's config);
    it raises ``ValueError`` for an option it does not know. Either way this runs before any model loads.
    """
    cfg_cls = getattr(check_cls, "Config", NoConfig)
    custom = getattr(cfg_cls, "from_overrides", None)
    if callable(custom):
        return custom(dict(overrides))
    return cfg_cls(**parse_overrides(cfg_cls, overrides, f"check {check_cls.name!r}", check_cls.name))


__all__ = ["AuditData", "Rendered", "Check", "NoConfig", "SkipCheck", "configure", "is_config", "parse_overrides"]
