"""Inactive-head scores (Sandoval-Segura et al., ICLR 2026): hand computations, planted heads, ablation."""
from __future__ import annotations

import math
import re
from dataclasses import asdict
from fractions import Fraction

import pytest
import torch

import interp
from interp.testing import tiny_model
from interp.configs import ConfigError
from interp.probes.heads import (EXTRA_SCORES, PAPER_SCORES, SCORE_FUNCTIONS, DynamicZeroing, HeadScores, SweepConfig,
                                 ablate_heads, cdf_thresholds, dynamic_zeroing, evaluate_ablation, head_statistics,
                                 inactive_sweep, output_weights, score_heads, scores_from_statistics)

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


def _official_rule(values, p, inactive_if):
    """The official thresholding rule by hand, in exact rational arithmetic: the CDF is the sorted scores
    x_(k) at heights k/N; τ is its inverse at y = p (1 − p for ">"), linear between the bracketing points, y
    clamped to [1/N, 1]; flagged means strictly below τ (above for ">")."""
    xs = sorted(Fraction(float(v)) for v in values)
    n = len(xs)
    y = Fraction(str(p)) if inactive_if == "<" else 1 - Fraction(str(p))
    y = min(max(y, Fraction(1, n)), Fraction(1))
    k = next(k for k in range(1, n + 1) if Fraction(k, n) >= y)  # first CDF point at or above y
    if k == 1:
        tau = xs[0]
    else:
        y1, y2 = Fraction(k - 1, n), Fraction(k, n)
        tau = xs[k - 2] + (y - y1) / (y2 - y1) * (xs[k - 1] - xs[k - 2])
    flagged = sum((x < tau) if inactive_if == "<" else (x > tau) for x in xs)
    return float(tau), flagged


def test_official_thresholds_by_hand():
    """The default convention is the official code's inverse CDF with strict comparison."""
    vals = torch.arange(40, dtype=torch.float32).view(10, 2, 2)  # N = 40, p·N = 4 exactly
    hs = HeadScores({"AHON (LN)": vals, "AWFT": vals.clone()}, torch.full((10,), 5))
    assert not hs.inactive("AHON (LN)", 0.0).any() and not hs.inactive("AWFT", 0.0).any()
    assert hs.threshold("AHON (LN)", 0.1) == 3.0  # y = 4/40 is the 4th CDF point: τ = x_(4) = 3
    assert hs.inactive("AHON (LN)", 0.1).sum() == 3  # strictly below: 0, 1, 2
    assert hs.threshold("AWFT", 0.1) == 35.0  # greater-than score: y = 0.9 = 36/40 -> x_(36) = 35
    assert hs.inactive("AWFT", 0.1).sum() == 4  # 36..39
    assert hs.threshold("AHON (LN)", 1.0) == 39.0 and hs.inactive("AHON (LN)", 1.0).sum() == 39
    # non-integer p·N interpolates between the bracketing CDF points; unequal gaps expose the weights
    sq = (torch.arange(30, dtype=torch.float64) ** 2).view(5, 2, 3)  # 0, 1, 4, 9, ..., 841
    hs = HeadScores({"AEQD": sq, "AWFT (LN)": sq.clone()}, torch.full((5,), 5))
    assert hs.thresholds("AEQD", [0.0, 0.05, 0.1, 0.3]) == [0.0, 0.5, 4.0, 64.0]  # 1.5/30 -> x_(1)+½(x_(2)−x_(1))
    assert [int(hs.inactive("AEQD", p).sum()) for p in (0.05, 0.1, 0.3)] == [1, 2, 8]
    assert hs.threshold("AWFT (LN)", 0.05) == pytest.approx(756.5)  # y = 0.95: 27² + ½(28² − 27²)
    assert hs.inactive("AWFT (LN)", 0.05).sum() == 2
    # the former convention stays available by name: torch.quantile interpolates at y·(N − 1)
    assert hs.threshold("AEQD", 0.1, convention="quantile") == pytest.approx(4 + 0.9 * 5)
    assert hs.inactive("AEQD", 0.1, convention="quantile").sum() == 3
    assert hs.threshold("AEQD", 0.1, convention="quantile") == pytest.approx(float(torch.quantile(sq.flatten(), 0.1)))
    assert hs.inactive("AWFT (LN)", threshold=800.0).sum() == 1
    assert hs.ranking("AEQD")[0] == (0, 0) and hs.ranking("AWFT (LN)")[0] == (1, 2)
    with pytest.raises(ValueError, match="unknown score function"):
        hs.threshold("AHONN", 0.1)
    with pytest.raises(ValueError, match="convention must be one of 'official', 'quantile'"):
        hs.inactive("AEQD", 0.1, convention="percentile")
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\]"):
        hs.threshold("AEQD", 1.5)


def test_official_thresholds_with_ties_at_the_boundary():
    """Grouped-query heads share value norms, so scores tie in groups of 3 (here 10 values × 3)."""
    tied = torch.arange(10, dtype=torch.float32).repeat_interleave(3).view(5, 2, 3)
    hs = HeadScores({"AVVN": tied, "AWFT": tied.clone()}, torch.full((5,), 5))
    # p = 10 %: y·N = 3 -> τ = x_(3) = 0, and nothing is strictly below the lowest tie group
    assert hs.threshold("AVVN", 0.1) == 0.0 and hs.inactive("AVVN", 0.1).sum() == 0
    assert hs.inactive("AVVN", 0.1, convention="quantile").sum() == 3  # τ = 0.9: the whole group of 0s
    assert hs.threshold("AVVN", 0.15) == 1.0 and hs.inactive("AVVN", 0.15).sum() == 3  # y·N = 4.5, inside a tie
    assert hs.threshold("AVVN", 0.2) == 1.0 and hs.inactive("AVVN", 0.2).sum() == 3
    assert hs.inactive("AVVN", 0.2, convention="quantile").sum() == 6  # τ = 1.8
    assert hs.threshold("AWFT", 0.1) == 8.0 and hs.inactive("AWFT", 0.1).sum() == 3  # > 8: the three 9s
    table = hs.compare_conventions((0.1, 0.2)).set_index(["score", "fraction"])
    assert table.loc[("AVVN", 0.2), ["pairs_quantile", "pairs_official"]].tolist() == [6, 3]
    assert table.loc[("AVVN", 0.1), ["tau_quantile", "tau_official"]].tolist() == pytest.approx([0.9, 0.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_official_thresholds_equal_the_rule_in_exact_arithmetic(seed):
    g = torch.Generator().manual_seed(seed)
    for n in (1, 2, 7, 30, 81, 100, 270):
        vals = torch.randn(n, generator=g).float()
        if seed == 1:  # grouped-query ties
            vals = vals[: (n + 2) // 3].repeat_interleave(3)[:n]
        if seed == 2:  # few distinct values
            vals = torch.randint(0, 4, (n,), generator=g).float()
        hs = HeadScores({"AHON": vals.view(n, 1, 1), "AWFT": vals.view(n, 1, 1)}, torch.ones(n))
        for p in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.37, 0.5, 0.55, 0.99, 1.0):  # 0.55·100 = 55.00000000000001
            for name, op in (("AHON", "<"), ("AWFT", ">")):
                tau, count = _official_rule(vals.tolist(), p, op)
                assert hs.threshold(name, p) == pytest.approx(tau, rel=1e-12, abs=1e-12), (n, p, name)
                assert int(hs.inactive(name, p).sum()) == count, (n, p, name)
    # NaN scores (e.g. a score undefined on some input) are left out of the CDF
    hs = HeadScores({"AHON": torch.tensor([float("nan"), 0.0, 1.0, 2.0, 3.0]).view(5, 1, 1)}, torch.ones(5))
    assert hs.threshold("AHON", 0.5) == 1.0
    with pytest.raises(ValueError, match="no finite scores"):
        cdf_thresholds(torch.full((3,), float("nan")), [0.1])


def test_iou_is_intersection_over_union_of_the_per_input_masks():
    g = torch.Generator().manual_seed(0)
    hs = HeadScores({n: torch.rand(20, 3, 4, generator=g) for n in ("AHON", "AWFT", "AEQD")}, torch.ones(20))
    table = hs.iou(0.2)
    for a in hs.names:
        for b in hs.names:
            ma, mb = hs.inactive(a, 0.2), hs.inactive(b, 0.2)
            assert table.loc[a, b] == pytest.approx(float((ma & mb).sum()) / float((ma | mb).sum())), (a, b)
    assert table.loc["AHON", "AHON"] == 1.0 and table.loc["AHON", "AWFT"] < 0.5
    assert hs.iou(0.0).isna().all().all()  # nothing flagged anywhere: IoU undefined


def test_pattern_scores_padding_rules_by_hand():
    """One input of 2 real tokens right-padded to 3: the padded query row still attends to the real keys."""
    mask = torch.tensor([[1, 1, 0]])
    a = torch.zeros(1, 1, 1, 3, 3)
    a[0, 0, 0, 0] = torch.tensor([1.0, 0.0, 0.0])
    a[0, 0, 0, 1] = torch.tensor([0.25, 0.75, 0.0])
    a[0, 0, 0, 2] = torch.tensor([0.5, 0.5, 0.0])  # padded query row
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    drop = head_statistics(mask, a)
    assert drop["awft"].item() == pytest.approx((1 + 0.25) / 2)
    assert drop["aeqd"].item() == pytest.approx(h / 2)
    lit = head_statistics(mask, a, padded_queries="official")
    assert lit["awft"].item() == pytest.approx((1 + 0.25 + 0.5) / 3)
    assert lit["aeqd"].item() == pytest.approx((0 + h + math.log(2)) / 3)
    # left padding: the fully masked padded row sees no real key; the code's nansum makes its entropy 0
    mask = torch.tensor([[0, 1, 1]])
    b = torch.zeros(1, 1, 1, 3, 3)
    b[0, 0, 0, 0] = 1 / 3  # what a fully masked row may hold (uniform): ignored by both rules
    b[0, 0, 0, 1] = torch.tensor([0.0, 1.0, 0.0])
    b[0, 0, 0, 2] = torch.tensor([0.0, 0.4, 0.6])
    h2 = -(0.4 * math.log(0.4) + 0.6 * math.log(0.6))
    assert head_statistics(mask, b)["awft"].item() == pytest.approx(0.7)
    assert head_statistics(mask, b)["aeqd"].item() == pytest.approx(h2 / 2)
    lit = head_statistics(mask, b, padded_queries="official")
    assert lit["awft"].item() == pytest.approx(0.7)  # the padded row cannot see the first real token
    assert lit["aeqd"].item() == pytest.approx(h2 / 3)
    with pytest.raises(ValueError, match="padded_queries must be one of 'drop', 'official'"):
        head_statistics(mask, b, padded_queries="keep")


def _literal_pattern_rule(mask, pattern):
    """The official code's AWFT/AEQD on a causal pattern, NaN-masking as it does (future and padded keys)."""
    a = pattern.clone().double()
    S = a.shape[-1]
    causal = torch.ones(S, S).tril().bool()
    a = a.masked_fill(~causal, float("nan"))
    a = a.masked_fill(~mask.bool()[None, :, None, None, :], float("nan"))
    first = mask.int().argmax(-1)
    col = torch.stack([a[:, b, :, :, int(f)] for b, f in enumerate(first)], 1)  # [L, B, H, Q]
    entropy = -(a * a.log()).nansum(-1)
    return {"awft": col.nanmean(-1).float(), "aeqd": entropy.mean(-1).float()}


def test_official_padding_rule_equals_the_literal_nan_masking_on_random_patterns():
    mask, pattern, v, z, w_o = _random_inputs(seed=3, L=3)  # one left-, one right-padded input
    lit = head_statistics(mask, pattern, v, z, w_o, n_heads=4, padded_queries="official")
    drop = head_statistics(mask, pattern, v, z, w_o, n_heads=4)
    ref = _literal_pattern_rule(mask, pattern)
    for key in ("awft", "aeqd"):
        torch.testing.assert_close(lit[key], ref[key], rtol=1e-5, atol=1e-6, msg=key)
        torch.testing.assert_close(lit[key][:, 0], drop[key][:, 0])  # the unpadded input: same either way
        assert not torch.allclose(lit[key][:, 1:], drop[key][:, 1:])
    for key in ("ftvvn", "avvn", "lthon", "ahon", "fho"):  # the other statistics have no query rows
        assert torch.equal(lit[key], drop[key]), key


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


def test_padding_rules_on_a_right_padded_batch():
    """Default: padding changes no score. ``padded_queries="official"``: the code's literal rule, which moves
    only the pattern scores of the padded inputs."""
    hf, tok = tiny_model("llama", n_layers=3)
    with torch.no_grad():  # non-unit norm weights
        for layer in hf.model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
    model = interp.wrap(hf, tok)
    texts = TEXTS[:4]
    unpadded = score_heads(model, texts, batch_size=1)
    drop = score_heads(model, texts, padding_side="right")
    lit = score_heads(model, texts, padding_side="right", padded_queries="official")
    assert (drop.padded_queries, lit.padded_queries) == ("drop", "official")
    batch = model.tokenize(texts, padding_side="right")
    padded = batch["attention_mask"].sum(-1) < batch["attention_mask"].shape[1]
    assert padded.any() and not padded.all()
    for n in drop.names:
        torch.testing.assert_close(drop.per_input[n], unpadded.per_input[n], rtol=1e-4, atol=1e-5, msg=n)
    _, cache = model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")
    pattern_scores = ["AWFT", "AWFT (LN)", "AEQD", "AEQD (LN)"]
    want = scores_from_statistics(_literal_pattern_rule(batch["attention_mask"], cache.stack("attn.hook_pattern")),
                                  pattern_scores)
    for n in lit.names:
        if n in pattern_scores:
            torch.testing.assert_close(lit.per_input[n], want[n], rtol=1e-4, atol=1e-5, msg=n)
            torch.testing.assert_close(lit.per_input[n][~padded], drop.per_input[n][~padded], msg=n)
            if "(LN)" not in n:  # (LN) may barely move: a random model's heads move alike and cancel
                assert (lit.per_input[n][padded] - drop.per_input[n][padded]).abs().amax() > 1e-3, n
        else:
            torch.testing.assert_close(lit.per_input[n], drop.per_input[n], msg=n)
    # without padding the two rules are the same
    lit_unpadded = score_heads(model, texts, batch_size=1, scores=pattern_scores, padded_queries="official")
    for n in pattern_scores:
        torch.testing.assert_close(lit_unpadded.per_input[n], unpadded.per_input[n], msg=n)
    with pytest.raises(ValueError, match="padded_queries must be one of 'drop', 'official'"):
        score_heads(model, texts, padded_queries="keep")
    bert, bert_tok = tiny_model("bert")
    with pytest.raises(ValueError, match="not a causal LM"):
        score_heads(interp.wrap(bert, bert_tok), texts, padded_queries="official")


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "gemma2", "bert", "vit"])
def test_every_architecture_is_scored(arch):
    hf, tok = tiny_model(arch)
    model = interp.wrap(hf, tok)
    inputs = torch.randn(2, 3, 32, 32) if arch == "vit" else TEXTS[:2]
    s = score_heads(model, inputs)
    for n in s.names:
        assert s.per_input[n].shape == (2, 2, 4), n
        assert torch.isfinite(s.per_input[n]).all(), n


def _fraction_for(scores, name, k):
    """Target fraction at which the official rule flags exactly the k·n_inputs most inactive (input, head) pairs
    (when they are separated from the rest). With N pairs and y·N = m an integer, τ is the m-th order statistic
    and the comparison is strict: for a "<" score p = m/N flags m − 1 pairs, so p is set one pair higher; for a
    ">" score (y = 1 − p) τ is the (m+1)-th largest, and p = m/N flags exactly m."""
    n = scores.n_layers * scores.n_heads * scores.n_inputs
    m = k * scores.n_inputs
    return (m + 1) / n if SCORE_FUNCTIONS[name].inactive_if == "<" else m / n


def test_planted_heads_are_flagged_by_exactly_the_scores_that_see_them(planted):
    _, _, scores = planted
    for name, expected in EXPECTED.items():
        if not expected:  # LTHON (HN): its invariance is checked in test_scores_blind_to_a_plant_do_not_move
            continue
        got = set(scores.flagged(name, fraction=_fraction_for(scores, name, len(expected))))
        assert got == expected, f"{name}: flagged {sorted(got)}, expected {sorted(expected)}"
        # the heads it should see are flagged on (almost) every input; every other head — normal heads and
        # the planted heads this score is blind to — (almost) never
        rate = scores.flag_rate(name, fraction=_fraction_for(scores, name, len(expected)))
        for l in range(scores.n_layers):
            for h in range(scores.n_heads):
                assert (rate[l, h] >= 0.95) if (l, h) in expected else (rate[l, h] <= 0.05), (name, l, h)
    # the digest's criterion: the heads with dead outputs are the bottom 3 of AHON (LN) on >= 95 % of inputs
    flat = scores.per_input["AHON (LN)"].flatten(1)
    bottom = [{(int(i) // 4, int(i) % 4) for i in row} for row in flat.argsort(-1)[:, :3]]
    assert sum(b == EXPECTED["AHON (LN)"] for b in bottom) >= 0.95 * len(bottom)
    # a sink head with normal values is *more* active than average by the output norms
    assert scores.scores["AHON (LN)"][0, 0] > 1.5


def test_heads_report_shows_the_patterns_of_the_planted_heads(planted):
    """The audit section's attention view: the 3 most inactive heads by AHON (LN) (the dead-output plants) and the
    most active head, their patterns as the model computes them on the first score text's first 24 tokens."""
    from interp.probes.heads.audit_check import _pattern_view

    model, plants, scores = planted
    with model.intervene(plants):
        view = _pattern_view(model, TEXTS[0], scores.ranking("AHON (LN)"))
        ids = model.to_tokens(TEXTS[0])[:, :24]
        _, cache = model.run_with_cache(ids, names="blocks.*.attn.hook_pattern")
    assert {tuple(h) for h in view["heads"][:3]} == EXPECTED["AHON (LN)"]
    assert tuple(view["heads"][3]) == scores.ranking("AHON (LN)")[-1]
    assert view["tokens"] == model.to_str_tokens(ids[0]) and view["patterns"].shape[-1] == len(view["tokens"])
    for (l, h), p in zip(view["heads"], view["patterns"]):
        torch.testing.assert_close(p, cache[f"blocks.{l}.attn.hook_pattern"][0, h].float())


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
    # pattern scores are dynamic on the torch backend too (attn.hook_pattern is writable there): AWFT flags heads
    # whose first-token attention exceeds the threshold; -inf flags every head, +inf none
    all_awft = DynamicZeroing(model, "AWFT", threshold=float("-inf"))
    with model.intervene(all_awft):
        torch.testing.assert_close(model(batch), out)
    assert all_awft.flagged[0].all()
    with model.intervene(DynamicZeroing(model, "AWFT", threshold=float("inf"))):
        torch.testing.assert_close(model(batch), base)
    # a backend that cannot write the pattern is refused with a clear error
    model.can_write = lambda name: "hook_pattern" not in name
    try:
        with pytest.raises(ValueError, match="not writable"):
            DynamicZeroing(model, "AWFT", 0.5)
    finally:
        del model.can_write


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
    model, plants, scores = planted
    with model.intervene(plants):
        sweep = inactive_sweep(model, TEXTS[:6], "AHON (LN)", fractions=(0.0, 0.15), n_random=2, batch_size=6)
        calibrated = inactive_sweep(model, TEXTS[:6], "AHON (LN)", fractions=(0.15,), calibration=scores,
                                    n_random=0, batch_size=6, convention="quantile")
    assert calibrated.thresholds == [scores.threshold("AHON (LN)", 0.15, convention="quantile")]
    assert calibrated.convention == "quantile" and sweep.convention == "official"
    for conv in ("official", "quantile"):
        dz = dynamic_zeroing(model, "AHON (LN)", calibration=scores, fraction=0.15, convention=conv)
        assert dz.threshold == scores.threshold("AHON (LN)", 0.15, convention=conv)
    assert sweep.mode == "dynamic" and sweep.values[0] == pytest.approx(sweep.baseline)
    assert sweep.heads_zeroed[1] > 0
    assert abs(sweep.values[1] - sweep.baseline) < 1e-3 * sweep.baseline  # only the planted dead heads go
    assert sweep.percent_inactive == pytest.approx(15.0)


def test_inactive_sweep_config_and_keywords_give_the_same_sweep(planted):
    model, plants, scores = planted
    opts = dict(n_random=2, seed=3, batch_size=6, tolerance=0.05, convention="quantile")
    cfg = SweepConfig("AHON (LN)", [0.0, 0.15], **opts)
    assert cfg.fractions == (0.0, 0.15)  # a list is stored as a tuple: the config is hashable
    hash(cfg)
    with model.intervene(plants):
        by_keywords = inactive_sweep(model, TEXTS[:6], "AHON (LN)", [0.0, 0.15], calibration=scores, **opts)
        by_config = inactive_sweep(model, TEXTS[:6], calibration=scores, config=cfg)
    assert asdict(by_config) == asdict(by_keywords)
    assert by_config.fractions == [0.0, 0.15] and len(by_config.random[1]) == 2
    assert by_config.tolerance == 0.05 and by_config.convention == "quantile"


@pytest.mark.parametrize("field, value, expected", [
    ("score", "NOPE", "SweepConfig.score must be one score function"),
    ("score", ["AHON (LN)", "AWFT"], "SweepConfig.score must be one score function"),
    ("fractions", (0.1, 1.5), "SweepConfig.fractions must be a non-empty sequence of fractions in [0, 1]; got"),
    ("fractions", (), "SweepConfig.fractions must be"),
    ("n_random", -1, "SweepConfig.n_random must be an integer >= 0; got -1"),
    ("seed", 0.5, "SweepConfig.seed must be an integer; got 0.5"),
    ("metric", "acc", "SweepConfig.metric must be 'loss', 'accuracy' or a callable"),
    ("tolerance", -0.01, "SweepConfig.tolerance must be a number >= 0; got -0.01"),
    ("tolerance", float("nan"), "SweepConfig.tolerance must be a number >= 0; got nan"),
    ("batch_size", 0, "SweepConfig.batch_size must be a positive integer or None; got 0"),
    ("max_length", True, "SweepConfig.max_length must be a positive integer or None; got True"),
    ("convention", "median", "SweepConfig.convention must be one of 'official', 'quantile'; got 'median'"),
    ("padded_queries", "keep", "SweepConfig.padded_queries must be one of 'drop', 'official'; got 'keep'"),
])
def test_sweep_config_refuses_bad_fields(field, value, expected):
    with pytest.raises(ConfigError, match="^" + re.escape(expected)) as err:
        SweepConfig(**{field: value})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=field):  # the keyword call builds (and checks) the same config
        inactive_sweep(None, TEXTS, **{field: value})


def test_inactive_sweep_refuses_config_mixed_with_keywords_and_unknown_options():
    with pytest.raises(ConfigError, match="inactive_sweep: pass either config= or the options as keywords, not both; "
                                          "got config= and n_random"):
        inactive_sweep(None, TEXTS, config=SweepConfig(), n_random=1)
    with pytest.raises(ConfigError, match="not both; got config= and score"):
        inactive_sweep(None, TEXTS, "AWFT", config=SweepConfig())
    with pytest.raises(ConfigError, match="inactive_sweep: config must be a SweepConfig, got dict"):
        inactive_sweep(None, TEXTS, config={"n_random": 1})
    with pytest.raises(ConfigError, match=r"unknown field\(s\) 'n_randon' \(did you mean 'n_random'\?\)"):
        inactive_sweep(None, TEXTS, n_randon=1)


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
    iou = scores.iou(_fraction_for(scores, "AHON", 3))
    assert iou.loc["AHON", "AHON (LN)"] == pytest.approx(1.0)
    assert iou.loc["AWFT", "AHON (LN)"] < 0.5


def test_configs_validate_their_fields():
    from interp.probes.heads.audit_check import HeadsConfig
    from interp.benchmarks.heads.experiment import ValidationConfig

    assert HeadsConfig().convention == "official" and HeadsConfig().padded_queries == "drop"
    with pytest.raises(ValueError, match="heads.convention must be one of 'official', 'quantile'"):
        HeadsConfig(convention="numpy")
    with pytest.raises(ValueError, match="heads.padded_queries must be one of 'drop', 'official'"):
        HeadsConfig(padded_queries="keep")
    with pytest.raises(ValueError, match=r"heads.fraction must be in \[0, 1\]"):
        HeadsConfig(fraction=1.5)
    with pytest.raises(ValueError, match="convention must be one of"):
        ValidationConfig(convention="numpy")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        ValidationConfig(batch_size=0)
    with pytest.raises(ValueError, match="padded_queries must be one of"):
        HeadScores({"AHON": torch.zeros(1, 1, 1)}, torch.ones(1), padded_queries="keep")


def test_bad_inputs_have_clear_errors(llama):
    _, _, model = llama
    with pytest.raises(ValueError, match="unknown score function"):
        score_heads(model, TEXTS[:1], scores=["nope"])
    with pytest.raises(ValueError, match="no real token"):
        score_heads(model, {"input_ids": torch.ones(1, 4, dtype=torch.long),
                            "attention_mask": torch.zeros(1, 4, dtype=torch.long)})
    with pytest.raises(TypeError, match="unsupported inputs"):
        score_heads(model, 3.5)
