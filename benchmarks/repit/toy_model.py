"""``zoo:toy-refusal``: the builder that trains the 2-layer "category refusal" Llama of the RepIt validation
(the papers digest, section 1). Its language, splits, tokenizer and first-token judge are data, in
:mod:`interp.benchmarks.repit.toy_data`; the entry and its config are :mod:`.zoo`; this module only builds and
trains the model.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp.data.refusal import Instruction

from .toy_data import (HARMFUL_CATEGORIES, HARMLESS_KINDS, _sample, first_token_accuracy, instructions,
                                make_tokenizer, response)
from .zoo import TOY_REFUSAL, ToyRefusalConfig  # noqa: F401  (TOY_REFUSAL: its old place)


def _encode(tokenizer, items: Sequence[Instruction]):
    """``(input_ids, labels)`` of prompt + response, loss on the response tokens only (equal lengths)."""
    import torch

    from interp.data.refusal import format_chat

    # one tokenizer call per batch (per-item calls were half the build's time); the same ids
    prompts = tokenizer([format_chat(tokenizer, it.text) for it in items], add_special_tokens=False)["input_ids"]
    replies = tokenizer([" " + response(it) + " <eos>" for it in items], add_special_tokens=False)["input_ids"]
    ids = [prompt + reply for prompt, reply in zip(prompts, replies)]
    labels = [[-100] * len(prompt) + reply for prompt, reply in zip(prompts, replies)]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    ids = [x + [pad] * (width - len(x)) for x in ids]
    labels = [x + [-100] * (width - len(x)) for x in labels]
    return torch.tensor(ids), torch.tensor(labels)


def _stream_batch(rng: random.Random, n: int, exclude: set[str]) -> list[Instruction]:
    """``n`` fresh training requests (half harmful, categories and harmless kinds uniform), none in ``exclude``."""
    out = []
    while len(out) < n:
        cat = rng.choice(HARMFUL_CATEGORIES)
        harmful = rng.random() < 0.5
        text = _sample(rng, cat, "harmful" if harmful else rng.choice(HARMLESS_KINDS))
        if text not in exclude:
            out.append(Instruction(text=text, category=cat if harmful else "harmless", harmful=harmful,
                                   split="train"))
    return out


def build_toy_refusal(out: Path, params: Mapping[str, Any]) -> dict:
    """Train the toy refusal model and save it with its tokenizer (raises if it does not learn the rule)."""
    from interp.training import limit_threads

    cfg = ToyRefusalConfig.from_params(params)
    with limit_threads(cfg.num_threads, blas=False):
        return _train(out, cfg)


def _train(out: Path, cfg: ToyRefusalConfig) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from interp.training import LMTrainConfig, quiet_transformers, train_lm

    torch.manual_seed(cfg.seed)
    tok = make_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=cfg.d_model, intermediate_size=cfg.d_mlp,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_heads, max_position_embeddings=64,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    with quiet_transformers():
        model = LlamaForCausalLM(config)
    for i in cfg.attention_only_layers:
        mlp = model.model.layers[i].mlp
        torch.nn.init.zeros_(mlp.down_proj.weight)
        mlp.requires_grad_(False)
    held_out = {x.text for x in instructions() if x.split != "train"}
    rng = random.Random(f"toy-refusal/train/{cfg.seed}")

    def batches():
        for _ in range(cfg.steps):
            ids, labels = _encode(tok, _stream_batch(rng, cfg.batch_size, held_out))
            yield {"input_ids": ids, "labels": labels}  # loss on the response tokens only

    losses = train_lm(model, batches(), LMTrainConfig(steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup,
                                                    weight_decay=cfg.weight_decay),
                      desc="toy-refusal: training")  # the frozen MLPs (requires_grad False) are not optimised
    model.eval()
    metrics = {f"test_{k}": v for k, v in first_token_accuracy(model, tok, instructions("test")).items()}
    if not metrics["test_accuracy"] >= cfg.min_accuracy:
        raise RuntimeError(f"toy-refusal training did not learn the rule: held-out first-token accuracy "
                           f"{metrics['test_accuracy']:.3f} (need >= {cfg.min_accuracy}); metrics {metrics}")
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    metrics.update(final_train_loss=sum(losses[-50:]) / 50, n_params=sum(p.numel() for p in model.parameters()))
    return metrics


__all__ = ["TOY_REFUSAL", "ToyRefusalConfig", "build_toy_refusal"]  # the first two: their old place
