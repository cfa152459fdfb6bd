"""Cost of the training-dynamics analyses (issue #18), as side-by-side ratios on the same inputs.

Three comparisons, each timed in interleaved rounds (median of ``--reps``), one torch thread by default:

1. **Gradient decomposition** on a GPT-2-style model (4 layers, d 128, Majority batch ``[32, 21]``, torch backend):
   * ``fwd_bwd``            — one forward + one backward of the mean next-token loss (ratio base 1.00);
   * ``naive_per_part``     — what :func:`~interp.dynamics.decompose_gradient` replaces: every component by its own
     forward(s) and backward (full: 1 forward; shared: 1 stop-gradient forward; direct and pre-cached: a plain
     and a stop-gradient forward each), 6 forwards + 4 backwards;
   * ``decompose_gradient`` — 2 forwards (plain, stop-gradient) and 4 backwards through the retained graphs.
2. **POLCA basis**: top Hessian eigenvector of a small model's mean loss (a 2-layer d 16 GPT-2 on 3-digit addition,
   a few thousand parameters), Lanczos on Hessian-vector products (``lanczos_top``, 20 iterations) vs the dense
   Hessian (``torch.func.hessian``) + ``eigh``; also one HVP against one gradient. Accuracy: ``|cos|`` of the two
   top eigenvectors and the eigenvalue's relative error.
3. **POLCA per-example terms** (first order + exact second order, ``second_order``) for ``n`` examples and ``k``
   basis vectors, vectorised over examples (one forward-over-forward JVP per basis vector) vs a loop over examples
   (per-example gradient by autograd, per-example ``bᵀH(x)b`` by double backward). The two must agree (max abs
   difference reported).

Run: ``.venv/bin/python benchmarks/speed/dynamics.py [--reps 3] [--threads 1]``. Writes
``benchmarks/speed/results/dynamics.json`` and ``dynamics.md``. Speed claims are these ratios only.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import interp
from interp.io import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def _time(fns: dict, reps: int) -> dict[str, float]:
    times = {k: [] for k in fns}
    for k, f in fns.items():      # warm-up
        f()
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _gpt2(n_layer: int, d: int, vocab: int, n_pos: int, seed: int = 0, n_head: int = 4):
    import transformers as T
    torch.manual_seed(seed)
    c = T.GPT2Config(n_layer=n_layer, n_embd=d, n_head=n_head, vocab_size=vocab, n_positions=n_pos, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    hf = T.GPT2LMHeadModel(c)
    hf.set_attn_implementation("eager")
    return hf


def bench_decomposition(reps: int) -> dict:
    from interp.dynamics import decompose_gradient, stop_gradient_at
    from interp.dynamics.influence import _per_position_nll
    from interp.dynamics.tasks import majority
    hf = _gpt2(4, 128, 4, 32)
    model = interp.wrap(hf, backend="torch")
    ids = majority(32, seed=0).tokens
    site, pos = "blocks.1.hook_resid_post", 8
    params = dict(hf.named_parameters())
    tensors = list(params.values())
    mask = torch.ones_like(ids)

    def nll(sg: bool):
        if sg:
            with model.intervene({site: stop_gradient_at(pos)}):
                return _per_position_nll(model.forward_with_grad(ids), ids, mask)
        return _per_position_nll(model.forward_with_grad(ids), ids, mask)
    n = float(ids.shape[0] * (ids.shape[1] - 1))

    def fwd_bwd():
        torch.autograd.grad(nll(False).sum() / n, tensors)

    def naive():
        out = {}
        out["full"] = torch.autograd.grad(nll(False).sum() / n, tensors)
        out["shared"] = torch.autograd.grad(nll(True).sum() / n, tensors)
        a, b = nll(False), nll(True)
        out["direct"] = torch.autograd.grad((a[:, pos].sum() - b[:, pos].sum()) / n, tensors)
        a, b = nll(False), nll(True)
        out["precached"] = torch.autograd.grad(((a.sum() - a[:, pos].sum()) - (b.sum() - b[:, pos].sum())) / n, tensors)
        return out

    def ours():
        return decompose_gradient(model, ids, site, pos, params=params)
    t = _time({"fwd_bwd": fwd_bwd, "naive_per_part": naive, "decompose_gradient": ours}, reps)
    ref, dec = naive(), ours()
    err = max(float((x - dec[c][nm]).abs().max()) for c in ref for nm, x in zip(params, ref[c]))
    return {"setup": f"GPT-2 4 layers d 128, batch {tuple(ids.shape)}, site {site}, position {pos}, "
                     f"{sum(p.numel() for p in tensors)} parameters", "seconds": t,
            "ratio_to_fwd_bwd": {k: v / t["fwd_bwd"] for k, v in t.items()},
            "max_abs_diff_naive_vs_ours": err}


def _addition_setup(n: int, d: int = 16):
    """A 2-layer GPT-2 (2 heads) after 30 Adam steps on 3-digit addition, its ParamSpace, ``n`` problems."""
    from interp.benchmarks.polca.addition import addition_token_loss
    from interp.dynamics.polca import ParamSpace
    from interp.dynamics.tasks import addition
    hf = _gpt2(2, d, 13, 16, n_head=2)
    # a few Adam steps so the Hessian is not the one at initialisation
    opt = torch.optim.Adam(hf.parameters(), lr=3e-3)
    data = addition(64 * 30, seed=0).tokens.view(30, 64, -1)
    for x in data:
        loss = addition_token_loss(hf, x).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return hf, ParamSpace(hf), addition(n, seed=1).tokens, addition_token_loss


def bench_basis(reps: int) -> dict:
    from interp.dynamics.polca import hvp_fn, lanczos_top
    hf, space, ex, loss_fn = _addition_setup(32, d=8)
    theta = space.flatten()
    f = space.losses(loss_fn, ex)
    hvp = hvp_fn(space, loss_fn, ex, theta)
    v = torch.randn(space.numel, generator=torch.Generator().manual_seed(0))
    grad = torch.func.grad(lambda th: f(th).mean())
    res = {}

    def dense():
        H = torch.func.hessian(lambda th: f(th).mean())(theta).double()
        res["dense"] = torch.linalg.eigh(H)

    def lanczos():
        res["lanczos"] = lanczos_top(hvp, space.numel, k=1, n_iter=20)
    t = _time({"gradient": lambda: grad(theta), "hvp": lambda: hvp(v), "lanczos_20": lanczos, "dense_hessian_eigh": dense},
              max(1, reps // 2))
    ev, evec = res["dense"]
    lam, vec = res["lanczos"]
    return {"setup": f"GPT-2 2 layers d 8 on 3-digit addition, {space.numel} parameters, 32 problems (128 answer tokens)",
            "seconds": t, "ratio_to_lanczos": {k: x / t["lanczos_20"] for k, x in t.items()},
            "hvp_over_gradient": t["hvp"] / t["gradient"],
            "top_eigenvalue_dense": float(ev[-1]), "top_eigenvalue_lanczos": float(lam[0]),
            "eigenvalue_rel_err": abs(float(lam[0]) - float(ev[-1])) / abs(float(ev[-1])),
            "abs_cos_top_eigenvector": abs(float(vec[:, 0] @ evec[:, -1]))}


def bench_terms(reps: int, n: int = 32, k: int = 4) -> dict:
    from interp.dynamics.polca import second_order
    hf, space, ex, loss_fn = _addition_setup(n // 4)            # 4 answer tokens per problem -> n examples
    theta = space.flatten()
    B, _ = torch.linalg.qr(torch.randn(space.numel, k, generator=torch.Generator().manual_seed(0)))
    theta2 = theta + 1e-3 * torch.randn(space.numel, generator=torch.Generator().manual_seed(1))
    f = space.losses(loss_fn, ex)
    res = {}

    def vec():
        res["vec"] = second_order(space, loss_fn, ex, B, theta, theta2)

    def loop():
        step = B.T @ (theta2 - theta)
        th = theta.clone().requires_grad_(True)
        losses = f(th)
        p1, h = torch.empty(losses.numel(), k), torch.empty(losses.numel(), k)
        for i in range(losses.numel()):
            g = torch.autograd.grad(losses[i], th, create_graph=True, retain_graph=True)[0]
            gb = g @ B                                                    # [k] directional derivatives
            for j in range(k):
                hb = torch.autograd.grad(gb[j], th, retain_graph=True)[0]     # H(x) b_j
                h[i, j] = 0.5 * (B[:, j] @ hb) * step[j] ** 2
            p1[i] = gb.detach() * step
        res["loop"] = (p1, h)
    t = _time({"vectorised_second_order": vec, "per_example_loop": loop}, max(1, reps // 2))
    diff = max(float((a - b).abs().max()) for a, b in zip(res["vec"], res["loop"]))
    return {"setup": f"GPT-2 2 layers d 16, {space.numel} parameters, {n} answer-token examples, {k} basis vectors",
            "seconds": t, "loop_over_vectorised": t["per_example_loop"] / t["vectorised_second_order"],
            "max_abs_diff": diff}


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    interp.set_progress(False)
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} at start",
           "threads": args.threads, "reps": args.reps, "torch": torch.__version__}
    out["decomposition"] = bench_decomposition(args.reps)
    out["basis"] = bench_basis(args.reps)
    out["terms"] = bench_terms(args.reps)
    out["load_at_end"] = os.getloadavg()[0]
    RESULTS.mkdir(exist_ok=True)
    atomic_write_json(RESULTS / "dynamics.json", out)
    d, b, te = out["decomposition"], out["basis"], out["terms"]
    md = [f"# Training-dynamics costs (issue #18)\n", f"{out['machine']}; {args.threads} thread(s); median of "
          f"interleaved rounds; load average at end {out['load_at_end']:.1f} (shared machine: ratios, not seconds)\n",
          f"## Gradient decomposition\n\n{d['setup']}\n", "| variant | median s | × one forward+backward |", "|---|---|---|"]
    md += [f"| {k} | {v:.4f} | {d['ratio_to_fwd_bwd'][k]:.2f} |" for k, v in d["seconds"].items()]
    md += [f"\nnaive vs decompose_gradient max abs difference: {d['max_abs_diff_naive_vs_ours']:.2e}\n",
           f"## POLCA basis: Lanczos on HVPs vs dense Hessian\n\n{b['setup']}\n", "| variant | median s | × Lanczos (20 HVPs) |",
           "|---|---|---|"]
    md += [f"| {k} | {v:.4f} | {b['ratio_to_lanczos'][k]:.3f} |" for k, v in b["seconds"].items()]
    md += [f"\none HVP = {b['hvp_over_gradient']:.2f} × one gradient; top eigenvalue dense {b['top_eigenvalue_dense']:.5f} vs "
           f"Lanczos {b['top_eigenvalue_lanczos']:.5f} (rel. err {b['eigenvalue_rel_err']:.1e}); |cos| of top eigenvectors "
           f"{b['abs_cos_top_eigenvector']:.5f}\n", f"## POLCA per-example terms\n\n{te['setup']}\n",
           "| variant | median s |", "|---|---|"]
    md += [f"| {k} | {v:.4f} |" for k, v in te["seconds"].items()]
    md += [f"\nper-example loop / vectorised = {te['loop_over_vectorised']:.1f}×; max abs difference {te['max_abs_diff']:.1e}\n"]
    atomic_write_text(RESULTS / "dynamics.md", "\n".join(md))
    print("\n".join(md))
    return out


if __name__ == "__main__":
    main()
