"""The three analyses on a user model and user task objects (not ours): mechanics, typed results, round trips.

The model is a 3-layer word-level Llama with non-identity norm weights (untrained), so the tests
check what the analyses compute from it -- which continuation is the alternative, padded batches, shapes,
normalisation, the null -- not the paper's effects (those are in test_planning_validation.py).
"""
import random
from dataclasses import dataclass, field

import numpy as np
import pytest

import interp
from interp.probes.planning import (BlockMapConfig, BlockMapResult, BranchConfig, BranchResult, HorizonConfig,
                                    HorizonResult, block_layer_map, branch_awareness, horizon_curve, normalized_mi)

TINY_VQ = {"d_model": 16, "d_latent": 8, "n_encoder_layers": 1, "n_heads": 2}
FAST = dict(n_codes=4, vqvae=TINY_VQ, train={"steps": 30, "eval_every": 30, "batch_size": 64}, n_perm=5,
            batch_size=32)


@dataclass(frozen=True)
class Example:
    prompt: str
    target: str
    answers: tuple = ()
    decoy: str | None = None
    meta: dict = field(default_factory=dict)


class WordTask:
    """A user task: random lower-case words; the target repeats the prompt's first word."""

    name = "words"

    def examples(self, n, seed=0):
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            words = [rng.choice(WORDS[:18]) for _ in range(6)]
            out.append(Example(" ".join(words), " ".join([words[0]] * 4)))
        return out

    def is_correct(self, example, generated):
        return generated.startswith(example.target[:2])


WORDS = [a + b for a in "abcdefghijklmnopq" for b in "xyz"]


@pytest.fixture(scope="module")
def model():
    """A user's word-level causal LM: 3 Llama layers, random weights, norm weights and biases far from 1 and 0."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from interp.benchmarks.planning.tasks import make_tokenizer

    tok = make_tokenizer(("<pad>", "<bos>", "<eos>", "<unk>") + tuple(WORDS))
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return interp.wrap(hf, tokenizer=tok)


def test_horizon_curve_mechanics(model, tmp_path):
    cfg = HorizonConfig(n_examples=60, max_tau=3, continuation="sample", **FAST)
    r = horizon_curve(model, WordTask(), cfg)
    assert isinstance(r, HorizonResult) and r.taus == [0, 1, 2, 3] and r.n == 60
    assert np.all(r.null_mean >= 0) and np.all(r.null_std >= 0)
    assert np.allclose(r.corrected, r.mi - r.null_mean)
    assert np.isclose(np.max(r.nmi), 1.0) and np.allclose(r.nmi, r.corrected / r.corrected.max())
    assert 0.0 <= r.accuracy <= 1.0
    df = r.to_frame()
    assert list(df["tau"]) == [0, 1, 2, 3] and {"nmi", "null_std", "corrected"} <= set(df.columns)
    assert len(r.figure().data) == 2
    back = HorizonResult.load(r.save(tmp_path / "h"))
    assert np.allclose(back.nmi, r.nmi) and back.taus == r.taus
    # teacher-forced targets: every example reaches max_tau
    r2 = horizon_curve(model, WordTask(), HorizonConfig(n_examples=30, max_tau=2, continuation="target", **FAST))
    assert r2.n == 30 and len(r2.taus) == 3


class ModelPathTask:
    """A branch task built around the model's own greedy continuation: answers[1] is always what it generates,
    so the alternative must be answers[0]; the decoy and the other answer are random letters."""

    name = "own-paths"

    def __init__(self, model, n=120):
        rng = random.Random(0)
        prompts = [" ".join(rng.choice(WORDS[:18]) for _ in range(4)) for _ in range(n)]
        ids = model.generate(prompts, max_new_tokens=6, return_text=False, stop_at_eos=False)
        gen = [model.tokenizer.decode(row.tolist()) for row in ids]
        def word():
            return rng.choice(WORDS[18:])

        self._ex = [Example(p, g, answers=(f"{word()} {word()}", g), decoy=f"{word()} {word()}")
                    for i, (p, g) in enumerate(zip(prompts, gen))
                    if int(ids[i].min()) >= 4]  # no special token generated
        assert len(self._ex) >= 20, len(self._ex)
        self.seen_alts = None

    def examples(self, n, seed=0):
        return self._ex[:n]

    def is_correct(self, example, generated):
        return generated == example.answers[1]


def test_branch_awareness_mechanics(model, tmp_path, monkeypatch):
    task = ModelPathTask(model)
    captured = {}
    from interp.probes.planning import analyses

    real_fit = analyses.fit_codes

    def spy(groups, config, seed=0):
        captured.update({k: len(v) for k, v in groups["path"].items()})
        return real_fit(groups, config, seed)

    monkeypatch.setattr(analyses, "fit_codes", spy)
    r = branch_awareness(model, task, BranchConfig(n_examples=120, n_seeds=2, **FAST))
    assert isinstance(r, BranchResult)
    n = len(task._ex)
    assert r.accuracy == 1.0 and r.n == n
    assert captured == {"alt": n, "decoy": n, "generated": n}
    assert len(r.ratios) == 2 and all(x >= 0 for x in r.ratios)   # inf where a seed's decoy codes carry nothing
    assert r.mi_alt >= 0 and r.mi_decoy >= 0
    assert r.ratio == pytest.approx(np.mean(r.ratios))
    df = r.to_frame()
    assert list(df["path"]) == ["alt", "decoy", "generated"]
    assert BranchResult.load(r.save(tmp_path / "b")).ratio == r.ratio
    # alternatives are the answers the model did not generate (harvested alone: <bos> + path)
    with pytest.raises(ValueError, match=">= 2 answers"):
        branch_awareness(model, WordTask(), BranchConfig(n_examples=5, **FAST))


def test_branch_awareness_target_continuation(model, monkeypatch):
    """``continuation="target"``: every example enters with its reference target as the generated path and the
    other answer as the alternative, whatever the model generates (here the target is the answer it does NOT
    generate, so the greedy mode would take the other one)."""
    own = ModelPathTask(model)
    task = ModelPathTask.__new__(ModelPathTask)
    task._ex = [Example(e.prompt, e.answers[0], answers=e.answers, decoy=e.decoy) for e in own._ex]
    captured = {}
    from interp.probes.planning import analyses

    real_fit = analyses.fit_codes

    def spy(groups, config, seed=0):
        captured["paths"] = set(groups["path"])
        return real_fit(groups, config, seed)

    real_prompt_ids = analyses._prompt_ids
    seen = []

    def spy_ids(model_, texts, batch_size):
        seen.append(list(texts))
        return real_prompt_ids(model_, texts, batch_size)

    monkeypatch.setattr(analyses, "fit_codes", spy)
    monkeypatch.setattr(analyses, "_prompt_ids", spy_ids)
    r = branch_awareness(model, task, BranchConfig(n_examples=120, continuation="target", **FAST))
    n = len(task._ex)
    assert r.n == n and r.accuracy == 1.0   # accuracy: the task's is_correct on the greedy continuations
    # harvested path texts, in order: prompts, then alt, decoy, generated (path_context="alone")
    alt, decoy, generated = seen[1], seen[2], seen[3]
    assert generated == [e.answers[0] for e in task._ex] and alt == [e.answers[1] for e in task._ex]
    assert decoy == [e.decoy for e in task._ex]
    with pytest.raises(ValueError, match="continuation must be 'greedy' or 'target'"):
        branch_awareness(model, task, BranchConfig(n_examples=5, continuation="sample", **FAST))


def test_block_layer_map_on_plain_texts(model, tmp_path):
    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(14 + i % 5)) for i in range(30)]
    cfg = BlockMapConfig(block_size=3, n_blocks=2, map_layers=(0, 2), anchors_per_text=2, max_tokens=40, **FAST)
    r = block_layer_map(model, texts, cfg)
    assert isinstance(r, BlockMapResult)
    assert r.blocks == [0, 1, 2] and r.layers == [0, 2] and r.n == 60
    assert r.nmi_t.shape == (3, 2) and np.isnan(r.cnmi_t[0]).all() and np.isfinite(r.cnmi_t[1:]).all()
    assert np.isclose(np.nanmax(r.nmi_t), 1.0)
    assert np.allclose(r.cnmi_t[1:], normalized_mi(r.cmi_t - r.null_cond)[1:])
    assert np.allclose(r.nmi_next, normalized_mi(r.mi_next - r.null_next))
    # the single state at T of the last layer *is* Z_T^L's set type: its MI is the largest of the map
    assert r.mi_t[0, 1] == pytest.approx(r.mi_t.max())
    df = r.to_frame()
    assert len(df) == 6 and {"block", "layer", "nmi_t", "nmi_next", "cnmi_t"} <= set(df.columns)
    assert len(r.figure().data) == 3
    back = BlockMapResult.load(r.save(tmp_path / "m"))
    assert np.allclose(back.nmi_t, r.nmi_t, equal_nan=True)
    with pytest.raises(ValueError, match="anchors"):
        block_layer_map(model, ["ax bx"], cfg)
