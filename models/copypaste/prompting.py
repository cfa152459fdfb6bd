"""Stage 1 of CopyPasteLLM: the CopyPaste prompting recipes (CP-Order, CP-Link, CP-Refine).

The paper's prompts (Appendix J) are not in the digest; the templates below are our own wording of the
digest's description, and any text generator ``generate(prompt) -> str`` (an :class:`interp.Model`'s
``generate``, an API client, a test stub) drives them. What is fixed by the paper and implemented exactly:

* CP-Order: the generator extracts verbatim context sentences ("EXTRACTED: ...", numbered ``SENT i``), then
  only outputs an order ``ORDER: SENT 2,SENT 1,...``; the answer is the concatenation of those sentences
  (copied from the extraction, so it is verbatim).
* CP-Link: the same extraction plus generated transitions of at most 15 words between core sentences (and an
  optional intro / conclusion); longer transitions are refused.
* CP-Refine: a writer / reviewer loop scored by the copy score ``sigma`` (:func:`copy_score`), stopping when
  ``sigma >= theta_sigma`` or after ``t_max`` rounds; the reviewer gives at most 3 suggestions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from .metrics import copy_metrics, copy_score

Generator = Callable[[str], str]

EXTRACT_TEMPLATE = ("Context:\n{context}\n\nQuestion: {question}\n"
                    "Copy, word for word, the context sentences needed to answer the question. "
                    "Write each on its own line as 'EXTRACTED: <sentence>'.\n")
ORDER_TEMPLATE = ("Question: {question}\nSentences:\n{numbered}\n"
                  "Output only the order in which to present them, as 'ORDER: SENT i,SENT j,...'.\n")
LINK_TEMPLATE = ("Question: {question}\nSentences:\n{numbered}\n"
                 "Write a transition of at most 15 words between each pair of consecutive sentences, one per line "
                 "as 'LINK i: <words>' (i = the sentence it follows), and optionally 'INTRO: ...' and 'CONCLUSION: ...'.\n")
WRITER_TEMPLATE = ("Context:\n{context}\n\nQuestion: {question}\n{feedback}"
                   "Answer by copying context text verbatim wherever possible.\n")
REVIEW_TEMPLATE = ("Context:\n{context}\n\nQuestion: {question}\nAnswer: {answer}\n"
                   "Give at most 3 suggestions (one per line, 'SUGGESTION: ...') on copying, faithfulness and relevance.\n")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (split after ``.``, ``!`` or ``?`` followed by whitespace)."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]


def parse_extracted(reply: str, context: str, verbatim: bool = True) -> list[str]:
    """The ``EXTRACTED:`` sentences of ``reply``; with ``verbatim`` only those occurring in ``context``
    (whitespace-normalised), so a paraphrase smuggled into the extraction is dropped."""
    found = [m.strip() for m in re.findall(r"EXTRACTED:\s*(.+)", reply)]
    if not verbatim:
        return found
    norm_ctx = " ".join(context.split())
    return [s for s in found if " ".join(s.split()) in norm_ctx]


def parse_order(reply: str, n: int) -> list[int]:
    """0-based sentence indices of ``ORDER: SENT 2,SENT 1,...``; indices outside ``1..n`` and repeats are
    dropped; sentences the order leaves out are appended in their original order."""
    m = re.search(r"ORDER:\s*(.+)", reply)
    idx = [int(k) - 1 for k in re.findall(r"SENT\s*(\d+)", m.group(1))] if m else []
    seen: list[int] = []
    for i in idx:
        if 0 <= i < n and i not in seen:
            seen.append(i)
    return seen + [i for i in range(n) if i not in seen]


def _numbered(sentences: list[str]) -> str:
    return "\n".join(f"SENT {i + 1}: {s}" for i, s in enumerate(sentences))


def _extract(generate: Generator, question: str, context: str) -> list[str]:
    sents = parse_extracted(generate(EXTRACT_TEMPLATE.format(context=context, question=question)), context)
    if not sents:
        raise ValueError("the generator extracted no verbatim context sentence (no 'EXTRACTED: <sentence>' "
                         "line whose sentence occurs in the context)")
    return sents


def cp_order(generate: Generator, question: str, context: str) -> str:
    """CP-Order answer: extracted verbatim sentences concatenated in the generator's ``ORDER``."""
    sents = _extract(generate, question, context)
    order = parse_order(generate(ORDER_TEMPLATE.format(question=question, numbered=_numbered(sents))), len(sents))
    return " ".join(sents[i] for i in order)


def cp_link(generate: Generator, question: str, context: str, max_link_words: int = 15) -> str:
    """CP-Link answer: extracted sentences joined by generated transitions of <= ``max_link_words`` words
    (a longer transition is cut to that length), with optional intro and conclusion."""
    sents = _extract(generate, question, context)
    reply = generate(LINK_TEMPLATE.format(question=question, numbered=_numbered(sents)))
    links = {int(i) - 1: " ".join(t.split()[:max_link_words]) for i, t in re.findall(r"LINK\s*(\d+):\s*(.+)", reply)}
    intro = re.search(r"INTRO:\s*(.+)", reply)
    outro = re.search(r"CONCLUSION:\s*(.+)", reply)
    parts = [intro.group(1).strip()] if intro else []
    for i, s in enumerate(sents):
        parts.append(s)
        if i < len(sents) - 1 and links.get(i):
            parts.append(links[i])
    if outro:
        parts.append(outro.group(1).strip())
    return " ".join(parts)


@dataclass
class RefineConfig:
    """CP-Refine constants. ``alpha, beta, gamma, epsilon`` of ``sigma`` and ``theta_sigma, t_max`` are
    UNKNOWN in the paper; defaults are implementation choices (see :func:`copy_score`)."""

    theta_sigma: float = 1.2
    t_max: int = 3
    alpha: float = 1.0
    beta: float = 0.5
    gamma: float = 4.0
    epsilon: float = 1.0
    max_suggestions: int = 3

    def __post_init__(self):
        if self.t_max < 1:
            raise ValueError(f"t_max must be >= 1, got {self.t_max}")
        if self.max_suggestions < 1:
            raise ValueError(f"max_suggestions must be >= 1, got {self.max_suggestions}")
        if self.gamma <= 0 or self.beta <= 0:
            raise ValueError(f"gamma and beta must be > 0, got gamma={self.gamma}, beta={self.beta}")


@dataclass
class RefineTrace:
    """The CP-Refine rounds: each answer, its ``(kappa, delta, sigma)`` and the reviewer's suggestions."""

    answers: list[str] = field(default_factory=list)
    scores: list[tuple[float, float, float]] = field(default_factory=list)
    suggestions: list[list[str]] = field(default_factory=list)

    @property
    def best(self) -> str:
        """The answer with the highest ``sigma``."""
        return self.answers[max(range(len(self.answers)), key=lambda i: self.scores[i][2])]


def cp_refine(writer: Generator, reviewer: Generator, question: str, context: str,
              config: RefineConfig | None = None) -> RefineTrace:
    """CP-Refine: the writer answers, ``sigma`` is scored; until ``sigma >= theta_sigma`` or ``t_max`` rounds
    the reviewer's (at most ``max_suggestions``) suggestions are fed back to the writer."""
    cfg = config or RefineConfig()
    trace, feedback = RefineTrace(), ""
    for _ in range(cfg.t_max):
        answer = writer(WRITER_TEMPLATE.format(context=context, question=question, feedback=feedback)).strip()
        kappa, delta = copy_metrics(answer, context) if answer.split() else (0.0, 0.0)
        sigma = copy_score(kappa, delta, cfg.alpha, cfg.beta, cfg.gamma, cfg.epsilon)
        trace.answers.append(answer)
        trace.scores.append((kappa, delta, sigma))
        if sigma >= cfg.theta_sigma:
            trace.suggestions.append([])
            break
        review = reviewer(REVIEW_TEMPLATE.format(context=context, question=question, answer=answer))
        tips = [t.strip() for t in re.findall(r"SUGGESTION:\s*(.+)", review)][:cfg.max_suggestions]
        trace.suggestions.append(tips)
        feedback = "Reviewer suggestions:\n" + "\n".join(f"- {t}" for t in tips) + "\n" if tips else ""
    return trace
