"""GAVEL's CE detector: a windowed bidirectional GRU, its training, triggers and Youden-J calibration.

The network follows the official ``TopicRNN``: a bidirectional GRU (3 layers, hidden 256, dropout 0.3)
reads a window of 5 token features and a linear layer maps the output at the window's last time step to
one logit per CE. Training is multi-label BCE (Adam, lr 3e-4, batch 64, at most 25 epochs, early stopping
with patience 3 on a held-out 20 % split).

Inference (digest §2): a scored token span is cut into windows of ``window`` tokens with stride
``window``; a span whose length is not a multiple of the window gets one more window made of its last
``window`` tokens, and a span shorter than a window is one short window (choice: the official code works
on fixed windows and does not say what happens to the tail). Per CE ``c`` the *trigger* fires when at
least ``patience_c`` windows have ``sigmoid(logit_c) >= θ_c``; the continuous CE score is the maximum
window probability.

Choice (not in the official code): features are standardised per dimension with the training windows'
mean and standard deviation, stored in the detector. This is an affine map the first GRU layer could
learn, but it makes small CPU-scale training converge reliably across models whose readout scales
differ by orders of magnitude.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from interp.io import load_tensors_json, output_dir, save_tensors_json
from interp.progress import progress
from interp.results import Result

from .rules import Rule

__all__ = ["DetectorConfig", "WindowGRU", "CEDetector", "make_windows", "compute_triggers", "train_detector", "masked_bce",
           "CalibrationLabels", "labels_for_rule", "Calibration", "calibrate", "TrainingHistory"]


@dataclass
class DetectorConfig:
    """Hyper-parameters of the detector and its training (defaults: the official code's)."""

    window: int = 5
    hidden: int = 256
    rnn_layers: int = 3
    dropout: float = 0.3
    proj_dim: int | None = None  #: optional linear projection of the features before the GRU
    lr: float = 3e-4
    batch_size: int = 64
    max_epochs: int = 25
    early_stopping: int = 3  #: epochs without validation improvement before stopping
    val_fraction: float = 0.2
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("window", "hidden", "rnn_layers", "batch_size", "max_epochs", "early_stopping"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"DetectorConfig.{name} must be a positive integer, got {v!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"DetectorConfig.dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"DetectorConfig.val_fraction must be in (0, 1), got {self.val_fraction}")
        if not self.lr > 0:
            raise ValueError(f"DetectorConfig.lr must be positive, got {self.lr}")
        if self.proj_dim is not None and (not isinstance(self.proj_dim, int) or self.proj_dim < 1):
            raise ValueError(f"DetectorConfig.proj_dim must be None or a positive integer, got {self.proj_dim!r}")


class WindowGRU(nn.Module):
    """``[n, window, d_in]`` -> logits ``[n, n_labels]`` (bidirectional GRU, output at the last step)."""

    def __init__(self, d_in: int, n_labels: int, hidden: int = 256, rnn_layers: int = 3, dropout: float = 0.3,
                 proj_dim: int | None = None):
        super().__init__()
        self.register_buffer("mean", torch.zeros(d_in))
        self.register_buffer("std", torch.ones(d_in))
        self.proj = nn.Linear(d_in, proj_dim) if proj_dim else None
        self.rnn = nn.GRU(proj_dim or d_in, hidden, num_layers=rnn_layers, batch_first=True, bidirectional=True,
                          dropout=dropout if rnn_layers > 1 else 0.0)
        self.fc = nn.Linear(2 * hidden, n_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float() - self.mean) / self.std
        if self.proj is not None:
            x = self.proj(x)
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


def make_windows(feats: torch.Tensor, window: int = 5) -> torch.Tensor:
    """``[T, d]`` -> ``[W, min(window, T), d]``: stride-``window`` windows plus one ending at the last token
    when ``T`` is not a multiple of ``window`` (``T < window``: the whole span as one short window)."""
    if feats.dim() != 2 or feats.shape[0] == 0:
        raise ValueError(f"features must be [T>0, d], got {tuple(feats.shape)}")
    T = feats.shape[0]
    if T <= window:
        return feats[None]
    wins = feats[: T - T % window].reshape(T // window, window, -1)
    if T % window:
        wins = torch.cat([wins, feats[T - window:][None]], 0)
    return wins


def compute_triggers(probs: torch.Tensor, thresholds: torch.Tensor | float, patience: torch.Tensor | int = 1
                     ) -> torch.Tensor:
    """Per CE, whether at least ``patience`` windows have probability ``>= threshold``.

    ``probs [..., W, C]`` (window probabilities, padding windows as 0 or NaN), ``thresholds`` and
    ``patience`` scalars or ``[C]``. Returns a bool tensor ``[..., C]``.
    """
    probs = torch.nan_to_num(probs, nan=-1.0)
    thr = torch.as_tensor(thresholds, dtype=probs.dtype)
    pat = torch.as_tensor(patience)
    if (pat < 1).any():
        raise ValueError("patience must be at least 1")
    hits = (probs >= thr).sum(-2)
    return hits >= pat


@dataclass
class TrainingHistory(Result):
    """Per-epoch training and validation BCE of a detector fit."""

    train_loss: list[float]
    val_loss: list[float]
    best_epoch: int

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame({"epoch": range(1, len(self.train_loss) + 1), "train_loss": self.train_loss,
                             "val_loss": self.val_loss})

    def figure(self):
        import plotly.graph_objects as go
        df = self.to_frame()
        fig = go.Figure([go.Scatter(x=df.epoch, y=df.train_loss, name="train"),
                         go.Scatter(x=df.epoch, y=df.val_loss, name="validation")])
        fig.add_vline(x=self.best_epoch, line_dash="dot")
        fig.update_layout(title="GAVEL detector training (BCE)", xaxis_title="epoch", yaxis_title="BCE")
        return fig


def masked_bce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy over the known targets: ``logits``, ``targets [N, C]``, NaN targets left out
    (all targets known: equal to ``BCEWithLogitsLoss()``)."""
    known = ~torch.isnan(targets)
    loss = nn.functional.binary_cross_entropy_with_logits(logits, torch.nan_to_num(targets), reduction="none")
    return (loss * known).sum() / known.sum().clamp_min(1)


def train_detector(windows: torch.Tensor, targets: torch.Tensor, ces: Sequence[str], config: DetectorConfig | None = None,
                   spec=None) -> tuple["CEDetector", TrainingHistory]:
    """Fit a :class:`CEDetector` on labelled windows.

    ``windows [N, window, d]`` (full windows), ``targets [N, C]`` multi-label 0/1 (an all-zero row is a
    window showing none of the CEs; NaN marks a label left out of the loss, e.g. a window that only partly
    covers a CE's sentence). Returns the detector at its best validation epoch and the history.
    """
    config = config or DetectorConfig()
    ces = list(ces)
    if windows.dim() != 3 or targets.dim() != 2 or windows.shape[0] != targets.shape[0]:
        raise ValueError(f"windows must be [N, window, d] and targets [N, C] with the same N; got "
                         f"{tuple(windows.shape)} and {tuple(targets.shape)}")
    if targets.shape[1] != len(ces):
        raise ValueError(f"targets have {targets.shape[1]} columns but {len(ces)} CEs were named")
    if len(set(ces)) != len(ces):
        raise ValueError("CE names must be unique")
    n = windows.shape[0]
    if n < 2:
        raise ValueError("need at least 2 training windows")
    gen = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    perm = torch.randperm(n, generator=gen)
    n_val = max(1, int(round(n * config.val_fraction)))
    val, tr = perm[:n_val], perm[n_val:]
    x, y = windows.float(), targets.float()
    net = WindowGRU(x.shape[-1], len(ces), config.hidden, config.rnn_layers, config.dropout, config.proj_dim)
    flat = x[tr].reshape(-1, x.shape[-1])
    net.mean.copy_(flat.mean(0))
    net.std.copy_(flat.std(0).clamp_min(1e-6))
    opt = torch.optim.Adam(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    lossf = masked_bce
    best, best_state, best_epoch, bad = math.inf, None, 0, 0
    hist_tr, hist_val = [], []
    bar = progress(range(config.max_epochs), desc="gavel detector")
    for epoch in bar:
        net.train()
        order = tr[torch.randperm(len(tr), generator=gen)]
        total = 0.0
        for i in range(0, len(order), config.batch_size):
            idx = order[i:i + config.batch_size]
            opt.zero_grad()
            loss = lossf(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        net.eval()
        with torch.no_grad():
            vl = sum(lossf(net(x[val[i:i + 1024]]), y[val[i:i + 1024]]).item() * len(val[i:i + 1024])
                     for i in range(0, len(val), 1024)) / len(val)
        hist_tr.append(total / len(tr))
        hist_val.append(vl)
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(train=f"{hist_tr[-1]:.4f}", val=f"{vl:.4f}")
        if vl < best - 1e-6:
            best, best_epoch, bad = vl, epoch + 1, 0
            best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        else:
            bad += 1
            if bad >= config.early_stopping:
                break
    net.load_state_dict(best_state)
    net.eval()
    det = CEDetector(net, ces, config, spec=spec)
    return det, TrainingHistory(hist_tr, hist_val, best_epoch)


class CEDetector:
    """A trained window detector over a CE library, with per-CE thresholds θ and patience.

    ``spec`` (a :class:`~interp.probes.gavel.FeatureSpec`) records which readout it was trained on.
    """

    def __init__(self, net: WindowGRU, ces: Sequence[str], config: DetectorConfig, spec=None,
                 thresholds: torch.Tensor | None = None, patience: torch.Tensor | None = None):
        self.net, self.ces, self.config, self.spec = net.eval(), list(ces), config, spec
        C = len(self.ces)
        self.thresholds = torch.full((C,), 0.5) if thresholds is None else torch.as_tensor(thresholds).float()
        self.patience = torch.ones(C, dtype=torch.long) if patience is None else torch.as_tensor(patience).long()

    @property
    def window(self) -> int:
        return self.config.window

    def index(self, ce: str) -> int:
        try:
            return self.ces.index(ce)
        except ValueError:
            raise KeyError(f"unknown CE {ce!r}; this detector knows {', '.join(self.ces)}") from None

    @torch.no_grad()
    def window_logits(self, windows: torch.Tensor) -> torch.Tensor:
        """``[N, w, d]`` -> ``[N, C]``."""
        return torch.cat([self.net(windows[i:i + 4096]) for i in range(0, len(windows), 4096)]) \
            if len(windows) else torch.zeros(0, len(self.ces))

    @torch.no_grad()
    def sequence_probs(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Per scored span ``[T_i, d]``, window probabilities ``[W_i, C]`` (all spans' full windows in one batch)."""
        full, short, owners = [], [], []
        for i, f in enumerate(feats):
            w = make_windows(f, self.window)
            (full if w.shape[1] == self.window else short).append((i, w))
        out: list[torch.Tensor | None] = [None] * len(feats)
        if full:
            logits = self.window_logits(torch.cat([w for _, w in full])).sigmoid()
            sizes = [len(w) for _, w in full]
            for (i, _), p in zip(full, logits.split(sizes)):
                out[i] = p
        for i, w in short:
            out[i] = self.window_logits(w).sigmoid()
        return out  # type: ignore[return-value]

    def scores(self, probs: torch.Tensor) -> dict[str, float]:
        """CE scores ``s_c = max over windows of sigmoid(logit_c)`` from ``probs [W, C]``."""
        m = probs.max(0).values
        return {c: float(v) for c, v in zip(self.ces, m)}

    def fired(self, probs: torch.Tensor) -> set[str]:
        """CEs whose trigger fires on the windows ``probs [W, C]`` (calibrated θ and patience)."""
        trig = compute_triggers(probs, self.thresholds, self.patience)
        return {c for c, t in zip(self.ces, trig) if t}

    def evaluate(self, rule: Rule, probs: torch.Tensor) -> tuple[bool, float]:
        """``(rule fired on the triggers, continuous rule score)`` for one conversation's windows."""
        rule.check_ces(self.ces)
        return rule.evaluate(self.fired(probs)), rule.score(self.scores(probs))

    # ---------------------------------------------------------------------------------------- io
    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write ``detector.safetensors`` (weights, θ, patience) and ``detector.json`` (config, CEs, spec)."""
        tensors = {f"net.{k}": v for k, v in self.net.state_dict().items()}
        tensors["thresholds"], tensors["patience"] = self.thresholds, self.patience
        meta = {"schema_version": 1, "ces": self.ces, "config": asdict(self.config),
                "d_in": int(self.net.mean.shape[0]),
                "spec": None if self.spec is None else {"layers": list(self.spec.layers),
                                                        "group_kv": self.spec.group_kv}}
        with output_dir(path, overwrite=overwrite, writer="CEDetector.save") as tmp:
            save_tensors_json(tmp, tensors, meta, stem="detector")
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "CEDetector":
        """Read a detector written by :meth:`save`. The saved facts are untrusted: ``ces`` must be a list of
        CE names, the configuration is checked against the weights' shapes before the network is allocated
        (:func:`interp.io.build_checked`); otherwise :class:`interp.io.SerializationError` names the file."""
        from interp.io import SerializationError, build_checked, check_tensors

        from .features import FeatureSpec
        tensors, meta = load_tensors_json(path, stem="detector", what="CE detector",
                                          required=("ces", "config", "d_in", "spec"), tensors=("thresholds", "patience"))
        where = Path(path) / "detector.json"
        ces = meta["ces"]
        if not isinstance(ces, list) or not ces or not all(isinstance(c, str) and c for c in ces) \
                or len(set(ces)) != len(ces):
            raise SerializationError(f"{where}: 'ces' must be a non-empty list of distinct CE names, got {ces!r}")
        d_in = meta["d_in"]
        if not isinstance(d_in, int) or isinstance(d_in, bool) or d_in < 1:
            raise SerializationError(f"{where}: 'd_in' must be a positive integer, got {d_in!r}")
        try:
            if not isinstance(meta["config"], dict):
                raise TypeError(f"'config' must be an object, got {meta['config']!r}")
            cfg = DetectorConfig(**meta["config"])
            spec_meta = meta["spec"]
            if spec_meta is not None and not (isinstance(spec_meta, dict) and isinstance(spec_meta.get("layers"), list)
                                              and isinstance(spec_meta.get("group_kv"), bool)):
                raise TypeError(f"'spec' must be null or {{'layers': [...], 'group_kv': true|false}}, "
                                f"got {spec_meta!r}")
            spec = FeatureSpec(tuple(spec_meta["layers"]), spec_meta["group_kv"]) if spec_meta else None
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"{where}: {exc}") from None
        check_tensors(tensors, {"thresholds": ((len(ces),), None), "patience": ((len(ces),), None)},
                      Path(path) / "detector.safetensors")
        net = build_checked(lambda: WindowGRU(d_in, len(ces), cfg.hidden, cfg.rnn_layers, cfg.dropout, cfg.proj_dim),
                            {k[4:]: v for k, v in tensors.items() if k.startswith("net.")}, where)
        return cls(net, ces, cfg, spec, tensors["thresholds"], tensors["patience"])


# ------------------------------------------------------------------------------------ calibration
@dataclass(frozen=True)
class CalibrationLabels:
    """Label-level ground truth of one calibration dialogue (the official bucket semantics).

    ``required`` CEs must fire (fired: TP, else FN); in each ``any_of`` group, if some member fired the fired
    members are TP and the others TN, otherwise every member is FN; ``supporting`` CEs are neutral (fired:
    TP, else TN); every other CE is FP when it fires and TN otherwise.
    """

    required: frozenset[str] = frozenset()
    any_of: tuple[frozenset[str], ...] = ()
    supporting: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "required", frozenset(self.required))
        object.__setattr__(self, "supporting", frozenset(self.supporting))
        object.__setattr__(self, "any_of", tuple(frozenset(g) for g in self.any_of))
        union = frozenset().union(*self.any_of) if self.any_of else frozenset()
        if self.required & self.supporting or (self.required | self.supporting) & union:
            raise ValueError("a CE may be in only one of required, any_of and supporting")
        if sum(len(g) for g in self.any_of) != len(union):
            raise ValueError("a CE may be in only one any_of group")


def labels_for_rule(rule: Rule | None) -> CalibrationLabels:
    """Ground truth for a dialogue that shows ``rule`` (``None``: a negative dialogue, every CE outside).

    CEs every satisfying assignment needs (:attr:`Rule.required`) are required. In a rule without ``or``
    each other selector's remaining CEs form an any-of group (a ``k of g`` with k > 1 is treated as any-of:
    the official semantics have no k); CEs in several groups, CEs of rules with ``or`` that are not required
    on every branch, and the rule's supporting CEs are supporting (neutral). For the JSON form this is the
    official mapping exactly.
    """
    if rule is None:
        return CalibrationLabels()
    from .rules import Or, _selectors
    req = set(rule.required)
    sels = list(_selectors(rule.condition))
    has_or = any(isinstance(n, Or) for n in _nodes(rule.condition))
    groups: list[set[str]] = []
    sup = set(rule.supporting)
    for sel in sels:
        g = set(sel.ces) - req
        if not g:
            continue
        if has_or:  # on some branches only: neutral
            sup |= g
        else:
            groups.append(g)
    counts: dict[str, int] = {}
    for g in groups:
        for c in g:
            counts[c] = counts.get(c, 0) + 1
    shared = {c for c, n in counts.items() if n > 1}
    sup = (sup | shared) - req
    groups = [g - sup for g in groups if g - sup]
    return CalibrationLabels(frozenset(req), tuple(frozenset(g) for g in groups), frozenset(sup))


def _nodes(node):
    yield node
    for i in getattr(node, "items", ()):
        yield from _nodes(i)


@dataclass
class Calibration(Result):
    """The θ × patience sweep and the chosen values per CE (Youden's J = TPR − FPR)."""

    ces: list[str]
    thresholds_grid: list[float]
    patience_grid: list[int]
    tpr: torch.Tensor  #: [n_patience, n_thresholds, C]
    fpr: torch.Tensor  #: [n_patience, n_thresholds, C]
    threshold: list[float]
    patience: list[int]
    youden_j: list[float]

    def to_frame(self):
        import pandas as pd
        P, T, C = self.tpr.shape
        rows = [{"ce": self.ces[c], "patience": self.patience_grid[p], "threshold": self.thresholds_grid[t],
                 "tpr": float(self.tpr[p, t, c]), "fpr": float(self.fpr[p, t, c]),
                 "youden_j": float(self.tpr[p, t, c] - self.fpr[p, t, c])}
                for p in range(P) for t in range(T) for c in range(C)]
        return pd.DataFrame(rows)

    def figure(self):
        import plotly.express as px
        df = self.to_frame()
        df = df[df.patience == self.patience_grid[0]]
        fig = px.line(df, x="threshold", y="youden_j", color="ce",
                      title=f"GAVEL calibration: Youden's J (patience {self.patience_grid[0]})")
        return fig

    def apply(self, detector: CEDetector) -> CEDetector:
        if list(detector.ces) != list(self.ces):
            raise ValueError("calibration and detector have different CE lists")
        detector.thresholds = torch.tensor(self.threshold, dtype=torch.float32)
        detector.patience = torch.tensor(self.patience, dtype=torch.long)
        return detector


def _pad_probs(probs: Sequence[torch.Tensor]) -> torch.Tensor:
    W = max(p.shape[0] for p in probs)
    out = torch.full((len(probs), W, probs[0].shape[1]), float("nan"))
    for i, p in enumerate(probs):
        out[i, :len(p)] = p
    return out


def calibrate(detector: CEDetector, probs: Sequence[torch.Tensor], labels: Sequence[CalibrationLabels],
              thresholds: Sequence[float] | None = None, patience: Sequence[int] = (1,), tol: float = 0.01,
              apply: bool = True, tie: str = "largest") -> Calibration:
    """Choose θ_c and patience_c per CE by Youden's J on calibration dialogues.

    ``probs``: per dialogue, window probabilities ``[W_i, C]`` (:meth:`CEDetector.sequence_probs`);
    ``labels``: its :class:`CalibrationLabels`. Grid θ ∈ {0.05, 0.10, ..., 1.0} by default. As in the
    official code, among the grid points within ``tol·|max J|`` of the best J the largest threshold wins
    (``tie="largest"``); ``tie="middle"`` (not in the paper) takes the middle of those thresholds instead,
    which is less strict when a small calibration set leaves J flat over a wide range.
    A CE with no positive (or no negative) label anywhere gets TPR (FPR) 0 on the whole grid.
    """
    if len(probs) != len(labels) or not probs:
        raise ValueError("probs and labels must be non-empty and of the same length")
    ces, C = detector.ces, len(detector.ces)
    grid = [round(0.05 * i, 2) for i in range(1, 21)] if thresholds is None else [float(t) for t in thresholds]
    pats = [int(p) for p in patience]
    if any(p < 1 for p in pats):
        raise ValueError("patience values must be at least 1")
    if tie not in ("largest", "middle"):
        raise ValueError(f"tie must be 'largest' (official) or 'middle', got {tie!r}")
    idx = {c: i for i, c in enumerate(ces)}

    def mask(names) -> torch.Tensor:
        m = torch.zeros(C, dtype=torch.bool)
        for n in names:
            if n not in idx:
                raise ValueError(f"calibration label names unknown CE {n!r}")
            m[idx[n]] = True
        return m

    D = len(labels)
    G = max([len(lb.any_of) for lb in labels] + [1])
    req = torch.stack([mask(lb.required) for lb in labels])  # [D, C]
    sup = torch.stack([mask(lb.supporting) for lb in labels])
    grp = torch.zeros(D, G, C, dtype=torch.bool)
    for d, lb in enumerate(labels):
        for g, members in enumerate(lb.any_of):
            grp[d, g] = mask(members)
    anyu = grp.any(1)
    irr = ~(req | sup | anyu)
    P = _pad_probs(probs)  # [D, W, C]
    thr = torch.tensor(grid)
    hits = (torch.nan_to_num(P, nan=-1.0)[:, None] >= thr[None, :, None, None]).sum(2)  # [D, T, C]
    pat = torch.tensor(pats)
    pred = hits[None] >= pat[:, None, None, None]  # [Pn, D, T, C]
    gfired = (pred[..., None, :] & grp[None, :, None]).any(-1)  # [Pn, D, T, G]
    ce_gfired = (gfired[..., None] & grp[None, :, None]).any(-2)  # [Pn, D, T, C]
    r, s, a, i_ = (m[None, :, None] for m in (req, sup, anyu, irr))
    tp = pred & (r | s | a)
    fn = (~pred & r) | (a & ~ce_gfired)
    fp = pred & i_
    tn = (~pred & s) | (~pred & a & ce_gfired) | (~pred & i_)
    tpr = tp.sum(1) / (tp.sum(1) + fn.sum(1)).clamp_min(1)  # [Pn, T, C]
    fpr = fp.sum(1) / (fp.sum(1) + tn.sum(1)).clamp_min(1)
    J = (tpr - fpr).float()
    chosen_t, chosen_p, chosen_j = [], [], []
    for c in range(C):
        jc = J[..., c]
        best = jc.max()
        ok = jc >= best - tol * best.abs()
        # largest threshold among the near-best; then the smallest patience
        cand = [(grid[t], -pats[p], p, t) for p in range(len(pats)) for t in range(len(grid)) if ok[p, t]]
        if tie == "largest":
            _, _, p, t = max(cand)
        else:  # middle of the near-best thresholds at the smallest patience that reaches them
            pbest = min(-c[1] for c in cand)
            row = sorted(c for c in cand if -c[1] == pbest)
            _, _, p, t = row[len(row) // 2]
        chosen_t.append(grid[t])
        chosen_p.append(pats[p])
        chosen_j.append(float(jc[p, t]))
    cal = Calibration(list(ces), grid, pats, tpr.float(), fpr.float(), chosen_t, chosen_p, chosen_j)
    if apply:
        cal.apply(detector)
    return cal
