"""Reproduction of "Identifying and Evaluating Inactive Heads in Pretrained LLMs" (Sandoval-Segura et al., ICLR
2026): ``interp reproduce heads``. The method is :mod:`interp.probes.heads`."""
from .experiment import (PLANTED, ValidationConfig, ValidationResult, build_planted_llama, experiment, heldout_chunks,
                         threshold_comparison)
from .recipe import RECIPE, HeadsRecipe

__all__ = ["PLANTED", "RECIPE", "HeadsRecipe", "ValidationConfig", "ValidationResult", "build_planted_llama",
           "experiment", "heldout_chunks", "threshold_comparison"]
