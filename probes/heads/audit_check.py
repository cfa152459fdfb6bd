"""Identifying and Evaluating Inactive Heads in Pretrained LLMs (ICLR 2026) as an ``interp audit`` check.

``HeadsCheck`` (entry point ``heads`` in the ``interp.checks`` group) scores every head with every score
function of the paper on half of the audit texts, thresholds them the paper's way (per input, τ_p from the
empirical CDF at the target fraction ``p``, inverted as the official code does; ``convention="quantile"`` for
``torch.quantile``), and checks the finding that matters to a user: ablating the heads the output-norm score
flags (AHON (LN) by default) changes the loss on the *other* half of the texts less than ablating as many random
heads. Optionally it runs the paper's full sweep over p = 0 ... 30 %.
"""
from __future__ import annotations

import html
import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch

from interp.checks import AuditData, Check, Rendered
from interp.results import Result
from interp.viz import attention_view

from . import (BEST_SCORE, PADDED_QUERIES, PAPER_FRACTIONS, SCORE_FUNCTIONS, THRESHOLD_CONVENTIONS, HeadScores,
                    evaluate_ablation, inactive_sweep, resolve_scores, score_heads)
from .ablation import AblationViews
from .scores import check_choice


@dataclass
class HeadsConfig:
    """Options of the ``heads`` check (defaults follow the paper where it has one)."""

    scores: tuple[str, ...] | None = None  #: score functions to compute (None = all 15)
    fraction: float = 0.10  #: target fraction p of (input, head) pairs flagged (paper grid 0 ... 0.30)
    min_share: float = 0.5  #: a head is in the fixed flagged set if flagged on more than this share of inputs
    ablation_score: str = BEST_SCORE  #: score whose flagged heads are ablated
    ablation_method: str = "zero"  #: "zero" (paper) or "mean"
    n_random: int = 3  #: random head sets of the same size
    sweep: bool = False  #: also run the paper's sweep over p = 0 ... 30 % (dynamic zeroing)
    batch_size: int = 8
    max_length: int = 128  #: tokens per text
    seed: int = 0
    convention: str = "official"  #: τ_p from the CDF: "official" (the code's inverse CDF) or "quantile"
    padded_queries: str = "drop"  #: AWFT/AEQD padding rule: "drop" padded query rows, or the code's "official" rule

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"heads.fraction must be in [0, 1], got {self.fraction}")
        if not 0.0 <= self.min_share < 1.0:
            raise ValueError(f"heads.min_share must be in [0, 1), got {self.min_share}")
        check_choice("heads.convention", self.convention, THRESHOLD_CONVENTIONS)
        check_choice("heads.padded_queries", self.padded_queries, PADDED_QUERIES)
        check_choice("heads.ablation_method", self.ablation_method, ("zero", "mean"))
        for field, low in (("batch_size", 1), ("max_length", 1), ("n_random", 0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"heads.{field} must be an integer >= {low}, got {value!r}")
        try:  # unknown score names fail here, before any model is loaded
            if self.scores is not None:
                resolve_scores(self.scores)
            resolve_scores(self.ablation_score)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"heads.scores / heads.ablation_score: {exc}") from None


@dataclass
class HeadsCheckResult(AblationViews, Result):
    """Everything the ``heads`` check measured."""

    #: the type name its saved files record (the module moved in #45; files written before load and compare equal)
    saved_type = "interp.probes.audit_checks.HeadsCheckResult"

    per_input: dict[str, torch.Tensor]  #: score -> [n_score_texts, n_layers, n_heads]
    n_tokens: torch.Tensor
    model: str
    fraction: float
    min_share: float
    summary_rows: list[dict[str, Any]]
    iou: list[list[float]]
    flagged: dict[str, list[list[int]]]  #: score -> fixed flagged set [[layer, head], ...]
    ablation: dict[str, Any] | None  #: AblationResult fields (None when no head was flagged)
    sweep: dict[str, Any] | None
    n_score_texts: int
    n_eval_texts: int
    convention: str = "official"  #: how τ_p was read off the CDF
    padded_queries: str = "drop"  #: padding rule of the pattern scores
    #: attention patterns for the report's view: {"tokens": [q], "heads": [[layer, head], ...],
    #: "patterns": [n_heads, q, q]} on the first score text (the ablation score's 3 most inactive heads, then its
    #: most active one); None for a model without attention patterns
    pattern_view: dict[str, Any] | None = None
    ablation_score: str = BEST_SCORE  #: the score whose flagged heads are ablated (and drift is tracked on)
    #: mean next-token loss of the unablated model on the held-out texts (also without an ablation run)
    baseline_loss: float | None = None
    #: ln(vocabulary size): the loss of a uniform guess, which a random-init model scores
    uniform_loss: float | None = None
    kind: ClassVar[str] = "heads_check"

    @property
    def head_scores(self) -> HeadScores:
        return HeadScores(per_input=self.per_input, n_tokens=self.n_tokens, model=self.model,
                          padded_queries=self.padded_queries)

    def figure(self):
        return self.head_scores.figure()

    @property
    def spread(self) -> float:
        """Relative spread of the ablation score over heads: (max − min) / |mean| of the per-head means (0 for
        identical heads). Below :data:`UNIFORM_SPREAD` the scores are nearly uniform, as in an untrained model."""
        means = self.head_scores.scores[self.ablation_score].float()
        scale = float(means.abs().mean())
        return float(means.max() - means.min()) / scale if scale > 0 else 0.0


#: relative spread of the per-head ablation score below which the report says "scores nearly uniform: untrained?"
#: (the random-init 4-layer Llama of issue 41: 0.3 %; SmolLM2-135M: > 100 %). Tiny models (d_head 16) spread
#: ~10 % even at random init, so the loss test below catches those.
UNIFORM_SPREAD = 0.02
#: loss / ln(vocabulary) above which the report says the predictions are nearly uniform ("untrained?"): a random
#: init scores ~1.0 (the tiny byte-level run of interp.apps.audit.demo: 1.006 at step 0, 0.68 after 10 steps)
UNIFORM_LOSS = 0.95


def _flag_figure(rows: list[dict[str, Any]], fraction: float):
    import plotly.graph_objects as go

    names = [r["score"] for r in rows]
    fig = go.Figure(go.Bar(x=names, y=[100 * r["fraction_heads_flagged"] for r in rows],
                           marker_color=["#1f77b4" if SCORE_FUNCTIONS[n].number else "#9ca3af" for n in names],
                           hovertemplate="%{x}: %{y:.1f}% of heads<extra></extra>"))
    top = max([100 * r["fraction_heads_flagged"] for r in rows] + [0.0])
    fig.update_layout(title={"text": f"Heads flagged on a majority of inputs at p = {100 * fraction:g}% "
                                     "(grey: extra variants)"},
                      yaxis={"title": {"text": "% of heads"}, "range": [0, max(5.0, 1.15 * top)]}, height=380,
                      margin={"b": 140})
    return fig


def _iou_figure(names: list[str], iou: list[list[float]]):
    import plotly.graph_objects as go

    fig = go.Figure(go.Heatmap(z=iou, x=names, y=names, colorscale="Blues", zmin=0, zmax=1,
                               hovertemplate="%{y} vs %{x}: IoU %{z:.2f}<extra></extra>"))
    fig.update_layout(title={"text": "Overlap (IoU) of the per-input inactive masks"}, height=560,
                      yaxis={"autorange": "reversed"}, margin={"l": 140, "b": 140})
    return fig


def _pattern_view(model, text: str, ranking: list[tuple[int, int]], n_tokens: int = 24) -> dict[str, Any]:
    """The patterns the report shows: the 3 most inactive heads of ``ranking`` and its most active head, on the
    first ``n_tokens`` tokens of ``text``."""
    heads = ranking[:3] + ranking[-1:]
    ids = model.to_tokens(text)[:, :n_tokens]
    _, cache = model.run_with_cache(ids, names=sorted({f"blocks.{l}.attn.hook_pattern" for l, _ in heads}),
                                    device="cpu")
    patterns = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"][0, h].float() for l, h in heads])
    return {"tokens": model.to_str_tokens(ids[0]), "heads": [[l, h] for l, h in heads], "patterns": patterns}


class HeadsCheck(Check):
    """Inactive attention heads: the paper's score functions, thresholds and an ablation check."""

    name: ClassVar[str] = "heads"
    title: ClassVar[str] = "Inactive attention heads"
    description: ClassVar[str] = ("Sandoval-Segura et al., 'Identifying and Evaluating Inactive Heads in Pretrained "
                                  "LLMs' (ICLR 2026): 12 score functions (+3 variants) per layer and head, dynamic "
                                  "per-input thresholds, and ablation of the flagged heads versus random heads.")
    Config: ClassVar[type] = HeadsConfig
    #: in the order the training-run index plots them
    METRICS: ClassVar[dict[str, str]] = {
        "baseline_loss": "mean next-token loss on the held-out audit texts (nats)",
        "perplexity": "exp(baseline_loss)",
        "n_flagged": "heads in the fixed flagged set of the ablation score",
        "flagged_fraction": "n_flagged / n_heads",
        "delta_loss_flagged": "loss change from ablating the flagged heads (null when none is flagged)",
        "delta_loss_random": "mean loss change from ablating as many random heads (null when none is flagged)",
        "score_spread": "relative spread (max - min) / |mean| of the per-head ablation score (near 0: untrained?)",
        "loss_vs_uniform": "baseline_loss / ln(vocabulary size): ~1 for a model that predicts uniformly (untrained?)",
        "n_heads": "attention heads (layers x heads)",
    }
    TRENDS: ClassVar[dict[str, tuple[str, ...]]] = {
        "Δloss, flagged vs random heads ablated": ("delta_loss_flagged", "delta_loss_random")}

    def applies(self, model) -> str | None:
        if model.cfg.modality != "text":
            return f"the heads check needs a text model (this one is {model.cfg.modality})"
        if model.tokenizer is None:
            return "the model has no tokenizer (give one with --tokenizer PATH_OR_SPEC)"
        return None

    def run(self, model, data: AuditData) -> HeadsCheckResult:
        cfg: HeadsConfig = self.config
        if model.cfg.modality != "text" or model.tokenizer is None:
            raise ValueError("the heads check needs a text model with a tokenizer")
        names = resolve_scores(cfg.scores)
        ablation_score = resolve_scores(cfg.ablation_score)[0]
        if ablation_score not in names:
            names.append(ablation_score)
        texts = list(data.texts)
        if len(texts) >= 2:  # interleaved halves: score on one, evaluate ablations on held-out texts
            score_texts, eval_texts = texts[0::2], texts[1::2]
        else:
            score_texts = eval_texts = texts
        scores = score_heads(model, score_texts, names, batch_size=cfg.batch_size, max_length=cfg.max_length,
                             padded_queries=cfg.padded_queries)
        summary = scores.summary(cfg.fraction, cfg.min_share, cfg.convention)
        iou = scores.iou(cfg.fraction, cfg.convention)
        flagged = {n: [[l, h] for l, h in scores.flagged(n, cfg.fraction, min_share=cfg.min_share,
                                                         convention=cfg.convention)] for n in names}
        ablation = None
        heads = flagged[ablation_score]
        if heads and model.cfg.is_causal_lm:
            res = evaluate_ablation(model, eval_texts, [tuple(x) for x in heads], n_random=cfg.n_random, seed=cfg.seed,
                                    method=cfg.ablation_method,
                                    mean_from=score_texts if cfg.ablation_method == "mean" else None,
                                    batch_size=cfg.batch_size, max_length=cfg.max_length,
                                    label=f"{ablation_score} flagged")
            ablation = asdict(res)
            baseline_loss = res.baseline
        elif model.cfg.is_causal_lm:  # nothing flagged: the loss headline still needs the unablated loss
            baseline_loss = evaluate_ablation(model, eval_texts, [], n_random=0, batch_size=cfg.batch_size,
                                              max_length=cfg.max_length).baseline
        else:
            baseline_loss = None
        sweep = None
        if cfg.sweep and model.cfg.is_causal_lm:
            sw = inactive_sweep(model, eval_texts, ablation_score, PAPER_FRACTIONS, calibration=scores,
                                n_random=cfg.n_random, seed=cfg.seed, batch_size=cfg.batch_size,
                                max_length=cfg.max_length, convention=cfg.convention,
                                padded_queries=cfg.padded_queries)
            sweep = asdict(sw)
        return HeadsCheckResult(scores.per_input, scores.n_tokens, scores.model, cfg.fraction, cfg.min_share,
                                summary.to_dict("records"), iou.values.tolist(), flagged, ablation, sweep,
                                len(score_texts), len(eval_texts), cfg.convention, cfg.padded_queries,
                                _pattern_view(model, score_texts[0], scores.ranking(ablation_score)), ablation_score,
                                baseline_loss, math.log(model.cfg.d_vocab) if model.cfg.d_vocab else None)

    def metrics(self, result: HeadsCheckResult) -> dict[str, Any]:
        hs = result.head_scores
        total = hs.n_layers * hs.n_heads
        n = len(result.flagged.get(result.ablation_score, []))
        abl = result.ablation_result
        loss = result.baseline_loss
        return {"n_heads": total, "n_flagged": n, "flagged_fraction": n / total if total else None,
                "baseline_loss": loss, "perplexity": math.exp(loss) if loss is not None and loss < 700 else None,
                "delta_loss_flagged": None if abl is None else abl.delta,
                "delta_loss_random": None if abl is None or not abl.random else abl.random_delta,
                "score_spread": result.spread,
                "loss_vs_uniform": loss / result.uniform_loss if loss is not None and result.uniform_loss else None}

    def summary(self, result: HeadsCheckResult) -> dict[str, Any]:
        cfg: HeadsConfig = self.config
        out: dict[str, Any] = {"heads": result.head_scores.n_layers * result.head_scores.n_heads}
        best = resolve_scores(cfg.ablation_score)[0]
        out[f"flagged by {best}"] = len(result.flagged.get(best, []))
        if result.baseline_loss is not None:
            out["baseline loss"] = result.baseline_loss
        abl = result.ablation_result
        if abl is not None:
            out["Δloss flagged"] = abl.delta
            out["Δloss random"] = abl.random_delta
            out["flagged < random"] = abs(abl.delta) < abs(abl.random_delta)
        sw = result.sweep_result
        if sw is not None:
            out["% inactive (paper metric)"] = sw.percent_inactive
        return out

    def to_json(self, result: HeadsCheckResult) -> dict[str, Any]:
        hs = result.head_scores
        return {"schema": "interp.checks.heads/1", "n_layers": hs.n_layers, "n_heads": hs.n_heads,
                "ablation_score": result.ablation_score, "baseline_loss": result.baseline_loss,
                "uniform_loss": result.uniform_loss,
                "score_spread": result.spread, "fraction": result.fraction, "min_share": result.min_share, "convention": result.convention,
                "padded_queries": result.padded_queries,
                "n_score_texts": result.n_score_texts, "n_eval_texts": result.n_eval_texts,
                "mean_scores": {n: t.tolist() for n, t in hs.scores.items()},
                "summary": result.summary_rows, "flagged": result.flagged,
                "iou": {"names": hs.names, "values": result.iou},
                "ablation": None if result.ablation is None else {
                    **result.ablation, "delta": result.ablation_result.delta,
                    "random_delta": result.ablation_result.random_delta},
                "sweep": None if result.sweep is None else {
                    **result.sweep, "percent_inactive": result.sweep_result.percent_inactive,
                    "percent_inactive_random": result.sweep_result.percent_inactive_random}}

    def render(self, result: HeadsCheckResult) -> Rendered:
        import pandas as pd

        cfg: HeadsConfig = self.config
        hs = result.head_scores
        best = resolve_scores(cfg.ablation_score)[0]
        total = hs.n_layers * hs.n_heads
        rule = ("the inverse of the empirical CDF of all (input, layer, head) scores at p (1−p for AWFT), "
                "interpolated between the bracketing points as in the official code" if result.convention == "official"
                else "the p-quantile (1−p for AWFT) of all (input, layer, head) scores (torch.quantile)")
        parts = [f"<p>{total} heads ({hs.n_layers} layers × {hs.n_heads} heads) scored on {result.n_score_texts} "
                 f"texts with {len(hs.names)} score functions. A head is <em>inactive on an input</em> when its score "
                 f"is strictly below τ<sub>p</sub> (above, for AWFT), {rule}, with p = {100 * result.fraction:g}%; "
                 f"the fixed set below keeps heads flagged on more than {100 * result.min_share:g}% of the inputs."
                 "</p>"]
        spread = result.spread
        if spread < UNIFORM_SPREAD:
            means = hs.scores[best]
            parts.append(f'<p class="note">Scores nearly uniform: untrained? (mean {html.escape(best)} per head '
                         f"ranges {float(means.min()):.4g}–{float(means.max()):.4g}, a spread of {100 * spread:.2g}% "
                         "of its mean; the colour scale below is fitted to that range, so small differences look "
                         "large.)</p>")
        elif result.baseline_loss is not None and result.uniform_loss and \
                result.baseline_loss >= UNIFORM_LOSS * result.uniform_loss:
            parts.append(f'<p class="note">Predictions nearly uniform: untrained? (loss {result.baseline_loss:.3f} '
                         f"nats per token against {result.uniform_loss:.3f} = ln(vocabulary) for a uniform guess; "
                         "score differences between heads are then noise.)</p>")
        if result.baseline_loss is not None:
            parts.append(f"<p>Loss of the unablated model on the {result.n_eval_texts} held-out texts: "
                         f"<b>{result.baseline_loss:.4f}</b> nats per token (perplexity "
                         f"{math.exp(min(result.baseline_loss, 700)):.4g}).</p>")
        abl = result.ablation_result
        if abl is not None:
            verdict = "smaller" if abs(abl.delta) < abs(abl.random_delta) else "NOT smaller"
            parts.append(f"<p>Ablating ({html.escape(abl.method)}) the {abl.n_heads:g} heads flagged by "
                         f"<b>{html.escape(best)}</b> changes the loss on {result.n_eval_texts} held-out texts by "
                         f"<b>{abl.delta:+.4f}</b> (baseline {abl.baseline:.4f}); ablating as many random heads "
                         f"changes it by <b>{abl.random_delta:+.4f}</b> ± {abl.random_delta_std:.4f} "
                         f"({len(abl.random)} draws): the flagged heads' effect is <b>{verdict}</b>.</p>")
        else:
            parts.append(f"<p>No head is flagged by {html.escape(best)} on a majority of inputs at this p, so "
                         "there is no ablation comparison.</p>")
        heat = hs.figure()
        for trace in heat.data:  # the colour scale is fitted to each score's range, with ticks that show it
            z = torch.as_tensor(trace.z, dtype=torch.float64)
            trace.update(zmin=float(z.min()), zmax=float(z.max()), colorbar={"tickformat": ".4g"})
        figures = [("Mean score per layer and head (choose the score function in the dropdown)", heat),
                   ("Share of heads in the fixed flagged set, per score function",
                    _flag_figure(result.summary_rows, result.fraction)),
                   ("How much the score functions agree", _iou_figure(hs.names, result.iou))]
        if abl is not None:
            figures.append(("Loss change: flagged heads versus random heads", abl.figure()))
        view = result.pattern_view
        if view is not None:
            figures.append((f"Attention patterns of the 3 most inactive heads by {best} and of its most active head, "
                            "on the first score text (choose the head in the drop-down)",
                            attention_view(view["patterns"], heads=[tuple(x) for x in view["heads"]],
                                           tokens=view["tokens"], title="attention")))
        sw = result.sweep_result
        if sw is not None:
            parts.append(f"<p>Paper metric (largest p whose loss stays within {100 * sw.tolerance:g}% of the baseline, "
                         f"{html.escape(sw.mode)} zeroing): <b>{sw.percent_inactive:g}%</b> with {html.escape(sw.score)} "
                         f"versus {sw.percent_inactive_random:g}% with random heads.</p>")
            figures.append(("Loss versus target fraction of zeroed heads (paper's sweep)", sw.figure()))
        table = pd.DataFrame(result.summary_rows)[["score", "title", "paper_number", "inactive_if", "threshold",
                                                   "flagged_per_input", "heads_flagged", "fraction_heads_flagged"]]
        tables = [("Score functions", table)]
        fl = result.flagged.get(best, [])
        if fl:
            rate = hs.flag_rate(best, result.fraction, convention=result.convention)
            mean = hs.scores[best]
            tables.append((f"Heads flagged by {best}", pd.DataFrame(
                [{"layer": l, "head": h, f"mean {best}": float(mean[l, h]), "share of inputs flagged": float(rate[l, h])}
                 for l, h in fl])))
        if abl is not None:
            tables.append(("Ablation", abl.to_frame()))
        return Rendered("".join(parts), figures, tables)


__all__ = ["HeadsCheck", "HeadsConfig", "HeadsCheckResult"]
