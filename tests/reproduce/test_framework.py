"""interp reproduce's framework: claims files and verdicts, stages that resume, records, --check, report, CLI.

A small recipe defined here (registered in-process) exercises the runner; the real recipes are run by
tests/reproduce/test_recipes.py.
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field

import pytest
import torch
from typer.testing import CliRunner

from interp.configs import ConfigError, config_from_dict, config_to_dict, digest
from interp.apps.reproduce import (RECIPES, ClaimsError, Outcome, Recipe, ReproductionRecord, compare, judge,
                              load_claims, parse_claims, run_recipe)
from interp.apps.reproduce.claims import Claim, Criterion
from interp.apps.reproduce.report import write_report
from interp.stages import Stages, code_version

CLAIMS = {
    "paper": "A toy paper", "digest": "none",
    "tolerances": {"default": {"rel": 1e-6}, "noisy": {"abs": 0.1}},
    "claims": [
        {"id": "big", "claim": "x is big", "paper": "x = 10", "where": "Table 1",
         "criteria": [{"metric": "x", "op": ">=", "value": 5}], "fixed": "2026-11-01", "expect": {"full": "reproduced"}},
        {"id": "seeds", "claim": "every seed is positive", "paper": "all > 0", "where": "Figure 2",
         "criteria": [{"metric": "per_seed", "op": ">", "value": 0}], "fixed": "2026-11-01",
         "changed": {"original": "per_seed > 1", "why": "threshold set before the metric was normalised",
                     "date": "2026-11-05"}},
    ]}


# ------------------------------------------------------------------------------------------ claims
def test_claims_parse_and_verdict_rules():
    claims = parse_claims(CLAIMS, "toy.yaml")
    big, seeds = claims.claims
    assert big.criteria == (Criterion("x", ">=", 5.0),) and seeds.changed.original == "per_seed > 1"
    assert judge(big, {"x": 7}).verdict == "reproduced"
    assert judge(big, {"x": 4.9}).verdict == "not reproduced"
    # a list is one value per seed: some hold -> partly, and the spread is reported
    v = judge(seeds, {"per_seed": [1.0, -1.0, 2.0]})
    assert (v.verdict, v.passed, v.total) == ("partly", 2, 3)
    assert "n=3" in v.ours
    assert judge(seeds, {"per_seed": [-1.0, -2.0]}).verdict == "not reproduced"
    # a crash, a missing metric or a NaN is an error, never "not reproduced"
    assert judge(big, None, "RuntimeError: boom").verdict == "error"
    missing = judge(big, {"y": 1})
    assert missing.verdict == "error" and "no 'x'" in missing.error
    assert judge(big, {"x": float("nan")}).verdict == "error"
    assert judge(big, {"x": "high"}).verdict == "error"
    assert claims.tolerance("noisy").abs == 0.1 and claims.tolerance("other").rel == 1e-6


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("claims"), "missing 'claims'"),
    (lambda d: d["claims"][0].pop("fixed"), "expected a date"),
    (lambda d: d["claims"][0]["criteria"][0].update(op="=>"), "op must be one of"),
    (lambda d: d["claims"][1].update(id="big"), "unique"),
    (lambda d: d["claims"][0].update(extra=1), "unknown key"),
    (lambda d: d["claims"][0]["criteria"][0].update(value="5"), "finite number"),
    (lambda d: d["claims"][0].update(expect={"full": "fine"}), "'expect'"),
    (lambda d: d["claims"][1]["changed"].pop("why"), "changed"),
    (lambda d: d.update(tolerances={"x": {"relative": 1}}), "tolerance"),
])
def test_malformed_claims_say_where(mutate, message):
    data = json.loads(json.dumps(CLAIMS))
    mutate(data)
    with pytest.raises(ClaimsError, match=message) as exc:
        parse_claims(data, "toy.yaml")
    assert str(exc.value).startswith("toy.yaml")


def test_claims_yaml_syntax_error_names_the_line(tmp_path):
    f = tmp_path / "claims.yaml"
    f.write_text("paper: x\ndigest: y\nclaims:\n  - id: a\n    claim: [unclosed\n")
    with pytest.raises(ClaimsError, match=r"line \d+"):
        load_claims(f)


# ------------------------------------------------------------------------------------------ configs
@dataclass
class Inner:
    width: int = 4
    sizes: tuple[int, ...] = (1, 2)


@dataclass
class Outer:
    name: str = "a"
    inner: Inner = field(default_factory=Inner)
    seeds: tuple[int, ...] = (0, 1)
    lr: float | None = None


def test_typed_configs_round_trip_and_refuse_unknown_fields():
    cfg = Outer(inner=Inner(width=8, sizes=(3,)), seeds=(5,), lr=0.1)
    data = json.loads(json.dumps(config_to_dict(cfg)))
    assert data == {"name": "a", "inner": {"width": 8, "sizes": [3]}, "seeds": [5], "lr": 0.1}
    back = config_from_dict(Outer, data)
    assert back == cfg and isinstance(back.inner, Inner) and back.seeds == (5,)
    with pytest.raises(ConfigError, match=r"config\.inner: unknown field\(s\) 'widht' \(did you mean 'width'"):
        config_from_dict(Outer, {"inner": {"widht": 3}})
    assert digest(cfg) == digest(back) != digest(Outer())


# ------------------------------------------------------------------------------------------ stages
def test_stages_store_resume_and_key(tmp_path):
    calls = []

    def train():
        calls.append(1)
        return {"w": torch.arange(6.0).reshape(2, 3), "loss": [0.5, 0.25], "name": "m"}

    s = Stages("t/run", Outer(), root=tmp_path)
    out = s("train", train)
    again = Stages("t/run", Outer(), root=tmp_path)("train", train)
    assert len(calls) == 1  # read back, not recomputed
    assert torch.equal(again["w"], out["w"]) and again["loss"] == [0.5, 0.25] and again["name"] == "m"
    # another config or other code: another key, so a stale stage is never reused
    other = Stages("t/run", Outer(seeds=(9,)), root=tmp_path)
    assert other.key != s.key and not other.done("train")
    src = tmp_path / "code.py"
    src.write_text("x = 1\n")
    a = Stages("t/run", Outer(), code=[src], root=tmp_path).key
    src.write_text("x = 2\n")
    assert Stages("t/run", Outer(), code=[src], root=tmp_path).key != a
    # fresh recomputes
    Stages("t/run", Outer(), root=tmp_path, fresh=True)("train", train)
    assert len(calls) == 2


def test_an_interrupted_stage_leaves_nothing_that_reads_as_done(tmp_path):
    s = Stages("t/run", {"a": 1}, root=tmp_path)

    def crash():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s("eval", crash)
    assert not s.done("eval")

    def build(d):
        (d / "part.bin").write_bytes(b"1")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        s.path("harvest", build)
    assert not s.done("harvest") and not (s.folder / "harvest").exists()
    d = s.path("harvest", lambda d: (d / "part.bin").write_bytes(b"2"))
    assert (d / "part.bin").read_bytes() == b"2" and s.done("harvest")
    with pytest.raises(ValueError, match="stage name"):
        s("../escape", lambda: 1)


def test_code_version_hashes_a_package():
    assert code_version("interp.apps.reproduce") == code_version("interp.apps.reproduce")
    assert code_version("interp.apps.reproduce") != code_version("interp.stages")


# ------------------------------------------------------------------------------------------ runner
@dataclass
class ToyConfig:
    seeds: tuple[int, ...] = (0, 1, 2)
    scale: float = 10.0
    fail_at: int | None = None


CALLS: list = []


class ToyRecipe(Recipe):
    name = "toy-test-recipe"
    title = "A toy paper"
    method = "interp/stages.py"
    Config = ToyConfig
    presets = {"quick": ToyConfig(seeds=(0,)), "full": ToyConfig()}

    @classmethod
    def claims(cls):
        return parse_claims(CLAIMS, "toy.yaml")

    def units(self, config):
        return list(config.seeds)

    def run_unit(self, config, seed, stages):
        def compute():
            CALLS.append(seed)
            return {"value": config.scale + seed, "v": torch.tensor([seed, -1.0])}
        out = stages(f"seed-{seed}", compute)
        if config.fail_at == seed:
            raise RuntimeError(f"seed {seed} failed")
        return out

    def combine(self, config, outputs):
        import plotly.graph_objects as go

        return Outcome(measured={"x": sum(o["value"] for o in outputs) / len(outputs),
                                 "per_seed": [o["value"] - 11 for o in outputs]},
                       tables={"per seed": [{"seed": s, "value": o["value"]} for s, o in zip(config.seeds, outputs)]},
                       figures=[("values", go.Figure(go.Bar(y=[o["value"] for o in outputs])))], notes="toy")


@pytest.fixture
def toy(monkeypatch, tmp_path):
    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path / "cache"))
    RECIPES.register(ToyRecipe, replace=True)
    CALLS.clear()
    yield ToyRecipe
    RECIPES.unregister(ToyRecipe.name)


def test_run_judges_claims_and_resumes(toy, tmp_path):
    run = run_recipe(toy.name, "full")
    rec = run.record
    assert rec.error is None and rec.measured == {"x": 11.0, "per_seed": [-1.0, 0.0, 1.0]}
    assert [v["verdict"] for v in rec.verdicts] == ["reproduced", "partly"]
    assert rec.verdicts[1]["changed"]["original"] == "per_seed > 1"
    assert rec.command == "interp reproduce toy-test-recipe --preset full"
    assert CALLS == [0, 1, 2]
    # an interrupted or failed run resumes: stored stages are not recomputed
    run_recipe(toy.name, "full")
    assert CALLS == [0, 1, 2]
    # the record is a typed result that loads back, config included
    rec.save(tmp_path / "rec")
    back = ReproductionRecord.load(tmp_path / "rec")
    assert back.verdicts == rec.verdicts and back.config == {"seeds": [0, 1, 2], "scale": 10.0, "fail_at": None}
    assert config_from_dict(ToyConfig, back.config) == ToyConfig()
    assert list(back.to_frame().columns) == ["id", "paper", "where", "criterion", "ours", "verdict"]


def test_a_crash_is_error_never_not_reproduced(toy):
    run = run_recipe(toy.name, "full", config=ToyConfig(fail_at=1))
    assert run.record.error is not None and "seed 1 failed" in run.record.error
    assert {v["verdict"] for v in run.record.verdicts} == {"error"}
    assert not run.ok


def test_check_compares_with_the_committed_record(toy, tmp_path, monkeypatch):
    monkeypatch.setattr(ToyRecipe, "records_dir", classmethod(lambda cls: tmp_path / "records"))
    first = run_recipe(toy.name, "full")
    assert run_recipe(toy.name, "full", check=True).differences == [
        "no committed record for this preset (benchmarks/toy-test-recipe/records/full/)"]
    first.record.save(tmp_path / "records" / "full")
    again = run_recipe(toy.name, "full", check=True)
    assert again.differences == [] and again.ok
    # a drifted number or a flipped verdict is a difference; a tolerance absorbs what it states
    claims = ToyRecipe.claims()
    drifted = ReproductionRecord(**{**vars(again.record), "measured": {"x": 11.5, "per_seed": [-1.0, 0.0, 1.0]}})
    diffs = compare(drifted, first.record, claims)
    assert len(diffs) == 1 and diffs[0].startswith("x: 11.5 vs committed 11")
    other = run_recipe(toy.name, "full", config=ToyConfig(scale=20.0))
    assert "config differs" in compare(other.record, first.record, claims)[0]


def test_report_has_paper_criterion_ours_verdict(toy, tmp_path):
    from interp.io import OutputError

    runs = [run_recipe(toy.name, "full"), run_recipe(toy.name, "full", config=ToyConfig(fail_at=0))]
    runs[1].record.paper = "toy-failed"
    out = write_report(tmp_path / "repro", runs)
    page = (out / "index.html").read_text()
    for text in ("x = 10", "Table 1", "x &gt;= 5", "fixed 2026-11-01", "original: per_seed &gt; 1", "11",
                 "reproduced", "partly", "error", "seed 0 failed", "interp reproduce toy-test-recipe --preset full"):
        assert text in page, text
    assert "<script src=" not in page and "Plotly" in page  # self-contained: plotly.js inlined
    summary = json.loads((out / "summary.json").read_text())
    assert summary["papers"][0]["verdicts"] == {"big": "reproduced", "seeds": "partly"}
    assert ReproductionRecord.load(out / toy.name).measured["x"] == 11.0
    # the writer rule: a folder of the user's is refused
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(OutputError):
        write_report(tmp_path / "mine", runs)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_cli(toy, tmp_path):
    from interp.apps.cli import app

    r = CliRunner().invoke(app, ["reproduce", toy.name, "--preset", "full", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "2 claims" not in r.output and "1 reproduced, 1 partly" in r.output
    assert (tmp_path / "o" / "index.html").is_file()
    bad = CliRunner().invoke(app, ["reproduce", "toy-test-recipee"])
    assert bad.exit_code == 2 and "did you mean 'toy-test-recipe'" in bad.output
    assert CliRunner().invoke(app, ["reproduce", toy.name, "--preset", "huge"]).exit_code == 2
    assert CliRunner().invoke(app, ["reproduce", toy.name, "--engine", "spark"]).exit_code == 2
    listed = CliRunner().invoke(app, ["reproduce", "--list"])
    assert listed.exit_code == 0 and "spiked_regression" in listed.output


def test_cli_exit_status_on_error(toy, tmp_path, monkeypatch):
    from interp.apps.cli import app

    monkeypatch.setitem(ToyRecipe.presets, "quick", ToyConfig(seeds=(0,), fail_at=0))
    r = CliRunner().invoke(app, ["reproduce", toy.name, "--out", str(tmp_path / "o")])
    assert r.exit_code == 1 and "ERROR" in r.output


def test_recipe_validation():
    class NoFull(Recipe):
        name = "nofull"
        Config = ToyConfig
        presets = {"quick": ToyConfig()}

    with pytest.raises(ValueError, match="lacks the preset"):
        RECIPES.register(NoFull)

    class WrongType(Recipe):
        name = "wrongtype"
        Config = ToyConfig
        presets = {"quick": ToyConfig(), "full": Outer()}

    with pytest.raises(TypeError, match="preset 'full' is a Outer"):
        RECIPES.register(WrongType)


def test_claim_helpers():
    c = Claim(id="a", claim="c", paper="p", where="w", criteria=(Criterion("m", "<", 1.0), Criterion("n", ">=", 2)),
              fixed="2026-01-01")
    assert c.criterion_text() == "m < 1 and n >= 2"
    assert textwrap.dedent(c.criterion_text()) == c.criterion_text()


def test_doc_markers_are_rendered_from_records(toy, tmp_path, monkeypatch):
    from interp.apps.reproduce.docs import RecordMissing, render

    monkeypatch.setattr(ToyRecipe, "records_dir", classmethod(lambda cls: tmp_path / "records"))
    text = ("intro\n<!-- record: toy-test-recipe/full -->\nstale\n<!-- /record -->\n"
            "<!-- record-table: toy-test-recipe/full: per seed -->\nstale\n<!-- /record-table -->\nend\n")
    with pytest.raises(RecordMissing, match="no committed record toy-test-recipe/full"):
        render(text)
    run_recipe(toy.name, "full").record.save(tmp_path / "records" / "full")
    out = render(text)
    assert "stale" not in out and out.startswith("intro\n<!-- record: toy-test-recipe/full -->\n| claim |")
    assert "| x is big | x = 10 (Table 1) | x >= 5 (fixed 2026-11-01) | x = 11 | **reproduced** |" in out
    assert "| seed | value |" in out and "| 2 | 12 |" in out and out.endswith("<!-- /record-table -->\nend\n")
    assert render(out) == out  # idempotent


def test_check_ignores_wall_clock_metrics(toy, tmp_path):
    data = json.loads(json.dumps(CLAIMS))
    data["tolerances"]["per_seed"] = {"ignore": True}
    claims = parse_claims(data, "toy.yaml")
    first = run_recipe(toy.name, "full").record
    slower = ReproductionRecord(**{**vars(first), "measured": {"x": 11.0, "per_seed": [5.0, 5.0, 5.0]},
                                   "verdicts": [dict(v, verdict="reproduced") for v in first.verdicts]})
    assert compare(slower, first, claims) == []  # the timing metric and the claim that reads only it
    with pytest.raises(ClaimsError, match="ignore"):
        parse_claims({**data, "tolerances": {"x": {"ignore": "yes"}}}, "toy.yaml")


def test_claims_yaml_key_given_twice_is_an_error(tmp_path):
    f = tmp_path / "claims.yaml"
    f.write_text("paper: x\ndigest: y\ntolerances:\n  a: {rel: 1}\n  a: {abs: 2}\nclaims: []\n")
    with pytest.raises(ClaimsError, match=r"line 5.*given twice|given twice.*line 5|line 5"):
        load_claims(f)


def test_a_resumed_run_reports_the_stored_stages_compute_time(toy):
    """A run that reads stages back from an earlier (interrupted) run records their compute time beside its own
    wall time, so its cost is not understated; a fresh run resumes nothing."""
    import time as _time

    class SlowToy(ToyRecipe):
        name = "toy-slow-recipe"

        def run_unit(self, config, seed, stages):
            return stages(f"seed-{seed}", lambda: (_time.sleep(0.2), {"value": config.scale + seed})[1])

    RECIPES.register(SlowToy, replace=True)
    try:
        first = run_recipe(SlowToy.name, "full").record
        assert first.resumed_seconds == 0.0 and "resumed" not in first.duration()
        again = run_recipe(SlowToy.name, "full").record
        assert again.resumed_seconds >= 0.6 - 0.05 and "of stages resumed" in again.duration()
        assert again.seconds < first.seconds
        assert run_recipe(SlowToy.name, "full", fresh=True).record.resumed_seconds == 0.0
    finally:
        RECIPES.unregister(SlowToy.name)


# ------------------------------------------------------------------------------------------ robustness (#42 item 5)
class OddValuesRecipe(ToyRecipe):
    """Measures a tensor, a numpy array and an infinity (converted), or an object (an error)."""

    name = "toy-odd-values"

    def combine(self, config, outputs):
        import numpy as np

        if config.fail_at == 99:
            return Outcome(measured={"x": object(), "per_seed": [1.0]})
        return Outcome(measured={"x": torch.tensor(float("inf")), "per_seed": np.array([1.0, 2.0], dtype=np.float32)},
                       tables={"t": [{"v": torch.tensor(3), "w": np.float64("-inf")}]})


@pytest.fixture
def odd(toy):
    RECIPES.register(OddValuesRecipe, replace=True)
    yield OddValuesRecipe
    RECIPES.unregister(OddValuesRecipe.name)


def test_tensor_numpy_and_inf_measurements_are_converted(odd, tmp_path):
    rec = run_recipe(odd.name, "full").record
    assert rec.error is None and rec.measured == {"x": "inf", "per_seed": [1.0, 2.0]}
    assert rec.tables == {"t": [{"v": 3, "w": "-inf"}]}
    assert [v["verdict"] for v in rec.verdicts] == ["reproduced", "reproduced"]  # inf >= 5 is judged
    rec.save(tmp_path / "rec")

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    json.loads((tmp_path / "rec" / "result.json").read_text(), parse_constant=no_constants)
    assert ReproductionRecord.load(tmp_path / "rec").measured["x"] == "inf"
    bad = run_recipe(odd.name, "full", config=ToyConfig(fail_at=99)).record
    assert "measured.x: a object is not a measurement" in bad.error
    assert {v["verdict"] for v in bad.verdicts} == {"error"}


def test_each_paper_of_a_run_is_isolated(toy, tmp_path, monkeypatch):
    from interp.apps.cli import app
    from interp.apps.reproduce import reproduce

    class BrokenClaims(ToyRecipe):
        name = "toy-broken-claims"

        @classmethod
        def claims(cls):
            return parse_claims({**CLAIMS, "claims": "not a list"}, "broken.yaml")

    RECIPES.register(BrokenClaims, replace=True)
    try:
        runs = reproduce([BrokenClaims.name, toy.name], "full", out=tmp_path / "o")
        assert [r.record.paper for r in runs] == [BrokenClaims.name, toy.name]
        assert runs[0].input_error.startswith("broken.yaml") and runs[0].record.verdicts == []
        assert runs[1].record.error is None and runs[1].record.summary() == "1 reproduced, 1 partly"
        assert (tmp_path / "o" / "index.html").is_file()
        r = CliRunner().invoke(app, ["reproduce", BrokenClaims.name, toy.name, "--preset", "full", "--out",
                                     str(tmp_path / "o2")])
        assert r.exit_code == 2 and "1 reproduced, 1 partly" in r.output
        errors = [line for line in r.output.splitlines() if line.startswith("error:")]
        assert errors == ["error: broken.yaml: 'claims' must be a list, got str ('not a list')"]
        assert "Traceback" not in r.output
    finally:
        RECIPES.unregister(BrokenClaims.name)


def test_list_survives_a_malformed_record(toy, tmp_path, monkeypatch):
    from interp.apps.cli import app

    monkeypatch.setattr(ToyRecipe, "records_dir", classmethod(lambda cls: tmp_path / "records"))
    (tmp_path / "records" / "full").mkdir(parents=True)
    (tmp_path / "records" / "full" / "result.json").write_text("{ not json")
    r = CliRunner().invoke(app, ["reproduce", "--list"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith(toy.name))
    assert "full: record unreadable" in line
    assert "spiked_regression" in r.output and "sdm" in r.output  # the papers after it are listed
    # --check against it: one error line, exit 2
    c = CliRunner().invoke(app, ["reproduce", toy.name, "--preset", "full", "--check", "--out", str(tmp_path / "o")])
    assert c.exit_code == 2 and any(x.startswith("error: toy-test-recipe: the committed full record cannot be read")
                                    for x in c.output.splitlines())


@pytest.mark.parametrize("text, message", [
    ("paper: x\ndigest: y\nclaims:\n  - id: a\n    claim: c\n    paper: p\n    where: w\n    fixed: 2026-01-01\n"
     "    criteria:\n      - {metric: m, op: ['>='], value: 1}\n", r"claims.yaml:10: claim 'a': criteria\[0\]: op must be"),
    ("paper: x\ndigest: y\nclaims:\n  - id: \"a\\n\"\n    claim: c\n    paper: p\n    where: w\n    fixed: 2026-01-01\n"
     "    criteria: [{metric: m, op: '>=', value: 1}]\n", r"claims.yaml:4: claim 'a\\n': an id is"),
    ("paper: x\ndigest: y\ntolerances:\n  m: {abs: -0.1}\nclaims:\n  - id: a\n    claim: c\n    paper: p\n"
     "    where: w\n    fixed: 2026-01-01\n    criteria: [{metric: m, op: '>=', value: 1}]\n",
     r"claims.yaml:4: tolerances.m: a tolerance is not negative"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", r"claims.yaml: nested too deeply"),
])
def test_malformed_claims_files_are_one_line_with_the_place(tmp_path, text, message):
    f = tmp_path / "claims.yaml"
    f.write_text(text)
    with pytest.raises(ClaimsError, match=message) as exc:
        load_claims(f)
    assert str(exc.value).startswith(str(f)) and "\n" not in str(exc.value).strip()


def test_posthoc_criteria_are_a_field_shown_beside_the_claim(toy, tmp_path):
    from interp.apps.reproduce.docs import claims_markdown

    data = json.loads(json.dumps(CLAIMS))
    data["claims"][0]["posthoc"] = {"seen": "the quick run's x (7)", "date": "2026-11-02"}
    claims = parse_claims(data, "toy.yaml")
    assert claims.claims[0].posthoc.seen == "the quick run's x (7)"
    with pytest.raises(ClaimsError, match="posthoc"):
        parse_claims({**data, "claims": [dict(data["claims"][0], posthoc={"seen": "x"})]}, "toy.yaml")
    from interp.apps.reproduce.record import verdict_rows

    run = run_recipe(toy.name, "full")
    run.record.verdicts = verdict_rows(claims, run.record.measured, None)
    out = write_report(tmp_path / "r", [run])
    page = (out / "index.html").read_text()
    assert "set after results were seen (2026-11-02): the quick run&#x27;s x (7)" in page
    assert "set after results were seen, 2026-11-02: the quick run's x (7)" in claims_markdown(run.record)


def test_records_store_provenance_and_refuse_a_dirty_update(toy, tmp_path, monkeypatch):
    from interp.apps.reproduce import update_record

    run = run_recipe(toy.name, "full", threads=2)
    p = run.record.provenance
    assert p["threads"] == 2 and p["cpu"] and p["packages"]["numpy"] and "env" in p
    assert {"commit", "dirty", "blas", "torch_threads", "torch_cpu_capability", "cpu_simd"} <= set(p)
    assert p["torch_threads"] == 2
    assert run.record.command.endswith("--threads 2")
    monkeypatch.setattr(ToyRecipe, "records_dir", classmethod(lambda cls: tmp_path / "records"))
    run.record.provenance = dict(p, dirty=True, dirty_files=["interp/model.py"])
    with pytest.raises(ValueError, match=r"uncommitted changes \(interp/model.py\)"):
        update_record(run)
    assert not (tmp_path / "records").exists()
    run.record.provenance = dict(p, dirty=False)
    assert (update_record(run) / "result.json").is_file()


def test_a_killed_report_write_leaves_nothing_behind(toy, tmp_path):
    run = run_recipe(toy.name, "full")
    left = tmp_path / ".o.interp-new-1a2b3c4d"  # a first write killed before its rename
    left.mkdir()
    (left / "index.html").write_text("half")
    write_report(tmp_path / "o", [run])
    inside = tmp_path / "o" / ".interp-new-99aa88bb"  # a later write killed mid-way
    inside.mkdir()
    write_report(tmp_path / "o", [run])
    assert not left.exists() and not inside.exists() and (tmp_path / "o" / "index.html").is_file()


def test_spread_of_reruns_is_measured_and_written_as_standard_json(toy, tmp_path):
    from interp.apps.reproduce.spread import measure_spread, write_spread

    ref = run_recipe(toy.name, "full").record
    same = run_recipe(toy.name, "full", threads=2).record
    drift = ReproductionRecord(**{**vars(same), "measured": {"x": 11.5, "per_seed": [-1.0, 0.25, "inf"]}})
    spread = measure_spread(ref, [same, drift])
    assert spread["metrics"]["x"]["abs"] == 0.5 and spread["metrics"]["x"]["rel"] == pytest.approx(0.5 / 11)
    assert spread["metrics"]["per_seed"]["abs"] == "inf" and spread["reruns"][0]["provenance"]["threads"] == 2
    assert measure_spread(ref, [same])["metrics"]["x"]["abs"] == 0.0
    path = write_spread(tmp_path, spread)
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    other = run_recipe(toy.name, "full", config=ToyConfig(scale=3.0)).record
    with pytest.raises(ValueError, match="not a rerun"):
        measure_spread(ref, [other])
    from interp.apps.reproduce.spread import needed_tolerances

    # x drifted 0.5 (default rel 1e-6 does not cover it): twice the spread; per_seed drifted to inf: not finite
    assert needed_tolerances(measure_spread(ref, [same, drift]), ToyRecipe.claims()) == {"x": 1.0}
    assert needed_tolerances(measure_spread(ref, [same]), ToyRecipe.claims()) == {}


def test_wall_clock_claims_are_not_counted_in_the_verdicts(toy):
    from interp.apps.reproduce.record import verdict_rows

    data = json.loads(json.dumps(CLAIMS))
    data["tolerances"]["per_seed"] = {"ignore": True}  # per_seed stands for a wall-clock time here
    claims = parse_claims(data, "toy.yaml")
    rec = run_recipe(toy.name, "full").record
    rec.verdicts = verdict_rows(claims, rec.measured, None)
    assert [v["timing"] for v in rec.verdicts] == [False, True]
    assert rec.counts() == {"reproduced": 1} and rec.summary() == "1 reproduced; 1 wall-clock claim not counted"
    assert rec.verdicts[1]["verdict"] == "partly"  # still judged and shown
