"""Difference-in-means activation addition (ActAdd / "mean-difference steering").

``r = mean_{x in positive} h_l(x)[p] - mean_{x in negative} h_l(x)[p]``, the difference of the mean
residual-stream activations at one layer ``l`` and one prompt position ``p`` (default: the last prompt token,
the input of block ``l``, TL ``blocks.{l}.hook_resid_pre``, as in Arditi et al. 2024). Applying it adds
``scale * r`` at that hook, at every position of the prompt and of each generated token (the position rule
can be narrowed with ``apply_positions``); ``scale < 0`` steers away from the behaviour.
"""
from __future__ import annotations

from dataclasses import dataclass

from .activations import collect, mean_difference
from .base import SteeringData, SteeringMethod, SteeringVector
from .refusal import default_data


@dataclass
class DiffInMeansConfig:
    """Options of :class:`DiffInMeans`.

    ``layer=None`` uses the middle layer ``n_layers // 2`` (a common default for activation addition; pick
    a layer with :class:`steering.repit.RepIt`-style selection when it matters). ``position`` is the prompt
    position the means are taken at (``-1``: the last prompt token). ``apply_positions=None`` adds at every
    position.
    """

    layer: int | None = None
    position: int = -1
    hook: str = "hook_resid_pre"
    scale: float = 1.0
    apply_positions: tuple[int, ...] | None = None
    batch_size: int = 16


def fit_direction(model, data: SteeringData, layer: int, position: int, hook: str, batch_size: int):
    """``(r, positive_mean, negative_mean)`` at ``blocks.{layer}.{hook}``, position ``position`` (each ``[d]``)."""
    if not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer must be in 0..{model.cfg.n_layers - 1}, got {layer}")
    name = f"blocks.{layer}.{hook}"
    pos = collect(model, data.positive, [name], [position], batch_size, desc="positive")[:, 0, 0]
    neg = collect(model, data.negative, [name], [position], batch_size, desc="negative")[:, 0, 0]
    return mean_difference(pos, neg), pos.mean(0), neg.mean(0)


class DiffInMeans(SteeringMethod):
    """Activation addition with the difference-in-means vector of a contrast set."""

    name = "diff_in_means"
    config_class = DiffInMeansConfig

    def fit(self, model, data: SteeringData | None = None, val: SteeringData | None = None) -> SteeringVector:
        """Fit on ``data`` (``None``: the built-in harmful vs harmless set, :func:`steering.refusal.default_data`);
        ``val`` is unused."""
        c = self.config
        data = default_data(model) if data is None else data
        layer = model.cfg.n_layers // 2 if c.layer is None else int(c.layer)
        r, mu_pos, mu_neg = fit_direction(model, data, layer, c.position, c.hook, c.batch_size)
        return SteeringVector(
            method=self.name, operation="add", hooks=(f"blocks.{layer}.{c.hook}",), direction=r,
            positions=c.apply_positions, scale=c.scale,
            tensors={"positive_mean": mu_pos, "negative_mean": mu_neg},
            metadata={"layer": layer, "position": c.position, "hook": c.hook,
                      "n_positive": len(data.positive), "n_negative": len(data.negative)})
