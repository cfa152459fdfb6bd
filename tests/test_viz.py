"""Notebook views: the attention-pattern view (plotly) and the token-coloured text view (HTML)."""
import pytest
import torch

import interp
from interp.testing import tiny_model
from interp.viz import attention_view, token_view


@pytest.fixture(scope="module")
def model():
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    return interp.wrap(hf, tok)


def test_attention_view_shows_the_captured_patterns(model):
    prompt = "ab cd"
    _, cache = model.run_with_cache(prompt, names="blocks.*.attn.hook_pattern")
    fig = attention_view(model, prompt, heads=[(2, 1), (0, 3), (-1, 0)])
    tokens = model.to_str_tokens(prompt)
    assert len(fig.data) == 3 and [t.name for t in fig.data] == ["L2H1", "L0H3", "L2H0"]
    # the heatmap is the pattern itself, tokens on both axes, one head visible at a time
    assert torch.allclose(torch.tensor(fig.data[0].z), cache["blocks.2.attn.hook_pattern"][0, 1].float())
    assert list(fig.data[1].x) == [f"{i}: {t}" for i, t in enumerate(tokens)] == list(fig.data[1].y)
    assert [t.visible for t in fig.data] == [True, False, False]
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["L2H1", "L0H3", "L2H0"] and buttons[1].args[0]["visible"] == [False, True, False]
    # from a cache, and every head by default
    every = attention_view(cache, tokens=tokens)
    assert len(every.data) == 3 * 4
    with pytest.raises(ValueError, match="out of range"):
        attention_view(cache, tokens=tokens, heads=[(3, 0)])
    with pytest.raises(ValueError, match="tokens given"):
        attention_view(cache, tokens=tokens[:-1])
    with pytest.raises(ValueError, match="no attention patterns"):
        attention_view(model.run_with_cache(prompt, names="blocks.0.hook_resid_post")[1])


def test_token_view_colours_by_value():
    view = token_view(["The", " cat", "<b>"], torch.tensor([1.0, -0.5, 0.0]), title="logit diff")
    html = view._repr_html_()
    assert html == view.html and "logit diff" in html
    assert "&lt;b&gt;" in html and "<b>" not in html  # tokens are escaped
    assert "rgba(220,38,38,1.000)" in html  # the largest positive value: full red
    assert "rgba(37,99,235,0.500)" in html  # half the scale, negative: half blue
    assert "rgba(37,99,235,0.000)" in html  # zero: no colour
    assert 'data-value="-0.5"' in html and "&nbsp;cat" in html and "<script" not in html
    with pytest.raises(ValueError, match="3 tokens but 2 values"):
        token_view(["a", "b", "c"], [1, 2])


def test_cache_displays_as_a_table(model):
    _, cache = model.run_with_cache(["ab", "cd"], names=["blocks.*.hook_resid_post", "blocks.0.attn.hook_pattern"])
    page = cache._repr_html_()
    assert page.count("<tr>") == 1 + 4 and "blocks.2.hook_resid_post" in page and "float32" in page
    resid = cache["blocks.0.hook_resid_post"]
    assert str(tuple(resid.shape)) in page
    total = sum(cache[k].numel() * cache[k].element_size() for k in cache)
    assert f"{total / 1024:.1f} KiB" in page


def test_results_vectors_and_rules_display_in_jupyter():
    from interp.patching import PatchingResult
    from interp.probes.gavel.rules import load_rules
    from interp.steering.base import SteeringVector

    res = PatchingResult(component="resid_pre", axes=["layer", "pos"], values=torch.arange(60.0).reshape(30, 2),
                         clean=1.0, corrupted=0.0)
    page = res._repr_html_()
    assert "PatchingResult" in page and "60 rows; showing 20" in page and page.count("<tr") == 21
    vec = SteeringVector(method="diff_in_means", operation="add", hooks=("blocks.1.hook_resid_post",),
                         direction=torch.tensor([3.0, 4.0]), scale=2.0)
    vpage = vec._repr_html_()
    assert "diff_in_means" in vpage and "blocks.1.hook_resid_post" in vpage and ">5</td>" in vpage
    rules = load_rules({"rules": [{"name": "fraud", "condition": "all of {tax, go}", "action": "flag"}]})
    rpage = rules._repr_html_()
    assert "fraud" in rpage and "all of {tax, go}" in rpage and "go, tax" in rpage
