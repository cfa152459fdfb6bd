"""The A1W1 digits validation of denoising dequantization (models digest, section 6): a 64-256-256-10 MLP with
1-bit weights and activations trained with the straight-through estimator (STE), with ridge dequantization,
and with ridge dequantization plus 2:4 weight sparsity, over several seeds; plus a stability probe at a large
learning rate. The method (quantizers, ridge dequantizer, drop-in layers) is :mod:`interp.models.dequantization`.

Definitions (our reading of the digest): a run *diverges* when its loss becomes non-finite or its last-epoch
training loss is above the first epoch's; the *epoch-to-epoch loss variance* is ``var(diff(epoch losses))``
after the first 10 % of epochs (the log-loss version is reported too). Variants: ``ste`` and ``ridge`` use 1-bit
affine weights; ``ridge_2:4`` uses 1-bit *linear* weights with 2:4 sparsity (ternary codes; sparsity needs the
linear transform); ``ste_linear`` / ``ridge_linear`` / ``fp32`` are extra references.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from interp.models.common import accuracy, digits_split, minibatches
from interp.training import set_seed
from interp.models.dequantization import DequantLinear, Method, QuantSpec, Transform, make_mlp
from interp.progress import progress
from interp.results import Result

__all__ = ["VARIANTS", "DequantConfig", "DequantResult", "RunStats", "assemble", "experiment", "loss_roughness",
           "run_seed", "train_digits"]

VARIANTS = {
    # name: (method, weight transform, sparsity)
    "fp32": ("none", "affine", None),
    "ste": ("ste", "affine", None),
    "ste_linear": ("ste", "linear", None),
    "ridge": ("ridge", "affine", None),
    "ridge_linear": ("ridge", "linear", None),
    "ridge_2:4": ("ridge", "linear", (2, 4)),
}


@dataclass
class DequantConfig:
    """A1W1 digits recipe (paper: λ = 0.01, the full-precision baseline's hyperparameters unchanged;
    digest's CPU recipe: 64-256-256-10 MLP, 1-bit weights and activations, block 64, Adam, 200 epochs,
    5 seeds). ``stability_lr``: an extra run of STE and ridge at a large learning rate (``None`` skips it)."""

    sizes: tuple[int, ...] = (64, 256, 256, 10)
    weight_bits: float = 1
    act_bits: float = 1
    act_transform: Transform = "affine"
    block_size: int = 64
    lam: float = 0.01
    quantize_input: bool = False
    detach_x_stats: bool = False
    epochs: int = 200
    batch_size: int = 64
    lr: float = 1e-3
    test_size: float = 0.2
    methods: tuple[str, ...] = ("ste", "ridge", "ridge_2:4")
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    roughness_from: float = 0.1  # drop this fraction of epochs before measuring loss variance
    stability_lr: float | None = 5e-2
    stability_epochs: int = 30
    stability_methods: tuple[str, ...] = ("ste", "ridge")

    def __post_init__(self) -> None:
        unknown = [m for m in (*self.methods, *self.stability_methods) if m not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; choose from {sorted(VARIANTS)}")
        if self.epochs < 1 or self.batch_size < 1 or self.stability_epochs < 1 or not self.seeds:
            raise ValueError("epochs, stability_epochs and batch_size must be >= 1 and seeds non-empty")
        if self.lr <= 0 or (self.stability_lr is not None and self.stability_lr <= 0):
            raise ValueError("learning rates must be > 0")

    def specs(self, name: str) -> tuple[Method, QuantSpec | None, QuantSpec | None]:
        """The (method, weight spec, activation spec) of a named variant."""
        method, w_transform, sparsity = VARIANTS[name]
        if method == "none":
            return "none", None, None
        wspec = QuantSpec(self.weight_bits, w_transform, self.block_size, sparsity)
        aspec = QuantSpec(self.act_bits, self.act_transform, self.block_size)
        return method, wspec, aspec


@dataclass
class RunStats:
    """One training run: per-epoch mean training loss ``[epochs]`` (NaN after a non-finite loss), final
    test accuracy (NaN if diverged to non-finite), divergence flag."""

    losses: np.ndarray
    test_accuracy: float
    diverged: bool


def train_digits(config: DequantConfig, variant: str, seed: int, lr: float | None = None,
                 epochs: int | None = None) -> RunStats:
    """Train the quantized MLP ``variant`` on digits with Adam; reproducible for a given ``seed``.

    A run *diverges* when a loss becomes non-finite or the last epoch's training loss exceeds the first's.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    lr = config.lr if lr is None else lr
    epochs = config.epochs if epochs is None else epochs
    data = digits_split(seed=seed, test_size=config.test_size)
    gen = set_seed(seed)
    method, wspec, aspec = config.specs(variant)
    net = make_mlp(config.sizes, wspec, aspec, method, config.lam, config.quantize_input)
    for m in net.modules():
        if isinstance(m, DequantLinear):
            m.detach_x_stats = config.detach_x_stats
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    n = len(data.y_train)
    losses = np.full(epochs, np.nan)
    diverged = False
    for epoch in progress(range(epochs), desc=f"{variant} seed {seed}", total=epochs):
        total = 0.0
        for idx in minibatches(n, config.batch_size, gen):
            loss = F.cross_entropy(net(data.x_train[idx]), data.y_train[idx])
            if not torch.isfinite(loss):
                diverged = True
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        if diverged:
            break
        losses[epoch] = total / n
    with torch.no_grad():
        acc = accuracy(net(data.x_test), data.y_test) if not diverged else float("nan")
    if not diverged:
        diverged = bool(losses[-1] > losses[0])  # trained into a worse state than after one epoch
    return RunStats(losses=losses, test_accuracy=acc, diverged=diverged)


def loss_roughness(losses: np.ndarray, skip: float = 0.1, log: bool = False) -> float:
    """Epoch-to-epoch loss variance: ``var(diff(losses))`` after dropping the first ``skip`` fraction of
    epochs (``log=True``: of ``log(losses)``, i.e. relative changes). NaN if the curve is not finite."""
    v = np.asarray(losses, dtype=np.float64)[int(len(losses) * skip):]
    if v.size < 3 or not np.isfinite(v).all() or (log and (v <= 0).any()):
        return float("nan")
    return float(np.var(np.diff(np.log(v) if log else v)))


def _mean_acc(values: Sequence[float]) -> float:
    a = np.asarray(values, dtype=np.float64)
    return float(np.where(np.isfinite(a), a, 0.1).mean())


@dataclass
class DequantResult(Result):
    """Digits A1W1 comparison. Per variant: ``accuracy`` test accuracy per seed ``[n_seeds]``; ``losses``
    training loss ``[n_seeds, epochs]``; ``diverged`` one flag per seed; ``roughness`` / ``log_roughness``
    epoch-to-epoch variance of the loss / log-loss per seed. ``stability_*``: the same variants trained at
    ``stability_lr`` (empty when skipped)."""

    variants: list[str]
    seeds: list[int]
    accuracy: dict[str, list[float]]
    losses: dict[str, np.ndarray]
    diverged: dict[str, list[bool]]
    roughness: dict[str, list[float]]
    log_roughness: dict[str, list[float]]
    stability_lr: float | None = None
    stability_accuracy: dict[str, list[float]] = field(default_factory=dict)
    stability_losses: dict[str, np.ndarray] = field(default_factory=dict)
    stability_diverged: dict[str, list[bool]] = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def mean_accuracy(self, variant: str) -> float:
        """Mean test accuracy over seeds (a run that ended non-finite counts as chance, 0.1)."""
        return _mean_acc(self.accuracy[variant])

    def mean_roughness(self, variant: str, log: bool = False) -> float:
        return float(np.nanmean(np.asarray((self.log_roughness if log else self.roughness)[variant], dtype=np.float64)))

    def to_frame(self) -> pd.DataFrame:
        rows = [{"run": "main", "variant": v, "seed": s, "test_accuracy": self.accuracy[v][i],
                 "diverged": self.diverged[v][i], "loss_roughness": self.roughness[v][i],
                 "log_loss_roughness": self.log_roughness[v][i],
                 "final_loss": float(np.asarray(self.losses[v])[i, -1])}
                for v in self.variants for i, s in enumerate(self.seeds)]
        rows += [{"run": f"lr={self.stability_lr}", "variant": v, "seed": s,
                  "test_accuracy": self.stability_accuracy[v][i], "diverged": self.stability_diverged[v][i],
                  "final_loss": float(np.asarray(self.stability_losses[v])[i, -1])}
                 for v in self.stability_accuracy for i, s in enumerate(self.seeds)]
        return pd.DataFrame(rows)

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=1, cols=3, subplot_titles=(
            "training loss (mean over seeds)", "test accuracy",
            f"training loss at lr={self.stability_lr}" if self.stability_lr else "(no stability run)"))
        palette = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3"]
        colors = {v: palette[k % len(palette)] for k, v in enumerate(dict.fromkeys([*self.variants,
                                                                                   *self.stability_losses]))}
        for v in self.variants:
            L = np.asarray(self.losses[v], dtype=np.float64)
            fig.add_trace(go.Scatter(y=np.nanmean(L, 0), name=v, mode="lines", line=dict(color=colors[v]),
                                     legendgroup=v), row=1, col=1)
            fig.add_trace(go.Box(y=self.accuracy[v], name=v, marker_color=colors[v], boxpoints="all",
                                 legendgroup=v, showlegend=False), row=1, col=2)
        for v, L in self.stability_losses.items():
            L = np.asarray(L, dtype=np.float64)
            for i in range(L.shape[0]):
                fig.add_trace(go.Scatter(y=L[i], mode="lines", line=dict(color=colors[v], width=1),
                                         legendgroup=v, showlegend=False, name=f"{v} seed {self.seeds[i]}"),
                              row=1, col=3)
        for c in (1, 3):
            fig.update_xaxes(title_text="epoch", row=1, col=c)
            fig.update_yaxes(title_text="cross-entropy", type="log", row=1, col=c)
        fig.update_layout(title="A1W1 MLP on digits: ridge dequantization vs STE", height=420)
        return fig


def _stats_dict(r: RunStats) -> dict:
    return {"losses": np.asarray(r.losses, dtype=np.float64), "test_accuracy": float(r.test_accuracy),
            "diverged": bool(r.diverged)}


def run_seed(config: DequantConfig, seed: int) -> dict:
    """Every run of one seed: ``{"main": {variant: run}, "stability": {variant: run}}`` where a run is
    ``{"losses": [epochs], "test_accuracy": float, "diverged": bool}`` (the stability runs at
    ``config.stability_lr``; empty when it is ``None``)."""
    main = {v: _stats_dict(train_digits(config, v, seed)) for v in config.methods}
    stability = {}
    if config.stability_lr is not None:
        stability = {v: _stats_dict(train_digits(config, v, seed, lr=config.stability_lr,
                                                  epochs=config.stability_epochs))
                     for v in config.stability_methods}
    return {"main": main, "stability": stability}


def assemble(config: DequantConfig, per_seed: Sequence[dict]) -> DequantResult:
    """The :class:`DequantResult` of the per-seed outputs of :func:`run_seed` (in ``config.seeds`` order)."""
    seeds = list(config.seeds)
    if len(per_seed) != len(seeds):
        raise ValueError(f"expected one output per seed ({len(seeds)}), got {len(per_seed)}")
    acc, losses, div, rough, lrough = {}, {}, {}, {}, {}
    for v in config.methods:
        rs = [p["main"][v] for p in per_seed]
        acc[v] = [float(r["test_accuracy"]) for r in rs]
        losses[v] = np.stack([np.asarray(r["losses"], dtype=np.float64) for r in rs])
        div[v] = [bool(r["diverged"]) for r in rs]
        rough[v] = [loss_roughness(r["losses"], config.roughness_from) for r in rs]
        lrough[v] = [loss_roughness(r["losses"], config.roughness_from, log=True) for r in rs]
    s_acc, s_losses, s_div = {}, {}, {}
    if config.stability_lr is not None:
        for v in config.stability_methods:
            rs = [p["stability"][v] for p in per_seed]
            s_acc[v] = [float(r["test_accuracy"]) for r in rs]
            s_losses[v] = np.stack([np.asarray(r["losses"], dtype=np.float64) for r in rs])
            s_div[v] = [bool(r["diverged"]) for r in rs]
    cfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(config).items()}
    return DequantResult(variants=list(config.methods), seeds=seeds, accuracy=acc, losses=losses, diverged=div,
                         roughness=rough, log_roughness=lrough, stability_lr=config.stability_lr,
                         stability_accuracy=s_acc, stability_losses=s_losses, stability_diverged=s_div, config=cfg)


def experiment(config: DequantConfig | None = None) -> DequantResult:
    """Train every variant in ``config.methods`` for every seed (accuracy, loss curves, divergence, loss
    roughness), then the ``stability_methods`` at ``stability_lr``."""
    config = config or DequantConfig()
    return assemble(config, [run_seed(config, s) for s in progress(config.seeds, desc="dequantization seeds")])
