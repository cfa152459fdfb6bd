"""Validation 2 (digest §5): the KECode-like translation toy at full size (slow). Numbers: docs/editing.md."""
import pytest
import torch

import interp
from interp.editing import EditConfig, TranscoderTrainingConfig, evaluate_transcoder, train_transcoder
from interp.editing.kecode_toy import compare_kecode, train_code_model

pytestmark = pytest.mark.slow
LAYER, FACT_TOKEN = 1, "last"
TAUS = (0.0, 0.5, 1.0)


@pytest.fixture(scope="module")
def toy():
    torch.set_num_threads(1)
    interp.set_progress(False)
    model, task = train_code_model(steps=1500)
    tc, _ = train_transcoder(model, LAYER, task.texts(3000, seed=777), TranscoderTrainingConfig(
        d_sae=1024, batch_size=256, n_epochs=10, l1_coefficient=1.0, text_batch_size=64, resample_every=200,
        dead_window=5000, lr=2e-3))
    res = compare_kecode(model, task, tc, LAYER, taus=TAUS, config=EditConfig(fact_token=FACT_TOKEN), n_test=400)
    return model, task, tc, res


def test_planted_error_learned_and_clustered(toy):
    model, task, tc, res = toy
    b = res.baseline
    assert b["target_message"].startswith("cannot implicitly convert expression of type")
    assert b["target_size"] >= 40                      # the planted class is the model's systematic failure
    assert b["n_clusters"] >= 2                        # and there are other clusters (locality is measurable)
    assert evaluate_transcoder(model, LAYER, tc, task.texts(300, seed=999), batch_size=64).fve > 0.9


@pytest.mark.xfail(strict=True, reason="measured (layer 1, key at the last token, ROME's compute_v defaults): GN 0 for "
                   "every method; compute_v final NLL 4.6 on the transcoder site (2.0 MLP, FT 6.3): the planted "
                   "mapping A0->B5 is not overridden within 25 steps at clamp 4 x |v0|; TCPE tau=0.5 changes 1 row")
def test_tcpe_fixes_the_cluster_with_few_features(toy):
    *_, res = toy
    s = res.to_frame().set_index("method")
    assert s.loc["tcpe(tau=0.5)", "GN"] >= 50          # half the target cluster fixed by one edit
    assert s.loc["tcpe(tau=0.5)", "frac_changed"] < 0.05
    assert s.loc["rome_tc", "residual"] < 1e-3


@pytest.mark.xfail(strict=True, reason="measured Score: TCPE tau=0.5 -45.8 (GN 0, CD 86.6, LoC 0, DT 29.6, RE 70.4), "
                   "ROME-on-TC -92.8 (DT 96.4), ROME-on-MLP 100 and FT 100 (both leave every output unchanged); "
                   "TCPE is more local than ROME-on-TC (DT 29.6 vs 96.4) but fixes nothing")
def test_paper_effect_tcpe_best_score(toy):
    *_, res = toy
    s = res.to_frame().set_index("method")
    t = s.loc["tcpe(tau=0.5)"]
    assert t.DT <= s.loc["rome_tc", "DT"] and t.LoC >= s.loc["rome_tc", "LoC"]
    assert t.Score >= max(s.loc[m, "Score"] for m in ("rome_tc", "rome", "ft"))
