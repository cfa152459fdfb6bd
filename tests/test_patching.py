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
