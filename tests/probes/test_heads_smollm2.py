"""Inactive heads on a real model (SmolLM2-135M): the official thresholds against torch.quantile.

The paper's criteria (flag rates, flagged vs random heads, the sweeps) are the claims of
``interp reproduce heads --preset full`` (benchmarks/heads/claims.yaml).
"""
import pytest

pytestmark = pytest.mark.slow


def test_smollm2_official_thresholds_flag_at_most_pn_minus_one_and_keep_the_fixed_sets():
    """Before/after table of docs/heads.md (c): official vs torch.quantile thresholds on the validation texts."""
    from interp.probes.heads import SCORE_FUNCTIONS
    from interp.benchmarks.heads.experiment import threshold_comparison

    table = threshold_comparison()
    n_pairs = 48 * 270
    for row in table.itertuples():
        m = round(row.fraction * n_pairs)
        if SCORE_FUNCTIONS[row.score].inactive_if == ">":
            assert row.pairs_official <= m and row.pairs_official == row.pairs_quantile, row
        else:  # the strict rule at tau = the m-th score: at most m - 1, one pair (a GQA tie group: 3) below quantile
            assert row.pairs_official <= m - 1, row
            assert row.pairs_quantile - row.pairs_official in (0, 1, 3), row
        assert row.heads_official == row.heads_quantile, row  # no fixed head set changes
        if "pattern" not in SCORE_FUNCTIONS[row.score].uses:
            assert row.heads_official_padded == row.heads_official, row  # the padding rule touches AWFT/AEQD only
    pattern = table[table.score.isin(["AWFT", "AWFT (LN)", "AEQD", "AEQD (LN)"])]
    assert (pattern.heads_official_padded != pattern.heads_official).any()
