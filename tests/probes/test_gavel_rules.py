"""GAVEL rule language: parser (precedence, bounds, errors with line/column), evaluate, score, JSON form, files."""
import itertools
import json

import pytest

from interp.probes.gavel import (And, Or, RuleSyntaxError, Selector, load_rules, parse_condition, parse_rule,
                                 rule_from_json)

CES = ["a", "b", "c", "d", "e"]


def test_and_binds_tighter_than_or():
    node = parse_condition("all of {a} or all of {b} and all of {c}")
    assert isinstance(node, Or) and isinstance(node.items[1], And)
    r = parse_rule("all of {a} or all of {b} and all of {c}")
    assert r.evaluate({"a"}) and not r.evaluate({"b"}) and r.evaluate({"b", "c"})
    r2 = parse_rule("(all of {a} or all of {b}) and all of {c}")
    assert not r2.evaluate({"a"}) and r2.evaluate({"a", "c"}) and r2.evaluate({"b", "c"})


def test_evaluate_truth_table_matches_hand_formula():
    r = parse_rule("all of {a} and 1 of {b, c} or 2 of {c, d, e}")
    for bits in itertools.product([0, 1], repeat=5):
        fired = {c for c, b in zip(CES, bits) if b}
        want = ("a" in fired and ("b" in fired or "c" in fired)) or len(fired & {"c", "d", "e"}) >= 2
        assert r.evaluate(fired) == want, fired


def test_k_of_g_refuses_a_repeated_ce():
    """Issue #35 item 5: the official matcher counts a repeated CE twice ('2 of [tax, tax, go]' fires on {tax});
    ours used to collapse the repeat silently (group {a, b}). Now a repeat is refused with a clear error."""
    with pytest.raises(RuleSyntaxError, match="listed twice"):
        parse_rule("2 of {a, a, b}")
    with pytest.raises(RuleSyntaxError, match="more than once"):
        parse_rule("2 of g", groups={"g": ["a", "a", "b"]})
    r = parse_rule("2 of {a, b}")
    assert not r.evaluate({"a"}) and r.evaluate({"a", "b"})


def test_score_min_max_composition():
    s = {"a": 0.9, "b": 0.2, "c": 0.7, "d": 0.4, "e": 0.1}
    r = parse_rule("all of {a, d} and 1 of {b, c}")
    assert r.score(s) == pytest.approx(min(min(0.9, 0.4), max(0.2, 0.7)))
    assert parse_rule("all of {a} or 1 of {e}").score(s) == pytest.approx(0.9)
    # k of g: the k-th largest score
    assert parse_rule("2 of {b, c, d}").score(s) == pytest.approx(0.4)
    # score >= t  <=>  evaluate on CEs thresholded at t
    r = parse_rule("all of {a} and 2 of {b, c, d} or all of {e, b}")
    for t in [0.05, 0.15, 0.3, 0.45, 0.8, 0.95]:
        assert (r.score(s) >= t) == r.evaluate({c for c, v in s.items() if v >= t})
    with pytest.raises(ValueError, match="no score for CE"):
        r.score({"a": 1.0})


def test_json_form_is_digest_formula():
    r = rule_from_json({"all_required": ["a", "b"], "any_of": [["c", "d"], ["e"]], "supporting": ["x"]})
    s = {"a": 0.8, "b": 0.6, "c": 0.1, "d": 0.3, "e": 0.9, "x": 0.0}
    assert r.score(s) == pytest.approx(min(0.8, 0.6, max(0.1, 0.3), 0.9))
    assert r.evaluate({"a", "b", "d", "e"}) and not r.evaluate({"a", "b", "x", "e"})
    assert r.supporting == ("x",) and set(r.ces) == {"a", "b", "c", "d", "e", "x"}
    assert r.required == ("a", "b", "e")
    with pytest.raises(ValueError, match="needs 'all_required' or 'any_of'"):
        rule_from_json({"supporting": ["a"]})
    with pytest.raises(ValueError, match="unknown JSON rule field"):
        rule_from_json({"all_requried": ["a"]})


def test_required_over_or_branches():
    assert parse_rule("all of {a, b} and 1 of {c, d} or all of {a, e}").required == ("a",)
    assert parse_rule("1 of {a, b}").required == ()


def test_named_groups_library_form():
    r = parse_rule("all of lure and 1 of info", groups={"lure": ["a", "b"], "info": ["c", "d"]})
    assert r.evaluate({"a", "b", "d"}) and not r.evaluate({"a", "c"})
    with pytest.raises(RuleSyntaxError, match="unknown group 'other'"):
        parse_rule("all of other", groups={"lure": ["a"]})
    with pytest.raises(RuleSyntaxError, match="not used"):
        parse_rule("all of lure", groups={"lure": ["a"], "dead": ["b"]})


@pytest.mark.parametrize("text, line, col, fragment", [
    ("all of {a} and", 1, 15, "expected 'all', a number k"),
    ("all {a}", 1, 5, "expected 'of'"),
    ("all of {a b}", 1, 11, "expected ',' or '}'"),
    ("all of {a,}", 1, 11, "expected a CE name"),
    ("all of {}", 1, 9, "empty group"),
    ("3 of {a, b}", 1, 1, "k must be between 1 and the group size"),
    ("0 of {a}", 1, 1, "at least 1"),
    ("all of {a}\n  and not 1 of {b}", 2, 7, "negation ('not') is reserved"),
    ("(all of {a} or 1 of {b}", 1, 24, "')' closing the '(' at line 1, column 1"),
    ("all of {a} 1 of {b}", 1, 12, "'and', 'or', ')' or the end"),
    ("all of {a} & 1 of {b}", 1, 12, "unexpected character '&'"),
    ("all of {a}\nor\n1 of {b c}", 3, 9, "expected ',' or '}'"),
])
def test_syntax_errors_name_line_column_and_expectation(text, line, col, fragment):
    with pytest.raises(RuleSyntaxError) as info:
        parse_rule(text)
    e = info.value
    assert isinstance(e, ValueError)
    assert (e.line, e.column) == (line, col), str(e)
    assert fragment in str(e) and f"line {line}, column {col}" in str(e)


def test_unknown_ce_against_library():
    with pytest.raises(RuleSyntaxError, match="unknown CE 'zz'") as info:
        parse_rule("all of {a}\nand 1 of {b, zz}", known_ces=CES)
    assert (info.value.line, info.value.column) == (2, 14)
    parse_rule("all of {a} and 1 of {b, c}", known_ces=CES)
    with pytest.raises(ValueError, match="unknown CE"):
        parse_rule("all of {a}").check_ces(["b"])


def test_actions_validated():
    with pytest.raises(ValueError, match="action must be one of"):
        parse_rule("all of {a}", action="explode")
    with pytest.raises(ValueError, match="needs a 'message'"):
        parse_rule("all of {a}", action="replace")
    with pytest.raises(ValueError, match="needs a 'system_prompt'"):
        parse_rule("all of {a}", action="redirect")


def test_rule_file_roundtrip_json_and_yaml(tmp_path):
    spec = {"rules": [
        {"name": "phishing", "description": "lure + info", "action": "block",
         "condition": "all of {content_creation, click_or_enter} and 1 of {personal_information, provide_or_give}"},
        {"name": "scamazon", "action": "replace", "message": "I can't help with that.",
         "all_required": ["personal_information", "payment_tools"], "any_of": [["buy_or_purchase", "click_or_enter"]]},
        {"name": "lib", "groups": {"lure": ["content_creation"]}, "condition": "all of lure"},
    ]}
    f = tmp_path / "rules.json"
    f.write_text(json.dumps(spec))
    rs = load_rules(f)
    assert [r.name for r in rs] == ["phishing", "scamazon", "lib"]
    assert rs["phishing"].action == "block" and rs["scamazon"].message.startswith("I can't")
    assert rs["phishing"].evaluate({"content_creation", "click_or_enter", "provide_or_give"})
    out = rs.save(tmp_path / "again.json")
    rs2 = load_rules(out)
    for r1, r2 in zip(rs, rs2):
        for fired in [set(), set(r1.ces), set(r1.ces[:2]), set(r1.ces[1:])]:
            assert r1.evaluate(fired) == r2.evaluate(fired)
    y = tmp_path / "rule.yaml"
    y.write_text("name: phishing_content_creation\ndefinition: d\ngroups:\n  lure_creation: [content_creation, "
                 "click_or_enter]\n  info_solicitation: [personal_information, provide_or_give]\n"
                 "condition: all of lure_creation and 1 of info_solicitation\n")
    (r,) = load_rules(y)
    assert r.name == "phishing_content_creation" and r.evaluate({"content_creation", "click_or_enter",
                                                                  "personal_information"})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"name": "x", "condition": "all of {a} and"}]}))
    with pytest.raises(RuleSyntaxError, match=r"bad.json\[0\], rule 'x'.*line 1, column 15"):
        load_rules(bad)
    with pytest.raises(ValueError, match="duplicate rule name"):
        load_rules([{"name": "x", "condition": "all of {a}"}, {"name": "x", "condition": "all of {b}"}])
    with pytest.raises(RuleSyntaxError, match="unknown CE"):
        load_rules(f, known_ces=["content_creation"])
