"""``interp audit ckpt1 ckpt2 ... [--engine ray]``: one audit per model or checkpoint, plus an index page.

Layout of the output folder (written with the same writer rule as a single report, :func:`interp.io.output_dir`:
built in a temporary folder, moved into place when complete, replacing only files of an earlier run)::

    index.html      a table comparing the checkpoints: status, time and every check's summary numbers
    results.json    {"schema": "interp.audit.index", "reports": [{"spec", "folder", "ok", "model", "checks"}]}
    01-NAME/        the full report of the first checkpoint (index.html, results.json, checks/ ...)
    02-NAME/        ...

With ``engine="ray"`` each audit is one Ray task (loading its model in the worker) writing its report
with the usual report writer into the temporary folder, which must be on storage the workers reach
(see ``docs/scale.md``); with ``engine="local"`` the audits run one after another in this process.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp.io import _json_default, check_output, output_dir

from .base import AuditData
from .report import _CSS, _fmt

INDEX_SCHEMA = "interp.audit.index"
ENGINES = ("local", "ray")


def _slug(spec: str, i: int) -> str:
    tail = "-".join(Path(spec.replace("zoo:", "zoo-")).parts[-2:]) or "model"
    return f"{i + 1:02d}-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip("-.") or "model")[:60]


def run_audits(specs: Sequence[str], checks: Sequence[str], data: AuditData | None = None,
               out: str | Path = "audit-report", options: Mapping[str, Mapping[str, str]] | None = None,
               backend: str = "torch", engine: str = "local", load_kwargs: Mapping[str, Any] | None = None,
               overwrite: bool = False) -> list[dict[str, Any]]:
    """Audit every model spec in ``specs`` with ``checks``; write one report each and an index page.

    Returns one summary per spec (``spec``, ``folder``, ``ok``, ``model``, ``checks`` with status, seconds
    and summary), in the order given. ``overwrite`` is ``--force`` (see :func:`interp.io.output_dir`).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if not specs:
        raise ValueError("give at least one model or checkpoint to audit")
    data = data or AuditData.builtin()
    folders = [_slug(s, i) for i, s in enumerate(specs)]
    out_path = check_output(out, ["index.html", "results.json", *(f + "/" for f in folders)], overwrite=overwrite,
                            writer="interp audit")
    with output_dir(out_path, overwrite=overwrite, writer="interp audit") as tmp:
        jobs = [dict(spec=s, backend=backend, checks=list(checks), texts=list(data.texts), source=data.source,
                     options={k: dict(v) for k, v in (options or {}).items()}, out=str(tmp / f),
                     load_kwargs=dict(load_kwargs or {})) for s, f in zip(specs, folders)]
        from interp.store.ray_engine import _audit_task, run_audits_ray

        summaries = run_audits_ray(jobs) if engine == "ray" else [_audit_task(**job) for job in jobs]
        for s, f in zip(summaries, folders):
            s["folder"] = f
        index = {"schema": INDEX_SCHEMA, "schema_version": 1, "engine": engine, "checks": list(checks),
                 "data": {"source": data.source, "n_texts": len(data.texts)}, "reports": summaries}
        (tmp / "results.json").write_text(json.dumps(index, indent=2, default=_json_default), encoding="utf-8")
        (tmp / "index.html").write_text(render_index(summaries, list(checks)), encoding="utf-8")
    return summaries


def render_index(summaries: list[dict[str, Any]], checks: list[str]) -> str:
    """The comparison page: one row per checkpoint, one column per check summary value."""
    cols: list[tuple[str, str]] = []
    for name in checks:
        keys: list[str] = []
        for s in summaries:
            for c in s["checks"]:
                if c["name"] == name:
                    keys += [k for k in c["summary"] if k not in keys]
        cols += [(name, k) for k in keys]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in
                   ["checkpoint", "model", *(f"{c}: status" for c in checks), *(f"{c}.{k}" for c, k in cols)])
    rows = []
    for s in summaries:
        by = {c["name"]: c for c in s["checks"]}
        status = [f'<td class="status-{by[c]["status"]}">{by[c]["status"]} ({by[c]["seconds"]:.1f} s)</td>'
                  if c in by else "<td>–</td>" for c in checks]
        values = [f"<td>{html.escape(_fmt(by.get(c, {}).get('summary', {}).get(k)))}</td>" for c, k in cols]
        card = s["model"]
        model = f"{card.get('family')} · {card.get('n_layers')} layers · d {card.get('d_model')}"
        rows.append(f'<tr><td><a href="{html.escape(s["folder"])}/index.html">{html.escape(s["spec"])}</a></td>'
                    f"<td>{html.escape(model)}</td>{''.join(status)}{''.join(values)}</tr>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>interp audit: {len(summaries)} models</title>"
            f"<style>{_CSS}</style></head><body><header><h1>interp audit: {len(summaries)} models</h1>"
            f"<p>checks: {html.escape(', '.join(checks))}</p></header><main><section><h2>Comparison</h2>"
            f"<table class='data'><tr>{head}</tr>{''.join(rows)}</table>"
            "<p class='muted'>Each checkpoint links to its full report.</p></section></main></body></html>")


__all__ = ["run_audits", "render_index", "INDEX_SCHEMA"]
