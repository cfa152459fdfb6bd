"""GAVEL Monitor: online readouts equal offline ones, windows, sliding history and the four actions."""
import pytest
import torch
from torch import nn

import interp
from interp.probes.gavel import (CEDetector, DetectorConfig, FeatureSpec, Monitor, conversation_features, parse_rule,
                                 render_prompt)
from interp.testing import tiny_model

torch.set_num_threads(1)
PROMPT = "hello there, monitor"
N_NEW = 20


@pytest.fixture(scope="module")
def setup():
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)  # GQA: 4 query / 2 KV heads
    model = interp.wrap(hf, tok, backend="torch")
    spec = FeatureSpec.range(1, 3)
    ids = model.generate(PROMPT, max_new_tokens=N_NEW, return_text=False, stop_at_eos=False)[0].tolist()
    p_ids = model.to_tokens(PROMPT)[0]
    full = torch.cat([p_ids, torch.tensor(ids)])
    keep = torch.zeros(len(full), dtype=torch.bool)
    keep[len(p_ids):-1] = True  # generated tokens 1..N-1 are read back by the model (the last one never is)
    feats = conversation_features(model, [(full, keep)], spec)[0]  # offline readouts [N-1, F]
    return model, spec, ids, feats


class Lookup(nn.Module):
    """Test double for the GRU: CE c's logit is +10 when its window holds the offline feature row of token t_c."""

    def __init__(self, rows):
        super().__init__()
        self.rows = rows
        self.register_buffer("mean", torch.zeros(rows[0].shape[-1]))

    def forward(self, x):
        hit = [((x - r).abs().amax(-1) < 1e-3).any(-1) for r in self.rows]
        return torch.stack(hit, -1).float() * 20 - 10


def detector(spec, feats, tokens):
    """CEs x, y firing on the windows that contain generated tokens ``tokens`` (1-based)."""
    det = CEDetector(Lookup([feats[t - 1] for t in tokens]), ["x", "y"], DetectorConfig(), spec=spec)
    det.thresholds = torch.tensor([0.5, 0.5])
    return det


def test_no_rule_fired_leaves_generation_unchanged(setup):
    model, spec, ids, feats = setup
    mon = Monitor(model, detector(spec, feats, [3, 3]), [parse_rule("all of {x} and all of {y}", name="r", action="block")])
    mon.detector.net.rows = [feats[0] + 1e3, feats[0] + 1e3]  # never matches
    out = mon.generate(PROMPT, max_new_tokens=N_NEW, stop_at_eos=False)
    assert not out.stopped and out.events == [] and out.token_ids == ids
    assert out.window_spans[:3] == [[0, 5], [5, 10], [10, 15]]
    assert out.window_spans[-1] == [N_NEW - 1 - 5, N_NEW - 1]  # tail window ends at the last read token
    assert out.window_probs.shape == (len(out.window_spans), 2)


def test_block_stops_mid_generation_and_logs_the_cause(setup):
    model, spec, ids, feats = setup
    rule = parse_rule("all of {x} and 1 of {y}", name="scam", action="block")
    mon = Monitor(model, detector(spec, feats, [7, 12]), [rule])
    out = mon.generate(PROMPT, max_new_tokens=N_NEW, stop_at_eos=False)
    assert out.stopped and out.action == "block"
    assert out.token_ids == ids[:15]  # stopped after the window of tokens 11..15 was read; tokens recovered
    (ev,) = out.events
    assert ev["rule"] == "scam" and ev["token"] == 15 and set(ev["fired"]) == {"x", "y"}
    assert ev["causes"]["x"][0]["span"] == [5, 10] and ev["causes"]["y"][0]["span"] == [10, 15]
    assert ev["causes"]["x"][0]["prob"] > 0.99
    assert out.text == model.tokenizer.decode(ids[:15], skip_special_tokens=True) == ev["text"]
    assert len(out.to_frame()) == 1
    out.figure()


def test_flag_logs_and_continues(setup):
    model, spec, ids, feats = setup
    mon = Monitor(model, detector(spec, feats, [2, 9]), [parse_rule("all of {x, y}", name="f", action="flag")])
    out = mon.generate(PROMPT, max_new_tokens=N_NEW, stop_at_eos=False)
    assert not out.stopped and out.token_ids == ids and [e["token"] for e in out.events] == [10]


def test_sliding_history_forgets_old_windows(setup):
    model, spec, ids, feats = setup
    rule = parse_rule("all of {x, y}", name="f", action="block")
    # x in window 1 (tokens 1-5), y in window 4 (16-19, the tail): with history 2 they never co-occur
    out = Monitor(model, detector(spec, feats, [2, 17]), [rule], history=2).generate(
        PROMPT, max_new_tokens=N_NEW, stop_at_eos=False)
    assert not out.stopped
    out = Monitor(model, detector(spec, feats, [2, 17]), [rule], history=8).generate(
        PROMPT, max_new_tokens=N_NEW, stop_at_eos=False)
    assert out.stopped


def test_replace_and_redirect(setup):
    model, spec, ids, feats = setup
    rule = parse_rule("all of {x}", name="r", action="replace", message="I cannot help with that.")
    out = Monitor(model, detector(spec, feats, [4, 4]), [rule]).generate(PROMPT, max_new_tokens=N_NEW, stop_at_eos=False)
    assert out.stopped and out.text == "I cannot help with that." and out.token_ids == ids[:5]
    rule = parse_rule("all of {x}", name="r", action="redirect", system_prompt="Be kind.")
    out = Monitor(model, detector(spec, feats, [4, 4]), [rule]).generate(PROMPT, max_new_tokens=N_NEW, stop_at_eos=False)
    want = model.generate(render_prompt(model, PROMPT, "Be kind."), max_new_tokens=N_NEW, stop_at_eos=False)[0]
    assert out.action == "redirect" and out.redirected["token_ids"] == ids[:5]
    assert out.text == want  # the redirected turn (its readouts differ, so the lookup does not fire again)


def test_monitor_validation(setup):
    model, spec, ids, feats = setup
    det = detector(spec, feats, [1, 1])
    with pytest.raises(ValueError, match="unknown CE"):
        Monitor(model, det, [parse_rule("all of {z}")])
    with pytest.raises(ValueError, match="history"):
        Monitor(model, det, [parse_rule("all of {x}")], history=0)
    with pytest.raises(ValueError, match="not a batch"):
        Monitor(model, det, [parse_rule("all of {x}")]).generate(["a", "b"])


def test_score_prompt_assistant_scores_only_assistant_tokens_and_prefill(setup):
    model, spec, _, _ = setup
    msgs = [{"role": "user", "content": "zzzzzzzzzz"}, {"role": "assistant", "content": "hello there"},
            {"role": "user", "content": "more"}]
    mon = Monitor(model, detector(spec, torch.zeros(2, 1), [1, 1]), [parse_rule("all of {x}", name="r", action="block")],
                  score_prompt="assistant")
    ids, keep = mon._prompt_ids(msgs, None, "pre")
    text = "user: zzzzzzzzzz\nassistant: hello there\nuser: more\nassistant:pre"  # no chat template: plain lines
    assert model.tokenizer.decode(ids.tolist()) == text
    a = text.index("hello there")  # official mask (issue #35): an earlier turn's content, not its header
    b = a + len("hello there")
    c = text.index("assistant:pre")
    assert torch.nonzero(keep).flatten().tolist() == list(range(a, b)) + list(range(c, len(text)))
    feats = conversation_features(model, [(ids, torch.ones(len(ids), dtype=torch.bool))], spec)[0]  # [T, F]
    user_row, asst_row = feats[3], feats[a + 1]  # a token of the user turn, one of "hello there"
    rule = [parse_rule("all of {x}", name="r", action="block")]
    for row, mode, fires in ((user_row, "assistant", False), (user_row, True, True), (asst_row, "assistant", True)):
        det = CEDetector(Lookup([row, row + 1e3]), ["x", "y"], DetectorConfig(), spec=spec)
        det.thresholds = torch.tensor([0.5, 0.5])
        out = Monitor(model, det, rule, score_prompt=mode).generate(msgs, max_new_tokens=6, prefill="pre",
                                                                    stop_at_eos=False)
        assert out.stopped == fires, (mode, fires)
        if fires:
            assert out.events[0]["in_prompt"] and out.events[0]["token"] == 0
    # unfired: the generation continues the prefilled prompt exactly as plain generation does
    det = CEDetector(Lookup([feats[0] + 1e3, feats[0] + 1e3]), ["x", "y"], DetectorConfig(), spec=spec)
    out = Monitor(model, det, rule, score_prompt="assistant").generate(msgs, max_new_tokens=6, prefill="pre",
                                                                       stop_at_eos=False)
    assert out.token_ids == model.generate(ids, max_new_tokens=6, return_text=False, stop_at_eos=False)[0].tolist()
    with pytest.raises(ValueError, match="score_prompt"):
        Monitor(model, det, rule, score_prompt="user")
