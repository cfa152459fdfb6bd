"""Generic tensorized circuits, their unitary parameterisation and the marginalization recursion.

A circuit is a DAG of layers over ``D`` discrete variables with domain ``{0..V-1}``:

* **input layer** over one variable ``X_v``: ``K`` functions ``f_k(x) = M_v[b_k, x]`` where ``M_v`` is a
  per-variable ``V x V`` matrix and ``b`` the layer's *basis indices* (a subset of its rows);
* **product layer** over children with disjoint scopes: Kronecker (``K = K_1 K_2``) or Hadamard
  (``K = K_1 = K_2``);
* **sum layer** over inputs with equal scopes: ``W l = sum_i W_i l_i`` with ``W = [W_1 .. W_m]``.

The model is ``p(x) = |c(x)|^2 / Z``. In the *unitary* parameterisation (U1-U3 of the paper)

* U1: ``M_v`` is unitary, so every input layer is orthonormal (``sum_x l(x) l(x)^H = I``);
* U2: the inputs of a sum layer use disjoint basis indices for at least one variable;
* U3: every ``W`` is semi-unitary (``W W^H = I``), obtained from an unconstrained parameter by a
  QR decomposition (see :func:`semi_unitary`),

so ``Z = 1`` exactly, and with U4 (disjoint basis indices for *all* variables) every marginal follows
from the Gram recursion of :meth:`Circuit.marginal` without squaring the circuit. With
``unitary=False`` the same structure has unconstrained weights and ``Z`` must be computed by
explicitly squaring the circuit (:meth:`Circuit.explicit_squaring`, possible only for
structured-decomposable circuits) or by brute force.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import nn

__all__ = [
    "Node",
    "CircuitStructure",
    "CircuitBuilder",
    "Circuit",
    "NotStructuredError",
    "semi_unitary",
    "as_weight",
    "random_structure",
    "tree_structure",
    "two_partition_structure",
]


class NotStructuredError(ValueError):
    """Explicit squaring needs a structured-decomposable circuit (the same partition at equal scopes)."""


def semi_unitary(raw: torch.Tensor) -> torch.Tensor:
    """Map an unconstrained ``[..., K_in, K_out]`` tensor (``K_in >= K_out``) to ``W`` ``[..., K_out, K_in]`` with ``W W^H = I``.

    ``W = Q^H`` where ``raw = Q R`` is the reduced QR decomposition with the phases of ``diag(R)`` moved
    into ``Q`` (so ``R`` has a positive diagonal and the map is smooth and unique for full-rank ``raw``).
    Works batched, for real and complex dtypes, and is differentiable.
    """
    if raw.shape[-2] < raw.shape[-1]:
        raise ValueError(f"a semi-unitary W needs K_out <= K_in, got raw shape {tuple(raw.shape)} (K_in={raw.shape[-2]}, "
                         f"K_out={raw.shape[-1]})")
    q, r = torch.linalg.qr(raw, mode="reduced")
    d = torch.diagonal(r, dim1=-2, dim2=-1)
    phase = d / d.abs().clamp_min(torch.finfo(d.abs().dtype).tiny)
    return (q * phase.unsqueeze(-2)).mH


def as_weight(raw: torch.Tensor, unitary: bool) -> torch.Tensor:
    """The layer matrix ``[..., K_out, K_in]`` from its raw parameter ``[..., K_in, K_out]`` (semi-unitary or plain ``raw^H``)."""
    return semi_unitary(raw) if unitary else raw.mH


# ----------------------------------------------------------------------------------------------
# structure
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """One layer. ``children`` index earlier nodes. ``size`` is the output width ``K``."""

    kind: str                       # "input" | "product" | "sum"
    children: tuple[int, ...] = ()
    var: int = -1                   # input: the variable
    basis: tuple[int, ...] = ()     # input: rows of M_var used as functions
    product: str = "kronecker"      # product: "kronecker" | "hadamard"
    size: int = 0


@dataclass
class CircuitStructure:
    """A validated layer DAG (topological order, root last with ``size == 1``)."""

    num_vars: int
    domain: int
    nodes: list[Node]
    scopes: list[frozenset[int]] = field(init=False)
    basis_sets: list[dict[int, frozenset[int]]] = field(init=False)

    def __post_init__(self) -> None:
        self.scopes, self.basis_sets = [], []
        if not self.nodes:
            raise ValueError("a circuit needs at least one node")
        for i, n in enumerate(self.nodes):
            if any(c >= i or c < 0 for c in n.children):
                raise ValueError(f"node {i}: children must be earlier nodes (topological order), got {n.children}")
            if n.kind == "input":
                if not 0 <= n.var < self.num_vars:
                    raise ValueError(f"node {i}: variable {n.var} out of range [0, {self.num_vars})")
                if not n.basis or len(set(n.basis)) != len(n.basis) or min(n.basis) < 0 or max(n.basis) >= self.domain:
                    raise ValueError(f"node {i}: basis indices must be distinct and in [0, {self.domain}), got {n.basis}")
                if n.size != len(n.basis):
                    raise ValueError(f"node {i}: an input layer's size is its number of basis functions")
                self.scopes.append(frozenset([n.var]))
                self.basis_sets.append({n.var: frozenset(n.basis)})
            elif n.kind == "product":
                if len(n.children) < 2:
                    raise ValueError(f"node {i}: a product layer needs >= 2 children")
                scopes = [self.scopes[c] for c in n.children]
                if sum(len(s) for s in scopes) != len(frozenset().union(*scopes)):
                    raise ValueError(f"node {i}: product children must have disjoint scopes (decomposability)")
                sizes = [self.nodes[c].size for c in n.children]
                if n.product == "kronecker":
                    expect = int(np.prod(sizes))
                elif n.product == "hadamard":
                    if len(set(sizes)) != 1:
                        raise ValueError(f"node {i}: Hadamard children need equal sizes, got {sizes}")
                    expect = sizes[0]
                else:
                    raise ValueError(f"node {i}: product must be 'kronecker' or 'hadamard', got {n.product!r}")
                if n.size != expect:
                    raise ValueError(f"node {i}: product size should be {expect}, got {n.size}")
                self.scopes.append(frozenset().union(*scopes))
                merged: dict[int, frozenset[int]] = {}
                for c in n.children:
                    merged.update(self.basis_sets[c])
                self.basis_sets.append(merged)
            elif n.kind == "sum":
                if not n.children:
                    raise ValueError(f"node {i}: a sum layer needs >= 1 input")
                scope = self.scopes[n.children[0]]
                if any(self.scopes[c] != scope for c in n.children):
                    raise ValueError(f"node {i}: sum inputs must have equal scopes (smoothness)")
                if n.size < 1:
                    raise ValueError(f"node {i}: sum size must be >= 1")
                self.scopes.append(scope)
                merged = {v: frozenset().union(*(self.basis_sets[c][v] for c in n.children)) for v in scope}
                self.basis_sets.append(merged)
            else:
                raise ValueError(f"node {i}: kind must be 'input', 'product' or 'sum', got {n.kind!r}")
        if self.nodes[-1].size != 1:
            raise ValueError("the root (last node) must output a single value (size 1)")
        if self.scopes[-1] != frozenset(range(self.num_vars)):
            raise ValueError("the root's scope must cover every variable")

    @property
    def root(self) -> int:
        return len(self.nodes) - 1

    def sum_in_size(self, i: int) -> int:
        return sum(self.nodes[c].size for c in self.nodes[i].children)

    def conditions(self) -> dict[str, bool]:
        """Structural conditions: U2, U4, width (``K_out <= K_in`` at every sum) and structured decomposability."""
        u2 = u4 = True
        for n in self.nodes:
            if n.kind != "sum" or len(n.children) < 2:
                continue
            for a, b in itertools.combinations(n.children, 2):
                disjoint = [not (self.basis_sets[a][v] & self.basis_sets[b][v]) for v in self.scopes[a]]
                u2 &= any(disjoint)
                u4 &= all(disjoint)
        width = all(n.size <= self.sum_in_size(i) for i, n in enumerate(self.nodes) if n.kind == "sum")
        return {"U2": bool(u2), "U4": bool(u4), "width_ok": bool(width), "structured": self.is_structured()}

    def is_structured(self) -> bool:
        """True when all product layers with the same scope split it the same way (a single vtree)."""
        seen: dict[frozenset[int], frozenset[frozenset[int]]] = {}
        for i, n in enumerate(self.nodes):
            if n.kind != "product":
                continue
            part = frozenset(self.scopes[c] for c in n.children)
            if seen.setdefault(self.scopes[i], part) != part:
                return False
        return True

    def num_parameters(self) -> int:
        """Raw parameter count (complex entries count once): embeddings ``D V^2`` plus every sum's ``K_in K_out``."""
        return self.num_vars * self.domain ** 2 + sum(self.sum_in_size(i) * n.size for i, n in enumerate(self.nodes)
                                                      if n.kind == "sum")


class CircuitBuilder:
    """Incremental construction of a :class:`CircuitStructure`::

        b = CircuitBuilder(num_vars=2, domain=2)
        r = b.sum([b.product(b.input(0, (0, 1)), b.input(1, (0, 1)))], size=1)
        structure = b.build()
    """

    def __init__(self, num_vars: int, domain: int) -> None:
        if num_vars < 1 or domain < 1:
            raise ValueError("num_vars and domain must be >= 1")
        self.num_vars, self.domain = num_vars, domain
        self.nodes: list[Node] = []

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def input(self, var: int, basis: Sequence[int]) -> int:
        return self._add(Node("input", var=var, basis=tuple(int(b) for b in basis), size=len(basis)))

    def product(self, *children: int, kind: str = "kronecker") -> int:
        sizes = [self.nodes[c].size for c in children]
        size = int(np.prod(sizes)) if kind == "kronecker" else sizes[0]
        return self._add(Node("product", children=tuple(children), product=kind, size=size))

    def sum(self, children: Sequence[int], size: int) -> int:
        return self._add(Node("sum", children=tuple(children), size=int(size)))

    def build(self) -> CircuitStructure:
        return CircuitStructure(self.num_vars, self.domain, list(self.nodes))


def _product_index(node: Node, sizes: Sequence[int]) -> list[torch.Tensor]:
    """For each child, the child index feeding each output unit (Kronecker: row-major; Hadamard: identity)."""
    if node.product == "hadamard":
        return [torch.arange(sizes[0]) for _ in sizes]
    grids = torch.meshgrid(*[torch.arange(s) for s in sizes], indexing="ij")
    return [g.reshape(-1) for g in grids]


# ----------------------------------------------------------------------------------------------
# the circuit
# ----------------------------------------------------------------------------------------------
class Circuit(nn.Module):
    """A squared tensorized circuit ``p(x) = |c(x)|^2 / Z`` over a :class:`CircuitStructure`.

    Args:
        structure: the layer DAG.
        unitary: enforce U1 and U3 by parameterisation (``Z = 1``); otherwise weights are unconstrained.
        dtype: ``torch.complex128`` (default), ``complex64``, ``float64`` or ``float32``.
        generator: seeds the standard-normal initialisation of the raw parameters.

    Parameters: ``embed_raw`` ``[D, V, V]`` (per-variable basis) and one raw ``[K_in, K_out]`` per sum layer.
    """

    def __init__(self, structure: CircuitStructure, unitary: bool = True, dtype: torch.dtype = torch.complex128,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.structure = structure
        self.unitary = bool(unitary)
        conds = structure.conditions()
        if self.unitary and not conds["width_ok"]:
            raise ValueError("unitary sum layers need K_out <= K_in (a semi-unitary W cannot widen)")
        if self.unitary and not conds["U2"]:
            raise ValueError("unitary circuits need U2: the inputs of every sum layer must use disjoint basis "
                             "functions for at least one variable")
        d, v = structure.num_vars, structure.domain
        self.embed_raw = nn.Parameter(_randn((d, v, v), dtype, generator))
        self.sum_raw = nn.ParameterList()
        self._sum_slot: dict[int, int] = {}
        for i, n in enumerate(structure.nodes):
            if n.kind == "sum":
                self._sum_slot[i] = len(self.sum_raw)
                self.sum_raw.append(nn.Parameter(_randn((structure.sum_in_size(i), n.size), dtype, generator)))
        self._prod_index = {i: _product_index(n, [structure.nodes[c].size for c in n.children])
                            for i, n in enumerate(structure.nodes) if n.kind == "product"}

    # -- materialised weights ----------------------------------------------------------------
    def input_matrices(self) -> torch.Tensor:
        """``M`` ``[D, V, V]``: row ``k`` of ``M[v]`` is input function ``f_k`` of variable ``v``."""
        return as_weight(self.embed_raw, self.unitary)

    def sum_weight(self, node: int) -> torch.Tensor:
        """``W`` ``[K_out, K_in]`` of sum layer ``node`` (inputs concatenated in child order)."""
        return as_weight(self.sum_raw[self._sum_slot[node]], self.unitary)

    def _weights(self) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        return self.input_matrices(), {i: self.sum_weight(i) for i in self._sum_slot}

    # -- evaluation --------------------------------------------------------------------------
    def _check_x(self, x: torch.Tensor) -> torch.Tensor:
        s = self.structure
        if x.ndim != 2 or x.shape[1] != s.num_vars:
            raise ValueError(f"x must be [batch, {s.num_vars}] integer states, got shape {tuple(x.shape)}")
        x = x.long()
        if x.numel() and (x.min() < 0 or x.max() >= s.domain):
            raise ValueError(f"states must lie in [0, {s.domain})")
        return x

    def amplitude(self, x: torch.Tensor) -> torch.Tensor:
        """``c(x)`` ``[B]`` for states ``x`` ``[B, D]`` (long)."""
        x = self._check_x(x)
        m, ws = self._weights()
        vals: list[torch.Tensor] = []
        for i, n in enumerate(self.structure.nodes):
            if n.kind == "input":
                vals.append(m[n.var][list(n.basis)][:, x[:, n.var]].T)              # [B, K]
            elif n.kind == "product":
                idx = self._prod_index[i]
                out = vals[n.children[0]][:, idx[0]]
                for c, ix in zip(n.children[1:], idx[1:]):
                    out = out * vals[c][:, ix]
                vals.append(out)
            else:
                h = torch.cat([vals[c] for c in n.children], dim=1)                # [B, K_in]
                vals.append(h @ ws[i].T)                                            # [B, K_out]
        return vals[-1][:, 0]

    def squared(self, x: torch.Tensor) -> torch.Tensor:
        """Unnormalised ``|c(x)|^2`` ``[B]``."""
        return self.amplitude(x).abs() ** 2

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``log p(x)`` ``[B]``: ``log|c|^2`` if unitary (``Z = 1``), else minus ``log Z`` from explicit squaring
        (structured circuits) or brute force (small non-structured ones)."""
        logc = torch.log(self.squared(x))
        if self.unitary:
            return logc
        if self.structure.is_structured():
            z = self.explicit_squaring()
        else:
            z = self.partition_function_bruteforce()
        return logc - torch.log(z)

    # -- brute force -------------------------------------------------------------------------
    def all_states(self) -> torch.Tensor:
        """Every assignment ``[V^D, D]`` in row-major order."""
        s = self.structure
        if s.domain ** s.num_vars > 2 ** 22:
            raise ValueError(f"brute force over {s.domain}^{s.num_vars} states is too large")
        grids = torch.meshgrid(*[torch.arange(s.domain)] * s.num_vars, indexing="ij")
        return torch.stack([g.reshape(-1) for g in grids], dim=1)

    def joint_table(self, chunk: int = 1 << 16) -> torch.Tensor:
        """``|c(x)|^2`` for every state, shaped ``[V] * D`` (not normalised)."""
        states = self.all_states()
        vals = torch.cat([self.squared(states[i:i + chunk]) for i in range(0, len(states), chunk)])
        return vals.reshape([self.structure.domain] * self.structure.num_vars)

    def partition_function_bruteforce(self) -> torch.Tensor:
        """``Z = sum_x |c(x)|^2`` by enumeration."""
        return self.joint_table().sum()

    # -- explicit squaring ----------------------------------------------------------------------
    def explicit_squaring(self) -> torch.Tensor:
        """``Z`` by squaring the circuit: the cross-Gram recursion ``G(a, b) = sum_x l_a(x) l_b(x)^H``.

        Sums expand linearly, products with the same partition factorise; cost is quadratic in the
        circuit size. Raises :class:`NotStructuredError` when two products of equal scope split it differently.
        """
        m, ws = self._weights()
        s = self.structure
        memo: dict[tuple[int, int], torch.Tensor] = {}

        def cross(a: int, b: int) -> torch.Tensor:
            key = (a, b)
            if key in memo:
                return memo[key]
            na, nb = s.nodes[a], s.nodes[b]
            if na.kind == "sum":
                w = ws[a]
                out, off = 0, 0
                for c in na.children:
                    k = s.nodes[c].size
                    out = out + w[:, off:off + k] @ cross(c, b)
                    off += k
            elif nb.kind == "sum":
                w = ws[b]
                out, off = 0, 0
                for c in nb.children:
                    k = s.nodes[c].size
                    out = out + cross(a, c) @ w[:, off:off + k].mH
                    off += k
            elif na.kind == "input" and nb.kind == "input":
                out = m[na.var][list(na.basis)] @ m[nb.var][list(nb.basis)].mH
            elif na.kind == "product" and nb.kind == "product":
                ca = {s.scopes[c]: (c, ix) for c, ix in zip(na.children, self._prod_index[a])}
                cb = {s.scopes[c]: (c, ix) for c, ix in zip(nb.children, self._prod_index[b])}
                if set(ca) != set(cb):
                    raise NotStructuredError("products over the same scope split it differently: the circuit is not "
                                             "structured-decomposable, so it cannot be squared layer-wise")
                out = 1
                for sc, (c1, i1) in ca.items():
                    c2, i2 = cb[sc]
                    out = out * cross(c1, c2)[i1[:, None], i2[None, :]]
            else:  # pragma: no cover - same scope rules this out
                raise NotStructuredError(f"cannot pair a {na.kind} with a {nb.kind} layer")
            memo[key] = out
            return out

        return cross(s.root, s.root)[0, 0].real

    # -- unitarity checks --------------------------------------------------------------------------
    def unitarity_error(self) -> dict[str, float]:
        """Max deviation of ``M_v M_v^H`` and every ``W W^H`` from the identity (U1, U3)."""
        m, ws = self._weights()
        eye = torch.eye(m.shape[-1], dtype=m.dtype)
        u1 = (m @ m.mH - eye).abs().max().item()
        u3 = max(((w @ w.mH) - torch.eye(w.shape[0], dtype=w.dtype)).abs().max().item() for w in ws.values())
        return {"U1": u1, "U3": u3}

    def conditions(self, atol: float = 1e-6) -> dict[str, bool]:
        """U1-U4 and structured decomposability of this circuit."""
        err = self.unitarity_error()
        return {"U1": err["U1"] < atol, **{k: v for k, v in self.structure.conditions().items()}, "U3": err["U3"] < atol}

    # -- marginals --------------------------------------------------------------------------------
    def marginal(self, x: torch.Tensor, observed: torch.Tensor | Sequence[bool]) -> torch.Tensor:
        """``p(x_Y) = sum_{x_Z} |c(x_Y, x_Z)|^2`` ``[B]`` by the Gram recursion (no squaring of the circuit).

        Args:
            x: ``[B, D]`` states (entries of unobserved variables are ignored).
            observed: ``[D]`` bool mask of the variables ``Y`` kept (the others, ``Z``, are summed out).

        Each layer returns the Gram matrix ``G = sum_{x_Z} l l^H``, lazily: the identity when its scope
        lies in ``Z`` (U1, U3), a vector ``r`` (``G = r r^H``) when its scope lies in ``Y``, else a
        ``[B, K, K]`` matrix. Products combine children index-wise (Kronecker / Hadamard), sums give
        ``sum_i W_i G_i W_i^H``: cross terms vanish under U4. Requires a unitary circuit satisfying U4.
        """
        if not self.unitary:
            raise ValueError("the marginalization recursion needs a unitary circuit (U1-U3); square an "
                             "unconstrained circuit explicitly instead")
        if not self.structure.conditions()["U4"]:
            raise ValueError("marginals without squaring need U4: the inputs of every sum layer must use disjoint "
                             "basis functions for every variable")
        x = self._check_x(x)
        obs = torch.as_tensor(observed, dtype=torch.bool)
        if obs.shape != (self.structure.num_vars,):
            raise ValueError(f"observed must be a [{self.structure.num_vars}] bool mask")
        m, ws = self._weights()
        b = x.shape[0]
        vals: list[tuple[str, torch.Tensor | None]] = []

        def as_matrix(state: tuple[str, torch.Tensor | None], k: int) -> torch.Tensor:
            kind, t = state
            if kind == "I":
                return torch.eye(k, dtype=m.dtype).expand(b, k, k)
            if kind == "vec":
                return t[:, :, None] * t[:, None, :].conj()
            return t

        for i, n in enumerate(self.structure.nodes):
            if n.kind == "input":
                if obs[n.var]:
                    vals.append(("vec", m[n.var][list(n.basis)][:, x[:, n.var]].T))
                else:
                    vals.append(("I", None))
            elif n.kind == "product":
                idx = self._prod_index[i]
                kinds = {vals[c][0] for c in n.children}
                if kinds == {"I"}:
                    vals.append(("I", None))
                elif kinds == {"vec"}:
                    out = vals[n.children[0]][1][:, idx[0]]
                    for c, ix in zip(n.children[1:], idx[1:]):
                        out = out * vals[c][1][:, ix]
                    vals.append(("vec", out))
                else:
                    out = 1
                    for c, ix in zip(n.children, idx):
                        g = as_matrix(vals[c], self.structure.nodes[c].size)
                        out = out * g[:, ix[:, None], ix[None, :]]
                    vals.append(("mat", out))
            else:
                w = ws[i]
                kinds = {vals[c][0] for c in n.children}
                if kinds == {"I"}:
                    vals.append(("I", None))        # sum_i W_i W_i^H = W W^H = I (U3)
                elif kinds == {"vec"}:
                    h = torch.cat([vals[c][1] for c in n.children], dim=1)
                    vals.append(("vec", h @ w.T))
                else:
                    out, off = 0, 0
                    for c in n.children:
                        k = self.structure.nodes[c].size
                        wi = w[:, off:off + k]
                        out = out + wi @ as_matrix(vals[c], k) @ wi.mH
                        off += k
                    vals.append(("mat", out))
        kind, t = vals[-1]
        if kind == "I":
            return torch.ones(b, dtype=m.real.dtype)
        if kind == "vec":
            return t[:, 0].abs() ** 2
        return t[:, 0, 0].real


def _randn(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator | None) -> torch.Tensor:
    """Standard complex (or real) normal entries."""
    if dtype.is_complex:
        real = torch.float64 if dtype == torch.complex128 else torch.float32
        re = torch.randn(shape, generator=generator, dtype=real)
        im = torch.randn(shape, generator=generator, dtype=real)
        return torch.complex(re, im) / np.sqrt(2.0)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be complex64/128 or float32/64, got {dtype}")
    return torch.randn(shape, generator=generator, dtype=dtype)


# ----------------------------------------------------------------------------------------------
# structures
# ----------------------------------------------------------------------------------------------
def tree_structure(num_vars: int, domain: int, width: int, order: Sequence[int] | None = None,
                   basis: Sequence[int] | None = None) -> CircuitStructure:
    """A binary-tree (tree tensor network-like) circuit: pairs of regions joined by Kronecker products
    followed by a single-input sum of width ``min(width, K_1 K_2)``; the root has width 1.

    ``order`` permutes the leaves (default ``0..D-1``); ``basis`` are the input functions used at every
    leaf (default all ``domain`` rows). Odd levels carry their last region up unchanged.
    """
    b = CircuitBuilder(num_vars, domain)
    _tree_into(b, list(range(num_vars)) if order is None else list(order),
               tuple(range(domain)) if basis is None else tuple(basis), width, root_size=1)
    return b.build()


def _tree_into(b: CircuitBuilder, order: list[int], basis: tuple[int, ...], width: int, root_size: int) -> int:
    if sorted(order) != sorted(set(order)) or len(order) < 1:
        raise ValueError("order must list distinct variables")
    level = [b.input(v, basis) for v in order]
    if len(level) == 1:
        return b.sum([level[0]], size=min(root_size, b.nodes[level[0]].size))
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level) - 1, 2):
            p = b.product(level[j], level[j + 1], kind="kronecker")
            k = min(root_size if len(level) == 2 else width, b.nodes[p].size)
            nxt.append(b.sum([p], size=k))
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def two_partition_structure(num_vars: int = 4, domain: int = 4, width: int = 4) -> CircuitStructure:
    """The digest's non-tensor-network example generalised: the root sums two binary trees over different
    variable partitionings (``{X0 X1}{X2 X3}..`` and ``{X0 X2}{X1 X3}..``) that use disjoint halves of every
    variable's basis (U4). Needs an even ``num_vars >= 4`` and ``domain >= 2``."""
    if num_vars < 4 or num_vars % 2 or domain < 2:
        raise ValueError("two_partition_structure needs an even num_vars >= 4 and domain >= 2")
    half = domain // 2
    b = CircuitBuilder(num_vars, domain)
    first = list(range(num_vars))
    second = _interleave(num_vars)
    t1 = _tree_into(b, first, tuple(range(half)), width, root_size=width)
    t2 = _tree_into(b, second, tuple(range(half, 2 * half)), width, root_size=width)
    b.sum([t1, t2], size=1)
    return b.build()


def _interleave(num_vars: int) -> list[int]:
    """Leaf order pairing X0 with X2, X1 with X3, X4 with X6, ... (different pairs from the identity order)."""
    order: list[int] = []
    for start in range(0, num_vars - num_vars % 4, 4):
        order += [start, start + 2, start + 1, start + 3]
    order += list(range(num_vars - num_vars % 4, num_vars))
    return order


def random_structure(num_vars: int, domain: int, rng: np.random.Generator, max_width: int = 4,
                     mix_prob: float = 0.5, max_mix: int = 2, hadamard_prob: float = 0.3,
                     condition: str = "U4") -> CircuitStructure:
    """A random circuit over a random region graph that may mix several variable partitionings.

    Each region over a scope ``S`` (``|S| >= 2``) is a sum over ``m`` (1 to ``max_mix``, chosen with
    ``mix_prob``) products, each splitting ``S`` at random into two sub-regions. Branches of a sum get
    disjoint subsets of the basis functions of every variable (``condition="U4"``) or of one variable only
    (``"U2"``, other variables share); mixing happens only where enough basis functions remain. Products
    are Hadamard (when the children's widths match, with probability ``hadamard_prob``) or Kronecker.
    Sum widths are random in ``[1, max_width]`` capped by their input width; the root has width 1.
    """
    if condition not in {"U2", "U4"}:
        raise ValueError("condition must be 'U2' or 'U4'")
    b = CircuitBuilder(num_vars, domain)

    def region(scope: list[int], basis: dict[int, list[int]], size: int) -> int:
        if len(scope) == 1:
            v = scope[0]
            inp = b.input(v, basis[v])
            if size < len(basis[v]) or rng.random() < 0.3:
                return b.sum([inp], size=min(size, len(basis[v])))
            return inp
        # how many branches can be mixed here
        if condition == "U4":
            cap = min(len(basis[v]) for v in scope)
        else:
            cap = max(len(basis[v]) for v in scope)
        m = 1
        if cap >= 2 and rng.random() < mix_prob:
            m = int(rng.integers(2, min(max_mix, cap) + 1))
        splits = _split_basis(scope, basis, m, condition, rng)
        prods = []
        for br in range(m):
            perm = list(rng.permutation(scope))
            cut = int(rng.integers(1, len(scope)))
            left, right = sorted(perm[:cut]), sorted(perm[cut:])
            k1 = int(rng.integers(1, max_width + 1))
            k2 = int(rng.integers(1, max_width + 1))
            a = region(left, splits[br], k1)
            c = region(right, splits[br], k2)
            same = b.nodes[a].size == b.nodes[c].size
            kind = "hadamard" if same and rng.random() < hadamard_prob else "kronecker"
            prods.append(b.product(a, c, kind=kind))
        k_in = sum(b.nodes[p].size for p in prods)
        return b.sum(prods, size=min(size, k_in))

    region(list(range(num_vars)), {v: list(range(domain)) for v in range(num_vars)}, 1)
    return b.build()


def _split_basis(scope: list[int], basis: dict[int, list[int]], m: int, condition: str,
                 rng: np.random.Generator) -> list[dict[int, list[int]]]:
    """``m`` basis assignments for the branches of a sum (disjoint on all / on one variable)."""
    if m == 1:
        return [basis]
    out: list[dict[int, list[int]]] = [dict(basis) for _ in range(m)]
    if condition == "U4":
        split_vars = scope
    else:
        split_vars = [int(rng.choice([v for v in scope if len(basis[v]) >= m]))]
    for v in split_vars:
        perm = list(rng.permutation(basis[v]))
        cuts = sorted(rng.choice(np.arange(1, len(perm)), size=m - 1, replace=False).tolist())
        parts = np.split(np.array(perm), cuts)
        for br in range(m):
            out[br][v] = sorted(int(p) for p in parts[br])
    return out
