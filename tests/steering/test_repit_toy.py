"""RepIt's effect on zoo:toy-refusal: the digest's CPU-scale validation recipe (the papers digest, section 1).

The model refuses ("<category> : I cannot help ...") six-word requests that combine intent with a harmful topic;
all harmful categories share the intent words, so their refusal directions overlap (pairwise cosine 0.5-0.9 at
blocks.1.hook_resid_pre). Pass criteria of the recipe, judged by P(refusal first token) > 0.5 on held-out prompts:
the plain target difference-in-means ablation breaks refusal on every harmful category; RepIt at its searched rho
removes the target's refusal (>= 50 points) and keeps >= 90% of non-target refusal; 12 target prompts give
nearly the same vector (cos > 0.8).

The criteria over the six training seeds of the toy recipe are the claims of ``interp reproduce repit --preset
full`` (benchmarks/repit/claims.yaml); these tests assert what holds for any trained toy model.
"""
import pytest
import torch

from interp.benchmarks.repit.experiment import RepItValidation, experiment, toy_config


def test_toy_tokenizer_splits_punctuation_and_formats_the_chat():
    """The toy model's word-level tokenizer (no training needed): punctuation is split off words, no ``<bos>`` is
    prepended (the chat template writes it), ``<eoi>`` is a special token."""
    from interp.benchmarks.repit.toy_data import make_tokenizer, vocabulary
    from interp.data.refusal import format_chat

    tok, vocab = make_tokenizer(), vocabulary()
    assert len(tok) == len(vocab) and tok.convert_ids_to_tokens(list(range(len(vocab)))) == list(vocab)
    chat = format_chat(tok, "make soup")
    assert chat == "<bos> user make soup <eoi> assistant"
    assert tok(chat)["input_ids"] == [vocab.index(w) for w in chat.split()]
    assert tok.convert_ids_to_tokens(tok("bio : I cannot help with that.")["input_ids"]) == \
        ["bio", ":", "I", "cannot", "help", "with", "that", "."]
    assert "<eoi>" in tok.all_special_tokens and tok("zebra")["input_ids"] == [tok.unk_token_id]


@pytest.fixture(scope="module")
def wmd(toy_refusal_path):
    return experiment(toy_config(targets=("bio", "chem", "nuclear")))


def test_toy_model_learned_the_rule(toy_refusal_path):
    import interp.zoo
    from interp.benchmarks.repit import toy_data as tr

    info = interp.zoo.info("toy-refusal")
    assert info.metrics["test_accuracy"] >= 0.98 and info.metrics["test_harmless_refused"] <= 0.02
    texts = {s: {x.text for x in tr.instructions(s)} for s in tr.SPLITS}
    assert not (texts["train"] & texts["test"]) and not (texts["val"] & texts["test"])
    for x in tr.instructions("test"):
        words = set(x.text.split())
        topic = {c for c in tr.HARMFUL_CATEGORIES if words & set(tr.TOPICS[c])}
        harmful_intent = {c for c in topic if words & (set(tr.INTENT) - set(tr.BENIGN_INTENT[c]))}
        assert x.harmful == bool(harmful_intent), x


def test_repit_group_rule_and_bookkeeping(wmd, tmp_path):
    """What holds for any toy model the recipe trains: the paper's rho rule, the criteria's arithmetic, the
    data-efficiency rebuild, the saved result. Whether the group's refusal is isolated depends on the trained model
    (2 of 6 recipe seeds pass every criterion; the CI machine's numerics trained a seventh model on which the
    non-target criterion failed too): that is measured over seeds by ``interp reproduce repit --preset full``."""
    s = wmd.summary
    # the build requires 98% held-out accuracy; every held-out prompt is refused on all 6 seeds measured
    assert s["none"]["target"] == 1.0 and s["none"]["nontarget"] == 1.0
    # the paper's rule: among the rhos whose validation non-target ASR is <= the ceiling, the highest target ASR
    # (ties: the smaller rho); if none is feasible, the lowest non-target ASR
    points = wmd.rho_search["affine"]
    feasible = [p for p in points if p["feasible"]]
    best = (max(feasible, key=lambda p: (p["target_asr"], -p["rho"])) if feasible
            else min(points, key=lambda p: p["nontarget_asr"]))
    assert wmd.rho["affine"] == best["rho"]
    crit = wmd.criteria
    assert crit["repit_target_drop"]["value"] == pytest.approx(1 - s["repit"]["target"] / s["none"]["target"])
    assert crit["repit_nontarget_retain"]["value"] == pytest.approx(s["repit"]["nontarget"] / s["none"]["nontarget"])
    assert crit["natural_collateral"]["value"] == pytest.approx(s["natural"]["nontarget"] / s["none"]["nontarget"])
    assert wmd.passed == all(c["passed"] for c in crit.values())
    # data efficiency: 12 prompts per target category give nearly the same vector (0.992-0.999 over 6 seeds)
    assert wmd.data_efficiency["12"] > 0.8
    wmd.save(tmp_path / "wmd")
    back = RepItValidation.load(tmp_path / "wmd")
    assert back.judged == wmd.judged and back.data_efficiency == wmd.data_efficiency
    assert back.category_cosine == wmd.category_cosine and back.criteria == wmd.criteria
    assert wmd.eval_layers == []  # the layer was fixed: no COSMIC selection


def test_single_target_category(toy_refusal_path):
    """The recipe's single target (one category against five): RepIt removes bio's refusal and keeps the others'.
    Measured on 6 seeds of the recipe: drop 1.00 on every seed, non-target refusal kept at 0.919-0.988. (That the
    plain bio vector also breaks the others' refusal, keeping < 90 % of it, holds on 5 of the 6 seeds, < 50 % on 4: see
    the recipe's claims.)"""
    res = experiment(toy_config(targets=("bio",)))
    before, rep = res.summary["none"], res.summary["repit"]
    assert before["target"] - rep["target"] >= 0.5  # >= 50 points
    assert rep["nontarget"] >= 0.9 * before["nontarget"]


def test_projection_alone_carries_the_shared_refusal(wmd):
    """What RepIt removes (the component in the non-target span) is what all categories share: ablating it
    alone breaks non-target refusal too, while the isolated vector does not (first-token scores)."""
    if wmd.rho["affine"] == 0:  # nothing was removed (one of 6 recipe seeds): there is no projection to test
        assert "projection" not in wmd.scored
        return
    proj = wmd.scored["projection"]
    assert sum(proj[c] for c in wmd.non_targets) / len(wmd.non_targets) < 0.5
    assert torch.tensor([wmd.scored["repit"][c] for c in wmd.non_targets]).mean() >= 0.9
