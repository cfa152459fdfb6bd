"""Reproduction of "Toward Practical Equilibrium Propagation" (Liu & Chen, ICLR 2026):
``interp reproduce equilibrium_propagation``. The method is :mod:`interp.models.equilibrium_propagation`."""
from .experiment import EPResult, EPRunConfig, assemble, experiment, run_beta, run_depth, run_seed
from .recipe import RECIPE, EquilibriumPropagationRecipe

__all__ = ["EPResult", "EPRunConfig", "EquilibriumPropagationRecipe", "RECIPE", "assemble", "experiment", "run_beta",
           "run_depth", "run_seed"]
