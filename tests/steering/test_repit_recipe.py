"""The RepIt recipe's own logic (``interp reproduce repit``): target-set names and the measurements the claims read."""
from types import SimpleNamespace

import pytest

from interp.benchmarks.repit.recipe import RepItReproConfig, measurements, set_name


def test_set_names_and_config_checks():
    assert set_name(("bio",)) == "single" and set_name(("bio", "chem")) == "group"
    with pytest.raises(ValueError, match="at most one single target and one group"):
        RepItReproConfig(target_sets=(("bio",), ("chem",)))
    with pytest.raises(ValueError, match="non-empty"):
        set_name(())


def test_measurements_from_a_validation():
    res = SimpleNamespace(
        summary={"none": {"target": 1.0, "nontarget": 0.8}, "natural": {"target": 0.0, "nontarget": 0.1},
                 "repit": {"target": 0.25, "nontarget": 0.76}},
        criteria={"repit_target_drop": {"value": 0.75}, "repit_nontarget_retain": {"value": 0.95},
                  "natural_collateral": {"value": 0.125}},
        config={"modes": ["affine"]}, rho={"affine": 0.9}, data_efficiency={"12": 0.99, "24": 0.995},
        localization={"affine": {"d": 64}}, dims_90={"affine": 16})
    m = measurements(res, "group")
    assert m["group_target_drop_points"] == pytest.approx(0.75) and m["group_target_after"] == 0.25
    assert m["group_nontarget_kept"] == 0.95 and m["group_natural_nontarget_kept"] == 0.125
    assert m["group_data_efficiency"] == 0.99 and m["group_dims90_share"] == 0.25 and m["group_rho"] == 0.9
    # rho = 0: no correction, no localisation, so no share is reported (not a vacuous 0)
    res.localization = {"affine": {}}
    assert "group_dims90_share" not in measurements(res, "group")
