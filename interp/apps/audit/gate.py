"""Gating an audit: ``--fail-if 'heads.flagged_fraction > 0.2'`` thresholds on the checks' headline metrics.

A threshold is ``CHECK.METRIC OP NUMBER`` with ``OP`` one of ``>``, ``>=``, ``<``, ``<=``, ``==``, ``!=``; it
*fails* the audit when the comparison is true. Thresholds are parsed and validated against the selected checks'
declared metrics (:attr:`interp.checks.Check.METRICS`) before any model loads; an unknown name gets the closest
valid ones. After the audit each threshold is evaluated on every report: a metric that was not measured (the
check was skipped, errored or did not produce it) counts as failed, so a gate never passes on a missing number.

Exit codes of ``interp audit`` (:data:`EXIT_CODES`): 0 every check ran or was skipped and no threshold failed;
1 a check (or a checkpoint's load) errored (the reports that could be written are written); 2 bad input, nothing
audited; 3 a threshold failed (and nothing errored).
"""
from __future__ import annotations

import difflib
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

#: exit code -> meaning (documented in docs/audit.md)
EXIT_CODES = {0: "pass", 1: "a check or a checkpoint errored", 2: "bad input (nothing audited)",
              3: "a --fail-if threshold failed"}
EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_THRESHOLD = 0, 1, 2, 3

_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, "==": operator.eq,
                                                   "!=": operator.ne, ">": operator.gt, "<": operator.lt}
_EXPR = re.compile(r"^\s*([A-Za-z0-9_-]+)\.([A-Za-z0-9_]+)\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Threshold:
    """One ``--fail-if`` condition: the audit fails when ``metric op value`` is true."""

    check: str
    metric: str
    op: str
    value: float

    @property
    def name(self) -> str:
        return f"{self.check}.{self.metric}"

    @property
    def expr(self) -> str:
        return f"{self.name} {self.op} {self.value:g}"

    def evaluate(self, metrics: Mapping[str, Mapping[str, Any]], status: Mapping[str, str] | None = None
                 ) -> dict[str, Any]:
        """``{"expr", "check", "metric", "op", "value", "actual", "failed", "reason"}`` on one report's metrics
        (``metrics[check][metric]``); ``status[check]`` explains a missing value."""
        actual = (metrics.get(self.check) or {}).get(self.metric)
        out = {"expr": self.expr, "check": self.check, "metric": self.metric, "op": self.op, "value": self.value,
               "actual": actual}
        if actual is None or (isinstance(actual, float) and not math.isfinite(actual)):
            st = (status or {}).get(self.check)
            why = f"check {self.check} {st}" if st and st != "ok" else "metric not measured"
            return {**out, "actual": None, "failed": True, "reason": f"{self.name} not measured ({why})"}
        failed = bool(_OPS[self.op](float(actual), self.value))
        return {**out, "failed": failed,
                "reason": f"{self.name} = {float(actual):.4g} {self.op} {self.value:g}" if failed else ""}


def parse_threshold(text: str, metrics: Mapping[str, Mapping[str, str]]) -> Threshold:
    """Parse ``"CHECK.METRIC OP NUMBER"``; ``metrics`` maps each selected check to its ``METRICS``.

    Raises ``ValueError`` (one line) for a malformed expression, a check that is not selected or declares no
    metrics, or an unknown metric (naming the closest valid ``CHECK.METRIC`` names).
    """
    m = _EXPR.match(text or "")
    valid = [f"{c}.{k}" for c, ks in metrics.items() for k in ks]
    if not m:
        raise ValueError(f"--fail-if expects 'CHECK.METRIC OP NUMBER' with OP one of > >= < <= == != "
                         f"(e.g. 'heads.flagged_fraction > 0.2'), got {text!r}")
    check, metric, op, raw = m.groups()
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"--fail-if {text!r}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"--fail-if {text!r}: the threshold must be a finite number")
    if check not in metrics:
        close = difflib.get_close_matches(f"{check}.{metric}", valid, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"--fail-if {text!r}: check {check!r} is not selected (selected: "
                         f"{', '.join(metrics) or 'none'}){hint}")
    if metric not in metrics[check]:
        if not metrics[check]:
            raise ValueError(f"--fail-if {text!r}: check {check!r} declares no headline metrics")
        close = difflib.get_close_matches(f"{check}.{metric}", valid, n=3, cutoff=0.5) or \
            [f"{check}.{k}" for k in difflib.get_close_matches(metric, list(metrics[check]), n=3, cutoff=0.0)]
        raise ValueError(f"--fail-if {text!r}: unknown metric {check}.{metric}; did you mean {', '.join(close)}? "
                         f"({check}'s metrics: {', '.join(metrics[check])})")
    return Threshold(check, metric, op, value)


def parse_thresholds(texts: Iterable[str] | None, metrics: Mapping[str, Mapping[str, str]]) -> list[Threshold]:
    """Every ``--fail-if`` (see :func:`parse_threshold`)."""
    return [parse_threshold(t, metrics) for t in (texts or [])]


def evaluate_thresholds(thresholds: Iterable[Threshold], report_json: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Evaluate ``thresholds`` on one report's ``results.json`` dict (its ``checks[*].metrics``)."""
    checks = report_json.get("checks") or []
    metrics = {c["name"]: c.get("metrics") or {} for c in checks}
    status = {c["name"]: c.get("status", "") for c in checks}
    return [t.evaluate(metrics, status) for t in thresholds]


def exit_code(errored: bool, thresholds_failed: bool) -> int:
    """The documented exit code: an error (1) outranks a failed threshold (3)."""
    if errored:
        return EXIT_ERROR
    return EXIT_THRESHOLD if thresholds_failed else EXIT_OK


__all__ = ["Threshold", "parse_threshold", "parse_thresholds", "evaluate_thresholds", "exit_code", "EXIT_CODES",
           "EXIT_OK", "EXIT_ERROR", "EXIT_BAD_INPUT", "EXIT_THRESHOLD"]
