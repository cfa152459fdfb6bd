"""Capture overhead of each interp backend against the library it wraps, in one run.

Model: a 6-layer GPT-2-shaped model (d_model 768, 12 heads, vocab 50257; random weights, built
offline). Captured hooks: ``hook_resid_post`` and ``hook_mlp_out`` of every block. Variants:

* ``hf_raw``          — plain HF forward, no hooks (the reference, ratio 1.00)
* ``interp_torch``    — interp torch backend ``run_with_cache``
* ``nnsight_native``  — an nnsight trace saving the same module outputs
* ``interp_nnsight``  — interp nnsight backend ``run_with_cache``
* ``tl_native``       — TransformerBridge ``run_with_cache(names_filter=...)``
* ``interp_tl``       — interp transformer_lens backend ``run_with_cache``

Two hook sets: ``mlp+resid_post`` (above) and ``all_resid`` (``hook_resid_pre``, ``hook_resid_mid`` and
``hook_resid_post`` of every block). A second table times ``generate`` (greedy, 24 new tokens, batch 4,
KV cache everywhere) with an ``Add`` intervention at ``positions=[-1]`` of ``blocks.3.hook_resid_post`` on
each backend (torch, nnsight, the TransformerLens bridge, and a HookedTransformer holding the same
weights) against plain Hugging Face ``generate`` and against the library's own cached generation with
the same steering hook (HF ``generate`` + a torch forward hook; HookedTransformer ``generate`` under
``hooks``). The bridge's own ``generate`` is not a reference: with transformers 5.24 its attention does
not read the cache (see docs/architecture.md), so it is fast and wrong.

Each variant is timed in interleaved rounds: every round calls every variant once, so a change of
machine load hits all variants alike. Both the process CPU time (``time.process_time``: robust on a
shared machine, the primary ratio) and the wall time are recorded; the tables give medians over
``--reps`` rounds (1x16), ``--reps-large`` (8x128) and ``--gen-reps`` (generation), and the load average
before and after each section. Run: ``.venv/bin/python benchmarks/speed/capture_overhead.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch

import interp
from interp.io import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def build(seed: int = 0):
    import transformers as T

    cfg = T.GPT2Config(n_layer=6, n_embd=768, n_head=12, vocab_size=50257, n_positions=256,
                       architectures=["GPT2LMHeadModel"])
    torch.manual_seed(seed)
    return T.GPT2LMHeadModel(cfg).eval()


HOOK_SETS = {"mlp+resid_post": ("hook_mlp_out", "hook_resid_post"),
             "all_resid": ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")}


def variants(batch_size: int, seq: int, hooks: tuple[str, ...] = HOOK_SETS["mlp+resid_post"]):
    from nnsight import NNsight

    ids = torch.randint(0, 50257, (batch_size, seq), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    pos = torch.arange(seq)[None].expand(batch_size, seq)
    names = [f"blocks.{l}.{h}" for l in range(6) for h in hooks]
    hf_torch, hf_nn, hf_tl = build(), build(), build()
    m_torch = interp.wrap(hf_torch, backend="torch")
    m_nn = interp.wrap(hf_nn, backend="nnsight")
    nn_native = NNsight(build())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m_tl = interp.wrap(hf_tl, backend="transformer_lens")
    bridge = m_tl.tl
    tl_points = [m_tl._points[n] for n in names]
    batch = {"input_ids": ids, "attention_mask": mask}

    def hf_raw():
        with torch.no_grad():
            hf_torch(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)

    def nnsight_native():
        saved = []
        with torch.no_grad(), nn_native.trace(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False):
            for layer in range(6):
                blk = nn_native.transformer.h[layer]
                if "hook_resid_pre" in hooks:
                    saved.append(blk.input.save())
                if "hook_resid_mid" in hooks:
                    saved.append(blk.ln_2.input.save())
                if "hook_mlp_out" in hooks:
                    saved.append(blk.mlp.c_proj.output.save())
                saved.append(blk.output.save())
            nn_native.output.save()

    def tl_native():
        with torch.no_grad():
            bridge.run_with_cache(ids, attention_mask=mask, names_filter=lambda n: n in tl_points)

    return {
        "hf_raw": hf_raw,
        "interp_torch": lambda: m_torch.run_with_cache(batch, names=names),
        "nnsight_native": nnsight_native,
        "interp_nnsight": lambda: m_nn.run_with_cache(batch, names=names),
        "tl_native": tl_native,
        "interp_tl": lambda: m_tl.run_with_cache(batch, names=names),
    }


def hooked_transformer(hf):
    """A HookedTransformer holding ``hf``'s GPT-2 weights (TransformerLens's own conversion)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    c = hf.config
    cfg = HookedTransformerConfig(n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head,
                                  d_mlp=4 * c.n_embd, n_ctx=c.n_positions, d_vocab=c.vocab_size, act_fn="gelu_new",
                                  normalization_type="LN", eps=c.layer_norm_epsilon, default_prepend_bos=False,
                                  original_architecture="GPT2LMHeadModel")
    ht = HookedTransformer(cfg)
    ht.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    return ht.eval()


def generate_variants(new: int = 24, batch_size: int = 4):
    """Plain HF generate, each library's own cached generate with a steering hook, and interp generate
    with the same steering as an intervention on each backend (all greedy, all with a KV cache)."""
    tok_ids = torch.randint(0, 50257, (batch_size, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tok_ids)
    vec = torch.randn(768, generator=torch.Generator().manual_seed(2))
    hf = build()
    ht = hooked_transformer(build())
    models = {"torch": interp.wrap(build(), backend="torch"), "nnsight": interp.wrap(build(), backend="nnsight")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models["transformer_lens"] = interp.wrap(build(), backend="transformer_lens")
        models["hooked_transformer"] = interp.wrap(hooked_transformer(build()), backend="transformer_lens")
    batch = {"input_ids": tok_ids, "attention_mask": mask}
    add = {"blocks.3.hook_resid_post": interp.Add(vec, scale=4.0, positions=[-1])}

    def hf_generate():
        with torch.no_grad():
            hf.generate(input_ids=tok_ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                        do_sample=False, pad_token_id=0, temperature=None, top_p=None, top_k=None)

    def add_last(module, args, out):  # the steering hook, by hand: the last position of every call
        h = out[0] if isinstance(out, tuple) else out
        h = h.clone()
        h[:, -1] += 4.0 * vec
        return (h, *out[1:]) if isinstance(out, tuple) else h

    def hf_generate_hooked():
        handle = hf.transformer.h[3].register_forward_hook(add_last)
        try:
            hf_generate()
        finally:
            handle.remove()

    def ht_add_last(t, hook):
        t = t.clone()
        t[:, -1] += 4.0 * vec
        return t

    def ht_generate_hooked():
        with torch.no_grad(), ht.hooks(fwd_hooks=[("blocks.3.hook_resid_post", ht_add_last)]):
            ht.generate(tok_ids, max_new_tokens=new, do_sample=False, use_past_kv_cache=True, stop_at_eos=False,
                        verbose=False, return_type="tokens")

    def steered(m):
        def run():
            with m.intervene(add):
                m.generate(batch, max_new_tokens=new, stop_at_eos=False, return_text=False)
        return run
    return {"hf_generate": hf_generate, "hf_generate_hooked": hf_generate_hooked,
            "ht_generate_hooked": ht_generate_hooked, **{f"interp_{k}_steered": steered(m) for k, m in models.items()}}


#: the library call each interp generation row wraps
GEN_WRAPS = {"interp_torch_steered": "hf_generate_hooked", "interp_nnsight_steered": "hf_generate_hooked",
             "interp_transformer_lens_steered": "hf_generate_hooked", "interp_hooked_transformer_steered": "ht_generate_hooked"}


def _timed(fns, reps: int) -> dict[str, dict[str, float]]:
    """Interleaved rounds; per variant the median CPU time (``cpu``) and wall time (``wall``), seconds."""
    for fn in fns.values():
        fn()
        fn()
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {k: {"cpu": statistics.median(cpu[k]), "wall": statistics.median(wall[k])} for k in fns}


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def measure(batch_size: int, seq: int, reps: int, hooks=HOOK_SETS["mlp+resid_post"]) -> dict[str, dict[str, float]]:
    return _timed(variants(batch_size, seq, hooks), reps)


WRAPS = {"interp_torch": "hf_raw", "interp_nnsight": "nnsight_native", "interp_tl": "tl_native"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=41, help="rounds at 1x16")
    ap.add_argument("--reps-large", type=int, default=7, help="rounds at 8x128")
    ap.add_argument("--gen-reps", type=int, default=9, help="rounds of the generation table")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    rows, loads = [], {}
    for hook_set, hooks in HOOK_SETS.items():
        for b, s in ((1, 16), (8, 128)):
            before = _load()
            med = measure(b, s, args.reps if b * s <= 16 else args.reps_large, hooks)
            loads[f"{hook_set} {b}x{s}"] = f"{before} -> {_load()}"
            for name, t in med.items():
                rows.append({"hooks": hook_set, "shape": f"{b}x{s}", "variant": name,
                             "cpu_ms": round(t["cpu"] * 1e3, 3), "wall_ms": round(t["wall"] * 1e3, 3),
                             "vs_hf_raw": round(t["cpu"] / med["hf_raw"]["cpu"], 3),
                             "vs_wrapped_library": round(t["cpu"] / med[WRAPS[name]]["cpu"], 3) if name in WRAPS else None,
                             "wall_vs_wrapped_library": round(t["wall"] / med[WRAPS[name]]["wall"], 3) if name in WRAPS else None})
            print(f"{hook_set} {b}x{s} done (load {loads[f'{hook_set} {b}x{s}']})", flush=True)
    before = _load()
    gen = _timed(generate_variants(), args.gen_reps)
    loads["generate"] = f"{before} -> {_load()}"
    gen_rows = [{"variant": k, "cpu_ms": round(v["cpu"] * 1e3, 1), "wall_ms": round(v["wall"] * 1e3, 1),
                 "vs_hf_generate": round(v["cpu"] / gen["hf_generate"]["cpu"], 3),
                 "vs_wrapped_library": round(v["cpu"] / gen[GEN_WRAPS[k]]["cpu"], 3) if k in GEN_WRAPS else None,
                 "wall_vs_wrapped_library": round(v["wall"] / gen[GEN_WRAPS[k]]["wall"], 3) if k in GEN_WRAPS else None}
                for k, v in gen.items()]
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "reps": args.reps, "reps_large": args.reps_large, "gen_reps": args.gen_reps,
            "load_1_5_15_min": loads, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_json(RESULTS / "capture_overhead.json", {"meta": meta, "rows": rows, "generate": gen_rows})
    fmt = lambda x: "" if x is None else format(x, ".3f")  # noqa: E731
    lines = ["| hooks | shape | variant | CPU ms | wall ms | vs HF raw (CPU) | vs wrapped library (CPU) | (wall) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['hooks']} | {r['shape']} | {r['variant']} | {r['cpu_ms']} | {r['wall_ms']} | {r['vs_hf_raw']:.3f} | "
                     f"{fmt(r['vs_wrapped_library'])} | {fmt(r['wall_vs_wrapped_library'])} |")
    lines += ["", "Generation (batch 4, 12-token prompts, 24 new tokens, greedy, KV cache everywhere; steering: an Add "
              "of 4*v at positions=[-1] of blocks.3.hook_resid_post, as an interp intervention or as a hand-written "
              "hook):", "",
              "| variant | CPU ms | wall ms | vs HF generate (CPU) | vs wrapped library + hook (CPU) | (wall) |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['cpu_ms']} | {r['wall_ms']} | {r['vs_hf_generate']:.3f} | {fmt(r['vs_wrapped_library'])} | "
              f"{fmt(r['wall_vs_wrapped_library'])} |" for r in gen_rows]
    lines += ["", "Load average (1/5/15 min) before -> after each section: " +
              "; ".join(f"{k}: {v}" for k, v in loads.items())]
    table = "\n".join(lines)
    atomic_write_text(RESULTS / "capture_overhead.md", f"# Capture overhead\n\n{json.dumps({k: v for k, v in meta.items() if k != 'load_1_5_15_min'})}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
