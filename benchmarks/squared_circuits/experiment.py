"""Validation of the unitary squared circuits (models digest, section 1): exactness on random small circuits and
learning on quantised digits (``interp reproduce squared_circuits``). The method is
:mod:`interp.models.squared_circuits`."""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from interp.progress import progress
from interp.results import Result

from interp.models.common import digits_split, minibatches
from interp.training import limit_threads, set_seed, warmup_cosine_fraction
from interp.models.squared_circuits.circuit import (Circuit, NotStructuredError, random_structure, tree_structure,
                                                    two_partition_structure)
from interp.models.squared_circuits.tree import TreeMixtureCircuit, morton_order

__all__ = [
    "SquaredCircuitsConfig",
    "ExactnessResult",
    "LearningResult",
    "SquaredCircuitsResult",
    "quantize_digits",
    "marginal_errors",
    "exactness_experiment",
    "train_tree",
    "step_time_sweep",
    "learning_experiment",
    "experiment",
]


@dataclass
class SquaredCircuitsConfig:
    """Defaults of the digest's CPU-scale validation (section 1).

    Exactness: ``num_random_circuits`` random U4 circuits (plus a U2-only one for ``Z``, a tree and the
    two-partition non-tensor-network example) over ``min_vars..max_vars`` variables with domain
    ``<= max_domain``; all ``2^D`` marginalisation masks when ``D <= all_masks_up_to``, else
    ``masks_per_circuit`` random ones; every assignment of the kept variables is checked.

    Learning: sklearn digits quantised to ``levels`` grey levels (``V``), a binary tree over the
    64 pixels in Z-order with width ``width``; model A is unitary, model B the same architecture with
    unconstrained weights, started from A's initial function and normalised by explicit squaring; the
    optional ``mixture`` model C sums two trees with different pixel orders (not a tensor network).
    ``lr``/``epochs``: Adam with linear warm-up and cosine decay, chosen on this CPU budget (the paper's
    LandingPC settings are unknown). ``val_fraction`` of the training images is held out; the reported test
    bits/dim is the one at the epoch with the best validation bits/dim (the same rule for every model).
    ``timing_widths``: widths at which A and B are additionally timed for ``timing_steps`` steps each.
    """

    # exactness
    num_random_circuits: int = 20
    min_vars: int = 4
    max_vars: int = 8
    max_domain: int = 4
    max_width: int = 4
    all_masks_up_to: int = 6
    masks_per_circuit: int = 24
    exact_tol: float = 1e-6
    # learning
    levels: int = 4
    width: int = 4
    epochs: int = 40
    batch_size: int = 64
    lr: float = 0.03
    warmup_frac: float = 0.05
    val_fraction: float = 0.15
    dtype: str = "complex128"
    z_check_every: int = 10
    mixture: bool = True
    nll_rel_tol: float = 0.03
    timing_widths: tuple[int, ...] = (4, 8, 16, 32)
    timing_steps: int = 8
    z_tol: float = 1e-5
    seed: int = 0
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        if not 2 <= self.min_vars <= self.max_vars <= 10:
            raise ValueError("need 2 <= min_vars <= max_vars <= 10 for brute force")
        if not 2 <= self.max_domain <= 4:
            raise ValueError("max_domain must lie in [2, 4]")
        if self.levels < 2:
            raise ValueError("levels must be >= 2")
        if self.dtype not in {"complex64", "complex128", "float32", "float64"}:
            raise ValueError("dtype must be complex64, complex128, float32 or float64")


# ----------------------------------------------------------------------------------------------
# exactness
# ----------------------------------------------------------------------------------------------
def marginal_errors(circuit: Circuit, masks: list[tuple[bool, ...]] | None = None) -> dict[str, float]:
    """Brute-force ``Z`` and the max |recursion - brute force| over the given marginalisation masks.

    For each mask, every assignment of the kept variables is evaluated by :meth:`Circuit.marginal` and
    compared with the enumerated joint table summed over the other variables.
    """
    s = circuit.structure
    d, v = s.num_vars, s.domain
    with torch.no_grad():
        table = circuit.joint_table()
        z = table.sum().item()
        masks = list(itertools.product([False, True], repeat=d)) if masks is None else masks
        worst = 0.0
        for mask in masks:
            keep = [i for i in range(d) if mask[i]]
            drop = [i for i in range(d) if not mask[i]]
            ref = table.sum(dim=drop) if drop else table
            xs = torch.zeros(max(v ** len(keep), 1), d, dtype=torch.long)
            if keep:
                grids = torch.meshgrid(*[torch.arange(v)] * len(keep), indexing="ij")
                for j, var in enumerate(keep):
                    xs[:, var] = grids[j].reshape(-1)
            got = circuit.marginal(xs, torch.tensor(mask))
            worst = max(worst, (got - ref.reshape(-1)).abs().max().item())
    return {"Z_bruteforce": z, "max_marginal_error": worst, "num_masks": len(masks)}


@dataclass
class ExactnessResult(Result):
    """Per random circuit: structure facts, brute-force ``Z``, explicit-squaring ``Z`` and marginal errors."""

    kind = "squared_circuits_exactness"
    rows: dict
    tol: float

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    @property
    def max_z_error(self) -> float:
        return float(max(abs(z - 1) for z in self.rows["Z_bruteforce"]))

    @property
    def max_marginal_error(self) -> float:
        vals = [e for e in self.rows["max_marginal_error"] if not math.isnan(e)]
        return float(max(vals)) if vals else float("nan")

    @property
    def passed(self) -> bool:
        return self.max_z_error < self.tol and self.max_marginal_error < self.tol

    def figure(self):
        import plotly.graph_objects as go

        df = self.to_frame()
        fig = go.Figure()
        fig.add_trace(go.Bar(x=df["name"], y=(df["Z_bruteforce"] - 1).abs() + 1e-18, name="|Z - 1| (brute force)"))
        fig.add_trace(go.Bar(x=df["name"], y=df["max_marginal_error"] + 1e-18, name="max |marginal - brute force|"))
        fig.add_hline(y=self.tol, line_dash="dash", annotation_text="tolerance")
        fig.update_layout(barmode="group", yaxis_type="log", title="Unitary circuits: exactness", yaxis_title="error")
        return fig


def exactness_experiment(config: SquaredCircuitsConfig | None = None) -> ExactnessResult:
    """Random unitary circuits: brute-force ``Z = 1`` and every marginal equal to brute force."""
    cfg = config or SquaredCircuitsConfig()
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    specs: list[tuple[str, object]] = []
    for i in range(cfg.num_random_circuits):
        d = int(rng.integers(cfg.min_vars, cfg.max_vars + 1))
        v = int(rng.integers(2, cfg.max_domain + 1))
        specs.append((f"random{i}_D{d}_V{v}", random_structure(d, v, rng, max_width=cfg.max_width, condition="U4")))
    d = cfg.max_vars
    specs.append((f"random_U2only_D{cfg.min_vars}", random_structure(cfg.min_vars, cfg.max_domain, rng, mix_prob=1.0,
                                                                   max_width=cfg.max_width, condition="U2")))
    specs.append((f"tree_D{d}_V{cfg.max_domain}", tree_structure(d, cfg.max_domain, cfg.max_width)))
    specs.append((f"two_partition_D{d - d % 2}_V{cfg.max_domain}",
                  two_partition_structure(d - d % 2, cfg.max_domain, cfg.max_width)))
    rows: dict[str, list] = {k: [] for k in ("name", "num_vars", "domain", "num_layers", "structured", "U4",
                                              "Z_bruteforce", "Z_explicit_squaring", "max_marginal_error", "num_masks")}
    with limit_threads(cfg.num_threads):
        for name, s in progress(specs, desc="exactness"):
            circuit = Circuit(s, unitary=True, dtype=torch.complex128, generator=gen)
            conds = s.conditions()
            dd = s.num_vars
            if not conds["U4"]:
                masks: list[tuple[bool, ...]] = []
            elif dd <= cfg.all_masks_up_to:
                masks = list(itertools.product([False, True], repeat=dd))
            else:
                masks = [tuple(bool(b) for b in rng.integers(0, 2, dd)) for _ in range(cfg.masks_per_circuit)]
                masks += [(False,) * dd, (True,) * dd]
            errs = marginal_errors(circuit, masks) if masks else {
                "Z_bruteforce": circuit.partition_function_bruteforce().item(), "max_marginal_error": float("nan"),
                "num_masks": 0}
            try:
                with torch.no_grad():
                    ze = circuit.explicit_squaring().item()
            except NotStructuredError:
                ze = float("nan")
            for k, val in (("name", name), ("num_vars", dd), ("domain", s.domain), ("num_layers", len(s.nodes)),
                           ("structured", conds["structured"]), ("U4", conds["U4"]), ("Z_bruteforce", errs["Z_bruteforce"]),
                           ("Z_explicit_squaring", ze), ("max_marginal_error", errs["max_marginal_error"]),
                           ("num_masks", errs["num_masks"])):
                rows[k].append(val)
    return ExactnessResult(rows=rows, tol=cfg.exact_tol)


# ----------------------------------------------------------------------------------------------
# learning on digits
# ----------------------------------------------------------------------------------------------
def quantize_digits(levels: int = 4, seed: int = 0, test_size: float = 0.25) -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn digits (8x8, grey values 0..16) quantised to ``levels`` equal-width bins: ``[n, 64]`` long train/test."""
    if not 2 <= levels <= 17:
        raise ValueError("levels must lie in [2, 17]")
    split = digits_split(seed=seed, test_size=test_size, scale=False)
    q = lambda t: torch.clamp((t * levels / 17.0).floor().long(), 0, levels - 1)  # noqa: E731
    return q(split.x_train), q(split.x_test)


def train_tree(model: TreeMixtureCircuit, x_train: torch.Tensor, x_val: torch.Tensor, x_test: torch.Tensor,
               epochs: int, batch_size: int, lr: float, generator: torch.Generator, z_check_every: int = 0,
               warmup_frac: float = 0.05, desc: str = "train") -> dict:
    """Adam (warm-up + cosine decay) on the negative log-likelihood in bits/dim.

    Returns per-epoch train/val/test bits/dim, the test bits/dim at the best validation epoch, ``log Z``
    checks and the median wall time per optimisation step (forward, backward and update). ``Z`` checks
    (every ``z_check_every`` steps, and after the last) run explicit squaring in double precision on the
    weights the model currently uses (``log Z = 0`` up to rounding for a unitary model).
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    steps_per_epoch = math.ceil(len(x_train) / batch_size)
    total_steps = max(epochs * steps_per_epoch, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: warmup_cosine_fraction(min(k, total_steps - 1), total_steps,
                                                                                     warmup_frac, 0.0))
    hist: dict[str, list] = {"epoch": [], "train_bpd": [], "val_bpd": [], "test_bpd": [], "z_step": [], "log_z": []}
    step_times: list[float] = []
    step = 0
    high = torch.complex128 if model.embed_raw.is_complex() else torch.float64

    def check_z() -> None:
        with torch.no_grad():
            hist["z_step"].append(step)
            hist["log_z"].append(model.log_partition_squared(dtype=high).item())

    for epoch in progress(range(epochs), desc=desc, total=epochs):
        total, count = 0.0, 0
        for idx in minibatches(len(x_train), batch_size, generator):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = model.bits_per_dim(x_train[idx])
            loss.backward()
            opt.step()
            step_times.append(time.perf_counter() - t0)
            sched.step()
            total += loss.item() * len(idx)
            count += len(idx)
            step += 1
            if z_check_every and step % z_check_every == 0:
                check_z()
        with torch.no_grad():
            hist["epoch"].append(epoch + 1)
            hist["train_bpd"].append(total / count)
            hist["val_bpd"].append(model.bits_per_dim(x_val).item() if len(x_val) else float("nan"))
            hist["test_bpd"].append(model.bits_per_dim(x_test).item())
    check_z()
    warm = step_times[min(5, len(step_times) - 1):]
    hist["time_per_step_ms"] = 1e3 * float(np.median(warm))
    best = int(np.nanargmin(hist["val_bpd"])) if len(x_val) else len(hist["test_bpd"]) - 1
    hist["best_epoch"] = best + 1
    hist["selected_test_bpd"] = hist["test_bpd"][best]
    hist["final_test_bpd"] = hist["test_bpd"][-1]
    return hist


@dataclass
class LearningResult(Result):
    """Training histories of the unitary tree (A), its unconstrained explicitly-squared twin (B) and,
    optionally, the unitary two-tree mixture (C); summary numbers and pass/fail."""

    kind = "squared_circuits_learning"
    config: dict
    histories: dict
    summary: dict
    timing: dict = field(default_factory=dict)

    def timing_frame(self):
        import pandas as pd

        return pd.DataFrame(self.timing)

    def to_frame(self):
        import pandas as pd

        rows = []
        for name, h in self.histories.items():
            for e, tr, te in zip(h["epoch"], h["train_bpd"], h["test_bpd"]):
                rows.append({"model": name, "epoch": e, "train_bpd": tr, "test_bpd": te})
        return pd.DataFrame(rows)

    def summary_frame(self):
        import pandas as pd

        return pd.DataFrame([{"model": k, **v} for k, v in self.summary["models"].items()])

    def figure(self):
        from plotly.subplots import make_subplots
        import plotly.graph_objects as go

        fig = make_subplots(rows=1, cols=3, subplot_titles=("test bits/dim", "|Z - 1| during training (A)",
                                                            "time per training step (ms) vs width"))
        for name, h in self.histories.items():
            fig.add_trace(go.Scatter(x=h["epoch"], y=h["test_bpd"], mode="lines", name=name), 1, 1)
        a = self.histories.get("A_unitary_tree")
        if a is not None:
            fig.add_trace(go.Scatter(x=a["z_step"], y=[abs(math.expm1(z)) + 1e-18 for z in a["log_z"]], mode="lines+markers",
                                     name="A: |Z-1|"), 1, 2)
            fig.add_hline(y=self.config["z_tol"], line_dash="dash", row=1, col=2)
        if self.timing:
            for key, label in (("A_ms", "A unitary"), ("B_ms", "B explicit squaring")):
                fig.add_trace(go.Scatter(x=self.timing["width"], y=self.timing[key], mode="lines+markers",
                                         name=f"{label} (ms/step)"), 1, 3)
            fig.update_xaxes(title_text="width K", type="log", row=1, col=3)
            fig.update_yaxes(type="log", row=1, col=3)
        else:
            fig.add_trace(go.Bar(x=list(self.histories), y=[h["time_per_step_ms"] for h in self.histories.values()],
                                 name="ms/step"), 1, 3)
        fig.update_yaxes(type="log", row=1, col=2)
        fig.update_xaxes(title_text="epoch", row=1, col=1)
        fig.update_xaxes(title_text="step", row=1, col=2)
        fig.update_layout(height=420, width=1200, title="Squared circuits on quantised digits")
        return fig


def learning_experiment(config: SquaredCircuitsConfig | None = None) -> LearningResult:
    """Unitary tree (A) vs the same tree unconstrained and squared explicitly (B) on quantised digits."""
    cfg = config or SquaredCircuitsConfig()
    dtype = getattr(torch, cfg.dtype)
    x_train, x_test = quantize_digits(cfg.levels, seed=cfg.seed)
    n_val = int(round(cfg.val_fraction * len(x_train)))
    perm = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(cfg.seed))
    x_val, x_train = x_train[perm[:n_val]], x_train[perm[n_val:]]
    order = morton_order(8, 8)
    histories: dict[str, dict] = {}
    with limit_threads(cfg.num_threads):
        gen = set_seed(cfg.seed)
        model_a = TreeMixtureCircuit(64, cfg.levels, cfg.width, orders=[order], unitary=True, dtype=dtype, generator=gen)
        model_a.retract_()
        model_b = model_a.unconstrained_copy()
        for name, model in (("A_unitary_tree", model_a), ("B_unconstrained_squared", model_b)):
            histories[name] = train_tree(model, x_train, x_val, x_test, cfg.epochs, cfg.batch_size, cfg.lr,
                                         torch.Generator().manual_seed(cfg.seed + 1), cfg.z_check_every,
                                         cfg.warmup_frac, desc=name)
            histories[name]["num_parameters"] = model.num_parameters()
        if cfg.mixture:
            model_c = TreeMixtureCircuit(64, cfg.levels, cfg.width, orders=[order, morton_order(8, 8, transpose=True)],
                                         unitary=True, dtype=dtype, generator=gen).retract_()
            histories["C_unitary_two_tree_mixture"] = train_tree(
                model_c, x_train, x_val, x_test, cfg.epochs, cfg.batch_size, cfg.lr,
                torch.Generator().manual_seed(cfg.seed + 1), cfg.z_check_every, cfg.warmup_frac, desc="C_mixture")
            histories["C_unitary_two_tree_mixture"]["num_parameters"] = model_c.num_parameters()
        timing = step_time_sweep(cfg.timing_widths, cfg.timing_steps, cfg.levels, cfg.batch_size, dtype, x_train,
                                 seed=cfg.seed)
    a, b = histories["A_unitary_tree"], histories["B_unconstrained_squared"]
    z_dev = max(abs(math.expm1(z)) for z in a["log_z"])
    rel = (a["selected_test_bpd"] - b["selected_test_bpd"]) / b["selected_test_bpd"]
    models = {name: {"test_bpd": h["selected_test_bpd"], "best_epoch": h["best_epoch"],
                     "final_test_bpd": h["final_test_bpd"], "train_bpd": h["train_bpd"][-1],
                     "time_per_step_ms": h["time_per_step_ms"], "num_parameters": h["num_parameters"],
                     "unitary": not name.startswith("B_"),
                     "max_abs_Z_minus_1": max(abs(math.expm1(z)) for z in h["log_z"]) if not name.startswith("B_")
                     else float("nan"), "final_log_Z": h["log_z"][-1]} for name, h in histories.items()}
    summary = {"models": models, "rel_nll_gap_A_vs_B": rel, "max_abs_Z_minus_1_A": z_dev,
               "nll_within_tol": bool(abs(rel) < cfg.nll_rel_tol), "z_within_tol": bool(z_dev < cfg.z_tol)}
    return LearningResult(config=asdict(cfg), histories=histories, summary=summary, timing=timing)


def step_time_sweep(widths: tuple[int, ...], steps: int, levels: int, batch_size: int, dtype: torch.dtype,
                    x: torch.Tensor, seed: int = 0) -> dict:
    """Median wall time (ms) of one Adam step of A (unitary) and B (explicit squaring) at several widths.

    Uses ``steps`` mini-batches of ``x`` ``[n, 64]``; the first step is a warm-up and not counted.
    """
    out: dict[str, list] = {"width": [], "num_parameters": [], "A_ms": [], "B_ms": []}
    for width in widths:
        gen = torch.Generator().manual_seed(seed)
        a = TreeMixtureCircuit(64, levels, width, orders=[morton_order(8, 8)], dtype=dtype, generator=gen).retract_()
        b = a.unconstrained_copy()
        row = {}
        for name, model in (("A_ms", a), ("B_ms", b)):
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            times = []
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
            for k in range(steps + 1):
                idx = order[(k * batch_size) % len(x):][:batch_size]
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                model.bits_per_dim(x[idx]).backward()
                opt.step()
                times.append(time.perf_counter() - t0)
            row[name] = 1e3 * float(np.median(times[1:])) if steps > 0 else float("nan")
        out["width"].append(width)
        out["num_parameters"].append(a.num_parameters())
        out["A_ms"].append(row["A_ms"])
        out["B_ms"].append(row["B_ms"])
    return out


@dataclass
class SquaredCircuitsResult(Result):
    """Both validations of the paper: exactness on random circuits and learning on digits (flat, saveable).

    ``exactness`` / ``exact_tol``: as in :class:`ExactnessResult`; ``learning_config`` / ``histories`` /
    ``summary``: as in :class:`LearningResult` (``None`` when learning was skipped); ``checks``: pass/fail.
    """

    kind = "squared_circuits"
    exactness: dict
    exact_tol: float
    learning_config: dict | None = None
    histories: dict | None = None
    summary: dict | None = None
    timing: dict | None = None
    checks: dict = field(default_factory=dict)

    @property
    def exactness_result(self) -> ExactnessResult:
        return ExactnessResult(rows=self.exactness, tol=self.exact_tol)

    @property
    def learning_result(self) -> LearningResult | None:
        if self.histories is None:
            return None
        return LearningResult(config=self.learning_config, histories=self.histories, summary=self.summary,
                              timing=self.timing or {})

    def to_frame(self):
        return self.exactness_result.to_frame()

    def figure(self):
        from plotly.subplots import make_subplots
        import plotly.graph_objects as go

        learn = self.learning_result
        fig = make_subplots(rows=1, cols=3 if learn is not None else 1, subplot_titles=(
            "exactness: log10 error", "test bits/dim", "time per training step (ms) vs width"))
        df = self.to_frame()
        fig.add_trace(go.Bar(x=df["name"], y=np.log10((df["Z_bruteforce"] - 1).abs() + 1e-18), name="log10 |Z-1|"), 1, 1)
        fig.add_trace(go.Bar(x=df["name"], y=np.log10(df["max_marginal_error"].fillna(0) + 1e-18),
                             name="log10 max |marginal error|"), 1, 1)
        fig.add_hline(y=math.log10(self.exact_tol), line_dash="dash", row=1, col=1)
        if learn is not None:
            for name, h in learn.histories.items():
                fig.add_trace(go.Scatter(x=h["epoch"], y=h["test_bpd"], mode="lines", name=name), 1, 2)
            if learn.timing:
                for key, label in (("A_ms", "A unitary"), ("B_ms", "B explicit squaring")):
                    fig.add_trace(go.Scatter(x=learn.timing["width"], y=learn.timing[key], mode="lines+markers",
                                             name=f"{label} (ms/step)"), 1, 3)
                fig.update_xaxes(title_text="width K", type="log", row=1, col=3)
                fig.update_yaxes(type="log", row=1, col=3)
            else:
                fig.add_trace(go.Bar(x=list(learn.histories),
                                     y=[h["time_per_step_ms"] for h in learn.histories.values()], name="ms/step"), 1, 3)
            fig.update_xaxes(title_text="epoch", row=1, col=2)
        fig.update_layout(height=480, width=1350, barmode="group",
                          title="How to square tensor networks and circuits without squaring them")
        return fig


def experiment(config: SquaredCircuitsConfig | None = None, learning: bool = True) -> SquaredCircuitsResult:
    """Run both validations (exactness; learning unless ``learning=False``) and collect pass/fail checks."""
    cfg = config or SquaredCircuitsConfig()
    ex = exactness_experiment(cfg)
    ln = learning_experiment(cfg) if learning else None
    checks = {"Z_equals_1": ex.max_z_error < cfg.exact_tol, "marginals_exact": ex.max_marginal_error < cfg.exact_tol}
    if ln is not None:
        checks["nll_A_within_tol_of_B"] = ln.summary["nll_within_tol"]
        checks["Z_A_within_tol_during_training"] = ln.summary["z_within_tol"]
    return SquaredCircuitsResult(exactness=ex.rows, exact_tol=ex.tol,
                                 learning_config=None if ln is None else ln.config,
                                 histories=None if ln is None else ln.histories,
                                 summary=None if ln is None else ln.summary,
                                 timing=None if ln is None else ln.timing, checks=checks)
