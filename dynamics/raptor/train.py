"""Raptor training (Stage 1 per-segment TF -> AR annealing, Stage 2 end-to-end AR) and its metrics.

Re-implemented from the digest (§7) and the official ``trainer.py``:

* Stage 1: each block ``j`` is trained alone on its teacher segment (input layer ``s`` to output layer ``e``).
  ``loss = r * TF + (1 - r) * AR``: TF predicts ``a_{l+1}`` from the teacher's ``a_l`` for every ``l`` of the
  segment in parallel; AR rolls out from ``a_s`` through the segment and averages the per-step loss;
  ``r = max(tf_min, 1 - step / (tf_anneal_frac * steps))`` (linear 1 -> 0 over the first 25% of the steps).
  Loss: MSE, on the last segment the token-type weighted MSE (cls 0.34, registers 0.33, patches 0.33).
* Stage 2: all blocks together, autoregressive from ``a_0`` through every layer, the per-step loss averaged over
  the layers (as the code's ``autoreg_pass``), weighted MSE cls 0.45, registers 0.10, patches 0.45 ("cls
  weighting").
* AdamW (lr 3e-4, wd 1e-4), linear warmup then cosine to 1e-6, gradient clipping at 1.0, input noise 0.

Choices where the digest is silent: a model without registers renormalises the token-type weights over CLS and
patches (0.34/0.33 -> 0.507/0.493; 0.45/0.45 -> 0.5/0.5); the weighted MSE averages within each type first (as
the code). The ablation switches: ``anneal=False`` keeps ``r = 1`` (TF only), ``cls_weighting=False`` uses plain
MSE everywhere, ``stage2_steps=0`` skips stage 2; ``RaptorConfig.depth_scaling=False`` drops ``t_proj``.
``normalize_layers=True`` (our option, not in the official code; default off) divides every layer's loss term by the
teacher's variance at that layer (mean over features of the variance over images and tokens, on the training
stream), so that each layer counts as it does in the mean per-layer R²; with the official plain MSE a layer counts in
proportion to its variance, which in a ViT grows with depth (30x from layer 1 to layer 8 on the digits teacher).
Each unit (stage-1 segment, stage 2) has its own optimiser and schedule. Batches are drawn by a generator
seeded from ``(seed, unit, step)``, so a run resumed from a checkpoint continues exactly.
"""
from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from interp.io import load_json, load_tensors, load_torch, output_dir, save_tensors_json
from interp.progress import progress
from interp.results import Result

from .model import Raptor

__all__ = ["RaptorTrainConfig", "RaptorTraining", "RaptorFit", "teacher_activations", "train_raptor", "layer_r2",
           "r2_score_official", "layer_r2_official", "probe_features", "linear_probe_accuracy", "evaluate_raptor",
           "weighted_mse"]


@dataclass
class RaptorTrainConfig:
    """Training schedule (defaults: the paper's optimiser; step counts scaled for CPU)."""

    stage1_steps: int = 300
    stage2_steps: int = 300
    batch_size: int = 32
    lr: float = 3e-4
    weight_decay: float = 1e-4
    lr_min: float = 1e-6
    warmup_frac: float = 0.032          # 10k of 312.5k steps in the paper
    grad_clip: float = 1.0
    tf_anneal_frac: float = 0.25
    tf_min: float = 0.0
    anneal: bool = True                 # False: teacher forcing only (the "TF only" ablation row)
    cls_weighting: bool = True
    last_segment_weights: tuple[float, float, float] = (0.34, 0.33, 0.33)
    stage2_weights: tuple[float, float, float] = (0.45, 0.10, 0.45)
    n_registers: int = 0
    normalize_layers: bool = False      # divide each layer's loss by the teacher's variance there (not official)
    seed: int = 0
    checkpoint_every: int = 100

    def __post_init__(self):
        for name in ("stage1_steps", "stage2_steps", "n_registers"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"RaptorTrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_size", "checkpoint_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"RaptorTrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "grad_clip", "tf_anneal_frac"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RaptorTrainConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("weight_decay", "lr_min"):
            if getattr(self, name) < 0:
                raise ValueError(f"RaptorTrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.warmup_frac < 1 or not 0 <= self.tf_min <= 1:
            raise ValueError("RaptorTrainConfig.warmup_frac must be in [0, 1) and tf_min in [0, 1]")
        for name in ("last_segment_weights", "stage2_weights"):
            w = tuple(float(x) for x in getattr(self, name))
            if len(w) != 3 or min(w) < 0 or sum(w) <= 0:
                raise ValueError(f"RaptorTrainConfig.{name} must be 3 non-negative weights (cls, registers, "
                                 f"patches) with a positive sum; got {getattr(self, name)}")
            setattr(self, name, w)


def weighted_mse(pred: torch.Tensor, target: torch.Tensor, weights: Sequence[float] | None,
                 n_registers: int = 0) -> torch.Tensor:
    """MSE over ``[..., tokens, d]``; with ``weights = (cls, registers, patches)`` the per-type MSEs are mixed
    (weights of absent types dropped and the rest renormalised)."""
    if weights is None:
        return torch.mean((pred - target) ** 2)
    groups = [slice(0, 1), slice(1, 1 + n_registers), slice(1 + n_registers, None)]
    sizes = [1, n_registers, pred.shape[-2] - 1 - n_registers]
    terms = [(w, torch.mean((pred[..., g, :] - target[..., g, :]) ** 2)) for w, g, n in zip(weights, groups, sizes)
             if n > 0 and w > 0]
    total = sum(w for w, _ in terms)
    return sum(w * t for w, t in terms) / total


@torch.no_grad()
def teacher_activations(model, images: torch.Tensor | None = None, batch_size: int = 32) -> torch.Tensor:
    """Teacher stream ``[L + 1, N, tokens, d]``: the block input ``a_0`` (``blocks.0.hook_resid_pre``) and every
    block output, captured through the public capture layer in batches (any backend). ``images=None``: the
    built-in digits (:func:`interp.data.digits_sample`)."""
    if images is None:
        from interp.data import digits_sample
        images = digits_sample(model)[0]
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise ValueError(f"images must be a float tensor [N, C, H, W]; got {getattr(images, 'shape', type(images))}")
    names = ["blocks.0.hook_resid_pre"] + model.hook_names("blocks.*.hook_resid_post")
    chunks = []
    for start in progress(range(0, images.shape[0], batch_size), desc="teacher activations"):
        _, cache = model.run_with_cache(images[start:start + batch_size], names=names)
        chunks.append(torch.stack([cache[n] for n in names]).float())
    return torch.cat(chunks, dim=1)


@dataclass
class RaptorTraining(Result):
    """Loss curves per unit (``"stage1/block{j}"``, ``"stage2"``) and the configs used."""

    losses: dict[str, list[float]]
    train_config: dict
    raptor_config: dict
    kind = "raptor.training"

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{"unit": u, "step": i, "loss": v} for u, vals in self.losses.items() for i, v in enumerate(vals)])

    def figure(self):
        import plotly.graph_objects as go
        fig = go.Figure()
        for u, vals in self.losses.items():
            fig.add_trace(go.Scatter(y=vals, name=u, mode="lines"))
        return fig.update_layout(title="Raptor training loss", xaxis_title="step", yaxis_title="loss", yaxis_type="log")


def _lr_at(step: int, steps: int, cfg: RaptorTrainConfig) -> float:
    warm = int(cfg.warmup_frac * steps)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    p = (step - warm) / max(1, steps - warm)
    return cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * p))


# Not the training kit's checkpoint (interp.training.train_lm), on purpose: the kit checkpoints one loop (the whole
# model, one optimizer and schedule, ``step`` equal to the number of losses), while a Raptor run trains several
# units in turn, each with its own optimizer and batches seeded from (seed, unit, step), so its state is the unit
# in progress, its step, the finished units and their losses, and the Raptor config it was written for. What the
# two have in common is already shared: the kernel's atomic write (interp.io.output_dir: the folder appears whole
# or not at all) and its checked readers (load_json, load_tensors, load_torch with weights_only=True).
def _save_checkpoint(path: Path, raptor: Raptor, opt, state: dict) -> None:
    buf = io.BytesIO()
    torch.save(opt.state_dict() if opt is not None else {}, buf)  # read back with weights_only=True
    with output_dir(path, writer="train_raptor checkpoint") as tmp:
        save_tensors_json(tmp, raptor.state_dict(), state, tensor_file="model.safetensors", json_file="state.json",
                          indent=None)
        (tmp / "optimizer.pt").write_bytes(buf.getvalue())


def _load_checkpoint(path: Path, raptor: Raptor) -> tuple[dict, dict] | None:
    if not (path / "state.json").is_file():
        return None
    state = load_json(path / "state.json", what="Raptor training checkpoint", required=("raptor_config",))
    if state.get("raptor_config") != asdict(raptor.cfg):
        raise ValueError(f"checkpoint at {path} was written for another Raptor config: {state.get('raptor_config')}")
    raptor.load_state_dict(load_tensors(path / "model.safetensors", what="Raptor training checkpoint")[0])
    opt_state = load_torch(path / "optimizer.pt", what="Raptor optimizer state")
    return state, opt_state


def train_raptor(raptor: Raptor, acts: torch.Tensor, cfg: RaptorTrainConfig | None = None,
                 checkpoint: str | Path | None = None) -> RaptorTraining:
    """Train ``raptor`` on the teacher stream ``acts [L + 1, N, tokens, d]`` (from :func:`teacher_activations`).

    With ``checkpoint`` (a folder), the state is written atomically every ``checkpoint_every`` steps and at the
    end of every unit; calling again with the same folder resumes where it stopped (finished units are skipped).
    """
    cfg = cfg or RaptorTrainConfig()
    L = raptor.cfg.n_layers
    if acts.dim() != 4 or acts.shape[0] != L + 1 or acts.shape[-1] != raptor.cfg.d_model:
        raise ValueError(f"acts must be [L + 1 = {L + 1}, N, tokens, {raptor.cfg.d_model}]; got {tuple(acts.shape)}")
    if acts.shape[-2] < 2 + cfg.n_registers:
        raise ValueError(f"acts have {acts.shape[-2]} tokens; need CLS, {cfg.n_registers} registers and patches")
    bounds = [0] + raptor.cfg.thresholds + [L]
    units = [(f"stage1/block{j}", j, bounds[j], bounds[j + 1], cfg.stage1_steps) for j in range(raptor.cfg.n_blocks)]
    if cfg.stage2_steps:
        units.append(("stage2", None, 0, L, cfg.stage2_steps))
    losses: dict[str, list[float]] = {}
    done: list[str] = []
    resume_unit, resume_step, resume_opt = None, 0, None
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None:
        loaded = _load_checkpoint(ckpt, raptor)
        if loaded is not None:
            state, resume_opt = loaded
            losses, done = state["losses"], state["done"]
            resume_unit, resume_step = state.get("unit"), state.get("step", 0)
    N = acts.shape[1]
    # per-layer loss scale [L + 1]: 1 / teacher std at each layer (normalize_layers), else 1
    if cfg.normalize_layers:
        var = torch.stack([acts[l].double().flatten(0, -2).var(0).mean() for l in range(L + 1)])
        scale = var.clamp_min(1e-12).rsqrt().float()
    else:
        scale = torch.ones(L + 1)
    for u, (name, j, s, e, steps) in enumerate(units):
        if name in done or steps == 0:
            continue
        params = list(raptor.parameters()) if j is None else list(raptor.blocks[j].parameters())
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        start = 0
        if resume_unit == name and resume_opt:
            opt.load_state_dict(resume_opt)
            start = resume_step
        hist = losses.setdefault(name, [])[:start]
        losses[name] = hist
        last = e == L
        w = (cfg.stage2_weights if j is None else cfg.last_segment_weights) if cfg.cls_weighting and (last or j is None) else None
        loss_fn = lambda p, t: weighted_mse(p, t, w, cfg.n_registers)  # noqa: E731
        t_seg = torch.arange(s + 1, e + 1, dtype=torch.float32)[:, None]
        sc = scale[s + 1:e + 1].view(-1, 1, 1, 1)                         # [n, 1, 1, 1]
        raptor.train()
        for step in progress(range(start, steps), desc=f"raptor {name}", total=steps, initial=start):
            g = torch.Generator().manual_seed(hash((cfg.seed, u, step)) % (2 ** 63))
            idx = torch.randint(N, (min(cfg.batch_size, N),), generator=g)
            seq = acts[s:e + 1, idx]                                          # [n + 1, B, T, d]
            r = max(cfg.tf_min, 1 - step / (cfg.tf_anneal_frac * steps)) if cfg.anneal else 1.0
            if j is None:
                r = 0.0                                                       # stage 2: autoregressive only
            loss = torch.zeros(())
            if r > 0:
                block = raptor.blocks[j]
                loss = loss + r * loss_fn(sc * block(seq[:-1], t_seg.expand(-1, seq.shape[1])), sc * seq[1:])
            if r < 1:
                roll = sc * raptor(seq[0], s, e)
                ar = torch.stack([loss_fn(roll[i], sc[i] * seq[i + 1]) for i in range(e - s)]).mean()
                loss = loss + (1 - r) * ar
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, steps, cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            hist.append(float(loss.detach()))
            if ckpt is not None and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < steps:
                _save_checkpoint(ckpt, raptor, opt, dict(losses=losses, done=done, unit=name, step=step + 1,
                                                         raptor_config=asdict(raptor.cfg)))
        done.append(name)
        if ckpt is not None:
            _save_checkpoint(ckpt, raptor, None, dict(losses=losses, done=done, unit=None, step=0,
                                                      raptor_config=asdict(raptor.cfg)))
    raptor.eval()
    return RaptorTraining(losses=losses, train_config=asdict(cfg), raptor_config=asdict(raptor.cfg))


@torch.no_grad()
def layer_r2(raptor: Raptor, acts: torch.Tensor, batch_size: int = 64,
             average: str = "uniform") -> tuple[torch.Tensor, torch.Tensor]:
    """Our per-layer R² of the rollout from ``a_0`` against the teacher, ``[L]``, and the rollout's last layer
    ``[N, tokens, d]``. ``average="uniform"``: per feature over all (image, token) samples, averaged over the d
    features (``sklearn.metrics.r2_score``'s default); ``"variance_weighted"`` pools the features
    (``1 - SSE / SST``), which low-variance features cannot drive to large negative values. Neither is the
    official code's quantity: that is :func:`layer_r2_official` (one scalar mean, of the prediction), which is
    larger wherever the per-feature means differ (the feature means count as explained variance)."""
    if average not in ("uniform", "variance_weighted"):
        raise ValueError(f"average must be 'uniform' or 'variance_weighted', got {average!r}")
    L = raptor.cfg.n_layers
    raptor.eval()
    sse = torch.zeros(L, acts.shape[-1], dtype=torch.float64)
    last = []
    for start in range(0, acts.shape[1], batch_size):
        roll = raptor(acts[0, start:start + batch_size])
        sse += ((roll.double() - acts[1:, start:start + batch_size].double()) ** 2).sum(dim=(1, 2))
        last.append(roll[-1])
    y = acts[1:].double().flatten(1, 2)                                         # [L, N*T, d]
    sst = ((y - y.mean(1, keepdim=True)) ** 2).sum(1).clamp_min(1e-12)
    if average == "variance_weighted":
        return (1 - sse.sum(-1) / sst.sum(-1)).float(), torch.cat(last)
    return (1 - sse / sst).mean(-1).float(), torch.cat(last)


R2_OFFICIAL_EPS = 1e-6  #: the ``Epsilon`` added to the denominator by ``overcomplete.metrics.r2_score``


def r2_score_official(pred: torch.Tensor, target: torch.Tensor) -> float:
    """The official Raptor R² (``trainer.py``'s ``validation_step`` calls ``overcomplete.metrics.r2_score(pred,
    a_end)`` on ``[(batch tokens), d]``), re-implemented::

        R² = 1 - mean((pred - target)²) / (mean((pred - m)²) + 1e-6),   m = mean(pred) (one scalar)

    Note what the denominator is: the variance of the **prediction** (the Raptor rollout, the first argument in
    the official call), not of the teacher, around **one scalar mean over all its entries** (every image, token
    and feature), not per feature; ``1e-6`` is the library's ``Epsilon``. So per-feature offsets count as
    explained variance and the score is not symmetric in its arguments. ``pred``, ``target``: any equal shapes
    ``[..., d]`` (the means are over all entries, so flattening to ``[(b t), d]`` does not matter); computed in
    float64. Compare :func:`layer_r2` (ours: per feature, teacher's variance).
    """
    if pred.shape != target.shape:
        raise ValueError(f"pred and target must have the same shape; got {tuple(pred.shape)} and {tuple(target.shape)}")
    if pred.numel() == 0:
        raise ValueError("r2_score_official needs at least one entry")
    x, y = pred.double(), target.double()
    ss_res = torch.mean((x - y) ** 2)
    ss_tot = torch.mean((x - x.mean()) ** 2)
    return float(1 - ss_res / (ss_tot + R2_OFFICIAL_EPS))


@torch.no_grad()
def layer_r2_official(raptor: Raptor, acts: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """The official R² (:func:`r2_score_official`) of the rollout from ``a_0`` at every layer, ``[L]``.

    Entry ``l - 1`` is what the official ``validation_step(start_layer=0, end_layer=l)`` reports: the rollout
    from ``a_0`` to layer ``l`` scored against the teacher's layer ``l``, per batch of ``batch_size`` images (the
    official validation batch: 64) and averaged over the batches weighted by their size (the official
    ``r2s += r2 * batch_size; r2s / num_samples``). The official trainer logs the entry of its end layer
    (``[-1]`` for a full rollout); the mean over layers is the digest's "mean per-layer R²" with the official R².
    Batches are taken in the order of ``acts [L + 1, N, tokens, d]`` (the official loader shuffles).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    L = raptor.cfg.n_layers
    if acts.dim() != 4 or acts.shape[0] != L + 1:
        raise ValueError(f"acts must be [L + 1 = {L + 1}, N, tokens, d]; got {tuple(acts.shape)}")
    raptor.eval()
    total = torch.zeros(L, dtype=torch.float64)
    N = acts.shape[1]
    for start in range(0, N, batch_size):
        roll = raptor(acts[0, start:start + batch_size]).double()                 # [L, B, T, d]
        tgt = acts[1:, start:start + batch_size].double()
        ss_res = ((roll - tgt) ** 2).mean(dim=(1, 2, 3))
        ss_tot = ((roll - roll.mean(dim=(1, 2, 3), keepdim=True)) ** 2).mean(dim=(1, 2, 3))
        total += (1 - ss_res / (ss_tot + R2_OFFICIAL_EPS)) * roll.shape[1]
    return (total / N).float()


def probe_features(resid: torch.Tensor, final_norm: Callable[[torch.Tensor], torch.Tensor] | None,
                   n_registers: int = 0) -> torch.Tensor:
    """DINOv2 linear-head features: final norm, then CLS ‖ mean of patch tokens. ``[N, T, d] -> [N, 2d]``."""
    x = final_norm(resid) if final_norm is not None else resid
    return torch.cat([x[:, 0], x[:, 1 + n_registers:].mean(1)], dim=-1)


def linear_probe_accuracy(train_x, train_y, test_x, test_y, C: float = 1.0, seed: int = 0) -> float:
    """Held-out accuracy of a multinomial logistic-regression probe on standardised features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000, random_state=seed))
    clf.fit(np.asarray(train_x, dtype=np.float64), np.asarray(train_y))
    return float(clf.score(np.asarray(test_x, dtype=np.float64), np.asarray(test_y)))


@dataclass
class RaptorFit(Result):
    """Fit of a Raptor against its teacher on held-out images: per-layer R² ``[L]`` and probe accuracies.

    ``r2``: ours, per feature (:func:`layer_r2`); ``r2_pooled``: ours, variance-weighted; ``r2_official``: the
    official R² at every layer (:func:`layer_r2_official`; its last entry is what the official trainer logs)."""

    name: str
    r2: torch.Tensor
    probe_acc_teacher: float | None = None
    probe_acc_raptor: float | None = None
    r2_pooled: torch.Tensor | None = None      #: variance-weighted R² per layer
    r2_official: torch.Tensor | None = None    #: the official R² per layer
    kind = "raptor.fit"

    @property
    def mean_r2(self) -> float:
        return float(self.r2.mean())

    @property
    def mean_r2_official(self) -> float | None:
        """Mean over layers of the official R² (the digest's "mean per-layer R²" with the official R²)."""
        return None if self.r2_official is None else float(self.r2_official.mean())

    @property
    def end_r2_official(self) -> float | None:
        """The official R² at the last layer: the number the official trainer logs for a full rollout."""
        return None if self.r2_official is None else float(self.r2_official[-1])

    @property
    def relative_acc(self) -> float | None:
        if self.probe_acc_teacher is None or self.probe_acc_raptor is None:
            return None
        return self.probe_acc_raptor / self.probe_acc_teacher

    def to_frame(self):
        import pandas as pd
        cols = {"name": self.name, "layer": np.arange(1, len(self.r2) + 1), "r2": self.r2.numpy()}
        if self.r2_official is not None:
            cols["r2_official"] = self.r2_official.numpy()
        return pd.DataFrame(cols)

    def figure(self):
        import plotly.graph_objects as go
        return go.Figure(go.Scatter(x=list(range(1, len(self.r2) + 1)), y=self.r2.tolist(), mode="lines+markers",
                                    name=self.name)).update_layout(title=f"Raptor {self.name}: per-layer R²",
                                                                   xaxis_title="layer", yaxis_title="R²")


@torch.no_grad()
def evaluate_raptor(raptor: Raptor, train_acts: torch.Tensor, train_y, test_acts: torch.Tensor, test_y,
                    final_norm: Callable[[torch.Tensor], torch.Tensor] | None = None, n_registers: int = 0,
                    name: str = "raptor") -> RaptorFit:
    """Per-layer R² on ``test_acts`` (ours per feature and pooled, and the official one) and linear-probe accuracy
    (trained on the train split's features, scored on the test split) of the teacher's last layer vs the Raptor
    rollout, both through ``final_norm`` (e.g. ``model.apply_ln_final``)."""
    r2, test_last = layer_r2(raptor, test_acts)
    r2_pooled, _ = layer_r2(raptor, test_acts, average="variance_weighted")
    r2_official = layer_r2_official(raptor, test_acts)
    _, train_last = layer_r2(raptor, train_acts)
    f = lambda x: probe_features(x, final_norm, n_registers).numpy()  # noqa: E731
    acc_t = linear_probe_accuracy(f(train_acts[-1]), train_y, f(test_acts[-1]), test_y)
    acc_r = linear_probe_accuracy(f(train_last), train_y, f(test_last), test_y)
    return RaptorFit(name=name, r2=r2, probe_acc_teacher=acc_t, probe_acc_raptor=acc_r, r2_pooled=r2_pooled,
                     r2_official=r2_official)
