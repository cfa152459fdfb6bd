"""RepIt on zoo:smollm2-135m-refusal (slow: builds/loads the refusal model and generates on held-out prompts).

Run with ``pytest -m slow tests/steering/test_repit_validation.py``. The measured table is in docs/steering.md.
"""
import pytest

pytestmark = pytest.mark.slow


def test_repit_validation_on_refusal_model(tmp_path):
    from steering.repit_validation import RepItExperimentConfig, RepItValidation, experiment

    res = experiment(RepItExperimentConfig())
    res.save(tmp_path / "repit")
    back = RepItValidation.load(tmp_path / "repit")
    assert back.criteria == res.criteria
    none, nat, rep = (res.summary[k] for k in ("none", "natural", "repit"))
    # the model refuses harmful requests to begin with
    assert none["target"] >= 0.8 and none["nontarget"] >= 0.8
    # RepIt: >= 80% drop of target refusal, non-target refusal >= 90% of its baseline
    assert res.criteria["repit_target_drop"]["passed"], res.criteria
    assert res.criteria["repit_nontarget_retain"]["passed"], res.criteria
    # the plain target vector causes the collateral damage RepIt avoids
    assert res.criteria["natural_collateral"]["passed"], res.criteria
    assert nat["nontarget"] < rep["nontarget"]
    # the correction is localised and harmless outputs barely move
    assert 0 < res.dims_90 < 576
    assert res.kl["repit"] < 0.1
    assert res.to_frame().shape[0] == 3 * 11 and res.figure() is not None


def test_audit_steering_section_on_refusal_model(tmp_path):
    import interp
    from interp.audit import AuditData, run_audit

    model = interp.load("zoo:smollm2-135m-refusal")
    report = run_audit(model, ["steering"], AuditData(["hello"]), out=tmp_path / "audit", keep_going=False)
    res = report.checks[0].result
    assert res.applicable and res.method == "repit" and res.layer is not None
    s = res.summary_numbers
    assert s["none target refusal"] >= 0.8 and s["repit target refusal"] < s["none target refusal"]
    assert "Refusal rate per category" in (tmp_path / "audit" / "index.html").read_text()
