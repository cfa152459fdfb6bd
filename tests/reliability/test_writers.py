"""The writer rule (interp.io.output_dir) on every real writer: Result.save, SteeringVector.save, interp audit.

Each writer is exercised on the cases of issue #12: a re-run into its own folder keeps the user's files, a
user's file / a foreign folder / a symbolic link is refused (or, when asked, written into without deleting
anything), failures anywhere (inside the writer, in the final moves) leave the old output and no empty
parents or temporary folders, and outputs written before manifests existed are still recognised.
"""
from __future__ import annotations

import json
import os
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


# ------------------------------------------------------------------------------------- writers
@dataclass
class _Toy(Result):
    version: int
    values: torch.Tensor

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"v": self.values.tolist()})

    def figure(self):
        import plotly.graph_objects as go

        return go.Figure(go.Scatter(y=self.values.tolist()))


@dataclass
class _LenConfig:
    pass


class _LenCheck(Check):
    """A cheap audit check whose saved result (checks/len/) makes the report folder nested."""

    name = "len"
    title = "Text lengths"
    Config = _LenConfig

    def run(self, model, data):
        return _Toy(len(data.texts), torch.tensor([float(len(t)) for t in data.texts]))

    def render(self, result):
        return Rendered("<p>lengths</p>", [], [("lengths", result.to_frame())])


@dataclass
class Writer:
    name: str
    write: Callable[[Path, int, bool], object]  # (path, version, overwrite)
    read: Callable[[Path], int]  # the version found at path
    files: set[str]  # relative paths of the files it writes (besides the manifest)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 3-layer tiny Llama: ``(folder, hf_model, tokenizer)``."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    hf, tok = tiny_model("llama", folder=folder, n_layers=3)
    return folder, hf, tok


@pytest.fixture(scope="module")
def reports(tiny):
    _, hf, tok = tiny
    model = interp.wrap(hf, tok)
    return {v: run_audit(model, [_LenCheck()], AuditData([f"text number {i}" for i in range(v)])) for v in (1, 2, 3)}


def _result_writer() -> Writer:
    return Writer("Result.save",
                  lambda p, v, o: _Toy(v, torch.arange(3.0) * v).save(p, overwrite=o),
                  lambda p: _Toy.load(p).version, {"result.json", "tensors.safetensors"})


def _vector_writer() -> Writer:
    def write(p, v, o):
        vec = SteeringVector("diff_in_means", "add", ("blocks.1.hook_resid_pre",), torch.randn(8) + 1.0,
                             scale=float(v))
        return vec.save(p, overwrite=o)

    return Writer("SteeringVector.save", write, lambda p: int(SteeringVector.load(p).scale),
                  {"vector.json", "vector.safetensors"})


def _audit_writer(reports) -> Writer:
    return Writer("AuditReport.write", lambda p, v, o: reports[v].write(p, overwrite=o),
                  lambda p: json.loads((p / "results.json").read_text())["data"]["n_texts"],
                  {"index.html", "results.json", "checks/len/result.json", "checks/len/tensors.safetensors",
                   f"checks/len/{MANIFEST}"})


def _atomic_dir_writer() -> Writer:
    """Writers of the paper models (CityGraph.save, RDChain.save, ...) use the rule under its old name."""
    def write(p, v, o):
        with iio.atomic_dir(p, overwrite=o) as tmp:
            (tmp / "data.json").write_text(json.dumps({"version": v}))
        return p

    return Writer("atomic_dir", write, lambda p: json.loads((p / "data.json").read_text())["version"], {"data.json"})


@pytest.fixture(params=["result", "vector", "audit", "atomic_dir"])
def writer(request) -> Writer:
    if request.param == "atomic_dir":
        return _atomic_dir_writer()
    if request.param == "result":
        return _result_writer()
    if request.param == "vector":
        return _vector_writer()
    return _audit_writer(request.getfixturevalue("reports"))


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` (files with their bytes, folders and links as None)."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def _user_files(folder: Path) -> dict[str, bytes]:
    """A user's notes, a data folder and (for a nested output) a file inside one of the output's folders."""
    (folder / "notes.txt").write_text("my notes")
    (folder / "mydata").mkdir()
    (folder / "mydata" / "table.csv").write_text("a,b\n1,2\n")
    files = {"notes.txt": b"my notes", "mydata/table.csv": b"a,b\n1,2\n"}
    if (folder / "checks").is_dir():
        (folder / "checks" / "my-comment.md").write_text("looked fine")
        files["checks/my-comment.md"] = b"looked fine"
    return files


def _no_leftovers(folder: Path) -> None:
    hidden = [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]
    inside = [p.name for p in folder.iterdir() if p.name.startswith(".interp-") and p.name != MANIFEST] \
        if folder.is_dir() else []
    assert hidden == [] and inside == [], (hidden, inside)


# --------------------------------------------------------------------------------------- cases
def test_fresh_output_has_a_manifest_of_exactly_its_files(writer, tmp_path):
    out = tmp_path / "a" / "b" / "out"  # missing parents are created
    writer.write(out, 1, False)
    assert writer.read(out) == 1
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["schema"] == "interp.output" and set(manifest["files"]) == writer.files
    assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == writer.files | {MANIFEST}
    _no_leftovers(out)


def test_rerun_replaces_its_own_files_and_keeps_the_users(writer, tmp_path):
    out = tmp_path / "out"
    writer.write(out, 1, False)
    mine = _user_files(out)
    writer.write(out, 2, False)  # no overwrite needed: the folder is ours
    assert writer.read(out) == 2
    for rel, data in mine.items():
        assert (out / rel).read_bytes() == data, rel
    assert set(json.loads((out / MANIFEST).read_text())["files"]) == writer.files  # user files never listed
    writer.write(out, 3, True)  # overwrite=True does not delete them either
    assert writer.read(out) == 3 and all((out / r).read_bytes() == d for r, d in mine.items())
    _no_leftovers(out)


def test_a_users_file_is_never_turned_into_a_folder(writer, tmp_path):
    f = tmp_path / "results.csv"
    f.write_text("precious")
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="exists and is not a folder"):
            writer.write(f, 1, overwrite)
        assert f.read_text() == "precious" and sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_a_foreign_folder_is_refused_unless_asked_and_then_nothing_is_deleted(writer, tmp_path):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "cat.jpg").write_bytes(b"\xff\xd8cat")
    before = _tree(out)
    with pytest.raises(OutputError, match="not empty and was not written by"):
        writer.write(out, 1, False)
    assert _tree(out) == before
    writer.write(out, 1, True)
    assert writer.read(out) == 1 and (out / "cat.jpg").read_bytes() == b"\xff\xd8cat"
    writer.write(out, 2, False)  # now it is ours: a re-run needs no overwrite and keeps cat.jpg
    assert writer.read(out) == 2 and (out / "cat.jpg").read_bytes() == b"\xff\xd8cat"
    _no_leftovers(out)


def test_a_users_file_with_an_output_name_is_refused_unless_asked(writer, tmp_path):
    out = tmp_path / "out"
    writer.write(out, 1, False)
    top = sorted(n for n in writer.files if "/" not in n)[0]
    # the user replaces one of the outputs by a file of their own and deletes the manifest: nothing is ours now
    (out / MANIFEST).unlink()
    (out / top).write_text("the user's own version")
    for p in list(out.rglob("*")):  # a folder that looks like nothing interp writes
        if p.is_file() and p.name not in (top,):
            p.unlink()
    with pytest.raises(OutputError, match="not empty and was not written by"):
        writer.write(out, 2, False)
    assert (out / top).read_text() == "the user's own version"
    writer.write(out, 2, True)  # asked: same-named files are replaced, nothing else removed
    assert writer.read(out) == 2


def test_symlinks_are_refused_or_written_through_when_asked(writer, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(OutputError, match="symbolic link"):
        writer.write(link, 1, False)
    assert link.is_symlink() and os.readlink(link) == str(target) and _tree(target) == {"keep.txt": b"keep"}
    writer.write(link, 1, True)  # asked: written into the target, the link stays a link
    assert link.is_symlink() and writer.read(target) == 1 and (target / "keep.txt").read_text() == "keep"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputError, match="symbolic link"):
        writer.write(dangling, 1, False)
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()


def test_a_failed_write_leaves_no_parents_and_the_old_output_intact(writer, tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    # 1. a new output under missing parents: the failure leaves no empty folders
    with monkeypatch.context() as m:
        m.setattr(iio, "atomic_write_json", disk_full)  # the manifest: the very last step
        with pytest.raises(OSError, match="No space left"):
            writer.write(tmp_path / "p1" / "p2" / "out", 1, False)
    assert list(tmp_path.iterdir()) == []
    # 2. a re-run into an existing output that fails after every file has been moved in: rolled back
    out = tmp_path / "out"
    writer.write(out, 1, False)
    _user_files(out)
    before = _tree(out)
    with monkeypatch.context() as m:
        m.setattr(iio, "atomic_write_json", disk_full)
        with pytest.raises(OSError, match="No space left"):
            writer.write(out, 2, False)
    assert _tree(out) == before and writer.read(out) == 1
    _no_leftovers(out)
    # 3. a failure half-way through the moves (the third rename): rolled back as well
    real_replace, calls = os.replace, []

    def flaky_replace(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(iio.os, "replace", flaky_replace)
        with pytest.raises(OSError, match="Input/output error"):
            writer.write(out, 2, False)
    assert _tree(out) == before and writer.read(out) == 1
    _no_leftovers(out)
    writer.write(out, 2, False)
    assert writer.read(out) == 2


def test_outputs_written_before_manifests_are_recognised(writer, tmp_path):
    out = tmp_path / "old"
    writer.write(out, 1, False)
    for p in out.rglob(MANIFEST):  # as written by the previous version of the toolkit
        p.unlink()
    (out / "notes.txt").write_text("mine")
    if writer.name == "atomic_dir":  # no recogniser given: such a folder is foreign, refused, untouched
        with pytest.raises(OutputError, match="not empty and was not written by"):
            writer.write(out, 2, False)
        assert writer.read(out) == 1 and (out / "notes.txt").read_text() == "mine"
        return
    writer.write(out, 2, False)
    assert writer.read(out) == 2 and (out / "notes.txt").read_text() == "mine"


def test_replace_dir_is_only_for_folders_owned_entirely(tmp_path):
    """The zoo cache's whole-folder swap refuses files and symbolic links as well."""
    f = tmp_path / "file"
    f.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    for bad, why in ((f, "not a folder"), (link, "symbolic link")):
        with pytest.raises(OutputError, match=why):
            with iio.replace_dir(bad):
                pass
    assert f.read_text() == "x" and link.is_symlink()
    with pytest.raises(RuntimeError):
        with iio.replace_dir(tmp_path / "p" / "q" / "cache"):
            raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "link"]


def test_leftovers_of_a_killed_run_are_cleaned_and_bad_paths_rejected(tmp_path):
    out = tmp_path / "out"
    _Toy(1, torch.zeros(2)).save(out)
    (out / ".interp-new-abc123").mkdir()  # what a kill -9 between the moves leaves inside
    (out / ".interp-new-abc123" / "result.json").write_text("{}")
    _Toy(2, torch.zeros(2)).save(out)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "result.json", "tensors.safetensors"]
    with pytest.raises(OutputError, match="non-empty path"):
        _Toy(1, torch.zeros(2)).save("")
    with pytest.raises(OutputError, match="reserved"):
        with iio.output_dir(tmp_path / "x") as tmp:
            (tmp / MANIFEST).write_text("{}")
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------ the audit CLI
@pytest.fixture(scope="module")
def model_dir(tiny):
    return tiny[0]


def _audit(*args):
    from interp.apps.audit import register_check, unregister_check

    register_check(_LenCheck)
    try:
        return CliRunner().invoke(app, ["audit", *map(str, args)])
    finally:
        unregister_check("len")


def test_cli_rerun_keeps_notes_and_mydata_and_force_is_needed_for_foreign_folders(model_dir, tmp_path):
    out = tmp_path / "report"
    res = _audit(model_dir, "--checks", "len", "--max-texts", 3, "--out", out)
    assert res.exit_code == 0, res.output
    mine = _user_files(out)
    res = _audit(model_dir, "--checks", "len", "--max-texts", 5, "--out", out)
    assert res.exit_code == 0, res.output
    assert json.loads((out / "results.json").read_text())["data"]["n_texts"] == 5
    assert all((out / r).read_bytes() == d for r, d in mine.items())
    # a foreign folder: refused before the model is loaded, accepted with --force, nothing of it removed
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "index.html").write_text("my homepage")
    (foreign / "cv.pdf").write_text("pdf")
    res = _audit(model_dir, "--checks", "len", "--out", foreign)
    assert res.exit_code == 2 and "--force" in res.output and "loading" not in res.output
    assert (foreign / "index.html").read_text() == "my homepage"
    res = _audit(model_dir, "--checks", "len", "--max-texts", 2, "--out", foreign, "--force")
    assert res.exit_code == 0, res.output
    assert (foreign / "cv.pdf").read_text() == "pdf" and "my homepage" not in (foreign / "index.html").read_text()
    # a file and a symbolic link as --out
    f = tmp_path / "results.csv"
    f.write_text("precious")
    res = _audit(model_dir, "--checks", "len", "--out", f, "--force")
    assert res.exit_code == 2 and "not a folder" in res.output and f.read_text() == "precious"
    link = tmp_path / "link"
    link.symlink_to(out, target_is_directory=True)
    res = _audit(model_dir, "--checks", "len", "--out", link)
    assert res.exit_code == 2 and "symbolic link" in res.output and link.is_symlink()
    # a bad model after a good output check: no empty parent folders are left behind
    res = _audit(tmp_path / "no-model", "--checks", "len", "--out", tmp_path / "new" / "deep" / "report")
    assert res.exit_code == 2 and not (tmp_path / "new").exists()


def test_activation_store_refuses_links_files_and_foreign_folders(tiny, tmp_path):
    """interp.store.harvest writes incrementally (resumable shards) into its own store folder."""
    from interp.store import StoreError, harvest

    _, hf, tok = tiny
    model = interp.wrap(hf, tok)
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    f = tmp_path / "results.csv"
    f.write_text("precious")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for out, why in ((link, "symbolic link"), (f, "not an activation store"), (foreign, "not an activation store")):
        with pytest.raises(StoreError, match=why):
            harvest(model, ["some text " * 20], "blocks.0.hook_resid_post", out, context_size=8)
    assert link.is_symlink() and list(target.iterdir()) == [] and f.read_text() == "precious"
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_a_file_where_a_folder_goes_and_a_folder_where_a_file_goes_are_refused_even_when_asked(reports, tmp_path):
    from interp.apps.audit.report import prepare_output

    out = tmp_path / "mixed"
    out.mkdir()
    (out / "checks").write_text("a file of mine called checks")
    for overwrite in (False, True):
        with pytest.raises(OutputError):
            reports[1].write(out, overwrite=overwrite)
    with pytest.raises(OutputError, match="checks \\(a file where a folder is needed\\)"):
        prepare_output(out, overwrite=True)  # the CLI's early check says so before any work
    (out / "checks").unlink()
    (out / "index.html").mkdir()
    (out / "index.html" / "page.txt").write_text("mine")
    with pytest.raises(OutputError, match="index.html \\(a folder where a file is needed\\)"):
        reports[1].write(out, overwrite=True)
    assert _tree(out) == {"index.html": None, "index.html/page.txt": b"mine"}


def test_outputs_get_the_usual_permissions(writer, tmp_path):
    """Temporary folders and files are private (0700/0600); the outputs made from them must not be."""
    mask = iio._umask()
    out = tmp_path / "out"
    writer.write(out, 1, False)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask
    assert (out / MANIFEST).stat().st_mode & 0o777 == 0o666 & ~mask


def test_an_output_that_appears_during_the_write_is_not_replaced(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OutputError, match="appeared while this output was being written"):
        with iio.output_dir(out) as tmp:
            (tmp / "a.txt").write_text("ours")
            out.mkdir()  # another program (or writer) creates the folder meanwhile ...
            (out / "theirs.txt").write_text("theirs")
    assert _tree(out) == {"theirs.txt": b"theirs"} and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


_KILL_SCRIPT = r"""
import sys, torch
from dataclasses import dataclass
from pathlib import Path
from interp.results import Result

@dataclass
class Toy(Result):
    version: int
    values: torch.Tensor

out, ready = Path(sys.argv[1]), Path(sys.argv[2])
v = 0
while True:
    v += 1
    Toy(v, torch.arange(200_000.0) * v).save(out)
    ready.touch()
"""


def _kill_rounds(tmp_path: Path, rounds: int) -> dict[str, int]:
    import random
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file

    out = tmp_path / "out"
    _Toy(0, torch.arange(200_000.0) * 0).save(out)
    mine = _user_files(out)
    script = tmp_path / "writer.py"
    script.write_text(_KILL_SCRIPT)
    rng = random.Random(0)
    seen = {"complete": 0, "incomplete": 0}
    for _ in range(rounds):
        ready = tmp_path / "ready"
        ready.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, str(script), str(out), str(ready)])
        deadline = time.time() + 120
        while not ready.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), "the writer did not start"
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert all((out / r).read_bytes() == d for r, d in mine.items())  # the user's files, always
        try:  # what is there is a complete output or an incomplete one, never a wrong one
            meta = json.loads((out / "result.json").read_text())
            v = meta["fields"]["version"]
            values = load_file(str(out / "tensors.safetensors"))["values"]
        except (FileNotFoundError, KeyError, ValueError):
            seen["incomplete"] += 1
        else:
            assert torch.equal(values, torch.arange(200_000.0) * v)
            seen["complete"] += 1
    _Toy(-1, torch.arange(200_000.0) * -1).save(out)  # the next write repairs and cleans up
    assert _Toy.load(out).version == -1 and all((out / r).read_bytes() == d for r, d in mine.items())
    _no_leftovers(out)
    return seen


@pytest.mark.slow
def test_kill_9_during_rewrites_never_costs_user_files(tmp_path):
    seen = _kill_rounds(tmp_path, rounds=25)
    print(seen)
    assert seen["complete"] > 0


_KILL_AT_SCRIPT = r"""
import os, signal, sys, torch
from dataclasses import dataclass
from pathlib import Path
import interp.io as iio
from interp.results import Result

@dataclass
class Toy(Result):
    version: int
    values: torch.Tensor

out, at = Path(sys.argv[1]), int(sys.argv[2])
real, calls = os.replace, []

def replace(src, dst):
    calls.append(dst)
    if len(calls) == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst)

iio.os.replace = replace
Toy(2, torch.arange(1000.0) * 2).save(out)
"""


def _kill_during_commit(tmp_path: Path, at: int) -> str:
    """Re-save into an output with user files, killed (SIGKILL) at the ``at``-th rename of the commit."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    out = tmp_path / f"out{at}"
    _Toy(1, torch.arange(1000.0)).save(out)
    mine = _user_files(out)
    script = tmp_path / "kill_at.py"
    script.write_text(_KILL_AT_SCRIPT)
    rc = subprocess.run([sys.executable, str(script), str(out), str(at)]).returncode
    assert rc == -9  # it was killed at that rename
    assert all((out / r).read_bytes() == d for r, d in mine.items())
    try:
        v = json.loads((out / "result.json").read_text())["fields"]["version"]
        values = load_file(str(out / "tensors.safetensors"))["values"]
    except (FileNotFoundError, KeyError, ValueError):
        state = "incomplete"
    else:
        assert torch.equal(values, torch.arange(1000.0) * v)  # never old JSON with new tensors or vice versa
        state = f"complete v{v}"
    _Toy(3, torch.arange(1000.0) * 3).save(out)  # the next write repairs it and removes the leftovers
    assert _Toy.load(out).version == 3 and all((out / r).read_bytes() == d for r, d in mine.items())
    _no_leftovers(out)
    return state


def test_kill_9_between_the_renames_of_a_rewrite(tmp_path):
    assert _kill_during_commit(tmp_path, 4) == "incomplete"  # new result.json in, new tensors not yet


@pytest.mark.slow
def test_kill_9_at_every_rename_of_a_rewrite(tmp_path):
    # killed before rename 1 (old result.json aside), 2 (old tensors aside), 3 and 4 (new ones in), 5 (manifest)
    states = [_kill_during_commit(tmp_path, at) for at in range(1, 6)]
    assert states == ["complete v1", "incomplete", "incomplete", "incomplete", "complete v2"], states


def test_result_check_save_refuses_before_any_work(tmp_path):
    f = tmp_path / "results.csv"
    f.write_text("x")
    with pytest.raises(OutputError, match="not a folder"):
        Result.check_save(f)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "a.txt").write_text("a")
    with pytest.raises(OutputError, match="not empty"):
        _Toy.check_save(foreign)
    assert _Toy.check_save(foreign, overwrite=True) == foreign
    _Toy(1, torch.zeros(1)).save(tmp_path / "mine")
    assert _Toy.check_save(tmp_path / "mine") == tmp_path / "mine" and not (tmp_path / "new").exists()
    _Toy.check_save(tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists()  # checking creates nothing
