"""Steering: methods that write directions into activations.

A :class:`SteeringMethod` fits :class:`SteeringVector` objects that turn themselves into capture-layer
interventions. Built-in methods (difference-in-means, directional ablation, RepIt) and third-party
methods are declared the same way, in the entry-point group ``interp.steering``, and share one registry.
"""
from .base import (
    ENTRY_POINT_GROUP,
    OPERATIONS,
    AffineAblate,
    AuditFit,
    SteeringData,
    SteeringMethod,
    SteeringVector,
    available,
    get,
    register,
    reload_entry_points,
    spread,
    unregister,
)
from .activations import collect, last_token, mean_difference
from .diff_in_means import DiffInMeans, DiffInMeansConfig
from .ablation import ABLATION_HOOKS, DirectionalAblation, DirectionalAblationConfig, ablation_vector, orthogonalize_weights
from . import behaviour, refusal
from .refusal import default_data
from .behaviour import LinearProbe, evaluate_behaviour, token_kl_view
from . import repit
from .repit import RepIt, RepItConfig, isolate, localize

__all__ = [
    "ENTRY_POINT_GROUP", "OPERATIONS", "AffineAblate", "AuditFit", "SteeringData", "SteeringMethod", "SteeringVector",
    "available", "default_data", "get", "register", "reload_entry_points", "spread", "unregister", "collect", "last_token", "mean_difference",
    "DiffInMeans", "DiffInMeansConfig", "ABLATION_HOOKS", "DirectionalAblation", "DirectionalAblationConfig",
    "ablation_vector", "orthogonalize_weights", "behaviour", "LinearProbe", "evaluate_behaviour", "token_kl_view", "refusal", "repit", "RepIt", "RepItConfig", "isolate", "localize",
]
