"""Issue #32, runtime half: threads, right-padded generation, negative head indices, raw library errors.

Models: tiny 3-layer models (``interp.testing.tiny_model``) with perturbed norm weights and biases, padded
batches of prompts of different lengths, on every backend (torch, nnsight, transformer_lens).

* Threads: contexts (``intervene``, ``capture``, ``splice``) belong to the thread that opened them, and the
  runs of one model are serialised by a per-model lock, so every run sees exactly its own hooks; the
  tokenizer is never mutated. :func:`_stress` runs plain forwards, forwards under another thread's
  ``Scale(0)``, captures and captured generations in several threads at once and compares each with the
  same call made alone (reduced here; ``-m slow``: more threads and rounds, llama and gpt2).
* ``generate(..., padding_side="right")`` equals the unbatched generation (llama and gpt2).
* ``heads=[-1]`` means the last head, as Python indexing does.
* Over-long input on the TransformerLens backend, an empty batch, ``wrap(None)``: one clear error.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import warnings

import pytest
import torch

import interp
from interp.testing import tiny_model

BACKENDS = ("torch", "nnsight", "transformer_lens")
TEXTS = ["The cat sat on the mat.", "A dog", "hello there"]
PROMPTS = ["ab", "abcdefg", "abcd"]
HOOK = "blocks.1.hook_resid_post"
NEW = 4


@functools.lru_cache(maxsize=None)
def wrapped(arch: str, backend: str) -> interp.Model:
    """One model per (arch, backend): the bridge rewires its HF module in place, so each gets its own copy
    (same seed, same weights)."""
    hf, tok = tiny_model(arch, seed=4, n_layers=3, perturb_norms=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return interp.wrap(hf, tok, backend=backend)


@contextlib.contextmanager
def _watch_tokenizer(tok):
    """Record every attribute written on ``tok`` inside the block (its class is swapped for a recording
    subclass, and back afterwards)."""
    writes: list[str] = []
    on = [True]
    base = type(tok)

    class Watched(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, key, value):
            if on[0]:
                writes.append(key)
            super().__setattr__(key, value)
    tok.__class__ = Watched
    try:
        yield writes
    finally:
        on[0] = False
        tok.__class__ = base


# ------------------------------------------------------------------------------------------- threads
def _stress(arch: str, backend: str, per_kind: int, rounds: int) -> None:
    """``per_kind`` threads of each of four kinds run ``rounds`` times at once on one model; every result
    must equal the same call made alone, and the tokenizer must not be written."""
    model = wrapped(arch, backend)
    tok = model.tokenizer
    side, pad = tok.padding_side, tok.pad_token
    # references, each computed alone
    ref = model(TEXTS).clone()
    with model.intervene({HOOK: interp.Scale(0.0)}):
        ref0 = model(TEXTS).clone()
    assert (ref - ref0).abs().max() > 1e-2  # Scale(0) visibly changes the output
    _, refc = model.run_with_cache(TEXTS[1:], names=[HOOK])
    refgen = model.generate(PROMPTS, max_new_tokens=NEW, return_text=False, stop_at_eos=False)
    errors: list[str] = []
    start = threading.Barrier(4 * per_kind)

    def guarded(fn):
        def body(k: int) -> None:
            try:
                start.wait()
                for r in range(rounds):
                    fn(k, r)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(f"{fn.__name__}[{k}]: {exc!r}")
        return body

    def plain(k, r):
        out = model(TEXTS)
        if out is None or not torch.allclose(out, ref, atol=1e-5):
            errors.append(f"plain[{k}] round {r}: "
                          + ("None" if out is None else f"max diff {float((out - ref).abs().max()):.3g}"))

    def scaled(k, r):
        with model.intervene({HOOK: interp.Scale(0.0)}):
            out = model(TEXTS)
        if out is None or not torch.allclose(out, ref0, atol=1e-5):
            errors.append(f"scaled[{k}] round {r}: "
                          + ("None" if out is None else f"max diff {float((out - ref0).abs().max()):.3g}"))

    def capture(k, r):
        with model.capture(HOOK) as cache:
            model(TEXTS[1:])
        passes = cache.passes(HOOK)
        want = refc[HOOK]
        if len(passes) != 1 or passes[0].shape != want.shape or not torch.allclose(passes[0], want, atol=1e-5):
            errors.append(f"capture[{k}] round {r}: {len(passes)} passes recorded, expected 1 equal to the "
                          "capture made alone")

    def generate(k, r):
        side_ = ("left", "right")[(k + r) % 2]
        with model.capture(HOOK) as cache:
            got = model.generate(PROMPTS, max_new_tokens=NEW, return_text=False, stop_at_eos=False,
                                 padding_side=side_)
        if not torch.equal(got, refgen):
            errors.append(f"generate[{k}] round {r} ({side_}-padded): {got.tolist()} != {refgen.tolist()}")
        if len(cache.passes(HOOK)) != NEW:
            errors.append(f"generate[{k}] round {r}: {len(cache.passes(HOOK))} passes recorded, expected {NEW}")

    threads = [threading.Thread(target=guarded(fn), args=(k,)) for fn in (plain, scaled, capture, generate)
               for k in range(per_kind)]
    with _watch_tokenizer(tok) as writes:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [], f"{len(errors)} wrong results, e.g. {errors[:4]}"
    assert writes == [], f"the shared tokenizer was written: {sorted(set(writes))}"
    assert (tok.padding_side, tok.pad_token) == (side, pad)
    assert torch.equal(model(TEXTS), ref)  # and nothing stays behind
    assert not model._active


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_see_only_their_own_runs(backend):
    _stress("llama", backend, per_kind=1, rounds=3)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_see_only_their_own_runs_full(arch, backend):
    _stress(arch, backend, per_kind=3, rounds=15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_context_belongs_to_the_thread_that_opened_it(backend):
    """Deterministic form of the race: thread B holds ``Scale(0)`` and a capture open while thread A runs;
    A's forward is the clean one and B's capture records none of A's passes."""
    model = wrapped("llama", backend)
    ref = model(TEXTS).clone()
    opened, done = threading.Event(), threading.Event()
    seen: dict = {}

    def b():
        try:
            with model.intervene({HOOK: interp.Scale(0.0)}), model.capture(HOOK) as cache:
                opened.set()
                done.wait(60)
                seen["b_passes"] = len(cache.passes(HOOK)) if HOOK in cache else 0
                seen["b_out"] = model(TEXTS)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            seen["error"] = repr(exc)
            opened.set()
    t = threading.Thread(target=b)
    t.start()
    try:
        assert opened.wait(60)
        out = model(TEXTS)
        with model.capture(HOOK) as mine:
            model.generate(PROMPTS, max_new_tokens=2, stop_at_eos=False)
    finally:
        done.set()
        t.join()
    assert "error" not in seen, seen["error"]
    assert out is not None and torch.allclose(out, ref, atol=1e-5)
    assert len(mine.passes(HOOK)) == 2
    assert seen["b_passes"] == 0                               # A's forward and generation are not B's
    assert not torch.allclose(seen["b_out"], ref, atol=1e-2)   # B's own forward is scaled


def test_a_model_with_its_run_lock_can_still_be_copied():
    import copy
    hf, tok = tiny_model("llama", seed=4, n_layers=3, perturb_norms=True)
    model = interp.wrap(hf, tok, backend="torch")
    twin = copy.deepcopy(model)
    assert twin._locked() is not model._locked()
    assert torch.equal(twin(TEXTS), model(TEXTS))


@pytest.mark.parametrize("backend", BACKENDS)
def test_tokenizer_is_never_written(backend):
    """Padding side and pad token are passed per call; the shared tokenizer object stays as it was."""
    model = wrapped("gpt2", backend)
    tok = model.tokenizer
    side = tok.padding_side
    with _watch_tokenizer(tok) as writes:
        left = model.tokenize(["a", "abc"], padding_side="left")
        right = model.tokenize(["a", "abc"], padding_side="right")
        model.generate(PROMPTS, max_new_tokens=1, padding_side="right")
        model.generate(PROMPTS, max_new_tokens=1)
        model.to_tokens(["x", "xyz"])
    assert left["attention_mask"].tolist() == [[0, 0, 1], [1, 1, 1]]
    assert right["attention_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert torch.equal(left["input_ids"][0, 2], right["input_ids"][0, 0])
    assert writes == [] and tok.padding_side == side


# ------------------------------------------------------------------------------ right-padded generate
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_right_padded_generation_equals_unbatched(arch, backend):
    model = wrapped(arch, backend)
    alone = torch.cat([model.generate([p], max_new_tokens=NEW, return_text=False, stop_at_eos=False)
                       for p in PROMPTS])
    right = model.generate(PROMPTS, max_new_tokens=NEW, return_text=False, stop_at_eos=False, padding_side="right")
    left = model.generate(PROMPTS, max_new_tokens=NEW, return_text=False, stop_at_eos=False, padding_side="left")
    assert torch.equal(left, alone)
    assert torch.equal(right, alone), f"right-padded {right.tolist()} != unbatched {alone.tolist()}"
    # a right-padded batch of ids with its mask, as a user builds it
    batch = model.tokenize(PROMPTS, padding_side="right")
    assert torch.equal(model.generate(batch, max_new_tokens=NEW, return_text=False, stop_at_eos=False), alone)
    # and the steered last real token of each row is the same token either way
    vec = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    with model.intervene({"blocks.2.hook_resid_post": interp.Add(vec, scale=3.0, positions=[-1])}):
        steered_alone = torch.cat([model.generate([p], max_new_tokens=NEW, return_text=False, stop_at_eos=False)
                                   for p in PROMPTS])
        steered = model.generate(PROMPTS, max_new_tokens=NEW, return_text=False, stop_at_eos=False,
                                 padding_side="right")
    assert torch.equal(steered, steered_alone)


# ------------------------------------------------------------------------------------ head index -1
@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_heads_index_from_the_end(backend):
    model = wrapped("llama", backend)
    n = model.cfg.n_heads
    z = "blocks.1.attn.hook_z"
    _, cache = model.run_with_cache(TEXTS, names=[z])
    vec = torch.randn(model.cfg.d_head, generator=torch.Generator().manual_seed(2))
    for make in (lambda h: interp.Ablate("zero", heads=h),
                 lambda h: interp.Ablate("mean", mean_from=cache, heads=h),
                 lambda h: interp.Scale(3.0, heads=h),
                 lambda h: interp.Add(vec, heads=h, positions=[-1]),
                 lambda h: interp.Patch(cache[z].flip(-1), heads=h)):
        with model.intervene({z: make([n - 1, 0])}):
            want = model(TEXTS)
        with model.intervene({z: make([-1, -n])}):
            got = model(TEXTS)
        assert torch.equal(got, want)
    with pytest.raises(IndexError, match=f"valid: -{n}..{n - 1}"):
        with model.intervene({z: interp.Ablate("zero", heads=[-n - 1])}):
            model(TEXTS)


# ------------------------------------------------------------------------------- raw library errors
@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_over_long_input_names_the_context_length_on_transformer_lens(arch):
    model = wrapped(arch, "transformer_lens")
    ids = torch.ones(1, 129, dtype=torch.long)
    with pytest.raises(ValueError, match="at most 128"):
        model(ids)
    with pytest.raises(ValueError, match="at most 128"):
        model.run_with_cache(ids, names=[HOOK])
    assert model(ids[:, :128]).shape[1] == 128  # the limit itself is fine


@pytest.mark.parametrize("backend", BACKENDS)
def test_generation_past_the_context_length_is_refused_before_it_starts(backend):
    model = wrapped("gpt2", backend)  # 128 learned positions
    ids = torch.full((1, 126), 65, dtype=torch.long)
    with pytest.raises(ValueError, match="needs 130 positions; this model takes at most 128"):
        model.generate(ids, max_new_tokens=5)
    assert model.generate(ids, max_new_tokens=3, return_text=False, stop_at_eos=False).shape == (1, 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_empty_batch_is_refused(backend):
    model = wrapped("llama", backend)
    empty = torch.ones(0, 5, dtype=torch.long)
    for bad in (empty, {"input_ids": empty, "attention_mask": empty}):
        for call in (model, lambda x: model.run_with_cache(x, names=[HOOK]),
                     lambda x: model.generate(x, max_new_tokens=1)):
            with pytest.raises(ValueError, match="no rows"):
                call(bad)


def test_wrap_none_is_refused():
    with pytest.raises(TypeError, match="wrap.. needs a model"):
        interp.wrap(None)
    with pytest.raises(TypeError, match="wrap.. needs a model"):
        interp.wrap("gpt2")  # a name is for interp.load
