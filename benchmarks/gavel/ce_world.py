"""The digest's CPU-scale "CE world" (the reproduction's experiment code; the method is
:mod:`interp.probes.gavel`): 4 cognitive elements as token families, a 2-layer model trained on them by
next-token prediction (zoo entry ``gavel-ce-world``, declared in :mod:`.zoo`), and the full GAVEL pipeline on top.

World. 40 filler words ``w0..w39`` and 4 CE families ``a0..a4``, ``b0..b4``, ``c0..c4``, ``d0..d4`` (60
words; with ``<bos> <eos> <pad> <unk>`` a 64-token vocabulary). A CE *occurrence* is a phrase of 3
consecutive family words in cyclic order (``a3 a4 a0``); a *decoy* is one family word alone among filler.
Decoys make the world need context: a keyword matcher on family words fires on decoys, whereas the
attention readout at a phrase's last word sees the two words before it. The LM learns phrases because
their continuation is predictable (sanity check: next-word accuracy inside phrases).

Window labels (choice): a window is positive for CE ``c`` when it contains the *last* word of a ``c``
phrase (under causal attention that is the first position whose readout can see the whole phrase),
negative when it contains no word of any ``c`` phrase, and is left out (training and window AUC)
otherwise.

Validation (digest): rule ``all of {A} and 1 of {B, C}`` on 200 positive (A and B or C), 200 hard-negative
(A alone, or B and/or C without A) and 200 random-negative conversations (no A/B/C phrase); D phrases
appear as a distractor anywhere. Pass: per-CE window AUC >= 0.95; rule AUC >= 0.95 with FPR <= 0.05 on hard
negatives; the monolithic GRU (rule-positive vs random-negative) has clearly higher hard-negative FPR.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from interp.probes.gavel.detector import CalibrationLabels, DetectorConfig, calibrate, make_windows, train_detector
from interp.probes.gavel.evaluation import (KeywordMatcher, RuleEvaluation, gavel_rule_outputs, rule_metrics,
                                            train_monolithic)
from interp.probes.gavel.features import FeatureSpec, conversation_features
from interp.probes.gavel.rules import parse_rule
from interp.results import Result

from .zoo import CE_WORLD, ZOO_NAME, CEWorldConfig  # noqa: F401  (CE_WORLD, CEWorldConfig: their old place)

FAMILIES = {"A": "a", "B": "b", "C": "c", "D": "d"}
FILLER = [f"w{i}" for i in range(40)]
PHRASE = 3
RULE = "all of {A} and 1 of {B, C}"

__all__ = ["CEWorldConfig", "make_tokenizer", "make_conversation", "build_ce_world_model", "CE_WORLD",
           "CEWorldResult", "run_ce_world", "ce_world_detector", "run_ce_world_monitor", "MONITOR_PROMPT", "RULE",
           "ZOO_NAME"]


def words() -> list[str]:
    return FILLER + [f"{p}{i}" for p in FAMILIES.values() for i in range(5)]


def make_tokenizer():
    """Word-level fast tokenizer of the CE world (64 tokens; ``<bos>`` is not prepended: callers add it)."""
    from interp.training import word_level_tokenizer

    return word_level_tokenizer(["<bos>", "<eos>", "<pad>", "<unk>"] + words(), add_bos=False, cleanup=True)


def make_conversation(rng: random.Random, ces: Sequence[str], length: int = 40, n_decoys: int = 3,
                      max_phrases: int = 2) -> tuple[list[str], list[str | None], list[bool]]:
    """Words, per-word CE of the phrase it belongs to (or None), and per-word "last word of a phrase".

    Each CE in ``ces`` gets 1..``max_phrases`` phrases at random non-overlapping places; ``n_decoys``
    single family words (any family) are scattered elsewhere, never next to a word of their own family.
    """
    seq: list[str] = [rng.choice(FILLER) for _ in range(length)]
    owner: list[str | None] = [None] * length
    last = [False] * length
    free = set(range(length))
    for ce in ces:
        for _ in range(rng.randint(1, max_phrases)):
            starts = [s for s in range(1, length - PHRASE) if all(i in free for i in range(s - 1, s + PHRASE + 1))]
            if not starts:
                break
            s = rng.choice(starts)
            k = rng.randrange(5)
            for j in range(PHRASE):
                seq[s + j] = f"{FAMILIES[ce]}{(k + j) % 5}"
                owner[s + j] = ce
                free.discard(s + j)
            last[s + PHRASE - 1] = True
            free.discard(s - 1)
            free.discard(s + PHRASE)
    for _ in range(n_decoys):
        cands = [i for i in free if i - 1 not in range(length) or owner[i - 1] is None]
        cands = [i for i in cands if (i - 1 in free or i == 0) and (i + 1 in free or i == length - 1)]
        if not cands:
            break
        i = rng.choice(sorted(cands))
        seq[i] = f"{rng.choice(list(FAMILIES.values()))}{rng.randrange(5)}"
        free -= {i - 1, i, i + 1}
    return seq, owner, last


def _lm_batch(rng: random.Random, tok, n: int, length: int) -> torch.Tensor:
    rows = []
    for _ in range(n):
        ces = [c for c in FAMILIES if rng.random() < 0.4]
        seq, _, _ = make_conversation(rng, ces, length)
        rows.append([tok.bos_token_id] + tok.convert_tokens_to_ids(seq))
    return torch.tensor(rows)


def build_ce_world_model(out: Path, params: Mapping[str, Any]) -> dict:
    """Zoo builder: train the CE-world LM; raise if it does not learn phrase continuations."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from interp.training import LMTrainConfig, train_lm

    cfg = CEWorldConfig(**params)
    torch.manual_seed(cfg.seed)
    tok = make_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=cfg.d_model, intermediate_size=2 * cfg.d_model,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=512,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(config)
    rng = random.Random(f"gavel-ce-world/{cfg.seed}")
    batches = (_lm_batch(rng, tok, cfg.batch_size, cfg.length) for _ in range(cfg.steps))
    # the one-cycle schedule and AdamW's default betas this entry was always trained with (its cache key and the
    # committed gavel records rest on them)
    losses = train_lm(model, batches, LMTrainConfig(steps=cfg.steps, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.999),
                                                    schedule="one_cycle", pct_start=0.1),
                      desc="gavel-ce-world: training")
    # sanity: inside a phrase the next family word is predictable
    test_rng = random.Random("gavel-ce-world/check")
    hits = total = 0
    with torch.no_grad():
        for _ in range(8):
            rows, owners = [], []
            for _ in range(32):
                seq, owner, _ = make_conversation(test_rng, list(FAMILIES), cfg.length)
                rows.append([tok.bos_token_id] + tok.convert_tokens_to_ids(seq))
                owners.append([None] + owner)
            ids = torch.tensor(rows)
            pred = model(input_ids=ids).logits.argmax(-1)
            for r, owner in enumerate(owners):
                for i in range(2, len(owner)):
                    if owner[i] is not None and owner[i - 1] == owner[i] and owner[i - 2] == owner[i]:
                        hits += int(pred[r, i - 1] == ids[r, i])
                        total += 1
    acc = hits / max(total, 1)
    if acc < cfg.min_phrase_accuracy:
        raise RuntimeError(f"gavel-ce-world LM did not learn phrase continuations: accuracy {acc:.3f} "
                           f"(need >= {cfg.min_phrase_accuracy})")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return {"phrase_accuracy": acc, "final_loss": float(np.mean(losses[-50:])),
            "n_params": sum(p.numel() for p in model.parameters())}


# ------------------------------------------------------------------------------------------ experiment
@dataclass
class CEWorldResult(Result):
    """Measured numbers of the CE-world validation and whether each pass criterion holds."""

    window_auc: dict  #: CE -> window AUC on test conversations
    rules: list[dict]  #: RuleEvaluation rows (GAVEL, monolithic, keywords)
    thresholds: dict  #: CE -> calibrated θ
    patience: dict  #: CE -> calibrated patience
    passed: dict  #: criterion -> bool
    sizes: dict

    def to_frame(self):
        return RuleEvaluation(self.rules).to_frame()

    def figure(self):
        return RuleEvaluation(self.rules).figure()


def _ids(tok, seq: list[str]) -> torch.Tensor:
    return torch.tensor([tok.bos_token_id] + tok.convert_tokens_to_ids(seq))


def _window_labels(owner: list[str | None], last: list[bool], ces: list[str], window: int) -> torch.Tensor:
    """``[W, C]`` with 1 / 0 / -1 (left out), for the windows :func:`make_windows` makes on this span."""
    T = len(owner)
    idx = make_windows(torch.arange(T)[:, None].float(), window)[..., 0].long()  # [W, w]
    lab = torch.zeros(len(idx), len(ces))
    for w, pos in enumerate(idx.tolist()):
        for c, ce in enumerate(ces):
            if any(last[p] and owner[p] == ce for p in pos):
                lab[w, c] = 1
            elif any(owner[p] == ce for p in pos):
                lab[w, c] = -1
    return lab


def _features_of(model, spec, seqs):
    tok = model.tokenizer
    inputs = [(_ids(tok, s), torch.tensor([False] + [True] * len(s))) for s in seqs]  # <bos> not scored
    return conversation_features(model, inputs, spec, batch_size=64)


def _train_and_calibrate(model, convs, ces, cfg, spec, n_train, n_cal):
    # CE data given as ready texts: single-CE conversations plus CE-free ones (decoys only)
    train_sets = [[c] for c in ces for _ in range(n_train)] + [[] for _ in range(n_train)]
    tr, tr_f = convs(train_sets)
    xw, yw = [], []
    for (seq, owner, last), f in zip(tr, tr_f):
        w = make_windows(f, cfg.window)
        lab = _window_labels(owner, last, ces, cfg.window)
        keep = (lab >= 0).all(1)
        xw.append(w[keep])
        yw.append(lab[keep])
    det, hist = train_detector(torch.cat(xw), torch.cat(yw), ces, cfg, spec=spec)
    # calibration dialogues (label-level ground truth: the CE it shows is required, all others outside)
    cal_sets = [[c] for c in ces for _ in range(n_cal)] + [[] for _ in range(n_cal)] + \
        [[c, d] for c in ces for d in ces if c < d for _ in range(max(1, n_cal // 6))]
    cal, cal_f = convs(cal_sets)
    cal_probs = det.sequence_probs(cal_f)
    calibrate(det, cal_probs, [CalibrationLabels(required=set(s)) for s in cal_sets], patience=(1, 2))
    return det, hist, int(sum(len(x) for x in xw)), len(cal_sets)


def ce_world_detector(model, n_train: int = 150, n_cal: int = 50, seed: int = 0,
                      detector_config: DetectorConfig | None = None):
    """Train and calibrate the CE-world detector (the first half of :func:`run_ce_world`)."""
    cfg = detector_config or DetectorConfig(hidden=64, rnn_layers=2, lr=3e-3, max_epochs=25, seed=seed)
    spec = FeatureSpec.range(0, model.cfg.n_layers)
    rng = random.Random(f"gavel-ce-world/detector/{seed}")

    def convs(sets):
        out = [make_conversation(rng, s, 40) for s in sets]
        return out, _features_of(model, spec, [s for s, _, _ in out])
    return _train_and_calibrate(model, convs, list(FAMILIES), cfg, spec, n_train, n_cal)[0]


def run_ce_world(model=None, n_train: int = 150, n_cal: int = 50, n_test: int = 200, seed: int = 0,
                 detector_config: DetectorConfig | None = None) -> CEWorldResult:
    """Run the digest's CE-world validation end to end (builds the zoo model if needed)."""
    import interp
    from sklearn.metrics import roc_auc_score

    if model is None:
        model = interp.load(f"zoo:{ZOO_NAME}", backend="torch")
    tok = model.tokenizer
    ces = list(FAMILIES)
    cfg = detector_config or DetectorConfig(hidden=64, rnn_layers=2, lr=3e-3, max_epochs=25, seed=seed)
    spec = FeatureSpec.range(0, model.cfg.n_layers)
    rng = random.Random(f"gavel-ce-world/experiment/{seed}")
    L = 40

    def convs(sets: list[list[str]]):  # noqa: E306
        out = [make_conversation(rng, s, L) for s in sets]
        inputs = [(_ids(tok, s), torch.tensor([False] + [True] * len(s))) for s, _, _ in out]  # <bos> not scored
        return out, conversation_features(model, inputs, spec, batch_size=64)

    det, hist, n_windows, n_cal_dialogues = _train_and_calibrate(model, convs, ces, cfg, spec, n_train, n_cal)
    rule = parse_rule(RULE, ces, name="R")
    # test set
    pos_sets = [["A", rng.choice(["B", "C", "BC"])] for _ in range(n_test)]
    pos_sets = [[a] + list(x) for a, x in pos_sets]
    hard_sets = [rng.choice([["A"], ["B"], ["C"], ["B", "C"]]) for _ in range(n_test)]
    rand_sets: list[list[str]] = [[] for _ in range(n_test)]
    all_sets = pos_sets + hard_sets + rand_sets
    all_sets = [s + (["D"] if rng.random() < 0.3 else []) for s in all_sets]
    group = ["positive"] * n_test + ["hard"] * n_test + ["random"] * n_test
    y = np.array([g == "positive" for g in group])
    te, te_f = convs(all_sets)
    te_probs = det.sequence_probs(te_f)
    # per-CE window AUC
    P = torch.cat(te_probs)
    lab = torch.cat([_window_labels(o, last, ces, cfg.window) for _, o, last in te])
    window_auc = {}
    for c, ce in enumerate(ces):
        keep = lab[:, c] >= 0
        window_auc[ce] = float(roc_auc_score(lab[keep, c].numpy(), P[keep, c].numpy()))
    rows = []
    dec, sc = gavel_rule_outputs(det, rule, te_probs)
    rows.append({"rule": "R", "method": "gavel", **rule_metrics(y, dec, sc, group)})
    # monolithic: rule-positive vs random-negative conversations, its own calibration set
    mono_train_sets = [["A"] + list(rng.choice(["B", "C", "BC"])) for _ in range(2 * n_train)]
    mono_train_sets = [s + (["D"] if rng.random() < 0.3 else []) for s in mono_train_sets]
    neg_train_sets = [(["D"] if rng.random() < 0.3 else []) for _ in range(2 * n_train)]
    _, mp_f = convs(mono_train_sets)
    _, mn_f = convs(neg_train_sets)
    _, cp_f = convs([["A", "B"] for _ in range(n_cal)] + [["A", "C"] for _ in range(n_cal)])
    _, cn_f = convs([[] for _ in range(2 * n_cal)])
    mono = train_monolithic(mp_f, mn_f, cfg, cp_f, cn_f)
    dec, sc = mono.evaluate(te_f)
    rows.append({"rule": "R", "method": "monolithic", **rule_metrics(y, dec, sc, group)})
    kw = KeywordMatcher({c: [f"{FAMILIES[c]}{i}" for i in range(5)] for c in ces})
    dec, sc = kw.evaluate(rule, [" ".join(s) for s, _, _ in te])
    rows.append({"rule": "R", "method": "keywords", **rule_metrics(y, dec, sc, group)})
    g, m = rows[0], rows[1]
    passed = {"window_auc>=0.95": all(v >= 0.95 for v in window_auc.values()),
              "rule_auc>=0.95": g["auc"] >= 0.95, "hard_fpr<=0.05": g["fpr_hard"] <= 0.05,
              "monolithic_hard_fpr_clearly_higher": m["fpr_hard"] >= g["fpr_hard"] + 0.10}
    return CEWorldResult(window_auc, rows, dict(zip(ces, det.thresholds.tolist())),
                         dict(zip(ces, det.patience.tolist())), passed,
                         {"train_windows": n_windows, "calibration": n_cal_dialogues,
                          "test": len(all_sets), "detector_best_epoch": hist.best_epoch})


# ------------------------------------------------------------------------------------------ monitor
#: the steered start of a B phrase: pass k of ``generate`` emits token k + 1 (``b0`` then ``b1``); the model must
#: complete the phrase itself (``b2``)
MONITOR_PROMPT = "<bos> w1 w7 w3 a2 a3 a4 w9 w12 w5 w30 w2 w8 w17 w4"


def run_ce_world_monitor(model, detector, max_new_tokens: int = 20, n_harmless: int = 40, seed: int = 1,
                         push: float = 100.0) -> dict:
    """Real-time enforcement on the CE world: rule :data:`RULE` with action ``block`` inside ``model.generate``.

    Positive: :data:`MONITOR_PROMPT` (an A phrase among filler words); the model is steered (its last-layer
    residual pushed along the unembedding columns of ``b0`` and ``b1`` in the first two passes) to start a B
    phrase and has to complete it itself; the monitor should block mid-generation. Harmless: ``n_harmless``
    random-negative conversations (decoys only), each continued for 10 tokens; none should fire.
    (Without steering the model's own phrase completion right after the prompt puts the phrase's last word at
    the start of the first generated window, where this detector does not see it.)

    Returns ``{"completed_phrase", "blocked", "stop_token", "blocked_mid", "fired_ces", "harmless",
    "harmless_fired", "words"}`` (``blocked_mid``: blocked after at least one generated token and before
    ``max_new_tokens``).
    """
    from interp.probes.gavel import Monitor

    tok = model.tokenizer
    rule = parse_rule(RULE, list(FAMILIES), name="R", action="block")
    W_U = model.weight("W_U")  # [d_model, vocab]
    plan = {1: tok.convert_tokens_to_ids("b0"), 2: tok.convert_tokens_to_ids("b1")}

    def steer(t, ctx):
        if ctx.pass_index in plan:
            t = t.clone()
            t[:, -1] += push * W_U[:, plan[ctx.pass_index]] / W_U[:, plan[ctx.pass_index]].norm()
        return t
    with model.intervene({f"blocks.{model.cfg.n_layers - 1}.hook_resid_post": steer}):
        out = Monitor(model, detector, [rule], score_prompt=True).generate(MONITOR_PROMPT, max_new_tokens=max_new_tokens,
                                                                           stop_at_eos=False)
    words = tok.convert_ids_to_tokens(out.token_ids)
    ev = out.events[0] if out.events else None
    n = len(out.token_ids)
    rng = random.Random(seed)
    fired = 0
    for _ in range(n_harmless):
        seq, _, _ = make_conversation(rng, [], 40)  # random negative: decoys only
        o = Monitor(model, detector, [rule], score_prompt=True).generate("<bos> " + " ".join(seq), max_new_tokens=10,
                                                                        stop_at_eos=False)
        fired += bool(o.events)
    blocked = bool(out.stopped and out.action == "block")
    return {"completed_phrase": words[1:4] == ["b0", "b1", "b2"], "blocked": blocked,
            "stop_token": n if blocked else None, "blocked_mid": blocked and 1 <= n < max_new_tokens,
            "fired_ces": sorted(ev["fired"]) if ev else [], "harmless": n_harmless, "harmless_fired": fired,
            "words": words}
