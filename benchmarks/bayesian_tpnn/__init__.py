"""Reproduction of "Bayesian Neural Networks for Functional ANOVA Model" (Bayesian-TPNN, ICLR 2026):
``interp reproduce bayesian_tpnn``. The method is :mod:`interp.models.bayesian_tpnn`."""
from .experiments import (
    ABLATION_METRICS, SYNTHETIC_TRUE_COMPONENTS, BayesianTPNNClassificationResult, BayesianTPNNResult, _hgb_rmse,
    ablation_means, classification_experiment, experiment, selection_auroc, stepwise_ablation, synthetic_anova,
)
from .recipe import RECIPE, BayesianTPNNRecipe, BayesianTPNNRunConfig, merge_ablations

__all__ = ["ABLATION_METRICS", "BayesianTPNNClassificationResult", "BayesianTPNNRecipe", "BayesianTPNNResult",
           "BayesianTPNNRunConfig", "RECIPE", "SYNTHETIC_TRUE_COMPONENTS", "_hgb_rmse", "ablation_means",
           "classification_experiment", "experiment", "merge_ablations", "selection_auroc", "stepwise_ablation",
           "synthetic_anova"]
