"""Cost of the hook points inside attention (``backends/attention.py``), side by side in one run.

Two questions, each answered by ratios of medians of interleaved rounds:

1. **The plain path is unchanged**: with none of ``attn.hook_rot_q/rot_k/attn_scores/pattern`` hooked, the
   torch and nnsight backends leave the model on its own attention implementation (sdpa here), so
   ``run_with_cache`` of every block's ``hook_resid_post`` + ``hook_mlp_out`` costs what it cost before
   (``benchmarks/speed/capture_overhead.py`` measures the same variants; the ratios here are re-measured in the
   same process as the rows below).
2. **Pattern/scores hooked**: interp's hook-calling attention (``run_with_cache`` of every block's
   ``attn.hook_pattern``, or of ``hook_attn_scores`` + ``hook_pattern``, or of rotated q/k) against the
   way one gets attention weights from Hugging Face directly: eager attention with
   ``output_attentions=True``.

Models: the 6-layer GPT-2 of ``capture_overhead.py`` (d_model 768, 12 heads) and a 6-layer Llama of the
same width (12 heads, 4 key/value heads: rotary, grouped-query attention), random weights, built offline.
Run: ``.venv/bin/python benchmarks/speed/attention_hooks.py [--reps 7] [--shapes 1x16,4x64] [--tag _long]``; writes
``results/attention_hooks<tag>.{json,md}``. At these widths the 50,257-token unembedding dominates short
inputs; ``--shapes 2x256 --tag _long`` weighs attention more.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import interp
from interp.io import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def _timed(fns, reps: int) -> dict[str, float]:
    """Interleaved rounds (two warm-up calls each); per variant the median CPU time of the process, seconds
    (CPU time, not wall time: the machine is shared, and the benchmark runs single-threaded)."""
    for fn in fns.values():
        fn()
        fn()
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            c0 = time.process_time()
            fn()
            cpu[name].append(time.process_time() - c0)
    return {k: statistics.median(v) for k, v in cpu.items()}


def build_gpt2(seed: int = 0):
    """The 6-layer GPT-2 of ``capture_overhead.py``."""
    import transformers as T

    cfg = T.GPT2Config(n_layer=6, n_embd=768, n_head=12, vocab_size=50257, n_positions=256,
                       architectures=["GPT2LMHeadModel"])
    torch.manual_seed(seed)
    return T.GPT2LMHeadModel(cfg).eval()


def build_llama(seed: int = 0):
    import transformers as T

    cfg = T.LlamaConfig(num_hidden_layers=6, hidden_size=768, num_attention_heads=12, num_key_value_heads=4,
                        intermediate_size=2048, vocab_size=50257, max_position_embeddings=256,
                        architectures=["LlamaForCausalLM"])
    torch.manual_seed(seed)
    return T.LlamaForCausalLM(cfg).eval()


def variants(arch: str, batch_size: int, seq: int):
    build = build_gpt2 if arch == "gpt2" else build_llama
    hf = build()
    hf.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 50257, (batch_size, seq), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    pos = torch.arange(seq)[None].expand(batch_size, seq)
    batch = {"input_ids": ids, "attention_mask": mask}
    m_torch = interp.wrap(hf, backend="torch")
    m_nn = interp.wrap(build(), backend="nnsight")
    plain = [f"blocks.{l}.{h}" for l in range(6) for h in ("hook_mlp_out", "hook_resid_post")]
    pattern = [f"blocks.{l}.attn.hook_pattern" for l in range(6)]
    scores = [f"blocks.{l}.attn.hook_{h}" for l in range(6) for h in ("attn_scores", "pattern")]
    rot = [f"blocks.{l}.attn.hook_rot_{h}" for l in range(6) for h in ("q", "k")]

    def hf_raw():
        with torch.no_grad():
            hf(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)

    def hf_eager_attentions():
        hf.config._attn_implementation = "eager"
        try:
            with torch.no_grad():
                hf(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, output_attentions=True)
        finally:
            hf.config._attn_implementation = "sdpa"

    fns = {"hf_raw": hf_raw,
           "interp_torch_plain": lambda: m_torch.run_with_cache(batch, names=plain),
           "interp_nnsight_plain": lambda: m_nn.run_with_cache(batch, names=plain),
           "hf_eager_output_attentions": hf_eager_attentions,
           "interp_torch_pattern": lambda: m_torch.run_with_cache(batch, names=pattern),
           "interp_nnsight_pattern": lambda: m_nn.run_with_cache(batch, names=pattern),
           "interp_torch_scores+pattern": lambda: m_torch.run_with_cache(batch, names=scores)}
    if arch == "llama":
        fns["interp_torch_rot_q+rot_k"] = lambda: m_torch.run_with_cache(batch, names=rot)
    return fns


REFERENCE = {"interp_torch_plain": "hf_raw", "interp_nnsight_plain": "hf_raw",
             "interp_torch_pattern": "hf_eager_output_attentions", "interp_nnsight_pattern": "hf_eager_output_attentions",
             "interp_torch_scores+pattern": "hf_eager_output_attentions",
             "interp_torch_rot_q+rot_k": "hf_eager_output_attentions", "hf_eager_output_attentions": "hf_raw"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--shapes", default="1x16,4x64")
    ap.add_argument("--tag", default="", help="suffix of the result files (attention_hooks<tag>.md/json)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    rows = []
    for arch in ("gpt2", "llama"):
        for shape in args.shapes.split(","):
            b, s = (int(v) for v in shape.split("x"))
            med = _timed(variants(arch, b, s), args.reps)
            for name, t in med.items():
                ref = REFERENCE.get(name)
                rows.append({"model": arch, "shape": shape, "variant": name, "median_ms": round(t * 1e3, 3),
                             "vs_hf_raw": round(t / med["hf_raw"], 3), "reference": ref,
                             "vs_reference": round(t / med[ref], 3) if ref else None})
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "timer": "process CPU time, median",
            "machine": platform.processor() or platform.machine(), "reps": args.reps,
            "load_after": "/".join(f"{x:.1f}" for x in os.getloadavg())}
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_json(RESULTS / f"attention_hooks{args.tag}.json", {"meta": meta, "rows": rows})
    lines = ["| model | shape | variant | median ms | vs HF raw (sdpa) | reference | vs reference |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['shape']} | {r['variant']} | {r['median_ms']} | {r['vs_hf_raw']:.3f} | "
                     f"{r['reference'] or ''} | {'' if r['vs_reference'] is None else format(r['vs_reference'], '.3f')} |")
    table = "\n".join(lines)
    atomic_write_text(RESULTS / f"attention_hooks{args.tag}.md", f"# Attention hook points: cost\n\n{json.dumps(meta)}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
