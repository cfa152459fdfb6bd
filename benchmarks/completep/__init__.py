"""Reproduction of "Completed Hyperparameter Transfer across Modules, Width, Depth, Batch and Duration"
(Complete(d)P; Mlodozeniec et al., ICLR 2026): ``interp reproduce completep``. The method is
:mod:`interp.models.completep`."""
from .experiments import (STAGES, CompletePConfig, CompletePResult, batch_transfer, coordinate_check,
                          duration_transfer, experiment, grid_argmin, lr_grid, lr_transfer, per_module_transfer,
                          refined_optimum)
from .recipe import RECIPE, CompletePRecipe

__all__ = ["RECIPE", "STAGES", "CompletePConfig", "CompletePRecipe", "CompletePResult", "batch_transfer",
           "coordinate_check", "duration_transfer", "experiment", "grid_argmin", "lr_grid", "lr_transfer",
           "per_module_transfer", "refined_optimum"]
