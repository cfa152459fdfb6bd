"""TransformerLens spellings on every backend (issue #34): weights as attributes, OV/QK factored matrices,
return_type, run_with_cache(names_filter, remove_batch_dim), persistent hooks, hook.layer(), generate
temperature, to_string of one id, tokens_to_residual_directions, test_prompt. Checked against the
TransformerLens bridge the transformer_lens backend wraps (its own attributes and methods) and by hand."""
from __future__ import annotations

import functools

import pytest
import torch

import interp
from interp.habits import lm_loss
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
TEXT = "When Mary and John went to the store"


@functools.lru_cache(maxsize=None)
def model_on(backend: str, arch: str = "llama") -> interp.Model:
    hf, tok = tiny_model(arch, seed=5, n_layers=3, perturb_norms=True)
    return interp.wrap(hf, tok, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_as_attributes(backend):
    m = model_on(backend)
    assert torch.equal(m.W_U, m.weight("W_U")) and torch.equal(m.W_E, m.weight("W_E"))
    assert torch.equal(m.blocks[1].attn.W_Q, m.weight("W_Q")[1])
    assert torch.equal(m.blocks[-1].mlp.W_out, m.weight("W_out")[2])
    assert torch.equal(m.blocks[2].attn.b_O, m.weight("b_O")[2])
    # grouped key/value heads (2 for 4 query heads) repeated per query head, as TransformerLens's W_K
    assert m.weight("W_K").shape[1] == 2 and m.W_K.shape[1] == 4 and m.blocks[0].attn.W_K.shape[0] == 4
    assert torch.equal(m.W_K[:, 0], m.W_K[:, 1]) and torch.equal(m.W_K[:, 1], m.weight("W_K")[:, 0])
    w, b, _ = m.ln_final_parts()
    assert torch.equal(m.ln_final.w, w) and not torch.allclose(m.ln_final.w, torch.ones_like(w))
    assert len(m.blocks) == 3 and len(m.blocks[0:2]) == 2
    with pytest.raises(IndexError, match="3 layers"):
        m.blocks[3]
    with pytest.raises(AttributeError, match="W_X"):
        m.blocks[0].attn.W_X


def test_attributes_equal_the_bridge():
    m = model_on("transformer_lens")
    bridge = m.tl
    for name in ("W_U", "W_E", "W_Q", "W_O", "W_in", "W_out"):
        assert torch.allclose(getattr(m, name), getattr(bridge, name).detach(), atol=1e-6), name
    assert torch.allclose(m.blocks[1].attn.W_Q, bridge.blocks[1].attn.W_Q.detach(), atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ov_qk_factored(backend):
    m = model_on(backend)
    OV, QK = m.OV, m.QK
    assert OV.AB.shape == (3, 4, m.cfg.d_model, m.cfg.d_model)
    assert torch.allclose(OV.AB[1, 2], m.W_V[1, 2] @ m.W_O[1, 2], atol=1e-5)
    assert torch.allclose(QK.AB[0, 3], m.W_Q[0, 3] @ m.W_K[0, 3].T, atol=1e-5)
    # the nonzero eigenvalues of a rank-d_head product are those of the small BA matrix
    ev = OV[1, 2].eigenvalues
    small = torch.linalg.eigvals(m.W_O[1, 2] @ m.W_V[1, 2])
    assert torch.allclose(ev.abs().sort().values, small.abs().sort().values, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_return_type_and_loss(backend):
    m = model_on(backend)
    ids = m.to_tokens([TEXT, "The cat"])
    mask = m.tokenize([TEXT, "The cat"], padding_side="right")["attention_mask"]
    inputs = {"input_ids": ids, "attention_mask": mask}
    logits = m(inputs)
    loss = m(inputs, return_type="loss")
    # by hand: mean -log p(next) over pairs of real tokens
    logp = torch.log_softmax(logits.float(), -1)
    terms = [-logp[b, t, ids[b, t + 1]] for b in range(2) for t in range(ids.shape[1] - 1) if mask[b, t + 1] and mask[b, t]]
    assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-5)
    both = m(inputs, return_type="both")
    assert torch.equal(both[0], logits) and torch.equal(both[1], loss)
    assert m(inputs, return_type=None) is None
    with pytest.raises(ValueError, match="return_type"):
        m(inputs, return_type="logit")
    out, cache = m.run_with_cache(TEXT, names_filter=lambda n: n.endswith("hook_resid_post"), return_type="loss")
    assert out.dim() == 0 and sorted(cache) == [f"blocks.{l}.hook_resid_post" for l in range(3)]
    r = m.run_with_hooks(TEXT, fwd_hooks=[("blocks.0.hook_resid_post", lambda t, hook: t)], return_type="both")
    assert torch.allclose(r[1], out, atol=1e-6)
    _, single = m.run_with_cache(TEXT, names="blocks.0.hook_resid_post", remove_batch_dim=True)
    assert single["blocks.0.hook_resid_post"].dim() == 2
    with pytest.raises(ValueError, match="one example"):
        m.run_with_cache([TEXT, "x"], remove_batch_dim=True)


def test_loss_equals_the_bridges_own():
    m = model_on("transformer_lens")
    ids = m.to_tokens(TEXT)
    ours = m(ids, return_type="loss")
    theirs = m.tl(ids, return_type="loss")
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert torch.allclose(lm_loss(m(ids), ids), theirs, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_persistent_hooks_and_hook_layer(backend):
    m = model_on(backend)
    plain = m(TEXT)
    seen = []

    def zero(t, hook):
        seen.append(hook.layer())
        return t * 0

    m.add_hook("blocks.1.attn.hook_z", zero)
    m.add_hook("blocks.2.hook_resid_pre", lambda t, hook: seen.append(("perm", hook.layer)), is_permanent=True)
    try:
        hooked = m(TEXT)
        assert (hooked - plain).abs().max() > 1e-3 and 1 in seen and ("perm", 2) in seen
        m.reset_hooks()
        seen.clear()
        assert torch.allclose(m(TEXT), plain, atol=1e-6) and seen == [("perm", 2)]  # the permanent one stays
    finally:
        m.reset_hooks(including_permanent=True)
    seen.clear()
    m(TEXT)
    assert seen == []
    with m.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero)]):
        assert torch.allclose(m(TEXT), hooked, atol=1e-5)
    assert torch.allclose(m(TEXT), plain, atol=1e-6)
    with pytest.raises(RuntimeError):
        with m.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero)]):
            raise RuntimeError("inside")
    assert torch.allclose(m(TEXT), plain, atol=1e-6)  # removed on an exception too
    with pytest.raises(ValueError, match="dir must be 'fwd' or 'bwd'"):
        m.add_hook("blocks.0.hook_resid_pre", zero, dir="backward")


@pytest.mark.parametrize("backend", BACKENDS)
def test_generate_temperature_samples(backend):
    m = model_on(backend)
    greedy = m.generate(TEXT, max_new_tokens=6)
    assert m.generate(TEXT, max_new_tokens=6, temperature=0) == greedy
    runs = {tuple(m.generate([TEXT], max_new_tokens=6, temperature=2.0, seed=s)) for s in range(6)}
    assert len(runs) > 1  # a temperature samples, as in TransformerLens
    assert m.generate(TEXT, max_new_tokens=6, temperature=2.0, seed=3) == m.generate(TEXT, max_new_tokens=6,
                                                                                     temperature=2.0, seed=3)


def test_small_spellings():
    m = model_on("torch")
    ids = m.to_tokens(TEXT)[0]
    assert m.to_string(ids[3]) == m.to_string(ids[3:4]) and isinstance(m.to_string(ids[3]), str)
    d = m.tokens_to_residual_directions(ids[:2])
    assert d.shape == (2, m.cfg.d_model) and torch.equal(d[1], m.W_U[:, ids[1]])
    rows = m.test_prompt("ab", "c", print_details=False)
    prompt = m.to_tokens("ab")[0]
    tok = m.tokenizer(" c", add_special_tokens=False)["input_ids"][0]
    row = m(torch.cat([prompt, torch.tensor([tok])])[None])[0, len(prompt) - 1]
    assert rows[0]["rank"] == int((row > row[tok]).sum()) and abs(rows[0]["logit"] - float(row[tok])) < 1e-5


def test_cache_helpers_take_transformer_lens_arguments():
    """The cache helpers with TL's arguments, against TransformerLens's own ActivationCache on the bridge."""
    m = model_on("transformer_lens")
    ids = m.to_tokens([TEXT, "The cat sat on the mat ok"])
    _, cache = m.run_with_cache(ids)
    _, tl_cache = m.tl.run_with_cache(ids)
    acc, labels = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)
    tl_acc, tl_labels = tl_cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True)
    assert labels == tl_labels and acc.shape == tl_acc.shape == (3 * 2 + 1, 2, m.cfg.d_model)
    assert torch.allclose(acc, tl_acc, atol=1e-5)
    part, part_labels = cache.accumulated_resid(layer=1, return_labels=True)
    assert part_labels == tl_cache.accumulated_resid(layer=1, return_labels=True)[1] == ["0_pre", "1_pre"]
    dec, dec_labels = cache.decompose_resid(layer=-1, pos_slice=(1, 3), return_labels=True)
    tl_dec, tl_dec_labels = tl_cache.decompose_resid(layer=-1, pos_slice=(1, 3), return_labels=True)
    assert dec_labels == tl_dec_labels and torch.allclose(dec, tl_dec, atol=1e-5)
    heads, head_labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    tl_heads, tl_head_labels = tl_cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    assert head_labels == tl_head_labels and torch.allclose(heads, tl_heads, atol=1e-4)
    rem, rem_labels = cache.stack_head_results(layer=2, incl_remainder=True, return_labels=True)
    assert rem_labels[-1] == "remainder" and torch.allclose(rem.sum(0), cache["resid_post", 1], atol=1e-5)
    # negative layer keys, remove_batch_dim
    assert torch.equal(cache["resid_post", -1], cache["blocks.2.hook_resid_post"])
    _, one = m.run_with_cache(TEXT)
    shape = one["blocks.0.hook_resid_pre"].shape
    assert one.remove_batch_dim() is one and one["blocks.0.hook_resid_pre"].shape == shape[1:]  # in place, as TL
    with pytest.raises(ValueError, match="one-example"):
        cache.remove_batch_dim()
    # the logit lens with a position slice: the last entry through the final norm is the logits there
    lens = cache.accumulated_resid(apply_ln=True, pos_slice=-1) @ m.W_U + m.b_U
    assert torch.allclose(lens[-1], m(ids)[:, -1], atol=1e-4)
    sliced = cache.apply_ln_to_stack(cache.decompose_resid(pos_slice=-1), pos_slice=-1)
    assert torch.allclose(sliced, cache.apply_ln_to_stack(cache.decompose_resid())[:, :, -1], atol=1e-6)
    for bad in (4, -2):  # -1 and 3 (n_layers) are the final norm (TL); other negatives are ambiguous
        with pytest.raises(ValueError, match="out of range"):
            cache.apply_ln_to_stack(dec, layer=bad)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_block_norms_position_table_and_apply_ln_to_stack_per_block(arch, backend):
    """``blocks[l].ln1.w`` / ``ln2.b``, ``weight("ln1.w")``, ``W_pos``, and ``apply_ln_to_stack(layer=l,
    mlp_input=...)`` (TransformerLens's block-norm variant, with the norm's own weight): checked against the
    Hugging Face norm modules applied to the cached residual (non-identity gains and biases)."""
    hf, tok = tiny_model(arch, seed=5, n_layers=3, perturb_norms=True)
    blocks = hf.model.layers if arch == "llama" else hf.transformer.h
    ln1 = [b.input_layernorm if arch == "llama" else b.ln_1 for b in blocks]
    ln2 = [b.post_attention_layernorm if arch == "llama" else b.ln_2 for b in blocks]
    m = interp.wrap(hf, tok, backend=backend)
    assert torch.equal(m.blocks[1].ln1.w, ln1[1].weight.detach()) and torch.equal(m.blocks[-1].ln2.w, ln2[2].weight.detach())
    assert torch.equal(m.weight("ln2.w"), torch.stack([n.weight.detach() for n in ln2]))
    if arch == "gpt2":
        assert torch.equal(m.weight("ln1.b")[2], ln1[2].bias.detach())
        assert torch.equal(m.W_pos, hf.transformer.wpe.weight.detach())
        assert torch.equal(m.weight("ln_final.b"), hf.transformer.ln_f.bias.detach())
    else:  # RMSNorm: no bias (zeros, as TransformerLens), no position table (rotary)
        assert torch.equal(m.blocks[0].ln1.b, torch.zeros(m.cfg.d_model))
        with pytest.raises(KeyError, match="no learned position table"):
            m.W_pos
    with pytest.raises(KeyError, match="closest"):
        m.weight("ln3.w")
    _, cache = m.run_with_cache(["When Mary and John went to the store", "Hi there"])
    with torch.no_grad():
        ref1 = ln1[1](cache["resid_pre", 1])
        ref2 = ln2[2](cache["resid_mid", 2])
    got1 = cache.apply_ln_to_stack(cache["resid_pre", 1][None], layer=1, include_weight=True, include_bias=True)[0]
    got2 = cache.apply_ln_to_stack(cache["resid_mid", 2][None], layer=2, mlp_input=True, include_weight=True,
                                   include_bias=True)[0]
    assert torch.allclose(got1, ref1, atol=2e-6) and torch.allclose(got2, ref2, atol=2e-6)
    # pos_slice: the stack holds only those positions, the scale is sliced alike; batch_slice (TL's) slices the
    # stack's batch axis and the scale's
    last = cache.apply_ln_to_stack(cache["resid_mid", 2][:, -1][None], layer=2, mlp_input=True, pos_slice=-1,
                                   include_weight=True, include_bias=True)[0]
    row = cache.apply_ln_to_stack(cache["resid_mid", 2][None], layer=2, mlp_input=True, batch_slice=1,
                                  include_weight=True, include_bias=True)[0]
    assert torch.allclose(last, ref2[:, -1], atol=2e-6) and torch.allclose(row, ref2[1], atol=2e-6)
    # a decomposition through a block norm (with its weight) sums to that norm's output (less its bias, added once)
    parts = cache.decompose_resid(layer=1)
    bias = m.blocks[1].ln1.b
    assert torch.allclose(cache.apply_ln_to_stack(parts, layer=1, include_weight=True).sum(0) + bias, ref1, atol=1e-5)
    # TL's default leaves the weight out (TL assumes fold_ln): the same parts, not multiplied by it
    w = m.blocks[1].ln1.w
    assert torch.allclose(cache.apply_ln_to_stack(parts, layer=1) * w, cache.apply_ln_to_stack(
        parts, layer=1, include_weight=True), atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prepend_bos_rules_every_text_input_as_transformer_lens(backend):
    """``model.prepend_bos = True`` gives TransformerLens's tokens (the bridge's own ``to_tokens``) for every text
    input: ``to_tokens``, ``model(text)``, ``run_with_cache(text)``; the default (``None``) is the tokenizer's
    rule on every backend; ``False`` strips a BOS; the per-call argument wins over the attribute."""
    hf, tok = tiny_model("llama", seed=5, n_layers=3, perturb_norms=True)
    m = interp.wrap(hf, tok, backend=backend)
    bos = tok.bos_token_id
    plain = m.to_tokens([TEXT, "Hi"])
    assert plain[0, 0] != bos  # the tiny tokenizer adds no BOS of its own
    try:
        m.prepend_bos = True
        tl_ids = m.to_tokens([TEXT, "Hi"])
        assert (tl_ids[:, 0] == bos).all() and torch.equal(tl_ids[0, 1:], plain[0])
        assert torch.equal(m(TEXT), m(tl_ids[:1]))  # strings follow the same rule
        _, cache = m.run_with_cache(TEXT)
        assert cache["blocks.0.hook_resid_pre"].shape[1] == len(tl_ids[0])
        assert torch.equal(m.to_tokens(TEXT, prepend_bos=False)[0], plain[0])
        if backend == "transformer_lens":  # what the bridge itself gives
            assert torch.equal(m.tl.to_tokens(TEXT, prepend_bos=True)[0], tl_ids[0])
    finally:
        m.prepend_bos = None
    assert torch.equal(m.to_tokens([TEXT, "Hi"]), plain)


def test_load_takes_the_tl_bos_default_in_its_one_line(tmp_path):
    """``interp.load(..., prepend_bos=True)``: a TL notebook's loading line changed, nothing else."""
    from interp.testing import tiny_model
    tiny_model("llama", folder=tmp_path)
    model = interp.load(str(tmp_path), prepend_bos=True)
    assert model.prepend_bos is True
    assert int(model.tokenize(["Hi"])["input_ids"][0, 0]) == model.tokenizer.bos_token_id
    assert interp.load(str(tmp_path)).prepend_bos is None
