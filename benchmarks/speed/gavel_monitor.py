"""Overhead of GAVEL's real-time Monitor per generated token, as a ratio to plain generation.

GAVEL (ICLR 2026) reports about 0.21 ms/token for its monitor on Mistral-7B; our goal is at most 10 %
overhead on SmolLM2-135M. The monitor reads ``blocks.{l}.attn.hook_z`` of a 15-layer range (grouped per KV
head: 15 × 3 × 64 = 2,880 features per token, as the paper's 15 × 1,024 on Mistral) and ``hook_embed`` in
every pass of ``model.generate`` and runs the paper-size detector (bidirectional 3-layer GRU, hidden 256)
on each 5-token window; the rules never fire here (thresholds above 1), so every token is generated and
scored. The detector's weights are random: its cost does not depend on them.

Timed in interleaved rounds (median of ``--reps``), greedy, same prompt, ``--tokens`` new tokens:

* ``generate``         — ``model.generate`` with no hooks;
* ``generate_monitor`` — ``Monitor.generate`` (hooks + window scoring + rule checks);
* ``detector_window``  — one detector call on one window alone (the scoring part of the overhead).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/gavel_monitor.py`` (default ``zoo:smollm2-135m``).
Writes ``benchmarks/speed/results/gavel_monitor.json`` and ``gavel_monitor.md``.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import interp
from interp.io import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = [{"role": "user", "content": "Write a short note to a colleague about the quarterly report."}]


def main() -> dict:
    from interp.probes.gavel import CEDetector, DetectorConfig, FeatureSpec, Monitor, WindowGRU, parse_rule, render_prompt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:smollm2-135m")
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", default="12:27", help="start:stop of the layer range")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--detector", help="a trained CEDetector folder (e.g. DIR/detector of `python -m "
                    "interp.benchmarks.gavel.smollm2 --out DIR --final`): its layer range, size and CEs, with the "
                    "library rules, replace the random one")
    ap.add_argument("--out", default=str(RESULTS / "gavel_monitor"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    interp.set_progress(False)
    model = interp.load(args.model, backend=args.backend)
    a, b = (int(x) for x in args.layers.split(":"))
    spec = FeatureSpec.range(a, b)
    ces = [f"ce{i}" for i in range(23)]  # the paper's library size
    cfg = DetectorConfig()
    torch.manual_seed(0)
    det = CEDetector(WindowGRU(spec.width(model), len(ces), cfg.hidden, cfg.rnn_layers, cfg.dropout), ces, cfg,
                     spec=spec, thresholds=torch.full((len(ces),), 1.01))
    rules = [parse_rule("all of {ce0, ce1} and 1 of {ce2, ce3}", name="r0", action="block"),
             parse_rule("all of {ce4} and 2 of {ce5, ce6, ce7}", name="r1", action="flag")]
    if args.detector:  # the trained SmolLM2 detector and the library's four rules (thresholds lifted: never fires)
        from interp.probes.gavel import library as lib
        det = CEDetector.load(args.detector)
        det.thresholds = torch.full((len(det.ces),), 1.01)
        spec, cfg, ces = det.spec, det.config, det.ces
        a, b = spec.layers[0], spec.layers[-1] + 1
        rules = [parse_rule(t, ces, name=n, action="block") for n, t in list(lib.SCENARIOS.items()) + [lib.UNSEEN_SCENARIO]]
    mon = Monitor(model, det, rules)
    text = render_prompt(model, PROMPT)
    kw = dict(max_new_tokens=args.tokens, stop_at_eos=False)

    def plain():
        return model.generate(text, return_text=False, **kw)

    def monitored():
        mon.reset()
        return mon.generate(PROMPT, **kw)

    window = torch.randn(1, cfg.window, spec.width(model))

    def one_window():
        return det.window_logits(window)

    plain(), monitored(), one_window()  # warm up
    out = monitored()
    assert len(out.token_ids) == args.tokens and not out.stopped
    assert out.token_ids == plain()[0].tolist(), "the monitor changed the generation"
    times: dict[str, list[float]] = {"generate": [], "generate_monitor": [], "detector_window": []}
    for _ in range(args.reps):
        for name, fn in (("generate", plain), ("generate_monitor", monitored)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(20):
            one_window()
        times["detector_window"].append((time.perf_counter() - t) / 20)
    med = {k: statistics.median(v) for k, v in times.items()}
    per_tok = {k: med[k] / args.tokens * 1e3 for k in ("generate", "generate_monitor")}
    res = {"detector": args.detector or "random", "gru": [cfg.rnn_layers, cfg.hidden], "model": args.model, "backend": args.backend, "tokens": args.tokens, "reps": args.reps,
           "layers": [a, b], "features": spec.width(model), "n_ces": len(ces), "threads": args.threads,
           "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
           "median_s": med, "ms_per_token": per_tok,
           "monitor_overhead_ms_per_token": per_tok["generate_monitor"] - per_tok["generate"],
           "ratio": med["generate_monitor"] / med["generate"],
           "detector_ms_per_window": med["detector_window"] * 1e3,
           "detector_ms_per_token": med["detector_window"] * 1e3 / cfg.window,
           "all_s": times, "load_average_1min": os.getloadavg()[0]}
    outp = Path(args.out)
    outp.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(outp.with_suffix(".json"), res)
    md = ["# GAVEL monitor overhead", "",
          f"`{args.model}` ({args.backend}), {args.tokens} new tokens, greedy, {args.threads} thread(s), median of "
          f"{args.reps}; readout layers {a}..{b - 1} ({spec.width(model)} features), {len(ces)} CEs, detector "
          f"GRU {cfg.rnn_layers}×{cfg.hidden} bidirectional on 5-token windows"
          + (f" (trained: `{args.detector}`)." if args.detector else " (random weights)."), "",
          "| what | ms/token |", "|---|---|",
          f"| plain generate | {per_tok['generate']:.2f} |",
          f"| monitored generate | {per_tok['generate_monitor']:.2f} |",
          f"| overhead | {res['monitor_overhead_ms_per_token']:.2f} |",
          f"| detector alone (per token) | {res['detector_ms_per_token']:.3f} |", "",
          f"Ratio monitored / plain: **{res['ratio']:.3f}** (goal ≤ 1.10). "
          "Generated tokens are identical with and without the monitor (checked). "
          f"Machine load average at the end: {res['load_average_1min']:.1f} (on {os.cpu_count()} cores).", ""]
    atomic_write_text(outp.with_suffix(".md"), "\n".join(md))
    print("\n".join(md))
    return res


if __name__ == "__main__":
    main()
