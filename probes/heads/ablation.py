"""Identifying and Evaluating Inactive Heads in Pretrained LLMs (Sandoval-Segura et al., ICLR 2026): ablation and evaluation.

The paper evaluates a score function by zeroing the heads it flags (their output ``O`` before ``W_O``,
i.e. ``hook_z``) and measuring the task metric against zeroing as many *random* heads:

* :func:`ablate_heads` turns a head set (``(layer, head)`` pairs, a ``[n_layers, n_heads]`` mask, or a
  per-input ``[batch, n_layers, n_heads]`` mask) into interventions for ``model.intervene`` (zero or
  mean ablation of ``attn.hook_z``).
* :func:`dynamic_zeroing` is the paper's procedure: inside the forward pass each layer's score is
  computed on the current input from that layer's own activations, and heads past τ are zeroed on that
  input only.
* :func:`evaluate_ablation` reports the loss (or accuracy) change for a head set next to the same
  number of random heads; :func:`inactive_sweep` runs the paper's sweep over target fractions
  (0 ... 30 %) and reports the largest fraction that stays within tolerance.

Choices (documented because the paper leaves them open at this scale): the metric is next-token loss on
text (the paper uses task accuracy, e.g. MMLU within 1 point); "within tolerance" is a relative loss
increase of at most ``tolerance`` (1 %); random baselines draw heads uniformly (a fixed set draws ``k``
distinct heads; a per-input mask is permuted per input, keeping each input's count), like the code's
``RandomHeads`` but with exactly matched counts.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

import torch

from interp.cache import Cache
from interp.configs import config_from_call, is_int, is_number, is_sequence, require
from interp.interventions import HookContext, Intervention, resolve_heads
from interp.model import Model, next_token_loss
from interp.progress import progress
from interp.results import Result

from .scores import (BEST_SCORE, PADDED_QUERIES, PAPER_FRACTIONS, SCORE_FUNCTIONS, THRESHOLD_CONVENTIONS, HeadScores,
                     _batches, check_choice, head_statistics, output_weights, resolve_inputs, resolve_scores,
                     score_heads, scores_from_statistics)

HeadSet = Any  # Iterable[(layer, head)] | BoolTensor [n_layers, n_heads] | BoolTensor [batch, n_layers, n_heads]


def _pair(item: Any) -> tuple[int, int]:
    """A ``(layer, head)`` pair of integers, as the interventions take indices (``1.5`` or ``True`` is a
    mistake, not index 1): otherwise a ``ValueError`` naming the item."""
    try:
        vals = tuple(item)
        if len(vals) != 2 or any(isinstance(v, bool) for v in vals):
            raise TypeError
        return operator.index(vals[0]), operator.index(vals[1])
    except TypeError:
        raise ValueError(f"heads must be (layer, head) pairs of integers, got {item!r}") from None


def head_mask(model: Model, heads: HeadSet) -> torch.Tensor:
    """A boolean mask ``[n_layers, n_heads]`` (or ``[batch, n_layers, n_heads]`` for per-input sets)."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if isinstance(heads, torch.Tensor) and heads.dtype == torch.bool:
        if heads.shape[-2:] != (n_layers, n_heads) or heads.dim() not in (2, 3):
            raise ValueError(f"head mask must be [{n_layers}, {n_heads}] or [batch, {n_layers}, {n_heads}], "
                             f"got {tuple(heads.shape)}")
        return heads.cpu()
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for item in heads:
        layer, head = _pair(item)
        if not 0 <= layer < n_layers:
            raise ValueError(f"head ({layer}, {head}) out of range: the model has {n_layers} layers × {n_heads} heads")
        # the interventions' rule (Ablate, Scale, Add, Patch): -1 is the last head; outside -n..n-1 an IndexError
        (head,) = resolve_heads([head], n_heads, f"blocks.{layer}.attn.hook_z")
        mask[layer, head] = True
    return mask


class ZeroHeads(Intervention):
    """Replace the ``hook_z`` output of selected heads of one layer by zero or by a fixed mean vector.

    ``mask`` is ``[n_heads]`` (same heads for every input) or ``[batch, n_heads]`` (per input); ``mean``
    ``[n_heads, d_head]`` switches to mean ablation.
    """

    def __init__(self, mask: torch.Tensor, mean: torch.Tensor | None = None):
        self.mask = mask.bool()
        self.mean = mean

    def __call__(self, z: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        if z.dim() != 4:
            raise ValueError(f"ZeroHeads acts on attn.hook_z [batch, pos, head, d_head], got {tuple(z.shape)} at {ctx.name}")
        m = self.mask.to(z.device)
        if m.dim() == 2:
            if m.shape[0] != z.shape[0]:
                raise ValueError(f"per-input head mask has {m.shape[0]} inputs but the forward pass at {ctx.name} "
                                 f"has batch {z.shape[0]}; build the ablation for this batch")
            m = m[:, None, :, None]
        else:
            m = m[None, None, :, None]
        if self.mean is None:
            repl = torch.zeros((), dtype=z.dtype, device=z.device)
        else:
            repl = self.mean.to(z.device, z.dtype)[None, None]
        return torch.where(m, repl, z)


class _InterventionMap(Mapping[str, Intervention]):
    """A read-only ``{hook name: intervention}`` mapping over ``self._items`` (what ``model.intervene`` takes)."""

    _items: dict[str, Intervention]

    def __getitem__(self, key: str) -> Intervention:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class HeadAblation(_InterventionMap):
    """``{"blocks.{l}.attn.hook_z": ZeroHeads, ...}``; use as ``with model.intervene(ablation):``."""

    def __init__(self, interventions: dict[str, Intervention], mask: torch.Tensor, method: str):
        self._items = interventions
        self.mask, self.method = mask, method

    def __repr__(self) -> str:
        n = int(self.mask.sum()) if self.mask.dim() == 2 else float(self.mask.sum(dim=(1, 2)).float().mean())
        return f"HeadAblation({self.method}, heads={n}, layers={sorted(self._items)})"


def head_means(model: Model, inputs: Any = None, batch_size: int | None = None) -> torch.Tensor:
    """Mean head output ``[n_layers, n_heads, d_head]`` of ``hook_z`` over the real tokens of ``inputs``
    (``None``: the built-in inputs, :func:`~.scores.default_inputs`)."""
    total: torch.Tensor | None = None
    count = 0.0
    for batch in _batches(model, inputs, batch_size, None, None):
        _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_z")
        z = cache.stack("attn.hook_z").float()  # [L, B, S, H, dh]
        mask = batch.get("attention_mask")
        m = torch.ones(z.shape[1:3]) if mask is None else mask.float().cpu()
        s = (z * m.to(z.device)[None, :, :, None, None]).sum((1, 2))
        total = s if total is None else total + s
        count += float(m.sum())
    assert total is not None
    return total / max(count, 1.0)


def ablate_heads(model: Model, heads: HeadSet, method: str = "zero",
                 mean_from: Any = None) -> HeadAblation:
    """Interventions that ablate a head set at ``attn.hook_z`` (the head output before ``W_O``).

    Args:
        model: the wrapped model.
        heads: ``(layer, head)`` pairs, a boolean ``[n_layers, n_heads]`` mask, or a per-input boolean
            ``[batch, n_layers, n_heads]`` mask (then every forward inside the block must have that batch).
        method: ``"zero"`` (the paper) or ``"mean"`` (replace by the head's mean output).
        mean_from: for ``"mean"``: inputs to average over, a :class:`~interp.Cache` holding
            ``attn.hook_z``, or a tensor ``[n_layers, n_heads, d_head]`` (e.g. ``head_means(model)``, the mean over
            the built-in inputs).

    ``heads`` has no default: which heads to ablate is the caller's question (e.g.
    ``score_heads(model).inactive()`` for the paper's per-input inactive heads).

    Returns a :class:`HeadAblation` mapping usable as ``with model.intervene(ablate_heads(...)):``.
    """
    if method not in ("zero", "mean"):
        raise ValueError(f"method must be 'zero' or 'mean', got {method!r}")
    mask = head_mask(model, heads)
    means: torch.Tensor | None = None
    if method == "mean":
        if mean_from is None:
            raise ValueError("method='mean' needs mean_from=<inputs, a Cache with attn.hook_z, or a "
                             "[n_layers, n_heads, d_head] tensor such as head_means(model) (built-in inputs)>")
        if isinstance(mean_from, torch.Tensor) and mean_from.is_floating_point() and mean_from.dim() == 3:
            means = mean_from
        elif isinstance(mean_from, Cache):
            means = torch.stack([mean_from.mean(f"blocks.{l}.attn.hook_z") for l in range(model.cfg.n_layers)])
        else:
            means = head_means(model, mean_from)
        want = (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
        if tuple(means.shape) != want:
            raise ValueError(f"mean head outputs must be {list(want)}, got {list(means.shape)}")
    layer_mask = mask.any(0) if mask.dim() == 3 else mask
    items: dict[str, Intervention] = {}
    for layer in range(model.cfg.n_layers):
        if not bool(layer_mask[layer].any()):
            continue
        m = mask[:, layer] if mask.dim() == 3 else mask[layer]
        items[f"blocks.{layer}.attn.hook_z"] = ZeroHeads(m, None if means is None else means[layer])
    return HeadAblation(items, mask, method)


# ---------------------------------------------------------------------------- dynamic zeroing
class _DynamicLayer(Intervention):
    """Computes one layer's score on the current pass and zeroes the heads past τ (per input)."""

    def __init__(self, owner: "DynamicZeroing", layer: int, role: str):
        self.owner, self.layer, self.role = owner, layer, role

    def __call__(self, tensor: torch.Tensor, ctx: HookContext):
        return self.owner._hook(self.layer, self.role, tensor, ctx)


class DynamicZeroing(_InterventionMap):
    """The paper's evaluation: per input and per layer, zero the heads whose score passes τ.

    The score of layer ``l`` is computed inside the (already ablated upstream) forward pass from layer
    ``l``'s own activations, like the official code does inside the attention module. Value- and
    output-based scores (FTVVN, AVVN, LTHON, AHON, their LN/HN variants, FullHeadOutput) work on every
    backend; pattern-based scores (AWFT, AEQD) need the pattern before the head output is consumed: every
    backend whose ``attn.hook_pattern`` is writable delivers it then (the TransformerLens backend, and the
    torch/nnsight backends through interp's hook-calling attention implementation); a backend that cannot
    is refused with a clear error. ``flagged`` records the mask of every pass: ``[batch, n_layers, n_heads]``.
    ``padded_queries`` is the padding rule of the pattern scores (see :func:`~.scores.head_statistics`).
    """

    def __init__(self, model: Model, score: str, threshold: float, padded_queries: str = "drop"):
        self.padded_queries = check_choice("padded_queries", padded_queries, PADDED_QUERIES)
        self.score = resolve_scores(score)[0]
        spec = SCORE_FUNCTIONS[self.score]
        if "pattern" in spec.uses and not model.can_write("blocks.0.attn.hook_pattern"):
            raise ValueError(f"{self.score} reads the attention pattern, which the {model.backend} backend delivers "
                             "only after the head output was used (its attn.hook_pattern is not writable); use "
                             "backend='torch', 'nnsight' or 'transformer_lens' for dynamic zeroing with it, or ablate_heads(model, scores.inactive(...)) with per-input masks "
                             "from an unablated pass")
        self.threshold = float(threshold)
        self.n_heads = model.cfg.n_heads
        self.n_layers = model.cfg.n_layers
        self.w_o = output_weights(model) if "w_o" in spec.uses else None
        self._state: dict[tuple[int, int, str], torch.Tensor] = {}
        self.flagged: list[torch.Tensor] = []
        self._current: dict[int, list[torch.Tensor | None]] = {}
        items: dict[str, Intervention] = {}
        for layer in range(self.n_layers):
            if "pattern" in spec.uses:
                items[f"blocks.{layer}.attn.hook_pattern"] = _DynamicLayer(self, layer, "pattern")
            if "v" in spec.uses:
                items[f"blocks.{layer}.attn.hook_v"] = _DynamicLayer(self, layer, "v")
            items[f"blocks.{layer}.attn.hook_z"] = _DynamicLayer(self, layer, "z")
        self._items = items

    def _hook(self, layer: int, role: str, t: torch.Tensor, ctx: HookContext):
        if role != "z":
            self._state[(ctx.pass_index, layer, role)] = t.detach()
            return None
        mask = ctx.attention_mask
        mask = torch.ones(t.shape[:2], dtype=torch.long) if mask is None else mask.cpu()
        spec = SCORE_FUNCTIONS[self.score]
        pattern = self._state.pop((ctx.pass_index, layer, "pattern"), None)
        v = self._state.pop((ctx.pass_index, layer, "v"), None)
        if ("pattern" in spec.uses and pattern is None) or ("v" in spec.uses and v is None):
            raise RuntimeError(f"the activations {self.score} needs did not arrive before {ctx.name}")
        stats = head_statistics(mask, None if pattern is None else pattern[None], None if v is None else v[None],
                                t.detach()[None], None if self.w_o is None else self.w_o[layer:layer + 1],
                                n_heads=self.n_heads, padded_queries=self.padded_queries)
        score = scores_from_statistics(stats, [self.score])[self.score][:, 0].double()  # [B, H]
        flag = score < self.threshold if spec.inactive_if == "<" else score > self.threshold
        rows = self._current.setdefault(ctx.pass_index, [None] * self.n_layers)
        rows[layer] = flag.cpu()
        if all(r is not None for r in rows):
            self.flagged.append(torch.stack(rows, dim=1))  # type: ignore[arg-type]
            del self._current[ctx.pass_index]
        if not bool(flag.any()):
            return None
        return torch.where(flag.to(t.device)[:, None, :, None], torch.zeros((), dtype=t.dtype, device=t.device), t)


def dynamic_zeroing(model: Model, score: str = BEST_SCORE, threshold: float | None = None,
                    calibration: HeadScores | None = None, fraction: float = 0.1,
                    convention: str = "official", padded_queries: str = "drop") -> DynamicZeroing:
    """Interventions for the paper's dynamic zeroing; ``threshold`` or τ_fraction of ``calibration`` (read off
    its empirical CDF with ``convention``, see :meth:`HeadScores.threshold`). With neither, ``calibration`` is
    ``score_heads(model, scores=score)`` on the built-in inputs (:func:`~.scores.default_inputs`)."""
    check_choice("convention", convention, THRESHOLD_CONVENTIONS)
    if threshold is None:
        if calibration is None:
            calibration = score_heads(model, None, score, padded_queries=padded_queries)
        threshold = calibration.threshold(score, fraction, convention)
    return DynamicZeroing(model, score, threshold, padded_queries)


# -------------------------------------------------------------------------------- evaluation
def _metric_fn(metric: str | Callable) -> Callable[[torch.Tensor, dict], tuple[float, float]]:
    """``fn(logits, batch) -> (sum, count)`` over real next-token targets."""
    if callable(metric):
        return metric
    if metric == "loss":
        def loss(logits, batch):
            mask = batch.get("attention_mask", torch.ones_like(batch["input_ids"]))
            n = float((mask[:, 1:] * mask[:, :-1]).sum())
            return float(next_token_loss(logits, batch)) * n, n
        return loss
    if metric == "accuracy":
        def acc(logits, batch):
            ids = batch["input_ids"]
            mask = batch.get("attention_mask", torch.ones_like(ids))
            keep = (mask[:, 1:] * mask[:, :-1]).bool()
            hit = (logits[:, :-1].argmax(-1) == ids[:, 1:]) & keep
            return float(hit.sum()), float(keep.sum())
        return acc
    raise ValueError(f"metric must be 'loss', 'accuracy' or a callable (logits, batch) -> (sum, count); got {metric!r}")


def _plans(model: Model, batches: list[dict], mask: torch.Tensor, method: str = "zero",
           means: Any = None) -> list[Mapping | None]:
    """One ablation per batch (slicing a per-input mask ``[n_inputs, L, H]`` along the batches)."""
    out: list[Mapping | None] = []
    start = 0
    for b in batches:
        n = b[next(iter(b))].shape[0]
        mb = mask[start:start + n] if mask.dim() == 3 else mask
        start += n
        out.append(ablate_heads(model, mb, method, means) if bool(mb.any()) else None)
    return out


def _evaluate(model: Model, batches: list[dict], fn, ablations: list[Mapping | None] | None = None,
              desc: str | None = None) -> float:
    total, count = 0.0, 0.0
    for i, batch in enumerate(batches):
        abl = ablations[i] if ablations is not None else None
        if abl:
            with model.intervene(abl):
                logits = model(batch)
        else:
            logits = model(batch)
        s, n = fn(logits, batch)
        total, count = total + s, count + n
    return total / max(count, 1.0)


def random_heads(n_layers: int, n_heads: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` distinct heads drawn uniformly: a mask ``[n_layers, n_heads]``."""
    mask = torch.zeros(n_layers * n_heads, dtype=torch.bool)
    mask[torch.randperm(n_layers * n_heads, generator=generator)[:k]] = True
    return mask.view(n_layers, n_heads)


def random_like(mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random mask with the same number of heads per input as ``mask`` (``[.., L, H]``)."""
    if mask.dim() == 2:
        return random_heads(*mask.shape, int(mask.sum()), generator)
    return torch.stack([random_heads(*m.shape, int(m.sum()), generator) for m in mask])


@dataclass
class AblationResult(Result):
    """Metric with no ablation, with the selected heads ablated, and with as many random heads ablated."""

    metric: str
    baseline: float
    ablated: float
    random: list[float]
    n_heads: float  #: heads ablated (mean per input for per-input masks)
    total_heads: int
    method: str = "zero"
    heads: list = field(default_factory=list)  #: the (layer, head) pairs of a fixed set ([] for per-input masks)
    label: str = "selected"
    kind: ClassVar[str] = "head_ablation"

    @property
    def delta(self) -> float:
        return self.ablated - self.baseline

    @property
    def random_deltas(self) -> list[float]:
        return [r - self.baseline for r in self.random]

    @property
    def random_delta(self) -> float:
        return float(torch.tensor(self.random_deltas).mean()) if self.random else float("nan")

    @property
    def random_delta_std(self) -> float:
        return float(torch.tensor(self.random_deltas).std()) if len(self.random) > 1 else 0.0

    def to_frame(self):
        import pandas as pd

        rows = [{"condition": "baseline", "value": self.baseline, "change": 0.0},
                {"condition": self.label, "value": self.ablated, "change": self.delta}]
        rows += [{"condition": f"random {i}", "value": r, "change": r - self.baseline} for i, r in enumerate(self.random)]
        df = pd.DataFrame(rows)
        df["relative_change"] = df["change"] / abs(self.baseline) if self.baseline else float("nan")
        df["metric"], df["n_heads"] = self.metric, self.n_heads
        return df

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure(go.Bar(x=[self.label, "random (mean)"], y=[self.delta, self.random_delta],
                               error_y={"type": "data", "array": [0.0, self.random_delta_std]},
                               marker_color=["#1f77b4", "#aaaaaa"]))
        fig.update_layout(title={"text": f"{self.metric} change when ablating {self.n_heads:g} of "
                                         f"{self.total_heads} heads ({self.method})"},
                          yaxis={"title": {"text": f"Δ {self.metric}"}}, height=360)
        return fig


def evaluate_ablation(model: Model, inputs: Any = None, heads: HeadSet | None = None, n_random: int = 5, seed: int = 0,
                      method: str = "zero", mean_from: Any = None, metric: str | Callable = "loss",
                      batch_size: int | None = 8, max_length: int | None = None, label: str = "selected"
                      ) -> AblationResult:
    """Loss (or accuracy) change when ``heads`` are ablated, next to ``n_random`` random sets of equal size.

    ``heads`` is a fixed head set or a per-input mask ``[n_inputs, n_layers, n_heads]`` (then the random
    sets keep each input's count). Metrics are pooled over every real next-token target.

    Defaults: ``inputs=None`` evaluates on the built-in inputs (:func:`~.scores.default_inputs`, 128 tokens
    each); ``heads=None`` ablates the paper's per-input inactive heads of those inputs
    (``score_heads(model, inputs).inactive()``: :data:`~.scores.BEST_SCORE`, 10 % target fraction).
    """
    fn = _metric_fn(metric)
    inputs, batch_size, max_length = resolve_inputs(model, inputs, batch_size, max_length)
    batches = _batches(model, inputs, batch_size, max_length, None)
    if heads is None:
        heads = score_heads(model, inputs, BEST_SCORE, batch_size=batch_size, max_length=max_length).inactive()
        label = label if label != "selected" else f"inactive ({BEST_SCORE}, 10%)"
    mask = head_mask(model, heads)
    n_inputs = sum(b[next(iter(b))].shape[0] for b in batches)
    if mask.dim() == 3 and mask.shape[0] != n_inputs:
        raise ValueError(f"per-input head mask covers {mask.shape[0]} inputs, but {n_inputs} inputs were given")
    means = head_means(model, mean_from) if method == "mean" and mean_from is not None and not isinstance(
        mean_from, (torch.Tensor, Cache)) else mean_from

    def plan(m: torch.Tensor) -> list[Mapping | None]:
        return _plans(model, batches, m, method, means)

    gen = torch.Generator().manual_seed(seed)
    steps = progress(total=2 + n_random, desc="ablation")
    baseline = _evaluate(model, batches, fn)
    steps.update()
    ablated = _evaluate(model, batches, fn, plan(mask))
    steps.update()
    rand = []
    for _ in range(n_random):
        rand.append(_evaluate(model, batches, fn, plan(random_like(mask, gen))))
        steps.update()
    steps.close()
    n_heads = float(mask.sum()) if mask.dim() == 2 else float(mask.sum((1, 2)).float().mean())
    fixed = [] if mask.dim() == 3 else [[int(l), int(h)] for l, h in mask.nonzero().tolist()]
    return AblationResult(metric if isinstance(metric, str) else getattr(metric, "__name__", "metric"), baseline,
                          ablated, rand, n_heads, model.cfg.n_layers * model.cfg.n_heads, method, fixed, label)


# ------------------------------------------------------------------------------------- sweep
@dataclass
class SweepResult(Result):
    """The paper's evaluation: metric vs target fraction p, for a score function and for random heads."""

    score: str
    metric: str
    fractions: list[float]
    thresholds: list[float]
    baseline: float
    values: list[float]  #: metric with dynamic zeroing by the score, per fraction
    random: list[list[float]]  #: per fraction, one value per random seed
    heads_zeroed: list[float]  #: mean share of heads zeroed per input, per fraction
    tolerance: float
    mode: str  #: "dynamic" (score computed inside the ablated pass) or "prepass" (masks from an unablated pass)
    convention: str = "official"  #: how τ_p was read off the CDF (see HeadScores.threshold)
    kind: ClassVar[str] = "inactive_sweep"

    def _within(self, value: float) -> bool:
        if self.metric == "accuracy":
            return value >= self.baseline - self.tolerance
        return value <= self.baseline * (1 + self.tolerance)

    @property
    def percent_inactive(self) -> float:
        """Largest target fraction (in %) whose metric stays within tolerance of the unablated baseline."""
        best = 0.0
        for p, v in zip(self.fractions, self.values):
            if self._within(v):
                best = max(best, p)
        return 100.0 * best

    @property
    def percent_inactive_random(self) -> float:
        best = 0.0
        for p, r in zip(self.fractions, self.random):
            if r and self._within(sum(r) / len(r)):
                best = max(best, p)
        return 100.0 * best

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"fraction": self.fractions, "threshold": self.thresholds,
                             "heads_zeroed": self.heads_zeroed, self.score: self.values,
                             "random_mean": [sum(r) / len(r) if r else float("nan") for r in self.random],
                             "baseline": self.baseline})

    def figure(self):
        import plotly.graph_objects as go

        x = [100 * p for p in self.fractions]
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=x, y=self.values, mode="lines+markers", name=self.score))
        fig.add_trace(go.Scatter(x=x, y=[sum(r) / len(r) if r else None for r in self.random], mode="lines+markers",
                                 name="random heads"))
        fig.add_hline(y=self.baseline, line_dash="dot", annotation_text="no ablation")
        fig.update_layout(title={"text": f"{self.metric} vs % of heads zeroed ({self.score}, {self.mode})"},
                          xaxis={"title": {"text": "target % of heads zeroed (p)"}},
                          yaxis={"title": {"text": self.metric}}, height=380)
        return fig


@dataclass(frozen=True)
class SweepConfig:
    """Options of :func:`inactive_sweep` (everything but the model, its inputs and the calibration scores),
    validated on construction; the defaults are the paper's.

    ``tolerance`` is relative for ``metric="loss"`` (loss may rise by 1 %) and absolute for ``"accuracy"``
    (may drop by 0.01, the paper's "within 1 point"); ``metric`` may also be a callable
    ``(logits, batch) -> (sum, count)``. ``convention`` reads τ_p off the CDF (the official inverse CDF, or
    ``"quantile"``); ``padded_queries`` is the padding rule of the pattern scores. ``batch_size`` /
    ``max_length`` ``None``: all inputs in one pass / no truncation (the built-in inputs' defaults when
    ``inputs=None``). A list of fractions is stored as a tuple.
    """

    score: str = BEST_SCORE  #: one score function (see SCORE_FUNCTIONS; code class names accepted)
    fractions: tuple[float, ...] = PAPER_FRACTIONS  #: target fractions p, each in [0, 1]
    n_random: int = 3  #: random-head baselines per fraction
    seed: int = 0  #: seed of the random heads
    metric: str | Callable = "loss"  #: "loss", "accuracy" or a callable (logits, batch) -> (sum, count)
    tolerance: float = 0.01
    batch_size: int | None = 8
    max_length: int | None = None
    convention: str = "official"  #: THRESHOLD_CONVENTIONS
    padded_queries: str = "drop"  #: PADDED_QUERIES

    def __post_init__(self) -> None:
        name = type(self).__name__
        try:
            ok = isinstance(self.score, str) and len(resolve_scores(self.score)) == 1
        except ValueError:
            ok = False
        require(ok, f"{name}.score", self.score, f"one score function, one of {', '.join(SCORE_FUNCTIONS)}")
        fr = self.fractions
        require(is_sequence(fr) and len(fr) > 0
                and all(is_number(p) and 0 <= p <= 1 for p in fr),
                f"{name}.fractions", fr, "a non-empty sequence of fractions in [0, 1]")
        object.__setattr__(self, "fractions", tuple(fr))
        require(is_int(self.n_random) and self.n_random >= 0, f"{name}.n_random", self.n_random, "an integer >= 0")
        require(is_int(self.seed), f"{name}.seed", self.seed, "an integer")
        require(self.metric in ("loss", "accuracy") or (callable(self.metric) and not isinstance(self.metric, str)),
                f"{name}.metric", self.metric, "'loss', 'accuracy' or a callable (logits, batch) -> (sum, count)")
        require(is_number(self.tolerance) and self.tolerance >= 0, f"{name}.tolerance", self.tolerance,
                "a number >= 0")
        for field_name in ("batch_size", "max_length"):
            v = getattr(self, field_name)
            require(v is None or (is_int(v) and v >= 1), f"{name}.{field_name}", v, "a positive integer or None")
        require(self.convention in THRESHOLD_CONVENTIONS, f"{name}.convention", self.convention,
                f"one of {', '.join(map(repr, THRESHOLD_CONVENTIONS))}")
        require(self.padded_queries in PADDED_QUERIES, f"{name}.padded_queries", self.padded_queries,
                f"one of {', '.join(map(repr, PADDED_QUERIES))}")


def inactive_sweep(model: Model, inputs: Any = None, score: str | None = None, fractions: Sequence[float] | None = None,
                   calibration: HeadScores | None = None, *, config: SweepConfig | None = None,
                   **options: Any) -> SweepResult:
    """The paper's evaluation of one score function.

    For each target fraction ``p``: τ_p from the empirical CDF of ``calibration`` (default: the scores of
    ``inputs`` themselves), dynamic per-input zeroing of the heads past τ_p, and the same number of random
    heads per input. Scores are computed inside the ablated pass (``mode="dynamic"``); only a pattern-based
    score on a backend whose ``attn.hook_pattern`` is not writable falls back to per-input masks from an
    unablated pass (``"prepass"``).

    The options are the fields of :class:`SweepConfig` (``score`` and ``fractions`` also positionally, the
    rest by name, e.g. ``n_random=2, metric="accuracy"``), or one ready ``config=`` (then no option may be
    given besides it). ``inputs=None``: the built-in inputs (:func:`~.scores.default_inputs`: 100 real-text
    passages, 128 tokens).
    """
    given = {k: v for k, v in (("score", score), ("fractions", fractions)) if v is not None}
    cfg = config_from_call(SweepConfig, config, {**given, **options}, "inactive_sweep")
    key = resolve_scores(cfg.score)[0]
    fn = _metric_fn(cfg.metric)
    batches = _batches(model, inputs, cfg.batch_size, cfg.max_length, None)
    prepass = "pattern" in SCORE_FUNCTIONS[key].uses and not model.can_write("blocks.0.attn.hook_pattern")
    unablated = HeadScores(per_input={key: torch.cat([score_heads(model, b, key, padded_queries=cfg.padded_queries)
                                                      .per_input[key] for b in batches])},
                           n_tokens=torch.zeros(0), padded_queries=cfg.padded_queries)
    calib = calibration if calibration is not None else unablated
    gen = torch.Generator().manual_seed(cfg.seed)
    baseline = _evaluate(model, batches, fn)
    thresholds, values, randoms, zeroed = [], [], [], []
    for p in progress(list(cfg.fractions), desc=f"sweep {key}"):
        tau = calib.threshold(key, p, cfg.convention)
        thresholds.append(tau)
        if prepass:
            mask = unablated.inactive(key, threshold=tau)
            values.append(_evaluate(model, batches, fn, _plans(model, batches, mask)))
        else:
            dz = DynamicZeroing(model, key, tau, cfg.padded_queries)
            values.append(_evaluate(model, batches, fn, [dz] * len(batches)))
            mask = torch.cat(dz.flagged) if dz.flagged else torch.zeros(0, model.cfg.n_layers, model.cfg.n_heads,
                                                                            dtype=torch.bool)
        zeroed.append(float(mask.float().mean()) if mask.numel() else 0.0)
        rs = []
        for _ in range(cfg.n_random):
            rs.append(_evaluate(model, batches, fn, _plans(model, batches, random_like(mask, gen))))
        randoms.append(rs)
    return SweepResult(key, cfg.metric, [float(p) for p in cfg.fractions], thresholds, baseline, values, randoms,
                       zeroed, cfg.tolerance, "prepass" if prepass else "dynamic", cfg.convention)


class AblationViews:
    """Typed views of the ``ablation`` / ``sweep`` dicts a result stores (its JSON form), and its table."""

    ablation: dict[str, Any] | None
    sweep: dict[str, Any] | None
    summary_rows: list[dict[str, Any]]

    @property
    def ablation_result(self) -> AblationResult | None:
        return None if self.ablation is None else AblationResult(**self.ablation)

    @property
    def sweep_result(self) -> SweepResult | None:
        return None if self.sweep is None else SweepResult(**self.sweep)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.summary_rows)


__all__ = ["AblationViews", "ablate_heads", "HeadAblation", "ZeroHeads", "head_mask", "head_means", "dynamic_zeroing",
           "DynamicZeroing", "evaluate_ablation", "AblationResult", "inactive_sweep", "SweepConfig", "SweepResult",
           "random_heads", "random_like"]
