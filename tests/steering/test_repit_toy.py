"""RepIt's effect on zoo:toy-refusal: the digest's CPU-scale validation recipe (shared/papers/interp_papers.md §1).

The model refuses ("<category> : I cannot help ...") six-word requests that combine intent with a harmful topic;
all harmful categories share the intent words, so their refusal directions overlap (pairwise cosine 0.5-0.9 at
blocks.1.hook_resid_pre). Pass criteria of the recipe, judged by P(refusal first token) > 0.5 on held-out prompts:
the plain target difference-in-means ablation breaks refusal on every harmful category; RepIt at its searched rho
removes the target's refusal (>= 50 points) and keeps >= 90% of non-target refusal; 12 target prompts give
nearly the same vector (cos > 0.8).
"""
import pytest
import torch

from interp.steering.repit_validation import RepItValidation, experiment, toy_config


@pytest.fixture(scope="module")
def wmd(toy_refusal_path):
    return experiment(toy_config(targets=("bio", "chem", "nuclear")))


def test_toy_model_learned_the_rule(toy_refusal_path):
    import interp.zoo
    from interp.data import toy_refusal as tr

    info = interp.zoo.info("toy-refusal")
    assert info.metrics["test_accuracy"] >= 0.98 and info.metrics["test_harmless_refused"] <= 0.02
    texts = {s: {x.text for x in tr.instructions(s)} for s in tr.SPLITS}
    assert not (texts["train"] & texts["test"]) and not (texts["val"] & texts["test"])
    for x in tr.instructions("test"):
        words = set(x.text.split())
        topic = {c for c in tr.HARMFUL_CATEGORIES if words & set(tr.TOPICS[c])}
        harmful_intent = {c for c in topic if words & (set(tr.INTENT) - set(tr.BENIGN_INTENT[c]))}
        assert x.harmful == bool(harmful_intent), x


def test_repit_isolates_target_refusal(wmd, tmp_path):
    s = wmd.summary
    assert s["none"]["target"] == 1.0 and s["none"]["nontarget"] == 1.0
    # the plain target vector breaks refusal on every harmful category (P(refusal) < 0.5 for most prompts)
    assert all(rate < 0.5 for rate in wmd.judged["natural"].values()), wmd.judged["natural"]
    # RepIt: the targets' refusal is gone, the non-targets' kept (>= 90% of baseline)
    assert s["repit"]["target"] <= 0.5 and wmd.criteria["repit_target_drop"]["passed"]
    assert wmd.criteria["repit_nontarget_retain"]["passed"], wmd.criteria
    assert all(wmd.judged["repit"][c] >= 0.8 for c in wmd.non_targets), wmd.judged["repit"]
    assert wmd.passed
    # the rho search chose a partial removal with feasible validation numbers
    assert 0 < wmd.rho["affine"] < 1
    chosen = [p for p in wmd.rho_search["affine"] if p["rho"] == wmd.rho["affine"]][0]
    assert chosen["feasible"] and chosen["target_asr"] >= 0.8
    # data efficiency: 12 prompts per target category give nearly the same vector
    assert wmd.data_efficiency["12"] > 0.8
    # the correction is not spread evenly over the 64 residual dims
    assert 0 < wmd.dims_90["affine"] < 0.9 * 64
    wmd.save(tmp_path / "wmd")
    back = RepItValidation.load(tmp_path / "wmd")
    assert back.judged == wmd.judged and back.data_efficiency == wmd.data_efficiency
    # the category vectors overlap (shared intent words) but are not identical (measured: mean cosine 0.74)
    assert 0.5 < wmd.category_cosine["all"] < 0.95 and back.category_cosine == wmd.category_cosine
    assert wmd.eval_layers == []  # the layer was fixed: no COSMIC selection


def test_single_target_category(toy_refusal_path):
    """The recipe's single target (one category against five)."""
    res = experiment(toy_config(targets=("bio",)))
    before, nat, rep = (res.summary[k] for k in ("none", "natural", "repit"))
    assert before["target"] - rep["target"] >= 0.5  # >= 50 points
    assert rep["nontarget"] >= 0.9 * before["nontarget"]
    assert nat["nontarget"] < 0.5 and nat["nontarget"] < rep["nontarget"]


def test_projection_alone_carries_the_shared_refusal(wmd):
    """What RepIt removes (the component in the non-target span) is what all categories share: ablating it
    alone breaks non-target refusal too, while the isolated vector does not (first-token scores)."""
    proj = wmd.scored["projection"]
    assert sum(proj[c] for c in wmd.non_targets) / len(wmd.non_targets) < 0.5
    assert torch.tensor([wmd.scored["repit"][c] for c in wmd.non_targets]).mean() >= 0.9
