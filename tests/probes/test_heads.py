"""Inactive-head scores (Sandoval-Segura et al., ICLR 2026): hand computations, planted heads, ablation."""
from __future__ import annotations

import math

import pytest
import torch

import interp
from interp.testing import tiny_model
from interp.probes.heads import (EXTRA_SCORES, PAPER_SCORES, SCORE_FUNCTIONS, DynamicZeroing, HeadScores, ablate_heads,
                          evaluate_ablation, head_statistics, inactive_sweep, output_weights, score_heads,
                          scores_from_statistics)

TEXTS = ["The quick brown fox jumps over the lazy dog again and again.",
         "Interpretability studies the internals of neural networks.",
         "A small model can still show inactive attention heads.",
         "Paris is the capital of France and a large city.",
         "She sold sea shells by the sea shore on sunny days.",
         "Numbers like 12, 345 and 6789 appear in text too.",
         "def f(x): return x * 2  # a tiny python function",
         "The weather today is cold, windy and slightly rainy.",
         "Attention sinks put most weight on the first token.",
         "We measure the loss on held-out sentences only."]
D_HEAD = 16
ROPE_SLOW = 7  # the lowest-frequency rotary pair of a 16-dim head: positions barely rotate it


# --------------------------------------------------------------------------------- helpers
def _naive(mask, pattern, v, z, w_o, n_heads):
    """Loop-by-loop reference of the base statistics, on the real tokens of each input only."""
    L, B = z.shape[0], z.shape[1]
    n_kv = v.shape[3]
    out = {k: torch.zeros(L, B, n_heads) for k in ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon", "fho")}
    for b in range(B):
        idx = mask[b].nonzero().flatten()
        f, last = int(idx[0]), int(idx[-1])
        for l in range(L):
            for h in range(n_heads):
                kv = h // (n_heads // n_kv)
                a = pattern[l, b, h][idx][:, idx]  # real queries x real keys
                out["awft"][l, b, h] = a[:, 0].mean()
                ent = [-sum(float(p) * math.log(float(p)) for p in row if p > 0) for row in a]
                out["aeqd"][l, b, h] = sum(ent) / len(ent)
                out["ftvvn"][l, b, h] = v[l, b, f, kv].norm()
                out["avvn"][l, b, h] = torch.stack([v[l, b, t, kv].norm() for t in idx]).mean()
                out["lthon"][l, b, h] = z[l, b, last, h].norm()
                out["ahon"][l, b, h] = torch.stack([z[l, b, t, h].norm() for t in idx]).mean()
                out["fho"][l, b, h] = torch.stack([(z[l, b, t, h] @ w_o[l, h]).norm() for t in idx]).mean()
    return out


def _random_inputs(seed=0, L=2, B=3, S=6, H=4, n_kv=2, d=5, dm=7):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    mask[2, -3:] = 0  # right padding
    logits = torch.randn(L, B, H, S, S, generator=g) * 2
    causal = torch.ones(S, S).tril().bool()
    allowed = causal[None, None, None] & mask.bool()[None, :, None, None, :]
    pattern = logits.masked_fill(~allowed, -1e9).softmax(-1)
    v = torch.randn(L, B, S, n_kv, d, generator=g)
    z = torch.randn(L, B, S, H, d, generator=g)
    w_o = torch.randn(L, H, d, dm, generator=g)
    return mask, pattern, v, z, w_o


def _first_real(ctx, t):
    mask = ctx.attention_mask
    return mask.int().argmax(-1) if mask is not None else torch.zeros(t.shape[0], dtype=torch.long)


def _q_sink(head):
    """All of ``head``'s queries point along the slow rotary dimension."""
    def fn(q, ctx):
        q = q.clone()
        q[:, :, head, :] = 0
        q[:, :, head, ROPE_SLOW] = 10.0
        return q
    return fn


def _k_sink(group):
    """The first token's key of KV ``group`` points along the slow rotary dimension too."""
    def fn(k, ctx):
        k = k.clone()
        b, f = torch.arange(k.shape[0]), _first_real(ctx, k)
        k[b, f, group, :] = 0
        k[b, f, group, ROPE_SLOW] = 10.0
        return k
    return fn


def _v_small_first(group):
    def fn(v, ctx):
        v = v.clone()
        b, f = torch.arange(v.shape[0]), _first_real(ctx, v)
        v[b, f, group, :] *= 1e-3
        return v
    return fn


def _planted():
    """A 4-layer Llama (4 query heads over 2 KV heads) with inactive heads planted in every layer.

    layer 0: head 0 puts all attention on the first token (values untouched);
    layer 1: KV head 1 has its value projection scaled by 1e-3 -> query heads 2 and 3 have tiny values;
    layer 2: head 1's slice of the output projection is zeroed;
    layer 3: head 2 attends to the first token and the first token's value (KV head 1) is tiny — a
             classic dormant head (its KV partner, head 3, shares the tiny first value but looks elsewhere).
    """
    hf, tok = tiny_model("llama", n_layers=4, d_model=64, n_heads=4)
    with torch.no_grad():
        hf.model.layers[1].self_attn.v_proj.weight[D_HEAD:2 * D_HEAD] *= 1e-3
        hf.model.layers[2].self_attn.o_proj.weight[:, D_HEAD:2 * D_HEAD] = 0
    plants = {"blocks.0.attn.hook_q": _q_sink(0), "blocks.0.attn.hook_k": _k_sink(0),
              "blocks.3.attn.hook_q": _q_sink(2), "blocks.3.attn.hook_k": _k_sink(1),
              "blocks.3.attn.hook_v": _v_small_first(1)}
    return hf, tok, plants


SINK = {(0, 0), (3, 2)}
PLANTED = {(0, 0), (1, 2), (1, 3), (2, 1), (3, 2)}
EXPECTED = {  # which planted heads each score function must see
    "AWFT": SINK, "AWFT (LN)": SINK, "AEQD": SINK, "AEQD (LN)": SINK,
    "FTVVN": {(1, 2), (1, 3), (3, 2), (3, 3)}, "FTVVN (LN)": {(1, 2), (1, 3), (3, 2), (3, 3)},
    "AVVN": {(1, 2), (1, 3)}, "AVVN (LN)": {(1, 2), (1, 3)},
    "LTHON": {(1, 2), (1, 3), (3, 2)}, "LTHON (LN)": {(1, 2), (1, 3), (3, 2)},
    "AHON": {(1, 2), (1, 3), (3, 2)}, "AHON (LN)": {(1, 2), (1, 3), (3, 2)},
    "FullHeadOutput": {(1, 2), (1, 3), (2, 1), (3, 2)}, "FullHeadOutput (LN)": {(1, 2), (1, 3), (2, 1), (3, 2)},
    "LTHON (HN)": set(),  # scale-free within a head: none of the plants changes it
}


@pytest.fixture(scope="module")
def llama():
    hf, tok = tiny_model("llama", n_layers=2)
    return hf, tok, interp.wrap(hf, tok)


@pytest.fixture(scope="module")
def planted():
    hf, tok, plants = _planted()
    model = interp.wrap(hf, tok)
    with model.intervene(plants):
        scores = score_heads(model, TEXTS)
    return model, plants, scores


# ------------------------------------------------------------------------------ unit tests
def test_score_catalogue_matches_paper():
    assert len(PAPER_SCORES) == 12 and len(EXTRA_SCORES) == 3
    assert [SCORE_FUNCTIONS[n].number for n in PAPER_SCORES] == list(range(1, 13))
    assert [n for n in SCORE_FUNCTIONS if SCORE_FUNCTIONS[n].inactive_if == ">"] == ["AWFT", "AWFT (LN)"]
    assert SCORE_FUNCTIONS["AHON (LN)"].code_class == "HonorHeads"


def test_entropy_of_one_hot_and_uniform_rows():
    S = 5
    mask = torch.ones(1, S, dtype=torch.long)
    one_hot = torch.zeros(1, 1, 2, S, S)
    one_hot[..., 0, :, 0] = 1.0  # head 0: every query on token 0
    for i in range(S):  # head 1: uniform over the causal prefix of i+1 keys
        one_hot[0, 0, 1, i, : i + 1] = 1.0 / (i + 1)
    stats = head_statistics(mask, pattern=one_hot)
    assert stats["aeqd"][0, 0, 0].item() == pytest.approx(0.0, abs=1e-7)
    assert stats["awft"][0, 0, 0].item() == pytest.approx(1.0)
    want = sum(math.log(k) for k in range(1, S + 1)) / S
    assert stats["aeqd"][0, 0, 1].item() == pytest.approx(want, rel=1e-6)
    assert stats["awft"][0, 0, 1].item() == pytest.approx(sum(1 / k for k in range(1, S + 1)) / S, rel=1e-6)


def test_vectorised_statistics_equal_naive_loops_with_padding_and_gqa():
    mask, pattern, v, z, w_o = _random_inputs()
    fast = head_statistics(mask, pattern, v, z, w_o, n_heads=4)
    slow = _naive(mask, pattern, v, z, w_o, 4)
    for key in slow:
        torch.testing.assert_close(fast[key], slow[key], rtol=1e-5, atol=1e-5, msg=key)


def test_layer_normalised_scores_average_one_per_layer_and_input():
    mask, pattern, v, z, w_o = _random_inputs(seed=1)
    s = scores_from_statistics(head_statistics(mask, pattern, v, z, w_o, n_heads=4), list(SCORE_FUNCTIONS))
    for name in ("AWFT (LN)", "AEQD (LN)", "FTVVN (LN)", "AVVN (LN)", "AHON (LN)", "FullHeadOutput (LN)"):
        torch.testing.assert_close(s[name].mean(-1), torch.ones(3, 2), msg=name)
    torch.testing.assert_close(s["LTHON (LN)"], s["LTHON"] / s["AHON"].mean(-1, keepdim=True))
    torch.testing.assert_close(s["LTHON (HN)"], s["LTHON"] / s["AHON"])


def test_thresholds_follow_the_empirical_cdf():
    vals = torch.arange(40, dtype=torch.float32).view(10, 2, 2)
    hs = HeadScores({"AHON (LN)": vals, "AWFT": vals.clone()}, torch.full((10,), 5))
    assert not hs.inactive("AHON (LN)", 0.0).any() and not hs.inactive("AWFT", 0.0).any()
    assert hs.threshold("AHON (LN)", 0.1) == pytest.approx(3.9)  # 0.1-quantile of 0..39
    assert hs.inactive("AHON (LN)", 0.1).sum() == 4  # values 0, 1, 2, 3
    assert hs.threshold("AWFT", 0.1) == pytest.approx(35.1)  # greater-than score: the 0.9-quantile
    assert hs.inactive("AWFT", 0.1).sum() == 4  # values 36..39
    assert hs.inactive("AWFT", threshold=37.5).sum() == 2
    assert hs.ranking("AHON (LN)")[0] == (0, 0) and hs.ranking("AWFT")[0] == (1, 1)
    with pytest.raises(ValueError, match="unknown score function"):
        hs.threshold("AHONN", 0.1)


# ------------------------------------------------------------------------------- on models
def test_output_weights_rebuild_the_attention_output():
    """Σ_h z_h W_O[h] + b equals the attention output on Linear (Llama, NeoX) and Conv1D (GPT-2) layouts."""
    for arch, backend in (("llama", "torch"), ("gpt2", "torch"), ("gpt_neox", "nnsight"), ("llama", "transformer_lens")):
        hf, tok = tiny_model(arch)
        model = interp.wrap(hf, tok, backend=backend)
        w = output_weights(model)
        assert w.shape == (2, 4, 16, 64)
        _, cache = model.run_with_cache("hello there", names=["blocks.1.attn.hook_z", "blocks.1.hook_attn_out"])
        rebuilt = torch.einsum("bshd,hde->bse", cache["blocks.1.attn.hook_z"], w[1])
        diff = cache["blocks.1.hook_attn_out"] - rebuilt  # the shared bias (zero for Llama)
        torch.testing.assert_close(diff, diff[:, :1].expand_as(diff), atol=1e-5, rtol=0, msg=f"{arch}/{backend}")


def test_scores_agree_across_backends_padding_and_batching(llama):
    hf, tok, model = llama
    ref = score_heads(model, TEXTS[:4], padding_side="right")
    runs = [score_heads(model, TEXTS[:4], padding_side="left"),
            score_heads(model, TEXTS[:4], batch_size=1),
            score_heads(interp.wrap(hf, tok, backend="nnsight"), TEXTS[:4])]
    for other in runs:
        for n in ref.names:
            torch.testing.assert_close(other.per_input[n], ref.per_input[n], rtol=1e-4, atol=1e-5, msg=n)
    assert ref.per_input["AHON (LN)"].shape == (4, 2, 4)
    # grouped-query attention: query heads 0,1 read KV head 0 and heads 2,3 read KV head 1
    ftvvn = ref.per_input["FTVVN"]
    assert torch.equal(ftvvn[..., 0], ftvvn[..., 1]) and torch.equal(ftvvn[..., 2], ftvvn[..., 3])
    assert not torch.equal(ftvvn[..., 0], ftvvn[..., 2])


def test_transformer_lens_backend_gives_the_same_scores():
    hf, tok = tiny_model("llama", n_layers=2)
    ref = score_heads(interp.wrap(hf, tok), TEXTS[:3])
    tl = score_heads(interp.wrap(hf, tok, backend="transformer_lens"), TEXTS[:3])
    for n in ref.names:
        torch.testing.assert_close(tl.per_input[n], ref.per_input[n], rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "gemma2", "bert", "vit"])
def test_every_architecture_is_scored(arch):
    hf, tok = tiny_model(arch)
    model = interp.wrap(hf, tok)
    inputs = torch.randn(2, 3, 32, 32) if arch == "vit" else TEXTS[:2]
    s = score_heads(model, inputs)
    for n in s.names:
        assert s.per_input[n].shape == (2, 2, 4), n
        assert torch.isfinite(s.per_input[n]).all(), n


def test_planted_heads_are_flagged_by_exactly_the_scores_that_see_them(planted):
    _, _, scores = planted
    total = scores.n_layers * scores.n_heads
    for name, expected in EXPECTED.items():
        if not expected:  # LTHON (HN): its invariance is checked in test_scores_blind_to_a_plant_do_not_move
            continue
        got = set(scores.flagged(name, fraction=len(expected) / total))
        assert got == expected, f"{name}: flagged {sorted(got)}, expected {sorted(expected)}"
        # the heads it should see are flagged on (almost) every input; every other head — normal heads and
        # the planted heads this score is blind to — (almost) never
        rate = scores.flag_rate(name, fraction=len(expected) / total)
        for l in range(scores.n_layers):
            for h in range(scores.n_heads):
                assert (rate[l, h] >= 0.95) if (l, h) in expected else (rate[l, h] <= 0.05), (name, l, h)
    # the digest's criterion: the heads with dead outputs are the bottom 3 of AHON (LN) on >= 95 % of inputs
    flat = scores.per_input["AHON (LN)"].flatten(1)
    bottom = [{(int(i) // 4, int(i) % 4) for i in row} for row in flat.argsort(-1)[:, :3]]
    assert sum(b == EXPECTED["AHON (LN)"] for b in bottom) >= 0.95 * len(bottom)
    # a sink head with normal values is *more* active than average by the output norms
    assert scores.scores["AHON (LN)"][0, 0] > 1.5


def test_scores_blind_to_a_plant_do_not_move():
    """Zeroing W_O[h] leaves every z/v/pattern score of its layer unchanged; scaling V leaves the pattern
    scores and the scale-free HN score unchanged."""
    hf, tok = tiny_model("llama", n_layers=2)
    model = interp.wrap(hf, tok)
    clean = score_heads(model, TEXTS[:4])
    attn = hf.model.layers[1].self_attn
    with torch.no_grad():
        old_o = attn.o_proj.weight[:, :D_HEAD].clone()
        attn.o_proj.weight[:, :D_HEAD] = 0
    try:
        no_o = score_heads(model, TEXTS[:4])
    finally:
        with torch.no_grad():
            attn.o_proj.weight[:, :D_HEAD] = old_o
    for n in clean.names:
        same = torch.equal(no_o.per_input[n][:, 1], clean.per_input[n][:, 1])
        assert same == (not n.startswith("FullHeadOutput")), n
    with torch.no_grad():
        attn.v_proj.weight[:D_HEAD] *= 1e-3  # KV head 0 -> query heads 0 and 1
    small_v = score_heads(model, TEXTS[:4])
    for n in ("AWFT", "AWFT (LN)", "AEQD", "AEQD (LN)"):
        assert torch.equal(small_v.per_input[n], clean.per_input[n]), n
    torch.testing.assert_close(small_v.per_input["LTHON (HN)"][:, 1], clean.per_input["LTHON (HN)"][:, 1])
    assert (small_v.per_input["AHON"][:, 1, :2] < 2e-3 * clean.per_input["AHON"][:, 1, :2]).all()


def test_ablate_heads_equals_removing_the_heads_from_the_weights(llama):
    hf, tok, model = llama
    batch = model.tokenize(TEXTS[:3])
    with model.intervene(ablate_heads(model, [(1, 2), (0, 0)])):
        ablated = model(batch)
    attn0, attn1 = hf.model.layers[0].self_attn, hf.model.layers[1].self_attn
    saved = attn0.o_proj.weight.clone(), attn1.o_proj.weight.clone()
    with torch.no_grad():
        attn0.o_proj.weight[:, :D_HEAD] = 0
        attn1.o_proj.weight[:, 2 * D_HEAD:3 * D_HEAD] = 0
    try:
        surgery = model(batch)
    finally:
        with torch.no_grad():
            attn0.o_proj.weight.copy_(saved[0])
            attn1.o_proj.weight.copy_(saved[1])
    torch.testing.assert_close(ablated, surgery, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ablated, model(batch), atol=1e-4)


def test_per_input_and_mean_ablation(llama):
    hf, tok, model = llama
    batch = model.tokenize(TEXTS[:2])
    mask = torch.zeros(2, 2, 4, dtype=torch.bool)
    mask[0, 0, 1] = True
    mask[1, 1, 3] = True
    with model.intervene(ablate_heads(model, mask)):
        both = model(batch)
    for i, heads in enumerate(([(0, 1)], [(1, 3)])):
        with model.intervene(ablate_heads(model, heads)):
            alone = model(batch)
        torch.testing.assert_close(both[i], alone[i], rtol=1e-5, atol=1e-5)
    means = torch.randn(2, 4, D_HEAD)
    with model.intervene(ablate_heads(model, [(1, 2)], method="mean", mean_from=means)):
        _, cache = model.run_with_cache(batch, names="blocks.1.attn.hook_z")
    z = cache["blocks.1.attn.hook_z"]
    torch.testing.assert_close(z[:, :, 2], means[1, 2].expand_as(z[:, :, 2]))
    with pytest.raises(ValueError, match="out of range"):
        ablate_heads(model, [(5, 0)])
    with pytest.raises(ValueError, match="mean_from"):
        ablate_heads(model, [(0, 0)], method="mean")


def test_dynamic_zeroing_extremes_and_backend_rules(llama):
    hf, tok, model = llama
    batch = model.tokenize(TEXTS[:2])
    base = model(batch)
    with model.intervene(DynamicZeroing(model, "AHON (LN)", threshold=-1.0)):
        torch.testing.assert_close(model(batch), base)
    every = DynamicZeroing(model, "AHON (LN)", threshold=float("inf"))
    with model.intervene(every):
        out = model(batch)
    with model.intervene(ablate_heads(model, torch.ones(2, 4, dtype=torch.bool))):
        torch.testing.assert_close(out, model(batch))
    assert every.flagged[0].shape == (2, 2, 4) and every.flagged[0].all()
    with pytest.raises(ValueError, match="transformer_lens"):
        DynamicZeroing(model, "AWFT", 0.5)


def test_planted_heads_ablation_costs_less_than_random_heads(planted):
    model, plants, scores = planted
    heads = scores.flagged("AHON (LN)", fraction=3 / 16)
    assert set(heads) == {(1, 2), (1, 3), (3, 2)}
    with model.intervene(plants):
        res = evaluate_ablation(model, TEXTS, heads, n_random=3, seed=0)
    assert abs(res.delta) < 1e-3 * abs(res.baseline)
    assert abs(res.delta) < 0.2 * abs(res.random_delta)
    assert res.n_heads == 3 and len(res.random) == 3
    frame = res.to_frame()
    assert list(frame["condition"][:2]) == ["baseline", "selected"]


def test_inactive_sweep_on_planted_model(planted):
    model, plants, _ = planted
    with model.intervene(plants):
        sweep = inactive_sweep(model, TEXTS[:6], "AHON (LN)", fractions=(0.0, 0.15), n_random=2, batch_size=6)
    assert sweep.mode == "dynamic" and sweep.values[0] == pytest.approx(sweep.baseline)
    assert sweep.heads_zeroed[1] > 0
    assert abs(sweep.values[1] - sweep.baseline) < 1e-3 * sweep.baseline  # only the planted dead heads go
    assert sweep.percent_inactive == pytest.approx(15.0)


def test_result_views_and_round_trip(planted, tmp_path):
    _, _, scores = planted
    frame = scores.to_frame()
    assert set(frame.columns) >= {"score", "layer", "head", "mean", "std"}
    assert len(frame) == 15 * 16
    fig = scores.figure()
    assert len(fig.data) == 15 and len(fig.layout.updatemenus[0].buttons) == 15
    assert [t.visible for t in fig.data].count(True) == 1
    summary = scores.summary(0.1)
    assert list(summary["score"]) == list(SCORE_FUNCTIONS)
    back = HeadScores.load(scores.save(tmp_path / "scores"))
    for n in scores.names:
        assert torch.equal(back.per_input[n], scores.per_input[n])
    iou = scores.iou(3 / 16)
    assert iou.loc["AHON", "AHON (LN)"] == pytest.approx(1.0)
    assert iou.loc["AWFT", "AHON (LN)"] < 0.5


def test_bad_inputs_have_clear_errors(llama):
    _, _, model = llama
    with pytest.raises(ValueError, match="unknown score function"):
        score_heads(model, TEXTS[:1], scores=["nope"])
    with pytest.raises(ValueError, match="no real tokens"):
        score_heads(model, {"input_ids": torch.ones(1, 4, dtype=torch.long),
                            "attention_mask": torch.zeros(1, 4, dtype=torch.long)})
    with pytest.raises(TypeError, match="unsupported inputs"):
        score_heads(model, 3.5)
