"""Transcoders: format compatibility with sae-lens, splice semantics, training and metrics."""
import pytest
import torch

import interp
from interp.editing import Transcoder, TranscoderTrainingConfig, evaluate_transcoder, splice, train_transcoder
from interp.editing.transcoders import harvest_pairs
from interp.testing import tiny_model

interp.set_progress(False)
TEXTS = [f"Row {i}: the quick brown fox {i * 7 % 13} jumps over {i % 5} lazy dogs." for i in range(48)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    return interp.wrap(hf, tok, backend="torch")


def test_sae_lens_round_trip(tmp_path):
    from sae_lens.saes.transcoder import Transcoder as SLTranscoder
    tc = Transcoder(16, 40, 12, hook_name="blocks.1.ln2.hook_normalized", seed=3)
    with torch.no_grad():
        tc.b_enc.normal_(), tc.b_dec.normal_()
    tc.save(tmp_path / "ours")
    theirs = SLTranscoder.load_from_disk(tmp_path / "ours")
    x = torch.randn(5, 16)
    assert torch.allclose(theirs(x), tc(x), atol=1e-6)
    assert torch.allclose(theirs.encode(x), tc.encode(x), atol=1e-6)
    theirs.save_model(tmp_path / "theirs")
    back = Transcoder.load(tmp_path / "theirs")
    assert torch.allclose(back(x), tc(x), atol=1e-6)
    assert Transcoder.load(tmp_path / "ours").hook_name == "blocks.1.ln2.hook_normalized"
    assert torch.allclose(Transcoder.from_sae_lens(tc.to_sae_lens())(x), tc(x))
    with pytest.raises(ValueError, match="d_in"):
        tc.encode(torch.randn(2, 15))


def test_apply_b_dec_to_input_is_applied_on_load(tmp_path):
    """A transcoder file with ``apply_b_dec_to_input: true`` encodes ``ReLU((x − b_dec) W_enc + b_enc)`` (input
    centring; TCPE's adapter subtracts its input-centring ``b_dec``), by hand. The loader before ignored the flag
    and encoded ``ReLU(x W_enc + b_enc)``."""
    import json
    tc = Transcoder(16, 40, 16, seed=3)
    with torch.no_grad():
        tc.b_enc.normal_(), tc.b_dec.normal_()
    tc.save(tmp_path / "tc")
    cfg = json.loads((tmp_path / "tc" / "cfg.json").read_text())
    cfg["apply_b_dec_to_input"] = True
    (tmp_path / "tc" / "cfg.json").write_text(json.dumps(cfg))
    back = Transcoder.load(tmp_path / "tc")
    x = torch.randn(5, 16)
    hand = torch.relu((x - tc.b_dec) @ tc.W_enc + tc.b_enc)
    assert torch.allclose(back.encode(x), hand, atol=1e-5)
    assert not torch.allclose(back.encode(x), tc.encode(x), atol=1e-3)
    assert torch.allclose(back(x), hand @ tc.W_dec + tc.b_dec, atol=1e-5)
    assert torch.equal(back.W_enc, tc.W_enc) and torch.equal(back.b_dec, tc.b_dec)
    cfg["apply_b_dec_to_input"] = "yes"
    (tmp_path / "tc" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="apply_b_dec_to_input"):
        Transcoder.load(tmp_path / "tc")
    Transcoder(16, 40, 12, seed=1).save(tmp_path / "wide")
    cfg = json.loads((tmp_path / "wide" / "cfg.json").read_text())
    (tmp_path / "wide" / "cfg.json").write_text(json.dumps({**cfg, "apply_b_dec_to_input": True}))
    with pytest.raises(ValueError, match="sizes differ"):
        Transcoder.load(tmp_path / "wide")


def test_splice_replaces_mlp_output_with_tc_of_mlp_input(model):
    tc = Transcoder(64, 96, 64, seed=1)
    with torch.no_grad():
        tc.b_enc.fill_(0.05)
    texts = TEXTS[:3]
    batch = model.tokenize(texts, padding_side="left")
    _, clean = model.run_with_cache(batch, names=["blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"])
    with splice(model, 1, tc) as s:
        out = "blocks.1.hook_mlp_out.hook_sae_output"  # the spliced MLP output (the base name shows the MLP's)
        logits, c = model.run_with_cache(batch, names=[out, s.features, "blocks.1.ln2.hook_normalized",
                                                       "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"])
        # the layer's MLP input is unchanged (upstream), its output is TC(input)
        assert torch.allclose(c["blocks.1.ln2.hook_normalized"], clean["blocks.1.ln2.hook_normalized"], atol=1e-5)
        expect = tc(clean["blocks.1.ln2.hook_normalized"])
        assert torch.allclose(c[out], expect, atol=1e-5)
        assert torch.allclose(c["blocks.1.hook_resid_post"], c["blocks.1.hook_resid_mid"] + expect, atol=1e-5)
        assert torch.allclose(c[s.features], tc.encode(clean["blocks.1.ln2.hook_normalized"]), atol=1e-5)
        # zero-ablating every feature leaves b_dec as the output
        with model.intervene({s.features: lambda t, ctx: torch.zeros_like(t)}):
            _, c2 = model.run_with_cache(batch, names=[out])
        assert torch.allclose(c2[out], tc.b_dec.expand_as(expect), atol=1e-6)
    assert not torch.allclose(logits, model(batch), atol=1e-4)
    # error term: spliced model reproduces the clean logits
    with splice(model, 1, tc, use_error_term=True):
        assert torch.allclose(model(batch), clean_logits(model, batch), atol=1e-4)
    # permanent swap: open until closed
    s = splice(model, 2, tc)
    spliced = model(batch)
    s.close()
    assert not torch.allclose(spliced, model(batch), atol=1e-4)
    with pytest.raises(ValueError, match="layer"):
        splice(model, 3, tc)


def clean_logits(model, batch):
    return model(batch)


def test_train_and_metrics(model):
    cfg = TranscoderTrainingConfig(d_sae=128, batch_size=64, n_epochs=4, l1_coefficient=1e-4, resample_every=10,
                                   dead_window=300, text_batch_size=16)
    tc, hist = train_transcoder(model, 1, TEXTS, cfg)
    assert hist.mse[-1] < 0.5 * hist.mse[0]
    assert hist.l1_coefficient[0] < hist.l1_coefficient[-1] == pytest.approx(1e-4)
    m = evaluate_transcoder(model, 1, tc, TEXTS[:16])
    # hand computation of FVE / L0 from the harvested pairs
    xs, ys = zip(*harvest_pairs(model, 1, TEXTS[:16]))
    x, y = torch.cat(xs), torch.cat(ys)
    with torch.no_grad():
        fve = 1 - (tc(x) - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
    assert m.fve == pytest.approx(float(fve), rel=1e-3)
    assert m.l0 == pytest.approx(float((tc.encode(x) > 0).float().sum(-1).mean()), rel=1e-4)
    assert m.n_tokens == len(x)
    # one text batch: the losses are the model's own next-token loss, plain and with the MLP replaced by TC
    from interp.model import next_token_loss
    batch = model.prepare(model.tokenize(TEXTS[:16]))
    with torch.no_grad():
        assert m.ce_clean == pytest.approx(float(next_token_loss(model(batch), batch)), rel=1e-5)
        with splice(model, 1, tc):
            assert m.ce_spliced == pytest.approx(float(next_token_loss(model(batch), batch)), rel=1e-5)
    assert m.ce_recovered == pytest.approx((m.ce_mlp_zero - m.ce_spliced) / (m.ce_mlp_zero - m.ce_clean))
    assert len(m.to_frame()) == 1 and m.figure() is not None
    with pytest.raises(ValueError, match="d_sae"):
        TranscoderTrainingConfig(d_sae=0)
    with pytest.raises(ValueError, match="l1_warmup_frac"):
        TranscoderTrainingConfig(l1_warmup_frac=2)


def test_feature_top_tokens_by_hand(model, tmp_path):
    from interp.editing import feature_top_tokens
    tc = Transcoder(64, 32, 64, seed=4)
    feats = [3, 7, 11]
    texts = TEXTS[:6]
    ft = feature_top_tokens(model, 1, tc, feats, texts, k=4, batch_size=4)
    batch = model.tokenize(texts)
    _, c = model.run_with_cache(batch, names=["blocks.1.ln2.hook_normalized"])
    z = tc.encode(c["blocks.1.ln2.hook_normalized"])[..., feats]
    z = z.masked_fill(~batch["attention_mask"].bool()[..., None], -1)
    for i, f in enumerate(feats):
        want = z[..., i].flatten().topk(4).values
        want = want[want > 0]
        got = torch.tensor([a for a, _, _ in ft.examples[str(f)]])
        assert torch.allclose(got, want, atol=1e-5)
    assert "<table>" in ft.to_html() and len(ft.to_frame()) == sum(len(v) for v in ft.examples.values())
    with pytest.raises(ValueError, match="feature ids"):
        feature_top_tokens(model, 1, tc, [99], texts)
