"""The harvest's typed config (HarvestConfig): validated once with one-line errors naming the field; keywords
or one ready config (not both) give the same store byte for byte; the CLI builds it once and hands it on; an
engine gets it whole (run_shards(todo, config, *, spec, folder, names, shapes, stop, record))."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from interp.configs import ConfigError
from interp.store import HarvestConfig, harvest
from interp.store.harvest import HARVEST_ENGINES, compute_shard, DTYPES
from interp.store.manifest import write_shard

NAMES = ["blocks.0.hook_resid_post", "blocks.1.hook_mlp_out"]
KW = dict(context_size=16, batch_size=3, shard_mb=0.05)


def _files(folder: Path) -> dict[str, str]:
    """sha256 of every file of a store (the lock file aside), by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("field, value, expected", [
    ("names", [], "one or more hook names"), ("names", ["ok", ""], "one or more hook names"),
    ("context_size", 1, "an integer >= 2"), ("context_size", 16.0, "an integer >= 2"),
    ("batch_size", 0, "an integer >= 1"), ("num_workers", True, "an integer >= 1"),
    ("threads_per_worker", 0, "an integer >= 1"), ("max_tokens", 8, r"None or an integer >= context_size \(16\)"),
    ("dtype", "int8", "one of float32, float16, bfloat16, float64"), ("shard_mb", 0, "a positive number"),
    ("shard_mb", float("nan"), "a positive number"), ("gpus_per_worker", -1, "a number >= 0"),
    ("engine", "spark", "one of local"), ("separator", "pad", "'bos', 'eos', 'sep', a token id or None"),
    ("prepend_bos", 1, "True or False"), ("verify", "yes", "True or False"), ("text_column", "", "a non-empty string"),
    ("backend", None, "a non-empty string"), ("load_kwargs", ["device"], "a mapping")])
def test_bad_values_are_refused_naming_the_field(field, value, expected):
    kwargs = {"names": NAMES, "context_size": 16, field: value}
    with pytest.raises(ConfigError, match=rf"^HarvestConfig\.{field} must be {expected}.*; got ") as err:
        HarvestConfig(**kwargs)
    assert "\n" not in str(err.value)
    # the same check through harvest's keywords, before any model loads (the model argument is never opened)
    with pytest.raises(ConfigError, match=rf"HarvestConfig\.{field} must be"):
        harvest("no-such-model", ["text"], out="unused", **{k: v for k, v in kwargs.items()})


def test_config_is_frozen_and_normalised():
    cfg = HarvestConfig(names="blocks.0.hook_resid_post", load_kwargs={"device": "cpu"})
    assert cfg.names == ("blocks.0.hook_resid_post",) and cfg.load_kwargs == {"device": "cpu"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 3  # type: ignore[misc]
    # the store's identity: what is stored, as the manifest records it (names a list), not how it runs
    ident = cfg.identity()
    assert ident["names"] == ["blocks.0.hook_resid_post"]
    assert not set(ident) & set(HarvestConfig.RUN_FIELDS) and list(ident)[0] == "names"


def test_keywords_and_config_give_identical_stores(model, texts, tmp_path):
    a = harvest(model, texts, NAMES, tmp_path / "kw", **KW)
    cfg = HarvestConfig(names=NAMES, **KW)
    b = harvest(model, texts, out=tmp_path / "cfg", config=cfg)
    assert a.n_shards >= 3 and b.shards_written == a.n_shards
    assert _files(tmp_path / "kw") == _files(tmp_path / "cfg")
    # both ways at once is refused, and so is an option the config does not have (naming the closest)
    with pytest.raises(ConfigError, match="harvest: pass either config= or the options as keywords, not both"):
        harvest(model, texts, NAMES, tmp_path / "x", config=cfg)
    with pytest.raises(ConfigError, match="not both; got config= and batch_size"):
        harvest(model, texts, out=tmp_path / "x", config=cfg, batch_size=2)
    with pytest.raises(ConfigError, match="unknown field.*'contxt_size' \\(did you mean 'context_size'"):
        harvest(model, texts, NAMES, tmp_path / "x", contxt_size=16)
    with pytest.raises(ConfigError, match="missing names"):
        harvest(model, texts, out=tmp_path / "x", context_size=16)
    with pytest.raises(ConfigError, match="config must be a HarvestConfig"):
        harvest(model, texts, out=tmp_path / "x", config={"names": NAMES})
    assert not (tmp_path / "x").exists()


def test_an_engine_gets_the_config_whole(model, model_dir, texts, tmp_path):
    """A registered engine is called as run_shards(todo, config, *, spec, folder, names, shapes, stop, record); one
    that computes the shards here writes the local engine's store byte for byte."""
    import interp

    calls = []

    def here(todo, config, *, spec, folder, names, shapes, stop, record):
        calls.append((config, spec))
        worker = interp.load(spec, backend=config.backend, **config.load_kwargs)
        n = 0
        for index, first, contexts in todo:
            tensors = compute_shard(worker, contexts, first, names, shapes, stop, config.batch_size,
                                    DTYPES[config.dtype])
            record(index, write_shard(Path(folder), index, first, tensors), len(contexts) * config.context_size)
            n += 1
        return n

    HARVEST_ENGINES.register(here, "test-here")
    try:
        res = harvest(str(model_dir), texts, NAMES, tmp_path / "e", engine="test-here", num_workers=3, **KW)
    finally:
        HARVEST_ENGINES.unregister("test-here")
    harvest(model, texts, NAMES, tmp_path / "local", **KW)
    (config, spec), = calls
    assert isinstance(config, HarvestConfig) and config.engine == "test-here" and config.num_workers == 3
    assert spec == str(model_dir) and res.engine == "test-here" and res.shards_written == res.n_shards
    man_e = json.loads((tmp_path / "e" / "manifest.json").read_text())
    man_l = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert man_e["shards"] == man_l["shards"] and man_e["identity"] == man_l["identity"]


def test_the_cli_builds_the_config_once_and_hands_it_on(model_dir, texts, tmp_path, monkeypatch):
    import sys

    from interp.apps.cli import app

    hv = sys.modules["interp.store.harvest"]  # the module (interp.store.harvest is also the function's name)

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(texts))
    seen = []
    real = hv.harvest

    def spy(model, data, names=None, out=None, *, config=None, **options):
        seen.append((names, options, config))
        return real(model, data, names, out, config=config, **options)

    monkeypatch.setattr(hv, "harvest", spy)
    args = ["harvest", str(model_dir), "--names", ",".join(NAMES), "--data", str(corpus), "--out",
            str(tmp_path / "s"), "--context-size", "16", "--batch-size", "3", "--shard-mb", "0.05", "--no-bos"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    (names, options, config), = seen
    assert names is None and options == {} and isinstance(config, HarvestConfig)
    assert config.names == tuple(NAMES) and (config.context_size, config.batch_size, config.prepend_bos) == (16, 3, False)
    # a bad value: one line naming the field, exit 2, nothing loaded or written
    res = CliRunner().invoke(app, [*args[:-7], "--context-size", "16", "--batch-size", "0"])
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        "error: HarvestConfig.batch_size must be an integer >= 1; got 0"], res.output
    assert len(seen) == 1
