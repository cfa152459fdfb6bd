"""Block-recurrent dynamics (Jacobs, Fel, Hakim et al., ICLR 2026) as an ``interp audit`` check (``raptor``).

On a vision transformer and real images (the scikit-learn digits, upsampled; the audit's text data are not
used): the layer x layer cosine-distance heatmap, the phases at several ``frac`` (max-cut and contiguous DP), the
token dynamics (γ, angular speed per token type, update-field stable rank, patch coherence, class basins, speed
jumps at the phase boundaries); with ``fit=True`` also a Raptor with ``k`` blocks trained on the activations and
its per-layer R² and linear-probe accuracy. Entry point: ``raptor = "interp.dynamics.raptor.audit_check:RaptorCheck"``.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from interp.checks import AuditData, Check, Rendered
from interp.results import Result

from ..trajectories import Trajectories, trajectory_metrics
from .model import Raptor, RaptorConfig
from .phases import LayerDistances, layer_distances, phases
from .train import RaptorFit, RaptorTrainConfig, evaluate_raptor, teacher_activations, train_raptor


@dataclass
class RaptorCheckConfig:
    """Options of the ``raptor`` check."""

    n_images: int = 200
    image_size: int = 56  #: digits upsampled to this many pixels (multiple of the patch size)
    n_registers: int = 0
    fracs: tuple[float, ...] = (0.2, 0.1, 0.05)
    fit: bool = False  #: also train a Raptor (minutes on CPU)
    k: int = 2
    steps: int = 60
    batch_size: int = 16

    def __post_init__(self) -> None:
        for name, low in (("n_images", 4), ("image_size", 1), ("n_registers", 0), ("k", 1), ("steps", 1),
                          ("batch_size", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"raptor.{name} must be an integer >= {low}, got {v!r}")
        self.fracs = tuple(float(f) for f in self.fracs)
        if any(f < 0 for f in self.fracs):
            raise ValueError(f"raptor.fracs must be >= 0, got {self.fracs}")


@dataclass
class RaptorCheckResult(Result):
    distances: LayerDistances
    phases: dict[str, list[list[int]]]
    trajectories: Trajectories
    fit: RaptorFit | None = None
    kind: ClassVar[str] = "raptor_check"

    def to_frame(self):
        return self.trajectories.to_frame()

    def figure(self):
        return self.distances.figure(self.phases.get("dp/k=2"))


class RaptorCheck(Check):
    """Layer phases, token dynamics and (optionally) a Raptor fit of a vision transformer."""

    name: ClassVar[str] = "raptor"
    title: ClassVar[str] = "Block-recurrent dynamics (phases, Raptor)"
    description: ClassVar[str] = ("Jacobs, Fel, Hakim et al., 'Block-Recurrent Dynamics in Vision Transformers' "
                                  "(ICLR 2026): layer-similarity phases, dynamics on the sphere, Raptor surrogate.")
    Config: ClassVar[type] = RaptorCheckConfig
    #: needs a vision transformer: runs when named (--checks raptor), not in the default audit
    opt_in: ClassVar[bool] = True
    METRICS: ClassVar[dict[str, str]] = {
        "n_phases": "phases of the contiguous DP partition at k blocks",
        "cls_speed_jump_ratio": "CLS-token angular-speed jump ratio at the phase boundaries",
        "raptor_end_r2": "Raptor R² (official definition) at the last layer (fit=true only)",
        "raptor_relative_acc": "Raptor / teacher linear-probe accuracy (fit=true only)"}

    def applies(self, model) -> str | None:
        if model.cfg.modality != "vision":
            return f"the raptor check needs a vision transformer (this model's modality is {model.cfg.modality})"
        return None

    def metrics(self, result: RaptorCheckResult) -> dict[str, Any]:
        cfg: RaptorCheckConfig = self.config
        jumps = result.trajectories.speed_jumps.get("cls")
        return {"n_phases": len(result.phases.get(f"dp/k={cfg.k}", [])),
                "cls_speed_jump_ratio": jumps["ratio"] if jumps else None,
                "raptor_end_r2": None if result.fit is None else result.fit.end_r2_official,
                "raptor_relative_acc": None if result.fit is None else result.fit.relative_acc}

    def run(self, model, data: AuditData) -> RaptorCheckResult:  # noqa: ARG002 - images, not texts
        from interp.data import digits_images
        cfg: RaptorCheckConfig = self.config
        if model.cfg.modality != "vision":
            raise ValueError("the raptor check needs a vision transformer (modality 'vision')")
        x, y = digits_images(cfg.image_size)
        idx = np.random.default_rng(0).permutation(len(y))[: cfg.n_images]
        x, y = x[idx], y[idx]
        dist = layer_distances(model, x, n_registers=cfg.n_registers)
        parts: dict[str, list[list[int]]] = {}
        for method in ("maxcut", "dp"):
            for f in cfg.fracs:
                parts[f"{method}/frac={f:g}"] = phases(dist, frac=f, method=method).parts
            parts[f"{method}/k={cfg.k}"] = phases(dist, n_phases=cfg.k, method=method).parts
        parts.setdefault("dp/k=2", phases(dist, n_phases=2, method="dp").parts)
        acts = teacher_activations(model, x)
        traj = trajectory_metrics(stream=acts, n_registers=cfg.n_registers, labels=y, phases=parts[f"dp/k={cfg.k}"])
        fit = None
        if cfg.fit:
            half = len(y) // 2
            raptor = Raptor(RaptorConfig.from_phases(parts[f"dp/k={cfg.k}"], d_model=model.cfg.d_model,
                                                     n_heads=model.cfg.n_heads))
            train_raptor(raptor, acts[:, :half], RaptorTrainConfig(stage1_steps=cfg.steps, stage2_steps=cfg.steps,
                                                                   batch_size=cfg.batch_size, lr=1e-3,
                                                                   n_registers=cfg.n_registers))
            fit = evaluate_raptor(raptor, acts[:, :half], y[:half], acts[:, half:], y[half:],
                                  final_norm=model.apply_ln_final, n_registers=cfg.n_registers, name=f"k{cfg.k}")
        return RaptorCheckResult(dist, parts, traj, fit)

    def summary(self, result: RaptorCheckResult) -> dict[str, Any]:
        cfg: RaptorCheckConfig = self.config
        out: dict[str, Any] = {f"phases dp/k={cfg.k}": str(result.phases[f"dp/k={cfg.k}"])}
        jumps = result.trajectories.speed_jumps.get("cls")
        if jumps:
            out["cls speed jump ratio at boundaries"] = jumps["ratio"]
        if result.fit is not None:
            out["Raptor R² official (last layer)"] = result.fit.end_r2_official
            out["Raptor mean R² official"] = result.fit.mean_r2_official
            out["Raptor mean R² (ours, per feature)"] = result.fit.mean_r2
            out["Raptor / teacher probe acc"] = result.fit.relative_acc
        return out

    def to_json(self, result: RaptorCheckResult) -> dict[str, Any]:
        return {"schema": "interp.checks.raptor/1", "cosine": result.distances.cosine.tolist(),
                "mse": result.distances.mse.tolist(), "phases": result.phases,
                "trajectories": result.trajectories.to_frame().to_dict("records"),
                "speed_jumps": result.trajectories.speed_jumps,
                "fit": None if result.fit is None else result.fit.to_dict()}

    def render(self, result: RaptorCheckResult) -> Rendered:
        import pandas as pd
        cfg: RaptorCheckConfig = self.config
        rows = [{"partition": k, "phases": str(v)} for k, v in result.phases.items()]
        text = (f"<p>{result.distances.n_images} real digit images at {cfg.image_size}px. Phases by recursive "
                f"brute-force max-cut (the official split rule) and exact contiguous DP. Speed jumps at the boundaries of "
                f"{html.escape(str(result.phases[f'dp/k={cfg.k}']))}: "
                + ", ".join(f"{g}: ratio {v['ratio']:.2f}" for g, v in result.trajectories.speed_jumps.items())
                + ".</p>")
        figures = [("Layer cosine distance with phase boundaries", result.distances.figure(result.phases[f"dp/k={cfg.k}"])),
                   ("Token dynamics over depth", result.trajectories.figure())]
        tables = [("Phases", pd.DataFrame(rows)), ("Dynamics per layer", result.trajectories.to_frame())]
        if result.fit is not None:
            text += (f"<p>Raptor k = {cfg.k}: R² (the official definition) {result.fit.end_r2_official:.3f} at the "
                     f"last layer, {result.fit.mean_r2_official:.3f} averaged over layers (ours, per feature: "
                     f"{result.fit.mean_r2:.3f}); linear-probe accuracy "
                     f"{result.fit.probe_acc_raptor:.3f} vs the teacher's {result.fit.probe_acc_teacher:.3f}.</p>")
            figures.append(("Raptor per-layer R²", result.fit.figure()))
        return Rendered(text, figures, tables)


__all__ = ["RaptorCheck", "RaptorCheckConfig", "RaptorCheckResult"]
