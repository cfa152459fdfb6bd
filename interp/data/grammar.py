"""A probabilistic grammar whose continuations are known exactly (the language of ``zoo:toy-grammar`` and of the
planning recipe's ``cfg`` task; the model and its training are :mod:`interp.apps.zoo.grammar`).

The language is a tiny English-like probabilistic context-free grammar (PCFG) with **number agreement
across nested relative clauses**, written so that it is LL(1):

    S          -> Det Adjs SubjN                         (a sentence ends with ".")
    SubjN      -> N_sg Rel_sg VP_sg "."  |  N_pl Rel_pl VP_pl "."
    Rel_x      -> "that" RelBody_x  |  ε                 (only while depth < max_depth)
    RelBody_x  -> VP_x  |  Det Adjs ObjRelN              (subject / object relative clause)
    ObjRelN    -> N_sg Rel_sg Vt_sg  |  N_pl Rel_pl Vt_pl
    VP_x       -> Vi_x  |  Vt_x Det Adjs ObjN
    ObjN       -> N_sg Rel_sg  |  N_pl Rel_pl
    Adjs       -> Adj Adjs  |  ε

The verb after a subject must agree in number with the subject's head noun, however many nouns of the
other number the relative clauses in between contain ("the dog that the cats chase runs ."). Because
the grammar is LL(1), one left-to-right parser state (a stack of symbols) determines the **exact**
next-token distribution after any prefix (:meth:`ToyGrammar.next_token_distribution`), so every
continuation of the trained model can be scored against the truth. Documents are streams of sentences
after a ``<bos>`` token.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
DETS = ("the", "my")
ADJS = ("big", "small", "old", "happy", "red")
NOUNS = {"sg": ("dog", "cat", "bird", "child", "teacher", "farmer"),
         "pl": ("dogs", "cats", "birds", "children", "teachers", "farmers")}
VERBS_INTRANSITIVE = {"sg": ("sleeps", "runs", "laughs"), "pl": ("sleep", "run", "laugh")}
VERBS_TRANSITIVE = {"sg": ("sees", "chases", "likes", "helps"), "pl": ("see", "chase", "like", "help")}

Symbol = str  # terminals are words; nonterminals start with an upper-case letter and carry "@depth"
Rule = tuple[float, tuple[Symbol, ...]]


@dataclass(frozen=True)
class GrammarConfig:
    """Probabilities of the PCFG (the recipe of the language)."""

    p_plural: float = 0.5        # subject / object noun is plural
    p_adj: float = 0.25          # one more adjective
    p_relative: float = 0.35     # a noun takes a relative clause (while depth < max_depth)
    p_object_relative: float = 0.5  # a relative clause is an object relative ("that the cats chase")
    p_transitive: float = 0.6    # VP has an object
    max_depth: int = 2           # maximum nesting of relative clauses


class ToyGrammar:
    """The PCFG with exact sampling, parsing and next-token distributions."""

    def __init__(self, config: GrammarConfig | None = None):
        self.config = config or GrammarConfig()
        self.rules: dict[Symbol, list[Rule]] = {}
        self._build_rules()
        self.terminals: tuple[str, ...] = tuple(
            dict.fromkeys(DETS + ADJS + ("that", ".") + NOUNS["sg"] + NOUNS["pl"] + VERBS_INTRANSITIVE["sg"]
                          + VERBS_INTRANSITIVE["pl"] + VERBS_TRANSITIVE["sg"] + VERBS_TRANSITIVE["pl"]))
        self.vocab: tuple[str, ...] = SPECIAL_TOKENS + self.terminals
        self.token_id = {t: i for i, t in enumerate(self.vocab)}
        self.number_of = {w: n for n in ("sg", "pl") for w in
                          NOUNS[n] + VERBS_INTRANSITIVE[n] + VERBS_TRANSITIVE[n]}
        self._nouns = frozenset(NOUNS["sg"] + NOUNS["pl"])
        self._verbs = frozenset(self.number_of) - self._nouns

    # ------------------------------------------------------------------ grammar
    def _build_rules(self) -> None:
        c = self.config
        r = self.rules

        def uniform(words: Sequence[str]) -> list[Rule]:
            return [(1.0 / len(words), (w,)) for w in words]

        r["Det"] = uniform(DETS)
        r["Adjs"] = [(c.p_adj, ("Adj", "Adjs")), (1 - c.p_adj, ())]
        r["Adj"] = uniform(ADJS)
        for n in ("sg", "pl"):
            r[f"N_{n}"] = uniform(NOUNS[n])
            r[f"Vi_{n}"] = uniform(VERBS_INTRANSITIVE[n])
            r[f"Vt_{n}"] = uniform(VERBS_TRANSITIVE[n])
        pn = {"sg": 1 - c.p_plural, "pl": c.p_plural}
        r["S"] = [(1.0, ("Det", "Adjs", "SubjN@0"))]
        for d in range(c.max_depth + 1):
            r[f"SubjN@{d}"] = [(pn[n], (f"N_{n}", f"Rel_{n}@{d}", f"VP_{n}@{d}", ".")) for n in ("sg", "pl")]
            r[f"ObjN@{d}"] = [(pn[n], (f"N_{n}", f"Rel_{n}@{d}")) for n in ("sg", "pl")]
            r[f"ObjRelN@{d}"] = [(pn[n], (f"N_{n}", f"Rel_{n}@{d}", f"Vt_{n}")) for n in ("sg", "pl")]
            for n in ("sg", "pl"):
                r[f"VP_{n}@{d}"] = [(1 - c.p_transitive, (f"Vi_{n}",)),
                                    (c.p_transitive, (f"Vt_{n}", "Det", "Adjs", f"ObjN@{d}"))]
                if d < c.max_depth:
                    r[f"Rel_{n}@{d}"] = [(c.p_relative, ("that", f"RelBody_{n}@{d + 1}")), (1 - c.p_relative, ())]
                else:
                    r[f"Rel_{n}@{d}"] = [(1.0, ())]
                r[f"RelBody_{n}@{d}"] = [(1 - c.p_object_relative, (f"VP_{n}@{d}",)),
                                         (c.p_object_relative, ("Det", "Adjs", f"ObjRelN@{d}"))]

    def is_terminal(self, sym: Symbol) -> bool:
        return sym not in self.rules

    # ------------------------------------------------------------------ sampling
    def sample_sentence(self, rng: random.Random) -> list[str]:
        """One sentence (list of words, ending with ".") sampled from the PCFG."""
        out: list[str] = []
        stack: list[Symbol] = ["S"]
        while stack:
            sym = stack.pop()
            if self.is_terminal(sym):
                out.append(sym)
                continue
            rules = self.rules[sym]
            x, acc = rng.random(), 0.0
            rhs = rules[-1][1]
            for p, cand in rules:
                acc += p
                if x < acc:
                    rhs = cand
                    break
            stack.extend(reversed(rhs))
        return out

    def sample_document(self, rng: random.Random, n_tokens: int) -> list[str]:
        """``<bos>`` followed by whole sentences, cut to ``n_tokens`` tokens in total."""
        words = ["<bos>"]
        while len(words) < n_tokens:
            words.extend(self.sample_sentence(rng))
        return words[:n_tokens]

    # ------------------------------------------------------------------ exact next-token distributions
    @lru_cache(maxsize=200_000)  # noqa: B019 - grammar objects are few and long-lived
    def _dist(self, stack: tuple[Symbol, ...]) -> tuple[tuple[str, float], ...]:
        if not stack:  # end of a sentence: the stream continues with a new sentence
            return self._dist(("S",))
        head, rest = stack[0], stack[1:]
        if self.is_terminal(head):
            return ((head, 1.0),)
        acc: dict[str, float] = {}
        for p, rhs in self.rules[head]:
            for tok, q in self._dist(tuple(rhs) + rest):
                acc[tok] = acc.get(tok, 0.0) + p * q
        return tuple(sorted(acc.items()))

    def _advance(self, stack: tuple[Symbol, ...], tok: str) -> tuple[Symbol, ...]:
        """Consume ``tok`` with the LL(1) parser; raises ``ValueError`` if ``tok`` is not a valid continuation."""
        if not stack:
            stack = ("S",)
        while True:
            head, rest = stack[0], stack[1:]
            if self.is_terminal(head):
                if head != tok:
                    raise ValueError(f"token {tok!r} is not a valid continuation (expected {head!r})")
                return rest
            for _, rhs in self.rules[head]:
                cand = tuple(rhs) + rest
                if any(t == tok for t, _ in self._dist(cand)):
                    stack = cand if cand else ("S",)
                    break
            else:
                raise ValueError(f"token {tok!r} is not a valid continuation here")

    def parse_states(self, words: Sequence[str]) -> list[tuple[Symbol, ...]]:
        """Parser stacks after each prefix: element ``i`` is the state after ``words[: i + 1]``.

        ``words`` may start with ``<bos>``; it must be a valid prefix of the sentence stream.
        """
        stack: tuple[Symbol, ...] = ("S",)
        states = []
        for w in words:
            if w != "<bos>":
                stack = self._advance(stack, w)
            states.append(stack)
        return states

    def next_token_distribution(self, words: Sequence[str]) -> dict[str, float]:
        """Exact probability of each next word after the prefix ``words`` (``<bos>`` optional)."""
        stack = self.parse_states(words)[-1] if words else ("S",)
        return dict(self._dist(stack))

    def target_matrix(self, docs: Sequence[Sequence[str]]):
        """Exact next-token distributions for every position of each document: ``[n_docs, T, vocab]`` tensor."""
        import torch

        out = torch.zeros(len(docs), len(docs[0]), len(self.vocab))
        for b, doc in enumerate(docs):
            for t, stack in enumerate(self.parse_states(doc)):
                for tok, p in self._dist(stack):
                    out[b, t, self.token_id[tok]] = p
        return out

    def agreement_positions(self, doc: Sequence[str]) -> list[tuple[int, str, bool]]:
        """Positions ``t`` where a verb may come next and every valid verb has one number.

        Returns ``(t, "sg" | "pl", attractor)``; ``attractor`` is True when the most recent noun before
        the verb has the *other* number ("the dog that the cats chase | runs"), i.e. where the model must
        remember the head noun's number across a relative clause.
        """
        out = []
        last_noun = None
        for t, stack in enumerate(self.parse_states(doc)):
            if doc[t] in self._nouns:
                last_noun = self.number_of[doc[t]]
            numbers = {self.number_of[tok] for tok, _ in self._dist(stack) if tok in self._verbs}
            if len(numbers) == 1:
                n = numbers.pop()
                out.append((t, n, last_noun is not None and last_noun != n))
        return out

    def entropy_rate(self, docs: Sequence[Sequence[str]]) -> float:
        """Mean entropy (nats) of the exact next-token distribution over all positions of ``docs``."""
        tot, n = 0.0, 0
        for doc in docs:
            for stack in self.parse_states(doc):
                tot -= sum(p * math.log(p) for _, p in self._dist(stack) if p > 0)
                n += 1
        return tot / max(n, 1)
