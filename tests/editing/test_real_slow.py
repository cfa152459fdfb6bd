"""Validation 3 (digest §5) on zoo:smollm2-135m (slow; 1 h 14 min cold with one worker at load ~5, resumable): a
layer-8 transcoder trained from activations harvested through interp.store (KJV + instructions, 160k tokens), second
moments from 100k tokens, then 20 single-fact counterfactual edits of known facts with TCPE (τ sweep fixed from the
keys before any edit), ROME on the transcoder and ROME on the MLP
(:func:`interp.benchmarks.tcpe.real_facts.validate_real`; numbers in docs/editing.md).

Set ``INTERP_EDITING_CACHE`` to a folder to keep the store, transcoder, second moments and per-edit results
between runs (a rerun resumes); by default a temporary folder (cold run)."""
import os

import pytest
import torch

import interp
from interp.benchmarks.tcpe.real_facts import known_facts, validate_real

pytestmark = pytest.mark.slow
N_EDITS = 20


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.set_num_threads(1)
    interp.set_progress(False)
    cache = os.environ.get("INTERP_EDITING_CACHE") or str(tmp_path_factory.mktemp("smol"))
    res, info = validate_real(cache, n_edits=N_EDITS)
    return res, info


def test_model_knows_enough_facts(run):
    res, _ = run
    assert res.baseline["known"] >= 51      # >= 50 others for the locality of every edit


def test_every_edit_ran_with_locality_on_50_facts(run):
    res, _ = run
    df = res.to_frame()
    assert df.edit.nunique() == N_EDITS
    assert (df.n_locality >= 50).all()


def test_rome_baseline_works(run):
    res, _ = run
    s = res.summary().set_index("method")
    assert s.loc["rome", "efficacy"] >= 0.8
    assert s.loc["rome_tc", "residual"] < 1e-3


@pytest.mark.xfail(strict=True, reason="measured on 20/20 edits (C from 100k tokens, ridge 1e-2 by ridge_rule): TCPE at the rule tau=0.05 (mean |S| 2.0% of d_tc) efficacy 0.80 vs ROME 1.00, locality 0.294 vs 0.763, 2.0% of features, perplexity 47.8 -> 149; the mask drops the components of u=C^-1 k* that cancel the update on ordinary tokens (RMS effect on C's text 0.38 vs 0.0098 unmasked). No tau of the sweep meets all three: 0.284 eff 0.90 loc 0.364; 1.062 eff 0.35 loc 0.782")
def test_tcpe_goal(run):
    """Issue goal: TCPE matches ROME's efficacy with better locality, touching < 5% of the features."""
    res, info = run
    s = res.summary().set_index("method")
    t = s.loc[f"tcpe(tau={info['tau_rule']})"]   # the digest's rule |S| ~ 2% of d_tc, fixed from the keys before any edit
    assert t.frac_changed < 0.05
    assert t.efficacy >= s.loc["rome", "efficacy"] - 0.1
    assert t.locality >= s.loc["rome", "locality"]
