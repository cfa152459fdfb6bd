"""Validation 3 (digest §5) on zoo:smollm2-135m (slow; about 1.5 h on 2 loaded cores): a layer-8 transcoder
trained from activations harvested through interp.store (KJV + instructions, 160k tokens), then single-fact
counterfactual edits of known facts with TCPE, ROME on the transcoder, ROME on the MLP and FT-L.
Measured (docs/editing.md; only 2 of the 10 edits finished on the loaded machine): known 55 facts; spliced keeps 24;
TCPE tau=1.114 efficacy 2/2, neighbourhood 0.86, 4 features (0.17%); ROME efficacy 2/2, neighbourhood 0.85."""
import pytest
import torch

import interp
from interp.data import heldout_text
from interp.editing import EditConfig, TranscoderTrainingConfig, evaluate_transcoder, train_transcoder_from_store
from interp.editing.real_facts import compare_real, known_facts, subject_activation_quantiles, training_documents

pytestmark = pytest.mark.slow
L = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from interp.store import harvest
    torch.set_num_threads(1)
    interp.set_progress(False)
    model = interp.load("zoo:smollm2-135m")
    out = tmp_path_factory.mktemp("smol") / "store"
    docs = training_documents()
    harvest(model, docs, [f"blocks.{L}.ln2.hook_normalized", f"blocks.{L}.hook_mlp_out"], out, context_size=128,
            batch_size=8, dtype="float16", max_tokens=160_000, shard_mb=32)
    tc, _ = train_transcoder_from_store(out, L, TranscoderTrainingConfig(
        d_sae=2304, l1_coefficient=6.0, batch_size=256, n_epochs=2, lr=1e-3, resample_every=150, dead_window=50_000))
    held = [x for x in heldout_text().splitlines() if x.strip()][:24]
    metrics = evaluate_transcoder(model, L, tc, held, batch_size=8)
    ctx = docs[1700:1775]
    qs, _ = subject_activation_quantiles(model, L, tc, known_facts(model)[0])
    taus = (0.0, round(qs[0.9], 3), round(qs[0.97], 3))   # measured run: 0, 1.114, 2.328
    res = compare_real(model, tc, L, n_edits=10, taus=taus, config=EditConfig(n_templates=2),
                       context_texts=ctx, heldout=held, n_mom2=8000)
    return model, tc, metrics, res


def test_model_knows_enough_facts(run):
    model, *_ = run
    known, _ = known_facts(model)
    assert len(known) >= 51      # >= 50 others for the neighbourhood of every edit


def test_rome_baseline_works(run):
    *_, res = run
    s = res.summary().set_index("method")
    assert s.loc["rome", "efficacy"] >= 0.8
    assert s.loc["rome_tc", "residual"] < 1e-3


def test_tcpe_goal(run):
    """Issue goal: TCPE matches ROME's efficacy with better locality, touching < 5% of the features."""
    *_, res = run
    s = res.summary().set_index("method")
    t = s.loc[[m for m in s.index if m.startswith("tcpe")][1]]    # tau = 90th percentile
    assert t.frac_changed < 0.05
    assert t.efficacy >= s.loc["rome", "efficacy"] - 0.1
    assert t.neighbourhood >= s.loc["rome", "neighbourhood"]
