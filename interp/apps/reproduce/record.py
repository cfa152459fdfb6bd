"""The record of one reproduction run, and the comparison that ``interp reproduce --check`` makes.

A record is a :class:`interp.results.Result` (``result.json`` + ``tensors.safetensors``, no pickle): the
recipe, preset and typed config (with its :func:`interp.configs.digest`), the code version, what was
measured, the tables, a snapshot of each claim with its verdict, the versions, the run time and the command
that reruns it. Committed records live in ``benchmarks/<paper>/records/<preset>/``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from interp.results import Result
from .claims import Claims, Tolerance, judge


@dataclass
class ReproductionRecord(Result):
    """One run of a recipe. ``verdicts``: one dict per claim (``id``, ``claim``, ``paper``, ``where``,
    ``criterion``, ``fixed``, ``changed``, ``posthoc``, ``ours``, ``verdict``, ``error``). ``provenance``: where
    the run ran (git commit and whether the tree was dirty, CPU, threads, BLAS library and kernel, the
    numeric stack's versions, the environment settings that choose kernels)."""

    #: the type name its saved files record (the module moved in #45; files written before load and compare equal)
    saved_type = "interp.reproduce.record.ReproductionRecord"

    kind = "reproduction"

    paper: str
    title: str
    preset: str
    config: dict
    config_type: str
    config_key: str
    code_version: str
    measured: dict
    verdicts: list
    tables: dict = field(default_factory=dict)
    notes: str = ""
    error: str | None = None
    seconds: float = 0.0  #: wall time of the run that wrote the record
    #: compute time of the stored stages this run read back instead of computing (finished by an earlier,
    #: interrupted or partial run): the record's full cost is ``seconds + resumed_seconds``
    resumed_seconds: float = 0.0
    created: str = ""
    versions: dict = field(default_factory=dict)
    command: str = ""
    provenance: dict = field(default_factory=dict)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{k: v.get(k) for k in ("id", "paper", "where", "criterion", "ours", "verdict")}
                             for v in self.verdicts])

    def figure(self):
        import plotly.graph_objects as go

        counts = self.counts()
        fig = go.Figure(go.Bar(x=list(counts), y=list(counts.values()),
                               marker_color=[VERDICT_COLOURS[v] for v in counts]))
        fig.update_layout(title=f"{self.paper} ({self.preset}): verdicts per claim", height=300)
        return fig

    def duration(self) -> str:
        """``"123 s"``, or with stages resumed from an earlier run ``"12 s (+ 111 s of stages resumed)"``."""
        text = f"{self.seconds:.0f} s"
        return text + (f" (+ {self.resumed_seconds:.0f} s of stages resumed from an earlier run)"
                       if self.resumed_seconds >= 0.5 else "")

    def counts(self) -> dict[str, int]:
        """Claims per verdict, wall-clock claims (``timing``: every metric they read is left out of --check)
        not counted: their verdict depends on the machine's load, not on the method."""
        out = {v: 0 for v in VERDICT_COLOURS}
        for v in self.verdicts:
            if not v.get("timing"):
                out[v["verdict"]] = out.get(v["verdict"], 0) + 1
        return {k: n for k, n in out.items() if n}

    def summary(self) -> str:
        """E.g. ``"2 reproduced, 1 partly, 1 not reproduced"`` (``"; 1 wall-clock claim not counted"`` after it)."""
        timing = sum(1 for v in self.verdicts if v.get("timing"))
        text = ", ".join(f"{n} {v}" for v, n in self.counts().items()) or "no claims"
        return text + (f"; {timing} wall-clock claim{'s' if timing > 1 else ''} not counted" if timing else "")

    def _repr_html_(self) -> str:
        return self.to_frame().to_html(index=False)


VERDICT_COLOURS = {"reproduced": "#15803d", "partly": "#b45309", "not reproduced": "#6b7280", "error": "#b91c1c"}


def json_ready(value: Any, where: str = "value") -> Any:
    """``value`` as plain JSON data, as a record stores it: tensors and numpy arrays become numbers or (nested)
    lists, numpy scalars Python numbers, tuples lists, mapping keys strings; a non-finite float becomes the
    string ``"inf"``, ``"-inf"`` or ``"nan"`` (standard JSON has no such numbers; the verdicts read them back).
    Anything else raises ``TypeError`` naming ``where``."""
    import numpy as np
    import torch

    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else ("nan" if math.isnan(v) else "inf" if v > 0 else "-inf")
    if isinstance(value, (torch.Tensor, np.ndarray)):
        arr = value.detach().cpu() if isinstance(value, torch.Tensor) else value
        if arr.dtype in (torch.complex64, torch.complex128) or (isinstance(arr, np.ndarray) and arr.dtype.kind not in "biuf"):
            raise TypeError(f"{where}: a {arr.dtype} array is not a measurement")
        return json_ready(arr.tolist() if arr.ndim else arr.item(), where)
    if isinstance(value, Mapping):
        return {str(k): json_ready(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"{where}: a {type(value).__name__} is not a measurement (numbers, strings, lists and mappings "
                    "of them, tensors and arrays)")


def verdict_rows(claims: Claims, measured: dict | None, error: str | None) -> list[dict]:
    """Judge every claim and snapshot it with its verdict (the rows a record stores)."""
    rows = []
    for c in claims.claims:
        v = judge(c, measured, error)
        rows.append({"id": c.id, "claim": c.claim, "paper": c.paper, "where": c.where,
                     "criterion": c.criterion_text(), "fixed": c.fixed,
                     "changed": None if c.changed is None else {"original": c.changed.original, "why": c.changed.why,
                                                                "date": c.changed.date},
                     "posthoc": None if c.posthoc is None else {"seen": c.posthoc.seen, "date": c.posthoc.date},
                     "timing": all(claims.tolerance(k.metric).ignore for k in c.criteria),
                     "expect": dict(c.expect), "note": c.note, "ours": v.ours, "verdict": v.verdict,
                     "passed": v.passed, "total": v.total, "error": v.error or None})
    return rows


def _compare_value(name: str, ours: Any, ref: Any, tol: Tolerance, out: list[str]) -> None:
    if isinstance(ref, (list, tuple)):
        if not isinstance(ours, (list, tuple)) or len(ours) != len(ref):
            out.append(f"{name}: {ours!r} vs committed {ref!r} (different length)")
            return
        for i, (a, b) in enumerate(zip(ours, ref)):
            _compare_value(f"{name}[{i}]", a, b, tol, out)
        return
    if isinstance(ref, dict):
        if not isinstance(ours, dict) or set(ours) != set(ref):
            out.append(f"{name}: keys {sorted(ours) if isinstance(ours, dict) else ours!r} vs committed {sorted(ref)}")
            return
        for k in ref:
            _compare_value(f"{name}.{k}", ours[k], ref[k], tol, out)
        return
    if isinstance(ref, (int, float)) and not isinstance(ref, bool) and isinstance(ours, (int, float)):
        a, b = float(ours), float(ref)
        if not tol.close(a, b):
            diff = abs(a - b) if math.isfinite(a) and math.isfinite(b) else float("nan")
            out.append(f"{name}: {a:.6g} vs committed {b:.6g} (|diff| {diff:.3g} > abs {tol.abs:g} + rel {tol.rel:g})")
        return
    if ours != ref:
        out.append(f"{name}: {ours!r} vs committed {ref!r}")


def compare(record: ReproductionRecord, committed: ReproductionRecord, claims: Claims) -> list[str]:
    """Differences between a run and the committed record of the same preset (empty: they agree).

    The configs must be the same (same digest); every committed measurement must be within the claims file's
    tolerance for that metric (``tolerances.default`` otherwise); every verdict must be the same. Metrics whose
    tolerance is ``{ignore: true}`` (wall-clock times) are left out, and so are the verdicts of claims that read
    only such metrics.
    """
    diffs: list[str] = []
    if record.config_key != committed.config_key:
        return [f"config differs from the committed record's (digest {record.config_key} vs {committed.config_key}):"
                " --check compares runs of the same config"]
    if committed.error is not None:
        diffs.append(f"the committed record is an error: {committed.error}")
    if record.error is not None:
        diffs.append(f"the run raised: {record.error.splitlines()[-1] if record.error else ''}")
    for k, ref in committed.measured.items():
        if claims.tolerance(k).ignore:
            continue
        if k not in record.measured:
            diffs.append(f"{k}: not measured by this run")
            continue
        _compare_value(k, record.measured[k], ref, claims.tolerance(k), diffs)
    for k in record.measured:
        if k not in committed.measured and not claims.tolerance(k).ignore:
            diffs.append(f"{k}: measured by this run, absent from the committed record")
    ref_v = {v["id"]: v["verdict"] for v in committed.verdicts}
    timing = {c.id for c in claims.claims if all(claims.tolerance(k.metric).ignore for k in c.criteria)}
    for v in record.verdicts:
        if v["id"] not in timing and ref_v.get(v["id"]) != v["verdict"]:
            diffs.append(f"claim {v['id']}: verdict {v['verdict']!r} vs committed {ref_v.get(v['id'])!r}")
    return diffs


def committed_record(recipe: Any, preset: str) -> ReproductionRecord | None:
    """The committed record of ``recipe`` for ``preset`` (``None`` when there is none)."""
    folder = Path(recipe.records_dir()) / preset
    if not (folder / "result.json").is_file():
        return None
    return ReproductionRecord.load(folder)


__all__ = ["ReproductionRecord", "VERDICT_COLOURS", "committed_record", "compare", "verdict_rows"]
