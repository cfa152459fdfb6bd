"""The load self-check (interp.selfcheck): it passes on right models, withdraws a site that alone is wrong (and a
request for it says why), refuses a wrong unembedding or final norm by name, and is recorded on the model."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import interp
from interp.architectures import Scaled, Site
from interp.names import UnknownHookError
from interp.selfcheck import SelfCheckError, SelfCheckWarning, self_check
from interp.testing import tiny_causal_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_load_records_a_passing_check(tok, tmp_path):
    hf = tiny_causal_lm("llama")
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = interp.load(str(tmp_path))
    sc = model.self_check
    assert sc.passed and not sc.withdrawn and sc.family == "llama" and sc.backend == "torch"
    assert set(sc.errors) >= {"resid_pre + attn_out == resid_mid", "resid_mid + mlp_out == resid_post",
                              "logits == unembed(ln_final(resid_post[-1]))"}
    assert max(sc.errors.values()) <= sc.tolerance
    assert sc.to_dict()["passed"] is True
    assert interp.load(str(tmp_path), check=False).self_check is None


def test_a_wrong_site_alone_is_withdrawn_and_refused_by_name(tok):
    model = interp.wrap(tiny_causal_lm("llama"), tok, check=False)
    name = "blocks.1.hook_mlp_out"
    site = model.sites[name]
    model.sites[name] = Site(site.module, site.io, site.lens >> Scaled(2.0))  # a planted off-by-2x bug
    with pytest.warns(SelfCheckWarning, match=name):
        sc = self_check(model)
    assert list(sc.withdrawn) == [name] and "resid_mid + mlp_out" in sc.withdrawn[name]
    assert name not in model.hook_names() and "blocks.0.hook_mlp_out" in model.hook_names()
    with pytest.raises(UnknownHookError, match="llama family on the torch backend.*self-check"):
        model.run_with_cache(["Hi"], names=[name])


def test_a_wrong_resid_mid_is_told_apart_from_attn_out(tok):
    model = interp.wrap(tiny_causal_lm("qwen2"), tok, check=False)
    name = "blocks.2.hook_resid_mid"
    site = model.sites[name]
    model.sites[name] = Site(site.module, site.io, Scaled(0.5))
    with pytest.warns(SelfCheckWarning):
        sc = self_check(model)
    assert list(sc.withdrawn) == [name]


def test_a_wrong_unembedding_or_final_norm_refuses_the_model(tok, monkeypatch):
    model = interp.wrap(tiny_causal_lm("gemma2"), tok, check=False)
    w, b, kind, eps = model._final_norm()
    monkeypatch.setattr(model, "_final_norm", lambda: (w, b, kind, eps * 1e6))
    with pytest.raises(SelfCheckError, match="gemma2 family on the torch backend at ln_final"):
        self_check(model)


def test_gemma2_final_softcap_and_granite_cohere_scales_are_in_the_check(tok):
    for family in ("gemma2", "granite", "cohere"):
        sc = interp.wrap(tiny_causal_lm(family, final_logit_softcapping=0.5) if family == "gemma2"
                         else tiny_causal_lm(family), tok).self_check
        assert sc.passed, (family, sc)


def test_transformer_lens_bridge_is_held_to_the_hf_module(tok):
    model = interp.wrap(tiny_causal_lm("llama"), tok, backend="transformer_lens")
    assert "logits == Hugging Face module's logits" in model.self_check.errors
    with pytest.raises(SelfCheckError, match="cohere family|CohereForCausalLM family"):
        interp.wrap(tiny_causal_lm("cohere"), tok, backend="transformer_lens")


def test_wrap_of_a_non_transformers_module_on_transformer_lens_is_refused_clearly():
    with pytest.raises(ValueError, match="transformer_lens.*bridges Hugging Face transformers models.*Linear"):
        interp.wrap(nn.Linear(2, 2), backend="transformer_lens")


def test_in_memory_models_without_architectures_wrap_on_every_backend(tok):
    for family in ("olmo", "granite", "falcon_mq", "gpt_bigcode"):
        hf = tiny_causal_lm(family)
        assert hf.config.architectures is None
        for backend in ("torch", "transformer_lens"):
            model = interp.wrap(tiny_causal_lm(family) if backend != "torch" else hf, tok, backend=backend)
            assert model.self_check.passed


def test_in_place_hook_edits_reach_the_model_through_copying_lenses(tok):
    """TransformerLens hooks may edit in place and return None: on a fused per-group q/k/v (Falcon) the q
    columns are a copy, written back because the tensor's version changed."""
    model = interp.wrap(tiny_causal_lm("falcon"), tok)
    ids = torch.tensor([[5, 6, 7, 8]])
    plain = model(ids)

    def zero_in_place(q, hook):
        q[:] = 0

    edited = model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_q", zero_in_place)])
    returned = model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_q", lambda q, hook: torch.zeros_like(q))])
    assert not torch.allclose(edited, plain) and torch.allclose(edited, returned)


def test_cached_tensors_are_copies_the_model_cannot_change(tok):
    """Falcon adds the attention output into the MLP output in place after the MLP hook has fired."""
    model = interp.wrap(tiny_causal_lm("falcon_mq"), tok)
    _, cache = model.run_with_cache(torch.tensor([[5, 6, 7, 8]]))
    resid = cache["blocks.0.hook_resid_post"] - cache["blocks.0.hook_resid_pre"]
    assert torch.allclose(cache["blocks.0.hook_attn_out"] + cache["blocks.0.hook_mlp_out"], resid, atol=1e-5)
    assert not torch.allclose(cache["blocks.0.hook_mlp_out"], resid, atol=1e-3)


def test_a_site_that_cannot_be_computed_is_withdrawn_not_raised(tok):
    """dynamics.untie_gpt2 replaces GPT-2's norms by position-split modules with no single epsilon: the ln hooks
    cannot be computed there; the check withdraws them (saying so) instead of failing the load or a later capture."""
    from interp.dynamics.untied import untie_gpt2
    hf = untie_gpt2(tiny_causal_lm("gpt2"), 3)
    with pytest.warns(SelfCheckWarning, match="withdrawn"):
        model = interp.wrap(hf, tok)
    assert model.self_check.withdrawn["blocks.1.ln1.hook_scale"].startswith("raises ValueError")
    assert not [n for n in model.hook_names() if ".ln" in n or n.startswith("ln_")]
    _, cache = model.run_with_cache(["Hello there"])
    assert set(cache) == set(model.hook_names())
