"""GAVEL template library and the v2 protocol's data: template splits, sentence spans, token and window labels,
the fixed held-out test set, and the masked BCE that leaves partly covered windows out."""
import math
import random
import re

import pytest
import torch

import types

from interp.probes.gavel import library as lib
from interp.probes.gavel.detector import masked_bce
from interp.benchmarks.gavel.validation import library_test_set, token_ce_labels, window_labels
from interp.testing import tiny_tokenizer

torch.set_num_threads(1)


def _matches(sentence: str, templates) -> bool:
    for t in templates:
        rx = "^" + re.escape(t) + "$"
        rx = re.sub(r"\\\{(\w+)\\\}", lambda m: "(?:" + "|".join(re.escape(v) for v in lib.SLOTS[m.group(1)]) + ")", rx)
        if re.match(rx, sentence):
            return True
    return False


def test_template_splits_are_disjoint():
    for ce in lib.CE_TEMPLATES:
        test, more, val = (set(lib._pool(ce, s)) for s in ("test", "more", "val"))
        assert test and more and val and not (test & more) and not (test & val) and not (more & val)
        assert len(more) == 11 and len(val) == 3
    assert not set(lib._pool(None, "more")) & set(lib._pool(None, "val")) - set(lib.NEUTRAL)
    with pytest.raises(ValueError, match="split"):
        lib._pool("making_threat", "dev")


def test_spans_point_at_the_ce_sentences():
    rng = random.Random(3)
    convs = lib.training_conversations(rng, 40, "more", max_ces=2) + library_test_set(0, n_test=3)
    assert any(len(c.ces) == 2 for c in convs) and any(not c.ces for c in convs)
    for c in convs:
        assert sorted(s[3] for s in c.spans) == sorted(c.ces)
        split = "test" if c.kind != "train" else "more"
        for m, a, b, ce in c.spans:
            assert c.messages[m]["role"] == "assistant"
            assert _matches(c.messages[m]["content"][a:b], lib._pool(ce, split))


def test_test_set_is_fixed_and_labelled():
    a, b = library_test_set(0), library_test_set(0)
    assert [x.messages for x in a] == [x.messages for x in b] and len(a) == 4 * 30 + 15
    kinds = [x.kind for x in a]
    assert kinds.count("positive") == kinds.count("hard") == 60 and kinds.count("random") == 15
    for x in a:
        r = lib.library_rules(include_unseen=True)
        if x.kind == "positive":
            assert any(rule.evaluate(x.ces) for rule in r if rule.name == x.scenario)


def test_token_and_window_labels_by_hand():
    tok = tiny_tokenizer()
    model = types.SimpleNamespace(tokenizer=tok)  # token_ce_labels only tokenises
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ab Click here. cd"}]
    conv = lib.LabelledConversation(msgs, ["click_or_enter"], "train", None, [(1, 3, 14, "click_or_enter")])
    ces = ["payment_tools", "click_or_enter"]
    ids, keep, lab = token_ce_labels(model, conv, ces)
    # no chat template: "user: hi\n" then "assistant: ab Click here. cd\n", one token per character here
    text = "user: hi\nassistant: ab Click here. cd\n"
    assert tok.decode(ids.tolist()) == text and len(ids) == len(text)
    # official mask (issue #35 item 6): only the content "ab Click here. cd" is scored, not "assistant: " or "\n"
    c0 = text.index("ab Click")
    assert keep.tolist() == [False] * c0 + [True] * len("ab Click here. cd") + [False]
    _, keep_m, _ = token_ce_labels(model, conv, ces, mask="message")  # ours before: the whole rendered message
    assert keep_m.tolist() == [False] * 9 + [True] * (len(text) - 9)
    start = text.index("Click")
    want = torch.zeros(len(text), 2)
    want[start:start + len("Click here."), 1] = 1
    torch.testing.assert_close(lab, want)
    # windows of 5: 1 when >= half the tokens carry the CE, 0 when none, NaN (left out) otherwise
    tl = torch.tensor([[1, 0], [1, 0], [1, 0], [0, 0], [0, 0],
                       [0, 0], [0, 0], [0, 0], [0, 0], [0, 0],
                       [0, 1], [0, 1], [0, 0], [0, 0], [0, 0]], dtype=torch.float)
    w = window_labels(tl, 5)
    assert w[:2].tolist() == [[1.0, 0.0], [0.0, 0.0]]
    assert w[2, 0] == 0 and math.isnan(w[2, 1])


def test_masked_bce_leaves_nan_targets_out():
    logits = torch.tensor([[0.3, -1.2], [2.0, 0.5]])
    t = torch.tensor([[1.0, float("nan")], [0.0, 1.0]])
    known = torch.tensor([[0.3, 1.0], [2.0, 0.0], [0.5, 1.0]])  # (logit, target) of the known entries
    want = torch.stack([torch.nn.functional.binary_cross_entropy_with_logits(x, y) for x, y in known]).mean()
    torch.testing.assert_close(masked_bce(logits, t), want)
    full = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    torch.testing.assert_close(masked_bce(logits, full), torch.nn.BCEWithLogitsLoss()(logits, full))
