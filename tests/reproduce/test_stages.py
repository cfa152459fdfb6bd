"""Stages that cannot be silently wrong: every stored stage carries its full key and checksums, a read checks
them and recomputes (or refuses) what fails, the key covers the project code the run imports, and the
leftovers of killed runs are removed by the next run (issue #42, item 2 and 3)."""
from __future__ import annotations

import json
import shutil
import sys
import textwrap
import warnings

import pytest
import torch

from interp import stages as stages_mod
from interp.stages import StageIntegrityError, Stages, StageWarning, code_files, code_version


def _train(calls):
    def compute():
        calls.append(1)
        return {"w": torch.arange(6.0).reshape(2, 3), "acc": 0.25, "names": ["a", "b"]}
    return compute


def _stored(tmp_path, cfg=None, stage="train"):
    calls: list = []
    s = Stages("t/integrity", cfg or {"seed": 0}, root=tmp_path)
    s(stage, _train(calls))
    return s, calls


def _again(s: Stages, stage: str = "train", on_mismatch: str = "recompute"):
    """Read ``stage`` with a new Stages object of the same run; returns (value, recomputations, warnings)."""
    calls: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = Stages(s.name, s.config, root=s.folder.parent.parent.parent, on_mismatch=on_mismatch)
        assert again.key == s.key
        value = again(stage, _train(calls))
    return value, len(calls), [w for w in caught if issubclass(w.category, StageWarning)]


def test_an_intact_stage_is_read_back(tmp_path):
    s, calls = _stored(tmp_path)
    value, n, warned = _again(s)
    assert n == 0 and not warned and value["acc"] == 0.25 and torch.equal(value["w"], torch.arange(6.0).reshape(2, 3))
    meta = json.loads((s.folder / "train" / "value.json").read_text())
    assert meta["stage"] == "train" and meta["key"] == s.key and meta["identity"]["config"] == {"seed": 0}
    assert set(meta["checksum"]) == {"value", "tensors"}


def test_an_edited_value_is_recomputed_or_refused(tmp_path):
    s, _ = _stored(tmp_path)
    f = s.folder / "train" / "value.json"
    f.write_text(f.read_text().replace("0.25", "0.75"))
    with pytest.raises(StageIntegrityError, match=r"stage 'train' of t/integrity .*checksum"):
        _again(s, on_mismatch="refuse")
    value, n, warned = _again(s)
    assert n == 1 and value["acc"] == 0.25 and len(warned) == 1 and "'train'" in str(warned[0].message)
    assert _again(s)[1] == 0  # the recomputed stage is stored again, intact


def test_a_flipped_tensor_is_recomputed(tmp_path):
    s, _ = _stored(tmp_path)
    f = s.folder / "train" / "value.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x01  # the last byte of the tensor data
    f.write_bytes(bytes(data))
    with pytest.raises(StageIntegrityError, match="value.safetensors does not match its checksum"):
        _again(s, on_mismatch="refuse")
    value, n, _ = _again(s)
    assert n == 1 and torch.equal(value["w"], torch.arange(6.0).reshape(2, 3))
    # a deleted tensor file is the same failure (no more KeyError: 'value.w')
    (s.folder / "train" / "value.safetensors").unlink()
    assert _again(s)[1] == 1


def test_swapped_stages_are_detected(tmp_path):
    s, _ = _stored(tmp_path)
    s("eval", lambda: {"acc": 0.9})
    tmp = s.folder / "swap"
    shutil.move(s.folder / "train", tmp)
    shutil.move(s.folder / "eval", s.folder / "train")
    shutil.move(tmp, s.folder / "eval")
    with pytest.raises(StageIntegrityError, match="holds stage 'eval'"):
        _again(s, on_mismatch="refuse")
    assert _again(s)[1] == 1


def test_a_stage_of_another_config_is_detected(tmp_path):
    s, _ = _stored(tmp_path)
    other, _ = _stored(tmp_path, cfg={"seed": 1})
    assert other.key != s.key
    shutil.rmtree(s.folder / "train")
    shutil.copytree(other.folder / "train", s.folder / "train")
    with pytest.raises(StageIntegrityError, match=r"another run's \(differs in: config\)"):
        _again(s, on_mismatch="refuse")
    assert _again(s)[1] == 1


def test_an_older_stage_without_checksum_is_recomputed(tmp_path):
    s, _ = _stored(tmp_path)
    f = s.folder / "train" / "value.json"
    meta = json.loads(f.read_text())
    del meta["checksum"], meta["schema_version"]
    f.write_text(json.dumps(meta))
    assert _again(s)[1] == 1


def test_folder_stages_check_every_file(tmp_path):
    s = Stages("t/folders", {"seed": 0}, root=tmp_path)
    builds: list = []

    def build(d):
        builds.append(1)
        (d / "weights.bin").write_bytes(b"\x00\x01\x02")
        (d / "sub").mkdir()
        (d / "sub" / "config.json").write_text('{"width": 4}')

    d = s.path("model", build)
    assert s.path("model", build) == d and len(builds) == 1 and s.done("model")
    strict = Stages("t/folders", {"seed": 0}, root=tmp_path, on_mismatch="refuse")
    # an edited file
    (d / "sub" / "config.json").write_text('{"width": 5}')
    with pytest.raises(StageIntegrityError, match=r"stage 'model' .*edited \['sub/config.json'\]"):
        strict.path("model", build)
    with pytest.warns(StageWarning, match="'model'"):
        assert not s.done("model")
    s.path("model", build)
    assert len(builds) == 2 and (d / "sub" / "config.json").read_text() == '{"width": 4}'
    # a deleted file, an added file
    (d / "weights.bin").unlink()
    with pytest.raises(StageIntegrityError, match=r"deleted \['weights.bin'\]"):
        strict.path("model", build)
    with pytest.warns(StageWarning):
        s.path("model", build)
    (d / "extra.txt").write_text("x")
    with pytest.raises(StageIntegrityError, match=r"added \['extra.txt'\]"):
        strict.path("model", build)
    # a flipped byte
    with pytest.warns(StageWarning):
        s.path("model", build)
    data = bytearray((d / "weights.bin").read_bytes())
    data[1] ^= 0x80
    (d / "weights.bin").write_bytes(bytes(data))
    with pytest.raises(StageIntegrityError, match=r"edited \['weights.bin'\]"):
        strict.path("model", build)
    assert len(builds) == 4


def test_fresh_runs_do_not_count_stored_stages_as_done(tmp_path):
    s, _ = _stored(tmp_path)
    fresh = Stages(s.name, s.config, root=tmp_path, fresh=True)
    assert s.done("train") and not fresh.done("train")  # recipes that skip work for done stages recompute


def test_leftovers_of_killed_runs_are_removed(tmp_path):
    s, _ = _stored(tmp_path)
    killed = s.folder / ".model.1a2b3c4d.tmp"  # replace_dir's temporary of a build killed mid-way
    killed.mkdir()
    (killed / "part.bin").write_bytes(b"1")
    old = s.folder / ".train.old.12345"  # a replaced folder a killed run did not delete
    old.mkdir()
    assert Stages(s.name, s.config, root=tmp_path).folder == s.folder  # the next run of the same key
    assert not killed.exists() and not old.exists() and (s.folder / "train" / "value.json").is_file()


# ------------------------------------------------------------------------------------------ code keys
@pytest.fixture
def toylib(tmp_path, monkeypatch):
    """A tiny project package ``toylib`` (counted as project code): a recipe module that imports ``core``
    inside a function, and an ``other`` module it never imports."""
    pkg = tmp_path / "src" / "toylib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("def next_token_loss(x):\n    return x\n")
    (pkg / "other.py").write_text("VALUE = 1\n")
    (pkg / "recipe.py").write_text(textwrap.dedent("""
        def run(x):
            from .core import next_token_loss
            return next_token_loss(x)
    """))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setattr(stages_mod, "PROJECT_PACKAGES", ("interp", "toylib"))
    yield pkg
    for name in [m for m in sys.modules if m == "toylib" or m.startswith("toylib.")]:
        del sys.modules[name]
    for name in [m for m in stages_mod._SPECS if m == "toylib" or m.startswith("toylib.")]:
        del stages_mod._SPECS[name]


def test_the_key_covers_the_library_code_the_run_imports(toylib, tmp_path):
    assert {"module:toylib", "module:toylib.recipe", "module:toylib.core"} <= set(code_files("toylib.recipe"))
    assert "module:toylib.other" not in code_files("toylib.recipe")
    calls: list = []
    first = Stages("t/code", {"a": 1}, code=["toylib.recipe"], root=tmp_path / "st")
    first("loss", _train(calls))
    # a change of code the run does not import keeps the stage
    (toylib / "other.py").write_text("VALUE = 2  # changed\n")
    same = Stages("t/code", {"a": 1}, code=["toylib.recipe"], root=tmp_path / "st")
    assert same.key == first.key and same.done("loss")
    # a change of library code the recipe imports (even inside a function) gives a new key: recomputed
    (toylib / "core.py").write_text("def next_token_loss(x):\n    return -x\n")
    changed = Stages("t/code", {"a": 1}, code=["toylib.recipe"], root=tmp_path / "st")
    assert changed.key != first.key and not changed.done("loss")
    changed("loss", _train(calls))
    assert len(calls) == 2


def test_real_recipes_are_keyed_by_the_library_they_run(monkeypatch, tmp_path):
    """The heads recipe's stages depend on interp/model.py (next_token_loss): editing it changes their key;
    the framework (interp.apps.reproduce) does not compute stages and is left out."""
    files = code_files("interp.benchmarks.heads")
    assert {"module:interp.model", "module:interp.probes.heads", "module:interp.benchmarks.heads.recipe"} <= set(files)
    assert not any(f.startswith(("module:interp.apps.reproduce", "module:interp.reproduce")) for f in files)
    assert "module:interp.probes.gavel" not in files and "module:interp.benchmarks.sdm.recipe" not in files
    before = code_version("interp.benchmarks.heads")
    edited = tmp_path / "model.py"
    edited.write_text(files["module:interp.model"].read_text().replace("def next_token_loss", "def next_token_loss_"))
    monkeypatch.setitem(stages_mod._SPECS, "interp.model", (str(edited), None))
    assert code_version("interp.benchmarks.heads") != before


def test_the_default_code_is_the_creating_module(tmp_path):
    s = Stages("t/default", {"a": 1}, root=tmp_path)
    assert s.code and s.code == Stages("t/default", {"a": 1}, code=[sys.modules[__name__]], root=tmp_path).code
    assert Stages("t/default", {"a": 1}, code=[], root=tmp_path).code == ""


def test_a_damaged_or_deep_value_json_is_recomputed_not_a_traceback(tmp_path):
    s, _ = _stored(tmp_path)
    f = s.folder / "train" / "value.json"
    f.write_text('{"value": ' + "[" * 100_000 + "]" * 100_000 + "}")  # nested past the JSON parser's recursion limit
    with pytest.raises(StageIntegrityError, match="stage 'train'"):
        _again(s, on_mismatch="refuse")
    assert _again(s)[1] == 1
    f.write_text("{ truncated")
    assert _again(s)[1] == 1
