"""``interp audit``: plug-in checks, the CLI, the self-contained report and its failure modes."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import interp
from interp.audit import (SCHEMA, AuditData, Check, Rendered, UnknownCheckError, available_checks, get_check,
                          parse_checks, register_check, run_audit, unregister_check)
from interp.cli import app
from interp.results import Result
from interp.testing import tiny_model

ROOT = Path(__file__).resolve().parents[1]


class _Page(HTMLParser):
    """Collects what a report page contains: section ids, plotly divs, tables, external scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.plots = 0
        self.tables = 0
        self.external: list[str] = []
        self.in_script = False
        self.script_chars = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("id", ""))
        if tag == "div" and "plotly-graph-div" in (a.get("class") or ""):
            self.plots += 1
        if tag == "table":
            self.tables += 1
        if tag in ("script", "link", "img") and (a.get("src") or a.get("href", "").startswith("http")):
            self.external.append(a.get("src") or a.get("href"))
        self.in_script = tag == "script"

    def handle_endtag(self, tag):
        if tag == "script":
            self.in_script = False

    def handle_data(self, data):
        if self.in_script:
            self.script_chars += len(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama", folder=folder, n_layers=2)
    return folder


def _invoke(*args):
    return CliRunner().invoke(app, ["audit", *map(str, args)])


# --------------------------------------------------------------------------- a toy plug-in
@dataclass
class _CountResult(Result):
    n_texts: int
    mean_chars: float

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"n_texts": self.n_texts, "mean_chars": self.mean_chars}])

    def figure(self):
        import plotly.graph_objects as go

        return go.Figure(go.Bar(x=["texts"], y=[self.n_texts]))


@dataclass
class _CountConfig:
    scale: float = 1.0
    fail: bool = False


class CountCheck(Check):
    """A third-party style check used to test the plug-in interface."""

    name = "count"
    title = "Text counter"
    Config = _CountConfig

    def run(self, model, data):
        if self.config.fail:
            raise RuntimeError("planned failure")
        return _CountResult(len(data.texts), self.config.scale * sum(map(len, data.texts)) / len(data.texts))

    def render(self, result):
        return Rendered("<p>counted</p>", [("bars", result.figure())], [("table", result.to_frame())])

    def summary(self, result):
        return {"texts": result.n_texts}


# ----------------------------------------------------------------------------------- tests
def test_heads_is_registered_through_its_entry_point():
    assert "heads" in available_checks()
    cls = get_check("heads")
    assert cls.__module__ == "interp.probes.audit_checks" and cls.name == "heads"
    assert parse_checks("heads") == ["heads"]
    with pytest.raises(UnknownCheckError, match="available checks: .*heads"):
        parse_checks("heads,nope")


def test_interp_imports_no_analyzer_package():
    for path in (ROOT / "interp").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pkg in ("probes", "steering", "editing", "dynamics", "models"):
            assert f"from {pkg}" not in text and f"import {pkg}" not in text, f"{path} imports {pkg}"
    code = "import interp.cli, interp.audit, sys; print(any(m.split('.')[0] == 'probes' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_audit_writes_a_complete_self_contained_report(model_dir, tmp_path):
    out = tmp_path / "report"
    res = _invoke(model_dir, "--checks", "heads", "--out", out, "--max-texts", 8, "--set", "heads.n_random=2")
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())  # strict JSON: no NaN tokens
    assert data["schema"] == SCHEMA and data["schema_version"] == 1
    assert data["model"]["n_layers"] == 2 and data["model"]["n_heads"] == 4 and data["model"]["n_kv_heads"] == 2
    assert data["data"]["n_texts"] == 8 and data["data"]["n_tokens"] > 8
    (check,) = data["checks"]
    assert check["name"] == "heads" and check["status"] == "ok" and check["config"]["n_random"] == 2
    payload = check["result"]
    assert len(payload["mean_scores"]) == 15 and len(payload["mean_scores"]["AHON (LN)"]) == 2
    assert {"load_model", "check:heads", "total"} <= set(data["timings"])
    assert (out / "checks" / "heads" / "result.json").is_file()
    page = _parse(out / "index.html")
    assert {"model", "overview", "check-heads", "timings"} <= set(page.sections)
    assert page.plots >= 3 and page.tables >= 3
    assert page.external == [] and page.script_chars > 1_000_000  # plotly.js is inlined, nothing is fetched
    html = (out / "index.html").read_text()
    assert "Avg Head Output Norm (LN)" in html and "Model card" in html
    assert "Attention patterns of the 3 most inactive heads" in html and "attention: layer" in html


def test_cli_errors_are_clear_and_non_zero(model_dir, tmp_path):
    res = _invoke("zoo:no-such-model", "--out", tmp_path / "r1")
    assert res.exit_code == 2 and "cannot load model 'zoo:no-such-model'" in res.output
    res = _invoke(tmp_path / "missing-folder", "--out", tmp_path / "r2")
    assert res.exit_code == 2 and "cannot load model" in res.output
    res = _invoke(model_dir, "--checks", "heads,bogus", "--out", tmp_path / "r3")
    assert res.exit_code == 2 and "unknown check 'bogus'" in res.output and "heads" in res.output
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = _invoke(model_dir, "--out", blocker / "report")
    assert res.exit_code == 2 and "not writable" in res.output
    res = _invoke(model_dir, "--out", blocker)
    assert res.exit_code == 2 and "not a folder" in res.output
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    res = _invoke(model_dir, "--out", busy)
    assert res.exit_code == 2 and "not empty" in res.output and (busy / "notes.txt").read_text() == "mine"
    res = _invoke(model_dir, "--set", "heads.nope=1", "--out", tmp_path / "r4")
    assert res.exit_code == 2 and "no option 'nope'" in res.output
    res = _invoke(model_dir, "--set", "heads.fraction=abc", "--out", tmp_path / "r5")
    assert res.exit_code == 2 and "bad value" in res.output
    assert not any((tmp_path / n).exists() for n in ("r1", "r2", "r3", "r4", "r5"))


def test_plugin_check_runs_like_a_builtin_and_failures_are_reported(model_dir, tmp_path):
    register_check(CountCheck)
    try:
        assert "count" in available_checks()
        res = _invoke(model_dir, "--checks", "count", "--out", tmp_path / "ok", "--set", "count.scale=2")
        assert res.exit_code == 0, res.output
        data = json.loads((tmp_path / "ok" / "results.json").read_text())
        assert data["checks"][0]["summary"] == {"texts": 48} and data["checks"][0]["config"]["scale"] == 2.0
        res = _invoke(model_dir, "--checks", "count", "--out", tmp_path / "bad", "--set", "count.fail=true")
        assert res.exit_code == 1
        data = json.loads((tmp_path / "bad" / "results.json").read_text())
        assert data["checks"][0]["status"] == "error" and "planned failure" in data["checks"][0]["error"]
        assert "planned failure" in (tmp_path / "bad" / "index.html").read_text()
    finally:
        unregister_check("count")


def test_third_party_entry_point_is_discovered(tmp_path, monkeypatch):
    """A separately installed package declaring ``interp.checks`` is found without touching interp."""
    site = tmp_path / "site"
    (site / "thirdparty_checks-0.1.dist-info").mkdir(parents=True)
    (site / "thirdparty_checks-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: thirdparty-checks\nVersion: 0.1\n")
    (site / "thirdparty_checks-0.1.dist-info" / "entry_points.txt").write_text(
        "[interp.checks]\ntokens = thirdparty_checks:TokenCheck\n")
    (site / "thirdparty_checks.py").write_text(textwrap.dedent("""
        from interp.audit import Check, Rendered
        from interp.results import Result
        from dataclasses import dataclass

        @dataclass
        class R(Result):
            n: int

        class TokenCheck(Check):
            name = "tokens"
            title = "Token count"
            def run(self, model, data):
                return R(sum(len(model.tokenizer(t)["input_ids"]) for t in data.texts))
            def render(self, result):
                return Rendered(f"<p>{result.n} tokens</p>")
    """))
    monkeypatch.syspath_prepend(str(site))
    assert "tokens" in available_checks()
    hf, tok = tiny_model("llama", n_layers=1)
    report = run_audit(interp.wrap(hf, tok), ["tokens"], AuditData(["abc", "de"]), out=tmp_path / "rep")
    assert report.ok and report.checks[0].payload == {"n": 5}
    assert "5 tokens" in (tmp_path / "rep" / "index.html").read_text()


def test_an_interrupted_write_never_replaces_the_old_report(tmp_path):
    hf, tok = tiny_model("llama", n_layers=1)
    model = interp.wrap(hf, tok)
    out = tmp_path / "report"
    register_check(CountCheck)
    try:
        run_audit(model, ["count"], AuditData(["one text"]), out=out)
        before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

        class Exploding(CountCheck):
            def run(self, model, data):
                res = super().run(model, data)

                def boom(path):
                    Path(path).mkdir(parents=True)
                    (Path(path) / "partial").write_text("half")
                    raise OSError("disk full")
                res.save = boom
                return res

        with pytest.raises(OSError, match="disk full"):
            run_audit(model, [Exploding()], AuditData(["another", "set"]), out=out)
        after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
        assert after == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temporary folders left behind
        report = run_audit(model, ["count"], AuditData(["a", "b", "c"]), out=out)  # an old report is replaced
        assert json.loads((out / "results.json").read_text())["data"]["n_texts"] == 3 and report.ok
    finally:
        unregister_check("count")


def test_builtin_text_set_is_diverse_and_packaged():
    data = AuditData.builtin()
    assert len(data.texts) >= 40 and len(set(data.texts)) == len(data.texts)
    with pytest.raises(ValueError, match="empty"):
        AuditData([])


def test_readme_first_command_is_the_audit():
    readme = (ROOT / "README.md").read_text()
    first = readme.split("```bash", 1)[1].split("```", 1)[0].strip()
    assert first == "bash scripts/setup.sh && .venv/bin/interp audit --out report"


def test_default_audit_skips_opt_in_checks():
    from interp.audit import parse_checks
    assert not {"gavel", "raptor"} & set(parse_checks(None)) and "gavel" not in parse_checks("default")
    assert "heads" in parse_checks(None)
    assert "gavel" in parse_checks("all") and parse_checks("gavel") == ["gavel"]
