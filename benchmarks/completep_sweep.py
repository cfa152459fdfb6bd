"""Full CPU-scale Complete(d)P sweep: coordinate check, LR transfer (width 64->256, depth 2->8, SP vs CompleteP),
batch-size and duration rules, per-module multipliers (search at the proxy, transfer to 4x width).

Usage (from the repository root)::

    .venv/bin/python benchmarks/completep_sweep.py                 # everything, ~15-20 CPU minutes
    .venv/bin/python benchmarks/completep_sweep.py --stages coord lr
    .venv/bin/python benchmarks/completep_sweep.py --stages lr --grad-clip none --final-gain-eps width \
        --out /tmp/before.json                                     # the settings before issue #22

Every training run is a unit stored in ``benchmarks/results/completep_sweep.json`` as soon as it finishes
(written atomically: a temporary file renamed over the old one). Interrupt at any time; running the same
command again skips the finished units and continues. The final file also holds the summary (measured
numbers and pass flags) and the total CPU seconds of all units; after a run of every stage, units that the
current configuration no longer uses (e.g. from older settings) are dropped.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from interp.io import atomic_write_json  # noqa: E402
from interp.models.completep import FINAL_GAIN_EPS, CompletePConfig, HParams, experiment  # noqa: E402
from interp.models.completep.experiments import STAGES  # noqa: E402


class TrackingStore(dict):
    """The unit store, remembering which units this configuration reads or writes (to drop stale ones)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.used: set[str] = set()

    def __getitem__(self, key: str):
        self.used.add(key)
        return super().__getitem__(key)

    def __setitem__(self, key: str, value) -> None:
        self.used.add(key)
        super().__setitem__(key, value)


def _clip(text: str) -> float | None:
    """``--grad-clip`` value: a positive float, or ``none`` for no clipping."""
    if text.lower() == "none":
        return None
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--grad-clip must be positive or 'none', got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "completep_sweep.json")
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1 is fastest on a shared 2-core machine)")
    ap.add_argument("--grad-clip", type=_clip, default=HParams().grad_clip,
                    help="maximum global gradient norm per model, or 'none' (default: %(default)s, as the reference)")
    ap.add_argument("--final-gain-eps", choices=FINAL_GAIN_EPS, default="reference",
                    help="Adam-epsilon rule of the final LayerNorm gain (default: %(default)s)")
    ap.add_argument("--figure", type=Path, default=None, help="also write the plotly figure as HTML here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    units = TrackingStore(doc.get("units", {}))
    cfg = CompletePConfig(stages=tuple(args.stages), final_gain_eps=args.final_gain_eps,
                          hp=HParams(grad_clip=args.grad_clip))
    started = time.time()

    def save(store: dict, **extra) -> None:
        atomic_write_json(args.out, {"config": cfg.to_dict(), "units": dict(store), **extra})

    result = experiment(cfg, store=units, on_update=lambda store: save(store, status="running"))
    if set(args.stages) == set(STAGES):  # a complete run: keep only the units of this configuration
        units = {k: v for k, v in units.items() if k in units.used}
    cpu = sum(float(u.get("cpu_seconds", 0.0)) for u in units.values())
    save(units, status="complete", summary=result.summary, cpu_seconds_total=cpu,
         wall_seconds_this_invocation=time.time() - started)
    if args.figure is not None:
        result.figure().write_html(str(args.figure))
    print(json.dumps(result.summary, indent=2, default=str))
    print(f"total CPU seconds over all units: {cpu:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
