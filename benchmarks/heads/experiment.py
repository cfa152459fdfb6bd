"""Identifying and Evaluating Inactive Heads in Pretrained LLMs (ICLR 2026): the validation on a real model.

The method is :mod:`interp.probes.heads`; this module is the reproduction ``interp reproduce heads`` runs
(:mod:`interp.benchmarks.heads.recipe`). It scores every head of a model (default ``zoo:smollm2-135m``) with
every score function on the built-in audit texts, reports the fraction of heads each score flags at the target
fraction ``p``, and compares, on held-out text (the Book of Ruth from :func:`interp.data.heldout_text`, never
used for scoring), the loss change from zero-ablating the heads flagged by the output-norm score (AHON (LN))
with the change from zero-ablating as many random heads. The paper's sweep (dynamic zeroing at
p = 0 ... 30 %) runs per (score, metric) in ``sweeps``.

``model="planted-llama"`` is the quick preset's model: a random 4-layer Llama (4 query heads over 2 KV heads,
byte-level tokenizer) with two KV heads' ``W_V`` scaled by 1e-3, so that four query heads are planted dead
(the digest's CPU-scale recipe); it is built in seconds inside a stage.

:func:`threshold_comparison` gives the before/after table of the two threshold conventions (and of the two
padding rules of the pattern scores) on the same scoring texts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

from interp.probes.heads import (BEST_SCORE, PADDED_QUERIES, PAPER_FRACTIONS, THRESHOLD_CONVENTIONS, HeadScores,
                                 evaluate_ablation, inactive_sweep, score_heads)
from interp.probes.heads.ablation import AblationViews
from interp.probes.heads.scores import check_choice
from interp.results import Result

#: the quick preset's model (built by :func:`build_planted_llama`)
PLANTED = "planted-llama"
#: ``(layer, kv_head)`` whose ``W_V`` rows :func:`build_planted_llama` scales by 1e-3
PLANTED_KV = ((1, 1), (3, 0))


@dataclass
class ValidationConfig:
    """Defaults of the CPU-scale validation (the ``full`` preset of ``interp reproduce heads``)."""

    model: str = "zoo:smollm2-135m"  #: a model spec for ``interp.load``, or ``"planted-llama"``
    backend: str = "torch"
    n_score_texts: int = 48  #: built-in audit texts used for scoring and thresholds
    n_eval_texts: int = 24  #: held-out chunks for the loss
    eval_chars: int = 320  #: characters per held-out chunk (whole verses)
    max_length: int = 96
    fraction: float = 0.10  #: target p for the per-input thresholds
    min_share: float = 0.5  #: fixed set = heads flagged on more than this share of inputs
    score: str = BEST_SCORE  #: the output-norm score whose heads are ablated
    n_random: int = 5
    seed: int = 0
    #: the paper's sweeps, as ``(score, metric)`` pairs (metric "loss": tolerance +1 % relative; "accuracy":
    #: next-token top-1 accuracy, tolerance −1 point like the paper)
    sweeps: tuple[tuple[str, str], ...] = ((BEST_SCORE, "loss"), (BEST_SCORE, "accuracy"), ("AWFT", "accuracy"))
    sweep_fractions: tuple[float, ...] = PAPER_FRACTIONS
    sweep_random: int = 2  #: random head draws per fraction in the sweeps
    #: target fractions of the threshold-convention table (empty: no table)
    threshold_fractions: tuple[float, ...] = (0.05, 0.10, 0.20)
    metric: str = "loss"  #: metric of the flagged-vs-random ablation
    batch_size: int = 8
    convention: str = "official"  #: τ_p from the CDF: the official code's inverse CDF, or "quantile"
    padded_queries: str = "drop"  #: AWFT/AEQD padding rule: "drop" padded query rows, or the code's "official"
    threads: int | None = 1  #: torch intra-op threads (one is fastest on a busy 2-core machine)

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {self.fraction}")
        if not 0.0 <= self.min_share < 1.0:
            raise ValueError(f"min_share must be in [0, 1), got {self.min_share}")
        check_choice("convention", self.convention, THRESHOLD_CONVENTIONS)
        check_choice("padded_queries", self.padded_queries, PADDED_QUERIES)
        check_choice("metric", self.metric, ("loss", "accuracy"))
        self.sweeps = tuple(tuple(s) for s in self.sweeps)
        for s in self.sweeps:
            if len(s) != 2:
                raise ValueError(f"a sweep is a (score, metric) pair, got {s!r}")
            check_choice("sweep metric", s[1], ("loss", "accuracy"))
        for name in ("n_score_texts", "n_eval_texts", "eval_chars", "max_length", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_random < 0 or self.sweep_random < 1:
            raise ValueError(f"n_random must be >= 0 and sweep_random >= 1, got {self.n_random}, {self.sweep_random}")


@dataclass
class ValidationResult(AblationViews, Result):
    """Fractions flagged per score, and flagged-vs-random ablation on held-out text."""

    config: dict[str, Any]
    summary_rows: list[dict[str, Any]]
    flagged: list[list[int]]
    ablation: dict[str, Any]
    sweep: dict[str, Any] | None = None
    kind: ClassVar[str] = "inactive_heads_validation"

    def figure(self):
        return self.ablation_result.figure()


def heldout_chunks(n: int, chars: int = 320) -> list[str]:
    """``n`` chunks of whole verses (about ``chars`` characters each) of the held-out Book of Ruth."""
    from interp.data import heldout_text

    chunks, cur = [], ""
    for verse in heldout_text().splitlines():
        cur = f"{cur} {verse}".strip()
        if len(cur) >= chars:
            chunks.append(cur)
            cur = ""
        if len(chunks) == n:
            break
    if len(chunks) < n:
        raise ValueError(f"the held-out text yields only {len(chunks)} chunks of {chars} characters, not {n}")
    return chunks


def build_planted_llama(folder: Path, seed: int = 0) -> list[list[int]]:
    """Write the quick preset's model to ``folder``: a random 4-layer Llama (d 64, 4 query heads over 2 KV
    heads, byte-level tokenizer) whose ``W_V`` rows of the KV heads :data:`PLANTED_KV` are scaled by 1e-3.
    Returns the planted dead query heads ``[[layer, head], ...]`` (both query heads reading each KV head)."""
    import torch

    from interp.testing import tiny_model

    hf, _ = tiny_model("llama", seed=seed, folder=folder, n_layers=4, d_model=64, n_heads=4)
    cfg = hf.config
    d_head = cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    dead = []
    with torch.no_grad():
        for layer, kv in PLANTED_KV:
            hf.model.layers[layer].self_attn.v_proj.weight[kv * d_head:(kv + 1) * d_head] *= 1e-3
            dead += [[layer, kv * group + g] for g in range(group)]
    hf.save_pretrained(folder, safe_serialization=True)
    return dead


def load_model(cfg: ValidationConfig, folder: Path | None = None) -> Any:
    """The config's model: ``interp.load(cfg.model)``, or the planted Llama stored in ``folder``."""
    import interp

    if cfg.model == PLANTED:
        if folder is None:
            raise ValueError("the planted Llama is loaded from the folder its build stage wrote; pass folder=")
        return interp.load(str(folder), backend=cfg.backend)
    return interp.load(cfg.model, backend=cfg.backend)


def score_texts(cfg: ValidationConfig) -> list[str]:
    """The scoring (threshold) texts: the first ``n_score_texts`` built-in audit texts."""
    from interp.checks import AuditData

    texts = AuditData.builtin().texts
    if len(texts) < cfg.n_score_texts:
        raise ValueError(f"n_score_texts={cfg.n_score_texts} but the built-in audit set has {len(texts)} texts")
    return list(texts[: cfg.n_score_texts])


def scores(model: Any, cfg: ValidationConfig, padded_queries: str | None = None) -> HeadScores:
    """Every score function on the scoring texts (one batched forward pass per batch)."""
    return score_heads(model, score_texts(cfg), batch_size=cfg.batch_size, max_length=cfg.max_length,
                       padded_queries=padded_queries or cfg.padded_queries)


def validation(model: Any, cfg: ValidationConfig, head_scores: HeadScores) -> ValidationResult:
    """Fractions flagged per score, and ablation of ``cfg.score``'s fixed head set against random heads."""
    summary = head_scores.summary(cfg.fraction, cfg.min_share, cfg.convention)
    heads = head_scores.flagged(cfg.score, cfg.fraction, min_share=cfg.min_share, convention=cfg.convention)
    if not heads:
        raise ValueError(f"{cfg.score} flags no head on a majority of inputs at p={cfg.fraction}")
    abl = evaluate_ablation(model, heldout_chunks(cfg.n_eval_texts, cfg.eval_chars), heads, n_random=cfg.n_random,
                            seed=cfg.seed, metric=cfg.metric, batch_size=cfg.batch_size, max_length=cfg.max_length,
                            label=f"{cfg.score} flagged")
    return ValidationResult(asdict(cfg), summary.to_dict("records"), [list(h) for h in heads], asdict(abl))


def sweep(model: Any, cfg: ValidationConfig, head_scores: HeadScores, score: str, metric: str) -> dict[str, Any]:
    """The paper's sweep of ``score`` (dynamic zeroing at each p of ``cfg.sweep_fractions``, τ_p calibrated on the
    scoring texts) on the held-out chunks, judged by ``metric``; the :class:`SweepResult` as a dict."""
    res = inactive_sweep(model, heldout_chunks(cfg.n_eval_texts, cfg.eval_chars), score, cfg.sweep_fractions,
                         calibration=head_scores, n_random=cfg.sweep_random, seed=cfg.seed, metric=metric,
                         batch_size=cfg.batch_size, max_length=cfg.max_length, convention=cfg.convention,
                         padded_queries=cfg.padded_queries)
    return asdict(res)


def experiment(config: ValidationConfig | None = None, model: Any = None) -> ValidationResult:
    """Score, threshold, and compare flagged-head ablation with random-head ablation (no sweep; see module docs)."""
    cfg = config or ValidationConfig()
    if model is None:
        if cfg.model == PLANTED:
            raise ValueError("experiment() needs model= for the planted Llama (the recipe builds it in a stage)")
        model = load_model(cfg)
    return validation(model, cfg, scores(model, cfg))


def threshold_comparison(model: Any = None, config: ValidationConfig | None = None,
                         fractions: Sequence[float] | None = None, head_scores: HeadScores | None = None) -> Any:
    """Before/after table of the threshold convention and the padding rule on the validation's scoring texts.

    Scores the ``n_score_texts`` built-in texts twice, in the validation's padded batches: with the default
    padding rule (or takes ``head_scores``, scored that way) and with ``padded_queries="official"``. Returns one
    row per (score, p) with τ, the (input, head) pairs flagged and the fixed heads under ``"quantile"`` and
    ``"official"`` thresholds, plus the fixed heads under official thresholds with the code's padding rule
    (``heads_official_padded``).
    """
    cfg = config or ValidationConfig()
    fractions = tuple(fractions if fractions is not None else cfg.threshold_fractions)
    if model is None:
        model = load_model(cfg)
    base = head_scores if head_scores is not None else scores(model, cfg, padded_queries="drop")
    table = base.compare_conventions(fractions, cfg.min_share)
    padded = scores(model, cfg, padded_queries="official")
    table["heads_official_padded"] = [len(padded.flagged(r.score, r.fraction, min_share=cfg.min_share))
                                      for r in table.itertuples()]
    return table


__all__ = ["PLANTED", "PLANTED_KV", "ValidationConfig", "ValidationResult", "build_planted_llama", "experiment",
           "heldout_chunks", "load_model", "score_texts", "scores", "sweep", "threshold_comparison", "validation"]
