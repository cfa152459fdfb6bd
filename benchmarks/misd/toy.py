"""The MisD digest's toy recipe (section 8's CPU-scale validation): an under-trained digits MLP stands in for a
VLM ("image embedding" = penultimate features, "text embedding" = the final layer's weight rows), a 16-per-class
calibration set and the rest of the held-out half as the test set. The method is :mod:`interp.models.misd`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from interp.models.common import digits_split, minibatches
from interp.training import set_seed
from interp.models.misd import LMNConfig, evaluate
from interp.progress import progress
from interp.results import Result

__all__ = ["MisDToyResult", "ToyClassifier", "ToyMisDConfig", "run_toy_seed", "toy_experiment",
           "train_toy_classifier"]


@dataclass
class ToyMisDConfig:
    """The digest's CPU recipe: an under-trained digits MLP (target accuracy ≈ 85–90 %), a 16-per-class
    calibration set, the rest of the held-out data as test, over ``seeds``."""

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    hidden: int = 32
    epochs: int = 4
    lr: float = 3e-3
    shots: int = 16
    lmn: LMNConfig = field(default_factory=LMNConfig)

    def __post_init__(self):
        if len(self.seeds) < 1:
            raise ValueError("seeds must not be empty")
        for name in ("hidden", "epochs", "shots"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass
class ToyClassifier:
    """Frozen toy classifier outputs: ``logits``/``emb``/``labels`` for the calibration and test sets;
    ``text_emb`` ``[C, hidden]`` = the rows of the final weight (the "class text embeddings")."""

    cal: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    text_emb: torch.Tensor


def train_toy_classifier(config: ToyMisDConfig, seed: int) -> ToyClassifier:
    """Under-train ``64 → hidden → hidden → 10`` on half the digits; split the rest into a ``shots``-per-class
    calibration set and a test set."""
    split = digits_split(seed=seed, test_size=0.5)
    g = set_seed(seed)
    body = nn.Sequential(nn.Linear(64, config.hidden), nn.ReLU(), nn.Linear(config.hidden, config.hidden), nn.ReLU())
    head = nn.Linear(config.hidden, 10)
    opt = torch.optim.Adam([*body.parameters(), *head.parameters()], lr=config.lr)
    for _ in range(config.epochs):
        for idx in minibatches(len(split.x_train), 32, g):
            loss = F.cross_entropy(head(body(split.x_train[idx])), split.y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        emb = body(split.x_test)
        logits = head(emb)
    y = split.y_test
    perm = torch.randperm(len(y), generator=g)
    cal_mask = torch.zeros(len(y), dtype=torch.bool)
    for c in range(10):
        cal_mask[perm[y[perm] == c][:config.shots]] = True
    return ToyClassifier(cal=(logits[cal_mask], emb[cal_mask], y[cal_mask]),
                         test=(logits[~cal_mask], emb[~cal_mask], y[~cal_mask]), text_emb=head.weight.detach().clone())


@dataclass
class MisDToyResult(Result):
    """Per-seed :class:`MisDTable` metrics of the toy recipe: ``tables[i]`` for ``seeds[i]``."""

    seeds: list[int]
    tables: list[dict[str, dict[str, float]]]
    argmax_unchanged: list[float]
    temperatures: list[float]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"seed": s, "method": m, **v} for s, t in zip(self.seeds, self.tables) for m, v in t.items()])

    def gain(self, metric: str = "auroc", over: str = "msp", method: str = "lmn") -> np.ndarray:
        """Per-seed ``metric(method) − metric(over)`` ``[n_seeds]``."""
        return np.array([t[method][metric] - t[over][metric] for t in self.tables])

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        df = self.to_frame()
        fig = make_subplots(rows=1, cols=3, subplot_titles=("AUROC ↑", "FPR@90%TPR-errors ↓", "AURC ↓"))
        for c, k in enumerate(("auroc", "fpr90", "aurc"), start=1):
            fig.add_trace(go.Box(x=df["method"], y=df[k], boxpoints="all", name=k, showlegend=False), row=1, col=c)
        fig.update_layout(title="MisD on the toy digits classifier (per seed)", height=400)
        return fig


def run_toy_seed(config: ToyMisDConfig, seed: int) -> dict:
    """One seed of the toy validation: train the toy classifier, fit the baselines and LMNs on the calibration set
    and evaluate on the test set. Returns ``{"table": {method: metrics}, "argmax_unchanged", "temperature"}``."""
    clf = train_toy_classifier(config, seed)
    table = evaluate(clf.cal, clf.test, clf.text_emb, dataclasses.replace(config.lmn, seed=seed), label=f"seed {seed}")
    return {"table": table.metrics, "argmax_unchanged": table.argmax_unchanged, "temperature": table.temperature}


def toy_experiment(config: ToyMisDConfig | None = None) -> MisDToyResult:
    """Run the digest's toy validation over ``config.seeds`` (:func:`run_toy_seed` per seed)."""
    config = config or ToyMisDConfig()
    outs = [run_toy_seed(config, s) for s in progress(list(config.seeds), desc="misd seeds")]
    return MisDToyResult(seeds=list(config.seeds), tables=[o["table"] for o in outs],
                         argmax_unchanged=[o["argmax_unchanged"] for o in outs],
                         temperatures=[o["temperature"] for o in outs])
