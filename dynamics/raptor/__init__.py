"""Block-recurrent dynamics in vision transformers (Jacobs, Fel, Hakim et al., ICLR 2026): layer phases and Raptor.

* ``layer_distances`` / ``phases``: the layer x layer similarity of block outputs and its partition into phases
  (recursive brute-force max-cut with the official split rule, or exact contiguous DP);
* ``Raptor`` / ``RaptorConfig``: k weight-tied, depth-conditioned blocks routed by layer thresholds;
* ``teacher_activations`` / ``train_raptor`` / ``evaluate_raptor``: Stage 1 (TF -> AR annealing per segment) and
  Stage 2 (end-to-end AR, cls weighting), per-layer R² (ours per feature; the official one,
  ``r2_score_official`` / ``layer_r2_official``) and linear-probe accuracy.
"""
from .model import Raptor, RaptorBlock, RaptorConfig
from .phases import (MAXCUT_RULES, LayerDistances, Phases, cut_value, distances_from_stack, dp_phases,
                     layer_distances, maxcut_phases, phases, token_summaries)
from .train import (RaptorFit, RaptorTrainConfig, RaptorTraining, evaluate_raptor, layer_r2, layer_r2_official,
                    linear_probe_accuracy, probe_features, r2_score_official, teacher_activations, train_raptor,
                    weighted_mse)

__all__ = ["MAXCUT_RULES", "LayerDistances", "Phases", "cut_value", "distances_from_stack", "dp_phases",
           "layer_distances", "maxcut_phases", "phases", "token_summaries", "Raptor", "RaptorBlock", "RaptorConfig",
           "RaptorFit", "RaptorTrainConfig", "RaptorTraining", "evaluate_raptor", "layer_r2", "layer_r2_official",
           "linear_probe_accuracy", "probe_features", "r2_score_official", "teacher_activations", "train_raptor",
           "weighted_mse"]
