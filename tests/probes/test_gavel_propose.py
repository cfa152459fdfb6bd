"""GAVEL automated rule creation: ranking by support/lift and the smallest separating rule."""
import random

import pytest

from interp.probes.gavel import parse_rule, propose_rule

CES = ["a", "b", "c", "d", "e"]


def sample(rng, truth, n, positive):
    out = []
    while len(out) < n:
        s = {c for c in CES if rng.random() < 0.35}
        if truth.evaluate(s) == positive:
            out.append(s)
    return out


def test_recovers_a_planted_rule():
    rng = random.Random(0)
    truth = parse_rule("all of {a} and 1 of {b, c}")
    pos, neg = sample(rng, truth, 200, True), sample(rng, truth, 400, False)
    prop = propose_rule(pos, neg, CES, description="planted", min_support=0.3)
    got = prop.rule(CES)
    assert prop.youden_j == pytest.approx(1.0)
    for s in pos:
        assert got.evaluate(s)
    for s in neg:
        assert not got.evaluate(s)
    assert set(got.condition_ces) == {"a", "b", "c"} and prop.text.startswith("all of {a}")
    assert prop.ranking[0]["ce"] == "a"  # support 1.0, largest lift
    assert len(prop.to_frame()) == 5
    prop.figure()


def test_prefers_the_smallest_rule_and_errors():
    pos = [{"a", "b"}] * 10
    neg = [{"b"}] * 10 + [set()] * 5
    prop = propose_rule(pos, neg, CES)
    assert prop.text == "all of {a}" and prop.tpr == 1 and prop.fpr == 0
    with pytest.raises(ValueError, match="no CE fires"):
        propose_rule([set()] * 3, neg, CES)
    with pytest.raises(ValueError, match="needs example"):
        propose_rule([], neg, CES)
