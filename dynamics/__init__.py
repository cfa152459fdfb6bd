"""Dynamics: analyses across depth and across training time.

ViT block-recurrence (Raptor), POLCA loss decomposition and gradient-component influence on features.
"""

from .influence import (GradientDecomposition, decompose_gradient, default_tokens, myopic_attention,  # noqa: F401
                        register_myopic_attention, stop_gradient_at)
from .influence import (FeatureInfluence, QProxy, attention_implementation, bootstrap_ci, q_proxy,  # noqa: F401
                        ridge_fit, ridge_pearson, ridge_probe, train_with_influence)
from .untied import PositionSplit, second_network_params, untie_gpt2  # noqa: F401
from .polca import (CheckpointRecorder, ParamSpace, PolcaResult, analyse, breakthrough_step, build_basis,  # noqa: F401
                    cluster_direction, drop_oscillating, exact_losses, first_order, homogeneity, label_fraction,
                    lanczos_top, load_checkpoints, plateau_step, polca_trajectories, second_order, span_diagnostics,
                    span_interval)
from .tasks import TaskBatch, addition, addition_problems, conditioned_majority, majority  # noqa: F401
