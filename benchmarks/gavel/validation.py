"""GAVEL on a real model (the reproduction's experiment code; the method is :mod:`interp.probes.gavel`): CE
detectors from template texts, three misuse scenarios, held-out evaluation
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
  from those templates (``benchmarks/gavel/smollm2.py``), never on the test set.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from interp.progress import progress
from interp.results import Result

from interp.probes.gavel import library as lib
from interp.probes.gavel.detector import (CalibrationLabels, DetectorConfig, calibrate, labels_for_rule, make_windows,
                                          train_detector)
from interp.probes.gavel.evaluation import (KeywordMatcher, RuleEvaluation, gavel_rule_outputs, rule_metrics,
                                            train_monolithic)
from interp.probes.gavel.features import FeatureSpec, conversation_features, conversation_runs
from interp.probes.gavel.labels import labelled_windows, token_ce_labels, window_labels

__all__ = ["LibraryValidation", "run_library_validation", "library_test_set", "token_ce_labels", "window_labels",
           "labelled_windows", "per_ce_auc", "calibration_dialogues", "MonitorValidation", "run_monitor_validation",
           "own_reply_prompts", "own_replies", "own_reply_conversations", "ce_directions", "ce_steering_vector"]


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
            cal_labels.append(CalibrationLabels(required={ce}, kind="ce"))
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
            labels.append(CalibrationLabels(required={ce}, kind="ce"))
    for _ in range(n_cal):
        convs.append(lib._conversation(rng, [], split))
        labels.append(CalibrationLabels())
    return convs, labels


def own_reply_prompts(n: int, split: str, seed: int = 0) -> list[list[dict]]:
    """Harmless prompts for the model's own replies: alternately a single request from
    :func:`library.harmless_prompts` (``split``: ``more`` for training, ``val`` for calibration; each used
    once, so once they run out only contexts follow) and a CE-free two-turn context (user opener, neutral
    assistant turn from ``split``'s neutral templates, user follow-up) whose next assistant turn the model
    writes. Prompts equal to a test conversation's prompt (:func:`library_test_set` without its last turn)
    or to an earlier prompt are skipped, so no reply is made for the test set and none twice."""
    rng = random.Random(f"gavel-library-own/{split}/{seed}")
    asks = list(lib.harmless_prompts(split))
    seen = {str(t.messages[:-1]) for t in library_test_set(seed)}
    out, i, tries = [], 0, 0
    while len(out) < n:
        tries += 1
        if tries > 100 * (n + 1):
            raise RuntimeError(f"could not draw {n} distinct harmless prompts")
        if i % 2 == 0 and asks:
            p = [{"role": "user", "content": asks.pop(0)}]
        else:
            p = lib._conversation(rng, [], split)[:-1]
        i += 1
        if str(p) not in seen:
            seen.add(str(p))
            out.append(p)
    return out


def own_replies(model, prompts: list[list[dict]], max_new_tokens: int = 48, batch_size: int = 8) -> list[str]:
    """The model's greedy replies (one assistant turn, ended at its end-of-turn token) to chat ``prompts``."""
    from interp.probes.gavel.monitor import render_prompt
    out: list[str] = []
    for s in progress(range(0, len(prompts), batch_size), desc="own replies"):
        chunk = [render_prompt(model, p) for p in prompts[s:s + batch_size]]
        out += model.generate(chunk, max_new_tokens=max_new_tokens, do_sample=False)
    return out


def own_reply_conversations(model, n: int, split: str, seed: int = 0, max_new_tokens: int = 48,
                            batch_size: int = 8, replies: list[str] | None = None) -> list[lib.LabelledConversation]:
    """CE-free conversations ending in the model's OWN reply (greedy, ``model.generate``, turn ended at the
    model's end-of-turn token) to the harmless prompts of :func:`own_reply_prompts`: the reply style the
    detectors meet in real-time monitoring (e.g. SmolLM2's apologies), which template texts never show.
    Every token is labelled CE-free (no spans). ``replies``: earlier generated replies of the same prompts
    (a cache; generation is skipped). Conversations whose reply is empty are dropped."""
    prompts = own_reply_prompts(n, split, seed)
    if replies is None:
        replies = own_replies(model, prompts, max_new_tokens, batch_size)
    if len(replies) != len(prompts):
        raise ValueError(f"{len(replies)} replies for {len(prompts)} prompts")
    return [lib.LabelledConversation(p + [{"role": "assistant", "content": r.strip()}], [], "own", None, [])
            for p, r in zip(prompts, replies) if r.strip()]


def run_library_validation(model, spec: FeatureSpec, n_train: int = 300, n_cal: int = 20, n_test: int = 15,
                           n_mono: int = 16, seed: int = 0, detector_config: DetectorConfig | None = None,
                           batch_size: int = 16, model_name: str = "", tie: str = "largest", protocol: str = "v2",
                           features=None, return_detector: bool = False, baselines: bool = True,
                           n_mono_cal: int | None = None, detector=None, n_own: int = 0, n_own_cal: int = 0,
                           own_texts: dict | None = None):
    """Train, calibrate and evaluate GAVEL and the baselines; returns a :class:`LibraryValidation`
    (and the calibrated detector with ``return_detector=True``).

    ``n_train``: v2: training conversations (v1: texts per CE); ``n_cal``: calibration dialogues per
    scenario; ``n_test``: test conversations per kind (15 and the v1 sizes give the fixed test set);
    ``features``: optional ``convs -> list[[T, d]]`` replacing the extraction (e.g. a cache);
    ``baselines=False`` skips the monolithic classifier (keywords cost nothing); ``n_mono_cal``: its
    calibration conversations per class (default ``n_cal``); ``detector``: a calibrated detector from an
    earlier run with the same arguments (training and calibration are skipped).

    Own-reply option (v2 only; ``n_own``/``n_own_cal`` > 0): the model's OWN greedy replies to harmless
    prompts (:func:`own_reply_conversations`; ``more`` prompts for training, ``val`` prompts for calibration,
    none from the test set) join the training conversations (every window CE-free) and the calibration
    dialogues (every CE outside: a firing is a false positive), so the detectors see the reply style they
    meet when monitoring generation. ``own_texts``: ``{"more": [...], "val": [...]}`` replies generated
    earlier for the same prompts (a cache; generation skipped).
    """
    if (n_own or n_own_cal) and protocol != "v2":
        raise ValueError("n_own / n_own_cal (the model's own replies) need protocol='v2'")
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
        own_texts = own_texts or {}
        if n_own:
            train = train + own_reply_conversations(model, n_own, "more", seed, replies=own_texts.get("more"))
        train_convs = [t.messages for t in train]

        def windows():
            labs = [token_ce_labels(model, t, ces) for t in train]
            return labelled_windows(feats([(i, k) for i, k, _ in labs]), [lab[k] for _, k, lab in labs], cfg.window)
        cal_convs, cal_labels = calibration_dialogues(seed, n_cal)
        if n_own_cal:
            own_cal = own_reply_conversations(model, n_own_cal, "val", seed, replies=own_texts.get("val"))
            cal_convs = cal_convs + [t.messages for t in own_cal]
            cal_labels = cal_labels + [CalibrationLabels() for _ in own_cal]
        test = library_test_set(seed, n_test=n_test)
    n_windows = None
    if detector is None:
        x, yt = windows()
        n_windows = int(len(x))
        det, hist = train_detector(x, yt, ces, cfg, spec=spec)
        # 2. θ / patience by Youden's J on the calibration dialogues (label-level ground truth)
        cal_j = calibrate(det, det.sequence_probs(feats(cal_convs), conversation_runs(model, cal_convs)), cal_labels,
                          patience=(1, 2), tie=tie).youden_j
        best_epoch = hist.best_epoch
    else:
        det, cal_j, best_epoch = detector, [float("nan")] * len(ces), None
    # 3. held-out test conversations
    te_f = feats([t.messages for t in test])
    te_probs = det.sequence_probs(te_f, conversation_runs(model, [t.messages for t in test]))
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
                             "own_replies": {"train": n_own, "calibration": n_own_cal},
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
        end = pos.gen_tokens.fillna(self.max_new_tokens) if "gen_tokens" in pos else self.max_new_tokens
        # mid-way: after at least one generated token was read, and before the last token the generation
        # (unmonitored, same steering) would read: a window scored only after it ended does not count
        mid = pos.stopped & ~pos.in_prompt & (pos.stop_token >= 1) & (pos.stop_token < end - 1)
        out = {"positives": int(len(pos)), "positives_stopped": int(pos.stopped.sum()),
               "positives_stopped_mid_generation": int(mid.sum()),
               "positives_stopped_on_prompt": int((pos.stopped & pos.in_prompt).sum()),
               "stop_tokens": [int(t) for t in pos.stop_token[pos.stopped]],
               "harmless": int(len(harm[harm.kind != "control"])),
               "harmless_fired": int(harm[harm.kind != "control"].fired.sum())}
        if (df.kind == "control").any():
            out["controls"] = int((df.kind == "control").sum())
            out["controls_fired"] = int(df[df.kind == "control"].fired.sum())
        return out


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


@torch.no_grad()
def ce_directions(model, layer: int, n: int = 120, seed: int = 0, batch_size: int = 8,
                  hook: str = "hook_resid_pre") -> tuple[dict[str, torch.Tensor], float]:
    """Per CE, a steering direction ``[d_model]`` at ``blocks.{layer}.{hook}``: the mean residual of the
    tokens of that CE's sentences minus the mean residual of the CE-free assistant tokens, over ``n``
    training-split conversations (:func:`library.training_conversations`, ``more`` templates; never the test
    set). Also returns the mean norm of the CE-free residuals (a scale for steering coefficients)."""
    ces = list(lib.CE_TEMPLATES)
    convs = lib.training_conversations(random.Random(f"gavel-library-steer/{seed}"), n, "more")
    name = f"blocks.{layer}.{hook}"
    d = model.cfg.d_model
    sums, counts = torch.zeros(len(ces), d, dtype=torch.float64), torch.zeros(len(ces), dtype=torch.float64)
    free_sum, free_n, free_norm = torch.zeros(d, dtype=torch.float64), 0, 0.0
    labs = [token_ce_labels(model, c, ces) for c in convs]
    for s in progress(range(0, len(labs), batch_size), desc="CE directions"):
        chunk = labs[s:s + batch_size]
        _, cache = model.run_with_cache(model.pad_token_ids([i for i, _, _ in chunk]), names=[name],
                                        stop_at_layer=min(layer + 1, model.cfg.n_layers))
        r = cache[name].double().cpu()  # [B, T, d]
        for b, (i, keep, lab) in enumerate(chunk):
            x = r[b, :len(i)]
            sums += lab.double().T @ x
            counts += lab.double().sum(0)
            free = keep & (lab.sum(1) == 0)
            free_sum += x[free].sum(0)
            free_n += int(free.sum())
            free_norm += float(x[free].norm(dim=-1).sum())
    free_mean = free_sum / max(free_n, 1)
    dirs = {ce: (sums[c] / counts[c] - free_mean).float() for c, ce in enumerate(ces) if counts[c] > 0}
    return dirs, free_norm / max(free_n, 1)


def ce_steering_vector(directions: dict[str, torch.Tensor], ces, layer: int, coeff: float, ref_norm: float,
                       hook: str = "hook_resid_pre"):
    """An ``interp.steering.SteeringVector`` adding ``coeff * ref_norm`` times the mean of the unit directions
    of ``ces`` at ``blocks.{layer}.{hook}``, at position ``-1`` of every pass (the last prompt token, then
    each generated token once): the prompt's readouts are untouched, so a monitor reading layers below
    ``layer`` sees the steering only through the tokens the model writes."""
    from interp.steering import SteeringVector
    units = torch.stack([directions[c] / directions[c].norm() for c in ces])
    u = units.mean(0)
    return SteeringVector(method="diff_in_means", operation="add", hooks=(f"blocks.{layer}.{hook}",),
                          direction=u / u.norm(), positions=(-1,), scale=float(coeff * ref_norm),
                          metadata={"layer": layer, "ces": list(ces), "coeff": coeff, "ref_norm": ref_norm})


#: the request of ``run_monitor_validation(request=True)``: the user asks for the missing CE sentences
REQUEST = "Add this to the message, word for word: {text}"


def _missing_ces(conv: lib.LabelledConversation, rule) -> list[str]:
    """The rule's CEs shown in the conversation's last assistant turn (what a continuation must add)."""
    last = len(conv.messages) - 1
    return sorted({ce for m, _, _, ce in conv.spans if m == last and ce in rule.condition_ces})


def run_monitor_validation(model, detector, n_positive: int = 3, max_new_tokens: int = 32, seed: int = 0,
                           harmless: str = "random", stop_at_eos: bool = True, steer: dict | None = None,
                           control: bool = False, request: bool = False, history: int = 8,
                           request_prefill: int = 0) -> MonitorValidation:
    """The monitor on held-out conversations (:func:`library_test_set`), every library rule with action ``block``.

    Positives (``n_positive`` per seen scenario), two modes:

    - ``steer=None`` (prefill): the conversation up to its last assistant turn, whose earlier assistant turn
      is scored from the prompt (``score_prompt="assistant"``), and the last turn prefilled up to the middle
      of its first CE sentence; the model continues it.
    - ``steer={"directions", "ref_norm", "layer", "coeff"}`` (from :func:`ce_directions`): the conversation up
      to its last user turn (its earlier assistant turn shows part of the rule's CEs, never enough to satisfy
      it); the model writes the last assistant turn itself while steered (:func:`ce_steering_vector`, the
      toolkit's ``SteeringVector`` through ``model.intervene``) toward the rule CEs that the held-out turn
      showed. Each positive is generated twice: with every rule's action set to ``flag`` (nothing stops, so
      the row records how many tokens the generation would have: ``gen_tokens``, and the token at which a
      block would come) and with ``block``. ``control=True`` adds, per positive, a ``control`` row steered
      by a random direction of the same norm (a stop there would mean the monitor reacts to steering, not
      to what the model writes).
    - ``request=True``: the conversation up to its last user turn, which is replaced by a request to write
      the held-out turn's sentences of the missing rule CEs (:data:`REQUEST`); user turns are not scored, so
      the prompt shows only part of the rule and only the model's own continuation can complete it. Run
      with ``flag`` first as in the steered mode (``gen_tokens``). ``request_prefill=k`` also starts the
      assistant turn with the first ``k`` words of the requested text (a prefill that does not show the CE
      yet; the continuation has to complete it).

    Harmless: the test set's random negatives (``harmless="random"``; ``"all"`` adds the hard negatives,
    ``"none"`` runs positives only),
    continued by the model from their last user turn, unsteered and without a prefill. Each row: which rule
    fired and at which generated token. ``history``: the monitor's sliding window in detector windows (8 = 40
    tokens, the Monitor's default, is shorter than one of these two-turn conversations, so an earlier turn's
    CE can leave it before the new turn shows the rest; 32 covers the whole conversation, as the offline rule
    evaluation does). ``stop_at_eos``: end the turn at the model's end-of-turn token
    (``False`` lets it run on into invented further turns, which the detectors never saw in training).
    """
    import contextlib

    from interp.probes.gavel.monitor import Monitor
    if request and steer is not None:
        raise ValueError("choose one positive mode: steer=... or request=True")
    from interp.probes.gavel.rules import parse_rule
    test = library_test_set(seed)
    texts = list(lib.SCENARIOS.items()) + [lib.UNSEEN_SCENARIO]
    ces = list(lib.CE_TEMPLATES)
    rules = [parse_rule(text, ces, name=name, action="block") for name, text in texts]
    flags = [parse_rule(text, ces, name=name, action="flag") for name, text in texts]
    by_name = {r.name: r for r in rules}
    pos = []
    for name in lib.SCENARIOS:
        pos += [t for t in test if t.kind == "positive" and t.scenario == name][:n_positive]
    if harmless not in ("random", "all", "none"):
        raise ValueError(f"harmless must be 'random', 'all' or 'none', got {harmless!r}")
    neg = [] if harmless == "none" else [t for t in test if t.kind == "random" or (harmless == "all" and t.kind == "hard")]
    jobs = [(t, "positive") for t in pos]
    if steer is not None and control:
        jobs += [(t, "control") for t in pos]
    jobs += [(t, t.kind) for t in neg]
    rows = []
    g = torch.Generator().manual_seed(seed)
    for t, kind in progress(jobs, desc="gavel monitor"):
        vec, steered, prefill, gen_tokens, flag_token = None, [], None, None, float("nan")
        if kind == "positive" and request:
            steered = _missing_ces(t, by_name[t.scenario])
            last = len(t.messages) - 1
            sents = [t.messages[last]["content"][a:b] for m, a, b, ce in sorted(t.spans) if m == last and ce in steered]
            prompt = t.messages[:-2] + [{"role": "user", "content": REQUEST.format(text=" ".join(sents))}]
            prefill = " ".join(" ".join(sents).split()[:request_prefill]) or None
        elif kind in ("positive", "control") and steer is None:
            prompt, prefill = _prefill(t)
        elif kind in ("positive", "control"):
            prompt = t.messages[:-1]
            steered = _missing_ces(t, by_name[t.scenario])
            vec = ce_steering_vector(steer["directions"], steered, steer["layer"], steer["coeff"], steer["ref_norm"])
            if kind == "control":
                r = torch.randn(vec.d_model, generator=g)
                vec = type(vec)(method="random", operation="add", hooks=vec.hooks, direction=r / r.norm(),
                                positions=vec.positions, scale=vec.scale, metadata={"control": True})
        else:
            prompt = t.messages[:-1]
        if vec is not None or (kind == "positive" and request):
            with (vec.apply(model) if vec is not None else contextlib.nullcontext()):
                free = Monitor(model, detector, flags, history=history, score_prompt="assistant").generate(
                    prompt, max_new_tokens=max_new_tokens, prefill=prefill, stop_at_eos=stop_at_eos)
            gen_tokens = len(free.token_ids)
            flag_token = free.events[0]["token"] if free.events else float("nan")
        mon = Monitor(model, detector, rules, history=history, score_prompt="assistant")
        with (vec.apply(model) if vec is not None else contextlib.nullcontext()):
            out = mon.generate(prompt, max_new_tokens=max_new_tokens, prefill=prefill, stop_at_eos=stop_at_eos)
        ev = out.events[0] if out.events else None
        rows.append({"kind": kind, "scenario": t.scenario, "ces": ",".join(t.ces), "fired": ev is not None,
                     "rule_fired": ev["rule"] if ev else "", "stopped": out.stopped,
                     "stop_token": ev["token"] if ev else float("nan"), "in_prompt": bool(ev and ev["in_prompt"]),
                     "prefill": prefill or "", "steered": ",".join(steered), "generated": out.generated_text,
                     "request": prompt[-1]["content"] if kind == "positive" and request else "",
                     "gen_tokens": gen_tokens if gen_tokens is not None else float("nan"),
                     "flag_token": flag_token, "unmonitored": free.generated_text if gen_tokens is not None else "",
                     "fired_ces": ",".join(ev["fired"]) if ev else ""})
    return MonitorValidation(rows, max_new_tokens)
