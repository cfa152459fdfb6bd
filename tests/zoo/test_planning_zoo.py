"""The ``zoo:planning-*`` recipes: label layout, MTP heads, a small cold-cache build that learns its task,
and (slow) the full-size entries' accuracies."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from interp import zoo
from interp.benchmarks.planning.tasks import HorizonToy, PathFinding, make_tokenizer, task_for
from interp.benchmarks.planning.zoo import (PLANNING_SPECS, _encode, _MTPHeads, build_planning, evaluate_planning,
                                            fast_params)
from interp.probes.planning import PlanningExample


def _test_entry(name: str, **overrides) -> zoo.ZooEntry:
    """A fast variant of a planning entry, registered under ``<name>-test`` (small params)."""
    base = zoo.get_entry(name)
    return zoo.register(dataclasses.replace(base, name=f"{name}-test", params=fast_params(name, **overrides)),
                        replace=True)


def test_encode_labels_hand_checked():
    task = PathFinding("short")
    tok = make_tokenizer(task)
    ex = PlanningExample(prompt="n1 n2 ? n1 n2 :", target="n1 n2")
    short = PlanningExample(prompt="n1 n2 ? n1 n2 :", target="n1")
    ids, mask, lab = _encode(tok, [ex, short], "target")
    v = tok.get_vocab()
    want = [v[w] for w in "<bos> n1 n2 ? n1 n2 : n1 n2".split()]
    assert ids[0].tolist() == want and ids[0].tolist() == tok(ex.prompt + " " + ex.target)["input_ids"]
    assert lab[0].tolist() == [-100] * 7 + want[7:]  # loss on the target words only
    assert mask[1].tolist() == [1] * 8 + [0] and ids[1, 8] == tok.pad_token_id and lab[1, 8] == -100
    _, _, lab_all = _encode(tok, [ex], "all")
    assert lab_all[0].tolist() == [-100] + want[1:]  # every word but <bos>


def test_encode_followups_label_answers_only():
    task = PathFinding("short")
    tok = make_tokenizer(task)
    doc = PlanningExample(prompt="n1 n2 ? n1 n2 :", target="n1 n2",
                          meta={"followups": (("? n2 n5 :", "n2 n7 n5"),)})
    ids, mask, lab = _encode(tok, [doc], "target")
    v = tok.get_vocab()
    words = "<bos> n1 n2 ? n1 n2 : n1 n2 ? n2 n5 : n2 n7 n5".split()
    assert ids[0].tolist() == [v[w] for w in words] and mask[0].tolist() == [1] * len(words)
    labelled = [w if 7 <= i <= 8 or i >= 13 else None for i, w in enumerate(words)]
    assert lab[0].tolist() == [-100 if w is None else v[w] for w in labelled]


def test_backward_queries_recipe():
    """Backward sub-queries need a task with a marker word; their queries are unlabelled, their answers labelled;
    the recipe field is left out of the params at its default (recipe hashes of older entries unchanged)."""
    from interp.benchmarks.planning.zoo import PF_SHORT_TASK, PlanningModelConfig

    with pytest.raises(ValueError):
        PlanningModelConfig(backward_queries=2)  # the default PF task has no backward marker
    cfg = PlanningModelConfig(task={**PF_SHORT_TASK, "backward_marker": "<"}, followup_queries=2, backward_queries=2)
    assert cfg.to_params()["backward_queries"] == 2
    assert "backward_queries" not in PlanningModelConfig().to_params()
    task = PathFinding("short", backward_marker="<")
    tok = make_tokenizer(task)
    doc = PlanningExample(prompt="n1 n2 ? n1 n2 :", target="n1 n2", meta={"followups": (("< n5 n2 :", "n5 n7 n2"),)})
    ids, _, lab = _encode(tok, [doc], "target")
    v = tok.get_vocab()
    words = "<bos> n1 n2 ? n1 n2 : n1 n2 < n5 n2 : n5 n7 n2".split()
    assert ids[0].tolist() == [v[w] for w in words]
    assert [i for i, x in enumerate(lab[0].tolist()) if x != -100] == [7, 8, 13, 14, 15]


#: sha256[:16] of each entry's canonical params JSON, as cached before the backward sub-queries (commit a48ff26)
#: were added: the params are what the zoo hashes into the cache key, so a change here retrains the entry. Update
#: a pin only when a recipe is changed on purpose.
_PARAMS_PINS = {"planning-horizon-ntp": "e4333891d00e2e0b", "planning-cfg-ntp": "80ed0b6a7292d23c",
                "planning-cfg-mtp": "bc3360322673463a", "planning-pf-short-ntp": "65bcdfb59485a637",
                "planning-pf-short-mtp": "6a0e9a6dd2d268eb", "planning-pf-long-ntp": "c3687c4737278116",
                "planning-pf-long-mtp": "16d540c3dfa679b5"}


def test_existing_recipes_unchanged_by_later_fields():
    """Opt-in fields (``followup_queries``/``backward_queries`` at 0, ``backward_marker`` unset) leave the entries'
    params, hence their cache keys, as they were; a config with the task's marker set but no backward queries is
    a different task (its vocabulary has the marker word), so it is a different recipe."""
    import hashlib

    from interp.benchmarks.planning.zoo import PF_SHORT_TASK, PlanningModelConfig

    for spec in PLANNING_SPECS:
        if spec["name"] not in _PARAMS_PINS:
            continue  # entries added later pin nothing here
        params = zoo.get_entry(spec["name"]).params
        blob = json.dumps(json.loads(json.dumps(dict(params), default=str)), sort_keys=True).encode()
        assert hashlib.sha256(blob).hexdigest()[:16] == _PARAMS_PINS[spec["name"]], spec["name"]
        assert "backward_queries" not in params and "backward_marker" not in params["task"]
        assert PlanningModelConfig.from_params(params).to_params() == dict(params)
    marked = PlanningModelConfig(task={**PF_SHORT_TASK, "backward_marker": "<"}).to_params()
    assert marked != PlanningModelConfig().to_params() and "backward_queries" not in marked


def test_step_accuracy_hand_checked():
    from interp.benchmarks.planning.zoo import _step_accuracy

    task = PathFinding("short")
    tok = make_tokenizer(task)
    v = tok.get_vocab()
    ex = PlanningExample(prompt="p", target="n1 n2 n3 n4", answers=("n1 n2 n3 n4", "n1 n5 n6 n4"), decoy="n7 n8 n9 n10")
    # predictions at the 4 target positions: source right, the other branch (right), a wrong lookup, goal right
    pred = torch.tensor([[0, v["n1"], v["n5"], v["n9"], v["n4"]], [0, v["n2"], v["n2"], v["n3"], v["n9"]]])
    sel = torch.tensor([[False, True, True, True, True], [False, True, True, True, True]])
    assert _step_accuracy(tok, [ex, ex], pred, sel) == [0.5, 1.0, 0.5, 0.5]


def test_mtp_heads_predict_words_further_ahead():
    torch.manual_seed(0)
    B, S, d, V, k = 2, 7, 8, 11, 2
    heads = _MTPHeads(d, 16, k, 1e-6)
    for h in heads.heads:  # non-trivial output layer (it starts at zero)
        torch.nn.init.normal_(h[3].weight)
    lm_head = torch.nn.Linear(d, V, bias=False)
    hidden = torch.randn(B, S, d)
    labels = torch.randint(0, V, (B, S))
    labels[:, :2] = -100
    losses = heads.losses(hidden, lm_head, labels)
    assert len(losses) == k
    for j in (1, 2):  # by hand: position s predicts labels[s + 1 + j]
        tot, n = 0.0, 0
        for b in range(B):
            for s in range(S):
                if s + 1 + j < S and labels[b, s + 1 + j] != -100:
                    z = hidden[b, s] + heads.heads[j - 1](hidden[b, s])
                    tot += -torch.log_softmax(lm_head(z), -1)[labels[b, s + 1 + j]]
                    n += 1
        assert torch.allclose(losses[j - 1], tot / n, atol=1e-5)


def test_small_build_learns_horizon_toy(tmp_zoo):
    """Cold cache: the test-size horizon model trains, is cached atomically and reloads with its metrics."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry = _test_entry("planning-horizon-ntp")
    folder = zoo.path(entry.name)
    meta = json.loads((folder / "zoo.json").read_text())
    assert meta["metrics"]["greedy_accuracy"] >= 0.95  # stated accuracy of the test-size build
    assert meta["metrics"]["task"] == "horizon" and meta["metrics"]["objective"] == "ntp"
    assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.bin"))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers >= 3
    tok = AutoTokenizer.from_pretrained(folder)
    task = task_for("planning-horizon-ntp")
    assert task == HorizonToy() and tok.get_vocab() == make_tokenizer(task).get_vocab()
    fresh = task.examples(48, seed=987)
    m = evaluate_planning(model, tok, task, fresh)
    assert m["greedy_accuracy"] >= 0.95
    # an untrained model of the same shape does not solve it (the check is not vacuous)
    blank = type(model)(model.config).eval()
    assert evaluate_planning(blank, tok, task, fresh)["greedy_accuracy"] < 0.2
    assert zoo.path(entry.name) == folder  # cache hit, no rebuild


def test_mtp_build_saves_the_plain_causal_lm(tmp_path):
    from safetensors import safe_open

    keys = {}
    for obj in ("ntp", "mtp"):
        out = tmp_path / obj
        out.mkdir()
        metrics = build_planning(out, fast_params(f"planning-pf-short-{obj}", steps=4, warmup=2, n_eval=8))
        assert metrics["objective"] == obj and 0.0 <= metrics["greedy_accuracy"] <= 1.0
        assert {"first_step_accuracy", "branch_share", "decoy_rate"} <= set(metrics)
        with safe_open(out / "model.safetensors", "pt") as f:
            keys[obj] = set(f.keys())
    assert keys["ntp"] == keys["mtp"]  # the future-word heads are not saved


def test_failed_build_caches_nothing(tmp_zoo):
    entry = _test_entry("planning-pf-short-ntp", steps=3, warmup=1, n_eval=8, min_accuracy=1.01)
    with pytest.raises(RuntimeError, match="did not train"):
        zoo.path(entry.name)
    assert zoo.cached_path(entry.name) is None
    assert not [p for p in (tmp_zoo / "zoo").iterdir() if p.name.startswith(entry.name)
                or p.name.startswith("." + entry.name)]


# ----------------------------------------------------------------------------------------- full-size (slow)
#: accuracy each full-size entry must reach (greedy, held-out); PF-short NTP: the branch-awareness check needs > 0.9
FULL_SIZE_ACCURACY = {"planning-horizon-ntp": 0.99, "planning-cfg-ntp": 0.9, "planning-cfg-mtp": 0.9,
                      "planning-pf-short-ntp": 0.9, "planning-pf-short-mtp": 0.9,
                      "planning-pf-short-nodead-ntp": 0.9, "planning-pf-short-nodead-mtp": 0.9,
                      "planning-pf-long-ntp": 0.5, "planning-pf-long-mtp": 0.5}


#: path finding at the CPU recipe (measured 2026-12-01, 256 held-out graphs). PF-short (3,000 steps, 8 follow-up
#: sub-queries per graph): in-context edge lookup is learned (teacher-forced 1.00) but the first step out of the
#: source is not planned (NTP: a uniform pick among its 3 successors, one a dead end; MTP worse), so greedy
#: accuracy stays < 0.9: the
#: build caches (floor 0.3) and the accuracy assertion fails; strict xfail until a recipe learns the look-ahead.
#: PF-long: the earlier 2,000 steps at lr 3e-3 without follow-ups (the build refuses to cache: ``zoo.path`` raises).
_PF_MEASURED = {
    "planning-pf-short-ntp": "greedy 0.684 = first step on a correct path 0.684 (uniform over the source's 3 "
                             "successors: 92/103/105 of 300), teacher-forced per step 1.00 0.68 1.00 1.00, one-step "
                             "look-ahead sub-queries 0.32-0.36 (chance 1/3), after 3,000 steps with 8 follow-up "
                             "sub-queries (without them, 6,000 steps: greedy 0.070, edge lookup at chance); with 4 "
                             "backward sub-queries per graph as well: greedy 0.641, one-step look-ahead sub-queries "
                             "0.92-0.96, first step still uniform (93/100/107 of 300)",
    "planning-pf-short-mtp": "greedy 0.527, first step on a correct path 0.531 (300 graphs: 81/68 to the two paths, 72 "
                             "dead end, 79 not a successor), teacher-forced per step 1.00 0.53 1.00 1.00, one-step "
                             "look-ahead sub-queries 0.71-0.78 (NTP: chance), same recipe as NTP (earlier recipe "
                             "without follow-ups, 6,000 steps: greedy 0.043); with 4 backward sub-queries per graph "
                             "as well: greedy 0.656, every sub-query type 0.95-1.00, first step still uniform",
    "planning-pf-long-ntp": "greedy 0.000, first step 0.102, decoy nodes used 0.46 after 2,000 steps",
    "planning-pf-long-mtp": "not measured (build stopped: its NTP twin reached 0.000); expected to fail likewise",
}


def _full_size_params():
    for s in PLANNING_SPECS:
        name = s["name"]
        if name in _PF_MEASURED:
            yield pytest.param(name, marks=pytest.mark.xfail(
                strict=True, raises=AssertionError,
                reason=f"4-layer d-64 model does not learn path finding to 0.9 in a CPU budget: "
                       f"{_PF_MEASURED[name]}"))
        else:
            yield name


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_full_size_params()))
def test_full_size_entry_accuracy(name):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        folder = zoo.path(name)
    except RuntimeError as exc:  # the build's accuracy floor: nothing cached; any other error is a failure
        if "did not train: greedy accuracy" not in str(exc):
            raise
        raise AssertionError(f"{name}: {exc}") from exc
    metrics = zoo.info(name).metrics
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    task = task_for(name)
    fresh = evaluate_planning(model, tok, task, task.examples(200, seed=424242))
    assert fresh["greedy_accuracy"] >= FULL_SIZE_ACCURACY[name], (fresh, metrics)
