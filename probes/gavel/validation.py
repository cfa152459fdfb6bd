"""GAVEL on a real model: CE detectors from template texts, three misuse scenarios, held-out evaluation
against the monolithic classifier and keywords, and the compositional test (a rule written afterwards
from existing CEs, never used in training or calibration).

Protocol (sizes are arguments): detectors are trained on prefilled single-exchange conversations of each
CE (train templates) and CE-free ones; θ and patience are calibrated by Youden's J on calibration
dialogues (scenario positives with the rule's label-level ground truth, single-CE and neutral dialogues);
the test conversations use held-out templates and are seen by nothing else. A test conversation's label
for a rule is whether its CEs satisfy the rule; negatives containing some of the rule's CEs are "hard",
the others "random".
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from interp.progress import progress
from interp.results import Result

from . import library as lib
from .detector import CalibrationLabels, DetectorConfig, calibrate, labels_for_rule, make_windows, train_detector
from .evaluation import KeywordMatcher, RuleEvaluation, gavel_rule_outputs, rule_metrics, train_monolithic
from .features import FeatureSpec, conversation_features

__all__ = ["LibraryValidation", "run_library_validation"]


@dataclass
class LibraryValidation(Result):
    """Per rule and method metrics on held-out conversations, plus calibration and sizes."""

    rows: list[dict]
    thresholds: dict
    patience: dict
    sizes: dict
    model: str
    layers: list[int]

    def to_frame(self):
        return RuleEvaluation(self.rows).to_frame()

    def figure(self):
        return RuleEvaluation(self.rows).figure()


def _assistant_text(msgs) -> str:
    return " ".join(m["content"] for m in msgs if m["role"] == "assistant")


def run_library_validation(model, spec: FeatureSpec, n_train: int = 30, n_cal: int = 10, n_test: int = 25,
                           n_mono: int = 30, seed: int = 0, detector_config: DetectorConfig | None = None,
                           batch_size: int = 16, model_name: str = "", tie: str = "largest") -> LibraryValidation:
    ces = list(lib.CE_TEMPLATES)
    rules = lib.library_rules(include_unseen=True)
    seen = [r for r in rules if r.name in lib.SCENARIOS]
    unseen = [r for r in rules if r.name not in lib.SCENARIOS]
    rng = random.Random(f"gavel-library/{seed}")
    cfg = detector_config or DetectorConfig(seed=seed)

    def feats(convs):
        return conversation_features(model, convs, spec, batch_size=batch_size)

    # 1. CE detectors from ready texts (prefilled assistant turns)
    train_convs, train_y = [], []
    for c, ce in enumerate(ces + [None]):
        for conv in lib.ce_conversations(rng, ce, n_train, "train"):
            train_convs.append(conv)
            y = torch.zeros(len(ces))
            if ce is not None:
                y[c] = 1
            train_y.append(y)
    tr_f = feats(train_convs)
    xw, yw = [], []
    for f, y in zip(tr_f, train_y):
        w = make_windows(f, cfg.window)
        if w.shape[1] == cfg.window:
            xw.append(w)
            yw.append(y.expand(len(w), -1))
    det, hist = train_detector(torch.cat(xw), torch.cat(yw), ces, cfg, spec=spec)
    # 2. calibration dialogues with label-level ground truth
    cal_convs, cal_labels = [], []
    for r in seen:
        for lc in lib.scenario_conversations(rng, r, n_cal, 0, "train"):
            cal_convs.append(lc.messages)
            lb = labels_for_rule(r)
            extra = set(lc.ces) - set(r.ces)  # an outside CE shown on purpose: neutral, not an FP
            cal_labels.append(CalibrationLabels(lb.required, lb.any_of, lb.supporting | extra))
    for ce in ces:
        for conv in lib.ce_conversations(rng, ce, max(2, n_cal // 2), "train"):
            cal_convs.append(conv)
            cal_labels.append(CalibrationLabels(required={ce}))
    for conv in lib.ce_conversations(rng, None, n_cal, "train"):
        cal_convs.append(conv)
        cal_labels.append(CalibrationLabels())
    cal = calibrate(det, det.sequence_probs(feats(cal_convs)), cal_labels, patience=(1, 2), tie=tie)
    # 3. held-out test conversations
    test = []
    for r in rules:
        test += lib.scenario_conversations(rng, r, n_test, n_test, "test", others=ces)
    test += lib.neutral_conversations(rng, n_test, "test", ces)
    te_f = feats([t.messages for t in test])
    te_probs = det.sequence_probs(te_f)
    texts = [_assistant_text(t.messages) for t in test]
    kw = KeywordMatcher(lib.KEYWORDS)
    # 4. monolithic baselines: per rule, rule-positive vs negative conversations (train templates)
    neg_pool = lib.neutral_conversations(rng, n_mono + n_cal, "train", ces)
    neg_f = feats([t.messages for t in neg_pool])
    rows = []
    for r in progress(rules, desc="gavel rules"):
        y = np.array([r.evaluate(t.ces) for t in test])
        group = ["positive" if yy else ("hard" if set(t.ces) & set(r.condition_ces) else "random")
                 for yy, t in zip(y, test)]
        dec, sc = gavel_rule_outputs(det, r, te_probs)
        tag = "unseen" if r in unseen else "seen"
        rows.append({"rule": r.name, "scenario": tag, "method": "gavel", **rule_metrics(y, dec, sc, group)})
        pos = [t.messages for t in lib.scenario_conversations(rng, r, n_mono + n_cal, 0, "train")]
        pf = feats(pos)
        mono = train_monolithic(pf[:n_mono], neg_f[:n_mono], cfg, pf[n_mono:], neg_f[n_mono:])
        dec, sc = mono.evaluate(te_f)
        rows.append({"rule": r.name, "scenario": tag, "method": "monolithic", **rule_metrics(y, dec, sc, group)})
        dec, sc = kw.evaluate(r, texts)
        rows.append({"rule": r.name, "scenario": tag, "method": "keywords", **rule_metrics(y, dec, sc, group)})
    return LibraryValidation(rows, dict(zip(ces, det.thresholds.tolist())), dict(zip(ces, det.patience.tolist())),
                             {"train_conversations": len(train_convs), "train_windows": int(sum(len(x) for x in xw)),
                              "calibration": len(cal_convs), "test": len(test), "detector_best_epoch": hist.best_epoch,
                              "calibration_j": dict(zip(ces, cal.youden_j))},
                             model_name, list(spec.layers))
