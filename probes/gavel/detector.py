"""GAVEL's CE detector: a windowed bidirectional GRU, its training, triggers and Youden-J calibration.

The network follows the official ``TopicRNN``: a bidirectional GRU (3 layers, hidden 256, dropout 0.3)
reads a window of 5 token features and a linear layer maps the output at the window's last time step to
one logit per CE. Training is multi-label BCE (Adam, lr 3e-4, batch 64; the shipped config trains 10
epochs with early stopping after 3 epochs without validation improvement).

Each option below has the official behaviour as its default and ours as a named alternative
(:class:`DetectorConfig`):

- training split (``split``): ``"ordered"`` (official) puts, per class, the first 80 % of the conversations
  (or windows, when no conversation ids are given) in the order given into training and the rest into
  validation (the official script shuffles each CE's conversations once, seed 42, then cuts at 80 %);
  ``"random"`` (ours before) splits windows at random, so neighbouring windows of one conversation leak
  between the splits;
- class balance (``balance``): ``"cap"`` (official) caps every class (a window's target pattern) to the
  count of the smallest single-CE class, in training and in validation; ``"none"`` keeps every window;
- returned weights (``restore``): ``"official"`` returns the last epoch unless early stopping fired, then
  the last checkpoint the official loop saved (a new lowest validation loss, or from the 5th epoch on a loss
  at most the lowest since then); ``"best"`` (ours before) returns the lowest-validation-loss epoch;
- window layout (``window_layout``): ``"official"`` cuts each scored run (one assistant turn) into
  stride-``window`` windows, the short tail window scored unpadded; ``"overlap"`` (ours before) joins all
  scored tokens into one span and adds a full window ending at its last token instead of a short tail;
- inference patience (``inference_patience``): ``False`` (official: evaluation fires a CE on one window
  above θ, whatever patience calibration chose); ``True`` (ours before) applies the calibrated patience;
- calibration protocol (``calibration``): ``"official"`` counts only use-case-level dialogues (a rule's
  scenario; :class:`CalibrationLabels` ``kind="usecase"``) in TPR/FPR; ``"all"`` (ours before) also counts
  CE-level and CE-free dialogues, where every firing outside a rule is a false positive.

Per CE ``c`` the *trigger* fires when at least ``patience_c`` windows have ``sigmoid(logit_c) >= θ_c``;
the continuous CE score is the maximum window probability. Training windows are full windows
(:func:`make_windows`: stride ``window`` plus one ending at the span's last token; the official training
instead zero-pads the short tail window, a difference kept because the CE-world labels are cut that way).

Choice (not in the official code): features are standardised per dimension with the training windows'
mean and standard deviation, stored in the detector. This is an affine map the first GRU layer could
learn, but it makes small CPU-scale training converge reliably across models whose readout scales
differ by orders of magnitude.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from interp.io import load_tensors_json, output_dir, save_tensors_json
from interp.progress import progress
from interp.results import Result

from .rules import Rule

__all__ = ["DetectorConfig", "WindowGRU", "CEDetector", "make_windows", "window_bounds", "compute_triggers",
           "train_detector", "masked_bce", "split_train_val", "balance_classes",
           "CalibrationLabels", "labels_for_rule", "Calibration", "calibrate", "TrainingHistory"]


@dataclass
class DetectorConfig:
    """Hyper-parameters of the detector, its training and its inference (defaults: the official code's; the
    alternatives named in the module docstring are ours)."""

    window: int = 5
    hidden: int = 256
    rnn_layers: int = 3
    dropout: float = 0.3
    proj_dim: int | None = None  #: optional linear projection of the features before the GRU
    lr: float = 3e-4
    batch_size: int = 64
    max_epochs: int = 10  #: the shipped config's 10 (the function's own default, 25, was ours before)
    early_stopping: int = 3  #: epochs without validation improvement before stopping
    val_fraction: float = 0.2
    weight_decay: float = 0.0
    seed: int = 0
    split: str = "ordered"  #: ``ordered`` (official, per class the first 80 %) or ``random`` (ours, by window)
    balance: str = "cap"  #: ``cap`` (official: classes capped to equal counts) or ``none``
    restore: str = "official"  #: ``official`` (last epoch unless early stopping fired) or ``best`` (ours)
    window_layout: str = "official"  #: ``official`` (per turn, short tail unpadded) or ``overlap`` (ours)
    inference_patience: bool = False  #: apply calibrated patience at inference (ours); official: 1 window
    calibration: str = "official"  #: ``official`` (use-case-level dialogues only) or ``all`` (ours)

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
        for name, allowed in (("split", ("ordered", "random")), ("balance", ("cap", "none")),
                              ("restore", ("official", "best")), ("window_layout", ("official", "overlap")),
                              ("calibration", ("official", "all"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"DetectorConfig.{name} must be one of {allowed} (the first is the official "
                                 f"behaviour), got {getattr(self, name)!r}")
        if not isinstance(self.inference_patience, bool):
            raise ValueError(f"DetectorConfig.inference_patience must be a bool, got {self.inference_patience!r}")

    @classmethod
    def ours(cls, **kw) -> "DetectorConfig":
        """Every option at our earlier behaviour (random window split, no class cap, best epoch, overlapping
        tail window over one joined span, calibrated patience at inference, all calibration dialogues)."""
        base = dict(split="random", balance="none", restore="best", window_layout="overlap",
                    inference_patience=True, calibration="all")
        return cls(**{**base, **kw})


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


def window_bounds(T: int, window: int = 5, runs: Sequence[int] | None = None, layout: str = "official"
                  ) -> list[tuple[int, int]]:
    """``[(start, end)]`` windows over a scored span of ``T`` tokens, in order.

    ``layout="official"``: each run (``runs``: lengths of the assistant turns, summing to ``T``; ``None``: one
    run) is cut into windows ``[s, min(s + window, end))`` for ``s = start, start + window, ...``, so a run's
    tail window is short (unpadded). ``layout="overlap"`` (ours before): the runs are joined into one span cut
    as :func:`make_windows` does (full windows plus one ending at the last token). E.g. ``T=12, window=5,
    runs=[7, 5]``: official ``(0,5) (5,7) (7,12)``; overlap ``(0,5) (5,10) (7,12)``.
    """
    if T < 1:
        raise ValueError(f"a scored span needs at least one token, got T={T}")
    if layout == "overlap" or runs is None:
        runs = [T]
    runs = [int(r) for r in runs]
    if any(r < 1 for r in runs) or sum(runs) != T:
        raise ValueError(f"runs {runs} must be positive lengths summing to the span's {T} tokens")
    if layout == "overlap":
        if T <= window:
            return [(0, T)]
        out = [(s, s + window) for s in range(0, T - T % window, window)]
        return out + ([(T - window, T)] if T % window else [])
    if layout != "official":
        raise ValueError(f"layout must be 'official' or 'overlap', got {layout!r}")
    out, a = [], 0
    for r in runs:
        out += [(s, min(s + window, a + r)) for s in range(a, a + r, window)]
        a += r
    return out


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
    best_epoch: int  #: the epoch (1-based) with the lowest validation loss
    returned_epoch: int = 0  #: the epoch whose weights were returned (``restore``)
    stopped_early: bool = False
    sizes: dict = field(default_factory=dict)  #: training / validation windows after split and class cap

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


def _class_keys(targets: torch.Tensor) -> list[tuple]:
    """A window's class: its target row (NaN read as -1), e.g. ``(1, 0, 0)``."""
    return [tuple(r) for r in torch.nan_to_num(targets.float(), nan=-1.0).tolist()]


def split_train_val(targets: torch.Tensor, val_fraction: float = 0.2, groups: torch.Tensor | None = None,
                    mode: str = "ordered", seed: int = 0, generator: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices ``(train, val)`` of the windows ``targets [N, C]``.

    ``mode="ordered"`` (official): per class the first ``int(n (1 - val_fraction))`` items in the order given
    train and the rest validate. With ``groups [N]`` (a conversation id per window) the items are
    conversations (a conversation's class: the CEs positive in any of its windows), so no conversation is in
    both splits; without, the items are windows (class: the target row). The official script shuffles each
    CE's conversations once and cuts at 80 %: give them in that order. ``mode="random"`` (ours before): a
    random ``val_fraction`` of the windows validates.
    """
    n = targets.shape[0]
    if mode == "random":
        perm = torch.randperm(n, generator=generator or torch.Generator().manual_seed(seed))
        n_val = max(1, int(round(n * val_fraction)))
        return perm[n_val:], perm[:n_val]
    if mode != "ordered":
        raise ValueError(f"split mode must be 'ordered' (official) or 'random', got {mode!r}")
    if groups is None:
        items = list(range(n))
        members = {i: [i] for i in items}
        keys = dict(zip(items, _class_keys(targets)))
    else:
        groups = torch.as_tensor(groups).long()
        if groups.shape != (n,):
            raise ValueError(f"groups must be [N={n}] conversation ids, got {tuple(groups.shape)}")
        items = list(dict.fromkeys(groups.tolist()))
        members = {g: [] for g in items}
        for i, g in enumerate(groups.tolist()):
            members[g].append(i)
        pos = (torch.nan_to_num(targets.float()) > 0)
        keys = {g: tuple(pos[members[g]].any(0).tolist()) for g in items}
    by_class: dict[tuple, list] = {}
    for it in items:
        by_class.setdefault(keys[it], []).append(it)
    tr, va = [], []
    for its in by_class.values():
        k = int(len(its) * (1 - val_fraction))
        for it in its[:k]:
            tr += members[it]
        for it in its[k:]:
            va += members[it]
    if not tr or not va:
        raise ValueError(f"the ordered split left {len(tr)} training and {len(va)} validation windows; give more "
                         "conversations per class (or split='random')")
    return torch.tensor(sorted(tr)), torch.tensor(sorted(va))


def balance_classes(targets: torch.Tensor, idx: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The official class cap: of the windows ``idx``, every class (target row) keeps at most ``m`` windows,
    drawn at random (seeded), where ``m`` is the count of the smallest class with exactly one positive CE (the
    official classes; the smallest class of all when there is none)."""
    keys = _class_keys(targets[idx])
    by: dict[tuple, list[int]] = {}
    for i, k in zip(idx.tolist(), keys):
        by.setdefault(k, []).append(i)
    single = [len(v) for k, v in by.items() if sum(x == 1.0 for x in k) == 1]
    cap = min(single) if single else min(len(v) for v in by.values())
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in sorted(by):
        v = torch.tensor(by[k])
        out.append(v[torch.randperm(len(v), generator=gen)[:cap]])
    return torch.cat(out).sort().values


def train_detector(windows: torch.Tensor, targets: torch.Tensor, ces: Sequence[str], config: DetectorConfig | None = None,
                   spec=None, groups: torch.Tensor | None = None) -> tuple["CEDetector", TrainingHistory]:
    """Fit a :class:`CEDetector` on labelled windows.

    ``windows [N, window, d]`` (full windows), ``targets [N, C]`` multi-label 0/1 (an all-zero row is a
    window showing none of the CEs; NaN marks a label left out of the loss, e.g. a window that only partly
    covers a CE's sentence); ``groups [N]``: optional conversation id per window (the ordered split is then
    by conversation). Split, class cap and returned epoch follow ``config`` (official by default; see the
    module docstring). Returns the detector and the history.
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
    tr, val = split_train_val(targets, config.val_fraction, groups, config.split, config.seed, generator=gen)
    if config.balance == "cap":
        tr, val = balance_classes(targets, tr, config.seed), balance_classes(targets, val, config.seed + 1)
    x, y = windows.float(), targets.float()
    net = WindowGRU(x.shape[-1], len(ces), config.hidden, config.rnn_layers, config.dropout, config.proj_dim)
    flat = x[tr].reshape(-1, x.shape[-1])
    net.mean.copy_(flat.mean(0))
    net.std.copy_(flat.std(0).clamp_min(1e-6) if len(flat) > 1 else torch.ones(x.shape[-1]))
    opt = torch.optim.Adam(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    lossf = masked_bce
    best, best_state, best_epoch, bad = math.inf, None, 0, 0
    since4, saved_state, saved_epoch = math.inf, None, 0  # the official loop's checkpoint file
    stopped = False
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
        state = None
        if epoch >= 4 and vl <= since4:  # official: from the 5th epoch, a loss at most the lowest since
            since4 = vl
            state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            saved_state, saved_epoch = state, epoch + 1
        if vl < best - (1e-6 if config.restore == "best" else 0.0):  # ours kept its 1e-6 margin
            best, best_epoch, bad = vl, epoch + 1, 0
            best_state = state or {k: v.detach().clone() for k, v in net.state_dict().items()}
            saved_state, saved_epoch = best_state, epoch + 1
        else:
            bad += 1
            if bad >= config.early_stopping:
                stopped = True
                break
    if config.restore == "best":
        net.load_state_dict(best_state)
        returned = best_epoch
    elif stopped:
        net.load_state_dict(saved_state)
        returned = saved_epoch
    else:
        returned = len(hist_val)
    net.eval()
    det = CEDetector(net, ces, config, spec=spec)
    return det, TrainingHistory(hist_tr, hist_val, best_epoch, returned, stopped,
                                {"train_windows": int(len(tr)), "val_windows": int(len(val))})


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
    def sequence_probs(self, feats: Sequence[torch.Tensor], runs: Sequence[Sequence[int] | None] | None = None,
                       layout: str | None = None) -> list[torch.Tensor]:
        """Per scored span ``[T_i, d]``, window probabilities ``[W_i, C]`` (windows of every span batched by length).

        ``runs[i]``: the lengths of span ``i``'s assistant turns (``conversation_features(..., return_runs=True)``;
        ``None``: one run). ``layout``: :func:`window_bounds` (default ``config.window_layout``; official: per
        turn, the short tail window unpadded).
        """
        layout = layout or self.config.window_layout
        if runs is not None and len(runs) != len(feats):
            raise ValueError(f"{len(runs)} run lists for {len(feats)} spans")
        by_len: dict[int, list[tuple[int, int, int]]] = {}  # length -> [(span, window index, start)]
        counts = []
        for i, f in enumerate(feats):
            if f.dim() != 2 or f.shape[0] == 0:
                raise ValueError(f"features must be [T>0, d], got {tuple(f.shape)}")
            b = window_bounds(f.shape[0], self.window, None if runs is None else runs[i], layout)
            counts.append(len(b))
            for j, (s0, e0) in enumerate(b):
                by_len.setdefault(e0 - s0, []).append((i, j, s0))
        out = [torch.zeros(n, len(self.ces)) for n in counts]
        for L, items in by_len.items():
            x = torch.cat([feats[i][s0:s0 + L][None].float() for i, _, s0 in items])  # [n, L, d]
            p = self.window_logits(x).sigmoid()
            for (i, j, _), row in zip(items, p):
                out[i][j] = row
        return out

    @property
    def inference_patience(self) -> torch.Tensor:
        """The patience used at inference ``[C]``: the calibrated one with ``config.inference_patience`` (ours),
        otherwise 1 window (official: evaluation ignores the calibrated patience)."""
        return self.patience if self.config.inference_patience else torch.ones_like(self.patience)

    def scores(self, probs: torch.Tensor) -> dict[str, float]:
        """CE scores ``s_c = max over windows of sigmoid(logit_c)`` from ``probs [W, C]``."""
        m = probs.max(0).values
        return {c: float(v) for c, v in zip(self.ces, m)}

    def fired(self, probs: torch.Tensor) -> set[str]:
        """CEs whose trigger fires on the windows ``probs [W, C]`` (calibrated θ; :attr:`inference_patience`)."""
        trig = compute_triggers(probs, self.thresholds, self.inference_patience)
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

    ``kind``: ``"usecase"`` (a rule's scenario dialogue: the only kind the official calibration counts),
    ``"ce"`` (a dialogue showing single CEs) or ``"negative"`` (CE-free); ``None`` infers ``"negative"`` when
    no CE is named and ``"usecase"`` otherwise.
    """

    required: frozenset[str] = frozenset()
    any_of: tuple[frozenset[str], ...] = ()
    supporting: frozenset[str] = frozenset()
    kind: str | None = None

    def __post_init__(self) -> None:
        if self.kind is None:
            named = self.required or self.supporting or any(self.any_of)
            object.__setattr__(self, "kind", "usecase" if named else "negative")
        if self.kind not in ("usecase", "ce", "negative"):
            raise ValueError(f"CalibrationLabels.kind must be 'usecase', 'ce' or 'negative', got {self.kind!r}")
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
              apply: bool = True, tie: str = "largest", protocol: str | None = None) -> Calibration:
    """Choose θ_c and patience_c per CE by Youden's J on calibration dialogues.

    ``probs``: per dialogue, window probabilities ``[W_i, C]`` (:meth:`CEDetector.sequence_probs`);
    ``labels``: its :class:`CalibrationLabels`. Grid θ ∈ {0.05, 0.10, ..., 1.0} by default. As in the
    official code, among the grid points within ``tol·|max J|`` of the best J the largest threshold wins
    (``tie="largest"``); ``tie="middle"`` (not in the paper) takes the middle of those thresholds instead,
    which is less strict when a small calibration set leaves J flat over a wide range.
    A CE with no positive (or no negative) label anywhere gets TPR (FPR) 0 on the whole grid.

    ``protocol`` (default ``detector.config.calibration``): ``"official"`` counts only the use-case-level
    dialogues (``labels[i].kind == "usecase"``; the official sweep skips its CE-level split); ``"all"`` (ours
    before) counts every dialogue, so a CE-level or CE-free dialogue where a CE fires outside a rule adds a
    false positive.
    """
    protocol = protocol or detector.config.calibration
    if protocol not in ("official", "all"):
        raise ValueError(f"protocol must be 'official' (use-case-level dialogues) or 'all', got {protocol!r}")
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

    if protocol == "official":
        keep = [i for i, lb in enumerate(labels) if lb.kind == "usecase"]
        if not keep:
            raise ValueError("the official calibration counts only use-case-level dialogues "
                             "(CalibrationLabels kind='usecase') and none was given; use protocol='all'")
        probs, labels = [probs[i] for i in keep], [labels[i] for i in keep]
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
