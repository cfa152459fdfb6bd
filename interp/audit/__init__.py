"""``interp audit``: run analyzer checks on a model and write a self-contained HTML report plus JSON.

Checks are plug-ins found through the entry-point group ``interp.checks`` (this package imports no
analyzer directly)::

    from interp.audit import AuditData, run_audit
    report = run_audit(model, ["heads"], AuditData.builtin(), out="report")

Implement a check by subclassing :class:`Check` (``name``, ``Config`` dataclass, ``run``, ``render``) and
declaring it under ``[project.entry-points."interp.checks"]`` in your package's ``pyproject.toml``.
"""
from .base import AuditData, Check, NoConfig, Rendered, configure, parse_overrides
from .registry import (GROUP, UnknownCheckError, available_checks, get_check, parse_checks, register_check,
                       unregister_check)
from .report import SCHEMA, SCHEMA_VERSION, AuditReport, CheckRecord, is_report_dir, prepare_output
from .runner import model_card, run_audit

__all__ = ["AuditData", "Check", "NoConfig", "Rendered", "configure", "parse_overrides", "GROUP", "UnknownCheckError",
           "available_checks", "get_check", "parse_checks", "register_check", "unregister_check", "SCHEMA",
           "SCHEMA_VERSION", "AuditReport", "CheckRecord", "is_report_dir", "prepare_output", "model_card",
           "run_audit"]
