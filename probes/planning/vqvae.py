"""Set VQ-VAE: compress a variable-size set of hidden states into one discrete code (digest §4, step 2).

Architecture (sizes are UNCERTAIN in the paper; ours are CPU-scale defaults, :class:`VQVAEConfig`):

* **Input normalisation.** Each state is standardised by per-layer statistics fitted on the training
  sets (mean vector and one scalar RMS scale per layer), because residual-stream norms differ by orders
  of magnitude across layers; the statistics are buffers saved with the model. ``normalize="feature"``
  (opt-in) divides every feature by its own per-layer standard deviation instead (floored at 1e-3 of the
  layer's median feature std): residual streams of real models can hold a few massive-activation features
  (SmolLM2-135M layer 20: one feature carries 93% of the variance of the block states, values up to ~910
  layer-RMS units), and with one scalar scale the reconstruction loss is then spent on those features and
  the relative error of everything else stays near 1. ``"layer"`` (the default) keeps the scalar scale.
* **Encoder.** ``Linear(d_in, d_model)`` + learned layer embedding + learned position embedding for every
  state of the set, a learned summary token prepended, a pre-norm Transformer encoder over the set with
  padding masked, and ``Linear(d_model, d_latent)`` of the summary token: the latent ``r_S: [d_latent]``.
* **Quantiser.** ``k* = argmin_k ||r_S - e_k||^2`` over ``K`` codewords; the code is ``Z_S = k*``; the
  decoder receives ``e_{k*}`` through the straight-through estimator ``r + sg(e - r)``.
* **Decoder.** One query per state of the set, built from *separate* (layer, position) embeddings plus a
  projection of the quantised latent, a Transformer over the queries (padding masked), and a linear read-out
  of the standardised state. The decoder is told where each state sits, so the code only has to carry the
  content.

Loss ``L = L_rec + λ_q L_vq + λ_cos L_cos + λ_ent L_ent``:

* ``L_rec``: mean squared error over the real (unpadded) states of the standardised set;
* ``L_vq = ||sg(r) - e||^2 + β ||r - sg(e)||^2`` (codebook + commitment, β = 0.25 as in VQ-VAE);
* ``L_cos``: mean squared cosine similarity over distinct codeword pairs (diversity);
* ``L_ent = log K - H(p̄)`` where ``p̄`` is the batch mean of the soft assignments
  ``softmax(-||r - e_k||^2 / t)``: zero when the batch uses codes uniformly (against collapse).

Codebook initialisation and dead codes (our choice, documented): the codebook starts as encoder latents of
random training sets; every ``reinit_every`` steps each code that no training set chose since the previous
check is moved onto the latent of a random set of the current batch (plus 1% noise), as in common VQ-VAE
practice (e.g. Jukebox-style restarts). Training uses AdamW, a held-out validation split, early stopping on
the validation loss (the best weights are kept), a progress bar, and a seed that fixes everything.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from interp.io import output_dir
from interp.progress import progress

from .states import StateSets

__all__ = ["VQVAEConfig", "TrainConfig", "SetVQVAE", "train_vqvae"]


@dataclass
class VQVAEConfig:
    """Architecture and loss weights of a :class:`SetVQVAE` (``d_in`` = hidden size of the states)."""

    d_in: int
    n_codes: int = 64
    d_model: int = 64
    d_latent: int = 32
    n_heads: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 1
    max_layers: int = 64
    max_positions: int = 512
    beta: float = 0.25
    lambda_q: float = 1.0
    lambda_cos: float = 0.1
    lambda_ent: float = 0.1
    ent_temperature: float = 1.0
    normalize: str = "layer"     # "layer": one RMS scale per layer | "feature": one std per (layer, feature)


@dataclass
class TrainConfig:
    """Optimisation of a :class:`SetVQVAE`."""

    steps: int = 1500
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    val_fraction: float = 0.1
    eval_every: int = 100
    patience: int = 4            # evaluations without validation improvement before stopping
    reinit_every: int = 50       # dead-code check period (steps); 0 disables
    seed: int = 0
    device: str | None = None
    desc: str = "VQ-VAE"


class SetVQVAE(nn.Module):
    """Transformer set encoder -> one of ``K`` codewords -> set decoder; see the module docstring.

    ``forward(sets)`` returns the losses; :meth:`encode` returns the codes ``[N]``; :meth:`save` /
    :meth:`load` use safetensors + JSON.
    """

    def __init__(self, config: VQVAEConfig):
        super().__init__()
        c = self.config = config
        self.in_proj = nn.Linear(c.d_in, c.d_model)
        self.layer_emb = nn.Embedding(c.max_layers, c.d_model)
        self.pos_emb = nn.Embedding(c.max_positions, c.d_model)
        self.summary = nn.Parameter(torch.randn(c.d_model) * 0.02)
        enc = nn.TransformerEncoderLayer(c.d_model, c.n_heads, 2 * c.d_model, dropout=0.0, batch_first=True,
                                         norm_first=True)
        self.encoder = nn.TransformerEncoder(enc, c.n_encoder_layers, enable_nested_tensor=False)
        self.enc_norm = nn.LayerNorm(c.d_model)
        self.to_latent = nn.Linear(c.d_model, c.d_latent)
        self.codebook = nn.Parameter(torch.randn(c.n_codes, c.d_latent))
        self.from_latent = nn.Linear(c.d_latent, c.d_model)
        self.dec_layer_emb = nn.Embedding(c.max_layers, c.d_model)
        self.dec_pos_emb = nn.Embedding(c.max_positions, c.d_model)
        dec = nn.TransformerEncoderLayer(c.d_model, c.n_heads, 2 * c.d_model, dropout=0.0, batch_first=True,
                                         norm_first=True)
        self.decoder = nn.TransformerEncoder(dec, c.n_decoder_layers, enable_nested_tensor=False)
        self.dec_norm = nn.LayerNorm(c.d_model)
        self.out_proj = nn.Linear(c.d_model, c.d_in)
        self.register_buffer("layer_mean", torch.zeros(c.max_layers, c.d_in))
        self.register_buffer("layer_scale", torch.ones(c.max_layers))
        self.register_buffer("feature_scale", torch.ones(c.max_layers, c.d_in))
        if c.normalize not in ("layer", "feature"):
            raise ValueError(f"normalize must be 'layer' or 'feature', got {c.normalize!r}")

    # ------------------------------------------------------------------ pieces
    def fit_normalizer(self, sets: StateSets) -> None:
        """Per-layer mean ``[d_in]`` and RMS scale of the real states of ``sets`` (layers never seen: 0 / 1)."""
        x, layers = sets.states[sets.mask].double(), sets.layers[sets.mask].clamp(0, self.config.max_layers - 1)
        L = self.config.max_layers
        count = torch.bincount(layers, minlength=L).double()
        s = torch.zeros(L, x.shape[1], dtype=torch.float64).index_add_(0, layers, x)
        mean = s / count.clamp_min(1)[:, None]
        sq = torch.zeros(L, dtype=torch.float64).index_add_(0, layers, ((x - mean[layers]) ** 2).sum(1))
        scale = (sq / (count.clamp_min(1) * x.shape[1])).sqrt()
        scale = torch.where((count > 0) & (scale > 0), scale, torch.ones_like(scale))
        self.layer_mean.copy_(mean.float())
        self.layer_scale.copy_(scale.float())
        fs = torch.ones(L, x.shape[1], dtype=torch.float64)
        if self.config.normalize == "feature":
            # per-(layer, feature) std in units of the layer scale, floored so near-constant features stay finite
            sq_f = torch.zeros(L, x.shape[1], dtype=torch.float64).index_add_(0, layers, (x - mean[layers]) ** 2)
            std_f = (sq_f / count.clamp_min(1)[:, None]).sqrt() / scale[:, None]
            floor = 1e-3 * std_f.median(1, keepdim=True).values.clamp_min(1e-12)
            fs = torch.where(count[:, None] > 0, std_f.maximum(floor), fs)
        self.feature_scale.copy_(fs.float())

    def _standardise(self, states: torch.Tensor, layers: torch.Tensor) -> torch.Tensor:
        return (states - self.layer_mean[layers]) / (self.layer_scale[layers][..., None] * self.feature_scale[layers])

    def _indices(self, sets: StateSets, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        layers = sets.layers.to(device).clamp(0, c.max_layers - 1)
        pos = sets.positions.to(device).clamp(0, c.max_positions - 1)
        mask = sets.mask.to(device)
        x = self._standardise(sets.states.to(device, torch.float32), layers)
        return x, layers, pos, mask

    def latent(self, x: torch.Tensor, layers: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Encoder: standardised states ``[B, S, d_in]`` (+ indices, ``mask [B, S]`` True = real) -> ``[B, d_latent]``."""
        h = self.in_proj(x) + self.layer_emb(layers) + self.pos_emb(pos)
        h = torch.cat([self.summary.expand(h.shape[0], 1, -1), h], 1)
        pad = torch.cat([torch.zeros_like(mask[:, :1]), ~mask], 1)
        h = self.encoder(h, src_key_padding_mask=pad)
        return self.to_latent(self.enc_norm(h[:, 0]))

    def distances(self, r: torch.Tensor) -> torch.Tensor:
        """Squared distances ``[B, K]`` of latents ``[B, d_latent]`` to every codeword."""
        return (r.pow(2).sum(-1, keepdim=True) - 2 * r @ self.codebook.T + self.codebook.pow(2).sum(-1)[None])

    def decode(self, z: torch.Tensor, layers: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Decoder: quantised latents ``[B, d_latent]`` -> standardised states ``[B, S, d_in]`` at the given slots."""
        q = self.dec_layer_emb(layers) + self.dec_pos_emb(pos) + self.from_latent(z)[:, None]
        q = self.decoder(q, src_key_padding_mask=~mask)
        return self.out_proj(self.dec_norm(q))

    def forward(self, sets: StateSets) -> dict[str, torch.Tensor]:
        """Losses of one batch (``loss`` = the weighted total), the chosen codes ``[B]``, and the summed squared
        reconstruction error ``sse`` and squared standardised states ``ss`` over real (unpadded) states."""
        c = self.config
        x, layers, pos, mask = self._indices(sets, self.codebook.device)
        r = self.latent(x, layers, pos, mask)
        d = self.distances(r)
        codes = d.argmin(-1)
        e = self.codebook[codes]
        z = r + (e - r).detach()
        recon = self.decode(z, layers, pos, mask)
        m = mask.float()
        sq = (recon - x) ** 2
        l_rec = (sq.mean(-1) * m).sum() / m.sum()
        l_vq = F.mse_loss(e, r.detach()) + c.beta * F.mse_loss(r, e.detach())
        cb = F.normalize(self.codebook, dim=-1)
        g = cb @ cb.T
        k = g.shape[0]
        l_cos = (g.pow(2).sum() - g.diagonal().pow(2).sum()) / max(1, k * (k - 1))
        p_bar = F.softmax(-d / c.ent_temperature, -1).mean(0)
        l_ent = math.log(k) + (p_bar * torch.log(p_bar.clamp_min(1e-12))).sum()
        loss = l_rec + c.lambda_q * l_vq + c.lambda_cos * l_cos + c.lambda_ent * l_ent
        return {"loss": loss, "rec": l_rec, "vq": l_vq, "cos": l_cos, "ent": l_ent, "codes": codes, "latent": r,
                "sse": sq[mask].sum().detach(), "ss": (x ** 2)[mask].sum().detach()}

    # ------------------------------------------------------------------ use
    @torch.no_grad()
    def encode(self, sets: StateSets, batch_size: int = 512) -> torch.Tensor:
        """Codes ``LongTensor [N]`` of ``N`` state sets (padding ignored)."""
        was = self.training
        self.eval()
        out = []
        dev = self.codebook.device
        for i in range(0, len(sets), batch_size):
            x, layers, pos, mask = self._indices(sets[i:i + batch_size], dev)
            out.append(self.distances(self.latent(x, layers, pos, mask)).argmin(-1).cpu())
        self.train(was)
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)

    @torch.no_grad()
    def reconstruction_error(self, sets: StateSets, batch_size: int = 512) -> float:
        """Mean squared error of the reconstruction of standardised states, divided by their variance
        (0 = perfect, 1 = no better than the per-layer mean)."""
        was = self.training
        self.eval()
        out = [self(sets[i:i + batch_size]) for i in range(0, len(sets), batch_size)]
        self.train(was)
        return _relative_error(out)

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into the folder ``path`` (atomically)."""
        from safetensors.torch import save_file

        with output_dir(path, overwrite=overwrite, writer="SetVQVAE.save") as tmp:
            (tmp / "config.json").write_text(json.dumps({"type": "SetVQVAE", "config": asdict(self.config)}, indent=2))
            save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()},
                      str(tmp / "model.safetensors"))
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device | None = None) -> "SetVQVAE":
        """Read a model written by :meth:`save` (JSON + safetensors, no pickle).

        The saved configuration is checked against the weights' shapes before anything is allocated
        (:func:`interp.io.build_checked`); a missing, truncated, damaged or edited file raises
        :class:`interp.io.SerializationError` naming it.
        """
        from interp.io import SerializationError, build_checked, load_tensors_json

        path = Path(path)
        state, meta = load_tensors_json(path, tensor_file="model.safetensors", json_file="config.json",
                                        what="SetVQVAE", required=("type", "config"))
        if meta.get("type") != "SetVQVAE":
            raise TypeError(f"{path} does not hold a SetVQVAE")
        if not isinstance(meta["config"], dict):
            raise SerializationError(f"{path / 'config.json'}: 'config' must be an object, got {meta['config']!r}")
        try:
            config = VQVAEConfig(**meta["config"])
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"{path / 'config.json'}: not a VQVAEConfig ({exc})") from None
        # feature_scale: models saved before the option lack it (the module's ones are right for them)
        model = build_checked(lambda: cls(config), state, path / "config.json", optional=("feature_scale",))
        model.eval()
        return model.to(device) if device is not None else model


@torch.no_grad()
def _init_codebook(model: SetVQVAE, sets: StateSets, gen: torch.Generator) -> None:
    n = len(sets)
    idx = torch.randperm(n, generator=gen)[:min(n, 4 * model.config.n_codes)]
    b = sets[idx]
    x, layers, pos, mask = model._indices(b, model.codebook.device)
    r = model.latent(x, layers, pos, mask)
    pick = torch.randint(0, r.shape[0], (model.config.n_codes,), generator=gen)
    noise = torch.randn(model.config.n_codes, r.shape[1], generator=gen).to(r) * (r.std() * 0.01 + 1e-6)
    model.codebook.data.copy_(r[pick.to(r.device)] + noise)


def _relative_error(outputs: Sequence[dict]) -> float:
    """Relative reconstruction error over the batches' :meth:`SetVQVAE.forward` outputs: ``Σ sse / Σ ss``."""
    return float(sum(o["sse"] for o in outputs)) / max(float(sum(o["ss"] for o in outputs)), 1e-12)


def train_vqvae(sets: StateSets, config: VQVAEConfig | dict | None = None,
                train: TrainConfig | dict | None = None) -> tuple[SetVQVAE, dict[str, Any]]:
    """Train a :class:`SetVQVAE` on ``sets`` (one *type* of state set); returns ``(model, history)``.

    ``config`` defaults to ``VQVAEConfig(d_in=sets.d)`` (a dict updates those defaults); ``history`` holds
    the per-evaluation validation losses and relative reconstruction errors (``val_rel_error_curve``), the
    step stopped at, the number of codes in use on the training sets and the relative reconstruction error
    of the kept (best) weights on the validation split.
    """
    if isinstance(config, dict) or config is None:
        config = VQVAEConfig(d_in=sets.d, **(config or {}))
    if config.d_in != sets.d:
        raise ValueError(f"config.d_in={config.d_in} but the states have d={sets.d}")
    train = TrainConfig(**train) if isinstance(train, dict) else (train or TrainConfig())
    if len(sets) < 2:
        raise ValueError("need at least 2 state sets to train a VQ-VAE")
    gen = torch.Generator().manual_seed(train.seed)
    torch.manual_seed(train.seed)
    model = SetVQVAE(config)
    device = torch.device(train.device) if train.device else torch.device("cpu")
    model.to(device)
    perm = torch.randperm(len(sets), generator=gen)
    n_val = int(round(len(sets) * train.val_fraction)) if len(sets) >= 20 else 0
    val, tr = sets[perm[:n_val]], sets[perm[n_val:]]
    model.fit_normalizer(tr)
    _init_codebook(model, tr, gen)
    opt = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    usage = torch.zeros(config.n_codes, dtype=torch.long)
    history: dict[str, Any] = {"val_loss": [], "eval_steps": [], "val_rel_error_curve": [], "reinitialised": 0}
    best, best_state, bad = float("inf"), None, 0
    bs = min(train.batch_size, len(tr))
    step = 0
    bar = progress(range(train.steps), desc=train.desc)
    for step in bar:
        idx = torch.randint(0, len(tr), (bs,), generator=gen)
        out = model(tr[idx])
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        opt.step()
        usage += torch.bincount(out["codes"].cpu(), minlength=config.n_codes)
        if train.reinit_every and (step + 1) % train.reinit_every == 0:
            dead = (usage == 0).nonzero().flatten()
            if len(dead):
                with torch.no_grad():
                    r = out["latent"].detach()
                    pick = torch.randint(0, r.shape[0], (len(dead),), generator=gen).to(r.device)
                    noise = torch.randn(len(dead), r.shape[1], generator=gen).to(r) * (r.std() * 0.01 + 1e-6)
                    model.codebook.data[dead.to(r.device)] = r[pick] + noise
                history["reinitialised"] += int(len(dead))
            usage.zero_()
        if (step + 1) % train.eval_every == 0 or step + 1 == train.steps:
            ev = val if len(val) else tr
            with torch.no_grad():
                model.eval()
                losses = [model(ev[i:i + 512]) for i in range(0, len(ev), 512)]
                model.train()
            v = float(sum(float(o["rec"] + config.lambda_q * o["vq"]) * len(o["codes"]) for o in losses) / len(ev))
            history["val_loss"].append(v)
            history["eval_steps"].append(step + 1)
            history["val_rel_error_curve"].append(_relative_error(losses))
            if v < best - 1e-4 * abs(best):
                best, bad = v, 0
                best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
            else:
                bad += 1
                if bad >= train.patience:
                    break
    if hasattr(bar, "close"):
        bar.close()
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    history["stopped_at"] = step + 1
    history["codes_used"] = int(model.encode(tr).unique().numel())
    history["val_rel_error"] = model.reconstruction_error(val if len(val) else tr)
    return model, history
