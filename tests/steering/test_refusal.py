"""Cheap refusal judging: first-token log-odds, KL on harmless prompts, judged generations."""
import math

import pytest
import torch

from interp.steering import SteeringVector
from interp.steering.refusal import (_spread, judge_generations, kl_divergence, last_logprobs, refusal_scores,
                              refusal_token_ids, scores_from_logprobs)


def test_log_odds_by_hand():
    probs = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.05, 0.05, 0.45, 0.45]])
    s = scores_from_logprobs(probs.log(), [0, 1])
    assert s[0].item() == pytest.approx(math.log(0.7 / 0.3), abs=1e-5)
    assert s[1].item() == pytest.approx(math.log(0.1 / 0.9), abs=1e-5)
    with pytest.raises(ValueError, match="refusal_tokens"):
        scores_from_logprobs(probs.log(), [])


def test_refusal_token_ids(llama):
    ids = refusal_token_ids(llama.tokenizer, ["I can't", "Sorry", "I won't"])
    assert ids == [llama.tokenizer("I", add_special_tokens=False)["input_ids"][0],
                   llama.tokenizer("S", add_special_tokens=False)["input_ids"][0]]


def test_scores_kl_and_judge_on_tiny_model(llama, make_ids):
    prompts = make_ids(6, seed=5)
    lp = last_logprobs(llama, prompts, batch_size=4)
    assert lp.shape == (6, 259) and torch.allclose(lp.exp().sum(-1), torch.ones(6), atol=1e-4)
    tokens = [10, 11, 12]
    assert torch.allclose(refusal_scores(llama, prompts, tokens), scores_from_logprobs(lp, tokens))
    # a vector that changes nothing has zero KL; a strong one has a positive KL equal to the direct formula
    null = SteeringVector("t", "add", ("blocks.0.hook_resid_pre",), torch.zeros(64))
    assert kl_divergence(llama, prompts, null) == pytest.approx(0.0, abs=1e-6)
    push = SteeringVector("t", "add", ("blocks.1.hook_resid_pre",), torch.randn(64) * 3)
    with push.apply(llama):
        steered = llama(prompts)[:, -1].log_softmax(-1)
    expect = float((lp.exp() * (lp - steered)).sum(-1).mean())
    assert kl_divergence(llama, prompts, push) == pytest.approx(expect, rel=1e-4) and expect > 1e-3
    texts = ["abc", "hello there"]
    resp, flags = judge_generations(llama, texts, None, max_new_tokens=3, judge=lambda r: len(r) > 0)
    assert len(resp) == 2 and flags == [len(r) > 0 for r in resp]


def test_spread():
    assert _spread(56, 4) == [0, 18, 37, 55] and _spread(3, None) == [0, 1, 2] and _spread(3, 10) == [0, 1, 2]
