"""Issue #35 (fidelity round three, GAVEL items 1-6): the official behaviour is the default, ours a named option.

Every test compares with a hand computation on fixed inputs and names what the code before the fix gave.
"""
import json

import pytest
import torch

import interp
from interp.probes.gavel import (CalibrationLabels, CEDetector, DetectorConfig, FeatureSpec, RuleSyntaxError,
                                 WindowGRU, balance_classes, calibrate, conversation_features, conversation_runs,
                                 encode_conversation, parse_rule, rule_from_json, scored_runs, split_train_val,
                                 train_detector, window_bounds)
from interp.testing import tiny_model

torch.set_num_threads(1)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")


@pytest.fixture(scope="module")
def llama():
    hf, tok = tiny_model("llama", n_layers=2)
    return interp.wrap(hf, tok, backend="torch")


@pytest.fixture(scope="module")
def chatml():
    hf, tok = tiny_model("llama", n_layers=2)
    tok.chat_template = CHATML
    return interp.wrap(hf, tok, backend="torch")


def _long_conversation(turns=6, words=30):
    conv = []
    for t in range(turns):
        conv.append({"role": "user", "content": f"question {t}"})
        conv.append({"role": "assistant", "content": " ".join(f"w{t}{i}" for i in range(words))})
    return conv


# ---------------------------------------------------------------------------------------- 1. truncation
def test_no_truncation_by_default_and_max_length_keeps_the_end(llama):
    """Before: max_length=256 kept the START (most assistant tokens of a long conversation were dropped)."""
    conv = _long_conversation()
    ids, keep = encode_conversation(llama, conv)
    full = "".join(f"{m['role']}: {m['content']}\n" for m in conv)  # no chat template: plain lines
    assert len(ids) == len(llama.tokenizer(full, add_special_tokens=False)["input_ids"]) > 256
    feats = conversation_features(llama, [conv], FeatureSpec((0,)))[0]
    assert feats.shape[0] == int(keep.sum()) == sum(len(m["content"]) for m in conv if m["role"] == "assistant")
    # official training cut: the last max_length tokens; ours (truncation="right"): the first
    ids10, keep10 = encode_conversation(llama, conv, max_length=10)
    assert ids10.tolist() == ids[-10:].tolist() and keep10.tolist() == keep[-10:].tolist()
    idsr, _ = encode_conversation(llama, conv, max_length=10, truncation="right")
    assert idsr.tolist() == ids[:10].tolist()
    with pytest.raises(ValueError, match="truncation"):
        encode_conversation(llama, conv, max_length=10, truncation="middle")


# ---------------------------------------------------------------------------------------- 2. windows
def test_window_bounds_hand():
    """Official: stride-5 windows per turn, short tail unpadded. Before: one joined span, overlapping tail."""
    assert window_bounds(12, 5, [7, 5]) == [(0, 5), (5, 7), (7, 12)]
    assert window_bounds(12, 5) == [(0, 5), (5, 10), (10, 12)]
    assert window_bounds(12, 5, [7, 5], layout="overlap") == [(0, 5), (5, 10), (7, 12)]
    assert window_bounds(3, 5) == [(0, 3)]
    with pytest.raises(ValueError, match="summing"):
        window_bounds(12, 5, [7, 4])


def test_sequence_probs_scores_each_official_window_unpadded():
    torch.manual_seed(0)
    net = WindowGRU(3, 2, hidden=4, rnn_layers=1, dropout=0.0)
    det = CEDetector(net, ["a", "b"], DetectorConfig(hidden=4, rnn_layers=1, dropout=0.0))
    f = torch.randn(12, 3)
    want = torch.cat([net(f[s:e][None]).sigmoid() for s, e in [(0, 5), (5, 7), (7, 12)]]).detach()
    got = det.sequence_probs([f], runs=[[7, 5]])[0]
    torch.testing.assert_close(got, want)
    old = torch.cat([net(f[s:e][None]).sigmoid() for s, e in [(0, 5), (5, 10), (7, 12)]]).detach()
    torch.testing.assert_close(det.sequence_probs([f], runs=[[7, 5]], layout="overlap")[0], old)
    assert not torch.allclose(got, old)


def test_scored_runs_per_assistant_turn(llama):
    assert scored_runs(torch.tensor([0, 1, 1, 0, 0, 1], dtype=torch.bool)) == [2, 1]
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "abc"},
            {"role": "user", "content": "ok"}, {"role": "assistant", "content": "de"}]
    assert conversation_runs(llama, [conv]) == [[3, 2]]
    feats, runs = conversation_features(llama, [conv], FeatureSpec((0,)), return_runs=True)
    assert runs == [[3, 2]] and feats[0].shape[0] == 5


# ---------------------------------------------------------------------------------------- 3. calibration
def _det(C=1, **kw):
    net = WindowGRU(2, C, hidden=4, rnn_layers=1, dropout=0.0)
    return CEDetector(net, ["a", "b"][:C], DetectorConfig(hidden=4, rnn_layers=1, dropout=0.0, **kw))


def test_official_calibration_counts_only_usecase_dialogues():
    """CE a, grid (0.2, 0.4, 0.6, 0.8). Use-case dialogues: d0 requires a (0.7), d3 requires a (0.45), d1 has a
    outside (0.3); d2 is CE-free with a at 0.5.
    Official (d0, d1, d3): θ=0.4: TPR 1, FPR 0 -> J 1; θ=0.6: J 0.5 -> θ 0.4.
    All (ours before, d2 counted): θ=0.4: TPR 1, FPR 1/2 -> J 0.5; θ=0.6: TPR 1/2, FPR 0 -> J 0.5; tie -> largest 0.6."""
    probs = [torch.tensor([[0.7]]), torch.tensor([[0.3]]), torch.tensor([[0.5]]), torch.tensor([[0.45]])]
    labels = [CalibrationLabels(required={"a"}), CalibrationLabels(required={"b"}), CalibrationLabels(),
              CalibrationLabels(required={"a"})]
    det = _det(2)
    probs2 = [torch.cat([p, torch.zeros_like(p)], 1) for p in probs]
    grid = [0.2, 0.4, 0.6, 0.8]
    assert calibrate(det, probs2, labels, thresholds=grid).threshold[0] == pytest.approx(0.4)
    assert calibrate(det, probs2, labels, thresholds=grid, protocol="all").threshold[0] == pytest.approx(0.6)
    ours = _det(2, calibration="all")
    assert calibrate(ours, probs2, labels, thresholds=grid).threshold[0] == pytest.approx(0.6)
    assert labels[2].kind == "negative" and labels[0].kind == "usecase"
    assert CalibrationLabels(required={"a"}, kind="ce").kind == "ce"
    with pytest.raises(ValueError, match="use-case-level"):
        calibrate(det, probs2[2:3], labels[2:3])


def test_official_inference_ignores_calibrated_patience():
    """One window above θ: the official evaluation fires (patience 1); ours applied the calibrated patience 2."""
    probs = torch.tensor([[0.9], [0.1], [0.2]])
    det = _det(1)
    det.thresholds, det.patience = torch.tensor([0.5]), torch.tensor([2])
    assert det.fired(probs) == {"a"}
    ours = _det(1, inference_patience=True)
    ours.thresholds, ours.patience = torch.tensor([0.5]), torch.tensor([2])
    assert ours.fired(probs) == set()


# ---------------------------------------------------------------------------------------- 4. training
def test_ordered_split_by_conversation_and_class_hand():
    """Class a: conversations 0-4 (2 windows each), CE-free: 5-9. Official: per class the first int(5 * 0.8) = 4
    conversations train, the 5th validates; no conversation is in both splits (before: random windows)."""
    groups = torch.arange(10).repeat_interleave(2)
    y = torch.zeros(20, 1)
    y[:10] = 1
    y[1] = 0  # a conversation's class is the CEs positive anywhere in it
    tr, va = split_train_val(y, 0.2, groups)
    assert va.tolist() == [8, 9, 18, 19]
    assert tr.tolist() == [i for i in range(20) if i not in (8, 9, 18, 19)]
    # without conversation ids: windows per class (target row) in the given order
    tr_w, va_w = split_train_val(y, 0.2)
    assert va_w.tolist() == [8, 9, 17, 18, 19]  # class 1: 9 windows -> 7 train; class 0: 11 -> 8 train
    tr_r, va_r = split_train_val(y, 0.2, groups, mode="random", seed=0)
    assert len(va_r) == 4 and set(groups[tr_r].tolist()) & set(groups[va_r].tolist())  # leaks


def test_class_cap_hand():
    """a: 6 windows, b: 4, CE-free: 10 -> every class capped to the smallest single-CE class (4)."""
    y = torch.zeros(20, 2)
    y[:6, 0] = 1
    y[6:10, 1] = 1
    kept = balance_classes(y, torch.arange(20), seed=0)
    assert len(kept) == 12
    assert int(y[kept, 0].sum()) == 4 and int(y[kept, 1].sum()) == 4 and int((y[kept].sum(1) == 0).sum()) == 4


def test_training_returns_last_epoch_unless_early_stopping_fired():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, 3, generator=g)
    y = (x[:, 2, :1] > 0).float()
    groups = torch.arange(200) // 2
    cfg = dict(hidden=4, rnn_layers=1, dropout=0.0, lr=1e-2, early_stopping=100)
    det, hist = train_detector(x, y, ["a"], DetectorConfig(max_epochs=6, **cfg), groups=groups)
    assert not hist.stopped_early and hist.returned_epoch == 6 == len(hist.val_loss)
    _, hist_b = train_detector(x, y, ["a"], DetectorConfig(max_epochs=6, restore="best", **cfg), groups=groups)
    assert hist_b.returned_epoch == hist_b.best_epoch == 1 + min(range(6), key=hist_b.val_loss.__getitem__)
    assert DetectorConfig().max_epochs == 10
    with pytest.raises(ValueError, match="restore"):
        DetectorConfig(restore="last")


def test_official_layer_range_mapping():
    assert FeatureSpec.official(32).layers == tuple(range(13, 27))  # the paper's Mistral-7B: 14 layers
    assert FeatureSpec.official(30).layers == tuple(range(12, 25))  # SmolLM2-135M: same relative range
    assert FeatureSpec.official(2).layers == (1,)


# ---------------------------------------------------------------------------------------- 5. rules
def test_rule_edge_cases():
    with pytest.raises(RuleSyntaxError, match="fire on every dialogue"):
        rule_from_json({"supporting": ["a"]})
    with pytest.raises(RuleSyntaxError, match="listed twice"):
        parse_rule("2 of {tax, tax, go}")
    r = rule_from_json(json.dumps({"all_required": ["a", "a"], "any_of": [["b", "b", "c"]]}))
    assert r.evaluate({"a", "b"}) and not r.evaluate({"a"})  # 'all of' / '1 of': a repeat changes nothing


# ---------------------------------------------------------------------------------------- 6. header tokens
def test_assistant_mask_excludes_template_header(chatml):
    """Official segmenters keep the content between '<|im_start|>assistant\\n' and '<|im_end|>'; before, the
    whole rendered message (header and end-of-turn) was scored."""
    conv = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello!"}]
    ids, keep = encode_conversation(chatml, conv)
    assert chatml.tokenizer.decode(ids[keep]) == "hello!"
    ids_m, keep_m = encode_conversation(chatml, conv, mask="message")
    assert chatml.tokenizer.decode(ids_m[keep_m]) == "<|im_start|>assistant\nhello!<|im_end|>\n"
    assert ids_m.tolist() == ids.tolist()
