"""GAVEL validation helpers for the monitor on a real model: the model's own replies as CE-free data (prompts,
labels, generation), CE steering directions (difference of means, by hand), the steering vector (the monitor's
readouts below the steered layer are untouched) and the mid-generation summary."""
import math
import types

import pytest
import torch

import interp
from interp.probes.gavel import FeatureSpec, render_prompt
from interp.probes.gavel import library as lib
from interp.benchmarks.gavel.validation import (MonitorValidation, ce_directions, ce_steering_vector, library_test_set,
                                            own_replies, own_reply_conversations, own_reply_prompts,
                                            run_library_validation, token_ce_labels)
from interp.testing import tiny_model, tiny_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model():
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)  # GQA: 4 query / 2 KV heads
    return interp.wrap(hf, tok, backend="torch")


def test_own_reply_prompts_are_harmless_distinct_and_never_test_prompts():
    a, b = own_reply_prompts(30, "more"), own_reply_prompts(30, "more")
    assert a == b and len({str(p) for p in a}) == 30
    test = {str(t.messages[:-1]) for t in library_test_set(0)}
    assert not {str(p) for p in a} & test
    asks = [p[0]["content"] for p in a if len(p) == 1]
    assert asks == lib.harmless_prompts("more")[:15]  # alternating: asks at even places, contexts at odd
    for p in a:
        assert p[-1]["role"] == "user"
        if len(p) == 3:  # opener, a CE-free neutral assistant turn, follow-up
            assert p[0]["content"] in lib.USER_OPENERS and p[2]["content"] in lib.USER_FOLLOWUPS
            assert any(p[1]["content"].startswith(s.split("{")[0]) for s in lib._pool(None, "more"))
    # the asks run out (48 in "more"), then only contexts follow; the two splits never share an ask
    many = own_reply_prompts(120, "more")
    assert sum(len(p) == 1 for p in many) == 48 and len({str(p) for p in many}) == 120
    assert not set(lib.harmless_prompts("more")) & set(lib.harmless_prompts("val"))
    with pytest.raises(ValueError, match="split"):
        lib.harmless_prompts("test")


def test_own_reply_conversations_are_labelled_ce_free():
    prompts = own_reply_prompts(4, "val")
    replies = ["Sure, here it is.", "  ", "I'm sorry for your loss.", "Have a nice day!"]
    convs = own_reply_conversations(None, 4, "val", replies=replies)
    assert len(convs) == 3  # the empty reply is dropped
    assert [c.messages[:-1] for c in convs] == [prompts[0], prompts[2], prompts[3]]
    assert [c.messages[-1] for c in convs] == [{"role": "assistant", "content": r} for r in
                                               ("Sure, here it is.", "I'm sorry for your loss.", "Have a nice day!")]
    m = types.SimpleNamespace(tokenizer=tiny_tokenizer())
    for c in convs:
        assert c.ces == [] and c.spans == [] and c.kind == "own"
        ids, keep, lab = token_ce_labels(m, c, list(lib.CE_TEMPLATES))
        assert keep.any() and lab.shape == (len(ids), len(lib.CE_TEMPLATES)) and lab.sum() == 0
    with pytest.raises(ValueError, match="replies"):
        own_reply_conversations(None, 4, "val", replies=replies[:3])
    with pytest.raises(ValueError, match="protocol='v2'"):
        run_library_validation(None, FeatureSpec.range(0, 1), protocol="v1", n_own=4)


def test_own_replies_are_the_models_greedy_turns(model):
    prompts = own_reply_prompts(3, "more")
    got = own_replies(model, prompts, max_new_tokens=6, batch_size=2)  # padded batches of 2 and 1
    want = [model.generate(render_prompt(model, p), max_new_tokens=6)[0] for p in prompts]
    assert got == want and all(isinstance(g, str) for g in got)


def test_ce_directions_are_differences_of_means(model):
    layer, n = 1, 6
    dirs, ref = ce_directions(model, layer, n=n, batch_size=4)  # padded batches
    # by hand, one conversation at a time (no padding), from the same draw
    import random
    convs = lib.training_conversations(random.Random("gavel-library-steer/0"), n, "more")
    ces = list(lib.CE_TEMPLATES)
    rows = {c: [] for c in ces}
    free = []
    for c in convs:
        ids, keep, lab = token_ce_labels(model, c, ces)
        _, cache = model.run_with_cache(ids[None], names=[f"blocks.{layer}.hook_resid_pre"])
        x = cache[f"blocks.{layer}.hook_resid_pre"][0].double()
        for j, ce in enumerate(ces):
            rows[ce] += list(x[lab[:, j] == 1])
        free += list(x[keep & (lab.sum(1) == 0)])
    free_t = torch.stack(free)
    shown = [ce for ce in ces if rows[ce]]
    assert sorted(dirs) == sorted(shown) and len(shown) >= 3
    for ce in shown:
        want = torch.stack(rows[ce]).mean(0) - free_t.mean(0)
        torch.testing.assert_close(dirs[ce].double(), want, atol=1e-4, rtol=1e-4)
    assert math.isclose(ref, float(free_t.norm(dim=-1).mean()), rel_tol=1e-4)


def test_ce_steering_vector_touches_only_layers_from_the_steered_one(model):
    d = model.cfg.d_model
    g = torch.Generator().manual_seed(0)
    dirs = {"a": torch.randn(d, generator=g) * 3, "b": torch.randn(d, generator=g) * 0.5}
    vec = ce_steering_vector(dirs, ["a", "b"], layer=2, coeff=4.0, ref_norm=2.5)
    u = dirs["a"] / dirs["a"].norm() + dirs["b"] / dirs["b"].norm()
    torch.testing.assert_close(vec.direction, u / u.norm())
    assert vec.scale == pytest.approx(10.0) and vec.positions == (-1,) and vec.hooks == ("blocks.2.hook_resid_pre",)
    ids = model.to_tokens("hello there, monitor")
    names = ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z", "blocks.2.hook_resid_pre", "blocks.2.attn.hook_z"]
    _, plain = model.run_with_cache(ids, names=names)
    with vec.apply(model):
        _, steered = model.run_with_cache(ids, names=names)
    for n in names[:2]:  # the monitor's readouts below the steered layer: unchanged
        torch.testing.assert_close(steered[n], plain[n])
    diff = steered["blocks.2.hook_resid_pre"] - plain["blocks.2.hook_resid_pre"]
    torch.testing.assert_close(diff[0, -1], 10.0 * vec.direction)  # added at the last position only
    assert diff[0, :-1].abs().max() == 0
    assert not torch.allclose(steered["blocks.2.attn.hook_z"][0, -1], plain["blocks.2.attn.hook_z"][0, -1])


def test_monitor_summary_counts_mid_generation_stops():
    def row(kind, stopped, token, in_prompt=False, gen=32.0):
        return {"kind": kind, "fired": stopped, "stopped": stopped, "stop_token": token, "in_prompt": in_prompt,
                "gen_tokens": gen}
    nan = float("nan")
    rows = [row("positive", True, 10), row("positive", True, 0, True), row("positive", False, nan),
            row("positive", True, 19, gen=20.0),  # fired on the tail window after the generation ended
            row("positive", True, 18, gen=20.0), row("random", False, nan, gen=nan), row("random", True, 5, gen=nan),
            row("control", False, nan)]
    s = MonitorValidation(rows, 32).summary()
    assert s["positives"] == 5 and s["positives_stopped"] == 4 and s["positives_stopped_on_prompt"] == 1
    assert s["positives_stopped_mid_generation"] == 2 and s["stop_tokens"] == [10, 0, 19, 18]
    assert s["harmless"] == 2 and s["harmless_fired"] == 1 and s["controls"] == 1 and s["controls_fired"] == 0


class _Never(torch.nn.Module):
    """Test double for the GRU: every CE's logit is -10 (nothing ever fires)."""

    def __init__(self, n):
        super().__init__()
        self.n = n
        self.register_buffer("mean", torch.zeros(1))

    def forward(self, x):
        return torch.full((x.shape[0], self.n), -10.0)


def test_monitor_validation_positive_modes(model):
    from interp.probes.gavel import CEDetector, DetectorConfig
    from interp.benchmarks.gavel.validation import REQUEST, run_monitor_validation
    ces = list(lib.CE_TEMPLATES)
    det = CEDetector(_Never(len(ces)), ces, DetectorConfig(), spec=FeatureSpec.range(0, 2))
    det.thresholds = torch.full((len(ces),), 0.5)
    test = library_test_set(0)
    pos = [next(t for t in test if t.kind == "positive" and t.scenario == name) for name in lib.SCENARIOS]
    mv = run_monitor_validation(model, det, n_positive=1, max_new_tokens=4, request=True, harmless="none",
                                stop_at_eos=False)
    df = mv.to_frame()
    assert list(df.kind) == ["positive"] * 3 and not df.fired.any() and (df.gen_tokens == 4).all()
    rules = {r.name: r for r in lib.library_rules()}
    for (_, row), t in zip(df.iterrows(), pos):
        last = t.messages[-1]["content"]
        missing = sorted({ce for m, _, _, ce in t.spans if m == len(t.messages) - 1} & set(rules[t.scenario].condition_ces))
        assert row.steered == ",".join(missing) and missing
        want = " ".join(last[a:b] for m, a, b, ce in sorted(t.spans) if m == len(t.messages) - 1 and ce in missing)
        assert row.request == REQUEST.format(text=want)
        assert row.unmonitored == row.generated  # nothing fired: the flag and block runs generate the same turn
    mv = run_monitor_validation(model, det, n_positive=1, max_new_tokens=3, request=True, request_prefill=2,
                                harmless="none", stop_at_eos=False)
    for (_, row), t in zip(mv.to_frame().iterrows(), pos):
        assert row.prefill == " ".join(row.request[len(REQUEST.format(text="")):].split()[:2])
    d = model.cfg.d_model
    dirs = {c: torch.randn(d, generator=torch.Generator().manual_seed(i)) for i, c in enumerate(ces)}
    mv = run_monitor_validation(model, det, n_positive=1, max_new_tokens=3, harmless="none", stop_at_eos=False,
                                steer={"directions": dirs, "ref_norm": 1.0, "layer": 2, "coeff": 2.0}, control=True)
    assert list(mv.to_frame().kind) == ["positive"] * 3 + ["control"] * 3
    assert mv.summary()["controls"] == 3 and mv.summary()["controls_fired"] == 0
    with pytest.raises(ValueError, match="one positive mode"):
        run_monitor_validation(model, det, request=True, steer={})
    with pytest.raises(ValueError, match="harmless"):
        run_monitor_validation(model, det, harmless="some")


def test_run_smollm2_runs_through_stages_and_resumes(model, tmp_path):
    """The SmolLM2 run's pipeline on the tiny model: own replies, detector and monitor are stages; a second run with
    the same config computes nothing and gives the same table."""
    from interp.benchmarks.gavel.smollm2 import SmolLM2Config, run_smollm2
    from interp.probes.gavel import DetectorConfig
    from interp.stages import Stages
    cfg = SmolLM2Config(model="tiny", layers=(1, 3), n_train=12, n_cal=2, n_test=2, n_mono=2, n_mono_cal=2,
                        detector=DetectorConfig(hidden=8, rnn_layers=1, max_epochs=1), n_own=2, n_own_cal=2,
                        own_max_new_tokens=3, monitor_max_new_tokens=2)
    first = Stages("gavel/smollm2", cfg, root=tmp_path)
    a = run_smollm2(cfg, model=model, stages=first)
    assert first.computed == ["own-replies", "library-validation", "monitor-harmless"]
    assert set(a["validation"].to_frame().method) == {"gavel", "monolithic", "keywords"}
    assert a["monitor"].summary()["harmless"] == 15 and list(a["detector"].spec.layers) == [1, 2]
    again = Stages("gavel/smollm2", cfg, root=tmp_path)
    b = run_smollm2(cfg, model=model, stages=again)
    assert again.computed == []
    assert b["validation"].rows == a["validation"].rows
