"""Fixtures shared by the ROME / TCPE tests: a 3-layer GPT-2 with non-identity norms and a sharpened
unembedding, and a small transcoder of its width."""
import pytest
import torch

import interp
from interp.editing import Transcoder
from interp.testing import tiny_model


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    hf, tok = tiny_model("gpt2", n_layers=3, perturb_norms=True)
    with torch.no_grad():  # a random init has near-uniform logits; sharpen the (tied) unembedding so edits can act
        hf.get_input_embeddings().weight.mul_(30)
    return interp.wrap(hf, tok, backend="torch")


@pytest.fixture(scope="module")
def tc():
    t = Transcoder(64, 192, 64, seed=2)
    with torch.no_grad():
        t.b_enc.fill_(0.03)
    return t
