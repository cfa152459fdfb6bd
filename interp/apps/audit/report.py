"""The audit report: ``index.html`` (self-contained, plotly inlined once) and ``results.json`` (versioned).

``results.json`` schema (``schema_version`` 2)::

    {"schema": "interp.audit.results", "schema_version": 2, "created": ISO-8601, "interp_version": str,
     "model": {"spec", "backend", "family", "n_layers", "n_heads", "n_kv_heads", "d_model", "d_head",
               "d_vocab", "n_params", "dtype", "device"},
     "data": {"source", "n_texts", "n_tokens", "hash"},
     "provenance": {"weights_fingerprint", "checkpoint": {"spec", "path", "step", "config_hash"},
                    "interp_version", "git_commit", "git_dirty" (the code differs from the commit),
                    "data_hash", "self_check" (the load self-check's
                    to_dict(), null when the model carries none)},
     "checks": [{"name", "title", "status": "ok" | "skipped" | "error", "reason" (why skipped, or the error's
                 one-line message; null when ok), "seconds", "config", "summary", "metrics" (the check's
                 headline metrics, null where not measured), "result" (the check's JSON payload, null on
                 error), "error" (the traceback, null unless error), "artifacts" (folder with the full saved
                 Result, relative to the report)}],
     "thresholds": [{"expr", "check", "metric", "op", "value", "actual", "failed", "reason"}],
     "gate": {"passed": bool, "errored": bool, "exit_code": 0 | 1 | 3},
     "timings": {"load_model": s, "check:NAME": s, ..., "total": s},
     "environment": {"python", "platform", "torch", "transformers"}}

Version 2 (this issue): ``skipped`` is its own status (version 1 reported a check that did not apply as
``ok``), and ``reason``, ``metrics``, ``provenance``, ``thresholds`` and ``gate`` were added.
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp.io import OutputError, _json_default, check_output, output_dir

SCHEMA = "interp.audit.results"
SCHEMA_VERSION = 2
#: the statuses of a check
STATUSES = ("ok", "skipped", "error")


@dataclass
class CheckRecord:
    """The outcome of one check inside an audit."""

    name: str
    title: str
    status: str  # "ok" | "skipped" | "error"
    seconds: float
    config: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)
    payload: dict[str, Any] | None = None
    error: str | None = None  #: the traceback of an error
    result: Any = None  # the Result object (saved under checks/NAME/)
    rendered: Any = None  # interp.checks.Rendered
    description: str = ""
    reason: str | None = None  #: why it was skipped, or the error's one-line message
    metrics: dict[str, Any] = field(default_factory=dict)  #: headline metrics (Check.METRICS)


@dataclass
class AuditReport:
    """Everything an audit produced; :meth:`write` puts it on disk atomically."""

    model: dict[str, Any]
    data: dict[str, Any]
    checks: list[CheckRecord]
    timings: dict[str, float]
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    provenance: dict[str, Any] = field(default_factory=dict)
    #: evaluated ``--fail-if`` thresholds (:meth:`interp.apps.audit.gate.Threshold.evaluate`)
    thresholds: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No check errored (a skipped check is not an error)."""
        return not self.errored

    @property
    def errored(self) -> bool:
        return any(c.status == "error" for c in self.checks)

    @property
    def passed(self) -> bool:
        """No check errored and no threshold failed."""
        return not self.errored and not any(t["failed"] for t in self.thresholds)

    @property
    def exit_code(self) -> int:
        from .gate import exit_code

        return exit_code(self.errored, any(t["failed"] for t in self.thresholds))

    def evaluate(self, thresholds: Any) -> list[dict[str, Any]]:
        """Evaluate ``--fail-if`` :class:`~interp.apps.audit.gate.Threshold` s on this report (kept in :attr:`thresholds`)."""
        from .gate import evaluate_thresholds

        self.thresholds = evaluate_thresholds(list(thresholds), {"checks": [
            {"name": c.name, "status": c.status, "metrics": c.metrics} for c in self.checks]})
        return self.thresholds

    def to_json(self) -> dict[str, Any]:
        import interp

        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "created": self.created,
            "interp_version": interp.__version__, "model": self.model, "data": self.data,
            "provenance": self.provenance,
            "checks": [{"name": c.name, "title": c.title, "status": c.status, "reason": c.reason,
                        "seconds": round(c.seconds, 3), "config": c.config, "summary": c.summary,
                        "metrics": c.metrics, "result": c.payload, "error": c.error,
                        "artifacts": f"checks/{c.name}" if c.result is not None and c.status != "error" else None}
                       for c in self.checks],
            "thresholds": self.thresholds,
            "gate": {"passed": self.passed, "errored": self.errored, "exit_code": self.exit_code},
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "environment": environment(),
        }

    def to_html(self) -> str:
        return render_html(self)

    def write(self, out: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write ``out/index.html``, ``out/results.json`` and ``out/checks/NAME/`` (see :func:`prepare_output`).

        Everything is built in a temporary folder first; the files of an earlier report there are then
        replaced (files the user added to the folder stay), and a failure leaves the old report as it was.
        """
        out = prepare_output(out, overwrite=overwrite)
        text = json.dumps(_clean(self.to_json()), indent=2, default=_json_default, allow_nan=False)
        page = self.to_html()
        with output_dir(out, overwrite=overwrite, writer="interp audit", legacy=_legacy_report_files) as tmp:
            for c in self.checks:
                if c.result is not None and c.status != "error" and hasattr(c.result, "save"):
                    c.result.save(tmp / "checks" / c.name)
            (tmp / "results.json").write_text(text, encoding="utf-8")
            (tmp / "index.html").write_text(page, encoding="utf-8")
        return out


def _clean(obj: Any) -> Any:
    """NaN/inf -> None so that results.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    try:
        import numpy as np
        import torch

        if isinstance(obj, (torch.Tensor, np.ndarray)):
            return _clean(obj.tolist())
        if isinstance(obj, (np.floating, np.integer, np.bool_)):
            return _clean(obj.item())
    except ImportError:  # pragma: no cover
        pass
    return obj


def environment() -> dict[str, str]:
    env = {"python": sys.version.split()[0], "platform": platform.platform()}
    for mod in ("torch", "transformers", "transformer_lens", "nnsight"):
        try:
            from importlib import metadata

            env[mod] = metadata.version(mod.replace("_", "-"))
        except Exception:  # noqa: BLE001 - optional information
            continue
    return env


# ------------------------------------------------------------------------------- output folder
def is_report_dir(path: Path) -> bool:
    """Does ``path`` hold an earlier audit report (so it may be replaced)?"""
    res = path / "results.json"
    if not res.is_file():
        return False
    try:
        return json.loads(res.read_text(encoding="utf-8")).get("schema") == SCHEMA
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def _legacy_report_files(folder: Path) -> list[str] | None:
    """The files of a report written before output manifests existed (so it is replaced, not refused)."""
    if not is_report_dir(folder):
        return None
    files = [n for n in ("index.html", "results.json") if (folder / n).is_file()]
    try:
        checks = json.loads((folder / "results.json").read_text(encoding="utf-8")).get("checks") or []
    except (OSError, ValueError, AttributeError, RecursionError):
        checks = []
    for c in checks:
        name = c.get("name") if isinstance(c, dict) else None
        if isinstance(name, str) and name and "/" not in name and name not in (".", ".."):
            files += [f"checks/{name}/{n}" for n in ("result.json", "tensors.safetensors")
                      if (folder / "checks" / name / n).is_file()]
    return files


#: What a report folder holds (top-level names), checked against the user's files before any work.
REPORT_FILES = ("index.html", "results.json", "checks/")


def prepare_output(out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Check that ``out`` can receive a report; raise ``ValueError`` (:class:`interp.io.OutputError`) otherwise.

    ``out`` may be missing, an empty folder, or a folder holding an earlier report: its files are replaced
    at the end, anything the user added there stays. A file, a symbolic link, a non-empty folder that holds
    no earlier report, or a user's file named like a report file are refused unless ``overwrite`` (``--force``)
    is given; even then nothing but same-named files is replaced and a file is never turned into a folder.
    Returns the folder that will be written (a symbolic link's target with ``overwrite``).
    """
    out = check_output(out, REPORT_FILES, overwrite=overwrite, writer="interp audit", legacy=_legacy_report_files)
    try:
        _probe_parent(out)
    except OSError as exc:
        raise OutputError(f"output folder {str(out)!r} is not writable: {exc.strerror or exc}") from None
    return out


def _probe_parent(out: Path) -> None:
    """Create and remove a folder next to ``out`` (and any parents created for it), proving it is writable."""
    from interp.io import _make_parents, _remove_if_empty

    created = _make_parents(out.parent)
    try:
        probe = out.parent / f".{out.name}.probe.{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    finally:
        _remove_if_empty(created)


# ---------------------------------------------------------------------------------------- HTML
_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:20px 32px}
header h1{margin:0 0 4px 0;font-size:24px}
header p{margin:0;color:#c9cfdb}
nav{padding:8px 32px;background:#e9ecf1;font-size:14px}
nav a{margin-right:16px;color:#1d4ed8;text-decoration:none}
main{padding:16px 32px;max-width:1200px}
section{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:16px 24px;margin:16px 0}
h2{margin-top:0}
table.data{border-collapse:collapse;font-size:13px;margin:8px 0 16px 0}
table.data th,table.data td{border:1px solid #dde1e8;padding:4px 8px;text-align:right}
table.data th{background:#f0f2f5}
table.data td:first-child,table.data th:first-child{text-align:left}
.status-ok{color:#15803d;font-weight:600}
.status-error{color:#b91c1c;font-weight:600}
.status-skipped{color:#92400e;font-weight:600}
.status-failed{color:#b91c1c;font-weight:600}
.note{background:#fffbeb;border:1px solid #fde68a;padding:6px 10px;border-radius:4px}
pre.error{background:#fef2f2;border:1px solid #fecaca;padding:12px;overflow:auto;font-size:12px}
figure{margin:8px 0 24px 0}
figcaption{font-size:13px;color:#4b5563;margin-bottom:4px}
.muted{color:#6b7280;font-size:13px}
"""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        return f"{v:.4g}"
    if v is None:
        return "–"
    return str(v)


def _kv_table(rows: dict[str, Any]) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in rows.items())
    return f'<table class="data">{body}</table>'


def _frame_html(df: Any) -> str:
    return df.to_html(index=False, border=0, classes="data", float_format=lambda x: f"{x:.4g}", na_rep="–",
                      escape=True)


def _figure_html(fig: Any, div_id: str) -> str:
    import plotly.io as pio

    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"responsive": True, "displaylogo": False})


def verdict(report: AuditReport) -> str:
    """One line for the page header: what ran, what was skipped, what errored, whether the gate passed."""
    n = {st: sum(c.status == st for c in report.checks) for st in STATUSES}
    bits = [f"{n['ok']} ok"] + [f"{n[st]} {st}" for st in ("skipped", "error") if n[st]]
    failed = [t for t in report.thresholds if t["failed"]]
    if report.thresholds:
        bits.append(f"{len(failed)} of {len(report.thresholds)} thresholds failed" if failed else "thresholds passed")
    return ", ".join(bits)


def render_html(report: AuditReport) -> str:
    """The self-contained HTML page (plotly.js inlined once; no network needed to view it)."""
    from plotly.offline import get_plotlyjs

    m = report.model
    title = f"interp audit — {html.escape(str(m.get('spec', 'model')))}"
    nav = ['<a href="#model">Model</a>', '<a href="#overview">Overview</a>']
    nav += [f'<a href="#check-{html.escape(c.name)}">{html.escape(c.title or c.name)}</a>' for c in report.checks]
    nav.append('<a href="#timings">Timings</a>')
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>",
             f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><style>{_CSS}</style>",
             f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>",
             f"<header><h1>{title}</h1><p>{len(report.checks)} check(s) · {html.escape(report.created)} · "
             f"{html.escape(verdict(report))}</p></header>",
             f"<nav>{''.join(nav)}</nav><main>"]
    card = {"spec": m.get("spec"), "backend": m.get("backend"), "architecture": m.get("family"),
            "layers": m.get("n_layers"), "attention heads": m.get("n_heads"), "key/value heads": m.get("n_kv_heads"),
            "d_model": m.get("d_model"), "d_head": m.get("d_head"), "vocabulary": m.get("d_vocab"),
            "parameters": f"{m['n_params']:,}" if isinstance(m.get("n_params"), int) else m.get("n_params"),
            "dtype": m.get("dtype"), "device": m.get("device")}
    data = {"text set": report.data.get("source"), "texts": report.data.get("n_texts"),
            "tokens": report.data.get("n_tokens"), "hash (SHA-256)": report.data.get("hash")}
    prov = report.provenance or {}
    ckpt = prov.get("checkpoint") or {}
    sc = prov.get("self_check")
    prov_rows = {"weights fingerprint (SHA-256)": prov.get("weights_fingerprint"), "checkpoint path": ckpt.get("path"),
                 "training step": ckpt.get("step"), "config hash (SHA-256)": ckpt.get("config_hash"),
                 "interp version": prov.get("interp_version"),
                 "interp git commit": (prov.get("git_commit") or "") + (" (modified)" if prov.get("git_dirty") else "")
                 or None,
                 "load self-check": None if sc is None else ("passed" if sc.get("passed") else "FAILED")}
    parts.append(f'<section id="model"><h2>Model card</h2>{_kv_table(card)}<h3>Data</h3>{_kv_table(data)}'
                 f'<h3>Provenance</h3>{_kv_table(prov_rows)}</section>')
    rows = []
    for c in report.checks:
        status = f'<span class="status-{c.status}">{c.status}</span>'
        if c.status == "ok":
            summ = "; ".join(f"{html.escape(str(k))}: {html.escape(_fmt(v))}" for k, v in c.summary.items())
        else:
            summ = html.escape(c.reason or "")
        rows.append(f"<tr><td><a href=\"#check-{html.escape(c.name)}\">{html.escape(c.name)}</a></td><td>{status}</td>"
                    f"<td>{c.seconds:.1f} s</td><td style=\"text-align:left\">{summ}</td></tr>")
    parts.append('<section id="overview"><h2>Overview</h2><table class="data"><tr><th>check</th><th>status</th>'
                 f'<th>time</th><th>summary</th></tr>{"".join(rows)}</table>')
    if report.thresholds:
        trows = "".join(f"<tr><td><code>{html.escape(t['expr'])}</code></td><td>{html.escape(_fmt(t['actual']))}</td>"
                        f"<td class=\"status-{'failed' if t['failed'] else 'ok'}\">{'FAILED' if t['failed'] else 'pass'}"
                        f"</td></tr>" for t in report.thresholds)
        parts.append('<h3 id="gate">Gate (--fail-if)</h3><table class="data"><tr><th>fails if</th><th>value</th>'
                     f'<th>outcome</th></tr>{trows}</table>')
    parts.append("</section>")
    for c in report.checks:
        parts.append(f'<section id="check-{html.escape(c.name)}" class="check" data-check="{html.escape(c.name)}">'
                     f"<h2>{html.escape(c.title or c.name)}</h2>")
        if c.description:
            parts.append(f'<p class="muted">{html.escape(c.description)}</p>')
        parts.append(f'<p class="muted">status <span class="status-{c.status}">{c.status}</span> · '
                     f"{c.seconds:.1f} s · config: <code>{html.escape(json.dumps(_clean(c.config), default=str))}</code></p>")
        if c.status == "error":
            parts.append(f'<pre class="error">{html.escape(c.error or "unknown error")}</pre></section>')
            continue
        if c.status == "skipped":
            parts.append(f'<p class="note">Skipped: {html.escape(c.reason or "the check does not apply")}.</p>')
        r = c.rendered
        if r is not None:
            parts.append(r.html)
            for i, (caption, fig) in enumerate(r.figures):
                parts.append(f"<figure><figcaption>{html.escape(caption)}</figcaption>"
                             f"{_figure_html(fig, f'fig-{c.name}-{i}')}</figure>")
            for caption, df in r.tables:
                parts.append(f"<h3>{html.escape(caption)}</h3>{_frame_html(df)}")
        parts.append("</section>")
    timings = {k: f"{v:.2f} s" for k, v in report.timings.items()}
    env = environment()
    parts.append(f'<section id="timings"><h2>Timings</h2>{_kv_table(timings)}<h3>Environment</h3>{_kv_table(env)}'
                 "<p class=\"muted\">Machine-readable results: <a href=\"results.json\">results.json</a>; "
                 "full results per check under <code>checks/</code>.</p></section>")
    parts.append("</main></body></html>")
    return "\n".join(parts)


__all__ = ["AuditReport", "CheckRecord", "SCHEMA", "SCHEMA_VERSION", "STATUSES", "REPORT_FILES", "verdict", "prepare_output", "is_report_dir",
           "render_html", "environment"]
