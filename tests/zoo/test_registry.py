"""The zoo's cache mechanism on tiny entries: hashing, cache hits, atomic builds, interrupted builds."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from interp import zoo
from interp.zoo import registry


def _tiny_builder(calls: list):
    def build(out: Path, params):
        from interp.testing import tiny_model

        calls.append(dict(params))
        tiny_model("llama", seed=params.get("seed", 0), folder=out, n_layers=1, d_model=32)
        return {"seed": params.get("seed", 0)}

    return build


@pytest.fixture
def tiny_entry(tmp_zoo):
    calls: list = []
    entry = zoo.register(zoo.ZooEntry(name="test-tiny", description="tiny random Llama for tests",
                                      source="interp.testing", architecture="LlamaForCausalLM", size="tiny",
                                      builder=_tiny_builder(calls), params={"seed": 0}), replace=True)
    yield entry, calls
    zoo.unregister("test-tiny")


def test_required_entries_and_api():
    names = zoo.available()
    for n in ("smollm2-135m", "minilm-l6", "dinov2-s14", "smollm2-135m-refusal", "toy-grammar"):
        assert n in names
    i = zoo.info("zoo:minilm-l6")  # the zoo: prefix is accepted
    assert i.name == "minilm-l6" and i.architecture == "BertModel" and len(i.recipe_hash) == 16
    with pytest.raises(KeyError, match="unknown zoo entry 'nope'.*smollm2-135m"):
        zoo.path("nope")


def test_cache_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path / "x"))
    assert zoo.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("INTERP_CACHE_DIR")
    import platformdirs

    assert zoo.cache_dir() == Path(platformdirs.user_cache_dir("interp"))


def test_build_then_cache_hit(tiny_entry, tmp_zoo):
    entry, calls = tiny_entry
    assert zoo.info("test-tiny").path is None
    p = zoo.path("test-tiny")
    assert calls == [{"seed": 0}]
    assert p.parent == tmp_zoo / "zoo" and p.name == f"test-tiny-{zoo.recipe_hash('test-tiny')}"
    meta = json.loads((p / "zoo.json").read_text())
    assert meta["recipe_hash"] == zoo.recipe_hash("test-tiny") and meta["metrics"] == {"seed": 0}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in p.iterdir()}
    # second load hits the cache: same folder, builder not called again
    assert zoo.path("test-tiny") == p and zoo.build("test-tiny") == p
    assert len(calls) == 1
    assert zoo.info("test-tiny").path == p and zoo.info("test-tiny").metrics == {"seed": 0}
    # force rebuilds in place
    assert zoo.build("test-tiny", force=True) == p and len(calls) == 2
    # no temporary folders left behind
    assert [q.name for q in p.parent.iterdir() if q.name.startswith(".test-tiny")] == []


def test_folder_loads_like_interp_load_does(tiny_entry):
    """AutoConfig -> config.architectures[0] -> from_pretrained, plus AutoTokenizer (the lead's loader)."""
    import transformers

    p = zoo.path("test-tiny")
    cfg = transformers.AutoConfig.from_pretrained(p)
    model = getattr(transformers, cfg.architectures[0]).from_pretrained(p)
    tok = transformers.AutoTokenizer.from_pretrained(p)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model(**tok("hi", return_tensors="pt")).logits.shape[-1] == cfg.vocab_size


def test_interp_load_zoo_prefix(tiny_entry):
    import interp

    m = interp.load("zoo:test-tiny", backend="torch")
    logits = m("hello")
    assert logits.shape[0] == 1 and logits.shape[-1] == 259


def test_changed_recipe_rebuilds(tiny_entry):
    entry, calls = tiny_entry
    p0 = zoo.path("test-tiny")
    h0 = zoo.recipe_hash("test-tiny")
    zoo.register(zoo.ZooEntry(**{**entry.__dict__, "params": {"seed": 1}}), replace=True)
    h1 = zoo.recipe_hash("test-tiny")
    assert h1 != h0
    assert zoo.info("test-tiny").path is None  # the new recipe is not built yet
    p1 = zoo.path("test-tiny")
    assert p1 != p0 and calls[-1] == {"seed": 1}
    # the weights differ because the seed differs
    from safetensors.torch import load_file

    a, b = load_file(p0 / "model.safetensors"), load_file(p1 / "model.safetensors")
    assert any(not torch.equal(a[k], b[k]) for k in a)
    # a version bump changes the hash as well
    zoo.register(zoo.ZooEntry(**{**entry.__dict__, "params": {"seed": 1}, "version": 2}), replace=True)
    assert zoo.recipe_hash("test-tiny") not in (h0, h1)


def test_dependency_hash_propagates(tiny_entry, tmp_zoo):
    entry, _ = tiny_entry
    child = zoo.register(zoo.ZooEntry(name="test-child", description="", source="", architecture="LlamaForCausalLM",
                                      size="tiny", builder=_tiny_builder([]), requires=("test-tiny",)))
    try:
        h = zoo.recipe_hash("test-child")
        zoo.register(zoo.ZooEntry(**{**entry.__dict__, "params": {"seed": 5}}), replace=True)
        assert zoo.recipe_hash("test-child") != h
        zoo.path("test-child")  # builds the dependency first
        assert zoo.info("test-tiny").path is not None
    finally:
        zoo.unregister(child.name)


def test_failed_build_leaves_nothing(tmp_zoo):
    def broken(out: Path, params):
        from interp.testing import tiny_model

        tiny_model("llama", folder=out, n_layers=1, d_model=32)  # writes a loadable-looking folder ...
        raise KeyboardInterrupt  # ... and is interrupted before it finishes

    zoo.register(zoo.ZooEntry(name="test-broken", description="", source="", architecture="LlamaForCausalLM",
                              size="tiny", builder=broken))
    try:
        with pytest.raises(KeyboardInterrupt):
            zoo.build("test-broken")
        assert zoo.info("test-broken").path is None
        root = tmp_zoo / "zoo"
        assert [p.name for p in root.iterdir() if "test-broken" in p.name] == []
    finally:
        zoo.unregister("test-broken")


def test_builder_must_write_config(tmp_zoo):
    zoo.register(zoo.ZooEntry(name="test-empty", description="", source="", architecture="?", size="0",
                              builder=lambda out, params: None))
    try:
        with pytest.raises(RuntimeError, match="no config.json"):
            zoo.build("test-empty")
        assert zoo.info("test-empty").path is None
    finally:
        zoo.unregister("test-empty")


_KILLED_BUILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from interp import zoo

    def build(out, params):
        from interp.testing import tiny_model
        tiny_model("llama", folder=out, n_layers=1, d_model=32)
        Path(sys.argv[1]).write_text("half-written")
        time.sleep(600)

    zoo.register(zoo.ZooEntry(name="test-tiny", description="tiny random Llama for tests", source="interp.testing",
                              architecture="LlamaForCausalLM", size="tiny", builder=build, params={"seed": 0}),
                 replace=True)
    zoo.build("test-tiny")
""")


def test_killed_build_is_not_a_cache_hit_and_is_cleaned(tiny_entry, tmp_zoo, tmp_path):
    """SIGKILL in the middle of a build: the half-written folder never looks like a finished cache."""
    entry, calls = tiny_entry
    marker = tmp_path / "half"
    env = dict(os.environ, INTERP_CACHE_DIR=str(tmp_zoo))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_BUILD, str(marker)], env=env)
    try:
        deadline = time.time() + 240
        while not marker.exists():
            assert proc.poll() is None, "build subprocess died early"
            assert time.time() < deadline, "build subprocess never reached the middle of its build"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    root = tmp_zoo / "zoo"
    leftovers = [p for p in root.iterdir() if p.name.startswith(".test-tiny-")]
    assert leftovers and (leftovers[0] / "config.json").exists()  # the half-written folder is hidden aside
    assert zoo.cached_path("test-tiny") is None and zoo.info("test-tiny").path is None
    p = zoo.path("test-tiny")  # rebuilds (waits on no stale lock: flock dies with the process)
    assert calls == [{"seed": 0}] and (p / "zoo.json").exists()
    assert not any(q.name.startswith(".test-tiny-") and q.is_dir() for q in root.iterdir())


def test_concurrent_builds_run_the_builder_once(tmp_zoo):
    calls: list = []
    inner = _tiny_builder(calls)

    def slow(out, params):
        time.sleep(0.5)
        return inner(out, params)

    zoo.register(zoo.ZooEntry(name="test-race", description="", source="", architecture="LlamaForCausalLM",
                              size="tiny", builder=slow))
    try:
        results: list = []
        threads = [threading.Thread(target=lambda: results.append(zoo.path("test-race"))) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 3
    finally:
        zoo.unregister("test-race")


def test_entry_validation():
    with pytest.raises(ValueError, match="plain non-empty token"):
        zoo.ZooEntry(name="a/b", description="", source="", architecture="", size="", builder=lambda o, p: None)
    with pytest.raises(TypeError, match="builder must be callable"):
        zoo.ZooEntry(name="ab", description="", source="", architecture="", size="", builder=None)
    with pytest.raises(ValueError, match="already registered"):
        zoo.register(zoo.ZooEntry(name="minilm-l6", description="", source="", architecture="", size="",
                                  builder=lambda o, p: None))
    assert registry.get_entry("minilm-l6").architecture == "BertModel"


def test_entry_point_plugins(tmp_zoo, monkeypatch):
    """Other packages register entries through the ``interp.zoo`` entry-point group."""
    import importlib.metadata

    calls: list = []

    class FakeEP:
        def load(self):
            return lambda: [zoo.ZooEntry(name="test-plugin", description="from a plugin", source="plugin",
                                         architecture="LlamaForCausalLM", size="tiny", builder=_tiny_builder(calls))]

    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [FakeEP()] if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        assert "test-plugin" in zoo.available()
        assert (zoo.path("test-plugin") / "config.json").exists() and len(calls) == 1
    finally:
        zoo.unregister("test-plugin")
