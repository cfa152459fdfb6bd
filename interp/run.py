"""Per-run context: everything about one forward pass lives here, never on the :class:`~interp.Model`.

A *run* is one call of ``model(...)``, ``run_with_cache``, ``gradients`` or ``generate``; a *pass* is one
forward of the network inside it (a plain forward is a run of one pass; ``generate`` is a run whose pass
0 reads the prompt and whose pass ``k`` reads the ``k``-th new token against the key-value cache). Each
pass gets its own :class:`PassContext` (attention mask, past length, pass index), pushed on a
:class:`contextvars.ContextVar` stack for the duration of the pass and looked up by the model that owns
it. So nested runs (a model called from inside a hook), re-entrant captures, several threads and two
wrapped models in one process each see their own context, and nothing leaks when a pass raises.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
from dataclasses import dataclass, field
from typing import Iterator

import torch

_run_ids = itertools.count()


@dataclass
class Run:
    """One run (a forward, a cached capture, a generation); counts its passes."""

    owner: int  # id() of the Model that runs it
    run_id: int = field(default_factory=lambda: next(_run_ids))
    passes: int = 0
    generating: bool = False

    def next_pass(self) -> int:
        self.passes += 1
        return self.passes - 1


@dataclass(frozen=True)
class PassContext:
    """What is known about the current forward pass.

    ``attention_mask`` is the mask of the whole sequence so far, ``[batch, past_length + n]`` where
    ``n`` is the number of positions this pass computes (with a key-value cache, ``n`` is 1 after the
    prompt). ``None`` for inputs without a mask (images).
    """

    run: Run
    pass_index: int
    attention_mask: torch.Tensor | None
    past_length: int = 0
    #: query masks already sliced in this pass, by their length (every hook of a pass asks for the same one)
    _query_masks: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def generating(self) -> bool:
        return self.run.generating

    def query_mask(self, n: int) -> torch.Tensor | None:
        """The mask of the ``n`` positions this pass computes: ``[batch, n]`` (the last ``n`` columns)."""
        got = self._query_masks.get(n)
        if got is None and self.attention_mask is not None and n <= self.attention_mask.shape[1]:
            got = self._query_masks[n] = self.attention_mask[:, -n:]
        return got


_STACK: contextvars.ContextVar[tuple[PassContext, ...]] = contextvars.ContextVar("interp_pass_stack", default=())
_RUNS: contextvars.ContextVar[tuple[Run, ...]] = contextvars.ContextVar("interp_run_stack", default=())


@contextlib.contextmanager
def run_scope(owner: object, generating: bool = False) -> Iterator[Run]:
    """Open a run of ``owner``: passes inside it count from 0 (reused if one is already open for it
    by the same caller frame chain, e.g. generation steps)."""
    run = Run(owner=id(owner), generating=generating)
    token = _RUNS.set(_RUNS.get() + (run,))
    try:
        yield run
    finally:
        _RUNS.reset(token)


def current_run(owner: object) -> Run | None:
    """The innermost open run of ``owner`` (``None`` outside any)."""
    for run in reversed(_RUNS.get()):
        if run.owner == id(owner):
            return run
    return None


@contextlib.contextmanager
def pass_scope(owner: object, attention_mask: torch.Tensor | None, past_length: int = 0) -> Iterator[PassContext]:
    """Open one forward pass of ``owner`` (inside its current run, or a fresh one-pass run)."""
    run = current_run(owner) or Run(owner=id(owner))
    ctx = PassContext(run, run.next_pass(), attention_mask, past_length)
    token = _STACK.set(_STACK.get() + (ctx,))
    try:
        yield ctx
    finally:
        _STACK.reset(token)


def push_pass(owner: object, attention_mask: torch.Tensor | None, past_length: int = 0):
    """Non-context-manager form of :func:`pass_scope` for torch hook pairs: returns a token for :func:`pop_pass`."""
    run = current_run(owner) or Run(owner=id(owner))
    ctx = PassContext(run, run.next_pass(), attention_mask, past_length)
    return _STACK.set(_STACK.get() + (ctx,))


def pop_pass(token) -> None:
    try:
        _STACK.reset(token)
    except ValueError:  # reset from another context (a hook pair split across threads): drop our entry
        _STACK.set(_STACK.get()[:-1])


def current_pass(owner: object) -> PassContext | None:
    """The innermost open pass of ``owner`` (``None`` outside any)."""
    for ctx in reversed(_STACK.get()):
        if ctx.run.owner == id(owner):
            return ctx
    return None


__all__ = ["Run", "PassContext", "run_scope", "pass_scope", "current_run", "current_pass", "push_pass", "pop_pass"]
