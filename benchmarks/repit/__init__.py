"""Reproduction of "RepIt: Representing Isolated Targets to Steer Language Models" (Siu et al., ICLR 2026):
``interp reproduce repit``. The method is :mod:`interp.steering.repit` (held-out refusal evaluation:
:func:`interp.steering.refusal.evaluate_refusal`); this package holds the experiment, the toy category-refusal
language (:mod:`.toy_data`) and its model (:mod:`.toy_model`, ``zoo:toy-refusal`` through an entry point)."""
from .experiment import CONDITIONS, MODES, RepItExperimentConfig, RepItValidation, experiment, toy_config
from .recipe import RECIPE, RepItRecipe, RepItReproConfig

__all__ = ["CONDITIONS", "MODES", "RECIPE", "RepItExperimentConfig", "RepItRecipe", "RepItReproConfig",
           "RepItValidation", "experiment", "toy_config"]
