"""Automated rule creation: from a scenario's example conversations (and negatives) to an editable rule.

The paper's tool (gavel-studio) was not read (UNCERTAIN); this implements the procedure the issue states:

1. Rank CEs by how strongly the scenario's examples fire them: ``support_c`` = share of example
   conversations where CE ``c`` triggers, ``lift_c = support_c − (share of negatives where it triggers)``;
   candidates are the CEs with ``support_c >= min_support``, ordered by lift, then support.
2. Search rules of the form ``all of {R}`` or ``all of {R} and 1 of {G}`` (R, G disjoint subsets of the
   ``max_candidates`` best candidates; R may be empty when G is not) in order of increasing size
   ``|R| + |G|``, and return the *smallest* one whose Youden's J (TPR on examples − FPR on negatives)
   is within ``tol`` of the best J any rule of at most ``max_size`` CEs reaches; ties at that size go to the
   higher J, then to better-ranked CEs.

The result's ``text`` is ordinary rule text (see :mod:`.rules`), ready for a person to edit.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Iterable, Sequence

import numpy as np

from interp.results import Result

from .rules import parse_rule

__all__ = ["RuleProposal", "propose_rule"]


@dataclass
class RuleProposal(Result):
    """A proposed rule with its fit on the examples and the CE ranking it came from."""

    name: str
    description: str
    text: str
    tpr: float
    fpr: float
    youden_j: float
    ranking: list[dict]  #: per CE: support, negative rate, lift, candidate

    def rule(self, known_ces: Iterable[str] | None = None):
        return parse_rule(self.text, known_ces, name=self.name, description=self.description)

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.ranking)

    def figure(self):
        import plotly.express as px
        df = self.to_frame()
        return px.bar(df, x="ce", y=["support", "negative_rate"], barmode="group",
                      title=f"Proposed: {self.text} (J = {self.youden_j:.2f})")


def _text(req: Sequence[str], grp: Sequence[str]) -> str:
    parts = []
    if req:
        parts.append("all of {" + ", ".join(req) + "}")
    if grp:
        parts.append("1 of {" + ", ".join(grp) + "}")
    return " and ".join(parts)


def propose_rule(examples: Sequence[set[str]], negatives: Sequence[set[str]], ces: Sequence[str],
                 description: str = "", name: str = "proposed", min_support: float = 0.5, max_candidates: int = 6,
                 max_size: int = 4, tol: float = 0.0) -> RuleProposal:
    """Propose a rule from the CEs fired on ``examples`` (scenario conversations) and ``negatives``.

    ``examples`` / ``negatives``: per conversation, the set of CEs whose trigger fired (e.g.
    ``detector.fired(probs)``); ``ces``: the CE library.
    """
    if not examples or not negatives:
        raise ValueError("propose_rule needs example and negative conversations")
    if not 0 < min_support <= 1:
        raise ValueError(f"min_support must be in (0, 1], got {min_support}")
    ces = list(ces)
    P = np.array([[c in s for c in ces] for s in examples], dtype=bool)
    N = np.array([[c in s for c in ces] for s in negatives], dtype=bool)
    support, neg_rate = P.mean(0), N.mean(0)
    lift = support - neg_rate
    order = sorted(range(len(ces)), key=lambda i: (-lift[i], -support[i], i))
    cand = [i for i in order if support[i] >= min_support][:max_candidates]
    ranking = [{"ce": ces[i], "support": float(support[i]), "negative_rate": float(neg_rate[i]),
                "lift": float(lift[i]), "candidate": i in cand} for i in order]
    if not cand:
        raise ValueError(f"no CE fires on at least {min_support:.0%} of the examples; the library cannot describe "
                         "this scenario (add CEs or lower min_support)")
    rank = {i: r for r, i in enumerate(cand)}
    found = []  # (size, -J, rank key, req, grp, tpr, fpr)
    for size in range(1, min(max_size, len(cand)) + 1):
        for members in combinations(cand, size):
            for n_req in range(size, -1, -1):
                for req in combinations(members, n_req):
                    grp = [m for m in members if m not in req]
                    if len(grp) == 1 and req:  # "1 of {x}" == "all of {x}": counted with req
                        continue
                    hit_p = P[:, list(req)].all(1) & (P[:, grp].any(1) if grp else True)
                    hit_n = N[:, list(req)].all(1) & (N[:, grp].any(1) if grp else True)
                    tpr, fpr = float(hit_p.mean()), float(hit_n.mean())
                    found.append((size, tpr - fpr, tuple(sorted(rank[m] for m in members)), req, grp, tpr, fpr))
    best_j = max(f[1] for f in found)
    ok = [f for f in found if f[1] >= best_j - tol]
    size, j, _, req, grp, tpr, fpr = min(ok, key=lambda f: (f[0], -f[1], f[2]))
    text = _text([ces[i] for i in sorted(req, key=rank.get)], [ces[i] for i in sorted(grp, key=rank.get)])
    return RuleProposal(name, description, text, tpr, fpr, float(j), ranking)
