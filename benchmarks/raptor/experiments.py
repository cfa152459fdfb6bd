"""Validation experiments of the Raptor analyzer (digest section 7): the CPU-scale digits recipe (three locally
trained DINOv2-architecture ViT teachers with stochastic depth 0 / 0.2 / 0.4) and the real DINOv2 ViT-S/14 on real
images. Run through ``interp reproduce raptor`` (:mod:`.recipe`): every teacher and every Raptor fit is a stage.

The method (phases, Raptor, training, evaluation) is :mod:`interp.dynamics.raptor`; the digits images are
:func:`interp.data.digits_images`. Moved here from ``interp.dynamics.raptor.experiments`` (issue #31); the
training and evaluation calls are unchanged; the ad-hoc per-run JSON files and teacher caches became stages, and
each run also measures the linear-probe baselines of the teacher's block input and block-0 output.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from interp.data.digits import IMAGENET_MEAN, IMAGENET_STD, digits_images
from interp.dynamics.raptor import (MAXCUT_RULES, LayerDistances, Raptor, RaptorConfig, RaptorTrainConfig,
                                    distances_from_stack, evaluate_raptor, layer_distances, linear_probe_accuracy,
                                    phases, probe_features, teacher_activations, token_summaries, train_raptor)
from interp.progress import progress

__all__ = ["ABLATIONS", "DigitsConfig", "DinoV2Config", "fashion_mnist_images", "real_image_split", "fit_run",
           "probe_baselines", "train_digits_teacher", "digits_teacher_model", "digits_unit", "dinov2_unit"]

#: The paper's ablation rows (k = 3 on DINOv2-B): each adds one ingredient to the previous one.
ABLATIONS = {
    "TF only": dict(anneal=False, depth_scaling=False, cls_weighting=False, stage2=False),
    "+ AR annealing": dict(anneal=True, depth_scaling=False, cls_weighting=False, stage2=False),
    "+ depth scaling": dict(anneal=True, depth_scaling=True, cls_weighting=False, stage2=False),
    "+ cls weighting": dict(anneal=True, depth_scaling=True, cls_weighting=True, stage2=False),
    "+ stage 2": dict(anneal=True, depth_scaling=True, cls_weighting=True, stage2=True),
}


@dataclass
class DigitsConfig:
    """The digest's CPU-scale digits recipe (defaults: the documented full-length run, docs/raptor.md): teachers
    of ``n_layers`` x ``d_model`` (``n_heads`` heads, 2x2 patches of the 8x8 digits: 16 tokens + CLS) trained
    ``epochs`` epochs on ``n_train`` digits (the rest held out) with stochastic depth ``p`` per teacher; Raptor
    ``steps`` per unit (each stage-1 block, then stage 2), ``batch_size``, ``lr``; ``n_random`` seeded random
    contiguous 2-block splits; ``extra_k``: more phases, reported (not criteria). The k = 2 phases are the
    max-cut ones with the official split rule (a single-layer phase is allowed; DP where max-cut is not
    contiguous); ``maxcut_rule="min_side"`` is our earlier rule (both sides >= 2 layers)."""

    n_layers: int = 8
    d_model: int = 64
    n_heads: int = 4
    epochs: int = 60
    n_train: int = 1400
    steps: int = 300
    batch_size: int = 64
    lr: float = 1e-3
    n_random: int = 5
    extra_k: tuple[int, ...] = (3, 4)
    seed: int = 0
    maxcut_rule: str = "official"

    def __post_init__(self) -> None:
        for f in ("n_layers", "d_model", "n_heads", "epochs", "n_train", "steps", "batch_size", "n_random"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"DigitsConfig.{f} must be a positive integer, got {v!r}")
        if self.n_layers < 4:
            raise ValueError(f"DigitsConfig.n_layers must be >= 4 (two phases of >= 2 layers), got {self.n_layers}")
        if self.maxcut_rule not in MAXCUT_RULES:
            raise ValueError(f"DigitsConfig.maxcut_rule must be one of {MAXCUT_RULES}, got {self.maxcut_rule!r}")
        if not self.n_train < 1797:
            raise ValueError(f"DigitsConfig.n_train must leave held-out digits (< 1797), got {self.n_train}")


@dataclass
class DinoV2Config:
    """Raptor on a real ViT (``spec``, default ``zoo:dinov2-s14``) and real images (Fashion-MNIST when installed,
    else the digits; :func:`real_image_split`): phases, Raptor fits for each k of ``ks`` (DP phases) and, with
    ``ablations``, the k = 3 ablation rows. Defaults: the 300-step run of docs/raptor.md."""

    spec: str = "zoo:dinov2-s14"
    dataset: str = "auto"
    n_train: int = 500
    n_test: int = 300
    size: int = 56
    steps: int = 300
    batch_size: int = 8
    lr: float = 1e-3
    ks: tuple[int, ...] = (2, 3)
    ablations: bool = True
    seed: int = 0


# ----------------------------------------------------------------------------------------- images
def fashion_mnist_images(split: str = "train", n: int | None = None, size: int = 56, seed: int = 0,
                         root: str | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """``n`` seeded-random Fashion-MNIST images of ``split`` (``"train"`` / ``"t10k"``; Debian package
    ``dataset-fashion-mnist``) as ``[n, 3, size, size]`` (bilinear, grey replicated, ImageNet normalisation)."""
    from interp.models.misd import FASHION_MNIST_ROOT, load_fashion_mnist
    x, y = load_fashion_mnist(split, root=root or FASHION_MNIST_ROOT)
    idx = np.random.default_rng(seed).permutation(len(y))[:n] if n is not None else np.arange(len(y))
    t = torch.tensor(x[idx], dtype=torch.float32)[:, None] / 255.0
    if size != 28:
        t = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    t = (t.expand(-1, 3, -1, -1) - IMAGENET_MEAN) / IMAGENET_STD
    return t.contiguous(), y[idx]


def real_image_split(dataset: str = "auto", n_train: int = 500, n_test: int = 300, size: int = 56, seed: int = 0):
    """Train / held-out real images: Fashion-MNIST (its train and t10k splits) when installed (``"auto"``),
    else the scikit-learn digits (a seeded split). Returns ``(name, x_tr, y_tr, x_te, y_te)``."""
    if dataset not in ("auto", "fashion-mnist", "digits"):
        raise ValueError(f"dataset must be 'auto', 'fashion-mnist' or 'digits', got {dataset!r}")
    if dataset == "auto":
        from interp.models.misd import has_fashion_mnist
        dataset = "fashion-mnist" if has_fashion_mnist() else "digits"
    if dataset == "fashion-mnist":
        xtr, ytr = fashion_mnist_images("train", n_train, size, seed)
        xte, yte = fashion_mnist_images("t10k", n_test, size, seed)
        return dataset, xtr, ytr, xte, yte
    x, y = digits_images(size)
    perm = np.random.default_rng(seed).permutation(len(y))[: n_train + n_test]
    tr, te = perm[:n_train], perm[n_train:]
    return dataset, x[tr], y[tr], x[te], y[te]


# ----------------------------------------------------------------------------------------- one Raptor fit
def fit_run(name: str, acts_tr, y_tr, acts_te, y_te, rcfg: RaptorConfig, tcfg: RaptorTrainConfig, final_norm,
            seed: int = 0) -> dict:
    """Train one Raptor on ``acts_tr`` and evaluate it on ``acts_te``: a JSON row (per-layer R²: ours per feature
    and pooled, and the official one (``r2_official``, its mean ``mean_r2_official`` and last-layer value
    ``end_r2_official``); probe accuracies of the teacher's last layer and the rollout; final losses; configs)."""
    torch.manual_seed(seed)
    raptor = Raptor(rcfg)
    t0 = time.process_time()
    hist = train_raptor(raptor, acts_tr, tcfg)
    secs = time.process_time() - t0
    fit = evaluate_raptor(raptor, acts_tr, y_tr, acts_te, y_te, final_norm=final_norm, name=name)
    return dict(name=name, thresholds=list(rcfg.thresholds), r2=fit.r2.tolist(), mean_r2=fit.mean_r2,
                r2_pooled=fit.r2_pooled.tolist(), mean_r2_pooled=float(fit.r2_pooled.mean()),
                r2_official=fit.r2_official.tolist(), mean_r2_official=fit.mean_r2_official,
                end_r2_official=fit.end_r2_official,
                probe_acc_teacher=fit.probe_acc_teacher, probe_acc_raptor=fit.probe_acc_raptor,
                relative_acc=fit.relative_acc, train_cpu_seconds=secs,
                final_loss={k: v[-1] for k, v in hist.losses.items() if v}, raptor_config=asdict(rcfg),
                train_config=asdict(tcfg))


def probe_baselines(acts_tr, y_tr, acts_te, y_te, final_norm) -> dict:
    """Linear-probe accuracy (the probe of :func:`evaluate_raptor`: through ``final_norm``, CLS ‖ mean patch) of
    the teacher's block input ``a_0``, its block-0 output ``a_1`` and its last layer: what a rollout's probe
    accuracy must be compared with (a probe on block 0's output needs no recurrence at all)."""
    f = lambda x: probe_features(x, final_norm).numpy()  # noqa: E731
    out = {}
    for key, layer in (("input", 0), ("block0", 1), ("last", -1)):
        out[f"probe_acc_{key}"] = linear_probe_accuracy(f(acts_tr[layer]), y_tr, f(acts_te[layer]), y_te)
    return out


# ----------------------------------------------------------------------------------------- digits recipe
def _teacher_config(cfg: DigitsConfig, p_drop: float):
    import transformers as T
    return T.Dinov2Config(hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                          mlp_ratio=4, image_size=8, patch_size=2, num_channels=1, num_labels=10,
                          drop_path_rate=p_drop, layerscale_value=1.0,
                          architectures=["Dinov2ForImageClassification"])


def _digits_data(cfg: DigitsConfig):
    x, y = digits_images(8, channels=1, normalize=False)
    x = (x - 0.5) / 0.5
    perm = np.random.default_rng(cfg.seed).permutation(len(y))
    return x, y, perm[:cfg.n_train], perm[cfg.n_train:]


def train_digits_teacher(cfg: DigitsConfig, p_drop: float) -> dict[str, torch.Tensor]:
    """A DINOv2-architecture ViT on 8x8 digits (2x2 patches: 16 patch tokens + CLS) trained with stochastic depth
    ``p_drop`` (AdamW 1e-3, weight decay 0.05, one-cycle schedule, batch 64); returns its state dict."""
    import transformers as T
    torch.manual_seed(cfg.seed)
    clf = T.Dinov2ForImageClassification(_teacher_config(cfg, p_drop))
    x, y, tr, _ = _digits_data(cfg)
    yt = torch.tensor(y)
    idx = torch.as_tensor(tr)
    opt = torch.optim.AdamW(clf.parameters(), lr=1e-3, weight_decay=0.05)
    steps = cfg.epochs * ((len(idx) + 63) // 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(cfg.seed)
    clf.train()
    for _ in progress(range(cfg.epochs), desc=f"digits teacher p={p_drop}"):
        order = idx[torch.randperm(len(idx), generator=g)]
        for b in range(0, len(order), 64):
            j = order[b:b + 64]
            loss = F.cross_entropy(clf(pixel_values=x[j]).logits, yt[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return {k: v.detach().contiguous() for k, v in clf.state_dict().items()}


def digits_teacher_model(cfg: DigitsConfig, p_drop: float, state: dict[str, torch.Tensor]):
    """The teacher ``Dinov2ForImageClassification`` with ``state`` loaded (eval mode)."""
    import transformers as T
    clf = T.Dinov2ForImageClassification(_teacher_config(cfg, p_drop))
    clf.load_state_dict(state)
    return clf.eval()


def digits_unit(cfg: DigitsConfig, p_drop: float, stages) -> dict:
    """One teacher of the digits recipe: the teacher (a stage), its test accuracy, layer similarity and phases,
    the probe baselines, and the Raptor fits (each a stage): k = L, k = 2 (max-cut; DP if max-cut is not
    contiguous), k = 2 TF only, k = 2 TF->AR stage 1 only, ``n_random`` random contiguous 2-block splits, and
    ``extra_k`` phases."""
    import interp
    tag = f"p{p_drop:g}"
    state = stages(f"teacher-{tag}", lambda: train_digits_teacher(cfg, p_drop))
    clf = digits_teacher_model(cfg, p_drop, state)
    x, y, tr, te = _digits_data(cfg)
    with torch.no_grad():
        test_acc = float((clf(pixel_values=x[te]).logits.argmax(-1).numpy() == y[te]).mean())
    model = interp.wrap(clf.dinov2, None, backend="torch")
    L = model.cfg.n_layers
    dist = layer_distances(model, x[tr], batch_size=200)
    off = dist.cosine[~torch.eye(L, dtype=torch.bool)]
    acts_tr = teacher_activations(model, x[tr], batch_size=200)
    acts_te = teacher_activations(model, x[te], batch_size=200)
    fn = model.apply_ln_final
    base = dict(d_model=cfg.d_model, n_heads=cfg.n_heads)
    tcfg = RaptorTrainConfig(stage1_steps=cfg.steps, stage2_steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
                             seed=cfg.seed)

    def run(name: str, rc: RaptorConfig, t: RaptorTrainConfig = tcfg) -> dict:
        return stages(f"{tag}-{name.replace(' ', '_').replace('>', '')}",
                      lambda: fit_run(name, acts_tr, y[tr], acts_te, y[te], rc, t, fn, cfg.seed))
    maxcut = phases(dist, n_phases=2, method="maxcut", maxcut_rule=cfg.maxcut_rule)
    dp = phases(dist, n_phases=2, method="dp")
    parts = maxcut.parts if maxcut.contiguous else dp.parts
    rows = {"kL": run("kL", RaptorConfig(n_layers=L, thresholds=list(range(1, L)), **base)),
            "k2": run("k2", RaptorConfig.from_phases(parts, **base)),
            "k2 TF only": run("k2 TF only", RaptorConfig.from_phases(parts, **base),
                              replace(tcfg, anneal=False, stage2_steps=0)),
            "k2 TF->AR stage 1 only": run("k2 TF-AR stage1", RaptorConfig.from_phases(parts, **base),
                                          replace(tcfg, stage2_steps=0))}
    rand = []
    rng = np.random.default_rng(cfg.seed + 1)  # the same random splits for every teacher
    for _ in range(cfg.n_random):
        th = int(rng.integers(2, L - 1))  # both phases >= 2 layers; a repeated split reuses its run
        if [th] == rows["k2"]["thresholds"]:
            rand.append(rows["k2"])       # the same config and seed as the max-cut run: the same result
        else:
            rand.append(run(f"k2 random th{th}", RaptorConfig(n_layers=L, thresholds=[th], **base)))
    for k in cfg.extra_k:  # more phases (reported, not a criterion of the recipe)
        pk = phases(dist, n_phases=k, method="maxcut", maxcut_rule=cfg.maxcut_rule)
        if not pk.contiguous or len(pk.parts) != k:  # max-cut may stop early (no cluster of >= 4 layers left)
            pk = phases(dist, n_phases=k, method="dp")
        rows[f"k{k}"] = dict(run(f"k{k}", RaptorConfig.from_phases(pk.parts, **base)), parts=pk.parts)
    return dict(p_drop=p_drop, test_acc=test_acc, mean_offdiag_cos_distance=float(off.mean()),
                mean_offdiag_similarity=float(1 - off.mean()), maxcut_k2=maxcut.parts, dp_k2=dp.parts,
                maxcut_k2_other_rule=phases(dist, n_phases=2, method="maxcut", maxcut_rule=next(
                    r for r in MAXCUT_RULES if r != cfg.maxcut_rule)).parts,
                phases_frac01=phases(dist, frac=0.1, maxcut_rule=cfg.maxcut_rule).parts, runs=rows,
                random_mean_r2=float(np.mean([r["mean_r2"] for r in rand])),
                random_mean_r2_official=float(np.mean([r["mean_r2_official"] for r in rand])),
                random_r2_official=[r["mean_r2_official"] for r in rand],
                random_r2=[r["mean_r2"] for r in rand], random_thresholds=[r["thresholds"] for r in rand],
                **probe_baselines(acts_tr, y[tr], acts_te, y[te], fn))


# ----------------------------------------------------------------------------------------- real ViT
def dinov2_unit(cfg: DinoV2Config, stages) -> dict:
    """Phases, Raptor fits (k in ``ks``, DP phases) and the k = 3 ablation rows on ``cfg.spec`` with real images
    (:func:`real_image_split`), with the probe baselines (block input, block-0 output, last layer)."""
    import interp
    model = interp.load(cfg.spec, backend="torch")
    dataset, x_tr, y_tr, x_te, y_te = real_image_split(cfg.dataset, cfg.n_train, cfg.n_test, cfg.size, cfg.seed)
    acts_tr = teacher_activations(model, x_tr, batch_size=50)
    acts_te = teacher_activations(model, x_te, batch_size=50)
    # the same numbers as layer_distances(model, images) (block outputs = acts[1:]), without a second pass
    cos, mse = distances_from_stack(token_summaries(torch.cat([acts_tr, acts_te], dim=1)[1:]))
    dist = LayerDistances(cosine=cos, mse=mse, n_images=acts_tr.shape[1] + acts_te.shape[1])
    summary: dict = {"dataset": dataset, "cosine": dist.cosine.tolist(), "phases": {}}
    for method in ("maxcut", "dp"):
        for frac in (0.2, 0.1, 0.09, 0.05):
            summary["phases"][f"{method}/frac={frac}"] = phases(dist, frac=frac, method=method).parts
        for k in (2, 3, 4):
            summary["phases"][f"{method}/k={k}"] = phases(dist, n_phases=k, method=method).parts
    base = dict(d_model=model.cfg.d_model, n_heads=model.cfg.n_heads)
    tcfg = RaptorTrainConfig(stage1_steps=cfg.steps, stage2_steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
                             seed=cfg.seed)
    fn = model.apply_ln_final

    def run(name: str, rc: RaptorConfig, t: RaptorTrainConfig) -> dict:
        return stages(f"dinov2-{name.replace(' ', '_').replace('+', 'plus')}",
                      lambda: fit_run(name, acts_tr, y_tr, acts_te, y_te, rc, t, fn, cfg.seed))
    rows = [run(f"k{k}", RaptorConfig.from_phases(phases(dist, n_phases=k, method="dp").parts, **base), tcfg)
            for k in cfg.ks]
    if cfg.ablations:
        parts = phases(dist, n_phases=3, method="dp").parts
        for name, ab in ABLATIONS.items():
            if ab["stage2"]:
                continue  # the k3 run
            rcfg = RaptorConfig.from_phases(parts, depth_scaling=ab["depth_scaling"], **base)
            t = replace(tcfg, anneal=ab["anneal"], cls_weighting=ab["cls_weighting"], stage2_steps=0)
            rows.append(run(f"ablation k3 {name}", rcfg, t))
    summary.update(runs=rows, L=model.cfg.n_layers, **probe_baselines(acts_tr, y_tr, acts_te, y_te, fn))
    return summary

