"""Auditing a real (tiny) training run: 4 checkpoints trained here with the zoo's small-LM trainer, plus a corrupt
one among them. The index orders them by step and its numbers are the per-checkpoint reports'; ``--compare`` diffs
two of them; ``--fail-if`` gates with exit code 3; the corrupt checkpoint is named with its reason while the
others' reports are written (exit code 1)."""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from interp.apps.audit.demo import tiny_training_run
from interp.apps.audit.multi import order_checkpoints, parse_steps
from interp.apps.cli import app

STEPS = [5, 10, 20, 40]
ARGS = ["--checks", "heads", "--max-texts", "6", "--set", "heads.n_random=1"]


def _invoke(*args):
    return CliRunner().invoke(app, ["audit", *map(str, args)])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """RUN/checkpoint-{5,10,20,40} (trained) and RUN/checkpoint-15 (its weights file cut short)."""
    folder = tmp_path_factory.mktemp("run")
    tiny_training_run(folder, STEPS)
    bad = folder / "checkpoint-15"
    shutil.copytree(folder / "checkpoint-10", bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 3])
    (bad / "trainer_state.json").write_text(json.dumps({"global_step": 15}))
    return folder


@pytest.fixture(scope="module")
def index(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("index") / "report"
    res = _invoke(run, *ARGS, "--out", out)
    return res, out


def test_index_orders_by_step_and_shows_each_checkpoints_numbers(run, index):
    res, out = index
    assert res.exit_code == 1, res.output  # one checkpoint failed: the exit code says so
    doc = json.loads((out / "results.json").read_text())
    reports = doc["reports"]
    assert [r["step"] for r in reports] == [5, 10, 15, 20, 40]  # folder names sort 10, 15, 20, 40, 5
    bad = reports[2]
    assert bad["spec"] == str(run / "checkpoint-15") and bad["folder"] is None and not bad["ok"]
    assert bad["error"].startswith(f"cannot load model {str(run / 'checkpoint-15')!r}: ")
    assert "SafetensorError" in bad["error"] and doc["exit_code"] == 1
    assert f"{run / 'checkpoint-15'} (step 15): error: cannot load model" in res.output  # one line on the console
    for r, step in zip([reports[i] for i in (0, 1, 3, 4)], STEPS):
        own = json.loads((out / r["folder"] / "results.json").read_text())  # the others' reports are written
        assert own["provenance"]["checkpoint"]["step"] == step == r["step"]
        assert own["provenance"]["checkpoint"]["path"] == str((run / f"checkpoint-{step}").resolve())
        assert [c["metrics"] for c in own["checks"]] == [c["metrics"] for c in r["checks"]]
        assert r["provenance"]["weights_fingerprint"] == own["provenance"]["weights_fingerprint"]
    fingerprints = {r["provenance"]["weights_fingerprint"] for r in reports if r["folder"]}
    assert len(fingerprints) == 4  # training changed the weights between checkpoints
    losses = [r["checks"][0]["metrics"]["baseline_loss"] for r in reports if r["folder"]]
    assert losses[0] > losses[-1]  # the run learned: step 40's loss is below step 5's
    # per-head drift: head x step values are each report's mean ablation score, a gap for the failed one
    drift = doc["drift"]
    assert drift["score"] == "AHON (LN)" and drift["steps"] == [5, 10, 15, 20, 40] and len(drift["heads"]) == 8
    for k, r in enumerate(reports):
        if r["folder"] is None:
            assert all(v[k] is None for v in drift["values"])
            continue
        payload = json.loads((out / r["folder"] / "results.json").read_text())["checks"][0]["result"]
        flat = [v for row in payload["mean_scores"]["AHON (LN)"] for v in row]
        assert [v[k] for v in drift["values"]] == pytest.approx(flat)
        flagged = {f"L{l}H{h}" for l, h in payload["flagged"]["AHON (LN)"]}
        assert {h for h, f in zip(drift["heads"], drift["flagged"]) if f[k]} == flagged
    page = (out / "index.html").read_text()
    assert "Failed checkpoints" in page and str(run / "checkpoint-15") in page and "SafetensorError" in page
    assert 'id="fig-trends"' in page and 'id="fig-drift"' in page and "heads.baseline_loss" in page


def test_compare_two_checkpoints_and_gate_them(run, tmp_path):
    out = tmp_path / "compare"
    res = _invoke(run / "checkpoint-5", *ARGS, "--compare", run / "checkpoint-40", "--out", out,
                  "--fail-if", "heads.baseline_loss > 4.0")
    doc = json.loads((out / "results.json").read_text())
    a, b = (json.loads((out / s["folder"] / "results.json").read_text()) for s in (doc["a"], doc["b"]))
    la, lb = a["checks"][0]["metrics"]["baseline_loss"], b["checks"][0]["metrics"]["baseline_loss"]
    assert la > 4.0 > lb, (la, lb)  # the threshold separates the two checkpoints
    assert res.exit_code == 3, res.output  # the early checkpoint fails the gate, nothing errored
    assert doc["schema"] == "interp.audit.compare" and doc["exit_code"] == 3
    assert [t["failed"] for t in doc["a"]["thresholds"]] == [True] and not doc["b"]["thresholds"][0]["failed"]
    diff = doc["diff"]
    assert diff["metrics"]["heads.baseline_loss"] == {"a": la, "b": lb, "delta": pytest.approx(lb - la)}
    ha, hb = (r["checks"][0]["result"]["mean_scores"]["AHON (LN)"] for r in (a, b))
    for got, ra, rb in zip(diff["heads"]["delta"], ha, hb):
        assert got == pytest.approx([y - x for x, y in zip(ra, rb)])
    fa = {tuple(x) for x in a["checks"][0]["result"]["flagged"]["AHON (LN)"]}
    fb = {tuple(x) for x in b["checks"][0]["result"]["flagged"]["AHON (LN)"]}
    assert {tuple(x) for x in diff["heads"]["entered"]} == fb - fa and {tuple(x) for x in diff["heads"]["left"]} == fa - fb
    assert not diff["fingerprints"]["same"]
    page = (out / "index.html").read_text()
    assert 'id="fig-compare-0"' in page and 'id="fig-compare-1"' in page and "B − A" in page


def test_steps_option_and_ordering():
    assert parse_steps("30, 10,20", 3) == [30, 10, 20]
    with pytest.raises(ValueError, match="2 step"):
        parse_steps("1,2", 3)
    with pytest.raises(ValueError, match="integers"):
        parse_steps("a,b", 2)
    assert order_checkpoints(["x", "y", "z"], [30, 10, 20]) == [("y", 10), ("z", 20), ("x", 30)]
    assert order_checkpoints(["x", "y"]) == [("x", None), ("y", None)]  # unknown steps: the order given


def test_a_skip_shared_by_every_checkpoint_is_said_once():
    from interp.apps.audit.multi import common_skips, render_index

    def summary(step, steering):
        return {"spec": f"ckpt-{step}", "step": step, "folder": f"0{step}-ckpt", "error": None, "ok": True,
                "model": {}, "thresholds": [],
                "checks": [{"name": "heads", "status": "ok", "reason": None, "seconds": 1.0, "summary": {},
                            "metrics": {"baseline_loss": 3.0 - step}},
                           {"name": "steering", "seconds": 0.1, "summary": {}, "metrics": {}, **steering}]}

    why = "the model has no chat template, so the refusal data set does not apply"
    same = [summary(k, {"status": "skipped", "reason": why}) for k in (1, 2, 3)]
    assert common_skips(same, ["heads", "steering"]) == {"steering": why}
    page = render_index(same, ["heads", "steering"])
    assert page.count(why) == 1 and "Skipped on every checkpoint" in page
    mixed = same[:2] + [summary(3, {"status": "ok", "reason": None})]
    assert common_skips(mixed, ["heads", "steering"]) == {}
    assert render_index(mixed, ["heads", "steering"]).count(f"s): {why}") == 2  # said on each row that skipped


def test_trend_panels_group_what_a_check_draws_together():
    """HeadsCheck.TRENDS: Δloss of the flagged heads and of random heads share one panel (two traces); the other
    metrics get a panel each; an unmeasured metric is left out."""
    from interp.apps.audit.multi import trend_figure

    runs = [{"spec": f"c{k}", "step": 10 * k, "checks": [{"name": "heads", "metrics": {
        "baseline_loss": 3.0 - k, "delta_loss_flagged": 0.01 * k, "delta_loss_random": 0.2, "score_spread": None}}]}
        for k in range(3)]
    fig = trend_figure(runs, ["heads"])
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["heads.baseline_loss", "heads: Δloss, flagged vs random heads ablated"]
    assert [t.name for t in fig.data] == ["heads.baseline_loss", "heads.delta_loss_flagged", "heads.delta_loss_random"]
    assert list(fig.data[1].y) == [0.0, 0.01, 0.02] and list(fig.data[0].x) == [0, 10, 20]
    assert fig.data[1].xaxis == fig.data[2].xaxis != fig.data[0].xaxis  # the pair shares a panel
