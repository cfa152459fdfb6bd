"""The SteeringVector / SteeringMethod interface, the registry, and the built-in activation-level methods."""
import json

import pytest
import torch

from interp import steering
from interp.steering import AffineAblate, SteeringData, SteeringVector
from interp.steering.activations import collect


def test_registry_has_builtins():
    names = steering.available()
    assert {"diff_in_means", "directional_ablation", "repit"} <= set(names)
    assert steering.get("repit") is steering.RepIt
    with pytest.raises(KeyError, match="unknown steering method 'nope'.*diff_in_means"):
        steering.get("nope")


def test_register_one_class_and_conflicts():
    @steering.register
    class Noop(steering.SteeringMethod):
        name = "test_noop_method"

        def fit(self, model, data, val=None):
            return SteeringVector(self.name, "add", ("blocks.0.hook_resid_pre",), torch.zeros(64))
    try:
        assert "test_noop_method" in steering.available() and steering.get("test_noop_method") is Noop
        with pytest.raises(ValueError, match="already registered"):
            steering.register(type("Other", (steering.SteeringMethod,), {"name": "test_noop_method"}))
        with pytest.raises(TypeError, match="SteeringMethod subclasses"):
            steering.register(object)
        with pytest.raises(TypeError, match="takes no configuration"):
            Noop(layer=3)
    finally:
        steering.unregister("test_noop_method")
    assert "test_noop_method" not in steering.available()
    with pytest.raises(TypeError, match="unknown option"):
        steering.DiffInMeans(layr=3)


def test_affine_ablate_hand_computed():
    r = torch.tensor([3.0, 4.0, 0.0])  # r_hat = (0.6, 0.8, 0)
    mu = torch.tensor([1.0, 1.0, 5.0])  # mu . r_hat = 1.4
    x = torch.tensor([[[2.0, -1.0, 7.0]]])  # x . r_hat = 0.4
    ctx = steering.base.HookContext("blocks.0.hook_resid_pre")
    out = AffineAblate(r, mu, coeff=0.0)(x, ctx)
    expect = x - 0.4 * torch.tensor([0.6, 0.8, 0]) + 1.4 * torch.tensor([0.6, 0.8, 0])
    assert torch.allclose(out, expect)
    out2 = AffineAblate(r, None, coeff=0.5)(x, ctx)
    assert torch.allclose(out2, x - 0.4 * torch.tensor([0.6, 0.8, 0]) + 0.5 * r)
    with pytest.raises(ValueError, match="non-zero"):
        AffineAblate(torch.zeros(3))


def test_vector_validation():
    with pytest.raises(ValueError, match="unknown operation"):
        SteeringVector("x", "multiply", ("h",), torch.ones(4))
    with pytest.raises(ValueError, match=r"\[d\]"):
        SteeringVector("x", "add", ("h",), torch.ones(2, 4))
    with pytest.raises(ValueError, match="reference"):
        SteeringVector("x", "affine", ("h",), torch.ones(4), reference=torch.ones(3))
    with pytest.raises(ValueError, match="at least one hook"):
        SteeringVector("x", "add", (), torch.ones(4))
    with pytest.raises(TypeError, match="list of strings"):
        SteeringData(positive="abc", negative=["x"])
    with pytest.raises(ValueError, match="one label per prompt"):
        SteeringData(positive=["a", "b"], negative=["x"], categories=["c"])


def test_save_load_roundtrip(tmp_path):
    v = SteeringVector("repit", "affine", ("blocks.1.hook_resid_pre",), torch.randn(64), positions=(-2, -1),
                       scale=0.25, reference=torch.randn(64), tensors={"naive": torch.randn(64)},
                       metadata={"layer": 1, "rho": 0.66, "targets": ["bio"], "nested": {"a": torch.tensor(2.0)}})
    v.save(tmp_path / "vec")
    assert sorted(p.name for p in (tmp_path / "vec").iterdir()) == [".interp-output.json", "vector.json",
                                                                   "vector.safetensors"]
    meta = json.loads((tmp_path / "vec" / "vector.json").read_text())
    assert meta["method"] == "repit" and meta["metadata"]["nested"]["a"] == 2.0
    w = SteeringVector.load(tmp_path / "vec")
    assert type(w) is SteeringVector and w.layer == 1 and w.positions == (-2, -1) and w.scale == 0.25
    assert torch.equal(w.direction, v.direction) and torch.equal(w.reference, v.reference)
    assert torch.equal(w.tensors["naive"], v.tensors["naive"])
    with pytest.raises(FileNotFoundError, match="not a saved steering vector"):
        SteeringVector.load(tmp_path)


def test_diff_in_means_fit_and_apply(llama, make_ids):
    id_prompts = make_ids
    pos, neg = id_prompts(12, seed=1, low=65, high=78), id_prompts(12, seed=2, low=97, high=110)
    data = SteeringData(pos, neg)
    vec = steering.get("diff_in_means")(layer=1, scale=2.0).fit(llama, data)
    assert vec.hooks == ("blocks.1.hook_resid_pre",) and vec.operation == "add"
    # equals a hand-computed difference of means at the last position
    _, c1 = llama.run_with_cache(pos, names="blocks.1.hook_resid_pre")
    _, c2 = llama.run_with_cache(neg, names="blocks.1.hook_resid_pre")
    expect = c1["blocks.1.hook_resid_pre"][:, -1].mean(0) - c2["blocks.1.hook_resid_pre"][:, -1].mean(0)
    assert torch.allclose(vec.direction, expect, atol=1e-5)
    # applying it adds 2 * r at every position of that hook (and nothing when the context is closed)
    _, base = llama.run_with_cache(neg[:3], names="blocks.1.hook_resid_pre")
    with vec.apply(llama):
        with llama.capture("blocks.1.hook_resid_pre") as cache:
            llama(neg[:3])
        new = llama.generate(neg[:2], max_new_tokens=4, return_text=False)
    assert torch.allclose(cache["blocks.1.hook_resid_pre"], base["blocks.1.hook_resid_pre"] + 2 * expect, atol=1e-4)
    plain = llama.generate(neg[:2], max_new_tokens=4, return_text=False)
    assert new.shape == plain.shape
    assert not torch.allclose(llama(neg[:2]), _steered_logits(llama, vec, neg[:2]))
    # larger positive steering raises the positive-vs-negative projection of the last-layer state
    proj = lambda c: (c["blocks.1.hook_resid_post"][:, -1] @ expect).mean()  # noqa: E731
    _, c_base = llama.run_with_cache(neg, names="blocks.1.hook_resid_post")
    with vec.apply(llama):
        _, c_st = llama.run_with_cache(neg, names="blocks.1.hook_resid_post")
    assert proj(c_st) > proj(c_base)
    # only the last position when a position rule is given
    last = vec.with_scale(1.0)
    last.positions = (-1,)
    with last.apply(llama), llama.capture("blocks.1.hook_resid_pre") as c3:
        llama(neg[:3])
    d = c3["blocks.1.hook_resid_pre"] - base["blocks.1.hook_resid_pre"]
    assert torch.allclose(d[:, -1], expect.expand(3, -1), atol=1e-4) and d[:, :-1].abs().max() < 1e-5


def _steered_logits(model, vec, x):
    with vec.apply(model):
        return model(x)


def test_directional_ablation_removes_direction_everywhere(llama, make_ids):
    id_prompts = make_ids
    pos, neg = id_prompts(10, seed=3, low=65, high=78), id_prompts(10, seed=4, low=97, high=110)
    vec = steering.DirectionalAblation(layer=1).fit(llama, SteeringData(pos, neg))
    assert vec.operation == "project_out" and torch.allclose(vec.direction.norm(), torch.tensor(1.0))
    names = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid",
             "blocks.1.hook_resid_post"]
    _, base = llama.run_with_cache(pos, names=names)
    with vec.apply(llama):
        _, cache = llama.run_with_cache(pos, names=names)
    for n in names:
        assert (base[n] @ vec.direction).abs().max() > 1e-3  # the direction was there ...
        assert (cache[n] @ vec.direction).abs().max() < 1e-4  # ... and is gone at every layer


def test_collect_left_padding_matches_unpadded(llama):
    texts = ["hello world, this is long", "hi"]
    acts = collect(llama, texts, ["blocks.1.hook_resid_pre"], [-2, -1])
    one = collect(llama, ["hi"], ["blocks.1.hook_resid_pre"], [-2, -1])
    assert acts.shape == (2, 1, 2, 64) and torch.allclose(acts[1], one[0], atol=1e-4)


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("gpt2", True)])
def test_weight_orthogonalisation_equals_activation_ablation(arch, tied):
    import transformers as T

    import interp
    from interp.testing import tiny_config, tiny_tokenizer

    cfg = tiny_config(arch)
    cfg.tie_word_embeddings = tied
    torch.manual_seed(0)
    hf = getattr(T, cfg.architectures[0])(cfg).eval()
    tok = tiny_tokenizer()
    model = interp.wrap(hf, tok)
    texts = ["The quick brown fox", "jumps over", "the lazy dog, twice"]
    r = torch.randn(64)
    vec = steering.ablation_vector(r)
    base = model(texts)
    with vec.apply(model):
        ablated = model(texts)
    edited = steering.orthogonalize_weights(model, vec)
    assert any(p.endswith(("o_proj", "c_proj")) for p in edited) and any("embed" in p or "wte" in p for p in edited)
    ortho = model(texts)  # no hooks: the weights do it
    assert (ablated - base).abs().max() > 1e-3
    assert torch.allclose(ortho, ablated, atol=1e-5)
    _, cache = model.run_with_cache(texts, names=["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post"])
    for t in cache.values():
        assert (t @ vec.direction).abs().max() < 1e-5
    if tied:  # the unembedding kept its original weights
        assert hf.get_output_embeddings().weight is not hf.get_input_embeddings().weight


def test_orthogonalisation_rejects_bad_input(llama):
    with pytest.raises(ValueError, match="expected \\[64\\]"):
        steering.orthogonalize_weights(llama, torch.ones(8))
    with pytest.raises(ValueError, match="non-zero"):
        steering.orthogonalize_weights(llama, torch.zeros(64))


def test_same_effect_on_every_backend(llama):
    import interp

    vecs = [SteeringVector("x", "affine", ("blocks.1.hook_resid_pre",), torch.randn(64), reference=torch.randn(64)),
            steering.ablation_vector(torch.randn(64))]
    texts = ["hello world", "abc"]
    ref = []
    for v in vecs:
        with v.apply(llama):
            ref.append((llama(texts), llama.generate(texts, max_new_tokens=3)))
    import copy

    for backend in ("nnsight", "transformer_lens"):
        # the bridge rewires the HF module in place: give it a copy, so the session's model stays usable
        hf = copy.deepcopy(llama.hf_model) if backend == "transformer_lens" else llama.hf_model
        other = interp.wrap(hf, llama.tokenizer, backend=backend)
        for v, (logits, gen) in zip(vecs, ref):
            with v.apply(other):
                assert torch.allclose(other(texts), logits, atol=1e-5)
                assert other.generate(texts, max_new_tokens=3) == gen
