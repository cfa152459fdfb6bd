"""TransformerLens spellings, round two (issue #44 items 2 and 3): ``model.cfg``'s TL fields derived from the
model, TL's own ``patching`` module on an interp model, backward hooks, ``loss_fn``, ``tl_named_parameters``,
``model.embed`` / ``model.unembed``, ``get_token_position``, per-call ``prepend_bos``, ``set_use_*``,
``cache.stack_activation`` / ``compute_head_results`` / ``get_full_resid_decomposition``, ``utils.test_prompt`` /
``get_device`` / ``to_numpy``, ``generate(verbose=, return_type=)``. Each against TransformerLens itself (the
bridge the transformer_lens backend wraps, or TL's own function) where TL has it, on every backend."""
from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch

import interp
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
TEXT = "When Mary and John went to the store"


@functools.lru_cache(maxsize=None)
def pair(arch: str, backend: str):
    """An interp model on ``backend`` and a TransformerBridge of the same weights (TL's reference)."""
    hf, tok = tiny_model(arch, seed=5, n_layers=3, perturb_norms=True)
    ref = interp.wrap(copy.deepcopy(hf), tok, backend="transformer_lens")
    model = ref if backend == "transformer_lens" else interp.wrap(hf, tok, backend=backend)
    return model, ref.tl


def tl():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import transformer_lens
        import transformer_lens.patching  # noqa: F401
        import transformer_lens.utils  # noqa: F401
    return transformer_lens


#: fields whose value is interp's own rule, not the bridge's (see test_cfg_fields_equal_the_bridges)
_OWN_RULE = ("tokenizer_prepends_bos", "default_prepend_bos", "original_architecture")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cfg_fields_equal_the_bridges(arch, backend):
    """Every TL field interp derives equals the bridge's (GQA Llama: RMSNorm, rotary, gated SiLU MLP; GPT-2:
    LayerNorm, learned positions, gelu_new), except the BOS fields, which state interp's rule: the tokenizer's
    own (the tiny tokenizer adds no BOS), until ``model.prepend_bos`` / ``cfg.default_prepend_bos`` is set."""
    model, bridge = pair(arch, backend)
    fields = model.cfg.tl_fields()
    for k, v in fields.items():
        if k in _OWN_RULE or not hasattr(bridge.cfg, k):
            continue
        theirs = getattr(bridge.cfg, k)
        assert v == theirs or (isinstance(v, float) and abs(v - float(theirs)) < 1e-9), (k, v, theirs)
    assert fields["n_ctx"] == bridge.cfg.n_ctx and fields["d_mlp"] == bridge.cfg.d_mlp
    assert fields["n_key_value_heads"] == (2 if arch == "llama" else None) == bridge.cfg.n_key_value_heads
    assert fields["normalization_type"] == ("RMS" if arch == "llama" else "LN")
    assert fields["act_fn"] == ("silu" if arch == "llama" else "gelu_new")
    assert fields["original_architecture"] == ("LlamaForCausalLM" if arch == "llama" else "GPT2LMHeadModel")
    assert model.cfg.default_prepend_bos is False and model.cfg.tokenizer_prepends_bos is False
    try:
        model.cfg.default_prepend_bos = True  # TL's switch: the model's BOS rule
        assert model.prepend_bos is True and model.cfg.default_prepend_bos is True
        assert torch.equal(model.to_tokens(TEXT), bridge.to_tokens(TEXT))
    finally:
        model.prepend_bos = None
    with pytest.raises(AttributeError, match="cannot be set"):
        model.cfg.n_layers = 5
    with pytest.raises(AttributeError, match="cannot be set"):
        model.cfg.n_ctx = 5
    with pytest.raises(AttributeError, match="no field"):
        model.cfg.n_ctxx = 5
    assert model.cfg.n_layers == 3 and hash(model.cfg) == hash(model.cfg)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transformer_lens_patching_module_runs_on_an_interp_model(backend):
    """TL's own patching functions, given an interp model (its cfg, run_with_hooks and cache), equal interp's on a
    grouped-query model (k / v need cfg.n_key_value_heads)."""
    model, _ = pair("llama", backend)
    tl_patching = tl().patching
    clean = model.to_tokens(["ab cd", "gh ij"])
    corrupted = clean.clone()
    corrupted[:, 1] = (corrupted[:, 1] + 5) % model.cfg.d_vocab
    logits, cache = model.run_with_cache(clean)
    target = logits[:, -1].argmax(-1)

    def metric(lg):
        return lg[torch.arange(2), -1, target].mean()

    for name in ("get_act_patch_attn_head_k_all_pos", "get_act_patch_resid_pre"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = getattr(tl_patching, name)(model, corrupted, cache, metric)
        ours = getattr(interp.patching, name)(model, corrupted, cache, metric)
        assert theirs.shape == ours.shape and torch.allclose(theirs.float(), ours, atol=1e-5), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_hooks_equal_transformer_lens(backend):
    """``add_hook(name, fn, "bwd")`` / ``hooks(bwd_hooks=...)``: ``fn(grad, hook)`` gets the gradient of the
    activation, as the bridge's own backward hooks do; a returned tensor replaces it; reset_hooks removes them."""
    model, bridge = pair("llama", backend)
    ids = model.to_tokens([TEXT, "The cat sat on the mat ok"])
    names = ["blocks.1.hook_resid_post", "blocks.2.attn.hook_z", "blocks.0.hook_mlp_out"]

    def collect(m, store):
        def fn(grad, hook, name):  # keyed by the name asked for (the bridge reports its own alias names)
            store[name] = grad.detach().clone()
        for n in names:
            m.add_hook(n, functools.partial(fn, name=n), "bwd")

    theirs, ours = {}, {}
    with torch.enable_grad():
        collect(bridge, theirs)
        try:
            bridge(ids, return_type="loss").backward()
        finally:
            bridge.reset_hooks()
            bridge.zero_grad(set_to_none=True)
        collect(model, ours)
        try:
            model(ids, return_type="loss").backward()
        finally:
            model.reset_hooks()
    assert sorted(ours) == sorted(names) and sorted(theirs) == sorted(names)
    for n in names:
        torch.testing.assert_close(ours[n], theirs[n], atol=2e-5, rtol=1e-4, msg=n)
    # gradients() agrees, and a returned tensor replaces the gradient flowing back (zero at resid_post 1:
    # nothing reaches block 0's MLP output)
    g = model.gradients(ids, names, loss_fn=lambda out, b: interp.habits.lm_loss(out, b["input_ids"]))
    torch.testing.assert_close(g.grads["blocks.2.attn.hook_z"], ours["blocks.2.attn.hook_z"], atol=2e-5, rtol=1e-4)
    seen = {}
    with torch.enable_grad(), model.hooks(bwd_hooks=[("blocks.1.hook_resid_post", lambda grad, hook: grad * 0),
                                                     ("blocks.0.hook_mlp_out", lambda grad, hook: seen.update(g=grad))]):
        model(ids, return_type="loss").backward()
    assert seen["g"].abs().max() == 0
    # removed hooks do not fire, also on a graph made while they were added
    fired = []
    with torch.enable_grad():
        model.add_hook("blocks.1.hook_resid_post", lambda grad, hook: fired.append(1), dir="bwd")
        loss = model(ids, return_type="loss")
        model.reset_hooks()
        loss.backward()
    assert fired == []
    with torch.no_grad():  # grad mode off: no graph, as in TL
        model.add_hook("blocks.1.hook_resid_post", lambda grad, hook: fired.append(1), dir="bwd")
        try:
            assert not model(ids, return_type="loss").requires_grad
        finally:
            model.reset_hooks()
    for p in model.parameters():
        p.grad = None


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_spellings_equal_the_bridges(backend):
    model, bridge = pair("gpt2", backend)
    ids = model.to_tokens([TEXT, "The cat sat on the mat ok"])
    logits = model(ids)
    for per_token in (False, True):
        torch.testing.assert_close(model.loss_fn(logits, ids, per_token=per_token),
                                   bridge.loss_fn(bridge(ids), ids, per_token=per_token), atol=1e-5, rtol=1e-5)
    assert torch.equal(model.unembed.b_U, bridge.unembed.b_U.detach())
    assert torch.equal(model.embed.W_E, bridge.embed.W_E.detach())
    assert torch.equal(model.unembed.W_U, bridge.unembed.W_U.detach())
    assert torch.equal(model.pos_embed.W_pos, bridge.pos_embed.W_pos.detach())
    with pytest.raises(AttributeError, match="no weight"):
        model.unembed.W_X
    # tl_named_parameters: TL's names, TL's shapes and values
    ours = dict(model.tl_named_parameters())
    theirs = {n: p.detach() for n, p in bridge.tl_named_parameters()}
    shared = sorted(set(ours) & set(theirs))
    assert len(shared) >= 10 + 3 * 12, sorted(set(theirs) - set(ours))
    for n in shared:
        assert ours[n].shape == theirs[n].shape and torch.allclose(ours[n], theirs[n], atol=1e-6), n
    # get_token_position, BOS per call
    text = "ab cd ab"
    for kw in ({"prepend_bos": True}, {"prepend_bos": False}, {"prepend_bos": True, "mode": "last"}):
        assert model.get_token_position("b", text, **kw) == bridge.get_token_position("b", text, **kw), kw
    assert model.get_token_position("b", model.to_tokens(text)[0]) == 1
    with pytest.raises(ValueError, match="not in the input"):
        model.get_token_position("z", text)
    for pb in (True, False):
        torch.testing.assert_close(model(TEXT, prepend_bos=pb), bridge(TEXT, prepend_bos=pb), atol=1e-4, rtol=1e-4)
        _, cache = model.run_with_cache(TEXT, prepend_bos=pb, names="blocks.0.hook_resid_pre")
        assert cache["blocks.0.hook_resid_pre"].shape[1] == bridge.to_tokens(TEXT, prepend_bos=pb).shape[1]
    assert model.run_with_hooks(TEXT, prepend_bos=True).shape[1] == len(model.to_tokens(TEXT)[0]) + 1
    assert model.prepend_bos is None  # a per-call rule does not stick
    assert model.eval() is model
    # set_use_attn_result: TL's switch; hook_result is offered either way
    model.set_use_attn_result(True)
    assert model.cfg.use_attn_result
    _, cache = model.run_with_cache(ids, names="blocks.1.attn.hook_result")
    assert cache["blocks.1.attn.hook_result"].shape == (2, ids.shape[1], 4, model.cfg.d_model)
    model.set_use_attn_result(False)
    model.set_use_split_qkv_input(False)
    with pytest.raises(ValueError, match="hook_q_input"):
        model.set_use_split_qkv_input(True)
    assert not model.cfg.use_split_qkv_input
    with pytest.raises(TypeError, match="True or False"):
        model.set_use_attn_result("yes")


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_helpers_equal_transformer_lens(backend):
    model, bridge = pair("gpt2", backend)
    ids = model.to_tokens([TEXT, "The cat sat on the mat ok"])
    _, cache = model.run_with_cache(ids)
    _, tl_cache = bridge.run_with_cache(ids)
    for name, kw in (("resid_post", {}), ("pattern", {"layer": 2}), ("scale", {"sublayer_type": "ln2"})):
        ours, theirs = cache.stack_activation(name, **kw), tl_cache.stack_activation(name, **kw)
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-5), name
    # compute_head_results: TL's per-head outputs, z @ W_O
    cache.compute_head_results()
    tl_cache.compute_head_results()
    torch.testing.assert_close(cache["blocks.1.attn.hook_result"], tl_cache["blocks.1.attn.hook_result"],
                               atol=1e-5, rtol=1e-4)
    # the full decomposition sums to the residual it decomposes, with TL's labels and parts (embed and pos_embed)
    for layer, mlp_input, expand in ((None, False, True), (2, True, False), (1, False, False)):
        full, labels = cache.get_full_resid_decomposition(layer, mlp_input=mlp_input, expand_neurons=expand,
                                                           return_labels=True)
        tl_full, tl_labels = tl_cache.get_full_resid_decomposition(layer, mlp_input=mlp_input, expand_neurons=expand,
                                                                   return_labels=True)
        target = (cache["resid_post", -1] if layer is None else
                  cache["resid_mid", layer] if mlp_input else cache["resid_pre", layer])
        assert torch.allclose(full.sum(0), target, atol=1e-4), (layer, mlp_input)
        assert labels == tl_labels and "pos_embed" in labels
        assert torch.allclose(full, tl_full, atol=1e-4), (layer, mlp_input)


def test_utils_spellings_equal_transformer_lens(capsys):
    tl_utils = tl().utils
    assert interp.utils.get_device() == tl_utils.get_device()
    t = torch.randn(3, 2)
    for x in (t, [1, 2], 3.5, t.numpy()):
        import numpy as np
        assert np.array_equal(interp.utils.to_numpy(x), tl_utils.to_numpy(x))
    model, _ = pair("llama", "torch")
    rows = interp.utils.test_prompt("ab", "c", model, print_details=True, prepend_bos=False, top_k=3)
    printed = capsys.readouterr().out
    prompt = model.to_tokens("ab")[0]
    tok = model.tokenizer(" c", add_special_tokens=False)["input_ids"][0]
    row = model(torch.cat([prompt, torch.tensor([tok])])[None])[0, len(prompt) - 1]
    assert rows[0]["rank"] == int((row > row[tok]).sum()) and "Rank:" in printed and len(rows[0]["top"]) == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_generate_verbose_and_return_type(backend, capsys):
    model, bridge = pair("llama", backend)
    cont = model.generate(TEXT, max_new_tokens=4)
    whole = model.generate(TEXT, max_new_tokens=4, return_type="input", verbose=True)
    assert isinstance(whole, str) and whole == TEXT + cont[0]
    toks = model.generate(model.to_tokens(TEXT), max_new_tokens=4, return_type="input")
    assert toks.shape == (1, len(model.to_tokens(TEXT)[0]) + 4)
    assert torch.equal(toks[0, -4:], model.generate(TEXT, max_new_tokens=4, return_text=False)[0])
    # TL's greedy generation gives the same tokens (without its key-value cache: on this bridge TL 3.9's cached
    # generation departs from the argmax of the full forward at the second new token; interp's cached one does not)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = bridge.generate(model.to_tokens(TEXT), max_new_tokens=4, do_sample=False, verbose=False,
                                 use_past_kv_cache=False)
    assert torch.equal(toks, theirs)
    assert model.generate([TEXT, "ab"], max_new_tokens=2, return_type="str")[1].startswith("ab")
    with pytest.raises(ValueError, match="return_type"):
        model.generate(TEXT, max_new_tokens=2, return_type="text")


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_key_value_weights_both_conventions(backend):
    """Issue #44 item 4, decided: ``model.W_K`` / ``W_V`` repeat grouped key/value heads per query head
    (HookedTransformer's ``W_K``, so ``model.QK`` / ``model.OV`` and ``W_Q[l, h] @ W_K[l, h].T`` are per query
    head); ``model._W_K`` / ``_W_V`` and ``model.weight("W_K")`` are the grouped ``[layer, kv_head, ...]`` that the
    bridge's ``W_K`` gives (HookedTransformer's ``_W_K``)."""
    model, bridge = pair("llama", backend)
    grouped, repeated = model._W_K, model.W_K
    assert grouped.shape == (3, 2, 64, 16) and repeated.shape == (3, 4, 64, 16)
    assert torch.allclose(grouped, bridge.W_K.detach(), atol=1e-6)
    assert torch.allclose(model._W_V, bridge.W_V.detach(), atol=1e-6) and torch.equal(model.weight("W_K"), grouped)
    assert torch.equal(repeated, grouped.repeat_interleave(2, dim=1))
    assert torch.allclose(model.QK.AB[1, 3], model.W_Q[1, 3] @ grouped[1, 1].T, atol=1e-5)  # query head 3 -> kv head 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_resid_mid_writes_feed_the_mlp_and_its_gradient_is_the_mlp_branchs(backend):
    """Issue #44 item 5, decided as TL's bridge has it: a write at ``hook_resid_mid`` changes the MLP's input only
    (the residual add after the MLP reads the unhooked value), and the gradient there (``gradients()`` and a
    backward hook alike) is the gradient of that write, the MLP branch's, as the bridge's own backward hook gives
    it; so ``grad[resid_mid] . delta`` predicts activation patching at ``hook_resid_mid``. The residual's full
    gradient at that point (MLP branch plus skip path) is ``grad[resid_mid] + grad[resid_post]``, the gradient at
    ``hook_attn_out`` (a write there moves the whole residual)."""
    model, bridge = pair("llama", backend)
    ids = model.to_tokens(["ab cd ef gh"])
    g = model.gradients(ids, ["blocks.1.hook_resid_mid", "blocks.1.hook_resid_post", "blocks.1.hook_attn_out"])
    delta = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    delta = delta / delta.norm()
    _, before = model.run_with_cache(ids, names=["blocks.1.hook_resid_post", "blocks.1.hook_mlp_out"])

    def write_loss(site, s):
        with model.intervene({site: lambda t, ctx: t + s * delta}):
            return float(model(ids, return_type="loss"))
    eps = 1e-2
    with model.intervene({"blocks.1.hook_resid_mid": lambda t, ctx: t + delta}):
        _, after = model.run_with_cache(ids, names=["blocks.1.hook_resid_post", "blocks.1.hook_mlp_out"])
    d_post = after["blocks.1.hook_resid_post"] - before["blocks.1.hook_resid_post"]
    d_mlp = after["blocks.1.hook_mlp_out"] - before["blocks.1.hook_mlp_out"]
    assert torch.allclose(d_post, d_mlp, atol=1e-5)  # the residual itself did not move by delta
    fd_mid = (write_loss("blocks.1.hook_resid_mid", eps) - write_loss("blocks.1.hook_resid_mid", -eps)) / (2 * eps)
    at_mid = float((g.grads["blocks.1.hook_resid_mid"] * delta).sum())
    assert abs(fd_mid - at_mid) < 3e-2 * abs(at_mid) + 1e-3
    full = float(((g.grads["blocks.1.hook_resid_mid"] + g.grads["blocks.1.hook_resid_post"]) * delta).sum())
    fd_attn = (write_loss("blocks.1.hook_attn_out", eps) - write_loss("blocks.1.hook_attn_out", -eps)) / (2 * eps)
    assert abs(fd_attn - full) < 3e-2 * abs(full) + 1e-3  # a write at attn_out moves the whole residual
    assert abs(full - at_mid) > 10 * abs(fd_mid - at_mid)  # and that is another number
    assert torch.allclose(g.grads["blocks.1.hook_attn_out"], g.grads["blocks.1.hook_resid_mid"]
                          + g.grads["blocks.1.hook_resid_post"], atol=1e-6)
    # the bridge's own backward hook at hook_resid_mid gives the same gradient
    store = {}
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge.add_hook("blocks.1.hook_resid_mid", lambda grad, hook: store.__setitem__("mid", grad.detach()), "bwd")
        try:
            bridge(ids, return_type="loss").backward()
        finally:
            bridge.reset_hooks()
            for p in bridge.parameters():
                p.grad = None
    torch.testing.assert_close(g.grads["blocks.1.hook_resid_mid"], store["mid"], atol=2e-6, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_hooks_fire_at_every_site_and_at_the_norm_scale_equal_transformer_lens(backend):
    """Every hook point takes a backward hook on every backend, the norms' ``hook_scale`` included (the torch /
    nnsight backends used to compute it beside the forward path, so no gradient reached it): the Attribution
    Patching Demo's filter ``lambda name: "_input" not in name`` fires at every site, and the gradients at
    ``ln1`` / ``ln2`` / ``ln_final``'s ``hook_scale`` and ``hook_normalized`` equal the bridge's own backward hooks
    (TL's semantics: ``hook_normalized = x_c / hook_scale``). A site a backend could only read beside the forward
    path would be refused in one line, or left out of a filter with a warning."""
    model, bridge = pair("gpt2", backend)
    ids = model.to_tokens([TEXT, "The cat sat on the mat ok"])

    def run(m, store):
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the bridge names its gated-off hooks and leaves its native norm path
            m.add_hook(lambda name: "_input" not in name,
                       lambda grad, hook: store.__setitem__(hook.name, grad.detach().clone()), "bwd")
            try:
                m(ids, return_type="loss").backward()
            finally:
                m.reset_hooks()
                for p in m.parameters():
                    p.grad = None

    ours, theirs = {}, {}
    run(model, ours)
    run(bridge, theirs)
    assert set(ours) == set(model.hook_names()), sorted(set(model.hook_names()) ^ set(ours))[:6]
    norms = [n for n in model.hook_names() if n.endswith(("hook_scale", "hook_normalized"))]
    assert len(norms) == 2 * (2 * model.cfg.n_layers + 1)
    for n in norms:
        assert ours[n].abs().sum() > 0, n
    # every site the bridge reports under the same name has the bridge's gradient (hook_resid_mid included: the
    # MLP branch's); the bridge reports resid_pre / resid_post as hook_in / hook_out and hook_result summed
    common = set(ours) & set(theirs)
    assert set(norms) | {f"blocks.{l}.hook_resid_mid" for l in range(model.cfg.n_layers)} <= common
    for n in common:
        torch.testing.assert_close(ours[n], theirs[n], atol=2e-5, rtol=1e-4, msg=n)
    # the refusal that remains for a read-only site (none is left on these models; a lens may still be one)
    site = "blocks.1.ln1.hook_scale"
    real = model.can_write
    model.can_write = lambda name: real(name) and name != site
    try:
        with pytest.raises(ValueError, match="would never fire"):
            model.add_hook(site, lambda grad, hook: None, "bwd")
        with pytest.warns(UserWarning, match="read-only"):
            model.add_hook("blocks.1.ln1.*", lambda grad, hook: None, "bwd")
    finally:
        del model.can_write
        model.reset_hooks()