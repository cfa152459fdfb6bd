"""Reproduction of "Revisiting Confidence Calibration for Misclassification Detection in VLMs" (ICLR 2026):
``interp reproduce misd``. The method (Ψ, LMN, surrogate loss, metrics) is :mod:`interp.models.misd`; the stand-in
VLMs are :mod:`.toy` (digits MLP) and :mod:`.zero_shot` (DINOv2 + MiniLM)."""
from .recipe import RECIPE, MisDRecipe, MisDRunConfig, run_zero_shot
from .toy import MisDToyResult, ToyClassifier, ToyMisDConfig, run_toy_seed, toy_experiment, train_toy_classifier

__all__ = ["MisDRecipe", "MisDRunConfig", "MisDToyResult", "RECIPE", "ToyClassifier", "ToyMisDConfig", "run_toy_seed",
           "run_zero_shot", "toy_experiment", "train_toy_classifier"]
