"""GAVEL on SmolLM2-135M: diagnosis of the first protocol, validation-split choices, and the final run.

Readouts of every conversation are extracted once over a wide layer range (6..26, fp16) into a
content-addressed cache (one safetensors file per conversation, so several processes can fill it at once
and a stopped run resumes); every variant then slices its layer range from the cache.

Modes:

* ``--extract SET`` fills the cache for one conversation set (``test``, ``val``, ``v2train``, ``v2cal``,
  ``mono``, ``v1``), to run sets in parallel processes;
* ``--diagnose`` per-CE conversation-level AUCs on the held-out test set for protocol v1 and v2;
* ``--choose "6,15,64,2;6,15,256,3"`` detector settings compared on the validation set (validation
  templates; never the test set);
* ``--eri-generate CE,CE`` ERI (the model rewrites neutral texts "in the manner of ⟨CE⟩"; readouts of the
  generated tokens) for a few CEs, written to the cache folder, with the wall time;
* ``--eri-compare CE,CE`` per CE, a detector trained on ERI data vs one trained on the same number of
  prefilled-template windows (same negatives), conversation-level AUC on the held-out test set;
* ``--final LAYERS HIDDEN RNN_LAYERS`` the reported run (test set) with the chosen settings, written to
  ``benchmarks/results/gavel_smollm2_v2/``.

Run with ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/gavel_smollm2.py --extract test`` etc.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

import interp
from interp.io import atomic_write_json

#: ERI variant with the CE's meaning spelled out (the paper's prompt names the CE only; UNCERTAIN)
ERI_DESCRIBED = "Rewrite the following text in the manner of {desc}:\n\n{{text}}"
ERI_DESCRIPTIONS = {
    "payment_tools": "payment tools (ask the reader to pay with gift cards, bitcoin or a wire transfer)",
    "making_threat": "making a threat (threaten the reader with harm if they do not obey)",
}
RESULTS = Path(__file__).resolve().parent / "results"
WIDE = (6, 15)  # layers 6..14 (the first protocol's range; a first cache over 6..26 is read as a fallback)
FALLBACK = (Path("/tmp/gavel_h/cache"), (6, 27))


def _key(conv) -> str:
    if isinstance(conv, tuple):
        raw = conv[0].numpy().tobytes() + conv[1].numpy().tobytes()
    else:
        raw = json.dumps(conv, sort_keys=True).encode()
    return hashlib.sha1(raw).hexdigest()


class Cache:
    """Wide-range readouts per conversation on disk; ``features(spec)`` returns a ``convs -> feats`` function."""

    def __init__(self, model, root: Path, batch_size: int = 16):
        from interp.probes.gavel import FeatureSpec
        self.model, self.root, self.bs = model, root, batch_size
        self.wide = FeatureSpec.range(*WIDE)
        root.mkdir(parents=True, exist_ok=True)
        self.mem: dict[str, torch.Tensor] = {}

    def get(self, convs) -> list[torch.Tensor]:
        from safetensors.torch import load_file, save_file
        from interp.probes.gavel import conversation_features
        keys = [_key(c) for c in convs]
        todo = []
        for i, k in enumerate(keys):
            if k not in self.mem and (self.root / f"{k}.safetensors").is_file():
                self.mem[k] = load_file(str(self.root / f"{k}.safetensors"))["f"]
            fb = FALLBACK[0] / f"{k}.safetensors"
            if k not in self.mem and fb.is_file():
                d = self.model.cfg.n_kv_heads * self.model.cfg.d_head
                self.mem[k] = load_file(str(fb))["f"][:, (WIDE[0] - FALLBACK[1][0]) * d:(WIDE[1] - FALLBACK[1][0]) * d].contiguous()
            if k not in self.mem:
                todo.append(i)
        for s in range(0, len(todo), self.bs):
            idx = todo[s:s + self.bs]
            fs = conversation_features(self.model, [convs[i] for i in idx], self.wide, batch_size=self.bs)
            for i, f in zip(idx, fs):
                f = f.half().contiguous()
                tmp = self.root / f".{keys[i]}.tmp"
                save_file({"f": f}, str(tmp))
                tmp.rename(self.root / f"{keys[i]}.safetensors")
                self.mem[keys[i]] = f
        return [self.mem[k] for k in keys]

    def features(self, spec):
        d = self.model.cfg.n_kv_heads * self.model.cfg.d_head
        a = (spec.layers[0] - WIDE[0]) * d
        b = (spec.layers[-1] + 1 - WIDE[0]) * d

        def fn(convs):
            return [f[:, a:b].float() for f in self.get(list(convs))]
        return fn


def validation_set(seed: int = 0, n: int = 8):
    """Choice-making set from the validation templates: per seen rule n positives and n hard negatives, n random."""
    from interp.probes.gavel import library as lib
    rng = random.Random(f"gavel-library-val/{seed}")
    ces = list(lib.CE_TEMPLATES)
    out = []
    for r in lib.library_rules():
        out += lib.scenario_conversations(rng, r, n, n, "val", others=ces)
    return out + lib.neutral_conversations(rng, n, "val", ces)


def sets(model, name: str):
    from interp.probes.gavel import library as lib
    from interp.probes.gavel.validation import (_v1_data, calibration_dialogues, library_test_set, token_ce_labels)
    ces = list(lib.CE_TEMPLATES)
    if name == "test":
        return [t.messages for t in library_test_set(0)]
    if name == "val":
        return [t.messages for t in validation_set()]
    if name == "v2train":
        tr = lib.training_conversations(random.Random("gavel-library-train/0"), ARGS.n_train, "more")
        return [(i, k) for i, k, _ in (token_ce_labels(model, t, ces) for t in tr)]
    if name == "v2cal":
        return calibration_dialogues(0, ARGS.n_cal)[0]
    if name == "v1":
        rules = [r for r in lib.library_rules() if r.name in lib.SCENARIOS]
        tc, _, cc, _ = _v1_data(random.Random("gavel-library/0"), ces, rules, 20, 12)
        return tc + cc
    if name == "mono":  # protocol v2's monolithic-baseline conversations (as run_library_validation draws them)
        mrng = random.Random("gavel-library-mono/0")
        out = [t.messages for t in lib.neutral_conversations(mrng, ARGS.n_mono, "more", ces)
               + lib.neutral_conversations(mrng, ARGS.n_mono_cal, "val", ces)]
        for r in lib.library_rules(include_unseen=True):
            out += [t.messages for t in lib.scenario_conversations(mrng, r, ARGS.n_mono, 0, "more")
                    + lib.scenario_conversations(mrng, r, ARGS.n_mono_cal, 0, "val")]
        return out
    raise ValueError(name)


def _train_v2(model, cache, spec, cfg):
    """Protocol v2 detector (training conversations) calibrated on the v2 calibration dialogues."""
    from interp.probes.gavel import calibrate, library as lib, train_detector
    from interp.probes.gavel.validation import calibration_dialogues, labelled_windows, token_ce_labels
    ces = list(lib.CE_TEMPLATES)
    tr = lib.training_conversations(random.Random("gavel-library-train/0"), ARGS.n_train, "more")
    labs = [token_ce_labels(model, t, ces) for t in tr]
    fn = cache.features(spec)
    x, y = labelled_windows(fn([(i, k) for i, k, _ in labs]), [lab[k] for _, k, lab in labs], cfg.window)
    det, hist = train_detector(x, y, ces, cfg, spec=spec)
    cc, cl = calibration_dialogues(0, ARGS.n_cal)
    calibrate(det, det.sequence_probs(fn(cc)), cl, patience=(1, 2))
    return det, hist


def _rule_table(det, convs, probs):
    from interp.probes.gavel import gavel_rule_outputs, library as lib, rule_metrics
    rows = []
    for r in lib.library_rules(include_unseen=True):
        y = np.array([r.evaluate(t.ces) for t in convs])
        if y.all() or not y.any():
            continue
        grp = ["positive" if yy else ("hard" if set(t.ces) & set(r.condition_ces) else "random") for yy, t in zip(y, convs)]
        dec, sc = gavel_rule_outputs(det, r, probs)
        rows.append({"rule": r.name, **rule_metrics(y, dec, sc, grp)})
    return rows


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--extract")
    ap.add_argument("--slice")
    ap.add_argument("--choose", help='configs "start,stop,hidden,rnn_layers;..."')
    ap.add_argument("--diagnose", action="store_true")
    ap.add_argument("--final", nargs=4, metavar=("START", "STOP", "HIDDEN", "RNN_LAYERS"))
    ap.add_argument("--cache", default="/tmp/gavel_h/cache6_14")
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
    ap.add_argument("--out", default=str(RESULTS / "gavel_smollm2_v2"))
    ARGS = ap.parse_args()
    torch.set_num_threads(1)
    from interp.probes.gavel import DetectorConfig, FeatureSpec
    from interp.probes.gavel import library as lib
    from interp.probes.gavel.validation import library_test_set, per_ce_auc, run_library_validation
    model = interp.load("zoo:smollm2-135m", backend="torch")
    cache = Cache(model, Path(ARGS.cache))
    t0 = time.time()
    if ARGS.extract:
        for name in ARGS.extract.split(","):
            convs = sets(model, name)
            if ARGS.slice:  # "i/n[r]": every n-th conversation from i (r: from the end), for parallel processes
                i, n = (int(v) for v in ARGS.slice.rstrip("r").split("/"))
                convs = (convs[::-1] if ARGS.slice.endswith("r") else convs)[i::n]
            cache.get(convs)
            print(f"{name}: {len(convs)} conversations, {time.time() - t0:.0f} s", flush=True)
        return
    if ARGS.diagnose:
        out = {}
        spec = FeatureSpec.range(6, 15)
        cfg = DetectorConfig(hidden=64, rnn_layers=2, lr=1e-3, max_epochs=20)
        for proto, kw in (("v1", dict(n_train=20, n_cal=12)), ("v2", dict(n_train=ARGS.n_train, n_cal=ARGS.n_cal))):
            res, det = run_library_validation(model, spec, n_test=15, n_mono=16 if proto == "v2" else 16, detector_config=cfg,
                                              protocol=proto, features=cache.features(spec), return_detector=True,
                                              baselines=False,
                                              model_name="zoo:smollm2-135m", **kw)
            df = res.to_frame()
            out[proto] = {"rows": res.rows, "ce_auc": res.sizes["ce_auc"], "thresholds": res.thresholds,
                          "sizes": {k: v for k, v in res.sizes.items() if k != "ce_auc"}}
            print(proto, json.dumps(res.sizes["ce_auc"], indent=0), flush=True)
            print(df[df.method == "gavel"].round(3).to_string(), flush=True)
            print("thresholds", res.thresholds, flush=True)
        atomic_write_json(Path("/tmp/gavel_h/diagnose.json"), out)
        print(f"{time.time() - t0:.0f} s")
        return
    if ARGS.choose:
        val = validation_set()
        rows = []
        for conf in ARGS.choose.split(";"):
            a, b, hidden, nl = (int(v) for v in conf.split(","))
            spec = FeatureSpec.range(a, b)
            cfg = DetectorConfig(hidden=hidden, rnn_layers=nl, lr=1e-3 if hidden == 64 else 3e-4, max_epochs=20)
            t = time.time()
            det, hist = _train_v2(model, cache, spec, cfg)
            probs = det.sequence_probs(cache.features(spec)([v.messages for v in val]))
            rt = _rule_table(det, val, probs)
            ce = per_ce_auc(det, probs, val)
            row = {"layers": f"{a}..{b - 1}", "gru": f"{nl}x{hidden}", "mean_rule_auc": float(np.mean([r["auc"] for r in rt])),
                   "min_rule_auc": float(np.min([r["auc"] for r in rt])),
                   "mean_balanced_acc": float(np.mean([r["balanced_accuracy"] for r in rt])),
                   "min_ce_auc": float(min(ce.values())), "rules": rt, "ce_auc": ce, "best_epoch": hist.best_epoch,
                   "seconds": time.time() - t}
            rows.append(row)
            print({k: v for k, v in row.items() if k not in ("rules", "ce_auc")}, flush=True)
            print(json.dumps(rt), json.dumps(ce), flush=True)
            atomic_write_json(Path(f"/tmp/gavel_h/choose_{conf.replace(',', '_')}.json"), rows)
        return
    if ARGS.eri_generate:
        from interp.probes.gavel import ERI_TEMPLATE, elicit
        rng = random.Random("gavel-eri/0")
        texts = [lib._fill(rng, rng.choice(lib.NEUTRAL + lib.EXTRA_NEUTRAL)) + " " + lib._fill(rng, rng.choice(lib.NEUTRAL))
                 for _ in range(ARGS.eri_texts)]
        spec = FeatureSpec.range(*WIDE)
        log = {}
        tag = "eri_desc" if ARGS.eri_describe else "eri"
        for ce in ARGS.eri_generate.split(","):
            t = time.time()
            template = ERI_DESCRIBED.format(desc=ERI_DESCRIPTIONS[ce]) if ARGS.eri_describe else ERI_TEMPLATE
            gen, feats = elicit(model, ce, texts, spec, max_new_tokens=ARGS.eri_tokens, batch_size=ARGS.eri_texts,
                                template=template)
            from safetensors.torch import save_file
            save_file({str(i): f.half().contiguous() for i, f in enumerate(feats) if len(f)},
                      str(Path(ARGS.cache) / f"{tag}_{ce}.safetensors"))
            log[ce] = {"seconds": time.time() - t, "texts": texts, "generated": gen,
                       "tokens": [int(len(f)) for f in feats]}
            print(ce, f"{log[ce]['seconds']:.0f} s", gen[:3], flush=True)
            atomic_write_json(Path(ARGS.cache) / f"{tag}_log_{ARGS.eri_generate.replace(',', '_')}.json", log)
        return
    if ARGS.eri_compare:
        from safetensors.torch import load_file
        from interp.probes.gavel import make_windows, train_detector
        from interp.probes.gavel.validation import labelled_windows, token_ce_labels
        a, b, hidden, nl = (int(x) for x in ARGS.eri_config.split(","))
        spec = FeatureSpec.range(a, b)
        fn = cache.features(spec)
        d = model.cfg.n_kv_heads * model.cfg.d_head
        ces = list(lib.CE_TEMPLATES)
        tr = lib.training_conversations(random.Random("gavel-library-train/0"), ARGS.n_train, "more")
        labs = [token_ce_labels(model, t, ces) for t in tr]
        x, y = labelled_windows(fn([(i, k) for i, k, _ in labs]), [lab[k] for _, k, lab in labs], 5)
        test = library_test_set(0)
        te = fn([t.messages for t in test])
        out = {}
        for ce in ARGS.eri_compare.split(","):
            c = ces.index(ce)
            srcs = {}
            for tag in ("eri", "eri_desc"):
                fpath = Path(ARGS.cache) / f"{tag}_{ce}.safetensors"
                if fpath.is_file():
                    ef = [v[:, (a - WIDE[0]) * d:(b - WIDE[0]) * d].float() for v in load_file(str(fpath)).values()]
                    srcs[tag] = torch.cat([make_windows(f, 5) for f in ef if len(f) >= 5])
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
            out[ce] = row
            print(ce, row, flush=True)
        atomic_write_json(Path("/tmp/gavel_h/eri_compare.json"), out)
        return
    if ARGS.final:
        a, b, hidden, nl = (int(x) for x in ARGS.final)
        spec = FeatureSpec.range(a, b)
        cfg = DetectorConfig(hidden=hidden, rnn_layers=nl, lr=1e-3 if hidden == 64 else 3e-4, max_epochs=20)
        res, det = run_library_validation(model, spec, n_train=ARGS.n_train, n_cal=ARGS.n_cal, n_test=15,
                                          n_mono=ARGS.n_mono, detector_config=cfg, features=cache.features(spec),
                                          return_detector=True, model_name="zoo:smollm2-135m",
                                          n_mono_cal=ARGS.n_mono_cal)
        res.save(ARGS.out, overwrite=True)
        det.save(Path(ARGS.out) / "detector", overwrite=True)
        df = res.to_frame()
        print(df.round(3).to_string())
        print(json.dumps(res.sizes, indent=1, default=str))
        print(f"{time.time() - t0:.0f} s")


ARGS = None
if __name__ == "__main__":
    main()
