"""Planning tasks of the reproduction: prompts with known correct continuations, for the horizon /
branch-awareness analyses.

The contract every analysis codes against is :class:`interp.probes.planning.PlanningTask` (a ``Protocol``,
in the library); the generators here are the paper's task families at CPU scale ("Internal Planning in Language Models", Ustaomeroglu, Askin et al., ICLR 2026):

- :class:`HorizonToy` -- the digest's goal-token toy: a prefix of filler words holding one goal token
  ``g``; the ``horizon`` (3) tokens right after the prompt are a fixed function of ``g``, the rest are
  uniformly random fillers, so information about the prefix is needed exactly up to offset 3.
- :class:`ContextFreeGrammar` -- continuations of the probabilistic context-free grammar with nested
  relative clauses of :mod:`interp.data.grammar` (recursion up to depth 2, number agreement across it).
- :class:`PathFinding` (``"short"``: 4-node paths, ``"long"``: 6-node paths) -- random directed graphs
  with exactly two node-disjoint source-to-goal paths, a decoy path sharing no node with them, and
  dead-end branches out of the source and into the goal (so the first step needs look-ahead).

All texts are word-level: tokens are separated by single spaces; :func:`make_tokenizer` builds a
Hugging Face word-level tokenizer over a task's :attr:`vocab` that prepends ``<bos>``.
Every generator is deterministic given ``seed`` (its own ``random.Random``; no global state).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from interp.probes.planning.tasks import PlanningExample, PlanningTask

__all__ = ["PlanningExample", "PlanningTask", "HorizonToy", "ContextFreeGrammar", "PathFinding",
           "SPECIAL_TOKENS", "make_tokenizer", "task_vocab", "task_for", "task_from_params", "TASKS"]

#: special tokens at the start of every task vocabulary (ids 0..3)
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


def _words(generated: str, n: int) -> list[str] | None:
    """The first ``n`` words of a generation, or ``None`` if it has fewer (``<eos>``/``<pad>`` end it)."""
    out = []
    for w in generated.split():
        if w in ("<eos>", "<pad>"):
            break
        out.append(w)
    return out[:n] if len(out) >= n else None


# ----------------------------------------------------------------------------------------- horizon toy
@dataclass(frozen=True)
class HorizonToy:
    """The goal-token horizon toy (digest §4, validation recipe 2).

    Prompt: ``prefix_len`` words, all fillers ``w0..w{n_fillers-1}`` except one goal token
    ``g0..g{n_goals-1}`` at a uniformly random position, then the marker ``=`` (position T).
    Target: ``horizon`` plan tokens that are a fixed function of the goal -- offset ``τ`` (1-based) holds
    ``p{perm_τ[g]}`` for a permutation ``perm_τ`` of ``range(n_goals)`` drawn from ``map_seed`` -- then
    ``n_random`` uniformly random fillers. So the token at ``T+τ`` is determined by ``g`` for
    ``τ <= horizon`` and independent of the whole prefix for ``τ > horizon``.
    ``is_correct``: the plan tokens are exact and the tail has ``n_random`` filler words.
    """

    n_goals: int = 8
    n_fillers: int = 16
    prefix_len: int = 12
    horizon: int = 3
    n_random: int = 9
    map_seed: int = 1234
    name: str = "horizon"

    def __post_init__(self):
        if self.n_goals < 2 or self.n_fillers < 2 or self.prefix_len < 1 or self.horizon < 1 or self.n_random < 0:
            raise ValueError(f"invalid HorizonToy sizes: {self}")

    @property
    def goals(self) -> tuple[str, ...]:
        return tuple(f"g{i}" for i in range(self.n_goals))

    @property
    def fillers(self) -> tuple[str, ...]:
        return tuple(f"w{i}" for i in range(self.n_fillers))

    @property
    def vocab(self) -> tuple[str, ...]:
        plans = tuple(f"p{i}" for i in range(self.n_goals))
        return SPECIAL_TOKENS + self.goals + self.fillers + plans + ("=",)

    def plan(self, goal: str) -> tuple[str, ...]:
        """The ``horizon`` plan tokens that follow the prompt for goal token ``goal`` (e.g. ``"g3"``)."""
        g = self.goals.index(goal)
        rng = random.Random(self.map_seed)
        perms = []
        for _ in range(self.horizon):
            p = list(range(self.n_goals))
            rng.shuffle(p)
            perms.append(p)
        return tuple(f"p{perm[g]}" for perm in perms)

    def examples(self, n: int, seed: int = 0) -> list[PlanningExample]:
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            goal = rng.choice(self.goals)
            prefix = [rng.choice(self.fillers) for _ in range(self.prefix_len)]
            pos = rng.randrange(self.prefix_len)
            prefix[pos] = goal
            tail = [rng.choice(self.fillers) for _ in range(self.n_random)]
            out.append(PlanningExample(prompt=" ".join(prefix + ["="]), target=" ".join(self.plan(goal) + tuple(tail)),
                                       meta={"goal": goal, "goal_position": pos}))
        return out

    def is_correct(self, example: PlanningExample, generated: str) -> bool:
        words = _words(generated, self.horizon + self.n_random)
        if words is None:
            return False
        fill = set(self.fillers)
        return (tuple(words[:self.horizon]) == self.plan(example.meta["goal"])
                and all(w in fill for w in words[self.horizon:]))


# ----------------------------------------------------------------------------------------- grammar
@dataclass(frozen=True)
class ContextFreeGrammar:
    """Continuations of the toy PCFG of :mod:`interp.data.grammar` (nested relative clauses, agreement).

    Each example is one document of the grammar's sentence stream (``<bos>`` then whole sentences) cut
    after ``prompt_len`` words: the prompt is those words (without ``<bos>``), the target the next
    ``target_len`` sampled words (usually ending the current sentence and starting new ones).
    ``is_correct``: the first ``target_len`` generated words are a valid continuation under the grammar
    (checked with its LL(1) parser). ``grammar`` holds :class:`interp.data.grammar.GrammarConfig` fields.
    """

    prompt_len: int = 24
    target_len: int = 12
    grammar: Mapping[str, Any] = field(default_factory=dict)
    name: str = "cfg"

    def __post_init__(self):
        if self.prompt_len < 1 or self.target_len < 1:
            raise ValueError(f"invalid ContextFreeGrammar lengths: {self}")
        object.__setattr__(self, "grammar", dict(self.grammar))

    def __hash__(self):
        return hash((self.prompt_len, self.target_len, tuple(sorted(self.grammar.items())), self.name))

    @property
    def pcfg(self):
        """The :class:`interp.data.grammar.ToyGrammar` object (cached per task)."""
        cached = self.__dict__.get("_pcfg")
        if cached is None:
            from interp.data.grammar import GrammarConfig, ToyGrammar

            cached = ToyGrammar(GrammarConfig(**self.grammar))
            object.__setattr__(self, "_pcfg", cached)
        return cached

    @property
    def vocab(self) -> tuple[str, ...]:
        return tuple(self.pcfg.vocab)

    def examples(self, n: int, seed: int = 0) -> list[PlanningExample]:
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            doc = self.pcfg.sample_document(rng, 1 + self.prompt_len + self.target_len)
            words = doc[1:]
            out.append(PlanningExample(prompt=" ".join(words[:self.prompt_len]),
                                       target=" ".join(words[self.prompt_len:])))
        return out

    def is_correct(self, example: PlanningExample, generated: str) -> bool:
        words = _words(generated, self.target_len)
        if words is None:
            return False
        try:
            self.pcfg.parse_states(example.prompt.split() + words)
        except ValueError:
            return False
        return True


# ----------------------------------------------------------------------------------------- path finding
@dataclass(frozen=True)
class PathFinding:
    """Path finding on random directed graphs with two correct paths and a decoy.

    ``variant="short"``: paths of ``path_len=4`` nodes (source, 2 intermediates, goal); ``"long"``: 6 nodes.
    Each graph (node names ``n0..n{n_nodes-1}``, drawn without replacement) holds

    - two node-disjoint source->goal paths of ``path_len`` nodes (the only source->goal paths);
    - a decoy path of ``path_len`` nodes sharing no node with them (and unconnected to them);
    - ``n_dead_out`` dead-end branches out of the source and ``n_dead_in`` branches into the goal, each a
      chain of ``path_len - 2`` fresh nodes: a first step into a dead end cannot reach the goal, and a
      chain into the goal cannot be reached from the source, so choosing the first step needs look-ahead.

    Prompt: the edges ``u v`` in random order separated by ``,``, then ``? source goal :``. With the opt-in
    ``query_first=True`` the query also comes *before* the edges (``? source goal : edges ? source goal :``), so
    the edge positions can already see the source and the goal (a format option, issue #15; the end of the prompt,
    the target and every other field are the same).
    Target: one of the two paths (both are in ``answers``, in random order; ``answers[0] == target``) as
    its node words, source and goal included; ``decoy`` is the decoy path. ``is_correct`` accepts any
    valid source->goal walk of exactly ``path_len`` nodes along prompt edges (with these graphs: either
    correct path). ``meta`` holds ``source``, ``goal``, ``edges`` (list of pairs) and ``dead_ends``.

    Training aid (a recipe choice, outside the contract): :meth:`subqueries` lists the graph's other queries with a
    unique answer, and :meth:`training_examples` appends some of them after the target, which multiplies the
    in-context edge lookups a small model is trained on (``zoo:planning-pf-*``; docs/planning.md).
    """

    variant: str = "short"
    path_len: int | None = None
    n_nodes: int | None = None
    n_dead_out: int = 1
    n_dead_in: int = 0
    name: str | None = None
    #: training aid (opt-in, outside the contract): the marker word of *backward* sub-queries
    #: (:meth:`backward_subqueries`); when set it is added to :attr:`vocab` (after the other words)
    backward_marker: str | None = None
    #: format option (opt-in): repeat the query ``? source goal :`` before the edge list, so that a causal model
    #: reading the edges already knows the goal (edge positions can mark "leads to the goal"); default ``False``
    #: keeps the original prompts (and the recipe hashes of the entries that do not set it)
    query_first: bool = False

    def __post_init__(self):
        if self.backward_marker is not None and (self.backward_marker in ("?", ":", ",")
                                                 or self.backward_marker.startswith("n") or " " in self.backward_marker
                                                 or self.backward_marker in SPECIAL_TOKENS):
            raise ValueError(f"backward_marker {self.backward_marker!r} clashes with the task's words")
        if self.variant not in ("short", "long"):
            raise ValueError(f"PathFinding variant must be 'short' or 'long', got {self.variant!r}")
        if self.path_len is None:
            object.__setattr__(self, "path_len", 4 if self.variant == "short" else 6)
        if self.n_nodes is None:
            object.__setattr__(self, "n_nodes", 24 if self.variant == "short" else 36)
        if self.name is None:
            object.__setattr__(self, "name", f"pf-{self.variant}")
        if self.path_len < 3:
            raise ValueError("path_len must be >= 3 (source, at least one intermediate, goal)")
        need = 2 + 2 * (self.path_len - 2) + self.path_len + (self.n_dead_out + self.n_dead_in) * (self.path_len - 2)
        if self.n_nodes < need:
            raise ValueError(f"n_nodes={self.n_nodes} is too small: a graph needs {need} distinct nodes")

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(f"n{i}" for i in range(self.n_nodes))

    @property
    def vocab(self) -> tuple[str, ...]:
        extra = (self.backward_marker,) if self.backward_marker else ()
        return SPECIAL_TOKENS + self.nodes + (",", "?", ":") + extra

    def _graph(self, rng: random.Random) -> dict:
        m = self.path_len - 2
        need = 2 + 2 * m + self.path_len + (self.n_dead_out + self.n_dead_in) * m
        pool = rng.sample(self.nodes, need)
        s, g = pool[0], pool[1]
        it = iter(pool[2:])
        p1 = [s] + [next(it) for _ in range(m)] + [g]
        p2 = [s] + [next(it) for _ in range(m)] + [g]
        decoy = [next(it) for _ in range(self.path_len)]
        dead_out = [[s] + [next(it) for _ in range(m)] for _ in range(self.n_dead_out)]
        dead_in = [[next(it) for _ in range(m)] + [g] for _ in range(self.n_dead_in)]
        edges = [(a, b) for chain in [p1, p2, decoy] + dead_out + dead_in for a, b in zip(chain, chain[1:])]
        rng.shuffle(edges)
        return {"source": s, "goal": g, "paths": (p1, p2), "decoy": decoy, "edges": edges,
                "dead_ends": dead_out + dead_in}

    def examples(self, n: int, seed: int = 0) -> list[PlanningExample]:
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            gr = self._graph(rng)
            p1, p2 = gr["paths"]
            if rng.random() < 0.5:
                p1, p2 = p2, p1
            edge_words = " , ".join(f"{a} {b}" for a, b in gr["edges"])
            prompt = f"{edge_words} ? {gr['source']} {gr['goal']} :"
            if self.query_first:
                prompt = f"? {gr['source']} {gr['goal']} : {prompt}"
            answers = (" ".join(p1), " ".join(p2))
            out.append(PlanningExample(prompt=prompt, target=answers[0], answers=answers, decoy=" ".join(gr["decoy"]),
                                       meta={"source": gr["source"], "goal": gr["goal"],
                                             "edges": [list(e) for e in gr["edges"]],
                                             "dead_ends": gr["dead_ends"]}))
        return out

    def subqueries(self, example: PlanningExample) -> list[PlanningExample]:
        """Every sub-query of ``example``'s graph with a unique answer of at least 3 nodes.

        Same edge list, query ``? u w :`` for two nodes ``u``, ``w`` at least two steps apart on one chain of the
        graph (either correct path, the decoy, a dead-end branch), target the chain segment ``u .. w`` (its
        only ``u -> w`` walk; ``answers == (target,)``, no decoy). The main query (source, goal: two answers) is
        excluded. PF-short yields 8 per graph: ``? s b : s a b`` (a branch choice from the source with one step of
        look-ahead), ``? a g : a b g`` (one edge lookup), the decoy's segments and ``? s y : s x y`` into a dead end.

        A *training aid* (see :meth:`training_examples`), not part of the task's contract.
        """
        prompt_edges = example.prompt.rsplit(" ? ", 1)[0]
        chains = [a.split() for a in example.answers] + [example.decoy.split()] + [list(c) for c in
                                                                                   example.meta["dead_ends"]]
        ends = {(example.meta["source"], example.meta["goal"])}
        out, seen = [], set()
        for chain in chains:
            for i in range(len(chain)):
                for j in range(i + 2, len(chain)):
                    u, w = chain[i], chain[j]
                    if (u, w) in ends or (u, w) in seen:
                        continue
                    seen.add((u, w))
                    seg = " ".join(chain[i:j + 1])
                    out.append(PlanningExample(prompt=f"{prompt_edges} ? {u} {w} :", target=seg, answers=(seg,),
                                               meta={**example.meta, "source": u, "goal": w, "subquery": True}))
        return out

    def backward_subqueries(self, example: PlanningExample) -> list[tuple[str, tuple[str, ...]]]:
        """Backward sub-queries of ``example``'s graph: ``(query, answers)`` word strings (needs ``backward_marker``).

        For two nodes ``u``, ``w`` at least two steps apart on one chain (either correct path, the decoy, a dead-end
        branch), the query ``< w u :`` (``<`` = :attr:`backward_marker`) asks for the walk from ``w`` back to ``u``
        against the edges; the answer is the reversed chain segment ``w .. u``. The main pair is included:
        ``< g s :`` has two answers (both reversed paths; with ``n_dead_in = 0`` every predecessor of the goal is
        on a correct path, so it needs no look-ahead). Each answer step is a *predecessor* lookup of the word just
        written (``b = pred(g)``); a decision with two predecessors (``< g a :``) is decided by a successor lookup
        of the query's end node. PF-short yields 9 per graph.

        A *training aid* (recipe choice, issue #15): the first step of the main query needs the predecessors of the
        goal's predecessors, which forward answers never supervise densely (every later forward step is solved by a
        successor lookup of the word just written, the "Clever Hans" shortcut of teacher forcing).
        """
        if not self.backward_marker:
            raise ValueError("backward sub-queries need PathFinding(backward_marker=...)")
        chains = [a.split() for a in example.answers] + [example.decoy.split()] + [list(c) for c in
                                                                                   example.meta["dead_ends"]]
        found: dict[tuple[str, str], list[str]] = {}
        for chain in chains:
            for i in range(len(chain)):
                for j in range(i + 2, len(chain)):
                    seg = " ".join(reversed(chain[i:j + 1]))
                    answers = found.setdefault((chain[j], chain[i]), [])
                    if seg not in answers:
                        answers.append(seg)
        return [(f"{self.backward_marker} {w} {u} :", tuple(a)) for (w, u), a in found.items()]

    def training_examples(self, n: int, seed: int = 0, followups: int = 0,
                          backward: int = 0) -> list[PlanningExample]:
        """Training documents: :meth:`examples` with ``followups`` sub-queries of the same graph appended.

        Each example is the main example of :meth:`examples` (same prompt, same target) with
        ``meta["followups"]``: ``min(followups, len(subqueries))`` distinct :meth:`subqueries`, in random order, as
        ``(query, answer)`` word strings (``"? u w :"``, ``"u .. w"``). A trainer appends them after the target
        (``prompt target query answer query answer ...``) with the loss on the answers. The main query comes
        first, so an evaluation prompt is exactly a prefix of a training document.

        *Recipe choice* (issue #15): the main query alone gives one branch choice and about one edge lookup per
        graph, too little signal for a small model to discover in-context edge lookup (measured: chance-level
        one-hop lookup after 6,000 steps); the follow-ups add lookups forwards and backwards and one-step branch
        choices that compose into the main query. Evaluation always uses :meth:`examples` alone.

        ``backward > 0`` (needs ``backward_marker``) adds ``min(backward, 9)`` distinct
        :meth:`backward_subqueries` (one of its answers at random where there are two), and shuffles them in with the
        forward ones (drawn from their own random stream, so ``backward = 0`` leaves the documents unchanged).
        """
        if followups < 0 or backward < 0:
            raise ValueError(f"followups and backward must be >= 0, got {followups}, {backward}")
        base = self.examples(n, seed)
        if followups == 0 and backward == 0:
            return base
        rng = random.Random(f"followups-{seed}")
        brng = random.Random(f"backward-{seed}")
        out = []
        for ex in base:
            subs = self.subqueries(ex)
            picked = rng.sample(subs, min(followups, len(subs)))
            pairs = tuple((q.prompt.rsplit(" ? ", 1)[1].join(["? ", ""]), q.target) for q in picked)
            if backward:
                bsubs = self.backward_subqueries(ex)
                bpairs = [(q, brng.choice(a)) for q, a in brng.sample(bsubs, min(backward, len(bsubs)))]
                mixed = list(pairs) + bpairs
                brng.shuffle(mixed)
                pairs = tuple(mixed)
            out.append(PlanningExample(prompt=ex.prompt, target=ex.target, answers=ex.answers, decoy=ex.decoy,
                                       meta={**ex.meta, "followups": pairs}))
        return out

    def is_valid_path(self, example: PlanningExample, words: Sequence[str]) -> bool:
        """``words`` is a source->goal walk of ``path_len`` distinct nodes along the example's edges."""
        edges = {tuple(e) for e in example.meta["edges"]}
        return (len(words) == self.path_len and words[0] == example.meta["source"]
                and words[-1] == example.meta["goal"] and len(set(words)) == len(words)
                and all((a, b) in edges for a, b in zip(words, words[1:])))

    def is_correct(self, example: PlanningExample, generated: str) -> bool:
        words = _words(generated, self.path_len)
        return words is not None and self.is_valid_path(example, words)


# ----------------------------------------------------------------------------------------- registry / tokenizer
#: task families by name; ``task_from_params`` builds one from ``{"kind": name, **fields}``
TASKS = {"horizon": HorizonToy, "cfg": ContextFreeGrammar, "pf": PathFinding}


def task_from_params(params: Mapping[str, Any]) -> PlanningTask:
    """Build a task from ``{"kind": "horizon" | "cfg" | "pf", **dataclass fields}`` (zoo recipes store this)."""
    params = dict(params)
    kind = params.pop("kind")
    try:
        cls = TASKS[kind]
    except KeyError:
        raise KeyError(f"unknown planning task kind {kind!r}; known: {', '.join(TASKS)}") from None
    return cls(**params)


def task_for(name: str) -> PlanningTask:
    """The task a planning zoo model was trained on (``"planning-pf-short-ntp"``, ``"zoo:..."``), or a task
    by short name (``"horizon"``, ``"cfg"``, ``"pf-short"``, ``"pf-long"``) with default settings."""
    short = {"horizon": lambda: HorizonToy(), "cfg": lambda: ContextFreeGrammar(),
             "pf-short": lambda: PathFinding("short"), "pf-long": lambda: PathFinding("long")}
    if name in short:
        return short[name]()
    from interp.zoo import get_entry

    params = get_entry(name).params
    if "task" not in params:
        raise KeyError(f"zoo entry {name!r} is not a planning model (its recipe has no 'task')")
    return task_from_params(params["task"])


def task_vocab(task: Any) -> tuple[str, ...]:
    """A task's word vocabulary (``task.vocab``), special tokens first; raises if the task has none."""
    vocab = tuple(getattr(task, "vocab", ()))
    if not vocab:
        raise TypeError(f"task {getattr(task, 'name', task)!r} has no `vocab`")
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        vocab = tuple(t for t in SPECIAL_TOKENS if t in missing) + vocab
    if len(set(vocab)) != len(vocab):
        raise ValueError("task vocabulary has duplicate words")
    return vocab


def make_tokenizer(task_or_vocab: Any):
    """A word-level ``PreTrainedTokenizerFast`` over a task's vocabulary (or a word sequence) that
    prepends ``<bos>``; unknown words map to ``<unk>``; ``decode`` joins words with single spaces."""
    from interp.training import word_level_tokenizer

    vocab = task_vocab(task_or_vocab) if not isinstance(task_or_vocab, (list, tuple)) else tuple(task_or_vocab)
    return word_level_tokenizer(vocab)
