"""The four validations of the FRE-RNN + EP digest (section 7) on digits: EP vs BPTT accuracy over seeds,
free-phase convergence and spectral radius against the feedback strength β, EP/BP gradient alignment, and a
deep network with and without long-range skip links. The method (network, EP and BP updates, training) is
:mod:`interp.models.equilibrium_propagation`.

Each part is a function of one independent unit (:func:`run_seed`, :func:`run_beta`, :func:`run_depth`), so the
recipe can store and spread them; :func:`experiment` runs them all and assembles an :class:`EPResult`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from interp.models.common import digits_split
from interp.models.equilibrium_propagation import (EPConfig, convergence_profile, default_skips,
                                                   gradient_alignment, train)
from interp.progress import progress
from interp.results import Result

__all__ = ["EPRunConfig", "EPResult", "run_seed", "run_beta", "run_depth", "assemble", "experiment"]


@dataclass
class EPRunConfig:
    """The validation run (defaults: the digest's CPU recipe).

    ``model``: the network and training config (64-64-64-10, β_i = 0.01, 100 epochs); ``seeds``: EP vs BP
    seeds (the first one's trained EP net gives the alignment); ``betas``: feedback strengths, one network
    trained ``convergence_epochs`` on seed ``seeds[0]`` per β; ``depth_layers`` hidden layers of
    ``model.hidden[0]`` units with and without ``depth_skips`` (``None``: :func:`default_skips`), trained
    ``depth_epochs`` on each of ``depth_seeds``; convergence is ``‖Δs‖∞ < tol`` within ``max_steps``.
    """

    model: EPConfig = field(default_factory=EPConfig)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    betas: tuple[float, ...] = (0.01, 0.1, 1.0, 2.0)
    convergence_epochs: int = 10
    depth_layers: int = 8
    depth_epochs: int = 20
    depth_skips: tuple[tuple[int, int], ...] | None = None
    depth_seeds: tuple[int, ...] = (0, 1, 2)
    tol: float = 1e-4
    max_steps: int = 1000

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("seeds must not be empty")
        if not self.betas or not self.depth_seeds:
            raise ValueError("betas and depth_seeds must not be empty")
        if self.depth_layers < 2:
            raise ValueError(f"depth_layers must be >= 2, got {self.depth_layers}")

    def skips(self) -> tuple[tuple[int, int], ...]:
        """The skip links of the depth study."""
        return default_skips(self.depth_layers) if self.depth_skips is None else tuple(tuple(p) for p in self.depth_skips)


def run_seed(config: EPRunConfig, seed: int) -> dict:
    """EP and BPTT trained on one seed: final test accuracy and the per-epoch test accuracy of each; on
    ``config.seeds[0]`` also the cosine(EP update, −BP gradient) per parameter of the trained EP network on the
    whole test set (``alignment``; empty otherwise)."""
    out: dict = {"seed": int(seed)}
    for m in ("ep", "bp"):
        st = train(config.model, m, seed)
        out[m] = st.final_accuracy
        out[f"{m}_curve"] = st.test_accuracy
        if m == "ep" and seed == config.seeds[0]:
            data = digits_split(seed=seed, test_size=config.model.test_size)
            out["alignment"] = gradient_alignment(st.model, data.x_test.to(config.model.torch_dtype), data.y_test)
    out.setdefault("alignment", {})
    return out


def run_beta(config: EPRunConfig, beta: float) -> dict:
    """A network trained with feedback strength ``beta`` (``convergence_epochs``, seed ``seeds[0]``): mean
    free-phase steps to convergence on the test set, spectral radius of the recurrent matrix, test accuracy."""
    cfg_b = dataclasses.replace(config.model, beta=float(beta))
    run_b = train(cfg_b, "ep", config.seeds[0], epochs=config.convergence_epochs, desc=f"beta={beta}")
    data = digits_split(seed=config.seeds[0], test_size=config.model.test_size)
    steps, radius = convergence_profile(run_b.model, data.x_test.to(config.model.torch_dtype), [beta], config.tol,
                                        config.max_steps)
    return {"beta": float(beta), "steps": steps[0], "radius": radius[0], "accuracy": run_b.final_accuracy}


def run_depth(config: EPRunConfig, seed: int) -> dict:
    """``depth_layers`` hidden layers trained with EP (``depth_epochs``) without and with the skip links: the
    final test accuracy of each."""
    betas = config.model.betas()
    out: dict = {"seed": int(seed)}
    for key, sk in (("no_skip", ()), ("skip", config.skips())):
        cfg_d = dataclasses.replace(config.model, hidden=(config.model.hidden[0],) * config.depth_layers,
                                    beta=betas[0] if betas else 0.01, skips=sk, T=None, K=None)
        out[key] = train(cfg_d, "ep", seed, epochs=config.depth_epochs, desc=f"depth {key} seed {seed}").final_accuracy
    return out


@dataclass
class EPResult(Result):
    """All four validations of the digest on digits.

    ``accuracy``: ``{"ep": [...], "bp": [...]}`` final test accuracy per seed; ``curves``: test accuracy per
    epoch ``{method: [n_seeds, epochs]}``; ``betas``: the feedback strengths swept, with
    ``convergence_steps`` (mean free-phase steps to ``‖Δs‖∞ < tol``), ``spectral_radius`` and
    ``beta_accuracy`` (test accuracy), each measured on a network trained with that β; ``alignment``:
    cosine(EP Δ, −∇BP) per parameter (trained EP net); ``depth_accuracy``: ``{"no_skip": [...], "skip": [...]}``
    at ``depth_layers`` hidden layers.
    """

    seeds: list[int]
    accuracy: dict[str, list[float]]
    curves: dict[str, np.ndarray]
    betas: list[float]
    convergence_steps: list[float]
    spectral_radius: list[float]
    beta_accuracy: list[float]
    alignment: dict[str, float]
    depth_layers: int
    depth_skips: list[list[int]]
    depth_seeds: list[int]
    depth_accuracy: dict[str, list[float]]
    config: dict = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        rows = [{"part": "accuracy", "setting": m, "seed": s, "value": a}
                for m, accs in self.accuracy.items() for s, a in zip(self.seeds, accs)]
        rows += [{"part": "convergence_steps", "setting": f"beta={b}", "seed": None, "value": v}
                 for b, v in zip(self.betas, self.convergence_steps)]
        rows += [{"part": "spectral_radius", "setting": f"beta={b}", "seed": None, "value": v}
                 for b, v in zip(self.betas, self.spectral_radius)]
        rows += [{"part": "beta_accuracy", "setting": f"beta={b}", "seed": None, "value": v}
                 for b, v in zip(self.betas, self.beta_accuracy)]
        rows += [{"part": "alignment", "setting": n, "seed": None, "value": v} for n, v in self.alignment.items()]
        rows += [{"part": f"depth{self.depth_layers}", "setting": k, "seed": s, "value": a}
                 for k, accs in self.depth_accuracy.items() for s, a in zip(self.depth_seeds, accs)]
        return pd.DataFrame(rows)

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=2, cols=2, subplot_titles=(
            "test accuracy during training", "free-phase convergence vs feedback β",
            "cosine(EP update, −BP gradient)", f"{self.depth_layers} hidden layers: residual links"))
        for m, color in (("ep", "#EF553B"), ("bp", "#636EFA")):
            c = np.asarray(self.curves[m], dtype=np.float64)
            fig.add_trace(go.Scatter(y=c.mean(0), name=m.upper(), mode="lines", line=dict(color=color)), 1, 1)
        fig.add_trace(go.Scatter(x=self.betas, y=self.convergence_steps, name="steps to converge",
                                 mode="lines+markers"), 1, 2)
        fig.add_trace(go.Scatter(x=self.betas, y=self.spectral_radius, name="spectral radius",
                                 mode="lines+markers", yaxis="y5"), 1, 2)
        names = list(self.alignment)
        fig.add_trace(go.Bar(x=names, y=[self.alignment[n] for n in names], name="cosine", showlegend=False), 2, 1)
        for k in self.depth_accuracy:
            fig.add_trace(go.Box(y=self.depth_accuracy[k], name=k, boxpoints="all", showlegend=False), 2, 2)
        fig.update_xaxes(title_text="epoch", row=1, col=1)
        fig.update_xaxes(title_text="β_i", type="log", row=1, col=2)
        fig.update_yaxes(type="log", row=1, col=2)
        fig.update_layout(title="FRE-RNN trained with equilibrium propagation (digits)", height=700)
        return fig


def assemble(config: EPRunConfig, seeds: list[dict], betas: list[dict], depth: list[dict]) -> EPResult:
    """An :class:`EPResult` from the outputs of :func:`run_seed`, :func:`run_beta` and :func:`run_depth` (in the
    order of ``config.seeds``, ``config.betas`` and ``config.depth_seeds``)."""
    from interp.configs import config_to_dict

    return EPResult(
        seeds=[int(s) for s in config.seeds],
        accuracy={m: [float(o[m]) for o in seeds] for m in ("ep", "bp")},
        curves={m: np.stack([np.asarray(o[f"{m}_curve"], dtype=np.float64) for o in seeds]) for m in ("ep", "bp")},
        betas=[float(b["beta"]) for b in betas], convergence_steps=[float(b["steps"]) for b in betas],
        spectral_radius=[float(b["radius"]) for b in betas], beta_accuracy=[float(b["accuracy"]) for b in betas],
        alignment={k: float(v) for k, v in seeds[0]["alignment"].items()}, depth_layers=config.depth_layers,
        depth_skips=[list(p) for p in config.skips()], depth_seeds=[int(s) for s in config.depth_seeds],
        depth_accuracy={k: [float(o[k]) for o in depth] for k in ("no_skip", "skip")}, config=config_to_dict(config))


def experiment(config: EPRunConfig | None = None) -> EPResult:
    """Run the four validations in one process (``interp reproduce equilibrium_propagation`` runs the same
    units as stored, resumable stages)."""
    config = config or EPRunConfig()
    seeds = [run_seed(config, s) for s in progress(config.seeds, desc="EP vs BP seeds", total=len(config.seeds))]
    betas = [run_beta(config, b) for b in progress(config.betas, desc="beta sweep", total=len(config.betas))]
    depth = [run_depth(config, s) for s in progress(config.depth_seeds, desc=f"depth {config.depth_layers} seeds",
                                                    total=len(config.depth_seeds))]
    return assemble(config, seeds, betas, depth)
