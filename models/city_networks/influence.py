"""The paper's long-range measurement: Jacobian influence per hop and the influence-weighted receptive field.

For a trained model ``y = f(X, A)`` and a seed node ``v`` (official ``influence/influence.py``, upstreamed as
``torch_geometric.utils.total_influence``)::

    I(v, u) = sum_i sum_j |d y_{v,i} / d x_{u,j}|             (per-pair influence)
    T_h(v)  = sum_{u : hop(v, u) = h} I(v, u),  h = 0..H       (exact BFS shells, a sum, not a mean)
    curve_h = mean_v T_h(v) / mean_v T_0(v)                    (the reported normalised curve)
    R       = mean_v [ sum_h h T_h(v) / sum_h T_h(v) ]         (on the unnormalised T)

The Jacobian is taken on the subgraph induced by the ``H``-hop neighbourhood of ``v`` (the model runs on that
subgraph, as in the code); the official radius is the model's depth, ``H = L`` (16 hops for the paper's
16-layer models). Here many seeds are measured at once: their induced subgraphs are glued into one
block-diagonal graph, one forward pass runs on it and one backward pass per output class gives the gradients
of every root's class-``i`` output (blocks never exchange messages, so each root's gradient lives in its own
block). That is exact for any model whose output at a node depends only on its connected component
(GCN/SAGE/GAT/MLP without batch norm), and equals the per-seed ``torch.autograd.functional.jacobian`` loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from interp.progress import progress
from interp.results import Result

__all__ = ["SubgraphBatch", "hop_distances", "induced_subgraphs", "pair_influence", "total_influence",
           "influence_curve", "receptive_field", "InfluenceResult", "measure_influence", "gcn_norm_dense",
           "linear_gcn_influence"]


def _csr(edge_index: torch.Tensor, num_nodes: int):
    import scipy.sparse as sp

    ei = edge_index.cpu().numpy()
    A = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(num_nodes, num_nodes))
    A.sum_duplicates()
    A.sort_indices()
    return A


def hop_distances(edge_index: torch.Tensor, num_nodes: int, seeds: torch.Tensor, max_hops: int) -> torch.Tensor:
    """Exact BFS hop counts ``[S, N]`` (int64) from every seed, ``-1`` beyond ``max_hops`` or unreachable.

    Hops follow ``edge_index`` from target to source (PyG's ``k_hop_subgraph`` convention for messages
    flowing into the seed); for undirected graphs the direction does not matter.
    """
    from scipy.sparse.csgraph import dijkstra

    A = _csr(edge_index.flip(0), num_nodes)
    d = dijkstra(A, directed=True, indices=seeds.cpu().numpy(), unweighted=True, limit=max_hops + 0.5)
    d = np.atleast_2d(d)
    return torch.from_numpy(np.where(np.isfinite(d), d, -1).astype(np.int64))


@dataclass
class SubgraphBatch:
    """Disjoint union of the induced ``max_hops`` subgraphs of ``B`` seeds.

    ``nodes`` ``[P]`` global ids, ``block`` ``[P]`` seed index, ``hop`` ``[P]`` hop distance to the block's seed,
    ``edge_index`` ``[2, E']`` in union positions, ``roots`` ``[B]`` union position of each seed.
    """

    nodes: torch.Tensor
    block: torch.Tensor
    hop: torch.Tensor
    edge_index: torch.Tensor
    roots: torch.Tensor


def induced_subgraphs(edge_index: torch.Tensor, num_nodes: int, seeds: torch.Tensor, max_hops: int) -> SubgraphBatch:
    """The induced ``max_hops``-hop subgraphs of ``seeds`` as one block-diagonal graph (vectorised)."""
    hops = hop_distances(edge_index, num_nodes, seeds, max_hops)          # [B, N]
    inside = hops >= 0
    block, nodes = inside.nonzero(as_tuple=True)                             # grouped by block, nodes ascending
    lookup = torch.full(inside.shape, -1, dtype=torch.long)
    lookup[block, nodes] = torch.arange(block.numel())
    src, dst = edge_index
    # an edge belongs to block b iff both endpoints are inside b: walk the edges out of every union node
    order = torch.argsort(src, stable=True)
    src_s, dst_s = src[order], dst[order]
    ptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(torch.bincount(src_s, minlength=num_nodes), 0)
    deg = ptr[nodes + 1] - ptr[nodes]
    rows = torch.repeat_interleave(torch.arange(block.numel()), deg)
    pos = torch.arange(int(deg.sum())) - torch.repeat_interleave(torch.cumsum(deg, 0) - deg, deg) \
        + torch.repeat_interleave(ptr[nodes], deg)
    cols = lookup[torch.repeat_interleave(block, deg), dst_s[pos]]
    keep = cols >= 0
    sub_ei = torch.stack([rows[keep], cols[keep]])
    roots = lookup[torch.arange(seeds.numel()), seeds]
    return SubgraphBatch(nodes=nodes, block=block, hop=hops[block, nodes], edge_index=sub_ei, roots=roots)


def pair_influence(model: torch.nn.Module, x: torch.Tensor, batch: SubgraphBatch) -> torch.Tensor:
    """``I(root_b, u) = sum_i sum_j |d y_{root_b, i} / d x_{u, j}|`` for every union node ``u`` ``[P]``.

    ``model(x, edge_index) -> [n, C]`` is run once on the union in eval mode; one backward pass per class.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            xs = x[batch.nodes].detach().clone().requires_grad_(True)
            out = model(xs, batch.edge_index)[batch.roots]                # [B, C]
            infl = torch.zeros(xs.shape[0], dtype=xs.dtype)
            for i in range(out.shape[1]):
                (g,) = torch.autograd.grad(out[:, i].sum(), xs, retain_graph=i + 1 < out.shape[1])
                infl += g.abs().sum(1)
    finally:
        model.train(was_training)
    return infl.detach()


def total_influence(model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor, seeds: torch.Tensor,
                    max_hops: int, batch_size: int = 32, desc: str | None = "influence") -> torch.Tensor:
    """Per-hop total influence ``T`` ``[S, max_hops + 1]``: ``T[s, h] = sum_{hop(seed_s, u) = h} I(seed_s, u)``."""
    if max_hops < 0:
        raise ValueError(f"max_hops must be >= 0, got {max_hops}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    seeds = torch.as_tensor(seeds, dtype=torch.long).reshape(-1)
    n = x.shape[0]
    if seeds.numel() and (seeds.min() < 0 or seeds.max() >= n):
        raise ValueError(f"seeds must index nodes 0..{n - 1}")
    T = torch.zeros(seeds.numel(), max_hops + 1, dtype=torch.float64)
    chunks = list(torch.split(torch.arange(seeds.numel()), batch_size))
    for idx in (progress(chunks, desc=desc, total=len(chunks)) if desc else chunks):
        batch = induced_subgraphs(edge_index, n, seeds[idx], max_hops)
        infl = pair_influence(model, x, batch).double()
        flat = T.new_zeros(idx.numel() * (max_hops + 1))
        flat.index_add_(0, batch.block * (max_hops + 1) + batch.hop, infl)
        T[idx] = flat.view(idx.numel(), max_hops + 1)
    return T


def influence_curve(T: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """``mean_v T_h(v)`` ``[H + 1]``, divided by its hop-0 value when ``normalize``."""
    mean = T.mean(0)
    return mean / mean[0] if normalize else mean


def receptive_field(T: torch.Tensor) -> float:
    """``R = mean_v sum_h h T_h(v) / sum_h T_h(v)`` (influence-weighted mean hop)."""
    hops = torch.arange(T.shape[1], dtype=T.dtype)
    return float(((T / T.sum(1, keepdim=True)) @ hops).mean())


@dataclass
class InfluenceResult(Result):
    """Influence measurement of one model on one graph.

    ``T`` ``[S, H+1]`` per-seed per-hop totals, ``seeds`` ``[S]``, ``curve`` ``[H+1]`` normalised mean,
    ``R`` the receptive field; ``label`` names the model/graph; ``meta`` free-form settings.
    """

    kind = "city_networks_influence"
    label: str
    T: torch.Tensor
    seeds: torch.Tensor
    curve: torch.Tensor
    R: float
    meta: dict = field(default_factory=dict)

    def to_frame(self):
        import pandas as pd

        mean = self.T.mean(0)
        return pd.DataFrame({"label": self.label, "hop": np.arange(self.T.shape[1]),
                             "mean_total_influence": mean.numpy(), "normalized": self.curve.numpy()})

    def figure(self):
        return influence_figure([self])


def influence_figure(results: list[InfluenceResult]):
    """Normalised ``T̄_h / T̄_0`` per hop (log scale) for several measurements, R in the legend."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in results:
        fig.add_trace(go.Scatter(x=list(range(r.curve.numel())), y=r.curve.clamp_min(1e-12).tolist(),
                                 mode="lines+markers", name=f"{r.label} (R={r.R:.2f})"))
    fig.update_layout(title="total influence per hop (normalised by hop 0)", xaxis_title="hop h",
                      yaxis_title="T̄_h / T̄_0", yaxis_type="log")
    return fig


def measure_influence(model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor, max_hops: int = 16,
                      num_samples: int | None = 10000, seed: int = 0, batch_size: int = 32,
                      label: str = "") -> InfluenceResult:
    """Sample ``num_samples`` seed nodes (all if ``None`` or larger than ``N``) and measure the influence
    (paper defaults: ``max_hops = 16``, 10,000 seeds). Seeds are drawn with ``torch.randperm`` under
    ``seed``; ``x`` must be the features the model was trained on.

    The official measurement (``influence_main.py``) uses a radius equal to the model's depth: ``max_hops = 16``
    for the 16-layer models; pass ``max_hops = L`` for an ``L``-layer model to match it. (A radius of ``L + 1``
    would give the exact full-graph Jacobian, since nodes at hop ``L`` then keep all their neighbours, and a
    slightly different ``R``; it is not the paper's.)"""
    n = x.shape[0]
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randperm(n, generator=g)[: n if num_samples is None else min(num_samples, n)]
    T = total_influence(model, x, edge_index, seeds, max_hops, batch_size)
    return InfluenceResult(label=label, T=T, seeds=seeds, curve=influence_curve(T), R=receptive_field(T),
                           meta={"max_hops": max_hops, "num_samples": int(seeds.numel()), "seed": seed})


# ----------------------------------------------------------------------------------------------
# closed form for a linear GCN
# ----------------------------------------------------------------------------------------------
def gcn_norm_dense(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``Â = D^{-1/2} (A + I) D^{-1/2}`` ``[N, N]`` float64 (GCNConv's normalisation, messages src -> dst)."""
    A = torch.zeros(num_nodes, num_nodes, dtype=torch.float64)
    A[edge_index[1], edge_index[0]] = 1.0
    A = A + torch.eye(num_nodes, dtype=torch.float64)
    d = A.sum(1).rsqrt()
    return d[:, None] * A * d[None, :]


def linear_gcn_influence(model: torch.nn.Module, edge_index: torch.Tensor, num_nodes: int, seed: int,
                         max_hops: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form ``I(v, u) = |(Â^L)_{vu}| · sum|W|`` for a bias-free linear :class:`CityGNN` of kind ``"gcn"``.

    ``Â`` is built on the induced ``max_hops`` subgraph of ``seed`` (where the measurement runs the model),
    ``L`` is the number of ``GCNConv`` layers and ``W`` the product of every weight matrix in order
    (``W_1 ... W_L`` for the official ``"pyg"`` architecture, ``W_in W_1 ... W_L W_out`` for ``"projected"``).
    Returns (global node ids ``[P]``, influences ``[P]``).
    """
    if getattr(model, "kind", None) != "gcn" or getattr(model, "activation_name", None) != "identity":
        raise ValueError("linear_gcn_influence needs a CityGNN of kind 'gcn' with activation='identity'")
    mats = [model.input_proj] if model.input_proj is not None else []
    mats += [conv.lin for conv in model.layers]
    mats += [model.output_proj] if model.output_proj is not None else []
    if any(getattr(m, "bias", None) is not None for m in [*mats, *model.layers]):
        raise ValueError("linear_gcn_influence needs a bias-free model (bias=False)")
    batch = induced_subgraphs(edge_index, num_nodes, torch.tensor([seed]), max_hops)
    A_hat = gcn_norm_dense(batch.edge_index, batch.nodes.numel())
    P = torch.linalg.matrix_power(A_hat, len(model.layers))
    W = mats[0].weight.double().T
    for m in mats[1:]:
        W = W @ m.weight.double().T
    return batch.nodes, P[batch.roots[0]].abs() * W.abs().sum()
