"""Gradient decomposition (Rofin et al., Prop. 3.1) through the capture layer's gradient path."""
import pytest
import torch

import interp
from interp.dynamics.influence import (GradientDecomposition, decompose_gradient, myopic_attention,
                                       register_myopic_attention, stop_gradient_at)
from interp.testing import tiny_model


@pytest.fixture(scope="module")
def gpt2():
    hf, tok = tiny_model("gpt2", n_layers=3, perturb_norms=True)
    return hf.double(), tok


def _ids(vocab, shape=(3, 9), seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("site,pos", [("blocks.0.hook_resid_post", 2), ("blocks.1.hook_resid_post", 5),
                                      ("blocks.2.hook_resid_pre", 0), ("blocks.1.hook_resid_mid", 6)])
def test_parts_sum_to_full_gradient(gpt2, site, pos):
    hf, tok = gpt2
    model = interp.wrap(hf, tok, backend="torch")
    ids = _ids(model.cfg.d_vocab)
    dec = decompose_gradient(model, ids, site, pos, params=dict(hf.named_parameters()))
    assert dec.max_abs_error() < 1e-12
    # the full part is the ordinary gradient of the mean next-token loss
    hf.zero_grad()
    logits = hf(ids).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()
    for n, p in hf.named_parameters():
        torch.testing.assert_close(dec.full[n], p.grad)
    hf.zero_grad()
    # the position's own loss sends signal through the site: direct is non-zero; pre-cached non-zero
    # whenever later positions attend to it through a later layer
    assert dec.norm("direct") > 1e-3 and dec.norm("shared") > 1e-3
    assert dec.norm("precached") > 1e-4
    # parameters before the site only get direct/pre-cached signal through it: wte rows of tokens
    frame = dec.to_frame()
    assert set(frame.component) == {"direct", "precached", "shared", "full"}
    assert dec.figure().data


def test_last_layer_mid_has_no_precached(gpt2):
    """After the last attention no position reads another: pre-cached must be exactly zero."""
    hf, tok = gpt2
    model = interp.wrap(hf, tok, backend="torch")
    dec = decompose_gradient(model, _ids(model.cfg.d_vocab), "blocks.2.hook_resid_mid", 3,
                             params=dict(hf.named_parameters()))
    assert dec.norm("precached") < 1e-12 and dec.norm("direct") > 0


def test_padded_batch_and_other_backends():
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    ids = _ids(hf.config.vocab_size, (3, 8), seed=1)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0
    with pytest.raises(ValueError, match="real tokens"):  # padding at the position or its target is refused
        decompose_gradient(interp.wrap(hf, tok), ids, "blocks.1.hook_resid_post", 6, attention_mask=mask)
    ref = None
    for backend in ("torch", "nnsight", "transformer_lens"):
        model = interp.wrap(hf, tok, backend=backend)
        dec = decompose_gradient(model, ids, "blocks.1.hook_resid_post", 4, attention_mask=mask)
        assert dec.max_abs_error() < 1e-5, backend
        if ref is None:
            ref = dec
        elif backend == "nnsight":  # same HF parameters: the same decomposition
            for c in ("direct", "precached", "shared"):
                assert abs(dec.norm(c) - ref.norm(c)) < 1e-4 * max(ref.norm(c), 1e-3), (backend, c)
        else:  # the TL bridge holds its own parameterisation of the weights: compare the loss only
            assert abs(dec.loss - ref.loss) < 1e-5


def test_myopic_attention_removes_precached():
    hf, tok = tiny_model("gpt2", n_layers=3, perturb_norms=True)
    hf = hf.double()
    ids = _ids(hf.config.vocab_size)
    eager = hf(ids).logits.detach()
    hf.set_attn_implementation(register_myopic_attention())
    torch.testing.assert_close(hf(ids).logits, eager, rtol=0, atol=1e-12)  # same forward values
    model = interp.wrap(hf, tok, backend="torch")
    for site, pos in [("blocks.0.hook_resid_post", 3), ("blocks.1.hook_resid_pre", 1)]:
        dec = decompose_gradient(model, ids, site, pos, params=dict(hf.named_parameters()))
        assert dec.norm("precached") / dec.norm("full") < 1e-6
        assert dec.norm("direct") > 1e-3 and dec.max_abs_error() < 1e-12


def test_myopic_attention_gradients_by_hand():
    """Loss at the last query: gradient reaches only the diagonal key/value, not earlier ones."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.double, requires_grad=True) for _ in range(3))
    out, probs = myopic_attention(None, q, k, v, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, ref)
    out[:, -1].sum().backward()
    assert k.grad[:, :, :-1].abs().max() == 0 and v.grad[:, :, :-1].abs().max() == 0
    assert k.grad[:, :, -1].abs().max() > 0 and v.grad[:, :, -1].abs().max() > 0


def test_bad_inputs(gpt2):
    hf, tok = gpt2
    model = interp.wrap(hf, tok)
    ids = _ids(model.cfg.d_vocab)
    with pytest.raises(ValueError, match="position"):
        decompose_gradient(model, ids, "blocks.0.hook_resid_post", 8)
    with pytest.raises(ValueError, match="exactly one hook"):
        decompose_gradient(model, ids, "blocks.*.hook_resid_post", 1)
    with pytest.raises(ValueError, match="integer tensor"):
        decompose_gradient(model, ids.float(), "blocks.0.hook_resid_post", 1)
    with pytest.raises(KeyError):
        GradientDecomposition("s", 0, {}, {}, {}, {}, 0.0)["nope"]
    x = torch.randn(2, 5, 4, requires_grad=True)
    y = stop_gradient_at(-1)(x, None)
    y.sum().backward()
    assert x.grad[:, -1].abs().max() == 0 and x.grad[:, :-1].min() == 1


def test_last_loss_position_has_no_precached(gpt2):
    """Position S-2 is the last with a loss: no later loss can read it, so pre-cached is exactly zero."""
    hf, tok = gpt2
    model = interp.wrap(hf, tok, backend="torch")
    dec = decompose_gradient(model, _ids(model.cfg.d_vocab), "blocks.0.hook_resid_post", 7,
                             params=dict(hf.named_parameters()))
    assert dec.norm("precached") < 1e-12 and dec.norm("direct") > 0


def test_q_proxy(gpt2):
    from interp.dynamics import q_proxy
    hf, tok = gpt2
    model = interp.wrap(hf.float(), tok)
    ids = _ids(model.cfg.d_vocab, (3, 8))
    dirs = torch.randn(3, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    r = q_proxy(model, ids, "blocks.0.hook_resid_post", 3, dirs)
    assert r.kl.shape == (3, 8) and (r.kl[:, :3] == 0).all()           # earlier positions cannot see the edit
    assert (r.kl[:, 3:] > 0).all()
    torch.testing.assert_close(r.q, r.kl[:, 4:].sum(-1) / r.kl[:, 3])
    # after the last attention layer nothing reaches later positions: Q = 0
    late = q_proxy(model, ids, "blocks.2.hook_resid_mid", 3, dirs)
    assert late.q.abs().max() < 1e-6 and (late.kl[:, 3] > 0).all()
    assert len(r.to_frame()) == 3 and r.figure().data
    hf.double()


@pytest.mark.slow
def test_majority_paper_criteria():
    """The digest's Majority criteria (4, 5) over 10 seeds. Deviation: only the myopic variant is built (m-untied
    training is not implemented), so criterion 4 is checked on myopic alone. Not run to completion on the shared
    2-core machine (see docs/dynamics.md for the measured single-seed numbers)."""
    from interp.dynamics import majority_validation
    df = majority_validation(seeds=range(10), steps=600, influence_steps=600).set_index("quantity")
    assert df.loc["probe_acc_standard", "mean"] >= 0.9
    assert df.loc["probe_acc_myopic", "mean"] <= df.loc["probe_acc_standard", "mean"] - 0.1
    assert df.loc["influence_direct@15", "lo"] > 0                    # output position
    assert df.loc["influence_direct@8", "lo"] <= 0 <= df.loc["influence_direct@8", "hi"]   # input position
    assert df.loc["influence_precached+shared@8", "lo"] > 0
