"""Read-only analyzers: they consume activations captured through :mod:`interp` and return typed results.

Inactive attention-head scores (all score functions of the paper plus an ablation check), GAVEL
cognitive-element rules, and VQ-VAE planning codes live here. Nothing in this package touches a
backend directly; every activation comes from :class:`interp.Model`.
"""

from .heads import (HeadScores, SweepConfig, ablate_heads, dynamic_zeroing, evaluate_ablation,  # noqa: E402
                    inactive_sweep, score_heads)
