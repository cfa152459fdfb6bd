"""The notebook views, checked where they are seen: rendered in headless Chromium, offline.

A real audit report (heads + steering checks on a 3-layer model), the training-run index and the ``--compare``
page of a tiny model trained here, and a notebook-style page (the attention view
with plotly.js inlined, as ``fig.write_html`` writes it, and a token view) are opened in Chromium with every
network feature off. A probe script, added to a copy of each page, waits for plotly, clicks the attention view's
head drop-down and reads the rendered page back: the heatmap is drawn, the token labels are on the axes, a click
on the second head shows that head only, the token view's colours are the computed background colours, and no
script error was raised. Skipped where no Chromium is installed (``scripts/setup.sh`` installs Debian's as root).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import interp
from interp.apps.audit import AuditData, run_audit
from interp.testing import tiny_model
from interp.viz import attention_view, token_view

CHROMIUM = os.environ.get("INTERP_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (scripts/setup.sh installs it as root)")

# Added to the page: wait for every plotly graph, click the attention view's drop-down, report what is on screen.
PROBE = r"""
<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message)));
const report = out => document.body.setAttribute("data-probe", JSON.stringify(out));
window.addEventListener("load", () => setTimeout(() => { try { probe(); } catch (e) { report({probeError: String(e)}); } }, 500));
function probe() {
  const out = {errors: window.__errors, graphs: []};
  for (const gd of document.querySelectorAll(".js-plotly-plot")) {
    out.graphs.push({id: gd.id, traces: gd._fullData.length, title: gd._fullLayout.title.text,
                     heatmapImages: gd.querySelectorAll(".hm image").length,
                     subplots: Object.keys(gd._fullLayout._plots).length,
                     points: gd.querySelectorAll(".scatterlayer .points path.point").length,
                     lines: Array.from(gd.querySelectorAll(".scatterlayer .js-line")).filter(
                         l => (l.getAttribute("d") || "").length > 2).length,
                     bars: gd.querySelectorAll(".barlayer .point path").length,
                     xticks: Array.from(gd.querySelectorAll(".xtick text")).map(t => t.textContent),
                     yticks: Array.from(gd.querySelectorAll(".ytick text")).map(t => t.textContent),
                     menuHeader: Array.from(gd.querySelectorAll(".updatemenu-header text")).map(t => t.textContent)});
  }
  const att = Array.from(document.querySelectorAll(".js-plotly-plot")).find(
      gd => gd._fullLayout.updatemenus && gd._fullLayout.updatemenus.length && gd._fullData[0].type === "heatmap"
            && String(gd._fullLayout.title.text).startsWith("attention"));
  const spans = Array.from(document.querySelectorAll(".interp-token-view span[data-value]"));
  out.tokens = spans.map(s => ({text: s.textContent, value: Number(s.dataset.value),
                                background: getComputedStyle(s).backgroundColor}));
  if (!att) { report(out); return; }
  att.querySelector(".updatemenu-header").dispatchEvent(new MouseEvent("click", {bubbles: true}));
  setTimeout(() => { try {
    const buttons = att.querySelectorAll(".updatemenu-dropdown-button");
    out.buttons = Array.from(buttons).map(b => b.textContent);
    buttons[1].dispatchEvent(new MouseEvent("click", {bubbles: true}));
    setTimeout(() => {
      out.afterClick = {visible: att._fullData.map(t => t.visible), title: att._fullLayout.title.text,
                        heatmapImages: att.querySelectorAll(".hm image").length};
      out.errors = window.__errors;
      report(out);
    }, 500);
  } catch (e) { report({probeError: String(e)}); } }, 500);
}
</script>
"""


def render(page: Path, tmp_path: Path) -> dict:
    """Open a copy of ``page`` with the probe in headless Chromium; the probe's report."""
    probed = page.with_name(page.stem + ".probed.html")
    head, sep, tail = page.read_text(encoding="utf-8").rpartition("</body>")  # the page's own (the last) end tag
    assert sep, f"{page} has no </body>"
    probed.write_text(head + PROBE + sep + tail, encoding="utf-8")
    profile = tmp_path / f"chromium-{page.stem}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--virtual-time-budget=30000", "--dump-dom", probed.as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    found = re.search(r'data-probe="([^"]*)"', out.stdout)
    assert found, f"the probe did not report (Chromium exit {out.returncode}): {out.stderr[-2000:]}"
    import html

    got = json.loads(html.unescape(found.group(1)))
    assert "probeError" not in got, got
    return got


@pytest.fixture(scope="module")
def model():
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    return interp.wrap(hf, tok)


def test_notebook_views_render_and_the_head_menu_switches_heads(model, tmp_path):
    prompt = "ab cd ef"
    fig = attention_view(model, prompt, heads=[(2, 1), (0, 3), (1, 0)])
    tokens = model.to_str_tokens(prompt)
    view = token_view(tokens, torch.linspace(-1.0, 1.0, len(tokens)), title="a value per token")
    page = tmp_path / "notebook.html"
    head, sep, tail = fig.to_html(include_plotlyjs=True, full_html=True).rpartition("</body>")
    page.write_text(head + view.html + sep + tail, encoding="utf-8")
    assert "<script src=" not in page.read_text(encoding="utf-8")  # plotly.js inlined: nothing to fetch
    got = render(page, tmp_path)
    assert got["errors"] == []
    (graph,) = got["graphs"]
    assert graph["traces"] == 3 and graph["heatmapImages"] == 1  # one head drawn at a time
    assert graph["xticks"] == [f"{i}: {t}" for i, t in enumerate(tokens)]
    assert graph["title"] == "attention pattern: layer 2, head 1" and graph["menuHeader"] == ["L2H1"]
    assert got["buttons"] == ["L2H1", "L0H3", "L1H0"]
    assert got["afterClick"]["visible"] == [False, True, False]
    assert got["afterClick"]["title"] == "attention pattern: layer 0, head 3"
    assert got["afterClick"]["heatmapImages"] == 1
    # token colours as the browser computed them: full blue, none, full red at the ends and the middle
    assert [t["text"] for t in got["tokens"]] == [t.replace(" ", "\xa0") for t in tokens]
    assert got["tokens"][0]["background"] == "rgb(37, 99, 235)"
    assert got["tokens"][-1]["background"] == "rgb(220, 38, 38)"


def test_audit_report_shows_the_attention_and_token_views(model, tmp_path):
    texts = ["The quick brown fox jumps over the lazy dog.", "A stitch in time saves nine.",
             "Birds of a feather flock together.", "All that glitters is not gold."]
    report = run_audit(model, ["heads", "steering"], AuditData(texts), out=tmp_path / "report", keep_going=False,
                       options={"heads": {"n_random": "1"},
                                "steering": {"method": "diff_in_means", "behaviour": "uppercase", "layer": "1",
                                             "scale": "8", "max_new_tokens": "2", "neutral_texts": "2"}})
    assert all(c.status == "ok" for c in report.checks), [c.error for c in report.checks]
    got = render(tmp_path / "report" / "index.html", tmp_path)
    assert got["errors"] == []
    assert len(got["graphs"]) >= 5 and all(g["traces"] >= 1 for g in got["graphs"])
    heads = report.checks[0].result.pattern_view
    att = [g for g in got["graphs"] if str(g["title"]).startswith("attention")]
    assert len(att) == 1 and att[0]["heatmapImages"] == 1
    assert att[0]["xticks"] == [f"{i}: {t}" for i, t in enumerate(heads["tokens"])]
    first = [f"L{l}H{h}" for l, h in heads["heads"]]
    assert got["buttons"] == first and got["afterClick"]["visible"] == [False, True, False, False]
    # the steering section's token view: the per-token KL of the first neutral text, coloured by the browser
    kl = report.checks[1].result.evaluation["kl_tokens"]
    assert [t["value"] for t in got["tokens"]] == pytest.approx(kl["kl"], rel=1e-4, abs=1e-9)
    top = max(range(len(kl["kl"])), key=lambda i: kl["kl"][i])
    assert got["tokens"][top]["background"] == "rgb(220, 38, 38)"  # the largest KL: full red


def test_training_run_index_and_compare_page_are_drawn(tmp_path):
    """A real 3-checkpoint run (step 0 is the random initialisation): the index's trend panels are drawn with a
    line and a point per checkpoint, the drift heatmap has a row per head, and the --compare page draws its
    per-head heatmap and metric bars."""
    from interp.apps.audit.demo import tiny_training_run
    from interp.apps.audit.multi import run_audits

    ckpts = tiny_training_run(tmp_path / "run", (0, 10, 30))
    data = AuditData(AuditData.builtin().texts[:4])
    opts = {"heads": {"n_random": "1"}}
    summaries = run_audits([str(c) for c in ckpts], ["heads"], data, tmp_path / "index", opts)
    assert [s["step"] for s in summaries] == [0, 10, 30] and all(s["ok"] for s in summaries)
    got = render(tmp_path / "index" / "index.html", tmp_path)
    assert got["errors"] == []
    by = {g["id"]: g for g in got["graphs"]}
    trends = by["fig-trends"]
    series = [k for k, v in summaries[0]["checks"][0]["metrics"].items()
              if any(s["checks"][0]["metrics"][k] is not None for s in summaries)]
    grouped = {"delta_loss_flagged", "delta_loss_random"} <= set(series)  # drawn in one panel (HeadsCheck.TRENDS)
    assert trends["traces"] == len(series) >= 5 and trends["subplots"] == len(series) - grouped
    assert trends["lines"] == len(series) and trends["points"] == 3 * len(series)  # every metric, every step
    assert {"0", "10", "20", "30"} <= set(trends["xticks"])  # the x axis is the training step
    drift = by["fig-drift"]
    assert drift["heatmapImages"] == 1 and sorted(drift["yticks"]) == [f"L{l}H{h}" for l in range(2) for h in range(4)]
    assert drift["xticks"] == ["step 0", "step 10", "step 30"]
    # the random initialisation: its heads report says the predictions are nearly uniform (untrained?)
    first = (tmp_path / "index" / summaries[0]["folder"] / "index.html").read_text()
    assert summaries[0]["checks"][0]["metrics"]["loss_vs_uniform"] > 0.95 and "nearly uniform: untrained?" in first
    assert "untrained?" not in (tmp_path / "index" / summaries[-1]["folder"] / "index.html").read_text()
    run_audits([str(ckpts[0]), str(ckpts[-1])], ["heads"], data, tmp_path / "compare", opts, compare=True)
    got = render(tmp_path / "compare" / "index.html", tmp_path)
    assert got["errors"] == []
    by = {g["id"]: g for g in got["graphs"]}
    assert by["fig-compare-0"]["heatmapImages"] == 1 and by["fig-compare-0"]["xticks"] == ["H0", "H1", "H2", "H3"]
    diff = json.loads((tmp_path / "compare" / "results.json").read_text())["diff"]
    assert by["fig-compare-1"]["bars"] == sum(v["delta"] is not None and bool(v["a"]) for v in diff["metrics"].values())


@pytest.mark.slow
def test_the_main_job_on_the_default_model_shows_every_section(tmp_path):
    """`interp audit --out report` on zoo:smollm2-135m (the README's first command): heads and steering both `ok`
    with real numbers (steering on the behaviour the model exhibits, sentiment), every figure drawn in Chromium.
    ~10 min on the shared 2-core machine (the zoo model is built on first use)."""
    from typer.testing import CliRunner

    from interp.apps.cli import app

    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["audit", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    assert data["model"]["spec"] == "zoo:smollm2-135m"
    by = {c["name"]: c for c in data["checks"]}
    assert set(by) == {"heads", "steering"} and all(c["status"] == "ok" for c in by.values())
    heads, steer = by["heads"]["metrics"], by["steering"]["metrics"]
    assert heads["n_heads"] == 270 and 0 < heads["baseline_loss"] < 5 and heads["loss_vs_uniform"] < 0.6
    assert by["steering"]["result"]["behaviour"] == "sentiment" and steer["rate_none"] >= 0.5
    assert steer["effect"] <= -0.5 and steer["probe_accuracy"] >= 0.8 and steer["kl_neutral"] > 0
    page = (out / "index.html").read_text()
    assert "Skipped" not in page and "untrained?" not in page
    got = render(out / "index.html", tmp_path)
    assert got["errors"] == []
    drawn = {g["id"].rsplit("-", 1)[0] for g in got["graphs"] if g["traces"] >= 1}
    assert {"fig-heads", "fig-steering"} <= drawn
