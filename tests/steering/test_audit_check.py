"""``interp audit --checks steering``: the check found through the interp.checks entry point."""
import copy
import json

import pytest

import interp
from interp.apps.audit import AuditData, get_check, run_audit

TEMPLATE = ("{% for m in messages %}<|bos|>user: {{ m['content'] }}<|eos|>{% endfor %}"
            "{% if add_generation_prompt %}\nbot:{% endif %}")


def test_registered_through_entry_point():
    cls = get_check("steering")
    assert cls.__module__ == "interp.steering.audit_check" and cls.Config().method == "repit"


def test_refusal_is_skipped_without_refusal_data(llama, tmp_path):
    """Refusal asked for on a model without a chat template: `skipped` with the reason (not `ok`)."""
    report = run_audit(llama, ["steering"], AuditData(["hello"]), out=tmp_path / "r",
                       options={"steering": {"behaviour": "refusal"}})
    rec = report.checks[0]
    assert rec.status == "skipped" and not rec.result.applicable and "chat template" in rec.result.reason
    assert rec.reason == rec.result.reason and report.ok
    assert set(rec.metrics) == set(get_check("steering").METRICS) and rec.metrics["effect"] is None
    assert "Skipped: the model has no chat template" in (tmp_path / "r" / "index.html").read_text()
    data = json.loads((tmp_path / "r" / "results.json").read_text())
    assert data["checks"][0]["status"] == "skipped" and "chat template" in data["checks"][0]["reason"]


def test_default_evaluates_a_behaviour_the_model_has(llama, tmp_path):
    """The default (RepIt, behaviour auto) on a model without refusal data: the built-in `sentiment` with
    diff_in_means steered against it (scale -1), the note saying which behaviour and why."""
    opts = {"max_new_tokens": "2", "neutral_texts": "1", "layer": "1"}
    report = run_audit(llama, ["steering"], AuditData(["hello there"]), options={"steering": opts}, keep_going=False)
    rec = report.checks[0]
    res = rec.result
    assert rec.status == "ok" and res.behaviour == "sentiment" and res.method == "diff_in_means"
    assert res.method_options == {"layer": 1, "batch_size": 16, "scale": -1.0}
    assert rec.title == "Steering: method diff_in_means on sentiment"
    assert "no chat template" in res.note and "a behaviour the model exhibits" in res.note
    assert "against the behaviour" in res.note and "steering.behaviour=refusal" in res.note
    ev = res.evaluation["conditions"]
    assert rec.metrics["rate_none"] == ev["none"]["behaviour_rate"]
    assert rec.metrics["effect"] == pytest.approx(ev["steered"]["behaviour_rate"] - ev["none"]["behaviour_rate"])
    assert rec.metrics["kl_neutral"] == res.evaluation["kl_neutral"] > 0


def test_runs_repit_section_on_a_chat_model(llama, tmp_path):
    tok = copy.deepcopy(llama.tokenizer)
    tok.chat_template = TEMPLATE
    model = interp.wrap(llama.hf_model, tok)
    opts = {"applicable": "yes", "train_per_category": "2", "train_harmless": "4", "val_per_category": "1",
            "test_per_category": "1", "test_harmless": "4", "max_new_tokens": "3", "layer": "1",
            "position": "-1", "rho": "0.5"}
    report = run_audit(model, ["steering"], AuditData(["hello"]), out=tmp_path / "r", options={"steering": opts},
                       keep_going=False)
    res = report.checks[0].result
    assert res.applicable and res.method == "repit" and res.layer == 1 and res.rho == 0.5
    df = res.to_frame()
    assert set(df["condition"]) == {"none", "natural", "repit"} and len(df) == 3 * 11
    assert set(df.loc[df.group == "target", "category"]) == {"bio", "chem", "nuclear"}
    assert set(res.kl) == {"natural", "repit"} and all(v >= 0 for v in res.kl.values())
    page = (tmp_path / "r" / "index.html").read_text()
    assert "Refusal rate per category" in page and "repit" in page
    payload = json.loads((tmp_path / "r" / "results.json").read_text())
    assert "steering" in json.dumps(payload)
    with pytest.raises(ValueError, match="applicable"):
        get_check("steering")(get_check("steering").Config(applicable="maybe")).run(model, AuditData(["x"]))
