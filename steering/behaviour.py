"""Judging any steering vector on a contrastive behaviour (not only refusal).

Given a fitted :class:`~interp.steering.SteeringVector` and a :class:`interp.data.Behaviour` (built-in or a
user's JSON file), :func:`evaluate_behaviour` measures, without and with the vector:

* **behaviour rate** (marker judge, :func:`marker_scores`): for each neutral evaluation prompt,
  ``score = log sum_{m in M+} P(m | prompt) - log sum_{m in M-} P(m | prompt)``, where ``M+`` / ``M-`` are the
  behaviour's positive / negative marker continuations and ``P(m | prompt)`` is the product over the marker's
  tokens (teacher-forced, with the vector applied exactly as during greedy generation, see
  :func:`generation_positions`). The rate is the share of prompts with ``score > 0``; the mean score is
  reported too. Only for behaviours with markers.
* **probe score** (:class:`LinearProbe`): a logistic probe fitted on the ``train`` contrastive texts'
  last-token activations at ``blocks.{L}.hook_resid_post`` (``L`` the steered layer, :func:`probe_hook`),
  unsteered; evaluated on the evaluation prompts' last-token activations at the same hook without / with the
  vector (``probe_score`` = mean P(positive), ``probe_rate`` = share with P > 0.5). Its held-out accuracy on
  the ``test`` contrastive texts says whether the probe means anything.
* **KL on neutral text** (:func:`token_kl`): mean over every real token of the neutral texts of
  ``KL(p_plain || p_steered)`` of the next-token distribution (nats).
* **coherence** (:func:`continuation_perplexity`): the perplexity, under the UNSTEERED model, of the greedy
  continuation generated under the vector (and, as the reference, of the unsteered greedy continuation).

Prompts are tokenized like everywhere in ``steering`` (:func:`interp.steering.base.prepared`: left padding, no
added special tokens).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Sequence

import torch

from interp.names import parse
from interp.progress import progress
from interp.viz import token_view

from .activations import last_token
from .base import SteeringVector, batches, n_prompts, prepared


def _ctx(model, vector: SteeringVector | None):
    return contextlib.nullcontext() if vector is None else vector.apply(model)


def _pad_id(tokenizer) -> int:
    return next((int(p) for p in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None),
                                  getattr(tokenizer, "unk_token_id", None)) if isinstance(p, int)), 0)


def generation_positions(positions: tuple[int, ...] | None, k: int) -> tuple[int, ...] | None:
    """The positions rule that, on ``prompt + k continuation tokens`` in ONE pass, steers the same tokens as
    KV-cached greedy generation of those ``k`` tokens does with ``positions``.

    In generation, pass 0 (the prompt) applies ``positions`` to the prompt and each later pass holds one new
    token, selected by ``-1`` (and by a non-negative index equal to its absolute position). So in one pass:
    negative ``p`` becomes ``p - k`` (still counted back from the prompt's last token), non-negative ``p``
    stays (absolute indices do not move: the continuation is appended after the prompt), and, if ``-1`` is in
    the rule, the ``k`` continuation tokens ``-k .. -1`` are added. ``None`` (every position) stays ``None``.
    """
    if positions is None:
        return None
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    out = [p - k if p < 0 else p for p in positions]
    if -1 in positions:
        out += list(range(-k, 0))
    return tuple(dict.fromkeys(out))


@torch.no_grad()
def marker_logprobs(model, prompts: Sequence[str], markers: Sequence[str], vector: SteeringVector | None = None,
                    batch_size: int = 16) -> torch.Tensor:
    """``log P(marker | prompt)`` (sum over the marker's tokens, teacher-forced) ``[n_prompts, n_markers]``.

    Prompt and marker are tokenized separately (no added special tokens) and their ids concatenated, so the
    marker's tokens are the same after every prompt. Under ``vector`` its positions rule is translated by
    :func:`generation_positions`, so the score is that of generating the marker greedily under the vector.
    """
    tok = model.tokenizer
    if tok is None:
        raise ValueError("marker_logprobs needs a model with a tokenizer")
    prompt_ids = tok(list(prompts), add_special_tokens=False)["input_ids"]
    marker_ids = tok(list(markers), add_special_tokens=False)["input_ids"]
    for m, ids in zip(markers, marker_ids):
        if not ids:
            raise ValueError(f"marker {m!r} tokenizes to nothing")
    pad = _pad_id(tok)
    out = torch.empty(len(prompt_ids), len(marker_ids))
    for j, mids in enumerate(marker_ids):  # one batch shape per marker: its length k fixes the logit slice
        k = len(mids)
        vec = None if vector is None else dataclasses.replace(
            vector, positions=generation_positions(vector.positions, k), tensors=dict(vector.tensors),
            metadata=dict(vector.metadata))
        target = torch.as_tensor(mids, dtype=torch.long)
        with _ctx(model, vec):
            for start in range(0, len(prompt_ids), batch_size):
                rows = [list(p) + list(mids) for p in prompt_ids[start:start + batch_size]]
                n = max(len(r) for r in rows)
                ids = torch.full((len(rows), n), pad, dtype=torch.long)
                mask = torch.zeros((len(rows), n), dtype=torch.long)
                for i, r in enumerate(rows):  # left padding: the marker is the last k tokens of every row
                    ids[i, n - len(r):] = torch.as_tensor(r, dtype=torch.long)
                    mask[i, n - len(r):] = 1
                logits = model({"input_ids": ids, "attention_mask": mask})
                lp = logits[:, n - k - 1:n - 1].float().log_softmax(-1).cpu()  # [b, k, vocab]
                out[start:start + len(rows), j] = lp.gather(-1, target.expand(len(rows), k)[..., None])[..., 0].sum(-1)
    return out


def marker_scores(model, prompts: Sequence[str], positive_markers: Sequence[str], negative_markers: Sequence[str],
                  vector: SteeringVector | None = None, batch_size: int = 16) -> torch.Tensor:
    """Behaviour log-odds per prompt ``[n]``: ``logsumexp`` of the positive markers' log-probabilities minus
    that of the negative markers (:func:`marker_logprobs`). ``> 0``: the behaviour is more likely than not."""
    if not positive_markers or not negative_markers:
        raise ValueError("marker_scores needs at least one positive and one negative marker")
    lp = marker_logprobs(model, prompts, list(positive_markers) + list(negative_markers), vector, batch_size)
    k = len(positive_markers)
    return lp[:, :k].logsumexp(-1) - lp[:, k:].logsumexp(-1)


@dataclasses.dataclass
class LinearProbe:
    """A logistic-regression probe on standardised features: ``P(positive | x) = sigmoid(w . (x - mean) / std + b)``.

    ``mean``, ``std``, ``w``: ``[d]``; ``b``: a scalar tensor."""

    mean: torch.Tensor
    std: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor

    @classmethod
    def fit(cls, positive: torch.Tensor, negative: torch.Tensor, l2: float = 1e-2, steps: int = 100) -> "LinearProbe":
        """Fit on ``positive`` ``[n+, d]`` (label 1) and ``negative`` ``[n-, d]`` (label 0): full-batch L-BFGS on the
        mean binary cross-entropy plus ``l2 * |w|^2`` (deterministic)."""
        if positive.dim() != 2 or negative.dim() != 2 or positive.shape[1] != negative.shape[1]:
            raise ValueError(f"probe features must be [n, d] with the same d, got {tuple(positive.shape)} and "
                             f"{tuple(negative.shape)}")
        x = torch.cat([positive, negative]).double()
        y = torch.cat([torch.ones(len(positive)), torch.zeros(len(negative))]).double()
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        z = (x - mean) / std
        w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros((), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y) + l2 * (w @ w)
            loss.backward()
            return loss

        with torch.enable_grad():
            opt.step(closure)
        return cls(mean.float(), std.float(), w.detach().float(), b.detach().float())

    def proba(self, x: torch.Tensor) -> torch.Tensor:
        """``P(positive)`` for features ``[n, d]`` -> ``[n]``."""
        return torch.sigmoid(((x.float() - self.mean) / self.std) @ self.w + self.b)

    def accuracy(self, positive: torch.Tensor, negative: torch.Tensor) -> float:
        """Share of ``positive`` rows with P > 0.5 and ``negative`` rows with P < 0.5."""
        right = torch.cat([self.proba(positive) > 0.5, self.proba(negative) < 0.5])
        return float(right.float().mean())


def probe_hook(model, vector: SteeringVector, layer: int | None = None) -> str:
    """Where the probe reads: ``blocks.{L}.hook_resid_post`` with ``L`` = ``layer`` if given, else the vector's
    ``layer`` (metadata), else the largest layer among its concrete hook names, else the middle layer (a vector
    on every layer, e.g. directional ablation). A write at ``blocks.L.hook_resid_pre`` or ``..._post`` is seen."""
    if layer is None:
        layer = vector.layer
    if layer is None:
        found = [parse(h)[0] for h in vector.hooks if "*" not in h]
        found = [f for f in found if f is not None]
        layer = max(found) if found else model.cfg.n_layers // 2
    if not 0 <= int(layer) < model.cfg.n_layers:
        raise ValueError(f"probe layer {layer} is outside the model's layers 0..{model.cfg.n_layers - 1}")
    return f"blocks.{int(layer)}.hook_resid_post"


@torch.no_grad()
def token_kl(model, texts: Sequence[str], vector: SteeringVector, batch_size: int = 16) -> tuple[float, int]:
    """``(mean KL(p_plain || p_steered) in nats over every real token of texts, number of tokens)``."""
    total, count = 0.0, 0
    n_batches = (n_prompts(texts) + batch_size - 1) // batch_size
    for batch in progress(batches(list(texts), batch_size), desc="neutral KL", total=n_batches):
        enc = prepared(model, batch)
        kl = _kl_per_position(model, enc, vector)
        real = enc["attention_mask"].to(kl.device).bool()
        total += float(kl[real].sum())
        count += int(real.sum())
    return total / max(count, 1), count


def _kl_per_position(model, enc, vector: SteeringVector) -> torch.Tensor:
    """``[batch, pos]``: KL(p_plain || p_steered) in nats of the next-token distribution at every position."""
    base = model(enc).float().log_softmax(-1)
    with vector.apply(model):
        steered = model(enc).float().log_softmax(-1)
    return (base.exp() * (base - steered)).sum(-1)


#: title of the per-token KL view (:func:`token_kl_view`, and the steering audit section that redraws it)
KL_VIEW_TITLE = "per-token KL(plain ‖ steered), nats"


@torch.no_grad()
def token_kl_view(model, text: str, vector: SteeringVector):
    """A :func:`interp.viz.token_view` of one text: each token coloured by KL(p_plain || p_steered) (nats) of the
    next-token distribution read at it; where steering moves the model's predictions."""
    enc = prepared(model, [text])
    kl = _kl_per_position(model, enc, vector)[0]
    real = enc["attention_mask"][0].bool().to(kl.device)
    ids = enc["input_ids"][0][real.to(enc["input_ids"].device)]
    return token_view(model.to_str_tokens(ids), kl[real].cpu(), title=KL_VIEW_TITLE)


@torch.no_grad()
def continuation_perplexity(model, prompts: Sequence[str], vector: SteeringVector | None,
                            max_new_tokens: int = 24, batch_size: int = 16) -> tuple[float, list[str]]:
    """``(perplexity, texts)``: greedy continuations generated under ``vector`` (``None``: unsteered), scored by
    the UNSTEERED model: ``exp(mean NLL)`` over every generated token (the end-of-sequence token included, what
    follows it not)."""
    nll, count, texts = 0.0, 0, []
    n_batches = (n_prompts(prompts) + batch_size - 1) // batch_size
    for batch in progress(batches(list(prompts), batch_size), desc="coherence", total=n_batches):
        enc = prepared(model, batch)
        with _ctx(model, vector):
            new = model.generate(enc, max_new_tokens=max_new_tokens, do_sample=False, return_text=False)
        new = new.cpu()
        valid = new >= 0
        texts += [model.tokenizer.decode(row[row >= 0], skip_special_tokens=True) for row in new]
        ids = torch.cat([enc["input_ids"].cpu(), new.clamp_min(0)], dim=1)
        mask = torch.cat([enc["attention_mask"].cpu(), valid.long()], dim=1)
        n = enc["input_ids"].shape[1]
        logits = model({"input_ids": ids, "attention_mask": mask})
        lp = logits[:, n - 1:-1].float().log_softmax(-1).cpu()
        tok_lp = lp.gather(-1, new.clamp_min(0)[..., None])[..., 0]
        nll -= float(tok_lp[valid].sum())
        count += int(valid.sum())
    return (math.exp(nll / count) if count else float("nan")), texts


def evaluate_behaviour(model, vector: SteeringVector, behaviour, neutral_texts: Sequence[str],
                       probe_layer: int | None = None, max_new_tokens: int = 24, batch_size: int = 16,
                       n_examples: int = 3) -> dict[str, Any]:
    """Every measurement of the module docstring for ``vector`` on ``behaviour`` (a :class:`interp.data.Behaviour`).

    Returns ``{"behaviour", "probe_hook", "probe_test_accuracy", "n_prompts", "n_neutral_texts",
    "n_neutral_tokens", "kl_neutral", "has_markers", "conditions": {"none": {...}, "steered": {...}},
    "kl_tokens": {"tokens", "kl"} (per-token KL on the first neutral text, :func:`token_kl_view`),
    "examples": [{"prompt", "none", "steered"}]}``; each condition holds ``behaviour_rate`` and
    ``behaviour_score`` (``None`` without markers), ``probe_score``, ``probe_rate`` and ``continuation_ppl``.
    """
    prompts = list(behaviour.prompts)
    hook = probe_hook(model, vector, probe_layer)
    pos_tr, neg_tr = behaviour.split("train")
    pos_te, neg_te = behaviour.split("test")
    act = {name: last_token(model, texts, hook, batch_size)
           for name, texts in (("pos_tr", pos_tr), ("neg_tr", neg_tr), ("pos_te", pos_te), ("neg_te", neg_te))}
    probe = LinearProbe.fit(act["pos_tr"], act["neg_tr"])
    conditions: dict[str, dict[str, Any]] = {}
    generations: dict[str, list[str]] = {}
    for cond, vec in (("none", None), ("steered", vector)):
        with _ctx(model, vec):
            p = probe.proba(last_token(model, prompts, hook, batch_size))
        row: dict[str, Any] = {"probe_score": float(p.mean()), "probe_rate": float((p > 0.5).float().mean()),
                               "behaviour_rate": None, "behaviour_score": None}
        if behaviour.has_markers:
            s = marker_scores(model, prompts, behaviour.positive_markers, behaviour.negative_markers, vec, batch_size)
            row["behaviour_rate"], row["behaviour_score"] = float((s > 0).float().mean()), float(s.mean())
        row["continuation_ppl"], generations[cond] = continuation_perplexity(model, prompts, vec, max_new_tokens,
                                                                             batch_size)
        conditions[cond] = row
    kl, n_tokens = token_kl(model, neutral_texts, vector, batch_size)
    view = token_kl_view(model, neutral_texts[0], vector) if len(neutral_texts) else None
    return {"behaviour": behaviour.name, "probe_hook": hook,
            "probe_test_accuracy": probe.accuracy(act["pos_te"], act["neg_te"]), "n_prompts": len(prompts),
            "n_neutral_texts": len(neutral_texts), "n_neutral_tokens": n_tokens, "kl_neutral": kl,
            "has_markers": behaviour.has_markers, "conditions": conditions,
            "kl_tokens": None if view is None else {"tokens": view.tokens, "kl": view.values},
            "examples": [{"prompt": prompts[i], "none": generations["none"][i], "steered": generations["steered"][i]}
                         for i in range(min(n_examples, len(prompts)))]}


__all__ = ["LinearProbe", "continuation_perplexity", "evaluate_behaviour", "generation_positions", "marker_logprobs",
           "marker_scores", "probe_hook", "token_kl", "token_kl_view"]
