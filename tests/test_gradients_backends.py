"""Gradients are a read with one meaning on every backend, including at reshaped and derived hook points.

A bridge hook point such as ``attn.hook_z`` or ``ln1.hook_normalized`` hands hooks a reshaped or derived copy; a
read there used to be off the forward path on the TransformerLens backend, so its gradient came back as exact zeros.
"""
import copy

import pytest
import torch

import interp
from interp.testing import tiny_model

NAMES = ["blocks.1.attn.hook_z", "blocks.1.ln1.hook_normalized", "ln_final.hook_normalized", "blocks.2.attn.hook_q",
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


def test_read_only_site_refuses_instead_of_zeros(llama):
    hf, tok = llama
    model = interp.wrap(hf, tok, backend="torch")
    assert not model.can_write("blocks.1.ln2.hook_scale")
    with pytest.raises(ValueError, match="hook_scale.*read-only"):
        model.gradients(TEXTS, "blocks.1.ln2.hook_scale")
