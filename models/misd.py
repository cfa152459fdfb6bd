"""Revisiting Confidence Calibration for Misclassification Detection in VLMs (ICLR 2026, OpenReview d8WMoi571f).

Calibration caps misclassification detection (MisD): under perfect calibration ``f(s) = s`` the precision of
flagging "correct" on ``[r, 1]`` is ``E[s | s >= r] < 1``. The paper therefore recalibrates confidences
towards a *sharper* target reliability curve, the normalised sigmoid::

    Ψ_λ(s) = [σ((s − 0.5)/λ) − σ(−0.5/λ)] / [σ(0.5/λ) − σ(−0.5/λ)]          (default λ = 0.05)

with a post-hoc **Lightweight Meta Network** (LMN) on a frozen classifier. The LMN reads
``[logits z, image embedding ξ(x), text embedding of the predicted class ψ(t_p)]`` and outputs an
instance temperature ``τ > 0``; the recalibrated logits are ``z' = τ · z`` so the argmax (and accuracy)
never changes. It is trained on a small (16-shot) labelled calibration set with a surrogate loss that
sharpens low-confidence correct samples (CE weighted by ``1 − Ψ(s)``) and flattens high-confidence wrong
samples towards the uniform distribution (the full-probability constraint, KL(U ‖ p') weighted by
``Ψ(s)``), fused by φ ∈ {sum, product} with balance β.

What is here: :func:`psi`; :class:`LMN` and :func:`surrogate_loss` / :func:`fit_lmn`; the baselines
maximum softmax probability (MSP), global temperature scaling (:func:`fit_temperature`, NLL) and the
LMN trained with CE only; the metrics :func:`auroc` (correct vs wrong), :func:`fpr_at_tpr_errors`
(FPR at 90 % TPR of errors) and :func:`aurc`; :func:`evaluate` (one table over methods). The digest's toy
recipe (an under-trained digits MLP standing in for a VLM) and the CLIP-style zero-shot classifier built from
DINOv2 + MiniLM are the reproduction recipe ``interp reproduce misd`` (``benchmarks/misd/``).

Choices where the digest says UNKNOWN / UNCERTAIN (all documented):

* *Loss (Eq. 8).* ``L = β·mean_correct[(1 − Ψ(s))·CE(p', y)] + (1 − β)·mean_wrong[Ψ(s)·KL(U ‖ p')]``
  with ``s = max p'`` (φ = sum, β = 0.6); φ = product multiplies the two means. The weights ``Ψ(s)`` and
  ``1 − Ψ(s)`` are treated as constants (detached): they select which samples to push, the CE / KL terms
  do the pushing. A set without correct (or wrong) samples drops that term.
* *LMN.* ``Linear(in, 16) → ReLU → Linear(16, 1)``; ``τ = softplus(·) + 1e-3`` initialised so that
  ``τ ≈ 1`` (the final bias is ``log(e − 1)``, the final weight is zero). Inputs are the logits, the
  L2-normalised image embedding and the L2-normalised text embedding of the predicted class.
* *Optimiser.* Adam, lr 1e-2, full-batch, 300 steps, weight decay 1e-4 (training takes about a second).
* *MisD score.* The max softmax probability of the (recalibrated) logits; errors are the positive class
  for FPR@90: the threshold flags 90 % of the errors, the FPR is the share of correct samples also flagged.
* *AURC.* Mean selective risk over the n coverages obtained by sorting by decreasing confidence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from interp.results import Result
from interp.training import set_seed

# the Fashion-MNIST loader lives in models.common; re-exported for code that reads it from here (raptor's recipe)
from .common import FASHION_MNIST_ROOT, has_fashion_mnist, load_fashion_mnist  # noqa: F401

__all__ = [
    "psi", "LMN", "LMNConfig", "surrogate_loss", "fit_lmn", "fit_temperature", "auroc", "fpr_at_tpr_errors",
    "aurc", "misd_metrics", "evaluate", "MisDTable",
]

Fusion = Literal["sum", "product"]
LossKind = Literal["surrogate", "ce"]


# --------------------------------------------------------------------------- target curve and metrics

def psi(s: torch.Tensor | float, lam: float = 0.05) -> torch.Tensor:
    """The normalised-sigmoid target curve Ψ_λ(s) on ``[0, 1]`` (any shape); Ψ(0)=0, Ψ(0.5)=0.5, Ψ(1)=1."""
    if lam <= 0:
        raise ValueError(f"lam must be > 0, got {lam}")
    s = torch.as_tensor(s, dtype=torch.float64 if not torch.is_tensor(s) else None)
    lo, hi = torch.sigmoid(torch.tensor(-0.5 / lam, dtype=s.dtype)), torch.sigmoid(torch.tensor(0.5 / lam, dtype=s.dtype))
    return (torch.sigmoid((s - 0.5) / lam) - lo) / (hi - lo)


def _as_np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if torch.is_tensor(x) else np.asarray(x)


def _check_scores(conf, correct) -> tuple[np.ndarray, np.ndarray]:
    conf, correct = _as_np(conf).astype(np.float64).ravel(), _as_np(correct).astype(bool).ravel()
    if conf.shape != correct.shape:
        raise ValueError(f"confidence {conf.shape} and correct {correct.shape} must have the same length")
    if correct.all() or not correct.any():
        raise ValueError("MisD metrics need both correct and wrong samples")
    return conf, correct


def auroc(conf, correct) -> float:
    """AUROC of separating correct (positive) from wrong samples by ``conf`` ``[n]`` (ties count 1/2)."""
    from scipy.stats import rankdata

    conf, correct = _check_scores(conf, correct)
    r = rankdata(conf)
    n_pos, n_neg = correct.sum(), (~correct).sum()
    return float((r[correct].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def fpr_at_tpr_errors(conf, correct, tpr: float = 0.9) -> float:
    """FPR at ``tpr`` TPR of errors: flag samples with ``conf <= t`` where ``t`` is the smallest threshold that
    flags at least ``tpr`` of the wrong samples; return the share of correct samples flagged."""
    if not 0 < tpr <= 1:
        raise ValueError(f"tpr must be in (0, 1], got {tpr}")
    conf, correct = _check_scores(conf, correct)
    wrong = np.sort(conf[~correct])
    t = wrong[int(math.ceil(tpr * len(wrong))) - 1]
    return float((conf[correct] <= t).mean())


def aurc(conf, correct) -> float:
    """Area under the risk-coverage curve: mean selective error over coverages 1/n..n/n (sorted by conf)."""
    conf, correct = _check_scores(conf, correct)
    order = np.argsort(-conf, kind="stable")
    err = np.cumsum(~correct[order]) / np.arange(1, len(conf) + 1)
    return float(err.mean())


def misd_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``{"accuracy", "auroc", "fpr90", "aurc", "ece"}`` of MSP on ``logits`` ``[n, C]``."""
    p = logits.double().softmax(-1)
    conf, pred = p.max(-1)
    correct = pred == labels
    bins = torch.clamp((conf * 15).long(), max=14)
    ece = sum(float((bins == b).sum()) / len(conf) * abs(float(correct[bins == b].double().mean() - conf[bins == b].mean()))
              for b in range(15) if (bins == b).any())
    return {"accuracy": float(correct.double().mean()), "auroc": auroc(conf, correct),
            "fpr90": fpr_at_tpr_errors(conf, correct), "aurc": aurc(conf, correct), "ece": ece}


# --------------------------------------------------------------------------- LMN

@dataclass
class LMNConfig:
    """LMN and surrogate-loss hyper-parameters (paper defaults λ = 0.05, β = 0.6, φ = sum)."""

    lam: float = 0.05
    beta: float = 0.6
    fusion: Fusion = "sum"
    hidden: int = 16
    lr: float = 1e-2
    weight_decay: float = 1e-4
    steps: int = 300
    seed: int = 0

    def __post_init__(self):
        if self.lam <= 0:
            raise ValueError(f"lam must be > 0, got {self.lam}")
        if not 0 <= self.beta <= 1:
            raise ValueError(f"beta must be in [0, 1], got {self.beta}")
        if self.fusion not in ("sum", "product"):
            raise ValueError(f"fusion must be 'sum' or 'product', got {self.fusion!r}")
        for name in ("hidden", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(f"lr must be > 0 and weight_decay >= 0, got {self.lr}, {self.weight_decay}")


class LMN(nn.Module):
    """Lightweight meta network: ``[z, ξ(x), ψ(t_pred)]`` -> instance temperature ``τ > 0``.

    ``forward(logits [n, C], image_emb [n, d_i], text_emb [C, d_t])`` returns the recalibrated logits
    ``τ · z`` ``[n, C]``; :meth:`temperature` returns ``τ`` ``[n]``.
    """

    def __init__(self, n_classes: int, d_image: int, d_text: int, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_classes + d_image + d_text, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        nn.init.zeros_(self.net[2].weight)
        nn.init.constant_(self.net[2].bias, math.log(math.e - 1))  # softplus(b) = 1: start at τ = 1

    def temperature(self, logits: torch.Tensor, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        if logits.dim() != 2 or image_emb.dim() != 2 or text_emb.dim() != 2:
            raise ValueError("logits [n, C], image_emb [n, d_i] and text_emb [C, d_t] must be 2-D")
        if len(image_emb) != len(logits) or len(text_emb) != logits.shape[1]:
            raise ValueError(f"shapes disagree: logits {tuple(logits.shape)}, image_emb {tuple(image_emb.shape)}, "
                             f"text_emb {tuple(text_emb.shape)} (needs one text row per class)")
        t_pred = F.normalize(text_emb, dim=-1)[logits.argmax(-1)]
        x = torch.cat([logits, F.normalize(image_emb, dim=-1), t_pred], -1)
        return F.softplus(self.net(x)).squeeze(-1) + 1e-3

    def forward(self, logits: torch.Tensor, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        return self.temperature(logits, image_emb, text_emb)[:, None] * logits


def surrogate_loss(logits: torch.Tensor, labels: torch.Tensor, lam: float = 0.05, beta: float = 0.6,
                   fusion: Fusion = "sum") -> torch.Tensor:
    """The surrogate loss on recalibrated ``logits`` ``[n, C]`` (see the module docstring for the form)."""
    logp = logits.log_softmax(-1)
    s = logp.exp().max(-1).values
    w = psi(s.detach(), lam)
    correct = logits.argmax(-1) == labels
    zero = logits.sum() * 0
    ce = F.nll_loss(logp, labels, reduction="none")
    kl_u = -math.log(logits.shape[1]) - logp.mean(-1)  # KL(U || p')
    l_c = ((1 - w) * ce)[correct].mean() if correct.any() else zero
    l_w = (w * kl_u)[~correct].mean() if (~correct).any() else zero
    if fusion == "product":
        return l_c * l_w
    return beta * l_c + (1 - beta) * l_w


def fit_lmn(logits: torch.Tensor, image_emb: torch.Tensor, text_emb: torch.Tensor, labels: torch.Tensor,
            config: LMNConfig | None = None, loss: LossKind = "surrogate") -> LMN:
    """Train an :class:`LMN` on a calibration set (frozen classifier outputs) with the surrogate or CE loss."""
    config = config or LMNConfig()
    if loss not in ("surrogate", "ce"):
        raise ValueError(f"loss must be 'surrogate' or 'ce', got {loss!r}")
    set_seed(config.seed)
    logits, image_emb, text_emb = logits.float().detach(), image_emb.float().detach(), text_emb.float().detach()
    model = LMN(logits.shape[1], image_emb.shape[1], text_emb.shape[1], config.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    for _ in range(config.steps):
        z = model(logits, image_emb, text_emb)
        value = (surrogate_loss(z, labels, config.lam, config.beta, config.fusion) if loss == "surrogate"
                 else F.cross_entropy(z, labels))
        opt.zero_grad()
        value.backward()
        opt.step()
    return model.eval()


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Global temperature ``T`` minimising the NLL of ``logits / T`` (LBFGS on ``log T``)."""
    log_t = torch.zeros((), requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")
    z = logits.detach().double()

    def closure():
        opt.zero_grad()
        value = F.cross_entropy(z / log_t.double().exp(), labels)
        value.backward()
        return value

    opt.step(closure)
    return float(log_t.detach().exp())


# --------------------------------------------------------------------------- evaluation

@dataclass
class MisDTable(Result):
    """MisD metrics per method: ``metrics[method] = {"accuracy", "auroc", "fpr90", "aurc", "ece"}``."""

    metrics: dict[str, dict[str, float]]
    temperature: float = 1.0
    argmax_unchanged: float = 1.0
    label: str = ""

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"method": m, **v} for m, v in self.metrics.items()])

    def figure(self):
        import plotly.graph_objects as go

        df = self.to_frame()
        fig = go.Figure([go.Bar(x=df["method"], y=df[k], name=k) for k in ("auroc", "fpr90", "aurc")])
        fig.update_layout(barmode="group", title=f"misclassification detection {self.label}".strip())
        return fig


def evaluate(cal: tuple[torch.Tensor, torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
             text_emb: torch.Tensor, config: LMNConfig | None = None, label: str = "") -> MisDTable:
    """Fit the baselines and LMNs on ``cal = (logits [n, C], image_emb [n, d], labels [n])`` and report the
    test metrics of MSP, temperature scaling, LMN (CE only) and LMN (surrogate) on ``test``."""
    config = config or LMNConfig()
    (zc, ec, yc), (zt, et, yt) = cal, test
    T = fit_temperature(zc, yc)
    lmn = fit_lmn(zc, ec, text_emb, yc, config, "surrogate")
    lmn_ce = fit_lmn(zc, ec, text_emb, yc, config, "ce")
    with torch.no_grad():
        z_lmn = lmn(zt.float(), et.float(), text_emb.float())
        z_ce = lmn_ce(zt.float(), et.float(), text_emb.float())
    unchanged = float((z_lmn.argmax(-1) == zt.argmax(-1)).double().mean())
    metrics = {"msp": misd_metrics(zt, yt), "temperature": misd_metrics(zt / T, yt),
               "lmn_ce": misd_metrics(z_ce, yt), "lmn": misd_metrics(z_lmn, yt)}
    return MisDTable(metrics=metrics, temperature=T, argmax_unchanged=unchanged, label=label)
