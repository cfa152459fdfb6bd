"""ARENA-style TransformerLens idioms that TL's demos do not use (issue #44 item 3), each run as a TL user writes it
on an interp model of every backend and on the TransformerLens bridge of the same weights (with
``transformer_lens.utils``), comparing the numbers: hook functions with ``functools.partial`` and filter
callables, ``model.hooks(...)``, ``add_hook`` / ``reset_hooks``, ``hook.ctx``, ``utils.get_act_name`` variants,
``utils.lm_cross_entropy_loss`` / ``lm_accuracy``, ``model(..., loss_per_token=True)``, the logit lens through
TL's modules (``model.unembed(model.ln_final(x))``, ``model.embed(tokens)``), ``cache.decompose_resid``,
``cache.accumulated_resid(apply_ln=True)`` at the final layer, ``cache.get_neuron_results`` /
``stack_neuron_results``, ``FactoredMatrix`` (``model.OV`` / ``model.QK``: eigenvalues, SVD, norms, full circuits),
``model.to_single_token`` / ``to_string``."""
from __future__ import annotations

import warnings
from functools import partial

import pytest
import torch

import interp

from test_tl_demos import BACKENDS, bridge_of, same, wrap


def idioms(model, utils) -> dict:
    """The idioms on ``model`` with ``utils`` (``transformer_lens.utils`` or ``interp.utils``): their numbers."""
    out = {}
    toks = model.to_tokens(["When J and M went, J gave to", "When T and A went, A gave to"])
    logits, cache = model.run_with_cache(toks)
    final = cache["resid_post", -1]
    out["logit_lens_modules"] = model.unembed(model.ln_final(final))
    assert torch.allclose(out["logit_lens_modules"], logits, atol=1e-4)
    out["embed_call"] = model.embed(toks)
    out["accumulated_ln"] = cache.accumulated_resid(layer=-1, incl_mid=True, apply_ln=True, pos_slice=-1,
                                                    return_labels=True)
    out["neuron_results"] = cache.get_neuron_results(1, neuron_slice=[0, 3], pos_slice=-1)
    out["neuron_one"] = cache.get_neuron_results(0, neuron_slice=5)
    out["stack_neurons"] = cache.stack_neuron_results(2, pos_slice=-1, return_labels=True)
    out["stack_neurons_rest"] = cache.stack_neuron_results(1, pos_slice=(1, 4), neuron_slice=(0, 6), incl_remainder=True)
    out["lm_ce"] = [utils.lm_cross_entropy_loss(logits, toks), utils.lm_cross_entropy_loss(logits, toks, per_token=True)]
    mask = torch.ones_like(toks)
    mask[1, -3:] = 0
    out["lm_ce_mask"] = [utils.lm_cross_entropy_loss(logits, toks, mask), utils.lm_cross_entropy_loss(logits, toks, mask, True)]
    out["lm_acc"] = [utils.lm_accuracy(logits, toks), utils.lm_accuracy(logits, toks, per_token=True)]
    out["loss_per_token"] = model(toks, return_type="loss", loss_per_token=True)
    out["act_names"] = [utils.get_act_name(*a) for a in [
        ("pattern", 0), ("attn_scores", 1), ("q", 0, "attn"), ("resid_mid", 1), ("z", 0), ("normalized", 0, "ln1"),
        ("scale", 2, "ln2"), ("mlp_out", 1), ("post", 0), ("result", 2), ("embed",), ("attn_out", 0), ("k6",),
        ("scale4ln1",), ("pre5",)]]

    def pattern_hook(pattern, hook, store):
        store[hook.layer()] = pattern.mean(0)
    store = {}
    model.run_with_hooks(toks, return_type=None,
                         fwd_hooks=[(lambda name: name.endswith("pattern"), partial(pattern_hook, store=store))])
    out["partial_and_filter"] = [store[k] for k in sorted(store)]

    def ablate_head_0(v, hook):
        v[:, :, 0] = 0.0
        return v
    with model.hooks(fwd_hooks=[(utils.get_act_name("v", 1), ablate_head_0)]):
        ablated = model(toks, return_type="loss")
    out["hooks_context"] = torch.stack([ablated, model(toks, return_type="loss")])
    model.add_hook(utils.get_act_name("z", 0), lambda z, hook: z * 0.5)
    halved = model(toks, return_type="loss")
    model.reset_hooks()
    out["add_and_reset"] = torch.stack([halved, model(toks, return_type="loss")])

    def count_calls(resid, hook):  # hook.ctx: a dict per hook point that lives across forwards
        hook.ctx["calls"] = hook.ctx.get("calls", 0) + 1
        hook.ctx["norms"] = hook.ctx.get("norms", []) + [resid.norm()]
    model.add_hook("blocks.1.hook_resid_post", count_calls)
    model(toks)
    model(toks[:1])
    seen = []
    model.add_hook("blocks.1.hook_resid_post", lambda resid, hook: seen.append(dict(hook.ctx)))
    model(toks[:1])
    model.reset_hooks()
    out["hook_ctx"] = [seen[0]["calls"], torch.stack(seen[0]["norms"])]
    model.add_hook("blocks.1.hook_resid_post", lambda resid, hook: seen.append(dict(hook.ctx)))
    model(toks[:1])
    model.reset_hooks()
    out["hook_ctx_cleared"] = seen[-1]

    out["tokens"] = [model.to_single_token("a"), model.to_string(toks[0]), model.to_string(toks)]
    out["ov_eigenvalues"] = model.OV[1, 2].eigenvalues
    out["qk"] = model.QK[1, 2].AB
    out["ov_norms"] = model.OV.norm()
    out["ov_svd"] = model.OV[0, 1].svd()[1]
    out["full_qk"] = (model.W_E @ model.QK[2, 0] @ model.W_E.T).AB[:5, :5]
    out["remove_batch_dim"] = model.run_with_cache(toks[:1], remove_batch_dim=True)[1]["resid_post", 1]
    out["stack_activation"] = cache.stack_activation("pattern")
    return out


@pytest.fixture(scope="module")
def reference():
    import transformer_lens.utils as tl_utils

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return idioms(bridge_of("gpt2"), tl_utils)


@pytest.mark.parametrize("backend", BACKENDS)
def test_arena_idioms_equal_transformer_lens(reference, backend):
    ours = idioms(wrap("gpt2", backend), interp.utils)
    assert set(ours) == set(reference)
    for key in reference:
        same(ours[key], reference[key], key)
    assert ours["hook_ctx"][0] == 3 and ours["hook_ctx_cleared"] == {}  # three forwards, then reset_hooks


def test_decompose_resid_on_gpt2_has_one_embed_part_where_tl_has_two(reference):
    """interp's ``decompose_resid`` has one ``embed`` part (token plus position embedding) where TL has ``embed``
    and ``pos_embed`` (docs/for_transformer_lens_users.md): the other parts equal TL's, and the parts sum alike."""
    import transformer_lens.utils  # noqa: F401

    model = wrap("gpt2", "torch")
    toks = model.to_tokens(["When J and M went, J gave to"])
    ours, labels = model.run_with_cache(toks)[1].decompose_resid(layer=-1, return_labels=True)
    theirs, tl_labels = bridge_of("gpt2").run_with_cache(toks)[1].decompose_resid(layer=-1, return_labels=True)
    assert tl_labels[:2] == ["embed", "pos_embed"] and labels[0] == "embed" and labels[1:] == tl_labels[2:]
    same(ours[1:], theirs[2:], "decompose_resid")
    same(ours[0], theirs[0] + theirs[1], "embed")
