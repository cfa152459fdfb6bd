"""``interp audit ckpt1 ckpt2 ... [--engine ray]``: one audit per checkpoint, plus an index with trends over steps.

Layout of the output folder (written with the same writer rule as a single report, :func:`interp.io.output_dir`:
built in a temporary folder, moved into place when complete, replacing only files of an earlier run)::

    index.html      the training-run page: headline metrics against the training step (plotly), per-head drift
                    (heatmap head x step of the ablation score, heads entering / leaving the flagged set), a table
                    of every checkpoint's status and numbers, and the checkpoints that failed with the reason
    results.json    {"schema": "interp.audit.index", "schema_version": 2, "engine", "checks", "data",
                     "thresholds", "exit_code", "reports": [{"spec", "folder" (null when it failed to load),
                     "step", "ok", "error" (why it failed to load, null otherwise), "model", "timings",
                     "provenance", "thresholds", "checks": [{"name", "title", "status", "reason", "seconds",
                     "summary", "metrics"}]}], "drift": {...} (see :func:`head_drift})}
    01-NAME/        the full report of the first checkpoint (index.html, results.json, checks/ ...)
    02-NAME/        ...

Checkpoints are ordered by training step (``--steps``, else ``trainer_state.json``'s ``global_step``, else a step
in the folder name; see :func:`interp.apps.audit.provenance.checkpoint_step`); when a step is unknown the order given
is kept. A checkpoint that fails to load or whose audit raises does not stop the others: its row names the path
and the reason, and the exit code is 1.

With ``engine="ray"`` each audit is one Ray task (loading its model in the worker) writing its report
with the usual report writer into the temporary folder, which must be on storage the workers reach
(see ``docs/scale.md``); with ``engine="local"`` the audits run one after another in this process. Both run
:func:`audit_one`, and the index is built from the reports written, so the two engines give the same output.

``interp audit A --compare B`` (:func:`run_compare`) audits both and writes a diff page instead of the index.
"""
from __future__ import annotations

import html
import json
import math
import re
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp.io import _json_default, check_output, output_dir

from interp.checks import AuditData, is_config
from .report import _CSS, _fmt

INDEX_SCHEMA = "interp.audit.index"
COMPARE_SCHEMA = "interp.audit.compare"
ENGINES = ("local", "ray")
#: the check whose per-head scores the drift views and --compare read
DRIFT_CHECK = "heads"


class ModelLoadError(ValueError):
    """A model spec that cannot be loaded (one line: ``cannot load model 'SPEC': reason``)."""


def load_model(spec: str, backend: str = "torch", load_kwargs: Mapping[str, Any] | None = None,
               tokenizer: str | None = None):
    """``interp.load(spec, backend, **load_kwargs)``, with the tokenizer of ``tokenizer`` (a folder or model spec)
    when given; any failure is a :class:`ModelLoadError` whose message names the spec once."""
    import interp

    try:
        model = interp.load(spec, backend=backend, **dict(load_kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - any load failure is reported as this spec's failure
        raise ModelLoadError(load_error(spec, exc)) from exc
    if tokenizer is not None:
        model.tokenizer = load_tokenizer(tokenizer)
    return model


def load_error(spec: str, exc: BaseException) -> str:
    """``cannot load model 'SPEC': reason`` on one line (the prefix once, whatever the loader said)."""
    msg = " ".join(str(exc).split()) or type(exc).__name__
    prefix = f"cannot load model {spec!r}: "
    while msg.startswith(prefix):
        msg = msg[len(prefix):]
    if type(exc) not in (ValueError, OSError):  # name the kind of failure (SafetensorError, KeyError, ...)
        msg = f"{type(exc).__name__}: {msg}"
    return prefix + msg


def resolve_tokenizer(spec: str) -> str:
    """Where ``--tokenizer SPEC`` is read from: a ``zoo:`` entry's folder, a local folder, or a hub name.
    Raises ``ValueError`` for a local path that does not exist (checked before any model loads)."""
    if spec.startswith("zoo:"):
        from interp import zoo

        try:
            return str(zoo.path(spec[4:]))
        except Exception as exc:  # noqa: BLE001 - unknown entry, failed build
            raise ValueError(f"--tokenizer {spec!r}: {exc}") from None
    path = Path(spec)
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        if not path.is_dir():
            raise ValueError(f"--tokenizer {spec!r}: no such folder (give a folder with tokenizer files, a zoo:NAME "
                             "or a hub name)")
        return str(path)
    return spec


def load_tokenizer(spec: str):
    """The tokenizer of ``spec`` (see :func:`resolve_tokenizer`), ``ValueError`` on failure."""
    import transformers

    source = resolve_tokenizer(spec)
    try:
        return transformers.AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # noqa: BLE001 - missing files, unknown hub name
        raise ValueError(f"--tokenizer {spec!r}: cannot load a tokenizer from it "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None


def audit_one(spec: str, backend: str, checks: list[str], texts: list[str], source: str,
              options: dict[str, dict[str, str]], out: str, load_kwargs: dict[str, Any],
              tokenizer: str | None = None, thresholds: Sequence[Any] = (), step: int | None = None,
              progress: bool = False) -> dict[str, Any]:
    """One checkpoint's audit (on a Ray worker or in-process): load, run, write its report to ``out``.

    Never raises for the checkpoint's own failures: a load error (or a failure of the audit itself) is returned
    as ``{"ok": False, "error": "reason", ...}`` with no report written, so the other checkpoints go on.
    """
    from interp.progress import progress_enabled, set_progress

    before = progress_enabled()
    set_progress(progress)
    try:
        return _audit_one(spec, backend, checks, texts, source, options, out, load_kwargs, tokenizer, thresholds, step)
    finally:
        set_progress(before)


def _audit_one(spec: str, backend: str, checks: list[str], texts: list[str], source: str,
               options: dict[str, dict[str, str]], out: str, load_kwargs: dict[str, Any], tokenizer: str | None,
               thresholds: Sequence[Any], step: int | None) -> dict[str, Any]:
    """:func:`audit_one`'s work, with the progress setting already applied."""
    from .runner import _first_line, run_audit

    base = {"spec": spec, "step": step, "ok": False, "error": None, "model": {}, "timings": {}, "provenance": {},
            "thresholds": [], "checks": [], "written": False}
    t0 = time.perf_counter()
    try:
        model = load_model(spec, backend, load_kwargs, tokenizer)
    except ValueError as exc:
        return {**base, "error": str(exc)}
    load_s = time.perf_counter() - t0
    try:
        report = run_audit(model, checks, AuditData(texts, source), None, options, spec=spec,
                           timings={"load_model": load_s}, thresholds=thresholds, step=step)
        report.write(out)
    except Exception as exc:  # noqa: BLE001 - this checkpoint's failure, reported in the index
        return {**base, "error": f"audit failed: {_first_line(exc)}"}
    return {**base, "step": report.provenance.get("checkpoint", {}).get("step"), "ok": report.ok,
            "model": report.model, "timings": report.timings, "provenance": report.provenance,
            "thresholds": report.thresholds, "written": True,
            "checks": [{"name": c.name, "title": c.title, "status": c.status, "reason": c.reason,
                        "seconds": c.seconds, "summary": c.summary, "metrics": c.metrics} for c in report.checks]}


# ------------------------------------------------------------------------------------ checkpoints
def _is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def expand_specs(specs: Sequence[str]) -> list[str]:
    """A spec that is a *run folder* (no ``config.json``, but sub-folders that have one, e.g. the
    ``checkpoint-N`` folders a trainer writes) becomes its checkpoint folders; other specs stay as given.
    A run folder's sub-folders that are not model folders but look like checkpoints (``checkpoint-N``, a
    ``trainer_state.json``) are kept too, so that a corrupt one is reported rather than silently left out."""
    from .provenance import _STEP_NAME

    out: list[str] = []
    for spec in specs:
        path = Path(spec)
        if spec.startswith("zoo:") or not path.is_dir() or _is_model_folder(path):
            out.append(spec)
            continue
        subs = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
        ckpts = [p for p in subs if _is_model_folder(p) or _STEP_NAME.match(p.name)
                 or (p / "trainer_state.json").is_file()]
        if not any(_is_model_folder(p) for p in ckpts):
            out.append(spec)  # not a run folder: loading it gives the usual error
            continue
        out += [str(p) for p in ckpts]
    return out


def parse_steps(text: str | None, n: int) -> list[int] | None:
    """``--steps 0,50,100``: one non-negative integer per checkpoint (``ValueError`` otherwise)."""
    if text is None:
        return None
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--steps expects comma-separated integers (one per checkpoint), got {text!r}") from None
    if len(steps) != n or any(s < 0 for s in steps):
        raise ValueError(f"--steps gives {len(steps)} step(s) for {n} checkpoint(s); give one non-negative "
                         "integer per checkpoint, in the order given")
    return steps


def order_checkpoints(specs: Sequence[str], steps: Sequence[int] | None = None) -> list[tuple[str, int | None]]:
    """``[(spec, step)]`` ordered by training step when every step is known (``steps``, else
    :func:`~interp.apps.audit.provenance.checkpoint_step`); in the order given otherwise."""
    from .provenance import checkpoint_step

    known = list(steps) if steps is not None else [checkpoint_step(s) for s in specs]
    pairs = list(zip(specs, known))
    if all(s is not None for s in known):
        pairs.sort(key=lambda p: p[1])
    return pairs


def _slug(spec: str, i: int) -> str:
    tail = "-".join(Path(spec.replace("zoo:", "zoo-")).parts[-2:]) or "model"
    return f"{i + 1:02d}-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip("-.") or "model")[:60]


def _run_jobs(jobs: list[dict[str, Any]], engine: str) -> list[dict[str, Any]]:
    """:func:`audit_one` for every job: in this process, or one Ray task each (results in job order)."""
    if engine != "ray":
        return [audit_one(**job) for job in jobs]
    from interp.apps.ray_engine import ensure_ray

    ray = ensure_ray()
    task = ray.remote(num_cpus=1)(audit_one)
    return ray.get([task.remote(**job) for job in jobs])


def _reports(tmp: Path, summaries: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    for s in summaries:
        path = tmp / s["folder"] / "results.json" if s.get("folder") else None
        out.append(json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else None)
    return out


def run_audits(specs: Sequence[str], checks: Sequence[str], data: AuditData | None = None,
               out: str | Path = "audit-report", options: Mapping[str, Mapping[str, str]] | None = None,
               backend: str = "torch", engine: str = "local", load_kwargs: Mapping[str, Any] | None = None,
               overwrite: bool = False, thresholds: Sequence[Any] = (), steps: Sequence[int] | None = None,
               tokenizer: str | None = None, compare: bool = False) -> list[dict[str, Any]]:
    """Audit every checkpoint in ``specs`` with ``checks``; write one report each and an index page.

    Returns one summary per checkpoint (``spec``, ``folder``, ``step``, ``ok``, ``error``, ``model``,
    ``provenance``, ``thresholds``, ``checks`` with status, reason, seconds, summary and metrics), ordered by
    step (see :func:`order_checkpoints`). ``overwrite`` is ``--force`` (see :func:`interp.io.output_dir`).
    ``compare=True`` (two specs, kept in the order given): the page is the diff of the second against the
    first (:func:`render_compare`) and ``results.json`` has the schema ``interp.audit.compare``.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if not specs:
        raise ValueError("give at least one model or checkpoint to audit")
    if compare and len(specs) != 2:
        raise ValueError(f"--compare diffs two checkpoints, got {len(specs)}")
    data = data or AuditData.builtin()
    pairs = list(zip(specs, steps or [None] * len(specs))) if compare else order_checkpoints(specs, steps)
    folders = [_slug(s, i) for i, (s, _) in enumerate(pairs)]
    out_path = check_output(out, ["index.html", "results.json", *(f + "/" for f in folders)], overwrite=overwrite,
                            writer="interp audit")
    with output_dir(out_path, overwrite=overwrite, writer="interp audit") as tmp:
        jobs = [dict(spec=s, backend=backend, checks=list(checks), texts=list(data.texts), source=data.source,
                     options={k: v if is_config(v) else dict(v) for k, v in (options or {}).items()}, out=str(tmp / f),
                     load_kwargs=dict(load_kwargs or {}), tokenizer=tokenizer, thresholds=list(thresholds),
                     step=st) for (s, st), f in zip(pairs, folders)]
        summaries = _run_jobs(jobs, engine)
        for s, f in zip(summaries, folders):
            s["folder"] = f if s.pop("written", False) else None
        reports = _reports(tmp, summaries)
        code = _exit_code(summaries)
        if compare:
            diff = compare_reports(reports[0], reports[1]) if all(r is not None for r in reports) else None
            doc = {"schema": COMPARE_SCHEMA, "schema_version": 1, "engine": engine, "checks": list(checks),
                   "a": summaries[0], "b": summaries[1], "diff": diff, "exit_code": code}
            page = render_compare(summaries, diff)
        else:
            drift = head_drift(summaries, reports)
            doc = {"schema": INDEX_SCHEMA, "schema_version": 2, "engine": engine, "checks": list(checks),
                   "data": {"source": data.source, "n_texts": len(data.texts), "hash": data.digest()},
                   "thresholds": [t.expr for t in thresholds], "exit_code": code, "reports": summaries,
                   "drift": drift}
            page = render_index(summaries, list(checks), drift)
        (tmp / "results.json").write_text(json.dumps(doc, indent=2, default=_json_default), encoding="utf-8")
        (tmp / "index.html").write_text(page, encoding="utf-8")
    return summaries


def _exit_code(summaries: list[dict[str, Any]]) -> int:
    from .gate import exit_code

    errored = any(s.get("error") or not s.get("ok") for s in summaries)
    return exit_code(errored, any(t["failed"] for s in summaries for t in s.get("thresholds", [])))


def exit_code_of(summaries: list[dict[str, Any]]) -> int:
    """The documented exit code of a multi-checkpoint audit (1 if any checkpoint or check errored, else 3 if
    a threshold failed on any checkpoint, else 0)."""
    return _exit_code(summaries)


# ------------------------------------------------------------------------------------ drift
def _heads_payload(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if report is None:
        return None
    for c in report.get("checks") or []:
        if c.get("name") == DRIFT_CHECK and c.get("status") == "ok" and isinstance(c.get("result"), dict):
            return c["result"]
    return None


def _drift_score(payload: Mapping[str, Any]) -> str | None:
    score = (payload.get("ablation_score") or None)
    means = payload.get("mean_scores") or {}
    if score in means:
        return score
    return next(iter(means), None)


def head_drift(summaries: list[dict[str, Any]], reports: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Per-head drift across checkpoints, from the ``heads`` payloads: ``{"score", "heads": ["L0H0", ...],
    "steps": [...], "labels": [...], "values": [[score of head h at checkpoint k]] (head-major), "flagged":
    [[bool]], "entered": [[heads newly flagged at k]], "left": [[heads no longer flagged at k]]}``; ``None``
    without a heads check that ran on at least one checkpoint."""
    payloads = [_heads_payload(r) for r in reports]
    first = next((p for p in payloads if p is not None), None)
    if first is None:
        return None
    score = _drift_score(first)
    if score is None:
        return None
    n_layers, n_heads = int(first["n_layers"]), int(first["n_heads"])
    heads = [f"L{l}H{h}" for l in range(n_layers) for h in range(n_heads)]
    values: list[list[float | None]] = [[] for _ in heads]
    flagged: list[list[bool | None]] = [[] for _ in heads]
    steps, labels, entered, left = [], [], [], []
    prev: set[str] | None = None
    for k, (s, p) in enumerate(zip(summaries, payloads)):
        steps.append(s.get("step"))
        labels.append(_label(s, k))
        ok = p is not None and int(p["n_layers"]) == n_layers and int(p["n_heads"]) == n_heads \
            and score in (p.get("mean_scores") or {})
        flat = [v for row in p["mean_scores"][score] for v in row] if ok else [None] * len(heads)
        fl = {f"L{l}H{h}" for l, h in (p.get("flagged") or {}).get(score, [])} if ok else None
        for i, name in enumerate(heads):
            values[i].append(flat[i])
            flagged[i].append(None if fl is None else name in fl)
        entered.append(sorted(fl - prev, key=heads.index) if fl is not None and prev is not None else [])
        left.append(sorted(prev - fl, key=heads.index) if fl is not None and prev is not None else [])
        prev = fl if fl is not None else prev
    return {"score": score, "heads": heads, "steps": steps, "labels": labels, "values": values, "flagged": flagged,
            "entered": entered, "left": left}


def _label(s: Mapping[str, Any], k: int) -> str:
    return f"step {s['step']}" if s.get("step") is not None else f"#{k + 1}"


# ------------------------------------------------------------------------------------ figures
def _trend_groups(name: str) -> dict[str, tuple[str, ...]]:
    """A check's ``TRENDS`` (``{panel title: metric names drawn together}``), ``{}`` when it declares none."""
    from .registry import get_check

    try:
        return dict(getattr(get_check(name), "TRENDS", {}) or {})
    except Exception:  # noqa: BLE001 - a plug-in missing here only loses the grouping
        return {}


def trend_figure(summaries: list[dict[str, Any]], checks: list[str]):
    """Every check's headline metrics against the training step: one panel per metric, or per group of metrics a
    check draws together (its ``TRENDS``, e.g. Δloss of the flagged heads vs random heads); a failed checkpoint
    or an unmeasured metric is a gap. ``None`` when no metric was measured."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels: list[tuple[str, list[tuple[str, list[float | None]]]]] = []
    for name in checks:
        keys = _metric_keys(summaries, name)
        series: dict[str, list[float | None]] = {}
        for key in keys:
            ys = []
            for s in summaries:
                by = {c["name"]: c for c in s["checks"]}
                v = (by.get(name, {}).get("metrics") or {}).get(key)
                ys.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                          else None)
            if any(y is not None for y in ys):
                series[key] = ys
        grouped: dict[str, str] = {}
        for title, members in _trend_groups(name).items():
            shown = [m for m in members if m in series]
            if len(shown) > 1:
                grouped.update({m: title for m in shown})
        done: set[str] = set()
        for key in series:
            if key in done:
                continue
            title = grouped.get(key)
            members = [k for k in series if grouped.get(k) == title] if title else [key]
            done.update(members)
            panels.append((f"{name}: {title}" if title else f"{name}.{key}",
                           [(f"{name}.{m}", series[m]) for m in members]))
    if not panels:
        return None
    use_steps = all(s.get("step") is not None for s in summaries)
    xs = [s["step"] if use_steps else k + 1 for k, s in enumerate(summaries)]
    cols = 2 if len(panels) > 1 else 1
    rows = -(-len(panels) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[t for t, _ in panels], vertical_spacing=min(
        0.12, 0.5 / max(rows, 1)))
    for i, (_, members) in enumerate(panels):
        for label, ys in members:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=label, showlegend=len(members) > 1,
                                     text=[s["spec"] for s in summaries],
                                     hovertemplate=f"{label}<br>%{{x}}: %{{y:.4g}}<br>%{{text}}<extra></extra>"),
                          row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(title_text="training step" if use_steps else "checkpoint")
    height = max(320, 260 * rows) + 40
    fig.update_layout(title={"text": "Headline metrics across the training run", "y": 1 - 12 / height,
                             "yanchor": "top"}, height=height, margin={"t": 120},
                      legend={"orientation": "h", "y": 1 + 30 / height, "yanchor": "bottom", "x": 0})
    return fig


def drift_figure(drift: Mapping[str, Any]):
    """Heatmap head x step of the drift score, the flagged heads marked with a ring."""
    import plotly.graph_objects as go

    x = drift["labels"]
    z = drift["values"]
    fig = go.Figure(go.Heatmap(z=z, x=x, y=drift["heads"], colorscale="Viridis", colorbar={"title": {"text": drift["score"]}},
                               hovertemplate="%{y} at %{x}: %{z:.4g}<extra></extra>", hoverongaps=False))
    fx, fy = [], []
    for i, head in enumerate(drift["heads"]):
        for k, f in enumerate(drift["flagged"][i]):
            if f:
                fx.append(x[k])
                fy.append(head)
    fig.add_trace(go.Scatter(x=fx, y=fy, mode="markers", name="flagged", hoverinfo="skip",
                             marker={"symbol": "circle-open", "size": 12, "color": "#dc2626", "line": {"width": 2}}))
    fig.update_layout(title={"text": f"Per-head drift: mean {drift['score']} per head and checkpoint "
                                     "(rings: heads in the flagged set)"},
                      height=max(360, 18 * len(drift["heads"]) + 160), yaxis={"autorange": "reversed"},
                      legend={"orientation": "h", "y": -0.08})
    return fig


def _fig_html(fig: Any, div_id: str) -> str:
    from .report import _figure_html

    return _figure_html(fig, div_id)


def _page(title: str, body: list[str]) -> str:
    from plotly.offline import get_plotlyjs

    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style><script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
            f"<header><h1>{html.escape(title)}</h1></header><main>{''.join(body)}</main></body></html>")


def common_skips(summaries: list[dict[str, Any]], checks: list[str]) -> dict[str, str]:
    """``{check: reason}`` for the checks skipped on every checkpoint that ran, for one reason (said once on the
    index instead of on every row)."""
    out = {}
    for name in checks:
        recs = [c for s in summaries if not s.get("error") for c in s["checks"] if c["name"] == name]
        reasons = {c.get("reason") for c in recs}
        if recs and all(c["status"] == "skipped" for c in recs) and len(reasons) == 1:
            out[name] = next(iter(reasons)) or "the check does not apply"
    return out


def _status_cell(c: Mapping[str, Any], said: bool = False) -> str:
    """A status cell: the reason shortened on the row (in full on hover), unless ``said`` once above the table."""
    reason = "" if said else (c.get("reason") or "")
    short = f": {reason[:117]}..." if len(reason) > 120 else (f": {reason}" if reason else "")
    return (f'<td class="status-{html.escape(c["status"])}" title="{html.escape(reason)}">'
            f'{html.escape(c["status"])} ({c["seconds"]:.1f} s){html.escape(short)}</td>')


def render_index(summaries: list[dict[str, Any]], checks: list[str], drift: Mapping[str, Any] | None = None) -> str:
    """The training-run page: trends, drift, failures and a table with one row per checkpoint."""
    body: list[str] = []
    failed = [s for s in summaries if s.get("error")]
    gate = [(s, t) for s in summaries for t in s.get("thresholds", []) if t["failed"]]
    lead = f"{len(summaries)} checkpoint(s), checks: {', '.join(checks)}"
    if failed:
        lead += f"; {len(failed)} failed"
    body.append(f"<section id='run'><h2>Training run</h2><p>{html.escape(lead)}.</p>")
    if failed:
        items = "".join(f"<li><code>{html.escape(s['spec'])}</code>: {html.escape(s['error'])}</li>" for s in failed)
        body.append(f"<div class='note' id='failed'><b>Failed checkpoints</b> (no report written):<ul>{items}</ul></div>")
    if gate:
        items = "".join(f"<li>{html.escape(_label(s, summaries.index(s)))} (<code>{html.escape(s['spec'])}</code>): "
                        f"{html.escape(t['reason'])}</li>" for s, t in gate)
        body.append(f"<div class='note' id='gate'><b>Thresholds failed</b>:<ul>{items}</ul></div>")
    body.append("</section>")
    fig = trend_figure(summaries, checks)
    if fig is not None:
        body.append("<section id='trends'><h2>Trends</h2><p class='muted'>Each check's headline metrics (the names "
                    "<code>--fail-if</code> takes) against the training step; hover for the checkpoint.</p>"
                    f"{_fig_html(fig, 'fig-trends')}</section>")
    if drift is not None:
        moves = "".join(f"<tr><td>{html.escape(lab)}</td><td>{html.escape(', '.join(e) or '–')}</td>"
                        f"<td>{html.escape(', '.join(l) or '–')}</td></tr>"
                        for k, (lab, e, l) in enumerate(zip(drift["labels"], drift["entered"], drift["left"])) if k)
        body.append("<section id='drift'><h2>Per-head drift</h2>"
                    f"{_fig_html(drift_figure(drift), 'fig-drift')}"
                    f"<h3>Heads entering / leaving the flagged set ({html.escape(drift['score'])})</h3>"
                    f"<table class='data'><tr><th>checkpoint</th><th>entered</th><th>left</th></tr>{moves}</table>"
                    "</section>")
    skips = common_skips(summaries, checks)
    if skips:
        items = "".join(f"<li><b>{html.escape(n)}</b>: {html.escape(r)}</li>" for n, r in skips.items())
        body.append(f"<section id='skipped'><h2>Skipped on every checkpoint</h2><ul>{items}</ul></section>")
    body.append(_table(summaries, checks, skips))
    return _page(f"interp audit: {len(summaries)} checkpoints", body)


def _metric_keys(summaries: list[dict[str, Any]], name: str) -> list[str]:
    """The headline metric names check ``name`` reported in any of the checkpoints' summaries, in first-seen order."""
    keys: list[str] = []
    for s in summaries:
        for c in s["checks"]:
            if c["name"] == name:
                keys += [k for k in (c.get("metrics") or {}) if k not in keys]
    return keys


def _table(summaries: list[dict[str, Any]], checks: list[str], said: Mapping[str, str] | None = None) -> str:
    cols: list[tuple[str, str]] = []
    for name in checks:
        cols += [(name, k) for k in _metric_keys(summaries, name)]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in
                   ["checkpoint", "step", "model", *(f"{c}: status" for c in checks), *(f"{c}.{k}" for c, k in cols),
                    *(f"{c}: summary" for c in checks)])
    rows = []
    for k, s in enumerate(summaries):
        by = {c["name"]: c for c in s["checks"]}
        link = (f'<a href="{html.escape(s["folder"])}/index.html">{html.escape(s["spec"])}</a>' if s.get("folder")
                else html.escape(s["spec"]))
        if s.get("error"):
            rows.append(f"<tr class='failed'><td>{link}</td><td>{html.escape(_fmt(s.get('step')))}</td>"
                        f"<td colspan='{1 + 2 * len(checks) + len(cols)}' class='status-error' style='text-align:left'>"
                        f"error: {html.escape(s['error'])}</td></tr>")
            continue
        status = [_status_cell(by[c], c in (said or {})) if c in by else "<td>–</td>" for c in checks]
        values = [f"<td>{html.escape(_fmt((by.get(c, {}).get('metrics') or {}).get(m)))}</td>" for c, m in cols]
        values += ["<td style='text-align:left'>" + html.escape("; ".join(
            f"{k}: {_fmt(v)}" for k, v in (by.get(c, {}).get("summary") or {}).items())) + "</td>" for c in checks]
        card = s["model"]
        model = f"{card.get('family')} · {card.get('n_layers')} layers · d {card.get('d_model')}"
        rows.append(f"<tr><td>{link}</td><td>{html.escape(_fmt(s.get('step')))}</td><td>{html.escape(model)}</td>"
                    f"{''.join(status)}{''.join(values)}</tr>")
    return ("<section id='table'><h2>Checkpoints</h2>"
            f"<table class='data'><tr>{head}</tr>{''.join(rows)}</table>"
            "<p class='muted'>Each checkpoint links to its full report; the numbers are its results.json "
            "<code>metrics</code>.</p></section>")


# ------------------------------------------------------------------------------------ compare
def compare_reports(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The diff of report ``b`` against report ``a`` (both ``results.json`` dicts): ``{"metrics": {"CHECK.METRIC":
    {"a", "b", "delta"}}, "heads": {"score", "n_layers", "n_heads", "delta": [[b - a per head]], "a": [[...]],
    "b": [[...]], "entered": [[l, h], ...], "left": [[l, h], ...], "kept": [[l, h], ...]} | None,
    "fingerprints": {"a", "b", "same"}}``."""
    metrics: dict[str, dict[str, Any]] = {}
    ma = {c["name"]: c.get("metrics") or {} for c in a.get("checks") or []}
    mb = {c["name"]: c.get("metrics") or {} for c in b.get("checks") or []}
    for name in list(dict.fromkeys([*ma, *mb])):
        for key in list(dict.fromkeys([*ma.get(name, {}), *mb.get(name, {})])):
            va, vb = ma.get(name, {}).get(key), mb.get(name, {}).get(key)
            num = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
            metrics[f"{name}.{key}"] = {"a": va, "b": vb, "delta": (vb - va) if num else None}
    heads = None
    pa, pb = _heads_payload(a), _heads_payload(b)
    if pa is not None and pb is not None and (pa["n_layers"], pa["n_heads"]) == (pb["n_layers"], pb["n_heads"]):
        score = _drift_score(pa)
        if score is not None and score in (pb.get("mean_scores") or {}):
            sa, sb = pa["mean_scores"][score], pb["mean_scores"][score]
            fa = {tuple(x) for x in (pa.get("flagged") or {}).get(score, [])}
            fb = {tuple(x) for x in (pb.get("flagged") or {}).get(score, [])}
            heads = {"score": score, "n_layers": pa["n_layers"], "n_heads": pa["n_heads"], "a": sa, "b": sb,
                     "delta": [[vb - va for va, vb in zip(ra, rb)] for ra, rb in zip(sa, sb)],
                     "entered": [list(x) for x in sorted(fb - fa)], "left": [list(x) for x in sorted(fa - fb)],
                     "kept": [list(x) for x in sorted(fa & fb)]}
    fa_, fb_ = ((r.get("provenance") or {}).get("weights_fingerprint") for r in (a, b))
    return {"metrics": metrics, "heads": heads, "fingerprints": {"a": fa_, "b": fb_, "same": fa_ == fb_}}


def compare_figures(diff: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The compare page's figures: the per-head score change (layer x head) and the metric changes."""
    import plotly.graph_objects as go

    figs = []
    h = diff.get("heads")
    if h is not None:
        d = h["delta"]
        top = max((abs(v) for row in d for v in row), default=0.0) or 1.0
        fig = go.Figure(go.Heatmap(z=d, x=[f"H{i}" for i in range(h["n_heads"])],
                                   y=[f"L{i}" for i in range(h["n_layers"])], colorscale="RdBu", zmid=0,
                                   zmin=-top, zmax=top, colorbar={"title": {"text": "B − A"}},
                                   hovertemplate="%{y} %{x}: %{z:+.4g}<extra></extra>"))
        for key, sym, col in (("entered", "circle-open", "#dc2626"), ("left", "x-open", "#1d4ed8")):
            pts = h[key]
            fig.add_trace(go.Scatter(x=[f"H{p[1]}" for p in pts], y=[f"L{p[0]}" for p in pts], mode="markers",
                                     name=f"{key} the flagged set", marker={"symbol": sym, "size": 14, "color": col}))
        fig.update_layout(title={"text": f"Per-head change of mean {h['score']} (B − A)"}, height=420,
                          yaxis={"autorange": "reversed"})
        figs.append(("Per-head score change and flagged-set change", fig))
    # relative change, so that a loss and a head count share one axis (hover gives both values); a metric that
    # is 0 in A has no relative change and is left to the table
    rows = [(k, v) for k, v in diff["metrics"].items() if v["delta"] is not None and v["a"]]
    if rows:
        rel = [100 * v["delta"] / abs(v["a"]) for _, v in rows]
        fig = go.Figure(go.Bar(x=[k for k, _ in rows], y=rel,
                               customdata=[[v["a"], v["b"], v["delta"]] for _, v in rows],
                               hovertemplate="%{x}: %{y:+.1f}%<br>A %{customdata[0]:.4g} → B %{customdata[1]:.4g} "
                                             "(%{customdata[2]:+.4g})<extra></extra>"))
        fig.update_layout(title={"text": "Relative change of each headline metric, (B − A) / |A|"}, height=380,
                          yaxis={"title": {"text": "% change"}}, margin={"b": 160})
        figs.append(("Headline metric changes", fig))
    return figs


def render_compare(summaries: list[dict[str, Any]], diff: Mapping[str, Any] | None) -> str:
    """The ``--compare`` page: what changed from checkpoint A to checkpoint B."""
    a, b = summaries
    body = ["<section id='compare'><h2>A versus B</h2><table class='data'><tr><th></th><th>checkpoint</th>"
            "<th>step</th><th>report</th></tr>"]
    for tag, s in (("A", a), ("B", b)):
        link = f'<a href="{html.escape(s["folder"])}/index.html">report</a>' if s.get("folder") else \
            f"<span class='status-error'>error: {html.escape(s.get('error') or '')}</span>"
        body.append(f"<tr><td>{tag}</td><td><code>{html.escape(s['spec'])}</code></td>"
                    f"<td>{html.escape(_fmt(s.get('step')))}</td><td>{link}</td></tr>")
    body.append("</table>")
    if diff is None:
        body.append("<p class='note'>No diff: a checkpoint failed (see above).</p></section>")
        return _page("interp audit: compare", body)
    fp = diff["fingerprints"]
    body.append(f"<p class='muted'>weights fingerprints {'identical' if fp['same'] else 'differ'}. "
                "Machine-readable: <a href='results.json'>results.json</a> (<code>diff</code>).</p>")
    h = diff.get("heads")
    if h is not None:
        fmt = lambda pts: ", ".join(f"L{l}H{hh}" for l, hh in pts) or "–"  # noqa: E731
        body.append(f"<p>Flagged set ({html.escape(h['score'])}): entered <b>{html.escape(fmt(h['entered']))}</b>; "
                    f"left <b>{html.escape(fmt(h['left']))}</b>; kept {html.escape(fmt(h['kept']))}.</p>")
    for i, (caption, fig) in enumerate(compare_figures(diff)):
        body.append(f"<figure><figcaption>{html.escape(caption)}</figcaption>{_fig_html(fig, f'fig-compare-{i}')}"
                    "</figure>")
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(v['a']))}</td>"
                   f"<td>{html.escape(_fmt(v['b']))}</td><td>{html.escape(_fmt(v['delta']))}</td></tr>"
                   for k, v in diff["metrics"].items())
    body.append("<h3>Headline metrics</h3><table class='data' id='compare-metrics'><tr><th>metric</th><th>A</th>"
                f"<th>B</th><th>B − A</th></tr>{rows}</table></section>")
    return _page("interp audit: compare", body)


__all__ = ["run_audits", "audit_one", "render_index", "render_compare", "compare_reports", "head_drift",
           "trend_figure", "drift_figure", "compare_figures", "expand_specs", "order_checkpoints", "parse_steps",
           "common_skips", "load_model", "load_tokenizer", "resolve_tokenizer", "load_error", "ModelLoadError", "exit_code_of",
           "INDEX_SCHEMA", "COMPARE_SCHEMA"]
