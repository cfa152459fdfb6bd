"""GAVEL CE folders, the CE library on disk and ERI elicitation (readouts of generated tokens)."""
import pytest
import torch

import interp
from interp.probes.gavel import (CE, CEDetector, CELibrary, DetectorConfig, FeatureSpec, WindowGRU,
                                 conversation_features, elicit, render_prompt)
from interp.testing import tiny_model

torch.set_num_threads(1)


def test_ce_validation_and_library_roundtrip(tmp_path):
    with pytest.raises(ValueError, match="CE.name"):
        CE("bad name")
    with pytest.raises(ValueError, match="CE.version"):
        CE("ok", version=0)
    ces = [CE("a", "first", texts=["x y"], calibration=[{"messages": [{"role": "assistant", "content": "x"}],
                                                          "ces": ["a"]}]), CE("b", "second", version=2)]
    det = CEDetector(WindowGRU(6, 2, hidden=4, rnn_layers=1, dropout=0.0), ["a", "b"],
                     DetectorConfig(hidden=4, rnn_layers=1, dropout=0.0), spec=FeatureSpec((0, 1)),
                     thresholds=torch.tensor([0.3, 0.7]), patience=torch.tensor([1, 2]))
    CELibrary(ces, det).save(tmp_path / "lib")
    lib = CELibrary.load(tmp_path / "lib")
    assert lib.names == ["a", "b"] and lib.ces[1].version == 2 and lib.ces[0].texts == ["x y"]
    assert lib.detector.patience.tolist() == [1, 2] and lib.detector.spec.layers == (0, 1)
    x = torch.randn(3, 5, 6)
    torch.testing.assert_close(lib.detector.window_logits(x), det.window_logits(x))
    with pytest.raises(ValueError, match="differ"):
        CELibrary(ces[:1], det)


def test_elicit_records_generated_token_readouts():
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    model = interp.wrap(hf, tok, backend="torch")
    spec = FeatureSpec.range(0, 2)
    texts = ["the cat sat", "a much longer text to rewrite here"]
    gen, feats = elicit(model, "payment_tools", texts, spec, max_new_tokens=8, stop_at_eos=False, batch_size=2)
    assert len(gen) == len(feats) == 2
    for t, f in zip(texts, feats):
        assert f.shape == (7, spec.width(model))  # 8 new tokens, the last never read back
        prompt = render_prompt(model, [{"role": "user", "content":
                                        f"Rewrite the following text in the manner of payment tools:\n\n{t}"}])
        p_ids = model.to_tokens(prompt)[0]
        new = model.generate(prompt, max_new_tokens=8, return_text=False, stop_at_eos=False)[0]
        full = torch.cat([p_ids, new])
        keep = torch.zeros(len(full), dtype=torch.bool)
        keep[len(p_ids):-1] = True
        want = conversation_features(model, [(full, keep)], spec)[0]
        torch.testing.assert_close(f, want, rtol=1e-4, atol=1e-4)  # batched (left-padded) = offline, unpadded
