"""Configuration of the Complete(d)P GPT: shape, base hyperparameters, per-module multipliers, SDE rules.

Notation (paper / CompleteP): ``m_N = width / base_width``, ``m_L = depth / base_depth``, ``alpha`` in
``[1/2, 1]`` the depth exponent of the residual-branch multiplier ``m_L^-alpha`` (``alpha = 1`` is CompleteP).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

PARAMETERIZATIONS = ("completep", "mup", "sp")
"""``completep``: Complete(d)P width+depth rules; ``mup``: the same width rules with the depth rules off
(residual multiplier 1, no depth factors); ``sp``: standard GPT-2/nanoGPT parameterization."""

MODULES = ("embedding", "attention", "mlp", "unembedding")
"""Module types of the per-module (Kronecker) multipliers. ``embedding``: token and position embeddings;
``attention``: pre-attention LayerNorm gain, QKV, QK-norm gains, output projection; ``mlp``: pre-MLP LayerNorm
gain, up and down projections; ``unembedding``: final LayerNorm gain and the logit matrix."""

BLOCK_MODULES = ("attention", "mlp")

FINAL_GAIN_EPS = ("reference", "width")
"""Adam epsilon rule of the final LayerNorm gain under CompleteP. ``reference``: ``eps / m_N * m_L^-alpha``, as
the CompleteP reference code (EleutherAI/nanoGPT-mup, branch ``completep``), which scales one epsilon for every
parameter group, the final gain included. ``width``: ``eps / m_N`` with no depth factor (the final gain sits
outside the residual branches, so its gradient does not shrink with depth; the same argument by which
Complete(d)P drops the depth factor of the embedding epsilon). The paper's per-tensor table was not available,
so it is not known which of the two Complete(d)P uses; the reference rule is the default."""

HP_TYPES = ("lr", "wd", "beta1", "beta2", "eps", "init", "mult")
"""Hyperparameter types that carry per-module multipliers. ``beta1``/``beta2`` multiply ``1 - beta``;
``init`` multiplies the init std of matrices; ``mult`` is a forward multiplier (input multiplier for the
embedding, residual-branch multiplier for attention/MLP, logit multiplier for the unembedding)."""


@dataclass
class GPTConfig:
    """Shape of the pre-norm GPT and its parameterization.

    Width is scaled by the number of heads at a fixed ``head_dim`` (CPU-scale choice; the attention scale
    still follows the ``1/d_head`` rule when ``head_dim`` differs from ``base_head_dim``). ``final_gain_eps``
    picks the Adam-epsilon rule of the final LayerNorm gain (see :data:`FINAL_GAIN_EPS`).
    """

    vocab_size: int = 63
    width: int = 64
    depth: int = 2
    head_dim: int = 16
    mlp_ratio: int = 4
    seq_len: int = 64
    base_width: int = 64
    base_depth: int = 2
    base_head_dim: int = 16
    alpha: float = 1.0
    parameterization: str = "completep"
    qk_norm: bool = True
    norm_eps: float = 1e-5
    final_gain_eps: str = "reference"

    def __post_init__(self) -> None:
        if self.parameterization not in PARAMETERIZATIONS:
            raise ValueError(f"parameterization must be one of {PARAMETERIZATIONS}, got {self.parameterization!r}")
        if self.final_gain_eps not in FINAL_GAIN_EPS:
            raise ValueError(f"GPTConfig.final_gain_eps must be one of {FINAL_GAIN_EPS}, got {self.final_gain_eps!r}")
        for name in ("vocab_size", "width", "depth", "head_dim", "mlp_ratio", "seq_len", "base_width",
                     "base_depth", "base_head_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {getattr(self, name)}")
        if self.width % self.head_dim:
            raise ValueError(f"width ({self.width}) must be a multiple of head_dim ({self.head_dim})")
        if not 0.5 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0.5, 1] (CompleteP is 1), got {self.alpha}")

    @property
    def n_heads(self) -> int:
        return self.width // self.head_dim

    @property
    def width_mult(self) -> float:
        """``m_N = width / base_width``."""
        return self.width / self.base_width

    @property
    def depth_mult(self) -> float:
        """``m_L = depth / base_depth``."""
        return self.depth / self.base_depth

    def replace(self, **changes) -> "GPTConfig":
        return dataclasses.replace(self, **changes)


@dataclass
class HParams:
    """Base (global) hyperparameters, meant at the base shape and batch; per-tensor values follow the rules.

    Defaults: AdamW betas (0.9, 0.95), init std 0.02, coupled (PyTorch-style) weight decay 0.1 and clipping of
    the global gradient norm at ``grad_clip = 1.0`` as in the CompleteP reference code (``None`` disables
    clipping; the norm is each ensemble member's own, over all of its parameters). ``eps = 1e-8`` is our
    default; the reference code's is ``adam_eps = 1e-12``. Z-loss 1e-4 (the paper uses a Z-loss with an unknown coefficient; 1e-4 is the
    PaLM value); linear warm-up over 10% of the steps then cosine decay to 10% (the paper uses a cosine
    schedule; warm-up length and floor are implementation choices). ``lr = 2**-8`` is the optimum measured
    at the base shape (width 64, depth 2, 200 steps of 8 x 64 characters) by ``benchmarks/completep_sweep.py``.
    """

    lr: float = 2.0 ** -8
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    init_std: float = 0.02
    z_loss: float = 1e-4
    warmup_frac: float = 0.1
    final_lr_frac: float = 0.1
    grad_clip: float | None = 1.0

    def __post_init__(self) -> None:
        if self.grad_clip is not None and not (isinstance(self.grad_clip, (int, float))
                                               and not isinstance(self.grad_clip, bool) and math.isfinite(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"HParams.grad_clip must be a positive finite float (the maximum global gradient "
                             f"norm) or None (no clipping), got {self.grad_clip!r}")
        if not self.lr > 0 or not self.eps > 0 or not self.init_std > 0:
            raise ValueError(f"lr, eps and init_std must be positive, got {self.lr}, {self.eps}, {self.init_std}")
        if self.weight_decay < 0 or self.z_loss < 0:
            raise ValueError("weight_decay and z_loss must be non-negative")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.warmup_frac < 1.0 or not 0.0 <= self.final_lr_frac <= 1.0:
            raise ValueError("warmup_frac must lie in [0, 1) and final_lr_frac in [0, 1]")

    def replace(self, **changes) -> "HParams":
        return dataclasses.replace(self, **changes)


def sde_scale(hp: HParams, batch_mult: float = 1.0, token_mult: float = 1.0) -> HParams:
    """SDE (Malladi et al. 2022 style) transfer of AdamW hyperparameters to a new batch size / duration.

    With ``r = m_B / m_D`` (batch multiplier over token multiplier, i.e. one over the step multiplier):
    ``lr * sqrt(r)``, ``weight_decay * sqrt(r)``, ``(1 - beta) * r``, ``eps / sqrt(r)``. Special cases:
    batch x k at fixed tokens -> lr x sqrt(k); steps x k at fixed batch -> lr / sqrt(k); batch x k with the
    steps fixed ("constant time horizon") -> unchanged. ``1 - beta`` is clipped to ``[0, 1]`` (beta >= 0).
    The unified form is the third-party reading quoted in the digest; it agrees with all stated special cases.
    """
    if batch_mult <= 0 or token_mult <= 0:
        raise ValueError(f"batch_mult and token_mult must be positive, got {batch_mult} and {token_mult}")
    r = batch_mult / token_mult
    root = math.sqrt(r)
    return hp.replace(
        lr=hp.lr * root,
        weight_decay=hp.weight_decay * root,
        beta1=1.0 - min((1.0 - hp.beta1) * r, 1.0),
        beta2=1.0 - min((1.0 - hp.beta2) * r, 1.0),
        eps=hp.eps / root,
    )


@dataclass
class ModuleMultipliers:
    """Complete(d)P per-module multipliers in Kronecker (log-additive) form.

    For hyperparameter type ``h`` the multiplier of module ``m`` in layer ``l`` is
    ``zeta_h(m, l) = type[h][m] * depth[h](l)``, i.e. ``log zeta = log zeta^type_m + log zeta^depth_l``:
    ``|MODULES|`` type multipliers plus one depth multiplier per layer (the paper's simplified search space).
    Depth multipliers act on the transformer blocks only (attention and MLP modules). They are given for
    ``len(depth[h])`` layers; a model of another depth reads them by linear interpolation of the log
    multiplier at the relative layer position ``(l + 1/2) / L`` (the paper interpolates linearly; doing it
    in log space, in which they are searched, is an implementation choice). Missing entries are 1.
    """

    type: dict[str, dict[str, float]] = field(default_factory=dict)
    depth: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for h, per_module in self.type.items():
            if h not in HP_TYPES:
                raise ValueError(f"unknown hyperparameter type {h!r}; expected one of {HP_TYPES}")
            for m, v in per_module.items():
                if m not in MODULES:
                    raise ValueError(f"unknown module {m!r}; expected one of {MODULES}")
                if not (v > 0 and math.isfinite(v)):
                    raise ValueError(f"multiplier type[{h!r}][{m!r}] must be positive and finite, got {v}")
        for h, values in self.depth.items():
            if h not in HP_TYPES:
                raise ValueError(f"unknown hyperparameter type {h!r}; expected one of {HP_TYPES}")
            if len(values) < 1 or not all(v > 0 and math.isfinite(v) for v in values):
                raise ValueError(f"depth[{h!r}] must be a non-empty list of positive multipliers, got {values}")

    def depth_factor(self, h: str, layer: int, depth: int) -> float:
        """Depth multiplier of hyperparameter type ``h`` at ``layer`` of a ``depth``-layer model."""
        values = self.depth.get(h)
        if not values:
            return 1.0
        if len(values) == depth:
            return float(values[layer])
        src = (np.arange(len(values)) + 0.5) / len(values)
        return float(np.exp(np.interp((layer + 0.5) / depth, src, np.log(values))))

    def factor(self, h: str, module: str, layer: int | None = None, depth: int | None = None) -> float:
        """``zeta_h(module, layer)``; ``layer=None`` for the embedding and unembedding."""
        value = float(self.type.get(h, {}).get(module, 1.0))
        if layer is not None and module in BLOCK_MODULES:
            if depth is None:
                raise ValueError("depth is needed to read a depth multiplier")
            value *= self.depth_factor(h, layer, depth)
        return value

    @classmethod
    def from_log2(cls, coords: list[tuple], values: np.ndarray | list[float]) -> "ModuleMultipliers":
        """Build multipliers from log2 values on coordinates ``("type", h, module)`` or ``("depth", h, l, L)``."""
        values = list(np.asarray(values, dtype=float).ravel())
        if len(values) != len(coords):
            raise ValueError(f"{len(coords)} coordinates but {len(values)} values")
        type_: dict[str, dict[str, float]] = {}
        depth: dict[str, list[float]] = {}
        for coord, v in zip(coords, values):
            if coord[0] == "type":
                _, h, m = coord
                type_.setdefault(h, {})[m] = float(2.0 ** v)
            elif coord[0] == "depth":
                _, h, layer, n_layers = coord
                depth.setdefault(h, [1.0] * n_layers)[layer] = float(2.0 ** v)
            else:
                raise ValueError(f"coordinate must start with 'type' or 'depth', got {coord!r}")
        return cls(type=type_, depth=depth)

    def to_dict(self) -> dict:
        return {"type": {h: dict(v) for h, v in self.type.items()}, "depth": {h: list(v) for h, v in self.depth.items()}}
