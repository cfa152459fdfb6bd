"""``interp audit``: plug-in checks, the CLI, the self-contained report and its failure modes."""
from __future__ import annotations

import json
import re
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
from interp.apps.audit import (SCHEMA, AuditData, Check, Rendered, UnknownCheckError, available_checks, get_check,
                          parse_checks, register_check, run_audit, unregister_check)
from interp.apps.cli import app
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
    assert cls.__module__ == "interp.probes.heads.audit_check" and cls.name == "heads"
    assert parse_checks("heads") == ["heads"]
    with pytest.raises(UnknownCheckError, match="available checks: .*heads"):
        parse_checks("heads,nope")


def test_interp_imports_no_analyzer_package():
    for path in (ROOT / "interp").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pkg in ("probes", "steering", "editing", "dynamics", "models"):
            assert f"from {pkg}" not in text and f"import {pkg}" not in text, f"{path} imports {pkg}"
    code = "import interp.apps.cli, interp.apps.audit, sys; print(any(m.split('.')[0] == 'probes' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_audit_writes_a_complete_self_contained_report(model_dir, tmp_path):
    out = tmp_path / "report"
    res = _invoke(model_dir, "--checks", "heads", "--out", out, "--max-texts", 8, "--set", "heads.n_random=2")
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())  # strict JSON: no NaN tokens
    assert data["schema"] == SCHEMA and data["schema_version"] == 2
    assert data["model"]["n_layers"] == 2 and data["model"]["n_heads"] == 4 and data["model"]["n_kv_heads"] == 2
    assert data["data"]["n_texts"] == 8 and data["data"]["n_tokens"] > 8
    (check,) = data["checks"]
    assert check["name"] == "heads" and check["status"] == "ok" and check["config"]["n_random"] == 2
    payload = check["result"]
    assert len(payload["mean_scores"]) == 15 and len(payload["mean_scores"]["AHON (LN)"]) == 2
    assert {"load_model", "check:heads", "total"} <= set(data["timings"])
    # headline metrics: every declared name, the numbers consistent with the payload
    m = check["metrics"]
    assert set(m) == set(get_check("heads").METRICS) and m["n_heads"] == 8
    assert m["n_flagged"] == len(payload["flagged"]["AHON (LN)"]) and m["flagged_fraction"] == m["n_flagged"] / 8
    assert m["baseline_loss"] > 0 and m["perplexity"] == pytest.approx(__import__("math").exp(m["baseline_loss"]))
    # provenance: the weights, the checkpoint, the data set and the software that produced the report
    prov = data["provenance"]
    model = interp.load(str(model_dir))
    from interp.store import weights_fingerprint
    assert prov["weights_fingerprint"] == weights_fingerprint(model) and len(prov["weights_fingerprint"]) == 64
    import hashlib
    assert prov["checkpoint"]["path"] == str(model_dir.resolve()) and prov["checkpoint"]["step"] is None
    assert prov["checkpoint"]["config_hash"] == hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()
    assert prov["data_hash"] == AuditData.builtin().head(8).digest() == data["data"]["hash"]
    assert prov["interp_version"] == interp.__version__
    own = getattr(model, "self_check", None)  # the load self-check, where interp.load attaches one
    if own is None:
        assert prov["self_check"] is None
    else:
        assert prov["self_check"]["passed"] == own.passed and set(prov["self_check"]) == set(own.to_dict())
    assert prov["git_commit"] is None or (len(prov["git_commit"]) == 40 and isinstance(prov["git_dirty"], bool))
    assert data["gate"] == {"passed": True, "errored": False, "exit_code": 0} and data["thresholds"] == []
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
        assert data["checks"][0]["reason"] == "RuntimeError: planned failure"  # one line; the traceback in "error"
        assert "  count: error (" in res.output and "): RuntimeError: planned failure" in res.output
    finally:
        unregister_check("count")


def test_set_options_are_parsed_once_into_the_config_the_check_runs_with(model_dir, tmp_path, monkeypatch):
    """``interp audit --set`` parses and validates each check's options once, before the model loads; the config
    built then is the one the check runs with (not rebuilt from the strings by the runner)."""
    import interp.apps.audit.runner as audit_runner
    import interp.checks
    from interp.checks import configure as real_configure

    built: list = []

    def counting(cls, overrides):
        cfg = real_configure(cls, overrides)
        built.append(cfg)
        return cfg

    ran_with: list = []

    class SeenCheck(CountCheck):
        name = "seen"

        def run(self, model, data):
            ran_with.append(self.config)
            return super().run(model, data)

    monkeypatch.setattr(interp.checks, "configure", counting)  # the CLI's (imported where it parses --set)
    monkeypatch.setattr(audit_runner, "configure", counting)
    register_check(SeenCheck)
    try:
        res = _invoke(model_dir, "--checks", "seen", "--out", tmp_path / "ok", "--set", "seen.scale=3")
        assert res.exit_code == 0, res.output
    finally:
        unregister_check("seen")
    assert len(built) == 1 and built[0].scale == 3.0
    assert len(ran_with) == 1 and ran_with[0] is built[0]


def test_third_party_entry_point_is_discovered(tmp_path, monkeypatch):
    """A separately installed package declaring ``interp.checks`` is found without touching interp."""
    site = tmp_path / "site"
    (site / "thirdparty_checks-0.1.dist-info").mkdir(parents=True)
    (site / "thirdparty_checks-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: thirdparty-checks\nVersion: 0.1\n")
    (site / "thirdparty_checks-0.1.dist-info" / "entry_points.txt").write_text(
        "[interp.checks]\ntokens = thirdparty_checks:TokenCheck\n")
    (site / "thirdparty_checks.py").write_text(textwrap.dedent("""
        from interp.apps.audit import Check, Rendered
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
    from interp.apps.audit import parse_checks
    assert not {"gavel", "raptor"} & set(parse_checks(None)) and "gavel" not in parse_checks("default")
    assert "heads" in parse_checks(None)
    assert "gavel" in parse_checks("all") and parse_checks("gavel") == ["gavel"]


# ------------------------------------------------------------------ statuses, gating, input checks (issue 41)
def test_checks_all_runs_what_applies_and_skips_the_rest(model_dir, tmp_path):
    """On a text model without a chat template: heads and steering run (steering on the built-in behaviour),
    gavel (no rule file) and raptor (not a vision model) are `skipped`, never `ok`, and the exit code is 0."""
    out = tmp_path / "all"
    res = _invoke(model_dir, "--checks", "all", "--out", out, "--max-texts", 4, "--set", "heads.n_random=1",
                  "--set", "steering.max_new_tokens=2", "--set", "steering.neutral_texts=2")
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    by = {c["name"]: c for c in data["checks"]}
    assert by["heads"]["status"] == "ok" and by["steering"]["status"] == "ok"
    assert by["gavel"]["status"] == "skipped" and "rule file" in by["gavel"]["reason"]
    assert by["raptor"]["status"] == "skipped" and "vision" in by["raptor"]["reason"]
    assert by["gavel"]["metrics"] == dict.fromkeys(get_check("gavel").METRICS)
    assert "  gavel: skipped (" in res.output and "): needs a rule file: --set gavel.rules=FILE" in res.output
    page = (out / "index.html").read_text()
    assert 'class="status-skipped">skipped</span>' in page and "Skipped: needs a rule file" in page
    assert re.search(r"\d ok, 2 skipped<", page)  # the header counts them apart
    # the steering section evaluates a behaviour the model has, and says which and why
    steer = by["steering"]
    assert steer["result"]["behaviour"] == "sentiment" and steer["result"]["method"] == "diff_in_means"
    assert "no chat template" in steer["result"]["note"] and "exhibits" in steer["result"]["note"]
    assert steer["metrics"]["effect"] == pytest.approx(steer["metrics"]["rate_steered"] - steer["metrics"]["rate_none"])
    assert steer["result"]["method_options"]["scale"] == -1.0  # steered against the behaviour


def test_a_check_that_does_not_apply_is_skipped_not_ok(tmp_path):
    hf, tok = tiny_model("llama", n_layers=1)
    report = run_audit(interp.wrap(hf, None), ["heads"], AuditData(["a b", "c d"]), out=tmp_path / "r")
    (rec,) = report.checks
    assert rec.status == "skipped" and "--tokenizer" in rec.reason and report.ok and report.exit_code == 0
    data = json.loads((tmp_path / "r" / "results.json").read_text())
    assert data["checks"][0]["status"] == "skipped" and data["checks"][0]["metrics"]["n_heads"] is None


def test_naming_a_check_that_cannot_run_is_bad_input_before_loading(tmp_path):
    res = _invoke("zoo:does-not-matter", "--checks", "gavel", "--out", tmp_path / "r")
    assert res.exit_code == 2 and "check 'gavel': needs a rule file" in res.output and "loading" not in res.output


@pytest.mark.parametrize("expr,match", [
    ("heads.flaged_fraction > 0.2", r"unknown metric heads.flaged_fraction; did you mean heads.flagged_fraction"),
    ("heads.flagged_fraction >> 0.2", "expects 'CHECK.METRIC OP NUMBER'"),
    ("heads.flagged_fraction > lots", "'lots' is not a number"),
    ("steering.effect < 0", "check 'steering' is not selected"),
])
def test_fail_if_is_validated_before_the_model_loads(expr, match, tmp_path):
    res = _invoke("zoo:does-not-matter", "--checks", "heads", "--fail-if", expr, "--out", tmp_path / "r")
    assert res.exit_code == 2, res.output
    assert re.search(match, res.output) and "loading" not in res.output and not (tmp_path / "r").exists()


def test_fail_if_gates_the_exit_code(model_dir, tmp_path):
    args = ["--checks", "heads", "--max-texts", 4, "--set", "heads.n_random=1"]
    res = _invoke(model_dir, *args, "--out", tmp_path / "fail", "--fail-if", "heads.n_heads >= 8",
                  "--fail-if", "heads.perplexity > 1e9")
    assert res.exit_code == 3, res.output
    data = json.loads((tmp_path / "fail" / "results.json").read_text())
    first, second = data["thresholds"]
    assert first["failed"] and first["actual"] == 8 and first["reason"] == "heads.n_heads = 8 >= 8"
    assert not second["failed"] and data["gate"] == {"passed": False, "errored": False, "exit_code": 3}
    assert "fail-if heads.n_heads >= 8: FAILED" in res.output
    assert "1 of 2 thresholds failed" in (tmp_path / "fail" / "index.html").read_text()
    res = _invoke(model_dir, *args, "--out", tmp_path / "pass", "--fail-if", "heads.flagged_fraction > 0.99")
    assert res.exit_code == 0, res.output


def test_thresholds_parse_and_a_missing_metric_fails():
    from interp.apps.audit.gate import exit_code, parse_threshold

    metrics = {"heads": {"flagged_fraction": "", "n_flagged": ""}, "steering": {"effect": ""}}
    t = parse_threshold(" steering.effect>=-0.5 ", metrics)
    assert (t.check, t.metric, t.op, t.value) == ("steering", "effect", ">=", -0.5)
    assert t.evaluate({"steering": {"effect": -0.4}})["failed"]
    assert not t.evaluate({"steering": {"effect": -0.6}})["failed"]
    miss = t.evaluate({"steering": {"effect": None}}, {"steering": "skipped"})
    assert miss["failed"] and miss["reason"] == "steering.effect not measured (check steering skipped)"
    with pytest.raises(ValueError, match="did you mean heads.n_flagged"):
        parse_threshold("heads.nflagged > 1", metrics)
    assert (exit_code(False, False), exit_code(True, True), exit_code(False, True)) == (0, 1, 3)


def test_device_is_checked_before_the_model_loads(tmp_path):
    res = _invoke("zoo:does-not-matter", "--device", "nonsense", "--out", tmp_path / "r")
    assert res.exit_code == 2 and "--device 'nonsense'" in res.output and "loading" not in res.output
    if not torch.cuda.is_available():
        res = _invoke("zoo:does-not-matter", "--device", "cuda", "--out", tmp_path / "r")
        assert res.exit_code == 2 and "no CUDA device" in res.output


def test_a_load_error_names_the_model_once(tmp_path):
    adapter = tmp_path / "lora-adapter"  # a LoRA adapter folder: adapter files, no config.json
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    res = _invoke(adapter, "--out", tmp_path / "r")
    assert res.exit_code == 2 and res.output.count("cannot load model") == 1, res.output
    assert f"error: cannot load model {str(adapter)!r}: " in res.output


def test_tokenizer_option_for_a_checkpoint_saved_without_one(model_dir, tmp_path):
    bare = tmp_path / "bare"  # the weights and config only, as a trainer's checkpoint may be saved
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((model_dir / name).read_bytes())
    args = ["--checks", "heads", "--max-texts", 4, "--set", "heads.n_random=1"]
    res = _invoke(bare, *args, "--out", tmp_path / "without")
    assert res.exit_code == 0 and "heads: skipped" in res.output and "--tokenizer" in res.output, res.output
    res = _invoke(bare, *args, "--tokenizer", model_dir, "--out", tmp_path / "with")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "with" / "results.json").read_text())["checks"][0]["status"] == "ok"
    res = _invoke(bare, *args, "--tokenizer", tmp_path / "nowhere", "--out", tmp_path / "bad")
    assert res.exit_code == 2 and "--tokenizer" in res.output and "no such folder" in res.output


def test_provenance_records_the_load_self_check(tmp_path):
    """A model carrying the load self-check (``model.self_check``: ``.passed`` and ``.to_dict()``) has its outcome in
    results.json; the weights fingerprint changes with the weights."""
    from interp.apps.audit.provenance import provenance

    class _SelfCheck:
        passed = False

        def to_dict(self):
            return {"passed": False, "checks": [{"name": "logits", "max_abs_diff": 0.5}]}

    hf, tok = tiny_model("llama", n_layers=1)
    model = interp.wrap(hf, tok)
    before = provenance(model, None, "abc")
    assert before["data_hash"] == "abc" and before["checkpoint"]["path"] is None
    assert before["self_check"] == (model.self_check.to_dict() if getattr(model, "self_check", None) else None)
    model.self_check = _SelfCheck()
    register_check(CountCheck)
    try:
        report = run_audit(model, ["count"], AuditData(["one"]), out=tmp_path / "r")
    finally:
        unregister_check("count")
    data = json.loads((tmp_path / "r" / "results.json").read_text())
    assert data["provenance"]["self_check"] == _SelfCheck().to_dict() == report.provenance["self_check"]
    assert "FAILED" in (tmp_path / "r" / "index.html").read_text()  # the model card's load self-check row
    with torch.no_grad():
        next(hf.parameters()).add_(1.0)
    assert provenance(model, None, None)["weights_fingerprint"] != before["weights_fingerprint"]
