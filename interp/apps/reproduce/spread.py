"""Measured tolerances: how far reruns of a committed record land from it.

``--check`` compares a rerun with the committed record within the claims file's tolerance per metric. A
tolerance is evidence only when it was measured: :func:`measure_spread` takes the committed record and reruns
of the same config (other thread counts, other environment settings) and reports, per metric, the largest
absolute and relative difference; :func:`write_spread` commits that measurement beside the record
(``benchmarks/<paper>/records/<preset>/spread.json``), with where each rerun ran, so a claims file's
tolerance can cite it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from .record import ReproductionRecord

SPREAD_FILE = "spread.json"


def _numbers(value: Any) -> list[float] | None:
    """The numbers of a measured value (a number or a list of numbers; ``"inf"`` strings as infinities)."""
    vals = value if isinstance(value, list) else [value]
    out = []
    for v in vals:
        if isinstance(v, str) and v in ("inf", "-inf"):
            v = float(v)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        out.append(float(v))
    return out


def measure_spread(ref: ReproductionRecord, reruns: Sequence[ReproductionRecord]) -> dict[str, Any]:
    """Per metric of ``ref``: its value, each rerun's, and the largest ``|rerun - ref|`` (``abs``) and
    ``|rerun - ref| / |ref|`` (``rel``) over the reruns and over a list's entries; the verdicts of each
    rerun. Reruns of another config are refused (``ValueError``)."""
    for r in reruns:
        if r.config_key != ref.config_key:
            raise ValueError(f"{r.paper}: a rerun of config {r.config_key} is not a rerun of the record's "
                             f"{ref.config_key}")
    metrics: dict[str, Any] = {}
    for k, v in ref.measured.items():
        base = _numbers(v)
        row: dict[str, Any] = {"committed": v, "reruns": [r.measured.get(k) for r in reruns]}
        if base is not None:
            worst_abs = worst_rel = 0.0
            for r in reruns:
                got = _numbers(r.measured.get(k))
                if got is None or len(got) != len(base):
                    worst_abs = worst_rel = math.inf
                    continue
                for a, b in zip(got, base):
                    if a == b:
                        continue
                    d = abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf
                    worst_abs = max(worst_abs, d)
                    worst_rel = max(worst_rel, d / abs(b) if b else math.inf)
            row.update(abs=worst_abs if math.isfinite(worst_abs) else "inf",
                       rel=worst_rel if math.isfinite(worst_rel) else "inf")
        metrics[k] = row
    return {
        "schema": "interp.reproduce.spread", "paper": ref.paper, "preset": ref.preset, "config_key": ref.config_key,
        "committed": {"created": ref.created, "provenance": _where(ref)},
        "reruns": [{"created": r.created, "seconds": r.seconds, "command": r.command, "provenance": _where(r),
                    "verdicts": {v["id"]: v["verdict"] for v in r.verdicts}} for r in reruns],
        "committed_verdicts": {v["id"]: v["verdict"] for v in ref.verdicts},
        "metrics": metrics,
    }


def _where(rec: ReproductionRecord) -> dict[str, Any]:
    p = rec.provenance or {}
    return {k: p.get(k) for k in ("commit", "dirty", "cpu", "cpu_simd", "torch_cpu_capability", "threads",
                                  "config_threads", "packages", "env")
            if k in p} | {"blas": [{k: b.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
                                   for b in p.get("blas", []) if b.get("user_api") == "blas"]}


def _round_up(x: float) -> float:
    """``x`` rounded up to two significant digits (0.00901 -> 0.0091)."""
    if x <= 0 or not math.isfinite(x):
        return x
    e = math.floor(math.log10(x)) - 1
    return math.ceil(x / 10 ** e) * 10 ** e


def needed_tolerances(spread: dict[str, Any], claims: Any, factor: float = 2.0) -> dict[str, float]:
    """Metric -> an absolute tolerance ``factor`` x the observed largest difference (rounded up), for every
    metric whose observed spread the claims file's current tolerance does not cover (wall-clock metrics,
    ``ignore``, excepted). ``factor`` leaves room for environments the reruns did not sample."""
    out = {}
    for k, m in spread["metrics"].items():
        tol = claims.tolerance(k)
        d = m.get("abs")
        if tol.ignore or not isinstance(d, (int, float)) or d == 0:
            continue
        base = _numbers(m["committed"]) or [0.0]
        if all(d <= tol.abs + tol.rel * abs(b) for b in base):
            continue
        out[k] = float(f"{_round_up(factor * d):.2g}")
    return out


def write_spread(folder: str | Path, spread: dict[str, Any]) -> Path:
    """Write ``spread`` as ``folder/spread.json`` (standard JSON) and return the path."""
    from interp.io import atomic_write_text

    path = Path(folder) / SPREAD_FILE
    atomic_write_text(path, json.dumps(spread, indent=2, allow_nan=False) + "\n")
    return path


__all__ = ["SPREAD_FILE", "measure_spread", "needed_tolerances", "write_spread"]
