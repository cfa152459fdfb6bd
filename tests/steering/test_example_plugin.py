"""The example plug-in package ``examples/steering_plugin`` evaluated by ``interp audit --checks steering``.

The package is pip-installed (offline, no dependencies, no build isolation) into a target folder inside the
test's temporary directory, which the CLI subprocess gets on ``PYTHONPATH``: its entry point ``normed_addition``
in the group ``interp.steering`` is found like any installed plug-in, and the shared environment is never changed.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from interp.apps.cli import app
from interp.testing import tiny_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "steering_plugin"
INTERP = Path(sys.executable).with_name("interp")


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    base = tmp_path_factory.mktemp("example-plugin")
    src, site = base / "src", base / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--quiet", "--target", str(site), str(src)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return site


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama", folder=folder, n_layers=2)
    return folder


def _audit(site: Path, *args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "INTERP_PROGRESS": "0"}
    return subprocess.run([str(INTERP), "audit", *map(str, args)], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)


def test_example_plugin_is_evaluated_by_the_audit(plugin_site, model_dir, tmp_path):
    out = tmp_path / "report"
    run = _audit(plugin_site, model_dir, "--checks", "steering", "--set", "steering.method=normed_addition",
                 "--set", "steering.scale=2", "--set", "steering.layer=1", "--set", "steering.behaviour=uppercase",
                 "--set", "steering.max_new_tokens=4", "--set", "steering.neutral_texts=4", "--out", out, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    rec = json.loads((out / "results.json").read_text())["checks"][0]
    assert rec["status"] == "ok" and rec["title"] == "Steering: method normed_addition on uppercase"
    res = rec["result"]
    # --set steering.scale reached the plug-in's own config field (a float), layer the shared one
    assert res["method"] == "normed_addition" and res["method_options"] == {"layer": 1, "batch_size": 16, "scale": 2.0}
    assert res["layer"] == 1 and res["behaviour"] == "uppercase"
    ev = res["evaluation"]
    assert ev["probe_hook"] == "blocks.1.hook_resid_post" and ev["n_neutral_texts"] == 4 and ev["kl_neutral"] > 0
    assert ev["n_prompts"] == 12 and len(ev["examples"]) == 3
    for cond in ("none", "steered"):
        c = ev["conditions"][cond]
        assert 0 <= c["behaviour_rate"] <= 1 and 0 <= c["probe_score"] <= 1 and c["continuation_ppl"] >= 1
    # the plug-in adds 2 mean residual norms along mean(h+) - mean(h-): the probe reads it
    assert ev["conditions"]["steered"]["probe_score"] > ev["conditions"]["none"]["probe_score"]
    assert set(rec["summary"]) >= {"behaviour_rate none", "behaviour_rate steered", "probe_score none",
                                   "probe_score steered", "kl_neutral", "continuation_ppl steered"}
    page = (out / "index.html").read_text()
    assert "Steering: method normed_addition on uppercase" in page and "Behaviour before / after steering" in page
    assert "plotly-graph-div" in page and "scale=2.0" in page


def test_plugin_option_errors_come_before_the_model_loads(plugin_site, tmp_path):
    missing = tmp_path / "no-such-model"  # loading it would fail: the option error must come first
    run = _audit(plugin_site, missing, "--checks", "steering", "--set", "steering.method=normed_addition",
                 "--set", "steering.nope=1", "--out", tmp_path / "r1", cwd=tmp_path)
    assert run.returncode == 2 and "no option 'nope'" in run.stderr and "scale" in run.stderr
    assert "loading" not in run.stderr and "cannot load model" not in run.stderr
    run = _audit(plugin_site, missing, "--checks", "steering", "--set", "steering.method=normed_addition",
                 "--set", "steering.scale=big", "--out", tmp_path / "r2", cwd=tmp_path)
    assert run.returncode == 2 and "bad value 'big' for steering.scale" in run.stderr and "loading" not in run.stderr
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_unknown_method_fails_before_the_model_loads(tmp_path):
    res = CliRunner().invoke(app, ["audit", str(tmp_path / "no-such-model"), "--checks", "steering", "--set",
                                   "steering.method=no_such_method", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "steering.method" in res.output and "no_such_method" in res.output
    assert "cannot load model" not in res.output and not (tmp_path / "r").exists()


RECORD = ROOT / "docs" / "results" / "steering_normed_addition_sentiment.json"


@pytest.mark.slow
def test_example_plugin_on_smollm2_reproduces_the_record(plugin_site, tmp_path):
    """The documented run (docs/steering.md, Audit): steering SmolLM2-135M-Instruct towards negative sentiment moves
    the behaviour rate and the probe, and the numbers equal the committed record (~2 min on one thread)."""
    out = tmp_path / "report"
    run = _audit(plugin_site, "zoo:smollm2-135m", "--checks", "steering", "--set", "steering.method=normed_addition",
                 "--set", "steering.scale=-0.25", "--set", "steering.layer=10", "--set", "steering.behaviour=sentiment",
                 "--out", out, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    ev = json.loads((out / "results.json").read_text())["checks"][0]["result"]["evaluation"]
    none, steered = ev["conditions"]["none"], ev["conditions"]["steered"]
    assert none["behaviour_rate"] - steered["behaviour_rate"] >= 0.5 and ev["probe_test_accuracy"] >= 0.8
    assert steered["probe_score"] < 0.5 * none["probe_score"] and steered["continuation_ppl"] < 3 * none["continuation_ppl"]
    want = json.loads(RECORD.read_text())["checks"][0]["result"]["evaluation"]
    assert ev["kl_neutral"] == pytest.approx(want["kl_neutral"], rel=0.05)
    for cond in ("none", "steered"):
        for key in ("behaviour_rate", "behaviour_score", "continuation_ppl"):
            assert ev["conditions"][cond][key] == pytest.approx(want["conditions"][cond][key], rel=0.05, abs=0.02)
