"""ARENA-style TransformerLens idioms that TL's demos do not use (issue #44 item 3), each run as a TL user writes it
on an interp model of every backend and on the TransformerLens bridge of the same weights (with
``transformer_lens.utils``), comparing the numbers: hook functions with ``functools.partial`` and filter
callables, ``model.hooks(...)``, ``add_hook`` / ``reset_hooks``, ``hook.ctx``, ``utils.get_act_name`` variants,
``utils.lm_cross_entropy_loss`` / ``lm_accuracy``, ``model(..., loss_per_token=True)``, the logit lens through
TL's modules (``model.unembed(model.ln_final(x))``, ``model.embed(tokens)``), ``cache.decompose_resid``,
``cache.accumulated_resid(apply_ln=True)`` at the final layer, ``cache.get_neuron_results`` /
``stack_neuron_results``, ``FactoredMatrix`` (``model.OV`` / ``model.QK``: eigenvalues, SVD, norms, full circuits),
``model.to_single_token`` / ``to_string``; TL's cache attribution helpers with TL's signatures
(:func:`attribution_helpers`) and round three's idioms (:func:`more_idioms`)."""
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


def attribution_helpers(model) -> dict:
    """TL's cache attribution helpers with TL's positional and keyword arguments: their numbers."""
    o = {}
    toks = model.to_tokens(["When J and M went, J gave to", "When T and A went, A gave to"])
    _, c = model.run_with_cache(toks)
    d, o["dec_labels"] = c.decompose_resid(-1, return_labels=True)
    o["dec"] = d
    o["dec_positional"] = c.decompose_resid(1, True, "attn", True, -1, True, True)
    o["dec_no_embeds"] = c.decompose_resid(2, mode="mlp", incl_embeds=False, apply_ln=True, pos_slice=(1, 4))
    o["acc_ln_block"] = c.accumulated_resid(1, True, True, -1, True)
    o["acc_ln_final"] = c.accumulated_resid(None, True, True, (0, 3))
    o["heads_ln"] = c.stack_head_results(2, True, True, -1, True)
    o["heads_none"] = list(c.stack_head_results(0, pos_slice=-1).shape)
    o["ln_block"] = c.apply_ln_to_stack(d, 2, True)
    o["ln_batch_slice"] = c.apply_ln_to_stack(d, -1, False, None, 1)
    o["ln_pos_and_batch"] = c.apply_ln_to_stack(d[:, :, -1], 1, False, -1, (0, 1))
    o["ln_recompute"] = c.apply_ln_to_stack(d, None, recompute_ln=True)
    a, b = model.to_single_token("J"), model.to_single_token("A")
    o["logit_attrs_str"] = c.logit_attrs(d[:, :, -1], "J", "M", -1)
    o["logit_attrs_batch"] = c.logit_attrs(d[:, :, -1], torch.tensor([a, b]), torch.tensor([b, a]), pos_slice=-1)
    o["logit_attrs_every_pos"] = c.logit_attrs(d, torch.tensor([[a] * toks.shape[1]] * 2))
    o["logit_attrs_batch_slice"] = c.logit_attrs(d[:, 1:, -1], a, pos_slice=-1, batch_slice=(1, 2))
    o["full"], o["full_labels"] = c.get_full_resid_decomposition(-1, expand_neurons=False, apply_ln=True, pos_slice=-1,
                                                                 return_labels=True)
    dirs = model.tokens_to_residual_directions(torch.tensor([a, b])).T  # [d_model, 2]
    o["neurons_projected"] = c.get_neuron_results(1, [0, 3], -1, dirs[:, 0])
    o["stack_neurons_positional"] = c.stack_neuron_results(2, -1, (0, 5), True, True, True, dirs)
    o["full_positional"] = c.get_full_resid_decomposition(2, False, True, True, -1, True, dirs[:, 1])
    with pytest.raises(ValueError):  # tokens and incorrect_tokens of different shapes
        c.logit_attrs(d, torch.tensor([a, b]), a)
    one = model.run_with_cache(toks[:1], remove_batch_dim=True)[1]
    o["no_batch_lens"] = one.accumulated_resid(-1, apply_ln=True, pos_slice=-1)
    o["no_batch_logit_attrs"] = one.logit_attrs(one.decompose_resid(-1, pos_slice=-1), a, b, pos_slice=-1,
                                                has_batch_dim=False)
    return o


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_cache_attribution_helpers_equal_tl(arch, backend):
    """``decompose_resid`` (TL's ``embed`` and ``pos_embed`` parts), ``accumulated_resid``, ``stack_head_results``,
    ``apply_ln_to_stack`` (TL's: the cached scale without the norm's weight; ``batch_slice`` slices the stack and
    the scale), ``logit_attrs`` (TL's signature: the raw stack, ``pos_slice`` / ``batch_slice``),
    ``get_full_resid_decomposition``, on a ``remove_batch_dim`` cache too: each equals TL's ``ActivationCache`` on
    the bridge of the same (unfolded) weights, with TL's positional argument order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = attribution_helpers(bridge_of(arch))
    ours = attribution_helpers(wrap(arch, backend))
    for key in theirs:
        same(ours[key], theirs[key], key)
    assert ("pos_embed" in ours["dec_labels"]) == (arch == "gpt2")


def more_idioms(model, utils) -> dict:
    """Round-three idioms (issue #44): what a TL / ARENA user writes beside the demos, their numbers."""
    out = {}
    toks = model.to_tokens(["When J and M went, J gave to", "When T and A went, A gave to"])
    out["str_tokens_1d"] = model.to_str_tokens(toks[0])
    out["str_tokens_2d"] = model.to_str_tokens(toks[:1])
    out["decode"] = model.tokenizer.decode(toks[0])
    out["act_names"] = [utils.get_act_name("resid_pre", 0), utils.get_act_name("attn", 1),
                        utils.get_act_name("q", 2, "attn"), utils.get_act_name("attn_out", 2)]
    out["d_head"] = model.cfg.d_head
    out["weights"] = [model.W_in, model.W_out]
    if model.cfg.positional_embedding_type == "standard":  # GPT-2 (biases); the bridge has no b_O on Llama (interp: zeros)
        out["biases"] = [model.b_O, model.b_in, model.b_out]
    out["ov_svd"] = list(model.OV[1, 0].svd())
    out["numpy"] = utils.to_numpy(model.W_E[:3, :4]).tolist()
    logits, cache = model.run_with_cache(toks)
    out["neg_layer"] = cache["resid_pre", -1]
    out["attn_short"] = cache["attn", 1]
    names = set(cache.keys())
    out["has_names"] = all(n in names for n in ("blocks.0.hook_resid_pre", "blocks.2.attn.hook_pattern", "hook_embed"))
    items = sorted((k, v) for k, v in cache.items() if k.startswith("blocks.1.attn.hook_")
                   and k.endswith(("hook_z", "hook_pattern")))
    out["items_keys"] = [k for k, _ in items]
    out["items_values"] = [v for _, v in items]
    out["values_len"] = len([v for v in cache.values()]) == len(cache)
    cpu = cache.to("cpu")
    out["to_cpu"] = cpu["blocks.1.hook_mlp_out"]
    row = cache.apply_slice_to_batch_dim(1)
    out["batch_slice_int"] = [row["blocks.0.attn.hook_pattern"], row.has_batch_dim]
    rows = cache.apply_slice_to_batch_dim((0, 1))
    out["batch_slice_tuple"] = [rows["blocks.2.hook_resid_post"], rows.has_batch_dim]
    out["batch_sliced_lens"] = row.accumulated_resid(-1, apply_ln=True, pos_slice=-1)
    _, one = model.run_with_cache(toks[:1])
    one.remove_batch_dim()  # TL removes it in place
    out["remove_batch_dim_in_place"] = [one["blocks.1.hook_resid_post"], one.has_batch_dim]
    out["cache_dict"] = sorted(k for k in cache.cache_dict if k.endswith("hook_scale"))
    out["cache_dict_value"] = cache.cache_dict["blocks.1.ln2.hook_scale"]

    layers = []

    def record_layer(act, hook):
        layers.append(hook.layer())

    model.run_with_hooks(toks, fwd_hooks=[(lambda n: n.endswith("hook_z"), record_layer)])
    out["hook_layer"] = layers

    def halve(z, hook):
        return z * 0.5

    base = model(toks, return_type="loss")
    kept = model.run_with_hooks(toks, return_type="loss", fwd_hooks=[("blocks.0.attn.hook_z", halve)],
                                reset_hooks_end=False)
    still = model(toks, return_type="loss")  # TL: the hook stays added after reset_hooks_end=False
    model.reset_hooks()
    out["run_with_hooks_kept"] = torch.stack([base, kept, still, model(toks, return_type="loss")])
    with model.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", lambda x, hook: x * 0.0)], reset_hooks_end=True):
        inside = model(toks, return_type="loss")
    out["hooks_ctx"] = torch.stack([inside, model(toks, return_type="loss")])
    with model.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", lambda x, hook: x * 0.0)], reset_hooks_end=False):
        pass
    after = model(toks, return_type="loss")
    model.reset_hooks()
    out["hooks_ctx_kept"] = torch.stack([after, model(toks, return_type="loss")])

    hp = model.hook_dict["blocks.1.attn.hook_pattern"]
    out["hook_point"] = [hp.name, hp.layer()]
    seen = []
    hp.add_hook(lambda p, hook: seen.append((hook.name, p.sum())))
    model(toks)
    hp.remove_hooks()
    model(toks)
    out["hook_point_hooks"] = seen
    grads = {}
    model.hook_dict["blocks.0.hook_mlp_out"].add_hook(lambda g, hook: grads.__setitem__(hook.name, g.detach()),
                                                     dir="bwd")
    with torch.enable_grad():
        model(toks, return_type="loss").backward()
    model.reset_hooks()
    for p in model.parameters():
        p.grad = None
    out["hook_point_bwd"] = grads["blocks.0.hook_mlp_out"]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_more_idioms_equal_tl(arch, backend):
    """Round three of issue #44: ``to_str_tokens`` of a tensor, ``tokenizer.decode``, ``get_act_name`` forms,
    ``cfg.d_head``, ``W_in`` / ``W_out`` / ``b_O``, ``OV[l, h].svd()``, ``utils.to_numpy``, ``cache["resid_pre", -1]``,
    ``cache["attn", l]``, ``keys`` / ``items`` / ``values``, ``cache.to("cpu")``, ``apply_slice_to_batch_dim``,
    ``remove_batch_dim()`` in place, ``cache_dict``, ``hook.layer()``, ``run_with_hooks(..., reset_hooks_end=False)``
    and ``model.hooks(..., reset_hooks_end=...)`` (False keeps the hooks, as TL), ``model.hook_dict[name]``'s
    ``add_hook`` / ``remove_hooks`` (forward and backward): each equal to the bridge of the same weights."""
    import transformer_lens.utils as tl_utils

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = more_idioms(bridge_of(arch), tl_utils)
        ours = more_idioms(wrap(arch, backend), interp.utils)
    assert set(ours) == set(theirs)
    for key in theirs:
        same(ours[key], theirs[key], key)
    kept = ours["run_with_hooks_kept"]
    assert kept[1] == kept[2] != kept[0] == kept[3]  # the hook stayed added until reset_hooks
    assert ours["hooks_ctx_kept"][0] != ours["hooks_ctx_kept"][1]


def test_full_decomposition_projected_at_an_mlp_input_is_tls_unprojected_one():
    """TL 3.9's ``get_full_resid_decomposition(layer, mlp_input=True, apply_ln=True, project_output_onto=d)`` normalises
    the neuron rows with ``ln1``'s scale (its fused path calls ``stack_neuron_results(apply_ln=True)``, which has no
    ``mlp_input``), so it differs from its own ``get_full_resid_decomposition(...) @ d`` (the demo's "Outputs should
    match!"). interp gives the latter, ``ln2``'s scale for every row, in both spellings: a TL inconsistency, not
    followed (docs/for_transformer_lens_users.md)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = bridge_of("gpt2")
        model = wrap("gpt2", "torch")
        toks = model.to_tokens(["When J and M went, J gave to", "When T and A went, A gave to"])
        d = model.tokens_to_residual_directions(torch.tensor(5))
        theirs = bridge.run_with_cache(toks)[1]
        tl_projected = theirs.get_full_resid_decomposition(2, True, True, True, -1, False, d)
        tl_then = theirs.get_full_resid_decomposition(2, True, True, True, -1) @ d
    ours = model.run_with_cache(toks)[1]
    assert not torch.allclose(tl_projected, tl_then, atol=1e-4)  # TL's two spellings disagree here
    same(ours.get_full_resid_decomposition(2, True, True, True, -1, False, d), tl_then, "projected")
    same(ours.get_full_resid_decomposition(2, True, True, True, -1) @ d, tl_then, "then projected")


@pytest.fixture(scope="module")
def biased_gpt2(tmp_path_factory):
    """The test GPT-2 with random attention and MLP biases (its own are zero, which would let a helper that drops or
    misplaces ``b_O`` / ``b_in`` / ``b_out`` pass): its folder, for interp and for the bridge alike."""
    import transformers

    from test_tl_demos import folder_of

    folder = tmp_path_factory.mktemp("biased_gpt2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder_of("gpt2"))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias") and (".attn." in name or ".mlp." in name):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    hf.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(folder_of("gpt2")).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_dependent_helpers_equal_tl_on_a_model_with_biases(biased_gpt2, backend):
    """The attribution helpers (:func:`attribution_helpers`: the bias row of ``get_full_resid_decomposition``, head
    and neuron outputs without their biases, ...) and ``model.accumulated_bias``, on a GPT-2 whose attention and MLP
    biases are not zero, equal TL's on the bridge of the same weights."""
    import transformers

    def load(backend_name):
        model = interp.wrap(transformers.AutoModelForCausalLM.from_pretrained(biased_gpt2).eval(),
                            transformers.AutoTokenizer.from_pretrained(biased_gpt2), backend=backend_name)
        model.prepend_bos = True
        return model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = load("transformer_lens").tl
        theirs = attribution_helpers(bridge)
        theirs["accumulated_bias"] = [bridge.accumulated_bias(2, True), bridge.accumulated_bias(3),
                                      bridge.accumulated_bias(1, False, False)]
    model = load(backend)
    assert model.b_O.abs().min() > 0 and model.b_out.abs().max() > 0.1
    ours = attribution_helpers(model)
    ours["accumulated_bias"] = [model.accumulated_bias(2, True), model.accumulated_bias(3),
                                model.accumulated_bias(1, False, False)]
    for key in theirs:
        same(ours[key], theirs[key], key)
    assert model.all_head_labels[:2] == model.all_head_labels()[:2] == bridge.all_head_labels[:2] == ["L0H0", "L0H1"]
    assert model.to_single_str_token(70) == bridge.to_single_str_token(70)

