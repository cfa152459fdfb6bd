"""Complete(d)P validation at CPU scale: coordinate check, LR transfer across width and depth, batch-size and
duration (SDE) rules, and per-module hyperparameters found by trust-region random search.

Every training run is a *unit* named by a hash of its settings. Pass ``stages`` (an
:class:`interp.stages.Stages`, or any ``stages(name, compute)`` callable) to store each unit once it is finished
and read it back on a rerun (``interp reproduce completep`` does); without it every unit is computed. Units that
several experiments share (the proxy's LR grid) are computed once per run. The method (parameterization,
model, optimizer, training) is :mod:`interp.models.completep`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from interp.results import Result

from interp.models.completep.config import FINAL_GAIN_EPS, MODULES, GPTConfig, HParams, ModuleMultipliers, sde_scale
from interp.models.completep.data import CharCorpus, load_kjv_corpus
from interp.models.completep.search import trust_region_search
from interp.models.completep.train import MemberSpec, train_ensemble

#: ``stages(name, compute)``: returns the stored output of unit ``name`` or ``compute()`` (stored)
StageRunner = Callable[[str, Callable[[], dict]], dict]
STAGES = ("coord", "lr", "batch", "duration", "per_module")
COORD_NAMES = ("embed", "resid", "resid_final", "attn_out", "mlp_out", "logits")


@dataclass
class CompletePConfig:
    """Settings of the CPU-scale validation (the digest's recipe, reduced to fit 2 CPU cores).

    Model: pre-norm GPT, head size 16, context 64 characters, base shape width 64 / depth 2. Training:
    ``steps`` AdamW steps of ``batch_size`` windows (the recipe says 300 steps; 200 x 8 x 64 characters is
    the reduced default), validation cross-entropy on ``eval_sequences`` fixed held-out windows.
    Learning-rate grids are log2 exponents (``2**-12 ... 2**-4`` as in the recipe). ``final_gain_eps`` is
    passed to every model (:data:`~.config.FINAL_GAIN_EPS`); gradient clipping is ``hp.grad_clip``.
    """

    base_width: int = 64
    base_depth: int = 2
    head_dim: int = 16
    seq_len: int = 64
    alpha: float = 1.0
    final_gain_eps: str = "reference"
    hp: HParams = field(default_factory=HParams)
    batch_size: int = 8
    steps: int = 200
    eval_sequences: int = 128
    seed: int = 0
    # 1. coordinate check
    coord_widths: tuple[int, ...] = (32, 64, 128, 256)
    coord_depths: tuple[int, ...] = (2, 4, 8, 16)
    coord_steps: int = 10
    coord_seeds: int = 2
    coord_batch_size: int = 8
    coord_lr: float = 2.0 ** -6
    # 2. learning-rate transfer
    lr_exponents: tuple[float, ...] = tuple(float(x) for x in range(-12, -3))
    transfer_widths: tuple[int, ...] = (64, 256)
    transfer_depths: tuple[int, ...] = (2, 8)
    parameterizations: tuple[str, ...] = ("sp", "completep")
    # 3. batch size at fixed tokens (SDE rule), relative to `batch_size`
    batch_sizes: tuple[int, ...] = (8, 16, 32, 64)
    batch_base_steps: int = 400
    # 4. duration at fixed batch (finer, half-octave grid; optimum refined by a parabola in log2 LR)
    duration_steps: tuple[int, ...] = (200, 400)
    duration_exponents: tuple[float, ...] = tuple(x / 2 for x in range(-20, -7))
    duration_seeds: tuple[int, ...] = (0, 1)
    # 5. per-module multipliers: trust-region random search at the proxy, transfer to a wider model
    search_hp: str = "lr"
    search_modules: tuple[str, ...] = MODULES
    search_rounds: int = 4
    search_samples: int = 8
    search_radius: float = 1.0
    search_max_radius: float = 2.0
    search_target_width: int = 256
    search_transfer_seeds: tuple[int, ...] = (0, 1)
    stages: tuple[str, ...] = STAGES

    def __post_init__(self) -> None:
        if self.final_gain_eps not in FINAL_GAIN_EPS:
            raise ValueError(f"CompletePConfig.final_gain_eps must be one of {FINAL_GAIN_EPS}, "
                             f"got {self.final_gain_eps!r}")
        unknown = set(self.stages) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; expected a subset of {STAGES}")
        if len(self.lr_exponents) < 3:
            raise ValueError("lr_exponents needs at least 3 grid points")
        if self.batch_size not in self.batch_sizes and "batch" in self.stages:
            raise ValueError(f"batch_sizes {self.batch_sizes} must contain the base batch_size {self.batch_size}")
        if "lr" in self.stages and (self.base_width not in self.transfer_widths
                                    or self.base_depth not in self.transfer_depths):
            raise ValueError(f"transfer_widths {self.transfer_widths} / transfer_depths {self.transfer_depths} must "
                             f"contain the base shape (width {self.base_width}, depth {self.base_depth})")
        bad = [m for m in self.search_modules if m not in MODULES]
        if bad:
            raise ValueError(f"unknown search modules {bad}; expected a subset of {MODULES}")

    def model(self, vocab_size: int, width: int | None = None, depth: int | None = None,
              parameterization: str = "completep", alpha: float | None = None) -> GPTConfig:
        return GPTConfig(vocab_size=vocab_size, width=width or self.base_width, depth=depth or self.base_depth,
                         head_dim=self.head_dim, seq_len=self.seq_len, base_width=self.base_width,
                         base_depth=self.base_depth, base_head_dim=self.head_dim,
                         alpha=self.alpha if alpha is None else alpha, parameterization=parameterization,
                         final_gain_eps=self.final_gain_eps)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return json.loads(json.dumps(out))


# ---------------------------------------------------------------------------------------------- helpers
def _unit(stages: StageRunner | None, key: str, compute: Callable[[], dict]) -> dict:
    """One training unit: ``compute()`` (with its CPU seconds), through ``stages`` when given (stage name: the
    unit's kind and a hash of its settings ``key``)."""
    def timed() -> dict:
        start = time.process_time()
        value = compute()
        value["cpu_seconds"] = time.process_time() - start
        return value

    if stages is None:
        return timed()
    name = f"{key.split('|', 1)[0]}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    return stages(name, timed)


def _key(kind: str, **settings: Any) -> str:
    return kind + "|" + json.dumps(settings, sort_keys=True, default=str)


def _finite(values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    return np.where(np.isfinite(arr), arr, np.inf)


def grid_argmin(losses: Any) -> int:
    """Index of the lowest finite loss (diverged / NaN entries count as +inf); -1 if none is finite."""
    arr = _finite(losses)
    return int(np.argmin(arr)) if np.isfinite(arr).any() else -1


def refined_optimum(exponents: Any, losses: Any) -> float:
    """Log2 LR optimum refined by the vertex of the parabola through the grid minimum and its neighbours
    (in log2 LR); the grid minimum itself at an edge, next to a diverged point, or for a non-convex triple."""
    x = np.asarray(exponents, dtype=float)
    y = _finite(losses)
    i = grid_argmin(y)
    if i < 0:
        return float("nan")
    if 0 < i < len(x) - 1 and np.isfinite(y[i - 1]) and np.isfinite(y[i + 1]):
        a, b, _ = np.polyfit(x[i - 1:i + 2], y[i - 1:i + 2], 2)
        if a > 0:
            return float(np.clip(-b / (2 * a), x[i - 1], x[i + 1]))
    return float(x[i])


def _nan_list(a: np.ndarray) -> list:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, dtype=float).ravel()]


def _floats(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def lr_grid(cfg: CompletePConfig, corpus: CharCorpus, parameterization: str, width: int, depth: int,
            exponents: tuple[float, ...], steps: int, batch_size: int, hp: HParams | None = None,
            batch_mult: float = 1.0, token_mult: float = 1.0, multipliers: ModuleMultipliers | None = None,
            seeds: tuple[int, ...] = (0,), alpha: float | None = None, stages: StageRunner | None = None) -> dict:
    """Train one model per (seed, base LR ``2**x``) as one ensemble; return validation losses ``[seeds][grid]``.

    ``hp.lr`` is replaced by each grid value and the result passed through :func:`sde_scale` with
    ``batch_mult`` / ``token_mult``, so the grid is in base-LR units when an SDE rule is applied."""
    hp = hp or cfg.hp
    alpha = cfg.alpha if alpha is None else alpha
    hp_key = {k: v for k, v in dataclasses.asdict(hp).items() if k != "lr"}  # the grid replaces hp.lr
    key = _key("lr_grid", p=parameterization, w=width, d=depth, x=list(exponents), steps=steps, b=batch_size,
               hp=hp_key, bm=batch_mult, tm=token_mult, seeds=list(seeds), alpha=alpha,
               mult=multipliers.to_dict() if multipliers else None, seed=cfg.seed, T=cfg.seq_len,
               hd=cfg.head_dim, base=[cfg.base_width, cfg.base_depth], ev=cfg.eval_sequences, fge=cfg.final_gain_eps)

    def compute() -> dict:
        model = cfg.model(corpus.vocab_size, width, depth, parameterization, alpha)
        members = [MemberSpec(sde_scale(hp.replace(lr=2.0 ** x), batch_mult, token_mult), multipliers, seed)
                   for seed in seeds for x in exponents]
        run = train_ensemble(model, members, corpus, steps, batch_size, data_seed=cfg.seed,
                             eval_sequences=cfg.eval_sequences,
                             desc=f"{parameterization} w{width} d{depth} b{batch_size} s{steps}")
        g = len(exponents)
        clip = math.inf if hp.grad_clip is None else hp.grad_clip
        with np.errstate(invalid="ignore"):
            seen = np.isfinite(run.grad_norm)
            clipped = np.where(seen.any(1), (run.grad_norm > clip).sum(1) / np.maximum(seen.sum(1), 1), np.nan)
        return {"exponents": list(exponents), "seeds": list(seeds),
                "val_loss": [_nan_list(run.val_loss[i * g:(i + 1) * g]) for i in range(len(seeds))],
                "train_loss": [_nan_list(run.final_train_loss[i * g:(i + 1) * g]) for i in range(len(seeds))],
                "clipped_frac": [_nan_list(clipped[i * g:(i + 1) * g]) for i in range(len(seeds))]}

    return _unit(stages, key, compute)


def _mean_over_seeds(unit: dict) -> np.ndarray:
    """Mean validation loss over seeds per grid point (inf if any seed diverged) ``[grid]``."""
    vals = np.stack([_finite(_floats(v)) for v in unit["val_loss"]])
    return vals.mean(0)


# ---------------------------------------------------------------------------------------------- result
@dataclass
class CompletePResult(Result):
    """Outcome of the Complete(d)P validation (any subset of the stages).

    ``coord``: rows ``{parameterization, axis, width, depth, step, name, rms}`` (mean over seeds);
    ``sweeps``: rows ``{stage, parameterization, width, depth, batch_size, steps, seed, log2_lr, lr,
    val_loss, train_loss, clipped_frac}`` (``log2_lr`` in base-LR units; ``lr`` the value actually used;
    ``clipped_frac`` the fraction of steps whose gradient norm exceeded ``grad_clip``);
    ``search``: rows ``{round, index, loss, log2 multipliers..., center, radius}``;
    ``transfer``: rows ``{setting, seed, width, val_loss}``; ``summary``: measured numbers and pass flags.
    """

    kind = "completep"
    config: dict = field(default_factory=dict)
    coord: list = field(default_factory=list)
    sweeps: list = field(default_factory=list)
    search: list = field(default_factory=list)
    transfer: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """All rows in one tidy table, with a ``table`` column naming their part."""
        frames = [pd.DataFrame(rows).assign(table=name) for name, rows in
                  (("coord", self.coord), ("sweeps", self.sweeps), ("search", self.search),
                   ("transfer", self.transfer)) if rows]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def merge(self, other: "CompletePResult") -> "CompletePResult":
        return CompletePResult(config=self.config or other.config, coord=self.coord + other.coord,
                               sweeps=self.sweeps + other.sweeps, search=self.search + other.search,
                               transfer=self.transfer + other.transfer, summary={**self.summary, **other.summary})

    def figure(self):
        """2x4 panels: coordinate check (width, depth), LR transfer (width, depth), batch, duration,
        per-module search trace and transfer."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        titles = ("Coord check vs width (final RMS)", "Coord check vs depth (final RMS)",
                  "LR transfer: width", "LR transfer: depth", "Batch size (base-LR units, √ rule)",
                  "Duration (fixed batch)", "Per-module search (proxy)", "Transfer to target width")
        fig = make_subplots(rows=2, cols=4, subplot_titles=titles, horizontal_spacing=0.06, vertical_spacing=0.14)
        dash = {"sp": "dash", "completep": "solid", "mup": "dot"}
        coord = pd.DataFrame(self.coord)
        if not coord.empty:
            last = coord[coord.step == coord.step.max()]
            for col, axis, xname in ((1, "width", "width"), (2, "depth", "depth")):
                sub = last[(last.axis == axis) & last.name.isin(["resid", "logits"])]
                for (p, name), g in sub.groupby(["parameterization", "name"]):
                    g = g.sort_values(xname)
                    fig.add_trace(go.Scatter(x=g[xname], y=g.rms, mode="lines+markers", name=f"{p} {name}",
                                             line=dict(dash=dash.get(p, "solid")), legendgroup=f"coord {p} {name}",
                                             showlegend=col == 1), 1, col)
                fig.update_xaxes(type="log", title_text=xname, row=1, col=col)
                fig.update_yaxes(type="log", row=1, col=col)
        sweeps = pd.DataFrame(self.sweeps)
        if not sweeps.empty:
            panels = ((1, 3, "lr_width", "width"), (1, 4, "lr_depth", "depth"), (2, 1, "batch", "batch_size"),
                      (2, 2, "duration", "steps"))
            for row, col, stage, by in panels:
                sub = sweeps[sweeps.stage == stage]
                if sub.empty:
                    continue
                mean = sub.groupby(["parameterization", by, "log2_lr"], as_index=False).val_loss.mean()
                for (p, v), g in mean.groupby(["parameterization", by]):
                    fig.add_trace(go.Scatter(x=g.log2_lr, y=g.val_loss, mode="lines+markers", name=f"{p} {by}={v}",
                                             line=dict(dash=dash.get(p, "solid")), legendgroup=stage), row, col)
                fig.update_xaxes(title_text="log2 LR", row=row, col=col)
                fig.update_yaxes(title_text="val loss", row=row, col=col)
        if self.search:
            s = pd.DataFrame(self.search)
            fig.add_trace(go.Scatter(x=np.arange(len(s)), y=s.loss, mode="markers", name="search sample",
                                     legendgroup="search"), 2, 3)
            fig.add_trace(go.Scatter(x=np.arange(len(s)), y=np.minimum.accumulate(_finite(s.loss.to_numpy(float))),
                                     mode="lines", name="incumbent", legendgroup="search"), 2, 3)
            fig.update_xaxes(title_text="evaluation", row=2, col=3)
        if self.transfer:
            t = pd.DataFrame(self.transfer)
            for setting, g in t.groupby("setting"):
                fig.add_trace(go.Box(y=g.val_loss, name=setting, boxpoints="all", legendgroup="transfer"), 2, 4)
        fig.update_layout(height=750, width=1700, title="Complete(d)P at CPU scale (King James Bible, char-level)")
        return fig


# ---------------------------------------------------------------------------------------------- stages
def coordinate_check(cfg: CompletePConfig, corpus: CharCorpus | None = None,
                     stages: StageRunner | None = None) -> CompletePResult:
    """Activation RMS after ``coord_steps`` constant-LR AdamW steps at ``cfg.coord_lr`` (two grid points above
    the measured base optimum, so that updates dominate the initialisation), across widths (base
    depth) and depths (base width), for every parameterization; mean over ``coord_seeds`` initialisations.

    Summary: per parameterization and axis, the max/min ratio of the final RMS over the shapes for each
    activation; pass if CompleteP keeps residual stream and logits within 2x on both axes and SP's ratio is
    clearly larger (>= 2 and >= 1.5x CompleteP's) on both axes.
    """
    corpus = corpus or load_kjv_corpus()
    hp = cfg.hp.replace(lr=cfg.coord_lr, warmup_frac=0.0, final_lr_frac=1.0)
    rows: list[dict] = []
    shapes = [("width", w, cfg.base_depth) for w in cfg.coord_widths] + \
             [("depth", cfg.base_width, d) for d in cfg.coord_depths]
    for p in cfg.parameterizations:
        for axis, w, d in shapes:
            key = _key("coord", p=p, w=w, d=d, steps=cfg.coord_steps, seeds=cfg.coord_seeds, b=cfg.coord_batch_size,
                       hp=dataclasses.asdict(hp), alpha=cfg.alpha, seed=cfg.seed, T=cfg.seq_len, hd=cfg.head_dim,
                       base=[cfg.base_width, cfg.base_depth], fge=cfg.final_gain_eps)

            def compute(w=w, d=d, p=p) -> dict:
                members = [MemberSpec(hp, None, cfg.seed + s) for s in range(cfg.coord_seeds)]
                run = train_ensemble(cfg.model(corpus.vocab_size, w, d, p), members, corpus, cfg.coord_steps,
                                     cfg.coord_batch_size, data_seed=cfg.seed, eval_sequences=1, record_stats=True,
                                     divergence_loss=float("inf"), desc=f"coord {p} w{w} d{d}")
                return {name: _nan_list(np.nanmean(run.stats[name], axis=1)) for name in COORD_NAMES}

            unit = _unit(stages, key, compute)
            for name in COORD_NAMES:
                for step, v in enumerate(unit[name]):
                    rows.append({"parameterization": p, "axis": axis, "width": w, "depth": d, "step": step,
                                 "name": name, "rms": np.nan if v is None else v})
    return CompletePResult(config=cfg.to_dict(), coord=rows, summary={"coord": _coord_summary(rows, cfg)})


def _coord_summary(rows: list[dict], cfg: CompletePConfig) -> dict:
    df = pd.DataFrame(rows)
    last = df[df.step == df.step.max()]
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    for (p, axis, name), g in last.groupby(["parameterization", "axis", "name"]):
        vals = g.rms.to_numpy(float)
        ratio = float(np.nanmax(vals) / np.nanmin(vals)) if np.isfinite(vals).all() else float("inf")
        ratios.setdefault(p, {}).setdefault(axis, {})[name] = ratio
    out: dict[str, Any] = {"ratios": ratios}
    if "completep" in ratios:
        cp = {axis: max(ratios["completep"][axis][n] for n in ("resid", "logits")) for axis in ratios["completep"]}
        out["completep_max_ratio"] = cp
        out["pass_completep"] = bool(all(v < 2.0 for v in cp.values()))
        if "sp" in ratios:
            sp = {axis: max(ratios["sp"][axis][n] for n in ("resid", "logits")) for axis in ratios["sp"]}
            out["sp_max_ratio"] = sp
            out["pass_sp_larger"] = bool(all(sp[a] >= 2.0 and sp[a] >= 1.5 * cp[a] for a in sp))
    return out


def lr_transfer(cfg: CompletePConfig, corpus: CharCorpus | None = None,
                stages: StageRunner | None = None) -> CompletePResult:
    """LR grids at the base shape, the wider models (base depth) and the deeper models (base width), per
    parameterization. Summary: grid argmin per shape and its shift (in grid points) from the base shape;
    pass if CompleteP moves <= 1 point and SP >= 2 points, for the largest width and the largest depth."""
    corpus = corpus or load_kjv_corpus()
    rows: list[dict] = []
    summary: dict[str, Any] = {"argmin": {}, "refined_log2_lr": {}, "shift_width": {}, "shift_depth": {}}
    shapes = [("lr_width", w, cfg.base_depth) for w in cfg.transfer_widths] + \
             [("lr_depth", cfg.base_width, d) for d in cfg.transfer_depths]
    for p in cfg.parameterizations:
        best: dict[tuple[int, int], int] = {}
        for stage, w, d in shapes:
            unit = lr_grid(cfg, corpus, p, w, d, cfg.lr_exponents, cfg.steps, cfg.batch_size, stages=stages)
            rows += _sweep_rows(unit, stage, p, w, d, cfg.batch_size, cfg.steps, 1.0)
            losses = _mean_over_seeds(unit)
            best[(w, d)] = grid_argmin(losses)
            summary["argmin"][f"{p}/w{w}/d{d}"] = float(cfg.lr_exponents[best[(w, d)]]) if best[(w, d)] >= 0 else None
            summary["refined_log2_lr"][f"{p}/w{w}/d{d}"] = refined_optimum(cfg.lr_exponents, losses)
        base = best[(cfg.base_width, cfg.base_depth)]
        summary["shift_width"][p] = best[(max(cfg.transfer_widths), cfg.base_depth)] - base
        summary["shift_depth"][p] = best[(cfg.base_width, max(cfg.transfer_depths))] - base
    if "completep" in cfg.parameterizations:
        summary["pass_completep"] = bool(abs(summary["shift_width"]["completep"]) <= 1
                                         and abs(summary["shift_depth"]["completep"]) <= 1)
    if "sp" in cfg.parameterizations:
        summary["pass_sp_width"] = bool(abs(summary["shift_width"]["sp"]) >= 2)
        summary["pass_sp_depth"] = bool(abs(summary["shift_depth"]["sp"]) >= 2)
    return CompletePResult(config=cfg.to_dict(), sweeps=rows, summary={"lr": summary})


def _sweep_rows(unit: dict, stage: str, p: str, w: int, d: int, batch: int, steps: int, lr_factor: float) -> list[dict]:
    rows = []
    clipped = unit.get("clipped_frac", [[None] * len(unit["exponents"])] * len(unit["seeds"]))
    for seed, vals, tr, cl in zip(unit["seeds"], unit["val_loss"], unit["train_loss"], clipped):
        for x, v, t, c in zip(unit["exponents"], vals, tr, cl):
            rows.append({"stage": stage, "parameterization": p, "width": w, "depth": d, "batch_size": batch,
                         "steps": steps, "seed": seed, "log2_lr": x, "lr": 2.0 ** x * lr_factor,
                         "val_loss": np.nan if v is None else v, "train_loss": np.nan if t is None else t,
                         "clipped_frac": np.nan if c is None else c})
    return rows


def batch_transfer(cfg: CompletePConfig, corpus: CharCorpus | None = None,
                   stages: StageRunner | None = None) -> CompletePResult:
    """CompleteP base shape at a fixed token budget (``batch_base_steps`` steps of ``batch_size``) with every
    batch in ``batch_sizes``; hyperparameters follow :func:`sde_scale` (LR x sqrt(k), ...). Pass if the grid
    argmin in base-LR units moves <= 1 point across batch sizes."""
    corpus = corpus or load_kjv_corpus()
    rows: list[dict] = []
    argmin: dict[str, float | None] = {}
    idx = []
    for b in cfg.batch_sizes:
        k = b / cfg.batch_size
        steps = int(round(cfg.batch_base_steps / k))
        unit = lr_grid(cfg, corpus, "completep", cfg.base_width, cfg.base_depth, cfg.lr_exponents, steps, b,
                       batch_mult=k, token_mult=1.0, stages=stages)
        rows += _sweep_rows(unit, "batch", "completep", cfg.base_width, cfg.base_depth, b, steps, math.sqrt(k))
        i = grid_argmin(_mean_over_seeds(unit))
        idx.append(i)
        argmin[str(b)] = float(cfg.lr_exponents[i]) if i >= 0 else None
    spread = int(max(idx) - min(idx)) if min(idx) >= 0 else None
    raw = {b: (argmin[str(b)] + 0.5 * math.log2(b / cfg.batch_size)) if argmin[str(b)] is not None else None
           for b in cfg.batch_sizes}
    summary = {"argmin_base_units": argmin, "argmin_raw_log2_lr": {str(b): v for b, v in raw.items()},
               "spread_points": spread, "pass": bool(spread is not None and spread <= 1)}
    return CompletePResult(config=cfg.to_dict(), sweeps=rows, summary={"batch": summary})


def duration_transfer(cfg: CompletePConfig, corpus: CharCorpus | None = None,
                      stages: StageRunner | None = None) -> CompletePResult:
    """CompleteP base shape, fixed batch, step counts ``duration_steps`` on the half-octave grid
    ``duration_exponents`` (raw LR, no rule applied), losses averaged over the initialisation seeds
    ``duration_seeds``. The optimum is refined by a parabola in log2 LR.
    Pass if doubling the steps moves the optimum by a factor within ``2**[-0.75, -0.25]`` (the SDE rule
    predicts ``1/sqrt(2) = 2**-0.5``)."""
    corpus = corpus or load_kjv_corpus()
    rows: list[dict] = []
    opt: dict[str, float] = {}
    for s in cfg.duration_steps:
        unit = lr_grid(cfg, corpus, "completep", cfg.base_width, cfg.base_depth, cfg.duration_exponents, s,
                       cfg.batch_size, seeds=cfg.duration_seeds, stages=stages)
        rows += _sweep_rows(unit, "duration", "completep", cfg.base_width, cfg.base_depth, cfg.batch_size, s, 1.0)
        opt[str(s)] = refined_optimum(cfg.duration_exponents, _mean_over_seeds(unit))
    summary: dict[str, Any] = {"refined_log2_lr": opt}
    steps = sorted(cfg.duration_steps)
    if len(steps) >= 2:
        shifts = {f"{a}->{b}": (opt[str(b)] - opt[str(a)]) / math.log2(b / a) for a, b in zip(steps, steps[1:])}
        summary["log2_shift_per_doubling"] = shifts
        summary["sde_prediction"] = -0.5
        summary["pass"] = bool(all(-0.75 <= v <= -0.25 for v in shifts.values()))
    return CompletePResult(config=cfg.to_dict(), sweeps=rows, summary={"duration": summary})


def per_module_transfer(cfg: CompletePConfig, corpus: CharCorpus | None = None,
                        stages: StageRunner | None = None) -> CompletePResult:
    """Per-module multipliers vs the best global setting, found at the proxy and transferred to a 4x wider model.

    1. the CompleteP LR grid at the proxy (base shape) gives the best global LR ``eta*``;
    2. trust-region random search over the log2 ``search_hp`` multipliers of ``search_modules`` (the
       Kronecker type factors) around ``eta*`` at the proxy;
    3. both settings are trained at ``search_target_width`` (CompleteP rules) for each seed in
       ``search_transfer_seeds``. Pass if the per-module setting reaches the lower mean validation loss.
    """
    corpus = corpus or load_kjv_corpus()
    base = lr_grid(cfg, corpus, "completep", cfg.base_width, cfg.base_depth, cfg.lr_exponents, cfg.steps,
                   cfg.batch_size, stages=stages)
    losses = _mean_over_seeds(base)
    i = grid_argmin(losses)
    if i < 0:
        raise RuntimeError("every learning rate of the proxy grid diverged; nothing to transfer")
    hp = cfg.hp.replace(lr=2.0 ** cfg.lr_exponents[i])
    coords = [("type", cfg.search_hp, m) for m in cfg.search_modules]
    model = cfg.model(corpus.vocab_size)
    rng = np.random.default_rng(cfg.seed)
    calls = {"n": 0}

    def evaluate(points: np.ndarray) -> np.ndarray:
        r = calls["n"]
        calls["n"] += 1
        key = _key("search", round=r, pts=np.round(points, 8).tolist(), hp=dataclasses.asdict(hp), steps=cfg.steps,
                   b=cfg.batch_size, seed=cfg.seed, w=cfg.base_width, d=cfg.base_depth, alpha=cfg.alpha,
                   coords=coords, ev=cfg.eval_sequences, fge=cfg.final_gain_eps)

        def compute() -> dict:
            members = [MemberSpec(hp, ModuleMultipliers.from_log2(coords, pt), cfg.seed) for pt in points]
            run = train_ensemble(model, members, corpus, cfg.steps, cfg.batch_size, data_seed=cfg.seed,
                                 eval_sequences=cfg.eval_sequences, desc=f"search round {r}")
            return {"val_loss": _nan_list(run.val_loss)}

        return _floats(_unit(stages, key, compute)["val_loss"])

    history = trust_region_search(evaluate, len(coords), cfg.search_rounds, cfg.search_samples,
                                  cfg.search_radius, cfg.search_max_radius, rng)
    search_rows = []
    for r, h in enumerate(history):
        for j, (pt, loss) in enumerate(zip(h["points"], h["losses"])):
            row = {"round": r, "index": j, "loss": np.nan if loss is None else loss, "radius": h["radius"]}
            row.update({f"log2_{cfg.search_hp}_{m}": v for m, v in zip(cfg.search_modules, pt)})
            search_rows.append(row)
    best_point = np.asarray(history[-1]["best_point"])
    best_mult = ModuleMultipliers.from_log2(coords, best_point)
    global_proxy = float(losses[i])

    key = _key("transfer", w=cfg.search_target_width, d=cfg.base_depth, hp=dataclasses.asdict(hp),
               mult=best_mult.to_dict(), seeds=list(cfg.search_transfer_seeds), steps=cfg.steps, b=cfg.batch_size,
               seed=cfg.seed, alpha=cfg.alpha, ev=cfg.eval_sequences, fge=cfg.final_gain_eps)

    def compute_transfer() -> dict:
        members = [MemberSpec(hp, mult, s) for s in cfg.search_transfer_seeds for mult in (None, best_mult)]
        run = train_ensemble(cfg.model(corpus.vocab_size, cfg.search_target_width), members, corpus, cfg.steps,
                             cfg.batch_size, data_seed=cfg.seed, eval_sequences=cfg.eval_sequences,
                             desc=f"transfer w{cfg.search_target_width}")
        return {"val_loss": _nan_list(run.val_loss)}

    vals = _floats(_unit(stages, key, compute_transfer)["val_loss"])
    transfer_rows = []
    for k, s in enumerate(cfg.search_transfer_seeds):
        for j, setting in enumerate(("global", "per-module")):
            transfer_rows.append({"setting": setting, "seed": s, "width": cfg.search_target_width,
                                  "val_loss": float(vals[2 * k + j])})
    glob = _finite(vals[0::2]).mean()
    per = _finite(vals[1::2]).mean()
    summary = {"global_log2_lr": float(cfg.lr_exponents[i]), "proxy_global_loss": global_proxy,
               "proxy_best_loss": float(history[-1]["best_loss"]),
               "best_log2_multipliers": dict(zip(cfg.search_modules, best_point.tolist())),
               "target_global_loss": float(glob), "target_per_module_loss": float(per),
               "target_gain": float(glob - per), "pass": bool(per < glob)}
    return CompletePResult(config=cfg.to_dict(), search=search_rows, transfer=transfer_rows,
                           summary={"per_module": summary})


def experiment(cfg: CompletePConfig | None = None, corpus: CharCorpus | None = None,
               stages: StageRunner | None = None) -> CompletePResult:
    """Run the stages listed in ``cfg.stages`` (default: all) and merge their results."""
    cfg = cfg or CompletePConfig()
    corpus = corpus or load_kjv_corpus()
    stage_fns = {"coord": coordinate_check, "lr": lr_transfer, "batch": batch_transfer,
                 "duration": duration_transfer, "per_module": per_module_transfer}
    result = CompletePResult(config=cfg.to_dict())
    for name in cfg.stages:
        result = result.merge(stage_fns[name](cfg, corpus, stages))
    return result
