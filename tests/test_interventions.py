"""Interventions, padding, errors and hook hygiene of the capture layer."""
from __future__ import annotations

import functools

import pytest
import torch

import interp
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
TEXTS = ["The cat sat on the mat.", "A dog", "Colourless green ideas sleep furiously"]


@functools.lru_cache(maxsize=None)
def llama(owner: str = "reference"):
    return tiny_model("llama", seed=1)


@functools.lru_cache(maxsize=None)
def model_on(backend: str) -> interp.Model:
    hf, tok = llama(backend)
    return interp.wrap(hf, tok, backend=backend)


def reference_logits(hook_module_fn, texts=TEXTS, side="right"):
    """Logits of the plain HF model with a hand-written forward hook on one module."""
    hf, tok = llama()
    ref = interp.wrap(hf, tok, backend="torch")
    batch = ref.prepare(ref.tokenize(texts, padding_side=side))
    module, hook = hook_module_fn(hf)
    h = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return hf(**ref._kwargs(batch)).logits, batch
    finally:
        h.remove()


def run(model, interventions, texts=TEXTS, side="right"):
    batch = model.tokenize(texts, padding_side=side)
    with model.intervene(interventions):
        return model(batch)


VEC = torch.randn(64, generator=torch.Generator().manual_seed(3))
DIRS = torch.randn(2, 64, generator=torch.Generator().manual_seed(4))


def _resid_hook(fn):
    return lambda hf: (hf.model.layers[1], lambda m, a, o: fn(o))


def _project(o):
    q, _ = torch.linalg.qr(DIRS.T)
    return o - (o @ q) @ q.T


HAND = {
    "add": (lambda: interp.Add(VEC, scale=2.0), _resid_hook(lambda o: o + 2.0 * VEC)),
    "scale": (lambda: interp.Scale(0.5), _resid_hook(lambda o: o * 0.5)),
    "zero": (lambda: interp.Ablate("zero"), _resid_hook(lambda o: torch.zeros_like(o))),
    "project": (lambda: interp.ProjectOut(DIRS), _resid_hook(_project)),
    # negative positions count from each row's last real token: with right padding that is not the last column
    "add_last": (lambda: interp.Add(VEC, positions=[-1]), _resid_hook(lambda o: _add_at_last_real(o, VEC))),
}


def _add_at_last_real(o, vec):
    hf, tok = llama()
    mask = interp.wrap(hf, tok, check=False).tokenize(TEXTS, padding_side="right")["attention_mask"]  # inside a forward hook: no check forward
    last = mask.sum(1) - 1
    assert (last < mask.shape[1] - 1).any(), "the test needs a right-padded row"
    out = o.clone()
    out[torch.arange(o.shape[0]), last] += vec
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(HAND))
def test_intervention_equals_hand_written_hook(backend, kind):
    make, hand = HAND[kind]
    want, batch = reference_logits(hand)
    got = run(model_on(backend), {"blocks.1.hook_resid_post": make()})
    real = batch["attention_mask"].bool()
    assert (got - want)[real].abs().max() < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_ablation_equals_hand_written_hook(backend):
    heads = [1, 3]

    def hand(hf):
        def pre(m, args):
            z = args[0].unflatten(-1, (4, 16)).clone()
            z[:, :, heads] = 0
            return (z.flatten(-2),)
        return hf.model.layers[0].self_attn.o_proj, pre

    hf, tok = llama()
    ref = interp.wrap(hf, tok)
    batch = ref.prepare(ref.tokenize(TEXTS))
    module, pre = hand(hf)
    h = module.register_forward_pre_hook(pre)
    with torch.no_grad():
        want = hf(**ref._kwargs(batch)).logits
    h.remove()
    got = run(model_on(backend), {"blocks.0.attn.hook_z": interp.Ablate("zero", heads=heads)})
    assert (got - want)[batch["attention_mask"].bool()].abs().max() < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_ablation_uses_cached_mean(backend):
    model = model_on(backend)
    batch = model.tokenize(TEXTS)
    _, cache = model.run_with_cache(batch, names="blocks.0.hook_mlp_out")
    mean = cache.mean("blocks.0.hook_mlp_out", batch["attention_mask"])
    with model.capture("blocks.0.hook_mlp_out") as seen, \
            model.intervene({"blocks.0.hook_mlp_out": interp.Ablate("mean", mean_from=cache, mask=batch["attention_mask"])}):
        model(batch)
    # the capture was opened first, so it sees the clean value; check the ablated value downstream instead
    with model.intervene({"blocks.0.hook_mlp_out": interp.Ablate("mean", mean_from=cache, mask=batch["attention_mask"])}):
        with model.capture("blocks.0.hook_mlp_out") as after:
            model(batch)
    assert torch.allclose(after["blocks.0.hook_mlp_out"], mean.expand_as(after["blocks.0.hook_mlp_out"]), atol=1e-6)
    assert torch.allclose(seen["blocks.0.hook_mlp_out"], cache["blocks.0.hook_mlp_out"], atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_patch_from_clean_cache_restores_clean_logits(backend):
    model = model_on(backend)
    clean, corrupt = "The cat sat on the mat.", "The dog sat on the rug."
    clean_logits, clean_cache = model.run_with_cache(clean, names="blocks.1.hook_resid_post")
    corrupt_logits = model(corrupt)
    assert (clean_logits - corrupt_logits).abs().max() > 1e-3
    with model.intervene({"blocks.1.hook_resid_post": interp.Patch(clean_cache)}):
        patched = model(corrupt)
    assert torch.allclose(patched, clean_logits, atol=1e-5)
    # patching one position changes only that position and later ones
    with model.intervene({"blocks.0.hook_resid_post": interp.Patch(model.run_with_cache(clean, names="blocks.0.hook_resid_post")[1], positions=[5])}):
        partial = model(corrupt)
    assert torch.allclose(partial[:, :5], corrupt_logits[:, :5], atol=1e-5)
    assert not torch.allclose(partial[:, 5:], corrupt_logits[:, 5:], atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_project_out_leaves_no_component(backend):
    model = model_on(backend)
    d = torch.randn(64)
    with model.intervene({"blocks.0.hook_resid_post": interp.ProjectOut(d)}):
        _, cache = model.run_with_cache(TEXTS, names="blocks.0.hook_resid_post")
    assert (cache["blocks.0.hook_resid_post"] @ (d / d.norm())).abs().max() < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_equals_unbatched(backend, side):
    model = model_on(backend)
    batched, cache = model.run_with_cache(model.tokenize(TEXTS, padding_side=side), names="blocks.1.hook_resid_post")
    mask = model.tokenize(TEXTS, padding_side=side)["attention_mask"].bool()
    for i, text in enumerate(TEXTS):
        single, single_cache = model.run_with_cache(text, names="blocks.1.hook_resid_post")
        assert torch.allclose(batched[i][mask[i]], single[0], atol=1e-4)
        assert torch.allclose(cache["blocks.1.hook_resid_post"][i][mask[i]], single_cache["blocks.1.hook_resid_post"][0], atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_generate_batched_equals_unbatched_and_obeys_interventions(backend):
    model = model_on(backend)
    prompts = ["Once upon", "A long time ago in a"]
    batched = model.generate(prompts, max_new_tokens=6, stop_at_eos=False)
    singles = [model.generate(p, max_new_tokens=6, stop_at_eos=False)[0] for p in prompts]
    assert batched == singles
    with model.intervene({"blocks.*.hook_resid_post": interp.Add(torch.randn(64) * 50)}):
        steered = model.generate(prompts, max_new_tokens=6, stop_at_eos=False)
    assert steered != batched


def test_generate_same_tokens_on_every_backend():
    outs = {b: model_on(b).generate(["Once upon", "Hi"], max_new_tokens=5, stop_at_eos=False, return_text=False)
            for b in BACKENDS}
    assert torch.equal(outs["torch"], outs["nnsight"]) and torch.equal(outs["torch"], outs["transformer_lens"])


def test_callable_intervention_and_context():
    model = model_on("torch")
    seen = []

    def fn(t, ctx):
        seen.append((ctx.name, ctx.layer, None if ctx.attention_mask is None else tuple(ctx.attention_mask.shape)))
        return t * 0
    with model.intervene({"hook_mlp_out": fn}):
        model(TEXTS)
    assert [s[0] for s in seen] == ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]
    assert seen[0][1] == 0 and seen[0][2] == tuple(model.tokenize(TEXTS)["input_ids"].shape) == (3, max(map(len, TEXTS)))


# ----------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("backend", BACKENDS)
def test_unknown_hook_names_the_closest(backend):
    model = model_on(backend)
    with pytest.raises(interp.UnknownHookError, match="blocks.1.hook_resid_post"):
        model.run_with_cache("hi", names="blocks.1.hook_resid_pst")
    with pytest.raises(interp.UnknownHookError):
        with model.intervene({"blocks.9.hook_resid_post": interp.Scale(2.0)}):
            pass


@pytest.mark.parametrize("backend", BACKENDS)
def test_shape_mismatch_says_what_was_expected(backend):
    model = model_on(backend)
    with pytest.raises(ValueError, match=r"expected a vector of shape \(64,\)"):
        with model.intervene({"blocks.0.hook_resid_post": interp.Add(torch.ones(10))}):
            model("hello")
    with pytest.raises(ValueError, match="expected"):
        with model.intervene({"blocks.0.hook_resid_post": lambda t, ctx: t[:, :1]}):
            model("hello")


def test_hook_that_never_fires_raises():
    model = model_on("torch")
    with pytest.raises(interp.HookNotFiredError):
        model.run_with_cache("hello", names=["blocks.1.hook_resid_post"], stop_at_layer=1)


@pytest.mark.parametrize("backend", ["torch", "nnsight"])
def test_hooks_removed_after_exception_and_user_hooks_survive(backend):
    model = model_on(backend)
    hf = model.hf_model
    calls = []
    user = hf.model.layers[0].register_forward_hook(lambda m, a, o: calls.append(1))
    modules = list(hf.modules())
    before = [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in modules]

    def boom(t, ctx):
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        with model.intervene({"blocks.1.hook_resid_post": boom}):
            model("hello")
    with pytest.raises(RuntimeError, match="boom"):
        with model.capture("blocks.0.hook_resid_post"):
            raise RuntimeError("boom")
    assert [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in modules] == before
    calls.clear()
    model("hello")
    assert calls == [1]
    user.remove()


def test_tl_hooks_removed_after_exception():
    model = model_on("transformer_lens")
    with pytest.raises(RuntimeError):
        with model.intervene({"blocks.1.hook_resid_post": lambda t, c: (_ for _ in ()).throw(RuntimeError("x"))}):
            model("hello")
    assert all(not hp.fwd_hooks for hp in model.tl.hook_dict.values())
    assert not model._active


# ------------------------------------------------------------------------------ cost control etc.
@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_at_layer(backend):
    model = model_on(backend)
    out, cache = model.run_with_cache(TEXTS, names="blocks.0.hook_resid_post", stop_at_layer=1)
    assert out is None
    _, full = model.run_with_cache(TEXTS, names="blocks.0.hook_resid_post")
    assert torch.allclose(cache["blocks.0.hook_resid_post"], full["blocks.0.hook_resid_post"])


def test_cache_device_and_dtype():
    _, cache = model_on("torch").run_with_cache("hi", names="hook_resid_post", dtype=torch.float16)
    assert cache["blocks.0.hook_resid_post"].dtype == torch.float16
    assert cache.stack("hook_resid_post").shape == (2, 1, 2, 64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_match_autograd(backend):
    model = model_on(backend)
    res = model.gradients(TEXTS, ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"])
    # hand check: d loss / d resid_post[1] through the final norm and unembedding only
    hf, tok = llama()
    ref = interp.wrap(hf, tok)
    batch = ref.prepare(TEXTS)
    r1 = res.activations["blocks.1.hook_resid_post"].clone().requires_grad_(True)
    logits = hf.lm_head(hf.model.norm(r1))
    loss = interp.model.next_token_loss(logits, batch)
    (g,) = torch.autograd.grad(loss, r1)
    assert torch.allclose(loss, res.value, atol=1e-5)
    assert torch.allclose(g, res.grads["blocks.1.hook_resid_post"], atol=1e-6)
    assert res.grads["blocks.0.hook_resid_post"].abs().sum() > 0


def test_capture_accumulates_passes():
    model = model_on("torch")
    with model.capture("blocks.0.hook_resid_post") as cache:
        model("abc")
        model("xyz")
    assert cache["blocks.0.hook_resid_post"].shape == (2, 3, 64)
    assert len(cache.passes("blocks.0.hook_resid_post")) == 2
    with model.capture("blocks.0.hook_resid_post") as cache:
        model("abc")
        model("longer")
    with pytest.raises(ValueError, match="passes"):
        cache["blocks.0.hook_resid_post"]


def test_torch_context_hooks_see_raw_hf_forward():
    model = model_on("torch")
    with model.capture("blocks.0.hook_resid_post") as cache:
        model.hf_model(torch.tensor([[1, 2, 3]]))
    assert cache["blocks.0.hook_resid_post"].shape == (1, 3, 64)


def test_load_from_local_folder_and_bad_spec(tmp_path):
    hf, tok = tiny_model("gpt2", folder=tmp_path / "m")
    for backend in BACKENDS:
        m = interp.load(str(tmp_path / "m"), backend=backend)
        assert torch.allclose(m("hello"), interp.wrap(hf, tok)("hello"), atol=1e-5)
    with pytest.raises(ValueError, match="cannot load model"):
        interp.load(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="unknown backend"):
        interp.load(str(tmp_path / "m"), backend="jax")


def test_wrap_hooked_transformer():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=64, n_ctx=32, d_vocab=50,
                                  act_fn="gelu", normalization_type="LN", seed=0)
    ht = HookedTransformer(cfg)
    model = interp.wrap(ht, backend="transformer_lens")
    ids = torch.randint(0, 50, (2, 6))
    logits, cache = model.run_with_cache(ids)
    ref_logits, ref_cache = ht.run_with_cache(ids)
    assert torch.allclose(logits, ref_logits, atol=1e-5)
    for name in ["blocks.1.hook_resid_post", "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z"]:
        assert torch.allclose(cache[name], ref_cache[name], atol=1e-6)
    with model.intervene({"blocks.0.hook_resid_post": interp.Ablate("zero")}):
        _, c2 = model.run_with_cache(ids, names="blocks.1.hook_resid_pre")
    assert c2["blocks.1.hook_resid_pre"].abs().max() == 0
