"""Cost of loading a model on the ``transformer_lens`` backend, side by side with booting the TransformerBridge
directly, in one run (issue #34: it was 8.4x slower on SmolLM2).

Variants, each a fresh load of ``zoo:smollm2-135m`` followed by one forward of a short prompt (the first forward
pages the weights in, for every variant alike):

* ``bridge``: ``TransformerBridge.boot_transformers(folder)`` + ``enable_compatibility_mode(no_processing=True)``,
  what a TransformerLens user writes;
* ``interp transformer_lens``: ``interp.load(..., backend="transformer_lens")`` (boots the same bridge around the
  HF model, then finds which hook points fire with one probe forward);
* ``interp torch``: ``interp.load(..., backend="torch")``, for reference.

And the cost that was removed: the probe forward with one string hook per hook name (how interp found the
firing hooks before: a bridge rebuilds its whole ``hook_dict``, aliases included, for every string hook it is
given) against one filter hook (now), on an already loaded bridge.

Measure: process CPU time (the machine is shared), medians of interleaved rounds; ratios against ``bridge``.
Run: ``.venv/bin/python benchmarks/speed/loading.py [--reps 3]``; writes ``results/loading.{json,md}``.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch

import interp
from interp.io import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "When Mary and John went to the store"


def _cpu(fn) -> float:
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def main(reps: int = 3, spec: str = "zoo:smollm2-135m") -> dict:
    from transformer_lens.model_bridge import TransformerBridge

    folder = interp.load(spec, backend="torch").hf_model.config._name_or_path

    def bridge():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b = TransformerBridge.boot_transformers(folder, device="cpu")
            b.enable_compatibility_mode(no_processing=True)
            b(PROMPT)

    def tl_backend():
        interp.load(spec, backend="transformer_lens")(PROMPT)

    def torch_backend():
        interp.load(spec, backend="torch")(PROMPT)

    loads = {"bridge": bridge, "interp transformer_lens": tl_backend, "interp torch": torch_backend}
    for fn in loads.values():  # warm-up: imports, the OS file cache
        fn()
    times: dict[str, list[float]] = {k: [] for k in loads}
    for _ in range(reps):
        for name, fn in loads.items():
            times[name].append(_cpu(fn))

    # the probe forward that finds the firing hooks: one string hook per name (before) vs one filter hook (now)
    m = interp.load(spec, backend="transformer_lens")
    points = [m._points[n] for n in m._names]
    probe = torch.zeros(1, 2, dtype=torch.long)

    def per_name():
        with torch.no_grad(), m._gates_on(m._names):  # attn.hook_result needs use_attn_result
            m.tl.run_with_hooks(probe, fwd_hooks=[(p, lambda t, hook: None) for p in points])

    wanted = set(points)

    def one_filter():
        with torch.no_grad(), m._gates_on(m._names):
            m.tl.run_with_hooks(probe, fwd_hooks=[(wanted.__contains__, lambda t, hook: None)])

    probes = {"probe: one hook per name (before)": per_name, "probe: one filter hook (now)": one_filter}
    for fn in probes.values():
        fn()
    for _ in range(reps):
        for name, fn in probes.items():
            times.setdefault(name, []).append(_cpu(fn))

    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"model": spec, "hook_points": len(points), "reps": reps, "cpu_seconds_median": med,
           "ratio_to_bridge": {k: med[k] / med["bridge"] for k in loads},
           "probe_ratio_before_over_now": med["probe: one hook per name (before)"] / med["probe: one filter hook (now)"],
           "versions": {"torch": torch.__version__, "python": platform.python_version(),
                        "interp": interp.__version__}}
    RESULTS.mkdir(exist_ok=True)
    atomic_write_json(RESULTS / "loading.json", out)
    lines = ["# Loading on the transformer_lens backend vs the bridge booted directly",
             "", f"`{spec}`, load + one forward, process CPU seconds, median of {reps} interleaved rounds. "
             "Regenerate: `.venv/bin/python benchmarks/speed/loading.py`.", "",
             "| variant | CPU s | ratio to bridge |", "|---|---|---|"]
    lines += [f"| {k} | {med[k]:.2f} | {med[k] / med['bridge']:.2f} |" for k in loads]
    lines += ["", f"Finding the firing hooks ({len(points)} hook points), probe forward only:", "",
              "| variant | CPU s |", "|---|---|"]
    lines += [f"| {k} | {med[k]:.2f} |" for k in probes]
    lines += ["", f"One hook per name costs {out['probe_ratio_before_over_now']:.1f}x the single filter hook."]
    atomic_write_text(RESULTS / "loading.md", "\n".join(lines) + "\n")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    print(main(ap.parse_args().reps))
