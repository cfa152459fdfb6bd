"""The digest's CPU-scale validation of CopyPasteLLM (the method is :mod:`interp.models.copypaste`): a tiny word-level LM memorises synthetic facts
(entity -> city), sees RAG prompts whose contexts sometimes contradict them, and is DPO-trained on pairs from
Alg. 2 whose chosen answer copies the context sentence. Pass: counterfactual-context accuracy +20 points,
original-context accuracy not lower, kappa of generations up, share of contextual captured tokens (Alg. 3) up.

Toy stand-ins for what the paper does with LLMs (implementation choices): the six candidates become four —
Base (the model's own greedy answer), Attributed (a fluent claim of the memorised fact), CP-Order (the context
sentence about the entity, verbatim) and CP-Link (that sentence plus a generated transition); the faithfulness
scorer and the judge read the city words (a candidate is faithful when every city it names is the context's
city for the entity; the judge prefers the faithful one, ties broken by kappa).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch

import interp
from interp.results import Result

from interp.training import set_seed, warmup_cosine_fraction
from interp.models.copypaste import (Candidate, CaptureConfig, DPOConfig, PreferenceConfig, build_pairs,
                                     capture_copying, copy_metrics, dpo_train)

CITIES = ("paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "quito", "dakar", "hanoi", "sofia", "perth")
TEMPLATE = ("context", ":", "question", "where", "does", "live", "?", "answer", "lives", "in", ".", "so", "that",
            "is", "where", "according", "to", "the", "memory")


@dataclass
class ToyConfig:
    """Sizes of the toy. ``n_known`` memorised entities (half used for DPO pairs, half held out for
    evaluation), ``n_unknown`` context-only entities (they teach copying at pre-training), ``conflict_rate`` the
    share of pre-training RAG prompts about known entities whose context contradicts memory (answered from
    memory), ``extractive_rate`` the share of context-only answers written in the copy-paste format
    ("<context sentence> so <city> .", so the format is in the model's support, as CP answers are for an
    instruction-tuned LLM), ``n_distractors`` other sentences per context. DPO uses the paper's beta = 0.3 and schedule; the
    learning rate is raised for a model trained from scratch (implementation choice)."""

    n_known: int = 24
    n_unknown: int = 24
    n_distractors: int = 1
    conflict_rate: float = 0.5
    extractive_rate: float = 0.5
    d_model: int = 64
    n_layers: int = 3
    n_heads: int = 4
    pretrain_steps: int = 3000
    pretrain_batch: int = 32
    pretrain_lr: float = 3e-3
    n_dpo_samples: int = 100
    counterfactual_frac: float = 0.7
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(lr=1e-3, epochs=2, batch_size=4, grad_accum=4, max_length=64))
    n_eval: int = 12
    top_k: int = 10
    seed: int = 0

    def __post_init__(self):
        if self.n_known < 4 or self.n_unknown < 1:
            raise ValueError(f"n_known must be >= 4 and n_unknown >= 1, got {self.n_known}, {self.n_unknown}")
        for name in ("conflict_rate", "counterfactual_frac", "extractive_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.n_eval > self.n_known // 2:
            raise ValueError(f"n_eval must be <= n_known // 2 = {self.n_known // 2} (held-out entities), got {self.n_eval}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        for name in ("pretrain_steps", "pretrain_batch", "n_dpo_samples", "n_distractors", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def word_tokenizer(words):
    """A whitespace word-level ``transformers`` tokenizer over ``words`` (duplicates dropped) plus ``<unk>``,
    ``<pad>``, ``<eos>`` (ids 0-2; no ``<bos>``, nothing prepended; decoding joins words with spaces), built by
    :func:`interp.training.word_level_tokenizer`."""
    from interp.training import word_level_tokenizer

    return word_level_tokenizer(["<unk>", "<pad>", "<eos>", *dict.fromkeys(words)], bos=None, add_bos=False)


class World:
    """Entities, their true cities and the text formats of the toy."""

    def __init__(self, cfg: ToyConfig, rng: random.Random):
        self.cfg, self.rng = cfg, rng
        self.known = [f"e{i}" for i in range(cfg.n_known)]
        self.unknown = [f"u{i}" for i in range(cfg.n_unknown)]
        self.city = {e: rng.choice(CITIES) for e in self.known}

    @staticmethod
    def sentence(entity: str, city: str) -> str:
        return f"{entity} lives in {city} ."

    def context(self, entity: str, city: str) -> str:
        others = self.rng.sample([e for e in self.known + self.unknown if e != entity], self.cfg.n_distractors)
        sents = [self.sentence(o, self.city.get(o) or self.rng.choice(CITIES)) for o in others]
        sents.insert(self.rng.randrange(len(sents) + 1), self.sentence(entity, city))
        return " ".join(sents)

    @staticmethod
    def prompt(entity: str, context: str | None) -> str:
        q = f"question : where does {entity} live ? answer :"
        return f"context : {context} {q}" if context else q

    def other_city(self, city: str) -> str:
        return self.rng.choice([c for c in CITIES if c != city])

    def pretrain_line(self) -> str:
        r = self.rng.random()
        if r < 0.25:
            e = self.rng.choice(self.known)
            return self.sentence(e, self.city[e])
        if r < 0.45:
            e = self.rng.choice(self.known)
            return f"{self.prompt(e, None)} {self.city[e]} ."
        if r < 0.75:
            e = self.rng.choice(self.known)
            shown = self.other_city(self.city[e]) if self.rng.random() < self.cfg.conflict_rate else self.city[e]
            return f"{self.prompt(e, self.context(e, shown))} {self.city[e]} ."
        e, c = self.rng.choice(self.unknown), self.rng.choice(CITIES)
        answer = f"{self.sentence(e, c)} so {c} ." if self.rng.random() < self.cfg.extractive_rate else f"{c} ."
        return f"{self.prompt(e, self.context(e, c))} {answer}"


def final_city(text: str) -> str | None:
    """The last city word of ``text`` (the stamped answer), or ``None``."""
    cities = [w for w in text.split() if w in CITIES]
    return cities[-1] if cities else None


def pretrain(cfg: ToyConfig, world: World, tok) -> torch.nn.Module:
    """Train a tiny Llama-architecture LM from scratch on the toy corpus (loss on every real token) with
    :func:`interp.training.train_lm`: AdamW betas (0.9, 0.999), linear warm-up over 5% of the steps then
    cosine decay to 5% at the last step (:func:`interp.training.warmup_cosine_fraction`), gradient norm clipped to 1."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from interp.training import LMTrainConfig, train_lm

    set_seed(cfg.seed)
    hf_cfg = LlamaConfig(vocab_size=len(tok), hidden_size=cfg.d_model, intermediate_size=2 * cfg.d_model,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
                         max_position_embeddings=128, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.eos_token_id, tie_word_embeddings=True, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(hf_cfg)

    def batches():  # drawn from the world's generator one step at a time, as training goes
        for _ in range(cfg.pretrain_steps):
            lines = [world.pretrain_line() + " <eos>" for _ in range(cfg.pretrain_batch)]
            enc = tok(lines, return_tensors="pt", padding=True)
            yield {**enc, "labels": enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)}

    steps = cfg.pretrain_steps
    train_lm(model, batches(), LMTrainConfig(steps=steps, lr=cfg.pretrain_lr, weight_decay=0.01, betas=(0.9, 0.999),
                                             clip=1.0, schedule=lambda s: warmup_cosine_fraction(s, steps, 0.05, 0.05)),
             desc="toy pre-training")
    return model.eval()


@dataclass
class EvalSet:
    entities: list[str]
    contexts: list[str]
    targets: list[str]       # the context's city for the entity


def evaluate(model, world: World, ev: EvalSet, max_new_tokens: int = 10) -> tuple[float, float, list[str]]:
    """Accuracy (final city == the context's city) and mean kappa of greedy answers to the context."""
    prompts = [world.prompt(e, c) for e, c in zip(ev.entities, ev.contexts)]
    answers = model.generate(prompts, max_new_tokens=max_new_tokens)
    acc = float(np.mean([final_city(a) == t for a, t in zip(answers, ev.targets)]))
    kappa = float(np.mean([copy_metrics(a, c)[0] if a.split() else 0.0 for a, c in zip(answers, ev.contexts)]))
    return acc, kappa, answers


@dataclass
class ToyResult(Result):
    """Before/after DPO on held-out memorised entities: accuracy on counterfactual and original contexts, kappa
    of answers to counterfactual contexts, Alg. 3 contextual share and per-sample contextual captures; the DPO
    history and the number of pairs."""

    kind = "copypaste_toy"
    metrics: dict = field(default_factory=dict)     # name -> {"before": x, "after": y}
    dpo_loss: list = field(default_factory=list)
    dpo_reward_accuracy: list = field(default_factory=list)
    n_pairs: int = 0
    examples: list = field(default_factory=list)    # (prompt, before, after) on counterfactual contexts

    @property
    def checks(self) -> dict[str, bool]:
        m = self.metrics
        return {"counterfactual_accuracy_+20": m["cf_accuracy"]["after"] - m["cf_accuracy"]["before"] >= 0.20,
                "original_accuracy_no_drop": m["orig_accuracy"]["after"] >= m["orig_accuracy"]["before"],
                "kappa_up": m["cf_kappa"]["after"] > m["cf_kappa"]["before"],
                "contextual_capture_up": m["contextual_share"]["after"] > m["contextual_share"]["before"]}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"metric": k, "before": v["before"], "after": v["after"], "change": v["after"] - v["before"]}
                             for k, v in self.metrics.items()])

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        df = self.to_frame()
        fig = make_subplots(rows=1, cols=2, subplot_titles=("before vs after DPO", "DPO loss"))
        fig.add_trace(go.Bar(name="before", x=df.metric, y=df.before), 1, 1)
        fig.add_trace(go.Bar(name="after", x=df.metric, y=df.after), 1, 1)
        fig.add_trace(go.Scatter(y=self.dpo_loss, name="loss", mode="lines"), 1, 2)
        fig.update_layout(title="CopyPaste toy: DPO on copy-paste preference pairs", barmode="group")
        return fig


def toy_experiment(cfg: ToyConfig | None = None) -> ToyResult:
    """Run the digest's toy recipe end to end (pre-train, Alg. 2 pairs, DPO, evaluation, Alg. 3)."""
    cfg = cfg or ToyConfig()
    rng = random.Random(cfg.seed)
    world = World(cfg, rng)
    words = [*TEMPLATE, *CITIES, *world.known, *world.unknown]
    tok = word_tokenizer(words)
    hf = pretrain(cfg, world, tok)
    model = interp.wrap(hf, tok, backend="torch")

    ents = world.known[:]
    rng.shuffle(ents)
    train_ents, eval_ents = ents[: cfg.n_known // 2], ents[cfg.n_known // 2:][: cfg.n_eval]
    cf = EvalSet(eval_ents, [], [])
    orig = EvalSet(eval_ents, [], [])
    for e in eval_ents:
        c = world.other_city(world.city[e])
        cf.contexts.append(world.context(e, c))
        cf.targets.append(c)
        orig.contexts.append(world.context(e, world.city[e]))
        orig.targets.append(world.city[e])

    # Alg. 2 preference pairs on the training entities
    pref = PreferenceConfig(min_kappa=0.9, min_delta=3.0, stamp_template="{response} so {answer} .")
    samples = [(rng.choice(train_ents), rng.random() < cfg.counterfactual_frac) for _ in range(cfg.n_dpo_samples)]
    prompts, infos = [], []
    for e, is_cf in samples:
        city = world.other_city(world.city[e]) if is_cf else world.city[e]
        ctx = world.context(e, city)
        prompts.append(world.prompt(e, ctx))
        infos.append((e, city, ctx))
    base_answers = model.generate(prompts, max_new_tokens=10)

    def faithful(q, ctx, ans):  # every named city is the context's city for the entity
        ent = q.split()[4]
        want = next(s.split()[3] for s in ctx.split(" .") if s.split() and s.split()[0] == ent)
        named = [w for w in ans.split() if w in CITIES]
        return float(bool(named) and all(w == want for w in named))

    def judge(q, ctx, a, b):
        fa, fb = faithful(q, ctx, a), faithful(q, ctx, b)
        if fa != fb:
            return float(fa > fb)
        ka, kb = copy_metrics(a, ctx)[0], copy_metrics(b, ctx)[0]
        return 0.5 if ka == kb else float(ka > kb)

    pairs = []
    for prompt, base, (e, city, ctx) in zip(prompts, base_answers, infos):
        q = f"question : where does {e} live ?"
        cands = [Candidate(base.strip() or ".", "base", False),
                 Candidate(f"according to the memory {e} lives in {world.city[e]} .", "attributed", False),
                 Candidate(world.sentence(e, city), "cp_order", True),
                 Candidate(f"{world.sentence(e, city)} that is where {e} lives .", "cp_link", True)]
        wrong = world.other_city(city)
        ps, _ = build_pairs(prompt, q, ctx, cands, judge, gold=city, wrong=wrong, config=pref, faithfulness=faithful)
        pairs.extend(ps)

    cap_cfg = CaptureConfig(top_k=cfg.top_k, max_new_tokens=10)
    para_prompts = [world.prompt(e, None) for e in cf.entities]
    cf_prompts = [world.prompt(e, c) for e, c in zip(cf.entities, cf.contexts)]
    metrics: dict[str, dict[str, float]] = {}

    def measure(tag: str):
        acc_cf, kap_cf, ans = evaluate(model, world, cf)
        acc_or, kap_or, _ = evaluate(model, world, orig)
        cap = capture_copying(model, cf_prompts, para_prompts, cf.contexts, cap_cfg)
        for k, v in (("cf_accuracy", acc_cf), ("orig_accuracy", acc_or), ("cf_kappa", kap_cf), ("orig_kappa", kap_or),
                     ("contextual_share", cap.contextual_share),
                     ("contextual_per_sample", cap.contextual_per_sample)):
            metrics.setdefault(k, {})[tag] = float(v)
        return ans

    before = measure("before")
    hist = dpo_train(hf, tok, pairs, cfg.dpo)
    after = measure("after")
    ex = [(p, b, a) for p, b, a in zip(cf_prompts[:5], before[:5], after[:5])]
    return ToyResult(metrics=metrics, dpo_loss=hist.loss, dpo_reward_accuracy=hist.accuracy, n_pairs=len(pairs),
                     examples=ex)
