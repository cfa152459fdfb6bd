"""Reproduction of "Reverse Distillation: Consistently Scaling Protein Language Model Representations" (Catrina et
al., ICLR 2026): ``interp reproduce reverse_distillation``. The method is :mod:`interp.models.reverse_distillation`."""
from .experiment import PAPER_PROTEINGYM, ProteinRDConfig, ProteinRDResult, protein_experiment
from .recipe import RECIPE, ReverseDistillationRecipe, ReverseDistillationRun
from .synthetic import SyntheticConfig, SyntheticFamily, SyntheticResult, synthetic_experiment

__all__ = ["PAPER_PROTEINGYM", "RECIPE", "ProteinRDConfig", "ProteinRDResult", "ReverseDistillationRecipe",
           "ReverseDistillationRun", "SyntheticConfig", "SyntheticFamily", "SyntheticResult", "protein_experiment",
           "synthetic_experiment"]
