"""GAVEL on SmolLM2-135M (docs/gavel.md, Validations 2 and 3): the template CE library, three misuse scenarios
and one rule written afterwards, GAVEL against the monolithic classifier and keywords on 135 held-out
conversations, the model's own replies as CE-free data, and the monitor on the model's own continuations.

Not a preset of ``interp reproduce gavel``: a cold run costs about an hour on 2 CPU cores (own replies
≈ 12 min, readouts of ≈ 1,300 conversations ≈ 20-40 min, detector and baselines ≈ 5-10 min, monitor ≈ 2 min).
Every expensive step is a stage (:class:`interp.stages.Stages`, keyed by the config and the code), so a rerun
resumes:

- :func:`run_smollm2` — the reported run (protocol v2 with own replies; the slow tests
  ``tests/probes/test_gavel_smollm2.py`` call it);
- the script's modes — the choices and diagnoses of the docs, from readouts stored per conversation set
  (stage ``readouts-<set>``, layers 6..14, fp16)::

    python -m interp.benchmarks.gavel.smollm2 --out DIR --extract test,val,v2train,v2cal,mono,v1
    python -m interp.benchmarks.gavel.smollm2 --out DIR --diagnose           # v1 vs v2 per-CE AUC on the test set
    python -m interp.benchmarks.gavel.smollm2 --out DIR --choose "6,15,64,2;6,15,256,3"   # validation set only
    python -m interp.benchmarks.gavel.smollm2 --out DIR --eri-generate payment_tools,making_threat [--eri-describe]
    python -m interp.benchmarks.gavel.smollm2 --out DIR --eri-compare payment_tools,making_threat
    python -m interp.benchmarks.gavel.smollm2 --out DIR --final              # run_smollm2, result + detector in DIR

``DIR`` receives the JSON outputs (a folder you choose; nothing is written elsewhere but the stage cache).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from interp.probes.gavel import DetectorConfig, FeatureSpec
from interp.probes.gavel import library as lib
from interp.stages import Stages

#: ERI variant with the CE's meaning spelled out (the paper's prompt names the CE only; UNCERTAIN)
ERI_DESCRIBED = "Rewrite the following text in the manner of {desc}:\n\n{{text}}"
ERI_DESCRIPTIONS = {
    "payment_tools": "payment tools (ask the reader to pay with gift cards, bitcoin or a wire transfer)",
    "making_threat": "making a threat (threaten the reader with harm if they do not obey)",
}
#: the readout layers stored for the script's modes (layers 6..14; every variant slices its range from them)
WIDE = (6, 15)
CODE = ("interp.benchmarks.gavel", "interp.probes.gavel")


def _detector_config() -> DetectorConfig:
    return DetectorConfig(hidden=64, rnn_layers=2, lr=1e-3, max_epochs=20)


@dataclass
class SmolLM2Config:
    """The reported SmolLM2 run (docs/gavel.md: protocol v2 with the model's own replies)."""

    model: str = "zoo:smollm2-135m"
    layers: tuple[int, int] = (6, 15)
    n_train: int = 300
    n_cal: int = 20
    n_test: int = 15
    n_mono: int = 16
    n_mono_cal: int = 8
    detector: DetectorConfig = field(default_factory=_detector_config)
    n_own: int = 144
    n_own_cal: int = 40
    own_max_new_tokens: int = 48
    monitor_history: int = 32
    monitor_max_new_tokens: int = 32
    seed: int = 0


def run_smollm2(config: SmolLM2Config | None = None, model=None, stages: Stages | None = None) -> dict:
    """The reported run, through stages: ``own-replies`` (the model's greedy replies to the harmless prompts),
    ``library-validation`` (folder: the :class:`LibraryValidation` result and the calibrated detector) and
    ``monitor-harmless`` (the test set's 15 harmless conversations continued under the monitor).

    Returns ``{"model", "validation", "detector", "monitor"}``.
    """
    import interp
    from interp.probes.gavel import CEDetector

    from .validation import LibraryValidation, own_replies, own_reply_prompts, run_library_validation, \
        run_monitor_validation
    cfg = config or SmolLM2Config()
    stages = stages or Stages("gavel/smollm2", cfg, code=CODE)
    model = model or interp.load(cfg.model, backend="torch")
    spec = FeatureSpec.range(*cfg.layers)
    own = stages("own-replies", lambda: {
        "more": own_replies(model, own_reply_prompts(cfg.n_own, "more", cfg.seed), cfg.own_max_new_tokens),
        "val": own_replies(model, own_reply_prompts(cfg.n_own_cal, "val", cfg.seed), cfg.own_max_new_tokens)})

    def build(tmp: Path) -> None:
        res, det = run_library_validation(model, spec, n_train=cfg.n_train, n_cal=cfg.n_cal, n_test=cfg.n_test,
                                          n_mono=cfg.n_mono, n_mono_cal=cfg.n_mono_cal, seed=cfg.seed,
                                          detector_config=cfg.detector, model_name=cfg.model, n_own=cfg.n_own,
                                          n_own_cal=cfg.n_own_cal, own_texts=own, return_detector=True)
        res.save(tmp / "result")
        det.save(tmp / "detector")
    folder = stages.path("library-validation", build)
    res, det = LibraryValidation.load(folder / "result"), CEDetector.load(folder / "detector")
    mon = stages("monitor-harmless", lambda: run_monitor_validation(
        model, det, n_positive=0, max_new_tokens=cfg.monitor_max_new_tokens, seed=cfg.seed,
        history=cfg.monitor_history))
    return {"model": model, "validation": res, "detector": det, "monitor": mon}


# ------------------------------------------------------------------------------------------ script modes
def _key(conv) -> str:
    if isinstance(conv, tuple):
        raw = conv[0].numpy().tobytes() + conv[1].numpy().tobytes()
    else:
        raw = json.dumps(conv, sort_keys=True).encode()
    return hashlib.sha1(raw).hexdigest()


class Readouts:
    """Readouts over :data:`WIDE` of named conversation sets, one stage per set (``readouts-<set>``, fp16);
    ``features(spec)`` returns a ``convs -> feats`` function slicing a layer range inside ``WIDE`` (a
    conversation outside the stored sets is extracted on the fly)."""

    def __init__(self, model, stages: Stages, args, batch_size: int = 16):
        self.model, self.stages, self.args, self.bs = model, stages, args, batch_size
        self.mem: dict[str, torch.Tensor] = {}

    def load(self, name: str) -> None:
        from interp.probes.gavel import conversation_features
        convs = sets(self.model, name, self.args)
        feats = self.stages(f"readouts-{name}", lambda: [f.half().contiguous() for f in conversation_features(
            self.model, convs, FeatureSpec.range(*WIDE), batch_size=self.bs)])
        self.mem.update({_key(c): f for c, f in zip(convs, feats)})

    def get(self, convs) -> list[torch.Tensor]:
        from interp.probes.gavel import conversation_features
        keys = [_key(c) for c in convs]
        todo = [i for i, k in enumerate(keys) if k not in self.mem]
        if todo:
            fs = conversation_features(self.model, [convs[i] for i in todo], FeatureSpec.range(*WIDE), batch_size=self.bs)
            self.mem.update({keys[i]: f.half() for i, f in zip(todo, fs)})
        return [self.mem[k] for k in keys]

    def features(self, spec: FeatureSpec):
        if spec.layers[0] < WIDE[0] or spec.layers[-1] >= WIDE[1]:
            raise ValueError(f"layers {spec.layers} are outside the stored range {WIDE[0]}..{WIDE[1] - 1}")
        d = self.model.cfg.n_kv_heads * self.model.cfg.d_head
        a, b = (spec.layers[0] - WIDE[0]) * d, (spec.layers[-1] + 1 - WIDE[0]) * d
        return lambda convs: [f[:, a:b].float() for f in self.get(list(convs))]


def validation_set(seed: int = 0, n: int = 8):
    """Choice-making set from the validation templates: per seen rule n positives and n hard negatives, n random."""
    rng = random.Random(f"gavel-library-val/{seed}")
    ces = list(lib.CE_TEMPLATES)
    out = []
    for r in lib.library_rules():
        out += lib.scenario_conversations(rng, r, n, n, "val", others=ces)
    return out + lib.neutral_conversations(rng, n, "val", ces)


def sets(model, name: str, args):
    from interp.probes.gavel import token_ce_labels

    from .validation import _v1_data, calibration_dialogues, library_test_set
    ces = list(lib.CE_TEMPLATES)
    if name == "test":
        return [t.messages for t in library_test_set(0)]
    if name == "val":
        return [t.messages for t in validation_set()]
    if name == "v2train":
        tr = lib.training_conversations(random.Random("gavel-library-train/0"), args.n_train, "more")
        return [(i, k) for i, k, _ in (token_ce_labels(model, t, ces) for t in tr)]
    if name == "v2cal":
        return calibration_dialogues(0, args.n_cal)[0]
    if name == "v1":
        rules = [r for r in lib.library_rules() if r.name in lib.SCENARIOS]
        tc, _, cc, _ = _v1_data(random.Random("gavel-library/0"), ces, rules, 20, 12)
        return tc + cc
    if name == "mono":  # protocol v2's monolithic-baseline conversations (as run_library_validation draws them)
        mrng = random.Random("gavel-library-mono/0")
        out = [t.messages for t in lib.neutral_conversations(mrng, args.n_mono, "more", ces)
               + lib.neutral_conversations(mrng, args.n_mono_cal, "val", ces)]
        for r in lib.library_rules(include_unseen=True):
            out += [t.messages for t in lib.scenario_conversations(mrng, r, args.n_mono, 0, "more")
                    + lib.scenario_conversations(mrng, r, args.n_mono_cal, 0, "val")]
        return out
    raise ValueError(f"unknown conversation set {name!r}: test, val, v2train, v2cal, v1, mono")


def _train_v2(model, feats, spec, cfg, args):
    """Protocol v2 detector (training conversations) calibrated on the v2 calibration dialogues."""
    from interp.probes.gavel import calibrate, labelled_windows, token_ce_labels, train_detector

    from .validation import calibration_dialogues
    ces = list(lib.CE_TEMPLATES)
    tr = lib.training_conversations(random.Random("gavel-library-train/0"), args.n_train, "more")
    labs = [token_ce_labels(model, t, ces) for t in tr]
    x, y = labelled_windows(feats([(i, k) for i, k, _ in labs]), [lab[k] for _, k, lab in labs], cfg.window)
    det, hist = train_detector(x, y, ces, cfg, spec=spec)
    cc, cl = calibration_dialogues(0, args.n_cal)
    calibrate(det, det.sequence_probs(feats(cc)), cl, patience=(1, 2))
    return det, hist


def _rule_table(det, convs, probs):
    from interp.probes.gavel import gavel_rule_outputs, rule_metrics
    rows = []
    for r in lib.library_rules(include_unseen=True):
        y = np.array([r.evaluate(t.ces) for t in convs])
        if y.all() or not y.any():
            continue
        grp = ["positive" if yy else ("hard" if set(t.ces) & set(r.condition_ces) else "random") for yy, t in zip(y, convs)]
        dec, sc = gavel_rule_outputs(det, r, probs)
        rows.append({"rule": r.name, **rule_metrics(y, dec, sc, grp)})
    return rows


def _write(out: Path, name: str, obj) -> None:
    from interp.io import atomic_write_json
    atomic_write_json(out / name, obj)
    print(f"wrote {out / name}", flush=True)


def main(argv=None) -> None:
    import interp
    from interp.probes.gavel import make_windows, train_detector

    from .validation import library_test_set, per_ce_auc, run_library_validation
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the JSON outputs (created if missing)")
    ap.add_argument("--model", default="zoo:smollm2-135m")
    ap.add_argument("--extract", help="store the readouts of these conversation sets (comma-separated)")
    ap.add_argument("--choose", help='detector settings "start,stop,hidden,rnn_layers;..." on the validation set')
    ap.add_argument("--diagnose", action="store_true")
    ap.add_argument("--final", action="store_true", help="the reported run (run_smollm2)")
    ap.add_argument("--n-train", type=int, default=300)
    ap.add_argument("--n-cal", type=int, default=20)
    ap.add_argument("--n-mono", type=int, default=16)
    ap.add_argument("--n-mono-cal", type=int, default=8)
    ap.add_argument("--eri-generate")
    ap.add_argument("--eri-compare")
    ap.add_argument("--eri-describe", action="store_true")
    ap.add_argument("--eri-config", default="6,15,64,2")
    ap.add_argument("--eri-texts", type=int, default=16)
    ap.add_argument("--eri-tokens", type=int, default=40)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    t0 = time.time()
    if args.final:
        cfg = SmolLM2Config(model=args.model, n_train=args.n_train, n_cal=args.n_cal, n_mono=args.n_mono,
                            n_mono_cal=args.n_mono_cal)
        r = run_smollm2(cfg)
        r["validation"].save(out / "result", overwrite=True)
        r["detector"].save(out / "detector", overwrite=True)
        print(r["validation"].to_frame().round(3).to_string())
        print(r["monitor"].summary(), f"{time.time() - t0:.0f} s")
        return
    model = interp.load(args.model, backend="torch")
    stages = Stages("gavel/smollm2-readouts", {"model": args.model, "wide": list(WIDE), "n_train": args.n_train,
                                               "n_cal": args.n_cal, "n_mono": args.n_mono,
                                               "n_mono_cal": args.n_mono_cal}, code=CODE)
    cache = Readouts(model, stages, args)
    if args.extract:
        for name in args.extract.split(","):
            cache.load(name)
            print(f"{name}: {time.time() - t0:.0f} s", flush=True)
        return
    if args.diagnose:
        for name in ("test", "v2train", "v2cal", "v1"):
            cache.load(name)
        res = {}
        spec = FeatureSpec.range(6, 15)
        for proto, kw in (("v1", dict(n_train=20, n_cal=12)), ("v2", dict(n_train=args.n_train, n_cal=args.n_cal))):
            r = run_library_validation(model, spec, n_test=15, n_mono=16, detector_config=_detector_config(),
                                       protocol=proto, features=cache.features(spec), baselines=False,
                                       model_name=args.model, **kw)
            res[proto] = {"rows": r.rows, "ce_auc": r.sizes["ce_auc"], "thresholds": r.thresholds,
                          "sizes": {k: v for k, v in r.sizes.items() if k != "ce_auc"}}
            print(proto, json.dumps(r.sizes["ce_auc"]), flush=True)
        _write(out, "diagnose.json", res)
        return
    if args.choose:
        for name in ("val", "v2train", "v2cal"):
            cache.load(name)
        val = validation_set()
        rows = []
        for conf in args.choose.split(";"):
            a, b, hidden, nl = (int(v) for v in conf.split(","))
            spec = FeatureSpec.range(a, b)
            cfg = DetectorConfig(hidden=hidden, rnn_layers=nl, lr=1e-3 if hidden == 64 else 3e-4, max_epochs=20)
            t = time.time()
            det, hist = _train_v2(model, cache.features(spec), spec, cfg, args)
            probs = det.sequence_probs(cache.features(spec)([v.messages for v in val]))
            rt = _rule_table(det, val, probs)
            ce = per_ce_auc(det, probs, val)
            rows.append({"layers": f"{a}..{b - 1}", "gru": f"{nl}x{hidden}",
                         "mean_rule_auc": float(np.mean([r["auc"] for r in rt])),
                         "min_rule_auc": float(np.min([r["auc"] for r in rt])),
                         "mean_balanced_acc": float(np.mean([r["balanced_accuracy"] for r in rt])),
                         "min_ce_auc": float(min(ce.values())), "rules": rt, "ce_auc": ce,
                         "best_epoch": hist.best_epoch, "seconds": time.time() - t})
            _write(out, "choose.json", rows)
        return
    if args.eri_generate:
        from interp.probes.gavel import ERI_TEMPLATE, elicit
        rng = random.Random("gavel-eri/0")
        texts = [lib._fill(rng, rng.choice(lib.NEUTRAL + lib.EXTRA_NEUTRAL)) + " " + lib._fill(rng, rng.choice(lib.NEUTRAL))
                 for _ in range(args.eri_texts)]
        tag = "eri_desc" if args.eri_describe else "eri"
        log = {}
        for ce in args.eri_generate.split(","):
            template = ERI_DESCRIBED.format(desc=ERI_DESCRIPTIONS[ce]) if args.eri_describe else ERI_TEMPLATE

            def gen(ce=ce, template=template):
                t = time.time()
                g, feats = elicit(model, ce, texts, FeatureSpec.range(*WIDE), max_new_tokens=args.eri_tokens,
                                  batch_size=args.eri_texts, template=template)
                return {"feats": [f.half() for f in feats if len(f)], "generated": g, "seconds": time.time() - t,
                        "tokens": [int(len(f)) for f in feats]}
            r = stages(f"{tag}-{ce}-{args.eri_texts}-{args.eri_tokens}", gen)
            log[ce] = {k: r[k] for k in ("generated", "seconds", "tokens")} | {"texts": texts}
        _write(out, f"{tag}_log.json", log)
        return
    if args.eri_compare:
        from interp.probes.gavel import labelled_windows, token_ce_labels
        cache.load("v2train")
        cache.load("test")
        a, b, hidden, nl = (int(x) for x in args.eri_config.split(","))
        spec = FeatureSpec.range(a, b)
        fn = cache.features(spec)
        d = model.cfg.n_kv_heads * model.cfg.d_head
        ces = list(lib.CE_TEMPLATES)
        tr = lib.training_conversations(random.Random("gavel-library-train/0"), args.n_train, "more")
        labs = [token_ce_labels(model, t, ces) for t in tr]
        x, y = labelled_windows(fn([(i, k) for i, k, _ in labs]), [lab[k] for _, k, lab in labs], 5)
        test = library_test_set(0)
        te = fn([t.messages for t in test])
        res = {}
        for ce in args.eri_compare.split(","):
            c = ces.index(ce)
            srcs = {}
            for tag in ("eri", "eri_desc"):
                name = f"{tag}-{ce}-{args.eri_texts}-{args.eri_tokens}"
                if stages.done(name):
                    ef = [v[:, (a - WIDE[0]) * d:(b - WIDE[0]) * d].float() for v in stages(name, lambda: None)["feats"]]
                    srcs[tag] = torch.cat([make_windows(f, 5) for f in ef if len(f) >= 5])
            if not srcs:
                raise SystemExit(f"no ERI readouts for {ce}: run --eri-generate {ce} first")
            n_pos = min(len(v) for v in srcs.values())
            neg = x[(y.nan_to_num(1) == 0).all(1)]  # windows showing no CE at all
            others = x[(y[:, c] == 0) & (y.nan_to_num(0).sum(1) > 0)]  # windows of other CEs
            pos_t = x[y[:, c] == 1]
            g = torch.Generator().manual_seed(0)
            srcs["template"] = pos_t[torch.randperm(len(pos_t), generator=g)[:n_pos]]
            row = {f"{k}_windows": len(v) for k, v in srcs.items()}
            row["negatives"] = len(neg) + len(others)
            for src, pos in srcs.items():
                X = torch.cat([pos, neg, others])
                Y = torch.cat([torch.ones(len(pos), 1), torch.zeros(len(neg) + len(others), 1)])
                cfg = DetectorConfig(hidden=hidden, rnn_layers=nl, lr=1e-3 if hidden == 64 else 3e-4, max_epochs=20)
                det, _ = train_detector(X, Y, [ce], cfg, spec=spec)
                row[f"auc_{src}"] = per_ce_auc(det, det.sequence_probs(te), [
                    lib.LabelledConversation(t.messages, [ce] if ce in t.ces else [], t.kind, t.scenario) for t in test])[ce]
            res[ce] = row
            print(ce, row, flush=True)
        _write(out, "eri_compare.json", res)
        return
    ap.error("choose a mode: --extract, --diagnose, --choose, --eri-generate, --eri-compare or --final")


if __name__ == "__main__":
    main()
