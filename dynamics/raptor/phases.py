"""Layer similarity and phase detection (Block-Recurrent Hypothesis, Jacobs, Fel, Hakim et al., ICLR 2026, digest §7).

Procedure (official code, ``max_cut_dinov2_base.ipynb``, re-implemented):

1. run the teacher through the capture layer and read every block output ``blocks.{l}.hook_resid_post``;
2. per image keep two vectors per layer: the CLS token and the mean of the patch tokens (registers excluded);
3. ``D[l, m] = mean over {cls, patch-mean} and images of (1 - cos(a_l, a_m))`` (cosine distance) and the
   matching mean-squared-error matrix;
4. phases: either the code's recursive brute-force max-cut bisection (``method="maxcut"``: start with one
   cluster, split every cluster of at least ``2 * min_size`` layers along its exact max-cut as long as the cut
   exceeds ``eps = frac * sum(D) / 2``; the two sides are unconstrained, so a single layer may split off (official
   ``recursive_max_cut``: its ``min_size`` only stops clusters under ``2 * min_size`` layers from being split);
   contiguity is *not* imposed) or an exact contiguous segmentation by dynamic programming (``method="dp"``, our
   choice of objective, see :func:`phases`). ``maxcut_rule="min_side"`` is our earlier variant (each side of a
   split keeps at least ``min_size`` layers).

Layer indices are 0-based block indices: layer ``l`` is the output of block ``l`` (the paper's layer ``l + 1``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from interp.progress import progress
from interp.results import Result

__all__ = ["LayerDistances", "Phases", "layer_distances", "distances_from_stack", "phases", "maxcut_phases",
           "dp_phases", "cut_value", "token_summaries", "MAXCUT_RULES"]


def token_summaries(resid: torch.Tensor, n_registers: int = 0) -> torch.Tensor:
    """``[..., pos, d] -> [..., 2, d]``: the CLS token (position 0) and the mean of the patch tokens
    (positions ``1 + n_registers:``; registers excluded)."""
    if resid.shape[-2] < 2 + n_registers:
        raise ValueError(f"need a CLS token, {n_registers} registers and at least one patch; got {resid.shape[-2]} positions")
    return torch.stack([resid[..., 0, :], resid[..., 1 + n_registers:, :].mean(-2)], dim=-2)


def distances_from_stack(summ: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine-distance and MSE matrices from summaries ``[layer, batch, 2, d]`` (sums over the batch are
    returned divided by the batch size, so batches can be averaged by the caller).

    Returns ``(cos_dist [L, L], mse [L, L])``.
    """
    s = summ.double()
    u = s / s.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    cos = torch.einsum("lbkd,mbkd->lmbk", u, u)                       # [L, L, batch, 2]
    cos_dist = (1 - cos).mean(dim=(2, 3))
    sq = (s * s).sum(-1)                                              # [L, batch, 2]
    dot = torch.einsum("lbkd,mbkd->lmbk", s, s)
    mse = ((sq[:, None] + sq[None, :] - 2 * dot) / s.shape[-1]).clamp_min(0).mean(dim=(2, 3))
    return cos_dist.float(), mse.float()


@dataclass
class LayerDistances(Result):
    """Layer x layer distances of block outputs.

    Fields: ``cosine`` ``[L, L]`` mean cosine distance (over images and {CLS, mean patch}); ``mse`` ``[L, L]``;
    ``n_images``; ``n_registers``; ``phases`` (optional partition to draw on the heatmap).
    """

    cosine: torch.Tensor
    mse: torch.Tensor
    n_images: int
    n_registers: int = 0
    phases: list[list[int]] | None = None
    kind = "raptor.layer_distances"

    def to_frame(self):
        import pandas as pd
        L = self.cosine.shape[0]
        ii, jj = np.meshgrid(np.arange(L), np.arange(L), indexing="ij")
        return pd.DataFrame({"layer_i": ii.ravel(), "layer_j": jj.ravel(), "cosine_distance": self.cosine.numpy().ravel(),
                             "mse": self.mse.numpy().ravel()})

    def figure(self, phases: list[list[int]] | None = None):
        """Heatmap of the cosine distances with phase boundaries (white lines) where phases are known."""
        import plotly.graph_objects as go
        L = self.cosine.shape[0]
        fig = go.Figure(go.Heatmap(z=self.cosine.numpy(), x=list(range(L)), y=list(range(L)), colorscale="Viridis",
                                   colorbar=dict(title="1 - cos")))
        for b in _boundaries(phases or self.phases):
            for kw in (dict(x0=b - 0.5, x1=b - 0.5, y0=-0.5, y1=L - 0.5), dict(y0=b - 0.5, y1=b - 0.5, x0=-0.5, x1=L - 0.5)):
                fig.add_shape(type="line", line=dict(color="white", width=2), **kw)
        fig.update_layout(title=f"Layer cosine distance ({self.n_images} images)", xaxis_title="layer",
                          yaxis_title="layer", yaxis_autorange="reversed")
        return fig


def _boundaries(parts: list[list[int]] | None) -> list[int]:
    """First layer of every phase but the first one (for contiguous phases; otherwise every start)."""
    if not parts:
        return []
    starts = sorted(min(p) for p in parts)
    return starts[1:]


@torch.no_grad()
def layer_distances(model, images: torch.Tensor | None = None, batch_size: int = 32,
                    n_registers: int = 0) -> LayerDistances:
    """Cosine-distance and MSE matrices between all block outputs of a vision model.

    ``images``: ``[N, C, H, W]`` pixel values as the model expects them; ``None``: the built-in digits
    (:func:`interp.data.digits_sample`: 200 real digit images at 56 px, or the model's own image size).
    ``n_registers``: number of register tokens after CLS (DINOv2-with-registers: 4; ``zoo:dinov2-s14``: 0). Runs through the public capture layer
    (``run_with_cache(names="blocks.*.hook_resid_post")``) in batches; works on any backend.
    """
    if getattr(model.cfg, "modality", "vision") != "vision":
        raise ValueError(f"layer_distances needs a vision model (CLS + patch tokens); got modality {model.cfg.modality!r}")
    if images is None:
        from interp.data import digits_sample
        images = digits_sample(model)[0]
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise ValueError(f"images must be a float tensor [N, C, H, W]; got {getattr(images, 'shape', type(images))}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    names = model.hook_names("blocks.*.hook_resid_post")
    cos_sum = mse_sum = None
    n = images.shape[0]
    for start in progress(range(0, n, batch_size), desc="layer distances"):
        x = images[start:start + batch_size]
        _, cache = model.run_with_cache(x, names=names)
        summ = token_summaries(cache.stack("hook_resid_post"), n_registers)
        c, m = distances_from_stack(summ)
        w = x.shape[0]
        cos_sum = c * w if cos_sum is None else cos_sum + c * w
        mse_sum = m * w if mse_sum is None else mse_sum + m * w
    return LayerDistances(cosine=cos_sum / n, mse=mse_sum / n, n_images=n, n_registers=n_registers)


@dataclass
class Phases(Result):
    """A partition of the layers into phases.

    ``parts``: lists of 0-based layer indices, sorted by their first layer; ``cut``: total distance across phases
    (``sum_{i, j in different phases} D[i, j] / 2``); ``eps``: the split threshold used; ``method``;
    ``contiguous``; ``thresholds``: for contiguous phases, the last layer of every phase but the last one (the
    Raptor routing thresholds, 0-based).
    """

    parts: list[list[int]]
    cut: float
    eps: float
    method: str
    gains: list[float] = field(default_factory=list)
    kind = "raptor.phases"

    @property
    def contiguous(self) -> bool:
        return all(p == list(range(p[0], p[-1] + 1)) for p in self.parts)

    @property
    def thresholds(self) -> list[int]:
        if not self.contiguous:
            raise ValueError(f"phases {self.parts} are not contiguous; Raptor routing needs contiguous phases")
        return [p[-1] for p in self.parts[:-1]]

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame({"phase": [i for i, p in enumerate(self.parts) for _ in p],
                             "layer": [l for p in self.parts for l in p]})

    def figure(self):
        import plotly.graph_objects as go
        df = self.to_frame()
        return go.Figure(go.Scatter(x=df.layer, y=df.phase, mode="markers")).update_layout(
            title=f"Phases ({self.method}, cut {self.cut:.3f})", xaxis_title="layer", yaxis_title="phase")


def cut_value(D: torch.Tensor | np.ndarray, parts: Sequence[Sequence[int]]) -> float:
    """Total distance between layers of different parts: ``sum_{i<j, part(i) != part(j)} D[i, j]``
    (``D`` symmetric)."""
    D = np.asarray(D, dtype=np.float64)
    label = np.empty(D.shape[0], dtype=np.int64)
    for k, p in enumerate(parts):
        label[list(p)] = k
    return float(D[label[:, None] != label[None, :]].sum() / 2)


def _check_D(D) -> np.ndarray:
    D = np.asarray(D.numpy() if isinstance(D, torch.Tensor) else D, dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != D.shape[1]:
        raise ValueError(f"distances must be a square [L, L] matrix; got shape {D.shape}")
    if not np.isfinite(D).all():
        raise ValueError("distances contain NaN or inf")
    if D.shape[0] > 24:
        raise ValueError(f"brute-force max-cut is limited to 24 layers; got {D.shape[0]}")
    return (D + D.T) / 2


MAXCUT_RULES = ("official", "min_side")


def _best_bisection(D: np.ndarray, idx: list[int], min_size: int,
                    rule: str = "official") -> tuple[float, list[int], list[int]] | None:
    """Brute-force max-cut of ``D[idx][:, idx]``, vectorised over all 2^(n-1) colourings (first element fixed to
    side 0). ``None`` when the cluster may not be split.

    ``rule="official"``: a cluster of fewer than ``2 * min_size`` layers is not split; otherwise every colouring is
    admissible (a side may hold one layer). The colourings are scanned in the official order (``itertools.product``
    over elements 1..n-1, the last one varying fastest, the all-zero colouring first) and the first maximum is kept,
    so ties resolve as in the official code; a best cut that leaves one side empty (all cuts <= 0) is no split.
    ``rule="min_side"`` (ours, before issue #33): each side keeps at least ``min_size`` layers.
    """
    n = len(idx)
    if n < 2 * min_size or n < 2:
        return None
    sub = D[np.ix_(idx, idx)]
    if rule == "official":
        codes = np.arange(0, 2 ** (n - 1), dtype=np.int64)
        shifts = np.arange(n - 2, -1, -1)                                      # element 1 is the highest bit
    else:
        codes = np.arange(1, 2 ** (n - 1), dtype=np.int64)
        shifts = np.arange(n - 1)                                              # element 1 is the lowest bit
    bits = ((codes[:, None] >> shifts) & 1).astype(np.float64)               # elements 1..n-1
    side = np.concatenate([np.zeros((len(codes), 1)), bits], axis=1)         # [S, n]
    # cut = sum_{i in 0, j in 1} D_ij = s^T D (1 - s)
    cut = np.einsum("si,ij,sj->s", side, sub, 1 - side)
    if rule != "official":
        size1 = side.sum(1)
        cut[(size1 < min_size) | (n - size1 < min_size)] = -np.inf
    best = int(np.argmax(cut))
    b = [idx[i] for i in range(n) if side[best, i] == 1]
    if not b:
        return None
    a = [idx[i] for i in range(n) if side[best, i] == 0]
    return float(cut[best]), a, b


def maxcut_phases(D, frac: float | None = 0.1, n_phases: int | None = None, min_size: int = 2,
                  rule: str = "official") -> Phases:
    """The official recursive brute-force max-cut bisection (``max_cut_dinov2_base.ipynb``, ``recursive_max_cut``
    with the ``bruteforce`` solver, re-implemented).

    ``rule="official"`` (default): every cluster of at least ``2 * min_size`` layers is split along its exact
    max-cut while that cut exceeds ``eps = frac * sum(D) / 2``; the sides are unconstrained, so one layer may split
    off (official DINOv2 splits such as ``[1-3][4-7][8-11][12]``). ``rule="min_side"`` (ours before issue #33):
    only bisections whose both sides keep ``>= min_size`` layers are considered.

    Splits are made largest gain first. With ``frac`` the final partition does not depend on that order (every
    cluster whose cut exceeds ``eps`` is split, as in the official loop, which stops only when no cluster is left
    to try); ``gains`` lists the cut values in the order made. With ``n_phases`` given instead of ``frac`` (ours:
    the official code has only the threshold), split (largest gain first) until there are ``n_phases`` clusters
    (or none can be split). Phases need not be contiguous.
    """
    if rule not in MAXCUT_RULES:
        raise ValueError(f"rule must be one of {MAXCUT_RULES}, got {rule!r}")
    D = _check_D(D)
    L = D.shape[0]
    if n_phases is not None:
        frac = None  # a fixed number of phases replaces the threshold
    elif frac is None:
        raise ValueError("give frac (split threshold fraction) or n_phases")
    if frac is not None and not (0 <= frac):
        raise ValueError(f"frac must be >= 0, got {frac}")
    if n_phases is not None and not (1 <= n_phases <= L):
        raise ValueError(f"n_phases must be in [1, {L}], got {n_phases}")
    if min_size < 1:
        raise ValueError(f"min_size must be >= 1, got {min_size}")
    eps = float(frac * D.sum() / 2) if frac is not None else 0.0
    clusters = [list(range(L))]
    gains: list[float] = []
    pending = {0: _best_bisection(D, clusters[0], min_size, rule)}
    while True:
        if n_phases is not None and len(clusters) >= n_phases:
            break
        cand = [(v[0], k) for k, v in pending.items() if v is not None]
        if not cand:
            break
        gain, k = max(cand)
        if frac is not None and gain <= eps:
            break
        _, a, b = pending.pop(k)
        clusters[k] = a
        clusters.append(b)
        pending[k] = _best_bisection(D, a, min_size, rule)
        pending[len(clusters) - 1] = _best_bisection(D, b, min_size, rule)
        gains.append(gain)
    parts = sorted((sorted(c) for c in clusters), key=lambda p: p[0])
    return Phases(parts=parts, cut=cut_value(D, parts), eps=eps, method="maxcut", gains=gains)


def dp_phases(D, frac: float | None = 0.1, n_phases: int | None = None, min_size: int = 2) -> Phases:
    """Exact contiguous segmentation by dynamic programming (our choice where the digest leaves the DP
    objective open).

    Objective: maximise ``cut(P) - eps * (|P| - 1)`` over contiguous partitions ``P`` with segments of at least
    ``min_size`` layers, ``eps = frac * sum(D) / 2`` — the same price per split as the max-cut threshold, so
    a split is made only when it pays more than ``eps`` of cross-phase distance. With ``n_phases`` given, the
    exact maximum-cut contiguous partition into exactly that many phases. Since ``cut(P) = (sum D - sum_s W_s)/2``
    with ``W_s`` the within-segment sum, this minimises ``sum_s (W_s / 2 + eps)``; O(L^2) (or O(k L^2)) with
    prefix sums.
    """
    D = _check_D(D)
    L = D.shape[0]
    if n_phases is not None:
        frac = None  # a fixed number of phases replaces the threshold
    elif frac is None:
        raise ValueError("give frac (split threshold fraction) or n_phases")
    if frac is not None and frac < 0:
        raise ValueError(f"frac must be >= 0, got {frac}")
    if min_size < 1:
        raise ValueError(f"min_size must be >= 1, got {min_size}")
    if n_phases is not None and not (1 <= n_phases <= L // min_size):
        raise ValueError(f"n_phases must be in [1, {L // min_size}] for {L} layers and min_size {min_size}; got {n_phases}")
    P = np.zeros((L + 1, L + 1))
    P[1:, 1:] = D.cumsum(0).cumsum(1)
    i, j = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    W = P[j, j] - P[i, j] - P[j, i] + P[i, i]                      # W[i, j] = sum D[i:j, i:j]
    seg_cost = np.where(j - i >= min_size, W / 2, np.inf)          # [start, end)
    eps = float(frac * D.sum() / 2) if frac is not None else 0.0
    K = n_phases if n_phases is not None else L // min_size
    best = np.full((K + 1, L + 1), np.inf)
    arg = np.zeros((K + 1, L + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, K + 1):
        tot = best[k - 1][:, None] + seg_cost + eps                # [start, end]
        arg[k] = tot.argmin(0)
        best[k] = tot.min(0)
    k = n_phases if n_phases is not None else int(np.argmin(best[1:, L])) + 1
    if not np.isfinite(best[k, L]):
        raise ValueError(f"no contiguous partition of {L} layers into {k} phases of >= {min_size} layers")
    parts, end = [], L
    for kk in range(k, 0, -1):
        start = int(arg[kk, end])
        parts.append(list(range(start, end)))
        end = start
    parts = parts[::-1]
    cut = cut_value(D, parts)
    gains = [cut]  # total cut of the chosen partition
    return Phases(parts=parts, cut=cut, eps=eps, method="dp", gains=gains)


def phases(distances, frac: float | None = 0.1, method: str = "maxcut", n_phases: int | None = None,
           min_size: int = 2, maxcut_rule: str = "official") -> Phases:
    """Phases of a layer-distance matrix ``[L, L]`` (or a :class:`LayerDistances`, whose cosine matrix is used).

    ``method="maxcut"``: the official recursive brute-force bisection (:func:`maxcut_phases`; ``maxcut_rule``
    ``"official"``: clusters under ``2 * min_size`` layers are not split, a split may leave one layer alone;
    ``"min_side"``: ours, each side ``>= min_size``); ``"dp"``: exact contiguous segmentation (:func:`dp_phases`,
    every segment ``>= min_size``). Give ``frac`` (threshold ``frac * sum(D) / 2``) or ``n_phases``.
    """
    D = distances.cosine if isinstance(distances, LayerDistances) else distances
    if method == "maxcut":
        return maxcut_phases(D, frac=frac if n_phases is None else None, n_phases=n_phases, min_size=min_size,
                             rule=maxcut_rule)
    if method == "dp":
        return dp_phases(D, frac=frac if n_phases is None else None, n_phases=n_phases, min_size=min_size)
    raise ValueError(f"method must be 'maxcut' or 'dp', got {method!r}")
