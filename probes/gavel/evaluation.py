"""Rule-level evaluation of GAVEL and its baselines in one harness.

- GAVEL: calibrated CE triggers -> ``Rule.evaluate`` (decision) and ``Rule.score`` (continuous, for AUC).
- Monolithic activation classifier (the paper's baseline): one window GRU trained directly on windows of
  rule-positive conversations (label 1) against windows of negative conversations (label 0); a
  conversation's score is its maximum window probability, its decision uses a threshold chosen by Youden's
  J on calibration conversations. (Choice: the paper only says "activation classifier"; this reuses the
  CE detector's architecture and windows so the two differ only in what they are trained to recognise.)
- Keyword matcher: a CE fires when one of its keywords occurs as a whole word in the scored text; the rule
  is evaluated on those CEs (score = decision).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from interp.results import Result

from .detector import (CalibrationLabels, CEDetector, DetectorConfig, calibrate, make_windows, train_detector)
from .rules import Rule

__all__ = ["KeywordMatcher", "MonolithicClassifier", "train_monolithic", "rule_metrics", "RuleEvaluation",
           "gavel_rule_outputs", "train_text_detector"]


class KeywordMatcher:
    """Flags a CE when any of its keywords occurs (case-insensitive, whole words) in the text."""

    def __init__(self, keywords: Mapping[str, Sequence[str]]):
        if not keywords:
            raise ValueError("KeywordMatcher needs at least one CE with keywords")
        self.keywords = {c: list(ws) for c, ws in keywords.items()}
        self._re = {c: re.compile(r"\b(?:" + "|".join(re.escape(w) for w in ws) + r")\b", re.IGNORECASE)
                    for c, ws in self.keywords.items() if ws}

    def fired(self, text: str) -> set[str]:
        return {c for c, rx in self._re.items() if rx.search(text)}

    def evaluate(self, rule: Rule, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(decisions, scores)`` for each text (scores equal decisions: keywords have no confidence)."""
        dec = np.array([rule.evaluate(self.fired(t) & set(rule.condition_ces)) for t in texts], dtype=bool)
        return dec, dec.astype(float)


class MonolithicClassifier:
    """A single window GRU for one rule (the paper's monolithic activation-classifier baseline)."""

    def __init__(self, detector: CEDetector):
        self.detector = detector

    def scores(self, feats: Sequence[torch.Tensor]) -> np.ndarray:
        return np.array([float(p.max()) for p in self.detector.sequence_probs(feats)])

    def evaluate(self, feats: Sequence[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
        probs = self.detector.sequence_probs(feats)
        dec = np.array([bool(self.detector.fired(p)) for p in probs])
        return dec, np.array([float(p.max()) for p in probs])


def train_monolithic(pos: Sequence[torch.Tensor], neg: Sequence[torch.Tensor], config: DetectorConfig | None = None,
                     cal_pos: Sequence[torch.Tensor] = (), cal_neg: Sequence[torch.Tensor] = ()) -> MonolithicClassifier:
    """Train on windows of rule-positive (1) vs negative (0) conversations; calibrate θ on ``cal_*`` by
    Youden's J (if given; otherwise θ = 0.5)."""
    config = config or DetectorConfig()
    if not pos or not neg:
        raise ValueError("train_monolithic needs positive and negative conversations")
    ws = [make_windows(f, config.window) for f in list(pos) + list(neg)]
    ids = [i for i, w in enumerate(ws) if w.shape[1] == config.window]
    x = torch.cat([ws[i] for i in ids])
    y = torch.cat([torch.full((len(ws[i]), 1), float(i < len(pos))) for i in ids])
    groups = torch.cat([torch.full((len(ws[i]),), i) for i in ids])  # conversation ids: the split keeps them whole
    det, _ = train_detector(x, y, ["rule"], config, groups=groups)
    if cal_pos and cal_neg:
        probs = det.sequence_probs(list(cal_pos) + list(cal_neg))
        labels = [CalibrationLabels(required={"rule"})] * len(cal_pos) + [CalibrationLabels()] * len(cal_neg)
        calibrate(det, probs, labels, protocol="all")  # one "CE" (the rule): its negatives are what θ is for
    return MonolithicClassifier(det)


def train_text_detector(feats: Sequence[torch.Tensor], labels: Sequence[Sequence[str]], ces: Sequence[str],
                        config: DetectorConfig | None = None, spec=None,
                        cal_feats: Sequence[torch.Tensor] = (), cal_labels: Sequence[CalibrationLabels] = ()
                        ) -> CEDetector:
    """A CE detector from ready texts labelled per text (the paper's ERI labelling: every scored token of a
    text showing CE ``c`` is a ``c`` token), calibrated on ``cal_*`` by Youden's J when given.

    ``feats[i]``: ``[T_i, d]`` readouts of text ``i`` (e.g. :func:`~.features.conversation_features`);
    ``labels[i]``: the CEs text ``i`` shows (empty: CE-free); every full window of text ``i`` gets target 1 for
    those CEs and 0 for the others. Texts shorter than one window are skipped. ``spec`` is stored in the
    detector. Patience is calibrated over (1, 2) windows.
    """
    config = config or DetectorConfig()
    ces = list(ces)
    if len(feats) != len(labels):
        raise ValueError(f"{len(feats)} feature tensors for {len(labels)} label sets")
    xw, yw, gw = [], [], []
    for i, (f, lab) in enumerate(zip(feats, labels)):
        unknown = set(lab) - set(ces)
        if unknown:
            raise ValueError(f"labels {sorted(unknown)} are not among the CEs {ces}")
        w = make_windows(f, config.window)
        if w.shape[1] == config.window:
            y = torch.tensor([float(c in lab) for c in ces])
            xw.append(w)
            yw.append(y.expand(len(w), -1))
            gw.append(torch.full((len(w),), i))
    if not xw:
        raise ValueError(f"no text has a full window of {config.window} tokens")
    det, _ = train_detector(torch.cat(xw), torch.cat(yw), ces, config, spec=spec, groups=torch.cat(gw))
    if len(cal_feats):
        calibrate(det, det.sequence_probs(list(cal_feats)), list(cal_labels), patience=(1, 2))
    return det


#: Detector of :func:`template_detector` (small: the template library is a few hundred short texts).
TEMPLATE_DETECTOR = DetectorConfig(hidden=64, rnn_layers=2, lr=1e-3, max_epochs=20)


def template_detector(model, spec=None, n_per_ce: int = 12, seed: int = 0, config: DetectorConfig | None = None,
                      cache: bool = True) -> CEDetector:
    """The built-in CE detector of ``model``: trained on the template library (:mod:`.library`, 10 CEs), with
    no data from the caller.

    ``n_per_ce`` training texts per CE plus as many CE-free ones (every window of a text labelled with its CE,
    :func:`train_text_detector`), calibrated (Youden's J, patience 1-2) on ``max(2, n_per_ce // 3)`` more per CE
    and CE-free, all from the training templates (templates 6-7 stay held out for testing). ``spec=None``: the
    paper's layer range mapped to the model (:meth:`~.features.FeatureSpec.official`); ``config``:
    :data:`TEMPLATE_DETECTOR` with ``seed``.

    Cached (``cache=True``): trained once per (model weights, spec, sizes, seed, GAVEL code version) and stored
    as a resumable stage (:class:`interp.stages.Stages` ``"gavel/template-detector"`` under the interp cache
    folder); later calls, in any process, load it. A model whose weights cannot be fingerprinted is not cached.
    """
    import random
    from dataclasses import asdict, replace

    from . import library as lib
    from .features import conversation_features, default_spec

    if isinstance(n_per_ce, bool) or not isinstance(n_per_ce, int) or n_per_ce < 1:
        raise ValueError(f"n_per_ce must be a positive integer, got {n_per_ce!r}")
    spec = default_spec(model, spec)
    spec.check(model)
    cfg = config or replace(TEMPLATE_DETECTOR, seed=seed)

    def train() -> CEDetector:
        rng = random.Random(f"gavel-audit/{seed}")
        ces = list(lib.CE_TEMPLATES)
        convs, labels = [], []
        for ce in ces + [None]:
            for conv in lib.ce_conversations(rng, ce, n_per_ce, "train"):
                convs.append(conv)
                labels.append([ce] if ce is not None else [])
        cal_c, cal_l = [], []
        for ce in ces + [None]:
            for conv in lib.ce_conversations(rng, ce, max(2, n_per_ce // 3), "train"):
                cal_c.append(conv)
                cal_l.append(CalibrationLabels(required={ce} if ce is not None else set()))
        return train_text_detector(conversation_features(model, convs, spec), labels, ces, cfg, spec=spec,
                                   cal_feats=conversation_features(model, cal_c, spec), cal_labels=cal_l)

    from interp.store.harvest import weights_fingerprint
    weights = weights_fingerprint(model) if cache else None
    if weights is None:
        return train()
    from interp.stages import Stages
    key = {"schema": 1, "weights": weights, "layers": list(spec.layers), "group_kv": spec.group_kv,
           "n_per_ce": n_per_ce, "seed": seed, "config": asdict(cfg)}
    st = Stages("gavel/template-detector", key, code=["interp.probes.gavel"])
    return CEDetector.load(st.path("detector", lambda d: train().save(d / "detector", overwrite=True)) / "detector")


def gavel_rule_outputs(detector: CEDetector, rule: Rule, probs: Sequence[torch.Tensor]
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``(decisions, scores)`` of ``rule`` on conversations given by their window probabilities."""
    rule.check_ces(detector.ces)
    out = [detector.evaluate(rule, p) for p in probs]
    return np.array([d for d, _ in out], dtype=bool), np.array([s for _, s in out])


def rule_metrics(y: np.ndarray, decisions: np.ndarray, scores: np.ndarray, group: Sequence[str] | None = None
                 ) -> dict[str, float]:
    """AUC (of ``scores``), balanced accuracy, TPR and FPR (of ``decisions``); FPR per negative ``group``."""
    from sklearn.metrics import roc_auc_score
    y, d = np.asarray(y, dtype=bool), np.asarray(decisions, dtype=bool)
    if y.all() or not y.any():
        raise ValueError("rule_metrics needs positive and negative conversations")
    tpr, fpr = float(d[y].mean()), float(d[~y].mean())
    out = {"auc": float(roc_auc_score(y, scores)), "balanced_accuracy": (tpr + 1 - fpr) / 2, "tpr": tpr, "fpr": fpr}
    if group is not None:
        g = np.asarray(group)
        for name in sorted(set(g[~y])):
            m = (~y) & (g == name)
            out[f"fpr_{name}"] = float(d[m].mean())
    return out


@dataclass
class RuleEvaluation(Result):
    """Per rule and method: AUC, balanced accuracy, TPR, FPR (overall and per negative kind)."""

    rows: list[dict]

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows)

    def figure(self):
        import plotly.express as px
        df = self.to_frame()
        cols = [c for c in df.columns if c.startswith("fpr") or c in ("auc", "balanced_accuracy")]
        long = df.melt(id_vars=["rule", "method"], value_vars=cols, var_name="metric")
        return px.bar(long, x="metric", y="value", color="method", barmode="group", facet_col="rule",
                      title="GAVEL vs baselines per rule")
