"""Run contexts, generation semantics, input and numeric validation, interrupts (issues #11, #12).

Models have 4 layers (more than any layer index used here) so that index bugs cannot hide.
"""
from __future__ import annotations

import functools
import threading

import pytest
import torch

import interp
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
HF_BACKENDS = ("torch", "nnsight")
PROMPTS = ["ab", "abcdefg", "abcd"]


@functools.lru_cache(maxsize=None)
def llama(owner: str = "ref"):
    return tiny_model("llama", seed=2, n_layers=4)


@functools.lru_cache(maxsize=None)
def model_on(backend: str) -> interp.Model:
    hf, tok = llama(backend)
    return interp.wrap(hf, tok, backend=backend)


VEC = torch.randn(64, generator=torch.Generator().manual_seed(5))


# ------------------------------------------------------------------------------------ run context
@pytest.mark.parametrize("backend", HF_BACKENDS)
def test_generation_passes_have_their_own_mask_and_index(backend):
    model = model_on(backend)
    seen = []

    def record(t, ctx):
        seen.append((ctx.pass_index, tuple(ctx.attention_mask.shape), ctx.past_length, tuple(ctx.key_mask.shape),
                     ctx.generating))

    with model.intervene({"blocks.3.hook_resid_post": record}):
        model.generate(PROMPTS, max_new_tokens=3, stop_at_eos=False)
    n = max(len(p) for p in PROMPTS)  # one token per byte
    assert seen == [(0, (3, n), 0, (3, n), True), (1, (3, 1), n, (3, n + 1), True), (2, (3, 1), n + 1, (3, n + 2), True)]
    # nothing about the run stays on the model
    assert not any(k in vars(model) for k in ("_mask", "_pass"))


def test_nested_runs_and_two_models_see_their_own_context():
    a, b = model_on("torch"), model_on("nnsight")
    inner = []

    def call_b(t, ctx):
        out = b(["abc"])  # a different model, from inside a's hook: its own run, its own mask
        with b.intervene({"blocks.0.hook_resid_post": lambda t2, c2: inner.append(tuple(c2.attention_mask.shape))}):
            b(["abcdef"])
        assert tuple(ctx.attention_mask.shape) == (2, 7)  # a's context is untouched by b's runs
        assert out.shape[:2] == (1, 3)

    with a.intervene({"blocks.2.hook_resid_post": call_b}):
        a(["a", "abcdefg"])
    assert inner == [(1, 6)]


def test_calling_the_model_from_its_own_hook_is_refused():
    model = model_on("torch")
    with pytest.raises(RuntimeError, match="inside one of its own hook"):
        with model.intervene({"blocks.0.hook_resid_post": lambda t, ctx: model(["x"])}):
            model(["abc"])
    assert model(["abc"]).shape[:2] == (1, 3)  # and the model still works


def test_threads_keep_their_contexts_apart():
    """A run's own hooks fire only for that run, also when threads share one torch-hooked module."""
    model = model_on("torch")
    errors: list[str] = []

    def work(k):
        texts = ["a" * (k + 2)] * (k + 1)

        def check(t, ctx):
            if tuple(ctx.attention_mask.shape) != (k + 1, k + 2):
                errors.append(f"thread {k} saw {tuple(ctx.attention_mask.shape)}")
        for _ in range(3):
            model._run(texts, {"blocks.1.hook_resid_post": [check]})

    ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert errors == []


# ---------------------------------------------------------------------------- generation semantics
@pytest.mark.parametrize("positions", [None, [-1]])
def test_generation_agrees_across_hf_backends_with_interventions(positions):
    outs, logits = [], []
    for backend in HF_BACKENDS:
        model = model_on(backend)
        with model.intervene({"blocks.2.hook_resid_post": interp.Add(VEC, scale=2.0, positions=positions)}):
            outs.append(model.generate(PROMPTS, max_new_tokens=6, return_text=False, stop_at_eos=False))
            with model.capture("ln_final.hook_normalized") as cache:
                model.generate(PROMPTS, max_new_tokens=2, stop_at_eos=False)
            logits.append(cache.passes("ln_final.hook_normalized"))
    assert torch.equal(outs[0], outs[1])
    for a, b in zip(*logits):
        assert (a - b).abs().max() < 1e-5


def test_cached_generation_equals_hand_written_hf_generate():
    """``positions=[-1]`` during generation = a hook on HF's own KV-cached generate that adds at the
    last position of every forward call (the last prompt token, then each new token)."""
    hf, tok = llama("hf-generate")
    model = interp.wrap(hf, tok)
    batch = model.tokenize(PROMPTS, padding_side="left")

    def hook(m, a, o):
        o = o.clone()
        o[:, -1] += 2.0 * VEC
        return o
    h = hf.model.layers[2].register_forward_hook(hook)
    try:
        ref = hf.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id,
                          eos_token_id=None, temperature=None, top_p=None, top_k=None)
    finally:
        h.remove()
    with model.intervene({"blocks.2.hook_resid_post": interp.Add(VEC, scale=2.0, positions=[-1])}):
        got = model.generate(PROMPTS, max_new_tokens=6, return_text=False, stop_at_eos=False)
    assert torch.equal(ref[:, batch["input_ids"].shape[1]:], got)


@pytest.mark.parametrize("backend", BACKENDS)
def test_generate_zero_tokens_and_seed(backend):
    model = model_on(backend)
    assert model.generate(PROMPTS, max_new_tokens=0) == ["", "", ""]
    assert model.generate(PROMPTS, max_new_tokens=0, return_text=False).shape == (3, 0)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = model.generate(PROMPTS[:1], max_new_tokens=4, do_sample=True, seed=7, return_text=False)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is untouched
    b = model.generate(PROMPTS[:1], max_new_tokens=4, do_sample=True, seed=7, return_text=False)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate("ab", max_new_tokens=-1)


# ------------------------------------------------------------------------------- padding, positions
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_negative_positions_steer_the_last_real_token(backend, side):
    """Batched, padded runs with ``positions=[-1]`` equal each prompt run alone."""
    model = model_on(backend)
    add = {"blocks.1.hook_resid_post": interp.Add(VEC, scale=3.0, positions=[-1, -2])}
    batch = model.tokenize(PROMPTS, padding_side=side)
    with model.intervene(add):
        together = model(batch)
        for i, p in enumerate(PROMPTS):
            alone = model([p])[0]
            real = batch["attention_mask"][i].bool()
            assert (together[i][real] - alone).abs().max() < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_patch_at_last_real_token_with_right_padding(backend):
    model = model_on(backend)
    name = "blocks.1.hook_resid_post"
    batch = model.tokenize(PROMPTS, padding_side="right")
    _, src = model.run_with_cache(model.tokenize(["zzzzzzz"] * 3, padding_side="right"), names=name)
    with model.intervene({name: interp.Patch(src, positions=[-1])}), model.capture(name) as cache:
        model(batch)
    last = batch["attention_mask"].sum(1) - 1
    got = cache[name]
    for i, li in enumerate(last.tolist()):
        assert torch.equal(got[i, li], src[name][i, li])


# ------------------------------------------------------------------------------ numeric validation
def test_project_out_handles_rank_deficient_and_refuses_bad_directions():
    v = torch.randn(64, generator=torch.Generator().manual_seed(0))
    for dirs in ([v, v], [v, 2 * v], [v, -3 * v]):
        p = interp.ProjectOut(torch.stack(dirs))
        assert p.rank == 1
        assert torch.allclose(p.basis[:, 0].abs(), (v / v.norm()).abs(), atol=1e-6)
    x = torch.randn(2, 3, 64)
    ctx = interp.HookContext("blocks.0.hook_resid_post")
    out = interp.ProjectOut(torch.stack([v, 2 * v]))(x, ctx)
    want = x - (x @ (v / v.norm()))[..., None] * (v / v.norm())
    assert (out - want).abs().max() < 1e-5  # exactly the span: nothing else removed
    with pytest.raises(ValueError, match="zero vector"):
        interp.ProjectOut(torch.zeros(64))
    with pytest.raises(ValueError, match="non-finite"):
        interp.ProjectOut(torch.full((64,), float("nan")))


@pytest.mark.parametrize("make, err, match", [
    (lambda: interp.Add(VEC, positions=[1.5]), TypeError, "integers"),
    (lambda: interp.Add(VEC, positions=5), TypeError, r"list of integers, e.g. \[5\]"),
    (lambda: interp.Add(VEC, positions="12"), TypeError, "list of integers"),
    (lambda: interp.Add(VEC, positions=[]), ValueError, "empty"),
    (lambda: interp.Add(VEC.to(torch.complex64)), TypeError, "real"),
    (lambda: interp.Add(torch.full((64,), float("nan"))), ValueError, "non-finite"),
    (lambda: interp.Add(VEC, scale=float("inf")), ValueError, "finite"),
    (lambda: interp.Scale(float("nan")), ValueError, "finite"),
    (lambda: interp.Add(VEC, heads=[0.5]), TypeError, "integers"),
    (lambda: interp.Patch("cache"), TypeError, "Cache or a tensor"),
])
def test_bad_intervention_arguments_are_refused(make, err, match):
    with pytest.raises(err, match=match):
        make()


# ------------------------------------------------------------------------------------- input errors
@pytest.mark.parametrize("backend", BACKENDS)
def test_ordinary_mistakes_get_one_clear_error(backend):
    model = model_on(backend)
    cases = [
        (lambda: model(""), ValueError, "empty string"),
        (lambda: model([]), ValueError, "empty list"),
        (lambda: model(torch.tensor([[1, 2, 999]])), ValueError, r"outside the vocabulary \(valid ids: 0..258\)"),
        (lambda: model(torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 2)), ValueError, "expected the token ids' shape"),
        (lambda: model.run_with_cache("ab", names=123), TypeError, "string or a list of strings"),
        (lambda: model.run_with_cache("ab", names="blocks.9.hook_resid_post"), KeyError, "closest valid names"),
        (lambda: model.run_with_cache("ab", names="blocks.0.hook_resid_post", stop_at_layer=0), ValueError, "stop_at_layer"),
    ]
    for call, err, match in cases:
        with pytest.raises(err, match=match):
            call()
    with pytest.raises(TypeError, match="dtype"):
        with model.intervene({"blocks.0.hook_resid_post": lambda t, ctx: t.double()}):
            model("abc")
    with pytest.raises(IndexError, match="out of range"):
        with model.intervene({"blocks.0.attn.hook_z": interp.Ablate(heads=[7])}):
            model("abc")


def test_too_long_input_is_refused_for_absolute_positions():
    hf, tok = tiny_model("gpt2", n_layers=3)
    model = interp.wrap(hf, tok)
    with pytest.raises(ValueError, match="at most 128"):
        model(torch.zeros(1, 129, dtype=torch.long))


def test_cache_mean_refuses_a_mismatched_mask():
    model = model_on("torch")
    _, cache = model.run_with_cache(["abc", "a"], names="blocks.0.hook_resid_post")
    with pytest.raises(ValueError, match="does not match"):
        cache.mean("blocks.0.hook_resid_post", torch.ones(2, 4))
    m = model.tokenize(["abc", "a"])["attention_mask"]
    t = cache["blocks.0.hook_resid_post"]
    want = t[m.bool()].mean(0)
    assert torch.allclose(cache.mean("blocks.0.hook_resid_post", m), want, atol=1e-6)


# ------------------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_are_a_read_and_reach_capture_only_sites(backend):
    model = model_on(backend)
    names = ["blocks.1.hook_resid_post", "blocks.2.attn.hook_pattern"]
    res = model.gradients(["abcde"], names)
    assert set(res.grads) == set(names)
    g = res.grads["blocks.1.hook_resid_post"]
    assert g.shape == res.activations["blocks.1.hook_resid_post"].shape and g.abs().sum() > 0
    assert res.grads["blocks.2.attn.hook_pattern"].abs().sum() > 0
    assert all(p.grad is None for p in model.parameters())
    # finite-difference check of one coordinate of the residual gradient
    name, eps = names[0], 1e-3
    base = res.value

    def bumped(sign):
        delta = torch.zeros_like(g)
        delta[0, 2, 5] = sign * eps
        with model.intervene({name: interp.Add(delta[0])}):
            return model.gradients(["abcde"], name).value
    fd = (bumped(1) - bumped(-1)) / (2 * eps)
    assert abs(float(fd) - float(g[0, 2, 5])) < 5e-3 * max(1.0, abs(float(fd)))


def test_forward_with_grad_differentiates_through_an_intervention():
    model = model_on("torch")
    w = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    kept: dict[str, torch.Tensor] = {}

    def keep_resid(t, ctx):
        kept["resid"] = t

    def encode(t, ctx):
        kept["feats"] = torch.relu(t @ w)  # e.g. SAE latents computed inside a hook
    with model.intervene({"blocks.0.hook_resid_post": keep_resid, "blocks.2.hook_resid_post": encode}):
        model.forward_with_grad(["abcd"])
    (g,) = torch.autograd.grad(kept["feats"][0, -1].sum(), kept["resid"])
    assert g.shape == kept["resid"].shape and g[0, -1].abs().sum() > 0
    assert all(p.grad is None for p in model.parameters())


def test_steering_vector_fields_are_validated_where_built():
    from interp.steering import SteeringVector
    v = SteeringVector("x", "affine", "blocks.1.hook_resid_pre", torch.randn(64))
    assert v.hooks == ("blocks.1.hook_resid_pre",)  # one name, not split into characters
    for kwargs, err in ((dict(positions=[1.5]), TypeError), (dict(scale=float("nan")), ValueError)):
        with pytest.raises(err):
            SteeringVector("x", "affine", ("blocks.1.hook_resid_pre",), torch.randn(64), **kwargs)
    with pytest.raises(TypeError, match="real"):
        SteeringVector("x", "affine", ("blocks.1.hook_resid_pre",), torch.randn(64, dtype=torch.complex64))
