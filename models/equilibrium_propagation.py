"""Toward Practical Equilibrium Propagation: Brain-inspired RNN with Feedback Regulation and Residual
Connections (Liu & Chen, ICLR 2026): the FRE-RNN trained with equilibrium propagation (EP).

The input ``s0 = x`` and the read-out ``s_p = softmax(W_f s_L + b_f)`` sit outside a recurrent core
of hidden layers ``s1 … sL`` updated synchronously, ``s[t+1] = ρ(h(s[t]))`` with ``ρ = tanh`` and::

    h_1 = W_0 s_0 + β_1 B_1 s_2 + b_0
    h_j = α W_{j-1} s_{j-1} + β_j B_j s_{j+1} + b_{j-1}                  (1 < j < L)
    h_L = α W_{L-1} s_{L-1} + b_{L-1} + β_f B_f e_p,   e_p = s_tar − s_p   (nudged phase only)

plus, for each residual (long-range) link ``i → j`` (``j > i + 1``), ``α S_ij s_i`` into ``h_j`` and the
feedback ``β_i S^B_ij s_j`` into ``h_i``. ``β_i`` is the *feedback regulation*: small ``β_i`` makes the
dynamics nearly feedforward, so they converge in a few steps. Feedback is symmetric (``B_i = W_iᵀ``,
tied throughout training) or fixed random (asymmetric case, with random "arbitrary graph topology"
skip links drawn with probability ``P``).

Training (Alg. 1): a free phase of ``T`` steps (``β_f = 0``) from zero states, a nudged phase of ``K``
steps started from the free state with the output error fed back, then local updates::

    ΔW_i = (s_{i+1}^β − s_{i+1}^0) (s_i^0)ᵀ / β_f,     ΔW_f = (s_tar − s_p^0)(s_L^0)ᵀ

applied as ascent with Adam (``−Δ`` is passed as the gradient). The backprop baseline trains the
*same* network by backpropagation through the ``T`` free-phase steps (BPTT).

The paper's validations on digits are a reproduction recipe, ``interp reproduce equilibrium_propagation``
(``benchmarks/equilibrium_propagation/``), not part of this module.

Choices where the paper is unclear (documented, listed in ``docs/models/equilibrium_propagation.md``):

* symmetric feedback stays tied to ``W_iᵀ`` during training (including skip links, ``S^B = Sᵀ``);
* biases are included (``bias=True``), updated like weights with a constant presynaptic input 1;
* updates are divided by ``β_f`` (an estimate of the negative gradient in scale; with Adam this only
  matters through Adam's ``eps``), and averaged over the batch;
* ``α`` scales every feedforward weight except ``W_0`` (as in the paper's 2-layer equations);
* a skip link's feedback into layer ``i`` uses that layer's ``β_i``; links may start at the input
  (``i = 0``), which is clamped and so receives no feedback; default links for the depth study jump
  three layers, starting from the top (``(L-3, L), (L-6, L-3), …``);
* the output error is recomputed from the current state at every nudged step;
* computations run in float64 by default: with ``β_i = 0.01`` the nudge reaching layer ``j`` shrinks
  like ``β^(L-j)``, which float32 cannot resolve in deep networks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from interp.progress import progress
from interp.training import set_seed

from .common import accuracy, digits_split, minibatches

__all__ = [
    "EPConfig", "FRERNN", "TrainStats", "train", "ep_gradients", "bp_gradients",
    "gradient_alignment", "convergence_profile", "default_skips",
]

Feedback = Literal["symmetric", "random"]
Method = Literal["ep", "bp"]


@dataclass
class EPConfig:
    """FRE-RNN + EP on digits (defaults: the CPU recipe, 64-64-64-10, tanh, symmetric feedback,
    ``β_i = 0.01``, ``β_f = 0.1``, ``T = 10·L``, ``K = T/2``, Adam 1e-3, batch 64, 100 epochs)."""

    hidden: tuple[int, ...] = (64, 64)
    beta: float | tuple[float, ...] = 0.01
    alpha: float = 1.0
    beta_f: float = 0.1
    T: int | None = None
    K: int | None = None
    feedback: Feedback = "symmetric"
    skips: tuple[tuple[int, int], ...] = ()
    skip_probability: float = 0.0
    bias: bool = True
    lr: float = 1e-3
    batch_size: int = 64
    epochs: int = 100
    test_size: float = 0.2
    scale_by_beta_f: bool = True
    dtype: str = "float64"

    def __post_init__(self) -> None:
        if not self.hidden or any(int(h) < 1 for h in self.hidden):
            raise ValueError(f"hidden must be a non-empty tuple of positive sizes, got {self.hidden!r}")
        betas = self.betas()
        if len(betas) != len(self.hidden) - 1 and len(self.hidden) > 1:
            raise ValueError(f"beta needs {len(self.hidden) - 1} values (one per feedback link), got {self.beta!r}")
        if any(b < 0 for b in betas) or self.beta_f <= 0:
            raise ValueError("beta values must be >= 0 and beta_f > 0")
        if self.feedback not in ("symmetric", "random"):
            raise ValueError(f"feedback must be 'symmetric' or 'random', got {self.feedback!r}")
        L = len(self.hidden)
        for i, j in self.skips:
            if not (0 <= i < j <= L and j - i >= 2):
                raise ValueError(f"skip ({i}, {j}) must link non-adjacent layers 0 <= i < j <= {L} with j - i >= 2")
        if len({tuple(p) for p in self.skips}) != len(self.skips):
            raise ValueError(f"skips contains duplicate links: {self.skips!r}")
        if not 0 <= self.skip_probability <= 1:
            raise ValueError(f"skip_probability must be in [0, 1], got {self.skip_probability}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        self.steps()  # validates T and K

    @property
    def n_layers(self) -> int:
        return len(self.hidden)

    def betas(self) -> list[float]:
        """``β_i`` for the feedback into hidden layer ``i = 1 … L-1``."""
        L = len(self.hidden)
        if isinstance(self.beta, (int, float)):
            return [float(self.beta)] * max(L - 1, 0)
        return [float(b) for b in self.beta]

    def steps(self) -> tuple[int, int]:
        """``(T, K)``: free and nudged phase lengths (defaults ``10·L`` and ``T/2``)."""
        T = self.T if self.T is not None else 10 * self.n_layers
        K = self.K if self.K is not None else max(T // 2, 1)
        if T < 1 or K < 1:
            raise ValueError(f"T and K must be >= 1, got {T}, {K}")
        return T, K

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == "float64" else torch.float32


def default_skips(n_layers: int, span: int = 3) -> tuple[tuple[int, int], ...]:
    """Long-range links jumping ``span`` layers, from the top down: ``(L-span, L), (L-2·span, L-span), …``
    (hidden layers only). For ``L = 8``: ``((5, 8), (2, 5))``."""
    links = []
    j = n_layers
    while j - span >= 1:
        links.append((j - span, j))
        j -= span
    return tuple(links)


class FRERNN(nn.Module):
    """Feedback-regulated residual RNN ``n_in -> hidden... -> n_out``.

    Parameters: ``W[i]`` ``[n_{i+1}, n_i]`` (layer ``i`` to ``i+1``, ``i = 0 … L-1``, ``n_0 = n_in``), ``W_f``
    ``[n_out, n_L]``, biases, and one ``S[k]`` ``[n_j, n_i]`` per skip link ``(i, j)``. With random feedback
    the fixed matrices ``B_i`` ``[n_i, n_{i+1}]``, ``B_f`` ``[n_L, n_out]`` and ``SB_k`` ``[n_i, n_j]`` are buffers.

    The hidden state is one tensor ``s`` ``[B, N]`` (``N = Σ n_j``, layers concatenated; :meth:`layers`
    splits it). One synchronous step is ``s ← tanh(s Mᵀ + d(x) [+ nudge])`` where ``M`` ``[N, N]``
    (:meth:`recurrent_matrix`) holds every hidden-to-hidden coupling (``α W``, ``β_i B_i``, skips) and
    ``d(x)`` ``[B, N]`` (:meth:`drive`) the input drive and biases.
    """

    def __init__(self, n_in: int, n_out: int, config: EPConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.config = config
        sizes = [n_in, *config.hidden]
        self.sizes = sizes
        self.L = len(config.hidden)
        self.betas = config.betas()
        self.offsets = [int(v) for v in np.cumsum([0, *sizes[1:]])]  # hidden layer j spans offsets[j-1]:offsets[j]
        dt = config.torch_dtype

        def init(out: int, inp: int) -> torch.Tensor:
            bound = 1.0 / np.sqrt(inp)
            return (torch.rand(out, inp, generator=generator, dtype=torch.float64) * 2 - 1).mul(bound).to(dt)

        self.W = nn.ParameterList([nn.Parameter(init(sizes[i + 1], sizes[i])) for i in range(self.L)])
        self.b = nn.ParameterList([nn.Parameter(torch.zeros(sizes[i + 1], dtype=dt)) for i in range(self.L)]
                                  if config.bias else [])
        self.W_f = nn.Parameter(init(n_out, sizes[-1]))
        self.b_f = nn.Parameter(torch.zeros(n_out, dtype=dt)) if config.bias else None
        skips = [tuple(p) for p in config.skips]
        if config.skip_probability > 0:  # arbitrary graph topology: random links between non-adjacent layers
            for i in range(1, self.L + 1):
                for j in range(i + 2, self.L + 1):
                    if (i, j) not in skips and torch.rand((), generator=generator).item() < config.skip_probability:
                        skips.append((i, j))
        self.skips: list[tuple[int, int]] = skips
        self.S = nn.ParameterList([nn.Parameter(init(sizes[j], sizes[i])) for i, j in skips])
        self.symmetric = config.feedback == "symmetric"
        if not self.symmetric:
            for i in range(1, self.L):
                self.register_buffer(f"B_{i}", init(sizes[i], sizes[i + 1]))
            self.register_buffer("B_f", init(sizes[-1], n_out))
            for k, (i, j) in enumerate(skips):
                self.register_buffer(f"SB_{k}", init(sizes[i], sizes[j]))

    # ------------------------------------------------------------------ feedback matrices
    def feedback(self, i: int) -> torch.Tensor:
        """``B_i`` ``[n_i, n_{i+1}]``: feedback from hidden layer ``i+1`` into ``i`` (``1 <= i < L``)."""
        return self.W[i].T if self.symmetric else getattr(self, f"B_{i}")

    def feedback_out(self) -> torch.Tensor:
        """``B_f`` ``[n_L, n_out]``: carries the output error into the top layer."""
        return self.W_f.T if self.symmetric else self.B_f

    def skip_feedback(self, k: int) -> torch.Tensor:
        """Feedback ``[n_i, n_j]`` of skip link ``k = (i, j)``."""
        return self.S[k].T if self.symmetric else getattr(self, f"SB_{k}")

    def beta_into(self, i: int) -> float:
        """Feedback attenuation ``β_i`` of hidden layer ``i`` (``1 <= i < L``)."""
        return self.betas[i - 1]

    # ------------------------------------------------------------------ dynamics
    @property
    def n_state(self) -> int:
        return self.offsets[-1]

    def layers(self, s: torch.Tensor) -> list[torch.Tensor]:
        """Split ``s`` ``[B, N]`` into the hidden layers ``[B, n_j]``, ``j = 1 … L``."""
        return [s[:, self.offsets[j - 1]:self.offsets[j]] for j in range(1, self.L + 1)]

    def init_state(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, self.n_state, dtype=self.W_f.dtype, device=self.W_f.device)

    def recurrent_matrix(self) -> torch.Tensor:
        """``M`` ``[N, N]``: block ``(j, i)`` is what hidden layer ``i`` feeds into hidden layer ``j``
        (``α W_{j-1}`` below the diagonal, ``β_j B_j`` above it, skip links further out). Differentiable."""
        o, alpha = self.offsets, self.config.alpha
        M = torch.zeros(self.n_state, self.n_state, dtype=self.W_f.dtype, device=self.W_f.device)
        for j in range(2, self.L + 1):
            M[o[j - 1]:o[j], o[j - 2]:o[j - 1]] = alpha * self.W[j - 1]
            if self.betas[j - 2] != 0:
                M[o[j - 2]:o[j - 1], o[j - 1]:o[j]] = self.betas[j - 2] * self.feedback(j - 1)
        for k, (i, j) in enumerate(self.skips):
            if i >= 1:
                M[o[j - 1]:o[j], o[i - 1]:o[i]] = alpha * self.S[k]
                if self.beta_into(i) != 0:
                    M[o[i - 1]:o[i], o[j - 1]:o[j]] = self.beta_into(i) * self.skip_feedback(k)
        return M

    def drive(self, x: torch.Tensor) -> torch.Tensor:
        """Constant input of the dynamics ``[B, N]``: ``W_0 x`` into layer 1, ``α S x`` for skips from the
        input, and the biases."""
        o = self.offsets
        parts = [x @ self.W[0].T] + [x.new_zeros(x.shape[0], n) for n in self.sizes[2:]]
        for k, (i, j) in enumerate(self.skips):
            if i == 0:
                parts[j - 1] = parts[j - 1] + self.config.alpha * (x @ self.S[k].T)
        d = torch.cat(parts, dim=1)
        if self.b:
            d = d + torch.cat(list(self.b))
        return d

    def logits(self, s: torch.Tensor) -> torch.Tensor:
        """Read-out pre-softmax ``W_f s_L + b_f`` ``[B, n_out]`` from the state ``[B, N]``."""
        out = s[:, self.offsets[-2]:] @ self.W_f.T
        return out + self.b_f if self.b_f is not None else out

    def coupling(self):
        """The map ``s ↦ s Mᵀ`` ``[B, N] -> [B, N]`` for the current parameters (differentiable).

        Equal hidden widths use the banded structure (two batched matmuls plus one per skip link); other
        shapes multiply by the dense :meth:`recurrent_matrix`.
        """
        widths = set(self.sizes[1:])
        if len(widths) > 1 or self.L == 1:
            M = self.recurrent_matrix()
            return lambda s: s @ M.T
        n, L, alpha = self.sizes[1], self.L, self.config.alpha
        ff = alpha * torch.stack([self.W[j] for j in range(1, L)])                    # [L-1, n, n]: j -> j+1
        fb = torch.stack([self.betas[j - 1] * self.feedback(j) for j in range(1, L)])  # [L-1, n, n]: j+1 -> j
        skips = [(i, j, alpha * self.S[k], self.beta_into(i) * self.skip_feedback(k))
                 for k, (i, j) in enumerate(self.skips) if i >= 1]

        def apply(s: torch.Tensor) -> torch.Tensor:
            s3 = s.view(s.shape[0], L, n)
            up = torch.einsum("bli,loi->blo", s3[:, :-1], ff)
            down = torch.einsum("bli,loi->blo", s3[:, 1:], fb)
            h = F.pad(up, (0, 0, 1, 0)) + F.pad(down, (0, 0, 0, 1))
            if skips:
                extra = torch.zeros_like(h)
                for i, j, Sf, Sb in skips:
                    extra[:, j - 1] += s3[:, i - 1] @ Sf.T
                    extra[:, i - 1] += s3[:, j - 1] @ Sb.T
                h = h + extra
            return h.reshape(s.shape[0], L * n)

        return apply

    def step(self, s: torch.Tensor, drive: torch.Tensor, couple, target: torch.Tensor | None = None,
             beta_f: float = 0.0) -> torch.Tensor:
        """One synchronous update ``tanh(couple(s) + drive)`` (``couple`` from :meth:`coupling`); with
        ``target`` ``[B, n_out]`` (one-hot) and ``beta_f > 0`` the top layer also gets
        ``β_f B_f (s_tar − softmax(W_f s_L + b_f))``."""
        h = couple(s) + drive
        if target is not None and beta_f != 0:
            e = target - torch.softmax(self.logits(s), dim=-1)
            h = h + F.pad(beta_f * (e @ self.feedback_out().T), (self.offsets[-2], 0))
        return torch.tanh(h)

    def free_phase(self, x: torch.Tensor, T: int, s: torch.Tensor | None = None) -> torch.Tensor:
        """``T`` un-nudged steps from ``s`` (zeros by default); returns the state ``[B, N]``."""
        x = x.to(self.W_f.dtype)
        d, M = self.drive(x), self.coupling()
        s = self.init_state(x.shape[0]) if s is None else s
        for _ in range(T):
            s = self.step(s, d, M)
        return s

    def nudged_phase(self, x: torch.Tensor, s: torch.Tensor, target: torch.Tensor, K: int,
                     beta_f: float) -> torch.Tensor:
        """``K`` nudged steps from the free state ``s``."""
        x = x.to(self.W_f.dtype)
        d, M = self.drive(x), self.coupling()
        for _ in range(K):
            s = self.step(s, d, M, target, beta_f)
        return s

    def forward(self, x: torch.Tensor, T: int | None = None) -> torch.Tensor:
        """Logits after the free phase ``[B, n_out]`` (differentiable: BPTT through ``T`` steps)."""
        T = self.config.steps()[0] if T is None else T
        return self.logits(self.free_phase(x, T))

    @torch.no_grad()
    def convergence_steps(self, x: torch.Tensor, tol: float = 1e-4, max_steps: int = 1000) -> torch.Tensor:
        """Per sample ``[B]``, the first ``t`` with ``‖s[t] − s[t-1]‖∞ < tol`` in the free phase from zero
        states (``max_steps`` if never)."""
        x = x.to(self.W_f.dtype)
        d, M = self.drive(x), self.coupling()
        s = self.init_state(x.shape[0])
        done = torch.full((x.shape[0],), max_steps, dtype=torch.long)
        for t in range(1, max_steps + 1):
            new = self.step(s, d, M)
            hit = ((new - s).abs().amax(-1) < tol) & (done == max_steps)
            done[hit] = t
            s = new
            if bool((done < max_steps).all()):
                break
        return done

    @torch.no_grad()
    def spectral_radius(self) -> float:
        """Largest |eigenvalue| of :meth:`recurrent_matrix`."""
        return float(torch.linalg.eigvals(self.recurrent_matrix()).abs().max())


# ---------------------------------------------------------------------------------------------------
# EP and BP gradients
# ---------------------------------------------------------------------------------------------------
def ep_gradients(model: FRERNN, x: torch.Tensor, y: torch.Tensor, T: int | None = None, K: int | None = None,
                 beta_f: float | None = None, return_loss: bool = False):
    """EP update direction for every parameter (``Δ``, ascent direction ≈ −∇loss), batch-averaged.

    ``x`` ``[B, n_in]``, ``y`` ``[B]`` class labels. Returns ``{parameter name: Δ}`` (and the free-phase
    cross-entropy when ``return_loss``).
    """
    cfg = model.config
    T0, K0 = cfg.steps()
    T, K = T or T0, K or K0
    beta_f = cfg.beta_f if beta_f is None else beta_f
    x = x.to(model.W_f.dtype)
    target = F.one_hot(y, model.W_f.shape[0]).to(x.dtype)
    with torch.no_grad():
        free = model.free_phase(x, T)
        nudged = model.nudged_phase(x, free, target, K, beta_f)
        B = x.shape[0]
        scale = 1.0 / (B * (beta_f if cfg.scale_by_beta_f else 1.0))
        full0 = [x, *model.layers(free)]                      # s_0 … s_L at the free fixed point
        diff = [None, *model.layers(nudged - free)]           # diff[j] = s_j^β − s_j^0
        err = target - torch.softmax(model.logits(free), -1)
        out: dict[str, torch.Tensor] = {}
        for i in range(model.L):
            out[f"W.{i}"] = diff[i + 1].T @ full0[i] * scale
            if model.b:
                out[f"b.{i}"] = diff[i + 1].sum(0) * scale
        out["W_f"] = err.T @ full0[-1] / B
        if model.b_f is not None:
            out["b_f"] = err.sum(0) / B
        for k, (i, j) in enumerate(model.skips):
            out[f"S.{k}"] = diff[j].T @ full0[i] * scale
        if return_loss:
            return out, float(F.cross_entropy(model.logits(free), y))
    return out


def bp_gradients(model: FRERNN, x: torch.Tensor, y: torch.Tensor, T: int | None = None) -> dict[str, torch.Tensor]:
    """``∇`` of the mean cross-entropy after ``T`` free-phase steps, by BPTT: ``{parameter name: grad}``."""
    params = dict(model.named_parameters())
    loss = F.cross_entropy(model(x, T), y)
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {n: (g if g is not None else torch.zeros_like(p)) for (n, p), g in zip(params.items(), grads)}


def gradient_alignment(model: FRERNN, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Cosine between the EP update and the negative BPTT gradient, per parameter."""
    ep = ep_gradients(model, x, y)
    bp = bp_gradients(model, x, y)
    return {n: float(F.cosine_similarity(ep[n].flatten(), -bp[n].flatten(), dim=0)) for n in ep}


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------
@dataclass
class TrainStats:
    """A training run: per-epoch train loss and test accuracy ``[epochs]``; the trained model."""

    train_loss: np.ndarray
    test_accuracy: np.ndarray
    model: FRERNN

    @property
    def final_accuracy(self) -> float:
        return float(self.test_accuracy[-1])


def train(config: EPConfig, method: Method = "ep", seed: int = 0, epochs: int | None = None,
          desc: str | None = None) -> TrainStats:
    """Train an FRE-RNN on digits with EP (``method="ep"``) or BPTT (``"bp"``) and Adam; reproducible."""
    if method not in ("ep", "bp"):
        raise ValueError(f"method must be 'ep' or 'bp', got {method!r}")
    epochs = config.epochs if epochs is None else epochs
    data = digits_split(seed=seed, test_size=config.test_size)
    gen = set_seed(seed)
    model = FRERNN(data.x_train.shape[1], 10, config, generator=gen)
    dt = config.torch_dtype
    xtr, xte = data.x_train.to(dt), data.x_test.to(dt)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    params = dict(model.named_parameters())
    n = len(data.y_train)
    losses, accs = np.zeros(epochs), np.zeros(epochs)
    for epoch in progress(range(epochs), desc=desc or f"{method} seed {seed}", total=epochs):
        total = 0.0
        for idx in minibatches(n, config.batch_size, gen):
            xb, yb = xtr[idx], data.y_train[idx]
            opt.zero_grad()
            if method == "ep":
                delta, loss = ep_gradients(model, xb, yb, return_loss=True)
                for name, d in delta.items():
                    params[name].grad = -d
            else:
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
            opt.step()
            total += float(loss.detach() if torch.is_tensor(loss) else loss) * len(idx)
        losses[epoch] = total / n
        with torch.no_grad():
            accs[epoch] = accuracy(model(xte), data.y_test)
    return TrainStats(train_loss=losses, test_accuracy=accs, model=model)


@torch.no_grad()
def convergence_profile(model: FRERNN, x: torch.Tensor, betas: Sequence[float], tol: float = 1e-4,
                        max_steps: int = 1000) -> tuple[list[float], list[float]]:
    """For each ``β`` (set on every feedback link of ``model``), mean steps to convergence on ``x`` and the
    spectral radius of the recurrent matrix. ``model``'s own ``β`` values are restored afterwards."""
    saved = list(model.betas)
    steps, radius = [], []
    try:
        for b in betas:
            model.betas = [float(b)] * len(saved)
            steps.append(float(model.convergence_steps(x, tol, max_steps).double().mean()))
            radius.append(model.spectral_radius())
    finally:
        model.betas = saved
    return steps, radius
