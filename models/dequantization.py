"""Robust Training of Neural Networks at Arbitrary Precision and Sparsity (Ye et al., ICLR 2026).

Denoising dequantization: quantization (and N:M sparsification) is modelled as *additive noise*
``q = f(x) + δ`` with ``δ = stopgrad(round(f(x)) − f(x))``, and the dequantizer ``g(q)`` is the
ridge-regression fit of ``x`` on ``q`` computed per block::

    g(q) = Cov(x, q) / (Var(q) + λ) · (q − q̄) + x̄          (affine transform)
    g(q) = ⟨q, x⟩ / (⟨q, q⟩ + λ) · q                         (linear transform)

with population (1/N) moments over each block and ``λ = 0.01``. Gradients flow through the
statistics (``s_g`` and ``q̄`` depend on ``q``, hence on the noise), which gives the error-aware
backward pass. The straight-through-estimator (STE) baseline dequantizes with the inverse of ``f``.

What is here:

* :func:`quantize`: the pre-quantization transform ``f`` and the additive-noise quantizer (any bit
  width: 1-bit, ternary ``bits=1.5``, 2..16-bit; affine or linear), with optional N:M sparsity;
* :func:`ridge_fit` / :func:`ridge_dequantize` / :func:`fake_quantize`: the ridge dequantizer and the
  STE baseline on blocked tensors;
* :func:`fast_affine_matmul`: ``Ỹ = (s_X s_Wᵀ) ⊙ (Q_X Q_W − n q̄_X q̄_Wᵀ) + n x̄ w̄ᵀ`` summed over blocks;
* :class:`DequantLinear`, :class:`QuantAct` and :func:`convert_linears`: drop-in replacements for
  ``nn.Linear`` and activation quantizers;
* :func:`make_mlp`: a ReLU MLP built from quantized layers.

The A1W1 digits validation (STE vs ridge dequantization vs ridge with 2:4 weight sparsity) is the
reproduction recipe ``interp reproduce dequantization`` (``benchmarks/dequantization/``).

Choices where the paper (as digested) is unclear, all documented here:

* *Affine levels.* ``b ≥ 2``: ``f(x) = (x − min)/s_f`` with ``s_f = (max − min)/(2^b − 1)`` per block, so
  ``round(f(x)) ∈ {0, …, 2^b − 1}``. 1 bit: ``f(x) = (x − x̄)/s_f`` with ``s_f = mean|x − x̄|`` and
  ``q = sign(f(x)) ∈ {−1, +1}`` (two levels around the block mean). The min/max variant thresholds a
  1-bit block at its mid-range, which leaves ReLU activations with nearly all-zero codes; the STE
  baseline uses the same ``f`` so both methods see identical codes.
* *Linear levels.* 1-bit: ``q = sign(f(x))`` (``sign(0) = +1``) with ``s_f = mean|x|`` (the XNOR-Net
  scale, so the STE baseline dequantizes to the L2-optimal binary code); ternary (``bits=1.5``) and
  ``b ≥ 2``: symmetric ``round`` with ``s_f = max|x| / q_max``, ``q_max = 1`` or ``2^(b−1) − 1``.
* *Quantizer statistics* ``s_f``, ``b_f`` are treated as constants (detached); the ridge statistics
  are differentiable. The x-side ridge statistics (``x̄``, ``Cov(x, q)``) are kept differentiable by
  default (``detach_x_stats=False``), a flag detaches them.
* *Sparsity* needs the linear transform (a pruned entry must stay exactly zero after dequantization);
  the ridge statistics use the dense ``x`` so ``g`` reconstructs the dense tensor.
* *Blocks* run along the last (contraction) dimension: per output row of a weight, per token of an
  activation; the CPU recipe's block of 64 is the default (the paper uses 128).
* *First layer input.* Raw pixels entering the first layer are not quantized by default
  (``quantize_input=False``); every later activation and every weight is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "Method", "QuantSpec", "Quantized", "Transform", "DequantLinear", "QuantAct",
    "quantize", "ridge_fit", "ridge_dequantize", "ste_dequantize", "fake_quantize", "nm_sparsity_mask",
    "dequant_params", "fast_affine_matmul", "convert_linears", "make_mlp",
]

Method = Literal["ridge", "ste", "none"]
Transform = Literal["affine", "linear"]
_EPS = 1e-12


# ---------------------------------------------------------------------------------------------------
# Specification of a quantizer
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantSpec:
    """How one tensor is quantized.

    ``bits``: 1, 1.5 (ternary {-1, 0, 1}) or an integer 2..16. ``transform``: ``"affine"`` (min/max
    levels ``0..2^b-1``) or ``"linear"`` (symmetric levels around zero). ``block_size``: number of
    consecutive entries of the last dimension sharing statistics (``None`` = the whole last dim).
    ``sparsity``: ``(n, m)`` keeps the ``n`` largest-magnitude entries of every ``m`` (e.g. ``(2, 4)``).
    """

    bits: float = 1
    transform: Transform = "affine"
    block_size: int | None = 64
    sparsity: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not (self.bits in (1, 1.5) or (float(self.bits).is_integer() and 2 <= self.bits <= 16)):
            raise ValueError(f"bits must be 1, 1.5 (ternary) or an integer in 2..16, got {self.bits!r}")
        if self.transform not in ("affine", "linear"):
            raise ValueError(f"transform must be 'affine' or 'linear', got {self.transform!r}")
        if self.transform == "affine" and self.bits == 1.5:
            raise ValueError("ternary (bits=1.5) is a symmetric code: use transform='linear'")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be a positive int or None, got {self.block_size!r}")
        if self.sparsity is not None:
            n, m = self.sparsity
            if not (0 < n <= m):
                raise ValueError(f"sparsity must be (n, m) with 0 < n <= m, got {self.sparsity!r}")
            if self.transform != "linear":
                raise ValueError("N:M sparsity needs transform='linear' so that pruned entries stay zero")
            if self.block_size is not None and self.block_size % m:
                raise ValueError(f"block_size {self.block_size} must be a multiple of the sparsity group {m}")


def _blocks(x: torch.Tensor, block_size: int | None) -> torch.Tensor:
    """``[..., n]`` -> ``[..., n // block, block]`` (``block = n`` when ``block_size`` is None)."""
    n = x.shape[-1]
    b = n if block_size is None else block_size
    if n % b:
        raise ValueError(f"last dimension {n} is not a multiple of block_size {b}")
    return x.reshape(*x.shape[:-1], n // b, b)


def nm_sparsity_mask(x: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Float mask ``[..., k]`` keeping the ``n`` largest |x| of each group of ``m`` along the last dim."""
    k = x.shape[-1]
    if k % m:
        raise ValueError(f"last dimension {k} is not a multiple of the sparsity group size {m}")
    groups = x.detach().abs().reshape(*x.shape[:-1], k // m, m)
    top = groups.topk(n, dim=-1).indices
    mask = torch.zeros_like(groups).scatter_(-1, top, 1.0)
    return mask.reshape(x.shape)


# ---------------------------------------------------------------------------------------------------
# Quantization as additive noise
# ---------------------------------------------------------------------------------------------------
@dataclass
class Quantized:
    """Output of :func:`quantize` on a blocked tensor ``[..., n_blocks, block]``.

    ``q``: ``f(x_S) + stopgrad(level − f(x_S))``; numerically the integer levels, with gradient
    ``1/s_f`` w.r.t. ``x``. ``scale`` / ``offset``: ``s_f`` / ``b_f`` ``[..., n_blocks, 1]`` (detached), so
    ``f(x) = (x − offset) / scale``. ``mask``: the sparsity mask or ``None``.
    """

    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    mask: torch.Tensor | None = None


def quantize(x: torch.Tensor, bits: float = 1, transform: Transform = "affine",
             mask: torch.Tensor | None = None) -> Quantized:
    """Quantize ``x`` ``[..., block]`` with statistics over the last dim as ``q = f(x_S) + δ``.

    ``mask`` (same shape, 0/1) applies sparsity first: ``x_S = x + stopgrad(mask·x − x)``; pruned
    entries get level 0 (linear transform only).
    """
    spec = QuantSpec(bits=bits, transform=transform, block_size=None)  # validates bits/transform
    if mask is not None and transform != "linear":
        raise ValueError("sparsity masks need transform='linear'")
    xs = x if mask is None else x + (x * mask - x).detach()
    with torch.no_grad():
        xd = xs.detach()
        if spec.transform == "affine" and bits == 1:
            offset = xd.mean(-1, keepdim=True)
            scale = (xd - offset).abs().mean(-1, keepdim=True).clamp_min(_EPS)
        elif spec.transform == "affine":
            lo = xd.amin(-1, keepdim=True)
            hi = xd.amax(-1, keepdim=True)
            scale = ((hi - lo) / (2 ** int(bits) - 1)).clamp_min(_EPS)
            offset = lo
        else:
            offset = torch.zeros_like(xd[..., :1])
            if bits == 1:
                denom = xd.abs().sum(-1, keepdim=True) / (mask.sum(-1, keepdim=True).clamp_min(1)
                                                          if mask is not None else xd.shape[-1])
                scale = denom.clamp_min(_EPS)
            else:
                qmax = 1 if bits == 1.5 else 2 ** (int(bits) - 1) - 1
                scale = (xd.abs().amax(-1, keepdim=True) / qmax).clamp_min(_EPS)
    f = (xs - offset) / scale
    with torch.no_grad():
        if bits == 1:
            level = torch.where(f >= 0, 1.0, -1.0).to(f.dtype)
        else:
            qmax = 1 if bits == 1.5 else 2 ** (int(bits) - 1) - 1
            level = f.round().clamp(-qmax, qmax) if spec.transform == "linear" else \
                f.round().clamp(0, 2 ** int(bits) - 1)
        if mask is not None:
            level = level * mask
    q = f + (level - f).detach()
    return Quantized(q=q, scale=scale, offset=offset, mask=mask)


# ---------------------------------------------------------------------------------------------------
# Dequantization: ridge regression (the paper) and the STE inverse (the baseline)
# ---------------------------------------------------------------------------------------------------
def ridge_fit(x: torch.Tensor, q: torch.Tensor, lam: float = 0.01,
              affine: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form ridge fit of ``x ≈ s_g q + b_g`` over the last dim; returns ``(s_g, b_g)`` ``[..., 1]``.

    Minimises ``(1/2N)‖s_g q + b_g − x‖² + (λ/2) s_g²`` (intercept unpenalised). Affine:
    ``s_g = Cov(x,q)/(Var(q)+λ)``, ``b_g = x̄ − s_g q̄``; linear: ``s_g = ⟨q,x⟩/(⟨q,q⟩+λ)``, ``b_g = 0``.
    Equals scikit-learn ``Ridge(alpha=N·λ)`` on a single block.
    """
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    if x.shape != q.shape:
        raise ValueError(f"x and q must have the same shape, got {tuple(x.shape)} and {tuple(q.shape)}")
    if affine:
        xm = x.mean(-1, keepdim=True)
        qm = q.mean(-1, keepdim=True)
        qc = q - qm
        s = ((x - xm) * qc).mean(-1, keepdim=True) / ((qc * qc).mean(-1, keepdim=True) + lam).clamp_min(_EPS)
        return s, xm - s * qm
    s = (q * x).mean(-1, keepdim=True) / ((q * q).mean(-1, keepdim=True) + lam).clamp_min(_EPS)
    return s, torch.zeros_like(s)


def ridge_dequantize(x: torch.Tensor, q: torch.Tensor, lam: float = 0.01, affine: bool = True,
                     detach_x_stats: bool = False) -> torch.Tensor:
    """``g(q) = s_g q + b_g`` fitted per block (last dim) to reconstruct ``x``; gradients flow through the stats."""
    s, b = ridge_fit(x.detach() if detach_x_stats else x, q, lam=lam, affine=affine)
    return s * q + b


def ste_dequantize(quantized: Quantized) -> torch.Tensor:
    """Straight-through baseline: invert ``f``, ``x̂ = s_f q + b_f`` (gradient w.r.t. ``x`` is the identity)."""
    return quantized.scale * quantized.q + quantized.offset


def dequant_params(x: torch.Tensor, spec: QuantSpec, method: Method = "ridge", lam: float = 0.01,
                   detach_x_stats: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x`` ``[..., n]`` blockwise; return ``(q, a, c)`` with ``x̂ = a·q + c`` per block.

    ``q``: ``[..., n_blocks, block]``; ``a``, ``c``: ``[..., n_blocks, 1]``. This is the form consumed by
    :func:`fast_affine_matmul`.
    """
    if method not in ("ridge", "ste"):
        raise ValueError(f"method must be 'ridge' or 'ste' here, got {method!r}")
    xb = _blocks(x, spec.block_size)
    mask = nm_sparsity_mask(xb, *spec.sparsity) if spec.sparsity is not None else None
    qz = quantize(xb, spec.bits, spec.transform, mask=mask)
    if method == "ste":
        return qz.q, qz.scale.expand_as(qz.q[..., :1]), qz.offset.expand_as(qz.q[..., :1])
    a, c = ridge_fit(xb.detach() if detach_x_stats else xb, qz.q, lam=lam, affine=spec.transform == "affine")
    return qz.q, a, c


def fake_quantize(x: torch.Tensor, spec: QuantSpec, method: Method = "ridge", lam: float = 0.01,
                  detach_x_stats: bool = False) -> torch.Tensor:
    """Quantize-then-dequantize ``x`` ``[..., n]`` blockwise along the last dim; same shape out.

    ``method``: ``"ridge"`` (the paper), ``"ste"`` (inverse of ``f``) or ``"none"`` (identity).
    """
    if method == "none":
        return x
    q, a, c = dequant_params(x, spec, method, lam, detach_x_stats)
    return (a * q + c).reshape(x.shape)


def fast_affine_matmul(qx: torch.Tensor, ax: torch.Tensor, cx: torch.Tensor,
                       qw: torch.Tensor, aw: torch.Tensor, cw: torch.Tensor) -> torch.Tensor:
    """``X̃ W̃ᵀ`` from blockwise affine codes with one code matmul and two rank-1 corrections per block.

    ``X̃[b, j] = ax (qx − q̄x) + x̄`` with ``qx`` ``[B, J, k]``, ``ax``/``cx`` ``[B, J, 1]`` (``x̄ = ax q̄x + cx``);
    ``W̃[m, j]`` likewise with ``qw`` ``[M, J, k]``. Per block (inner size ``k``):
    ``Ỹ_j = (s_X s_Wᵀ) ⊙ (Q_X Q_Wᵀ − k q̄_X q̄_Wᵀ) + k x̄ w̄ᵀ``; the result ``[B, M]`` sums over blocks.
    """
    if qx.dim() != 3 or qw.dim() != 3 or qx.shape[1:] != qw.shape[1:]:
        raise ValueError(f"expected qx [B, J, k] and qw [M, J, k] with equal J, k; got {tuple(qx.shape)}, "
                         f"{tuple(qw.shape)}")
    k = qx.shape[-1]
    qbx, qbw = qx.mean(-1), qw.mean(-1)                      # [B, J], [M, J]
    sx, sw = ax.squeeze(-1), aw.squeeze(-1)                  # [B, J], [M, J]
    xbar, wbar = sx * qbx + cx.squeeze(-1), sw * qbw + cw.squeeze(-1)
    codes = torch.einsum("bjk,mjk->bjm", qx, qw)             # the (integer) matmul per block
    centred = codes - k * qbx.unsqueeze(-1) * qbw.T.unsqueeze(0)
    return torch.einsum("bj,mj,bjm->bm", sx, sw, centred) + k * xbar @ wbar.T


# ---------------------------------------------------------------------------------------------------
# Drop-in modules
# ---------------------------------------------------------------------------------------------------
class QuantAct(nn.Module):
    """Activation quantizer ``[..., n] -> [..., n]`` (blocks along the feature dim, i.e. per token)."""

    def __init__(self, spec: QuantSpec, method: Method = "ridge", lam: float = 0.01,
                 detach_x_stats: bool = False) -> None:
        super().__init__()
        self.spec, self.method, self.lam, self.detach_x_stats = spec, method, lam, detach_x_stats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fake_quantize(x, self.spec, self.method, self.lam, self.detach_x_stats)

    def extra_repr(self) -> str:
        return f"spec={self.spec}, method={self.method!r}, lam={self.lam}"


class DequantLinear(nn.Linear):
    """``nn.Linear`` whose weight (blocks along ``in_features`` per output row) and optionally input
    activation (blocks along features per row) are quantized and dequantized.

    ``fast=True`` computes the product with :func:`fast_affine_matmul` (needs an activation spec with
    the same block size as the weight); values equal the explicit dequantize-then-matmul path.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 weight_spec: QuantSpec | None = QuantSpec(), act_spec: QuantSpec | None = QuantSpec(),
                 method: Method = "ridge", lam: float = 0.01, detach_x_stats: bool = False,
                 fast: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        if method not in ("ridge", "ste", "none"):
            raise ValueError(f"method must be 'ridge', 'ste' or 'none', got {method!r}")
        if fast and (weight_spec is None or act_spec is None or method == "none"
                     or (weight_spec.block_size or in_features) != (act_spec.block_size or in_features)):
            raise ValueError("fast=True needs weight and activation specs with the same block size and a "
                             "quantizing method")
        self.weight_spec, self.act_spec = weight_spec, act_spec
        self.method, self.lam, self.detach_x_stats, self.fast = method, lam, detach_x_stats, fast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.method == "none":
            return F.linear(x, self.weight, self.bias)
        if self.fast:
            lead = x.shape[:-1]
            qx, ax, cx = dequant_params(x.reshape(-1, x.shape[-1]), self.act_spec, self.method, self.lam,
                                        self.detach_x_stats)
            qw, aw, cw = dequant_params(self.weight, self.weight_spec, self.method, self.lam,
                                        self.detach_x_stats)
            y = fast_affine_matmul(qx, ax, cx, qw, aw, cw)
            if self.bias is not None:
                y = y + self.bias
            return y.reshape(*lead, self.out_features)
        xq = x if self.act_spec is None else fake_quantize(x, self.act_spec, self.method, self.lam,
                                                          self.detach_x_stats)
        w = self.weight if self.weight_spec is None else fake_quantize(self.weight, self.weight_spec,
                                                                       self.method, self.lam,
                                                                       self.detach_x_stats)
        return F.linear(xq, w, self.bias)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, method={self.method!r}, weight_spec={self.weight_spec}, "
                f"act_spec={self.act_spec}, fast={self.fast}")


def convert_linears(module: nn.Module, weight_spec: QuantSpec | None, act_spec: QuantSpec | None,
                    method: Method = "ridge", lam: float = 0.01, quantize_first_input: bool = True,
                    detach_x_stats: bool = False) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` (in place) by a :class:`DequantLinear` with the same
    parameters. ``quantize_first_input=False`` leaves the input of the first linear layer (in module
    order) in full precision. Returns ``module`` (or the replacement when ``module`` is a Linear)."""
    if isinstance(module, nn.Linear) and not isinstance(module, DequantLinear):
        return _to_dequant(module, weight_spec, act_spec if quantize_first_input else None, method, lam,
                           detach_x_stats)
    first = [True]

    def visit(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear) and not isinstance(child, DequantLinear):
                spec_a = act_spec if (quantize_first_input or not first[0]) else None
                first[0] = False
                setattr(parent, name, _to_dequant(child, weight_spec, spec_a, method, lam, detach_x_stats))
            else:
                visit(child)

    visit(module)
    return module


def _to_dequant(lin: nn.Linear, weight_spec: QuantSpec | None, act_spec: QuantSpec | None, method: Method,
                lam: float, detach_x_stats: bool) -> DequantLinear:
    new = DequantLinear(lin.in_features, lin.out_features, bias=lin.bias is not None, weight_spec=weight_spec,
                        act_spec=act_spec, method=method, lam=lam, detach_x_stats=detach_x_stats)
    new = new.to(device=lin.weight.device, dtype=lin.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(lin.weight)
        if lin.bias is not None:
            new.bias.copy_(lin.bias)
    return new


def make_mlp(sizes: Sequence[int], weight_spec: QuantSpec | None, act_spec: QuantSpec | None,
             method: Method = "ridge", lam: float = 0.01, quantize_input: bool = False) -> nn.Sequential:
    """ReLU MLP ``sizes[0] -> ... -> sizes[-1]`` built from ``nn.Linear`` and converted to quantized layers."""
    if len(sizes) < 2:
        raise ValueError(f"sizes needs at least an input and an output size, got {sizes!r}")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    net = nn.Sequential(*layers)
    return convert_linears(net, weight_spec, act_spec, method, lam, quantize_first_input=quantize_input)
