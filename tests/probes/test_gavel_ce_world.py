"""GAVEL CE world (digest §2 CPU-scale validation): data generator checks (fast) and the full pass criteria (slow)."""
import random

import pytest
import torch

from interp.probes.gavel import ce_world
from interp.probes.gavel.ce_world import FAMILIES, _window_labels, make_conversation


def test_conversations_have_phrases_and_isolated_decoys():
    rng = random.Random(0)
    for _ in range(50):
        ces = [c for c in FAMILIES if rng.random() < 0.5]
        seq, owner, last = make_conversation(rng, ces, 40)
        assert len(seq) == len(owner) == len(last) == 40
        assert {o for o in owner if o} == set(ces)
        for i, w in enumerate(seq):
            if owner[i] is None and w[0] in "abcd":  # a decoy: no neighbour of its family
                for j in (i - 1, i + 1):
                    assert not (0 <= j < 40 and seq[j][0] == w[0])
        for i in range(40):
            if last[i]:  # phrase = 3 cyclically consecutive family words ending here
                fam = seq[i][0]
                ks = [int(seq[i - 2 + j][1]) for j in range(3)]
                assert all(seq[i - 2 + j][0] == fam for j in range(3))
                assert ks[1] == (ks[0] + 1) % 5 and ks[2] == (ks[1] + 1) % 5


def test_window_labels():
    owner = [None] * 12
    last = [False] * 12
    for i in (3, 4, 5):
        owner[i] = "A"
    last[5] = True
    lab = _window_labels(owner, last, ["A", "B"], 5)  # windows 0-4, 5-9, 7-11
    assert lab[:, 0].tolist() == [-1, 1, 0] and lab[:, 1].tolist() == [0, 0, 0]


@pytest.mark.slow
def test_ce_world_pass_criteria(tmp_path, monkeypatch):
    """Digest pass criteria; measured 2026-12-01: window AUC A/B/C/D 0.9998/0.9986/0.9991/0.9997, GAVEL rule AUC
    0.999, hard-negative FPR 0.00, monolithic hard FPR 0.92, keywords 0.65."""
    import interp
    torch.set_num_threads(1)
    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path))
    model = interp.load(f"zoo:{ce_world.ZOO_NAME}", backend="torch")
    res = ce_world.run_ce_world(model)
    assert all(res.passed.values()), (res.passed, res.window_auc, res.rules)
    df = res.to_frame()
    assert set(df.method) == {"gavel", "monolithic", "keywords"}
    res.save(tmp_path / "res")
    res.figure()


@pytest.mark.slow
def test_ce_world_monitor_stops_mid_generation_and_not_on_harmless():
    """A prefilled A phrase; the model is steered (last-layer residual pushed along two unembedding columns) to
    start a B phrase, completes it itself, and the monitor blocks mid-generation; harmless prompts never fire.

    (Without steering the model's own phrase completion right after the prompt puts the phrase's last word at the
    start of the first generated window, where this detector does not see it: B probability 0.006 online and
    offline alike.)"""
    import interp
    from interp.probes.gavel import Monitor, parse_rule
    torch.set_num_threads(1)
    model = interp.load(f"zoo:{ce_world.ZOO_NAME}", backend="torch")
    det = ce_world.ce_world_detector(model, n_train=80, n_cal=30)
    rule = parse_rule(ce_world.RULE, list(FAMILIES), name="R", action="block")
    tok = model.tokenizer
    W_U = model.weight("W_U")  # [d_model, vocab]
    plan = {1: tok.convert_tokens_to_ids("b0"), 2: tok.convert_tokens_to_ids("b1")}  # pass k emits token k+1

    def steer(t, ctx):
        if ctx.pass_index in plan:
            t = t.clone()
            t[:, -1] += 100 * W_U[:, plan[ctx.pass_index]] / W_U[:, plan[ctx.pass_index]].norm()
        return t
    prompt = "<bos> w1 w7 w3 a2 a3 a4 w9 w12 w5 w30 w2 w8 w17 w4"
    with model.intervene({f"blocks.{model.cfg.n_layers - 1}.hook_resid_post": steer}):
        out = Monitor(model, det, [rule], score_prompt=True).generate(prompt, max_new_tokens=20, stop_at_eos=False)
    words = tok.convert_ids_to_tokens(out.token_ids)
    assert words[1:4] == ["b0", "b1", "b2"], words  # steered b0 b1, then the model's own b2
    assert out.stopped and out.action == "block" and len(out.token_ids) == 5  # mid-way through 20 tokens
    (ev,) = out.events
    assert {"A", "B"} <= set(ev["fired"]) and ev["causes"]["B"][0]["span"] == [0, 5]
    rng = random.Random(1)
    fired = 0
    for _ in range(40):
        seq, _, _ = make_conversation(rng, [], 40)  # random negative: decoys only
        o = Monitor(model, det, [rule], score_prompt=True).generate("<bos> " + " ".join(seq), max_new_tokens=10,
                                                                   stop_at_eos=False)
        fired += bool(o.events)
    assert fired == 0
