"""Gradient components of next-token training (Rofin, Naghiyev & Hahn, ICLR 2026, "seemingly useless features").

Fix a residual-stream site ``k`` (a hook name such as ``blocks.1.hook_resid_post``) and a position ``i``.
Let ``L = mean_{b, j} L_j`` be the next-token loss (``L_j``: logits at ``j`` predicting token ``j+1``) and
``L^{sg}`` the same loss from a forward in which the single vector ``r_i^k`` is replaced by
``stopgrad(r_i^k)`` (same values, no gradient through it; an out-of-place edit by an ``interp``
intervention). Then (Prop. 3.1)

* ``direct     = ∇ L_i/N − ∇ L_i^{sg}/N``                 (the immediate prediction, through ``r_i^k``),
* ``precached  = ∇ Σ_{j≠i} L_j/N − ∇ Σ_{j≠i} L_j^{sg}/N`` (future losses reaching ``r_i^k`` via attention),
* ``shared     = ∇ L^{sg}``                               (everything that bypasses ``r_i^k``),
* ``full       = ∇ L``,

with ``N`` the number of (row, position) loss terms (``B·(S−1)`` without padding; the official code's
``L_i/(S−1)`` for a batch-mean ``L_i``). Each part is computed by its *own* backward pass (it is not
obtained as a remainder), so ``direct + precached + shared == full`` is a real check of the hooks and
of the capture layer's gradient path, not an identity.

Also here: the myopic attention of Wu et al. (2024) as a ``transformers`` attention implementation
(:func:`register_myopic_attention`), which removes the pre-cached component.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Mapping

import numpy as np
import torch

from interp.model import requires_grad as _require_grad
from interp.results import Result

COMPONENTS = ("direct", "precached", "shared", "full")


# ----------------------------------------------------------------------------------------- result
@dataclasses.dataclass
class GradientDecomposition(Result):
    """The four gradients at one ``(site, position)``; each a dict parameter name -> gradient tensor
    (same shape as the parameter). Index like a dict: ``dec["direct"]``."""

    site: str
    position: int
    direct: dict[str, torch.Tensor]
    precached: dict[str, torch.Tensor]
    shared: dict[str, torch.Tensor]
    full: dict[str, torch.Tensor]
    loss: float

    kind = "gradient_decomposition"

    def __getitem__(self, key: str) -> dict[str, torch.Tensor]:
        if key not in COMPONENTS:
            raise KeyError(f"unknown component {key!r}; one of {COMPONENTS}")
        return getattr(self, key)

    def keys(self):
        return COMPONENTS

    def norm(self, component: str) -> float:
        """Global L2 norm of one component over all parameters."""
        return float(torch.sqrt(sum((g.double() ** 2).sum() for g in self[component].values())))

    def max_abs_error(self) -> float:
        """``max |direct + precached + shared − full|`` over all parameter entries."""
        return max(float((self.direct[n] + self.precached[n] + self.shared[n] - self.full[n]).abs().max())
                   for n in self.full) if self.full else 0.0

    def to_frame(self):
        """One row per (parameter, component): the gradient's L2 norm."""
        import pandas as pd
        rows = [{"parameter": n, "component": c, "norm": float(self[c][n].double().norm())}
                for n in self.full for c in COMPONENTS]
        return pd.DataFrame(rows)

    def figure(self):
        """Grouped bars: per-parameter gradient norm of each component."""
        import plotly.express as px
        fig = px.bar(self.to_frame(), x="parameter", y="norm", color="component", barmode="group",
                     title=f"Gradient components at {self.site}, position {self.position}")
        return fig


# ----------------------------------------------------------------------------------------- core
def stop_gradient_at(position: int):
    """An intervention ``fn(tensor, ctx)`` that detaches the vector at absolute ``position`` (out of place):
    ``[batch, pos, ...]`` -> same values, no gradient through that position."""
    def fn(t: torch.Tensor, ctx) -> torch.Tensor:
        if t.dim() < 2 or not -t.shape[1] <= position < t.shape[1]:
            raise ValueError(f"stop-gradient position {position} outside the activation's {t.shape[1] if t.dim() > 1 else 0} positions")
        keep = torch.ones(t.shape[1], dtype=torch.bool, device=t.device)
        keep[position] = False
        keep = keep.view(1, -1, *([1] * (t.dim() - 2)))
        return torch.where(keep, t, t.detach())
    return fn


def _per_position_nll(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[batch, pos-1]`` next-token NLL, zero where the pair is not two real tokens."""
    logp = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)   # no float64 -> 32
    nll = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return nll * (mask[:, 1:] * mask[:, :-1]).to(nll.dtype)


def default_tokens(model, n: int = 8, length: int = 32) -> torch.Tensor:
    """Token ids ``[n, length]`` of ``n`` built-in text passages (:func:`interp.data.text_passages`), each cut to
    its first ``length`` tokens (every passage has more): what :func:`decompose_gradient` reads when given no
    tokens."""
    from interp.data import text_passages
    rows = [model.tokenize(t)["input_ids"][0, :length] for t in text_passages(n)]
    short = [len(r) for r in rows if len(r) < length]
    if short:
        raise ValueError(f"a built-in passage has only {min(short)} tokens, fewer than length={length}")
    return torch.stack(rows)


def decompose_gradient(model, tokens: torch.Tensor | None = None, site: str | None = None,
                       position: int | None = None, attention_mask: torch.Tensor | None = None,
                       params: Mapping[str, torch.Tensor] | None = None) -> GradientDecomposition:
    """Split the gradient of the mean next-token loss on ``tokens`` into direct / pre-cached / shared parts
    with respect to the residual vector at ``(site, position)``.

    Args:
        model: an ``interp`` :class:`~interp.Model` (any backend where gradients flow and ``site`` is writable).
        tokens: ``[batch, seq]`` token ids; default :func:`default_tokens` (8 built-in text passages cut to their
            first 32 tokens).
        site: one hook name (e.g. ``"blocks.1.hook_resid_post"``; ``"hook_embed"``-like sites work too);
            default the residual stream after the middle block, ``blocks.{n_layers // 2}.hook_resid_post``.
        position: absolute position ``i`` in ``0..seq-2`` (the loss at ``i`` predicts token ``i+1``); every
            row must have a real token at ``i`` and ``i+1``; default the middle position ``seq // 2``.
        attention_mask: ``[batch, seq]`` (1 = real token), optional.
        params: name -> parameter tensors to differentiate (default: ``model.parameters()`` named ``p0, p1, ...``
            in order; pass ``dict(hf_model.named_parameters())`` for readable names).
    Returns:
        :class:`GradientDecomposition` with four dicts name -> gradient.
    """
    if tokens is None:
        tokens = default_tokens(model)
    if site is None:
        site = f"blocks.{model.cfg.n_layers // 2}.hook_resid_post"
    if position is None and isinstance(tokens, torch.Tensor) and tokens.dim() == 2:
        position = tokens.shape[1] // 2
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int):
        raise ValueError("tokens must be an integer tensor [batch, seq]")
    S = tokens.shape[1]
    if S < 2:
        raise ValueError(f"tokens need at least 2 positions to have a next-token loss, got {S}")
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position <= S - 2:
        raise ValueError(f"position must be an integer in 0..{S - 2} (seq={S}), got {position!r}")
    names = model.hook_names(site)
    if len(names) != 1:
        raise ValueError(f"site must name exactly one hook, {site!r} matches {len(names)}")
    site = names[0]
    if not model.can_write(site):
        raise ValueError(f"site {site!r} cannot be intervened on by this backend; pick a residual-stream hook")
    mask = torch.ones_like(tokens) if attention_mask is None else attention_mask.to(tokens.device)
    if mask.shape != tokens.shape:
        raise ValueError(f"attention_mask shape {tuple(mask.shape)} != tokens shape {tuple(tokens.shape)}")
    if not bool((mask[:, position] * mask[:, position + 1]).all()):
        raise ValueError(f"every row needs real tokens at positions {position} and {position + 1}")
    if params is None:
        params = {f"p{i}": p for i, p in enumerate(model.parameters()) if p.is_floating_point()}
    if not params:
        raise ValueError("no parameters to differentiate")
    names_p, tensors = list(params), list(params.values())

    with _require_grad(params):
        nll = _per_position_nll(model.forward_with_grad(tokens, attention_mask=mask), tokens, mask)
        with model.intervene({site: stop_gradient_at(position)}):
            nll_sg = _per_position_nll(model.forward_with_grad(tokens, attention_mask=mask), tokens, mask)
        n = (mask[:, 1:] * mask[:, :-1]).sum().clamp_min(1).to(nll.dtype)
        total, total_sg = nll.sum() / n, nll_sg.sum() / n
        imm, imm_sg = nll[:, position].sum() / n, nll_sg[:, position].sum() / n
        scalars = {"direct": imm - imm_sg, "precached": (total - imm) - (total_sg - imm_sg),
                   "shared": total_sg, "full": total}
        out = {}
        for c, s in scalars.items():
            gs = torch.autograd.grad(s, tensors, retain_graph=True, allow_unused=True)
            out[c] = {nm: (torch.zeros_like(p) if g is None else g).detach() for nm, p, g in zip(names_p, tensors, gs)}
    return GradientDecomposition(site=site, position=position, loss=float(total.detach()), **out)


# ----------------------------------------------------------------------------------------- myopic attention
def myopic_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention with myopic gradients (Wu et al. 2024): the forward values equal ordinary attention,
    but the keys and values of *other* positions enter detached, so the loss at ``j`` sends no gradient into
    the computation at positions ``< j``; only the diagonal (self) term keeps its key/value gradient.

    ``query`` ``[B, H, Q, D]``, ``key``/``value`` ``[B, H(kv), K, D]`` -> ``([B, Q, H, D], [B, H, Q, K])``.
    Grouped key/value heads are repeated to the query heads.
    """
    B, H, Q, D = query.shape
    if key.shape[1] != H:
        rep = H // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    K = key.shape[-2]
    scaling = D ** -0.5 if scaling is None else scaling
    qpos = torch.arange(Q, device=query.device)[:, None] + (K - Q)
    kpos = torch.arange(K, device=query.device)[None, :]
    diag = kpos == qpos                                                  # [Q, K]
    off = (query @ key.detach().transpose(-1, -2)) * scaling
    self_term = (query * key[..., K - Q:, :]).sum(-1, keepdim=True) * scaling   # [B, H, Q, 1], live key
    scores = torch.where(diag, self_term, off)
    scores = scores.masked_fill(kpos > qpos, float("-inf"))
    if attention_mask is not None:
        m = attention_mask[..., -K:]
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m
    probs = scores.softmax(-1, dtype=torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype)
    probs = probs.to(value.dtype)
    if dropout and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    p_diag = (probs * diag).sum(-1, keepdim=True)
    out = torch.where(diag, 0.0, probs) @ value.detach() + p_diag * value[..., K - Q:, :]
    return out.transpose(1, 2).contiguous(), probs


def register_myopic_attention(name: str = "myopic") -> str:
    """Register :func:`myopic_attention` with ``transformers`` (attention and mask interfaces) under ``name``;
    then ``config._attn_implementation = name`` (or ``model.set_attn_implementation(name)``) makes an HF
    model (GPT-2, Llama, ...) train myopically. Returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    AttentionInterface.register(name, myopic_attention)
    AttentionMaskInterface.register(name, eager_mask)
    return name


# ----------------------------------------------------------------------------------------- feature influence
@dataclasses.dataclass
class FeatureInfluence(Result):
    """Cumulative influence of each gradient component on each tracked feature over one re-run of training.

    ``influence[optimizer][component]`` is ``[n_probes]``: ``Σ_t Δ_c(t) · ∇R(θ_t)`` (positive = the component
    moves the feature toward its final form); ``probes`` lists ``(feature, site, position)`` in the same order;
    ``curves[optimizer][component]`` is ``[n_steps, n_probes]`` (the running sum). ``risk_scale`` is the factor of
    the risk: 1.0 is the official ``R = mse(⟨w, r_θ⟩, ⟨w, r_θ*⟩)``; 0.5 the digest's ``½·MSE`` (ours until issue #33:
    every influence half the official one).

    ``influence_centered`` (ours, a diagnostic; same layout; ``None`` when not computed): the same sums on the
    *centred* risk ``R_c = risk_scale · var_b(⟨w, r_θ⟩ − ⟨w, r_θ*⟩)``, i.e. on the feature's variation across
    sequences only. The official risk is ``R = R_c + risk_scale · (mean_b(⟨w, r_θ⟩ − ⟨w, r_θ*⟩))²``: the rest of
    ``influence`` is credit for moving the batch *mean* of ``⟨w, r⟩`` toward its final value (e.g. learning the
    unigram distribution), which is not the feature."""

    probes: list[tuple[str, str, int]]
    influence: dict[str, dict[str, torch.Tensor]]
    curves: dict[str, dict[str, torch.Tensor]]
    risk: torch.Tensor          # [n_steps, n_probes]
    influence_centered: dict[str, dict[str, torch.Tensor]] | None = None
    curves_centered: dict[str, dict[str, torch.Tensor]] | None = None
    risk_scale: float = 1.0

    kind = "feature_influence"

    def to_frame(self):
        import pandas as pd
        cen = self.influence_centered
        rows = [{"optimizer": o, "component": c, "feature": f, "site": s, "position": p, "influence": float(v[k]),
                 "influence_centered": float(cen[o][c][k]) if cen is not None else float("nan")}
                for o, comps in self.influence.items() for c, v in comps.items()
                for k, (f, s, p) in enumerate(self.probes)]
        return pd.DataFrame(rows)

    def figure(self, optimizer: str = "adam"):
        import plotly.express as px
        df = self.to_frame()
        df = df[df.optimizer == optimizer]
        df["probe"] = df.feature + "@" + df.site + ":" + df.position.astype(str)
        return px.bar(df, x="probe", y="influence", color="component", barmode="group",
                      title=f"Cumulative feature influence ({optimizer})")


def _flat(gs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in gs.values()])


def _batched_vjp(out: torch.Tensor, tensors: list[torch.Tensor], cot: torch.Tensor, chunk: int) -> torch.Tensor:
    """``[M, n_params]``: ``J^T c`` for each of the ``M`` cotangents ``cot`` ``[M, *out.shape]`` (vmapped backward
    passes, ``chunk`` at a time; parameters the output does not reach get zeros)."""
    rows = []
    for lo in range(0, cot.shape[0], chunk):          # chunks bound the memory of the vmapped backward
        c = cot[lo:lo + chunk]
        gs = torch.autograd.grad(out, tensors, grad_outputs=c, is_grads_batched=True, retain_graph=True,
                                 allow_unused=True)
        rows.append(torch.cat([(torch.zeros((c.shape[0], t.numel()), dtype=c.dtype, device=c.device) if g is None
                                else g.reshape(c.shape[0], -1)) for t, g in zip(tensors, gs)], 1))
    return torch.cat(rows) if rows else cot.new_zeros((0, sum(t.numel() for t in tensors)))


def _at_positions(values: torch.Tensor, positions: torch.Tensor, seq: int) -> torch.Tensor:
    """``values`` ``[M, batch, d]`` placed at ``positions`` ``[M]`` of zero tensors ``[M, batch, seq, d]``."""
    out = values.new_zeros((values.shape[0], values.shape[1], seq, values.shape[2]))
    out[torch.arange(values.shape[0], device=values.device), :, positions] = values
    return out


def train_with_influence(model, params: Mapping[str, torch.Tensor], batches,
                         probes: list[tuple[str, str, int, torch.Tensor, torch.Tensor]],
                         lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                         risk_context=None, risk_scale: float = 1.0, centered: bool = True,
                         chunk: int = 8) -> FeatureInfluence:
    """Re-run Adam training on ``batches`` and accumulate the feature-mismatch influence of each component.

    ``probes``: ``(feature_name, site, position, w, r_star)`` with ``w`` ``[d]`` a probe direction fitted on the
    final model θ* and ``r_star`` ``[n_batches, batch]`` the values ``⟨w, r_{θ*}⟩`` for each batch (precomputed with
    θ*). Any number of probes over any sites and positions (the official Majority run: 3 features x layers 1-2 x
    positions 2-19 = 108). At each step, for each probe, the risk ``R(θ) = risk_scale · mean_b (⟨w, r_θ⟩ −
    ⟨w, r_θ*⟩)²`` (official: ``risk_scale = 1``, ``torch.nn.functional.mse_loss``; ``0.5`` is the digest's ``½``,
    ours until issue #33), ``∇_θ R``, and the step each component alone would cause: SGD ``lr·g_c``; Adam a
    separate first moment per component and per ``(site, position)`` with the *shared* second moment of the full
    gradient and the usual bias correction (the official ``compute_adam_param_delta``). Influence ``+= Δ_c · ∇R``.
    The model is then updated by Adam on the full gradient (``θ ← θ − Δ``). ``batches``: iterable of
    ``[batch, seq]`` ids. Since the Adam moments are linear in the gradient and the second moment is shared, the
    three Adam steps sum to the real Adam update, so the ``full`` influence is ``Σ_t (θ_t − θ_{t+1})·∇R(θ_t)``
    exactly (tested). The loss is the next-token loss at *every* position (the official Majority sampler has no
    loss mask). The official run also tracks one extra batch after the last update; here every tracked step is a
    training step.

    Vectorised (no Python loop over positions, features or probes; one loop over the sites, i.e. layers): with
    ``J`` the Jacobian of the site's activation ``r_i`` w.r.t. θ, the chain rule gives exactly the official
    stop-gradient parts: ``shared = ∇L − J^T ∂L/∂r_i``, ``direct = J^T ∂(L_i/N)/∂r_i``, ``pre-cached =
    J^T ∂L/∂r_i − direct`` (``∂L/∂r`` from the one backward of the full loss; ``∂L_i/∂r_i`` for every tracked
    position from one vmapped backward of the per-position losses) and ``∇R = J^T ∂R/∂r_i`` with the closed form
    ``∂R/∂r_i = risk_scale · 2/B · (⟨w, r⟩ − target) w``. All ``J^T c`` of a site come from vmapped backward passes
    (``is_grads_batched``), ``chunk`` cotangents at a time (memory), and the influences of all probes from one
    einsum per optimizer. Tested equal to :func:`decompose_gradient` (separate stop-gradient forwards) and a
    per-probe ``∇R``.

    ``centered`` (ours, a diagnostic): also accumulate the same sums on the centred risk
    (``FeatureInfluence.influence_centered``; one more cotangent per probe). ``risk_context``: optional
    zero-argument callable returning a context manager under which the ``∇R`` forward runs. The official code
    computes ``∇R`` with ordinary attention even for a myopic model (the feature's true derivative): for a myopic
    model pass ``lambda: attention_implementation(hf, "eager")`` (the Majority runs of
    ``interp.benchmarks.influence`` do); then the risk has its own forward and backward passes.
    """
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    if not risk_scale > 0:
        raise ValueError(f"risk_scale must be positive (1.0 = the official MSE), got {risk_scale}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    if not probes:
        raise ValueError("train_with_influence needs at least one probe")
    for k, pr in enumerate(probes):
        if len(pr) != 5:
            raise ValueError(f"probe {k}: expected (feature_name, site, position, w, r_star), got {len(pr)} items")
    tensors = list(params.values())
    if not tensors:
        raise ValueError("no parameters to train")
    opt = torch.optim.Adam(tensors, lr=lr, betas=betas, eps=eps)
    comps = ("direct", "precached", "shared")
    acc_dtype = torch.promote_types(tensors[0].dtype, torch.float32)     # optimizer state precision
    dev = tensors[0].device
    n_p = sum(t.numel() for t in tensors)

    # ---- layout (setup, not the hot path): sites, (site, position) pairs, probes grouped per pair
    resolved = {}
    for _, s, _, _, _ in probes:
        if s not in resolved:
            names = model.hook_names(s)
            if len(names) != 1:
                raise ValueError(f"probe site must name exactly one hook, {s!r} matches {len(names)}")
            resolved[s] = names[0]
    probes = [(f, resolved[s], p, w, t) for f, s, p, w, t in probes]
    sites = list(dict.fromkeys(s for _, s, _, _, _ in probes))
    pairs = list(dict.fromkeys((s, int(p)) for _, s, p, _, _ in probes))
    pair_of = torch.tensor([pairs.index((s, int(p))) for _, s, p, _, _ in probes], device=dev)
    slot = torch.zeros(len(probes), dtype=torch.long, device=dev)       # rank of each probe within its pair
    seen: dict[int, int] = {}
    for k, pi in enumerate(pair_of.tolist()):
        slot[k] = seen.get(pi, 0)
        seen[pi] = int(slot[k]) + 1
    n_slots = max(seen.values())
    W = torch.stack([torch.as_tensor(w).reshape(-1) for _, _, _, w, _ in probes]).to(dev)          # [K, d]
    T = torch.stack([torch.as_tensor(t) for _, _, _, _, t in probes]).to(dev)                       # [K, steps, B]
    positions = sorted({p for _, p in pairs})
    pos_row = {p: i for i, p in enumerate(positions)}
    by_site = []
    for s in sites:
        pk = [k for k, (_, s2, _, _, _) in enumerate(probes) if s2 == s]
        pp = [i for i, (s2, _) in enumerate(pairs) if s2 == s]
        by_site.append(dict(site=s, probes=torch.tensor(pk, device=dev), pairs=torch.tensor(pp, device=dev),
                            pair_pos=torch.tensor([pairs[i][1] for i in pp], device=dev),
                            pair_row=torch.tensor([pos_row[pairs[i][1]] for i in pp], device=dev),
                            probe_pos=torch.tensor([int(probes[k][2]) for k in pk], device=dev)))
    risks_of = ("official", "centered") if centered else ("official",)

    moments = torch.zeros((len(pairs), 3, n_p), dtype=acc_dtype, device=dev)     # per (pair, component)
    v = torch.zeros(n_p, dtype=acc_dtype, device=dev)
    b1, b2 = betas
    totals = {r: {o: {c: torch.zeros(len(probes), dtype=torch.float64, device=dev) for c in comps + ("full",)}
                  for o in ("sgd", "adam")} for r in risks_of}
    curves = {r: {o: {c: [] for c in comps + ("full",)} for o in ("sgd", "adam")} for r in risks_of}
    risks = []
    from interp.progress import progress
    for step, ids in enumerate(progress(batches, desc="influence")):
        if T.shape[1] <= step:
            raise ValueError(f"r_star has {T.shape[1]} batches of targets, training ran past it (step {step})")
        S = ids.shape[1]
        if positions[-1] > S - 2 or positions[0] < 0:
            raise ValueError(f"probe positions must be in 0..{S - 2} (seq={S}), got {positions[0]}..{positions[-1]}")
        kept: dict[str, torch.Tensor] = {}
        kept_r: dict[str, torch.Tensor] = {}

        def keeper(store):
            def keep(t, ctx):
                store[ctx.name] = t
                return t
            return keep
        with _require_grad(params):
            with model.intervene({s: keeper(kept) for s in sites}):
                logits = model.forward_with_grad(ids)
            if risk_context is not None:
                with model.intervene({s: keeper(kept_r) for s in sites}), risk_context():
                    model.forward_with_grad(ids)
            else:
                kept_r = kept
            hs = [kept[s] for s in sites]
            hr = [kept_r[s] for s in sites]
            nll = _per_position_nll(logits, ids, torch.ones_like(ids))           # [B, S-1]
            N = nll.numel()
            g = torch.autograd.grad(nll.sum() / N, tensors + hs, retain_graph=True, allow_unused=True)
            full = torch.cat([(torch.zeros_like(t) if x is None else x).reshape(-1) for t, x in zip(tensors, g)])
            adj = [torch.zeros_like(h) if x is None else x for h, x in zip(hs, g[len(tensors):])]
            # ∂(Σ_b L_i / N)/∂r for every tracked position i at once: one vmapped backward, one-hot cotangents
            E = nll.new_zeros((len(positions),) + nll.shape)
            E[torch.arange(len(positions)), :, torch.tensor(positions)] = 1.0 / N
            imm = torch.autograd.grad(nll, hs, grad_outputs=E, is_grads_batched=True, retain_graph=True,
                                      allow_unused=True)
            through = torch.zeros((len(pairs), n_p), dtype=full.dtype, device=dev)
            direct = torch.zeros_like(through)
            gR = {r: torch.zeros((len(probes), n_p), dtype=full.dtype, device=dev) for r in risks_of}
            r_row = torch.zeros(len(probes), dtype=torch.float64)
            for j, site in enumerate(by_site):          # one pass per site (layer); positions/features batched
                h, hrr, pp, pk = hs[j], hr[j], site["pairs"], site["probes"]
                a = adj[j][:, site["pair_pos"]].transpose(0, 1)                              # [n_pairs_s, B, d]
                ii = (torch.zeros_like(hs[j]).expand(len(positions), *hs[j].shape) if imm[j] is None else imm[j])
                b = ii[site["pair_row"], :, site["pair_pos"]]                                # [n_pairs_s, B, d]
                diff = torch.einsum("bkd,kd->bk", hrr[:, site["probe_pos"]].to(W.dtype), W[pk]) - T[pk, step].T
                r_row[pk.cpu()] = (risk_scale * (diff ** 2).mean(0)).detach().double().cpu()
                cot_r = {"official": diff}
                if centered:
                    cot_r["centered"] = diff - diff.mean(0, keepdim=True)
                cot_r = [(risk_scale * 2.0 / diff.shape[0]) * c.detach().T[:, :, None] * W[pk][:, None, :]
                         for c in cot_r.values()]                                              # [n_k, B, d] each
                loss_cot = _at_positions(torch.cat([a, b]).to(h.dtype), site["pair_pos"].repeat(2), S)
                risk_cot = _at_positions(torch.cat(cot_r).to(hrr.dtype), site["probe_pos"].repeat(len(cot_r)), S)
                if hrr is h:
                    rows = _batched_vjp(h, tensors, torch.cat([loss_cot, risk_cot]), chunk)
                    rows_l, rows_r = rows[:loss_cot.shape[0]], rows[loss_cot.shape[0]:]
                else:
                    rows_l = _batched_vjp(h, tensors, loss_cot, chunk)
                    rows_r = _batched_vjp(hrr, tensors, risk_cot, chunk)
                n = len(pp)
                through[pp], direct[pp] = rows_l[:n], rows_l[n:]
                for q, r in enumerate(risks_of):
                    gR[r][pk] = rows_r[q * len(pk):(q + 1) * len(pk)]
        risks.append(r_row)
        G = torch.stack([direct, through - direct, full[None] - through], 1).to(acc_dtype)   # [pairs, 3, n]
        v = b2 * v + (1 - b2) * full.to(acc_dtype) ** 2
        denom = (v / (1 - b2 ** (step + 1))).sqrt() + eps
        moments.mul_(b1).add_((1 - b1) * G)
        deltas = {"sgd": lr * G, "adam": lr * (moments / (1 - b1 ** (step + 1))) / denom}
        for r in risks_of:
            grid = torch.zeros((len(pairs), n_slots, n_p), dtype=acc_dtype, device=dev)   # ∇R per (pair, slot)
            grid[pair_of, slot] = gR[r].to(acc_dtype)
            for o, d in deltas.items():
                inf = torch.einsum("pcn,psn->pcs", d, grid)[pair_of, :, slot].double()    # [K, 3]
                for ci, c in enumerate(comps):
                    totals[r][o][c] += inf[:, ci]
                totals[r][o]["full"] += inf.sum(1)
                for c in totals[r][o]:
                    curves[r][o][c].append(totals[r][o][c].clone())
        opt.zero_grad(set_to_none=False)
        off = 0
        for t in tensors:
            t.grad = full[off:off + t.numel()].view_as(t).clone()
            off += t.numel()
        opt.step()

    def pack(d):
        return {o: {c: x.clone().cpu() for c, x in cs.items()} for o, cs in d.items()}

    def stack(d):
        return {o: {c: torch.stack(x).cpu() for c, x in cs.items()} for o, cs in d.items()}
    return FeatureInfluence(probes=[(f, s, int(p)) for f, s, p, _, _ in probes],
                            influence=pack(totals["official"]), curves=stack(curves["official"]),
                            risk=torch.stack(risks) if risks else torch.zeros((0, len(probes))),
                            influence_centered=pack(totals["centered"]) if centered else None,
                            curves_centered=stack(curves["centered"]) if centered else None,
                            risk_scale=float(risk_scale))


# ----------------------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def attention_implementation(hf, name: str):
    """Temporarily run a ``transformers`` model ``hf`` with attention implementation ``name`` (e.g. ``"eager"``
    for a myopic model: same forward values, ordinary gradients)."""
    old = hf.config._attn_implementation
    hf.set_attn_implementation(name)
    try:
        yield hf
    finally:
        hf.set_attn_implementation(old)


def ridge_fit(X: torch.Tensor, Y: torch.Tensor, alpha: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``sklearn.linear_model.Ridge(alpha)`` with intercept, in closed form and batched: ``X`` ``[..., n, d]``,
    ``Y`` ``[..., n, F]`` (or ``[..., n]``) -> ``(coef [..., F, d], intercept [..., F])`` (float64), with
    ``coef = (XcᵀXc + αI)⁻¹ XcᵀYc`` on the centred data (sklearn's dense ``cholesky`` solver; equal to sklearn up
    to rounding, tested). One solve for every leading index (e.g. all positions of a layer)."""
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    X = torch.as_tensor(X).detach().double()
    Y = torch.as_tensor(Y).detach().double()
    if Y.dim() == X.dim() - 1:
        Y = Y[..., None]
    if X.dim() < 2 or Y.shape[:-1] != X.shape[:-1]:
        raise ValueError(f"X [..., n, d] and Y [..., n, F] must share their leading shape, got {tuple(X.shape)} "
                         f"and {tuple(Y.shape)}")
    xm, ym = X.mean(-2, keepdim=True), Y.mean(-2, keepdim=True)
    Xc, Yc = X - xm, Y - ym
    eye = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)
    coef = torch.linalg.solve(Xc.transpose(-1, -2) @ Xc + alpha * eye, Xc.transpose(-1, -2) @ Yc)   # [..., d, F]
    intercept = ym.squeeze(-2) - (xm @ coef).squeeze(-2)
    return coef.transpose(-1, -2), intercept


def ridge_probe(X: torch.Tensor, Y: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """The official influence probe: ``sklearn.linear_model.Ridge(alpha)`` (with intercept) of the features ``Y``
    ``[..., n, n_features]`` (0/1) on the residual ``X`` ``[..., n, d]``; returns ``coef_`` ``[..., n_features, d]``
    (float32), row ``f`` being the direction ``w`` of feature ``f`` (``probe.coef_[feature_id]`` in the official
    code). Batched over leading dimensions (:func:`ridge_fit`)."""
    return ridge_fit(X, Y, alpha)[0].float()


def ridge_pearson(X_train: torch.Tensor, Y_train: torch.Tensor, X_test: torch.Tensor, Y_test: torch.Tensor,
                  alpha: float = 1.0) -> torch.Tensor:
    """The official probing metric (``src/probing.py``): fit ``Ridge(alpha)`` on the train split, predict the test
    split and take Pearson's r between each feature and its prediction. ``X_* [..., n, d]``, ``Y_* [..., n, F]`` ->
    ``[..., F]`` (float64; NaN where a feature or its prediction is constant on the test split, as
    ``scipy.stats.pearsonr``). The official per-(layer, position) number is the mean over features."""
    coef, b = ridge_fit(X_train, Y_train, alpha)
    Xt = torch.as_tensor(X_test).detach().double()
    Yt = torch.as_tensor(Y_test).detach().double()
    if Yt.dim() == Xt.dim() - 1:
        Yt = Yt[..., None]
    pred = Xt @ coef.transpose(-1, -2) + b[..., None, :]
    yc, pc = Yt - Yt.mean(-2, keepdim=True), pred - pred.mean(-2, keepdim=True)
    den = (yc.pow(2).sum(-2) * pc.pow(2).sum(-2)).sqrt()
    r = (yc * pc).sum(-2) / den
    return torch.where(den > 0, r, torch.full_like(r, float("nan")))


def bootstrap_ci(values, n_boot: int = 10_000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: percentile bootstrap CI of the mean over seeds (vectorised resampling)."""
    x = torch.tensor(np.array(values, dtype=np.float64)).reshape(-1)
    if x.numel() < 2:
        raise ValueError("bootstrap_ci needs at least two values")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    idx = torch.randint(0, x.numel(), (n_boot, x.numel()), generator=torch.Generator().manual_seed(seed))
    means = x[idx].mean(1)
    a = (1 - level) / 2
    return float(x.mean()), float(means.quantile(a)), float(means.quantile(1 - a))


# ----------------------------------------------------------------------------------------- Q(w) proxy
@dataclasses.dataclass
class QProxy(Result):
    """``Q(w)`` per direction: ``Σ_{j>i} KL_j / KL_i`` after projecting ``w`` out of ``r_i^k`` (estimates
    pre-cached relative to direct influence in a finished model). ``kl`` ``[n_dirs, seq]`` (batch mean)."""

    site: str
    position: int
    q: torch.Tensor        # [n_dirs]
    kl: torch.Tensor       # [n_dirs, seq]

    kind = "q_proxy"

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame({"direction": range(len(self.q)), "Q": self.q.numpy(),
                             "kl_immediate": self.kl[:, self.position].numpy(),
                             "kl_later": self.kl[:, self.position + 1:].sum(-1).numpy()})

    def figure(self):
        import plotly.express as px
        return px.histogram(self.to_frame(), x="Q", nbins=40, title=f"Q(w) at {self.site}, position {self.position}")


def q_proxy(model, tokens: torch.Tensor, site: str, position: int, directions: torch.Tensor,
            attention_mask: torch.Tensor | None = None, eps: float = 1e-12) -> QProxy:
    """``Q(w)`` of the paper for each row of ``directions`` ``[n_dirs, d]`` (e.g. SAE decoder rows).

    Choices (the digest marks them UNCERTAIN): the ablation projects ``w`` out of ``r_i^k`` (``interp.ProjectOut``
    at the absolute ``position`` only); the *immediate* term is the distribution at position ``i`` itself (it
    predicts token ``i+1``), the later terms are positions ``j > i``; ``KL(p_orig || p_ablated)`` per position,
    averaged over the batch (real tokens only). One forward per direction, batched over ``tokens``."""
    import interp
    if directions.dim() == 1:
        directions = directions[None]
    names = model.hook_names(site)
    if len(names) != 1:
        raise ValueError(f"site must name exactly one hook, {site!r} matches {len(names)}")
    if not 0 <= position < tokens.shape[1]:
        raise ValueError(f"position must be in 0..{tokens.shape[1] - 1}, got {position}")
    mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
    if not bool(mask[:, position].all()):
        raise ValueError(f"every row needs a real token at position {position}")
    w = mask.to(torch.float64)
    with torch.no_grad():
        base = model.run_with_cache(tokens, names=[], attention_mask=mask)[0].double().log_softmax(-1)
        kls = []
        for d in progress_iter(directions):
            with model.intervene({names[0]: interp.ProjectOut(d, positions=[position])}):
                abl = model.run_with_cache(tokens, names=[], attention_mask=mask)[0].double().log_softmax(-1)
            kl = (base.exp() * (base - abl)).sum(-1)                     # [batch, seq]
            kls.append((kl * w).sum(0) / w.sum(0).clamp_min(1))
    kl = torch.stack(kls).float()
    q = kl[:, position + 1:].sum(-1) / (kl[:, position] + eps)
    return QProxy(site=names[0], position=position, q=q, kl=kl)


def progress_iter(x):
    from interp.progress import progress
    return progress(x, desc="Q(w)")
