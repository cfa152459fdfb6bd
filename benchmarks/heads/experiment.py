"""Identifying and Evaluating Inactive Heads in Pretrained LLMs (ICLR 2026): the validation on a real model.

:func:`experiment` scores every head of a model (default ``zoo:smollm2-135m``) with every score function on
the built-in audit texts, reports the fraction of heads each score flags at the target fraction ``p``, and
compares, on held-out text (the Book of Ruth from :func:`interp.data.heldout_text`, never used for
scoring), the loss change from zero-ablating the heads flagged by the output-norm score (AHON (LN)) with
the change from zero-ablating as many random heads. With ``sweep=True`` it also runs the paper's sweep
(dynamic zeroing at p = 0 ... 30 %).

:func:`threshold_comparison` gives the before/after table of the two threshold conventions (and of the two
padding rules of the pattern scores) on the same scoring texts.

Run: ``.venv/bin/python -m interp.probes.heads.experiment`` (prints the tables; about a minute on 2 idle cores);
``--compare-thresholds`` prints only the convention table.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Sequence

from interp.results import Result

from .ablation import AblationViews, evaluate_ablation, inactive_sweep
from .scores import (BEST_SCORE, PADDED_QUERIES, PAPER_FRACTIONS, THRESHOLD_CONVENTIONS, HeadScores, check_choice,
                     score_heads)


@dataclass
class ValidationConfig:
    """Defaults of the CPU-scale validation."""

    model: str = "zoo:smollm2-135m"
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
    sweep: bool = False
    sweep_fractions: tuple[float, ...] = PAPER_FRACTIONS
    metric: str = "loss"  #: "loss" (tolerance: +1 % relative) or "accuracy" (tolerance: −1 point, like the paper)
    batch_size: int = 8
    convention: str = "official"  #: τ_p from the CDF: the official code's inverse CDF, or "quantile"
    padded_queries: str = "drop"  #: AWFT/AEQD padding rule: "drop" padded query rows, or the code's "official"

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {self.fraction}")
        if not 0.0 <= self.min_share < 1.0:
            raise ValueError(f"min_share must be in [0, 1), got {self.min_share}")
        check_choice("convention", self.convention, THRESHOLD_CONVENTIONS)
        check_choice("padded_queries", self.padded_queries, PADDED_QUERIES)
        check_choice("metric", self.metric, ("loss", "accuracy"))
        for name in ("n_score_texts", "n_eval_texts", "eval_chars", "max_length", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_random < 0:
            raise ValueError(f"n_random must be >= 0, got {self.n_random}")


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


def experiment(config: ValidationConfig | None = None, model: Any = None) -> ValidationResult:
    """Score, threshold, and compare flagged-head ablation with random-head ablation (see module docs)."""
    import interp
    from interp.audit import AuditData

    cfg = config or ValidationConfig()
    model = model if model is not None else interp.load(cfg.model, backend=cfg.backend)
    score_texts = AuditData.builtin().texts[: cfg.n_score_texts]
    eval_texts = heldout_chunks(cfg.n_eval_texts, cfg.eval_chars)
    scores: HeadScores = score_heads(model, score_texts, batch_size=cfg.batch_size, max_length=cfg.max_length,
                                     padded_queries=cfg.padded_queries)
    summary = scores.summary(cfg.fraction, cfg.min_share, cfg.convention)
    heads = scores.flagged(cfg.score, cfg.fraction, min_share=cfg.min_share, convention=cfg.convention)
    if not heads:
        raise ValueError(f"{cfg.score} flags no head on a majority of inputs at p={cfg.fraction}")
    abl = evaluate_ablation(model, eval_texts, heads, n_random=cfg.n_random, seed=cfg.seed, metric=cfg.metric,
                            batch_size=cfg.batch_size, max_length=cfg.max_length, label=f"{cfg.score} flagged")
    sweep = None
    if cfg.sweep:
        sweep = asdict(inactive_sweep(model, eval_texts, cfg.score, cfg.sweep_fractions, calibration=scores,
                                      n_random=max(1, min(cfg.n_random, 2)), seed=cfg.seed, metric=cfg.metric,
                                      batch_size=cfg.batch_size, max_length=cfg.max_length,
                                      convention=cfg.convention, padded_queries=cfg.padded_queries))
    return ValidationResult(asdict(cfg), summary.to_dict("records"), [list(h) for h in heads], asdict(abl), sweep)


def threshold_comparison(model: Any = None, config: ValidationConfig | None = None,
                         fractions: Sequence[float] = (0.05, 0.10, 0.20)) -> "Any":
    """Before/after table of the threshold convention and the padding rule on the validation's scoring texts.

    Scores the ``n_score_texts`` built-in texts twice, in the validation's padded batches: with the default
    padding rule and with ``padded_queries="official"``. Returns one row per (score, p) with τ, the (input, head)
    pairs flagged and the fixed heads under ``"quantile"`` and ``"official"`` thresholds, plus the fixed heads
    under official thresholds with the code's padding rule (``heads_official_padded``).
    """
    import interp
    from interp.audit import AuditData

    cfg = config or ValidationConfig()
    model = model if model is not None else interp.load(cfg.model, backend=cfg.backend)
    texts = AuditData.builtin().texts[: cfg.n_score_texts]
    table = score_heads(model, texts, batch_size=cfg.batch_size, max_length=cfg.max_length).compare_conventions(
        fractions, cfg.min_share)
    padded = score_heads(model, texts, batch_size=cfg.batch_size, max_length=cfg.max_length,
                         padded_queries="official")
    table["heads_official_padded"] = [len(padded.flagged(r.score, r.fraction, min_share=cfg.min_share))
                                      for r in table.itertuples()]
    return table


def _main() -> None:  # pragma: no cover - a script
    import argparse
    import json

    import interp

    ap = argparse.ArgumentParser(description="Inactive-heads validation on a real model")
    ap.add_argument("--model", default=ValidationConfig.model)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--metric", default="loss", choices=["loss", "accuracy"])
    ap.add_argument("--n-random", type=int, default=ValidationConfig.n_random)
    ap.add_argument("--convention", default="official", choices=list(THRESHOLD_CONVENTIONS),
                    help="how τ_p is read off the empirical CDF")
    ap.add_argument("--compare-thresholds", action="store_true",
                    help="only print the before/after table of threshold conventions and padding rules "
                         "(p = 5, 10, 20 %%)")
    ap.add_argument("--out", default=None, help="save the ValidationResult to this folder")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (1 is fastest on a busy machine)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    interp.set_progress(False)
    if args.out:
        ValidationResult.check_save(args.out)  # refuse a folder it may not write before the slow work
    if args.compare_thresholds:
        print(threshold_comparison(config=ValidationConfig(model=args.model)).to_string(index=False))  # noqa: T201
        return
    res = experiment(ValidationConfig(model=args.model, sweep=args.sweep, n_random=args.n_random, metric=args.metric,
                                      convention=args.convention))
    cols = ["score", "threshold", "heads_flagged", "fraction_heads_flagged"]
    print(res.to_frame()[cols].to_string(index=False))  # noqa: T201
    print(res.ablation_result.to_frame().to_string(index=False))  # noqa: T201
    abl = res.ablation_result
    print(json.dumps({"flagged_heads": res.flagged, "delta": abl.delta, "random_delta": abl.random_delta,  # noqa: T201
                      "random_delta_std": abl.random_delta_std}, indent=1))
    if res.sweep_result is not None:
        sw = res.sweep_result
        print(sw.to_frame().to_string(index=False))  # noqa: T201
        print(f"percent inactive: {sw.percent_inactive} (random {sw.percent_inactive_random})")  # noqa: T201
    if args.out:
        res.save(args.out)


if __name__ == "__main__":
    _main()
