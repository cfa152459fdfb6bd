"""Reverse distillation on a locally trained protein MLM family (models digest, section 4, beside the paper's
ProteinGym percentages): fit the chains on training-split residues, embed held-out proteins with every model and
every chain, score few-shot probes, compare representations. The method is
:mod:`interp.models.reverse_distillation`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from interp.models.reverse_distillation.plm import embed_residues, load_plm
from interp.models.reverse_distillation.probes import exactness, probe_score
from interp.models.reverse_distillation.proteins import (TASKS, hmm_domain_labels, load_proteins, residue_tasks,
                                                         sequence_tasks, split_proteins)
from interp.models.reverse_distillation.scaler import RDChain, RDScaler, ScalerConfig
from interp.models.reverse_distillation.zoo import family
from interp.progress import progress
from interp.results import Result

__all__ = ["ProteinRDConfig", "ProteinRDResult", "protein_experiment", "PAPER_PROTEINGYM"]

#: the paper's ProteinGym DMS percentages (28 single-mutant sets, linear probes; digest section 4)
PAPER_PROTEINGYM = {
    "rd.650M > 650M": 71.4, "rd.3B > 3B": 85.7, "rd.15B > 15B": 67.9,
    "rd.3B > rd.650M": 92.9, "3B > 650M": 53.6, "rd.15B > rd.3B": 85.7,
}


@dataclass
class ProteinRDConfig:
    """The protein validation.

    ``toy``: use the toy zoo family (tests, notebook). ``n_fit_proteins``: training-split proteins whose residues fit
    the scalers (paper: 1,000 sequences). Probes are trained and scored on held-out proteins only:
    per-residue tasks from the residues of ``n_label_proteins`` labelled proteins (at most
    ``max_train_residues``), scored on up to ``max_test_residues`` residues of the other held-out proteins;
    per-sequence tasks (mean-pooled) from ``n_label_sequences`` labelled proteins, scored on the rest;
    ``hmm_domain`` on the proteins with an HMM hit (all splits, half labelled). Proteins are truncated to
    ``max_length`` residues before embedding and labelling (28 of 2,100 are longer than 1,022). ``n_repeats`` draws of the
    labelled set, averaged; every representation sees the same draws.
    """

    toy: bool = False
    regressor: str = "pcr"
    n_fit_proteins: int = 400
    max_heldout_proteins: int | None = None
    n_label_proteins: int = 16
    max_train_residues: int = 2000
    max_test_residues: int = 20000
    n_label_sequences: int = 64
    n_repeats: int = 5
    include_hmm: bool = True
    max_length: int = 1022
    batch_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        ScalerConfig(regressor=self.regressor)
        for name in ("n_fit_proteins", "n_label_proteins", "max_train_residues", "max_test_residues",
                     "n_label_sequences", "n_repeats", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class ProteinRDResult(Result):
    """``scores[task][rep]``: mean probe score (Spearman or AUROC) per task and representation (``raw.64``,
    ``rd.64``, ``rd_code.64``, ``naive.64``, ``direct.128``); ``comparisons``: fraction of tasks where one
    representation beats another, beside :data:`PAPER_PROTEINGYM`; ``exactness`` per chain step."""

    scores: dict
    comparisons: dict
    exactness: dict
    widths: list
    models: list
    model_metrics: dict
    config: dict = field(default_factory=dict)
    kind = "reverse_distillation.protein"

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"task": t, "level": TASKS[t].level, "metric": "AUROC" if TASKS[t].kind == "binary"
                              else "Spearman", "representation": rep, "score": s}
                             for t, reps in self.scores.items() for rep, s in reps.items()])

    def comparison_frame(self):
        import pandas as pd

        return pd.DataFrame([{"comparison": k, "fraction_of_tasks": v} for k, v in self.comparisons.items()])

    def figure(self):
        import plotly.graph_objects as go

        frame = self.to_frame()
        fig = go.Figure()
        for kind in ("raw", "rd", "rd_code", "naive"):
            sub = frame[frame.representation.str.startswith(kind + ".")]
            if sub.empty:
                continue
            mean = sub.assign(width=sub.representation.str.split(".").str[1].astype(int)).groupby("width").score.mean()
            fig.add_trace(go.Scatter(x=mean.index, y=mean.values, mode="lines+markers", name=kind))
        fig.update_layout(title="Protein MLM family: mean probe score over tasks", xaxis_title="width",
                          yaxis_title="mean score (Spearman / AUROC)", xaxis_type="log", template="plotly_white")
        return fig


def _pool(embs: list[torch.Tensor]) -> np.ndarray:
    return torch.stack([e.double().mean(0) for e in embs]).numpy()


def protein_experiment(config: ProteinRDConfig | None = None, models: Sequence[str | Path] | None = None,
                       model_metrics: Mapping[str, Mapping] | None = None) -> ProteinRDResult:
    """Fit the chains on training-split residues, embed the held-out proteins with every model and every chain, and
    score few-shot ridge probes on every task.

    ``models``: the family in ascending width, as zoo names or HF folders (default: the zoo family of
    ``config.toy``); ``model_metrics``: name -> training metrics reported in the result (default: the zoo's
    build metrics for zoo names, nothing for folders).
    """
    c = config or ProteinRDConfig()
    names = [str(m) for m in (models if models is not None else family(c.toy))]
    proteins = load_proteins()
    proteins.sequences = [s[: c.max_length] for s in proteins.sequences]  # as embedded (ESM's truncation)
    train, held = split_proteins(proteins)
    if c.max_heldout_proteins:
        held = held.subset(range(min(c.max_heldout_proteins, len(held))))
    rng = np.random.default_rng(c.seed)
    fit_set = train.subset(sorted(rng.choice(len(train), min(c.n_fit_proteins, len(train)), replace=False)))
    plms = [load_plm(n) for n in names]
    raw_fit = [torch.cat(embed_residues(m, fit_set.sequences, c.batch_size, c.max_length)) for m in plms]
    widths = [h.shape[1] for h in raw_fit]
    chains = {"rd": RDChain.fit(raw_fit, ScalerConfig(regressor=c.regressor)),
              "rd_code": RDChain.fit(raw_fit, ScalerConfig(regressor=c.regressor, variant="code")),
              "naive": RDChain.fit(raw_fit, ScalerConfig(kind="naive"))}
    direct = RDScaler.fit(raw_fit[0], raw_fit[-1], ScalerConfig(regressor=c.regressor))
    ex, acc = {}, raw_fit[0]
    for i, (scaler, h) in enumerate(zip(chains["rd"].scalers, raw_fit[1:])):
        ex[f"{widths[i]}->{widths[i + 1]}"] = exactness(scaler, acc, h)
        acc = scaler.transform(acc, h)

    def representations(seqs: list[str]) -> dict[str, list[torch.Tensor]]:
        raw = [embed_residues(m, seqs, c.batch_size, c.max_length) for m in plms]
        lengths = [len(e) for e in raw[0]]
        cat = [torch.cat(e) for e in raw]
        reps = {f"raw.{w}": cat[i] for i, w in enumerate(widths)}
        for name, chain in chains.items():
            for w, lv in zip(widths[1:], chain.transform(cat)[1:]):
                reps[f"{name}.{w}"] = lv
        reps[f"direct.{widths[-1]}"] = direct.transform(cat[0], cat[-1])
        return {k: list(torch.split(v, lengths)) for k, v in reps.items()}

    held_reps = representations(held.sequences)
    rep_names = list(held_reps)
    scores: dict[str, dict[str, float]] = {}
    n_held = len(held)
    draws = [rng.permutation(n_held) for _ in range(c.n_repeats)]

    # per-residue tasks
    r_targets = residue_tasks(held.sequences)
    for task, targets in progress(r_targets.items(), desc="residue tasks", total=len(r_targets)):
        acc_s = {r: [] for r in rep_names}
        for perm in draws:
            lab, rest = perm[: c.n_label_proteins], perm[c.n_label_proteins:]
            y_tr, y_te = np.concatenate([targets[i] for i in lab]), np.concatenate([targets[i] for i in rest])
            tr_idx = rng.choice(len(y_tr), min(c.max_train_residues, len(y_tr)), replace=False)
            te_idx = rng.choice(len(y_te), min(c.max_test_residues, len(y_te)), replace=False)
            for r in rep_names:
                x_tr = torch.cat([held_reps[r][i] for i in lab]).numpy()[tr_idx]
                x_te = torch.cat([held_reps[r][i] for i in rest]).numpy()[te_idx]
                acc_s[r].append(probe_score(x_tr, y_tr[tr_idx], x_te, y_te[te_idx], TASKS[task].kind))
        scores[task] = {r: float(np.nanmean(v)) for r, v in acc_s.items()}

    # per-sequence tasks (mean pooled)
    s_targets = sequence_tasks(held)
    pooled = {r: _pool(v) for r, v in held_reps.items()}
    for task, y in s_targets.items():
        acc_s = {r: [] for r in rep_names}
        for perm in draws:
            lab, rest = perm[: c.n_label_sequences], perm[c.n_label_sequences:]
            for r in rep_names:
                acc_s[r].append(probe_score(pooled[r][lab], y[lab], pooled[r][rest], y[rest], TASKS[task].kind))
        scores[task] = {r: float(np.nanmean(v)) for r, v in acc_s.items()}

    # HMM domain envelopes, on the proteins with a hit
    if c.include_hmm:
        labels = hmm_domain_labels(proteins)
        hit = [i for i, lab in enumerate(labels) if lab is not None]
        if len(hit) >= 4:
            hit_reps = representations([proteins.sequences[i] for i in hit])
            acc_s = {r: [] for r in rep_names}
            for _ in range(c.n_repeats):
                perm = rng.permutation(len(hit))
                lab, rest = perm[: len(hit) // 2], perm[len(hit) // 2:]
                y_tr = np.concatenate([labels[hit[i]] for i in lab])
                y_te = np.concatenate([labels[hit[i]] for i in rest])
                for r in rep_names:
                    x_tr = torch.cat([hit_reps[r][i] for i in lab]).numpy()
                    x_te = torch.cat([hit_reps[r][i] for i in rest]).numpy()
                    acc_s[r].append(probe_score(x_tr, y_tr, x_te, y_te, "binary"))
            scores["hmm_domain"] = {r: float(np.nanmean(v)) for r, v in acc_s.items()}

    def frac(a: str, b: str) -> float:
        vals = [scores[t][a] > scores[t][b] for t in scores if np.isfinite(scores[t][a]) and np.isfinite(scores[t][b])]
        return float(np.mean(vals)) if vals else float("nan")

    comparisons = {}
    for i, w in enumerate(widths[1:], start=1):
        prev = widths[i - 1]
        rd_prev = f"rd.{prev}" if i > 1 else f"raw.{prev}"
        comparisons[f"rd.{w} > raw.{w}"] = frac(f"rd.{w}", f"raw.{w}")
        comparisons[f"rd.{w} > {rd_prev}"] = frac(f"rd.{w}", rd_prev)
        comparisons[f"raw.{w} > raw.{prev}"] = frac(f"raw.{w}", f"raw.{prev}")
        comparisons[f"rd.{w} > naive.{w}"] = frac(f"rd.{w}", f"naive.{w}")
        comparisons[f"rd.{w} > rd_code.{w}"] = frac(f"rd.{w}", f"rd_code.{w}")
    comparisons[f"rd.{widths[-1]} > direct.{widths[-1]}"] = frac(f"rd.{widths[-1]}", f"direct.{widths[-1]}")
    if model_metrics is None:
        from interp import zoo

        model_metrics = {n: zoo.info(n).metrics for n in names if not Path(n).is_dir()}
    metrics = {str(n): dict(m) for n, m in model_metrics.items()}
    return ProteinRDResult(scores, comparisons, ex, widths, names, metrics, asdict(c))
