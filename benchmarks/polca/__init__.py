"""Reproduction of "Hidden Breakthroughs in Language Model Training" (Kangaslahti, Rosenfeld & Saphra, ICLR 2026):
``interp reproduce polca``. The method (POLCA, Algorithm 1, clustering, breakthroughs) is
:mod:`interp.dynamics.polca`."""
from .addition import AdditionConfig, addition_carry_summary, addition_token_loss, run_addition, train_addition
from .recipe import RECIPE, PolcaRecipe

__all__ = ["AdditionConfig", "PolcaRecipe", "RECIPE", "addition_carry_summary", "addition_token_loss",
           "run_addition", "train_addition"]
