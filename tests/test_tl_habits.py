"""TransformerLens habits on every backend (issue #11): the workflows a TransformerLens user reaches for
first, on a 4-layer Llama with non-identity norm weights and on GPT-2 (LayerNorm with biases), and, under
``-m slow``, on ``zoo:smollm2-135m``. Each result is checked against a hand computation or the model's
own logits, and across backends."""
from __future__ import annotations

import functools

import pytest
import torch

import interp
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
TEXTS = ["When Mary and John went to the store, John gave a drink to", "The cat sat"]


@functools.lru_cache(maxsize=None)
def model_on(arch: str, backend: str) -> interp.Model:
    hf, tok = tiny_model(arch, seed=4, n_layers=4, perturb_norms=True)
    return interp.wrap(hf, tok, backend=backend)


CASES = [pytest.param(a, b, id=f"{a}-{b}") for a in ("llama", "gpt2") for b in BACKENDS]


def _habits(model: interp.Model, texts=TEXTS, atol: float = 1e-4) -> dict[str, torch.Tensor]:
    n = model.cfg.n_layers
    tokens = model.to_tokens(texts)
    mask = model.tokenize(texts, padding_side="right")["attention_mask"]
    logits, cache = model.run_with_cache({"input_ids": tokens, "attention_mask": mask})
    last = mask.sum(1) - 1
    rows = torch.arange(len(texts))
    out: dict[str, torch.Tensor] = {"logits": logits}

    # cache shorthand and stacking
    assert torch.equal(cache["resid_post", 2], cache["blocks.2.hook_resid_post"])
    assert torch.equal(cache["scale"], cache["ln_final.hook_scale"])
    assert cache.stack("hook_resid_post").shape == (n, *cache["blocks.0.hook_resid_post"].shape)

    # logit lens: the final entry of the accumulated residual, through the final norm and W_U, is the logits
    acc, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)
    assert labels[-1] == "final_post" and acc.shape[0] == n + 1
    lens_logits = acc @ model.weight("W_U") + model.weight("b_U")
    assert (lens_logits[-1] - logits).abs().max() < atol
    out["logit_lens"] = lens_logits[:, rows, last]

    # direct logit attribution: components through the run's norm sum to the true logit difference
    a_tok, b_tok = logits[rows, last].topk(2, -1).indices.unbind(-1)
    parts, part_labels = cache.decompose_resid(return_labels=True)
    assert (parts.sum(0) - cache[f"blocks.{n - 1}.hook_resid_post"]).abs().max() < atol
    scaled = cache.apply_ln_to_stack(parts, include_weight=True)  # TL's default leaves the weight to fold_ln
    W_U = model.weight("W_U")
    dla = torch.stack([(scaled[:, i, last[i]] @ (W_U[:, a_tok[i]] - W_U[:, b_tok[i]])) for i in range(len(texts))], 1)
    bias = cache.ln_bias_term() @ (W_U[:, a_tok] - W_U[:, b_tok])
    true = logits[rows, last, a_tok] - logits[rows, last, b_tok]
    assert (dla.sum(0) + bias - true).abs().max() < atol
    attrs = cache.logit_attrs(scaled, a_tok, b_tok, pos=-1)  # interp's earlier form: a normalised stack
    manual = torch.stack([scaled[:, i, -1] @ (W_U[:, a_tok[i]] - W_U[:, b_tok[i]]) for i in range(len(texts))], 1)
    assert attrs.shape == (len(part_labels), len(texts)) and (attrs - manual).abs().max() < atol
    # TL's form: the raw stack and pos_slice; the norm's scale without its weight, as TL's
    tl_attrs = cache.logit_attrs(parts[:, :, -1], a_tok, b_tok, pos_slice=-1)
    unweighted = cache.apply_ln_to_stack(parts)[:, :, -1]
    manual = torch.stack([unweighted[:, i] @ (W_U[:, a_tok[i]] - W_U[:, b_tok[i]]) for i in range(len(texts))], 1)
    assert (tl_attrs - manual).abs().max() < atol
    out["dla"] = dla

    # per-head results: summed over heads plus b_O they are the attention output
    heads, head_labels = cache.stack_head_results(return_labels=True)
    H = model.cfg.n_heads
    assert head_labels[:2] == ["L0H0", "L0H1"] and heads.shape[0] == n * H
    for layer in (0, n - 1):
        total = heads[layer * H:(layer + 1) * H].sum(0) + model.weight("b_O")[layer]
        assert (total - cache[f"blocks.{layer}.hook_attn_out"]).abs().max() < atol
    out["heads"] = heads[:, rows, last]

    # stop_at_layer returns the residual where it stopped; unembed of the full residual is the logits
    r = model(tokens, attention_mask=mask, stop_at_layer=2)
    assert torch.equal(r, cache["blocks.1.hook_resid_post"]) or (r - cache["blocks.1.hook_resid_post"]).abs().max() < 1e-6
    final = cache[f"blocks.{n - 1}.hook_resid_post"]
    assert (model.unembed(model.ln_final(final)) - logits).abs().max() < atol  # TL's modules: unembed adds no norm
    assert (model.unembed(final, apply_ln=True) - logits).abs().max() < atol

    # callable name filters and run_with_hooks with TransformerLens's (tensor, hook) signature
    names = model.hook_names(lambda nm: nm.endswith("ln2.hook_normalized"))
    assert names == [f"blocks.{l}.ln2.hook_normalized" for l in range(n)]
    seen = []
    ablated = model.run_with_hooks({"input_ids": tokens, "attention_mask": mask},
                                   fwd_hooks=[(lambda nm: nm == "blocks.1.attn.hook_z",
                                               lambda z, hook: (seen.append(hook.name), z * 0)[1])])
    assert seen == ["blocks.1.attn.hook_z"] and (ablated - logits).abs().max() > 1e-3
    out["ablated"] = ablated

    # activation patching: patching the clean run's residual at the last real token restores its logits
    corrupt = tokens.clone()
    corrupt[:, 0] = (corrupt[:, 0] + 7) % model.cfg.d_vocab
    name = f"blocks.{n - 1}.hook_resid_post"
    with model.intervene({name: interp.Patch(cache, positions=[-1])}):
        patched = model({"input_ids": corrupt, "attention_mask": mask})
    assert (patched[rows, 0] - logits[rows, 0]).abs().max() > 1e-3  # the corruption did change things
    assert (patched[rows, last] - logits[rows, last]).abs().max() < atol
    return out


@pytest.mark.parametrize("arch,backend", CASES)
def test_tl_habits_hold(arch, backend):
    _habits(model_on(arch, backend))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tl_habits_agree_across_backends(arch):
    results = {b: _habits(model_on(arch, b)) for b in BACKENDS}
    for b in BACKENDS[1:]:
        for key, ref in results["torch"].items():
            assert (results[b][key] - ref).abs().max() < 1e-4, (b, key)


def test_tokens_round_trip_and_bos_rule():
    model = model_on("llama", "torch")
    ids = model.to_tokens("hello")
    assert model.to_string(ids[0]) == "hello"
    assert model.to_str_tokens("hi!") == ["h", "i", "!"]
    bos = model.tokenizer.bos_token_id
    with_bos = model.to_tokens("hello", prepend_bos=True)
    assert with_bos[0, 0] == bos and torch.equal(with_bos[:, 1:], ids)
    assert torch.equal(model.to_tokens(model.to_string(with_bos[0]), prepend_bos=False), ids)
    assert model.to_single_token("a") == ids.new_tensor(model.tokenizer("a", add_special_tokens=False)["input_ids"])[0]
    with pytest.raises(ValueError, match="not one"):
        model.to_single_token("ab")


def test_weights_agree_with_transformer_lens():
    for arch in ("llama", "gpt2", "gpt_neox", "gemma"):
        ours = interp.wrap(*tiny_model(arch, seed=5, n_layers=3, perturb_norms=True), backend="torch")
        tl = interp.wrap(*tiny_model(arch, seed=5, n_layers=3, perturb_norms=True), backend="transformer_lens")
        for name in ("W_E", "W_U", "W_Q", "W_K", "W_V", "W_O", "b_O", "W_in", "W_out"):
            assert torch.allclose(ours.weight(name), tl.weight(name), atol=1e-6), (arch, name)
        assert ours.can_write("blocks.0.ln1.hook_scale") and ours.can_write("blocks.0.ln1.hook_normalized")


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_tl_habits_on_smollm2(backend):
    model = interp.load("zoo:smollm2-135m", backend=backend)
    res = _habits(model, atol=2e-3)
    top = res["logits"][0, -1].argmax()
    assert model.to_string([int(top)]) == " Mary"  # the IOI sanity check of assets.md


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_add_to_weight_writes_in_tl_shape_and_reverts(arch):
    model = interp.wrap(*tiny_model(arch, seed=6, n_layers=3), backend="torch")
    before = model(TEXTS)
    for name in ("W_out", "W_in", "W_O", "b_O" if arch == "gpt2" else "W_gate"):
        w = model.weight(name)[1]
        delta = torch.randn_like(w) * 0.1
        model.add_to_weight(name, 1, delta)
        assert torch.allclose(model.weight(name)[1], w + delta, atol=1e-6)
        assert torch.equal(model.weight(name)[0], model.weight(name)[0])
        model.add_to_weight(name, 1, -delta)
        assert torch.allclose(model.weight(name)[1], w, atol=1e-6)
        # a large edit and its float64 restore: float64 round-off only (w + d - d in float32 drifts by |d| 2^-24)
        big = torch.randn_like(w) * 1e3
        model.add_to_weight(name, 1, big)
        drift = model.weight(name)[1] - big - w
        assert name == "b_O" or drift.abs().max() > 1e-5  # float32 round-off is real here (b_O starts at 0)
        model.add_to_weight(name, 1, w.double() - model.weight(name)[1].double())
        assert (model.weight(name)[1] - w).abs().max() < 1e-9
    assert (model(TEXTS) - before).abs().max() < 1e-5
    with pytest.raises(ValueError, match="shape"):
        model.add_to_weight("W_out", 1, torch.zeros(3))
    tl = interp.wrap(*tiny_model(arch, seed=6, n_layers=3), backend="transformer_lens")
    with pytest.raises(ValueError, match="torch and nnsight"):
        tl.add_to_weight("W_out", 1, torch.zeros_like(tl.weight("W_out")[1]))
