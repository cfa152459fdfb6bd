"""The digest's synthetic "model family" with planted latent factors, and its validation experiment (digest
section 4's CPU-scale recipe; ``interp reproduce reverse_distillation``).

Per sample: shared factors ``s`` ``[8]`` (high variance), rare factors ``r`` ``[8]`` (each active with probability
``r_active``), nuisance factors ``z`` ``[16]`` (large variance). "Models" of width 16 / 32 / 64 are
``tanh(x A) + noise`` of ``x = [s]``, ``[s, r_1:4, z_1:8]`` and ``[s, r, z]`` with Gaussian ``A`` (entries
``N(0, 1/dim x)``). Tasks: ``y = a.s / (|a| sd_s) + c b.r / (|b| sd_r) + noise`` with random directions ``a``,
``b`` and ``c ~ U(0, 2)`` per task, so the set runs from shared-factor to rare-factor tasks.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from interp.progress import progress
from interp.results import Result

from interp.models.reverse_distillation.probes import exactness, probe_score
from interp.models.reverse_distillation.scaler import RDChain, ScalerConfig

__all__ = ["SyntheticConfig", "SyntheticFamily", "SyntheticResult", "synthetic_experiment"]


@dataclass
class SyntheticConfig:
    """Digest defaults: RD fitted on 5,000 samples, ridge probes from 100 labelled samples, 50 tasks.

    ``n_repeats``: independent draws of the labelled samples per task (scores are averaged; every representation
    sees the same draws). ``min_monotone_fraction``: pass if ``rd.16 <= rd.32 <= rd.64`` on at least this fraction
    of tasks (digest: 0.8). ``min_raw_loss_fraction``: "raw width-64 loses to raw width-16 on a noticeable
    fraction" read as at least this fraction of tasks (our choice: 0.2).
    """

    widths: tuple[int, ...] = (16, 32, 64)
    s_dim: int = 8
    r_dim: int = 8
    z_dim: int = 16
    s_std: float = 1.0
    r_active: float = 0.25
    z_std: float = 2.0
    model_noise: float = 0.05
    task_noise: float = 0.1
    n_fit: int = 5000
    n_pool: int = 5000
    n_test: int = 2000
    n_labelled: int = 100
    n_tasks: int = 50
    n_repeats: int = 5
    regressor: str = "pcr"
    min_monotone_fraction: float = 0.8
    min_raw_loss_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.widths) != 3 or list(self.widths) != sorted(set(self.widths)):
            raise ValueError(f"widths must be three increasing widths, got {self.widths}")
        for name in ("s_dim", "r_dim", "z_dim", "n_fit", "n_pool", "n_test", "n_labelled", "n_tasks", "n_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.r_dim < 2 or self.z_dim < 2:
            raise ValueError("r_dim and z_dim must be >= 2 (the middle model sees half of each)")
        if not 0 < self.r_active <= 1:
            raise ValueError(f"r_active must lie in (0, 1], got {self.r_active}")
        if self.n_labelled > self.n_pool:
            raise ValueError(f"n_labelled ({self.n_labelled}) must not exceed n_pool ({self.n_pool})")
        ScalerConfig(regressor=self.regressor)


class SyntheticFamily:
    """Factors, three random "models" and random tasks, all drawn from one seed."""

    def __init__(self, config: SyntheticConfig):
        self.config = c = config
        g = torch.Generator().manual_seed(c.seed)
        self.inputs = [("s",), ("s", "r_half", "z_half"), ("s", "r", "z")]
        dims = [c.s_dim, c.s_dim + c.r_dim // 2 + c.z_dim // 2, c.s_dim + c.r_dim + c.z_dim]
        self.maps = [torch.randn(d, w, generator=g, dtype=torch.float64) / d ** 0.5 for d, w in zip(dims, c.widths)]
        a = torch.randn(c.n_tasks, c.s_dim, generator=g, dtype=torch.float64)
        b = torch.randn(c.n_tasks, c.r_dim, generator=g, dtype=torch.float64)
        self.task_s = a / a.norm(dim=1, keepdim=True) / c.s_std
        self.task_r = b / b.norm(dim=1, keepdim=True) / c.r_active ** 0.5 * 2 * torch.rand(c.n_tasks, 1, generator=g,
                                                                                              dtype=torch.float64)
        self._g = g

    def sample(self, n: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``n`` fresh samples: the three models' embeddings (float32 ``[n, width]``) and task targets ``[n, tasks]``."""
        c, g = self.config, self._g
        s = c.s_std * torch.randn(n, c.s_dim, generator=g, dtype=torch.float64)
        r = torch.randn(n, c.r_dim, generator=g, dtype=torch.float64) * (
            torch.rand(n, c.r_dim, generator=g, dtype=torch.float64) < c.r_active)
        z = c.z_std * torch.randn(n, c.z_dim, generator=g, dtype=torch.float64)
        xs = [s, torch.cat([s, r[:, : c.r_dim // 2], z[:, : c.z_dim // 2]], 1), torch.cat([s, r, z], 1)]
        embs = [(torch.tanh(x @ m) + c.model_noise * torch.randn(n, m.shape[1], generator=g, dtype=torch.float64)).float()
                for x, m in zip(xs, self.maps)]
        y = s @ self.task_s.T + r @ self.task_r.T + c.task_noise * torch.randn(n, c.n_tasks, generator=g,
                                                                               dtype=torch.float64)
        return embs, y


@dataclass
class SyntheticResult(Result):
    """Synthetic validation: ``scores[rep]`` ``[tasks]`` mean probe Spearman per representation (``raw.16``,
    ``rd.32``, ``naive.64``, ...); ``exactness`` per RD step; ``checks`` pass/fail of the digest's criteria."""

    scores: dict
    exactness: dict
    checks: dict
    summary: dict
    config: dict = field(default_factory=dict)
    kind = "reverse_distillation.synthetic"

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"task": t, "representation": rep, "spearman": float(v)}
                             for rep, vals in self.scores.items() for t, v in enumerate(np.asarray(vals))])

    def figure(self):
        import plotly.graph_objects as go

        frame = self.to_frame()
        fig = go.Figure()
        for rep in self.scores:
            sub = frame[frame.representation == rep]
            fig.add_trace(go.Box(y=sub.spearman, name=rep, boxpoints="all", jitter=0.4))
        fig.update_layout(title=f"Synthetic family: probe Spearman over {len(frame.task.unique())} tasks "
                                f"(monotone rd.16<=rd.32<=rd.64 on {self.summary['monotone_fraction']:.0%})",
                          yaxis_title="mean probe Spearman", template="plotly_white")
        return fig


def synthetic_experiment(config: SyntheticConfig | None = None) -> SyntheticResult:
    """Fit the RD chain (and the code variant and naive baseline) on ``n_fit`` samples, then few-shot ridge probes
    on every task from ``n_labelled`` samples, scored on ``n_test`` fresh samples."""
    c = config or SyntheticConfig()
    fam = SyntheticFamily(c)
    fit_embs, _ = fam.sample(c.n_fit)
    chains = {"rd": RDChain.fit(fit_embs, ScalerConfig(regressor=c.regressor)),
              "rd_code": RDChain.fit(fit_embs, ScalerConfig(regressor=c.regressor, variant="code")),
              "naive": RDChain.fit(fit_embs, ScalerConfig(kind="naive"))}
    ex, acc = {}, fit_embs[0]
    for i, (scaler, h) in enumerate(zip(chains["rd"].scalers, fit_embs[1:])):
        ex[f"{c.widths[i]}->{c.widths[i + 1]}"] = exactness(scaler, acc, h)
        acc = scaler.transform(acc, h)
    ols = RDChain.fit(fit_embs, ScalerConfig(regressor="linear"))
    ex_ols = exactness(ols.scalers[0], fit_embs[0], fit_embs[1])

    pool, y_pool = fam.sample(c.n_pool)
    test, y_test = fam.sample(c.n_test)
    reps_pool, reps_test = {}, {}
    for name, chain in chains.items():
        for w, e_p, e_t in zip(c.widths[1:], chain.transform(pool)[1:], chain.transform(test)[1:]):
            reps_pool[f"{name}.{w}"], reps_test[f"{name}.{w}"] = e_p, e_t
    for w, e_p, e_t in zip(c.widths, pool, test):
        reps_pool[f"raw.{w}"], reps_test[f"raw.{w}"] = e_p, e_t
    order = [f"raw.{w}" for w in c.widths] + [f"{k}.{w}" for k in chains for w in c.widths[1:]]
    rng = np.random.default_rng(c.seed)
    draws = [rng.choice(c.n_pool, c.n_labelled, replace=False) for _ in range(c.n_repeats)]
    scores = {}
    for rep in progress(order, desc="synthetic probes", total=len(order)):
        x_p, x_t = reps_pool[rep].numpy(), reps_test[rep].numpy()
        scores[rep] = np.mean([probe_score(x_p[d], y_pool[d].numpy(), x_t, y_test.numpy()) for d in draws], axis=0)
    w0, w1, w2 = c.widths
    rd0, rd1, rd2 = scores[f"raw.{w0}"], scores[f"rd.{w1}"], scores[f"rd.{w2}"]
    monotone = float(np.mean((rd0 <= rd1) & (rd1 <= rd2)))
    raw_loss = float(np.mean(scores[f"raw.{w2}"] < scores[f"raw.{w0}"]))
    summary = {
        "monotone_fraction": monotone, "raw_large_loses_fraction": raw_loss,
        "rd_beats_raw": {str(w): float(np.mean(scores[f"rd.{w}"] > scores[f"raw.{w}"])) for w in c.widths[1:]},
        "rd_code_monotone_fraction": float(np.mean((rd0 <= scores[f"rd_code.{w1}"])
                                                   & (scores[f"rd_code.{w1}"] <= scores[f"rd_code.{w2}"]))),
        "mean_scores": {rep: float(np.mean(v)) for rep, v in scores.items()},
        "ols_exactness": ex_ols,
    }
    checks = {
        "prefix_exact": all(e["prefix_exact"] for e in ex.values()),
        "pcr_residual_uncorrelated_with_retained_pcs": all(e["max_abs_corr_retained"] < 1e-6 for e in ex.values()),
        "ols_residual_uncorrelated": ex_ols["max_abs_corr_input"] < 1e-6,
        "reconstruction_beats_random": all(e["beats_random"] for e in ex.values()) and ex_ols["beats_random"],
        "monotone_rd": monotone >= c.min_monotone_fraction,
        "raw_width_can_lose": raw_loss >= c.min_raw_loss_fraction,
    }
    return SyntheticResult({k: torch.from_numpy(v) for k, v in scores.items()}, ex, checks, summary, asdict(c))
