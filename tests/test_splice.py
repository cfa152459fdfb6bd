"""SAEs as hook points (issue #11): capturable, patchable, differentiable, equal to sae-lens's own
SAETransformerBridge, on every backend."""
from __future__ import annotations

import functools
import warnings

import pytest
import torch

import interp
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
TEXTS = ["hello there world", "hi"]
AT = "blocks.1.hook_resid_post"


@functools.lru_cache(maxsize=None)
def sae():
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata
    torch.manual_seed(0)
    s = StandardSAE(StandardSAEConfig(d_in=64, d_sae=128, metadata=SAEMetadata(hook_name=AT)))
    with torch.no_grad():
        for p in s.parameters():
            p.normal_(0, 0.1)
    return s


@functools.lru_cache(maxsize=None)
def model_on(backend):
    return interp.wrap(*tiny_model("llama", n_layers=3, perturb_norms=True), backend=backend)


@functools.lru_cache(maxsize=None)
def sae_lens_reference():
    from sae_lens import SAETransformerBridge
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        br = SAETransformerBridge.boot_transformers(hf.config._name_or_path, hf_model=hf, tokenizer=tok)
        br.enable_compatibility_mode(no_processing=True)
        br.add_sae(sae(), use_error_term=False)
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    logits, cache = br.run_with_cache(batch["input_ids"], attention_mask=batch["attention_mask"])
    return logits, cache["blocks.1.hook_out.hook_sae_acts_post"], batch["attention_mask"].bool()


@pytest.mark.parametrize("backend", BACKENDS)
def test_spliced_sae_equals_sae_lens_bridge(backend):
    model = model_on(backend)
    ref_logits, ref_acts, real = sae_lens_reference()
    with model.splice(sae(), at=AT):
        assert f"{AT}.hook_sae_acts_post" in model.hook_names()
        logits, cache = model.run_with_cache(model.tokenize(TEXTS, padding_side="right"), names=f"{AT}.*")
    assert set(cache) == {f"{AT}.{h}" for h in ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post",
                                              "hook_sae_recons", "hook_sae_output")}
    assert (logits - ref_logits)[real].abs().max() < 1e-5
    assert (cache[f"{AT}.hook_sae_acts_post"] - ref_acts)[real].abs().max() < 1e-5
    assert f"{AT}.hook_sae_acts_post" not in model.hook_names()  # gone with the splice


@pytest.mark.parametrize("backend", BACKENDS)
def test_error_term_reproduces_clean_logits_and_latents_are_writable(backend):
    model = model_on(backend)
    clean = model(TEXTS)
    with model.splice(sae(), at=AT, use_error_term=True):
        assert (model(TEXTS) - clean).abs().max() < 1e-5
        with model.intervene({f"{AT}.hook_sae_acts_post": interp.Ablate("zero", positions=[-1])}):
            ablated = model(TEXTS)
    assert (ablated - clean).abs().max() > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_reach_spliced_latents(backend):
    model = model_on(backend)
    name = f"{AT}.hook_sae_acts_post"
    with model.splice(sae(), at=AT, use_error_term=True):
        res = model.gradients(["hello there"], name)
    g = res.grads[name]
    assert g.shape == res.activations[name].shape and g.abs().sum() > 0
    # with the error term the output is recons + const: d loss / d latents = (d loss / d x) @ W_dec^T
    with model.splice(sae(), at=AT, use_error_term=True):
        gx = model.gradients(["hello there"], f"{AT}.hook_sae_output").grads[f"{AT}.hook_sae_output"]
    acts = res.activations[name]
    want = (gx @ sae().W_dec.detach().T) * (acts > 0)
    assert (g * (acts > 0) - want).abs().max() < 1e-5


def test_encode_decode_modules_splice_too():
    class Linear2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Linear(64, 32)
            self.dec = torch.nn.Linear(32, 64)

        def encode(self, x):
            return torch.relu(self.enc(x))

        def decode(self, f):
            return self.dec(f)
    mod = Linear2()
    model = model_on("torch")
    clean = model(TEXTS)
    with model.splice(mod, at=AT, use_error_term=True):
        out, cache = model.run_with_cache(TEXTS, names=f"{AT}.hook_sae_acts_post")
    assert (out - clean).abs().max() < 1e-5
    x = model.run_with_cache(TEXTS, names=AT)[1][AT]
    assert torch.allclose(cache[f"{AT}.hook_sae_acts_post"], mod.encode(x), atol=1e-6)
    with pytest.raises(ValueError, match="one hook name"):
        with model.splice(mod, at="blocks.*.hook_resid_post"):
            pass
    with pytest.raises(TypeError, match="encode"):
        with model.splice(object(), at=AT):
            pass
