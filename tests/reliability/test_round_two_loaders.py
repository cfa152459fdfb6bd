"""Issue #32, data safety of what is read back: GAVEL rule files, saved steering vectors, module loaders,
deep JSON, and the ``interp demo`` command.

* A string where a list of CE names (or hook names) is required is an error naming the field, never a list
  of characters; integers are not CE names.
* The GAVEL parser and rule files raise only :class:`RuleSyntaxError` on malformed input (fuzzed), also for
  an error after a trailing newline and for deep nesting.
* Loaders of saved modules check the declared configuration against the weights before allocating.
* Damaged JSON (200k-deep, truncated) is a :class:`SerializationError` naming the file.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from interp.apps.cli import app
from interp.io import MANIFEST, OutputError, SerializationError
from interp.probes.gavel.rules import RuleSyntaxError, load_rules, parse_rule, rule_from_json

BACKENDS = ("torch", "nnsight", "transformer_lens")


# ====================================================== item 9: a string is not a list of CE names
STRING_FIELDS = [
    ({"name": "r", "any_of": "harm_intent"}, "any_of"),
    ({"name": "r", "all_required": "harm_intent"}, "all_required"),
    ({"name": "r", "all_required": ["a"], "supporting": "harm_intent"}, "supporting"),
    ({"name": "r", "condition": "1 of {a}", "supporting": "harm_intent"}, "supporting"),
    ({"name": "r", "any_of": [["a"], "harm_intent"]}, r"any_of\[1\]"),
    ({"name": "r", "condition": "1 of g", "groups": {"g": "harm_intent"}}, "group 'g'"),
]


def _write_rules(tmp_path: Path, entry: dict, fmt: str) -> Path:
    import yaml

    f = tmp_path / f"rules.{fmt}"
    f.write_text(json.dumps({"rules": [entry]}) if fmt == "json" else yaml.safe_dump({"rules": [entry]}))
    return f


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("entry,field", STRING_FIELDS, ids=[f for _, f in STRING_FIELDS])
def test_a_string_where_a_list_of_ces_is_required_is_an_error_naming_the_field(tmp_path, entry, field, fmt):
    with pytest.raises(RuleSyntaxError, match=field):
        load_rules(_write_rules(tmp_path, entry, fmt))
    with pytest.raises(RuleSyntaxError, match=field):
        load_rules({"rules": [entry]})


def test_the_json_form_never_splits_a_string_into_characters():
    for field in ("any_of", "all_required"):
        with pytest.raises(RuleSyntaxError, match=field):
            rule_from_json({field: "harm_intent"})
    with pytest.raises(RuleSyntaxError, match="supporting"):
        parse_rule("1 of {a}", supporting="harm_intent")
    with pytest.raises(RuleSyntaxError, match="known_ces"):
        parse_rule("1 of {a}", known_ces="abc")
    # one group written flat is still one group (the paper repository's form)
    r = rule_from_json({"any_of": ["harm_intent", "threat"]})
    assert r.render() == "1 of {harm_intent, threat}" and not r.evaluate({"a"}) and r.evaluate({"threat"})
    assert parse_rule("1 of {a}", known_ces={"a": 1, "b": 2}.keys()).ces == ("a",)  # any iterable of names


INT_NAMES = [
    {"name": "r", "all_required": [1, 2]},
    {"name": "r", "any_of": [[1]]},
    {"name": "r", "all_required": ["a"], "supporting": [3]},
    {"name": "r", "condition": "1 of g", "groups": {"g": [1]}},
    {"name": "r", "condition": "1 of {a}", "supporting": [True]},
]


@pytest.mark.parametrize("entry", INT_NAMES)
def test_integers_are_not_ce_names(entry):
    with pytest.raises(RuleSyntaxError, match="bad CE name"):
        load_rules({"rules": [entry]})


def test_a_saved_steering_vector_with_hooks_as_a_string_is_refused(tmp_path):
    from interp.steering import SteeringVector

    out = tmp_path / "vec"
    hooks = ("blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre")
    SteeringVector("diff_in_means", "add", hooks, torch.ones(8)).save(out)
    meta = json.loads((out / "vector.json").read_text())
    for field, value in (("hooks", "blocks.1.hook_resid_pre"), ("positions", "12"), ("metadata", [1])):
        bad = dict(meta, **{field: value})
        (out / "vector.json").write_text(json.dumps(bad))
        with pytest.raises(SerializationError, match=f"'{field}' must be"):
            SteeringVector.load(out)
    (out / "vector.json").write_text(json.dumps(meta))
    assert SteeringVector.load(out).hooks == ("blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre")


def test_a_saved_ce_with_a_string_where_a_list_belongs_is_refused(tmp_path):
    from interp.probes.gavel.ce import CE

    CE("harm_intent", "wants harm", texts=["I will hurt them."],
       calibration=[{"messages": [{"role": "user", "content": "hi"}], "ces": ["harm_intent"]}]).save(tmp_path / "ce")
    meta = json.loads((tmp_path / "ce" / "ce.json").read_text())
    bad_dialogue = dict(meta["calibration"][0], ces="harm_intent")
    for field, value in (("texts", "I will hurt them."), ("calibration", [bad_dialogue])):
        (tmp_path / "ce" / "ce.json").write_text(json.dumps(dict(meta, **{field: value})))
        with pytest.raises(SerializationError, match=f"ce.json: CE.{field}"):
            CE.load(tmp_path / "ce")


# ======================================================================= parser crashes
def test_an_error_after_a_trailing_newline_is_a_syntax_error_with_its_line():
    for text, line in (("1 of\n", 2), ("all of {a} and\n", 2), ("1 of {a\n\n", 3), ("(1 of {a}\n", 2)):
        with pytest.raises(RuleSyntaxError) as info:
            parse_rule(text)
        assert info.value.line == line, (text, info.value)
    import yaml

    entry = yaml.safe_load("name: r\ncondition: |\n  all of {a} and\n")  # every YAML | block ends with "\n"
    with pytest.raises(RuleSyntaxError, match="line 2"):
        load_rules(entry)


@pytest.mark.parametrize("depth", [330, 1000, 100_000])
def test_deep_nesting_is_a_syntax_error_not_a_recursion_error(depth):
    with pytest.raises(RuleSyntaxError, match="nested deeper"):
        parse_rule("(" * depth + "1 of {a}" + ")" * depth)


def test_nesting_up_to_the_limit_parses_and_evaluates():
    from interp.probes.gavel.rules import MAX_DEPTH

    text = "1 of {z}"
    for i in range(MAX_DEPTH):  # each level adds one "or": fires iff any named CE fired
        text = f"(1 of {{c{i}}} or {text})"
    rule = parse_rule(text)
    assert rule.evaluate({"z"}) and rule.evaluate({"c57"}) and not rule.evaluate({"other"})
    assert rule.score({c: 0.1 for c in rule.ces} | {"c3": 0.9}) == pytest.approx(0.9)


# ------------------------------------------------------------------- fuzzing malformed rule files
_VALID = {"rules": [
    {"name": "phishing", "description": "lure and solicitation", "action": "block",
     "condition": "all of lure and 1 of {personal_information, provide_or_give}",
     "groups": {"lure": ["content_creation", "click_or_enter"]}, "supporting": ["trust_seeding"]},
    {"name": "threat", "all_required": ["making_threat"], "any_of": [["personal_information", "send_or_transfer"]],
     "supporting": ["emotionally_engaging"], "action": "replace", "message": "I cannot help with that."},
]}
_JUNK = [None, True, 0, 7, -1, 2.5, float("nan"), "", "x", "harm_intent", "1 of", "(", [], [1], ["a", 2], [[]],
         [["a"], "b"], {}, {"a": 1}, {"x": ["a"]}, [None], "all of {a}\n", "((" * 40]


def _mutate(rng: random.Random, obj):
    """One random structural change: replace, delete or insert a value anywhere in the nested object."""
    import copy

    obj = copy.deepcopy(obj)
    paths = []

    def walk(o, path):
        paths.append(path)
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, path + [k])
        elif isinstance(o, list):
            for i, v in enumerate(o):
                walk(v, path + [i])

    walk(obj, [])
    path = rng.choice(paths)
    if not path:  # (a bare string would be read as a file name)
        return {"rules": rng.choice(_JUNK)}
    parent = obj
    for p in path[:-1]:
        parent = parent[p]
    op = rng.random()
    if op < 0.6:
        parent[path[-1]] = rng.choice(_JUNK)
    elif op < 0.8:
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[rng.choice(["any_of", "all_required", "supporting", "groups", "condition", "name", "rules", 5])] = \
            rng.choice(_JUNK)
    else:
        parent.insert(path[-1], rng.choice(_JUNK))
    return obj


def _text_mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(chars) + 1)
        op = rng.random()
        if op < 0.4 and i < len(chars):
            del chars[i]
        elif op < 0.8:
            chars.insert(i, rng.choice("{}()[],:-|>#&*!%@`'\"\n\t 01x²é\\"))
        elif i < len(chars):
            chars[i] = rng.choice("{}()[]:,\n")
    return "".join(chars)


def _fuzz(tmp_path: Path, n: int, seed: int = 0) -> dict[str, int]:
    """Only RuleSyntaxError (the documented error) or a loaded RuleSet, whatever the file holds."""
    import yaml

    rng = random.Random(seed)
    seen = {"loaded": 0, "refused": 0}
    base_yaml, base_json = yaml.safe_dump(_VALID), json.dumps(_VALID, indent=1)
    for i in range(n):
        kind = i % 4
        if kind == 0:
            source = _mutate(rng, _VALID)
            for _ in range(rng.randint(0, 2)):
                source = _mutate(rng, source) if isinstance(source, (dict, list)) else source
        else:
            f = tmp_path / ("r.yaml" if kind in (1, 3) else "r.json")
            text = base_yaml if kind in (1, 3) else base_json
            if kind == 3:
                text = yaml.safe_dump(_mutate(rng, _VALID))
            f.write_text(_text_mutate(rng, text) if kind != 3 else text)
            source = f
        try:
            rules = load_rules(source)
        except RuleSyntaxError:
            seen["refused"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - the point of the test
            shown = source.read_text() if isinstance(source, Path) else source
            pytest.fail(f"case {i} raised {type(exc).__name__}: {exc}\n{shown!r}")
        seen["loaded"] += 1
        if kind in (0, 3):  # structural changes: what loaded is over CE names, never over single characters
            for r in rules:
                assert all(len(c) > 1 or c in ("a", "b", "x") for c in r.ces), r
    return seen


def test_malformed_rule_files_raise_only_the_documented_error(tmp_path):
    seen = _fuzz(tmp_path, 1200)
    assert seen["refused"] > 300 and seen["loaded"] > 50, seen


@pytest.mark.slow
def test_malformed_rule_files_raise_only_the_documented_error_at_length(tmp_path):
    seen = _fuzz(tmp_path, 20_000, seed=1)
    print(seen)


def test_rule_file_format_errors_name_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("rules:\n  - name: r\n    condition: [unclosed\n")
    with pytest.raises(RuleSyntaxError, match=r"bad.yaml: not valid YAML \(line \d+, column \d+\)"):
        load_rules(f)
    f.write_bytes(b"rules: \xff\xfe")
    with pytest.raises(RuleSyntaxError, match="not UTF-8"):
        load_rules(f)
    with pytest.raises(RuleSyntaxError, match="not valid JSON"):
        load_rules('{"rules": [')
    with pytest.raises(RuleSyntaxError, match="'rules' must be a list"):
        load_rules({"rules": "phishing"})
    with pytest.raises(RuleSyntaxError, match="duplicate rule name"):
        load_rules({"rules": [{"name": "r", "condition": "1 of {a}"}, {"name": "r", "condition": "1 of {b}"}]})
    f.write_text("[" * 100_000)
    f.rename(tmp_path / "deep.json")
    with pytest.raises(RuleSyntaxError, match="deep.json"):
        load_rules(tmp_path / "deep.json")


# ============================================== loaders check the declared config before allocating
def _constructions(monkeypatch, cls) -> list[str]:
    """Record the default device at every construction of ``cls`` (``meta`` allocates nothing)."""
    seen: list[str] = []
    real = cls.__init__

    def init(self, *a, **k):
        seen.append(torch.empty(0).device.type)
        real(self, *a, **k)

    monkeypatch.setattr(cls, "__init__", init)
    return seen


def _detector(tmp_path: Path) -> Path:
    from interp.probes.gavel.detector import CEDetector, DetectorConfig, WindowGRU

    cfg = DetectorConfig(window=3, hidden=8, rnn_layers=1, dropout=0.0)
    net = WindowGRU(6, 2, cfg.hidden, cfg.rnn_layers, cfg.dropout, cfg.proj_dim)
    return CEDetector(net, ["a", "b"], cfg).save(tmp_path / "det")


def _raptor(tmp_path: Path) -> Path:
    from interp.dynamics.raptor.model import Raptor, RaptorConfig

    return Raptor(RaptorConfig(d_model=8, n_heads=2, n_layers=4, thresholds=[2])).save(tmp_path / "raptor")


def _vqvae(tmp_path: Path) -> Path:
    from interp.probes.planning.vqvae import SetVQVAE, VQVAEConfig

    return SetVQVAE(VQVAEConfig(d_in=4, n_codes=8, d_model=16, d_latent=8, n_heads=2, max_layers=4,
                                max_positions=8)).save(tmp_path / "vq")


def _edit_json(f: Path, fn) -> None:
    meta = json.loads(f.read_text())
    fn(meta)
    f.write_text(json.dumps(meta))


LOADERS = {
    # name: (make, json file, (inflate a little, inflate hugely), the class loaded, the module class built)
    "CEDetector": (_detector, "detector.json",
                   (lambda m: m["config"].update(hidden=32), lambda m: m["config"].update(hidden=10**6)),
                   "interp.probes.gavel.detector:CEDetector", "interp.probes.gavel.detector:WindowGRU"),
    "Raptor": (_raptor, "config.json", (lambda m: m.update(d_model=16), lambda m: m.update(d_model=2**20, n_heads=2)),
               "interp.dynamics.raptor.model:Raptor", "interp.dynamics.raptor.model:Raptor"),
    "SetVQVAE": (_vqvae, "config.json",
                 (lambda m: m["config"].update(n_codes=64), lambda m: m["config"].update(max_positions=10**9)),
                 "interp.probes.planning.vqvae:SetVQVAE", "interp.probes.planning.vqvae:SetVQVAE"),
}


def _obj(spec: str):
    import importlib

    mod, name = spec.split(":")
    return getattr(importlib.import_module(mod), name)


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_an_inflated_config_is_refused_before_anything_is_allocated(tmp_path, monkeypatch, name):
    make, cfg_file, (little, huge), loaded, built = LOADERS[name]
    folder = make(tmp_path)
    good = _obj(loaded).load(folder)  # the intact folder loads
    assert good is not None
    for inflate in (little, huge):
        _edit_json(folder / cfg_file, inflate)
        seen = _constructions(monkeypatch, _obj(built))
        with pytest.raises(SerializationError, match=f"{cfg_file}.*(declares|shape)"):
            _obj(loaded).load(folder)
        assert seen and set(seen) == {"meta"}, seen  # only the meta-device check was built
        monkeypatch.undo()
        folder = make(tmp_path / "again")


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_a_truncated_or_edited_config_is_a_serialization_error(tmp_path, name):
    make, cfg_file, _, loaded, _ = LOADERS[name]
    folder = make(tmp_path)
    text = (folder / cfg_file).read_text()
    (folder / cfg_file).write_text(text[: len(text) // 2])
    with pytest.raises(SerializationError, match=f"{cfg_file}: malformed JSON"):
        _obj(loaded).load(folder)
    (folder / cfg_file).write_text(text)
    meta = json.loads(text)
    cfg = meta["config"] if "config" in meta else meta
    cfg["no_such_option"] = 1
    (folder / cfg_file).write_text(json.dumps(meta))
    with pytest.raises(SerializationError, match=cfg_file):
        _obj(loaded).load(folder)


def test_a_detector_with_ces_as_a_string_is_refused(tmp_path):
    from interp.probes.gavel.detector import CEDetector

    folder = _detector(tmp_path)
    _edit_json(folder / "detector.json", lambda m: m.update(ces="ab"))
    with pytest.raises(SerializationError, match="'ces' must be a non-empty list"):
        CEDetector.load(folder)


# ======================================================================== deep or damaged JSON
def test_a_200k_deep_result_json_is_a_serialization_error(tmp_path):
    from dataclasses import dataclass

    from interp.results import Result

    @dataclass
    class _Deep(Result):
        x: int

    out = tmp_path / "r"
    _Deep(1).save(out)
    meta = json.loads((out / "result.json").read_text())
    (out / "result.json").write_text(json.dumps(meta)[:-1] + ', "deep": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(SerializationError, match="result.json.*nested too deeply"):
        _Deep.load(out)
    # moderately deep values parse, and restoring them must not crash either
    meta["fields"]["x"] = json.loads("[" * 900 + "]" * 900)
    (out / "result.json").write_text(json.dumps(meta))
    try:
        _Deep.load(out)
    except SerializationError as exc:
        assert "nested too deeply" in str(exc)
    # a 200k-deep output manifest is unreadable, not a RecursionError: the saved result is recognised by its
    # own files (as one from before manifests) and replaced; without them the folder is refused
    (out / MANIFEST).write_text("[" * 200_000 + "]" * 200_000)
    _Deep(2).save(out)
    assert _Deep.load(out).x == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / MANIFEST).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(OutputError, match="manifest is unreadable"):
        _Deep(3).save(other)


# ========================================================================= interp demo
def _demo(*args):
    return CliRunner().invoke(app, ["demo", *map(str, args)])


def _lines(output: str) -> list[str]:
    return [ln for ln in output.strip().splitlines() if "%|" not in ln and ln.strip()]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    """A tiny GPT-2 (absolute positions, at most 128 tokens)."""
    from interp.testing import tiny_model

    folder = tmp_path_factory.mktemp("gpt2")
    tiny_model("gpt2", folder=folder)
    return folder


@pytest.mark.parametrize("backend", BACKENDS)
def test_demo_input_mistakes_are_one_line(gpt2_dir, backend):
    for args, match in ((["--text", ""], "empty"), ([gpt2_dir, "--text", "word " * 400], "at most 128")):
        res = _demo(*args, "--backend", backend)
        lines = _lines(res.output)
        assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], \
            res.output
    res = _demo(gpt2_dir, "--backend", backend, "--text", "a short text")
    assert res.exit_code == 0, res.output
