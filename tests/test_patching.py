"""Activation and path patching (interp.patching): the batched sweeps equal patching one component at a time
with interp.Patch, on every backend; TransformerLens's patching module gives the same numbers on its bridge."""
from __future__ import annotations

import functools
import warnings

import pytest
import torch

import interp
from interp.patching import (get_act_patch_attn_head_out_by_pos, get_act_patch_block_every,
                             get_act_patch_resid_pre, patch, patch_values, path_patch)
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")


@functools.lru_cache(maxsize=None)
def model_on(backend: str) -> interp.Model:
    hf, tok = tiny_model("llama", seed=3, n_layers=3, perturb_norms=True)
    return interp.wrap(hf, tok, backend=backend)


def _inputs(model):
    clean = model.to_tokens(["ab cd ef", "gh ij kl"])
    corrupted = clean.clone()
    corrupted[:, 1] = (corrupted[:, 1] + 5) % model.cfg.d_vocab
    return clean, corrupted


def metric_of(clean_logits):
    target = clean_logits[:, -1].argmax(-1)

    def metric(logits):
        return logits[torch.arange(len(target)), -1, target].mean()
    return metric


def _one_at_a_time(model, corrupted, cache, metric, hook, positions=None, heads=None):
    with model.intervene({hook: interp.Patch(cache, positions=positions, heads=heads)}):
        return float(metric(model(corrupted)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_sweeps_equal_one_patch_at_a_time(backend):
    model = model_on(backend)
    clean, corrupted = _inputs(model)
    logits, cache = model.run_with_cache(clean)
    metric = metric_of(logits)
    T, L, H = clean.shape[1], model.cfg.n_layers, model.cfg.n_heads
    resid = get_act_patch_resid_pre(model, corrupted, cache, metric)
    assert resid.shape == (L, T)
    ref = torch.tensor([[_one_at_a_time(model, corrupted, cache, metric, f"blocks.{l}.hook_resid_pre", [p])
                         for p in range(T)] for l in range(L)])
    assert torch.allclose(resid, ref, atol=1e-5)
    # patching the whole clean residual at layer 0 position 1 (the corrupted token) restores the clean metric
    assert abs(resid[0, 1] - float(metric(logits))) < 1e-4
    heads = patch_values(model, corrupted, cache, metric, "z")
    ref = torch.tensor([[_one_at_a_time(model, corrupted, cache, metric, f"blocks.{l}.attn.hook_z", heads=[h])
                         for h in range(H)] for l in range(L)])
    assert heads.shape == (L, H) and torch.allclose(heads, ref, atol=1e-5)
    by_pos = get_act_patch_attn_head_out_by_pos(model, corrupted, cache, metric)
    assert by_pos.shape == (L, T, H)
    l, p, h = 1, 2, 3
    assert abs(by_pos[l, p, h] - _one_at_a_time(model, corrupted, cache, metric, f"blocks.{l}.attn.hook_z", [p], [h])) < 1e-5
    pattern = patch_values(model, corrupted, cache, metric, "pattern", batch_size=4)  # several chunks
    assert abs(pattern[2, 1] - _one_at_a_time(model, corrupted, cache, metric, "blocks.2.attn.hook_pattern",
                                              heads=[1])) < 1e-5
    every = get_act_patch_block_every(model, corrupted, cache, metric)
    assert every.shape == (3, L, T) and torch.equal(every[0], resid)


def test_backends_agree():
    vals = []
    for backend in BACKENDS:
        model = model_on(backend)
        clean, corrupted = _inputs(model)
        logits, cache = model.run_with_cache(clean)
        vals.append(patch_values(model, corrupted, cache, metric_of(logits), "attn_out"))
    assert torch.allclose(vals[0], vals[1], atol=1e-5) and torch.allclose(vals[0], vals[2], atol=1e-4)


def test_transformer_lens_patching_module_gives_the_same_numbers():
    """TransformerLens's own patching functions, run on the bridge under our transformer_lens backend."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import patching as tl_patching
    model = model_on("transformer_lens")
    bridge = model.tl
    clean, corrupted = _inputs(model)
    tl_logits, tl_cache = bridge.run_with_cache(clean)
    metric = metric_of(tl_logits)
    ours_logits, ours_cache = model.run_with_cache(clean)
    assert torch.allclose(tl_logits, ours_logits, atol=1e-5)
    expected = tl_patching.get_act_patch_resid_pre(bridge, corrupted, tl_cache, metric)
    got = get_act_patch_resid_pre(model, corrupted, ours_cache, metric)
    assert torch.allclose(got, expected.float(), atol=1e-4)
    expected = tl_patching.get_act_patch_attn_head_out_all_pos(bridge, corrupted, tl_cache, metric)
    got = patch_values(model, corrupted, ours_cache, metric, "z")
    assert torch.allclose(got, expected.float(), atol=1e-4)


def test_typed_result_and_errors(tmp_path):
    model = model_on("torch")
    clean, corrupted = _inputs(model)
    logits = model(clean)
    res = patch(model, clean, corrupted, metric_of(logits), "mlp_out")
    assert res.axes == ["layer", "pos"] and res.values.shape == (3, clean.shape[1])
    assert abs(res.clean - float(metric_of(logits)(logits))) < 1e-6
    assert torch.allclose(res.normalised(), (res.values - res.corrupted) / (res.clean - res.corrupted))
    assert len(res.to_frame()) == res.values.numel() and res.figure().data[0].z.shape == (3, clean.shape[1])
    res.save(tmp_path / "p")
    assert torch.equal(type(res).load(tmp_path / "p").values, res.values)
    with pytest.raises(ValueError, match="unknown component"):
        patch(model, clean, corrupted, metric_of(logits), "resid")
    with pytest.raises(ValueError, match="same shape"):
        patch(model, clean, corrupted[:, :-1], metric_of(logits))
    with pytest.raises(ValueError, match="layers must be in"):
        patch(model, clean, corrupted, metric_of(logits), layers=[3])
    with pytest.raises(ValueError, match="scalar"):
        patch(model, clean, corrupted, lambda lg: lg[:, -1, 0])


def test_path_patching():
    """A head of layer 2 into the receiver blocks.2.hook_resid_mid: with every other head frozen at its corrupted
    value, the receiver reads the corrupted residual plus that head's clean-minus-corrupted output through W_O
    (a hand computation); the metric is then that of the corrupted run with the receiver so patched."""
    model = model_on("torch")
    clean, corrupted = _inputs(model)
    logits, cache = model.run_with_cache(clean)
    _, ccache = model.run_with_cache(corrupted)
    metric = metric_of(logits)
    receiver = "blocks.2.hook_resid_mid"
    res = path_patch(model, clean, corrupted, metric, receivers=[receiver], senders=[(2, 3), (2, 0), (0, 1)])
    W_O = model.weight("W_O")
    for h in (3, 0):
        dz = cache["blocks.2.attn.hook_z"][:, :, h] - ccache["blocks.2.attn.hook_z"][:, :, h]
        resid_mid = ccache[receiver] + torch.einsum("bpe,ed->bpd", dz, W_O[2, h])
        with model.intervene({receiver: interp.Patch(resid_mid)}):
            expected = float(metric(model(corrupted)))
        assert abs(res.values[2, h] - expected) < 1e-4
    assert not torch.isnan(res.values[0, 1]) and torch.isnan(res.values[1, 0])  # (1, 0) was not a sender
    assert abs(res.corrupted - float(metric(model(corrupted)))) < 1e-6
    # a sender at or after the receiver's layer cannot reach it: nan
    early = path_patch(model, clean, corrupted, metric, receivers=["blocks.1.attn.hook_q"], senders=[(2, 0), (0, 0)])
    assert torch.isnan(early.values[2, 0]) and not torch.isnan(early.values[0, 0])
    with pytest.raises(ValueError, match="senders are"):
        path_patch(model, clean, corrupted, metric, receivers=[receiver], senders=[(3, 0)])
    # every sender at once is the default
    assert path_patch(model, clean, corrupted, metric, receivers={"blocks.2.attn.hook_v": [1]}).values.shape == (3, 4)


# ------------------------------------------------------------------ issue #44 item 1, issue #43 items 1-3
@functools.lru_cache(maxsize=None)
def arch_on(arch: str, backend: str) -> interp.Model:
    hf, tok = tiny_model(arch, seed=3, n_layers=3, perturb_norms=True)
    return interp.wrap(hf, tok, backend=backend)


def _short_inputs(model):
    clean = model.to_tokens(["ab cd", "gh ij"])
    corrupted = clean.clone()
    corrupted[:, 1] = (corrupted[:, 1] + 5) % model.cfg.d_vocab
    return clean, corrupted


@pytest.mark.parametrize("backend", BACKENDS)
def test_key_value_patching_on_a_grouped_query_model(backend):
    """k / v patching on a grouped-query model (4 query heads, 2 key/value heads): one column per key/value head,
    as TransformerLens counts them (it used to raise IndexError); each column equals patching that key/value head
    alone with interp.Patch; the *_every stacks pad k / v with zero columns as TL does."""
    model = arch_on("llama", backend)
    assert model.cfg.n_heads == 4 and model.cfg.n_kv_heads == 2
    clean, corrupted = _short_inputs(model)
    logits, cache = model.run_with_cache(clean)
    metric = metric_of(logits)
    T = clean.shape[1]
    for comp, fn in (("k", interp.patching.get_act_patch_attn_head_k_all_pos),
                     ("v", interp.patching.get_act_patch_attn_head_v_all_pos)):
        got = fn(model, corrupted, cache, metric)
        assert got.shape == (3, 2), comp
        for l, h in ((0, 1), (2, 0)):
            ref = _one_at_a_time(model, corrupted, cache, metric, f"blocks.{l}.attn.hook_{comp}", heads=[h])
            assert abs(got[l, h] - ref) < 1e-5, (comp, l, h)
    by_pos = interp.patching.get_act_patch_attn_head_k_by_pos(model, corrupted, cache, metric)
    assert by_pos.shape == (3, T, 2)
    assert abs(by_pos[1, 2, 1] - _one_at_a_time(model, corrupted, cache, metric, "blocks.1.attn.hook_k", [2], [1])) < 1e-5
    every = interp.patching.get_act_patch_attn_head_all_pos_every(model, corrupted, cache, metric)
    assert every.shape == (5, 3, 4) and torch.equal(every[2, :, 2:], torch.zeros(3, 2))
    assert torch.allclose(every[2, :, :2], interp.patching.get_act_patch_attn_head_k_all_pos(model, corrupted, cache, metric))


def test_key_value_patching_equals_transformer_lens_on_its_bridge():
    """TransformerLens's own k / v patching on the bridge (grouped-query Llama) gives the numbers interp gives."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import patching as tl_patching
    model = arch_on("llama", "transformer_lens")
    clean, corrupted = _short_inputs(model)
    tl_logits, tl_cache = model.tl.run_with_cache(clean)
    metric = metric_of(tl_logits)
    _, cache = model.run_with_cache(clean)
    for name in ("get_act_patch_attn_head_k_all_pos", "get_act_patch_attn_head_v_all_pos"):
        expected = getattr(tl_patching, name)(model.tl, corrupted, tl_cache, metric)
        got = getattr(interp.patching, name)(model, corrupted, cache, metric)
        assert got.shape == expected.shape and torch.allclose(got, expected.float(), atol=1e-4), name


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_every_tl_patching_function_equals_transformer_lens(arch):
    """Every get_act_patch_* of TransformerLens's patching module, on its bridge, against interp's of the same name
    on the transformer_lens backend: grouped-query Llama and multi-head GPT-2 (TL runs one forward per patch)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import patching as tl_patching
    model = arch_on(arch, "transformer_lens")
    clean, corrupted = _short_inputs(model)
    tl_logits, tl_cache = model.tl.run_with_cache(clean)
    metric = metric_of(tl_logits)
    _, cache = model.run_with_cache(clean)
    names = [n for n in dir(tl_patching) if n.startswith("get_act_patch_")]
    assert len(names) == 18
    for name in names:
        expected = getattr(tl_patching, name)(model.tl, corrupted, tl_cache, metric)
        got = getattr(interp.patching, name)(model, corrupted, cache, metric)
        assert got.shape == expected.shape and torch.allclose(got, expected.float(), atol=1e-4), name


def test_patch_labels_rows_with_the_requested_layers():
    model = model_on("torch")
    clean, corrupted = _short_inputs(model)
    metric = metric_of(model(clean))
    res = patch(model, clean, corrupted, metric, "resid_pre", layers=[2, 1])
    full = patch(model, clean, corrupted, metric, "resid_pre")
    assert res.layers == [2, 1] and torch.equal(res.values, full.values[[2, 1]])
    frame = res.to_frame()
    assert list(dict.fromkeys(frame["layer"])) == [2, 1]
    assert frame[frame.layer == 2]["metric"].tolist() == full.values[2].tolist()
    assert list(res.figure().data[0].y) == ["2", "1"]
    heads = patch(model, clean, corrupted, metric, "z", by_position=True, layers=[-1])
    assert heads.layers == [2] and set(heads.to_frame()["layer"]) == {2}


@pytest.mark.parametrize("backend", BACKENDS)
def test_patching_arguments_are_checked_once_for_every_entry_point(backend):
    """One validation for patch, patch_values, path_patch and every get_act_patch_*: clean and corrupted of one
    shape (a batch of 1 is not broadcast), layers integers (no int() of 0.7, '1', True), a metric that returns
    a scalar (None / dict refused in one line), token ids of an integer dtype (bool refused like float)."""
    model = model_on(backend)
    clean, corrupted = _short_inputs(model)
    logits, cache = model.run_with_cache(clean)
    metric = metric_of(logits)
    with pytest.raises(ValueError, match="same shape"):
        path_patch(model, clean[:1], corrupted, metric, receivers=["blocks.2.hook_resid_mid"], senders=[(0, 0)])
    with pytest.raises(ValueError, match="same shape"):
        path_patch(model, clean, corrupted[:, :-1], metric, receivers=["blocks.2.hook_resid_mid"], senders=[(0, 0)])
    with pytest.raises(ValueError, match="same shape"):
        get_act_patch_resid_pre(model, corrupted[:1], cache, metric)
    for bad in (0.7, "1", True, [0.7], ["1"], [True], [1.0]):
        with pytest.raises(TypeError, match="layers must be integers"):
            patch(model, clean, corrupted, metric, layers=bad)
        with pytest.raises(TypeError, match="layers must be integers"):
            patch_values(model, corrupted, cache, metric, layers=bad)
    for bad_metric in (lambda lg: None, lambda lg: {"diff": lg[0, -1, 0]}, lambda lg: "x"):
        for call in (lambda m: patch(model, clean, corrupted, m, "mlp_out", layers=[0]),
                     lambda m: get_act_patch_resid_pre(model, corrupted, cache, m),
                     lambda m: path_patch(model, clean, corrupted, m, receivers=["blocks.2.hook_resid_mid"],
                                          senders=[(0, 0)])):
            with pytest.raises(TypeError, match="metric must return a scalar"):
                call(bad_metric)
    with pytest.raises(TypeError, match="metric must be a function"):
        patch(model, clean, corrupted, None)
    for bad_ids in (corrupted.bool(), corrupted.float()):
        with pytest.raises(TypeError, match="integer tensor"):
            get_act_patch_resid_pre(model, bad_ids, cache, metric)
        with pytest.raises(TypeError, match="integer tensor"):
            patch(model, clean, bad_ids, metric)
        with pytest.raises(TypeError, match="integer tensor"):
            path_patch(model, bad_ids, corrupted, metric, receivers=["blocks.2.hook_resid_mid"])
    with pytest.raises(ValueError, match="senders are"):
        path_patch(model, clean, corrupted, metric, receivers=["blocks.2.hook_resid_mid"], senders=[(True, 0)])
