"""Generation means the same on every backend (issue #11): a key-value cache everywhere.

Pass 0 reads the (left-padded) prompt, pass ``k`` only the ``k``-th new token; hooks see only the
positions a pass computes, and ``positions=[-1]`` touches the last prompt token and then each new token
once. Checked on 4-layer models with non-identity norm weights and biases, a padded batch, with and
without interventions: the TransformerLens bridge and a HookedTransformer (built from the same GPT-2
weights) against the torch backend, and each against its own library's cached ``generate`` under hooks.
"""
from __future__ import annotations

import functools

import pytest
import torch

import interp
from interp.testing import tiny_model

PROMPTS = ["ab", "abcdefg", "abcd"]
LAYERS = 4
NEW = 5
VEC = torch.randn(64, generator=torch.Generator().manual_seed(5))
CAPTURED = ["blocks.1.hook_resid_post", "blocks.3.attn.hook_z", "ln_final.hook_normalized"]


@functools.lru_cache(maxsize=None)
def wrapped(arch: str, backend: str) -> interp.Model:
    """A fresh HF model per backend (the bridge rewires its module in place), same seed, same weights."""
    hf, tok = tiny_model(arch, seed=2, n_layers=LAYERS, perturb_norms=True)
    return interp.wrap(hf, tok, backend=backend)


@functools.lru_cache(maxsize=None)
def hooked_gpt2() -> interp.Model:
    """A HookedTransformer holding the tiny GPT-2's weights (TransformerLens's own conversion)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    hf, tok = tiny_model("gpt2", seed=2, n_layers=LAYERS, perturb_norms=True)
    c = hf.config
    cfg = HookedTransformerConfig(n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head,
                                  d_mlp=4 * c.n_embd, n_ctx=c.n_positions, d_vocab=c.vocab_size, act_fn="gelu_new",
                                  normalization_type="LN", eps=c.layer_norm_epsilon, default_prepend_bos=False,
                                  original_architecture="GPT2LMHeadModel")
    ht = HookedTransformer(cfg)
    ht.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    return interp.wrap(ht.eval(), tok, backend="transformer_lens")


def model_for(arch: str, backend: str) -> interp.Model:
    return hooked_gpt2() if backend == "hooked" else wrapped(arch, backend)


def run(model: interp.Model, positions, new: int = NEW):
    """Greedy ids ``[3, new]`` and the per-pass captures of a steered, padded generation."""
    steer = {"blocks.2.hook_resid_post": interp.Add(VEC, scale=2.0, positions=positions)} if positions != "off" else {}
    with model.intervene(steer), model.capture(CAPTURED) as cache:
        ids = model.generate(PROMPTS, max_new_tokens=new, return_text=False, stop_at_eos=False)
    return ids, cache


def real(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The real-token positions of a pass-0 capture (``[batch, pos, ...]``): padding rows may differ."""
    return t[mask.bool()]


CASES = [("llama", "transformer_lens"), ("gpt2", "transformer_lens"), ("gpt2", "hooked")]


@pytest.mark.parametrize("arch,backend", CASES, ids=["bridge-llama", "bridge-gpt2", "hooked-gpt2"])
@pytest.mark.parametrize("positions", ["off", None, [-1]], ids=["plain", "all-positions", "last"])
def test_tl_generation_equals_torch_backend_pass_by_pass(arch, backend, positions):
    ref_ids, ref = run(wrapped(arch, "torch"), positions)
    ids, got = run(model_for(arch, backend), positions)
    assert torch.equal(ids, ref_ids)
    mask = wrapped(arch, "torch").tokenize(PROMPTS, padding_side="left")["attention_mask"]
    for name in CAPTURED:
        a, b = ref.passes(name), got.passes(name)
        assert len(a) == len(b) == NEW
        assert b[1].shape[1] == 1  # a cached pass computes the new token only
        assert (real(a[0], mask) - real(b[0], mask)).abs().max() < 1e-4, name
        for k in range(1, NEW):
            assert (a[k] - b[k]).abs().max() < 1e-4, (name, k)


@pytest.mark.parametrize("backend", ["transformer_lens", "hooked"])
def test_tl_generation_passes_have_their_own_mask_and_index(backend):
    model = model_for("gpt2", backend)
    seen = []

    def record(t, ctx):
        seen.append((tuple(t.shape[:2]), ctx.pass_index, tuple(ctx.attention_mask.shape), ctx.past_length,
                     tuple(ctx.key_mask.shape), ctx.generating))

    with model.intervene({"blocks.3.hook_resid_post": record}):
        model.generate(PROMPTS, max_new_tokens=3, stop_at_eos=False)
    n = max(len(p) for p in PROMPTS)  # one token per byte
    assert seen == [((3, n), 0, (3, n), 0, (3, n), True), ((3, 1), 1, (3, 1), n, (3, n + 1), True),
                    ((3, 1), 2, (3, 1), n + 1, (3, n + 2), True)]


def test_bridge_generation_equals_hf_cached_generate_under_a_hook():
    """``positions=[-1]`` = a hook on HF's own KV-cached ``generate`` adding at the last position of every call."""
    hf, tok = tiny_model("llama", seed=2, n_layers=LAYERS, perturb_norms=True)
    batch = wrapped("llama", "torch").tokenize(PROMPTS, padding_side="left")

    def hook(m, a, o):
        o = (o[0] if isinstance(o, tuple) else o).clone()
        o[:, -1] += 2.0 * VEC
        return o
    h = hf.model.layers[2].register_forward_hook(hook)
    try:
        ref = hf.generate(**batch, max_new_tokens=NEW, do_sample=False, pad_token_id=tok.pad_token_id,
                          eos_token_id=None, temperature=None, top_p=None, top_k=None)
    finally:
        h.remove()
    ids, _ = run(wrapped("llama", "transformer_lens"), [-1])
    assert torch.equal(ref[:, batch["input_ids"].shape[1]:], ids)


def test_hooked_transformer_generation_equals_its_own_cached_generate():
    """On a HookedTransformer, our cached loop = TransformerLens's ``generate(use_past_kv_cache=True)``
    with a hook adding at the last position of every call, one prompt at a time (TL pads batches
    itself); and a batched, left-padded run gives each row's unbatched continuation."""
    model = hooked_gpt2()
    ht = model.tl

    def add_last(t, hook):
        t = t.clone()
        t[:, -1] += 2.0 * VEC
        return t
    batched, _ = run(model, [-1])
    for i, p in enumerate(PROMPTS):
        toks = model.tokenize([p])["input_ids"]
        with ht.hooks(fwd_hooks=[("blocks.2.hook_resid_post", add_last)]):
            ref = ht.generate(toks, max_new_tokens=NEW, do_sample=False, use_past_kv_cache=True, stop_at_eos=False,
                              verbose=False, return_type="tokens")
        assert torch.equal(ref[0, toks.shape[1]:], batched[i]), p


def test_bridge_without_cache_support_is_refused_loudly(monkeypatch):
    """If the bridge's attention kept no cache (as before the ``cache`` argument alias), generation
    raises instead of producing text that ignores the prompt."""
    model = wrapped("gpt2", "transformer_lens")
    monkeypatch.setattr(type(model), "_cache_kwarg_alias", lambda self: [])
    with pytest.raises(RuntimeError, match="does not keep the cache"):
        model.generate(PROMPTS, max_new_tokens=2)
