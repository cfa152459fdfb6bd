"""The TCPE reproduction's data plumbing (benchmarks/tcpe): facts as relations, facts with their own templates,
the edit plan over other relations, and the validations' preconditions on the full run (slow; the paper's
criteria themselves are the claims of ``interp reproduce tcpe``)."""
import pytest

from interp.benchmarks.tcpe.facts import N_REL, N_SUBJ, FactsTask, facts_relations, facts_tokenizer
from interp.benchmarks.tcpe.real_facts import RELATIONS, Fact, RealConfig, all_facts, edit_plan


def test_facts_relations_are_the_tasks_facts():
    task = FactsTask(0)
    rel = facts_relations(task)
    assert list(rel) == [f"r{r}" for r in range(N_REL)]
    facts = all_facts(rel)
    assert len(facts) == N_SUBJ * N_REL
    f = facts[N_SUBJ + 7]                                     # relation r1, subject s7
    assert (f.relation, f.subject, f.obj) == ("r1", "s7", f" o{task.objects[7, 1]}")
    assert f.prompt == task.prompt(7, 1) and f.paraphrase == task.prompt(7, 1, paraphrase=True)
    req = f.request(" o3")
    assert (req.prompt, req.subject, req.target) == ("{} r1", "s7", " o3")



def test_facts_tokenizer_ids():
    """The facts model's 100 word ids (``<pad> <bos> <eos> <unk>``, then s0..s49, r0..r3, p0..p3, o0..o29 and the
    extra words); ``<bos>`` is prepended, unknown words are ``<unk>``, decoding drops the space before ``.``,
    padding goes on the right (the TCPE code toy's tokenizer is the same builder)."""
    tok = facts_tokenizer(FactsTask(0))
    assert len(tok) == 100 and tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert tok.convert_ids_to_tokens([4, 53, 54, 58, 62, 91, 92, 99]) == ["s0", "s49", "r0", "p0", "o0", "o29", ".",
                                                                          "You"]
    ids = tok("s7 r1 o3 . s0 p3 o29 zebra")["input_ids"]
    assert ids == [1, 11, 55, 65, 92, 4, 61, 91, 3]
    assert tok.decode(ids) == "<bos> s7 r1 o3. s0 p3 o29 <unk>"
    assert tok.decode(ids, skip_special_tokens=True) == "s7 r1 o3. s0 p3 o29"
    assert tok(["s0", "s0 r0"], padding=True)["input_ids"] == [[1, 4, 0], [1, 4, 54]]


def test_builtin_facts_keep_their_form_and_plan_draws_from_the_relation():
    f = all_facts()[0]
    assert f == Fact("capital", "France", " Paris") and f.prompt == "The capital of France is"
    rel = facts_relations(FactsTask(0))
    plan = edit_plan(all_facts(rel)[:40], 10, seed=2, relations=rel)
    assert len(plan) == 10
    for fact, new in plan:
        assert new != fact.obj and new in set(rel[fact.relation][2].values())
    with pytest.raises(KeyError):
        edit_plan(all_facts(rel)[:5], 2, seed=0)              # the task's relations are not the built-in ones
    assert set(RELATIONS) == {"capital", "language", "currency"}


def test_real_config_checks_its_fields():
    with pytest.raises(ValueError, match="mom2_eps_rel"):
        RealConfig(mom2_eps_rel="ridge")
    with pytest.raises(ValueError, match="unknown methods"):
        RealConfig(methods=("tcpe", "memit"))


@pytest.mark.slow
def test_full_run_preconditions():
    """What the claims rest on (full preset, through the recipe's stages): the facts model knows every fact, the
    translation toy learned the planted error as its own cluster beside others, SmolLM2 knows >= 51 facts (>= 50
    others for each edit's locality) and ROME works on them."""
    from interp.apps.reproduce import run_recipe
    rec = run_recipe("tcpe", "full").record
    assert rec.error is None, rec.error
    t = rec.tables
    (m2,) = t["validation 2: model"]
    assert m2["target_message"].startswith("cannot implicitly convert expression of type")
    assert m2["target_size"] >= 40 and m2["n_clusters"] >= 2 and m2["fve"] > 0.9
    (v3,) = t["validation 3: transcoder, τ and ridge"]
    assert v3["known"] >= 51
    assert rec.measured["real_rome_efficacy"] >= 0.8
    assert all(r["n_locality"] >= 50 for r in t["validation 3: single-fact edits (mean per method)"])


def test_mask_leak_by_hand():
    """Diagonal C: u = C⁻¹k normalised; the full u's effect on C's text is |u|_C / |u·k|; a mask keeps its rows."""
    import torch

    from interp.benchmarks.tcpe.real_facts import mask_leak
    C = torch.diag(torch.tensor([1.0, 4.0, 0.25, 2.0]))
    keys = torch.tensor([[1.0, 0.5, 0.0, 0.2], [0.0, 1.0, 1.0, 0.0]])
    rows = {r["mask"]: r for r in mask_leak(C, keys, taus=(0.4,))}

    def one(k, keep):
        u = k / torch.diagonal(C)
        u = u / u.norm()
        uS = u * keep
        return float((uS @ C @ uS).sqrt()) / float(u @ k), [float((o @ uS).abs()) / float(u @ k) for o in keys
                                                              if not torch.equal(o, k)][0]
    full = [one(k, torch.ones(4)) for k in keys]
    masked = [one(k, ((k > 0) & (k >= 0.4)).float()) for k in keys]
    assert rows["full"]["rms_median"] == pytest.approx(sum(r for r, _ in full) / 2, rel=1e-6)
    assert rows["tau=0.4"]["rms_median"] == pytest.approx(sum(r for r, _ in masked) / 2, rel=1e-6)
    assert rows["tau=0.4"]["other_keys_median"] == pytest.approx(sum(o for _, o in masked) / 2, rel=1e-6)
