"""Gradients are a read with one meaning on every backend, including at reshaped and derived hook points.

A bridge hook point such as ``attn.hook_z`` or ``ln1.hook_normalized`` hands hooks a reshaped or derived copy; a
read there used to be off the forward path on the TransformerLens backend, so its gradient came back as exact zeros.
"""
import copy

import pytest
import torch

import interp
from interp.testing import tiny_model

NAMES = ["blocks.1.attn.hook_z", "blocks.1.ln1.hook_scale", "blocks.1.ln1.hook_normalized", "blocks.2.ln2.hook_scale",
         "ln_final.hook_scale", "ln_final.hook_normalized", "blocks.2.attn.hook_q",
         "blocks.1.attn.hook_rot_k", "blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern",
         "blocks.1.attn.hook_result", "blocks.0.mlp.hook_pre", "blocks.2.hook_resid_post"]
TEXTS = ["a b c d e", "f g"]  # padded batch


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    return hf, tok


@pytest.fixture(scope="module")
def grads(llama):
    hf, tok = llama
    out = {}
    for backend in ("torch", "nnsight", "transformer_lens"):
        # a TransformerBridge rewires the module it wraps: give it its own copy
        model = interp.wrap(copy.deepcopy(hf) if backend == "transformer_lens" else hf, tok, backend=backend)
        out[backend] = model.gradients(TEXTS, NAMES)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_gradient_equal_across_backends_and_nonzero(grads, name):
    ref = grads["torch"].grads[name]
    assert ref.abs().sum() > 0, name
    for backend in ("nnsight", "transformer_lens"):
        torch.testing.assert_close(grads[backend].grads[name], ref, atol=2e-5, rtol=1e-4, msg=f"{backend} {name}")


def test_gradient_matches_finite_difference_at_hook_z(llama):
    """The TransformerLens backend's hook_z gradient, checked against a finite difference of an Add there."""
    hf, tok = llama
    model = interp.wrap(copy.deepcopy(hf), tok, backend="transformer_lens")
    name = "blocks.1.attn.hook_z"
    g = model.gradients(TEXTS, name).grads[name]
    direction = torch.randn_like(g)
    eps = 1e-2

    def loss(scale: float) -> float:
        with model.intervene({name: lambda t, ctx: t + scale * direction}):
            return float(model.gradients(TEXTS, "blocks.0.hook_resid_post").value)

    fd = (loss(eps) - loss(-eps)) / (2 * eps)
    analytic = float((g * direction).sum())
    assert abs(analytic) > 1e-3 and abs(fd - analytic) < 2e-2 * abs(analytic)


@pytest.mark.parametrize("backend", ["torch", "nnsight"])
def test_norm_scale_gradient_matches_finite_difference(llama, backend):
    """``ln*.hook_scale`` is on the forward path of the HF backends as in TL (the normalized input divides by it):
    its gradient is the loss's derivative along a write there (it was computed beside the path and refused)."""
    hf, tok = llama
    model = interp.wrap(hf, tok, backend=backend)
    name = "blocks.1.ln2.hook_scale"
    assert model.can_write(name)
    g = model.gradients(TEXTS, name)
    scale, grad = g.activations[name], g.grads[name]
    eps = 1e-2

    def loss(k: float) -> float:
        with model.intervene({name: interp.Scale(1 + k)}):
            return float(model.gradients(TEXTS, "blocks.0.hook_resid_post").value)

    fd = (loss(eps) - loss(-eps)) / (2 * eps)
    analytic = float((grad * scale).sum())
    assert abs(analytic) > 1e-3 and abs(fd - analytic) < 2e-2 * abs(analytic)


@pytest.mark.parametrize("backend", ["torch", "nnsight", "transformer_lens"])
def test_gradient_caches_know_they_are_gradients(llama, backend):
    """``gradients(...).grads`` carries the model and knows it holds gradients (issue #44): ``accumulated_resid``
    works on it as on TL's gradient cache; ``stack_head_results`` is the gradient with respect to each head's
    output (``attn.hook_result``'s), so per-head attribution (grad x (clean - corrupted)) equals the one
    taken at ``hook_z`` (it used to multiply dL/dz by W_O: another number); a gradient cache without
    ``hook_result`` and the norm helpers refuse in one line."""
    hf, tok = llama
    model = interp.wrap(copy.deepcopy(hf) if backend == "transformer_lens" else hf, tok, backend=backend)
    clean = model.to_tokens(["a b c d e", "f g h i j"])
    corrupted = clean.clone()
    corrupted[:, 1] = (corrupted[:, 1] + 3) % model.cfg.d_vocab
    names = ["blocks.*.attn.hook_result", "blocks.*.attn.hook_z", "blocks.*.hook_resid_pre", "blocks.*.hook_resid_mid",
             "blocks.2.hook_resid_post"]
    g = model.gradients(corrupted, names)
    assert g.grads.model is model and g.activations.model is model
    assert g.grads.is_gradient and not g.activations.is_gradient and "GradientCache" in repr(g.grads)
    acc = g.grads.accumulated_resid(-1, incl_mid=True)
    assert acc.shape[0] == 7 and torch.equal(acc[0], g.grads["blocks.0.hook_resid_pre"])
    _, clean_cache = model.run_with_cache(clean)
    heads_grad = g.grads.stack_head_results(-1)
    delta = clean_cache.stack_head_results(-1) - g.activations.stack_head_results(-1)
    per_head = (heads_grad * delta).sum((1, 2, 3))
    z_grad = torch.stack([g.grads[f"blocks.{l}.attn.hook_z"] for l in range(3)])  # [L, b, p, H, e]
    dz = torch.stack([clean_cache[f"blocks.{l}.attn.hook_z"] - g.activations[f"blocks.{l}.attn.hook_z"]
                      for l in range(3)])
    torch.testing.assert_close(per_head, (z_grad * dz).sum((1, 2, 4)).flatten(), atol=1e-5, rtol=1e-4)
    only_z = model.gradients(corrupted, "blocks.*.attn.hook_z").grads
    with pytest.raises(ValueError, match="gradient at attn.hook_result"):
        only_z.stack_head_results(-1)
    with pytest.raises(ValueError, match="gradients"):
        only_z.compute_head_results()
    with pytest.raises(ValueError, match="gradients"):
        g.grads.accumulated_resid(-1, apply_ln=True)
    with pytest.raises(ValueError, match="gradients"):
        g.grads.select("blocks.0.*").apply_ln_to_stack(acc[:1], layer=0)
