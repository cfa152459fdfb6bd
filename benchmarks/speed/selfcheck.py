"""Cost of the load self-check (:mod:`interp.selfcheck`) side by side with loading, on ``zoo:smollm2-135m``.

Variants, each a fresh ``interp.load`` on one thread, in interleaved rounds:

* ``load, check=False`` and ``load, check=True`` on the ``torch`` and the ``transformer_lens`` backends
  (the latter's check adds the Hugging Face module's own forward before the bridge is booted, its oracle);
* ``one HF forward of the probe``: the floor of any check that runs the model once (the probe is
  ``interp.selfcheck.PROBE_SHAPE`` tokens).

Measure: process CPU seconds (the machine is shared), medians of ``--reps`` interleaved rounds; the check's
share is ``(check=True - check=False) / check=False``. The issue's goal was under 5% of load time: a check
that runs one forward of the model cannot be cheaper than that forward, which on a CPU is a sizeable part of
loading a 135M model from the page cache (see the generated table).

Run: ``.venv/bin/python benchmarks/speed/selfcheck.py [--reps 3]``; writes ``results/selfcheck.{json,md}``.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time
import warnings
from pathlib import Path

import torch

import interp
from interp.io import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"
SPEC = "zoo:smollm2-135m"


def _cpu(fn) -> float:
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(reps: int) -> dict:
    from interp.selfcheck import probe_ids

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    interp.load(SPEC, check=False)  # build / page in the weights once, for every variant alike
    variants = {f"{be}, check={c}": (be, c) for be in ("torch", "transformer_lens") for c in (False, True)}
    times: dict[str, list[float]] = {k: [] for k in (*variants, "one HF forward of the probe")}
    check_seconds: dict[str, list[float]] = {be: [] for be in ("torch", "transformer_lens")}
    for _ in range(reps):
        for key, (be, check) in variants.items():
            box = {}
            times[key].append(_cpu(lambda: box.setdefault("m", interp.load(SPEC, backend=be, check=check))))
            if check:
                check_seconds[be].append(box["m"].self_check.seconds)
        m = interp.load(SPEC, check=False)
        ids = probe_ids(m.cfg.d_vocab)
        with torch.no_grad():
            times["one HF forward of the probe"].append(_cpu(lambda: m.hf_model(input_ids=ids)))
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"model": SPEC, "reps": reps, "cpu_seconds_median": med,
           "check_wall_seconds_median": {k: statistics.median(v) for k, v in check_seconds.items()},
           "share_of_load": {be: (med[f"{be}, check=True"] - med[f"{be}, check=False"]) / med[f"{be}, check=False"]
                             for be in ("torch", "transformer_lens")},
           "environment": {"python": platform.python_version(), "torch": torch.__version__,
                           "machine": platform.machine(), "processor": platform.processor(), "threads": 1,
                           "git_commit": _commit()}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_json(RESULTS / "selfcheck.json", out)
    lines = ["# Load self-check cost vs loading", "",
             f"`{SPEC}`, process CPU seconds on one thread, median of {reps} interleaved rounds "
             f"(git {out['environment']['git_commit'][:10]}). Regenerate: `.venv/bin/python benchmarks/speed/selfcheck.py`.",
             "", "| variant | CPU s |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in med.items()]
    lines += ["", "| backend | the check's share of load time |", "|---|---|"]
    lines += [f"| {be} | {100 * s:.0f}% |" for be, s in out["share_of_load"].items()]
    lines += ["", "The check runs the model once on the probe; its floor is the HF forward above. The goal of under 5% "
              "of load time is not met on CPU (see the share): loading maps the weights from the page cache in well "
              "under a second, while one forward of a 135M model on one CPU thread costs a sizeable part of that. "
              "`check=False` skips it."]
    atomic_write_text(RESULTS / "selfcheck.md", "\n".join(lines) + "\n")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    print(main(ap.parse_args().reps))
