"""One serialisation path (safetensors + JSON, :mod:`interp.io`) for every saved object.

Round trips of each caller type (results, steering vectors, GAVEL detectors and CEs, reverse-distillation
chains, transcoders in sae-lens's files, Raptor, polca checkpoints, City-Networks graphs), files written
the way they were written before the shared helper still load, and damaged files fail with an error
naming the file and the problem.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from interp.io import (MissingFileError, SerializationError, check_tensors, load_json, load_tensors,
                       load_tensors_json, save_tensors, save_tensors_json)
from interp.results import Result


@dataclass
class _Res(Result):
    name: str
    scores: torch.Tensor
    table: np.ndarray
    nested: dict
    n: int


def _res() -> _Res:
    g = torch.Generator().manual_seed(0)
    return _Res("r", torch.randn(3, 4, generator=g), np.arange(6, dtype=np.int64).reshape(2, 3),
                {"a": torch.ones(2, dtype=torch.bfloat16), "b": [1, 2], "c": [torch.zeros(1), "x"]}, 7)


# ------------------------------------------------------------------------------------ the helper itself
def test_helper_round_trip_keeps_dtypes_shapes_and_meta(tmp_path):
    tensors = {"f": torch.randn(2, 3), "i": torch.arange(5), "h": torch.ones(4, dtype=torch.float16),
               "b": torch.tensor([True, False])}
    tensors["view"] = tensors["f"][:, 1]  # a non-contiguous view, sharing storage with "f"
    t_file, j_file = save_tensors_json(tmp_path, tensors, {"k": [1, 2], "s": "x"}, stem="obj")
    assert (t_file.name, j_file.name) == ("obj.safetensors", "obj.json")
    back, meta = load_tensors_json(tmp_path, stem="obj", required=("k",),
                                   tensors={"f": ((2, 3), torch.float32), "i": ((None,), torch.int64)})
    assert meta == {"k": [1, 2], "s": "x"} and set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)
    # one-file form: the facts in the safetensors metadata
    save_tensors(tmp_path / "one.safetensors", {"theta": torch.arange(3.0)}, {"step": 4})
    t, m = load_tensors(tmp_path / "one.safetensors", tensors=("theta",), required=("step",))
    assert m == {"step": 4} and torch.equal(t["theta"], torch.arange(3.0))
    # no tensors: only the JSON file
    assert save_tensors_json(tmp_path / "sub", {}, {"a": 1}, stem="only")[0] is None
    assert not (tmp_path / "sub" / "only.safetensors").exists() and load_json(tmp_path / "sub" / "only.json") == {"a": 1}


def test_malformed_files_name_the_file_and_the_problem(tmp_path):
    save_tensors_json(tmp_path, {"w": torch.zeros(2, 3)}, {"a": 1}, stem="o")
    j, t = tmp_path / "o.json", tmp_path / "o.safetensors"
    cases = [
        (lambda: j.write_text('{"a": 1,'), "malformed JSON"),
        (lambda: j.write_text("[1, 2]"), "holds a JSON list, not the object"),
        (lambda: j.write_text('{"b": 2}'), "missing key 'a'"),
        (lambda: t.write_bytes(t.read_bytes()[:40]), "not a readable safetensors file"),
        (lambda: t.write_bytes(b"\x00" * 3), "not a readable safetensors file"),
    ]
    original = (j.read_text(), t.read_bytes())
    for damage, problem in cases:
        j.write_text(original[0]), t.write_bytes(original[1])
        damage()
        with pytest.raises(SerializationError) as info:
            load_tensors_json(tmp_path, stem="o", required=("a",), what="widget")
        assert problem in str(info.value)
        bad = j if "JSON" in problem or "key" in problem else t
        assert str(info.value).startswith(f"{bad}:"), (problem, str(info.value))
    j.write_text(original[0]), t.write_bytes(original[1])
    with pytest.raises(SerializationError, match=rf"{t}: missing tensor 'v'"):
        load_tensors_json(tmp_path, stem="o", tensors=("w", "v"))
    with pytest.raises(SerializationError, match=r"tensor 'w' has shape \[2, 3\], expected \[2, 4\]"):
        load_tensors_json(tmp_path, stem="o", tensors={"w": ((2, 4), None)})
    with pytest.raises(SerializationError, match=r"tensor 'w' has dtype torch.float32, expected torch.int64"):
        check_tensors(load_tensors_json(tmp_path, stem="o")[0], {"w": (None, torch.int64)}, t)
    t.unlink()
    with pytest.raises(MissingFileError, match=rf"{t}: missing") as info:
        load_tensors_json(tmp_path, stem="o")
    assert isinstance(info.value, FileNotFoundError)
    one = tmp_path / "one.safetensors"
    save_file({"x": torch.zeros(1)}, str(one), metadata={"interp.meta": "{oops"})
    with pytest.raises(SerializationError, match=rf"{one}: malformed JSON in its metadata"):
        load_tensors(one)


# ------------------------------------------------------------------------------------ each caller
def test_result_round_trip_and_old_files(tmp_path):
    r = _res()
    _Res.load(r.save(tmp_path / "r"))
    back = _Res.load(tmp_path / "r")
    assert back.name == "r" and back.n == 7 and torch.equal(back.scores, r.scores)
    assert isinstance(back.table, np.ndarray) and (back.table == r.table).all()
    assert back.nested["a"].dtype == torch.bfloat16 and back.nested["b"] == [1, 2] and back.nested["c"][1] == "x"
    # a result saved before the shared helper (and before output manifests): plain files
    old = tmp_path / "old"
    old.mkdir()
    save_file({"scores": torch.ones(2)}, str(old / "tensors.safetensors"))
    (old / "result.json").write_text(json.dumps({"schema_version": 1, "type": f"{_Res.__module__}._Res", "fields": {
        "name": "o", "scores": {"__tensor__": "scores", "numpy": False}, "table": [1], "nested": {}, "n": 1}}))
    assert torch.equal(_Res.load(old).scores, torch.ones(2))
    # damaged: the errors name the file
    (old / "result.json").write_text('{"type": ')
    with pytest.raises(SerializationError, match=f"{old / 'result.json'}: malformed JSON"):
        _Res.load(old)
    (old / "result.json").write_text(json.dumps({"schema_version": 1, "type": f"{_Res.__module__}._Res", "fields": {
        "name": "o", "scores": {"__tensor__": "gone", "numpy": False}, "table": [1], "nested": {}, "n": 1}}))
    with pytest.raises(SerializationError, match="tensors.safetensors: missing tensor 'gone'"):
        _Res.load(old)
    with pytest.raises(FileNotFoundError, match="result.json: missing"):
        _Res.load(tmp_path / "nothing")


@dataclass
class _Outer(Result):
    inner: _Res
    parts: list
    maybe: _Res | None = None


def test_nested_results_round_trip_and_unknown_types_are_refused(tmp_path):
    """A field holding a result (e.g. the raptor audit check's distances and trajectories) is saved with its
    tensors and restored as its own type; a nested type that no imported module defines is refused by name."""
    r = _res()
    out = _Outer(r, [r, {"x": torch.arange(3)}], None)
    back = _Outer.load(out.save(tmp_path / "o"))
    assert isinstance(back.inner, _Res) and torch.equal(back.inner.scores, r.scores)
    assert isinstance(back.parts[0], _Res) and (back.parts[0].table == r.table).all()
    assert torch.equal(back.parts[1]["x"], torch.arange(3)) and back.maybe is None
    assert back.to_dict()["inner"]["n"] == 7
    meta = json.loads((tmp_path / "o" / "result.json").read_text())
    meta["fields"]["inner"]["__result__"] = "os.system"
    (tmp_path / "o" / "result.json").write_text(json.dumps(meta))
    with pytest.raises(SerializationError, match="unknown type 'os.system'"):
        _Outer.load(tmp_path / "o")


def test_steering_vector_round_trip_and_old_files(tmp_path):
    from interp.steering import SteeringVector

    g = torch.Generator().manual_seed(1)
    v = SteeringVector("diff_in_means", "affine", ("blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre"),
                       torch.randn(8, generator=g), positions=(-1,), scale=2.5, reference=torch.randn(8, generator=g),
                       tensors={"extra": torch.arange(4)}, metadata={"layer": 1, "score": torch.tensor(0.5)})
    back = SteeringVector.load(v.save(tmp_path / "v"))
    assert type(back).__name__ == "SteeringVector" and back.hooks == v.hooks and back.positions == (-1,)
    assert torch.equal(back.direction, v.direction) and torch.equal(back.reference, v.reference)
    assert torch.equal(back.tensors["extra"], torch.arange(4)) and back.metadata == {"layer": 1, "score": 0.5}
    old = tmp_path / "old"  # the pre-helper layout: vector.json (sorted keys) + vector.safetensors
    old.mkdir()
    save_file({"direction": torch.ones(4)}, str(old / "vector.safetensors"))
    (old / "vector.json").write_text(json.dumps({"format_version": 1, "class": "SteeringVector", "method": "m",
                                                 "operation": "add", "hooks": ["blocks.0.hook_resid_pre"],
                                                 "positions": None, "scale": 1.0, "metadata": {}}, sort_keys=True))
    assert torch.equal(SteeringVector.load(old).direction, torch.ones(4))
    meta = json.loads((old / "vector.json").read_text())
    del meta["hooks"]
    (old / "vector.json").write_text(json.dumps(meta))
    with pytest.raises(SerializationError, match=f"{old / 'vector.json'}: missing key 'hooks'"):
        SteeringVector.load(old)


def test_gavel_detector_and_ce_round_trip(tmp_path):
    from interp.probes.gavel.ce import CE
    from interp.probes.gavel.detector import CEDetector, DetectorConfig, WindowGRU

    torch.manual_seed(0)
    cfg = DetectorConfig(hidden=8, rnn_layers=2, dropout=0.0)
    net = WindowGRU(6, 3, cfg.hidden, cfg.rnn_layers, cfg.dropout, cfg.proj_dim)
    det = CEDetector(net, ["a", "b", "c"], cfg, None, torch.tensor([0.2, 0.5, 0.9]), torch.tensor([1, 2, 1]))
    back = CEDetector.load(det.save(tmp_path / "det"))
    assert back.ces == det.ces and back.config == cfg
    assert torch.equal(back.thresholds, det.thresholds) and torch.equal(back.patience, det.patience)
    x = torch.randn(4, cfg.window, 6)
    with torch.no_grad():
        assert torch.equal(back.net(x), det.net(x))
    assert sorted(p.name for p in (tmp_path / "det").iterdir() if not p.name.startswith(".")) == [
        "detector.json", "detector.safetensors"]
    (tmp_path / "det" / "detector.safetensors").write_bytes(b"garbage!")
    with pytest.raises(SerializationError, match="detector.safetensors: not a readable safetensors file"):
        CEDetector.load(tmp_path / "det")
    ce = CE(name="greeting", description="says hello", version=2, texts=["hi", "hello"],
            calibration=[{"messages": [{"role": "user", "content": "hi"}], "ces": ["greeting"]}])
    assert CE.load(ce.save(tmp_path / "ce", thresholds={"x": 0.5})) == ce
    (tmp_path / "ce" / "ce.json").write_text(json.dumps({"name": "greeting"}))
    with pytest.raises(SerializationError, match=r"ce.json: missing keys 'description', 'version'"):
        CE.load(tmp_path / "ce")


def test_rd_chain_round_trip(tmp_path):
    from interp.models.reverse_distillation import RDChain, ScalerConfig

    g = torch.Generator().manual_seed(2)
    base = torch.randn(120, 4, generator=g)
    embs = [base, torch.cat([base @ torch.randn(4, 4, generator=g), torch.randn(120, 2, generator=g)], 1)]
    chain = RDChain.fit(embs, ScalerConfig(regressor="linear"))
    back = RDChain.load(chain.save(tmp_path / "chain"))
    assert back.widths == chain.widths and back.config == chain.config
    for a, b in zip(chain.transform(embs), back.transform(embs)):
        assert torch.equal(a, b)
    (tmp_path / "chain" / "scalers.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="scalers.safetensors: missing"):
        RDChain.load(tmp_path / "chain")


def test_transcoder_keeps_sae_lens_files(tmp_path):
    from interp.editing import Transcoder

    tc = Transcoder(6, 10, 5, hook_name="blocks.1.ln2.hook_normalized", hook_name_out="blocks.1.hook_mlp_out",
                    model_name="m")
    with torch.no_grad():
        tc.b_enc.add_(0.3), tc.b_dec.add_(-0.2)
    tc.save(tmp_path / "tc")
    cfg = json.loads((tmp_path / "tc" / "cfg.json").read_text())
    assert cfg["architecture"] == "transcoder" and (cfg["d_in"], cfg["d_sae"], cfg["d_out"]) == (6, 10, 5)
    back = Transcoder.load(tmp_path / "tc")
    assert back.hook_name == tc.hook_name and back.hook_name_out == tc.hook_name_out
    for k, v in tc.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)
    sd = dict(load_tensors(tmp_path / "tc" / "sae_weights.safetensors")[0])
    sd["W_enc"] = sd["W_enc"][:, :9].contiguous()
    save_file(sd, str(tmp_path / "tc" / "sae_weights.safetensors"))
    with pytest.raises(SerializationError, match=r"tensor 'W_enc' has shape \[6, 9\], expected \[6, 10\]"):
        Transcoder.load(tmp_path / "tc")


def test_raptor_model_and_polca_checkpoints(tmp_path):
    from interp.dynamics.polca import CheckpointRecorder, load_checkpoints
    from interp.dynamics.raptor import Raptor, RaptorConfig

    torch.manual_seed(0)
    r = Raptor(RaptorConfig(d_model=8, n_heads=2, n_layers=3, thresholds=[1], t_hidden=4))
    back = Raptor.load(r.save(tmp_path / "raptor"))
    assert back.cfg == r.cfg and all(torch.equal(back.state_dict()[k], v) for k, v in r.state_dict().items())
    (tmp_path / "raptor" / "config.json").write_text("{")
    with pytest.raises(SerializationError, match="config.json: malformed JSON"):
        Raptor.load(tmp_path / "raptor")

    net = torch.nn.Linear(3, 2)
    rec = CheckpointRecorder(net, tmp_path / "ck", every=2)
    assert rec(0) and not rec(1)
    with torch.no_grad():
        net.weight.add_(1.0)
    rec(2)
    save_file({"theta": torch.zeros(8)}, str(tmp_path / "ck" / "step_0000004.safetensors"))  # an old file
    steps, thetas = load_checkpoints(tmp_path / "ck")
    assert steps == [0, 2, 4] and thetas.shape == (3, 8)
    assert torch.equal(thetas[1] - thetas[0], torch.cat([torch.ones(6), torch.zeros(2)]))
    assert load_tensors(tmp_path / "ck" / "step_0000002.safetensors")[1] == {"step": 2}


def test_city_graph_round_trip(tmp_path):
    from interp.models.city_networks import CityGraph

    g = CityGraph(name="toy", x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]),
                  edge_attr=torch.rand(4, 1), eccentricity=torch.rand(4, dtype=torch.float64),
                  y=torch.tensor([0, 1, 1, 0]), train_idx=torch.tensor([0, 1]), val_idx=torch.tensor([2]),
                  test_idx=torch.tensor([3]), feature_names=["a", "b"], edge_feature_names=["length"],
                  nodes=["n0", "n1", "n2", "n3"], meta={"k": 2})
    back = CityGraph.load(g.save(tmp_path / "g"))
    assert back.nodes == g.nodes and back.meta == {"k": 2} and back.eccentricity.dtype == torch.float64
    for k in CityGraph._TENSORS:
        assert torch.equal(getattr(back, k), getattr(g, k))
    t, _ = load_tensors(tmp_path / "g" / "tensors.safetensors")
    del t["y"]
    save_file(t, str(tmp_path / "g" / "tensors.safetensors"))
    with pytest.raises(SerializationError, match="tensors.safetensors: missing tensor 'y'"):
        CityGraph.load(tmp_path / "g")


def test_table_result_round_trip_keeps_the_subclass(tmp_path):
    """A one-table result (``interp.results.TableResult``) saves and loads as its own subclass."""
    from interp.benchmarks.tcpe.facts import FactsComparison

    res = FactsComparison(rows=[{"method": "tcpe", "efficacy": 1.0}, {"method": "rome", "efficacy": 0.5}],
                          baseline={"accuracy": 0.9})
    back = FactsComparison.load(res.save(tmp_path / "cmp"))
    assert type(back) is FactsComparison and back.rows == res.rows and back.baseline == res.baseline
    assert list(back.to_frame()["method"]) == ["tcpe", "rome"]
