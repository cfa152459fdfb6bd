"""Interrupt safety: a KeyboardInterrupt at a random moment of a run leaves no trace (issue #12).

Each trial starts a timer that raises KeyboardInterrupt in the main thread after a random delay while
a capture of attention patterns (which switches HF attention to eager) runs inside an intervention.
Afterwards: no hook of ours is left on any module, every attention config is as before, and outputs
are bit-identical to the clean model's. Reduced here (40 trials per backend); ``-m slow`` runs 400.
"""
from __future__ import annotations

import _thread
import random
import signal
import threading
import time

import pytest
import torch

import interp
from interp.testing import tiny_model

NAMES = ["blocks.1.attn.hook_pattern", "blocks.2.hook_resid_post"]


def _impls(module) -> dict[int, str]:
    cfgs = [getattr(m, "config", None) for m in module.modules()]
    return {id(c): c._attn_implementation for c in cfgs if c is not None and hasattr(c, "_attn_implementation")}


@pytest.fixture(autouse=True)
def python_sigint_handler():
    """Ctrl-C as in an interactive session: Python's own SIGINT handler. pytest-xdist workers ignore SIGINT
    (SIG_IGN, so Ctrl-C reaches the controller), and ``interrupt_main`` does nothing then: whether an earlier
    test in the worker (a notebook kernel's client) had reinstalled Python's handler decided whether this test
    tested anything."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _trials(backend: str, n: int, seed: int = 0) -> None:
    hf, tok = tiny_model("llama", seed=3, n_layers=3)
    model = interp.wrap(hf, tok, backend=backend)
    texts = ["The cat sat on the mat.", "A dog"]
    clean = model(texts).clone()
    impls = _impls(hf)
    n_hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in hf.modules())
    rng = random.Random(seed)
    # measure one run to spread interrupts over its whole duration
    t0 = time.perf_counter()
    with model.intervene({"blocks.0.hook_resid_post": interp.Scale(0.5)}):
        model.run_with_cache(texts, names=NAMES)
    span = time.perf_counter() - t0
    hit = 0
    for _ in range(n):
        timer = threading.Timer(rng.uniform(0, 1.2 * span), _thread.interrupt_main)
        try:
            timer.start()
            with model.intervene({"blocks.0.hook_resid_post": interp.Scale(0.5)}):
                model.run_with_cache(texts, names=NAMES)
            time.sleep(0.3 * span)  # let a late interrupt land here rather than in the checks
        except KeyboardInterrupt:
            hit += 1
        finally:
            timer.cancel()
            timer.join()
    assert hit > 0, "no interrupt landed inside a run; the test did not test anything"
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in hf.modules()) == n_hooks
    assert _impls(hf) == impls
    assert torch.equal(model(texts), clean)


@pytest.mark.parametrize("backend", ["torch", "nnsight", "transformer_lens"])
def test_interrupts_leave_no_trace(backend):
    _trials(backend, 40)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "nnsight", "transformer_lens"])
def test_interrupts_leave_no_trace_full(backend):
    _trials(backend, 400, seed=1)


def test_debug_mode_catches_a_run_that_leaves_hooks(monkeypatch):
    """``INTERP_DEBUG=1`` verifies after each run that none of its hooks are left (planted failure: removal
    skipped)."""
    import interp.backends.torch_hooks as th
    hf, tok = tiny_model("llama", seed=3, n_layers=3)
    model = interp.wrap(hf, tok, backend="torch")
    monkeypatch.setattr(th, "DEBUG", True)
    model.run_with_cache(["abc"], names=NAMES)  # a clean run passes the check
    monkeypatch.setattr(th, "_remove", lambda handles: None)
    with pytest.raises(RuntimeError, match="debug check"):
        model.run_with_cache(["abc"], names=NAMES)
