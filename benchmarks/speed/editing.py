"""Time per edit of each method (TCPE, ROME on the transcoder, ROME on the MLP, constrained fine-tuning) and
transcoder training throughput, on the recipe's shapes (2-layer GPT-2, d_model 64, d_mlp 256, d_tc 1024,
word-level facts vocabulary; weights untrained: timing depends on shapes only).

Edits use 5 sampled context templates, 25 ``compute_v`` steps (no early stop: ``nll_stop=0``), ``C`` precomputed
(reported separately). Median of ``--reps``; each method's time is also given as a ratio to ROME on the MLP
(same run, same machine load). TCPE with several τ shares one ``compute_v`` (``restrict``): its marginal cost per
extra τ is the mask alone (``tcpe_extra_tau``).

Transcoder training throughput, side by side on the same activation store (harvested once with
``interp.store.harvest``; both read it through ``ActivationStore.batches``, same d_sae, batch and steps):
ours (``train_transcoder_from_store``) against sae-lens's own trainer (``SAETrainer``) driven by
``interp.store.train_transcoder`` (sae-lens 6 has no offline transcoder runner; that adapter is its trainer on
a transcoder training class). Also ours harvesting on the fly (``train_transcoder``). Run:
``.venv/bin/python benchmarks/speed/editing.py``.
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
    from interp.benchmarks.tcpe.facts import FactsTask, facts_tokenizer
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
    rows["transcoder_training (ours, harvest on the fly)"] = {"seconds": dt, "tokens": hist.n_tokens,
                                                             "tokens_per_s": hist.n_tokens / dt}
    import tempfile
    from interp.editing import train_transcoder_from_store
    from interp.store import SAETrainConfig, harvest
    from interp.store import train_transcoder as sl_train_transcoder
    with tempfile.TemporaryDirectory() as tmp:
        names = ["blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"]
        harvest(model, texts, names, Path(tmp) / "store", context_size=16, batch_size=64, prepend_bos=True)
        steps = 150
        for rep in range(args.reps):  # interleaved, so both see the same machine load
            t = time.perf_counter()
            _, h = train_transcoder_from_store(Path(tmp) / "store", 0, TranscoderTrainingConfig(
                d_sae=1024, batch_size=256, n_epochs=1), max_steps=steps)
            ours = time.perf_counter() - t
            t = time.perf_counter()
            r = sl_train_transcoder(Path(tmp) / "store", names[0], names[1],
                                    SAETrainConfig(d_sae=1024, steps=steps, batch_size=256, lr=1e-3, l1_coefficient=1.0))
            theirs = time.perf_counter() - t
            rows.setdefault("_store", []).append((len(h.mse) * 256 / ours, steps * 256 / theirs))
        ours_tps = statistics.median(a for a, _ in rows["_store"])
        theirs_tps = statistics.median(b for _, b in rows.pop("_store"))
        rows["transcoder_training from a store: ours"] = {"tokens_per_s": ours_tps}
        rows["transcoder_training from a store: sae-lens SAETrainer"] = {"tokens_per_s": theirs_tps,
                                                                         "ours / sae-lens": ours_tps / theirs_tps}
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
    from interp.editing import TranscoderSite, rank_one, restrict
    full = tcpe(model, req, 0, tc, tau=-1, C=C_tc, config=cfg, templates=templates, apply=False)
    methods["tcpe_extra_tau"] = lambda: restrict(full, 0.5, site=TranscoderSite(model, 0, tc))
    times = {name: [] for name in methods}
    for _ in range(args.reps):  # interleaved repetitions: every method sees the same load drift
        for name, fn in methods.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    base = statistics.median(times["rome"])
    for name, ts in times.items():
        rows[name] = {"seconds_per_edit": statistics.median(ts), "ratio_to_rome_mlp": statistics.median(ts) / base}
    meta = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__, "threads": 1,
            "load_average": list(__import__("os").getloadavg())}
    atomic_write_json(RESULTS / "editing.json", {"meta": meta, "rows": rows})
    md = ["| what | value |", "|---|---|"] + [f"| {k} | " + ", ".join(f"{a} = {b:.3g}" for a, b in v.items()) + " |"
                                             for k, v in rows.items()]
    atomic_write_text(RESULTS / "editing.md", "\n".join(md) + f"\n\nload average during the run: {meta['load_average']}\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
