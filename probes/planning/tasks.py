"""The task protocol of the planning analyses: prompts with known correct continuations.

The contract every analysis codes against is :class:`PlanningTask` (a ``Protocol``): an object with a
``name``, a seeded ``examples(n, seed)`` generator of :class:`PlanningExample` and an ``is_correct(example,
generated)`` check. Users write their own task objects against it. The paper's task families at CPU scale (the
goal-token horizon toy, the context-free grammar, path finding) and the word-level tokenizer of the toy models are
part of the reproduction, :mod:`interp.benchmarks.planning.tasks` (``interp reproduce planning``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["PlanningExample", "PlanningTask"]


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
