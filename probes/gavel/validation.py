"""GAVEL on a real model: CE detectors from template texts, three misuse scenarios, held-out evaluation
against the monolithic classifier and keywords, and the compositional test (a rule written afterwards
from existing CEs, never used in training or calibration).

Two protocols share one held-out test set (:func:`library_test_set`: templates 6-7, seen by nothing else;
a conversation's label for a rule is whether its CEs satisfy it; negatives holding some of the rule's CEs
are "hard", the others "random"):

- ``protocol="v1"`` (first run): detectors trained on prefilled single-exchange texts of one CE (templates
  0-5; every window of a text labelled with its CE, including its neutral sentence and the chat-template
  tokens); θ/patience calibrated on dialogues from the same templates.
- ``protocol="v2"`` (default): detectors trained on two-turn conversations written like the scenarios, with
  0-2 CEs each, from templates 0-5 plus extra templates (``library.EXTRA_TEMPLATES`` 0-4); windows are
  labelled from the sentences they cover (:func:`window_labels`: a CE is 1 when at least half the window's
  tokens lie in its sentences, 0 when none do, left out of the loss otherwise); θ/patience calibrated on
  dialogues from the validation templates (extra 5-7) that the detector never saw, so calibration meets
  the same template shift as the test. The layer range and detector size were chosen on a validation set
  from those templates (``benchmarks/gavel_smollm2.py``), never on the test set.
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
from .features import FeatureSpec, _pieces, conversation_features

__all__ = ["LibraryValidation", "run_library_validation", "library_test_set", "token_ce_labels", "window_labels",
           "labelled_windows", "per_ce_auc", "calibration_dialogues", "MonitorValidation", "run_monitor_validation"]


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


def library_test_set(seed: int = 0, n_train: int = 20, n_cal: int = 12, n_test: int = 15
                     ) -> list[lib.LabelledConversation]:
    """The held-out test conversations (every rule: ``n_test`` positives and hard negatives; ``n_test`` random
    negatives) exactly as the first protocol drew them: its training and calibration draws are replayed
    (no features) so the test set stays the same whatever the detectors are trained on."""
    rng = random.Random(f"gavel-library/{seed}")
    ces = list(lib.CE_TEMPLATES)
    rules = lib.library_rules(include_unseen=True)
    for ce in ces + [None]:
        lib.ce_conversations(rng, ce, n_train, "train")
    for r in rules:
        if r.name in lib.SCENARIOS:
            lib.scenario_conversations(rng, r, n_cal, 0, "train")
    for ce in ces:
        lib.ce_conversations(rng, ce, max(2, n_cal // 2), "train")
    lib.ce_conversations(rng, None, n_cal, "train")
    test = []
    for r in rules:
        test += lib.scenario_conversations(rng, r, n_test, n_test, "test", others=ces)
    test += lib.neutral_conversations(rng, n_test, "test", ces)
    return test


def token_ce_labels(model, conv: lib.LabelledConversation, ces: list[str], roles=("assistant",)
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids ``[T]``, scored mask ``[T]`` (tokens of ``roles``) and CE labels ``[T, C]`` (1 where the token
    overlaps a sentence of that CE, from ``conv.spans``), tokenised as :func:`encode_conversation` does."""
    tok = model.tokenizer
    ids, keep, labels = [], [], []
    for m, (role, text) in enumerate(_pieces(model, conv.messages)):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        content = conv.messages[m]["content"]
        off0 = text.find(content) if content else -1
        lab = torch.zeros(len(enc["input_ids"]), len(ces))
        for mi, a, b, ce in conv.spans:
            if mi != m or off0 < 0:
                continue
            for t, (s, e) in enumerate(enc["offset_mapping"]):
                if s < off0 + b and e > off0 + a and e > s:
                    lab[t, ces.index(ce)] = 1
        ids += enc["input_ids"]
        keep += [role in roles] * len(enc["input_ids"])
        labels.append(lab)
    return torch.tensor(ids), torch.tensor(keep), torch.cat(labels)


def window_labels(token_labels: torch.Tensor, window: int = 5) -> torch.Tensor:
    """``[T, C]`` token labels -> ``[W, C]`` window targets (windows as :func:`make_windows` cuts them): 1 when at
    least half the window's tokens carry the CE, 0 when none does, NaN (left out of the loss) otherwise."""
    frac = make_windows(token_labels, window).float().mean(1)
    out = torch.full_like(frac, float("nan"))
    out[frac >= 0.5] = 1.0
    out[frac == 0] = 0.0
    return out


def labelled_windows(feats, token_labels, window: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Full windows ``[N, window, d]`` and their targets ``[N, C]`` of several scored spans."""
    xw, yw = [], []
    for f, lab in zip(feats, token_labels):
        w = make_windows(f, window)
        if w.shape[1] == window:
            xw.append(w)
            yw.append(window_labels(lab[: len(f)], window))  # features may be truncated (max_length)
    return torch.cat(xw), torch.cat(yw)


def _v1_data(rng, ces, seen, n_train, n_cal):
    """Training conversations, per-conversation window targets and calibration dialogues of protocol v1."""
    train_convs, train_y = [], []
    for c, ce in enumerate(ces + [None]):
        for conv in lib.ce_conversations(rng, ce, n_train, "train"):
            train_convs.append(conv)
            y = torch.zeros(len(ces))
            if ce is not None:
                y[c] = 1
            train_y.append(y)
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
    return train_convs, train_y, cal_convs, cal_labels


def calibration_dialogues(seed: int, n_cal: int, split: str = "val") -> tuple[list, list[CalibrationLabels]]:
    """Protocol v2 calibration dialogues (validation templates): ``n_cal`` scenario positives per seen rule
    (the rule's label-level ground truth; an outside CE shown on purpose is neutral), ``n_cal // 2`` dialogues
    per CE showing that CE alone, and ``n_cal`` CE-free dialogues."""
    rng = random.Random(f"gavel-library-cal/{seed}")
    ces = list(lib.CE_TEMPLATES)
    convs, labels = [], []
    for r in lib.library_rules():
        lb = labels_for_rule(r)
        for lc in lib.scenario_conversations(rng, r, n_cal, 0, split, others=ces):
            convs.append(lc.messages)
            labels.append(CalibrationLabels(lb.required, lb.any_of, lb.supporting | (set(lc.ces) - set(r.ces))))
    for ce in ces:
        for _ in range(max(2, n_cal // 2)):
            convs.append(lib._conversation(rng, [ce], split))
            labels.append(CalibrationLabels(required={ce}))
    for _ in range(n_cal):
        convs.append(lib._conversation(rng, [], split))
        labels.append(CalibrationLabels())
    return convs, labels


def run_library_validation(model, spec: FeatureSpec, n_train: int = 300, n_cal: int = 20, n_test: int = 15,
                           n_mono: int = 16, seed: int = 0, detector_config: DetectorConfig | None = None,
                           batch_size: int = 16, model_name: str = "", tie: str = "largest", protocol: str = "v2",
                           features=None, return_detector: bool = False, baselines: bool = True,
                           n_mono_cal: int | None = None, detector=None):
    """Train, calibrate and evaluate GAVEL and the baselines; returns a :class:`LibraryValidation`
    (and the calibrated detector with ``return_detector=True``).

    ``n_train``: v2: training conversations (v1: texts per CE); ``n_cal``: calibration dialogues per
    scenario; ``n_test``: test conversations per kind (15 and the v1 sizes give the fixed test set);
    ``features``: optional ``convs -> list[[T, d]]`` replacing the extraction (e.g. a cache);
    ``baselines=False`` skips the monolithic classifier (keywords cost nothing); ``n_mono_cal``: its
    calibration conversations per class (default ``n_cal``); ``detector``: a calibrated detector from an
    earlier run with the same arguments (training and calibration are skipped).
    """
    if protocol not in ("v1", "v2"):
        raise ValueError(f"protocol must be 'v1' or 'v2', got {protocol!r}")
    ces = list(lib.CE_TEMPLATES)
    rules = lib.library_rules(include_unseen=True)
    seen = [r for r in rules if r.name in lib.SCENARIOS]
    unseen = [r for r in rules if r.name not in lib.SCENARIOS]
    cfg = detector_config or DetectorConfig(seed=seed)

    def feats(convs):
        if features is not None:
            return features(convs)
        return conversation_features(model, convs, spec, batch_size=batch_size)

    # 1. CE detectors from ready texts (prefilled assistant turns)
    if protocol == "v1":
        rng = random.Random(f"gavel-library/{seed}")
        train_convs, train_y, cal_convs, cal_labels = _v1_data(rng, ces, seen, n_train, n_cal)

        def windows():
            xw, yw = [], []
            for f, y in zip(feats(train_convs), train_y):
                w = make_windows(f, cfg.window)
                if w.shape[1] == cfg.window:
                    xw.append(w)
                    yw.append(y.expand(len(w), -1))
            return torch.cat(xw), torch.cat(yw)
        test = library_test_set(seed, n_train, n_cal, n_test)
    else:
        train = lib.training_conversations(random.Random(f"gavel-library-train/{seed}"), n_train, "more")
        train_convs = [t.messages for t in train]

        def windows():
            labs = [token_ce_labels(model, t, ces) for t in train]
            return labelled_windows(feats([(i, k) for i, k, _ in labs]), [lab[k] for _, k, lab in labs], cfg.window)
        cal_convs, cal_labels = calibration_dialogues(seed, n_cal)
        test = library_test_set(seed, n_test=n_test)
    n_windows = None
    if detector is None:
        x, yt = windows()
        n_windows = int(len(x))
        det, hist = train_detector(x, yt, ces, cfg, spec=spec)
        # 2. θ / patience by Youden's J on the calibration dialogues (label-level ground truth)
        cal_j = calibrate(det, det.sequence_probs(feats(cal_convs)), cal_labels, patience=(1, 2), tie=tie).youden_j
        best_epoch = hist.best_epoch
    else:
        det, cal_j, best_epoch = detector, [float("nan")] * len(ces), None
    # 3. held-out test conversations
    te_f = feats([t.messages for t in test])
    te_probs = det.sequence_probs(te_f)
    texts = [_assistant_text(t.messages) for t in test]
    kw = KeywordMatcher(lib.KEYWORDS)
    # 4. monolithic baselines: per rule, rule-positive vs negative conversations
    mrng = random.Random(f"gavel-library-mono/{seed}")
    msplit, csplit = ("train", "train") if protocol == "v1" else ("more", "val")
    n_mc = n_cal if n_mono_cal is None else n_mono_cal
    neg_pool = lib.neutral_conversations(mrng, n_mono, msplit, ces) + lib.neutral_conversations(mrng, n_mc, csplit, ces)
    neg_f = feats([t.messages for t in neg_pool]) if baselines else None
    rows = []
    for r in progress(rules, desc="gavel rules"):
        y = np.array([r.evaluate(t.ces) for t in test])
        group = ["positive" if yy else ("hard" if set(t.ces) & set(r.condition_ces) else "random")
                 for yy, t in zip(y, test)]
        dec, sc = gavel_rule_outputs(det, r, te_probs)
        tag = "unseen" if r in unseen else "seen"
        rows.append({"rule": r.name, "scenario": tag, "method": "gavel", **rule_metrics(y, dec, sc, group)})
        pos = lib.scenario_conversations(mrng, r, n_mono, 0, msplit) + lib.scenario_conversations(mrng, r, n_mc, 0, csplit)
        if baselines:
            pf = feats([t.messages for t in pos])
            mono = train_monolithic(pf[:n_mono], neg_f[:n_mono], cfg, pf[n_mono:], neg_f[n_mono:])
            dec, sc = mono.evaluate(te_f)
            rows.append({"rule": r.name, "scenario": tag, "method": "monolithic", **rule_metrics(y, dec, sc, group)})
        dec, sc = kw.evaluate(r, texts)
        rows.append({"rule": r.name, "scenario": tag, "method": "keywords", **rule_metrics(y, dec, sc, group)})
    ce_auc = per_ce_auc(det, te_probs, test)
    res = LibraryValidation(rows, dict(zip(ces, det.thresholds.tolist())), dict(zip(ces, det.patience.tolist())),
                            {"protocol": protocol, "train_conversations": len(train_convs), "train_windows": n_windows,
                             "calibration": len(cal_convs), "test": len(test), "detector_best_epoch": best_epoch,
                             "calibration_j": dict(zip(ces, cal_j)), "ce_auc": ce_auc},
                            model_name, list(spec.layers))
    return (res, det) if return_detector else res


def per_ce_auc(det, probs, convs: list[lib.LabelledConversation]) -> dict[str, float]:
    """Per CE, the conversation-level AUC of ``s_c = max window probability`` for "the conversation shows c"."""
    from sklearn.metrics import roc_auc_score
    out = {}
    for c, ce in enumerate(det.ces):
        y = np.array([ce in t.ces for t in convs])
        s = np.array([float(p[:, c].max()) for p in probs])
        if y.any() and not y.all():
            out[ce] = float(roc_auc_score(y, s))
    return out


@dataclass
class MonitorValidation(Result):
    """Validation 3 on a real model: monitored generations of held-out conversations, one row each."""

    rows: list[dict]
    max_new_tokens: int

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows)

    def figure(self):
        import plotly.express as px
        df = self.to_frame()
        return px.strip(df, x="kind", y="stop_token", color="rule_fired",
                        title="GAVEL monitor: generated token at which generation stopped (NaN: not stopped)")

    def summary(self) -> dict:
        df = self.to_frame()
        pos, harm = df[df.kind == "positive"], df[df.kind != "positive"]
        mid = pos.stopped & (pos.stop_token > 0) & (pos.stop_token < self.max_new_tokens)
        return {"positives": int(len(pos)), "positives_stopped": int(pos.stopped.sum()),
                "positives_stopped_mid_generation": int(mid.sum()),
                "stop_tokens": [int(t) for t in pos.stop_token[pos.stopped]],
                "harmless": int(len(harm)), "harmless_fired": int(harm.fired.sum())}


def _prefill(conv: lib.LabelledConversation) -> tuple[list[dict], str]:
    """Prompt (all but the last assistant turn) and the last turn cut in the middle of its first CE sentence."""
    last = len(conv.messages) - 1
    spans = sorted(s for s in conv.spans if s[0] == last)
    content = conv.messages[last]["content"]
    if not spans:
        return conv.messages[:last], ""
    _, a, b, _ = spans[0]
    cut = content.rfind(" ", a, (a + b) // 2)
    return conv.messages[:last], content[: cut if cut > a else (a + b) // 2]


def run_monitor_validation(model, detector, n_positive: int = 3, max_new_tokens: int = 32, seed: int = 0,
                           harmless: str = "random", stop_at_eos: bool = True) -> MonitorValidation:
    """The monitor on held-out conversations (:func:`library_test_set`), every library rule with action ``block``.

    Positives (``n_positive`` per seen scenario): the conversation up to its last assistant turn, whose
    earlier assistant turn is scored from the prompt (``score_prompt="assistant"``), and the last turn
    prefilled up to the middle of its first CE sentence; the model continues it. Harmless: the test set's
    random negatives (``harmless="random"``; ``"all"`` adds the hard negatives), continued by the model from
    their last user turn without a prefill. Each row: which rule fired and at which generated token.
    ``stop_at_eos``: end the turn at the model's end-of-turn token (``False`` lets it run on into invented
    further turns, which the detectors never saw in training).
    """
    from .monitor import Monitor
    test = library_test_set(seed)
    from .rules import parse_rule
    rules = [parse_rule(text, list(lib.CE_TEMPLATES), name=name, action="block")
             for name, text in list(lib.SCENARIOS.items()) + [lib.UNSEEN_SCENARIO]]
    pos = []
    for name in lib.SCENARIOS:
        pos += [t for t in test if t.kind == "positive" and t.scenario == name][:n_positive]
    neg = [t for t in test if t.kind == "random" or (harmless == "all" and t.kind == "hard")]
    rows = []
    for t in progress(pos + neg, desc="gavel monitor"):
        mon = Monitor(model, detector, rules, score_prompt="assistant")
        if t.kind == "positive":
            prompt, prefill = _prefill(t)
        else:
            prompt, prefill = t.messages[:-1], None
        out = mon.generate(prompt, max_new_tokens=max_new_tokens, prefill=prefill, stop_at_eos=stop_at_eos)
        ev = out.events[0] if out.events else None
        rows.append({"kind": t.kind, "scenario": t.scenario, "ces": ",".join(t.ces), "fired": ev is not None,
                     "rule_fired": ev["rule"] if ev else "", "stopped": out.stopped,
                     "stop_token": ev["token"] if ev else float("nan"), "in_prompt": bool(ev and ev["in_prompt"]),
                     "prefill": prefill or "", "generated": out.generated_text,
                     "fired_ces": ",".join(ev["fired"]) if ev else ""})
    return MonitorValidation(rows, max_new_tokens)
