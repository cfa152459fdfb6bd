"""Direct preference optimisation (Rafailov et al. 2023) as CopyPasteLLM trains it: the standard loss with
``beta = 0.3``, AdamW (lr 5e-5, weight decay 0.01), cosine schedule with 5 % warm-up, grad-norm clip 1.0,
batch 2 x gradient accumulation 8. Our own loss and loop (no ``trl``).

``loss = -log sigmoid(beta [(log pi(y_c|x) - log ref(y_c|x)) - (log pi(y_r|x) - log ref(y_r|x))])`` with sequence
log-probabilities summed over the response tokens only.
"""
from __future__ import annotations

import copy
from pathlib import Path
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from interp.io import load_torch
from interp.progress import progress
from interp.training import set_seed, warmup_cosine_fraction

from ..common import minibatches
from .preference import PreferencePair


@dataclass
class DPOConfig:
    """The paper's DPO hyperparameters (epochs: 2 for Mistral-7B / Llama-3-8B, 1 for Llama-3.1-8B)."""

    beta: float = 0.3
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    batch_size: int = 2
    grad_accum: int = 8
    epochs: int = 2
    max_length: int = 512
    seed: int = 0

    def __post_init__(self):
        for name in ("beta", "lr", "grad_clip"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("batch_size", "grad_accum", "epochs", "max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(f"warmup_frac must lie in [0, 1), got {self.warmup_frac}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean DPO loss and the per-pair implicit reward margins ``[batch]``.

    All inputs are sequence log-probabilities ``[batch]``; margin ``= beta ((pc - rc) - (pr - rr))``.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    return -F.logsigmoid(margin).mean(), margin.detach()


def sequence_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Summed log-probability of the response tokens ``[batch]``.

    ``logits`` ``[batch, pos, vocab]`` from a causal LM on ``input_ids`` ``[batch, pos]``; ``response_mask``
    ``[batch, pos]`` is 1 on the tokens to score (token ``t`` is predicted by the logits at ``t - 1``).
    """
    if logits.shape[:2] != input_ids.shape or response_mask.shape != input_ids.shape:
        raise ValueError(f"shapes disagree: logits {tuple(logits.shape)}, ids {tuple(input_ids.shape)}, "
                         f"mask {tuple(response_mask.shape)}")
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return (logp * response_mask[:, 1:].to(logp.dtype)).sum(-1)


@dataclass
class EncodedPairs:
    """Right-padded token tensors ``[n, pos]`` of prompt+chosen and prompt+rejected, masks of real tokens
    and of response tokens."""

    chosen_ids: torch.Tensor
    chosen_mask: torch.Tensor
    chosen_response: torch.Tensor
    rejected_ids: torch.Tensor
    rejected_mask: torch.Tensor
    rejected_response: torch.Tensor


def _encode(tokenizer, prompts: Sequence[str], responses: Sequence[str], max_length: int):
    rows, resp = [], []
    for p, r in zip(prompts, responses):
        p_ids = tokenizer(p, add_special_tokens=True)["input_ids"]
        r_ids = tokenizer(" " + r.strip(), add_special_tokens=False)["input_ids"]
        eos = tokenizer.eos_token_id
        r_ids = r_ids + ([eos] if eos is not None else [])
        ids = (p_ids + r_ids)[-max_length:]
        n_resp = min(len(r_ids), len(ids) - 1)
        if n_resp < 1:
            raise ValueError(f"max_length={max_length} leaves no response token")
        rows.append(ids)
        resp.append(n_resp)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    rmask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, n) in enumerate(zip(rows, resp)):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
        rmask[i, len(r) - n:len(r)] = 1
    return ids, mask, rmask


def encode_pairs(tokenizer, pairs: Sequence[PreferencePair], max_length: int = 512) -> EncodedPairs:
    """Tokenise ``pairs`` (a space joins prompt and response; an EOS token ends the response)."""
    if not pairs:
        raise ValueError("pairs is empty")
    prompts = [p.prompt for p in pairs]
    return EncodedPairs(*_encode(tokenizer, prompts, [p.chosen for p in pairs], max_length),
                        *_encode(tokenizer, prompts, [p.rejected for p in pairs], max_length))


def _logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=ids, attention_mask=mask)
    return out.logits if hasattr(out, "logits") else out


@dataclass
class DPOHistory:
    """Per optimiser step: mean loss, mean reward margin and the share of pairs with a positive margin."""

    loss: list[float] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)


def dpo_train(policy: torch.nn.Module, tokenizer, pairs: Sequence[PreferencePair], config: DPOConfig | None = None,
              reference: torch.nn.Module | None = None, checkpoint: str | Path | None = None,
              checkpoint_every: int = 1) -> DPOHistory:
    """Train ``policy`` (in place) with DPO on ``pairs``; ``reference`` defaults to a frozen copy of ``policy``
    taken before training (the reference log-probs are computed once, up front).

    ``policy`` is a causal LM called as ``policy(input_ids=..., attention_mask=...)`` returning logits or an
    object with ``.logits`` (a ``transformers`` model, a ``peft`` LoRA model). Only parameters with
    ``requires_grad`` are optimised (so a LoRA wrapper trains its adapters only).

    ``checkpoint``: a ``.pt`` file written atomically every ``checkpoint_every`` optimiser steps (trainable
    parameters, optimiser and schedule state, reference log-probs, history); when it exists the run resumes from it
    (same pairs and config assumed; the batch order is drawn up front from the seed, so a resumed run takes the
    same steps as an uninterrupted one). Loaded with ``interp.io.load_torch`` (``torch.load(weights_only=True)``; any failure a ``SerializationError``).
    """
    cfg = config or DPOConfig()
    gen = set_seed(cfg.seed)
    enc = encode_pairs(tokenizer, pairs, cfg.max_length)
    state = load_torch(checkpoint, what="DPO checkpoint") if checkpoint is not None and Path(checkpoint).exists() else None
    if state is not None:
        ref_c, ref_r = state["ref_c"], state["ref_r"]
        if ref_c.shape[0] != len(pairs):
            raise ValueError(f"checkpoint {checkpoint} was written for {ref_c.shape[0]} pairs, got {len(pairs)}")
    else:
        ref_c, ref_r = _reference_logprobs(policy if reference is None else reference, enc, len(pairs),
                                           copy_policy=reference is None)
    params = [p for p in policy.parameters() if p.requires_grad]
    if not params:
        raise ValueError("policy has no trainable parameter")
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    per_epoch = -(-len(pairs) // (cfg.batch_size * cfg.grad_accum))
    total = per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine_fraction(s, total, cfg.warmup_frac, 0.0))
    hist = DPOHistory()
    steps: list[list[torch.Tensor]] = []
    for _ in range(cfg.epochs):
        batches = list(minibatches(len(pairs), cfg.batch_size, gen))
        steps.extend(batches[start:start + cfg.grad_accum] for start in range(0, len(batches), cfg.grad_accum))
    done = 0
    if state is not None:
        named = {n: p for n, p in policy.named_parameters() if p.requires_grad}
        with torch.no_grad():
            for n, p in named.items():
                p.copy_(state["params"][n])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        done = int(state["done"])
        hist = DPOHistory(loss=list(map(float, state["loss"])), margin=list(map(float, state["margin"])),
                          accuracy=list(map(float, state["accuracy"])))
    policy.train()
    for k in progress(range(done, len(steps)), desc="DPO steps", total=len(steps) - done):
        step_batches = steps[k]
        n_step = sum(len(b) for b in step_batches)
        opt.zero_grad(set_to_none=True)
        losses, margins = [], []
        for b in step_batches:
            pc = sequence_logprobs(_logits(policy, enc.chosen_ids[b], enc.chosen_mask[b]), enc.chosen_ids[b],
                                   enc.chosen_response[b])
            pr = sequence_logprobs(_logits(policy, enc.rejected_ids[b], enc.rejected_mask[b]), enc.rejected_ids[b],
                                   enc.rejected_response[b])
            loss, margin = dpo_loss(pc, pr, ref_c[b], ref_r[b], cfg.beta)
            (loss * len(b) / n_step).backward()
            losses.append(loss.item() * len(b))
            margins.append(margin)
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        m = torch.cat(margins)
        hist.loss.append(sum(losses) / n_step)
        hist.margin.append(m.mean().item())
        hist.accuracy.append((m > 0).float().mean().item())
        if checkpoint is not None and ((k + 1) % checkpoint_every == 0 or k + 1 == len(steps)):
            _save_checkpoint(checkpoint, policy, opt, sched, k + 1, hist, ref_c, ref_r)
    policy.eval()
    return hist


def _reference_logprobs(ref: torch.nn.Module, enc: EncodedPairs, n: int, copy_policy: bool):
    """Sequence log-probs ``[n]`` of the chosen and rejected responses under the (frozen) reference."""
    if copy_policy:
        ref = copy.deepcopy(ref)
    was_training = ref.training
    ref.eval()
    with torch.no_grad():
        ref_c = torch.cat([sequence_logprobs(_logits(ref, enc.chosen_ids[b], enc.chosen_mask[b]), enc.chosen_ids[b],
                                             enc.chosen_response[b]) for b in minibatches(n, 16, shuffle=False)])
        ref_r = torch.cat([sequence_logprobs(_logits(ref, enc.rejected_ids[b], enc.rejected_mask[b]),
                                             enc.rejected_ids[b], enc.rejected_response[b])
                           for b in minibatches(n, 16, shuffle=False)])
    if not copy_policy and was_training:
        ref.train()
    return ref_c, ref_r


# Not the training kit's checkpoint (interp.training.train_lm), on purpose: the kit saves the whole model's
# state_dict and one list of losses, while DPO resumes from the trainable (LoRA) parameters only (not the frozen
# base), the reference log-probs computed once before the first step, and three histories (loss, margin,
# accuracy); its public ``checkpoint`` is one ``.pt`` file. It uses the same primitives as the kit: interp.io's
# atomic write (atomic_write_bytes) and checked reader (load_torch, weights_only=True).
def _save_checkpoint(path, policy, opt, sched, done, hist, ref_c, ref_r) -> None:
    import io

    from interp.io import atomic_write_bytes

    buf = io.BytesIO()
    torch.save({"params": {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad},
                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "done": done,
                "loss": torch.tensor(hist.loss), "margin": torch.tensor(hist.margin),
                "accuracy": torch.tensor(hist.accuracy), "ref_c": ref_c, "ref_r": ref_r}, buf)
    atomic_write_bytes(path, buf.getvalue())

