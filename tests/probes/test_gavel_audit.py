"""GAVEL audit check: config validation and per-rule metrics equal to a direct computation."""
import json

import numpy as np
import pytest
import torch

import interp
from interp.apps.audit import AuditData
from interp.checks import configure
from interp.probes.gavel import (CE, CEDetector, CELibrary, DetectorConfig, FeatureSpec, WindowGRU,
                                 conversation_features, gavel_rule_outputs, load_rules, rule_metrics)
from interp.probes.gavel.audit_check import GavelCheck, GavelConfig
from interp.testing import tiny_model

torch.set_num_threads(1)


def test_config_validation():
    with pytest.raises(ValueError, match="gavel.layers"):
        GavelConfig(layers="3")
    with pytest.raises(ValueError, match="gavel.n_test"):
        GavelConfig(n_test=0)
    assert configure(GavelCheck, {"rules": "r.json", "n_test": "4"}).n_test == 4
    with pytest.raises(ValueError, match="needs a rule file"):
        GavelCheck(GavelConfig()).run(None, AuditData(["x"]))
    assert GavelCheck(GavelConfig()).missing() == "needs a rule file: --set gavel.rules=FILE"
    assert GavelCheck(GavelConfig(rules="r.json")).missing() is None


def test_check_runs_rule_file_over_conversations(tmp_path):
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    model = interp.wrap(hf, tok, backend="torch")
    spec = FeatureSpec.range(1, 3)
    ces = ["a", "b", "c"]
    torch.manual_seed(0)
    det = CEDetector(WindowGRU(spec.width(model), 3, hidden=8, rnn_layers=1, dropout=0.0), ces,
                     DetectorConfig(hidden=8, rnn_layers=1, dropout=0.0), spec=spec,
                     thresholds=torch.tensor([0.5, 0.45, 0.55]))
    CELibrary([CE(c) for c in ces], det).save(tmp_path / "lib")
    (tmp_path / "rules.json").write_text(json.dumps({"rules": [
        {"name": "r1", "condition": "all of {a} and 1 of {b, c}", "action": "block"},
        {"name": "r2", "all_required": ["b"], "any_of": [["c"]]}]}))
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]
    convs = []
    for i in range(16):
        sets = [["a", "b"], ["a"], ["b", "c"], []][i % 4]
        convs.append({"messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": " ".join(rng.choice(words, 12))}], "ces": sets})
    (tmp_path / "convs.json").write_text(json.dumps({"conversations": convs}))
    check = GavelCheck(GavelConfig(rules=str(tmp_path / "rules.json"), library=str(tmp_path / "lib"),
                                   conversations=str(tmp_path / "convs.json"), max_audit_texts=4))
    res = check.run(model, AuditData(["The sky is blue.", "Cats sleep a lot.", "Bread needs yeast."]))
    df = res.to_frame()
    assert list(df.rule) == ["r1", "r2"]
    det2 = CELibrary.load(tmp_path / "lib").detector
    probs = det2.sequence_probs(conversation_features(model, [c["messages"] for c in convs], spec))
    rules = load_rules(tmp_path / "rules.json")
    for r, row in zip(rules, res.rules):
        y = np.array([r.evaluate(c["ces"]) for c in convs])
        group = ["positive" if yy else ("hard" if set(c["ces"]) & set(r.condition_ces) else "random")
                 for yy, c in zip(y, convs)]
        want = rule_metrics(y, *gavel_rule_outputs(det2, r, probs), group)
        for k, v in want.items():
            assert row[k] == pytest.approx(v), k
    assert {c["ce"] for c in res.ces} == set(ces) and 0 <= res.rules[0]["fpr_audit_texts"] <= 1
    rendered = check.render(res)
    assert len(rendered.figures) == 2 and len(rendered.tables) == 2
    assert set(check.summary(res)) >= {"rules", "mean_auc"}
    m = check.metrics(res)
    assert set(m) == set(GavelCheck.METRICS) and m["rules"] == 2 and m["mean_auc"] == check.summary(res)["mean_auc"]
    res.save(tmp_path / "out")
