"""Complete(d)P sweep with other settings than the recipe's presets: the full preset of ``interp reproduce completep``
with the run settings of issue #22 as options (e.g. the settings before it).

Usage::

    .venv/bin/python -m interp.benchmarks.completep.sweep          # = interp reproduce completep --preset full
    .venv/bin/python -m interp.benchmarks.completep.sweep --stages coord lr
    .venv/bin/python -m interp.benchmarks.completep.sweep --stages lr --grad-clip none --final-gain-eps width \\
        --out before.json                                                       # the settings before issue #22

Every training run is a stage of the toolkit's resumable stages (``interp.stages``), keyed by the config and the
code version: interrupt at any time, and the same command continues. ``--out`` writes the summary, the measured
values and the verdicts as JSON.

``results/completep_sweep.json`` holds the output of the sweep script this module replaced (run of 2026-12-01, 962
CPU-s of training units), with every unit's losses; the numbers in ``docs/models/completep.md`` come from it until
a full record (``interp reproduce completep --preset full --update-record``) is committed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from interp.io import atomic_write_json
from interp.models.completep import FINAL_GAIN_EPS, HParams

from .experiments import STAGES
from .recipe import CompletePRecipe


def _clip(text: str) -> float | None:
    """``--grad-clip`` value: a positive float, or ``none`` for no clipping."""
    if text.lower() == "none":
        return None
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--grad-clip must be positive or 'none', got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    from interp.apps.reproduce import run_recipe

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write summary, measurements and verdicts here (JSON)")
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    ap.add_argument("--grad-clip", type=_clip, default=HParams().grad_clip,
                    help="maximum global gradient norm per model, or 'none' (default: %(default)s, as the reference)")
    ap.add_argument("--final-gain-eps", choices=FINAL_GAIN_EPS, default="reference",
                    help="Adam-epsilon rule of the final LayerNorm gain (default: %(default)s)")
    args = ap.parse_args(argv)
    base = CompletePRecipe.preset("full")
    cfg = dataclasses.replace(base, stages=tuple(args.stages), final_gain_eps=args.final_gain_eps,
                              hp=dataclasses.replace(base.hp, grad_clip=args.grad_clip))
    run = run_recipe("completep", "full", config=cfg)
    rec = run.record
    if rec.error is not None:
        print(rec.error)
        return 1
    doc = {"config": rec.config, "measured": rec.measured, "verdicts": rec.verdicts,
           "summary": rec.tables.get("summary per experiment"), "seconds": rec.seconds}
    if args.out is not None:
        atomic_write_json(args.out, doc)
    print(json.dumps({"measured": rec.measured, "verdicts": {v["id"]: v["verdict"] for v in rec.verdicts}},
                     indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
