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
``hook_resid_post`` of every block). A second table times ``generate`` (greedy, 24 new tokens, batch 4)
with an ``Add`` intervention at ``positions=[-1]`` of ``blocks.3.hook_resid_post`` on each backend
against plain Hugging Face ``generate`` (KV cache, no hooks).

Each variant is timed in interleaved rounds (median of ``--reps``); ratios are to ``hf_raw`` and,
for the interp backends, to the library they wrap. Run: ``.venv/bin/python benchmarks/capture_overhead.py``.
"""
from __future__ import annotations

import argparse
import json
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


def generate_variants(new: int = 24, batch_size: int = 4):
    """Plain HF generate vs interp generate with a steering intervention, each backend."""
    tok_ids = torch.randint(0, 50257, (batch_size, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tok_ids)
    vec = torch.randn(768, generator=torch.Generator().manual_seed(2))
    hf = build()
    models = {"torch": interp.wrap(build(), backend="torch"), "nnsight": interp.wrap(build(), backend="nnsight")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models["transformer_lens"] = interp.wrap(build(), backend="transformer_lens")
    batch = {"input_ids": tok_ids, "attention_mask": mask}
    add = {"blocks.3.hook_resid_post": interp.Add(vec, scale=4.0, positions=[-1])}

    def hf_generate():
        with torch.no_grad():
            hf.generate(input_ids=tok_ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                        do_sample=False, pad_token_id=0, temperature=None, top_p=None, top_k=None)

    def steered(m):
        def run():
            with m.intervene(add):
                m.generate(batch, max_new_tokens=new, stop_at_eos=False, return_text=False)
        return run
    return {"hf_generate": hf_generate, **{f"interp_{k}_steered": steered(m) for k, m in models.items()}}


def _timed(fns, reps: int) -> dict[str, float]:
    for fn in fns.values():
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def measure(batch_size: int, seq: int, reps: int, hooks=HOOK_SETS["mlp+resid_post"]) -> dict[str, float]:
    return _timed(variants(batch_size, seq, hooks), reps)


WRAPS = {"interp_torch": "hf_raw", "interp_nnsight": "nnsight_native", "interp_tl": "tl_native"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    rows = []
    for hook_set, hooks in HOOK_SETS.items():
        for b, s in ((1, 16), (8, 128)):
            med = measure(b, s, args.reps, hooks)
            for name, t in med.items():
                rows.append({"hooks": hook_set, "shape": f"{b}x{s}", "variant": name, "median_ms": round(t * 1e3, 3),
                             "vs_hf_raw": round(t / med["hf_raw"], 3),
                             "vs_wrapped_library": round(t / med[WRAPS[name]], 3) if name in WRAPS else None})
    gen = _timed(generate_variants(), max(3, args.reps // 3))
    gen_rows = [{"variant": k, "median_ms": round(v * 1e3, 1), "vs_hf_generate": round(v / gen["hf_generate"], 3)}
                for k, v in gen.items()]
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
            "reps": args.reps}
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_json(RESULTS / "capture_overhead.json", {"meta": meta, "rows": rows, "generate": gen_rows})
    lines = ["| hooks | shape | variant | median ms | vs HF raw | vs wrapped library |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['hooks']} | {r['shape']} | {r['variant']} | {r['median_ms']} | {r['vs_hf_raw']:.3f} | "
                     f"{'' if r['vs_wrapped_library'] is None else format(r['vs_wrapped_library'], '.3f')} |")
    lines += ["", "Generation (batch 4, 12-token prompts, 24 new tokens, greedy; interp with an Add at "
              "positions=[-1] of blocks.3.hook_resid_post):", "",
              "| variant | median ms | vs HF generate |", "|---|---|---|"]
    lines += [f"| {r['variant']} | {r['median_ms']} | {r['vs_hf_generate']:.3f} |" for r in gen_rows]
    table = "\n".join(lines)
    atomic_write_text(RESULTS / "capture_overhead.md", f"# Capture overhead\n\n{json.dumps(meta)}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
