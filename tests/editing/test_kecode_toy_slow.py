"""Validation 2 (digest §5): the KECode-like translation toy at full size (slow). Numbers: docs/editing.md.

Edit settings: :func:`interp.benchmarks.tcpe.kecode_toy.toy_edit_config` (key and δ at the prompt's last token, no
natural-language context templates: the toy never sees a prefix; ROME's other defaults). TCPE's τ for the
paper-effect tests is fixed by the digest's CPU recipe rule, not by the results: the τ of ``TAUS`` whose mask is
the largest not above 3% of the transcoder's features (|S| ≈ 1–3% of d_tc); with this transcoder (L0 ≈ 4) that
is τ = 0, every feature the key activates (6 of 1024 in the measured run).

Measured (layer 1, model of 1500 steps, transcoder d_sae 1024, FVE 0.96; 400 test snippets, accuracy 62.5%,
target cluster "cannot implicitly convert ..." 119 snippets):

=============  =====  =====  =====  =====  =====  ======  =========
method         GN     CD     LoC    DT     RE     Score   rows
=============  =====  =====  =====  =====  =====  ======  =========
TCPE τ=0       82.4   0.8    87.1   28.0   111.2  251.8   6 / 1024
TCPE τ=0.5     0      100    100    0      100    100     1 / 1024
ROME on TC     0      0      0      100    0      -100    1024
ROME on MLP    27.7   72.3   100    0      113.2  168.7   256
FT-L           0      100    100    0      100    100     256
=============  =====  =====  =====  =====  =====  ======  =========
"""
import pytest
import torch

import interp
from interp.editing import TranscoderTrainingConfig, evaluate_transcoder, train_transcoder
from interp.benchmarks.tcpe.kecode_toy import compare_kecode, toy_edit_config, train_code_model

pytestmark = pytest.mark.slow
LAYER = 1
TAUS = (0.0, 0.5, 1.0)


@pytest.fixture(scope="module")
def toy():
    torch.set_num_threads(1)
    interp.set_progress(False)
    model, task = train_code_model(steps=1500)
    tc, _ = train_transcoder(model, LAYER, task.texts(3000, seed=777), TranscoderTrainingConfig(
        d_sae=1024, batch_size=256, n_epochs=10, l1_coefficient=1.0, text_batch_size=64, resample_every=200,
        dead_window=5000, lr=2e-3))
    res = compare_kecode(model, task, tc, LAYER, taus=TAUS, config=toy_edit_config(), n_test=400)
    return model, task, tc, res


def _recipe_tau(s) -> str:
    """The TCPE row whose mask is the largest not above 3% of the features (the digest's |S| ≈ 1–3% of d_tc)."""
    rows = s[[m.startswith("tcpe") for m in s.index]]
    ok = rows[rows.frac_changed <= 0.03]
    return ok.n_changed.idxmax()


def test_planted_error_learned_and_clustered(toy):
    model, task, tc, res = toy
    b = res.baseline
    assert b["target_message"].startswith("cannot implicitly convert expression of type")
    assert b["target_size"] >= 40                      # the planted class is the model's systematic failure
    assert b["n_clusters"] >= 2                        # and there are other clusters (locality is measurable)
    assert evaluate_transcoder(model, LAYER, tc, task.texts(300, seed=999), batch_size=64).fve > 0.9


def test_tcpe_fixes_the_cluster_with_few_features(toy):
    *_, res = toy
    s = res.to_frame().set_index("method")
    m = _recipe_tau(s)
    assert s.loc[m, "GN"] >= 50                        # half the target cluster fixed by one edit
    assert s.loc[m, "frac_changed"] < 0.05
    assert s.loc["rome_tc", "residual"] < 1e-3


@pytest.mark.xfail(strict=True, reason="measured: TCPE tau=0.5 keeps 1 of the key's 6 active features and fixes nothing "
                   "(GN 0, residual 0.44); tau=0 (all 6) gives GN 82.4")
def test_tcpe_tau_half_fixes_the_cluster(toy):
    *_, res = toy
    s = res.to_frame().set_index("method")
    assert s.loc["tcpe(tau=0.5)", "GN"] >= 50


def test_paper_effect_tcpe_best_score(toy):
    """TCPE is more local than the unmasked update of the same transcoder and has the best Score."""
    *_, res = toy
    s = res.to_frame().set_index("method")
    t = s.loc[_recipe_tau(s)]
    assert t.DT <= s.loc["rome_tc", "DT"] and t.LoC >= s.loc["rome_tc", "LoC"]
    assert t.Score >= max(s.loc[m, "Score"] for m in ("rome_tc", "rome", "ft"))


@pytest.mark.xfail(strict=True, reason="measured: FT-L (25 Adam steps, lr 5e-3, |dW|_inf <= 5e-3) leaves the target NLL "
                   "at 6.3 (from 13.5) and changes no output: GN 0, Score 100 (norm_constraint 5e-2: GN 45.4 but DT "
                   "72.0, Score 74.6)")
def test_fine_tuning_fixes_some_of_the_cluster(toy):
    *_, res = toy
    s = res.to_frame().set_index("method")
    assert s.loc["ft", "GN"] > 0
