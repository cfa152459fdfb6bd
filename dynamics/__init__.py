"""Dynamics: analyses across depth and across training time.

ViT block-recurrence (Raptor), POLCA loss decomposition and gradient-component influence on features.
"""

from .influence import (GradientDecomposition, decompose_gradient, myopic_attention,  # noqa: F401
                        register_myopic_attention, stop_gradient_at)
