"""GAVEL activations (hook_z readout, GQA grouping, padding) and the window GRU detector (triggers, calibration)."""
import pytest
import torch

import interp
from interp.probes.gavel import (CalibrationLabels, CEDetector, DetectorConfig, FeatureSpec, calibrate,
                                 compute_triggers, conversation_features, encode_conversation, group_readout,
                                 labels_for_rule, make_windows, parse_rule, rule_from_json, train_detector)
from interp.testing import tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def llama():
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)  # 4 query heads, 2 KV heads
    return interp.wrap(hf, tok, backend="torch")


def test_group_readout_hand():
    z = torch.arange(2 * 4 * 3, dtype=torch.float).reshape(1, 2, 4, 3)  # [B=1, S=2, H=4, d=3]
    g = group_readout(z, 2)
    assert g.shape == (1, 2, 6)
    assert torch.equal(g[0, 0, :3], (z[0, 0, 0] + z[0, 0, 1]) / 2)
    assert torch.equal(g[0, 1, 3:], (z[0, 1, 2] + z[0, 1, 3]) / 2)
    with pytest.raises(ValueError, match="multiple"):
        group_readout(torch.zeros(1, 1, 3, 2), 2)


def test_grouped_readout_is_group_averaged_attention_times_values(llama):
    """Digest: under GQA the probabilities are averaged over each KV group's query heads, then times V."""
    ids = torch.tensor([[256, 72, 101, 108, 108, 111, 33]])
    names = ["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_v", "blocks.1.attn.hook_z"]
    _, cache = llama.run_with_cache(ids, names=names)
    A, v = cache[names[0]][0], cache[names[1]][0]  # [H, Q, K], [K, H_kv or H, d]
    H, Hkv = llama.cfg.n_heads, llama.cfg.n_kv_heads
    if v.shape[1] == H:  # values repeated per query head: take one per group
        v = v[:, :: H // Hkv]
    Abar = A.reshape(Hkv, H // Hkv, *A.shape[1:]).mean(1)  # [H_kv, Q, K]
    want = torch.einsum("gqk,kgd->qgd", Abar, v).reshape(A.shape[1], -1)
    feats = conversation_features(llama, [ids[0]], FeatureSpec((1,)), batch_size=1)[0]
    torch.testing.assert_close(feats, want, rtol=1e-4, atol=1e-5)


def test_features_padding_excluded_and_layers_stacked(llama):
    spec = FeatureSpec.range(0, 3)
    seqs = [torch.tensor([256, 10, 20, 30, 40, 50, 60, 70]), torch.tensor([256, 5, 6]), torch.tensor([256, 1, 2, 3, 4])]
    batched = conversation_features(llama, seqs, spec, batch_size=3)
    alone = [conversation_features(llama, [s], spec, batch_size=1)[0] for s in seqs]
    for b, a, s in zip(batched, alone, seqs):
        assert b.shape == (len(s), spec.width(llama)) == (len(s), 3 * 2 * 16)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    # the middle block of the stacked feature is layer 1's readout
    mid = conversation_features(llama, seqs[:1], FeatureSpec((1,)))[0]
    torch.testing.assert_close(batched[0][:, 32:64], mid, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="contiguous"):
        FeatureSpec((0, 2))
    with pytest.raises(ValueError, match="has 3 layers"):
        conversation_features(llama, seqs, FeatureSpec((2, 3)))


def test_assistant_tokens_only(llama):
    conv = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello!"},
            {"role": "user", "content": "bye"}]
    ids, keep = encode_conversation(llama, conv)
    text = llama.tokenizer.decode(ids[keep])
    assert "hello!" in text and "hi there" not in text and "bye" not in text
    feats = conversation_features(llama, [conv], FeatureSpec((0, 1)))[0]
    assert feats.shape[0] == int(keep.sum())
    with pytest.raises(ValueError, match="role"):
        encode_conversation(llama, [{"role": "bot", "content": "x"}])


def test_make_windows():
    f = torch.arange(12.0)[:, None]
    w = make_windows(f, 5)
    assert w.shape == (3, 5, 1)
    assert w[:, :, 0].tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [7, 8, 9, 10, 11]]
    assert make_windows(f[:10], 5).shape == (2, 5, 1)
    assert make_windows(f[:3], 5).shape == (1, 3, 1)


def test_compute_triggers_patience_semantics():
    probs = torch.tensor([[0.9, 0.2, 0.6], [0.1, 0.3, 0.7], [0.95, 0.3, 0.1]])  # [W=3, C=3]
    assert compute_triggers(probs, 0.5, 1).tolist() == [True, False, True]
    assert compute_triggers(probs, 0.5, 2).tolist() == [True, False, True]
    assert compute_triggers(probs, 0.65, 2).tolist() == [True, False, False]
    assert compute_triggers(probs, 0.3, 2).tolist() == [True, True, True]
    assert compute_triggers(probs, 0.3, 3).tolist() == [False, False, False]
    # per-CE thresholds and patience; >= is inclusive
    assert compute_triggers(probs, torch.tensor([0.95, 0.3, 0.7]), torch.tensor([1, 2, 1])).tolist() == [True, True, True]
    with pytest.raises(ValueError):
        compute_triggers(probs, 0.5, 0)


def _dummy_detector(C=3):
    from interp.probes.gavel import WindowGRU
    net = WindowGRU(2, C, hidden=4, rnn_layers=1, dropout=0.0)
    return CEDetector(net, ["a", "b", "c"][:C], DetectorConfig(hidden=4, rnn_layers=1, dropout=0.0))


def test_calibration_buckets_and_youden_hand():
    det = _dummy_detector()
    # three dialogues: a required (prob .8), a outside (.4), any_of {b, c} with b .6, c .2
    probs = [torch.tensor([[0.8, 0.1, 0.1]]), torch.tensor([[0.4, 0.7, 0.1]]),
             torch.tensor([[0.1, 0.6, 0.2]])]
    labels = [CalibrationLabels(required={"a"}), CalibrationLabels(required={"b"}),
              CalibrationLabels(any_of=[{"b", "c"}])]
    cal = calibrate(det, probs, labels, thresholds=[0.3, 0.5, 0.9], patience=[1])
    T = {t: i for i, t in enumerate(cal.thresholds_grid)}
    # CE a: positive in d0 (0.8), negative in d1 (0.4) and d2 (0.1)
    assert cal.tpr[0, T[0.5], 0] == 1 and cal.fpr[0, T[0.5], 0] == 0
    assert cal.tpr[0, T[0.3], 0] == 1 and cal.fpr[0, T[0.3], 0] == pytest.approx(0.5)
    assert cal.threshold[0] == 0.5 and cal.youden_j[0] == pytest.approx(1.0)
    # CE c at θ=0.5: d2's group fired through b, so c (not fired) is TN there; d0, d1: outside, TN
    assert cal.fpr[0, T[0.5], 2] == 0 and cal.tpr[0, T[0.5], 2] == 0
    # CE c at θ=0.9: the group did not fire in d2 -> c is FN
    # CE b at θ=0.9: FN in d1 and d2 -> TPR 0
    assert cal.tpr[0, T[0.9], 1] == 0
    # b at 0.5: TP in d1 and d2, d0 (0.1) TN -> J = 1; at 0.3 also J = 1 -> the largest near-best θ wins (0.5)
    assert cal.threshold[1] == 0.5
    assert det.thresholds.tolist() == pytest.approx(cal.threshold)
    assert len(cal.to_frame()) == 3 * 3
    cal.figure()


def test_labels_for_rule():
    lb = labels_for_rule(rule_from_json({"all_required": ["a"], "any_of": [["b", "c"]], "supporting": ["d"]}))
    assert lb.required == {"a"} and lb.any_of == ({"b", "c"},) and lb.supporting == {"d"}
    lb = labels_for_rule(parse_rule("all of {a} and 1 of {b} or all of {a, c}"))
    assert lb.required == {"a"} and lb.any_of == () and lb.supporting == {"b", "c"}
    assert labels_for_rule(None) == CalibrationLabels()


def test_detector_learns_separable_windows_and_roundtrips(tmp_path):
    g = torch.Generator().manual_seed(0)
    n, d = 600, 12
    y = torch.zeros(n, 3)
    cls = torch.randint(0, 4, (n,), generator=g)  # 3 = none
    scale = torch.logspace(-1, 1, d)  # dimensions on very different scales (standardisation must cope)
    x = (torch.randn(n, 5, d, generator=g) + 1) * scale
    for c in range(3):
        y[cls == c, c] = 1
        x[cls == c, 2, c] += 4.0 * scale[c]  # the CE shows at one token of the window
    cfg = DetectorConfig(hidden=8, rnn_layers=2, dropout=0.0, max_epochs=15, batch_size=64, lr=1e-2)
    det, hist = train_detector(x, y, ["a", "b", "c"], cfg)
    assert hist.best_epoch >= 1 and min(hist.val_loss) < hist.val_loss[0]
    from sklearn.metrics import roc_auc_score
    xt = (torch.randn(300, 5, d, generator=g) + 1) * scale
    ct = torch.randint(0, 4, (300,), generator=g)
    for c in range(3):
        xt[ct == c, 2, c] += 4.0 * scale[c]
    p = det.window_logits(xt).sigmoid()
    for c in range(3):
        assert roc_auc_score((ct == c).numpy(), p[:, c].numpy()) > 0.95
    det.thresholds = torch.tensor([0.3, 0.4, 0.5])
    det.save(tmp_path / "det")
    det2 = CEDetector.load(tmp_path / "det")
    torch.testing.assert_close(det2.window_logits(xt), det.window_logits(xt))
    assert det2.thresholds.tolist() == pytest.approx([0.3, 0.4, 0.5]) and det2.ces == ["a", "b", "c"]
    with pytest.raises(ValueError, match="targets have"):
        train_detector(x, y[:, :2], ["a", "b", "c"], cfg)
    with pytest.raises(ValueError, match="DetectorConfig.window"):
        DetectorConfig(window=0)


def test_calibration_tie_break_largest_vs_middle():
    det = _dummy_detector(1 and 3)
    # CE a separates perfectly for every θ in 0.3 ... 0.8: J flat at 1
    probs = [torch.tensor([[0.85, 0.0, 0.0]]), torch.tensor([[0.25, 0.0, 0.0]])]
    labels = [CalibrationLabels(required={"a"}), CalibrationLabels()]
    grid = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    # the CE-free dialogue counts only under protocol="all" (the official protocol leaves it out)
    assert calibrate(det, probs, labels, thresholds=grid, protocol="all").threshold[0] == pytest.approx(0.8)  # largest
    assert calibrate(det, probs, labels, thresholds=grid, tie="middle", protocol="all").threshold[0] == \
        pytest.approx(0.6)
    with pytest.raises(ValueError, match="tie must be"):
        calibrate(det, probs, labels, tie="smallest")


def test_features_equal_on_every_backend():
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    spec = FeatureSpec.range(0, 3)
    seqs = [torch.tensor([256, 10, 20, 30, 40, 50, 60, 70]), torch.tensor([256, 5, 6])]
    ref = conversation_features(interp.wrap(hf, tok, backend="torch"), seqs, spec, batch_size=2)
    for backend in ("nnsight", "transformer_lens"):
        got = conversation_features(interp.wrap(hf, tok, backend=backend), seqs, spec, batch_size=2)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_train_text_detector_labels_every_window_of_a_text_with_its_ces():
    """Texts labelled per text (ERI-style): CE x texts carry +2 in feature 0, CE y texts in feature 1, CE-free
    texts neither; the trained detector separates them and calibration fires x on x texts only."""
    from interp.probes.gavel import train_text_detector
    g = torch.Generator().manual_seed(0)

    def text(lab):
        f = torch.randn(12, 4, generator=g) * 0.3
        for c in lab:
            f[:, "xy".index(c)] += 2.0
        return f
    labels = [["x"]] * 30 + [["y"]] * 30 + [[]] * 30 + [["x", "y"]] * 10
    feats = [text(lab) for lab in labels]
    cal_labels = [["x"]] * 8 + [["y"]] * 8 + [[]] * 8
    cal = [text(lab) for lab in cal_labels]
    cfg = DetectorConfig(hidden=16, rnn_layers=1, dropout=0.0, lr=1e-2, max_epochs=15)
    det = train_text_detector(feats, labels, ["x", "y"], cfg, cal_feats=cal,
                              cal_labels=[CalibrationLabels(required=set(lab)) for lab in cal_labels])
    fired = [det.fired(p) for p in det.sequence_probs([text(["x"]), text(["y"]), text([])])]
    assert fired == [{"x"}, {"y"}, set()]
    with pytest.raises(ValueError, match="not among the CEs"):
        train_text_detector(feats[:2], [["z"], []], ["x", "y"], cfg)
    with pytest.raises(ValueError, match="full window"):
        train_text_detector([torch.zeros(3, 4)], [["x"]], ["x", "y"], cfg)
