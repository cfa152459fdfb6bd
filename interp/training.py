"""The training kit: everything the small models of the zoo, the recipes and ``models/`` train with.

* **Seeding**: :func:`set_seed` (Python, NumPy and torch, plus a seeded ``torch.Generator``).
* **Threads**: :func:`limit_threads` caps torch's intra-op threads (and, with ``blas=True``, the BLAS/OpenMP
  pools of NumPy/SciPy) for a block and restores them.
* **Schedules**: :func:`warmup_cosine` (warm-up over a number of steps, cosine to a floor at ``steps``) and
  :func:`warmup_cosine_fraction` (warm-up over a fraction of the run, cosine to a floor at the last step).
* **Tokenizers**: :func:`word_level_tokenizer`, the fast tokenizer of a synthetic task (a fixed vocabulary of
  whitespace-separated words, ``<bos>`` prepended).
* **The small-LM trainer**: :func:`train_lm` with :class:`LMTrainConfig`: AdamW (or Adam), linear warm-up then
  cosine decay (or torch's one-cycle schedule, or a step -> factor function of one's own), gradient clipping, a
  progress bar, and (with ``checkpoint=``) atomic checkpoints and resumption after an interruption that gives the
  same weights as an uninterrupted run. It trains the zoo's small language models and the recipes' toy models
  (toy-grammar, the planning models, toy-refusal, the GAVEL CE world, the protein MLMs, the TCPE facts and code
  toys, the CopyPaste toy, the POLCA addition model).
* :func:`quiet_transformers`: silence transformers' logging and progress bars while building a model.

This module is part of the kernel: it imports nothing from the applications, the zoo or the analyzers.
``interp.zoo.training`` and the training helpers of ``interp.models.common`` re-export these names for one
release.
"""
from __future__ import annotations

import contextlib
import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

# ------------------------------------------------------------------------------------------------ seeding
def set_seed(seed: int):
    """Seed Python, NumPy and torch; return a ``torch.Generator`` seeded the same way."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------ threads
@contextlib.contextmanager
def limit_threads(num_threads: int | None, *, blas: bool = True) -> Iterator[None]:
    """Run the block with ``num_threads`` intra-op torch threads and, when ``blas``, the BLAS/OpenMP pools of
    NumPy/SciPy capped to the same number (threadpoolctl); ``None``: change nothing. Restores the old counts.

    Small-matrix workloads (batched QR, tiny einsums, small models) run far faster single-threaded on a busy CPU,
    where spinning threads otherwise dominate. ``blas=False`` caps torch only (what the zoo builders and the
    recipes' ``threads`` option have always done: their results were recorded that way).
    """
    if num_threads is None:
        yield
        return
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be an integer >= 1 or None, got {num_threads!r}")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        if blas:
            from threadpoolctl import threadpool_limits

            with threadpool_limits(limits=num_threads):
                yield
        else:
            yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own logging and progress bars inside the block (ours report progress)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    root_level = logging.getLogger("transformers").level
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
        logging.getLogger("transformers").setLevel(root_level)


# ------------------------------------------------------------------------------------------------ tokenizers
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
#: what a training checkpoint consists of (``train_state.json`` is written last)
_CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "train_state.json")


def word_level_tokenizer(vocab: Mapping[str, int] | Sequence[str], *, bos: str | None = "<bos>",
                         eos: str | None = "<eos>", pad: str | None = "<pad>", unk: str = "<unk>",
                         add_bos: bool = True, split_punctuation: bool = False, cleanup: bool = False,
                         additional_special_tokens: Sequence[str] = ()):
    """A ``PreTrainedTokenizerFast`` over a fixed word vocabulary (whitespace-split; ``<bos>`` prepended when
    ``add_bos``; decoding joins words with spaces).

    ``vocab``: ``{word: id}`` (ids as given), or a list of words (ids in list order). Every special token named
    (``additional_special_tokens`` included) must be in the vocabulary: a missing one is a ``ValueError`` naming
    it (``unk`` always). ``split_punctuation``: split runs of punctuation off words as well (the ``Whitespace``
    pre-tokenizer, ``"help."`` -> ``help .``) instead of splitting on white space only. ``cleanup``: decoding
    also removes the space before punctuation and in contractions (``"a ."`` -> ``"a."``, the WordPiece
    decoder's cleanup).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = dict(vocab) if isinstance(vocab, Mapping) else {w: i for i, w in enumerate(vocab)}
    if len(set(ids.values())) != len(ids):
        raise ValueError("word_level_tokenizer: two words share an id")
    extra = list(additional_special_tokens)
    missing = [t for t in (bos, eos, pad, unk, *extra) if t is not None and t not in ids]
    if missing:
        raise ValueError(f"word_level_tokenizer: special token(s) {missing} are not in the vocabulary")
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace() if split_punctuation else pre_tokenizers.WhitespaceSplit()
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                           special_tokens=[(bos, ids[bos])])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=cleanup)
    named: dict[str, Any] = {k: v for k, v in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad),
                                               ("unk_token", unk)) if v is not None}
    if extra:
        named["additional_special_tokens"] = extra
    return PreTrainedTokenizerFast(tokenizer_object=tok, **named)


#: the learning-rate schedules of :class:`LMTrainConfig`
SCHEDULES = ("warmup_cosine", "one_cycle", "constant")
#: the optimizers of :class:`LMTrainConfig`
OPTIMIZERS = ("adamw", "adam")


@dataclass(frozen=True)
class LMTrainConfig:
    """The optimisation of :func:`train_lm`: AdamW(``lr``, ``betas``, ``weight_decay``) (``optimizer="adam"``:
    torch's Adam, with ``weight_decay`` as its L2 penalty), a learning-rate schedule, gradient norm clipped to
    ``clip`` (``None``: no clipping).

    ``schedule="warmup_cosine"`` (default): ``warmup`` steps of linear warm-up then cosine decay to
    ``floor * lr`` at ``steps`` (:func:`warmup_cosine`). ``schedule="one_cycle"``: torch's ``OneCycleLR``
    (max ``lr``, ``pct_start`` of the steps rising from ``lr / 25``, then cosine annealing to ``lr / 25e4``; it
    also cycles AdamW's first beta between 0.95 and 0.85, so ``betas[0]`` is unused); ``warmup`` and ``floor``
    are then unused, as ``pct_start`` is with the default schedule. ``schedule="constant"``: ``lr`` throughout
    (``warmup``, ``floor``, ``pct_start`` unused). ``schedule`` may also be a function
    ``step -> factor`` (0-based step; the learning rate is ``lr * factor``, torch's ``LambdaLR``) for a schedule
    of one's own; ``warmup``, ``floor`` and ``pct_start`` are then unused.
    """

    steps: int
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    clip: float | None = 1.0
    floor: float = 0.05
    schedule: str | Callable[[int], float] = "warmup_cosine"
    pct_start: float = 0.1
    optimizer: str = "adamw"

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0 or not self.lr > 0:
            raise ValueError(f"LMTrainConfig needs steps >= 1, warmup >= 0 and lr > 0, got {self}")
        if not callable(self.schedule) and self.schedule not in SCHEDULES:
            raise ValueError(f"LMTrainConfig.schedule must be one of {SCHEDULES} or a function step -> factor, "
                             f"got {self.schedule!r}")
        if not 0 < self.pct_start < 1:
            raise ValueError(f"LMTrainConfig.pct_start must be in (0, 1), got {self.pct_start}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"LMTrainConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")

    def make_optimizer(self, params: Sequence[Any]):
        """The optimizer of this config over ``params``."""
        import torch

        kind = torch.optim.AdamW if self.optimizer == "adamw" else torch.optim.Adam
        return kind(params, lr=self.lr, weight_decay=self.weight_decay, betas=self.betas)

    def scheduler(self, optimizer: Any):
        """The learning-rate scheduler of this config on ``optimizer`` (stepped once per training step)."""
        import torch

        if callable(self.schedule):
            return torch.optim.lr_scheduler.LambdaLR(optimizer, self.schedule)
        if self.schedule == "constant":
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        if self.schedule == "one_cycle":
            return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.lr, total_steps=self.steps,
                                                       pct_start=self.pct_start)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: warmup_cosine(s, self.warmup, self.steps, self.floor))


def warmup_cosine(step: int, warmup: int, steps: int, floor: float = 0.05) -> float:
    """The learning-rate factor at ``step``: linear warm-up over ``warmup`` steps, then cosine from 1 to ``floor``."""
    if step < warmup:
        return (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac))


def warmup_cosine_fraction(step: int, total_steps: int, warmup_frac: float = 0.1, final_frac: float = 0.1) -> float:
    """The learning-rate factor at ``step`` (0-based): linear warm-up over ``warmup_frac`` of the run
    (``round(warmup_frac * total_steps)`` steps), then a cosine decay from 1 to ``final_frac`` reached at the *last*
    step (``total_steps - 1``).

    The same curve as :func:`warmup_cosine` with the warm-up given as a fraction, except where the floor is reached
    (:func:`warmup_cosine` reaches it one step after the last, at ``steps``) and that the cosine is NumPy's: the
    ``models/`` papers, the protein MLMs and the CopyPaste toy were trained (and their records written) with this
    one, so it stays bit for bit as it was.
    """
    import numpy as np

    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    warmup = int(round(warmup_frac * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    span = max(total_steps - 1 - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return final_frac + (1.0 - final_frac) * 0.5 * (1.0 + float(np.cos(np.pi * progress)))


def default_loss(model: Any, batch: Any):
    """Causal-LM loss of a Hugging Face model: ``batch`` is ``{input_ids, labels, ...}`` or a tensor of ids
    (labels = ids)."""
    if isinstance(batch, Mapping):
        return model(**batch).loss
    return model(input_ids=batch, labels=batch).loss


def train_lm(model: Any, batches: Iterable[Any], cfg: LMTrainConfig, *, params: Iterable[Any] | None = None,
             loss_fn: Callable[[Any, Any], Any] = default_loss, desc: str = "training",
             checkpoint: str | Path | None = None, every: int = 200,
             on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Train ``model`` for ``cfg.steps`` steps on ``batches`` (an iterable yielding one batch per step, in a
    fixed order); returns the per-step losses.

    ``params``: the parameters to optimise (default: all of the model's). ``loss_fn(model, batch)`` returns
    the scalar loss (default: the Hugging Face causal-LM loss). ``checkpoint``: a folder where the model,
    optimizer and schedule state and the losses so far are saved atomically every ``every`` steps; a run
    started again with the same folder resumes from the last checkpoint (the batch iterator is advanced past
    the batches already used, so the data order, and hence the result, is that of an uninterrupted run).
    When training completes the checkpoint files are removed (anything else in the folder stays).
    """
    import torch

    from .progress import progress

    params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
    opt = cfg.make_optimizer(params)
    sched = cfg.scheduler(opt)
    losses: list[float] = []
    start = 0
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None and (ckpt / "train_state.json").is_file():
        start, losses = _load_checkpoint(ckpt, model, opt, sched)
    it: Iterator[Any] = iter(batches)
    for _ in range(start):  # the batches the interrupted run used
        next(it)
    model.train()
    for step in progress(range(start, cfg.steps), desc=desc, total=cfg.steps, initial=start):
        try:
            batch = next(it)
        except StopIteration:
            raise ValueError(f"train_lm: the batches ran out after {step} of {cfg.steps} steps") from None
        loss = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
        if ckpt is not None and (step + 1) % every == 0 and step + 1 < cfg.steps:
            _save_checkpoint(ckpt, model, opt, sched, step + 1, losses)
    model.eval()
    if ckpt is not None:  # remove only what the checkpoints wrote, then the folder if that leaves it empty
        for name in _CHECKPOINT_FILES:
            (ckpt / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            ckpt.rmdir()
    return losses


def _save_checkpoint(folder: Path, model: Any, opt: Any, sched: Any, step: int, losses: list[float]) -> None:
    import io
    import json

    import torch
    from safetensors.torch import save

    from .io import atomic_write_bytes, atomic_write_text

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(folder / "model.safetensors", save(_untie(state)))
    buf = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, buf)
    atomic_write_bytes(folder / "optimizer.pt", buf.getvalue())
    atomic_write_text(folder / "train_state.json", json.dumps({"step": step, "losses": losses}))  # written last


def _untie(state: dict) -> dict:
    """safetensors refuses shared storage (tied embeddings): give each tensor its own copy."""
    seen: dict[int, str] = {}
    out = {}
    for k, v in state.items():
        ptr = v.untyped_storage().data_ptr() if v.numel() else id(v)
        out[k] = v.clone() if ptr in seen else v
        seen.setdefault(ptr, k)
    return out


def _load_checkpoint(folder: Path, model: Any, opt: Any, sched: Any) -> tuple[int, list[float]]:
    """Restore a checkpoint :func:`_save_checkpoint` wrote; returns ``(step, losses)``.

    Every failure is a :class:`interp.io.SerializationError` naming the folder and saying to delete it:
    the three files are read first (JSON, safetensors, ``torch.load(weights_only=True)`` through
    :func:`interp.io.load_torch`, so a pickle payload, a truncated or foreign file is refused the same way),
    their fields checked, and only then loaded into the model, optimizer and schedule.
    """
    from .io import SerializationError, load_json, load_tensors, load_torch

    def unreadable(why: object) -> SerializationError:  # one line: torch's load_state_dict errors span several
        return SerializationError(f"{folder}: training checkpoint is unreadable ({' '.join(str(why).split())}); "
                                  "delete it to start over")

    try:
        meta = load_json(folder / "train_state.json", what="training checkpoint", required=("step", "losses"))
        state, _ = load_tensors(folder / "model.safetensors", what="training checkpoint")
        extra = load_torch(folder / "optimizer.pt", what="training checkpoint")
    except SerializationError as exc:
        raise unreadable(exc) from None
    step, losses = meta["step"], meta["losses"]
    if not isinstance(step, int) or isinstance(step, bool):
        raise unreadable(f"'step' must be an integer, got {step!r}")
    if not isinstance(losses, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses):
        raise unreadable(f"'losses' must be a list of numbers, got {type(losses).__name__}")
    losses = [float(x) for x in losses]
    if not isinstance(extra, dict) or not {"optimizer", "scheduler"} <= set(extra):
        raise unreadable("optimizer.pt does not hold the optimizer and scheduler states")
    if not 0 < step or len(losses) != step:
        raise unreadable(f"train_state.json: step {step} and {len(losses)} losses disagree")
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if k not in state]:
            raise ValueError(f"checkpoint does not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
        opt.load_state_dict(extra["optimizer"])
        sched.load_state_dict(extra["scheduler"])
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError, AttributeError) as exc:
        raise unreadable(exc) from None
    return step, losses


__all__ = ["LMTrainConfig", "OPTIMIZERS", "SCHEDULES", "SPECIALS", "default_loss", "limit_threads", "quiet_transformers",
           "set_seed", "train_lm", "warmup_cosine", "warmup_cosine_fraction", "word_level_tokenizer"]
