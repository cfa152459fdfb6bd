"""Vectorised binary-tree squared circuits: a tree tensor network (one tree) or a mixture of trees over
different variable orders (a circuit whose factorisation is not a tensor network).

Layout: ``T`` branches, each a balanced binary tree over ``D = 2^L`` variables taken in the branch's own
order. Branch ``t`` uses basis rows ``[t K_0, (t + 1) K_0)`` of every variable's ``V x V`` input matrix
(``K_0 = V // T``), so the branches are orthogonal on every variable (U4). Level ``l`` joins sibling
pairs by a Kronecker product and a sum layer of width ``K_l = min(width, K_{l-1}^2)``. With ``T = 1`` the
top level outputs the root (width 1); with ``T > 1`` the top of every branch has width ``K_L`` and a root
sum layer mixes the ``T`` branches.

Evaluation renormalises every node vector and carries the log of the scales, so ``log|c(x)|^2`` is exact
for 64 variables without underflow. All nodes of a level are computed in one batched ``einsum``.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from .circuit import Circuit, CircuitBuilder, _randn, as_weight, semi_unitary

__all__ = ["TreeMixtureCircuit", "morton_order"]


def morton_order(height: int, width: int, transpose: bool = False) -> list[int]:
    """Row-major pixel indices of a ``height x width`` image in Z-order (quadtree) so that sibling pairs
    of a balanced binary tree are neighbouring pixels; ``transpose`` merges vertical neighbours first."""
    if height & (height - 1) or width & (width - 1) or height != width:
        raise ValueError("morton_order needs a square image with a power-of-two side")
    def key(r: int, c: int) -> int:
        a, b = (r, c) if transpose else (c, r)  # the lowest interleaved bit comes from the first coordinate
        out = 0
        for bit in range(int(math.log2(height))):
            out |= ((a >> bit) & 1) << (2 * bit)
            out |= ((b >> bit) & 1) << (2 * bit + 1)
        return out
    pix = [(r, c) for r in range(height) for c in range(width)]
    return [r * width + c for r, c in sorted(pix, key=lambda rc: key(*rc))]


class TreeMixtureCircuit(nn.Module):
    """Squared tree circuit(s) over ``num_vars`` discrete variables with domain ``domain``.

    Args:
        num_vars: ``D``, a power of two.
        domain: ``V`` states per variable.
        width: maximum layer width ``K``.
        orders: one leaf order (a permutation of ``range(D)``) per branch; ``None`` = one identity tree.
        unitary: semi-unitary weights and unitary input matrices (``Z = 1``); else unconstrained.
        dtype: complex (default ``complex64``) or real.
        generator: seeds the initialisation.
    """

    def __init__(self, num_vars: int, domain: int, width: int, orders: Sequence[Sequence[int]] | None = None,
                 unitary: bool = True, dtype: torch.dtype = torch.complex64,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if num_vars < 2 or num_vars & (num_vars - 1):
            raise ValueError(f"num_vars must be a power of two >= 2, got {num_vars}")
        orders = [list(range(num_vars))] if orders is None else [list(o) for o in orders]
        for o in orders:
            if sorted(o) != list(range(num_vars)):
                raise ValueError("every order must be a permutation of range(num_vars)")
        t = len(orders)
        if domain < t:
            raise ValueError(f"{t} branches need domain >= {t} (disjoint basis functions per branch), got {domain}")
        if width < 1:
            raise ValueError("width must be >= 1")
        self.num_vars, self.domain, self.width, self.unitary = num_vars, domain, width, bool(unitary)
        self.num_branches = t
        self.leaf_size = domain // t
        self.register_buffer("orders", torch.tensor(orders, dtype=torch.long), persistent=False)
        self.depth = int(math.log2(num_vars))
        sizes = [self.leaf_size]
        for lvl in range(1, self.depth + 1):
            k = min(width, sizes[-1] ** 2)
            if lvl == self.depth and t == 1:
                k = 1
            sizes.append(k)
        self.sizes = sizes
        self.embed_raw = nn.Parameter(_randn((num_vars, domain, domain), dtype, generator))
        self.level_raw = nn.ParameterList([
            nn.Parameter(_randn((t, num_vars >> lvl, sizes[lvl - 1] ** 2, sizes[lvl]), dtype, generator))
            for lvl in range(1, self.depth + 1)])
        self.root_raw = nn.Parameter(_randn((t * sizes[-1], 1), dtype, generator)) if t > 1 else None

    # -- weights -------------------------------------------------------------------------------
    def input_matrices(self) -> torch.Tensor:
        """``[D, V, V]`` input matrices (row k = function f_k)."""
        return as_weight(self.embed_raw, self.unitary)

    def level_weights(self) -> list[torch.Tensor]:
        """Per level ``[T, N_l, K_l, K_{l-1}^2]``."""
        return [as_weight(r, self.unitary) for r in self.level_raw]

    def root_weight(self) -> torch.Tensor | None:
        """``[1, T K_L]`` (``None`` for a single tree)."""
        return None if self.root_raw is None else as_weight(self.root_raw, self.unitary)

    def num_parameters(self) -> int:
        """Raw parameter count (one per complex entry)."""
        return sum(p.numel() for p in self.parameters())

    # -- evaluation ------------------------------------------------------------------------------
    def _leaves(self, emb: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, D, K_0]``: branch t's leaf j is variable ``orders[t, j]`` with basis block t."""
        t, k = self.num_branches, self.leaf_size
        blocks = emb[:, : t * k].reshape(self.num_vars, t, k, self.domain).permute(0, 1, 3, 2)  # [D, T, V, K]
        xs = x[:, self.orders]                                                             # [B, T, D]
        tidx = torch.arange(t)[None, :, None]
        return blocks[self.orders[None], tidx, xs]

    def log_amplitude_sq(self, x: torch.Tensor) -> torch.Tensor:
        """``log |c(x)|^2`` ``[B]`` for states ``x`` ``[B, D]`` (long)."""
        if x.ndim != 2 or x.shape[1] != self.num_vars:
            raise ValueError(f"x must be [batch, {self.num_vars}] states, got shape {tuple(x.shape)}")
        x = x.long()
        if x.numel() and (x.min() < 0 or x.max() >= self.domain):
            raise ValueError(f"states must lie in [0, {self.domain})")
        h = self._leaves(self.input_matrices(), x)                     # [B, T, N, K]
        logscale = torch.zeros(h.shape[:2], dtype=h.real.dtype)          # [B, T]
        for w in self.level_weights():
            b, t, n, k = h.shape
            pair = h.reshape(b, t, n // 2, 2, k)
            kron = (pair[..., 0, :, None] * pair[..., 1, None, :]).reshape(b, t, n // 2, k * k)
            h = torch.einsum("btnk,tnok->btno", kron, w)
            s = h.abs().square().sum(-1).sqrt().clamp_min(torch.finfo(logscale.dtype).tiny)   # [B, T, N']
            logscale = logscale + s.log().sum(-1)
            h = h / s[..., None]
        top = h[:, :, 0, :]                                               # [B, T, K_L], unit norm
        if self.num_branches == 1:
            return 2 * logscale[:, 0] + top[:, 0, 0].abs().square().log()
        w = self.root_weight().reshape(self.num_branches, -1)            # [T, K_L]
        ref = logscale.max(dim=1, keepdim=True).values
        amp = ((top * w[None]).sum(-1) * torch.exp(logscale - ref)).sum(-1)
        return 2 * ref[:, 0] + amp.abs().square().log()

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``log p(x)`` ``[B]``: ``log|c|^2`` when unitary (``Z = 1`` by construction), else ``log|c|^2 - log Z``
        with ``Z`` from :meth:`log_partition_squared` (explicit squaring)."""
        out = self.log_amplitude_sq(x)
        return out if self.unitary else out - self.log_partition_squared()

    def bits_per_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Mean ``-log2 p(x) / D`` over the batch (a scalar)."""
        return -self.log_prob(x).mean() / (self.num_vars * math.log(2.0))

    def log_partition_squared(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``log Z`` by explicitly squaring each tree: the Gram recursion ``G = W (G_1 (x) G_2) W^H``
        from the leaf Grams ``E E^H`` (cost quadratic in the layer width).

        With several branches the cross-branch terms are dropped, which is exact only when the branches
        are orthogonal (unitary input matrices, disjoint basis blocks), so unconstrained mixtures raise.
        ``dtype`` (e.g. ``torch.complex128``) runs the recursion in higher precision on the weights exactly as
        the model materialises them in its own dtype (so a check measures the model's true ``Z``).
        """
        if self.num_branches > 1 and not self.unitary:
            raise ValueError("explicit squaring of a mixture of different trees is not layer-wise: the circuit "
                             "is not structured-decomposable")
        cast = (lambda w: w) if dtype is None else (lambda w: w.to(dtype))  # noqa: E731
        emb = cast(self.input_matrices())
        weights = [cast(w) for w in self.level_weights()]
        t, k0 = self.num_branches, self.leaf_size
        blocks = emb[:, : t * k0].reshape(self.num_vars, t, k0, self.domain)           # [D, T, K, V]
        leaves = blocks[self.orders.T, torch.arange(t)[None, :]]                        # [D, T, K, V]
        g = (leaves @ leaves.mH).permute(1, 0, 2, 3)                                     # [T, D, K, K]
        logscale = torch.zeros(t, dtype=g.real.dtype)
        for w in weights:                                                                # [T, N, Ko, K^2]
            tt, n, k, _ = g.shape
            pair = g.reshape(tt, n // 2, 2, k, k)
            # W (G_1 (x) G_2) W^H without materialising the K^2 x K^2 Kronecker product (cost K_out K^3)
            w3 = w.reshape(tt, n // 2, w.shape[-2], k, k)                                # [T, N, Ko, i, k]
            y = torch.einsum("tnoik,tnij->tnojk", w3, pair[:, :, 0])
            y = torch.einsum("tnojk,tnkl->tnojl", y, pair[:, :, 1])
            g = torch.einsum("tnojl,tnpjl->tnop", y, w3.conj())
            tr = torch.diagonal(g, dim1=-2, dim2=-1).real.sum(-1).clamp_min(torch.finfo(logscale.dtype).tiny)
            logscale = logscale + tr.log().sum(-1)
            g = g / tr[..., None, None]
        top = g[:, 0]                                                                    # [T, K_L, K_L]
        if t == 1:
            return logscale[0] + top[0, 0, 0].real.log()
        w = cast(self.root_weight()).reshape(t, -1)                                      # [T, K_L]
        ref = logscale.max()
        z = torch.einsum("ti,tij,tj->t", w, top, w.conj()).real * torch.exp(logscale - ref)
        return ref + z.sum().log()

    @torch.no_grad()
    def retract_(self) -> "TreeMixtureCircuit":
        """Replace every raw parameter ``A`` of a unitary model by ``Q(A)`` (its orthonormalised columns).

        The function is unchanged (``semi_unitary(Q) = semi_unitary(A)``), but the raw parameters stay at unit
        column norm, so Adam's steps keep the same angular size throughout training (a QR retraction onto
        the Stiefel manifold, in the spirit of LandingPC's projection). No-op for unconstrained models.
        """
        if not self.unitary:
            return self
        for p in [self.embed_raw, *self.level_raw] + ([self.root_raw] if self.root_raw is not None else []):
            p.copy_(semi_unitary(p).mH)
        return self

    # -- conversions -------------------------------------------------------------------------------
    def to_circuit(self) -> Circuit:
        """The same model as a generic :class:`Circuit` (copies the raw parameters), for brute force and marginals."""
        b = CircuitBuilder(self.num_vars, self.domain)
        tops = []
        for t in range(self.num_branches):
            basis = tuple(range(t * self.leaf_size, (t + 1) * self.leaf_size))
            level = [b.input(int(v), basis) for v in self.orders[t]]
            for lvl in range(1, self.depth + 1):
                level = [b.sum([b.product(level[2 * j], level[2 * j + 1])], size=self.sizes[lvl])
                         for j in range(len(level) // 2)]
            tops.append(level[0])
        if self.num_branches > 1:
            b.sum(tops, size=1)
        circuit = Circuit(b.build(), unitary=self.unitary, dtype=self.embed_raw.dtype)
        with torch.no_grad():
            circuit.embed_raw.copy_(self.embed_raw)
            slots = iter(range(len(circuit.sum_raw)))
            # sum layers were created branch by branch, level by level, node by node
            order = [(t, lvl, j) for t in range(self.num_branches) for lvl in range(self.depth)
                     for j in range(self.num_vars >> (lvl + 1))]
            for (t, lvl, j), slot in zip(order, slots):
                circuit.sum_raw[slot].copy_(self.level_raw[lvl][t, j])
            if self.num_branches > 1:
                circuit.sum_raw[len(order)].copy_(self.root_raw)
        return circuit

    def unconstrained_copy(self) -> "TreeMixtureCircuit":
        """An unconstrained model (``unitary=False``) computing exactly the same ``c(x)`` now.

        The materialised weights ``W`` become raw parameters (``raw = W^H``), so both models start from the
        same function and differ only in how they are trained and normalised.
        """
        if self.num_branches > 1:
            raise ValueError("the unconstrained baseline needs a single tree (it is squared explicitly)")
        other = TreeMixtureCircuit(self.num_vars, self.domain, self.width, self.orders.tolist(), unitary=False,
                                   dtype=self.embed_raw.dtype)
        with torch.no_grad():
            other.embed_raw.copy_(self.input_matrices().mH)
            for dst, w in zip(other.level_raw, self.level_weights()):
                dst.copy_(w.mH)
        return other
