"""Estimator sanity check with no language model (digest §4, CPU validation recipe 1).

A discrete source ``X`` (``n_symbols`` = 32 symbols, uniform) and ``Y = X`` with probability ``1 - ε``,
else a uniformly random symbol, so the true mutual information is known in closed form::

    I(X; Y) = log S - H(1 - ε + ε/S, ε/S, ..., ε/S)      (nats, S = n_symbols)

Each item becomes a *set* of 16-dimensional Gaussian "hidden states": ``m ~ U{2..6}`` vectors
``μ_symbol + σ · N(0, I)`` with position labels ``0..m-1`` (variable set sizes, padding masked). One VQ-VAE
(one type: X- and Y-sets are drawn from the same symbol clouds) is trained on the pooled sets of all noise
levels, ``Z_X`` and ``Z_Y`` are its codes, and the plug-in MI of the codes is compared with the true MI:
the check passes when the Spearman correlation over the noise levels is >= 0.9 and, at ``ε = 1``
(independent sources), the null-corrected MI is within noise (3 null standard deviations) of 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from interp.results import Result

from interp.probes.planning.mi import mutual_information, shuffled_null
from interp.probes.planning.states import StateSets
from interp.probes.planning.vqvae import TrainConfig, VQVAEConfig, train_vqvae

__all__ = ["true_symmetric_channel_mi", "symbol_sets", "EstimatorSanityResult", "estimator_sanity", "horizon_criteria",
           "decay_criteria", "horizon_run_for", "HORIZON_RUN", "BRANCH_RUN", "SMOLLM_RUN",
           "VALIDATION_VQ"]


def true_symmetric_channel_mi(noise: float, n_symbols: int) -> float:
    """Exact ``I(X;Y)`` (nats) of the uniform symmetric channel above with replacement probability ``noise``."""
    s = n_symbols
    p_same = 1 - noise + noise / s
    p_other = noise / s
    h = -(p_same * math.log(p_same) if p_same > 0 else 0.0) - ((s - 1) * p_other * math.log(p_other) if p_other > 0 else 0.0)
    return math.log(s) - h


def symbol_sets(symbols: Sequence[int], means: torch.Tensor, sigma: float, gen: torch.Generator,
                min_size: int = 2, max_size: int = 6) -> StateSets:
    """Sets of ``m ~ U{min_size..max_size}`` vectors ``means[s] + sigma N(0, I)`` per symbol ``s``."""
    sizes = torch.randint(min_size, max_size + 1, (len(symbols),), generator=gen)
    out = []
    for s, m in zip(symbols, sizes.tolist()):
        x = means[int(s)] + sigma * torch.randn(m, means.shape[1], generator=gen)
        out.append((x, torch.zeros(m, dtype=torch.long), torch.arange(m)))
    return StateSets.from_list(out)


@dataclass
class EstimatorSanityResult(Result):
    """Per noise level: true MI, estimated plug-in MI of the codes, null mean/std, null-corrected MI (nats)."""

    noise: list
    true_mi: list
    mi: list
    null_mean: list
    null_std: list
    corrected: list
    spearman: float
    independent_z: float          # corrected MI at the noisiest level divided by its null std
    n_codes: int
    n: int
    codes_used: int

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"noise": self.noise, "true_mi": self.true_mi, "mi": self.mi, "null_mean": self.null_mean,
                             "null_std": self.null_std, "corrected": self.corrected, "n_codes": self.n_codes})

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure(go.Scatter(x=self.true_mi, y=self.corrected, mode="lines+markers",
                                   text=[f"ε={e}" for e in self.noise], name=f"K={self.n_codes}",
                                   error_y=dict(type="data", array=self.null_std)))
        fig.update_layout(title=f"VQ-VAE MI vs true MI (Spearman {self.spearman:.2f})", xaxis_title="true MI (nats)",
                          yaxis_title="null-corrected code MI (nats)")
        return fig

    @property
    def passed(self) -> bool:
        return self.spearman >= 0.9 and abs(self.independent_z) <= 3


def estimator_sanity(noise_levels: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0), n_codes: int = 16,
                     n: int = 2000, n_symbols: int = 32, dim: int = 16, sigma: float = 0.5, seed: int = 0,
                     vqvae: dict | None = None, train: dict | None = None, n_perm: int = 50
                     ) -> EstimatorSanityResult:
    """Run the recipe above: ``n`` pairs per noise level; returns an :class:`EstimatorSanityResult`."""
    from scipy.stats import spearmanr

    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(n_symbols, dim, generator=gen)
    pairs = []
    for eps in noise_levels:
        x = torch.randint(0, n_symbols, (n,), generator=gen)
        flip = torch.rand(n, generator=gen) < eps
        y = torch.where(flip, torch.randint(0, n_symbols, (n,), generator=gen), x)
        pairs.append((symbol_sets(x.tolist(), means, sigma, gen), symbol_sets(y.tolist(), means, sigma, gen)))
    pooled = StateSets.cat([s for p in pairs for s in p])
    cfg = VQVAEConfig(d_in=dim, **{"n_codes": n_codes, **(vqvae or {})})
    model, hist = train_vqvae(pooled, cfg, TrainConfig(**{"steps": 600, "seed": seed, **(train or {})}))
    rows = []
    for i, (sx, sy) in enumerate(pairs):
        zx, zy = model.encode(sx).numpy(), model.encode(sy).numpy()
        mi = mutual_information(zx, zy)
        mean, std = shuffled_null(zx, zy, n_perm=n_perm, seed=seed + i)
        rows.append((mi, mean, std))
    mi, nm, ns = (list(map(float, c)) for c in zip(*rows))
    corrected = [a - b for a, b in zip(mi, nm)]
    true = [true_symmetric_channel_mi(e, n_symbols) for e in noise_levels]
    rho = float(spearmanr(true, corrected).statistic)
    indep = corrected[int(np.argmax(noise_levels))] / max(ns[int(np.argmax(noise_levels))], 1e-12)
    return EstimatorSanityResult(noise=list(noise_levels), true_mi=true, mi=mi, null_mean=nm, null_std=ns,
                                 corrected=corrected, spearman=rho, independent_z=float(indep), n_codes=n_codes, n=n,
                                 codes_used=hist["codes_used"])


# ----------------------------------------------------------------------------------------- paper criteria
#: settings of the measured validation runs (docs/planning.md; the slow tests use the same)
VALIDATION_VQ = {"d_model": 64, "d_latent": 32, "n_encoder_layers": 2}
HORIZON_RUN = {"n_examples": 2000, "n_codes": 32, "max_tau": 10, "vqvae": VALIDATION_VQ, "train": {"steps": 800},
               "n_perm": 20, "n_seeds": 1}
#: branch awareness: N = 8000 (was 2000 until 2026-12-02). The ratio is of *plug-in* MIs, whose bias
#: ~(K-1)²/(2N) nats (the shuffled-pairing null) is the same for both paths; at N = 2000 with K = 32 it was 0.21
#: nats, ten times the decoy's null-corrected MI (0.02), which pulls the ratio towards 1 (1.44 on the no-dead-end
#: NTP model; 2.68 at N = 8000, null 0.057; docs/planning.md section 4)
BRANCH_RUN = {"n_examples": 8000, "n_codes": 32, "vqvae": VALIDATION_VQ, "train": {"steps": 600}, "n_perm": 20,
              "n_seeds": 2}


#: the block x layer map of zoo:smollm2-135m on 1000 KJV passages of 100 words (3 anchors each); per-feature
#: input normalisation (SmolLM2's layer-20 residual stream has a massive-activation feature) and 2500 VQ steps
#: (the block VQ-VAEs' reconstruction error only starts to fall after ~300-1000 steps; docs/planning.md section 5)
SMOLLM_RUN = {"n_examples": 3000, "n_codes": 16, "block_size": 8, "n_blocks": 3, "map_layers": (0, 10, 20, 29),
              "anchors_per_text": 3, "max_tokens": 80, "vqvae": {**VALIDATION_VQ, "normalize": "feature"},
              "train": {"steps": 2500, "eval_every": 250, "patience": 10}, "n_perm": 20, "batch_size": 16}


def horizon_run_for(task, **overrides) -> dict:
    """:data:`HORIZON_RUN` with ``max_tau = min(10, reference target length - 1)`` (path finding: the path's nodes)."""
    n = len(task.examples(1, seed=0)[0].target.split())
    return {**HORIZON_RUN, "max_tau": min(10, n - 1), **overrides}


def horizon_criteria(result, early: Sequence[int] = (0, 1, 2, 3), late_from: int = 6) -> dict:
    """Digest recipe 2 on a :class:`~interp.probes.planning.analyses.HorizonResult`.

    ``early_mean`` / ``late_mean``: mean null-corrected MI over ``τ in early`` / ``τ >= late_from``;
    ``ratio = early_mean / late_mean`` (``inf`` when the late mean is not above 0); ``late_within_noise``:
    every late ``|corrected| <= 3 null std``; ``early_significant``: every early corrected MI ``> 3 null std``.
    ``passed`` = ratio >= 3, late within noise, early significant."""
    taus = list(result.taus)
    c, s = np.asarray(result.corrected), np.asarray(result.null_std)
    ei = [taus.index(t) for t in early if t in taus]
    li = [i for i, t in enumerate(taus) if t >= late_from]
    em, lm = float(c[ei].mean()), float(c[li].mean())
    ratio = em / lm if lm > 0 else float("inf")
    late_ok = bool(np.all(np.abs(c[li]) <= 3 * s[li]))
    early_ok = bool(np.all(c[ei] > 3 * s[ei]))
    return {"early_mean": em, "late_mean": lm, "ratio": ratio, "late_within_noise": late_ok,
            "early_significant": early_ok, "passed": bool(ratio >= 3 and late_ok and early_ok)}


def decay_criteria(result) -> dict:
    """The paper's qualitative shapes on a horizon curve (nMI over τ).

    ``decays``: the mean nMI over the last three τ is below half of nMI at τ = 1 (the paper: the grammar's nMI
    falls to about 1/5 by τ = 10; one τ alone is too noisy at our sample size, so the last three are averaged);
    ``flat_or_rising``: for every τ > 1 nMI stays at or above half of its value at τ = 1 (path finding)."""
    taus = list(result.taus)
    n = np.asarray(result.nmi)
    i1 = taus.index(1)
    later = n[i1 + 1:]
    tail = float(n[-3:].mean())
    return {"nmi_tau1": float(n[i1]), "nmi_tail_mean": tail, "nmi_last": float(n[-1]),
            "min_after_1": float(later.min()) if len(later) else float("nan"),
            "decays": bool(tail < 0.5 * n[i1]), "flat_or_rising": bool(len(later) and later.min() >= 0.5 * n[i1])}
