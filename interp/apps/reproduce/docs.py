"""Result tables in the docs and the README, generated from the committed records (one script:
``python scripts/render_records.py``; a default-suite test fails when a generated block is out of date).

Markers in a Markdown file (the text between a marker and its end line is replaced)::

    <!-- record: PAPER/PRESET -->            claims table of the committed record (paper | criterion | ours | verdict)
    <!-- /record -->
    <!-- record-table: PAPER/PRESET: CAPTION -->   one of the record's tables, by its caption
    <!-- /record-table -->
    <!-- papers -->                          the README's table of all papers (method, recipe, doc, notebook, verdicts)
    <!-- /papers -->
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

from .recipe import available_recipes, get_recipe
from .record import ReproductionRecord, committed_record

_BLOCK = re.compile(r"(?P<open><!-- (?P<kind>record|record-table|papers)(?::\s*(?P<arg>[^\n]*?))?\s*-->\n)"
                    r"(?P<body>.*?)(?P<close><!-- /(?P=kind) -->)", re.S)


class RecordMissing(LookupError):
    """A doc refers to a record that is not committed."""


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "–" if not math.isfinite(v) else f"{v:.4g}"
    if v is None:
        return "–"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _record(arg: str, where: str) -> ReproductionRecord:
    paper, _, preset = (arg or "").strip().partition("/")
    if not paper or preset not in ("quick", "full"):
        raise ValueError(f"{where}: a record marker names PAPER/PRESET (preset quick or full), got {arg!r}")
    rec = committed_record(get_recipe(paper), preset)
    if rec is None:
        raise RecordMissing(f"{where}: no committed record {paper}/{preset} (run: interp reproduce {paper} "
                            f"--preset {preset} --update-record)")
    return rec


def claims_markdown(rec: ReproductionRecord) -> str:
    rows = []
    for v in rec.verdicts:
        crit = v["criterion"] + (f" (fixed {v['fixed']}" + (f"; changed {v['changed']['date']}, originally "
                                                            f"{v['changed']['original']}: {v['changed']['why']}"
                                                            if v.get("changed") else "")
                                     + (f"; set after results were seen, {v['posthoc']['date']}: "
                                        f"{v['posthoc']['seen']}" if v.get("posthoc") else "") + ")")
        rows.append({"claim": v["claim"], "paper": f"{v['paper']} ({v['where']})", "our criterion": crit,
                     "ours": v["ours"], "verdict": f"**{v['verdict']}**"})
    rel = f"benchmarks/{rec.paper}/records/{rec.preset}/"
    return (markdown_table(rows) + f"\nFrom the committed record `{rel}` ({rec.duration()}, {rec.created[:10]}); "
            f"regenerate with `{rec.command} --update-record`, compare with `{rec.command} --check`.\n")


def record_cost(rec: ReproductionRecord | None, estimate: str) -> str:
    """What a full run costs, read from its committed record (its wall time, the compute time of stages it
    resumed, the date and the thread count); the recipe's estimate only where there is no record."""
    if rec is None:
        return f"no record; estimate: {estimate}"
    total = rec.seconds + rec.resumed_seconds
    threads = (rec.provenance or {}).get("threads")
    minutes = f"{total / 60:.0f} min" if total >= 90 else f"{total:.0f} s"
    return (f"{minutes} in the committed record ({rec.duration()}; {rec.created[:10]}"
            + (f", {threads} thread(s)" if threads else "") + ")")


def papers_markdown(prefix: str = "") -> str:
    """The table of every recipe; links are prefixed with ``prefix`` (``"../"`` from docs/)."""
    rows = []
    for name in available_recipes():
        try:
            r = get_recipe(name)
        except (ImportError, KeyError, TypeError, ValueError):
            rows.append({"paper": name, "method": "–", "recipe": "–", "doc": "–", "notebook": "–",
                         "verdicts (full record)": "recipe missing", "full run": "–"})
            continue
        try:
            rec = committed_record(r, "full")
        except Exception:  # noqa: BLE001 - an unreadable record is stated, the table still renders
            rec = None
            verdicts = "full record unreadable"
        else:
            verdicts = rec.summary() if rec is not None else "no full record yet"
        rows.append({"paper": r.title, "method": f"[{r.method}]({prefix}{r.method})",
                     "recipe": f"[benchmarks/{name}]({prefix}benchmarks/{name}/recipe.py)",
                     "doc": f"[{Path(r.doc).name}]({prefix}{r.doc})" if r.doc else "–",
                     "notebook": f"[{Path(r.notebook).name}]({prefix}{r.notebook})" if r.notebook else "–",
                     "verdicts (full record)": verdicts, "full run": record_cost(rec, r.cost.get("full", "?"))})
    return markdown_table(rows)


def render(text: str, where: str = "<text>", prefix: str = "") -> str:
    """``text`` with every generated block replaced by its current content (``prefix``: see :func:`papers_markdown`)."""
    def block(m: re.Match) -> str:
        kind, arg = m.group("kind"), m.group("arg") or ""
        if kind == "papers":
            body = papers_markdown(prefix)
        elif kind == "record":
            body = claims_markdown(_record(arg, where))
        else:
            spec, _, caption = arg.partition(":")
            rec = _record(spec, where)
            caption = caption.strip()
            if caption not in rec.tables:
                raise KeyError(f"{where}: record {spec.strip()} has no table {caption!r}; tables: {list(rec.tables)}")
            body = markdown_table(rec.tables[caption])
        return m.group("open") + body + m.group("close")

    return _BLOCK.sub(block, text)


def render_files(root: str | Path, write: bool = True,
                 files: Callable[[Path], list[Path]] | None = None) -> list[Path]:
    """Render README.md and docs/**/*.md under ``root``; returns the files whose content changed (written
    when ``write``)."""
    root = Path(root)
    targets = (files(root) if files else [root / "README.md", *sorted((root / "docs").rglob("*.md"))])
    changed = []
    for f in targets:
        if not f.is_file():
            continue
        old = f.read_text(encoding="utf-8")
        rel = f.relative_to(root)
        new = render(old, str(rel), "../" * (len(rel.parts) - 1))
        if new != old:
            changed.append(f)
            if write:
                f.write_text(new, encoding="utf-8")
    return changed


__all__ = ["RecordMissing", "claims_markdown", "record_cost", "markdown_table", "papers_markdown", "render", "render_files"]
