"""Reproduction of "How to Square Tensor Networks and Circuits Without Squaring Them" (Loconte, Javaloy & Vergari,
ICLR 2026): ``interp reproduce squared_circuits``. The method is :mod:`interp.models.squared_circuits`."""
from .experiment import (ExactnessResult, LearningResult, SquaredCircuitsConfig, SquaredCircuitsResult,
                         exactness_experiment, experiment, learning_experiment, marginal_errors, quantize_digits,
                         step_time_sweep, train_tree)
from .recipe import RECIPE, SquaredCircuitsRecipe

__all__ = ["RECIPE", "ExactnessResult", "LearningResult", "SquaredCircuitsConfig", "SquaredCircuitsRecipe",
           "SquaredCircuitsResult", "exactness_experiment", "experiment", "learning_experiment", "marginal_errors",
           "quantize_digits", "step_time_sweep", "train_tree"]
