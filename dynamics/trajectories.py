"""Dynamical metrics of token trajectories across depth (Block-Recurrent Dynamics in ViTs, digest §7).

A token's trajectory is its residual stream ``x_0 .. x_L`` (``x_0`` the block input, ``x_l`` block ``l``'s output);
on the sphere it is ``x̂_l = x_l / ‖x_l‖``. Metrics (paper definitions, via the digest):

* convergence ``γ_l = <x̂_l, x̂_L>`` (so ``γ_L = 1``);
* angular speed ``s_l = arccos <x̂_{l+1}, x̂_l>`` in ``[0, π]`` (the speed of block ``l``, 0-based);
* stable rank of the update field ``ΔX_l = X_{l+1} - X_l`` (tokens x d, per image): ``‖ΔX‖_F² / ‖ΔX‖_2²``;
* patch coherence: mean cosine between each patch token and the mean patch direction;
* speed jumps at phase boundaries: ``|s_b - s_{b-1}|`` at the first block ``b`` of every phase, against the same
  quantity inside phases;
* class basins (our operationalisation; the digest leaves the protocol open): per layer, the fraction of images
  whose CLS direction is closer (cosine) to its own class's mean *final* direction than to any other class's;
* perturbation of the basins (our protocol, UNCERTAIN in the digest): add Gaussian noise of relative norm
  ``sigma`` to every token of the block output at layer ``l`` (through ``model.intervene``) and compare the angle
  the perturbation makes at ``l`` with the angle between the perturbed and clean final directions; a ratio
  below 1 means the dynamics pull the trajectory back (self-correction), and ``basin_kept`` is the fraction of
  images whose final CLS stays in the same class basin.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from interp.progress import progress
from interp.results import Result

__all__ = ["directions", "convergence", "angular_speed", "stable_rank", "update_stable_rank", "patch_coherence",
           "speed_jumps", "class_basin_accuracy", "token_groups", "Trajectories", "trajectory_metrics",
           "BasinPerturbation", "basin_perturbation", "residual_stream"]

def _images(model, images: torch.Tensor | None) -> torch.Tensor:
    from interp.data import digits_sample
    return digits_sample(model)[0] if images is None else images


def directions(x: torch.Tensor) -> torch.Tensor:
    """``x / ‖x‖`` along the last dimension (zero vectors stay zero)."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def convergence(stream: torch.Tensor) -> torch.Tensor:
    """``γ_l = <x̂_l, x̂_L>`` for ``stream [L + 1, ..., d]`` -> ``[L + 1, ...]`` (last entry 1)."""
    u = directions(stream.double())
    return (u * u[-1:]).sum(-1).float()


def angular_speed(stream: torch.Tensor) -> torch.Tensor:
    """``s_l = arccos <x̂_{l+1}, x̂_l>`` for ``stream [L + 1, ..., d]`` -> ``[L, ...]``, in ``[0, π]``."""
    u = directions(stream.double())
    return torch.arccos((u[1:] * u[:-1]).sum(-1).clamp(-1, 1)).float()


def stable_rank(m: torch.Tensor) -> torch.Tensor:
    """``‖M‖_F² / ‖M‖_2²`` of matrices ``[..., rows, cols]`` -> ``[...]`` (in ``[1, min(rows, cols)]``)."""
    s = torch.linalg.svdvals(m.double())
    return ((s ** 2).sum(-1) / (s[..., 0] ** 2).clamp_min(1e-300)).float()


def update_stable_rank(stream: torch.Tensor) -> torch.Tensor:
    """Stable rank of ``ΔX_l = X_{l+1} - X_l`` per image for ``stream [L + 1, batch, tokens, d]`` -> ``[L, batch]``."""
    return stable_rank(stream[1:] - stream[:-1])


def patch_coherence(stream: torch.Tensor, n_registers: int = 0) -> torch.Tensor:
    """Mean cosine of each patch token to the mean patch direction: ``[L + 1, batch, tokens, d] -> [L + 1, batch]``."""
    patches = directions(stream[..., 1 + n_registers:, :].double())
    mean_dir = directions(patches.mean(-2, keepdim=True))
    return (patches * mean_dir).sum(-1).mean(-1).float()


def speed_jumps(speed: torch.Tensor, parts: list[list[int]]) -> dict[str, float]:
    """Speed changes at phase boundaries vs inside phases.

    ``speed [L]``: mean angular speed of block ``l`` (0-based; ``s_l`` is the angle of block ``l``'s update);
    ``parts``: contiguous phases of 0-based block indices. Returns the mean ``|s_b - s_{b-1}|`` over the first
    blocks ``b`` of phases 2.., the same mean over all other ``b >= 1``, and their ratio (> 1: speed jumps at
    the boundaries).
    """
    s = torch.as_tensor(speed, dtype=torch.float64)
    if s.dim() != 1:
        raise ValueError(f"speed must be [L] (average over images first); got {tuple(s.shape)}")
    starts = sorted(min(p) for p in parts)[1:]
    if any(not 1 <= b < len(s) for b in starts):
        raise ValueError(f"phase starts {starts} must lie in [1, {len(s) - 1}]")
    jumps = (s[1:] - s[:-1]).abs()                     # jumps[b - 1] = |s_b - s_{b-1}|
    at = torch.zeros(len(jumps), dtype=torch.bool)
    at[[b - 1 for b in starts]] = True
    inside = float(jumps[~at].mean()) if (~at).any() else float("nan")
    boundary = float(jumps[at].mean()) if at.any() else float("nan")
    return {"boundary_jump": boundary, "inside_jump": inside, "ratio": boundary / inside if inside > 0 else float("nan")}


def class_basin_accuracy(cls_stream: torch.Tensor, labels) -> torch.Tensor:
    """Per layer, the fraction of images whose CLS direction is nearest (cosine) to the mean final CLS direction
    of its own class. ``cls_stream [L + 1, batch, d]`` -> ``[L + 1]``."""
    y = torch.as_tensor(np.asarray(labels))
    classes = torch.unique(y)
    if len(classes) < 2:
        raise ValueError("class basins need at least two classes among the labels")
    u = directions(cls_stream.double())
    centroids = directions(torch.stack([u[-1, y == c].mean(0) for c in classes]))   # [C, d]
    nearest = classes[(u @ centroids.T).argmax(-1)]                                  # [L + 1, batch]
    return (nearest == y).double().mean(-1).float()


def token_groups(n_tokens: int, n_registers: int = 0) -> dict[str, slice]:
    """Positions of the CLS token, the registers and the patches."""
    groups = {"cls": slice(0, 1), "patches": slice(1 + n_registers, n_tokens)}
    if n_registers:
        groups["registers"] = slice(1, 1 + n_registers)
    return groups


@torch.no_grad()
def residual_stream(model, images: torch.Tensor | None = None, batch_size: int = 32) -> torch.Tensor:
    """``[L + 1, N, tokens, d]``: ``blocks.0.hook_resid_pre`` and every ``blocks.{l}.hook_resid_post``
    (``images=None``: the built-in digits, :func:`interp.data.digits_sample`: 200 real digits at 56 px)."""
    images = _images(model, images)
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise ValueError(f"images must be a float tensor [N, C, H, W]; got {getattr(images, 'shape', type(images))}")
    names = ["blocks.0.hook_resid_pre"] + model.hook_names("blocks.*.hook_resid_post")
    out = []
    for start in progress(range(0, images.shape[0], batch_size), desc="residual stream"):
        _, cache = model.run_with_cache(images[start:start + batch_size], names=names)
        out.append(torch.stack([cache[n] for n in names]).float())
    return torch.cat(out, dim=1)


@dataclass
class Trajectories(Result):
    """Depth profiles per token type (``cls``, ``registers`` where present, ``patches``), averaged over images
    (and tokens of the type): ``gamma [L + 1]``, ``speed [L]``, ``update_stable_rank [L]`` (all tokens of an
    image; also ``patch_update_stable_rank``), ``patch_coherence [L + 1]``, ``basin_accuracy [L + 1]`` (when
    labels were given), ``speed_jumps`` (when phases were given)."""

    gamma: dict[str, torch.Tensor]
    speed: dict[str, torch.Tensor]
    update_stable_rank: torch.Tensor
    patch_update_stable_rank: torch.Tensor
    patch_coherence: torch.Tensor
    basin_accuracy: torch.Tensor | None = None
    phases: list[list[int]] | None = None
    speed_jumps: dict[str, dict[str, float]] = field(default_factory=dict)
    n_images: int = 0
    kind = "dynamics.trajectories"

    def to_frame(self):
        import pandas as pd
        rows = []
        L = len(self.update_stable_rank)
        for l in range(L + 1):
            row = {"layer": l, "patch_coherence": float(self.patch_coherence[l])}
            for g in self.gamma:
                row[f"gamma_{g}"] = float(self.gamma[g][l])
                row[f"speed_{g}"] = float(self.speed[g][l]) if l < L else np.nan
            row["update_stable_rank"] = float(self.update_stable_rank[l]) if l < L else np.nan
            row["patch_update_stable_rank"] = float(self.patch_update_stable_rank[l]) if l < L else np.nan
            if self.basin_accuracy is not None:
                row["basin_accuracy"] = float(self.basin_accuracy[l])
            rows.append(row)
        return pd.DataFrame(rows)

    def figure(self):
        """Four panels against depth: γ, angular speed (per token type, phase boundaries dashed), stable rank of
        the update field, patch coherence and basin accuracy."""
        from plotly.subplots import make_subplots
        import plotly.graph_objects as go
        fig = make_subplots(rows=2, cols=2, subplot_titles=("γ_l = <x̂_l, x̂_L>", "angular speed s_l (rad)",
                                                            "stable rank of ΔX_l", "patch coherence / basin acc."))
        for g in self.gamma:
            fig.add_trace(go.Scatter(y=self.gamma[g].tolist(), name=f"γ {g}", mode="lines+markers"), 1, 1)
            fig.add_trace(go.Scatter(x=[l + 0.5 for l in range(len(self.speed[g]))], y=self.speed[g].tolist(),
                                     name=f"s {g}", mode="lines+markers"), 1, 2)
        fig.add_trace(go.Scatter(y=self.update_stable_rank.tolist(), name="all tokens", mode="lines+markers"), 2, 1)
        fig.add_trace(go.Scatter(y=self.patch_update_stable_rank.tolist(), name="patches", mode="lines+markers"), 2, 1)
        fig.add_trace(go.Scatter(y=self.patch_coherence.tolist(), name="patch coherence", mode="lines+markers"), 2, 2)
        if self.basin_accuracy is not None:
            fig.add_trace(go.Scatter(y=self.basin_accuracy.tolist(), name="basin accuracy", mode="lines+markers"), 2, 2)
        for p in (self.phases or [])[1:]:
            fig.add_vline(x=min(p), line_dash="dash", line_color="grey", row=1, col=2)
        return fig.update_layout(title=f"Token dynamics over depth ({self.n_images} images)", height=700)


def trajectory_metrics(model=None, images: torch.Tensor | None = None, stream: torch.Tensor | None = None,
                       n_registers: int = 0, labels=None, phases: list[list[int]] | None = None,
                       batch_size: int = 32) -> Trajectories:
    """All depth profiles of a vision transformer's tokens (see the module docstring).

    Give ``model`` and ``images [N, C, H, W]`` (captured through the capture layer) or a precomputed
    ``stream [L + 1, N, tokens, d]``. ``labels [N]`` adds the class-basin accuracy; ``phases`` (contiguous,
    0-based block indices) adds the speed jumps at the phase boundaries per token type. ``model`` alone runs on
    the built-in digits (:func:`interp.data.digits_sample`: 200 real digits at 56 px) and their labels (unless ``labels`` is given).
    """
    if stream is None:
        if model is None:
            raise ValueError("give model and images (images=None: the built-in digits), or a precomputed stream")
        if images is None:
            from interp.data import digits_sample
            images, default_labels = digits_sample(model)
            labels = default_labels if labels is None else labels
        stream = residual_stream(model, images, batch_size)
    if stream.dim() != 4:
        raise ValueError(f"stream must be [L + 1, N, tokens, d]; got {tuple(stream.shape)}")
    groups = token_groups(stream.shape[2], n_registers)
    gamma, speed, jumps = {}, {}, {}
    for g, sl in groups.items():
        part = stream[:, :, sl]
        gamma[g] = convergence(part).mean(dim=(1, 2))
        speed[g] = angular_speed(part).mean(dim=(1, 2))
        if phases:
            jumps[g] = speed_jumps(speed[g], phases)
    basins = class_basin_accuracy(stream[:, :, 0], labels) if labels is not None else None
    return Trajectories(gamma=gamma, speed=speed, update_stable_rank=update_stable_rank(stream).mean(1),
                        patch_update_stable_rank=update_stable_rank(stream[:, :, groups["patches"]]).mean(1),
                        patch_coherence=patch_coherence(stream, n_registers).mean(1), basin_accuracy=basins,
                        phases=phases, speed_jumps=jumps, n_images=stream.shape[1])


@dataclass
class BasinPerturbation(Result):
    """Per perturbed layer: the mean angle of the perturbation at that layer (CLS), the mean angle it leaves in
    the final CLS direction, their ratio, and the fraction of images whose final CLS keeps its class basin."""

    layers: list[int]
    sigma: float
    angle_at_layer: torch.Tensor
    angle_final: torch.Tensor
    basin_kept: torch.Tensor | None = None
    kind = "dynamics.basin_perturbation"

    def to_frame(self):
        import pandas as pd
        df = pd.DataFrame({"layer": self.layers, "angle_at_layer": self.angle_at_layer.numpy(),
                           "angle_final": self.angle_final.numpy(),
                           "ratio": (self.angle_final / self.angle_at_layer.clamp_min(1e-12)).numpy()})
        if self.basin_kept is not None:
            df["basin_kept"] = self.basin_kept.numpy()
        return df

    def figure(self):
        import plotly.graph_objects as go
        df = self.to_frame()
        fig = go.Figure([go.Scatter(x=df.layer, y=df.angle_at_layer, name="angle at perturbed layer"),
                         go.Scatter(x=df.layer, y=df.angle_final, name="angle of final direction")])
        return fig.update_layout(title=f"Perturbation of the angular basins (σ = {self.sigma} relative)",
                                 xaxis_title="perturbed layer", yaxis_title="CLS angle (rad)")


@torch.no_grad()
def basin_perturbation(model, images: torch.Tensor | None = None, layers: list[int] | None = None,
                       sigma: float = 0.3, labels=None, seed: int = 0) -> BasinPerturbation:
    """Perturb the block output at each layer in ``layers`` (0-based) and measure where the final CLS direction
    ends up (protocol in the module docstring). ``sigma``: noise norm relative to each token's norm.
    ``images=None``: the built-in digits and their labels (:func:`interp.data.digits_sample`: 200 real digits at 56 px; ``labels`` overrides)."""
    if images is None:
        from interp.data import digits_sample
        images, default_labels = digits_sample(model)
        labels = default_labels if labels is None else labels
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    L = model.cfg.n_layers
    layers = list(range(L - 1)) if layers is None else list(layers)
    if any(not 0 <= l < L for l in layers):
        raise ValueError(f"layers must be in [0, {L - 1}]; got {layers}")
    final = f"blocks.{L - 1}.hook_resid_post"
    names = model.hook_names("blocks.*.hook_resid_post")
    _, clean = model.run_with_cache(images, names=names)
    clean_final = directions(clean[final][:, 0].double())
    y = torch.as_tensor(np.asarray(labels)) if labels is not None else None
    if y is not None:
        classes = torch.unique(y)
        cents = directions(torch.stack([clean_final[y == c].mean(0) for c in classes]))
        clean_basin = classes[(clean_final @ cents.T).argmax(-1)]
    at, fin, kept = [], [], []
    for l in progress(layers, desc="basin perturbation"):
        g = torch.Generator().manual_seed(seed + l)
        noise = torch.randn(clean[names[l]].shape, generator=g)
        noise = noise / noise.norm(dim=-1, keepdim=True) * clean[names[l]].norm(dim=-1, keepdim=True) * sigma

        def perturb(t, ctx, noise=noise):
            return t + noise.to(t.dtype)

        with model.intervene({names[l]: perturb}):
            _, pert = model.run_with_cache(images, names=[names[l], final])
        u0 = directions(clean[names[l]][:, 0].double())
        u1 = directions(pert[names[l]][:, 0].double())
        at.append(torch.arccos((u0 * u1).sum(-1).clamp(-1, 1)).mean())
        pf = directions(pert[final][:, 0].double())
        fin.append(torch.arccos((clean_final * pf).sum(-1).clamp(-1, 1)).mean())
        if y is not None:
            kept.append((classes[(pf @ cents.T).argmax(-1)] == clean_basin).double().mean())
    return BasinPerturbation(layers=layers, sigma=sigma, angle_at_layer=torch.stack(at).float(),
                             angle_final=torch.stack(fin).float(),
                             basin_kept=torch.stack(kept).float() if kept else None)
