"""The digest's CPU recipe (§5) end to end: facts model, transcoder, 20 edits with four methods (slow).

Measured (docs/editing.md): the recipe as written (layer-0 MLP, key at the subject's last token) gives 0/20
successful rank-one edits for every method, because this 2-layer model does not store the facts at the subject
token (compute_v's NLL stays at 10.0 on average; FT reaches 0.95). With the key at the last token
(ROME's ``fact_token="last"``) on the layer-1 MLP, TCPE (tau=0.5) succeeds on 20/20 edits.
"""
import pytest
import torch

import interp
from interp.benchmarks.tcpe.facts import compare_methods, fact_predictions, train_facts_model
from interp.editing import EditConfig, TranscoderTrainingConfig, evaluate_transcoder, splice, train_transcoder

pytestmark = pytest.mark.slow
TC_CFG = dict(d_sae=1024, batch_size=256, n_epochs=20, l1_coefficient=1.0, text_batch_size=64, resample_every=200,
              dead_window=5000, lr=2e-3)
TAUS = (0.0, 0.5, 1.0, 2.0)


@pytest.fixture(scope="module")
def facts():
    torch.set_num_threads(1)
    interp.set_progress(False)
    return train_facts_model(steps=1500)


def _recipe(facts, layer, fact_token):
    model, task = facts
    tc, _ = train_transcoder(model, layer, task.texts(3000, seed=777), TranscoderTrainingConfig(**TC_CFG))
    res = compare_methods(model, task, tc, layer=layer, n_edits=20, taus=TAUS, config=EditConfig(fact_token=fact_token))
    return tc, res


@pytest.fixture(scope="module")
def layer1(facts):
    return _recipe(facts, 1, "last")


def test_facts_learned_and_transcoder_spliced(facts, layer1):
    model, task = facts
    tc, res = layer1
    assert (fact_predictions(model, task) == task.objects).mean() == 1.0
    with splice(model, 1, tc):
        assert (fact_predictions(model, task) == task.objects).mean() >= 0.95   # measured 1.00
    assert evaluate_transcoder(model, 1, tc, task.texts(300, seed=999)).fve > 0.99  # measured 0.998


@pytest.mark.xfail(strict=True, reason="recipe: < 5% of features active; measured L0 88.2 of 1024 (8.6%) on the "
                                       "layer-1 transcoder at l1=1.0 (layer 0: 62.4, 6.1%; l1=3 gives L0 127 and "
                                       "breaks the facts: 10.5% kept)")
def test_transcoder_sparsity_recipe(facts, layer1):
    model, task = facts
    tc, _ = layer1
    assert evaluate_transcoder(model, 1, tc, task.texts(300, seed=999)).l0 / tc.d_sae < 0.05


def test_recipe_pass_criteria_layer1_last_token(layer1):
    _, res = layer1
    df = res.to_frame()
    s = res.summary().set_index("method")
    assert (df[df.method == "rome_tc"].residual < 1e-3).all()                    # mask = all: W'k* = v*
    t = df[df.method.str.startswith("tcpe")]
    assert (t.n_changed <= t.n_active).all()                                      # changed rows = |S|
    assert s.loc["tcpe(tau=0.5)", "efficacy"] >= 0.9                              # measured 1.00
    assert s.loc["tcpe(tau=0.5)", "mask_frac"] < 0.05                             # measured 2.1% of d_tc
    assert s.loc["tcpe(tau=0.5)", "other_drop"] < s.loc["rome_tc", "other_drop"]  # 0.030 vs 0.064
    assert abs(s.loc["tcpe(tau=0.0)", "efficacy"] - s.loc["rome_tc", "efficacy"]) <= 0.05  # tau -> 0: full ROME


@pytest.mark.xfail(strict=True, reason="recipe as written (layer-0 MLP, key at the subject's last token): measured "
                                       "efficacy 0/20 for TCPE (every tau), ROME-on-TC and ROME-on-MLP; compute_v "
                                       "NLL 12.7 -> 10.5 even with clamp x100: the model looks facts up at the "
                                       "relation token, not the subject token")
def test_recipe_as_written_layer0_subject_last(facts):
    tc, res = _recipe(facts, 0, "subject_last")
    assert res.summary().set_index("method").loc["tcpe(tau=0.5)", "efficacy"] >= 0.9
