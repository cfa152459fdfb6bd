"""Reproduction of "Robust Training of Neural Networks at Arbitrary Precision and Sparsity" (Ye et al., ICLR 2026):
``interp reproduce dequantization``. The method is :mod:`interp.models.dequantization`."""
from .experiment import (VARIANTS, DequantConfig, DequantResult, RunStats, assemble, experiment, loss_roughness,
                         run_seed, train_digits)
from .recipe import RECIPE, DequantizationRecipe

__all__ = ["RECIPE", "VARIANTS", "DequantConfig", "DequantResult", "DequantizationRecipe", "RunStats", "assemble",
           "experiment", "loss_roughness", "run_seed", "train_digits"]
