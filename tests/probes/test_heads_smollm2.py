"""Inactive heads on a real model (SmolLM2-135M): flagged-head ablation costs less than random heads."""
import pytest

pytestmark = pytest.mark.slow


def test_smollm2_output_norm_heads_are_cheaper_to_ablate_than_random_heads():
    from interp.probes.heads.experiment import ValidationConfig, experiment

    res = experiment(ValidationConfig(n_random=5))
    table = res.to_frame().set_index("score")
    assert len(table) == 15
    # every score flags a non-trivial fixed set near the target fraction p = 10 % of the 270 heads
    assert ((table["fraction_heads_flagged"] > 0.02) & (table["fraction_heads_flagged"] <= 0.15)).all()
    abl = res.ablation_result
    assert abl.total_heads == 270 and abl.n_heads == len(res.flagged) > 0
    assert abl.delta < abl.random_delta  # the paper's claim, on held-out text
    assert abl.delta < 0.05 * abl.baseline  # and the flagged heads matter little in absolute terms
