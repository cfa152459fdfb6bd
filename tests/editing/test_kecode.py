"""KECode metrics by hand, and the paper's Score identity."""
import math

import pytest
import torch

from interp.editing.kecode import KECodeScores, cd, cluster_errors, dt, gn, kecode_scores, loc, re


def test_metrics_by_hand():
    # 10 samples: 4 correct, 3 in target cluster "A", 3 in cluster "B"
    before = [None, None, None, None, "A", "A", "A", "B", "B", "B"]
    after = [None, None, None, "A", None, "B", "A", "B", None, "C"]
    assert gn(before, after, "A") == pytest.approx(100 / 3)          # one of three A's fixed
    assert cd(before, after, "A") == pytest.approx(200 / 3)          # A has 2 members after (idx 3, 6) vs 3
    assert loc(before, after, "A") == pytest.approx(100 / 3)         # of B's: idx 7 unchanged, 8 fixed, 9 moved
    assert dt(before, after) == pytest.approx(25.0)                  # 1 of 4 correct broken
    assert re(before, after) == pytest.approx(100 * 5 / 4)           # 5 correct after vs 4
    s = kecode_scores(before, after, "A")
    assert s.score == pytest.approx((s.GN - s.CD) + (s.LoC - s.DT) + s.RE)
    assert len(s.to_frame()) == 1


def test_paper_identity():
    s = KECodeScores(GN=32.86, CD=46.43, LoC=82.17, DT=6.86, RE=109.71)
    assert s.score == pytest.approx(171.45, abs=1e-6)


def test_errors_and_empty_clusters():
    with pytest.raises(ValueError, match="align"):
        gn([None], [None, None], "A")
    assert math.isnan(gn([None, "B"], [None, "B"], "A"))


def test_cluster_errors():
    e = torch.tensor([[1.0, 0.0], [0.99, 0.05], [0.0, 1.0], [0.05, 1.0], [-1.0, 0.0]])
    assert cluster_errors(e, 0.9) == [0, 0, 1, 1, 2]
    assert cluster_errors(e, -1.0) == [0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="threshold"):
        cluster_errors(e, 2.0)
