"""Throughput of the planning probe: plug-in MI against sklearn, and set VQ-VAE training.

* **MI estimator** -- :func:`interp.probes.planning.mutual_information` (vectorised ``bincount`` / sorted
  counts over relabelled codes) against ``sklearn.metrics.mutual_info_score`` (contingency matrix) on the
  same code pairs, in interleaved rounds (median of ``--reps``), for several ``N`` and ``K``; the two
  values must agree to 1e-9. Also the shuffled-null cost (20 permutations) of ours.
* **VQ-VAE training** -- sets per second of :func:`train_vqvae` steps for the estimator-toy sets (2..6
  states of 16 dims), prefix-like sets (42 states of 128 dims, the horizon toy's ``H``) and sets the size of
  the horizon's ``H`` on SmolLM2-135M (870 states of 576 dims: what makes the default ``horizon_curve`` hours on
  CPU there), batch 128.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/planning.py``. Writes ``benchmarks/speed/results/planning.json``
and ``planning.md`` (speeds are side-by-side ratios on one machine, one thread, in process CPU time).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from interp.io import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def _time(fn, reps: int) -> list[float]:
    """CPU seconds of the process per call (``time.process_time``: on a shared machine, wall-clock timings of
    long calls are inflated by preemption far more than those of short calls; CPU time is not)."""
    out = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        out.append(time.process_time() - t)
    return out


def bench_mi(sizes, ks, reps: int) -> list[dict]:
    from sklearn.metrics import mutual_info_score

    from interp.probes.planning import mutual_information, shuffled_null

    rows = []
    for n in sizes:
        for k in ks:
            rng = np.random.default_rng(0)
            a = rng.integers(0, k, n)
            b = (a + rng.integers(0, max(2, k // 8), n)) % k
            ours_v, ref_v = mutual_information(a, b), mutual_info_score(a, b)
            assert abs(ours_v - ref_v) < 1e-9, (ours_v, ref_v)
            ours, ref = [], []
            for _ in range(reps):  # interleaved
                ours += _time(lambda: mutual_information(a, b), 1)
                ref += _time(lambda: mutual_info_score(a, b), 1)
            null = _time(lambda: shuffled_null(a, b, n_perm=20), 1)[0]
            mo, mr = statistics.median(ours), statistics.median(ref)
            rows.append({"n": n, "k": k, "ours_ms": 1e3 * mo, "sklearn_ms": 1e3 * mr, "speedup": mr / mo,
                         "null20_ms": 1e3 * null, "mi": ours_v})
    return rows


#: (label, number of sets, states per set (None: 2-6), state size, layers the states come from)
VQVAE_SETS = (("toy sets (2-6 x 16)", 2000, None, 16, 3), ("prefix sets (42 x 128)", 2000, 42, 128, 3),
              # the horizon's H on SmolLM2-135M: 29 layers x the built-in TextContinuation's prompts (30 tokens on average)
              ("SmolLM2-135M H sets (870 x 576)", 256, 870, 576, 29))


def bench_vqvae(steps: int, large_steps: int) -> list[dict]:
    from interp.probes.planning import StateSets, train_vqvae

    rows = []
    gen = torch.Generator().manual_seed(0)
    for label, n, size, d, n_layers in VQVAE_SETS:
        sets = []
        for _ in range(n):
            m = int(torch.randint(2, 7, (1,), generator=gen)) if size is None else size
            sets.append((torch.randn(m, d, generator=gen), torch.arange(m) % n_layers, torch.arange(m) // n_layers))
        ss = StateSets.from_list(sets)
        k = steps if size is None or size < 500 else large_steps
        t = time.process_time()
        train_vqvae(ss, {"n_codes": 32}, {"steps": k, "eval_every": k + 1, "batch_size": 128})
        dt = time.process_time() - t
        rows.append({"sets": label, "steps": k, "seconds": dt, "sets_per_s": k * 128 / dt, "seconds_per_step": dt / k})
    return rows


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--large-steps", type=int, default=3, help="steps on the SmolLM2-size sets (~25 CPU-s each)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    mi_rows = bench_mi([10_000, 100_000, 1_000_000], [16, 256, 4096], args.reps)
    vq_rows = bench_vqvae(args.steps, args.large_steps)
    res = {"machine": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(),
           "mi": mi_rows, "vqvae": vq_rows}
    RESULTS.mkdir(exist_ok=True)
    atomic_write_json(RESULTS / "planning.json", res)
    lines = ["# planning probe throughput", "", "`OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/planning.py` "
             f"(one thread, CPU time of the process, median of {args.reps} interleaved rounds; shared machine, so only the ratios matter).", "",
             "## Plug-in MI: ours vs `sklearn.metrics.mutual_info_score` (same codes, values agree to 1e-9)", "",
             "| N | K | ours (ms) | sklearn (ms) | speed-up | ours + 20-permutation null (ms) |", "|---|---|---|---|---|---|"]
    for r in mi_rows:
        lines.append(f"| {r['n']:,} | {r['k']} | {r['ours_ms']:.2f} | {r['sklearn_ms']:.2f} | {r['speedup']:.2f}x | "
                     f"{r['null20_ms']:.1f} |")
    lines += ["", "## Set VQ-VAE training (K = 32, d_model 64, batch 128)", "",
              "| sets | steps | CPU seconds | CPU seconds per step | sets/s |", "|---|---|---|---|---|"]
    for r in vq_rows:
        lines.append(f"| {r['sets']} | {r['steps']} | {r['seconds']:.1f} | {r['seconds_per_step']:.2f} | "
                     f"{r['sets_per_s']:.0f} |")
    atomic_write_text(RESULTS / "planning.md", "\n".join(lines) + "\n")
    return res


if __name__ == "__main__":
    main()
