"""The RepIt pipeline end to end on a tiny random Llama (mechanics; the effect is validated on SmolLM2 in
test_repit_validation.py)."""
import pytest
import torch

from interp import steering
from interp.steering import SteeringData, SteeringVector
from interp.steering.repit import category_vectors, isolate


@pytest.fixture(scope="module")
def data(make_ids):
    cats = ["a", "b", "c", "d"]
    # each category draws its tokens from a different byte range; harmless from another
    pos = torch.cat([make_ids(8, seed=10 + i, low=65 + 6 * i, high=71 + 6 * i) for i in range(4)])
    neg = make_ids(12, seed=99, low=97, high=123)
    train = SteeringData(pos, neg, [c for c in cats for _ in range(8)])
    pos_v = torch.cat([make_ids(6, seed=50 + i, low=65 + 6 * i, high=71 + 6 * i) for i in range(4)])
    val = SteeringData(pos_v, make_ids(8, seed=98, low=97, high=123), [c for c in cats for _ in range(6)])
    return train, val


def test_category_vectors_by_hand(llama, data):
    train, _ = data
    cv = category_vectors(llama, train, n_eoi=3)
    assert cv.positions == [-3, -2, -1] and cv.vectors["b"].shape == (3, 2, 64) and cv.counts["b"] == 8
    _, cb = llama.run_with_cache(train.of_category("b"), names="blocks.1.hook_resid_pre")
    _, ch = llama.run_with_cache(train.negative, names="blocks.1.hook_resid_pre")
    expect = cb["blocks.1.hook_resid_pre"][:, -2].mean(0) - ch["blocks.1.hook_resid_pre"][:, -2].mean(0)
    assert torch.allclose(cv.at("b", -2, 1), expect, atol=1e-5)


def test_repit_fit_end_to_end(llama, data, tmp_path):
    train, val = data
    method = steering.get("repit")(targets=("a", "b"), n_eoi=3, refusal_tokens=(33, 34), kl_threshold=10.0,
                                   max_select_prompts=12)
    vec = method.fit(llama, train, val)
    sel, search = method.selection_, method.rho_search_
    # COSMIC selection: every (position, layer) candidate scored, sorted by total score; the chosen one is the
    # best that passes the filters (layer 1 is in the last 20% of this 2-layer model, so it is never chosen)
    assert len(sel.candidates) == 3 * 2 and {r["position"] for r in sel.candidates} == {-3, -2, -1}
    totals = [r["total"] for r in sel.candidates]
    assert totals == sorted(totals, reverse=True)
    k = [r["status"] for r in sel.candidates].index("chosen")
    assert all(r["status"] in ("late layer", "past peak", "kl") for r in sel.candidates[:k])
    assert all(r["status"] == "late layer" for r in sel.candidates[:k] if r["layer"] == 1)
    assert (vec.layer, vec.metadata["position"]) == (sel.candidates[k]["layer"], sel.candidates[k]["position"])
    assert vec.layer == 0 and sel.to_frame().shape[0] == 6
    # rho search evaluated the grid; the chosen rho is one of the evaluated points
    rhos = [p["rho"] for p in search.points]
    assert {0.0, 0.33, 0.66, 0.99} <= set(rhos) and vec.metadata["rho"] in rhos
    # the vector is the average of the per-target isolated vectors at the chosen rho
    cv, l, p, rho = method.category_vectors_, vec.layer, vec.metadata["position"], vec.metadata["rho"]
    R = cv.stack(["c", "d"], p, l)
    expect = (isolate(cv.at("a", p, l), R, rho) + isolate(cv.at("b", p, l), R, rho)) / 2
    assert torch.allclose(vec.direction, expect.float(), atol=1e-5)
    assert torch.allclose(vec.tensors["naive"], (cv.at("a", p, l) + cv.at("b", p, l)) / 2, atol=1e-6)
    assert torch.allclose(vec.tensors["correction"], vec.tensors["naive"] - vec.direction, atol=1e-5)
    assert set(method.vectors_) >= {"natural", "nontarget", "repit"}
    assert vec.metadata["targets"] == ["a", "b"] and vec.metadata["non_targets"] == ["c", "d"]
    # the intervention: only blocks.{l}.hook_resid_pre, every position; the r_hat component becomes mu . r_hat
    assert vec.hooks == (f"blocks.{l}.hook_resid_pre",) and vec.operation == "affine" and vec.positions is None
    r_hat = vec.direction / vec.direction.norm()
    with vec.apply(llama), llama.capture(vec.hooks[0]) as cache:
        llama(val.positive[:4])
    comp = cache[vec.hooks[0]] @ r_hat
    assert torch.allclose(comp, (vec.reference @ r_hat).expand_as(comp), atol=1e-4)
    # round trip through the registry-aware loader
    vec.save(tmp_path / "repit")
    back = SteeringVector.load(tmp_path / "repit")
    assert torch.equal(back.direction, vec.direction) and back.metadata["rho"] == rho and back.layer == l


def test_repit_fixed_layer_rho_and_tail(llama, data):
    train, _ = data
    m = steering.RepIt(targets=("a",), n_eoi=2, layer=1, position=-1, rho=1.0, top_k=5)
    vec = m.fit(llama, train)
    assert m.selection_ is None and m.rho_search_ is None
    corr = vec.tensors["correction"]
    # tail-only: the correction is applied on exactly its 5 largest dims
    applied = vec.tensors["naive"] - vec.direction
    assert int((applied.abs() > 1e-7).sum()) == 5
    assert torch.allclose(applied[corr.abs().argsort(descending=True)[:5]],
                          corr[corr.abs().argsort(descending=True)[:5]])
    assert m.localization_.k_for_share >= 1
    with pytest.raises(ValueError, match="target categories"):
        steering.RepIt(targets=("zzz",), n_eoi=2, layer=1, position=-1, rho=1.0).fit(llama, train)
    with pytest.raises(ValueError, match="category labels"):
        steering.RepIt(n_eoi=2).fit(llama, SteeringData(train.positive, train.negative))


def test_repit_ablation_mode(llama, data):
    train, val = data
    m = steering.RepIt(targets=("a",), n_eoi=2, layer=1, position=-1, rho=0.5, intervention="ablation")
    vec = m.fit(llama, train, val)
    assert vec.operation == "project_out" and vec.hooks == steering.ABLATION_HOOKS and vec.layer == 1
    expect = m.vectors_["natural"].direction  # unit naive direction
    assert torch.allclose(expect, vec.tensors["naive"] / vec.tensors["naive"].norm(), atol=1e-6)
    with vec.apply(llama), llama.capture("blocks.0.hook_resid_post") as cache:
        llama(val.positive[:3])
    assert (cache["blocks.0.hook_resid_post"] @ vec.direction).abs().max() < 1e-4
    with pytest.raises(ValueError, match="intervention"):
        steering.RepIt(targets=("a",), n_eoi=2, layer=1, position=-1, rho=0.5, intervention="x").fit(llama, train)
