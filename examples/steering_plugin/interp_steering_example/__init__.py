"""Norm-calibrated activation addition: a complete, minimal third-party steering method for ``interp``.

The direction is the difference of the mean last-token residual activations of the positive and negative
prompts, ``u = normalise(mean h+ - mean h-)`` at ``blocks.{layer}.hook_resid_pre``; it is added at that hook,
at every position of the prompt and of each generated token, rescaled so that ``scale = 1`` adds one typical
residual norm (the mean norm of all fitted activations): ``x <- x + scale * n_bar * u``. So ``scale`` means the
same on every model, whatever its residual-stream norm.

Nothing in ``interp`` imports this package: it is found through the entry point ``normed_addition`` in the
group ``interp.steering`` (``pyproject.toml``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from interp.steering import SteeringData, SteeringMethod, SteeringVector, last_token

__all__ = ["NormedAddition", "NormedAdditionConfig"]


@dataclass
class NormedAdditionConfig:
    """Options (``interp audit --set steering.<field>=VALUE`` sets them)."""

    layer: int | None = None  #: residual stream read and written (None: the middle layer)
    scale: float = 1.0  #: added norm in units of the mean residual norm at ``layer``
    batch_size: int = 16


class NormedAddition(SteeringMethod):
    """``x <- x + scale * n_bar * u`` with ``u`` the unit difference of means (see the module docstring)."""

    name = "normed_addition"
    config_class = NormedAdditionConfig

    def fit(self, model, data: SteeringData, val: SteeringData | None = None) -> SteeringVector:
        c: NormedAdditionConfig = self.config  # built by SteeringMethod.__init__ from the overrides
        layer = model.cfg.n_layers // 2 if c.layer is None else int(c.layer)
        if not 0 <= layer < model.cfg.n_layers:
            raise ValueError(f"layer {layer} is outside the model's layers 0..{model.cfg.n_layers - 1}")
        hook = f"blocks.{layer}.hook_resid_pre"
        pos = last_token(model, data.positive, hook, c.batch_size)  # [n+, d]
        neg = last_token(model, data.negative, hook, c.batch_size)  # [n-, d]
        diff = pos.mean(0) - neg.mean(0)
        if float(diff.norm()) == 0.0:
            raise ValueError("the positive and negative prompts give identical mean activations; nothing to steer")
        n_bar = float(torch.cat([pos, neg]).norm(dim=-1).mean())
        return SteeringVector(method=self.name, operation="add", hooks=(hook,), direction=diff / diff.norm() * n_bar,
                              positions=None, scale=c.scale,
                              metadata={"layer": layer, "position": -1, "mean_norm": n_bar,
                                        "n_positive": len(data.positive), "n_negative": len(data.negative)})
