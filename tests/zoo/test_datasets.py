"""interp.data.refusal: the refusal instruction set, the judge, chat formatting, held-out text."""
from __future__ import annotations

from collections import Counter

import pytest

from interp.data import refusal as D

REQUIRED_HARMFUL = ("bio", "chem", "nuclear", "cyber", "drugs", "fraud", "violence", "hate", "self_harm", "privacy")


def test_categories():
    assert set(REQUIRED_HARMFUL) <= set(D.HARMFUL_CATEGORIES) and len(D.HARMFUL_CATEGORIES) >= 10
    assert len(D.HARMLESS_CATEGORIES) >= 10
    assert not set(D.HARMFUL_CATEGORIES) & set(D.HARMLESS_CATEGORIES)


def test_sizes_distinct_and_labelled():
    allx = D.refusal_instructions()
    texts = [x.text for x in allx]
    assert len(set(texts)) == len(texts)
    harmful = D.refusal_instructions(harmful=True)
    harmless = D.refusal_instructions(harmful=False)
    assert len(harmful) >= 300 and len(harmless) >= 300
    assert all(x.category in D.HARMFUL_CATEGORIES for x in harmful)
    assert all(x.category in D.HARMLESS_CATEGORIES for x in harmless)
    for split in D.SPLITS:
        got = D.refusal_instructions(split=split)
        assert got and all(x.split == split for x in got)
        # every category is present in every split
        assert set(Counter(x.category for x in got)) == set(D.HARMFUL_CATEGORIES + D.HARMLESS_CATEGORIES)
    assert sum(len(D.refusal_instructions(split=s)) for s in D.SPLITS) == len(allx)


def test_splits_hold_out_whole_requests():
    """A test request never appears in train under any wording."""
    def tasks(split):
        out = set()
        for x in D.refusal_instructions(split=split):
            found = [t for t in D.category_tasks(x.category) if t in x.text]
            assert len(found) == 1, x.text
            out.add((x.category, found[0]))
        return out

    train, val, test = tasks("train"), tasks("val"), tasks("test")
    assert not train & test and not train & val and not val & test


def test_same_wordings_on_both_sides():
    """Harmful and harmless prompts share the wordings, so only the content tells them apart."""
    def wordings(harmful):
        out = Counter()
        for x in D.refusal_instructions(harmful=harmful):
            task = next(t for t in D.category_tasks(x.category) if t in x.text)
            out[x.text.replace(task, "{t}")] += 1
        return out

    wh, wl = wordings(True), wordings(False)
    assert set(wh) == set(wl) == set(D.TEMPLATES)


def test_deterministic_and_filters():
    a = D.refusal_instructions(split="test", harmful=True, categories=["bio", "chem"])
    D._all_instructions.cache_clear()
    b = D.refusal_instructions(split="test", harmful=True, categories=("bio", "chem"))
    assert a == b and {x.category for x in a} == {"bio", "chem"}
    assert D.refusal_instructions(categories="nuclear") == D.refusal_instructions(categories=["nuclear"])
    with pytest.raises(ValueError, match="split must be one of"):
        D.refusal_instructions(split="dev")
    with pytest.raises(ValueError, match="unknown categories"):
        D.refusal_instructions(categories=["weather"])
    x = a[0]
    assert isinstance(x, D.Instruction) and x.harmful and x.split == "test"
    with pytest.raises(AttributeError):
        x.text = "changed"  # frozen


def test_requests_only_and_refusals():
    for x in D.refusal_instructions(harmful=True):
        r = D.refusal_response(x)
        assert D.is_refusal(r)
        task = next(t for t in D.category_tasks(x.category) if t in x.text)
        assert task not in r  # refusals never repeat the request
    with pytest.raises(ValueError):
        D.refusal_response(D.refusal_instructions(harmful=False)[0])
    # varied: many distinct refusals
    assert len({D.refusal_response(x) for x in D.refusal_instructions(harmful=True)}) > 50


def test_is_refusal():
    assert D.is_refusal("I'm sorry, but I can't help with that.")
    assert D.is_refusal("I can\u2019t do that")  # curly apostrophe
    assert D.is_refusal("As an AI, I cannot")
    assert D.is_refusal("I won't help with this.")
    assert not D.is_refusal("To bake bread, mix flour and water.")
    assert not D.is_refusal("Sure! Here are the steps:")
    with pytest.raises(TypeError):
        D.is_refusal(None)


def test_heldout_text():
    held = D.heldout_text()
    assert held.startswith("Now it came to pass in the days when the judges ruled") and len(held) > 10_000
    assert "1:1" not in held  # verse numbers stripped
    corpus = D.kjv_text()
    assert len(corpus) > 3_000_000 and "In the beginning God created" in corpus
    assert held[:200] not in corpus  # the held-out book is left out of the training corpus
    assert held[:200] in D.kjv_text(include_heldout=True)


def test_format_chat(smollm2_tokenizer):
    s = D.format_chat(smollm2_tokenizer, "How do I bake bread?")
    assert s.endswith("<|im_start|>user\nHow do I bake bread?<|im_end|>\n<|im_start|>assistant\n")
    assert s.startswith("<|im_start|>system\n")

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="chat template"):
        D.format_chat(NoTemplate(), "hi")
