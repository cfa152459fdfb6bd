"""Hook points inside attention on the HF backends (issue #11): ``attn.hook_rot_q/rot_k`` (after rotary),
``attn.hook_attn_scores`` (pre-softmax, masked entries ``-inf``), ``attn.hook_pattern`` (now writable) from
the hook-calling attention implementation, and ``attn.hook_result`` (per-head output) on every backend.

References: the TransformerLens bridge's own hooks (to 1e-5) where it fires them, hand computations from
``hook_q/k`` and HF's eager ``output_attentions`` where it does not (BERT, ViT, DINOv2, GPT-NeoX's rotated
q/k); left- and right-padded batches against unbatched rows; writes and generation across backends."""
from __future__ import annotations

import functools

import pytest
import torch

import interp
from interp.backends.attention import IMPL
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
ROTARY = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gpt_neox")
TEXTS = ["Hello world, this is a test.", "Hi"]
NEW = ("attn.hook_rot_q", "attn.hook_rot_k", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_result")


@functools.lru_cache(maxsize=None)
def model_on(arch: str, backend: str) -> interp.Model:
    """One HF module per backend (the bridge rewires the module it wraps); three layers, non-identity norms."""
    hf, tok = tiny_model(arch, seed=0, n_layers=3, perturb_norms=True)
    return interp.wrap(hf, tok, backend=backend)


def new_names(model: interp.Model) -> list[str]:
    return [n for n in model.hook_names() if n.split(".", 2)[-1] in NEW]


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max difference of two tensors that may hold ``-inf`` (which must sit at the same entries)."""
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    assert torch.equal(torch.isinf(a), torch.isinf(b)), "masked entries differ"
    f = torch.isfinite(a)
    return float((a[f] - b[f]).abs().max()) if f.any() else 0.0


@pytest.mark.parametrize("arch", ROTARY + ("gpt2",))
@pytest.mark.parametrize("side", ["right", "left"])
def test_values_equal_the_bridge(arch, side):
    caches = {}
    for backend in BACKENDS:
        model = model_on(arch, backend)
        batch = model.tokenize(TEXTS, padding_side=side)
        _, caches[backend] = model.run_with_cache(batch, names=new_names(model))
    ref = caches["transformer_lens"]
    offered = {n.split(".", 2)[-1] for n in caches["torch"]}
    assert offered == set(NEW) if arch in ROTARY else offered == set(NEW) - {"attn.hook_rot_q", "attn.hook_rot_k"}
    assert {n.split(".", 2)[-1] for n in caches["nnsight"]} == offered
    compared = set()
    for backend in ("torch", "nnsight"):
        for name, t in caches[backend].items():
            if name in ref:  # the bridge fires everything but GPT-NeoX's rotated q/k
                assert diff(t, ref[name]) < 1e-5, (backend, name)
                compared.add(name.split(".", 2)[-1])
    assert compared == offered - ({"attn.hook_rot_q", "attn.hook_rot_k"} if arch == "gpt_neox" else set())
    # shapes and conventions: GQA keys keep n_kv_heads; masked scores are -inf, their pattern entries 0
    m = model_on(arch, "torch")
    c = caches["torch"]
    B, P = 2, c["blocks.0.attn.hook_pattern"].shape[-1]
    if arch in ROTARY:
        assert c["blocks.1.attn.hook_rot_q"].shape == (B, P, m.cfg.n_heads, m.cfg.d_head)
        assert c["blocks.1.attn.hook_rot_k"].shape == (B, P, m.cfg.n_kv_heads, m.cfg.d_head)
    scores, pattern = c["blocks.2.attn.hook_attn_scores"], c["blocks.2.attn.hook_pattern"]
    assert torch.isneginf(scores[0]).sum() == m.cfg.n_heads * P * (P - 1) // 2  # causal, no padding in row 0
    assert torch.equal(pattern == 0, torch.isneginf(scores) | (pattern == 0))
    assert (pattern[torch.isneginf(scores)] == 0).all()
    assert c["blocks.0.attn.hook_result"].shape == (B, P, m.cfg.n_heads, m.cfg.d_model)
    # the padded row equals the same text run alone, on its real positions
    mask = m.tokenize(TEXTS, padding_side=side)["attention_mask"][1].bool()
    _, alone = m.run_with_cache(TEXTS[1], names=new_names(m))
    for name in alone:
        got = c[name][1]
        if name.endswith(("scores", "pattern")):
            got = got[:, mask][:, :, mask]
        else:
            got = got[mask]
        assert diff(got, alone[name][0]) < 1e-5, name


@pytest.mark.parametrize("arch", ["bert", "vit", "dinov2", "gpt_neox", "gpt2", "esm"])
@pytest.mark.parametrize("backend", ["torch", "nnsight"])
def test_scores_and_pattern_by_hand(arch, backend):
    """Where the bridge does not fire them: scores are ``q k^T / sqrt(d_head)`` (rotated q/k for GPT-NeoX,
    whose rotation leaves position 0 and the non-rotary dimensions as they are, and for ESM, which scales the
    query by ``1/sqrt(d_head)`` before rotating it), masked entries ``-inf``, and the pattern equals HF eager
    attention's ``output_attentions``."""
    model = model_on(arch, backend)
    hf = model.hf_model
    vision = arch in ("vit", "dinov2")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)) if vision else model.tokenize(TEXTS)
    _, cache = model.run_with_cache(x, names=[n for n in model.hook_names() if ".attn." in n])
    batch = model.prepare(x)
    old = hf.config._attn_implementation
    hf.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            ref = hf(**model._kwargs(batch), output_attentions=True)
    finally:
        hf.config._attn_implementation = old
    mask = batch.get("attention_mask")
    d = model.cfg.d_head
    for layer in range(model.cfg.n_layers):
        pre = "rot_" if arch in ("gpt_neox", "esm") else ""
        q, k = cache[f"blocks.{layer}.attn.hook_{pre}q"], cache[f"blocks.{layer}.attn.hook_{pre}k"]
        scale = 1.0 if arch == "esm" else d ** -0.5
        if pre:
            raw_q = cache[f"blocks.{layer}.attn.hook_q"] / (d ** 0.5 if arch == "esm" else 1.0)
            rot = int(d * 0.25) if arch == "gpt_neox" else d  # rotary_pct of the tiny GPT-NeoX config
            assert torch.allclose(q[:, 0], raw_q[:, 0], atol=1e-6) and torch.allclose(q[..., rot:], raw_q[..., rot:])
            assert (q[:, 1:, :, :rot] - raw_q[:, 1:, :, :rot]).abs().max() > 1e-3
        want = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"]
        blocked = torch.isneginf(scores)
        assert (scores - want)[~blocked].abs().max() < 1e-5
        if mask is not None:  # padded keys are masked in every row (BERT) / with the causal mask (GPT)
            assert blocked[1][:, :, ~mask[1].bool()].all()
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        real = torch.ones(pattern.shape[0], pattern.shape[-1], dtype=torch.bool) if mask is None else mask.bool()
        keep = real[:, None, :, None] & real[:, None, None, :]
        assert ((pattern - ref.attentions[layer]) * keep).abs().max() < 1e-5


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert", "dinov2", "esm"])
def test_head_result_sums_to_attn_out(arch):
    """``hook_result`` is ``z_h @ W_O[h]``: equal to ``cache.stack_head_results`` and across backends, and its
    sum over heads plus ``b_O`` is the attention output."""
    # the bridge computes hook_result (use_attn_result) for its decoder attention, not for BERT's
    backends = BACKENDS if arch in ("llama", "gpt2") else BACKENDS[:2]
    vision = arch == "dinov2"
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2)) if vision else TEXTS
    res = {}
    for backend in backends:
        model = model_on(arch, backend)
        _, cache = model.run_with_cache(x)
        n, H = model.cfg.n_layers, model.cfg.n_heads
        result = torch.stack([cache[f"blocks.{l}.attn.hook_result"] for l in range(n)])  # [L, b, p, H, d]
        stacked = cache.stack_head_results().unflatten(0, (n, H)).permute(0, 2, 3, 1, 4)
        assert (result - stacked).abs().max() < 1e-6, backend
        assert torch.equal(cache["result", 1], cache["blocks.1.attn.hook_result"])  # TransformerLens shorthand
        if arch != "dinov2":  # DINOv2's layer scale sits between the projection and hook_attn_out
            total = result.sum(-2) + model.weight("b_O")[:, None, None]
            out = torch.stack([cache[f"blocks.{l}.hook_attn_out"] for l in range(n)])
            assert (total - out).abs().max() < 1e-5, backend
        res[backend] = result
    for backend in backends[1:]:
        assert (res[backend] - res["torch"]).abs().max() < 1e-5, backend


def _edits(arch: str, model: interp.Model) -> dict:
    H = model.cfg.n_heads

    def zero_head_1(p, ctx):  # a pattern-dependent write: zero head 1 where it attends mostly to one key
        keep = torch.ones(H, 1, 1)
        keep[1] = 0
        return torch.where(p.amax(-1, keepdim=True) > 0.3, p * keep, p)

    def shift_scores(s, ctx):
        bias = torch.zeros(H, 1, 1)
        bias[0] = 2.0
        return s + bias

    edits = {"blocks.1.attn.hook_pattern": zero_head_1, "blocks.2.attn.hook_attn_scores": shift_scores,
             "blocks.0.attn.hook_result": interp.Ablate(heads=[2])}
    if arch in ROTARY and arch != "gpt_neox":  # the bridge does not fire GPT-NeoX's rotated q/k
        edits.update({"blocks.0.attn.hook_rot_q": interp.Scale(1.7), "blocks.2.attn.hook_rot_k": interp.Scale(-0.8)})
    return edits


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt_neox", "gpt2"])
def test_writes_agree_across_backends(arch):
    outs = {}
    for backend in BACKENDS:
        model = model_on(arch, backend)
        with model.intervene(_edits(arch, model)):
            outs[backend] = model(TEXTS)
    torch_model = model_on(arch, "torch")
    clean = torch_model(TEXTS)
    mask = torch_model.prepare(TEXTS)["attention_mask"].bool()
    assert (outs["torch"] - clean)[mask].abs().max() > 1e-2
    for backend in BACKENDS[1:]:
        assert (outs[backend] - outs["torch"])[mask].abs().max() < 1e-4, backend
    # a write to hook_result of head 2 equals zeroing head 2's z
    for backend in ("torch", "nnsight"):
        model = model_on(arch, backend)
        with model.intervene({"blocks.0.attn.hook_result": interp.Ablate(heads=[2])}):
            a = model(TEXTS)
        with model.intervene({"blocks.0.attn.hook_z": interp.Ablate(heads=[2])}):
            b = model(TEXTS)
        assert (a - b)[mask].abs().max() < 1e-5 and (a - clean)[mask].abs().max() > 1e-3
    assert torch_model.can_write("blocks.0.attn.hook_pattern") and torch_model.can_write("blocks.0.attn.hook_result")


def test_generation_passes_and_kv_cache_writes():
    """Pass semantics are unchanged: pass 0 sees the prompt, pass k the new token against the cache (one
    position of rot_q/rot_k, one query row of the pattern over all keys so far). A write to ``hook_rot_k``
    reaches the key/value cache, so KV-cached generation equals the TransformerLens backend's full
    recomputation and HF ``generate`` under the same context."""
    prompts = ["Hello there", "A"]
    texts = {}
    for backend in BACKENDS:
        model = model_on("llama", backend)
        edits = {"blocks.*.attn.hook_rot_k": interp.Scale(3.0), "blocks.1.attn.hook_pattern": _edits("llama", model)["blocks.1.attn.hook_pattern"]}
        with model.intervene(edits):
            texts[backend] = model.generate(prompts, max_new_tokens=6, return_text=False, stop_at_eos=False)
    plain = model_on("llama", "torch").generate(prompts, max_new_tokens=6, return_text=False, stop_at_eos=False)
    assert not torch.equal(texts["torch"], plain)
    for backend in BACKENDS[1:]:
        assert torch.equal(texts[backend], texts["torch"]), backend

    model = model_on("llama", "torch")
    with model.capture(["blocks.0.attn.hook_rot_k", "blocks.0.attn.hook_pattern"]) as cache:
        model.generate(prompts, max_new_tokens=3, stop_at_eos=False)
    ks, ps = cache.passes("blocks.0.attn.hook_rot_k"), cache.passes("blocks.0.attn.hook_pattern")
    P = ks[0].shape[1]
    assert [k.shape[1] for k in ks] == [P, 1, 1] and [p.shape[-2:] for p in ps] == [(P, P), (1, P + 1), (1, P + 2)]
    assert all(torch.allclose(p.sum(-1)[0], torch.ones(1)) for p in ps[1:])

    batch = model.tokenize(prompts, padding_side="left")
    with model.intervene({"blocks.*.attn.hook_rot_k": interp.Scale(3.0)}), torch.no_grad():
        hf_ids = model.hf_model.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=258)
    with model.intervene({"blocks.*.attn.hook_rot_k": interp.Scale(3.0)}):
        ours = model.generate(prompts, max_new_tokens=6, return_text=False, stop_at_eos=False)
    assert torch.equal(hf_ids[:, batch["input_ids"].shape[1]:], ours)


def test_switch_only_while_hooked_and_names():
    model = model_on("llama", "torch")
    hf = model.hf_model
    before = hf.config._attn_implementation
    assert before != IMPL
    model(TEXTS)
    assert hf.config._attn_implementation == before
    a = model.capture("blocks.0.attn.hook_pattern")
    b = model.intervene({"blocks.1.attn.hook_attn_scores": interp.Scale(1.0)})
    a.__enter__()
    b.__enter__()
    assert hf.config._attn_implementation == IMPL
    a.__exit__(None, None, None)  # closed out of order: the other context still needs the switch
    assert hf.config._attn_implementation == IMPL
    b.__exit__(None, None, None)
    assert hf.config._attn_implementation == before
    with pytest.raises(interp.UnknownHookError, match="hook_rot_k"):
        model.run_with_cache(TEXTS, names="blocks.0.attn.hook_rot_kk")
    assert "blocks.0.attn.hook_rot_q" not in model_on("gpt2", "torch").hook_names()
    assert model.hook_names("blocks.0.attn.hook_*")[-5:] == [f"blocks.0.attn.hook_{k}" for k in
                                                            ("rot_k", "attn_scores", "pattern", "z", "result")]


@pytest.mark.parametrize("backend", ["torch", "nnsight"])
def test_gradients_through_pattern_with_left_padding(backend):
    model = model_on("llama", backend)
    batch = model.tokenize(TEXTS, padding_side="left")
    res = model.gradients(batch, ["blocks.1.attn.hook_pattern", "blocks.0.attn.hook_rot_k", "blocks.0.attn.hook_result"])
    for name in ("blocks.1.attn.hook_pattern", "blocks.0.attn.hook_rot_k", "blocks.0.attn.hook_result"):
        g = res.grads[name]
        assert torch.isfinite(g).all() and g.abs().max() > 0, name


@pytest.mark.parametrize("side", ["right", "left"])
def test_esm_padding_and_writes(side):
    """ESM (torch and nnsight): padded rows equal the text run alone on real positions (position ids from the
    mask drive its rotary embeddings), and writes inside attention agree across the two backends."""
    models = [model_on("esm", b) for b in ("torch", "nnsight")]
    batch = models[0].tokenize(TEXTS, padding_side=side)
    real = batch["attention_mask"][1].bool()
    names = new_names(models[0]) + ["blocks.2.hook_resid_post"]
    _, cache = models[0].run_with_cache(batch, names=names)
    _, alone = models[0].run_with_cache(TEXTS[1], names=names)
    for name in alone:
        got = cache[name][1]
        got = got[:, real][:, :, real] if name.endswith(("scores", "pattern")) else got[real]
        assert diff(got, alone[name][0]) < 1e-5, name
    outs = []
    for model in models:
        with model.intervene(_edits("esm", model)):
            outs.append(model(batch))
    assert (outs[0] - outs[1])[batch["attention_mask"].bool()].abs().max() < 1e-5
    assert (outs[0] - models[0](batch))[batch["attention_mask"].bool()].abs().max() > 1e-3


@pytest.mark.slow
def test_protein_mlm_zoo_entry_loads_on_hf_backends():
    """``interp.load("zoo:protein-mlm-toy-8")`` (built here if the cache is cold: ~30 s) on torch and nnsight:
    the last block's residual through the final norm is HF's last hidden state, and both backends agree."""
    seqs = ["MKTAYIAKQRQISFVKSHFSRQ", "MKV"]
    res = {}
    for backend in ("torch", "nnsight"):
        model = interp.load("zoo:protein-mlm-toy-8", backend=backend)
        assert model.cfg.family == "esm" and not model.cfg.is_causal_lm
        res[backend] = model.run_with_cache(seqs)
    out, cache = res["torch"]
    batch = model.prepare(seqs)
    with torch.no_grad():
        ref = model.hf_model(**model._kwargs(batch), output_hidden_states=True)
    mask = batch["attention_mask"].bool()
    last = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    final = model.apply_ln_final(last)
    assert (final - ref.hidden_states[-1])[mask].abs().max() < 1e-5
    assert (res["nnsight"][0] - out)[mask].abs().max() < 1e-6


def test_sliding_window_masks_match_the_bridge():
    """Mistral with a 4-token sliding window, left padding: scores keep at most 4 finite keys per query row,
    equal to the bridge's, and a scores write agrees across backends."""
    caches, outs = {}, {}
    for backend in BACKENDS:
        hf, tok = tiny_model("mistral", seed=1, n_layers=3, perturb_norms=True)
        hf.config.sliding_window = 4
        model = interp.wrap(hf, tok, backend=backend)
        batch = model.tokenize(TEXTS, padding_side="left")
        _, caches[backend] = model.run_with_cache(batch, names=["blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern"])
        with model.intervene({"blocks.2.attn.hook_attn_scores": interp.Scale(0.3)}):
            outs[backend] = model(batch)
    scores = caches["torch"]["blocks.1.attn.hook_attn_scores"]
    assert int(torch.isfinite(scores).sum(-1).max()) == 4 and int(torch.isfinite(scores[0, 0, -1]).sum()) == 4
    real = batch["attention_mask"].bool()
    for backend in BACKENDS[1:]:
        for name in caches["torch"]:
            assert diff(caches[backend][name], caches["torch"][name]) < 1e-5, (backend, name)
        assert (outs[backend] - outs["torch"])[real].abs().max() < 1e-4, backend


@pytest.mark.parametrize("arch", ["bert", "vit", "dinov2"])
def test_encoder_writes_agree_on_hf_backends(arch):
    """Encoders (no bridge pattern/scores): pattern, scores and head-result writes agree between torch and
    nnsight, change the output, and a head-result ablation equals ablating that head's z."""
    vision = arch in ("vit", "dinov2")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)) if vision else TEXTS
    outs = []
    for backend in ("torch", "nnsight"):
        model = model_on(arch, backend)
        with model.intervene(_edits(arch, model)):
            outs.append(model(x))
        with model.intervene({"blocks.1.attn.hook_result": interp.Ablate(heads=[0, 3])}):
            a = model(x)
        with model.intervene({"blocks.1.attn.hook_z": interp.Ablate(heads=[0, 3])}):
            b = model(x)
        assert (a - b).abs().max() < 1e-5
    clean = model(x)
    real = torch.ones(clean.shape[:2], dtype=torch.bool) if vision else model.prepare(x)["attention_mask"].bool()
    assert (outs[0] - clean)[real].abs().max() > 1e-3 and (a - clean)[real].abs().max() > 1e-3
    assert (outs[0] - outs[1])[real].abs().max() < 1e-5
