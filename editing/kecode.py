"""KECode metrics (TCPE paper, digest §5): how an edit of one error cluster changes a model's failures.

Every evaluated sample has an *outcome*: ``None`` when the model's output is correct, else the id of the error
cluster its failure belongs to. Given the outcomes before and after an edit of cluster ``target``
(all values in percent, as the paper reports them):

* ``GN``  = fraction of the target cluster's samples that are now correct (↑);
* ``CD``  = size of the target cluster after / size before (↓). The digest calls it the "relative change in
  target-cluster size"; the paper's numbers (GN 32.86, CD 46.43 for LTC4) fit *remaining relative size*
  (cluster samples fixed + moved elsewhere + stayed ≤ 100), not a signed change; UNCERTAIN, documented choice;
* ``LoC`` = among samples failing in a *non-target* cluster before, the fraction whose outcome is unchanged (↑);
* ``DT``  = fraction of previously correct samples that now fail (↓);
* ``RE``  = accuracy after / accuracy before (↑);
* ``Score = (GN − CD) + (LoC − DT) + RE`` (e.g. (32.86 − 46.43) + (82.17 − 6.86) + 109.71 = 171.45).

:func:`cluster_errors` groups failures as KECode does: error messages embedded (by any embedder) and
clustered greedily at cosine similarity ≥ ``threshold`` (0.9 in the paper) to the cluster's first member.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from interp.results import Result

Outcome = Hashable | None


def _check(before: Sequence[Outcome], after: Sequence[Outcome]) -> None:
    if len(before) != len(after):
        raise ValueError(f"before has {len(before)} outcomes, after has {len(after)}; they must align")
    if not len(before):
        raise ValueError("no outcomes given")


def _pct(num: int, den: int) -> float:
    return 100.0 * num / den if den else float("nan")


def gn(before: Sequence[Outcome], after: Sequence[Outcome], target: Hashable) -> float:
    """% of the target cluster's samples now correct."""
    _check(before, after)
    idx = [i for i, b in enumerate(before) if b == target]
    return _pct(sum(after[i] is None for i in idx), len(idx))


def cd(before: Sequence[Outcome], after: Sequence[Outcome], target: Hashable) -> float:
    """Target-cluster size after as % of its size before."""
    _check(before, after)
    return _pct(sum(a == target for a in after), sum(b == target for b in before))


def loc(before: Sequence[Outcome], after: Sequence[Outcome], target: Hashable) -> float:
    """% of non-target failures whose outcome is unchanged."""
    _check(before, after)
    idx = [i for i, b in enumerate(before) if b is not None and b != target]
    return _pct(sum(after[i] == before[i] for i in idx), len(idx))


def dt(before: Sequence[Outcome], after: Sequence[Outcome]) -> float:
    """% of previously correct samples that now fail."""
    _check(before, after)
    idx = [i for i, b in enumerate(before) if b is None]
    return _pct(sum(after[i] is not None for i in idx), len(idx))


def re(before: Sequence[Outcome], after: Sequence[Outcome]) -> float:
    """Accuracy after / accuracy before, in %."""
    _check(before, after)
    return _pct(sum(a is None for a in after), sum(b is None for b in before))


@dataclass
class KECodeScores(Result):
    """GN, CD, LoC, DT, RE and Score of one edit (percent)."""

    kind = "kecode_scores"
    GN: float
    CD: float
    LoC: float
    DT: float
    RE: float

    @property
    def score(self) -> float:
        return (self.GN - self.CD) + (self.LoC - self.DT) + self.RE

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{"GN": self.GN, "CD": self.CD, "LoC": self.LoC, "DT": self.DT, "RE": self.RE,
                              "Score": self.score}])

    def figure(self):
        import plotly.graph_objects as go
        f = self.to_frame().iloc[0]
        return go.Figure(go.Bar(x=list(f.index), y=list(f.values)))


def kecode_scores(before: Sequence[Outcome], after: Sequence[Outcome], target: Hashable) -> KECodeScores:
    """All KECode metrics of one edit of cluster ``target``."""
    return KECodeScores(GN=gn(before, after, target), CD=cd(before, after, target), LoC=loc(before, after, target),
                        DT=dt(before, after), RE=re(before, after))


def cluster_errors(embeddings: torch.Tensor, threshold: float = 0.9) -> list[int]:
    """Greedy leader clustering of error-message embeddings ``[n, d]``: each message joins the first cluster
    whose leader has cosine similarity ≥ ``threshold``, else starts a new one. Returns cluster ids."""
    if embeddings.dim() != 2:
        raise ValueError(f"embeddings must be [n, d], got {tuple(embeddings.shape)}")
    if not -1 <= threshold <= 1:
        raise ValueError(f"threshold must be a cosine in [-1, 1], got {threshold}")
    e = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    leaders: list[int] = []
    out: list[int] = []
    for i in range(len(e)):
        if leaders:
            sims = e[leaders] @ e[i]
            j = int(sims.argmax())
            if float(sims[j]) >= threshold:
                out.append(j)
                continue
        leaders.append(i)
        out.append(len(leaders) - 1)
    return out


__all__ = ["gn", "cd", "loc", "dt", "re", "KECodeScores", "kecode_scores", "cluster_errors"]
