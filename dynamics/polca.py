"""POLCA: projected-oriented loss change allocation (Kangaslahti, Rosenfeld & Saphra, ICLR 2026, "Hidden
breakthroughs in language model training").

Pieces (all on flat parameter vectors θ ``[P]``; a model is any ``nn.Module`` and ``loss_fn(model, examples)``
returns per-example losses ``[n]``):

* :class:`ParamSpace` — flatten / unflatten a module's parameters; :class:`CheckpointRecorder` writes θ during
  any training loop (atomic safetensors, resumable); :func:`load_checkpoints` reads them back.
* :func:`lanczos_top` / :func:`build_basis` — Algorithm 1: at chosen checkpoints the top-k eigenvectors of the
  Hessian of the mean loss projected away from the current basis, ``Π⊥ H Π⊥`` (symmetric; the paper writes
  ``Π⊥H``), by Lanczos with full re-orthogonalisation on Hessian-vector products (forward-over-reverse AD).
* :func:`first_order` — ``POLCA₁(x,b;θ_t) = ⟨b, ∇L(x;θ_t)⟩·⟨b, θ_{t+1}−θ_t⟩`` ``[n, k]`` (the directional
  derivative is one forward-mode JVP per basis vector for all examples at once);
  :func:`second_order` — the exact per-example term ``½ bᵀH(x)b ⟨b, Δθ⟩²`` (forward-over-forward AD; the digest's
  CPU recommendation instead of the paper's Eq. 4 approximation).
* :func:`polca_trajectories` — ``L_b(x, θ_t) = Σ_{i<t} POLCA(x,b;θ_i)`` ``[n, k, T]``; :func:`drop_oscillating`;
  :func:`span_diagnostics` (how much of each step the basis spans, and POLCA vs exact changes along it).
* :func:`cluster_direction` (HDBSCAN per direction after dropping examples whose projected loss rises),
  :func:`breakthrough_step`, :func:`homogeneity`, :func:`plateau_step`, and :func:`analyse` (typed result).

Choices where the paper is silent (documented in docs/dynamics.md): the breakthrough argmax is taken on ``−f``
(a sudden *drop* of a decreasing loss); ``τ`` is the first checkpoint after which the aggregate exact loss is
within 5 % of its total decrease from its final value; HDBSCAN's ``min_cluster_size`` / ``min_samples`` scale the
paper's Table 4 (3 % of the points, clustered points / 15). Two cluster purities are reported: :func:`homogeneity`
(share of the most common label, any label) and :func:`label_fraction` (share of one label value); the addition
run's "carry homogeneity" is the latter with the eligibility rule of the recipe's ``addition_carry_summary``
(:mod:`interp.benchmarks.polca.addition`) — see there for which parts are the paper's and which are ours (UNCERTAIN).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from interp.progress import progress
from interp.results import Result

LossFn = Callable[[nn.Module, object], torch.Tensor]


# ----------------------------------------------------------------------------------------- parameters
class ParamSpace:
    """The floating parameters of ``model`` as one flat vector (in ``named_parameters`` order)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.names = [n for n, p in model.named_parameters() if p.is_floating_point()]
        params = dict(model.named_parameters())
        self.shapes = [params[n].shape for n in self.names]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.numel = sum(self.sizes)

    def flatten(self) -> torch.Tensor:
        """``[P]`` copy of the current parameters."""
        params = dict(self.model.named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self.names]).clone()

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        if theta.shape != (self.numel,):
            raise ValueError(f"theta must have shape ({self.numel},), got {tuple(theta.shape)}")
        return {n: t.view(s) for n, t, s in zip(self.names, theta.split(self.sizes), self.shapes)}

    def losses(self, loss_fn: LossFn, examples) -> Callable[[torch.Tensor], torch.Tensor]:
        """``θ -> per-example losses [n]`` (functional: the module's own parameters are untouched)."""
        model = self.model

        def f(theta: torch.Tensor) -> torch.Tensor:
            out = torch.func.functional_call(_LossModule(model, loss_fn), {"model." + k: v for k, v in self.unflatten(theta).items()},
                                             (examples,), strict=False)
            if out.dim() != 1:
                raise ValueError(f"loss_fn must return per-example losses [n], got shape {tuple(out.shape)}")
            return out
        return f


class _LossModule(nn.Module):
    def __init__(self, model: nn.Module, loss_fn: LossFn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, examples):
        return self.loss_fn(self.model, examples)


class CheckpointRecorder:
    """Callback for any training loop: ``rec(step)`` writes θ to ``folder/step_{step:07d}.safetensors``
    (atomically) when ``step % every == 0``. Steps already on disk are kept, so a resumed run continues."""

    def __init__(self, model: nn.Module, folder: str | Path, every: int = 20):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.space, self.folder, self.every = ParamSpace(model), Path(folder), every
        self.folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, step: int) -> bool:
        if step % self.every:
            return False
        from interp.io import save_tensors
        save_tensors(self.folder / f"step_{step:07d}.safetensors", {"theta": self.space.flatten()}, {"step": step})
        return True


def load_checkpoints(folder: str | Path) -> tuple[list[int], torch.Tensor]:
    """``(steps, thetas [T, P])`` from a :class:`CheckpointRecorder` folder, in step order."""
    from interp.io import load_tensors
    files = sorted(Path(folder).glob("step_*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no step_*.safetensors checkpoints in {folder}")
    steps = [int(f.stem.split("_")[1]) for f in files]
    return steps, torch.stack([load_tensors(f, what="checkpoint", tensors=("theta",))[0]["theta"] for f in files])


# ----------------------------------------------------------------------------------------- Hessian basis
def hvp_fn(space: ParamSpace, loss_fn: LossFn, examples, theta: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``v -> H v`` for the Hessian of the *mean* loss over ``examples`` at ``theta`` (forward-over-reverse)."""
    f = space.losses(loss_fn, examples)
    g = torch.func.grad(lambda th: f(th).mean())
    return lambda v: torch.func.jvp(g, (theta,), (v,))[1]


def lanczos_top(matvec: Callable[[torch.Tensor], torch.Tensor], dim: int, k: int, n_iter: int = 30,
                project: torch.Tensor | None = None, seed: int = 0, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` (largest algebraic) eigenpairs of the symmetric operator ``Π⊥ A Π⊥`` where ``Π⊥`` projects away
    from the orthonormal columns of ``project`` ``[dim, m]``. Lanczos with full re-orthogonalisation.
    Returns ``(eigenvalues [k], eigenvectors [dim, k])`` with eigenvectors orthogonal to ``project``."""
    if k < 1 or n_iter < k:
        raise ValueError(f"need 1 <= k <= n_iter, got k={k}, n_iter={n_iter}")
    n_iter = min(n_iter, dim - (0 if project is None else project.shape[1]))
    P = None if project is None or project.numel() == 0 else project.to(dtype)

    def proj(v: torch.Tensor) -> torch.Tensor:
        return v if P is None else v - P @ (P.T @ v)

    op = lambda v: proj(matvec(proj(v).to(torch.float32)).to(dtype))  # noqa: E731
    v = proj(torch.randn(dim, generator=torch.Generator().manual_seed(seed), dtype=dtype))
    V = [v / v.norm()]
    alphas, betas = [], []
    for j in range(n_iter):
        w = op(V[j])
        alphas.append(float(w @ V[j]))
        Q = torch.stack(V, 1)
        w = proj(w - Q @ (Q.T @ w))
        w = w - Q @ (Q.T @ w)                              # twice is enough (Kahan-Parlett)
        beta = float(w.norm())
        if j == n_iter - 1 or beta < 1e-10:
            break
        betas.append(beta)
        V.append(w / beta)
    m = len(alphas)
    T = torch.diag(torch.tensor(alphas, dtype=dtype))
    if m > 1:
        off = torch.tensor(betas[:m - 1], dtype=dtype)
        T = T + torch.diag(off, 1) + torch.diag(off, -1)
    evals, evecs = torch.linalg.eigh(T)
    top = evals.argsort(descending=True)[:k]
    vecs = torch.stack(V[:m], 1) @ evecs[:, top]
    vecs = proj(vecs)
    vecs, _ = torch.linalg.qr(vecs)
    return evals[top], vecs


def build_basis(space: ParamSpace, loss_fn: LossFn, examples, thetas: torch.Tensor, at: Sequence[int],
                k: int = 1, n_iter: int = 20, seed: int = 0, resume: torch.Tensor | None = None,
                on_batch: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """Algorithm 1: for each checkpoint index in ``at`` (in order), append the top-``k`` eigenvectors of
    ``Π⊥ H(θ_t) Π⊥`` (Hessian of the mean loss on ``examples``). Returns ``B`` ``[P, len(at)·k]``, orthonormal.
    ``resume``: the first columns of an interrupted run (whole batches of ``k``), continued from there;
    ``on_batch(B)`` is called after each appended batch (e.g. to save it)."""
    B = torch.zeros(space.numel, 0, dtype=torch.float64) if resume is None else resume.to(torch.float64)
    if B.shape[1] % k or B.shape[1] > len(at) * k:
        raise ValueError(f"resume has {B.shape[1]} columns: not whole batches of k={k} within {len(at)} checkpoints")
    done = B.shape[1] // k
    for i, t in enumerate(progress(list(at)[done:], desc="POLCA basis"), start=done):
        _, vecs = lanczos_top(hvp_fn(space, loss_fn, examples, thetas[t].float()), space.numel, k, n_iter,
                              project=B, seed=seed + i)
        B = torch.cat([B, vecs], 1)
        if on_batch is not None:
            on_batch(B.float())
    return B.float()


# ----------------------------------------------------------------------------------------- POLCA terms
def _check(space_or_model, basis, theta_t, theta_next) -> ParamSpace:
    space = space_or_model if isinstance(space_or_model, ParamSpace) else ParamSpace(space_or_model)
    if basis.dim() != 2 or basis.shape[0] != space.numel:
        raise ValueError(f"basis must be [P={space.numel}, n_basis], got {tuple(basis.shape)}")
    for nm, th in (("theta_t", theta_t), ("theta_next", theta_next)):
        if th.shape != (space.numel,):
            raise ValueError(f"{nm} must be [P={space.numel}], got {tuple(th.shape)}")
    return space


def first_order(model, loss_fn: LossFn, examples, basis: torch.Tensor, theta_t: torch.Tensor,
                theta_next: torch.Tensor) -> torch.Tensor:
    """``POLCA₁ [n_examples, n_basis]`` = ``⟨b, ∇L(x;θ_t)⟩ · ⟨b, θ_{t+1} − θ_t⟩``. ``model``: module or ParamSpace."""
    space = _check(model, basis, theta_t, theta_next)
    f = space.losses(loss_fn, examples)
    step = basis.T @ (theta_next - theta_t)                                          # [k]
    d = torch.stack([torch.func.jvp(f, (theta_t,), (basis[:, j].contiguous(),))[1] for j in range(basis.shape[1])], 1)
    return d.detach() * step


def second_order(model, loss_fn: LossFn, examples, basis: torch.Tensor, theta_t: torch.Tensor,
                 theta_next: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(POLCA₁, h)`` each ``[n_examples, n_basis]``; ``h = ½ bᵀH(x;θ_t)b · ⟨b, Δθ⟩²`` exactly per example."""
    space = _check(model, basis, theta_t, theta_next)
    f = space.losses(loss_fn, examples)
    step = basis.T @ (theta_next - theta_t)
    d1, d2 = [], []
    for j in range(basis.shape[1]):
        b = basis[:, j].contiguous()
        g, c = torch.func.jvp(lambda th: torch.func.jvp(f, (th,), (b,))[1], (theta_t,), (b,))
        d1.append(g)
        d2.append(c)
    d1, d2 = torch.stack(d1, 1).detach(), torch.stack(d2, 1).detach()
    return d1 * step, 0.5 * d2 * step ** 2


def polca_trajectories(model, loss_fn: LossFn, examples, basis: torch.Tensor, thetas: torch.Tensor,
                       second: bool = True) -> torch.Tensor:
    """``L_b(x, θ_t)`` ``[n, n_basis, T]``: cumulative POLCA (first + exact second order) from checkpoint 0
    (``L_b(x, θ_0) = 0``)."""
    space = model if isinstance(model, ParamSpace) else ParamSpace(model)
    steps = []
    for t in progress(range(thetas.shape[0] - 1), desc="POLCA"):
        if second:
            a, h = second_order(space, loss_fn, examples, basis, thetas[t], thetas[t + 1])
            steps.append(a + h)
        else:
            steps.append(first_order(space, loss_fn, examples, basis, thetas[t], thetas[t + 1]))
    inc = torch.stack(steps, -1)
    return torch.cat([torch.zeros_like(inc[..., :1]), inc.cumsum(-1)], -1)


def exact_losses(model, loss_fn: LossFn, examples, thetas: torch.Tensor) -> torch.Tensor:
    """``[n, T]`` per-example loss at every checkpoint."""
    space = model if isinstance(model, ParamSpace) else ParamSpace(model)
    f = space.losses(loss_fn, examples)
    with torch.no_grad():
        return torch.stack([f(th) for th in thetas], -1)


def span_interval(model, loss_fn: LossFn, examples, basis: torch.Tensor, theta_t: torch.Tensor,
                  theta_next: torch.Tensor) -> dict[str, torch.Tensor]:
    """One checkpoint interval of :func:`span_diagnostics`: ``first``/``second`` ``[n, k]`` (POLCA terms),
    ``exact_along_b`` ``[n, k]`` (``L(θ_t + b s_b) − L(θ_t)``), ``exact_in_span`` ``[n]`` (``L(θ_t + B s) − L(θ_t)``),
    ``base`` ``[n]`` (``L(θ_t)``) and ``frac_in_span`` (``‖B s‖/‖Δθ‖``, a 0-dim tensor), ``s = Bᵀ(θ_{t+1} − θ_t)``."""
    space = _check(model, basis, theta_t, theta_next)
    f = space.losses(loss_fn, examples)
    a, h = second_order(space, loss_fn, examples, basis, theta_t, theta_next)
    d = theta_next - theta_t
    st = basis.T @ d
    with torch.no_grad():
        base = f(theta_t)
        along = torch.stack([f(theta_t + basis[:, j] * st[j]) - base for j in range(basis.shape[1])], 1)
        span = f(theta_t + basis @ st) - base
    return {"first": a, "second": h, "exact_along_b": along, "exact_in_span": span, "base": base,
            "frac_in_span": (basis @ st).norm() / d.norm().clamp_min(1e-30)}


def span_diagnostics(model, loss_fn: LossFn, examples, basis: torch.Tensor, thetas: torch.Tensor,
                     interval: Callable[[int, Callable[[], dict]], dict] | None = None) -> dict:
    """Where POLCA's tracking of the exact per-example loss change is lost, interval by interval.

    For each checkpoint interval ``Δθ = θ_{t+1} − θ_t`` and ``s = Bᵀ Δθ``: the POLCA terms (first and exact second
    order, ``[n, k, T-1]``), the exact change of moving along each ``b`` alone ``L(θ_t + b s_b) − L(θ_t)``
    (``[n, k, T-1]``), the exact change of moving by the in-span part ``L(θ_t + B s) − L(θ_t)`` (``[n, T-1]``), and
    the fraction ``‖B s‖/‖Δθ‖`` (``[T-1]``). Returns those tensors and R² against the exact per-example change
    (``"r2"``: total over all intervals and per interval, for POLCA 1st+2nd, 1st only, Σ_b exact along b, and exact
    in span; ``"r2_taylor"``: POLCA vs exact along b per (x, b, t); ``"r2_zero"``: of predicting no change).
    The Taylor terms can only be as good as the span: if ``exact_in_span`` misses the change, so does POLCA.
    ``interval``: optional ``(t, compute) -> terms`` through which each interval's :func:`span_interval` is
    computed (e.g. a resumable stage, ``lambda t, f: stages(f"span-{t}", f)``); default: ``compute()``.
    ``"trajectories"`` ``[n, k, T]`` is :func:`polca_trajectories` (first + second order), from the same terms."""
    space = model if isinstance(model, ParamSpace) else ParamSpace(model)
    f = space.losses(loss_fn, examples)
    with torch.no_grad():
        last = f(thetas[-1])
    run = interval if interval is not None else (lambda t, compute: compute())
    parts = []
    for t in progress(range(thetas.shape[0] - 1), desc="POLCA span"):
        part = run(t, lambda t=t: span_interval(space, loss_fn, examples, basis, thetas[t], thetas[t + 1]))
        missing = [k for k in _SPAN_KEYS if k not in part]
        if missing:
            raise ValueError(f"interval {t}: the terms lack {missing} (expected the keys of span_interval)")
        parts.append(part)
    cat = {k: torch.stack([p[k] for p in parts], -1) for k in _SPAN_KEYS}
    p1, h, along, span = cat["first"], cat["second"], cat["exact_along_b"], cat["exact_in_span"]
    base = torch.cat([cat["base"], last[:, None]], -1)                          # [n, T]
    true_inc = base[:, 1:] - base[:, :-1]

    def r2(p: torch.Tensor, y: torch.Tensor) -> float:
        return float(1 - ((p - y) ** 2).sum() / ((y - y.mean()) ** 2).sum().clamp_min(1e-30))
    preds = {"polca": (p1 + h).sum(1), "polca_first_order": p1.sum(1), "exact_along_each_b": along.sum(1),
             "exact_in_span": span}
    inc = p1 + h
    traj = torch.cat([torch.zeros_like(inc[..., :1]), inc.cumsum(-1)], -1)
    return {"first": p1, "second": h, "exact_along_b": along, "exact_in_span": span, "frac_in_span": cat["frac_in_span"],
            "exact": base, "trajectories": traj,
            "r2": {k: {"total": r2(v.sum(-1), true_inc.sum(-1)), "per_interval": r2(v.flatten(), true_inc.flatten())}
                   for k, v in preds.items()},
            "r2_taylor": r2((p1 + h).flatten(), along.flatten()),
            "r2_zero": {"total": r2(torch.zeros(base.shape[0]), true_inc.sum(-1)),
                        "per_interval": r2(torch.zeros_like(true_inc).flatten(), true_inc.flatten())}}


_SPAN_KEYS = ("first", "second", "exact_along_b", "exact_in_span", "base", "frac_in_span")


def drop_oscillating(traj: torch.Tensor) -> torch.Tensor:
    """Boolean ``[n_basis]``: keep directions whose *mean* projected loss does not increase from the first to
    the last checkpoint (the paper discards the others as oscillation directions)."""
    return traj[..., -1].mean(0) <= traj[..., 0].mean(0)


# ----------------------------------------------------------------------------------------- clustering
def cluster_direction(traj_b: torch.Tensor, min_cluster_size: int | None = None, min_samples: int | None = None,
                      drop_rising: bool = True) -> np.ndarray:
    """HDBSCAN labels ``[n]`` for one direction's trajectories ``[n, T]``: examples whose projected loss rises
    overall get ``-2`` (dropped before clustering; ``drop_rising=False`` keeps them), HDBSCAN outliers ``-1``.
    Defaults scale the paper's arithmetic setting (Table 4: ``min_cluster_size`` 150 of 5000 tokens,
    ``min_samples`` = number of tokens / 15): ``min_cluster_size`` = 3 % of the ``n`` examples (at least 5),
    ``min_samples`` = the clustered examples / 15 (at least 1)."""
    from sklearn.cluster import HDBSCAN
    x = traj_b.detach().double().numpy()
    labels = np.full(x.shape[0], -2)
    keep = x[:, -1] <= x[:, 0] if drop_rising else np.ones(x.shape[0], dtype=bool)
    n_keep = int(keep.sum())
    if n_keep < 3:
        return labels
    mcs = min(min_cluster_size or max(5, round(0.03 * x.shape[0])), n_keep)
    ms = min(min_samples or max(1, round(n_keep / 15)), n_keep)
    labels[keep] = HDBSCAN(min_cluster_size=max(2, mcs), min_samples=ms, copy=True).fit_predict(x[keep])
    return labels


def homogeneity(labels: np.ndarray, truth: np.ndarray) -> dict[int, float]:
    """Per cluster id (``>= 0``): the share of its most common ``truth`` value."""
    out = {}
    for c in np.unique(labels[labels >= 0]):
        _, counts = np.unique(truth[labels == c], return_counts=True)
        out[int(c)] = float(counts.max() / counts.sum())
    return out


def label_fraction(labels: np.ndarray, truth: np.ndarray, value: int = 1) -> dict[int, float]:
    """Per cluster id (``>= 0``): the share of its members whose ``truth`` equals ``value``. Our reading of the
    paper's "carry homogeneity" (Table 1; UNCERTAIN, see ``addition_carry_summary`` in
    :mod:`interp.benchmarks.polca.addition`) is this with ``value`` = carry: the fraction of a cluster's tokens that carry, so a cluster of non-carry tokens scores 0 (where
    :func:`homogeneity` would give 1)."""
    return {int(c): float((truth[labels == c] == value).mean()) for c in np.unique(labels[labels >= 0])}


def breakthrough_step(f: torch.Tensor, steps: Sequence[int], delta: int) -> torch.Tensor:
    """``break(f, x, Δ) = argmax_t ([g(t+Δ)−g(t)] − [g(t)−g(t−Δ)])`` with ``g = −f`` (a sudden drop of a loss),
    over checkpoints ``t`` with ``t±Δ`` inside; ``f`` ``[n, T]`` on checkpoints ``steps`` (evenly spaced).
    ``delta`` is in training steps and rounded to checkpoints. Returns the step of the breakthrough ``[n]``."""
    steps_t = torch.as_tensor(list(steps))
    stride = int(steps_t[1] - steps_t[0]) if len(steps_t) > 1 else 1
    d = max(1, round(delta / stride))
    if f.shape[-1] <= 2 * d:
        raise ValueError(f"need more than 2·Δ checkpoints: {f.shape[-1]} checkpoints, Δ = {d} checkpoints")
    g = -f
    second = (g[:, 2 * d:] - g[:, d:-d]) - (g[:, d:-d] - g[:, :-2 * d])
    return steps_t[d:-d][second.argmax(-1)]


def plateau_step(agg_loss: torch.Tensor, steps: Sequence[int], frac: float = 0.05) -> int:
    """``τ``: first checkpoint after which the aggregate loss stays within ``frac`` of its total decrease above
    its final value."""
    agg = torch.as_tensor(agg_loss, dtype=torch.float64)
    tol = frac * float(agg[0] - agg[-1])
    above = (agg - agg[-1]) > tol
    idx = int(torch.nonzero(above).max()) + 1 if above.any() else 0
    return int(list(steps)[min(idx, len(agg) - 1)])


@dataclasses.dataclass
class PolcaResult(Result):
    """Clusters of one analysis. ``clusters`` rows: source (``"polca:b"``, ``"exact"`` = exact-loss trajectories,
    ``"exact_change"`` = their per-interval changes), cluster id, size, homogeneity per label (``hom_*``: share of
    the most common value), fraction per positive label (``frac_*``: share of the given value, the paper's carry
    homogeneity), mean breakthrough step, hidden (mean break > τ). ``traj [n, k, T]``, ``exact [n, T]``,
    ``assignments``: source -> cluster label per example ``[n]`` (``-1`` outlier, ``-2`` dropped),
    ``diagnostics``: numbers of the run (e.g. R² and the share of each step in the basis' span)."""

    steps: list[int]
    tau: int
    kept: torch.Tensor
    traj: torch.Tensor
    exact: torch.Tensor
    clusters: list[dict]
    assignments: dict = dataclasses.field(default_factory=dict)
    diagnostics: dict = dataclasses.field(default_factory=dict)

    kind = "polca"

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.clusters)

    def summary(self, label: str = "carry") -> dict[str, float]:
        """Max homogeneity (``hom_<label>``, and ``frac_<label>`` when present) and the fraction of clusters with
        hidden breakthroughs, for POLCA, exact-loss and change-in-exact-loss clusters."""
        df = self.to_frame()
        out = {}
        groups = (("polca", df[df.source.str.startswith("polca")]), ("exact", df[df.source == "exact"]),
                  ("exact_change", df[df.source == "exact_change"]))
        for name, sub in groups:
            out[f"{name}_max_{label}_homogeneity"] = float(sub[f"hom_{label}"].max()) if len(sub) else float("nan")
            if f"frac_{label}" in df:
                out[f"{name}_max_{label}_fraction"] = float(sub[f"frac_{label}"].max()) if len(sub) else float("nan")
            out[f"{name}_hidden_breakthrough_fraction"] = float(sub.hidden.mean()) if len(sub) else float("nan")
            out[f"{name}_n_clusters"] = int(len(sub))
        return out

    def figure(self, direction: int = 0, max_lines: int = 200):
        """Projected-loss trajectories along one kept direction, coloured by cluster, plus the aggregate."""
        import plotly.graph_objects as go
        x = self.traj[:, direction].numpy()
        fig = go.Figure()
        for i in range(min(max_lines, x.shape[0])):
            fig.add_trace(go.Scatter(x=self.steps, y=x[i], mode="lines", line=dict(width=0.5), showlegend=False))
        fig.add_trace(go.Scatter(x=self.steps, y=x.mean(0), mode="lines", name="mean", line=dict(width=3, color="black")))
        fig.update_layout(title=f"POLCA projected loss, direction {direction}", xaxis_title="step",
                          yaxis_title="L_b(x, θ_t)")
        return fig


def analyse(traj: torch.Tensor, exact: torch.Tensor, steps: Sequence[int], labels: dict[str, np.ndarray],
            delta: int, tau: int | None = None, min_cluster_size: int | None = None,
            positive: dict[str, int] | None = None) -> PolcaResult:
    """Cluster each kept direction's projected-loss trajectories (after dropping examples whose projected loss
    rises) and, as the paper's baselines (Table 1), the exact-loss trajectories ``L(x, θ_t)`` (``"exact"``) and
    their per-interval changes ``L(x, θ_t) − L(x, θ_{t−1})`` (``"exact_change"``), all examples. Per cluster:
    homogeneity per label, the fraction of each ``positive`` value (e.g. ``{"carry": 1}``), and hidden breakthroughs
    (mean break step > ``tau``; break on ``L_b`` for POLCA clusters, on the exact loss for the baselines; default
    ``tau``: :func:`plateau_step` of the mean exact loss). ``labels``: name -> ``[n]`` integer labels."""
    steps = list(steps)
    positive = dict(positive or {})
    if traj.shape[-1] != len(steps) or exact.shape[-1] != len(steps):
        raise ValueError("traj and exact need one value per checkpoint step")
    for k in positive:
        if k not in labels:
            raise ValueError(f"positive names a label that is not given: {k!r}")
    tau = plateau_step(exact.mean(0), steps) if tau is None else tau
    kept = drop_oscillating(traj)
    rows, assignments = [], {}

    def add(source: str, f: torch.Tensor, lab: np.ndarray):
        assignments[source] = lab
        brk = breakthrough_step(f, steps, delta).numpy()
        homs = {k: homogeneity(lab, np.asarray(v)) for k, v in labels.items()}
        fracs = {k: label_fraction(lab, np.asarray(labels[k]), v) for k, v in positive.items()}
        for c in np.unique(lab[lab >= 0]):
            m = lab == c
            mb = float(brk[m].mean())
            rows.append({"source": source, "cluster": int(c), "size": int(m.sum()), "mean_break": mb,
                         "hidden": bool(mb > tau), **{f"hom_{k}": h[int(c)] for k, h in homs.items()},
                         **{f"frac_{k}": h[int(c)] for k, h in fracs.items()}})
    for b in torch.nonzero(kept).flatten().tolist():
        add(f"polca:{b}", traj[:, b], cluster_direction(traj[:, b], min_cluster_size))
    add("exact", exact, cluster_direction(exact, min_cluster_size, drop_rising=False))
    add("exact_change", exact, cluster_direction(exact[:, 1:] - exact[:, :-1], min_cluster_size, drop_rising=False))
    return PolcaResult(steps=steps, tau=int(tau), kept=kept, traj=traj, exact=exact, clusters=rows,
                       assignments=assignments)
