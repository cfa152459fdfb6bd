"""Reproduction of "Towards Quantifying Long-Range Interactions in Graph Machine Learning" (City-Networks; Liang et
al., ICLR 2026): ``interp reproduce city_networks``. The method is :mod:`interp.models.city_networks`."""
from .experiment import (PAPER_ACCURACY_L16, PAPER_R_GCN, CityValidationResult, SweepSpec, ValidationConfig,
                         decay_rate, road_validation, synthetic_validation)
from .recipe import RECIPE, CityNetworksRecipe, CityNetworksRun

__all__ = ["PAPER_ACCURACY_L16", "PAPER_R_GCN", "RECIPE", "CityNetworksRecipe", "CityNetworksRun",
           "CityValidationResult", "SweepSpec", "ValidationConfig", "decay_rate", "road_validation",
           "synthetic_validation"]
