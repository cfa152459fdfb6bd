"""Raptor / ViT-dynamics analyzer against what a user would otherwise write, side by side (ratios only).

Model: a DINOv2-S-shaped ``Dinov2Model`` (12 layers, d 384, 6 heads, patch 14; random weights, built offline)
on 56 px images (16 patches + CLS = 17 tokens). Rows, each timed in interleaved rounds (median of ``--reps``):

* ``capture``: the teacher stream ``[L + 1, N, T, d]`` through ``interp`` (:func:`teacher_activations`,
  hooks ``blocks.0.hook_resid_pre`` + every ``hook_resid_post``) vs a plain HF forward with
  ``output_hidden_states=True`` (the reference, which returns the same 13 tensors);
* ``distances``: our vectorised layer x layer cosine-distance + MSE (:func:`distances_from_stack`) vs a per-pair,
  per-image loop with ``scipy.spatial.distance.cosine`` (the obvious way) and vs one sklearn
  ``pairwise_distances`` call per image and summary token;
* ``phases``: the exact contiguous DP segmentation into k phases vs enumerating every contiguous partition
  (``itertools.combinations`` of the cut points), L = 24 and k = 4 (both exact: same cut value, checked);
* ``raptor step``: one Raptor k = 2 Stage-2 training step (autoregressive rollout through all 12 layers +
  backward + AdamW) and one Raptor rollout without gradients vs one teacher forward on the same batch (what the
  surrogate replaces) and vs one teacher forward + backward + AdamW (a fine-tuning step of the ViT itself);
* ``trajectories``: :func:`trajectory_metrics` on a precomputed stream vs a per-image numpy loop
  (``np.arccos`` / ``np.linalg.svd`` per image and layer), both giving the same numbers (checked).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speed/raptor.py`` (writes ``benchmarks/speed/results/raptor.{json,md}``).
"""
from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import interp
from interp.dynamics.raptor import (Raptor, RaptorConfig, RaptorTrainConfig, cut_value, distances_from_stack,
                                    dp_phases, teacher_activations, token_summaries)
from interp.dynamics.raptor.train import weighted_mse
from interp.dynamics.trajectories import trajectory_metrics
from interp.io import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def build_vit(seed: int = 0):
    import transformers as T
    cfg = T.Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4, patch_size=14,
                         image_size=56, layerscale_value=1.0, attn_implementation="eager")
    torch.manual_seed(seed)
    return T.Dinov2Model(cfg).eval()


def timeit(fns: dict, reps: int) -> dict[str, float]:
    """Median seconds per call of each function, in interleaved rounds (one warm-up call each)."""
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_capture(hf, images, reps):
    model = interp.wrap(hf, None, backend="torch")

    def plain():
        with torch.no_grad():
            return torch.stack(hf(pixel_values=images, output_hidden_states=True).hidden_states)

    def ours():
        return teacher_activations(model, images, batch_size=len(images))

    a, b = plain(), ours()
    # HF's hidden_states[0] is the embedding output = blocks.0.hook_resid_pre; the rest are the block outputs
    # (the last one before the final layernorm)
    assert torch.allclose(a, b, atol=1e-4), float((a - b).abs().max())
    return timeit({"hf output_hidden_states": plain, "interp teacher_activations": ours}, reps)


def bench_distances(stream, reps):
    from scipy.spatial.distance import cosine
    from sklearn.metrics import pairwise_distances
    summ = token_summaries(stream[1:])                                   # [L, N, 2, d]
    s = summ.double().numpy()
    L, N = s.shape[:2]

    def ours():
        return distances_from_stack(summ)

    def scipy_loop():
        cos, mse = np.zeros((L, L)), np.zeros((L, L))
        for l in range(L):
            for m in range(L):
                for i in range(N):
                    for k in range(2):
                        cos[l, m] += cosine(s[l, i, k], s[m, i, k])
                        mse[l, m] += np.mean((s[l, i, k] - s[m, i, k]) ** 2)
        return cos / (2 * N), mse / (2 * N)

    def sklearn_per_image():
        cos, mse = np.zeros((L, L)), np.zeros((L, L))
        for i in range(N):
            for k in range(2):
                v = s[:, i, k]                                             # [L, d]
                cos += pairwise_distances(v, metric="cosine")
                mse += pairwise_distances(v, metric="sqeuclidean") / v.shape[1]
        return cos / (2 * N), mse / (2 * N)

    c0, m0 = ours()
    for c, m in (scipy_loop(), sklearn_per_image()):
        assert np.allclose(c0.numpy(), c, atol=1e-5) and np.allclose(m0.numpy(), m, rtol=1e-4, atol=1e-5)
    return timeit({"per-pair scipy loop": scipy_loop, "sklearn per image": sklearn_per_image,
                   "interp distances_from_stack": ours}, reps)


def bench_phases(reps, L=24, k=4):
    rng = np.random.default_rng(0)
    X = rng.random((L, L))
    D = X + X.T
    np.fill_diagonal(D, 0)

    def enumerate_all():
        best, arg = -1.0, None
        for cuts in itertools.combinations(range(1, L), k - 1):
            b = (0,) + cuts + (L,)
            if min(b[i + 1] - b[i] for i in range(k)) < 2:
                continue
            parts = [list(range(b[i], b[i + 1])) for i in range(k)]
            v = cut_value(D, parts)
            if v > best:
                best, arg = v, parts
        return best, arg

    def ours():
        return dp_phases(D, n_phases=k)

    best, _ = enumerate_all()
    assert abs(ours().cut - best) < 1e-9
    return timeit({"enumerate contiguous partitions": enumerate_all, "interp dp_phases": ours}, reps)


def bench_raptor_step(hf, images, stream, reps):
    L, d = 12, 384
    raptor = Raptor(RaptorConfig(d_model=d, n_heads=6, n_layers=L, thresholds=[6]))
    opt = torch.optim.AdamW(raptor.parameters(), lr=1e-4)
    w = RaptorTrainConfig().stage2_weights
    raptor.train()

    def raptor_step():
        roll = raptor(stream[0])
        loss = torch.stack([weighted_mse(roll[i], stream[i + 1], w) for i in range(L)]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(raptor.parameters(), 1.0)
        opt.step()

    def teacher_forward():
        with torch.no_grad():
            hf(pixel_values=images)

    def raptor_rollout():
        with torch.no_grad():
            raptor(stream[0])

    hf_train = build_vit(1).train()
    opt2 = torch.optim.AdamW(hf_train.parameters(), lr=1e-5)

    def teacher_step():
        out = hf_train(pixel_values=images).last_hidden_state
        loss = out.pow(2).mean()
        opt2.zero_grad(set_to_none=True)
        loss.backward()
        opt2.step()

    return timeit({"teacher forward (no grad)": teacher_forward, "Raptor k=2 rollout (no grad)": raptor_rollout,
                   "teacher forward+backward+AdamW": teacher_step, "Raptor k=2 stage-2 step": raptor_step}, reps)


def bench_trajectories(stream, reps):
    x = stream.double().numpy()                                          # [L + 1, N, T, d]

    def numpy_loop():
        L1, N, T, _ = x.shape
        gamma, speed, srank = np.zeros((L1, N, T)), np.zeros((L1 - 1, N, T)), np.zeros((L1 - 1, N))
        for i in range(N):
            for l in range(L1):
                for t in range(T):
                    u = x[l, i, t] / np.linalg.norm(x[l, i, t])
                    f = x[-1, i, t] / np.linalg.norm(x[-1, i, t])
                    gamma[l, i, t] = u @ f
                    if l + 1 < L1:
                        v = x[l + 1, i, t] / np.linalg.norm(x[l + 1, i, t])
                        speed[l, i, t] = np.arccos(np.clip(u @ v, -1, 1))
                if l + 1 < L1:
                    sv = np.linalg.svd(x[l + 1, i] - x[l, i], compute_uv=False)
                    srank[l, i] = (sv ** 2).sum() / sv[0] ** 2
        return gamma, speed, srank

    def ours():
        return trajectory_metrics(stream=stream)

    g, s, r = numpy_loop()
    tr = ours()
    assert np.allclose(tr.speed["cls"].numpy(), s[:, :, 0].mean(1), atol=1e-4)
    assert np.allclose(tr.speed["patches"].numpy(), s[:, :, 1:].mean((1, 2)), atol=1e-4)
    assert np.allclose(tr.gamma["patches"].numpy(), g[:, :, 1:].mean((1, 2)), atol=1e-4)
    assert np.allclose(tr.update_stable_rank.numpy(), r.mean(1), rtol=1e-4)
    return timeit({"per-image numpy loop": numpy_loop, "interp trajectory_metrics": ours}, reps)


def table(title, res, ref, unit_n=None, unit="image"):
    lines = [f"### {title}", "", f"| variant | ms per call | ratio to {ref} |" +
             (f" {unit}s / s |" if unit_n else ""), "|---|---|---|" + ("---|" if unit_n else "")]
    for k, v in res.items():
        row = f"| {k} | {1e3 * v:.2f} | {v / res[ref]:.2f}x |"
        if unit_n:
            row += f" {unit_n / v:.0f} |"
        lines.append(row)
    return lines + [""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    interp.set_progress(False)
    hf = build_vit()
    images = torch.randn(args.batch, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    model = interp.wrap(hf, None, backend="torch")
    stream = teacher_activations(model, images, batch_size=args.batch)       # [13, B, 17, 384]
    res = {"capture": bench_capture(hf, images, args.reps),
           "distances": bench_distances(stream, args.reps),
           "phases": bench_phases(args.reps),
           "raptor_step": bench_raptor_step(hf, images, stream, args.reps),
           "trajectories": bench_trajectories(stream, args.reps)}
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = []
    meta = dict(torch=torch.__version__, python=platform.python_version(), threads=1, batch=args.batch,
                reps=args.reps, loadavg=load, model="DINOv2-S shape (12 x 384, 6 heads), 56 px, 17 tokens")
    atomic_write_json(Path(args.out) / "raptor.json", dict(meta=meta, results=res))
    B = args.batch
    md = ["# Raptor / ViT dynamics benchmark", "",
          f"`benchmarks/speed/raptor.py`: {meta['model']}, batch {B}, one thread, median of interleaved rounds; "
          f"machine load average at the end {' '.join(load)} (shared 2-core machine: absolute times are noisy, "
          "the ratios within a table are the result). Every pair is checked to give the same numbers.", ""]
    md += table("Teacher capture (13 residual tensors)", res["capture"], "hf output_hidden_states", B)
    md += table(f"Layer x layer cosine distance + MSE ({B} images, 12 layers)", res["distances"],
                "interp distances_from_stack", B)
    md += table("Exact contiguous phases, L = 24, k = 4", res["phases"], "interp dp_phases")
    md += table("Raptor training step vs the teacher ViT", res["raptor_step"], "teacher forward (no grad)", B)
    md += table(f"Trajectory metrics (γ, speed, update stable rank; {B} images)", res["trajectories"],
                "interp trajectory_metrics", B)
    md += ["Notes: `interp trajectory_metrics` computes more than the loop (per token type, patch-only stable rank, "
           "patch coherence); the Raptor rows use a k = 2 Raptor (two SwiGLU blocks, 12 applications) on the teacher's "
           "own stream; the phase DP is exact (same cut value as the enumeration, asserted).", ""]
    atomic_write_text(Path(args.out) / "raptor.md", "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
