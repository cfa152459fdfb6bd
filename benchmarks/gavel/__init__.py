"""Reproduction of "GAVEL: Towards Rule-Based Safety Through Activation Monitoring" (Rozenfeld et al., ICLR 2026):
``interp reproduce gavel``. The method is :mod:`interp.probes.gavel`; here: the digest's CE world
(:mod:`.ce_world`, zoo entry ``gavel-ce-world``), the SmolLM2 validations (:mod:`.validation`, :mod:`.smollm2`)
and the recipe."""
from .recipe import RECIPE, GavelConfig, GavelRecipe

__all__ = ["RECIPE", "GavelConfig", "GavelRecipe"]
