"""The toy grammar's exact continuations, and the zoo:toy-grammar model trained on it."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from interp.data.grammar import VERBS_INTRANSITIVE, VERBS_TRANSITIVE, GrammarConfig, ToyGrammar


@pytest.fixture(scope="module")
def g():
    return ToyGrammar()


def test_hand_computed_distributions(g):
    c = GrammarConfig()
    assert g.next_token_distribution(["<bos>"]) == {"the": 0.5, "my": 0.5}
    d = g.next_token_distribution("<bos> the dog".split())
    # after a singular subject: a relative clause, or a singular verb
    assert d["that"] == pytest.approx(c.p_relative)
    assert d["runs"] == pytest.approx((1 - c.p_relative) * (1 - c.p_transitive) / 3)
    assert d["chases"] == pytest.approx((1 - c.p_relative) * c.p_transitive / 4)
    assert set(d) == {"that"} | set(VERBS_INTRANSITIVE["sg"] + VERBS_TRANSITIVE["sg"])
    assert sum(d.values()) == pytest.approx(1.0)
    # after "that": subject relative (verb agreeing with the head) or object relative (new NP)
    d = g.next_token_distribution("the dogs that".split())
    assert d["the"] == pytest.approx(c.p_object_relative / 2)
    assert set(d) - {"the", "my"} == set(VERBS_INTRANSITIVE["pl"] + VERBS_TRANSITIVE["pl"])
    # long-range agreement: after the object relative the verb agrees with "dog", not with "cats"
    d = g.next_token_distribution("the dog that the cats chase".split())
    assert set(d) == set(VERBS_INTRANSITIVE["sg"] + VERBS_TRANSITIVE["sg"])
    # the inner verb of the object relative agrees with the inner subject
    d = g.next_token_distribution("the dog that the cats".split())
    assert set(d) == {"that"} | set(VERBS_TRANSITIVE["pl"])
    # end of sentence, then a new one
    assert g.next_token_distribution("the dog runs".split()) == {".": 1.0}
    assert g.next_token_distribution("the dog runs .".split()) == {"the": 0.5, "my": 0.5}


def test_depth_limit_and_invalid_tokens(g):
    # at depth max_depth (2) no further relative clause is allowed
    d = g.next_token_distribution("the dog that sees the cat that sees the bird".split())
    assert "that" not in d
    with pytest.raises(ValueError, match="not a valid continuation"):
        g.parse_states("the dog run".split())
    with pytest.raises(ValueError):
        g.parse_states("the the".split())


def test_samples_are_valid_and_match_exact_distribution(g):
    rng = random.Random(0)
    docs = [g.sample_document(rng, 48) for _ in range(40)]
    target = g.target_matrix(docs)
    assert torch.allclose(target.sum(-1), torch.ones(40, 48))
    ids = torch.tensor([[g.token_id[w] for w in d] for d in docs])
    assert (target[:, :-1].gather(-1, ids[:, 1:, None]) > 0).all()  # every sampled next token is valid
    # Monte Carlo: the frequency of the word after "the dog" matches the exact distribution
    counts = Counter()
    n = 0
    for _ in range(4000):
        s = g.sample_sentence(rng)
        if s[:2] == ["the", "dog"]:
            counts[s[2]] += 1
            n += 1
    exact = g.next_token_distribution("the dog".split())
    for tok, p in exact.items():
        assert abs(counts[tok] / n - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1e-3


def test_agreement_positions(g):
    doc = "<bos> the dog that the cats chase runs .".split()
    pos = g.agreement_positions(doc)
    assert (2, "sg", False) in pos  # after "dog"
    assert (5, "pl", False) in pos  # after "cats": inner verb (object relative) is plural
    assert (6, "sg", True) in pos  # after "chase": the main verb agrees with "dog" across "cats"


def test_toy_grammar_model(toy_grammar_dir):
    """The cached model predicts the exact continuations (KL to the truth, agreement across clauses)."""
    import transformers

    from interp.apps.zoo.grammar import evaluate

    cfg = transformers.AutoConfig.from_pretrained(toy_grammar_dir)
    assert cfg.architectures == ["LlamaForCausalLM"] and cfg.num_hidden_layers == 4
    model = transformers.LlamaForCausalLM.from_pretrained(toy_grammar_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(toy_grammar_dir)
    g = ToyGrammar()
    assert tok("the dog runs .")["input_ids"] == [g.token_id[w] for w in "<bos> the dog runs .".split()]
    rng = random.Random(12345)
    docs = [g.sample_document(rng, 64) for _ in range(32)]
    m = evaluate(model, g, docs)
    assert m["kl_per_token"] < 0.05
    assert m["valid_mass"] > 0.97
    assert m["agreement_accuracy"] > 0.97
    assert m["agreement_accuracy_attractor"] > 0.9 and m["attractor_positions"] > 20
    assert m["model_xent"] == pytest.approx(m["true_entropy"] + m["kl_per_token"], abs=1e-3)


@pytest.mark.parametrize("backend", ["torch", "nnsight", "transformer_lens"])
def test_toy_grammar_backends(toy_grammar_dir, backend):
    import interp

    m = interp.load("zoo:toy-grammar", backend=backend)
    logits = m("the dog that the cats chase")
    probs = logits[0, -1].softmax(-1)
    g = ToyGrammar()
    sg = [g.token_id[w] for w in VERBS_INTRANSITIVE["sg"] + VERBS_TRANSITIVE["sg"]]
    pl = [g.token_id[w] for w in VERBS_INTRANSITIVE["pl"] + VERBS_TRANSITIVE["pl"]]
    assert probs[sg].sum() > 0.9 > probs[pl].sum()
