"""Baselines of the City-Networks paper: MLP, GCN, GraphSAGE and GAT, and their full-batch training.

Two architectures (``architecture=``):

* ``"pyg"`` (**official**, the default): the official run script's ``benchmark/configs.py::parse_method``
  builds PyTorch Geometric's stock models ``torch_geometric.nn.GCN`` / ``GraphSAGE`` / ``GAT`` (one head) /
  ``MLP`` with ``num_layers = L``, ReLU and dropout::

      x -> [conv_l -> ReLU -> dropout] x (L - 1) -> conv_L          (conv_1: F -> h, conv_L: h -> C)

  ``conv`` is ``GCNConv`` / ``SAGEConv`` (mean) / ``GATConv`` (one head; PyG also passes the dropout to its
  attention) and for the MLP ``Linear`` with PyG ``MLP``'s default batch norm before the ReLU. No input or
  output ``Linear`` projection: an ``L``-layer GNN sees exactly ``L`` hops.
* ``"projected"`` (**ours**, the earlier default of this package): input and output ``Linear`` projections
  around ``L`` hidden layers, SiLU::

      x -> Linear(F, h) -> act -> dropout -> [conv_l(h, h) -> act -> dropout] x L -> Linear(h, C)

  Officially only ``ChebNet`` (``benchmark/gnn.py``) and SGFormer are built this way; the paper's GCN /
  GraphSAGE / GAT / MLP are not. Kept as an option (``TrainConfig(architecture="projected")``).

Training is full-batch (the official runs use a NeighborLoader with all neighbours and one 200k-node batch,
i.e. the full graph), AdamW with cross-entropy on the training nodes, validation accuracy every epoch,
early stopping after ``patience`` epochs without improvement, and the test accuracy at the best validation
epoch (the code's ``test_at_best_val``). Features are standardised (z-score over all nodes, a transductive
choice; the official files keep raw coordinates and lengths and train 30,000 epochs instead).
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from interp.progress import progress
from interp.results import Result

from interp.training import limit_threads, set_seed
from .data import CityGraph

__all__ = ["MODEL_KINDS", "ARCHITECTURES", "CityGNN", "TrainConfig", "TrainRun", "standardize", "train_model",
           "DepthSweepResult", "depth_sweep"]

MODEL_KINDS = ("mlp", "gcn", "sage", "gat")
#: ``"pyg"``: the official PyG stock models (default); ``"projected"``: ours, Linear + SiLU projections
ARCHITECTURES = ("pyg", "projected")
ACTIVATIONS = {"silu": nn.SiLU, "identity": nn.Identity, "relu": nn.ReLU}
#: the activation each architecture uses when none is given
DEFAULT_ACTIVATION = {"pyg": "relu", "projected": "silu"}


class CityGNN(nn.Module):
    """One baseline of the paper: ``kind`` at depth ``num_layers`` in one of two :data:`ARCHITECTURES`.

    Args:
        kind: ``"mlp"``, ``"gcn"``, ``"sage"`` or ``"gat"``.
        in_dim, hidden, out_dim: feature, hidden and class dimensions.
        num_layers: ``L >= 1``. ``"pyg"``: ``L`` layers in all (the first maps ``in_dim -> hidden``, the last
            ``hidden -> out_dim``); ``"projected"``: ``L`` hidden ``hidden -> hidden`` layers between the two
            projections. Either way an ``L``-layer GNN sees ``L`` hops.
        dropout: after every activation (official run script: 0.2).
        activation: ``"relu"``, ``"silu"`` or ``"identity"``; ``None``: ReLU for ``"pyg"`` (official, PyG's
            default), SiLU for ``"projected"`` (ours, the official ``ChebNet``'s).
        bias: biases in every layer (``False`` with ``"identity"`` gives ``H = Â^L X W``).
        architecture: ``"pyg"`` (official, default): PyG's ``GCN`` / ``GraphSAGE`` / ``GAT`` / ``MLP`` as the
            official run script builds them; ``"projected"`` (ours): input and output ``Linear`` projections.
    Forward: ``x`` ``[N, in_dim]``, ``edge_index`` ``[2, E]`` -> logits ``[N, out_dim]``.

    ``net`` is the PyG model (``"pyg"``; ``input_proj`` / ``output_proj`` are then ``None``), and ``layers`` the
    ``L`` (``"projected"``) or all (``"pyg"``) message-passing / linear layers in order.
    """

    def __init__(self, kind: str, in_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float = 0.2,
                 activation: str | None = None, bias: bool = True, architecture: str = "pyg"):
        super().__init__()
        from torch_geometric.nn import GAT, GCN, MLP, GATConv, GCNConv, GraphSAGE, SAGEConv

        if kind not in MODEL_KINDS:
            raise ValueError(f"kind must be one of {MODEL_KINDS}, got {kind!r}")
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
        if num_layers < 1 or hidden < 1 or in_dim < 1 or out_dim < 1:
            raise ValueError("num_layers, hidden, in_dim and out_dim must be >= 1")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        activation = DEFAULT_ACTIVATION[architecture] if activation is None else activation
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        self.kind, self.num_layers, self.dropout = kind, num_layers, dropout
        self.architecture, self.activation_name = architecture, activation
        if architecture == "pyg":
            model = {"mlp": MLP, "gcn": GCN, "sage": GraphSAGE, "gat": GAT}[kind]
            self.net = model(in_channels=in_dim, hidden_channels=hidden, out_channels=out_dim, num_layers=num_layers,
                             dropout=dropout, act=None if activation == "identity" else activation, bias=bias)
            self.input_proj = self.output_proj = None
            return
        self.input_proj = nn.Linear(in_dim, hidden, bias=bias)
        make = {"mlp": lambda: nn.Linear(hidden, hidden, bias=bias),
                "gcn": lambda: GCNConv(hidden, hidden, bias=bias),
                "sage": lambda: SAGEConv(hidden, hidden, bias=bias),
                "gat": lambda: GATConv(hidden, hidden, heads=1, bias=bias)}[kind]
        self.convs = nn.ModuleList([make() for _ in range(num_layers)])
        self.output_proj = nn.Linear(hidden, out_dim, bias=bias)
        self.activation = ACTIVATIONS[activation]()

    @property
    def layers(self) -> nn.ModuleList:
        """The message-passing (or, for the MLP, linear) layers in order: ``L`` of them in both architectures."""
        if self.architecture == "pyg":
            return self.net.lins if self.kind == "mlp" else self.net.convs
        return self.convs

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        if self.architecture == "pyg":
            return self.net(x) if self.kind == "mlp" else self.net(x, edge_index)
        h = F.dropout(self.activation(self.input_proj(x)), self.dropout, self.training)
        for conv in self.convs:
            h = conv(h) if self.kind == "mlp" else conv(h, edge_index)
            h = F.dropout(self.activation(h), self.dropout, self.training)
        return self.output_proj(h)


@dataclass
class TrainConfig:
    """Full-batch training (defaults: digest's CPU recipe lr 5e-3 / 500 epochs; the code's hidden 64,
    dropout 0.2, weight decay 1e-5, AdamW). Validation every ``eval_every`` epochs; stop after ``patience``
    epochs without a better validation accuracy.

    ``architecture``: ``"pyg"`` (official, default: PyG's stock ``GCN`` / ``GraphSAGE`` / ``GAT`` / ``MLP``, ReLU,
    no projections) or ``"projected"`` (ours: ``Linear`` + SiLU input and output projections); ``activation``:
    ``None`` for the architecture's own (ReLU / SiLU), else ``"relu"``, ``"silu"`` or ``"identity"``. See
    :class:`CityGNN`."""

    hidden: int = 64
    dropout: float = 0.2
    lr: float = 5e-3
    weight_decay: float = 1e-5
    max_epochs: int = 500
    patience: int = 100
    eval_every: int = 1
    standardize: bool = True
    num_threads: int | None = 1
    architecture: str = "pyg"
    activation: str | None = None

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be None or one of {tuple(ACTIVATIONS)}, got {self.activation!r}")
        if self.hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {self.hidden}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(f"lr must be > 0 and weight_decay >= 0, got {self.lr}, {self.weight_decay}")
        if self.max_epochs < 1 or self.patience < 1 or self.eval_every < 1:
            raise ValueError(f"max_epochs, patience and eval_every must be >= 1, got {self.max_epochs}, "
                             f"{self.patience}, {self.eval_every}")


def standardize(x: torch.Tensor) -> torch.Tensor:
    """Column z-score over all nodes (constant columns left at 0)."""
    std = x.std(0, unbiased=False)
    return (x - x.mean(0)) / torch.where(std > 0, std, torch.ones_like(std))


@dataclass
class TrainRun:
    """One trained model: accuracies at the best validation epoch and the model itself (not saved)."""

    kind: str
    num_layers: int
    seed: int
    train_acc: float
    val_acc: float
    test_acc: float
    best_epoch: int
    epochs: int
    seconds: float
    model: CityGNN | None = field(default=None, repr=False)


def train_model(graph: CityGraph, kind: str, num_layers: int, seed: int = 0,
                config: TrainConfig | None = None) -> TrainRun:
    """Train one baseline full-batch with early stopping on validation accuracy; return the best-val model."""
    cfg = config or TrainConfig()
    with limit_threads(cfg.num_threads):
        set_seed(seed)
        x = standardize(graph.x) if cfg.standardize else graph.x
        ei, y = graph.edge_index, graph.y
        model = CityGNN(kind, x.shape[1], cfg.hidden, graph.num_classes, num_layers, cfg.dropout,
                        activation=cfg.activation, architecture=cfg.architecture)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        tr, va, te = graph.train_idx, graph.val_idx, graph.test_idx
        best = (-1.0, 0, None, 0.0, 0.0)   # val, epoch, state, train, test
        start, epoch = time.perf_counter(), 0
        for epoch in range(1, cfg.max_epochs + 1):
            model.train()
            opt.zero_grad()
            loss = F.cross_entropy(model(x, ei)[tr], y[tr])
            loss.backward()
            opt.step()
            if epoch % cfg.eval_every and epoch != cfg.max_epochs:
                continue
            model.eval()
            with torch.no_grad():
                pred = model(x, ei).argmax(-1)
            val = (pred[va] == y[va]).float().mean().item()
            if val > best[0]:
                best = (val, epoch, copy.deepcopy(model.state_dict()),
                        (pred[tr] == y[tr]).float().mean().item(), (pred[te] == y[te]).float().mean().item())
            elif epoch - best[1] >= cfg.patience:
                break
        model.load_state_dict(best[2])
        model.eval()
    return TrainRun(kind, num_layers, seed, best[3], best[0], best[4], best[1], epoch,
                    time.perf_counter() - start, model)


@dataclass
class DepthSweepResult(Result):
    """Accuracy of each baseline at each depth and seed on one graph.

    ``rows``: column lists (graph, kind, num_layers, seed, train_acc, val_acc, test_acc, best_epoch, epochs,
    seconds); ``graph``: :meth:`CityGraph.stats`; ``config``: the training config.
    """

    kind = "city_networks_depth_sweep"
    graph: dict
    rows: dict
    config: dict

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    def summary(self):
        """Mean and std of the test accuracy (%) per model and depth, over seeds."""
        df = self.to_frame()
        g = df.groupby(["kind", "num_layers"])["test_acc"]
        out = (g.agg(["mean", "std", "count"]) * [100, 100, 1]).reset_index()
        return out.rename(columns={"mean": "test_acc_mean", "std": "test_acc_std", "count": "seeds"})

    def accuracy(self, kind: str, num_layers: int) -> float:
        """Mean test accuracy (fraction) of ``kind`` at depth ``num_layers``."""
        df = self.to_frame()
        sel = df[(df.kind == kind) & (df.num_layers == num_layers)]
        if sel.empty:
            raise KeyError(f"no runs of {kind!r} at depth {num_layers}")
        return float(sel.test_acc.mean())

    def figure(self):
        import plotly.graph_objects as go

        s = self.summary()
        fig = go.Figure()
        for kind in s.kind.unique():
            part = s[s.kind == kind]
            fig.add_trace(go.Scatter(x=part.num_layers, y=part.test_acc_mean, name=kind, mode="lines+markers",
                                     error_y=dict(type="data", array=part.test_acc_std.fillna(0))))
        fig.add_hline(y=100 / self.graph["classes"], line_dash="dot", annotation_text="chance")
        fig.update_layout(title=f"{self.graph['name']}: test accuracy vs depth", xaxis_title="layers L",
                          yaxis_title="test accuracy (%)", xaxis_type="log")
        return fig


def depth_sweep(graph: CityGraph, kinds=MODEL_KINDS, depths=(2, 4, 8, 16), seeds=(0, 1, 2),
                config: TrainConfig | None = None, keep_models: bool = False) -> tuple[DepthSweepResult, dict]:
    """Train every ``kind`` at every depth and seed. Returns the result and (if ``keep_models``) a dict
    ``(kind, depth, seed) -> CityGNN``."""
    cfg = config or TrainConfig()
    for kind in kinds:
        if kind not in MODEL_KINDS:
            raise ValueError(f"kind must be one of {MODEL_KINDS}, got {kind!r}")
    cols = ("graph", "kind", "num_layers", "seed", "train_acc", "val_acc", "test_acc", "best_epoch", "epochs",
            "seconds")
    rows: dict[str, list] = {c: [] for c in cols}
    models = {}
    jobs = [(k, d, s) for k in kinds for d in depths for s in seeds]
    for kind, depth, seed in progress(jobs, desc=f"{graph.name} depth sweep", total=len(jobs)):
        run = train_model(graph, kind, depth, seed, cfg)
        for c in cols:
            rows[c].append(graph.name if c == "graph" else getattr(run, c))
        if keep_models:
            models[(kind, depth, seed)] = run.model
    return DepthSweepResult(graph=graph.stats(), rows=rows, config=asdict(cfg)), models
