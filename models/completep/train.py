"""Training an ensemble of Complete(d)P GPTs: per-member hyperparameters, schedule, divergence, evaluation."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from interp.progress import progress
from interp.training import warmup_cosine_fraction

from .config import GPTConfig, HParams, ModuleMultipliers
from .data import CharCorpus
from .model import EnsembleGPT
from .optim import EnsembleAdamW, TensorHParams
from .parameterization import tensor_rule


@dataclass
class MemberSpec:
    """One ensemble member: base hyperparameters (already SDE-scaled if wanted), per-module multipliers and
    the seed of its initial weights."""

    hp: HParams = field(default_factory=HParams)
    multipliers: ModuleMultipliers | None = None
    seed: int = 0


def tensor_hparams(model: EnsembleGPT, members: list[MemberSpec]) -> list[TensorHParams]:
    """Per-tensor AdamW hyperparameters ``[E]`` = base value x parameterization rule x module/depth multiplier.

    ``beta`` multipliers act on ``1 - beta`` (clipped to ``[0, 1]``)."""
    cfg, L = model.cfg, model.cfg.depth
    out = []
    for _, info in model.param_infos():
        rule = tensor_rule(info.kind, cfg)
        cols: dict[str, list[float]] = {k: [] for k in ("lr", "wd", "beta1", "beta2", "eps")}
        for spec in members:
            mult = spec.multipliers or ModuleMultipliers()

            def z(h: str) -> float:
                return mult.factor(h, info.module, info.layer, L)

            cols["lr"].append(spec.hp.lr * rule.lr * z("lr"))
            cols["wd"].append(spec.hp.weight_decay * rule.wd * z("wd"))
            cols["beta1"].append(1.0 - min((1.0 - spec.hp.beta1) * z("beta1"), 1.0))
            cols["beta2"].append(1.0 - min((1.0 - spec.hp.beta2) * z("beta2"), 1.0))
            cols["eps"].append(spec.hp.eps * rule.eps * z("eps"))
        out.append(TensorHParams(**{k: torch.tensor(v, dtype=torch.float32) for k, v in cols.items()}))
    return out


@dataclass
class EnsembleRun:
    """Outcome of :func:`train_ensemble` for ``E`` members.

    ``val_loss`` ``[E]`` (NaN for diverged members), ``train_loss`` ``[E, steps]`` (cross-entropy of each
    step's batch, NaN after divergence), ``grad_norm`` ``[E, steps]`` (global gradient norm of the objective
    before clipping, NaN after divergence), ``diverged`` ``[E]`` and, when recorded, ``stats[name]``
    ``[steps + 1, E]`` activation RMS values (row ``t`` measured after ``t`` updates).
    """

    val_loss: np.ndarray
    train_loss: np.ndarray
    diverged: np.ndarray
    grad_norm: np.ndarray
    stats: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def final_train_loss(self) -> np.ndarray:
        """Mean training cross-entropy over the last 10% of the steps ``[E]``."""
        k = max(1, self.train_loss.shape[1] // 10)
        return self.train_loss[:, -k:].mean(1)


def train_ensemble(cfg: GPTConfig, members: list[MemberSpec], corpus: CharCorpus, steps: int,
                   batch_size: int, data_seed: int = 0, eval_sequences: int = 128,
                   record_stats: bool = False, divergence_loss: float | None = None,
                   desc: str | None = None) -> EnsembleRun:
    """Train ``len(members)`` GPTs of shape ``cfg`` side by side on the same batches; evaluate on held-out text.

    The LR factor follows :func:`interp.training.warmup_cosine_fraction` with each member's ``warmup_frac`` and
    ``final_lr_frac``. The objective is cross-entropy plus ``z_loss * mean(logsumexp^2)``; its gradient is
    clipped to each member's ``grad_clip`` (global norm over the member's parameters, as the CompleteP reference
    code clips; ``None`` = no clipping) before the AdamW step. A member whose
    batch cross-entropy becomes non-finite or exceeds ``divergence_loss`` (default ``2 ln V``, twice the
    loss of a uniform prediction) is stopped and reported as diverged.
    """
    if not members:
        raise ValueError("train_ensemble needs at least one member")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    if cfg.vocab_size != corpus.vocab_size:
        raise ValueError(f"cfg.vocab_size={cfg.vocab_size} but the corpus has {corpus.vocab_size} symbols")
    E = len(members)
    model = EnsembleGPT(cfg, E)
    model.configure([m.hp.init_std for m in members], [m.multipliers for m in members], [m.seed for m in members])
    opt = EnsembleAdamW([p for p, _ in model.param_infos()], tensor_hparams(model, members))
    limit = 2.0 * math.log(cfg.vocab_size) if divergence_loss is None else divergence_loss
    z_coef = torch.tensor([m.hp.z_loss for m in members])
    clip = torch.tensor([math.inf if m.hp.grad_clip is None else m.hp.grad_clip for m in members])
    gen = torch.Generator().manual_seed(int(data_seed))
    alive = torch.arange(E)  # original index of each member still in the ensemble
    train_loss = np.full((E, steps), np.nan)
    grad_norm = np.full((E, steps), np.nan)
    stats: dict[str, list[np.ndarray]] = {}

    def add_stats(record: dict[str, torch.Tensor]) -> None:
        for k, v in record.items():
            row = np.full(E, np.nan)
            row[alive.numpy()] = v.numpy()
            stats.setdefault(k, []).append(row)

    for step in progress(range(steps), desc=desc or f"train w{cfg.width} d{cfg.depth} x{E}", total=steps):
        x, y = corpus.batch(batch_size, cfg.seq_len, gen)
        record: dict[str, torch.Tensor] | None = {} if record_stats else None
        ce, z = model.loss(x, y, record=record)
        with torch.no_grad():
            ok = torch.isfinite(ce) & (ce <= limit)
            train_loss[alive.numpy(), step] = torch.where(ok, ce.detach(), torch.nan).numpy()
        if record is not None:
            add_stats(record)
        if not ok.all():  # drop diverged members: they stop costing compute and cannot poison anything
            if not ok.any():
                alive = alive[:0]
                break
            model.keep_members(ok)
            opt.keep_members(ok, [p for p, _ in model.param_infos()])
            alive, z_coef, clip = alive[ok], z_coef[ok], clip[ok]
            ce, z = model.loss(x, y)  # recompute on the surviving members (the old graph is stale)
        opt.zero_grad()
        (ce + z_coef * z).sum().backward()
        grad_norm[alive.numpy(), step] = opt.clip_grad_norm_(clip).numpy()
        sched = torch.tensor([warmup_cosine_fraction(step, steps, members[i].hp.warmup_frac, members[i].hp.final_lr_frac)
                              for i in alive.tolist()])
        opt.step(sched)

    val = np.full(E, np.nan)
    if alive.numel():
        val[alive.numpy()] = evaluate(model, corpus, eval_sequences)
        if record_stats:
            with torch.no_grad():
                record = {}
                x, y = corpus.batch(batch_size, cfg.seq_len, gen)
                model.loss(x, y, record=record)
                add_stats(record)
    diverged = np.ones(E, dtype=bool)
    diverged[alive.numpy()] = False
    return EnsembleRun(val_loss=val, train_loss=train_loss, diverged=diverged, grad_norm=grad_norm,
                       stats={k: np.stack(v) for k, v in stats.items()})


@torch.no_grad()
def evaluate(model: EnsembleGPT, corpus: CharCorpus, n_sequences: int = 128, chunk: int = 32) -> np.ndarray:
    """Mean held-out cross-entropy per member ``[E]`` over ``n_sequences`` fixed validation windows."""
    x, y = corpus.eval_windows(n_sequences, model.cfg.seq_len)
    total = torch.zeros(model.n_members)
    for start in range(0, n_sequences, chunk):
        ce, _ = model.loss(x[start:start + chunk], y[start:start + chunk])
        total += ce * x[start:start + chunk].shape[0]
    return (total / n_sequences).numpy().astype(float)
