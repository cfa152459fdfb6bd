"""``interp audit --checks steering``: the check found through the interp.checks entry point."""
import copy
import json

import pytest

import interp
from interp.audit import AuditData, get_check, run_audit

TEMPLATE = ("{% for m in messages %}<|bos|>user: {{ m['content'] }}<|eos|>{% endfor %}"
            "{% if add_generation_prompt %}\nbot:{% endif %}")


def test_registered_through_entry_point():
    cls = get_check("steering")
    assert cls.__module__ == "interp.steering.audit_check" and cls.Config().method == "repit"


def test_skipped_without_refusal_data(llama, tmp_path):
    report = run_audit(llama, ["steering"], AuditData(["hello"]), out=tmp_path / "r")
    rec = report.checks[0]
    assert rec.status == "ok" and not rec.result.applicable and "chat template" in rec.result.reason
    assert "Skipped" in (tmp_path / "r" / "index.html").read_text()


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
