"""Reproduction of "Block-Recurrent Dynamics in Vision Transformers" (Jacobs, Fel, Hakim et al., ICLR 2026):
``interp reproduce raptor``. The method (phases, Raptor, trajectories) is :mod:`interp.dynamics.raptor` and
:mod:`interp.dynamics.trajectories`; the digits images are :func:`interp.data.digits_images`."""
from .experiments import (ABLATIONS, DigitsConfig, DinoV2Config, digits_unit, dinov2_unit, fashion_mnist_images,
                          fit_run, probe_baselines, real_image_split, train_digits_teacher)
from .recipe import RECIPE, RaptorRecipe, RaptorRecipeConfig

__all__ = ["ABLATIONS", "DigitsConfig", "DinoV2Config", "RECIPE", "RaptorRecipe", "RaptorRecipeConfig", "digits_unit",
           "dinov2_unit", "fashion_mnist_images", "fit_run", "probe_baselines", "real_image_split",
           "train_digits_teacher"]
