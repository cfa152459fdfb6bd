"""Stage 2 of CopyPasteLLM: preference-pair construction (Alg. 2).

For each (question, context) sample: score the candidates (Base, Attributed, Citations, CP-Order, CP-Link,
CP-Refine in the paper), filter them on several criteria, run an Elo tournament among the CopyPaste
candidates with a pairwise judge, and stamp answers: ``chosen = r* + gold``, ``rejected`` = every other CP
candidate + wrong answer, plus the filtered non-CP candidates (about 5 pairs per sample with 6 candidates).

The paper's scorers (AlignScore / MiniCheck faithfulness, Qwen3-Embedding relevance, GPT-2 perplexity,
Qwen3-32B judge) are plug-ins here: any callables with the signatures below. Their thresholds are UNKNOWN in
the paper; :class:`PreferenceConfig` exposes them (implementation choice: a criterion without a scorer is
not applied).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .metrics import copy_metrics

Scorer = Callable[[str, str, str], float]           # (question, context, answer) -> score
Judge = Callable[[str, str, str, str], float]       # (question, context, a, b) -> 1 if a better, 0 if b, 0.5 tie


@dataclass
class Candidate:
    """One candidate answer: its ``text``, the recipe that made it (``kind``) and whether it is a CopyPaste one."""

    text: str
    kind: str
    copypaste: bool


@dataclass
class PreferencePair:
    """A DPO pair: the prompt and the preferred / dispreferred responses (plus where they came from)."""

    prompt: str
    chosen: str
    rejected: str
    chosen_kind: str = ""
    rejected_kind: str = ""


@dataclass
class PreferenceConfig:
    """Filter thresholds and Elo constants (all UNKNOWN in the paper: implementation choices).

    CP candidates enter the tournament only if ``kappa >= min_kappa``, ``delta >= min_delta`` and every given
    scorer clears its threshold (``faithfulness >= min_faithfulness``, ``relevance >= min_relevance``,
    ``perplexity <= max_perplexity``); non-CP candidates become rejected responses if they clear the quality
    scorers (relevance, perplexity) — the copy and faithfulness criteria are what makes them dispreferred.
    The Elo tournament is a round robin, each pair judged in both presentation orders (position bias), from
    ``elo_start`` with step ``elo_k``.
    """

    min_kappa: float = 0.5
    min_delta: float = 1.0
    min_faithfulness: float = 0.5
    min_relevance: float = 0.0
    max_perplexity: float = float("inf")
    elo_start: float = 1000.0
    elo_k: float = 32.0
    stamp_template: str = "{response} Answer: {answer}"

    def __post_init__(self):
        if not 0.0 <= self.min_kappa <= 1.0:
            raise ValueError(f"min_kappa must lie in [0, 1], got {self.min_kappa}")
        if self.min_delta < 0:
            raise ValueError(f"min_delta must be >= 0, got {self.min_delta}")
        if self.elo_k <= 0:
            raise ValueError(f"elo_k must be > 0, got {self.elo_k}")
        if "{response}" not in self.stamp_template or "{answer}" not in self.stamp_template:
            raise ValueError("stamp_template must contain '{response}' and '{answer}'")


def elo_tournament(question: str, context: str, texts: Sequence[str], judge: Judge,
                   start: float = 1000.0, k: float = 32.0) -> list[float]:
    """Elo ratings of ``texts`` after a round robin of ``judge`` calls (each pair in both orders).

    Expected score ``E_a = 1 / (1 + 10^((R_b - R_a)/400))``; update ``R_a += k (S_a - E_a)``, ``R_b -= k (S_a - E_a)``.
    """
    ratings = [float(start)] * len(texts)
    for i, j in itertools.permutations(range(len(texts)), 2):
        if i > j:
            i, j = j, i
            s = 1.0 - judge(question, context, texts[j], texts[i])
        else:
            s = judge(question, context, texts[i], texts[j])
        if not 0.0 <= s <= 1.0:
            raise ValueError(f"the judge must return a score in [0, 1], got {s}")
        e = 1.0 / (1.0 + 10 ** ((ratings[j] - ratings[i]) / 400.0))
        ratings[i] += k * (s - e)
        ratings[j] -= k * (s - e)
    return ratings


@dataclass
class SampleScores:
    """What Alg. 2 measured on one sample's candidates (for reporting)."""

    kappa: list[float] = field(default_factory=list)
    delta: list[float] = field(default_factory=list)
    passed: list[bool] = field(default_factory=list)
    elo: dict[int, float] = field(default_factory=dict)
    best: int | None = None


def build_pairs(prompt: str, question: str, context: str, candidates: Sequence[Candidate], judge: Judge,
                gold: str | None = None, wrong: str | None = None, config: PreferenceConfig | None = None,
                faithfulness: Scorer | None = None, relevance: Scorer | None = None,
                perplexity: Scorer | None = None) -> tuple[list[PreferencePair], SampleScores]:
    """Alg. 2 on one sample: filter, Elo tournament among the passing CP candidates, answer stamping.

    Returns the pairs (empty when no CP candidate passes the filter) and the per-candidate scores. With both
    ``gold`` and ``wrong``: ``chosen = stamp(r*, gold)``, rejected = ``stamp(c, wrong)`` for every other CP
    candidate (passing the filter or not) and the quality-filtered non-CP candidates as they are; otherwise
    chosen = ``r*`` and rejected = every other candidate.
    """
    cfg = config or PreferenceConfig()
    if not candidates:
        raise ValueError("candidates is empty")
    if (gold is None) != (wrong is None):
        raise ValueError("answer stamping needs both gold and wrong (or neither)")
    scores = SampleScores()
    quality_ok: list[bool] = []
    for c in candidates:
        kappa, delta = copy_metrics(c.text, context) if c.text.split() else (0.0, 0.0)
        scores.kappa.append(kappa)
        scores.delta.append(delta)
        q = ((relevance is None or relevance(question, context, c.text) >= cfg.min_relevance)
             and (perplexity is None or perplexity(question, context, c.text) <= cfg.max_perplexity))
        quality_ok.append(q)
        ok = q and kappa >= cfg.min_kappa and delta >= cfg.min_delta and (
            faithfulness is None or faithfulness(question, context, c.text) >= cfg.min_faithfulness)
        scores.passed.append(ok and c.copypaste)
    eligible = [i for i, p in enumerate(scores.passed) if p]
    if not eligible:
        return [], scores
    ratings = elo_tournament(question, context, [candidates[i].text for i in eligible], judge, cfg.elo_start, cfg.elo_k)
    scores.elo = dict(zip(eligible, ratings))
    best = eligible[max(range(len(eligible)), key=lambda t: ratings[t])]
    scores.best = best
    stamp = (lambda r, a: cfg.stamp_template.format(response=r, answer=a))
    chosen = stamp(candidates[best].text, gold) if gold is not None else candidates[best].text
    pairs = []
    for i, c in enumerate(candidates):
        if i == best:
            continue
        if gold is not None:
            if c.copypaste:
                rejected = stamp(c.text, wrong)
            elif quality_ok[i]:
                rejected = c.text
            else:
                continue
        else:
            rejected = c.text
        if rejected != chosen:
            pairs.append(PreferencePair(prompt, chosen, rejected, candidates[best].kind, c.kind))
    return pairs, scores
