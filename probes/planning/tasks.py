"""The task protocol of the planning analyses: prompts with known correct continuations.

The contract every analysis codes against is :class:`PlanningTask` (a ``Protocol``): an object with a
``name``, a seeded ``examples(n, seed)`` generator of :class:`PlanningExample` and an ``is_correct(example,
generated)`` check. Users write their own task objects against it. The paper's task families at CPU scale (the
goal-token horizon toy, the context-free grammar, path finding) and the word-level tokenizer of the toy models are
part of the reproduction, :mod:`interp.benchmarks.planning.tasks` (``interp reproduce planning``).

:class:`TextContinuation` is the built-in task of the analyses called without one: real text
(:func:`interp.data.text_passages`) cut into a prompt and its true continuation, so any language model can be
analysed from one call (how far ahead its states inform what it writes next in ordinary prose).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["PlanningExample", "PlanningTask", "TextContinuation"]


@dataclass(frozen=True)
class PlanningExample:
    """One prompt with its known continuations.

    ``prompt`` and ``target`` are word-level (tokens separated by single spaces, no ``<bos>``: the
    tokenizer adds it). ``answers`` holds every correct continuation when they can be enumerated (branch
    tasks: both correct paths, ``answers[0] == target``); it is empty when they cannot (the horizon toy's
    random tail, grammar continuations) -- use the task's ``is_correct`` then. ``decoy`` is a wrong
    continuation sharing no node with the answers (branch tasks only).
    """

    prompt: str                      # text given to the model (word-level: tokens separated by spaces)
    target: str                      # reference continuation (one correct answer), space-separated tokens
    answers: tuple[str, ...] = ()    # every correct continuation (branch tasks: both correct paths; answers[0]==target)
    decoy: str | None = None         # wrong continuation sharing no nodes with the answers (branch tasks)
    meta: dict = field(default_factory=dict)   # e.g. {"goal": "g7"} or the graph


@runtime_checkable
class PlanningTask(Protocol):
    """What the planning analyses need from a task (write your own against this)."""

    name: str

    def examples(self, n: int, seed: int = 0) -> list[PlanningExample]: ...

    def is_correct(self, example: PlanningExample, generated: str) -> bool: ...


@dataclass(frozen=True)
class TextContinuation:
    """Real-text continuation: each example is a KJV passage (:func:`interp.data.text_passages`, Ruth held out)
    cut after ``prompt_words`` words, its ``target`` the next ``target_words`` words of the passage. A
    generation is correct when its first word is the passage's next word (punctuation kept, case-sensitive).
    ``examples(n, seed)`` draws ``n`` distinct passages (all 8,114 at most) with a seeded generator."""

    prompt_words: int = 24
    target_words: int = 8
    name: str = "text-continuation"

    def __post_init__(self) -> None:
        for f in ("prompt_words", "target_words"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TextContinuation.{f} must be a positive integer, got {v!r}")

    def examples(self, n: int, seed: int = 0) -> list[PlanningExample]:
        from interp.data import text_passages

        need = self.prompt_words + self.target_words
        pool = [p.split() for p in text_passages(None)]
        pool = [w for w in pool if len(w) >= need]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(pool):
            raise ValueError(f"n must be an integer in 1..{len(pool)} (passages of >= {need} words), got {n!r}")
        pick = random.Random(f"text-continuation/{seed}").sample(range(len(pool)), n)
        return [PlanningExample(prompt=" ".join(pool[i][:self.prompt_words]),
                                target=" ".join(pool[i][self.prompt_words:need])) for i in pick]

    def is_correct(self, example: PlanningExample, generated: str) -> bool:
        words = generated.split()
        return bool(words) and words[0] == example.target.split()[0]
