"""Cost of scoring every head with every inactive-head score function, against one forward pass.

Identifying and Evaluating Inactive Heads in Pretrained LLMs (ICLR 2026): :func:`probes.score_heads` runs
one forward pass that captures attention patterns, values and head outputs of every layer, then computes
all 15 score functions vectorised over layers, inputs and heads. This benchmark times, in interleaved
rounds (median of ``--reps``), on the same token batch:

* ``forward``          — plain ``model(batch)`` (no capture), for reference;
* ``forward_pattern``  — ``model.run_with_cache(batch, names="blocks.*.attn.hook_pattern")``: one forward
  with pattern capture (the reference of the target, ratio 1.00);
* ``forward_pvz``      — the same forward capturing pattern, ``hook_v`` and ``hook_z`` (what scoring needs);
* ``score_heads``      — :func:`probes.score_heads` with all score functions (target ≤ 1.5× ``forward_pattern``).

Run: ``.venv/bin/python benchmarks/speed/heads.py`` (default ``zoo:smollm2-135m``, 16 built-in texts, ≤ 64 tokens).
Writes ``benchmarks/speed/results/heads.json`` and ``heads.md``.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

import interp
from interp.io import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> dict:
    from interp.checks import AuditData
    from interp.probes import score_heads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:smollm2-135m")
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--texts", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--concat", type=int, default=1, help="join this many built-in texts into one (longer) input")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--out", default=None, help="results path without suffix (default benchmarks/speed/results/heads[_<tag>])")
    ap.add_argument("--tag", default="", help="suffix of the default results name")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    interp.set_progress(False)
    model = interp.load(args.model, backend=args.backend)
    pool = AuditData.builtin().texts
    texts = [" ".join(pool[(i * args.concat + j) % len(pool)] for j in range(args.concat)) for i in range(args.texts)]
    batch = model.tokenize(texts, max_length=args.max_length)
    variants = {
        "forward": lambda: model(batch),
        "forward_pattern": lambda: model.run_with_cache(batch, names="blocks.*.attn.hook_pattern"),
        "forward_pvz": lambda: model.run_with_cache(batch, names=["blocks.*.attn.hook_pattern", "blocks.*.attn.hook_v",
                                                                  "blocks.*.attn.hook_z"]),
        "score_heads": lambda: score_heads(model, batch),
    }
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.reps):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = med["forward_pattern"]
    result = {
        "model": args.model, "backend": args.backend, "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads,
        "batch": list(batch["input_ids"].shape), "real_tokens": int(batch["attention_mask"].sum()),
        "reps": args.reps, "concat": args.concat, "threads": torch.get_num_threads(), "machine": platform.platform(),
        "median_seconds": med, "ratio_to_forward_pattern": {k: v / ref for k, v in med.items()},
        "target": "score_heads <= 1.5 x forward_pattern",
        "target_met": med["score_heads"] <= 1.5 * ref,
    }
    out = Path(args.out or RESULTS / (f"heads_{args.tag}" if args.tag else "heads"))
    atomic_write_json(out.with_suffix(".json"), result)
    lines = [f"# score_heads vs one forward with pattern capture ({args.model}, {args.backend})", "",
             f"batch {result['batch']} ({result['real_tokens']} real tokens), median of {args.reps} interleaved "
             f"rounds, {result['threads']} threads", "", "| variant | median s | × forward_pattern |", "|---|---|---|"]
    lines += [f"| {k} | {med[k]:.3f} | {result['ratio_to_forward_pattern'][k]:.2f} |" for k in variants]
    lines += ["", f"target ≤ 1.5×: {'met' if result['target_met'] else 'NOT met'}"]
    atomic_write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))  # noqa: T201 - a script
    return result


if __name__ == "__main__":
    main()
