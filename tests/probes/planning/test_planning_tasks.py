"""Planning task generators: path-finding graph invariants, horizon-toy determinism, grammar validity,
the word-level tokenizer, and the task <-> zoo recipe link.

(Named ``test_planning_tasks.py``, not ``test_tasks.py``: ``tests/dynamics/test_tasks.py`` exists and the
test folders are not packages, so equal basenames collide under pytest's default import mode.)
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from interp.benchmarks.planning.tasks import (ContextFreeGrammar, HorizonToy, PathFinding, make_tokenizer, task_for,
                                              task_from_params)
from interp.probes.planning import PlanningExample, PlanningTask


def _parse_edges(prompt: str):
    """Independent parse of the path-finding prompt format ``u v , u v , ... ? s g :``."""
    body, query = prompt.split(" ? ")
    edges = [tuple(e.split()) for e in body.split(" , ")]
    s, g, colon = query.split()
    assert colon == ":"
    return edges, s, g


def _all_simple_paths(edges, s, g):
    succ = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    out, stack = [], [[s]]
    while stack:
        path = stack.pop()
        if path[-1] == g:
            out.append(path)
            continue
        for nxt in succ[path[-1]]:
            if nxt not in path:
                stack.append(path + [nxt])
    return out


@pytest.mark.parametrize("variant,length", [("short", 4), ("long", 6)])
def test_pathfinding_graph_invariants(variant, length):
    task = PathFinding(variant)
    assert task.path_len == length and task.name == f"pf-{variant}"
    exs = task.examples(60, seed=3)
    firsts = []
    for ex in exs:
        edges, s, g = _parse_edges(ex.prompt)
        assert sorted(edges) == sorted(tuple(e) for e in ex.meta["edges"])
        assert len(set(edges)) == len(edges)
        assert (s, g) == (ex.meta["source"], ex.meta["goal"])
        # exactly the two answers are source->goal paths in the graph (brute-force enumeration)
        paths = sorted(" ".join(p) for p in _all_simple_paths(edges, s, g))
        assert paths == sorted(ex.answers) and len(paths) == 2
        assert ex.answers[0] == ex.target
        p1, p2 = (a.split() for a in ex.answers)
        assert len(p1) == len(p2) == length
        assert set(p1) & set(p2) == {s, g}  # node-disjoint apart from the endpoints
        decoy = ex.decoy.split()
        assert len(decoy) == length and len(set(decoy)) == length
        assert not set(decoy) & (set(p1) | set(p2))
        assert all((a, b) in set(edges) for a, b in zip(decoy, decoy[1:]))  # the decoy is a path in the graph
        # the source has dead-end successors, so the first step is a real choice
        succ_s = {b for a, b in edges if a == s}
        assert len(succ_s) == 2 + task.n_dead_out
        # correctness check: both answers, trailing words ignored, everything else rejected
        for a in ex.answers:
            assert task.is_correct(ex, a) and task.is_correct(ex, a + " n0 n1 <eos>")
        assert not task.is_correct(ex, ex.decoy)
        assert not task.is_correct(ex, " ".join(p1[:-1]))  # too short
        assert not task.is_correct(ex, " ".join(reversed(p1)))
        mixed = [p1[0], p2[1]] + p1[2:]  # hops from one path to the other: not along edges
        assert not task.is_correct(ex, " ".join(mixed))
        dead = ex.meta["dead_ends"][0]
        assert not task.is_correct(ex, " ".join((dead + [g] * length)[:length]))
        firsts.append(ex.target.split()[1])
    # which of the two paths is the target is random (both branches appear as target)
    assert 0.25 < sum(ex.target == sorted(ex.answers)[0] for ex in exs) / len(exs) < 0.75


def test_pathfinding_determinism_and_validation():
    t = PathFinding("short")
    assert t.examples(5, seed=11) == t.examples(5, seed=11)
    assert t.examples(5, seed=11) != t.examples(5, seed=12)
    assert t.examples(3, seed=11) == t.examples(5, seed=11)[:3]  # a prefix of the same stream
    with pytest.raises(ValueError, match="too small"):
        PathFinding("short", n_nodes=10)
    with pytest.raises(ValueError):
        PathFinding("medium")


def test_horizon_offsets_are_a_function_of_the_goal():
    task = HorizonToy()
    exs = task.examples(400, seed=5)
    by_goal = defaultdict(set)
    tails = defaultdict(set)
    for ex in exs:
        words = ex.prompt.split()
        assert words[-1] == "=" and len(words) == task.prefix_len + 1
        goals = [w for w in words if w in task.goals]
        assert goals == [ex.meta["goal"]] and words[ex.meta["goal_position"]] == ex.meta["goal"]
        tgt = ex.target.split()
        assert len(tgt) == task.horizon + task.n_random
        by_goal[ex.meta["goal"]].add(tuple(tgt[:task.horizon]))
        tails[ex.meta["goal"]].add(tgt[task.horizon])
        assert all(w in task.fillers for w in tgt[task.horizon:])
        assert task.is_correct(ex, ex.target)
    assert set(by_goal) == set(task.goals)
    assert all(len(v) == 1 for v in by_goal.values())  # offsets 1..3: deterministic in g
    for tau in range(task.horizon):  # ... and injective at every offset (full information about g)
        assert len({next(iter(v))[tau] for v in by_goal.values()}) == task.n_goals
    assert all(len(v) > 3 for v in tails.values())  # offset 4: not determined by g
    ex = exs[0]
    tgt = ex.target.split()
    wrong = [w for w in (f"p{i}" for i in range(task.n_goals)) if w != tgt[0]][0]
    assert not task.is_correct(ex, " ".join([wrong] + tgt[1:]))
    assert not task.is_correct(ex, " ".join(tgt[:task.horizon] + ["p0"] + tgt[task.horizon + 1:]))
    assert not task.is_correct(ex, " ".join(tgt[:-1]))
    assert task.plan("g3") == HorizonToy().plan("g3") != HorizonToy(map_seed=7).plan("g3")
    assert task.examples(4, seed=1) == task.examples(4, seed=1) != task.examples(4, seed=2)


def test_grammar_continuations():
    task = ContextFreeGrammar(prompt_len=10, target_len=8)
    exs = task.examples(40, seed=2)
    assert exs == task.examples(40, seed=2)
    for ex in exs:
        assert len(ex.prompt.split()) == 10 and len(ex.target.split()) == 8
        assert task.is_correct(ex, ex.target)
    g = task.pcfg
    ex = exs[0]
    # a continuation the grammar forbids: after any prefix, some terminal is invalid as the next word
    allowed = g.next_token_distribution(ex.prompt.split())
    bad = next(w for w in g.terminals if w not in allowed)
    assert not task.is_correct(ex, " ".join([bad] + ex.target.split()[1:]))
    assert not task.is_correct(ex, " ".join(ex.target.split()[:-1]))  # too short
    # recursion: nested relative clauses occur
    assert any(ex.prompt.count("that") >= 2 for ex in task.examples(200, seed=0))
    assert ContextFreeGrammar(grammar={"max_depth": 1}).pcfg.config.max_depth == 1


@pytest.mark.parametrize("task", [HorizonToy(), ContextFreeGrammar(), PathFinding("short"), PathFinding("long")],
                         ids=lambda t: t.name)
def test_tokenizer_round_trip(task):
    tok = make_tokenizer(task)
    assert len(tok) == len(task.vocab)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<bos>", "<eos>", "<unk>"]
    for ex in task.examples(5, seed=0):
        text = ex.prompt + " " + ex.target
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id and len(ids) == len(text.split()) + 1
        assert tok.convert_ids_to_tokens(ids[1:]) == text.split()
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok("zzz")["input_ids"] == [tok.bos_token_id, tok.unk_token_id]


#: task fields added after the first zoo entries were cached, with their defaults (``PathFinding.backward_marker``:
#: commit a48ff26, opt-in backward sub-queries; ``PathFinding.query_first``: opt-in query-before-edges format); the
#: entries that do not use them must not store them
_LATER_TASK_FIELDS = {"backward_marker": None, "query_first": False}


def test_protocol_and_task_for():
    from interp.benchmarks.planning.zoo import planning_specs

    for t in (HorizonToy(), ContextFreeGrammar(), PathFinding()):
        assert isinstance(t, PlanningTask)

    class MyTask:  # a user's own task satisfies the protocol structurally
        name = "mine"

        def examples(self, n, seed=0):
            return [PlanningExample(prompt="a b", target="c")] * n

        def is_correct(self, example, generated):
            return generated.split()[:1] == ["c"]

    assert isinstance(MyTask(), PlanningTask)
    assert task_for("pf-short") == PathFinding("short") and task_for("horizon") == HorizonToy()
    specs = planning_specs()
    assert len(specs) == 9
    for spec in specs:
        task = task_for(spec["name"])
        assert task_for("zoo:" + spec["name"]) == task
        # the recipe stores every field of the task, so changing a default changes the recipe hash; fields added
        # after the entries were cached (opt-in training aids, part of the task's identity when set) are left out
        # of the older recipes at their default, so those recipes, and their cache keys, stay the same
        fields = {f.name for f in dataclasses.fields(task)}
        stored = set(spec["params"]["task"]) - {"kind"}
        assert stored <= fields
        assert {f: getattr(task, f) for f in fields - stored} == {f: v for f, v in _LATER_TASK_FIELDS.items()
                                                                  if f in fields}
        assert task == task_from_params(spec["params"]["task"])
    with pytest.raises(KeyError):
        task_for("toy-grammar")
    with pytest.raises(KeyError):
        task_from_params({"kind": "nope"})


@pytest.mark.parametrize("variant", ["short", "long"])
def test_pathfinding_subqueries_have_unique_answers(variant):
    """Sub-queries (a training aid): same edges, a new query whose only walk is the target, >= 3 nodes."""
    task = PathFinding(variant)
    m = task.path_len - 1  # chain length of a dead end (source + path_len - 2 nodes)
    # per graph: each correct path has C(path_len, 2) - (path_len - 1) pairs >= 2 apart minus (s, g); the decoy
    # the same plus (first, last); the dead end C(m, 2) - (m - 1)
    pairs = lambda k: k * (k - 1) // 2 - (k - 1)  # noqa: E731
    want = 2 * (pairs(task.path_len) - 1) + pairs(task.path_len) + pairs(m)
    for ex in task.examples(20, seed=4):
        subs = task.subqueries(ex)
        assert len(subs) == want and (variant != "short" or want == 8)
        edges, _, _ = _parse_edges(ex.prompt)
        queries = set()
        for q in subs:
            q_edges, u, w = _parse_edges(q.prompt)
            assert q_edges == edges  # the same graph, same edge order
            assert (u, w) != (ex.meta["source"], ex.meta["goal"])
            walks = [" ".join(p) for p in _all_simple_paths(edges, u, w)]
            assert walks == [q.target] and q.answers == (q.target,)  # the only u -> w walk
            assert len(q.target.split()) >= 3 and task.is_valid_path(q, q.target.split()) is (
                len(q.target.split()) == task.path_len)
            queries.add((u, w))
        assert len(queries) == len(subs)
        # the branch choice out of the source into one path or into the dead end is among them
        s = ex.meta["source"]
        assert any(q.meta["source"] == s and q.target.split()[1] == ex.meta["dead_ends"][0][1] for q in subs)


def test_pathfinding_training_followups():
    task = PathFinding("short")
    assert task.training_examples(16, seed=3) == task.examples(16, seed=3)  # no follow-ups: the task itself
    docs = task.training_examples(50, seed=3, followups=3)
    assert docs == task.training_examples(50, seed=3, followups=3)
    for doc, ex in zip(docs, task.examples(50, seed=3)):
        # the main example is unchanged (an evaluation prompt is a prefix of the training document)
        assert (doc.prompt, doc.target, doc.answers, doc.decoy) == (ex.prompt, ex.target, ex.answers, ex.decoy)
        fu = doc.meta["followups"]
        subs = {(q.meta["source"], q.meta["goal"]): q.target for q in task.subqueries(ex)}
        assert len(fu) == 3 and len({q for q, _ in fu}) == 3
        for query, answer in fu:
            mark, u, w, colon = query.split()
            assert (mark, colon) == ("?", ":") and subs[(u, w)] == answer
    every = task.training_examples(5, seed=3, followups=100)[0].meta["followups"]
    assert len(every) == 8  # capped at the graph's sub-queries
    with pytest.raises(ValueError):
        task.training_examples(4, followups=-1)


def test_pathfinding_backward_subqueries():
    """Backward sub-queries (opt-in training aid): ``< w u :`` answered by the reversed chain segment ``w .. u``."""
    plain = PathFinding("short")
    assert "<" not in plain.vocab
    with pytest.raises(ValueError):
        plain.backward_subqueries(plain.examples(1)[0])
    with pytest.raises(ValueError):
        PathFinding("short", backward_marker="?")
    task = PathFinding("short", backward_marker="<")
    assert task.vocab == plain.vocab + ("<",) and task.examples(10, seed=5) == plain.examples(10, seed=5)
    for ex in task.examples(20, seed=5):
        edges, _, _ = _parse_edges(ex.prompt)
        back = task.backward_subqueries(ex)
        assert len(back) == 9  # the 8 forward pairs and the main pair, reversed
        for query, answers in back:
            mark, w, u, colon = query.split()
            assert (mark, colon) == ("<", ":")
            walks = sorted(" ".join(reversed(p)) for p in _all_simple_paths(edges, u, w))
            assert sorted(answers) == walks  # every backward walk w -> u, i.e. every forward walk u -> w
            assert len(answers) == (2 if (u, w) == (ex.meta["source"], ex.meta["goal"]) else 1)
    # backward=0 keeps the forward-only documents; backward > 0 mixes in distinct backward queries
    assert task.training_examples(8, seed=2, followups=8) == plain.training_examples(8, seed=2, followups=8)
    docs = task.training_examples(30, seed=2, followups=8, backward=4)
    assert docs == task.training_examples(30, seed=2, followups=8, backward=4)
    for doc, ex in zip(docs, task.examples(30, seed=2)):
        assert (doc.prompt, doc.target) == (ex.prompt, ex.target)
        fu = doc.meta["followups"]
        backs = [(q, a) for q, a in fu if q.startswith("<")]
        assert len(fu) == 12 and len(backs) == 4 and len({q for q, _ in fu}) == 12
        allowed = dict(task.backward_subqueries(ex))
        assert all(a in allowed[q] for q, a in backs)
    with pytest.raises(ValueError):
        plain.training_examples(2, followups=2, backward=1)


def test_pathfinding_query_first():
    """``query_first`` (opt-in format): the query ``? s g :`` also before the edges; everything else unchanged."""
    plain, task = PathFinding("short"), PathFinding("short", query_first=True, backward_marker="<")
    assert task.vocab == plain.vocab + ("<",)
    for ex, ref in zip(task.examples(20, seed=4), plain.examples(20, seed=4)):
        s, g = ex.meta["source"], ex.meta["goal"]
        assert ex.prompt == f"? {s} {g} : {ref.prompt}"
        assert (ex.target, ex.answers, ex.decoy, ex.meta) == (ref.target, ref.answers, ref.decoy, ref.meta)
        assert task.is_correct(ex, ex.answers[1]) and not task.is_correct(ex, ex.decoy)
        # sub-queries keep the same edge list (with the main query in front) and their unique answers
        subs = task.subqueries(ex)
        assert [q.target for q in subs] == [q.target for q in plain.subqueries(ref)]
        assert all(q.prompt.startswith(f"? {s} {g} : ") and q.prompt.endswith(":") for q in subs)
    docs = task.training_examples(6, seed=1, followups=8, backward=4)
    assert [d.meta["followups"] for d in docs] == [d.meta["followups"] for d in
                                                   PathFinding("short", backward_marker="<").training_examples(
                                                       6, seed=1, followups=8, backward=4)]
    assert task_from_params({"kind": "pf", "variant": "short", "query_first": True}) == PathFinding(
        "short", query_first=True)
