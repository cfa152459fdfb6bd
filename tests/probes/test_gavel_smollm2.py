"""GAVEL on SmolLM2-135M (slow): the issue's goal, kept as a strict xfail with the measured numbers."""
import pytest
import torch


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "measured 2026-12-01 (docs/gavel.md): GAVEL AUC phishing 0.984, payment_scam 0.878, harassment 0.928, "
    "unseen romance_baiting 0.973 (goal >= 0.95 on every rule not met: with 12 calibration dialogues per scenario "
    "Youden's J is flat and the official largest-threshold tie-break leaves recall at 0.06-0.60); hard-negative FPR "
    "0.00/0.00/0.00/0.018 vs monolithic 0.87/0.91/0.85/0.89 (met)"))
def test_smollm2_gavel_goal():
    import interp
    from interp.probes.gavel import DetectorConfig, FeatureSpec
    from interp.probes.gavel.validation import run_library_validation
    torch.set_num_threads(1)
    model = interp.load("zoo:smollm2-135m", backend="torch")
    res = run_library_validation(model, FeatureSpec.range(6, 15), n_train=20, n_cal=12, n_test=15, n_mono=16,
                                 detector_config=DetectorConfig(hidden=64, rnn_layers=2, lr=1e-3, max_epochs=20))
    df = res.to_frame()
    g = df[df.method == "gavel"].set_index("rule")
    m = df[df.method == "monolithic"].set_index("rule")
    assert (g.fpr_hard < m.fpr_hard).all()  # precision: holds at our scale
    assert (g.auc >= 0.95).all(), g.auc.to_dict()
