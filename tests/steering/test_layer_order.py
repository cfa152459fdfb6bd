"""Every all-layer path of steering/ against single-layer captures (#23).

The bug of #23: ``category_vectors(..., layers=None)`` asked ``collect`` for all ``hook_resid_pre`` names and then all
``hook_resid_post`` names, and ``collect`` returned them in the model's execution order, so the vector labelled layer
``l`` was the one of layer ``ceil(l / 2)``. On a 2-layer model that map is the identity, so these tests use a 5-layer
model (more layers than any index they test), non-unit norm gains, and string prompts of different lengths (padded
batches, left padding).
"""
import pytest
import torch

import interp
from interp.steering import SteeringData
from interp.steering.activations import collect
from interp.steering.repit import RepIt, affine_vector, category_vectors, select_direction
from interp.testing import tiny_model

N_LAYERS = 5
CATS = ("a", "b", "c")
WORDS = {"a": "apple pear plum", "b": "bolt nail screw", "c": "cat dog cow", None: "sun rain snow"}


@pytest.fixture(scope="module")
def model5():
    hf, tok = tiny_model("llama", seed=3, n_layers=N_LAYERS)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mod in hf.modules():
            if type(mod).__name__.endswith("RMSNorm"):  # non-unit norm gains
                mod.weight.copy_(0.5 + torch.rand(mod.weight.shape, generator=g))
    return interp.wrap(hf, tok, backend="torch")


def _prompts(kind, n, seed):
    g = torch.Generator().manual_seed(seed)
    words = WORDS[kind].split()
    out = []
    for _ in range(n):
        k = int(torch.randint(2, 7, (1,), generator=g))  # different lengths: padded batches
        out.append(" ".join(words[int(i)] for i in torch.randint(0, len(words), (k,), generator=g)) + " ok?")
    return out


@pytest.fixture(scope="module")
def data():
    pos, cats = [], []
    for i, c in enumerate(CATS):
        pos += _prompts(c, 5, seed=i)
        cats += [c] * 5
    return SteeringData(pos, _prompts(None, 6, seed=9), cats)


def _one_by_one(model, prompts, name, positions):
    """``[n, P, d]`` activations of ``name``, one unpadded prompt per forward pass."""
    rows = []
    for p in prompts:
        _, cache = model.run_with_cache(model.tokenize([p], add_special_tokens=False), names=name)
        rows.append(cache[name][0, positions].float())
    return torch.stack(rows)


def test_collect_returns_the_callers_order(model5, data):
    names = ["blocks.3.hook_resid_post", "blocks.1.hook_resid_pre", "blocks.4.hook_resid_pre",
             "blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"]  # out of execution order, one repeat
    prompts = data.positive[:7]
    acts = collect(model5, prompts, names, [-2, -1], batch_size=3)
    assert acts.shape == (7, 5, 2, 64)
    for i, name in enumerate(names):
        assert torch.allclose(acts[:, i], _one_by_one(model5, prompts, name, [-2, -1]), atol=1e-4), name
    assert not torch.allclose(acts[:, 0], acts[:, 3])


def test_collect_does_not_rely_on_name_resolution_order(model5, data, monkeypatch):
    """Even a capture layer that resolves a list in execution order (the old behaviour) gives the caller's order."""
    names = ["blocks.4.hook_resid_pre", "blocks.2.hook_resid_post", "blocks.0.hook_resid_pre"]
    want = collect(model5, data.negative, names, [-1])
    every = model5.hook_names()
    monkeypatch.setattr(model5, "hook_names", lambda pattern=None: every if pattern is None else
                        [n for n in every if n in set(pattern)])
    assert torch.equal(collect(model5, data.negative, names, [-1]), want)


@pytest.mark.parametrize("bad", [["blocks.*.hook_resid_pre"], ["hook_resid_pre"], ["blocks.9.hook_resid_pre"],
                                 ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid_typo"], []])
def test_collect_rejects_names_that_are_not_exact(model5, data, bad):
    with pytest.raises(ValueError, match="hook name"):
        collect(model5, data.negative, bad, [-1])
    with pytest.raises(TypeError):
        collect(model5, data.negative, "blocks.1.hook_resid_pre", [-1])


@pytest.fixture(scope="module")
def cv_all(model5, data):
    return category_vectors(model5, data, n_eoi=3, batch_size=4)


def test_category_vectors_every_layer_equals_single_layer(model5, data, cv_all):
    assert cv_all.layers == list(range(N_LAYERS)) and cv_all.vectors["a"].shape == (3, N_LAYERS, 64)
    for layer in range(N_LAYERS):
        one = category_vectors(model5, data, n_eoi=3, batch_size=4, layers=[layer])
        assert one.layers == [layer] and one.harmful_post_last is None
        for pos in (-3, -2, -1):
            assert torch.allclose(cv_all.reference(pos, layer), one.reference(pos, layer), atol=1e-5)
            for c in CATS:
                assert torch.allclose(cv_all.at(c, pos, layer), one.at(c, pos, layer), atol=1e-5), (c, pos, layer)
    # the layers really differ (a mislabelled layer would be caught)
    assert not torch.allclose(cv_all.at("a", -1, 4), cv_all.at("a", -1, 2), atol=1e-3)
    # an explicit, unordered subset is sorted and keyed by layer
    sub = category_vectors(model5, data, n_eoi=3, batch_size=4, layers=[3, 1])
    assert sub.layers == [1, 3]
    assert torch.allclose(sub.at("b", -2, 3), cv_all.at("b", -2, 3), atol=1e-5)
    assert torch.allclose(sub.at("b", -2, 1), cv_all.at("b", -2, 1), atol=1e-5)


def test_category_vectors_by_hand_on_a_deep_layer(model5, data, cv_all):
    """Hand computation from unpadded single-prompt captures, at layer 3 (resid_pre) and every resid_post."""
    name = "blocks.3.hook_resid_pre"
    harmless = _one_by_one(model5, data.negative, name, [-3, -2, -1]).mean(0)  # [P, d]
    for c in CATS:
        mu = _one_by_one(model5, data.of_category(c), name, [-3, -2, -1]).mean(0)
        for i, pos in enumerate((-3, -2, -1)):
            assert torch.allclose(cv_all.at(c, pos, 3), mu[i] - harmless[i], atol=1e-4)
            assert torch.allclose(cv_all.reference(pos, 3), harmless[i], atol=1e-4)
    for layer in range(N_LAYERS):
        post = f"blocks.{layer}.hook_resid_post"
        assert torch.allclose(cv_all.harmful_post_last[layer], _one_by_one(model5, data.positive, post, [-1])[:, 0].mean(0),
                              atol=1e-4), layer
        assert torch.allclose(cv_all.harmless_post_last[layer], _one_by_one(model5, data.negative, post, [-1])[:, 0].mean(0),
                              atol=1e-4), layer


def _summary(model, prompts, layers):
    """COSMIC's summary from unpadded captures: normalised mean over prompts and layers of the last-token output."""
    m = torch.stack([_one_by_one(model, prompts, f"blocks.{l}.hook_resid_post", [-1])[:, 0] for l in layers]).double()
    m = m.mean(dim=(0, 1))
    return m / m.norm()


def test_cosmic_evaluation_layers_and_scores_use_the_true_layers(model5, data, cv_all):
    harmful, harmless = data.of_category("b", "c"), data.negative
    sel = select_direction(model5, cv_all, ["a"], harmful, harmless, eval_layer_frac=0.4, kl_threshold=1e9,
                           batch_size=4)
    # evaluation layers: the 2 layers whose true mean harmful / harmless last-token outputs are least similar
    post = [(f"blocks.{l}.hook_resid_post") for l in range(N_LAYERS)]
    h = torch.stack([_one_by_one(model5, data.positive, n, [-1])[:, 0].mean(0) for n in post])
    b = torch.stack([_one_by_one(model5, data.negative, n, [-1])[:, 0].mean(0) for n in post])
    cos = torch.nn.functional.cosine_similarity(h, b, dim=-1)
    assert sel.eval_layers == sorted(torch.argsort(cos)[:2].tolist())
    # each candidate's refusal score, recomputed from single-layer captures at its own layer
    base_harmless = _summary(model5, harmless, sel.eval_layers)
    for row in [r for r in sel.candidates if r["layer"] in (2, 3) and r["position"] == -1]:
        layer = row["layer"]
        name = f"blocks.{layer}.hook_resid_pre"
        r = _one_by_one(model5, data.of_category("a"), name, [-1])[:, 0].mean(0) - \
            _one_by_one(model5, data.negative, name, [-1])[:, 0].mean(0)
        mu = _one_by_one(model5, data.negative, name, [-1])[:, 0].mean(0)
        with affine_vector(r, mu, layer, "hook_resid_pre").apply(model5):
            refusal = float(_summary(model5, harmful, sel.eval_layers) @ base_harmless)
        assert refusal == pytest.approx(row["refusal_score"], abs=1e-4), row
    assert {r["layer"] for r in sel.candidates if r["position"] == -1} >= {2, 3}


def test_repit_fit_selected_vector_is_its_layers_vector(model5, data):
    """The all-layer fit (COSMIC selection) deploys the naive vector and harmless mean of the layer it reports."""
    m = RepIt(targets=("a",), n_eoi=3, rho=0.5, kl_threshold=1e9, batch_size=4)
    vec = m.fit(model5, data)
    layer, pos = vec.layer, vec.metadata["position"]
    one = category_vectors(model5, data, n_eoi=3, batch_size=4, layers=[layer])
    assert vec.hooks == (f"blocks.{layer}.hook_resid_pre",)
    assert torch.allclose(vec.tensors["naive"], one.at("a", pos, layer), atol=1e-5)
    assert torch.allclose(vec.reference, one.reference(pos, layer), atol=1e-5)
