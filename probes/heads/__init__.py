"""Identifying and Evaluating Inactive Heads in Pretrained LLMs (Sandoval-Segura et al., ICLR 2026).

* :func:`score_heads` computes every score function of the paper (the 12 of the paper plus the code's
  ``LTHON (HN)`` and the appendix ``FullHeadOutput`` variants) for every input, layer and head from one
  batched forward pass; :class:`HeadScores` thresholds them the paper's way (``.inactive``: the official
  code's inverse empirical CDF and strict comparison by default, ``convention="quantile"`` optional), and gives
  ``.to_frame()``, ``.figure()`` (heatmaps with a dropdown) and ``.save()``.
* :func:`ablate_heads` (zero/mean ablation of ``hook_z``) and :func:`dynamic_zeroing` (the paper's per-input
  zeroing) return interventions for ``model.intervene``; :func:`evaluate_ablation` compares a head set with
  as many random heads, :func:`inactive_sweep` runs the paper's sweep over target fractions.
* Called without inputs, every analysis uses :func:`default_inputs` (100 real-text passages, 128 tokens).
"""
from .ablation import (AblationResult, DynamicZeroing, HeadAblation, SweepConfig, SweepResult, ZeroHeads, ablate_heads,
                       dynamic_zeroing, evaluate_ablation, head_mask, head_means, inactive_sweep, random_heads,
                       random_like)
from .scores import (BEST_SCORE, DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH, DEFAULT_N_INPUTS, EXTRA_SCORES, PADDED_QUERIES,
                     PAPER_FRACTIONS, PAPER_SCORES, SCORE_FUNCTIONS, THRESHOLD_CONVENTIONS, HeadScores, ScoreFunction,
                     cdf_thresholds, default_inputs, head_statistics, output_weights, resolve_scores, score_heads,
                     scores_from_statistics)

__all__ = ["score_heads", "HeadScores", "ScoreFunction", "SCORE_FUNCTIONS", "PAPER_SCORES", "EXTRA_SCORES",
           "BEST_SCORE", "PAPER_FRACTIONS", "THRESHOLD_CONVENTIONS", "PADDED_QUERIES", "cdf_thresholds",
           "output_weights", "head_statistics", "scores_from_statistics", "resolve_scores", "ablate_heads",
           "HeadAblation", "ZeroHeads", "head_mask", "head_means", "dynamic_zeroing", "DynamicZeroing",
           "evaluate_ablation", "AblationResult", "inactive_sweep", "SweepConfig", "SweepResult", "random_heads",
           "random_like", "default_inputs", "DEFAULT_N_INPUTS", "DEFAULT_MAX_LENGTH", "DEFAULT_BATCH_SIZE"]
