"""Validation experiments of the Raptor analyzer (digest §7): the real DINOv2 ViT-S/14 on real images, and the
CPU-scale digits recipe (three locally trained ViT teachers with stochastic depth 0 / 0.2 / 0.4).

Run from the shell (each experiment writes one JSON per finished run into ``out`` atomically and skips runs
already there, so an interrupted experiment resumes)::

    python -m interp.dynamics.raptor.experiments dinov2 --out /tmp/raptor_dinov2
    python -m interp.dynamics.raptor.experiments digits --out /tmp/raptor_digits
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from interp.io import atomic_write_json
from interp.progress import progress

from .model import Raptor, RaptorConfig
from .phases import LayerDistances, distances_from_stack, layer_distances, phases, token_summaries
from .train import RaptorTrainConfig, evaluate_raptor, teacher_activations, train_raptor

__all__ = ["digits_images", "fashion_mnist_images", "real_image_split", "dinov2_experiment", "train_digits_teacher", "digits_recipe", "ABLATIONS"]

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225])[:, None, None]


def digits_images(size: int = 56, channels: int = 3, normalize: bool = True) -> tuple[torch.Tensor, np.ndarray]:
    """The 1,797 real 8x8 scikit-learn digits as ``[N, channels, size, size]`` (bilinear upsampling, grey
    replicated over channels, ImageNet normalisation when ``normalize``) and their labels."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.expand(-1, channels, -1, -1).contiguous()
    if normalize and channels == 3:
        x = (x - IMAGENET_MEAN) / IMAGENET_STD
    return x, d.target


#: The paper's ablation rows (k = 3 on DINOv2-B): each adds one ingredient to the previous one.
ABLATIONS = {
    "TF only": dict(anneal=False, depth_scaling=False, cls_weighting=False, stage2=False),
    "+ AR annealing": dict(anneal=True, depth_scaling=False, cls_weighting=False, stage2=False),
    "+ depth scaling": dict(anneal=True, depth_scaling=True, cls_weighting=False, stage2=False),
    "+ cls weighting": dict(anneal=True, depth_scaling=True, cls_weighting=True, stage2=False),
    "+ stage 2": dict(anneal=True, depth_scaling=True, cls_weighting=True, stage2=True),
}


def _run(out: Path, name: str, acts_tr, y_tr, acts_te, y_te, rcfg: RaptorConfig, tcfg: RaptorTrainConfig,
         final_norm, seed: int = 0) -> dict:
    path = out / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    import time
    torch.manual_seed(seed)
    raptor = Raptor(rcfg)
    t0 = time.time()
    hist = train_raptor(raptor, acts_tr, tcfg, checkpoint=out / f"{name}.ckpt")  # resumable mid-run
    secs = time.time() - t0
    fit = evaluate_raptor(raptor, acts_tr, y_tr, acts_te, y_te, final_norm=final_norm, name=name)
    raptor.save(out / f"{name}.model")
    row = dict(name=name, thresholds=rcfg.thresholds, r2=fit.r2.tolist(), mean_r2=fit.mean_r2,
               r2_pooled=fit.r2_pooled.tolist(), mean_r2_pooled=float(fit.r2_pooled.mean()),
               probe_acc_teacher=fit.probe_acc_teacher, probe_acc_raptor=fit.probe_acc_raptor,
               relative_acc=fit.relative_acc, train_seconds=secs,
               final_loss={k: v[-1] for k, v in hist.losses.items() if v}, raptor_config=asdict(rcfg),
               train_config=asdict(tcfg))
    atomic_write_json(path, row)
    return row


FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"


def fashion_mnist_images(split: str = "train", n: int | None = None, size: int = 56, seed: int = 0,
                         root: str = FASHION_MNIST_ROOT) -> tuple[torch.Tensor, np.ndarray]:
    """``n`` seeded-random Fashion-MNIST images of ``split`` (``"train"`` / ``"t10k"``; Debian package
    ``dataset-fashion-mnist``) as ``[n, 3, size, size]`` (bilinear, grey replicated, ImageNet normalisation)."""
    from interp.models.misd import load_fashion_mnist
    x, y = load_fashion_mnist(split, root=root)
    idx = np.random.default_rng(seed).permutation(len(y))[:n] if n is not None else np.arange(len(y))
    t = torch.tensor(x[idx], dtype=torch.float32)[:, None] / 255.0
    if size != 28:
        t = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    t = (t.expand(-1, 3, -1, -1) - IMAGENET_MEAN) / IMAGENET_STD
    return t.contiguous(), y[idx]


def real_image_split(dataset: str = "auto", n_train: int = 500, n_test: int = 300, size: int = 56, seed: int = 0):
    """Train / held-out real images: Fashion-MNIST (its train and t10k splits) when installed (``"auto"``),
    else the scikit-learn digits (a seeded split). Returns ``(name, x_tr, y_tr, x_te, y_te)``."""
    if dataset == "auto":
        dataset = "fashion-mnist" if Path(FASHION_MNIST_ROOT).is_dir() else "digits"
    if dataset == "fashion-mnist":
        xtr, ytr = fashion_mnist_images("train", n_train, size, seed)
        xte, yte = fashion_mnist_images("t10k", n_test, size, seed)
        return dataset, xtr, ytr, xte, yte
    if dataset != "digits":
        raise ValueError(f"dataset must be 'auto', 'fashion-mnist' or 'digits', got {dataset!r}")
    x, y = digits_images(size)
    perm = np.random.default_rng(seed).permutation(len(y))[: n_train + n_test]
    tr, te = perm[:n_train], perm[n_train:]
    return dataset, x[tr], y[tr], x[te], y[te]


def dinov2_experiment(out: str | Path, n_train: int = 500, n_test: int = 300, size: int = 56,
                      steps: int = 150, batch_size: int = 16, lr: float = 1e-3, ablations: bool = True,
                      seed: int = 0, dataset: str = "auto", ks=(2, 3, 4)) -> dict:
    """Phases, Raptor fits (k in ``ks``, DP phases) and the k = 3 ablation rows on ``zoo:dinov2-s14`` with real
    images (Fashion-MNIST when installed, else digits; see :func:`real_image_split`)."""
    import interp
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = interp.load("zoo:dinov2-s14", backend="torch")
    dataset, x_tr, y_tr, x_te, y_te = real_image_split(dataset, n_train, n_test, size, seed)
    acts_path = out / "teacher_acts.safetensors"
    if acts_path.is_file():
        from safetensors.torch import load_file
        cached = load_file(str(acts_path))
        acts_tr, acts_te = cached["train"], cached["test"]
    else:
        from safetensors.torch import save_file
        acts_tr = teacher_activations(model, x_tr, batch_size=50)
        acts_te = teacher_activations(model, x_te, batch_size=50)
        tmp = acts_path.with_name(acts_path.name + ".tmp")
        save_file({"train": acts_tr.contiguous(), "test": acts_te.contiguous()}, str(tmp))
        tmp.replace(acts_path)
    # the same numbers as layer_distances(model, images) (block outputs = acts[1:]), without a second pass
    cos, mse = distances_from_stack(token_summaries(torch.cat([acts_tr, acts_te], dim=1)[1:]))
    dist = LayerDistances(cosine=cos, mse=mse, n_images=acts_tr.shape[1] + acts_te.shape[1])
    summary: dict = {"dataset": dataset, "n_train": n_train, "n_test": n_test, "size": size,
                     "cosine": dist.cosine.tolist(), "mse": dist.mse.tolist(), "phases": {}}
    for method in ("maxcut", "dp"):
        for frac in (0.2, 0.1, 0.09, 0.05):
            summary["phases"][f"{method}/frac={frac}"] = phases(dist, frac=frac, method=method).parts
        for k in (2, 3, 4):
            p = phases(dist, n_phases=k, method=method)
            summary["phases"][f"{method}/k={k}"] = p.parts
    atomic_write_json(out / "phases.json", summary)
    L = model.cfg.n_layers
    base = dict(d_model=model.cfg.d_model, n_heads=model.cfg.n_heads)
    tcfg = RaptorTrainConfig(stage1_steps=steps, stage2_steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    rows = []
    for k in ks:
        parts = phases(dist, n_phases=k, method="dp").parts
        rcfg = RaptorConfig.from_phases(parts, **base)
        rows.append(_run(out, f"k{k}", acts_tr, y_tr, acts_te, y_te, rcfg, tcfg, model.apply_ln_final, seed))
    if ablations:
        parts = phases(dist, n_phases=3, method="dp").parts
        for name, ab in ABLATIONS.items():
            if ab["stage2"]:
                continue  # identical to the k3 run above
            rcfg = RaptorConfig.from_phases(parts, depth_scaling=ab["depth_scaling"], **base)
            t = replace(tcfg, anneal=ab["anneal"], cls_weighting=ab["cls_weighting"], stage2_steps=0)
            rows.append(_run(out, f"ablation k3 {name}", acts_tr, y_tr, acts_te, y_te, rcfg, t,
                             model.apply_ln_final, seed))
    summary["runs"] = rows
    summary["L"] = L
    atomic_write_json(out / "summary.json", summary)
    return summary


def train_digits_teacher(p_drop: float, n_layers: int = 8, d_model: int = 64, n_heads: int = 4, epochs: int = 60,
                         seed: int = 0, train_idx=None, cache: str | Path | None = None):
    """A DINOv2-architecture ViT on 8x8 digits (2x2 patches: 16 patch tokens + CLS; L = 8, d = 64, 4 heads)
    trained with stochastic depth ``p_drop``; returns the trained ``Dinov2ForImageClassification``.
    With ``cache`` (a folder), the trained weights are saved there (safetensors, atomic) and reused."""
    import transformers as T
    from safetensors.torch import load_file, save_file
    cfg = T.Dinov2Config(hidden_size=d_model, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                         mlp_ratio=4, image_size=8, patch_size=2, num_channels=1, num_labels=10,
                         drop_path_rate=p_drop, layerscale_value=1.0, architectures=["Dinov2ForImageClassification"])
    torch.manual_seed(seed)
    clf = T.Dinov2ForImageClassification(cfg)
    key = dict(p_drop=p_drop, n_layers=n_layers, d_model=d_model, n_heads=n_heads, epochs=epochs, seed=seed,
               train_idx=[int(i) for i in train_idx])
    cache = Path(cache) if cache is not None else None
    if cache is not None and (cache / "key.json").is_file() and json.loads((cache / "key.json").read_text()) == key:
        clf.load_state_dict(load_file(str(cache / "model.safetensors")))
        return clf.eval()
    x, y = digits_images(8, channels=1, normalize=False)
    x = (x - 0.5) / 0.5
    yt = torch.tensor(y)
    idx = torch.as_tensor(train_idx)
    opt = torch.optim.AdamW(clf.parameters(), lr=1e-3, weight_decay=0.05)
    steps = epochs * ((len(idx) + 63) // 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    clf.train()
    for _ in progress(range(epochs), desc=f"digits teacher p={p_drop}"):
        order = idx[torch.randperm(len(idx), generator=g)]
        for b in range(0, len(order), 64):
            j = order[b:b + 64]
            loss = F.cross_entropy(clf(pixel_values=x[j]).logits, yt[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    clf.eval()
    if cache is not None:
        from interp.io import output_dir
        with output_dir(cache, writer="train_digits_teacher") as tmp:
            save_file({k: v.detach().contiguous() for k, v in clf.state_dict().items()}, str(tmp / "model.safetensors"))
            (tmp / "key.json").write_text(json.dumps(key))
    return clf


def digits_recipe(out: str | Path, p_drops=(0.0, 0.2, 0.4), steps: int = 300, n_random: int = 5, seed: int = 0,
                  epochs: int = 60, extra_k=(3, 4), only=None) -> dict:
    """The digest's CPU-scale recipe; see the module docstring of :mod:`interp.dynamics.raptor`.

    ``only`` (run names such as ``"kL"``, ``"k2"``): train just those runs (to spread one recipe over several
    processes sharing ``out``); the summary is then not computed. Finished runs are read back from ``out``."""
    import interp
    from scipy.stats import spearmanr
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    x, y = digits_images(8, channels=1, normalize=False)
    x = (x - 0.5) / 0.5
    perm = np.random.default_rng(seed).permutation(len(y))
    tr, te = perm[:1400], perm[1400:]
    results = {}
    for p in p_drops:
        sub = out / f"p{p}"
        sub.mkdir(exist_ok=True)
        clf = train_digits_teacher(p, epochs=epochs, seed=seed, train_idx=tr, cache=sub / "teacher")
        with torch.no_grad():
            test_acc = float((clf(pixel_values=x[te]).logits.argmax(-1).numpy() == y[te]).mean())
        model = interp.wrap(clf.dinov2, None, backend="torch")
        L = model.cfg.n_layers
        dist = layer_distances(model, x[tr], batch_size=200)
        off = dist.cosine[~torch.eye(L, dtype=torch.bool)]
        acts_tr = teacher_activations(model, x[tr], batch_size=200)
        acts_te = teacher_activations(model, x[te], batch_size=200)
        base = dict(d_model=64, n_heads=4)
        tcfg = RaptorTrainConfig(stage1_steps=steps, stage2_steps=steps, batch_size=64, lr=1e-3, seed=seed)
        fn = model.apply_ln_final
        run = lambda name, rc, t=tcfg: _run(sub, name, acts_tr, y[tr], acts_te, y[te], rc, t, fn, seed)  # noqa: E731
        if only is not None:
            maxcut = phases(dist, n_phases=2, method="maxcut")
            parts = maxcut.parts if maxcut.contiguous else phases(dist, n_phases=2, method="dp").parts
            configs = {"kL": (RaptorConfig(n_layers=L, thresholds=list(range(1, L)), **base), tcfg),
                       "k2": (RaptorConfig.from_phases(parts, **base), tcfg),
                       "k2 TF only": (RaptorConfig.from_phases(parts, **base),
                                      replace(tcfg, anneal=False, stage2_steps=0)),
                       "k2 TF-AR stage1": (RaptorConfig.from_phases(parts, **base), replace(tcfg, stage2_steps=0))}
            for name in only:
                if name.startswith("k2 random th"):
                    configs[name] = (RaptorConfig(n_layers=L, thresholds=[int(name[12:])], **base), tcfg)
                results.setdefault(p, {})[name] = run(name, *configs[name])
            continue
        maxcut = phases(dist, n_phases=2, method="maxcut")
        dp = phases(dist, n_phases=2, method="dp")
        parts = maxcut.parts if maxcut.contiguous else dp.parts
        rows = {"kL": run("kL", RaptorConfig(n_layers=L, thresholds=list(range(1, L)), **base)),
                "k2": run("k2", RaptorConfig.from_phases(parts, **base)),
                "k2 TF only": run("k2 TF only", RaptorConfig.from_phases(parts, **base),
                                  replace(tcfg, anneal=False, stage2_steps=0)),
                "k2 TF->AR stage 1 only": run("k2 TF-AR stage1", RaptorConfig.from_phases(parts, **base),
                                              replace(tcfg, stage2_steps=0))}
        rand = []
        rng = np.random.default_rng(seed + 1)  # the same random splits for every teacher (and every process)
        for i in range(n_random):
            th = int(rng.integers(2, L - 1))  # both phases >= 2 layers; a repeated split reuses its run
            if [th] == rows["k2"]["thresholds"]:
                rand.append(rows["k2"])       # the same config and seed as the max-cut run: the same result
            else:
                rand.append(run(f"k2 random th{th}", RaptorConfig(n_layers=L, thresholds=[th], **base)))
        for k in extra_k:  # more phases (reported, not a criterion of the recipe)
            pk = phases(dist, n_phases=k, method="maxcut")
            if not pk.contiguous or len(pk.parts) != k:  # max-cut may stop early (no cluster splits into >= 2 + 2)
                pk = phases(dist, n_phases=k, method="dp")
            rows[f"k{k}"] = dict(run(f"k{k}", RaptorConfig.from_phases(pk.parts, **base)), parts=pk.parts)
        results[p] = dict(test_acc=test_acc, mean_offdiag_cos_distance=float(off.mean()),
                          mean_offdiag_similarity=float(1 - off.mean()), maxcut_k2=maxcut.parts, dp_k2=dp.parts,
                          phases_frac01=phases(dist, frac=0.1).parts, runs=rows,
                          random_mean_r2=float(np.mean([r["mean_r2"] for r in rand])),
                          random_r2=[r["mean_r2"] for r in rand], random_thresholds=[r["thresholds"] for r in rand])
        atomic_write_json(out / "summary.json", {str(k): v for k, v in results.items()})
    if only is not None:
        return results
    ps = list(results)
    results["spearman_similarity"] = float(spearmanr(ps, [results[p]["mean_offdiag_similarity"] for p in ps])[0])
    results["spearman_r2"] = float(spearmanr(ps, [results[p]["runs"]["k2"]["mean_r2"] for p in ps])[0])
    atomic_write_json(out / "summary.json", {str(k): v for k, v in results.items()})
    return results


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", choices=["dinov2", "digits"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=None, help="training steps per unit (stage-1 block, stage 2)")
    ap.add_argument("--batch-size", type=int, default=None, help="dinov2: Raptor batch size")
    ap.add_argument("--n-train", type=int, default=None, help="dinov2: training images")
    ap.add_argument("--n-test", type=int, default=None, help="dinov2: held-out images")
    ap.add_argument("--epochs", type=int, default=None, help="digits: teacher epochs")
    ap.add_argument("--dataset", default=None, help="dinov2: auto (Fashion-MNIST if installed) | fashion-mnist | digits")
    ap.add_argument("--size", type=int, default=None, help="dinov2: image resolution in pixels")
    ap.add_argument("--ks", default=None, help="dinov2: comma-separated numbers of blocks, e.g. 2,3,4")
    ap.add_argument("--no-ablations", action="store_true", help="dinov2: skip the ablation rows")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    given = {k: v for k, v in vars(args).items()
             if v is not None and k not in ("experiment", "out", "no_ablations")}
    if "ks" in given:
        given["ks"] = tuple(int(k) for k in given["ks"].split(","))
    if args.experiment == "dinov2":
        given.pop("epochs", None)
        given["ablations"] = not args.no_ablations
        res = dinov2_experiment(args.out, **given)
    else:
        for k in ("batch_size", "n_train", "n_test", "dataset", "size", "ks"):
            given.pop(k, None)
        res = digits_recipe(args.out, **given)
    print(json.dumps(res, indent=1, default=str)[:20000])


if __name__ == "__main__":
    main()
