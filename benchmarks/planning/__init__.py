"""Reproduction of "Internal Planning in Language Models: Characterizing Horizon and Branch Awareness"
(Ustaomeroglu, Askin et al., ICLR 2026): ``interp reproduce planning``. The method is
:mod:`interp.probes.planning`; this package holds the paper's tasks (:mod:`.tasks`), the toy models trained on them
(:mod:`.zoo`, the ``zoo:planning-*`` entries through an entry point), the estimator sanity check and the documented
run settings (:mod:`.validation`) and the recipe."""
from .recipe import RECIPE, PlanningRecipe, PlanningReproConfig

__all__ = ["RECIPE", "PlanningRecipe", "PlanningReproConfig"]
