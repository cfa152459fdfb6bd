"""Issue #43 (round three), the data side: each class of failure found, with a test that fails on the code
before the fix.

* GAVEL's parser checks membership with sets: the comparisons it makes grow linearly with the CEs of a
  group (counted, never timed), and its errors and the written order are unchanged.
* The small-LM trainer's checkpoint loader (:mod:`interp.training`): every way a checkpoint can be unreadable
  is a ``SerializationError`` (a pickle payload in ``optimizer.pt`` included, which never runs).
* ``Result.load`` holds each tensor to the dtype and shape ``result.json`` recorded; an unknown zoo entry is
  an ``error:`` line with exit code 2.
* The activation store: any OS error while writing (``EFBIG``, ``EIO`` ...) is one line and the store
  resumes, on the local and the Ray engine; resuming with another backend compares weights, not the
  ``family`` spelling; the paper-model writers save under their own names.
* ``probes.heads`` takes negative head indices as the interventions do.
"""
from __future__ import annotations

import errno
import io
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import interp
from interp.apps.cli import app
from interp.io import MANIFEST, OutputError, SerializationError
from interp.testing import tiny_model


# ============================================================================ 4. GAVEL parser
class _Counted(str):
    """A CE name that counts the comparisons and hashes made with it: a list search compares with every
    element, ``list.count`` too, and a set built anew for each lookup hashes every element again; a set
    lookup hashes once and, for distinct names, compares nothing."""

    calls = 0

    def __eq__(self, other: object) -> bool:
        _Counted.calls += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        _Counted.calls += 1
        return str.__ne__(self, other)

    def __hash__(self) -> int:
        _Counted.calls += 1
        return str.__hash__(self)


def _counted(names):
    return [_Counted(n) for n in names]


@pytest.fixture
def counted_tokens(monkeypatch):
    """The parser's lexer, with every name token a :class:`_Counted`."""
    from probes.gavel import rules

    real = rules._lex

    def lex(text):
        return [rules._Tok(t.kind, _Counted(t.value) if t.kind == "NAME" else t.value, t.line, t.col)
                for t in real(text)]

    monkeypatch.setattr(rules, "_lex", lex)
    return rules


def _comparisons(run) -> int:
    _Counted.calls = 0
    run()
    return _Counted.calls


def test_gavel_parsing_makes_linearly_many_comparisons_in_the_ces_of_a_group(counted_tokens):
    """4k / 8k / 16k / 32k CEs in one group took 0.38 / 1.05 / 4.16 / 11.7 s (a list search per CE): the
    comparisons (and hashes) are counted here, for a group written inline, a named group, supporting CEs against the CE
    library, the JSON form and the rule names of a rule file. Before the fix the inline group of 2,000 CEs
    made about 2,000,000 comparisons."""
    from probes.gavel.rules import load_rules, parse_rule, rule_from_json

    def cases(n: int) -> dict:
        ces = [f"ce_{i}" for i in range(n)]
        inline = "1 of {" + ", ".join(ces) + "}"
        return {
            "inline group": lambda: parse_rule(inline),
            "inline group, known CEs": lambda: parse_rule(inline, known_ces=_counted(ces)),
            "named group": lambda: parse_rule("all of g", groups={"g": _counted(ces)}),
            "supporting": lambda: parse_rule("1 of {ce_0}", known_ces=_counted(ces), supporting=_counted(ces)),
            "JSON any_of": lambda: rule_from_json({"any_of": [_counted(ces)]}),
            "rule names": lambda: load_rules([{"name": _Counted(f"r{i}"), "condition": "1 of {a}"} for i in range(n)]),
        }

    small, large = cases(1000), cases(2000)
    for what in small:
        a, b = _comparisons(small[what]), _comparisons(large[what])
        assert b <= 12 * 2000, f"{what}: {b} comparisons and hashes for 2,000 CEs (quadratic)"
        assert b <= 2.2 * a + 50, f"{what}: {a} comparisons for 1,000 CEs, {b} for 2,000"


def test_gavel_errors_and_order_are_those_of_the_list_search():
    from probes.gavel.rules import RuleSyntaxError, load_rules, parse_rule

    ces = [f"c{i}" for i in range(500)]
    rule = parse_rule("2 of {" + ", ".join(reversed(ces)) + "}")
    assert rule.condition.ces == tuple(reversed(ces)) and rule.condition_ces == tuple(reversed(ces))
    text = "1 of {a, b,\n c, b}"
    with pytest.raises(RuleSyntaxError) as e:
        parse_rule(text)
    assert str(e.value) == ("line 2, column 5: CE 'b' is listed twice in this group; list each CE once (the official "
                            "matcher would count a repeated CE twice, so '2 of {a, a, b}' would fire on a alone)"
                            "\n   c, b}\n      ^")
    with pytest.raises(RuleSyntaxError, match=r"group 'g' lists a, c more than once; list each CE once"):
        parse_rule("all of g", groups={"g": ["c", "a", "b", "a", "c", "c"]})
    with pytest.raises(ValueError, match=r"rule 'rule': unknown supporting CE\(s\) y, x$"):
        parse_rule("1 of {a}", known_ces=["a", "b"], supporting=["y", "a", "x"])
    with pytest.raises(RuleSyntaxError, match=r"duplicate rule name\(s\): r1, r2$"):
        load_rules([{"name": n, "condition": "1 of {a}"} for n in ("r2", "r1", "r2", "r0", "r1")])


# ============================================================ 5. the trainer's checkpoints
_VOCAB = 10


def _tiny_lm(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=_VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def _batches(seed: int = 0):
    rng = random.Random(seed)
    while True:
        yield torch.tensor([[rng.randrange(4, _VOCAB) for _ in range(8)] for _ in range(2)])


class _Payload:
    """A pickle that would run a shell command when unpickled without ``weights_only``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of ``train_lm`` after 3 of 6 steps."""
    from interp.training import LMTrainConfig, train_lm

    class Stop(Exception):
        pass

    def stop(step, loss):
        if step == 3:
            raise Stop

    folder = tmp_path_factory.mktemp("train") / "ckpt"
    with pytest.raises(Stop):
        train_lm(_tiny_lm(), _batches(), LMTrainConfig(steps=6, lr=1e-2), checkpoint=folder, every=3, on_step=stop)
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors", "optimizer.pt", "train_state.json"]
    return folder


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _damages(marker: Path) -> dict:
    """``{what: (file, new bytes or None to delete)}``: every way the three files can be unreadable."""
    payload = _torch_bytes({"optimizer": _Payload(marker), "scheduler": {}})
    raw_pickle = pickle.dumps({"optimizer": _Payload(marker), "scheduler": {}}, protocol=2)
    return {
        "pickle payload in optimizer.pt (torch archive)": ("optimizer.pt", payload),
        "pickle payload in optimizer.pt (bare pickle)": ("optimizer.pt", raw_pickle),
        "empty optimizer.pt": ("optimizer.pt", b""),
        "truncated optimizer.pt": ("optimizer.pt", "half"),
        "garbage optimizer.pt": ("optimizer.pt", b"\x00not a torch file" * 10),
        "optimizer.pt holding a list": ("optimizer.pt", _torch_bytes([1, 2])),
        "optimizer.pt without the scheduler": ("optimizer.pt", _torch_bytes({"optimizer": {}})),
        "optimizer.pt with a malformed state": ("optimizer.pt", _torch_bytes({"optimizer": {"state": 3},
                                                                             "scheduler": {}})),
        "missing optimizer.pt": ("optimizer.pt", None),
        "empty model.safetensors": ("model.safetensors", b""),
        "truncated model.safetensors": ("model.safetensors", "half"),
        "model.safetensors of another model": ("model.safetensors", "other"),
        "missing model.safetensors": ("model.safetensors", None),
        "train_state.json not JSON": ("train_state.json", b"{not json"),
        "train_state.json a list": ("train_state.json", b"[3, []]"),
        "train_state.json not UTF-8": ("train_state.json", b"\xff\xfe{"),
        "step a string": ("train_state.json", b'{"step": "3", "losses": [1, 2, 3]}'),
        "step infinite": ("train_state.json", b'{"step": Infinity, "losses": [1, 2, 3]}'),
        "step 1e400": ("train_state.json", b'{"step": 1e400, "losses": [1, 2, 3]}'),
        "step true": ("train_state.json", b'{"step": true, "losses": [1.0]}'),
        "losses a string": ("train_state.json", b'{"step": 3, "losses": "123"}'),
        "losses of dicts": ("train_state.json", b'{"step": 1, "losses": [{}]}'),
        "losses disagree with step": ("train_state.json", b'{"step": 3, "losses": [1.0]}'),
        "no step": ("train_state.json", b'{"losses": [1.0]}'),
        "deep JSON": ("train_state.json", b"[" * 200_000 + b"]" * 200_000),
    }


@pytest.mark.parametrize("what", list(_damages(Path("x"))))
def test_every_unreadable_training_checkpoint_is_a_serialization_error(checkpoint, tmp_path, what):
    """``UnpicklingError`` (the refusal of a pickle payload by ``torch.load(weights_only=True)``), ``EOFError``,
    ``OverflowError``, safetensors' own error ... all escaped as themselves before; now each is a
    ``SerializationError`` that names the folder and says to delete it, and the payload never runs."""
    from interp.training import LMTrainConfig, train_lm

    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    marker = tmp_path / "pwned"
    name, data = _damages(marker)[what]
    target = folder / name
    if data is None:
        target.unlink()
    elif data == "half":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif data == "other":
        from safetensors.torch import save_file

        save_file({"lm_head.weight": torch.zeros(3, 3)}, str(target))
    else:
        target.write_bytes(data)
    with pytest.raises(SerializationError, match="delete it to start over") as e:
        train_lm(_tiny_lm(), _batches(), LMTrainConfig(steps=6, lr=1e-2), checkpoint=folder, every=3)
    assert str(folder) in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


def test_an_intact_training_checkpoint_still_resumes(checkpoint, tmp_path):
    from interp.training import LMTrainConfig, train_lm

    cfg = LMTrainConfig(steps=6, lr=1e-2)
    full = train_lm(_tiny_lm(), _batches(), cfg)
    shutil.copytree(checkpoint, tmp_path / "ckpt")
    assert train_lm(_tiny_lm(seed=1), _batches(), cfg, checkpoint=tmp_path / "ckpt", every=3) == full


def test_load_torch_refuses_what_weights_only_refuses(tmp_path):
    from interp.io import MissingFileError, load_torch

    (tmp_path / "ok.pt").write_bytes(_torch_bytes({"a": torch.ones(2), "b": [1, "x"]}))
    assert torch.equal(load_torch(tmp_path / "ok.pt")["a"], torch.ones(2))
    marker = tmp_path / "pwned"
    (tmp_path / "evil.pt").write_bytes(_torch_bytes(_Payload(marker)))
    with pytest.raises(SerializationError, match=r"evil\.pt: not a readable torch file .*UnpicklingError"):
        load_torch(tmp_path / "evil.pt", what="optimizer state")
    assert not marker.exists()
    with pytest.raises(MissingFileError, match="missing"):
        load_torch(tmp_path / "nothing.pt")


# ========================================================= 6. Result.load, zoo entry errors
@pytest.fixture(scope="module")
def result_type():
    from dataclasses import dataclass

    import numpy as np

    from interp.results import Result

    @dataclass
    class _Saved(Result):
        values: torch.Tensor
        table: np.ndarray
        nested: dict

    return _Saved


def _replace_tensor(folder: Path, key: str, tensor: torch.Tensor) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "tensors.safetensors"))
    tensors[key] = tensor
    save_file(tensors, str(folder / "tensors.safetensors"))


@pytest.mark.parametrize("key,tensor,match", [
    ("values", torch.zeros(2, 3, dtype=torch.int8), "'values' has dtype int8, but result.json records 'float32'"),
    ("values", torch.zeros(2, 3, dtype=torch.float64), "'values' has dtype float64, but result.json records 'float32'"),
    ("values", torch.zeros(3, 2), r"'values' has shape \[3, 2\], but result.json records \[2, 3\]"),
    ("values", torch.zeros(6), r"'values' has shape \[6\]"),
    ("table", torch.zeros(4, dtype=torch.float32), "'table' has dtype float32, but result.json records 'float64'"),
    ("nested.w", torch.zeros(1, dtype=torch.bool), "'nested.w' has dtype bool, but result.json records 'int64'"),
])
def test_result_load_refuses_a_tensor_unlike_the_saved_one(result_type, tmp_path, key, tensor, match):
    import numpy as np

    saved = result_type(torch.randn(2, 3), np.arange(4, dtype=np.float64), {"w": torch.tensor([7])})
    saved.save(tmp_path / "r")
    back = result_type.load(tmp_path / "r")  # the intact result reads as written
    assert torch.equal(back.values, saved.values) and back.table.dtype == np.float64
    _replace_tensor(tmp_path / "r", key, tensor)
    with pytest.raises(SerializationError, match=match) as e:
        result_type.load(tmp_path / "r")
    assert str(tmp_path / "r" / "tensors.safetensors") in str(e.value)


def test_results_saved_before_dtypes_were_recorded_still_load(result_type, tmp_path):
    import numpy as np

    result_type(torch.randn(2, 3), np.arange(4.0), {"w": torch.tensor([7])}).save(tmp_path / "r")
    meta = json.loads((tmp_path / "r" / "result.json").read_text())
    for ref in (meta["fields"]["values"], meta["fields"]["table"], meta["fields"]["nested"]["__dict__"]["w"]):
        assert set(ref) == {"__tensor__", "numpy", "dtype", "shape"}
        del ref["dtype"], ref["shape"]
    (tmp_path / "r" / "result.json").write_text(json.dumps(meta))
    _replace_tensor(tmp_path / "r", "values", torch.zeros(2, 3, dtype=torch.int8))
    assert result_type.load(tmp_path / "r").values.dtype == torch.int8  # nothing recorded, nothing to check
    meta["fields"]["values"]["__tensor__"] = ["values"]
    (tmp_path / "r" / "result.json").write_text(json.dumps(meta))
    with pytest.raises(SerializationError, match="must name a tensor"):
        result_type.load(tmp_path / "r")


@pytest.mark.parametrize("args", [["zoo", "build", "no-such-model"], ["zoo", "info", "no-such-model"],
                                  ["zoo", "verify", "no-such-model"], ["zoo", "build", "zoo:no-such-model"],
                                  ["hooks", "zoo:no-such-model"], ["demo", "zoo:no-such-model"]])
def test_an_unknown_zoo_entry_is_an_error_line_with_exit_code_2(tmp_zoo_dir, args):
    res = CliRunner().invoke(app, args)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: unknown zoo entry 'no-such-model'; available: "), res.output


@pytest.fixture
def tmp_zoo_dir(tmp_path, monkeypatch):
    from interp.zoo import registry

    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


# ============================================================================ 7. the store
NAMES = ["blocks.0.hook_resid_post", "blocks.1.hook_mlp_out"]
KW = dict(context_size=16, batch_size=3, shard_mb=0.05)  # 6 contexts (24 KiB) per shard
_WORDS = "the quick brown fox jumps over a lazy dog while seven owls count silver stars".split()
TEXTS = [f"doc {i}: " + " ".join(_WORDS[(i * 7 + j) % len(_WORDS)] for j in range(4 + (i * 11) % 25))
         for i in range(30)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    f.write_text("\n".join(TEXTS))
    return f


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _interrupted(out: Path, keep: int) -> None:
    """What a harvest killed after ``keep`` shards leaves: later shards neither listed nor on disk."""
    man = _manifest(out)
    for key in [k for k in man["shards"] if int(k) >= keep]:
        (out / man["shards"].pop(key)["file"]).unlink()
    man.update(complete=False)
    for k in ("n_shards", "n_contexts", "n_tokens", "n_documents"):
        man.pop(k, None)
    (out / "manifest.json").write_text(json.dumps(man))


def _harvest_args(model_dir: Path, corpus: Path, out: Path) -> list[str]:
    return [str(model_dir), "--names", ",".join(NAMES), "--data", str(corpus), "--out", str(out),
            "--context-size", "16", "--batch-size", "3", "--shard-mb", "0.05"]


def _lines(output: str) -> list[str]:
    """The command's own lines (transformers' weight-loading progress bar left out)."""
    return [ln for ln in output.strip().splitlines() if "%|" not in ln and ln.strip()]


@pytest.mark.parametrize("code,expect", [
    (errno.EFBIG, "error: file too large at {out} (EFBIG: a file-size limit such as 'ulimit -f'"),
    (errno.EIO, "error: cannot write the store at {out}: Input/output error [EIO] ({out}/shard_000002.safetensors)"),
    (errno.EROFS, "error: cannot write the store at {out}: Read-only file system [EROFS]"),
    (errno.ENOSPC, "error: disk full at {out}; the store resumes"),
])
def test_any_os_error_while_writing_a_harvest_is_one_line_and_the_store_resumes(model_dir, corpus, tmp_path,
                                                                               monkeypatch, code, expect):
    """Before: only ENOSPC and EDQUOT were one line; EFBIG (``ulimit -f``) gave a 51-line traceback."""
    import interp.store.manifest as sm
    from interp.store import ActivationStore

    out = tmp_path / "s"
    real, calls = sm.atomic_write_bytes, []

    def fail_after_two(path, payload):
        calls.append(path)
        if len(calls) > 2:
            raise OSError(code, os.strerror(code))  # no file name: the store names the file it was writing
        return real(path, payload)

    with monkeypatch.context() as m:
        m.setattr(sm, "atomic_write_bytes", fail_after_two)
        res = CliRunner().invoke(app, ["harvest", *_harvest_args(model_dir, corpus, out)])
    lines = _lines(res.output)
    assert res.exit_code == 1 and len(lines) == 1, res.output
    assert lines[0].startswith(expect.format(out=out)) and lines[0].endswith("and rerun the same command"), lines[0]
    assert len(_manifest(out)["shards"]) == 2
    res = CliRunner().invoke(app, ["harvest", *_harvest_args(model_dir, corpus, out)])
    assert res.exit_code == 0, res.output
    ActivationStore(out, verify=True)


def test_store_write_errors_keep_errno_and_name_the_file(tmp_path, monkeypatch):
    import interp.store.manifest as sm
    from interp.store.manifest import StoreWriteError, write_manifest

    def fail(path, payload):
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(sm, "atomic_write_json", fail)
    with pytest.raises(StoreWriteError) as e:
        write_manifest(tmp_path, {"a": 1})
    assert e.value.errno == errno.EFBIG and e.value.filename == str(tmp_path / "manifest.json")
    assert isinstance(e.value.__cause__, OSError)


@pytest.mark.slow
def test_a_file_size_limit_during_a_harvest_is_one_line_and_the_store_resumes(model_dir, corpus, tmp_path):
    """The real thing: ``interp harvest`` under ``ulimit -f`` smaller than a shard (EFBIG on the first shard;
    Python ignores SIGXFSZ), then without the limit (``-m slow``: two fresh interpreters)."""
    import resource

    from interp.store import ActivationStore

    out = tmp_path / "s"
    cmd = [sys.executable, "-c", "from interp.apps.cli import main; main()", "harvest",
           *_harvest_args(model_dir, corpus, out)]

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, resource.RLIM_INFINITY))

    env = {**os.environ, "INTERP_PROGRESS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, env=env, timeout=600)
    lines = _lines(res.stderr)
    assert res.returncode == 1, res.stderr
    assert lines[-1].startswith(f"error: file too large at {out} (EFBIG"), res.stderr
    assert "Traceback" not in res.stderr
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    ActivationStore(out, verify=True)


class _Ref:
    """An object reference of :class:`_FakeRay`: the task's value or its wrapped exception."""

    value = None
    error = None


class _FakeRay:
    """Ray's driver-side calls, run in this process; a task's exception reaches ``get`` wrapped as Ray wraps
    it (``RayTaskError(OSError)``, whose ``errno`` is ``None``)."""

    def __init__(self) -> None:
        import ray.exceptions

        self.exceptions = ray.exceptions

    def remote(self, **_options):
        fake = self

        class Handle:
            def __init__(self, cls, args):
                self.obj = cls(*args)
                self.run = self

            def remote(self, *args):
                ref = _Ref()
                try:
                    ref.value = self.obj.run(*args)
                except Exception as exc:  # noqa: BLE001 - handed to get(), as Ray does
                    ref.error = fake.exceptions.RayTaskError("run", "traceback", exc).as_instanceof_cause()
                return ref

        def decorate(cls):
            class Actor:
                @staticmethod
                def remote(*args):
                    return Handle(cls, args)
            return Actor

        return decorate

    def wait(self, refs, num_returns=1):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if ref.error is not None:
            raise ref.error
        return ref.value

    def cancel(self, *_a, **_k) -> None:
        pass

    def kill(self, *_a) -> None:
        pass


def test_a_write_error_on_a_ray_worker_keeps_its_errno(model_dir, corpus, tmp_path, monkeypatch):
    """A full disk on a Ray worker reached the driver as ``RayTaskError(OSError)`` with ``errno`` None: a
    traceback instead of the one line. The driver now raises the worker's own error."""
    pytest.importorskip("ray.exceptions")
    import interp.store.manifest as sm
    import interp.apps.ray_engine as re_
    from interp.store import ActivationStore

    wrapped = _FakeRay().exceptions.RayTaskError("run", "tb", OSError(errno.ENOSPC, "x")).as_instanceof_cause()
    assert isinstance(wrapped, OSError) and wrapped.errno is None  # what the driver used to see
    out = tmp_path / "s"
    real, calls = sm.atomic_write_bytes, []

    def full_after_two(path, payload):
        calls.append(path)
        if len(calls) > 2 and Path(path).name.startswith("shard_"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, payload)

    monkeypatch.setattr(re_, "ensure_ray", _FakeRay)
    with monkeypatch.context() as m:
        m.setattr(sm, "atomic_write_bytes", full_after_two)
        res = CliRunner().invoke(app, ["harvest", *_harvest_args(model_dir, corpus, out), "--engine", "ray",
                                       "--workers", "1"])
    lines = _lines(res.output)
    assert res.exit_code == 1 and len(lines) == 1, res.output
    assert lines[0].startswith(f"error: disk full at {out}; the store resumes"), res.output
    res = CliRunner().invoke(app, ["harvest", *_harvest_args(model_dir, corpus, out), "--engine", "ray",
                                   "--workers", "1"])
    assert res.exit_code == 0, res.output
    ActivationStore(out, verify=True)


def test_resuming_with_another_backend_compares_weights_not_the_family_spelling(model_dir, perturbed_dir,
                                                                                tmp_path):
    """A torch-backend store resumed with the transformer_lens backend was refused ("the model changed"): its
    ``family`` is ``'llama'`` there and ``'LlamaForCausalLM'`` here, and TransformerLens's bridge adds a zero
    bias to the unembedding. The same weights now resume; other weights are still refused."""
    from interp.store import ActivationStore, harvest
    from interp.store.manifest import IncompatibleStoreError

    out = tmp_path / "s"
    harvest(str(model_dir), TEXTS, NAMES, out, backend="torch", **KW)
    assert _manifest(out)["identity"]["model"]["family"] == "llama"
    _interrupted(out, keep=2)
    perturbed = perturbed_dir
    with pytest.raises(IncompatibleStoreError, match="weights' fingerprint.*backend 'torch'.*'transformer_lens'"):
        harvest(str(perturbed), TEXTS, NAMES, out, backend="transformer_lens", **KW)
    assert len(_manifest(out)["shards"]) == 2
    res = harvest(str(model_dir), TEXTS, NAMES, out, backend="transformer_lens", **KW)
    assert res.shards_skipped == 2 and res.shards_written >= 2
    ActivationStore(out, verify=True)
    assert _manifest(out)["identity"]["model"]["family"] == "llama"  # the store's record is kept


def test_a_store_fingerprinted_by_the_earlier_scheme_still_resumes(model_dir, perturbed_dir, tmp_path):
    """Stores written before the backend-independent scheme recorded every parameter (zero biases too) and no
    ``weights_scheme``: they are compared by their own scheme."""
    from interp.store import harvest, weights_fingerprint
    from interp.store.manifest import IncompatibleStoreError

    out = tmp_path / "s"
    harvest(str(model_dir), TEXTS, NAMES, out, **KW)
    _interrupted(out, keep=2)
    man = _manifest(out)
    assert man["identity"]["weights_scheme"] == 2
    del man["identity"]["weights_scheme"]
    man["identity"]["weights"] = weights_fingerprint(interp.load(str(model_dir)))
    (out / "manifest.json").write_text(json.dumps(man))
    perturbed = perturbed_dir
    with pytest.raises(IncompatibleStoreError, match="weights"):
        harvest(str(perturbed), TEXTS, NAMES, out, **KW)
    assert harvest(str(model_dir), TEXTS, NAMES, out, **KW).shards_skipped == 2


def test_the_model_sizes_must_still_agree(model_dir, tmp_path):
    from interp.store.harvest import _check_same
    from interp.store.manifest import IncompatibleStoreError

    ident = {"config": {}, "model": {"family": "llama", "n_layers": 2, "d_model": 64, "d_vocab": 259},
             "weights": "a" * 64, "weights_scheme": 2, "probe": {}}
    _check_same(ident, {**ident, "model": {**ident["model"], "family": "LlamaForCausalLM"}}, tmp_path)
    with pytest.raises(IncompatibleStoreError, match=r"model\.d_model changed \(model\.d_model: store has 64, this run 32"):
        _check_same(ident, {**ident, "model": {**ident["model"], "d_model": 32}}, tmp_path)
    with pytest.raises(IncompatibleStoreError, match="the model changed"):
        _check_same(ident, {**ident, "weights": "b" * 64}, tmp_path)


# ------------------------------------------------------------------- writer names
def _city_graph():
    from interp.models.city_networks.data import CityGraph

    return CityGraph(name="g", x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1], [1, 0]]),
                     edge_attr=torch.ones(2, 1), eccentricity=torch.zeros(4, dtype=torch.float64),
                     y=torch.tensor([0, 1, 0, 1]), train_idx=torch.tensor([0]), val_idx=torch.tensor([1]),
                     test_idx=torch.tensor([2, 3]), feature_names=["a", "b"], edge_feature_names=["len"],
                     nodes=["0", "1", "2", "3"])


def _chain():
    from interp.models.reverse_distillation import RDChain, ScalerConfig

    g = torch.Generator().manual_seed(0)
    f = torch.randn(200, 6, generator=g, dtype=torch.float64)
    return RDChain.fit([f[:, :3], f[:, :3] @ torch.randn(3, 5, generator=g, dtype=torch.float64)],
                       ScalerConfig(regressor="linear"))


def _writers() -> dict:
    from interp.models.reverse_distillation import RDChain, ReverseDistilledFamily
    from interp.models.city_networks.data import CityGraph

    chain = _chain()
    return {"CityGraph.save": (_city_graph().save, CityGraph.load),
            "RDChain.save": (chain.save, RDChain.load),
            "ReverseDistilledFamily.save": (ReverseDistilledFamily(["m0", "m1"], chain).save,
                                            ReverseDistilledFamily.load)}


def test_paper_model_writers_save_under_their_own_names(tmp_path):
    """They shared the default name ``interp`` and so replaced each other's folders without being asked."""
    writers = _writers()
    for name, (save, load) in writers.items():
        save(tmp_path / name)
        assert json.loads((tmp_path / name / MANIFEST).read_text())["writer"] == name
        save(tmp_path / name)  # its own earlier output is replaced
        load(tmp_path / name)
    for name, (save, _) in writers.items():
        for other in writers:
            if other != name:
                before = {p: p.read_bytes() for p in (tmp_path / other).rglob("*") if p.is_file()}
                with pytest.raises(OutputError, match=f"written by {other}, not by {name}"):
                    save(tmp_path / other)
                assert before == {p: p.read_bytes() for p in (tmp_path / other).rglob("*") if p.is_file()}


def test_outputs_saved_under_the_shared_name_are_still_replaced_by_their_writer(tmp_path):
    writers = _writers()
    for name, (save, load) in writers.items():
        folder = tmp_path / name
        save(folder)
        (folder / "notes.txt").write_text("mine")
        man = json.loads((folder / MANIFEST).read_text())
        man["writer"] = "interp"  # as saved before the writers had names
        (folder / MANIFEST).write_text(json.dumps(man))
        for other, (other_save, _) in writers.items():
            if other != name:
                with pytest.raises(OutputError, match=f"written by interp, not by {other}"):
                    other_save(folder)
        save(folder)
        load(folder)
        assert json.loads((folder / MANIFEST).read_text())["writer"] == name
        assert (folder / "notes.txt").read_text() == "mine"


# =============================================================== 8. negative head indices
@pytest.fixture(scope="module")
def heads_model():
    hf, tok = tiny_model("llama", n_layers=2)
    return interp.wrap(hf, tok)


def test_head_ablation_takes_negative_heads_as_the_interventions_do(heads_model):
    from interp.interventions import resolve_heads
    from interp.probes.heads import ablate_heads, head_mask

    m = heads_model
    n = m.cfg.n_heads
    assert torch.equal(head_mask(m, [(1, -1), (0, -n)]), head_mask(m, [(1, n - 1), (0, 0)]))
    batch = m.tokenize(["the quick brown fox", "a lazy dog"])
    with m.intervene(ablate_heads(m, [(1, -1)])):
        neg = m(batch)
    with m.intervene(ablate_heads(m, [(1, n - 1)])):
        pos = m(batch)
    assert torch.equal(neg, pos) and not torch.equal(neg, m(batch))
    for bad in (n, -n - 1):
        with pytest.raises(IndexError) as e:
            head_mask(m, [(0, bad)])
        with pytest.raises(IndexError) as ref:
            resolve_heads([bad], n, "blocks.0.attn.hook_z")
        assert str(e.value) == str(ref.value) and f"valid: -{n}..{n - 1}" in str(e.value)
    for bad in ((0, 1.5), (0, True), (0.0, 1), (0,), (0, 1, 2), "01"):
        with pytest.raises(ValueError, match="pairs of integers"):
            head_mask(m, [bad])
    with pytest.raises(ValueError, match="out of range"):
        head_mask(m, [(-1, 0)])
    assert head_mask(m, [(torch.tensor(1), torch.tensor(-1))])[1, n - 1]
