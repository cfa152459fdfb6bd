"""Reproduction of "Risk Phase Transitions in Spiked Regression" (Li & Sonthalia, ICLR 2026):
``interp reproduce spiked_regression``. The method is :mod:`interp.models.spiked_regression`."""
from .experiment import SpikedRegressionConfig, SpikedRegressionResult, experiment
from .recipe import RECIPE, SpikedRegressionRecipe

__all__ = ["RECIPE", "SpikedRegressionConfig", "SpikedRegressionRecipe", "SpikedRegressionResult", "experiment"]
