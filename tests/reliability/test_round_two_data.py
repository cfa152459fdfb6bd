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
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from typer.testing import CliRunner

import interp
from interp import io as iio
from interp.audit import AuditData, Check, Rendered, run_audit
from interp.cli import app
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
        from interp.audit.report import prepare_output

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
