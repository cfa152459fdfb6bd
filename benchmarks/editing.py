"""Time per edit of each method (TCPE, ROME on the transcoder, ROME on the MLP, constrained fine-tuning) and
transcoder training throughput, on the recipe's shapes (2-layer GPT-2, d_model 64, d_mlp 256, d_tc 1024,
word-level facts vocabulary; weights untrained: timing depends on shapes only).

Edits use 5 sampled context templates, 25 ``compute_v`` steps (no early stop: ``nll_stop=0``), ``C`` precomputed
(reported separately). Median of ``--reps``. sae-lens's own trainer is not compared: sae-lens 6 trains
transcoders only through its ``LanguageModelSAETrainingRunner`` on a HookedTransformer from the hub (no
offline path here). Run: ``.venv/bin/python benchmarks/editing.py``.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    interp.set_progress(False)
    from transformers import GPT2Config, GPT2LMHeadModel

    from interp.editing import (EditConfig, MLPSite, TranscoderSite, TranscoderTrainingConfig,
                                context_templates, fine_tune, rome, second_moment, tcpe, train_transcoder)
    from interp.editing.facts import FactsTask, facts_tokenizer
    task = FactsTask(0)
    tok = facts_tokenizer(task)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=64, n_layer=2, n_head=4, n_inner=256))
    model = interp.wrap(hf.eval(), tok, backend="torch")
    texts = task.texts(2000, seed=1)
    rows = {}
    t = time.perf_counter()
    tc, hist = train_transcoder(model, 0, texts, TranscoderTrainingConfig(d_sae=1024, batch_size=256, text_batch_size=64))
    dt = time.perf_counter() - t
    rows["transcoder_training"] = {"seconds": dt, "tokens": hist.n_tokens, "tokens_per_s": hist.n_tokens / dt}
    t = time.perf_counter()
    C_mlp = second_moment(MLPSite(model, 0), texts)
    C_tc = second_moment(TranscoderSite(model, 0, tc), texts)
    rows["second_moments"] = {"seconds": time.perf_counter() - t}
    cfg = EditConfig(nll_stop=0.0)
    templates = context_templates(model, cfg)
    req = task.request(3, 1, 7)
    methods = {
        "tcpe(tau=0.5)": lambda: tcpe(model, req, 0, tc, tau=0.5, C=C_tc, config=cfg, templates=templates, apply=False),
        "rome_tc": lambda: tcpe(model, req, 0, tc, tau=-1, C=C_tc, config=cfg, templates=templates, apply=False),
        "rome": lambda: rome(model, req, 0, C=C_mlp, config=cfg, templates=templates, apply=False),
        "ft": lambda: fine_tune(model, req, 0, templates=templates[:1]).revert(model),
    }
    for name, fn in methods.items():
        ts = []
        for _ in range(args.reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        rows[name] = {"seconds_per_edit": statistics.median(ts)}
    meta = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__, "threads": 1,
            "load_average": list(__import__("os").getloadavg())}
    atomic_write_json(RESULTS / "editing.json", {"meta": meta, "rows": rows})
    md = ["| what | value |", "|---|---|"] + [f"| {k} | " + ", ".join(f"{a} = {b:.3g}" for a, b in v.items()) + " |"
                                             for k, v in rows.items()]
    atomic_write_text(RESULTS / "editing.md", "\n".join(md) + f"\n\nload average during the run: {meta['load_average']}\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
