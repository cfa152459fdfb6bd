"""Issue #32, data safety: writer ownership, the activation store as untrusted input, resume by weights.

* Writers (``Result.save``, ``SteeringVector.save``, the audit report, any ``output_dir`` writer such as
  ``interp reproduce``) refuse a folder another kind of writer made, unless ``overwrite=True``.
* Harvest start-up removes only its own temporaries, under its own lock; a second harvest into a folder in
  use is refused.
* The store's manifest is validated against the shard files (names, counts, shapes, dtypes, locations);
  the default reader checks sizes, headers and a sampled hash; resume identifies the model by its weights.
* CLI mistakes of ``interp harvest`` are one line, before the model loads; a full disk is one line.
"""
from __future__ import annotations

import errno
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from typer.testing import CliRunner

import interp
from interp import io as iio
from interp.apps.audit import AuditData, Check, Rendered, run_audit
from interp.apps.cli import app
from interp.io import MANIFEST, OutputError
from interp.results import Result
from interp.steering import SteeringVector
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")


# =============================================================================== writer ownership
@dataclass
class _Owned(Result):
    version: int
    values: torch.Tensor


@dataclass
class _NoConfig:
    pass


class _CountCheck(Check):
    name = "count"
    title = "Text count"
    Config = _NoConfig

    def run(self, model, data):
        return _Owned(len(data.texts), torch.arange(3.0))

    def render(self, result):
        return Rendered("<p>count</p>", [], [])


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer tiny Llama in memory: ``(hf_model, tokenizer)``."""
    return tiny_model("llama", n_layers=2)


@dataclass
class _W:
    name: str  # the writer name its manifest records
    write: Callable[[Path, bool], object]  # (path, overwrite)
    read: Callable[[Path], object]  # raises unless the folder holds this writer's output


def _writers(tiny) -> dict[str, _W]:
    hf, tok = tiny
    report = run_audit(interp.wrap(hf, tok), [_CountCheck()], AuditData(["a text", "another"]))

    def reproduce(p, o):  # the reproduction report (interp reproduce) writes through output_dir as well
        with iio.output_dir(p, overwrite=o, writer="interp reproduce") as tmp:
            (tmp / "record.json").write_text(json.dumps({"claims": 3}))

    def read_reproduce(p):
        assert json.loads((p / "record.json").read_text()) == {"claims": 3}

    vec = SteeringVector("diff_in_means", "add", ("blocks.1.hook_resid_pre",), torch.ones(8), scale=2.0)
    return {
        "result": _W("Result.save", lambda p, o: _Owned(7, torch.arange(3.0)).save(p, overwrite=o),
                     lambda p: _Owned.load(p).version == 7 or pytest.fail("wrong result")),
        "vector": _W("SteeringVector.save", lambda p, o: vec.save(p, overwrite=o),
                     lambda p: SteeringVector.load(p).scale == 2.0 or pytest.fail("wrong vector")),
        "audit": _W("interp audit", lambda p, o: report.write(p, overwrite=o),
                    lambda p: json.loads((p / "results.json").read_text())["data"]["n_texts"] == 2
                    or pytest.fail("wrong report")),
        "reproduce": _W("interp reproduce", reproduce, read_reproduce),
    }


PAIRS = [(a, b) for a in ("result", "vector", "audit", "reproduce") for b in ("result", "vector", "audit", "reproduce")
         if a != b]


@pytest.mark.parametrize("first,second", PAIRS)
def test_a_writer_refuses_another_writers_folder_unless_asked(tiny, tmp_path, first, second):
    writers = _writers(tiny)
    a, b = writers[first], writers[second]
    out = tmp_path / "out"
    a.write(out, False)
    (out / "notes.txt").write_text("mine")
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(OutputError, match=rf"written by {a.name}, not by {b.name}"):
        b.write(out, False)
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # nothing of the first output lost
    a.read(out)
    if second in ("result", "audit"):  # the early checks refuse as well, before any work
        from interp.apps.audit.report import prepare_output

        with pytest.raises(OutputError, match=a.name):
            (_Owned.check_save if second == "result" else prepare_output)(out)
    # asked: the other output is replaced by today's rule (its listed files go, the user's stay)
    b.write(out, True)
    b.read(out)
    assert (out / "notes.txt").read_text() == "mine"
    listed = json.loads((out / MANIFEST).read_text())
    assert listed["writer"] == b.name
    left = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert left == set(listed["files"]) | {MANIFEST, "notes.txt"}
    a.write(out, True)  # and back
    a.read(out)


def test_the_same_writer_still_replaces_its_own_output(tiny, tmp_path):
    for w in _writers(tiny).values():
        out = tmp_path / w.name.replace(" ", "-")
        w.write(out, False)
        w.write(out, False)
        w.read(out)


def test_a_manifest_without_a_writer_is_foreign(tmp_path):
    out = tmp_path / "out"
    _Owned(1, torch.zeros(1)).save(out)
    man = json.loads((out / MANIFEST).read_text())
    del man["writer"]
    (out / MANIFEST).write_text(json.dumps(man))
    with pytest.raises(OutputError, match="unknown writer"):
        _Owned(2, torch.zeros(1)).save(out)
    assert _Owned.load(out).version == 1


# ============================================================================ the activation store
from interp.store import ActivationStore, CorruptShardError, IncompatibleStoreError, StoreError, harvest  # noqa: E402
from interp.store.manifest import LOCK  # noqa: E402

NAMES = ["blocks.0.hook_resid_post", "blocks.1.hook_mlp_out"]
KW = dict(context_size=16, batch_size=3, shard_mb=0.05)  # 6 contexts (24 KiB) per shard
_WORDS = "the quick brown fox jumps over a lazy dog while seven owls count silver stars".split()


def _texts(n: int = 30) -> list[str]:
    g = torch.Generator().manual_seed(0)
    docs = []
    for i in range(n):
        length = int(torch.randint(4, 30, (1,), generator=g))
        words = torch.randint(0, len(_WORDS), (length,), generator=g).tolist()
        docs.append(f"doc {i}: " + " ".join(_WORDS[j] for j in words))
    return docs


TEXTS = _texts()


@pytest.fixture(scope="module")
def model(model_dir):
    return interp.load(str(model_dir))


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "store"
    res = harvest(model, TEXTS, NAMES, out, **KW)
    assert res.n_shards >= 4
    return out


def _copy(reference: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "store"
    shutil.copytree(reference, out)
    return out


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _write_manifest(out: Path, man: dict) -> None:
    (out / "manifest.json").write_text(json.dumps(man))


def _interrupted(out: Path, keep: int) -> None:
    """What a harvest killed after ``keep`` shards leaves: later shards neither listed nor on disk."""
    man = _manifest(out)
    for key in [k for k in man["shards"] if int(k) >= keep]:
        (out / man["shards"].pop(key)["file"]).unlink()
    man["complete"] = False
    for k in ("n_shards", "n_contexts", "n_tokens", "n_documents"):
        man.pop(k, None)
    _write_manifest(out, man)


def _same_store(a: Path, b: Path) -> None:
    ma, mb = _manifest(a), _manifest(b)
    assert ma["shards"] == mb["shards"] and ma["n_tokens"] == mb["n_tokens"]
    for e in ma["shards"].values():
        assert (a / e["file"]).read_bytes() == (b / e["file"]).read_bytes()


# ------------------------------------------------------------- item 2: temporaries and the lock
def test_harvest_removes_only_its_own_temporaries(model, reference, tmp_path):
    out = _copy(reference, tmp_path)
    _interrupted(out, keep=2)
    users = {".draft.tmp": b"my draft", ".notes.md.tmp": b"notes", ".shard_000001.safetensors.tmp": b"mine too"}
    for name, data in users.items():
        (out / name).write_bytes(data)
    own = [".shard_000003.safetensors.ab12cd34.tmp", ".manifest.json.z9_y8x7w.tmp"]  # what a killed run leaves
    for name in own:
        (out / name).write_bytes(b"half-written")
    harvest(model, TEXTS, NAMES, out, **KW)
    for name, data in users.items():
        assert (out / name).read_bytes() == data, name
    assert not any((out / n).exists() for n in own)
    _same_store(out, reference)


def test_a_second_harvest_into_a_folder_in_use_is_refused(model_dir, reference, tmp_path):
    """One harvest is paused inside a forward; a second one into the same folder is refused at once and the
    first finishes with a complete, verified store."""
    first, second = interp.load(str(model_dir)), interp.load(str(model_dir))
    out = tmp_path / "store"
    inside, release = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def pause(t, ctx):
        inside.set()
        release.wait(60)

    def run_first():
        try:
            with first.intervene({"blocks.0.hook_resid_pre": pause}):
                harvest(first, TEXTS, NAMES, out, **KW)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    thread = threading.Thread(target=run_first)
    thread.start()
    try:
        assert inside.wait(60), "the first harvest did not start"
        with pytest.raises(StoreError, match="another harvest is writing into"):
            harvest(second, TEXTS, NAMES, out, **KW)
    finally:
        release.set()
        thread.join(120)
    assert not failure, failure
    ActivationStore(out, verify=True)
    _same_store(out, reference)
    again = harvest(second, TEXTS, NAMES, out, **KW)  # the lock is released after the run
    assert again.shards_written == 0


def test_a_failed_harvest_leaves_no_folder_and_no_lock(model, tmp_path):
    with pytest.raises(ValueError, match="no complete context"):
        harvest(model, ["too short"], NAMES, tmp_path / "a" / "store", context_size=64)
    assert list(tmp_path.iterdir()) == []
    empty = tmp_path / "mine"
    empty.mkdir()
    with pytest.raises(ValueError, match="no complete context"):
        harvest(model, ["too short"], NAMES, empty, context_size=64)
    res = harvest(model, TEXTS, NAMES, empty, **KW)  # the lock file alone does not make it foreign
    assert res.n_shards >= 4 and (empty / LOCK).exists()


# ---------------------------------------------------- item 6: the manifest is untrusted input
def _outside_copy(out: Path) -> Path:
    outside = out.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "x.safetensors").write_bytes((out / "shard_000001.safetensors").read_bytes())
    return outside / "x.safetensors"


def _edit(fn):
    def apply(out: Path) -> None:
        man = _manifest(out)
        fn(man, out)
        _write_manifest(out, man)
    return apply


def _both(man, key, value):
    man[key] = value
    if key == "context_size":
        man["identity"]["config"][key] = value
    else:
        man["identity"][key] = value


MUTATIONS = {
    "file_outside_relative": (
        _edit(lambda m, o: (_outside_copy(o), m["shards"]["1"].update(file="../outside/x.safetensors"))),
        "names the file"),
    "file_absolute": (_edit(lambda m, o: m["shards"]["1"].update(file=str(_outside_copy(o)))), "names the file"),
    "n_rows_raised": (_edit(lambda m, o: m["shards"]["0"].update(n_rows=m["shards"]["0"]["n_rows"] + 32)), "'n_rows'"),
    "n_contexts_raised_consistently": (_edit(lambda m, o: (
        m["shards"]["0"].update(n_contexts=m["shards"]["0"]["n_contexts"] + 2, n_rows=m["shards"]["0"]["n_rows"] + 32),
        m.update(n_contexts=m["n_contexts"] + 2, n_tokens=m["n_tokens"] + 32),
        m.update(contexts_per_shard=m["contexts_per_shard"] + 2),
        m["identity"].update(contexts_per_shard=m["contexts_per_shard"]),
    )), "first_context|n_contexts|holds"),
    "shapes_top_level": (_edit(lambda m, o: m["shapes"].update({NAMES[0]: [32]})), "identity"),
    "shapes_everywhere": (_edit(lambda m, o: _both(m, "shapes", {NAMES[0]: [32], NAMES[1]: [64]})), "holds|changed"),
    "dtype_top_level": (_edit(lambda m, o: m.update(dtype="float16")), "identity"),
    "dtype_everywhere": (_edit(lambda m, o: _both(m, "dtype", "float16")), "holds|changed"),
    "context_size_everywhere": (_edit(lambda m, o: _both(m, "context_size", 8)), "n_rows"),
    "complete_with_a_shard_removed": (_edit(lambda m, o: m["shards"].pop("1")), "not listed"),
    "complete_with_a_file_removed": (lambda o: (o / "shard_000002.safetensors").unlink(), "missing"),
    "totals_edited": (_edit(lambda m, o: m.update(n_tokens=m["n_tokens"] + 16)), "n_tokens"),
    "shards_as_a_list": (_edit(lambda m, o: m.update(shards=list(m["shards"].values()))), "'shards' must be an object"),
    "without_names": (_edit(lambda m, o: m.pop("names")), "missing 'names'"),
    "names_a_string": (_edit(lambda m, o: m.update(names=NAMES[0])), "'names' must be"),
    "not_an_object": (lambda o: (o / "manifest.json").write_text("[1, 2]"), "not an interp store manifest"),
    "shard_is_a_link_outside": (lambda o: (o / "shard_000001.safetensors").symlink_to(
        (_outside_copy(o), (o / "shard_000001.safetensors").unlink())[0]), "resolves outside"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_tampered_manifest_is_refused_by_reader_and_harvest(model, reference, tmp_path, case):
    out = _copy(reference, tmp_path)
    mutate, match = MUTATIONS[case]
    mutate(out)
    with pytest.raises(StoreError, match=match):
        ActivationStore(out, allow_incomplete=True)
    with pytest.raises(StoreError, match=match):
        harvest(model, TEXTS, NAMES, out, **KW, verify=False)


# ------------------------------------------------ item 7: the default reader checks what it reads
def _data_start(path: Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def test_the_default_reader_catches_a_flipped_byte_and_a_swapped_shard(reference, tmp_path):
    out = _copy(reference, tmp_path)
    good = ActivationStore(out)
    clean = good.rows(slice(0, len(good)))
    shard = out / "shard_000001.safetensors"
    data = bytearray(shard.read_bytes())
    data[_data_start(shard) + 3] ^= 0x7F  # one byte of the first activation of shard 1
    shard.write_bytes(bytes(data))
    store = ActivationStore(out)  # size and header are fine: opening is not the check that catches it
    rows = store.shards[0]["n_rows"]
    torch.testing.assert_close(store.rows(slice(0, rows))[NAMES[0]], clean[NAMES[0]][:rows])  # shard 0 reads
    with pytest.raises(CorruptShardError, match="shard_000001.safetensors.*sample hash"):
        store.rows(slice(rows, rows + 1))
    with pytest.raises(CorruptShardError, match="shard_000001"):
        list(ActivationStore(out).batches(8, names=NAMES[0]))
    # two whole shards swapped (same size, same header): the order of the rows would be silently wrong
    out2 = _copy(reference, tmp_path / "b")
    a, b = out2 / "shard_000000.safetensors", out2 / "shard_000001.safetensors"
    da, db = a.read_bytes(), b.read_bytes()
    assert len(da) == len(db)
    a.write_bytes(db)
    b.write_bytes(da)
    with pytest.raises(CorruptShardError, match="shard_000000"):
        ActivationStore(out2).rows(slice(0, 4))
    # a truncated shard is caught when the store is opened
    out3 = _copy(reference, tmp_path / "c")
    (out3 / "shard_000002.safetensors").write_bytes(db[:-100])
    with pytest.raises(CorruptShardError, match="shard_000002.*bytes"):
        ActivationStore(out3)


def test_the_full_check_stays_opt_in_and_an_intact_store_reads_as_written(model, reference, tmp_path):
    out = _copy(reference, tmp_path)
    store = ActivationStore(out, verify=True)
    ids = store.context_tokens(3).long()[None]
    _, cache = model.run_with_cache(ids, names=NAMES)
    torch.testing.assert_close(store.rows(slice(48, 64))[NAMES[1]], cache[NAMES[1]][0], rtol=1e-5, atol=1e-5)
    assert all(len(e["sample"]) == 64 for e in _manifest(out)["shards"].values())


def test_stores_from_before_sample_hashes_still_read_and_are_checked(reference, tmp_path):
    out = _copy(reference, tmp_path)
    man = _manifest(out)
    for e in man["shards"].values():
        e.pop("sample")
    _write_manifest(out, man)
    assert len(ActivationStore(out).rows(slice(0, 200))[NAMES[0]]) == 200
    shard = out / "shard_000000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match="checksum mismatch"):
        ActivationStore(out).rows(slice(0, 1))


# -------------------------------------------- item 8: resume identifies the model by its weights
@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_refuses_another_checkpoint_and_accepts_the_same(model_dir, perturbed_dir, tmp_path, backend):
    ref = tmp_path / "ref"
    harvest(str(model_dir), TEXTS, NAMES, ref, backend=backend, **KW)
    out = _copy(ref, tmp_path)
    _interrupted(out, keep=2)
    with pytest.raises(IncompatibleStoreError, match="weights"):
        harvest(str(perturbed_dir), TEXTS, NAMES, out, backend=backend, **KW)
    assert len(_manifest(out)["shards"]) == 2  # nothing of the other checkpoint was written
    res = harvest(str(model_dir), TEXTS, NAMES, out, backend=backend, **KW)
    assert res.shards_skipped == 2
    _same_store(out, ref)


def test_a_store_from_before_fingerprints_resumes_by_the_probe_and_records_one(model, reference, tmp_path):
    out = _copy(reference, tmp_path)
    _interrupted(out, keep=2)
    man = _manifest(out)
    del man["identity"]["weights"]
    _write_manifest(out, man)
    harvest(model, TEXTS, NAMES, out, **KW)
    _same_store(out, reference)
    assert _manifest(out)["identity"]["weights"] == _manifest(reference)["identity"]["weights"]


# --------------------------------------------------------------- the harvest command line
def _harvest_cli(*args):
    return CliRunner().invoke(app, ["harvest", *map(str, args)])


def _lines(output: str) -> list[str]:
    """The command's own lines (transformers' weight-loading progress bar left out)."""
    return [ln for ln in output.strip().splitlines() if "%|" not in ln and ln.strip()]


@pytest.mark.parametrize("extra,match", [
    (["--model-dtype", "float17"], "float17"),
    (["--shard-mb", "nan"], "shard_mb"),
    (["--shard-mb", "inf"], "shard_mb"),
    (["--device", "cuda:99" if torch.cuda.is_available() else "cuda"], "cuda"),
    (["--device", "gpu0"], "gpu0"),
])
def test_harvest_cli_mistakes_fail_in_one_line_before_the_model_loads(model_dir, tmp_path, monkeypatch, extra, match):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(interp, "load", no_load)
    data = tmp_path / "corpus.txt"
    data.write_text("\n".join(TEXTS))
    res = _harvest_cli(model_dir, "--names", NAMES[0], "--data", data, "--out", tmp_path / "s", *extra)
    assert res.exit_code == 2, res.output
    lines = _lines(res.output)
    assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], res.output
    assert not (tmp_path / "s").exists()


def test_a_full_disk_during_a_harvest_is_one_line_and_the_store_resumes(model_dir, reference, tmp_path, monkeypatch):
    import interp.store.manifest as sm

    data = tmp_path / "corpus.txt"
    data.write_text("\n".join(TEXTS))
    out = tmp_path / "s"
    real, calls = sm.atomic_write_bytes, []

    def full_after_two(path, payload):
        calls.append(path)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, payload)

    args = [model_dir, "--names", ",".join(NAMES), "--data", data, "--out", out, "--context-size", 16,
            "--batch-size", 3, "--shard-mb", 0.05]
    with monkeypatch.context() as m:
        m.setattr(sm, "atomic_write_bytes", full_after_two)
        res = _harvest_cli(*args)
    assert res.exit_code == 1, res.output
    lines = _lines(res.output)
    assert len(lines) == 1 and lines[0].startswith(f"error: disk full at {out}") and "the store resumes" in lines[0], \
        res.output
    assert len(_manifest(out)["shards"]) == 2
    res = _harvest_cli(*args)
    assert res.exit_code == 0, res.output
    ActivationStore(out, verify=True)
