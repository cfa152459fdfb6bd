"""The behaviour evaluation of any steering vector (steering.behaviour) and the steering check's options."""
import dataclasses
import json
import math

import pytest
import torch

from interp.apps.audit import AuditData, get_check, run_audit
from interp.checks import configure
from interp.data import BEHAVIOURS, Behaviour, get_behaviour, load_behaviour
from interp.steering import SteeringVector, last_token
from interp.steering.activations import collect
from interp.steering.behaviour import (LinearProbe, continuation_perplexity, generation_positions, marker_logprobs,
                                       marker_scores, probe_hook, token_kl, token_kl_view)

PROMPTS = ["Hello there, my", "The cat sat on the", "A"]


def _vec(scale=1.0, positions=None, seed=1, layer=1):
    g = torch.Generator().manual_seed(seed)
    return SteeringVector("x", "add", (f"blocks.{layer}.hook_resid_pre",), torch.randn(64, generator=g) * 8,
                          positions=positions, scale=scale, metadata={"layer": layer})


# ------------------------------------------------------------------ positions
def test_generation_positions_by_hand():
    assert generation_positions(None, 3) is None
    assert generation_positions((-1,), 3) == (-4, -3, -2, -1)
    assert generation_positions((-2, -1), 2) == (-4, -3, -2, -1)
    assert generation_positions((0, 5, -3), 2) == (0, 5, -5)  # no -1: the continuation is not steered
    assert generation_positions((-1,), 0) == (-1,)


@pytest.mark.parametrize("positions", [(-1,), (-2, -1), None])
def test_teacher_forced_scoring_matches_greedy_generation(llama, positions):
    """Tokens generated greedily under the vector are the argmax of the teacher-forced steered logits at every step
    with the translated positions; without the translation a last-token vector would not reproduce them."""
    vec, k = _vec(positions=positions), 4
    enc = llama.tokenize(PROMPTS, padding_side="left", add_special_tokens=False)
    with vec.apply(llama):
        new = llama.generate(enc, max_new_tokens=k, return_text=False, stop_at_eos=False)
    naive_ok = []
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([llama.tokenizer(p, add_special_tokens=False)["input_ids"] + new[i].tolist()])
        shifted = dataclasses.replace(vec, positions=generation_positions(vec.positions, k))
        with shifted.apply(llama):
            assert llama(ids)[0, -k - 1:-1].argmax(-1).tolist() == new[i].tolist()
        with vec.apply(llama):
            naive_ok.append(llama(ids)[0, -k - 1:-1].argmax(-1).tolist() == new[i].tolist())
    if positions is not None:
        assert not all(naive_ok)  # the translation is needed (the check above is not vacuous)


# ------------------------------------------------------------------ marker judge
def test_marker_logprobs_by_hand_and_batched(llama):
    markers = [" good", "xy"]
    got = marker_logprobs(llama, PROMPTS, markers, batch_size=2)
    tok = llama.tokenizer
    for i, p in enumerate(PROMPTS):
        for j, m in enumerate(markers):
            pi, mi = tok(p, add_special_tokens=False)["input_ids"], tok(m, add_special_tokens=False)["input_ids"]
            lp = llama(torch.tensor([pi + mi]))[0].float().log_softmax(-1)
            want = sum(float(lp[len(pi) - 1 + t, mi[t]]) for t in range(len(mi)))
            assert got[i, j].item() == pytest.approx(want, abs=1e-4)
    vec = _vec(positions=(-1,))
    assert torch.allclose(marker_logprobs(llama, PROMPTS, markers, vec, batch_size=1),
                          marker_logprobs(llama, PROMPTS, markers, vec, batch_size=3), atol=1e-4)
    s = marker_scores(llama, PROMPTS, [" good"], ["xy"], batch_size=2)
    assert torch.allclose(s, got[:, 0] - got[:, 1], atol=1e-5)
    with pytest.raises(ValueError, match="at least one positive"):
        marker_scores(llama, PROMPTS, [], ["xy"])


# ------------------------------------------------------------------ probe, KL, coherence
def test_linear_probe_separates_and_reads_a_shift():
    g = torch.Generator().manual_seed(0)
    pos, neg = torch.randn(30, 8, generator=g) + 2.0, torch.randn(30, 8, generator=g) - 2.0
    probe = LinearProbe.fit(pos, neg)
    assert probe.accuracy(pos, neg) == 1.0
    mid = torch.zeros(5, 8)
    assert (probe.proba(mid + 4.0) > 0.99).all() and (probe.proba(mid - 4.0) < 0.01).all()
    with pytest.raises(ValueError, match="same d"):
        LinearProbe.fit(pos, neg[:, :4])


def test_token_kl_by_hand_and_zero_at_scale_zero(llama):
    texts = ["Some neutral words.", "x", "The river runs past the mill and the bridge."]
    vec = _vec(scale=0.7)
    kl, n = token_kl(llama, texts, vec, batch_size=2)
    total, count = 0.0, 0
    for t in texts:
        ids = torch.tensor([llama.tokenizer(t, add_special_tokens=False)["input_ids"]])
        base = llama(ids)[0].float().log_softmax(-1)
        with vec.apply(llama):
            st = llama(ids)[0].float().log_softmax(-1)
        total += float((base.exp() * (base - st)).sum())
        count += ids.shape[1]
    assert n == count and kl == pytest.approx(total / count, rel=1e-4) and kl > 0
    assert token_kl(llama, texts, vec.with_scale(0.0))[0] == pytest.approx(0.0, abs=1e-7)
    # the report's per-token view of one text: its values are the per-position KLs computed by hand above
    t = texts[2]
    ids = torch.tensor([llama.tokenizer(t, add_special_tokens=False)["input_ids"]])
    base = llama(ids)[0].float().log_softmax(-1)
    with vec.apply(llama):
        st = llama(ids)[0].float().log_softmax(-1)
    view = token_kl_view(llama, t, vec)
    assert view.tokens == llama.to_str_tokens(ids[0])
    torch.testing.assert_close(torch.tensor(view.values), (base.exp() * (base - st)).sum(-1), rtol=1e-4, atol=1e-7)
    assert sum(view.values) / len(view.values) == pytest.approx(token_kl(llama, [t], vec)[0], rel=1e-5)
    assert "interp-token-view" in view.html


def test_continuation_perplexity_by_hand(llama):
    vec = _vec(scale=1.0, positions=(-1,))
    ppl, texts = continuation_perplexity(llama, PROMPTS, vec, max_new_tokens=5, batch_size=2)
    nll, count = 0.0, 0
    for p in PROMPTS:
        enc = llama.tokenize([p], add_special_tokens=False)
        with vec.apply(llama):
            new = llama.generate(enc, max_new_tokens=5, return_text=False)[0]
        new = new[new >= 0]
        ids = torch.cat([enc["input_ids"][0], new])[None]
        lp = llama(ids)[0, enc["input_ids"].shape[1] - 1:-1].float().log_softmax(-1)  # unsteered model scores
        nll -= float(lp.gather(-1, new[:, None]).sum())
        count += len(new)
    assert ppl == pytest.approx(math.exp(nll / count), rel=1e-4) and len(texts) == len(PROMPTS)


def test_probe_hook_rule(llama):
    assert probe_hook(llama, _vec(layer=0)) == "blocks.0.hook_resid_post"
    glob = SteeringVector("x", "project_out", ("blocks.*.hook_resid_pre",), torch.ones(64))
    assert probe_hook(llama, glob) == "blocks.1.hook_resid_post"  # middle layer of 2: 2 // 2
    assert probe_hook(llama, glob, layer=0) == "blocks.0.hook_resid_post"
    with pytest.raises(ValueError, match="outside"):
        probe_hook(llama, glob, layer=5)
    acts = last_token(llama, PROMPTS, "blocks.1.hook_resid_post")
    assert torch.equal(acts, collect(llama, PROMPTS, ["blocks.1.hook_resid_post"], (-1,))[:, 0, 0])


# ------------------------------------------------------------------ behaviour sets
def test_builtin_behaviours_and_splits():
    assert set(BEHAVIOURS) >= {"sentiment", "uppercase"}
    b = get_behaviour("sentiment")
    tr, te = b.split("train"), b.split("test")
    assert len(tr[0]) + len(te[0]) == len(b.positive) and not set(tr[0]) & set(te[0])
    assert te[0] == [b.positive[i] for i in range(3, len(b.positive), 4)]
    up = get_behaviour("uppercase")
    assert all(p == n.upper() for p, n in zip(up.positive, up.negative))
    with pytest.raises(ValueError, match="sentiment"):
        get_behaviour("nope")


def test_load_behaviour_file(tmp_path):
    f = tmp_path / "formal.json"
    f.write_text(json.dumps({"positive": ["Dear Sir", "Yours faithfully", "Kind regards"],
                             "negative": ["Hey mate", "Cheers", "See ya"]}))
    b = load_behaviour(f)
    assert b.name == "formal" and not b.has_markers and b.prompts == ("See ya",)  # held-out negative (the last, < 4 texts)
    for bad, msg in [({"positive": ["a", "b"]}, "lacks"), ({"positive": "ab", "negative": ["a", "b"]}, "list"),
                     ({"positive": ["a", "b"], "negative": ["c", "d"], "extra": 1}, "unknown keys"),
                     ({"positive": ["a", "b"], "negative": ["c", "d"], "positive_markers": ["x"]}, "both")]:
        f.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=msg):
            load_behaviour(f)
    f.write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        load_behaviour(f)
    with pytest.raises(ValueError, match="does not exist"):
        load_behaviour(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="at least 2"):
        Behaviour("b", "", ["a"], ["b"], ["p"])


# ------------------------------------------------------------------ the check's options
def test_set_options_reach_the_method_config():
    cls = get_check("steering")
    cfg = configure(cls, {"method": "diff_in_means", "scale": "2.5", "layer": "1", "hook": "hook_resid_post",
                          "behaviour": "uppercase"})
    assert cfg.method_options == {"scale": 2.5, "hook": "hook_resid_post"} and isinstance(cfg.method_options["scale"], float)
    assert cfg.method_kwargs() == {"layer": 1, "batch_size": 16, "scale": 2.5, "hook": "hook_resid_post"}  # shared fields
    assert cfg.evaluation() == "uppercase" and configure(cls, {}).evaluation() == "refusal"  # repit
    errors = [({"method": "no_such_method"}, "steering.method"),
              ({"method": "diff_in_means", "nope": "1"}, "neither a field of the check"),
              ({"method": "diff_in_means", "scale": "abc"}, "bad value 'abc' for steering.scale"),
              ({"behaviour": "sentiment"}, "repit"),
              ({"method": "diff_in_means", "behaviour": "nope"}, "built-in behaviour"),
              ({"method": "diff_in_means", "data": "missing.json"}, "does not exist"),
              ({"method": "diff_in_means", "applicable": "maybe"}, "applicable")]
    for opts, msg in errors:
        with pytest.raises(ValueError, match=msg):
            configure(cls, opts)
    from interp.steering.audit_check import SteeringCheckConfig
    with pytest.raises(ValueError, match="no option 'bogus'"):  # a config built in Python is validated at run
        SteeringCheckConfig(method="diff_in_means", method_options={"bogus": 1}).validate()


def test_behaviour_section_on_a_tiny_model(llama, tmp_path):
    """diff_in_means on `uppercase`: the section names the method; at scale 0 nothing changes (KL 0, every metric
    equal before and after); at scale 8 the neutral KL is positive and the probe reads the push."""
    base = {"method": "diff_in_means", "behaviour": "uppercase", "layer": "1", "hook": "hook_resid_post", "max_new_tokens": "4",
            "neutral_texts": "3"}
    zero = run_audit(llama, ["steering"], AuditData(["Some text here.", "More text.", "x y z"]), out=tmp_path / "z",
                     options={"steering": {**base, "scale": "0"}}, keep_going=False).checks[0]
    assert zero.title == "Steering: method diff_in_means on uppercase"
    ev = zero.result.evaluation
    assert ev["kl_neutral"] == pytest.approx(0.0, abs=1e-7) and ev["n_neutral_texts"] == 3
    assert ev["conditions"]["none"] == pytest.approx(ev["conditions"]["steered"], rel=1e-5)
    strong = run_audit(llama, ["steering"], AuditData(["Some text here.", "More text.", "x y z"]), out=tmp_path / "s",
                       options={"steering": {**base, "scale": "8"}}, keep_going=False).checks[0]
    res = strong.result
    assert res.applicable and res.behaviour == "uppercase" and res.method_options == {"layer": 1, "batch_size": 16, "scale": 8.0, "hook": "hook_resid_post"}
    assert res.evaluation["kl_neutral"] > 1e-3 and res.evaluation["probe_hook"] == "blocks.1.hook_resid_post"
    # the vector is mean(h+) - mean(h-) of the probe's own training texts: pushing along it raises P(positive)
    assert res.evaluation["conditions"]["steered"]["probe_score"] > res.evaluation["conditions"]["none"]["probe_score"]
    df = res.to_frame()
    assert set(df["condition"]) == {"none", "diff_in_means"}
    assert {"behaviour_rate", "probe_score", "continuation_ppl"} <= set(df["metric"])
    page = (tmp_path / "s" / "index.html").read_text()
    assert "Steering: method diff_in_means on uppercase" in page and "Behaviour before / after steering" in page
    assert "KL on neutral text" in page and "Greedy continuations" in page
    assert "interp-token-view" in page and res.evaluation["kl_tokens"]["tokens"] == llama.to_str_tokens(
        llama.tokenizer("Some text here.", add_special_tokens=False, return_tensors="pt")["input_ids"][0])
    assert max(res.evaluation["kl_tokens"]["kl"]) > 0 and max(ev["kl_tokens"]["kl"]) == pytest.approx(0.0, abs=1e-7)


def test_user_data_without_markers_and_auto_fallback(llama, tmp_path):
    """steering.data: a user's contrastive JSON set (no markers: no behaviour rate, the probe only); behaviour auto
    on a model without a chat template: a non-RepIt method is judged on the built-in `sentiment`, saying why."""
    f = tmp_path / "shout.json"
    f.write_text(json.dumps({"name": "shout", "positive": ["HELLO THERE", "GOOD MORNING", "WATCH OUT", "STOP NOW"],
                             "negative": ["hello there", "good morning", "watch out", "stop now"],
                             "prompts": ["Well then", "So"]}))
    small = {"method": "diff_in_means", "layer": "1", "max_new_tokens": "2", "neutral_texts": "2"}
    rec = run_audit(llama, ["steering"], AuditData(["a b c", "d e"]), out=tmp_path / "u",
                    options={"steering": {**small, "data": str(f)}}, keep_going=False).checks[0]
    res = rec.result
    assert rec.title == "Steering: method diff_in_means on shout" and res.behaviour == "shout"
    assert res.evaluation["n_prompts"] == 2 and not res.evaluation["has_markers"]
    assert "behaviour_rate" not in set(res.to_frame()["metric"]) and "probe_score" in set(res.to_frame()["metric"])
    assert "not measured: this set has no markers" in (tmp_path / "u" / "index.html").read_text()
    rec = run_audit(llama, ["steering"], AuditData(["a b c", "d e"]), out=tmp_path / "a",
                    options={"steering": small}, keep_going=False).checks[0]
    assert rec.result.behaviour == "sentiment" and "no chat template" in rec.result.note
    assert rec.title == "Steering: method diff_in_means on sentiment"
    assert "no chat template" in (tmp_path / "a" / "index.html").read_text()
