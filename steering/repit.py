"""RepIt: Representing Isolated Targets to Steer Language Models (Siu et al., ICLR 2026; arXiv 2509.13281).

RepIt builds a refusal vector for a few TARGET harmful categories that leaves refusal on the other
(non-target) harmful categories intact. The procedure follows the official code (``wang-research-lab/RepIt``):

1. :func:`category_vectors`: for each harmful category ``c``, every layer ``l`` and each end-of-instruction
   position ``p`` (the last ``n_eoi = min(len(eoi_toks), 5)`` chat-template tokens after the instruction),
   ``r_c[p, l] = mean_{x in c} h_l(x)[p] - mean_{x in harmless} h_l(x)[p]`` with ``h_l`` the input of block ``l``
   (``blocks.{l}.hook_resid_pre``); the harmless mean ``mu_minus[p, l]`` is kept as the reference.
2. :func:`select_direction` (COSMIC, naive target vector, rho = 0): evaluation layers are the
   ``int(0.1 L)`` layers whose mean harmful and harmless last-token outputs are least cosine-similar; each
   candidate ``(p, l)`` (layers outside the last 20%) is scored by ablating it on (non-target) harmful
   prompts (cosine to the harmless centroid) plus adding it on harmless prompts (cosine to the harmful
   centroid); candidates whose ablation moves harmless next-token distributions by KL > 0.1 are discarded.
3. :func:`isolate`: reweighting, ridge covariance, Cholesky whitening (with retry), QR basis of the whitened
   non-target span, partial removal ``alpha = 1 - sqrt(1 - rho)`` and un-whitening. With several target
   categories the cleaned per-category vectors are averaged.
4. :func:`search_rho`: rho in {0, .33, .66, .99}, bracket where the non-target attack-success rate (ASR)
   crosses the ceiling, 3 secant/midpoint refinements (2 decimals), argmax target ASR s.t. non-target
   ASR <= ceiling (ties: smaller rho; none feasible: lowest non-target ASR).
5. The intervention (:class:`steering.base.AffineAblate`): at the single selected layer's ``hook_resid_pre``,
   every position, prompt and generation: ``x <- x - (x.r_hat) r_hat + (mu_minus.r_hat) r_hat + coeff r``.
6. :func:`localize`: the correction ``v - v'`` lives in few residual dimensions ("neurons").

Choices where the paper/code is not explicit (also listed in ``docs/steering.md``):

* Judging during the searches uses the refusal log-odds of the first response token
  (:func:`steering.refusal.refusal_scores`; a prompt counts as refused when the score is > 0) instead of
  LlamaGuard generations; ASR = 1 - refusal rate.
* COSMIC representation: the eval-layer outputs at all ``n_eoi`` positions, concatenated; score = mean
  cosine over prompts. The ablation used for scoring and for the KL filter is the single-layer affine
  ablation of step 5 (the intervention RepIt deploys); the steering test adds the naive vector (coeff 1)
  at the same hook, all positions. Harmful prompts for the scores are the non-target ones (as in
  ``run_pipeline_repit.py``); the harmful centroid is theirs.
* Cholesky failure: retried with ``lambda * 10`` up to 6 times. QR columns with ``|R_ii| <= 1e-10 max|R_jj|``
  (linearly dependent non-target vectors) are dropped (the code uses plain QR; identical for independent rows).
* "Share of the correction's norm" held by top-k dims is the squared-norm (energy) share; Gini is the Gini
  coefficient of ``|p|``; kurtosis is Pearson's (normal = 3).
* ``top_k`` (the paper's tail-only construction, not recoverable from the code): ``v_tail = v - p * 1[top-k |p|]``.

A property worth knowing (proved in ``docs/steering.md``, tested in ``tests/steering/test_isolate.py``): because
``C = Rw^T Rw / n + lambda I`` has the non-target span as an invariant subspace, the whitened projection
``L Q Q^T L^-1`` equals the Euclidean orthogonal projector onto ``span(R)``. In exact arithmetic
``v' = v - (1 - sqrt(1 - rho)) P_span(R) v`` for every reweighting and ridge; the whitening only changes the
numerics (which is why the code records condition numbers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from interp.configs import is_int, is_number, is_sequence, require
from interp.progress import progress
from interp.results import Result

from .activations import collect, resid_names
from .base import (AuditFit, SteeringData, SteeringMethod, SteeringVector, has_chat_template,
                   n_prompts, spread)
from .refusal import default_data, kl_divergence, last_logprobs, refusal_scores, refusal_token_ids

REWEIGHTS = ("invnorm", "uniform", "sim")


# ============================================================================ step 3: isolation
@dataclass
class IsolationInfo:
    """Diagnostics of one :func:`isolate_with_info` call (energies are in the whitened metric)."""

    isolated: torch.Tensor  # [d] v'
    correction: torch.Tensor  # [d] v - v'
    projected_energy: float  # ||Q^T L^-1 v||^2
    remaining_energy: float  # ||Q^T L^-1 v'||^2 = (1 - rho) * projected_energy
    removed_fraction: float  # 1 - remaining / projected  (= rho)
    lam: float  # ridge actually used
    cholesky_retries: int
    cond_C: float
    cond_Nw: float
    rank: int  # dimension of the non-target span used


def _weights(R: torch.Tensor, v: torch.Tensor, reweight: str, eps: float) -> torch.Tensor:
    if reweight == "invnorm":
        w = 1.0 / (R.norm(dim=1) + eps)
    elif reweight == "uniform":
        w = torch.ones(R.shape[0], dtype=R.dtype)
    elif reweight == "sim":
        w = (R @ v).abs() / (R.norm(dim=1) * v.norm() + eps) + eps
    else:
        raise ValueError(f"reweight must be one of {REWEIGHTS}, got {reweight!r}")
    return w / w.sum()


def isolate_with_info(target: torch.Tensor, non_targets: torch.Tensor, rho: float, reweight: str = "invnorm",
                      eps: float = 1e-8, max_retries: int = 6) -> IsolationInfo:
    """:func:`isolate` plus its diagnostics (computed in float64)."""
    v = torch.as_tensor(target)
    R = torch.as_tensor(non_targets)
    if v.dim() != 1:
        raise ValueError(f"target must be a vector [d], got shape {tuple(v.shape)}")
    if R.dim() == 1:
        R = R[None]
    if R.dim() != 2 or R.shape[1] != v.shape[0] or R.shape[0] == 0:
        raise ValueError(f"non_targets must be [n, d] with n >= 1 and d = {v.shape[0]}, got {tuple(R.shape)}")
    if not 0.0 <= float(rho) <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    if not (torch.isfinite(v).all() and torch.isfinite(R).all()):
        raise ValueError("target and non_targets must be finite")
    out_dtype = v.dtype if v.is_floating_point() else torch.float32
    v, R = v.double().cpu(), R.double().cpu()
    n, d = R.shape
    Rw = _weights(R, v, reweight, eps)[:, None] * R  # [n, d]
    lam = 1e-4 * float((Rw ** 2).mean()) + 1e-12
    gram = Rw.T @ Rw / n
    eye = torch.eye(d, dtype=torch.float64)
    retries = 0
    while True:
        C = gram + lam * eye
        L, info = torch.linalg.cholesky_ex(C)
        if int(info) == 0:
            break
        if retries >= max_retries:
            raise RuntimeError(f"Cholesky factorisation failed after {retries} ridge increases (lambda={lam:g})")
        lam *= 10.0
        retries += 1
    v_w = torch.linalg.solve_triangular(L, v[:, None], upper=False)  # [d, 1]
    N_w = torch.linalg.solve_triangular(L, Rw.T, upper=False)  # [d, n]
    Q, Rq = torch.linalg.qr(N_w, mode="reduced")
    diag = Rq.diagonal().abs()
    keep = diag > 1e-10 * diag.max().clamp_min(1e-300)
    Q = Q[:, keep]
    coeffs = Q.T @ v_w  # [k, 1]
    proj = Q @ coeffs
    alpha = 1.0 - math.sqrt(1.0 - float(rho))
    v_w_new = v_w - alpha * proj
    v_new = (L @ v_w_new)[:, 0]
    before = float((coeffs ** 2).sum())
    after = float(((Q.T @ v_w_new) ** 2).sum())
    sv_c = torch.linalg.svdvals(C)
    sv_n = torch.linalg.svdvals(N_w)
    return IsolationInfo(
        isolated=v_new.to(out_dtype), correction=(v - v_new).to(out_dtype), projected_energy=before,
        remaining_energy=after, removed_fraction=(1.0 - after / before) if before > 0 else 0.0, lam=lam,
        cholesky_retries=retries, cond_C=float(sv_c.max() / sv_c.min()),
        cond_Nw=float(sv_n.max() / sv_n.min().clamp_min(1e-300)), rank=int(keep.sum()))


def isolate(target: torch.Tensor, non_targets: torch.Tensor, rho: float, reweight: str = "invnorm") -> torch.Tensor:
    """Remove a fraction ``rho`` of ``target``'s component in the non-target span, in a whitened metric.

    Args:
        target: ``[d]`` target-category difference-in-means vector ``v``.
        non_targets: ``[n, d]`` non-target category vectors ``R`` (rows).
        rho: fraction of the whitened projected energy to remove, in ``[0, 1]`` (0: ``v`` unchanged).
        reweight: row weights ``w`` of ``R`` (normalised to sum 1): ``"invnorm"`` (``1/(||R_i|| + eps)``,
            the default), ``"uniform"`` or ``"sim"`` (``|cos(R_i, v)|``).

    Returns:
        ``[d]`` isolated vector ``v'``. Procedure: ``Rw = diag(w) R``; ``lambda = 1e-4 mean(Rw^2) + 1e-12``;
        ``C = Rw^T Rw / n + lambda I = L L^T`` (Cholesky; on failure ``lambda *= 10`` and retry);
        ``v_w = L^-1 v``, ``N_w = L^-1 Rw^T``; ``Q = qr(N_w)``; ``pi = Q Q^T v_w``;
        ``v_w' = v_w - (1 - sqrt(1 - rho)) pi``; ``v' = L v_w'``. Then ``||Q^T L^-1 v'||^2 = (1 - rho) ||Q^T L^-1 v||^2``,
        and the correction ``v - v'`` lies in the span of the non-target vectors.
    """
    return isolate_with_info(target, non_targets, rho, reweight).isolated


# ============================================================================ step 6: localisation
@dataclass
class Localization:
    """Where the correction ``p = v - v'`` lives in the residual basis ("neurons")."""

    k: int  # number of dims reported in ``dims`` (k_for_share unless a k was asked)
    dims: list[int]  # the top-k dims by |p_i|
    share: float  # share of ||p||^2 held by ``dims``
    k_for_share: int  # smallest number of dims holding ``target_share`` of ||p||^2
    target_share: float
    heavy_tail: int  # #dims with |p_i| > mean|p| + 2 std|p| (the code's profile)
    kurtosis: float  # Pearson kurtosis of the entries of p (normal = 3)
    skewness: float
    gini: float  # Gini coefficient of |p| (0: uniform, -> 1: concentrated)
    d: int


def localize(correction: torch.Tensor, share: float = 0.9, k: int | None = None) -> Localization:
    """Top dimensions of a correction vector ``[d]`` and the share of its squared norm they hold."""
    p = torch.as_tensor(correction).double().flatten()
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    d = p.numel()
    energy = p ** 2
    total = float(energy.sum())
    order = torch.argsort(p.abs(), descending=True)
    cum = energy[order].cumsum(0) / max(total, 1e-300)
    k_share = int(torch.searchsorted(cum, torch.tensor([share - 1e-12], dtype=torch.float64)).item()) + 1
    k_share = min(k_share, d)
    kk = k_share if k is None else int(k)
    if not 0 < kk <= d:
        raise ValueError(f"k must be in 1..{d}, got {k}")
    a = p.abs()
    heavy = int((a > a.mean() + 2 * a.std()).sum())
    z = (p - p.mean()) / p.std(unbiased=False).clamp_min(1e-300)
    sorted_a = a.sort().values
    idx = torch.arange(1, d + 1, dtype=torch.float64)
    gini = float(((2 * idx - d - 1) * sorted_a).sum() / (d * sorted_a.sum().clamp_min(1e-300)))
    return Localization(k=kk, dims=order[:kk].tolist(), share=float(cum[kk - 1]) if total > 0 else 0.0,
                        k_for_share=k_share, target_share=share, heavy_tail=heavy,
                        kurtosis=float((z ** 4).mean()), skewness=float((z ** 3).mean()), gini=gini, d=d)


def tail_only(target: torch.Tensor, correction: torch.Tensor, k: int) -> torch.Tensor:
    """``v - p * 1[top-k |p|]``: apply the correction only on its ``k`` largest dimensions."""
    p = torch.as_tensor(correction)
    mask = torch.zeros_like(p, dtype=torch.bool)
    mask[torch.argsort(p.abs(), descending=True)[:k]] = True
    return torch.as_tensor(target) - p * mask


# ============================================================================ step 1: category vectors
@dataclass
class CategoryVectors:
    """Difference-in-means vectors per category at every (position, layer) of ``hook``.

    ``vectors[c]``, ``harmless_mean``: ``[n_pos, len(layers), d]`` (``layers``: the layers computed, sorted, all by
    default; axis 1 is ``layers``, so index by layer number through :meth:`layer_index`, never by assuming
    ``layers == range(L)``); ``positions`` are negative indices (``-n_eoi..-1``, axis 0); ``harmful_post_last`` /
    ``harmless_post_last``: mean ``hook_resid_post`` at the last position ``[n_layers, d]``, row ``l`` = layer ``l``
    (for the evaluation layers of the selection; ``None`` unless every layer was computed); ``counts[c]``: #prompts.
    """

    vectors: dict[str, torch.Tensor]
    harmless_mean: torch.Tensor
    positions: list[int]
    hook: str
    counts: dict[str, int]
    layers: list[int]
    harmful_post_last: torch.Tensor | None = None
    harmless_post_last: torch.Tensor | None = None

    def pos_index(self, position: int) -> int:
        if position not in self.positions:
            raise ValueError(f"position {position} was not computed; positions: {self.positions}")
        return self.positions.index(position)

    def layer_index(self, layer: int) -> int:
        if layer not in self.layers:
            raise ValueError(f"layer {layer} was not computed; layers: {self.layers}")
        return self.layers.index(layer)

    def at(self, category: str, position: int, layer: int) -> torch.Tensor:
        """``r_c[p, l]`` ``[d]``."""
        return self.vectors[category][self.pos_index(position), self.layer_index(layer)]

    def reference(self, position: int, layer: int) -> torch.Tensor:
        """The harmless mean ``mu_minus[p, l]`` ``[d]``."""
        return self.harmless_mean[self.pos_index(position), self.layer_index(layer)]

    def stack(self, categories: Sequence[str], position: int, layer: int) -> torch.Tensor:
        """``[n, d]`` vectors of ``categories`` at ``(position, layer)``."""
        return torch.stack([self.at(c, position, layer) for c in categories])


def category_vectors(model, data: SteeringData, n_eoi: int, hook: str = "hook_resid_pre",
                     batch_size: int = 16, layers: Sequence[int] | None = None) -> CategoryVectors:
    """Step 1: per-category difference-in-means vectors at the last ``n_eoi`` positions of every layer
    (or only of ``layers``: then the forward passes stop after the last of them, and the last-position
    ``hook_resid_post`` means needed by the selection are not computed).

    Results are keyed by layer: ``cv.layers`` is the sorted list of layers computed and axis 1 of every
    tensor follows it (read them with :meth:`CategoryVectors.at` / ``reference`` / ``layer_index``); the
    ``hook_resid_post`` means are indexed by layer number ``0..L-1``. This relies on :func:`collect` returning
    its names in the caller's order (it reads the cache by name), so the all-layer path gives exactly the
    single-layer captures (``tests/steering/test_layer_order.py``; #23 was the pre-fix mislabelling).
    """
    if data.categories is None:
        raise ValueError("RepIt needs category labels for the positive (harmful) prompts")
    positions = list(range(-n_eoi, 0))
    L = model.cfg.n_layers
    every = layers is None
    layers = list(range(L)) if every else sorted({int(x) for x in layers})
    if not layers or not all(0 <= x < L for x in layers):
        raise ValueError(f"layers must be in 0..{L - 1}, got {layers}")
    pre = resid_names(model, hook, layers)
    post = resid_names(model, "hook_resid_post") if every else []
    names = pre + post
    k = len(pre)

    def means(prompts, desc):
        acts = collect(model, prompts, names, positions, batch_size, desc=desc)  # [n, k (+L), P, d]
        post_last = acts[:, k:, -1] if post else None  # [n, L, d]
        return acts[:, :k].mean(0).transpose(0, 1), post_last, n_prompts(prompts)  # [P, k, d]

    harmless, harmless_post, _ = means(data.negative, "harmless")
    vectors, counts, post_sum, total = {}, {}, 0, 0
    for cat in data.category_names:
        mu, post_c, n = means(data.of_category(cat), f"category {cat}")
        vectors[cat] = mu - harmless
        counts[cat] = n
        if post_c is not None:
            post_sum = post_sum + post_c.sum(0)
        total += n
    return CategoryVectors(vectors=vectors, harmless_mean=harmless, positions=positions, hook=hook, counts=counts,
                           layers=layers, harmful_post_last=post_sum / total if post else None,
                           harmless_post_last=harmless_post.mean(0) if post else None)


def exclude_similar(cv: CategoryVectors, targets: Sequence[str], non_targets: Sequence[str], position: int,
                    layer: int, threshold: float = 0.25) -> list[str]:
    """The code's optional ``filter_exclude_categories``: keep non-targets whose vector, after projecting out
    the target centroid, keeps a relative residual norm (sin theta) >= ``threshold``."""
    t = cv.stack(targets, position, layer).mean(0)
    t_hat = t / t.norm().clamp_min(1e-12)
    kept = []
    for c in non_targets:
        r = cv.at(c, position, layer)
        resid = r - (r @ t_hat) * t_hat
        if float(resid.norm() / r.norm().clamp_min(1e-12)) >= threshold:
            kept.append(c)
    return kept


# ============================================================================ step 5: the vectors
def affine_vector(direction: torch.Tensor, reference: torch.Tensor, layer: int, hook: str, coeff: float = 0.0,
                  method: str = "repit", metadata: dict | None = None,
                  tensors: dict | None = None) -> SteeringVector:
    """Single-layer affine direction ablation at ``blocks.{layer}.{hook}``, every position."""
    return SteeringVector(method=method, operation="affine", hooks=(f"blocks.{layer}.{hook}",), direction=direction,
                          reference=reference, scale=coeff, positions=None, tensors=dict(tensors or {}),
                          metadata={"layer": layer, **(metadata or {})})


INTERVENTIONS = ("affine", "ablation")


def intervention_vector(direction: torch.Tensor, cv: "CategoryVectors", position: int, layer: int,
                        intervention: str = "affine", coeff: float = 0.0, metadata: dict | None = None,
                        tensors: dict | None = None) -> SteeringVector:
    """The deployed form of a RepIt-family vector read at ``(position, layer)``.

    ``"affine"`` (the paper's step 5): affine ablation at ``blocks.{layer}.hook_resid_pre`` only, reference
    ``mu_minus[p, l]``, coefficient ``coeff``. ``"ablation"``: the direction projected out of every layer's
    residual stream (COSMIC's linear mode, Arditi et al.'s directional ablation; ``coeff`` unused).
    """
    if intervention == "affine":
        return affine_vector(direction, cv.reference(position, layer), layer, cv.hook, coeff, metadata=metadata,
                             tensors=tensors)
    if intervention == "ablation":
        from .ablation import ablation_vector

        vec = ablation_vector(direction, source_layer=layer, position=position, hook=cv.hook, tensors=tensors,
                              method="repit")
        vec.metadata.update(metadata or {})
        vec.metadata["layer"] = layer
        return vec
    raise ValueError(f"intervention must be one of {INTERVENTIONS}, got {intervention!r}")


def isolated_target(cv: CategoryVectors, targets: Sequence[str], non_targets: Sequence[str], position: int,
                    layer: int, rho: float, reweight: str = "invnorm") -> tuple[torch.Tensor, torch.Tensor, list]:
    """``(v_repit, v_naive, infos)``: per-target isolation, averaged over the targets (step 3)."""
    R = cv.stack(non_targets, position, layer)
    infos = [isolate_with_info(cv.at(t, position, layer), R, rho, reweight) for t in targets]
    v_repit = torch.stack([i.isolated for i in infos]).mean(0).float()
    v_naive = cv.stack(targets, position, layer).mean(0).float()
    return v_repit, v_naive, infos


# ============================================================================ step 2: selection
@dataclass
class Selection(Result):
    """COSMIC-style choice of (position, layer) for the naive target vector."""

    layer: int
    position: int
    eval_layers: list[int]
    candidates: list[dict]  # one row per (position, layer): refusal_score, steering_score, total, kl

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.candidates)

    def figure(self):
        import plotly.express as px

        df = self.to_frame()
        return px.density_heatmap(df, x="layer", y="position", z="total", histfunc="avg",
                                  title=f"COSMIC score (chosen: layer {self.layer}, position {self.position})")


def _global_direction(rep: torch.Tensor) -> torch.Tensor:
    """COSMIC's summary of a prompt set: the mean over prompts and evaluation layers of the last-token
    output ``rep`` ``[n, n_eval, 1, d]``, normalised ``[d]``."""
    m = rep.double().mean(dim=(0, 1, 2))
    return m / (m.norm() + 1e-8)


def _peak_layer(rows: list[dict], key: str, positions: Sequence[int]) -> float:
    """Median over ``positions`` of the layer where ``key`` peaks (COSMIC's filter for position -1)."""
    peaks = []
    for pos in positions:
        cand = [r for r in rows if r["position"] == pos]
        if cand:
            peaks.append(max(cand, key=lambda r: r[key])["layer"])
    if not peaks:
        return float("inf")
    return float(torch.tensor(peaks, dtype=torch.float64).nanmedian())  # lower median, as torch.nanmedian


def select_direction(model, cv: CategoryVectors, targets: Sequence[str], harmful_prompts: Any,
                     harmless_prompts: Any, eval_layer_frac: float = 0.10, discard_last_frac: float = 0.20,
                     kl_threshold: float = 0.1, layers: Sequence[int] | None = None,
                     positions: Sequence[int] | None = None, batch_size: int = 16,
                     intervention: str = "affine") -> Selection:
    """Step 2 (COSMIC, ``select_direction_cosmic.py`` with affine steering): pick ``(position, layer)``.

    * Evaluation layers: the ``max(1, int(eval_layer_frac * L))`` layers whose mean harmful and harmless
      last-token outputs (``hook_resid_post``, row ``l`` of ``cv.harmful_post_last`` = layer ``l``) have the lowest
      cosine similarity; returned sorted, as layer numbers.
    * A prompt set is summarised by the normalised mean, over prompts and evaluation layers, of the last-token
      output. Refusal score of a candidate: cosine between the summary of ``harmful_prompts`` under the
      affine ablation of the naive target vector ``r[p, l]`` (reference ``mu_minus[p, l]``, coefficient 0) and the
      unsteered harmless summary. Steering score: cosine between the summary of ``harmless_prompts`` under the
      affine activation addition (coefficient 1) and the unsteered harmful summary. With
      ``intervention="ablation"`` (COSMIC's linear mode) the ablation is directional ablation at every layer and
      the addition is plain activation addition at the source layer.
    * Discarded: layers in the last ``discard_last_frac`` of the model, candidates whose ablation moves the
      harmless last-position next-token distribution by KL > ``kl_threshold``, and, at position -1, layers
      above both the median peak layer of the refusal scores and that of the steering scores over the other
      positions. The best remaining refusal + steering score wins.
    """
    L = model.cfg.n_layers
    if cv.harmful_post_last is None:
        raise ValueError("select_direction needs category vectors of every layer (category_vectors(..., layers=None))")
    cos = torch.nn.functional.cosine_similarity(cv.harmful_post_last, cv.harmless_post_last, dim=-1)  # [L]
    n_eval = max(1, int(eval_layer_frac * L))
    eval_layers = sorted(torch.argsort(cos)[:n_eval].tolist())
    eval_names = resid_names(model, "hook_resid_post", eval_layers)
    pos_list = list(cv.positions if positions is None else positions)

    def summary(prompts: Any, desc: str) -> torch.Tensor:
        return _global_direction(collect(model, prompts, eval_names, [-1], batch_size, desc=desc))

    base_harmful, base_harmless = summary(harmful_prompts, "harmful baseline"), summary(harmless_prompts, "harmless")
    keep_below = int(L * (1.0 - discard_last_frac))  # as the code's filter_fn
    cand_layers = sorted({int(x) for x in (range(L) if layers is None else layers) if 0 <= int(x) < L})
    rows = []
    for layer in progress(cand_layers, desc="COSMIC layers"):
        for pos in pos_list:
            r = cv.stack(targets, pos, layer).mean(0)
            if not float(r.norm()) > 1e-6:  # e.g. block 0's input at template tokens: no direction at all
                continue
            with intervention_vector(r, cv, pos, layer, intervention, 0.0).apply(model):
                refusal = float(summary(harmful_prompts, "ablate") @ base_harmless)
            if intervention == "affine":
                add = affine_vector(r, cv.reference(pos, layer), layer, cv.hook, coeff=1.0)
            else:  # COSMIC's linear mode: plain activation addition at the source layer
                add = SteeringVector("repit", "add", (f"blocks.{layer}.{cv.hook}",), r, scale=1.0)
            with add.apply(model):
                steer = float(summary(harmless_prompts, "add") @ base_harmful)
            rows.append({"layer": layer, "position": pos, "refusal_score": refusal, "steering_score": steer,
                         "total": refusal + steer, "kl": float("nan"), "status": ""})
    if not rows:
        raise ValueError("every candidate (position, layer) has a zero target vector; choose other layers")
    others = [p for p in pos_list if p != -1]
    limit_refusal = _peak_layer(rows, "refusal_score", others)
    cutoff_steering = _peak_layer(rows, "steering_score", others)
    rows.sort(key=lambda r: -r["total"])
    base = last_logprobs(model, harmless_prompts, None, batch_size)
    chosen = None
    for row in rows:
        layer, pos = row["layer"], row["position"]
        if layer >= keep_below:
            row["status"] = "late layer"
            continue
        if pos == -1 and limit_refusal < layer and cutoff_steering < layer:
            row["status"] = "past peak"
            continue
        r = cv.stack(targets, pos, layer).mean(0)
        abl = intervention_vector(r, cv, pos, layer, intervention, 0.0)
        row["kl"] = kl_divergence(model, harmless_prompts, abl, batch_size, base_logprobs=base)
        if row["kl"] > kl_threshold:
            row["status"] = "kl"
            continue
        row["status"] = "chosen"
        chosen = row
        break
    if chosen is None:
        raise RuntimeError(f"no candidate direction passes the filters (KL <= {kl_threshold}, layer < {keep_below}); "
                           "raise kl_threshold or check the data")
    return Selection(layer=int(chosen["layer"]), position=int(chosen["position"]), eval_layers=eval_layers,
                     candidates=rows)


# ============================================================================ step 4: rho search
@dataclass
class RhoSearch(Result):
    """Every evaluated rho with its target and non-target attack-success rates, and the choice."""

    rho: float
    ceiling: float
    points: list[dict]  # {"rho", "target_asr", "nontarget_asr", "feasible"} sorted by rho
    feasible: bool

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.points)

    def figure(self):
        import plotly.graph_objects as go

        df = self.to_frame()
        fig = go.Figure()
        fig.add_scatter(x=df["rho"], y=df["target_asr"], mode="lines+markers", name="target ASR")
        fig.add_scatter(x=df["rho"], y=df["nontarget_asr"], mode="lines+markers", name="non-target ASR")
        fig.add_hline(y=self.ceiling, line_dash="dash", annotation_text="non-target ceiling")
        fig.add_vline(x=self.rho, line_dash="dot", annotation_text=f"rho={self.rho:.2f}")
        fig.update_layout(title="RepIt rho search", xaxis_title="rho", yaxis_title="attack success rate")
        return fig


def search_rho(evaluate: Callable[[float], tuple[float, float]], grid: Sequence[float] = (0.0, 0.33, 0.66, 0.99),
               ceiling: float = 0.1, n_refine: int = 3, fallback: float = 0.99) -> RhoSearch:
    """Step 4. ``evaluate(rho) -> (target_asr, nontarget_asr)``.

    Evaluates ``grid``; finds the first pair of neighbouring grid points between which the non-target ASR
    crosses ``ceiling``; adds ``n_refine`` secant points (midpoint when the secant is degenerate or lands on a
    known point), rounded to 2 decimals, narrowing the bracket each time. Picks the rho with the highest target
    ASR among those with non-target ASR <= ceiling (ties: smaller rho); if none is feasible, the rho with the
    lowest non-target ASR; if no evaluation gave finite numbers, ``fallback``.
    """
    evals: dict[float, tuple[float, float]] = {}

    def ev(r: float) -> tuple[float, float]:
        r = round(float(r), 2)
        if r not in evals:
            t, nt = evaluate(r)
            evals[r] = (float(t), float(nt))
        return evals[r]

    for r in grid:
        ev(r)
    above = lambda r: evals[r][1] > ceiling  # noqa: E731
    pts = sorted(r for r in evals if math.isfinite(evals[r][1]))
    bracket = next(((a, b) for a, b in zip(pts, pts[1:]) if above(a) != above(b)), None)
    if bracket is not None:
        lo, hi = bracket
        for _ in range(n_refine):
            a_lo, a_hi = evals[lo][1], evals[hi][1]
            cand = lo + (ceiling - a_lo) * (hi - lo) / (a_hi - a_lo) if a_hi != a_lo else (lo + hi) / 2
            cand = round(cand, 2)
            if not lo < cand < hi or cand in evals:
                cand = round((lo + hi) / 2, 2)
            if not lo < cand < hi or cand in evals:
                break
            ev(cand)
            if not math.isfinite(evals[cand][1]):
                break
            if above(cand) == above(lo):
                lo = cand
            else:
                hi = cand
    valid = [r for r in sorted(evals) if math.isfinite(evals[r][0]) and math.isfinite(evals[r][1])]
    feasible = [r for r in valid if evals[r][1] <= ceiling]
    if feasible:
        best = max(feasible, key=lambda r: (evals[r][0], -r))
    elif valid:
        best = min(valid, key=lambda r: (evals[r][1], r))
    else:
        best = fallback
    points = [{"rho": r, "target_asr": evals[r][0], "nontarget_asr": evals[r][1],
               "feasible": bool(evals[r][1] <= ceiling)} for r in sorted(evals)]
    return RhoSearch(rho=float(best), ceiling=float(ceiling), points=points, feasible=bool(feasible))


# ============================================================================ the method
@dataclass
class RepItConfig:
    """Options of :class:`RepIt` (defaults from the paper's code).

    targets: target categories (grouped: isolated per category, then averaged); non_targets: ``None`` = every
    other category of the data. ``layer``/``position``: skip the COSMIC selection when both are set; ``rho``:
    skip the search when set. ``nontarget_ceiling``: max non-target ASR in the rho search (paper: 0.1);
    ``nontarget_retain``: if set, the ceiling is instead ``1 - retain * baseline non-target refusal rate``.
    ``refusal_tokens``: ids that start a refusal (``None``: :func:`steering.refusal.refusal_token_ids`).
    ``n_eoi``: end-of-instruction positions (``None``: from the chat template, at most 5; the last token alone
    when the tokenizer has no chat template).
    ``exclude_threshold``: the optional near-duplicate filter (sin theta < threshold dropped; ``None``: off).
    ``top_k``: keep only the top-k dims of the correction (tail-only vector; ``None``: full correction).
    ``intervention``: ``"affine"`` (the paper: single-layer affine ablation) or ``"ablation"`` (the vector projected
    out of every layer, COSMIC's linear mode); see :func:`intervention_vector`.
    ``max_select_prompts``: prompts per set used by the COSMIC selection and the rho search.
    """

    targets: tuple[str, ...] = ("bio", "chem", "nuclear")
    non_targets: tuple[str, ...] | None = None
    hook: str = "hook_resid_pre"
    n_eoi: int | None = None
    reweight: str = "invnorm"
    layer: int | None = None
    position: int | None = None
    candidate_layers: tuple[int, ...] | None = None
    candidate_positions: tuple[int, ...] | None = None
    eval_layer_frac: float = 0.10
    discard_last_frac: float = 0.20
    kl_threshold: float = 0.1
    rho: float | None = None
    rho_grid: tuple[float, ...] = (0.0, 0.33, 0.66, 0.99)
    n_refine: int = 3
    nontarget_ceiling: float = 0.1
    nontarget_retain: float | None = None
    coeff: float = 0.0
    intervention: str = "affine"
    refusal_tokens: tuple[int, ...] | None = None
    exclude_threshold: float | None = None
    top_k: int | None = None
    localize_share: float = 0.9
    max_select_prompts: int | None = 32
    batch_size: int = 16


class RepIt(SteeringMethod):
    """RepIt concept-isolated refusal vectors (see the module docstring for the procedure).

    ``fit(model, data, val)``: ``data`` (train) gives the category vectors; ``val`` (default: ``data``) drives
    the selection and the rho search. Returns the RepIt :class:`SteeringVector` (affine ablation at the selected
    layer). After a fit: ``vectors_`` (``"natural"``: the naive target vector, ``"nontarget"``: the
    count-weighted mean of non-target vectors, ``"projection"``: the removed component only, ``"repit"``),
    ``selection_``, ``rho_search_``, ``localization_``, ``category_vectors_``, ``isolation_``.
    """

    name = "repit"
    config_class = RepItConfig
    needs_categories = True
    audit_title = "Steering (RepIt concept-isolated refusal vectors)"

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """The names (:meth:`SteeringMethod.check_options`) and the values that need no model or data: target
        lists of category names, ``reweight``/``intervention`` from their sets, ``rho``, ``nontarget_retain``,
        ``nontarget_ceiling`` and ``localize_share`` in [0, 1], layer lists and sizes that are integers
        (``ValueError`` naming the method and the option)."""
        super().check_options(options)

        def check(key: str, ok: Callable[[Any], bool], expected: str) -> None:
            if key in options:
                require(ok(options[key]), f"method 'repit' option {key!r}", options[key], expected)

        def names(v: Any) -> bool:
            return is_sequence(v) and len(v) > 0 and all(isinstance(x, str) and x for x in v)

        def unit(v: Any) -> bool:
            return is_number(v) and 0.0 <= v <= 1.0

        check("targets", names, "a non-empty list of category names")
        check("non_targets", lambda v: v is None or names(v), "None or a non-empty list of category names")
        check("reweight", lambda v: v in REWEIGHTS, f"one of {', '.join(REWEIGHTS)}")
        check("intervention", lambda v: v in INTERVENTIONS, f"one of {', '.join(INTERVENTIONS)}")
        for key in ("rho", "nontarget_retain"):
            check(key, lambda v: v is None or unit(v), "None or a number in [0, 1]")
        check("nontarget_ceiling", unit, "a number in [0, 1]")
        check("localize_share", lambda v: is_number(v) and 0.0 < v <= 1.0, "a number in (0, 1]")
        check("rho_grid", lambda v: is_sequence(v) and len(v) > 0 and all(unit(x) for x in v),
              "a non-empty list of numbers in [0, 1]")
        for key in ("candidate_layers",):
            check(key, lambda v: v is None or (is_sequence(v) and len(v) > 0 and all(is_int(x) and x >= 0 for x in v)),
                  "None or a non-empty list of layer numbers >= 0")
        check("layer", lambda v: v is None or (is_int(v) and v >= 0), "None or a layer number >= 0")
        check("position", lambda v: v is None or (is_int(v) and v < 0), "None or a negative position")
        for key in ("n_eoi", "top_k", "max_select_prompts"):
            check(key, lambda v: v is None or (is_int(v) and v >= 1), "None or an integer >= 1")
        for key in ("batch_size", "n_refine"):
            check(key, lambda v: is_int(v) and v >= (1 if key == "batch_size" else 0),
                  "an integer >= 1" if key == "batch_size" else "an integer >= 0")

    @classmethod
    def for_audit(cls, model, options: dict[str, Any], val_per_category: int) -> "RepIt":
        """RepIt at the audit's reduced sizes: the rho search keeps 90% of the non-target baseline refusal
        (``nontarget_retain=0.9``), the selection and search use ``max(8, 4 * val_per_category)`` prompts per
        set, and unless a layer and position are fixed the candidate layers are every third layer of the first
        80% (all layers when that leaves at most 6). Options given win over each of these."""
        opts = {"nontarget_retain": 0.9, "max_select_prompts": max(8, val_per_category * 4), **options}
        if "candidate_layers" not in options and (opts.get("layer") is None or opts.get("position") is None):
            top = model.cfg.n_layers - int(0.2 * model.cfg.n_layers)
            opts["candidate_layers"] = tuple(range(0, top, 3)) if top > 6 else None
        return cls(**opts)

    def audit_fit(self, model, train: SteeringData, val: SteeringData) -> AuditFit:
        """The fit, with the natural (non-isolated) target vector as a baseline condition, the target categories,
        the chosen rho and the localisation of the correction."""
        vec = self.fit(model, train, val)
        loc = self.localization_
        return AuditFit(vec, baselines={"natural": self.vectors_["natural"]}, targets=list(self.config.targets),
                        rho=float(vec.metadata["rho"]), dims_90=None if loc is None else int(loc.k_for_share))

    def fit(self, model, data: SteeringData | None = None, val: SteeringData | None = None) -> SteeringVector:
        """Fit on ``data``, select and search on ``val``. ``data=None``: the built-in categorised refusal set
        (:func:`steering.refusal.default_data`, train split) and, unless given, ``val`` its val split; otherwise
        ``val=None`` reuses ``data``."""
        c = self.config
        if data is None:
            data = default_data(model)
            val = default_data(model, "val") if val is None else val
        val = val if val is not None else data
        if data.categories is None or val.categories is None:
            raise ValueError("RepIt needs category labels on the harmful prompts (SteeringData.categories)")
        if c.reweight not in REWEIGHTS:
            raise ValueError(f"reweight must be one of {REWEIGHTS}, got {c.reweight!r}")
        if c.intervention not in INTERVENTIONS:
            raise ValueError(f"intervention must be one of {INTERVENTIONS}, got {c.intervention!r}")
        targets = list(c.targets)
        missing = [t for t in targets if t not in data.category_names]
        if not targets or missing:
            raise ValueError(f"target categories {missing or targets} not in the data; categories: {data.category_names}")
        non_targets = list(c.non_targets) if c.non_targets is not None else \
            [x for x in data.category_names if x not in targets]
        if not non_targets:
            raise ValueError("RepIt needs at least one non-target category")
        bad = [x for x in non_targets if x not in data.category_names or x in targets]
        if bad:
            raise ValueError(f"non-target categories {bad} are missing from the data or are targets")
        n_eoi = c.n_eoi
        if n_eoi is None:
            if model.tokenizer is None:
                raise ValueError("set RepItConfig.n_eoi for models without a tokenizer")
            from .refusal import eoi_length
            # without a chat template there are no end-of-instruction tokens: the last prompt token alone
            n_eoi = eoi_length(model.tokenizer) if has_chat_template(model.tokenizer) else 1

        cap = c.max_select_prompts
        val_t = spread(val.of_category(*targets), cap)
        val_nt = spread(val.of_category(*non_targets), cap)
        val_harmless = spread(val.negative, cap)

        fixed = c.layer is not None and c.position is not None
        cv = category_vectors(model, data, n_eoi, c.hook, c.batch_size, layers=[int(c.layer)] if fixed else None)
        self.category_vectors_ = cv

        if fixed:
            layer, pos = int(c.layer), int(c.position)
            cv.pos_index(pos)
            self.selection_ = None
        else:
            sel = select_direction(model, cv, targets, val_nt, val_harmless, c.eval_layer_frac, c.discard_last_frac,
                                   c.kl_threshold, c.candidate_layers, c.candidate_positions, c.batch_size,
                                   c.intervention)
            layer, pos = sel.layer, sel.position
            self.selection_ = sel
        if c.exclude_threshold is not None:
            non_targets = exclude_similar(cv, targets, non_targets, pos, layer, c.exclude_threshold) or non_targets
        def build(direction: torch.Tensor, metadata: dict | None = None, tensors: dict | None = None):
            return intervention_vector(direction, cv, pos, layer, c.intervention, c.coeff, metadata, tensors)

        def vector_at(rho: float) -> SteeringVector:
            v, _, _ = isolated_target(cv, targets, non_targets, pos, layer, rho, c.reweight)
            return build(v)

        if c.rho is not None:
            rho = float(c.rho)
            self.rho_search_ = None
        else:
            if c.refusal_tokens is not None:
                tokens = list(c.refusal_tokens)
            elif model.tokenizer is not None:
                tokens = refusal_token_ids(model.tokenizer)
            else:
                raise ValueError("set RepItConfig.refusal_tokens for models without a tokenizer")
            base_nt = float((refusal_scores(model, val_nt, tokens, None, c.batch_size) > 0).float().mean())
            ceiling = c.nontarget_ceiling if c.nontarget_retain is None else 1.0 - c.nontarget_retain * base_nt

            def evaluate(rho: float) -> tuple[float, float]:
                vec = vector_at(rho)
                t = float((refusal_scores(model, val_t, tokens, vec, c.batch_size) <= 0).float().mean())
                nt = float((refusal_scores(model, val_nt, tokens, vec, c.batch_size) <= 0).float().mean())
                return t, nt
            self.rho_search_ = search_rho(evaluate, c.rho_grid, ceiling, c.n_refine)
            rho = self.rho_search_.rho

        v_repit, v_naive, infos = isolated_target(cv, targets, non_targets, pos, layer, rho, c.reweight)
        correction = v_naive - v_repit
        self.isolation_ = infos
        self.localization_ = localize(correction, c.localize_share) if correction.norm() > 0 else None
        if c.top_k is not None:
            v_repit = tail_only(v_naive, correction, c.top_k)
        counts = torch.tensor([cv.counts[x] for x in non_targets], dtype=torch.float32)
        v_nontarget = (cv.stack(non_targets, pos, layer) * counts[:, None]).sum(0) / counts.sum()
        meta = {"position": pos, "hook": c.hook, "rho": rho, "targets": targets, "non_targets": non_targets,
                "n_eoi": n_eoi, "reweight": c.reweight, "top_k": c.top_k, "intervention": c.intervention,
                "localization": None if self.localization_ is None else
                {k: getattr(self.localization_, k) for k in ("k_for_share", "target_share", "heavy_tail",
                                                              "kurtosis", "skewness", "gini", "d")}}
        tensors = {"naive": v_naive, "correction": correction, "nontarget": v_nontarget}
        repit = build(v_repit, meta, tensors)
        base_meta = {"position": pos, "hook": c.hook, "intervention": c.intervention}
        self.vectors_ = {
            "natural": build(v_naive, {**base_meta, "variant": "natural"}),
            "nontarget": build(v_nontarget, {**base_meta, "variant": "nontarget"}),
            "repit": repit,
        }
        if correction.norm() > 0:
            self.vectors_["projection"] = build(correction, {**base_meta, "variant": "projection"})
        return repit


__all__ = ["isolate", "isolate_with_info", "IsolationInfo", "localize", "Localization", "tail_only",
           "category_vectors", "CategoryVectors", "exclude_similar", "select_direction", "Selection", "search_rho",
           "RhoSearch", "RepIt", "RepItConfig", "affine_vector", "intervention_vector", "isolated_target", "REWEIGHTS",
           "INTERVENTIONS"]
