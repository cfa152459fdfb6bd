"""A real, short training run to audit: a tiny byte-level language model trained on the audit's built-in texts.

:func:`tiny_training_run` trains a 2-layer Llama (d_model 64, 4 heads, one token per byte) with the small-LM
trainer (:func:`interp.training.train_lm`) and saves a checkpoint at each requested step, as a Hugging Face
trainer lays them out::

    RUN/checkpoint-5/    config.json, model.safetensors, tokenizer files, trainer_state.json {"global_step": 5, ...}
    RUN/checkpoint-10/   ...

so that ``interp audit RUN --out RUN-report`` audits every checkpoint in step order (docs/audit.md, "Auditing a
training run"; the tests build their run with it). A few seconds on one CPU core.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence


def tiny_training_run(folder: str | Path, steps: Sequence[int] = (5, 10, 20, 40), seed: int = 0, n_layers: int = 2,
                      lr: float = 3e-3, batch_size: int = 8, max_length: int = 48) -> list[Path]:
    """Train a tiny byte-level Llama for ``max(steps)`` steps on the built-in audit texts and save a checkpoint
    ``folder/checkpoint-{step}`` after each step in ``steps`` (``0``: the random initialisation). Returns the
    checkpoint folders in step order. ``folder`` must not hold checkpoints already (``ValueError``)."""
    import torch
    import transformers as T

    from interp.testing import tiny_config, tiny_tokenizer
    from interp.training import LMTrainConfig, train_lm

    from interp.checks import AuditData

    steps = sorted({int(s) for s in steps})
    if not steps or steps[0] < 0:
        raise ValueError(f"steps must be non-negative integers, got {steps}")
    folder = Path(folder)
    targets = [folder / f"checkpoint-{s}" for s in steps]
    if any(t.exists() for t in targets):
        raise ValueError(f"{str(folder)!r} already holds checkpoints; use a new folder")
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / ".tokenizer"
    tok = tiny_tokenizer(scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    cfg = tiny_config("llama", n_layers=n_layers)
    torch.manual_seed(seed)
    model = getattr(T, cfg.architectures[0])(cfg)
    texts = AuditData.builtin().texts
    enc = tok(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)

    def batches():
        g = torch.Generator().manual_seed(seed)
        while True:
            idx = torch.randperm(len(texts), generator=g)[:batch_size]
            yield {"input_ids": enc["input_ids"][idx], "attention_mask": enc["attention_mask"][idx],
                   "labels": labels[idx]}

    losses: list[float] = []

    def save(step: int) -> None:
        out = folder / f"checkpoint-{step}"
        was_training = model.training
        model.eval()
        model.save_pretrained(out)
        tok.save_pretrained(out)
        state = {"global_step": step, "log_history": [{"step": i + 1, "loss": v} for i, v in enumerate(losses)]}
        (out / "trainer_state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
        model.train(was_training)

    if steps[0] == 0:
        save(0)
    if steps[-1] > 0:
        def on_step(i: int, loss: float) -> None:
            losses.append(loss)
            if i + 1 in steps:
                save(i + 1)

        train_lm(model, batches(), LMTrainConfig(steps=steps[-1], lr=lr, warmup=min(5, steps[-1])), on_step=on_step,
                 desc="tiny training run")
    return targets


__all__ = ["tiny_training_run"]
