"""The paper's / digest's validation criteria for the planning probe (digest §4, docs/planning.md).

All are ``slow`` (VQ-VAEs of validation size; the zoo models are built on a cold cache). Fast toy versions
of the same checks are in test_planning_vqvae.py (estimator) and test_planning_analyses.py (mechanics).
Where an effect does not reproduce at our scale the test is a strict xfail whose reason holds the numbers.
"""
import numpy as np
import pytest

import interp
from interp.probes.planning import (BlockMapConfig, BranchConfig, HorizonConfig, block_layer_map, branch_awareness,
                                    estimator_sanity, horizon_curve, task_for)
from interp.probes.planning.validation import (BRANCH_RUN, HORIZON_RUN, SMOLLM_RUN, decay_criteria,
                                               horizon_criteria, horizon_run_for)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("k", [16, 64])
def test_estimator_sanity_paper(k):
    """Recipe 1: Spearman >= 0.9 over 5 noise levels; independent sources within noise of 0 after the null."""
    r = estimator_sanity(n_codes=k, n=2000, train={"steps": 800})
    assert r.spearman >= 0.9, r.to_frame()
    assert abs(r.independent_z) <= 3, r.to_frame()


@pytest.mark.xfail(strict=True, reason=(
    "measured (zoo:planning-horizon-ntp, accuracy 0.99, N=2000, K=32, 800 VQ steps): null-corrected "
    "I(Z_H; Z_T+tau^L) = 0.043 0.030 0.025 0.019 | 0.015 0.011 | 0.014 0.019 0.041 0.042 0.042 nats for tau=0..10 "
    "(null std 0.002-0.007); mean tau<=3 0.029 vs tau>=6 0.032 (ratio 0.92 < 3), tau>=6 not within noise of 0. "
    "Diagnosis: the last-layer codes keep the goal after the plan (I(Z_tau; goal) = 1.48 1.26 1.43 0.68 0.64 ... "
    "0.87 nats at tau=0..10, null ~0.02), and Z_H codes mostly the random prefix fillers (I(Z_H; goal) = 0.13 vs "
    "null 0.06), whose trace the late states also keep"))
def test_horizon_toy():
    """Recipe 2: null-corrected MI at τ <= 3 at least 3x that at τ >= 6, τ >= 6 within noise of 0."""
    name = "planning-horizon-ntp"
    r = horizon_curve(interp.load(f"zoo:{name}"), task_for(name), HorizonConfig(**HORIZON_RUN))
    c = horizon_criteria(r)
    assert r.accuracy > 0.9
    assert c["passed"], (c, r.to_frame())


def _shape(name):
    task = task_for(name)
    r = horizon_curve(interp.load(f"zoo:{name}"), task, HorizonConfig(**horizon_run_for(task)))
    return decay_criteria(r), r


@pytest.mark.xfail(strict=True, reason=(
    "measured (HORIZON_RUN, tau=0..3, N=2000, K=32): zoo:planning-pf-short-ntp (greedy 0.682: edge lookup learned, "
    "first step a uniform pick among the source's successors) corrected I(Z_H; Z_T+tau) = 0.183 0.037 0.015 0.040 "
    "nats (null std ~0.009), nMI 1.00 0.20 0.08 0.22: tau=2 falls below half of tau=1, not flat or rising; the "
    "grammar side decays (0.30 < 0.5 x 0.36)"))
def test_cfg_decays_path_finding_does_not():
    """Paper: the grammar's horizon curve decays; path finding's stays flat or rises for τ > 1."""
    cfg, rc = _shape("planning-cfg-ntp")
    pf, rp = _shape("planning-pf-short-ntp")
    assert cfg["decays"], (cfg, rc.to_frame())
    assert pf["flat_or_rising"], (pf, rp.to_frame())


def test_path_finding_horizon_flat_on_a_solving_model():
    """Paper: path finding's horizon curve stays flat or rises for τ > 1, here on the PF model that solves its task
    (``planning-pf-short-nodead-ntp``: the paper's PF instances without our dead-end branch, greedy 1.00).

    Measured 2026-12-02 (HORIZON_RUN, τ = 0..3, N = 2000, K = 32; 167 CPU s): corrected I(Z_H; Z_T+τ) 0.098 0.047
    0.052 0.036 nats (null std 0.006-0.012), nMI 1.00 0.48 0.53 0.36: the second intermediate node (τ = 2) at or above
    the first (difference within one null std), every τ > 1 above half of τ = 1. The model needs no look-ahead (its
    first step is a free choice), so this says each later node is coded in the prefix as well as the first, not that
    the model plans backward from the goal; the grammar's side is checked in the test above."""
    pf, rp = _shape("planning-pf-short-nodead-ntp")
    assert pf["flat_or_rising"], (pf, rp.to_frame())
    assert pf["nmi_tau1"] > 0 and not pf["decays"], (pf, rp.to_frame())


#: the PF-short models do not reach the accuracy the criterion needs (tests/zoo/test_planning_zoo.py, docs/planning.md)
_BRANCH_XFAIL = {
    "planning-pf-short-ntp": "greedy accuracy 0.662-0.684 < 0.9 (edge lookup learned, first step a uniform pick "
                             "among the source's 3 successors); BRANCH_RUN (then N = 2000) with 1 VQ seed: ratio 1.55 (alt 0.533, "
                             "decoy 0.344 nats, nulls 0.332/0.328), control 1.12, on 1,324 solved graphs. With 4 "
                             "backward sub-queries per graph (backward_queries=4, 3,000 steps): greedy 0.641 (256 "
                             "graphs; one-step look-ahead sub-queries 0.92-0.96 vs 0.28-0.38 without, backward walk "
                             "from the goal 1.00), first step still uniform (93/100/107 of 300): ratio not measured. Same "
                             "recipe with the query also before the edges (query_first, 4,000 steps): greedy 0.605 "
                             "(lookup slower to form, 0.875); as a 6-layer d-128 model (2,500 steps, 2,306 CPU s): "
                             "greedy 0.637 (fresh 0.68), every sub-query type 0.99-1.00, first step uniform "
                             "(96/94/110 of 300)",
    "planning-pf-short-mtp": ("greedy accuracy 0.527 < 0.9 (edge lookup learned; one-step look-ahead "
                              "sub-queries 0.71-0.78, but the main query's two-step first choice is not); ratio not "
                              "measured for lack of a > 90% model. With 4 backward sub-queries per graph (3,000 "
                              "steps): greedy 0.656 (256 graphs), every sub-query type 0.95-1.00, first step still "
                              "uniform (94/108/89 of 300, 9 to a non-successor)"),
}


_BRANCH_MODELS = ("planning-pf-short-ntp", "planning-pf-short-mtp", "planning-pf-short-nodead-ntp",
                  "planning-pf-short-nodead-mtp")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=_BRANCH_XFAIL[n]))
                                  if n in _BRANCH_XFAIL else n for n in _BRANCH_MODELS])
def test_branch_awareness_path_finding(name):
    """Recipe 3: ratio > 1.5 for a model with > 90% accuracy; the shuffled-decoy control near 1.

    The paper's PF instances (``planning-pf-short-nodead-*``: two correct paths and a decoy, no dead end), measured
    2026-12-02 with BRANCH_RUN (N = 8000, K = 32, 2 VQ seeds): NTP accuracy 0.995, ratio 2.68 (plug-in 0.193 vs
    0.072 nats, null 0.057; null-corrected 0.136 vs 0.014), control 0.97, 412 CPU s; MTP (6,000 steps) accuracy
    0.9998, ratio 3.95 (0.332 vs 0.084, null 0.059), control 0.97, 416 CPU s. At N = 2000 the NTP model gave 1.44
    (null 0.21 nats for both paths; MTP 1.97): see BRANCH_RUN."""
    r = branch_awareness(interp.load(f"zoo:{name}"), task_for(name), BranchConfig(**BRANCH_RUN))
    assert r.accuracy > 0.9, r.to_frame()
    assert r.ratio > 1.5, r.to_frame()
    assert 0.8 <= r.control_ratio <= 1.25, r.to_frame()


def test_smollm_block_layer_map():
    """Paper (OpenWebText): recent blocks and late layers carry most information about Z_T^L; earlier blocks
    still add information given the last position (conditional MI above its null).

    Passes with SMOLLM_RUN (3000 anchors, 2500 VQ steps, per-feature input normalisation; docs/planning.md
    section 5; 21.5 min on the shared 2-core machine): conditional I - null for B2 / B3 up to 0.042 / 0.030 nats
    against 3 null std 0.016 / 0.017. With 1200 anchors and 300 steps the conditional part stayed within noise
    of 0; with the default scalar normalisation B3 misses (0.015 < 0.019)."""
    from interp.data import kjv_text

    words = kjv_text().split()
    n_texts = -(-SMOLLM_RUN["n_examples"] // SMOLLM_RUN["anchors_per_text"])   # 3 anchors per 100-word text
    texts = [" ".join(words[i:i + 100]) for i in range(0, 100 * n_texts, 100)]
    r = block_layer_map(interp.load("zoo:smollm2-135m"), texts, BlockMapConfig(**SMOLLM_RUN))
    blocks = r.nmi_t[1:]                                               # [k, layer], k = 1 most recent
    half = blocks.shape[1] // 2
    assert blocks[0].mean() > blocks[1:].mean(), r.to_frame()          # the most recent block carries most
    assert blocks[:, half:].mean() > blocks[:, :half].mean(), r.to_frame()  # late layers more than early ones
    cond = r.cmi_t[1:] - r.null_cond[1:]
    assert np.all(cond[1:].max(axis=1) > 3 * r.null_std[2:].max(axis=1)), r.to_frame()  # earlier blocks add
