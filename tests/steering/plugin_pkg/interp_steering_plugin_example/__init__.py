"""An example third-party steering method: the top principal direction of paired activation differences.

Representation-engineering style: pair the i-th positive with the i-th negative prompt, take the
differences of their activations at one layer and position, and steer along their first principal
component (sign chosen to point from negative to positive). Registered through the entry-point group
``interp.steering`` in this package's ``pyproject.toml``; nothing in interp imports it.
"""
from dataclasses import dataclass

import torch

from interp.steering import SteeringMethod, SteeringVector
from interp.steering.activations import collect


class PCAVector(SteeringVector):
    """A vector class of its own, so that loading must find it through the registry."""

    @property
    def explained(self) -> float:
        return float(self.metadata["explained"])


@dataclass
class PCAConfig:
    layer: int = 0
    position: int = -1
    scale: float = 1.0


class PCASteering(SteeringMethod):
    name = "example_pca"
    config_class = PCAConfig
    vector_class = PCAVector

    def fit(self, model, data, val=None):
        c = self.config
        hook = f"blocks.{c.layer}.hook_resid_pre"
        pos = collect(model, data.positive, [hook], [c.position])[:, 0, 0]
        neg = collect(model, data.negative, [hook], [c.position])[:, 0, 0]
        n = min(len(pos), len(neg))
        diffs = pos[:n] - neg[:n]
        centred = diffs - diffs.mean(0)
        _, s, vh = torch.linalg.svd(centred, full_matrices=False)
        direction = vh[0] if float(vh[0] @ diffs.mean(0)) >= 0 else -vh[0]
        scale_to = float(diffs.mean(0).norm())
        return PCAVector(method=self.name, operation="add", hooks=(hook,), direction=direction * scale_to,
                         scale=c.scale, metadata={"layer": c.layer, "explained": float(s[0] ** 2 / (s ** 2).sum())})
