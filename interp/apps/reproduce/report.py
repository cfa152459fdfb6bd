"""The reproduction report: ``index.html`` (self-contained, plotly inlined once; the audit's page style and
helpers) and one record folder per paper, written through the writer rule (writer ``interp reproduce``).

Per paper: a table of claims (the paper's number and where it stands | our criterion and when it was fixed,
with the original where it changed after results were seen | our number, with the spread over seeds |
verdict), the notes, the recipe's tables and figures, the config, the versions, the run time and the command
that reruns it.
"""
from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any, Sequence

from interp.apps.audit.report import _CSS, _figure_html, _frame_html, _kv_table, environment
from interp.io import check_output, output_dir
from .record import VERDICT_COLOURS, ReproductionRecord

WRITER = "interp reproduce"
REPORT_FILES = ("index.html", "summary.json")

_EXTRA_CSS = """
.verdict{font-weight:600;white-space:nowrap}
td.left,th.left{text-align:left!important}
table.claims td{vertical-align:top;text-align:left}
.changed{color:#b45309;font-size:12px}
"""


def prepare_output(out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Check that ``out`` can receive a report (see :func:`interp.io.check_output`)."""
    return check_output(out, REPORT_FILES, overwrite=overwrite, writer=WRITER)


def remove_leftovers(out: str | os.PathLike) -> list[Path]:
    """Remove the temporary folders a killed report write left beside or inside ``out``
    (``.OUT.interp-new-*``, ``OUT/.interp-new-*``, ``OUT/.interp-old-*``); returns what was removed."""
    import shutil

    p = Path(out)
    found = list(p.parent.glob(f".{p.name}.interp-new-*")) if p.parent.is_dir() else []
    if p.is_dir() and not p.is_symlink():
        found += list(p.glob(".interp-new-*")) + list(p.glob(".interp-old-*"))
    removed = []
    for d in found:
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _verdict(v: str) -> str:
    return f'<span class="verdict" style="color:{VERDICT_COLOURS.get(v, "#000")}">{html.escape(v)}</span>'


def _claims_table(rec: ReproductionRecord) -> str:
    rows = []
    for v in rec.verdicts:
        crit = html.escape(v["criterion"]) + f'<br><span class="muted">fixed {html.escape(str(v.get("fixed")))}</span>'
        if v.get("changed"):
            ch = v["changed"]
            crit += (f'<br><span class="changed">changed {html.escape(ch["date"])} after results were seen; '
                     f'original: {html.escape(ch["original"])}; why: {html.escape(ch["why"])}</span>')
        if v.get("posthoc"):
            ph = v["posthoc"]
            crit += (f'<br><span class="changed">set after results were seen ({html.escape(ph["date"])}): '
                     f'{html.escape(ph["seen"])}</span>')
        ours = html.escape(v["ours"])
        if v.get("error"):
            ours += f'<br><span class="muted">{html.escape(v["error"])}</span>'
        note = f'<br><span class="muted">{html.escape(v["note"])}</span>' if v.get("note") else ""
        if v.get("timing"):
            note += ('<br><span class="changed">wall-clock: this verdict depends on the machine\'s load; it is not '
                     "counted in the paper's verdicts and not compared by --check</span>")
        rows.append(f'<tr><td>{html.escape(v["claim"])}{note}</td><td>{html.escape(str(v["paper"]))}'
                    f'<br><span class="muted">{html.escape(v["where"])}</span></td><td>{crit}</td><td>{ours}</td>'
                    f'<td>{_verdict(v["verdict"])}</td></tr>')
    return ('<table class="data claims"><tr><th class="left">claim</th><th class="left">paper</th>'
            '<th class="left">our criterion</th><th class="left">ours</th><th class="left">verdict</th></tr>'
            + "".join(rows) + "</table>")


def _section(run: Any, index: int) -> str:
    import pandas as pd

    rec: ReproductionRecord = run.record
    parts = [f'<section id="paper-{html.escape(rec.paper)}" class="paper" data-paper="{html.escape(rec.paper)}">',
             f"<h2>{html.escape(rec.paper)}: {html.escape(rec.title)}</h2>",
             f'<p class="muted">preset <b>{html.escape(rec.preset)}</b> · {html.escape(rec.duration())} · {rec.summary()} · '
             f"rerun: <code>{html.escape(rec.command)}</code> · record: <a href=\"{html.escape(rec.paper)}/result.json\">"
             f"{html.escape(rec.paper)}/result.json</a></p>"]
    if run.differences is not None:
        if run.differences:
            items = "".join(f"<li>{html.escape(d)}</li>" for d in run.differences)
            parts.append(f'<p class="status-error">differs from the committed record:</p><ul>{items}</ul>')
        else:
            parts.append('<p class="status-ok">agrees with the committed record (within the stated tolerances)</p>')
    parts.append(_claims_table(rec))
    if rec.error:
        parts.append(f'<h3>Error</h3><pre class="error">{html.escape(rec.error)}</pre>')
    if rec.notes:
        parts.append(f"<h3>Notes</h3><p>{html.escape(rec.notes)}</p>")
    for caption, rows in rec.tables.items():
        if rows:
            parts.append(f"<h3>{html.escape(caption)}</h3>{_frame_html(pd.DataFrame(rows))}")
    for i, (caption, fig) in enumerate(run.figures):
        try:
            drawn = _figure_html(fig, f"fig-{rec.paper}-{i}")
        except Exception as exc:  # noqa: BLE001 - one figure that cannot be drawn never loses the report
            drawn = f'<p class="status-error">the figure could not be drawn: {html.escape(f"{type(exc).__name__}: {exc}")}</p>'
        parts.append(f"<figure><figcaption>{html.escape(str(caption))}</figcaption>{drawn}</figure>")
    parts.append(f"<details><summary>config ({html.escape(rec.config_type)}, digest {rec.config_key}; code "
                 f"{rec.code_version})</summary><pre>{html.escape(json.dumps(rec.config, indent=2))}</pre></details>")
    if rec.provenance:
        parts.append(f"<details><summary>where it ran (commit {html.escape(str(rec.provenance.get('commit') or '?')[:12])}"
                     f"{' + uncommitted changes' if rec.provenance.get('dirty') else ''}, "
                     f"{html.escape(str(rec.provenance.get('cpu')))}, {rec.provenance.get('threads')} thread(s))</summary>"
                     f"<pre>{html.escape(json.dumps(rec.provenance, indent=2))}</pre></details>")
    parts.append("</section>")
    return "".join(parts)


def _committed_full(rec: ReproductionRecord) -> str:
    """The verdicts of the paper's committed full record (what a quick run's verdicts are not), as HTML."""
    from .recipe import get_recipe
    from .record import committed_record

    try:
        full = committed_record(get_recipe(rec.paper), "full")
    except Exception as exc:  # noqa: BLE001 - an unreadable record is shown as such, the report is still written
        return f'<span class="muted">unreadable ({html.escape(type(exc).__name__)})</span>'
    if full is None:
        return '<span class="muted">no full record yet</span>'
    cells = ", ".join(f"{n} {_verdict(v)}" for v, n in full.counts().items())
    return f'{cells} <span class="muted">({html.escape(full.created[:10])}, {html.escape(full.duration())})</span>'


def render_html(runs: Sequence[Any]) -> str:
    """The self-contained report page of ``runs`` (:class:`interp.apps.reproduce.runner.Run` objects)."""
    from plotly.offline import get_plotlyjs

    n = len(runs)
    title = "interp reproduce" + (f" — {runs[0].record.paper}" if n == 1 else f" — {n} papers")
    presets = sorted({r.record.preset for r in runs})
    overview = []
    for r in runs:
        rec = r.record
        cells = ", ".join(f"{n} {_verdict(v)}" for v, n in rec.counts().items())
        full = _committed_full(rec)
        overview.append(f'<tr><td><a href="#paper-{html.escape(rec.paper)}">{html.escape(rec.paper)}</a></td>'
                        f'<td class="left">{html.escape(rec.title)}</td><td>{rec.preset}</td><td>{html.escape(rec.duration())}</td>'
                        f'<td class="left">{cells}</td><td class="left">{full}</td></tr>')
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>',
             f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{_CSS}{_EXTRA_CSS}</style>',
             f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>',
             f"<header><h1>{html.escape(title)}</h1><p>{n} paper(s) · preset {', '.join(presets)} · "
             f"{sum(r.record.seconds for r in runs):.0f} s</p></header><main>",
             '<section id="overview"><h2>Overview</h2><p class="muted">Verdicts per claim: reproduced (every criterion '
             "holds, on every seed), partly (some), not reproduced (none), error (the run raised or measured "
             "nothing for a criterion). A quick preset is small: it proves that every stage and verdict runs, its "
             "verdicts are not the paper's test; the full preset is.</p>",
             '<table class="data"><tr><th>paper</th><th class="left">title</th><th>preset</th><th>time</th>'
             '<th class="left">verdicts (this run)</th><th class="left">committed full record</th></tr>'
             f'{"".join(overview)}</table></section>']
    parts += [_section(r, i) for i, r in enumerate(runs)]
    parts.append(f'<section id="environment"><h2>Environment</h2>{_kv_table(environment())}</section>')
    parts.append("</main></body></html>")
    return "\n".join(parts)


def write_report(out: str | os.PathLike, runs: Sequence[Any], overwrite: bool = False) -> Path:
    """Write ``out/index.html``, ``out/summary.json`` and ``out/<paper>/`` (each record) atomically; the
    temporaries of an earlier write that was killed are removed first (one writer per folder at a time)."""
    remove_leftovers(out)
    page = render_html(runs)
    summary = {"schema": "interp.reproduce.summary", "schema_version": 1,
               "papers": [{"paper": r.record.paper, "preset": r.record.preset, "seconds": r.record.seconds,
                           "error": r.record.error is not None, "differences": r.differences,
                           "verdicts": {v["id"]: v["verdict"] for v in r.record.verdicts}} for r in runs]}
    with output_dir(out, overwrite=overwrite, writer=WRITER) as tmp:
        for r in runs:
            r.record.save(tmp / r.record.paper)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
        (tmp / "index.html").write_text(page, encoding="utf-8")
    return Path(out)


__all__ = ["REPORT_FILES", "WRITER", "prepare_output", "remove_leftovers", "render_html", "write_report"]
