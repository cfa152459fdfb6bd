"""Zoo cache integrity: checksums recorded at build time, a cheap check on every load, a full one on request.

Each kind of damage from issue #12 (weights overwritten or zeroed, truncated config.json / tokenizer.json /
zoo.json, a missing file) must make the load fail with an error that names the damaged file and the command
that rebuilds the entry, instead of loading a different model.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import interp
from interp import zoo
from interp.apps.cli import app
from interp.zoo import ZooIntegrityError, registry

NAME = "test-integrity"
BLOB_MIB = 16


def _builder(calls: list):
    def build(out: Path, params):
        from interp.testing import tiny_model

        calls.append(1)
        tiny_model("llama", folder=out, n_layers=3, d_model=32)
        # a file larger than the sample hash reads completely (2 MiB + 64 x 64 KiB)
        (out / "blob.bin").write_bytes(np.random.default_rng(0).bytes(BLOB_MIB << 20))
        return {}

    return build


@pytest.fixture
def entry(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path / "cache"))
    calls: list = []
    zoo.register(zoo.ZooEntry(name=NAME, description="tiny Llama for integrity tests", source="interp.testing",
                              architecture="LlamaForCausalLM", size="tiny", builder=_builder(calls)), replace=True)
    folder = zoo.path(NAME)
    yield folder, calls
    zoo.unregister(NAME)


def _damage(f: Path, fn, keep_mtime: bool = False) -> None:
    st = f.stat()
    data = bytearray(f.read_bytes())
    f.write_bytes(bytes(fn(data)))
    if keep_mtime:  # a damage that even leaves the modification time as it was
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def _expect_damaged(rel: str, match: str = "") -> None:
    with pytest.raises(ZooIntegrityError) as err:
        zoo.path(NAME)
    msg = str(err.value)
    assert f"zoo cache of '{NAME}' is damaged: {rel}" in msg and f"interp zoo build {NAME} --force" in msg, msg
    assert match in msg, msg


def test_build_records_checksums_of_every_file(entry):
    folder, _ = entry
    meta = json.loads((folder / "zoo.json").read_text())
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"zoo.json"}
    assert set(meta["files"]) == files and {"config.json", "model.safetensors", "tokenizer.json"} <= files
    import hashlib

    rec = meta["files"]["model.safetensors"]
    assert rec["sha256"] == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert rec["size"] == (folder / "model.safetensors").stat().st_size
    assert meta["integrity_version"] == registry.INTEGRITY_VERSION == 2 and len(meta["checksum"]) == 64
    assert zoo.path(NAME) == folder and zoo.verify(NAME) == folder  # intact: both checks pass


def test_overwritten_weights_are_detected_and_force_rebuilds(entry):
    folder, calls = entry
    model = interp.load(f"zoo:{NAME}", backend="torch")
    ref = model("hello world")
    _damage(folder / "model.safetensors", lambda d: d[:-64] + bytes(range(64)))  # same size, other bytes
    _expect_damaged("model.safetensors", "changed")
    with pytest.raises(ZooIntegrityError, match="model.safetensors"):
        interp.load(f"zoo:{NAME}", backend="torch")  # the loader never sees the damaged weights
    with pytest.raises(ZooIntegrityError):
        zoo.build(NAME)  # without force, build reports the damage as well
    zoo.build(NAME, force=True)
    assert len(calls) == 2 and zoo.verify(NAME) == folder
    assert torch.equal(interp.load(f"zoo:{NAME}", backend="torch")("hello world"), ref)


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["mtime-changed", "mtime-restored"])
def test_zeroed_weights_are_detected(entry, keep_mtime):
    folder, _ = entry
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        header_len = int.from_bytes((folder / "model.safetensors").read_bytes()[:8], "little")
        assert "model.layers.1.mlp.up_proj.weight" in fh.keys()
    # zero every tensor byte after the header: a loadable file of zero weights
    _damage(folder / "model.safetensors", lambda d: d[:8 + header_len] + bytes(len(d) - 8 - header_len), keep_mtime)
    _expect_damaged("model.safetensors")


def test_zeroed_block_in_a_large_file_is_caught_by_the_sample_hash(entry):
    folder, _ = entry
    mid = (BLOB_MIB << 20) // 2
    _damage(folder / "blob.bin", lambda d: d[:mid] + bytes(1 << 20) + d[mid + (1 << 20):], keep_mtime=True)
    _expect_damaged("blob.bin", "sample hash")


def test_one_byte_with_restored_mtime_needs_the_full_check(entry):
    """The documented limit of the cheap check: a tiny change between sampled blocks, mtime put back."""
    folder, _ = entry
    meta = json.loads((folder / "zoo.json").read_text())
    pos = (1 << 20) + 70_000  # inside the first gap between sampled blocks
    _damage(folder / "blob.bin", lambda d: d[:pos] + bytes([d[pos] ^ 0xFF]) + d[pos + 1:], keep_mtime=True)
    assert (folder / "blob.bin").stat().st_mtime_ns == meta["files"]["blob.bin"]["mtime_ns"]
    assert zoo.path(NAME) == folder  # not seen by sizes + sample hash
    with pytest.raises(ZooIntegrityError, match="blob.bin has changed \\(SHA-256 mismatch\\)"):
        zoo.verify(NAME, full=True)
    res = CliRunner().invoke(app, ["zoo", "verify", NAME])
    assert res.exit_code == 1 and "DAMAGED" in res.output and "blob.bin" in res.output


@pytest.mark.parametrize("rel", ["config.json", "tokenizer.json"])
def test_truncated_files_are_detected(entry, rel):
    folder, _ = entry
    _damage(folder / rel, lambda d: d[: len(d) // 2])
    _expect_damaged(rel, "truncated")


def test_truncated_or_edited_zoo_json_is_detected(entry):
    folder, _ = entry
    meta_file = folder / "zoo.json"
    good = meta_file.read_bytes()
    meta_file.write_bytes(good[: len(good) // 2])
    _expect_damaged("zoo.json", "truncated")
    meta = json.loads(good)
    meta["files"]["config.json"]["size"] += 1  # still valid JSON, but not what the build wrote
    meta_file.write_text(json.dumps(meta))
    _expect_damaged("zoo.json", "checksum does not match")


def test_a_missing_file_is_detected_and_a_missing_zoo_json_means_rebuild(entry):
    folder, calls = entry
    (folder / "tokenizer.json").unlink()
    _expect_damaged("tokenizer.json is missing")
    zoo.build(NAME, force=True)
    (folder / "zoo.json").unlink()  # no zoo.json: never a finished build, so it is rebuilt
    assert zoo.path(NAME) == folder and len(calls) == 3 and zoo.verify(NAME) == folder


def test_a_copied_cache_loads_and_remembers_the_new_times(entry):
    folder, _ = entry
    later = time.time_ns() + 10**9
    for f in folder.iterdir():
        if f.name != "zoo.json":
            os.utime(f, ns=(later, later))  # what cp without -p does: same bytes, new times
    assert zoo.path(NAME) == folder  # full hashes match, so it loads ...
    meta = json.loads((folder / "zoo.json").read_text())
    assert all(rec["mtime_ns"] == later for rec in meta["files"].values())  # ... and records the times
    assert zoo.verify(NAME, full=True) == folder


def test_a_cache_built_before_checksums_is_adopted_then_protected(entry):
    folder, calls = entry
    meta = json.loads((folder / "zoo.json").read_text())
    legacy = {k: v for k, v in meta.items() if k not in ("files", "checksum", "integrity_version")}
    (folder / "zoo.json").write_text(json.dumps(legacy))
    with pytest.warns(UserWarning, match="built before checksums were recorded"):
        assert zoo.path(NAME) == folder
    assert json.loads((folder / "zoo.json").read_text())["files"] == {
        k: {**v, "mtime_ns": (folder / k).stat().st_mtime_ns} for k, v in meta["files"].items()}
    _damage(folder / "config.json", lambda d: d[:10])
    _expect_damaged("config.json")
    assert len(calls) == 1


def test_an_older_integrity_record_is_checked_in_full_then_upgraded(entry):
    folder, calls = entry
    meta = json.loads((folder / "zoo.json").read_text())
    old = {**meta, "integrity_version": 1,
           "files": {k: {**v, "sample": "0" * 64} for k, v in meta["files"].items()}}  # other sample hashes
    (folder / "zoo.json").write_text(json.dumps({**old, "checksum": registry._meta_checksum(old)}))
    assert zoo.path(NAME) == folder  # full hashes match: loads, and the record is rewritten
    assert json.loads((folder / "zoo.json").read_text()) == meta
    (folder / "zoo.json").write_text(json.dumps({**old, "checksum": registry._meta_checksum(old)}))
    _damage(folder / "blob.bin", lambda d: d[:100] + bytes([d[100] ^ 1]) + d[101:], keep_mtime=True)
    _expect_damaged("blob.bin", "SHA-256 mismatch")  # an older record is no excuse
    assert len(calls) == 1


def test_cli_verify(entry, monkeypatch):
    folder, _ = entry
    runner = CliRunner()
    res = runner.invoke(app, ["zoo", "verify", NAME])
    assert res.exit_code == 0 and res.output.startswith(f"ok       {NAME}"), res.output
    monkeypatch.setattr(registry, "available", lambda: [NAME])
    res = runner.invoke(app, ["zoo", "verify"])  # every cached entry
    assert res.exit_code == 0 and NAME in res.output
    _damage(folder / "config.json", lambda d: d.replace(b"3", b"4", 1))
    res = runner.invoke(app, ["zoo", "verify", NAME])
    assert res.exit_code == 1 and "config.json" in res.output and f"interp zoo build {NAME} --force" in res.output
    res = runner.invoke(app, ["zoo", "build", NAME])
    assert res.exit_code == 1 and "damaged" in res.output
    res = runner.invoke(app, ["zoo", "verify", "minilm-l6"])  # not built in this cache
    assert res.exit_code == 1 and "not built" in res.output


@pytest.mark.slow
def test_zeroed_tensor_in_a_copy_of_smollm2(tmp_path, monkeypatch):
    """At full scale: one 1.27 MiB tensor zeroed in place with the modification time put back is caught by
    the check on load (the sample hash reads 4 KiB of every MiB)."""
    import shutil

    src = zoo.path("smollm2-135m")
    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path))
    dst = tmp_path / "zoo" / src.name
    shutil.copytree(src, dst)  # copy2 keeps the modification times
    f = dst / "model.safetensors"
    n = int.from_bytes(f.read_bytes()[:8], "little")
    a, b = json.loads(f.read_bytes()[8:8 + n])["model.layers.7.self_attn.o_proj.weight"]["data_offsets"]
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.seek(8 + n + a)
        fh.write(bytes(b - a))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ZooIntegrityError, match="model.safetensors has changed \\(sample hash mismatch\\)"):
        zoo.path("smollm2-135m")


@pytest.mark.slow
def test_load_check_cost_on_smollm2():
    """The cheap check on SmolLM2-135M's 517 MiB folder stays small next to loading the model."""
    folder = zoo.path("smollm2-135m")
    entry = registry.get_entry("smollm2-135m")
    quick = min(_timed(lambda: registry._check_folder(entry.name, folder, full=False)) for _ in range(3))
    full = _timed(lambda: registry._check_folder(entry.name, folder, full=True))
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"smollm2-135m: {size / 2**20:.0f} MiB, quick check {quick * 1e3:.0f} ms, full SHA-256 {full:.2f} s")
    assert size > 500 * 2**20 and quick < 0.25 and quick < full / 10


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_a_read_only_cache_still_loads_and_is_still_checked(entry, monkeypatch):
    folder, _ = entry
    meta = json.loads((folder / "zoo.json").read_text())
    legacy = {k: v for k, v in meta.items() if k not in ("files", "checksum", "integrity_version")}
    (folder / "zoo.json").write_text(json.dumps(legacy))

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as m:
        m.setattr(registry, "atomic_write_json", read_only)
        with pytest.warns(UserWarning) as caught:
            assert zoo.path(NAME) == folder  # adoption cannot be recorded, the load still works
        messages = [str(w.message) for w in caught]
        assert any("before checksums" in m for m in messages) and any("could not record" in m for m in messages)
        assert "files" not in json.loads((folder / "zoo.json").read_text())
        (folder / "zoo.json").write_text(json.dumps(meta))  # recorded checksums, read-only, damaged file
        _damage(folder / "config.json", lambda d: d[:5])
        _expect_damaged("config.json")
