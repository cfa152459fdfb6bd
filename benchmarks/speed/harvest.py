"""Activation-store benchmarks (issue #13), ratios side by side in one run.

1. Throughput on ``zoo:smollm2-135m``, residual stream of 4 layers (blocks 2, 5, 8, 11), KJV verses packed
   into 128-token contexts, batch 8, one torch thread:
   - ``harvest`` (tokenize + pack + forward to block 11 + write shards with checksums), tokens/s;
   - a plain forward loop over the same contexts that discards the activations: (a) the full model
     (``model(ids)``), (b) the capture layer stopped at the same depth (``run_with_cache(..., stop_at_layer=12)``);
   - sae-lens's ``CacheActivationsRunner`` on the same model folder (``AutoModelForCausalLM`` proxy, offline),
     data and context size, for one hook (``model.layers.11``; it caches one hook per run).
2. Peak memory (RSS, in a fresh subprocess) of a harvest whose store is more than 10x the memory it uses
   (a tiny 4-layer Llama, d_model 256, all residual streams; the model is tiny so the store can be big).
3. Ray engine, 2 workers (1 thread each) vs the local engine on the same harvest, including start-up.

``python benchmarks/speed/harvest.py [--tokens 8192] [--skip-sae-lens] [--skip-ray]`` writes
``benchmarks/speed/results/harvest.json`` and ``benchmarks/speed/results/harvest.md``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("INTERP_PROGRESS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

import interp  # noqa: E402
from interp import zoo  # noqa: E402
from interp.store import ActivationStore, harvest, pack, tokenized  # noqa: E402
from interp.store.sources import open_source  # noqa: E402

RESULTS = Path(__file__).parent / "results"
LAYERS = (2, 5, 8, 11)
NAMES = [f"blocks.{l}.hook_resid_post" for l in LAYERS]
CTX, BATCH = 128, 8


def corpus(folder: Path) -> Path:
    from interp.data import kjv_text

    path = folder / "kjv.txt"
    path.write_text(kjv_text(), encoding="utf-8")
    return path


def contexts(model, data: Path, n_ctx: int) -> torch.Tensor:
    tok = model.tokenizer
    stream = pack(tokenized(open_source(data).documents(), tok), CTX, tok.bos_token_id, tok.bos_token_id)
    return torch.from_numpy(__import__("numpy").stack([c.tokens for c in itertools.islice(stream, n_ctx)]))


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def throughput(tmp: Path, data: Path, n_tokens: int, skip_sae_lens: bool) -> dict:
    model = interp.load("zoo:smollm2-135m")
    n_ctx = n_tokens // CTX
    ids = contexts(model, data, n_ctx)
    model(ids[:1])  # warm-up
    out: dict = {"tokens": n_ctx * CTX, "names": NAMES, "context_size": CTX, "batch_size": BATCH}

    def loop_full():
        with torch.no_grad():
            for i in range(0, n_ctx, BATCH):
                model(ids[i:i + BATCH])

    def loop_capture():
        for i in range(0, n_ctx, BATCH):
            model.run_with_cache(ids[i:i + BATCH], names=NAMES, stop_at_layer=max(LAYERS) + 1)

    res = {}
    res["harvest"] = timed(lambda: harvest(model, data, NAMES, tmp / "store", context_size=CTX, batch_size=BATCH,
                                           max_tokens=n_ctx * CTX, shard_mb=32))
    res["loop_stop_at_12"] = timed(loop_capture)
    res["loop_full_model"] = timed(loop_full)
    store = ActivationStore(tmp / "store")
    assert len(store) == n_ctx * CTX
    out["store_bytes"] = sum(e["bytes"] for e in store.shards)
    out["seconds"] = res
    out["tokens_per_s"] = {k: n_ctx * CTX / v for k, v in res.items()}
    out["harvest_vs_loop_stop_at_12"] = res["loop_stop_at_12"] / res["harvest"]
    out["harvest_vs_loop_full_model"] = res["loop_full_model"] / res["harvest"]
    if not skip_sae_lens:
        out["sae_lens"] = sae_lens_runner(tmp, data, n_ctx * CTX)
        if "seconds" in out["sae_lens"]:
            sl = out["sae_lens"]
            out["harvest_vs_sae_lens_1_hook"] = sl["tokens_per_s"] and out["tokens_per_s"]["harvest"] / sl["tokens_per_s"]
    return out


def sae_lens_runner(tmp: Path, data: Path, n_tokens: int) -> dict:
    try:
        from sae_lens import CacheActivationsRunner, CacheActivationsRunnerConfig

        ds = tmp / "sl_data"
        ds.mkdir()
        with open(ds / "train.jsonl", "w", encoding="utf-8") as fh:
            for line in data.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    fh.write(json.dumps({"text": line}) + "\n")
        cfg = CacheActivationsRunnerConfig(
            dataset_path=str(ds), model_name=str(zoo.path("smollm2-135m")), model_class_name="AutoModelForCausalLM",
            model_batch_size=BATCH, hook_name="model.layers.11", d_in=576, training_tokens=n_tokens,
            context_size=CTX, new_cached_activations_path=str(tmp / "sl_cache"), device="cpu", shuffle=False,
            dtype="float32", streaming=False, buffer_size_gb=0.05)
        runner = CacheActivationsRunner(cfg)
        secs = timed(runner.run)
        import datasets
        cached = datasets.load_from_disk(str(tmp / "sl_cache"))
        toks = cached.num_rows * CTX
        return {"ok": True, "seconds": secs, "tokens": toks, "tokens_per_s": toks / secs, "hooks": 1,
                "note": "one hook per run (model.layers.11 output = blocks.11.hook_resid_post); full 30-layer forward; "
                        "4 hooks need 4 runs"}
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


MEMORY_SCRIPT = textwrap.dedent("""
    import json, re, sys, time, torch

    def hwm():  # peak resident set of this process (VmHWM; ru_maxrss would include the parent's at fork)
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024

    torch.set_num_threads(1)
    import interp
    from interp.testing import tiny_model
    from interp.store import harvest
    hf, tok = tiny_model("llama", n_layers=4, d_model=256, n_heads=4)
    m = interp.wrap(hf, tok)
    gen = torch.Generator().manual_seed(0)
    docs = torch.randint(0, 256, (int(sys.argv[2]), 1000), generator=gen)
    m(docs[:2, :128])
    before = hwm()
    with open("/proc/self/clear_refs", "w") as fh:  # reset the peak: what follows is the harvest's own peak
        fh.write("5")
    rss_start = hwm()
    t0 = time.perf_counter()
    res = harvest(m, docs, "blocks.*.hook_resid_post", sys.argv[1], context_size=128, batch_size=16, shard_mb=16)
    secs = time.perf_counter() - t0
    during = hwm()
    print(json.dumps({"rss_before": before, "rss_at_start": rss_start, "rss_peak_during": during,
                      "rss_peak": max(before, during), "tokens": res.n_tokens, "seconds": secs,
                      "store_bytes": sum(e["bytes"] for e in res.shards), "shards": res.n_shards}))
""")


def memory(tmp: Path, n_docs: int) -> dict:
    p = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(tmp / "mem"), str(n_docs)], capture_output=True,
                       text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["harvest_rss_increase"] = r["rss_peak_during"] - r["rss_at_start"]
    r["store_over_peak_rss"] = r["store_bytes"] / r["rss_peak"]
    r["store_over_harvest_rss_increase"] = r["store_bytes"] / max(r["harvest_rss_increase"], 1)
    shutil.rmtree(tmp / "mem", ignore_errors=True)
    return r


def ray_vs_local(tmp: Path, data: Path, n_tokens: int) -> dict:
    import ray

    spec = "zoo:smollm2-135m"
    local = timed(lambda: harvest(spec, data, NAMES, tmp / "local", context_size=CTX, batch_size=BATCH,
                                  max_tokens=n_tokens, shard_mb=8))
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "INTERP_PROGRESS": "0"}})
    init_s = time.perf_counter() - t0
    try:
        dist = timed(lambda: harvest(spec, data, NAMES, tmp / "ray", context_size=CTX, batch_size=BATCH,
                                     max_tokens=n_tokens, shard_mb=8, engine="ray", num_workers=2))
    finally:
        ray.shutdown()
    same = all((tmp / "ray" / e["file"]).read_bytes() == (tmp / "local" / e["file"]).read_bytes()
               for e in ActivationStore(tmp / "local").shards)
    return {"tokens": n_tokens // CTX * CTX, "local_s": local, "ray_init_s": init_s, "ray_harvest_s": dist,
            "ray_over_local": (init_s + dist) / local, "identical_shards": same,
            "note": "local includes loading the model once; ray includes 2 workers each loading it"}


def write_md(r: dict) -> str:
    t = r["throughput"]
    lines = [f"# Harvest benchmark ({r['date']}, {r['machine']})", "",
             f"Command: `{r['command']}`", "",
             f"## Throughput: zoo:smollm2-135m, {len(NAMES)} residual streams (blocks {', '.join(map(str, LAYERS))}), "
             f"{t['tokens']} tokens, context {CTX}, batch {BATCH}, 1 thread", "",
             "| method | seconds | tokens/s | harvest speed ratio |", "|---|---|---|---|"]
    for k, label in (("harvest", "interp harvest (forward to block 11 + write + sha256)"),
                     ("loop_stop_at_12", "plain loop, capture stopped at block 12, discard"),
                     ("loop_full_model", "plain loop, full model forward, discard")):
        ratio = t["seconds"][k] / t["seconds"]["harvest"]
        lines.append(f"| {label} | {t['seconds'][k]:.1f} | {t['tokens_per_s'][k]:.0f} | {ratio:.2f}x |")
    sl = t.get("sae_lens")
    if sl and sl.get("ok"):
        lines.append(f"| sae-lens CacheActivationsRunner, 1 hook (model.layers.11), full forward | {sl['seconds']:.1f} "
                     f"| {sl['tokens_per_s']:.0f} | {t['tokens_per_s']['harvest'] / sl['tokens_per_s']:.2f}x |")
    elif sl:
        lines.append(f"| sae-lens CacheActivationsRunner | failed: {sl['error']} | | |")
    lines += ["", "Ratio = (method's seconds per token) / (harvest's): > 1 means the harvest is faster. The harvest's "
              "own goal is >= 0.9x the plain loop that runs the same forward (stopped after block 11) and discards "
              "the activations. sae-lens's runner caches one hook per run and runs the whole 30-layer model (its "
              "HF proxy has no early stop), so for the same 4 hooks it needs 4 runs (4x its time). The machine "
              "was shared (load average 13-15 on 2 cores): absolute tokens/s are low and noisy, the methods ran "
              "back to back.",
              f"Store written: {t['store_bytes'] / 2**20:.0f} MiB.", ""]
    m = r.get("memory")
    if m:
        lines += ["## Peak memory", "",
                  f"Tiny 4-layer Llama (d 256), all residual streams, {m['tokens']} tokens, 16 MiB shards: store "
                  f"{m['store_bytes'] / 2**20:.0f} MiB in {m['shards']} shards, process peak RSS "
                  f"{m['rss_peak'] / 2**20:.0f} MiB ({m['rss_at_start'] / 2**20:.0f} MiB resident when the harvest "
                  f"started: Python, torch, model, corpus); peak while harvesting {m['rss_peak_during'] / 2**20:.0f} MiB, "
                  f"so the harvest itself used {m['harvest_rss_increase'] / 2**20:.0f} MiB: store / whole-process peak = "
                  f"{m['store_over_peak_rss']:.1f}x, store / harvest's own memory = "
                  f"{m['store_over_harvest_rss_increase']:.0f}x ({m['tokens'] / m['seconds']:.0f} tokens/s).", ""]
    ry = r.get("ray")
    if ry:
        lines += ["## Ray, 2 workers vs local engine (same harvest, 2-core machine)", "",
                  "| engine | seconds |", "|---|---|",
                  f"| local (load model + harvest) | {ry['local_s']:.1f} |",
                  f"| ray.init(num_cpus=2) | {ry['ray_init_s']:.1f} |",
                  f"| ray engine, 2 actors (each loads the model) | {ry['ray_harvest_s']:.1f} |", "",
                  f"Ray / local = {ry['ray_over_local']:.2f}x ({ry['tokens']} tokens); shards byte-identical to the "
                  f"local run: {ry['identical_shards']}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--ray-tokens", type=int, default=4096)
    ap.add_argument("--memory-docs", type=int, default=1200)
    ap.add_argument("--skip-sae-lens", action="store_true")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--only-memory", action="store_true", help="rerun only section 2, merged into the saved results")
    args = ap.parse_args()
    if args.only_memory:
        tmp = Path(tempfile.mkdtemp(prefix="interp-bench-harvest-"))
        try:
            r = json.loads((RESULTS / "harvest.json").read_text())
            r["memory"] = memory(tmp, args.memory_docs)
            r["command"] += f" ; python benchmarks/speed/harvest.py --only-memory --memory-docs {args.memory_docs}"
            (RESULTS / "harvest.json").write_text(json.dumps(r, indent=2))
            (RESULTS / "harvest.md").write_text(write_md(r))
            print(write_md(r))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    tmp = Path(tempfile.mkdtemp(prefix="interp-bench-harvest-"))
    try:
        data = corpus(tmp)
        r = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
             "command": "python benchmarks/speed/harvest.py " + " ".join(sys.argv[1:])}
        r["throughput"] = throughput(tmp, data, args.tokens, args.skip_sae_lens)
        print(json.dumps(r["throughput"], indent=1), flush=True)
        r["memory"] = memory(tmp, args.memory_docs)
        print(json.dumps(r["memory"], indent=1), flush=True)
        if not args.skip_ray:
            r["ray"] = ray_vs_local(tmp, data, args.ray_tokens)
            print(json.dumps(r["ray"], indent=1), flush=True)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "harvest.json").write_text(json.dumps(r, indent=2))
        (RESULTS / "harvest.md").write_text(write_md(r))
        print(write_md(r))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
