"""Identifying and Evaluating Inactive Heads in Pretrained LLMs (Sandoval-Segura et al., ICLR 2026): the score functions.

Every score function of the paper is computed for every input, layer and head from one batched
forward pass through the capture layer (``attn.hook_pattern``, ``attn.hook_v``, ``attn.hook_z``, and the
output-projection weight per head), vectorised over layers, inputs and heads.

Notation for one head and one input (paper, Appendix A.12 / official code): ``A`` is the attention
matrix ``[query, key]``, ``V`` the value vectors ``[pos, d_head]`` (grouped-query KV heads are broadcast
to the query heads that read them, as the model does), ``O = A V`` the head output before the output
projection (``hook_z``), ``W_O[h]`` the rows of the output projection that read head ``h``.

=====  ======================  ==========================================================  ============
 #      name                    definition                                                  inactive if
=====  ======================  ==========================================================  ============
 1      ``AWFT``                mean over query rows i of ``A[i, first]``                   score > τ
 2      ``AWFT (LN)``           #1 / mean of #1 over the heads of the layer                 > τ
 3      ``AEQD``                mean over query rows of the entropy ``-Σ_j A[i,j] ln A``    < τ
 4      ``AEQD (LN)``           layer-normalised #3                                         < τ
 5      ``FTVVN``               ``‖V[first]‖``                                              < τ
 6      ``FTVVN (LN)``          layer-normalised #5                                         < τ
 7      ``AVVN``                ``mean_t ‖V[t]‖``                                           < τ
 8      ``AVVN (LN)``           layer-normalised #7                                         < τ
 9      ``LTHON``               ``‖O[last]‖``                                               < τ
 10     ``LTHON (LN)``          #9 / mean over the layer's heads of ``mean_t ‖O[t]‖``       < τ
 11     ``AHON``                ``mean_t ‖O[t]‖``                                           < τ
 12     ``AHON (LN)``           layer-normalised #11 (the paper's best function)            < τ
 extra  ``LTHON (HN)``          ``‖O[last]‖ / mean_t ‖O[t]‖`` of the same head              < τ
 extra  ``FullHeadOutput``      ``mean_t ‖O[t] W_O[h]‖`` (appendix)                         < τ
 extra  ``FullHeadOutput (LN)`` layer-normalised ``FullHeadOutput`` (appendix)              < τ
=====  ======================  ==========================================================  ============

"LN" means *layer-normalised* (divided by the mean of the same score over all heads of that layer, for
the same input); it has nothing to do with LayerNorm.

Padding is excluded by NaN-masking: padded positions are set to NaN before the means (``nanmean``).
For the value and output scores this is what the official code does. For the two attention-pattern scores
(AWFT, AEQD) it is not: the code NaN-masks only padded *key columns* (and the causal upper triangle), so
padded *query rows* still enter its row average — under right padding a padded query row is a real
distribution over the real keys, and its weight on the first token and its entropy are averaged in; a
fully masked row (left padding) contributes entropy 0 through ``nansum``. By default
(``padded_queries="drop"``) we drop padded query rows, so a padded input scores exactly as it does
unpadded; ``padded_queries="official"`` applies the code's literal rule (only for causal models, as the
code assumes causal attention) to reproduce its numbers from padded batches. Choices where the
paper/code leave room:

* "first token" and "last token" are the first and last *real* (non-padding) tokens of each input, so
  left- and right-padded batches give the same scores (the official code assumes right padding and uses
  index 0 and the last non-pad index, which is the same thing there).
* AWFT averages over every real query row, including row 0 (whose weight on token 0 is 1 in a causal
  model), as the code's ``nanmean`` over the causal-masked matrix does on an unpadded input.
* The appendix variants are named after the code classes (``FullHeadOutput``, ``FullHeadOutputNormalized``
  → ``FullHeadOutput (LN)``); their norm ``‖O W_O[h]‖`` is computed exactly as the quadratic form
  ``sqrt(O (W_O W_Oᵀ) Oᵀ)``, which avoids materialising a ``d_model`` vector per head and token. The
  output-projection bias (shared by all heads) is not part of any head's output.

Thresholds (:meth:`HeadScores.threshold`, :func:`cdf_thresholds`) follow the official code by default
(``convention="official"``): the empirical CDF of the ``N`` sorted (input, layer, head) scores is the points
``(x_(k), k/N)``, k = 1..N, and τ_p is its inverse at ``y = p`` (``1 − p`` for AWFT), linearly interpolated
between the two bracketing points and clamped to ``[x_(1), x_(N)]`` — i.e. the sorted scores interpolated at
the 0-based position ``y·N − 1``; a head is inactive if ``score < τ`` (``> τ`` for AWFT), strictly. When
``p·N = m`` is an integer, τ is an order statistic itself: the m-th smallest score for a "<" score, so the
strict rule flags m − 1 scores, and the (m+1)-th largest for AWFT (``y = 1 − p``), which flags m; fewer when
scores tie at the boundary (grouped-query heads share their value norms, so whole tie groups drop out).
``convention="quantile"`` is ``torch.quantile`` (interpolation at position ``y·(N − 1)``), which this
project used before: it flags one more (input, head) pair for the "<" scores, a tie group more with ties.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import torch

from interp.model import Model
from interp.progress import progress
from interp.results import Result

#: Target fractions of the paper's dynamic thresholding (0, 5, ..., 30 %).
PAPER_FRACTIONS: tuple[float, ...] = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
#: How τ_p is read off the empirical CDF: the official code's inverse CDF (default) or ``torch.quantile``.
THRESHOLD_CONVENTIONS: tuple[str, ...] = ("official", "quantile")
#: What the attention-pattern scores (AWFT, AEQD) do with padded query rows: drop them (default) or the
#: official code's literal rule (only padded key columns are masked; padded query rows are averaged in).
PADDED_QUERIES: tuple[str, ...] = ("drop", "official")


def check_choice(field_name: str, value: Any, allowed: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise a ValueError naming the field."""
    if value not in allowed:
        raise ValueError(f"{field_name} must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}")
    return value


def cdf_thresholds(values: torch.Tensor, fractions: Sequence[float], inactive_if: str = "<",
                   convention: str = "official") -> list[float]:
    """τ_p for each target fraction ``p`` from the empirical distribution of ``values`` (any shape, NaN ignored).

    ``convention="official"`` (the paper's code): with the ``N`` finite values sorted, ``x_(1) <= ... <= x_(N)``,
    the CDF is the points ``(x_(k), k/N)`` and τ is its inverse at ``y = p`` (``y = 1 − p`` when
    ``inactive_if == ">"``), linearly interpolated between the bracketing points and clamped to the range of
    the CDF: the sorted values interpolated at the 0-based position ``clamp(y·N − 1, 0, N − 1)``. A position
    that is an integer up to float rounding (``0.55 * 100 = 55.00000000000001``) is snapped to it, so τ is then
    exactly an order statistic, as it is when the official code finds ``y`` among the CDF's ``k/N`` (it
    compares in float32).
    ``convention="quantile"``: ``torch.quantile`` at ``y`` (position ``y·(N − 1)``).

    Computed in float64; returns one float per fraction.
    """
    check_choice("convention", convention, THRESHOLD_CONVENTIONS)
    check_choice("inactive_if", inactive_if, ("<", ">"))
    fr = torch.as_tensor([float(p) for p in fractions], dtype=torch.float64)
    if fr.numel() and (bool(fr.isnan().any()) or bool((fr < 0).any()) or bool((fr > 1).any())):
        raise ValueError(f"fraction must be in [0, 1], got {[float(p) for p in fractions]}")
    x = values.detach().flatten().double().cpu()
    x = x[~x.isnan()]
    if x.numel() == 0:
        raise ValueError("no finite scores to threshold")
    if bool(x.isinf().any()):
        raise ValueError("scores contain ±inf; the empirical CDF needs finite scores")
    y = fr if inactive_if == "<" else 1.0 - fr
    if convention == "quantile":
        return torch.quantile(x, y).tolist()
    x = x.sort().values
    n = x.numel()
    pos = y * n - 1.0
    near = pos.round()
    pos = torch.where((pos - near).abs() <= 1e-9 * max(1.0, float(n)), near, pos).clamp(0.0, n - 1.0)
    lo = pos.floor().long()
    hi = (lo + 1).clamp(max=n - 1)
    return (x[lo] + (pos - lo.double()) * (x[hi] - x[lo])).tolist()


@dataclass(frozen=True)
class ScoreFunction:
    """One per-head score function of the paper."""

    name: str  #: short name used as key (``"AHON (LN)"``)
    title: str  #: the paper's full name
    code_class: str  #: class name in the official code
    inactive_if: str  #: ``"<"`` (low score = inactive) or ``">"`` (high score = inactive, AWFT)
    uses: tuple[str, ...]  #: activations it needs: ``pattern``, ``v``, ``z``, ``w_o``
    number: int | None  #: row in the paper's table (1..12); ``None`` for the extra variants

    @property
    def extra(self) -> bool:
        return self.number is None


_SPECS = [
    ScoreFunction("AWFT", "Avg Weight of First Token", "DormantHeads", ">", ("pattern",), 1),
    ScoreFunction("AWFT (LN)", "Avg Weight of First Token (LN)", "NormalizedDormantHeads", ">", ("pattern",), 2),
    ScoreFunction("AEQD", "Avg Entropy of Query Distributions", "EntropyHeads", "<", ("pattern",), 3),
    ScoreFunction("AEQD (LN)", "Avg Entropy of Query Distributions (LN)", "NormalizedEntropyHeads", "<",
                  ("pattern",), 4),
    ScoreFunction("FTVVN", "First Token Value Vector Norm", "ValueVectorMagnitudeFirstToken", "<", ("v",), 5),
    ScoreFunction("FTVVN (LN)", "First Token Value Vector Norm (LN)", "ValueVectorMagnitudeNormalizedFirstToken",
                  "<", ("v",), 6),
    ScoreFunction("AVVN", "Avg Value Vector Norm", "ValueVectorAvgMagnitude", "<", ("v",), 7),
    ScoreFunction("AVVN (LN)", "Avg Value Vector Norm (LN)", "ValueVectorAvgNormalizedMagnitude", "<", ("v",), 8),
    ScoreFunction("LTHON", "Last Token Head Output Norm", "HeadOutputMagnitudeLastToken", "<", ("z",), 9),
    ScoreFunction("LTHON (LN)", "Last Token Head Output Norm (LN)", "HeadOutputMagnitudeNormalizedLastToken", "<",
                  ("z",), 10),
    ScoreFunction("AHON", "Avg Head Output Norm", "UnnormalizedHonorHeads", "<", ("z",), 11),
    ScoreFunction("AHON (LN)", "Avg Head Output Norm (LN)", "HonorHeads", "<", ("z",), 12),
    ScoreFunction("LTHON (HN)", "Last Token Head Output Norm (HN)", "HeadOutputMagnitudeNormalizedHeadLastToken",
                  "<", ("z",), None),
    ScoreFunction("FullHeadOutput", "Avg Full Head Output Norm (O·W_O)", "FullHeadOutput", "<", ("z", "w_o"), None),
    ScoreFunction("FullHeadOutput (LN)", "Avg Full Head Output Norm (O·W_O, LN)", "FullHeadOutputNormalized", "<",
                  ("z", "w_o"), None),
]
#: Every score function, in the paper's order (the 12 of the paper, then the extra variants).
SCORE_FUNCTIONS: dict[str, ScoreFunction] = {s.name: s for s in _SPECS}
#: The 12 score functions of the paper (6 base scores × {raw, layer-normalised}).
PAPER_SCORES: tuple[str, ...] = tuple(s.name for s in _SPECS if not s.extra)
#: The code's extra score (HN) and the appendix's full-head-output variants.
EXTRA_SCORES: tuple[str, ...] = tuple(s.name for s in _SPECS if s.extra)
#: The function the paper finds best overall.
BEST_SCORE = "AHON (LN)"

_HOOK_OF = {"pattern": "attn.hook_pattern", "v": "attn.hook_v", "z": "attn.hook_z"}


def resolve_scores(names: str | Iterable[str] | None) -> list[str]:
    """Validate score names (``None`` = all); accepts the code class names as aliases."""
    if names is None:
        return list(SCORE_FUNCTIONS)
    if isinstance(names, str):
        names = [names]
    alias = {s.code_class: s.name for s in _SPECS}
    lower = {k.lower(): k for k in SCORE_FUNCTIONS}
    out: list[str] = []
    for n in names:
        key = n if n in SCORE_FUNCTIONS else alias.get(n) or lower.get(str(n).lower())
        if key is None:
            raise ValueError(f"unknown score function {n!r}; choose from {', '.join(SCORE_FUNCTIONS)}")
        if key not in out:
            out.append(key)
    return out


def required_activations(names: Iterable[str]) -> set[str]:
    """Which activations (``pattern``, ``v``, ``z``, ``w_o``) the given scores need."""
    need: set[str] = set()
    for n in names:
        need.update(SCORE_FUNCTIONS[n].uses)
    return need


# ----------------------------------------------------------------------------------------- weights
def output_weights(model: Model) -> torch.Tensor:
    """Output-projection weight per head, ``[n_layers, n_heads, d_head, d_model]``, on every backend.

    ``O[h] @ W[l, h]`` is head ``h``'s contribution to the attention output of layer ``l`` (without the
    shared bias): the capture layer's ``model.weight("W_O")`` in TransformerLens shape.
    """
    return model.weight("W_O")


def _positions(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of the first and last real token of each row of ``mask`` ``[batch, pos]``."""
    valid = mask.bool()
    if not bool(valid.any(-1).all()):
        raise ValueError("an input has no real tokens (its attention mask is all zeros)")
    s = mask.shape[-1]
    first = valid.int().argmax(-1)
    last = s - 1 - valid.flip(-1).int().argmax(-1)
    return first, last


def _nan_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """NaN-mask the positions where ``valid`` is False, then ``nanmean`` over the last axis."""
    return torch.where(valid, x, torch.full_like(x, float("nan"))).nanmean(-1)


def _pick(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[l, b, h, index[b]]`` for ``x`` ``[L, B, H, S]`` and ``index`` ``[B]`` -> ``[L, B, H]``."""
    idx = index.to(x.device).view(1, -1, 1, 1).expand(*x.shape[:3], 1)
    return x.gather(-1, idx).squeeze(-1)


def head_statistics(mask: torch.Tensor, pattern: torch.Tensor | None = None, v: torch.Tensor | None = None,
                    z: torch.Tensor | None = None, w_o: torch.Tensor | None = None,
                    n_heads: int | None = None, padded_queries: str = "drop") -> dict[str, torch.Tensor]:
    """The base per-head statistics, each ``[n_layers, batch, n_heads]`` (float32).

    Args:
        mask: ``[batch, pos]`` attention mask (1 = real token).
        pattern: ``[n_layers, batch, n_heads, query, key]`` attention probabilities.
        v: ``[n_layers, batch, pos, n_kv_heads, d_head]`` value vectors (broadcast to ``n_heads``).
        z: ``[n_layers, batch, pos, n_heads, d_head]`` head outputs before the output projection.
        w_o: ``[n_layers, n_heads, d_head, d_model]`` output projection per head (needs ``z``).
        padded_queries: for ``awft``/``aeqd``: ``"drop"`` averages over the real query rows only;
            ``"official"`` is the code's literal rule for a causal model: entries with a padded or future
            key are masked, ``awft`` averages column ``first`` over every row that can see it (padded rows
            after it included), ``aeqd`` averages the row entropies over *all* rows, a row without any
            visible real key counting as entropy 0 (the code's ``nansum``).

    Returns keys among ``awft, aeqd`` (pattern), ``ftvvn, avvn`` (v), ``lthon, ahon`` (z), ``fho`` (z, w_o).
    """
    check_choice("padded_queries", padded_queries, PADDED_QUERIES)
    first, last = _positions(mask)
    valid = mask.bool()
    out: dict[str, torch.Tensor] = {}
    if pattern is not None:
        a = pattern.float()
        dev = a.device
        col = a.gather(-1, first.to(dev).view(1, -1, 1, 1, 1).expand(*a.shape[:4], 1)).squeeze(-1)  # [L, B, H, Q]
        plogp = torch.special.xlogy(a, a)  # 0 ln 0 = 0 (masked keys)
        if padded_queries == "drop":
            rows = valid.to(dev)[None, :, None, :]  # real query rows
            out["awft"] = _nan_mean(col, rows)
            out["aeqd"] = _nan_mean(-plogp.sum(-1), rows)
        else:
            q = torch.arange(a.shape[-2], device=dev)
            k = torch.arange(a.shape[-1], device=dev)
            keys = valid.to(dev)[:, None, :] & (k[None, None, :] <= q[None, :, None])  # [B, Q, K]: real, not future
            sees_first = q[None, :] >= first.to(dev)[:, None]  # [B, Q]
            out["awft"] = _nan_mean(col, sees_first[None, :, None, :])
            entropy = -torch.where(keys[None, :, None], plogp, torch.zeros((), device=dev)).sum(-1)
            out["aeqd"] = entropy.mean(-1)
    if v is not None:
        n_kv = v.shape[3]
        heads = n_heads or n_kv
        if heads % n_kv:
            raise ValueError(f"{heads} query heads cannot share {n_kv} KV heads evenly")
        vn = v.float().norm(dim=-1)  # [L, B, S, Hkv]
        if heads != n_kv:  # grouped-query attention: query head h reads KV head h // (heads / n_kv)
            vn = vn.repeat_interleave(heads // n_kv, dim=-1)
        vn = vn.transpose(2, 3)  # [L, B, H, S]
        pos = valid.to(vn.device)[None, :, None, :]
        out["ftvvn"] = _pick(vn, first)
        out["avvn"] = _nan_mean(vn, pos)
    if z is not None:
        zf = z.float()
        zn = zf.norm(dim=-1).transpose(2, 3)  # [L, B, H, S]
        pos = valid.to(zn.device)[None, :, None, :]
        out["lthon"] = _pick(zn, last)
        out["ahon"] = _nan_mean(zn, pos)
        if w_o is not None:
            gram = torch.einsum("lhde,lhfe->lhdf", w_o.float().to(zf.device), w_o.float().to(zf.device))
            sq = torch.einsum("lbshd,lhdf,lbshf->lbhs", zf, gram, zf)
            out["fho"] = _nan_mean(sq.clamp_min(0).sqrt(), pos)
    return out


def _layer_norm(x: torch.Tensor) -> torch.Tensor:
    """Divide by the mean over the heads of the same layer and input (``x``: ``[L, B, H]``)."""
    return x / x.mean(-1, keepdim=True)


def scores_from_statistics(stats: Mapping[str, torch.Tensor], names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Score functions from :func:`head_statistics`; each ``[batch, n_layers, n_heads]``."""
    def get(key: str) -> torch.Tensor:
        if key not in stats:
            raise ValueError(f"statistic {key!r} missing; computed: {sorted(stats)}")
        return stats[key]

    make = {
        "AWFT": lambda: get("awft"),
        "AWFT (LN)": lambda: _layer_norm(get("awft")),
        "AEQD": lambda: get("aeqd"),
        "AEQD (LN)": lambda: _layer_norm(get("aeqd")),
        "FTVVN": lambda: get("ftvvn"),
        "FTVVN (LN)": lambda: _layer_norm(get("ftvvn")),
        "AVVN": lambda: get("avvn"),
        "AVVN (LN)": lambda: _layer_norm(get("avvn")),
        "LTHON": lambda: get("lthon"),
        "LTHON (LN)": lambda: get("lthon") / get("ahon").mean(-1, keepdim=True),
        "AHON": lambda: get("ahon"),
        "AHON (LN)": lambda: _layer_norm(get("ahon")),
        "LTHON (HN)": lambda: get("lthon") / get("ahon"),
        "FullHeadOutput": lambda: get("fho"),
        "FullHeadOutput (LN)": lambda: _layer_norm(get("fho")),
    }
    return {n: make[n]().transpose(0, 1).contiguous() for n in names}


#: Defaults of every head analysis called without ``inputs``: the paper builds its score CDFs on 100 FineWeb-Edu
#: samples; here :data:`DEFAULT_N_INPUTS` real-text passages of :func:`interp.data.text_passages` (KJV, spread
#: over the book; a vision model gets as many real digit images, :func:`interp.data.digits_sample`), cut at :data:`DEFAULT_MAX_LENGTH` tokens, :data:`DEFAULT_BATCH_SIZE` per pass.
DEFAULT_N_INPUTS = 100
DEFAULT_MAX_LENGTH = 128
DEFAULT_BATCH_SIZE = 8


def default_inputs(model: Model, n: int = DEFAULT_N_INPUTS) -> Any:
    """The built-in inputs of the head analyses: ``n`` texts (``list[str]``, :func:`interp.data.text_passages`)
    for a text model, or ``n`` real digit images ``[n, 3, s, s]`` (:func:`interp.data.digits_sample`: 56 px, or
    the model's own image size) for a vision model."""
    if model.cfg.modality == "vision":
        from interp.data import digits_sample
        return digits_sample(model, n)[0]
    from interp.data import text_passages
    return text_passages(n)


def resolve_inputs(model: Model, inputs: Any, batch_size: int | None, max_length: int | None
                   ) -> tuple[Any, int | None, int | None]:
    """``(inputs, batch_size, max_length)`` with the built-in defaults filled in when ``inputs`` is None."""
    if inputs is None:
        return (default_inputs(model), DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
                DEFAULT_MAX_LENGTH if max_length is None else max_length)
    return inputs, batch_size, max_length


def _batches(model: Model, inputs: Any, batch_size: int | None, max_length: int | None,
             padding_side: str | None) -> list[dict[str, torch.Tensor]]:
    """Forward-ready batches (texts tokenized per batch), from the capture layer's :meth:`Model.batches`;
    ``inputs=None``: the built-in inputs (:func:`default_inputs`)."""
    inputs, batch_size, max_length = resolve_inputs(model, inputs, batch_size, max_length)
    return list(model.batches(inputs, batch_size, padding_side=padding_side, max_length=max_length))


def score_heads(model: Model, inputs: Any = None, scores: str | Iterable[str] | None = None,
                batch_size: int | None = None, max_length: int | None = None,
                padding_side: str | None = None, padded_queries: str = "drop") -> "HeadScores":
    """Compute the inactive-head score functions for every input, layer and head.

    One forward pass per batch (``batch_size=None``: all inputs in one pass) captures the attention
    patterns, value vectors and head outputs of every layer; the scores are then computed vectorised
    over layers, inputs and heads, with padding NaN-masked.

    Args:
        model: a wrapped model (any backend, any supported architecture, grouped-query attention included).
        inputs: text(s), token ids ``[batch, pos]``, a dict with ``input_ids``/``attention_mask``, or images;
            ``None`` (default): the built-in inputs (:func:`default_inputs`: 100 real-text passages cut at 128
            tokens, 8 per pass, or 100 digit images for a vision model).
        scores: score names (see :data:`SCORE_FUNCTIONS`); ``None`` computes all of them.
        batch_size: inputs per forward pass (bounds memory; patterns are ``[layers, batch, heads, pos, pos]``).
        max_length: truncate texts to this many tokens.
        padding_side: ``"left"``/``"right"`` (the scores are the same either way with ``padded_queries="drop"``).
        padded_queries: ``"drop"`` (default): AWFT and AEQD average over real query rows only, so padding
            changes no score. ``"official"``: the official code's literal rule (see :func:`head_statistics`),
            under which padded query rows enter AWFT/AEQD; use it with right padding to reproduce the
            code's numbers from padded batches. Causal language models only.

    Returns:
        :class:`HeadScores` with ``per_input[name]`` ``[n_inputs, n_layers, n_heads]``.
    """
    check_choice("padded_queries", padded_queries, PADDED_QUERIES)
    if padded_queries == "official" and not model.cfg.is_causal_lm:
        raise ValueError("padded_queries='official' is the official code's rule for causal attention (it masks the "
                         "upper triangle); this model is not a causal LM, use padded_queries='drop'")
    names = resolve_scores(scores)
    need = required_activations(names)
    hooks = [f"blocks.*.{_HOOK_OF[k]}" for k in ("pattern", "v", "z") if k in need]
    w_o = output_weights(model) if "w_o" in need else None
    batches = _batches(model, inputs, batch_size, max_length, padding_side)
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    tokens: list[torch.Tensor] = []
    for batch in progress(batches, desc="head scores", total=len(batches)):
        _, cache = model.run_with_cache(batch, names=hooks)
        acts = {k: cache.stack(_HOOK_OF[k]) for k in ("pattern", "v", "z") if k in need}
        ref = acts.get("z", acts.get("v"))
        b, s = (ref.shape[1], ref.shape[2]) if ref is not None else (acts["pattern"].shape[1], acts["pattern"].shape[-1])
        mask = batch.get("attention_mask")
        mask = torch.ones(b, s, dtype=torch.long) if mask is None else mask.cpu()
        if mask.shape != (b, s):
            raise ValueError(f"attention mask {tuple(mask.shape)} does not match activations of batch {b} and "
                             f"{s} positions")
        stats = head_statistics(mask, acts.get("pattern"), acts.get("v"), acts.get("z"), w_o,
                                n_heads=model.cfg.n_heads, padded_queries=padded_queries)
        for n, t in scores_from_statistics(stats, names).items():
            parts[n].append(t.cpu())
        tokens.append(mask.sum(-1))
    return HeadScores(per_input={n: torch.cat(p) for n, p in parts.items()}, n_tokens=torch.cat(tokens),
                      model=str(getattr(model, "source", "") or model.cfg.family), padded_queries=padded_queries)


# -------------------------------------------------------------------------------------- result
@dataclass
class HeadScores(Result):
    """Per-input scores of every score function; see :func:`score_heads`.

    Attributes:
        per_input: score name -> ``[n_inputs, n_layers, n_heads]`` (the paper thresholds per input).
        n_tokens: ``[n_inputs]`` real (non-padding) tokens of each input.
        model: the model spec or family the scores came from.
        padded_queries: the padding rule the pattern scores were computed with (``"drop"`` or ``"official"``).
    """

    per_input: dict[str, torch.Tensor]
    n_tokens: torch.Tensor
    model: str = ""
    padded_queries: str = "drop"
    kind: ClassVar[str] = "head_scores"

    def __post_init__(self) -> None:
        check_choice("padded_queries", self.padded_queries, PADDED_QUERIES)

    # -- shape
    @property
    def names(self) -> list[str]:
        return list(self.per_input)

    @property
    def n_inputs(self) -> int:
        return int(next(iter(self.per_input.values())).shape[0])

    @property
    def n_layers(self) -> int:
        return int(next(iter(self.per_input.values())).shape[1])

    @property
    def n_heads(self) -> int:
        return int(next(iter(self.per_input.values())).shape[2])

    @property
    def scores(self) -> dict[str, torch.Tensor]:
        """Score name -> ``[n_layers, n_heads]``: the mean over inputs."""
        return {n: t.nanmean(0) for n, t in self.per_input.items()}

    def _get(self, name: str) -> torch.Tensor:
        key = resolve_scores(name)[0]
        if key not in self.per_input:
            raise ValueError(f"score {key!r} was not computed; available: {', '.join(self.per_input)}")
        return self.per_input[key]

    # -- thresholding (the paper's dynamic, per-input procedure)
    def thresholds(self, name: str, fractions: Sequence[float] = PAPER_FRACTIONS,
                   convention: str = "official") -> list[float]:
        """τ_p for each target fraction (the paper's 0, 5, ..., 30 % by default) from the empirical CDF of
        all (input, layer, head) scores; see :func:`cdf_thresholds` for the two conventions."""
        key = resolve_scores(name)[0]
        try:
            return cdf_thresholds(self._get(key), fractions, SCORE_FUNCTIONS[key].inactive_if, convention)
        except ValueError as err:
            raise ValueError(f"score {key!r}: {err}") from None

    def threshold(self, name: str, fraction: float, convention: str = "official") -> float:
        """τ_p for one target fraction ``p`` (``convention="official"``: the code's inverse CDF at ``p``, or
        at ``1 − p`` for a "greater-than" score such as AWFT; ``"quantile"``: ``torch.quantile``)."""
        return self.thresholds(name, [fraction], convention)[0]

    def inactive(self, name: str = BEST_SCORE, fraction: float = 0.1, threshold: float | None = None,
                 convention: str = "official") -> torch.Tensor:
        """Boolean mask ``[n_inputs, n_layers, n_heads]`` of the heads inactive on each input.

        The paper's rule, strict: ``score < τ`` (``score > τ`` for AWFT), with ``τ = threshold`` when given
        (e.g. a τ calibrated on another data set), else τ_p of this data for the target ``fraction`` under
        ``convention``. With ``fraction=0`` nothing is flagged. Compared in float64.
        """
        key = resolve_scores(name)[0]
        check_choice("convention", convention, THRESHOLD_CONVENTIONS)
        t = self._get(key).double()
        tau = self.threshold(key, fraction, convention) if threshold is None else float(threshold)
        if SCORE_FUNCTIONS[key].inactive_if == "<":
            return t < tau
        return t > tau

    def flag_rate(self, name: str = BEST_SCORE, fraction: float = 0.1, threshold: float | None = None,
                  convention: str = "official") -> torch.Tensor:
        """``[n_layers, n_heads]``: share of inputs on which each head is flagged inactive."""
        return self.inactive(name, fraction, threshold, convention).float().mean(0)

    def flagged(self, name: str = BEST_SCORE, fraction: float = 0.1, threshold: float | None = None,
                min_share: float = 0.5, convention: str = "official") -> list[tuple[int, int]]:
        """A fixed head set: ``(layer, head)`` flagged on more than ``min_share`` of the inputs."""
        rate = self.flag_rate(name, fraction, threshold, convention)
        return [(int(l), int(h)) for l, h in (rate > min_share).nonzero().tolist()]

    def ranking(self, name: str = BEST_SCORE) -> list[tuple[int, int]]:
        """Every ``(layer, head)``, most inactive first (by the mean score over inputs)."""
        key = resolve_scores(name)[0]
        mean = self._get(key).nanmean(0).flatten()
        order = mean.argsort(descending=SCORE_FUNCTIONS[key].inactive_if == ">")
        return [(int(i) // self.n_heads, int(i) % self.n_heads) for i in order]

    def iou(self, fraction: float = 0.1, convention: str = "official") -> "Any":
        """Pairwise intersection-over-union of the per-input inactive masks of the score functions."""
        import pandas as pd

        masks = torch.stack([self.inactive(n, fraction, convention=convention).flatten() for n in self.names]).double()
        inter = masks @ masks.T  # [n_scores, n_scores] pairs flagged by both
        count = masks.sum(-1)
        union = count[:, None] + count[None, :] - inter
        values = torch.where(union > 0, inter / union.clamp_min(1), torch.full_like(inter, float("nan")))
        return pd.DataFrame(values.numpy(), index=self.names, columns=self.names)

    def summary(self, fraction: float = 0.1, min_share: float = 0.5, convention: str = "official") -> "Any":
        """One row per score: τ at ``fraction``, the share of (input, head) pairs flagged, and the
        fraction of heads flagged on more than ``min_share`` of the inputs (a fixed head set)."""
        import pandas as pd

        rows = []
        total = self.n_layers * self.n_heads
        for n in self.names:
            spec = SCORE_FUNCTIONS[n]
            tau = self.threshold(n, fraction, convention)
            mask = self.inactive(n, threshold=tau)
            fixed = int(((mask.float().mean(0)) > min_share).sum())
            rows.append({"score": n, "title": spec.title, "paper_number": str(spec.number) if spec.number else "extra",
                         "inactive_if": spec.inactive_if, "threshold": tau,
                         "flagged_per_input": float(mask.float().mean()), "pairs_flagged": int(mask.sum()),
                         "heads_flagged": fixed, "fraction_heads_flagged": fixed / total})
        return pd.DataFrame(rows)

    def compare_conventions(self, fractions: Sequence[float] = (0.05, 0.10, 0.20), min_share: float = 0.5) -> "Any":
        """One row per (score, p): τ, (input, head) pairs flagged and fixed heads (flagged on more than
        ``min_share`` of the inputs) under each threshold convention (see :data:`THRESHOLD_CONVENTIONS`)."""
        import pandas as pd

        rows = []
        for n in self.names:
            taus = {c: self.thresholds(n, fractions, c) for c in THRESHOLD_CONVENTIONS}
            for i, p in enumerate(fractions):
                row: dict[str, Any] = {"score": n, "fraction": float(p)}
                for c in THRESHOLD_CONVENTIONS:
                    mask = self.inactive(n, threshold=taus[c][i])
                    row[f"tau_{c}"] = taus[c][i]
                    row[f"pairs_{c}"] = int(mask.sum())
                    row[f"heads_{c}"] = int((mask.float().mean(0) > min_share).sum())
                rows.append(row)
        return pd.DataFrame(rows)

    # -- views
    def to_frame(self) -> "Any":
        """Tidy table: one row per (score, layer, head) with the mean, std and min/max over inputs."""
        import pandas as pd

        frames = []
        layers = torch.arange(self.n_layers).repeat_interleave(self.n_heads)
        heads = torch.arange(self.n_heads).repeat(self.n_layers)
        for n, t in self.per_input.items():
            flat = t.flatten(1)
            finite = ~flat.isnan()
            filled_hi = torch.where(finite, flat, torch.full_like(flat, -math.inf))
            filled_lo = torch.where(finite, flat, torch.full_like(flat, math.inf))
            mean = flat.nanmean(0)
            var = ((flat - mean).pow(2).nan_to_num(0.0).sum(0) / (finite.sum(0) - 1).clamp_min(1))
            frames.append(pd.DataFrame({"score": n, "layer": layers.numpy(), "head": heads.numpy(),
                                        "mean": mean.numpy(), "std": var.sqrt().numpy(),
                                        "min": filled_lo.min(0).values.numpy(),
                                        "max": filled_hi.max(0).values.numpy(),
                                        "inactive_if": SCORE_FUNCTIONS[n].inactive_if}))
        return pd.concat(frames, ignore_index=True)

    def figure(self, names: Sequence[str] | None = None):
        """Plotly heatmaps (layer × head, mean over inputs), one per score, chosen with a dropdown."""
        import plotly.graph_objects as go

        names = resolve_scores(names) if names is not None else self.names
        fig = go.Figure()
        means = self.scores
        for i, n in enumerate(names):
            spec = SCORE_FUNCTIONS[n]
            fig.add_trace(go.Heatmap(
                z=means[n].numpy(), x=list(range(self.n_heads)), y=list(range(self.n_layers)), visible=i == 0,
                colorscale="Viridis" if spec.inactive_if == "<" else "Viridis_r", name=n,
                colorbar={"title": {"text": n}},
                hovertemplate="layer %{y}, head %{x}<br>" + n + " = %{z:.4g}<extra></extra>"))
        buttons = []
        for i, n in enumerate(names):
            spec = SCORE_FUNCTIONS[n]
            title = f"{spec.title} — inactive if score {spec.inactive_if} τ"
            buttons.append({"label": n, "method": "update",
                            "args": [{"visible": [j == i for j in range(len(names))]}, {"title.text": title}]})
        first = SCORE_FUNCTIONS[names[0]]
        fig.update_layout(
            title={"text": f"{first.title} — inactive if score {first.inactive_if} τ"},
            xaxis={"title": {"text": "head"}, "dtick": 1}, yaxis={"title": {"text": "layer"}, "autorange": "reversed"},
            updatemenus=[{"buttons": buttons, "direction": "down", "x": 1.0, "xanchor": "right", "y": 1.15,
                          "yanchor": "top", "showactive": True}],
            height=max(360, 24 * self.n_layers + 160), margin={"t": 90})
        return fig


__all__ = ["ScoreFunction", "SCORE_FUNCTIONS", "PAPER_SCORES", "EXTRA_SCORES", "BEST_SCORE", "PAPER_FRACTIONS",
           "THRESHOLD_CONVENTIONS", "PADDED_QUERIES", "HeadScores", "score_heads", "output_weights",
           "head_statistics", "scores_from_statistics", "resolve_scores", "required_activations", "cdf_thresholds",
           "check_choice"]
