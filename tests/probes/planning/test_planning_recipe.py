"""The planning recipe's own logic (``interp reproduce planning``): the block-map criteria as numbers, by hand."""
from types import SimpleNamespace

import numpy as np
import pytest

from interp.benchmarks.planning.recipe import PlanningReproConfig, map_measurements


def test_map_measurements_by_hand():
    # rows: state at T, B1, B2, B3; columns: layers 0, 1, 2, 3
    nmi_t = np.array([[0.5, 0.6, 0.8, 1.0],
                      [0.1, 0.2, 0.3, 0.4],
                      [0.0, 0.1, 0.1, 0.2],
                      [0.0, 0.0, 0.1, 0.1]])
    cmi_t = np.array([[np.nan] * 4,
                      [0.30, 0.40, 0.50, 0.0],
                      [0.20, 0.25, 0.21, 0.0],
                      [0.10, 0.12, 0.11, 0.0]])
    null_cond = np.array([[np.nan] * 4, [0.1, 0.1, 0.1, 0.0], [0.1, 0.1, 0.1, 0.0], [0.1, 0.1, 0.1, 0.0]])
    null_std = np.array([[0.0] * 4, [0.01] * 4, [0.02, 0.01, 0.01, 0.0], [0.005] * 4])
    m = map_measurements(SimpleNamespace(nmi_t=nmi_t, cmi_t=cmi_t, null_cond=null_cond, null_std=null_std))
    # B1 mean 0.25 against the mean of B2 and B3 (0.1 and 0.05): 0.25 - 0.075
    assert m["map_recent_minus_older"] == pytest.approx(0.175)
    # blocks only: layers 2-3 (0.3 0.4 0.1 0.2 0.1 0.1: mean 0.2) against layers 0-1 (sum 0.4 over 6)
    assert m["map_late_minus_early"] == pytest.approx(0.2 - 0.4 / 6)
    # B2: max(0.10, 0.15, 0.11, -0.10) - 3 * 0.02; B3: max(0.0, 0.02, 0.01, -0.10) - 3 * 0.005
    assert m["map_cond_margin"] == pytest.approx([0.15 - 0.06, 0.02 - 0.015])


def test_config_refuses_task_texts_without_a_trained_map_model():
    with pytest.raises(ValueError, match="map_texts='task' needs map_model='train:"):
        PlanningReproConfig(map_texts="task")
    with pytest.raises(ValueError, match="map_texts must be 'kjv' or 'task'"):
        PlanningReproConfig(map_texts="owt")
