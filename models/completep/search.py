"""Trust-region random search over per-module hyperparameter multipliers (Complete(d)P's search at the proxy)."""
from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["trust_region_search"]


def trust_region_search(evaluate: Callable[[np.ndarray], np.ndarray], dim: int, rounds: int, samples: int,
                        radius: float, max_radius: float, rng: np.random.Generator,
                        center: np.ndarray | None = None) -> list[dict]:
    """Trust-region random search (minimisation) in log2 multiplier space.

    Round ``r`` draws ``samples`` points uniformly in the box ``center +- radius`` (round 0 evaluates the
    center itself as its first point, which is the first incumbent) and scores them with one call
    ``evaluate(points [samples, dim]) -> losses [samples]`` (non-finite = diverged). If the round's best beats
    the incumbent, it becomes the new center and the radius grows x1.5 (capped at ``max_radius``); otherwise
    the radius halves.
    The paper uses trust-region random search because the landscape has divergence cliffs; its radius,
    sample count and acceptance rule are not given, these are implementation choices.
    Returns one dict per round: ``points``, ``losses``, ``center``, ``radius``, ``best_point``, ``best_loss``.
    """
    center = np.zeros(dim) if center is None else np.asarray(center, dtype=float)
    best_point, best_loss = center.copy(), np.inf
    history = []
    for r in range(rounds):
        pts = center + rng.uniform(-radius, radius, size=(samples, dim))
        if r == 0:
            pts[0] = center
        losses = np.asarray(evaluate(pts), dtype=float)
        losses = np.where(np.isfinite(losses), losses, np.inf)
        if r == 0:
            best_loss = float(losses[0])  # the incumbent is the center itself
        i = int(np.argmin(losses))
        improved = losses[i] < best_loss
        history.append({"points": pts.tolist(), "losses": [None if not np.isfinite(v) else float(v) for v in losses],
                        "center": center.tolist(), "radius": float(radius)})
        if improved:
            best_point, best_loss = pts[i].copy(), float(losses[i])
            center = best_point
            radius = min(radius * 1.5, max_radius)
        else:
            radius = radius / 2.0
        history[-1].update(best_point=best_point.tolist(), best_loss=best_loss)
    return history
