"""Tests of CopyPasteLLM (interp.models.copypaste): metrics, prompting, Alg. 2, DPO, Alg. 3; and of its validations
(interp.benchmarks.copypaste: the toy, the SmolLM2 pipeline's pieces). The digest's criteria on the full runs are
the recipe's claims (benchmarks/copypaste/claims.yaml), checked by tests/reproduce."""
from __future__ import annotations

import math

import pytest
import torch

import interp
from interp.benchmarks.copypaste import ToyConfig, toy_experiment, word_tokenizer
from interp.models.copypaste import (CaptureConfig, CaptureResult, Candidate, DPOConfig, PreferenceConfig, PreferencePair,
                                     RefineConfig, build_pairs, capture_copying, copy_fragments, copy_metrics,
                                     copy_score, cp_link, cp_order, cp_refine, dpo_loss, dpo_train, elo_tournament,
                                     encode_pairs, parse_order, sequence_logprobs)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    from interp.progress import progress_enabled, set_progress
    was = progress_enabled()
    set_progress(False)
    yield
    set_progress(was)
    torch.set_num_threads(old)


# ------------------------------------------------------------------------------------------ metrics
def test_copy_metrics_digest_hand_cases():
    ctx = "the cat sat on the mat"
    assert copy_metrics(ctx, ctx) == (1.0, 6.0)                      # identical: kappa 1, delta |A|
    assert copy_metrics("dogs bark loudly", ctx) == (0.0, 0.0)      # disjoint
    assert copy_fragments("a b c x a b", "a b c") == [["a", "b", "c"], ["a", "b"]]
    kappa, delta = copy_metrics("a b c x a b", "a b c")
    assert kappa == pytest.approx(5 / 6) and delta == pytest.approx(13 / 6)


def test_copy_metrics_greedy_longest_match_and_tokens():
    # greedy from the left takes the longest match at i, even if it splits a later longer one
    assert copy_fragments("x b c d", "a b c d b c") == [["b", "c", "d"]]
    assert copy_fragments("b c d e", "b c z c d e") == [["b", "c"], ["d", "e"]]
    assert copy_metrics("b c d e", "b c z c d e") == (1.0, 2.0)
    assert copy_metrics(["p", "q"], ["q", "p"]) == (1.0, 1.0)          # token lists accepted
    assert copy_metrics("a  b\tc", "a b c") == (1.0, 3.0)               # whitespace tokens
    with pytest.raises(ValueError, match="answer is empty"):
        copy_metrics("   ", "a b")
    assert copy_score(1.0, 16.0) == pytest.approx(2.0) and copy_score(0.5, 4.0) == pytest.approx(1.0)
    assert copy_score(0.5, 400.0, epsilon=1.0) == pytest.approx(1.5)   # bonus capped by epsilon


def test_copy_fragments_match_brute_force_alg4():
    import random
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.choice("abcd") for _ in range(rng.randint(1, 12))]
        c = [rng.choice("abcde") for _ in range(rng.randint(1, 12))]
        want, i = [], 0
        while i < len(a):                                        # Alg. 4 literally: try every l and m
            best = max((l for l in range(1, len(a) - i + 1) for m in range(len(c) - l + 1) if a[i:i + l] == c[m:m + l]),
                       default=0)
            if best:
                want.append(a[i:i + best])
                i += best
            else:
                i += 1
        assert copy_fragments(a, c) == want


# ------------------------------------------------------------------------------------------ prompting
CTX = "Paris is the capital of France. It has 2 million people. The Seine flows through it."


def scripted(replies):
    calls = []

    def gen(prompt):
        calls.append(prompt)
        for key, reply in replies:
            if key in prompt:
                return reply
        raise AssertionError(prompt)
    gen.calls = calls
    return gen


def test_cp_order_and_link_are_verbatim_concatenations():
    gen = scripted([("Copy, word for word", "EXTRACTED: Paris is the capital of France.\n"
                                            "EXTRACTED: The Seine flows through it.\nEXTRACTED: Paris is big."),
                    ("ORDER", "ORDER: SENT 2,SENT 1,SENT 7"),
                    ("LINK", "LINK 1: and " + "very " * 20 + "much\nCONCLUSION: That is all.")])
    ans = cp_order(gen, "What flows through the capital of France?", CTX)
    assert ans == "The Seine flows through it. Paris is the capital of France."   # paraphrase dropped, order kept
    assert copy_metrics(ans, CTX)[0] == 1.0
    link = cp_link(gen, "q", CTX)
    assert link.startswith("Paris is the capital of France. and") and link.endswith("That is all.")
    transition = link.split("France. ")[1].split(" The Seine")[0]
    assert len(transition.split()) == 15                                        # transitions capped at 15 words
    assert parse_order("ORDER: SENT 3, SENT 3, SENT 1", 3) == [2, 0, 1]
    with pytest.raises(ValueError, match="no verbatim context sentence"):
        cp_order(scripted([("Copy", "EXTRACTED: Rome is big.")]), "q", CTX)


def test_cp_refine_loops_until_copy_score_threshold():
    answers = iter(["France has a big capital city.", "Paris is the capital of France. It has 2 million people."])
    writer = scripted([])
    writer_calls = []

    def writer(prompt):
        writer_calls.append(prompt)
        return next(answers)
    reviewer = scripted([("SUGGESTION", "SUGGESTION: copy more\nSUGGESTION: b\nSUGGESTION: c\nSUGGESTION: d")])
    trace = cp_refine(writer, reviewer, "q", CTX, RefineConfig(theta_sigma=1.2, t_max=5))
    assert len(trace.answers) == 2 and trace.best == trace.answers[1]
    assert trace.suggestions[0] == ["copy more", "b", "c"]                    # at most 3 suggestions
    assert "copy more" in writer_calls[1]
    k, d = copy_metrics(trace.answers[1], CTX)
    assert trace.scores[1] == pytest.approx((k, d, copy_score(k, d)))
    with pytest.raises(ValueError, match="t_max"):
        RefineConfig(t_max=0)


# ------------------------------------------------------------------------------------------ Alg. 2
def test_elo_tournament_hand_values():
    judge = lambda q, c, a, b: 1.0 if len(a) > len(b) else (0.0 if len(a) < len(b) else 0.5)
    r = elo_tournament("q", "c", ["aa", "a"], judge, start=1000, k=32)
    # two games, "aa" wins both: +16, then E = 1/(1+10^(-32/400)) -> + 32 (1 - E)
    e = 1 / (1 + 10 ** (-32 / 400))
    assert r[0] == pytest.approx(1016 + 32 * (1 - e)) and r[0] + r[1] == pytest.approx(2000)


def test_build_pairs_filters_ranks_and_stamps():
    ctx = "e1 lives in rome . e2 lives in oslo ."
    cands = [Candidate("paris .", "base", False), Candidate("e1 lives in paris .", "attributed", False),
             Candidate("e1 lives in rome .", "cp_order", True), Candidate("e1 lives in rome . e2 lives", "cp_link", True),
             Candidate("rome is where e1 is", "cp_refine", True)]              # fails kappa filter
    judge = lambda q, c, a, b: float(len(a) < len(b)) if len(a) != len(b) else 0.5  # prefers the shorter
    pairs, s = build_pairs("P", "q", ctx, cands, judge, gold="rome", wrong="paris",
                           config=PreferenceConfig(min_kappa=0.9, min_delta=2.0, stamp_template="{response} so {answer} ."))
    assert s.passed == [False, False, True, True, False] and s.best == 2
    assert {p.chosen for p in pairs} == {"e1 lives in rome . so rome ."}
    assert [p.rejected for p in pairs] == ["paris .", "e1 lives in paris .", "e1 lives in rome . e2 lives so paris .",
                                           "rome is where e1 is so paris ."]
    unstamped, _ = build_pairs("P", "q", ctx, cands, judge, config=PreferenceConfig(min_kappa=0.9, min_delta=2.0))
    assert unstamped[0].chosen == "e1 lives in rome ." and len(unstamped) == 4
    none, _ = build_pairs("P", "q", ctx, cands[:2], judge)
    assert none == []
    with pytest.raises(ValueError, match="both gold and wrong"):
        build_pairs("P", "q", ctx, cands, judge, gold="rome")
    with pytest.raises(ValueError, match="min_kappa"):
        PreferenceConfig(min_kappa=2)


# ------------------------------------------------------------------------------------------ DPO
def test_dpo_loss_hand_computation():
    pc, pr = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
    rc, rr = torch.tensor([-2.0, -2.0]), torch.tensor([-2.0, -2.0])
    loss, margin = dpo_loss(pc, pr, rc, rr, beta=0.3)
    # margins: 0.3((1) - (-1)) = 0.6 and 0.3((0) - (1)) = -0.3
    assert margin.tolist() == pytest.approx([0.6, -0.3])
    want = (math.log1p(math.exp(-0.6)) + math.log1p(math.exp(0.3))) / 2
    assert loss.item() == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="beta"):
        DPOConfig(beta=0)


def test_sequence_logprobs_scores_only_response_tokens():
    logits = torch.randn(2, 4, 5)
    ids = torch.tensor([[1, 2, 3, 4], [0, 1, 2, 0]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]])
    lp = torch.log_softmax(logits, -1)
    want = torch.stack([lp[0, 1, 3] + lp[0, 2, 4], lp[1, 0, 1] + lp[1, 1, 2]])
    assert torch.allclose(sequence_logprobs(logits, ids, mask), want)



def test_toy_word_tokenizer_ids():
    """``<unk> <pad> <eos>`` are ids 0-2, the words follow in order (a repeated word keeps its first id); nothing is
    prepended (no ``<bos>``), unknown words are ``<unk>``, decoding joins words with spaces, padding on the right."""
    tok = word_tokenizer(["where", "paris", "where", "e1"])
    assert len(tok) == 6 and tok.bos_token is None
    assert (tok.unk_token_id, tok.pad_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok("where paris e1 zebra <eos>")["input_ids"]
    assert ids == [3, 4, 5, 0, 2]
    assert tok.decode(ids) == "where paris e1 <unk> <eos>" and tok.decode(ids, skip_special_tokens=True) == "where paris e1"
    enc = tok(["paris", "where e1"], padding=True)
    assert enc["input_ids"] == [[4, 1], [3, 5]] and enc["attention_mask"] == [[1, 0], [1, 1]]


@pytest.fixture(scope="module")
def tiny_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    words = "context : question where does live ? answer lives in . so e1 e2 e3 rome oslo paris".split()
    tok = word_tokenizer(words)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():                                        # non-unit norm weights expose norm bugs
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.5 * torch.randn_like(p))
    return hf, tok


def test_encode_pairs_masks_and_dpo_train_raises_margin(tiny_lm):
    import copy

    hf, tok = tiny_lm
    policy = copy.deepcopy(hf)
    pairs = [PreferencePair("context : e1 lives in rome . question : where does e1 live ? answer :",
                            "e1 lives in rome .", "paris ."),
             PreferencePair("question : where does e2 live ? answer :", "e2 lives in oslo . so oslo .", "rome .")]
    enc = encode_pairs(tok, pairs)
    assert enc.chosen_response[0].sum() == 5 + 1 and enc.rejected_response[1].sum() == 2 + 1   # + eos
    row = enc.chosen_ids[1][enc.chosen_response[1].bool()]
    assert tok.decode(row[:-1]) == "e2 lives in oslo . so oslo ." and row[-1] == tok.eos_token_id
    assert (enc.chosen_response <= enc.chosen_mask).all()                                       # never on padding
    hist = dpo_train(policy, tok, pairs, DPOConfig(lr=1e-2, epochs=8, batch_size=2, grad_accum=1))
    assert hist.loss[0] == pytest.approx(math.log(2), abs=1e-4)   # policy == reference at step 0
    assert hist.loss[-1] < 0.3 and hist.accuracy[-1] == 1.0
    assert any(not torch.equal(p, q) for p, q in zip(hf.parameters(), policy.parameters()))


def test_dpo_checkpoint_resume_equals_uninterrupted_run(tiny_lm, tmp_path):
    """A run killed after 2 optimiser steps and resumed from its checkpoint takes the same steps as one run."""
    import copy

    hf, tok = tiny_lm
    pairs = [PreferencePair("question : where does e1 live ? answer :", "e1 lives in rome .", "paris ."),
             PreferencePair("question : where does e2 live ? answer :", "e2 lives in oslo .", "rome ."),
             PreferencePair("question : where does e3 live ? answer :", "so paris .", "oslo ."),
             PreferencePair("context : e3 lives in paris . answer :", "e3 lives in paris .", "rome .")]
    cfg = DPOConfig(lr=1e-2, epochs=2, batch_size=1, grad_accum=2, warmup_frac=0.2)
    full = copy.deepcopy(hf)
    h_full = dpo_train(full, tok, pairs, cfg)

    class Crash(torch.nn.Module):                      # dies on the 1st forward of optimiser step 3
        def __init__(self, m, limit=2 * 2 * 2):        # 2 steps x 2 micro-batches x (chosen, rejected)
            super().__init__()
            self.m, self.calls, self.limit = m, 0, limit

        def forward(self, **kw):
            self.calls += 1
            if self.calls > self.limit:
                raise RuntimeError("killed")
            return self.m(**kw)

    ck = tmp_path / "dpo.pt"
    crashing = Crash(copy.deepcopy(hf))
    with pytest.raises(RuntimeError, match="killed"):
        dpo_train(crashing, tok, pairs, cfg, reference=hf, checkpoint=ck)
    assert torch.load(ck, weights_only=True)["done"] == 2
    resumed = Crash(copy.deepcopy(hf), limit=10**9)   # fresh process: weights come from the checkpoint
    h_res = dpo_train(resumed, tok, pairs, cfg, checkpoint=ck)
    assert len(h_res.loss) == len(h_full.loss) == 4
    assert h_res.loss == pytest.approx(h_full.loss, rel=1e-5, abs=1e-6)
    for p, q in zip(full.parameters(), resumed.m.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    with pytest.raises(ValueError, match="pairs"):
        dpo_train(Crash(copy.deepcopy(hf)), tok, pairs[:3], cfg, checkpoint=ck)


# ------------------------------------------------------------------------------------------ Alg. 3
def test_capture_copying_contextual_and_parametric_by_hand(tiny_lm):
    """Force the next-token distribution with an intervention on ln_final so the scan is known exactly."""
    hf, tok = tiny_lm
    model = interp.wrap(hf, tok, backend="torch")
    # ln_final.hook_normalized is read before the norm's gain (TransformerLens convention): logits = (h * g) @ W_U
    W_eff = hf.model.norm.weight.detach()[:, None] * model.weight("W_U")     # [d_model, vocab]
    vid = tok.convert_tokens_to_ids
    # Step 0 ranks: "." (function), "rome" (in C) -> contextual. Step 1: "rome" again (captured), "paris" (in A_para)
    # -> parametric. Step 2: "oslo" is in S_com (C and A_para share "oslo") -> scan stops, nothing.
    plans = [[".", "rome", "paris"], ["rome", "paris", "oslo"], ["oslo", "rome", "paris"]]
    targets = []
    for plan in plans:
        logits = torch.full((len(tok),), -10.0)
        for r, w in enumerate(plan):
            logits[vid(w)] = 10.0 - r
        targets.append(torch.linalg.lstsq(W_eff.T, logits[:, None]).solution[:, 0])

    def force(t, ctx):
        if t.shape[1] >= len(targets) and not ctx.generating:
            t = t.clone()
            t[0, -len(targets) - 1:-1] = torch.stack(targets)
        return t

    ctx_text = "e1 lives in rome . e2 lives in oslo ."
    # fixed generations (A_ctx = "e1 lives in", A_para = "paris oslo"); the forward pass and the scan are real
    prompts_ctx = [f"context : {ctx_text} question : where does e1 live ? answer :"]
    prompts_para = ["question : where does e1 live ? answer :"]
    gens = {prompts_ctx[0]: torch.tensor([[vid("e1"), vid("lives"), vid("in")]]),
            prompts_para[0]: torch.tensor([[vid("paris"), vid("oslo"), -1]])}
    orig_generate = model.generate
    model.generate = lambda prompts, **kw: gens[prompts[0]]
    try:
        with model.intervene({"ln_final.hook_normalized": force}):
            res = capture_copying(model, prompts_ctx, prompts_para, [ctx_text], CaptureConfig(top_k=3))
    finally:
        model.generate = orig_generate
    assert res.tokens == ["rome", "paris"] and res.contextual.tolist() == [True, False]
    assert res.step.tolist() == [0, 1] and res.hidden.shape == (2, model.cfg.d_model)
    assert res.prob[0] == pytest.approx(torch.softmax(W_eff.T @ targets[0], 0)[vid("rome")].item(), rel=1e-3)
    assert res.contextual_share == 0.5
    power = res.logits_power()
    assert power["contextual"][0] == pytest.approx(res.logit[0].item() ** 2) and power["parametric"][0] == 0
    assert set(res.to_frame().kind) == {"contextual", "parametric"}
    res.figure()
    with pytest.raises(ValueError, match="equal length"):
        capture_copying(model, prompts_ctx, [], [ctx_text])


# ------------------------------------------------------------------------------------------ toy recipe
def test_toy_experiment_runs_end_to_end_small(tmp_path):
    cfg = ToyConfig(n_known=12, n_unknown=8, d_model=32, n_layers=3, n_heads=4, pretrain_steps=30, pretrain_batch=16,
                    n_dpo_samples=8, n_eval=4, dpo=DPOConfig(lr=1e-3, epochs=1, batch_size=4, grad_accum=1, max_length=64))
    res = toy_experiment(cfg)
    df = res.to_frame()
    assert set(df.metric) >= {"cf_accuracy", "orig_accuracy", "cf_kappa", "contextual_share"}
    assert res.n_pairs >= 8 and len(res.dpo_loss) == -(-res.n_pairs // 4) and res.dpo_loss[0] == pytest.approx(math.log(2), abs=1e-3)
    res.save(tmp_path / "toy")
    assert set(res.checks) == {"counterfactual_accuracy_+20", "original_accuracy_no_drop", "kappa_up",
                               "contextual_capture_up"}
    res.figure()
    with pytest.raises(ValueError, match="n_eval"):
        ToyConfig(n_known=8, n_eval=5)


# ------------------------------------------------------------------------------------------ SmolLM2 RAG pipeline
def test_smollm_rag_facts_faithfulness_and_pairs():
    from interp.benchmarks.copypaste.smollm import FACTS, Fact, faithful, rag_pairs

    assert len(FACTS) > 100 and len({(f.subject, f.relation) for f in FACTS}) == len(FACTS)
    f = Fact("France", "capital", "Paris")
    ctx = f.context("Berlin")
    assert f.sentence("Berlin") in ctx and f.question == "What is the capital of France?"
    assert copy_metrics(f.sentence("Berlin"), ctx)[0] == 1.0                 # CP-Order copies verbatim
    assert faithful("Berlin", "Paris", "It is Berlin.") and not faithful("Berlin", "Paris", "Berlin, not Paris")
    assert not faithful("Berlin", "Paris", "Paris.") and faithful("Paris", "Paris", "paris")
    pairs = rag_pairs("P", f, "Berlin", "The capital of France is Paris.", "Paris")
    assert {p.chosen for p in pairs} == {"The capital of France is Berlin. Answer: Berlin"}      # stamped winner
    assert [p.rejected_kind for p in pairs] == ["base", "attributed", "cp_link"]
    assert pairs[2].rejected.endswith("Answer: Paris")                                          # stamped wrong
    assert pairs[1].rejected == "From what I know, the capital of France is Paris."
    # the SmolLM2 run's stamp (Alg. 2's "r* + gold answer" as plain concatenation, the answer written as the context
    # writes it): a stamped CP-Order winner is itself a verbatim copy, so kappa can credit it
    from interp.models.copypaste.preference import PreferenceConfig
    from interp.benchmarks.copypaste.smollm import SmolConfig

    cfg = PreferenceConfig(min_kappa=0.8, min_delta=3.0, stamp_template=SmolConfig().stamp_template)
    bare = rag_pairs("P", f, "Berlin", "The capital of France is Paris.", "Paris", cfg)
    assert {p.chosen for p in bare} == {"The capital of France is Berlin. Berlin."}
    assert copy_metrics(bare[0].chosen, ctx)[0] == 1.0 and bare[2].rejected.endswith("So the answer is Berlin. Paris.")
    assert copy_metrics("The capital of France is Berlin. Answer: Berlin", ctx)[0] == 0.75    # the "Answer:" stamp
    from interp.benchmarks.copypaste.smollm import stamp_suffix, strip_stamp

    t, xs = SmolConfig().stamp_template, ("Berlin", "Paris")
    assert strip_stamp(bare[0].chosen, t, xs) == f.sentence("Berlin")                         # stamp detected...
    assert stamp_suffix(f.sentence("Berlin"), t, xs) is None and stamp_suffix("Berlin.", t, xs) is None  # ...not here
    assert stamp_suffix("The capital of France is Berlin. Answer: Berlin", t, xs) == 33       # "Answer:" still counts
    with pytest.raises(ValueError, match="stamp_template"):
        SmolConfig(stamp_template="{answer}.")                                                  # no response slot
    g = Fact("the Colosseum", "landmark", "Rome")
    assert g.sentence("Oslo") == "The Colosseum is located in Oslo." and g.question == "In which city is the Colosseum?"


def test_smollm_answer_end_rule_and_capture_truncation(tiny_lm):
    from interp.models.copypaste.capture import truncate_ids
    from interp.benchmarks.copypaste.smollm import answer_end, first_answer, strip_stamp

    cases = {  # generated text -> the answer every condition is scored on
        "The capital of Iraq is Jerusalem.\nQuestion: next": "The capital of Iraq is Jerusalem.",
        "\n The capital of Iraq is Jerusalem. It is": "The capital of Iraq is Jerusalem. It is",   # no stamp: 1st line
        "Capital of Iraq: Jerusalem Answer: Jerusalem Question: What is the capital": "Capital of Iraq: Jerusalem Answer: Jerusalem",
        "It is in Sydney Answer: Sydney Answer: Sydney Answer:": "It is in Sydney Answer: Sydney",
        "The capital of Ethiopia is Addis Ababa. Answer: Addis Ababa. So": "The capital of Ethiopia is Addis Ababa. Answer: Addis Ababa.",
        "Answer: Quito": "Answer: Quito", "": ""}
    for text, want in cases.items():
        assert first_answer(text) == want and text[:answer_end(text)].strip() == want
    assert strip_stamp("The capital of X is Y. Answer: Y") == "The capital of X is Y." and strip_stamp("Y.") == "Y."
    _, tok = tiny_lm
    ids = tok("e1 lives in rome . e2", add_special_tokens=False)["input_ids"]
    assert tok.decode(truncate_ids(tok, ids, lambda t: t.index("rome") + 4)).strip() == "e1 lives in rome"
    assert truncate_ids(tok, ids, None) == ids and truncate_ids(tok, [], answer_end) == []


def test_smollm_config_validation_and_recipe_stage_names():
    from interp.benchmarks.copypaste import CopyPasteRunConfig, SmolConfig
    from interp.benchmarks.copypaste.recipe import _Prefixed

    with pytest.raises(ValueError, match="n_facts"):
        SmolConfig(n_facts=1)
    with pytest.raises(ValueError, match="units"):
        CopyPasteRunConfig(units=("toy", "gpt4"))
    seen = []

    class Store:                         # stands in for interp.stages.Stages
        folder, fresh = None, False

        def __call__(self, name, fn):
            seen.append(name)
            return fn()

    view = _Prefixed(Store(), "smollm")
    assert view("known", lambda: [True]) == [True] and seen == ["smollm-known"] and view.fresh is False
