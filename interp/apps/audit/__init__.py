"""``interp audit``: run analyzer checks on a model and write a self-contained HTML report plus JSON.

Checks are plug-ins found through the entry-point group ``interp.checks`` (this package imports no
analyzer directly)::

    from interp.apps.audit import AuditData, run_audit
    report = run_audit(model, ["heads"], AuditData.builtin(), out="report",
                       thresholds=parse_thresholds(["heads.flagged_fraction > 0.2"], {"heads": HeadsCheck.METRICS}))
    report.exit_code  # 0 pass, 1 a check errored, 3 a threshold failed (2: bad input, from the CLI)

Implement a check by subclassing :class:`Check` (``name``, ``Config`` dataclass, ``run``, ``render``) and
declaring it under ``[project.entry-points."interp.checks"]`` in your package's ``pyproject.toml``.
"""
from interp.checks import AuditData, Check, NoConfig, Rendered, SkipCheck, configure, parse_overrides
from .gate import EXIT_CODES, Threshold, parse_threshold, parse_thresholds
from .registry import (GROUP, UnknownCheckError, available_checks, get_check, parse_checks, register_check,
                       unregister_check)
from .report import SCHEMA, SCHEMA_VERSION, AuditReport, CheckRecord, is_report_dir, prepare_output
from .runner import model_card, run_audit

__all__ = ["AuditData", "Check", "NoConfig", "Rendered", "SkipCheck", "EXIT_CODES", "Threshold", "parse_threshold",
           "parse_thresholds", "configure", "parse_overrides", "GROUP", "UnknownCheckError",
           "available_checks", "get_check", "parse_checks", "register_check", "unregister_check", "SCHEMA",
           "SCHEMA_VERSION", "AuditReport", "CheckRecord", "is_report_dir", "prepare_output", "model_card",
           "run_audit"]
