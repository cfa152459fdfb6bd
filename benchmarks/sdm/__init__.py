"""Reproduction of "Matched Data, Better Models" (SDM, ICLR 2026): ``interp reproduce sdm``. The method is
:mod:`interp.models.sdm`; the real-embedding pools are :mod:`interp.benchmarks.sdm.pools` (imported on use:
they need the MisD zero-shot feature extractors)."""
from .experiment import (DigitsPool, SDMConfig, SDMResult, assemble, experiment, make_digits_pool, make_pool,
                         objective_checks, run_seed)
from .recipe import RECIPE, SDMRecipe

__all__ = ["DigitsPool", "RECIPE", "SDMConfig", "SDMRecipe", "SDMResult", "assemble", "experiment",
           "make_digits_pool", "make_pool", "objective_checks", "run_seed"]
