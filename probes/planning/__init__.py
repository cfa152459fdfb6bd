"""Internal planning in language models (Ustaomeroglu, Askin et al., ICLR 2026): VQ-VAE summary codes and MI.

Sets of hidden states (:mod:`.states`: which (layer, position) states, harvested through :mod:`interp`) are
compressed to discrete codes with a set VQ-VAE (:mod:`.vqvae`) and compared with plug-in mutual information
(:mod:`.mi`). The three analyses (:mod:`.analyses`) ask how far ahead a model plans (:func:`horizon_curve`),
whether it keeps the path it did not take (:func:`branch_awareness`), and where in depth and position
decision information lives (:func:`block_layer_map`). :mod:`.tasks` holds the task protocol any user task
follows and the built-in real-text task (:class:`TextContinuation`) that the analyses use when given none. The paper's task families (goal-token horizon toy, context-free grammar, path finding), the toy models
trained on them (``zoo:planning-*``), the estimator sanity check and the validation runs are the reproduction,
:mod:`interp.benchmarks.planning` (``interp reproduce planning``).
"""
from .mi import (MIEstimate, conditional_mutual_information, entropy, miller_madow_bias, mutual_information,
                 normalized_mi, null_corrected_mi, relabel, shuffled_null)
from .states import SetSpec, StateSets, final_layer, harvest_sets, prefix_layers
from .vqvae import SetVQVAE, TrainConfig, VQVAEConfig, train_vqvae
from .analyses import (BlockMapConfig, BlockMapResult, BranchConfig, BranchResult, CodeConfig, HorizonConfig,
                       HorizonResult, block_layer_map, block_map_from_sets, branch_awareness, fit_codes,
                       horizon_curve, mi_with_null)
from .tasks import PlanningExample, PlanningTask, TextContinuation

__all__ = ["mutual_information", "conditional_mutual_information", "entropy", "shuffled_null", "null_corrected_mi",
           "normalized_mi", "miller_madow_bias", "MIEstimate", "relabel",
           "StateSets", "SetSpec", "harvest_sets", "final_layer", "prefix_layers",
           "SetVQVAE", "VQVAEConfig", "TrainConfig", "train_vqvae",
           "CodeConfig", "HorizonConfig", "BranchConfig", "BlockMapConfig", "HorizonResult", "BranchResult",
           "BlockMapResult", "horizon_curve", "branch_awareness", "block_layer_map", "block_map_from_sets",
           "fit_codes", "mi_with_null",
           "PlanningExample", "PlanningTask", "TextContinuation"]
