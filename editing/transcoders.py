"""Transcoders: sparse replacements of one MLP, trained on activations harvested through ``interp``.

A transcoder (TC) maps the MLP's input ``h̄ = blocks.{l}.ln2.hook_normalized`` to its output
``blocks.{l}.hook_mlp_out`` through a wide, sparse ReLU code::

    z      = ReLU(h̄ @ W_enc + b_enc)        W_enc [d_in, d_sae], z [..., d_sae]
    TC(h̄)  = z @ W_dec + b_dec              W_dec [d_sae, d_out]

Parameters have sae-lens's names and shapes, and :meth:`Transcoder.save` writes sae-lens's on-disk format
(``cfg.json`` with ``architecture: "transcoder"`` and ``sae_weights.safetensors``), so
``sae_lens.Transcoder.load_from_disk`` reads ours and :meth:`Transcoder.load` reads theirs.

Training (:func:`train_transcoder`) minimises, per token,
``||TC(h̄) - mlp_out||² + λ(t) Σ_a z_a ||W_dec[a]||`` (the squared error summed over ``d_out``, the
decoder-norm-weighted L1 that sae-lens's standard SAE uses, so the sparsity penalty cannot be dodged by
shrinking ``W_enc`` and growing ``W_dec``). Choices where the TCPE paper is silent (digest: "the TC
training recipe" is UNCERTAIN):

* **sparsity schedule**: ``λ(t)`` rises linearly from 0 to ``l1_coefficient`` over the first
  ``l1_warmup_frac`` of the steps (sae-lens's ``l1_warm_up_steps``), then stays constant; the learning rate
  is constant (Adam) with a linear decay to 0 over the last ``lr_decay_frac`` of the steps.
* **dead features**: a feature that has not fired on any of the last ``dead_window`` training tokens is
  dead. Every ``resample_every`` steps (and never in the last 20% of training) dead features are
  re-initialised on the inputs of the current batch that the transcoder reconstructs worst (Anthropic's
  "resampling"): the encoder column points along that input (scaled to 0.2 × the mean norm of the live
  encoder columns), ``b_enc = 0``, the decoder row is the unit direction of the residual, and the Adam
  moments of those entries are zeroed.
* **data**: tokens of every real position (padding excluded; the first position kept), shuffled within a
  streaming buffer of ``buffer_batches`` × ``batch_size`` tokens.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from interp.io import MissingFileError, load_json, load_tensors, output_dir, save_tensors, save_tensors_json
from interp.progress import progress
from interp.results import Result

SAE_WEIGHTS = "sae_weights.safetensors"
SAE_CFG = "cfg.json"


def hook_in(layer: int) -> str:
    """The transcoder's input hook (the MLP input, after the second norm)."""
    return f"blocks.{layer}.ln2.hook_normalized"


def hook_out(layer: int) -> str:
    """The transcoder's output hook (the MLP output)."""
    return f"blocks.{layer}.hook_mlp_out"


class Transcoder(nn.Module):
    """``TC(h̄) = ReLU(h̄ W_enc + b_enc) W_dec + b_dec`` with sae-lens parameter names and shapes.

    ``encode(x [..., d_in]) -> z [..., d_sae]``, ``decode(z) -> [..., d_out]``, ``forward = decode∘encode``.
    ``hook_name``/``hook_name_out`` record the hooks it was trained on (metadata, kept in ``cfg.json``).
    """

    def __init__(self, d_in: int, d_sae: int, d_out: int | None = None, hook_name: str = "",
                 hook_name_out: str = "", model_name: str = "", dtype: torch.dtype = torch.float32,
                 seed: int | None = 0) -> None:
        super().__init__()
        for name, v in (("d_in", d_in), ("d_sae", d_sae), ("d_out", d_out if d_out is not None else d_in)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        d_out = d_in if d_out is None else d_out
        self.d_in, self.d_sae, self.d_out = d_in, d_sae, d_out
        self.hook_name, self.hook_name_out, self.model_name = hook_name, hook_name_out, model_name
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        w_dec = torch.randn(d_sae, d_out, generator=gen, dtype=torch.float32)
        w_dec = w_dec / w_dec.norm(dim=1, keepdim=True) * 0.1
        w_enc = torch.randn(d_in, d_sae, generator=gen, dtype=torch.float32) / math.sqrt(d_in)
        self.W_enc = nn.Parameter(w_enc.to(dtype))
        self.b_enc = nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        self.W_dec = nn.Parameter(w_dec.to(dtype))
        self.b_dec = nn.Parameter(torch.zeros(d_out, dtype=dtype))

    # ---------------------------------------------------------------- forward
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``z [..., d_sae]`` of MLP inputs ``x [..., d_in]``."""
        if x.shape[-1] != self.d_in:
            raise ValueError(f"transcoder input has last dimension {x.shape[-1]}, expected d_in={self.d_in}")
        return torch.relu(x.to(self.W_enc.dtype) @ self.W_enc + self.b_enc)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """MLP-output estimate ``[..., d_out]`` from features ``z [..., d_sae]``."""
        return z @ self.W_dec + self.b_dec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))

    # ---------------------------------------------------------------- sae-lens format
    def sae_lens_cfg(self) -> dict:
        """The ``cfg.json`` dict sae-lens writes for a ``Transcoder`` of these sizes."""
        return {
            "architecture": "transcoder", "d_in": self.d_in, "d_sae": self.d_sae, "d_out": self.d_out,
            "dtype": str(self.W_enc.dtype).removeprefix("torch."), "device": "cpu",
            "apply_b_dec_to_input": False, "normalize_activations": "none", "reshape_activations": "none",
            "metadata": {"hook_name": self.hook_name, "hook_name_out": self.hook_name_out,
                         "model_name": self.model_name, "sae_lens_training_version": None},
        }

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write ``cfg.json`` and ``sae_weights.safetensors`` (sae-lens's format) atomically into ``path``."""
        with output_dir(path, overwrite=overwrite, writer="interp.editing.Transcoder") as tmp:
            save_tensors_json(tmp, self.state_dict(), self.sae_lens_cfg(), tensor_file=SAE_WEIGHTS, json_file=SAE_CFG,
                              indent=1)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "Transcoder":
        """Read a transcoder in sae-lens's format (ours or one saved by ``sae_lens.Transcoder.save_model``).

        ``apply_b_dec_to_input: true`` in ``cfg.json`` (input centring: the encoder reads ``x − b_dec``, as the
        adapter of TCPE's code does with its input-centring ``b_dec``; sae-lens itself refuses the flag for
        transcoders) is applied exactly by folding it into the encoder bias, ``b_enc ← b_enc − b_dec W_enc``
        (computed in float64); a file where ``d_in ≠ d_out`` with the flag set is refused. (Before 2026-12-02
        the flag was ignored, silently changing every feature activation.)"""
        path = Path(path)
        if not (path / SAE_CFG).is_file() or not (path / SAE_WEIGHTS).is_file():
            raise MissingFileError(f"{path} has no {SAE_CFG} and {SAE_WEIGHTS} (sae-lens format)")
        cfg = load_json(path / SAE_CFG, what="transcoder (sae-lens format)", required=("d_in", "d_sae", "d_out"))
        if cfg.get("architecture", "transcoder") != "transcoder":
            raise ValueError(f"{path}: architecture {cfg.get('architecture')!r} is not a plain ReLU 'transcoder'")
        if cfg.get("normalize_activations", "none") not in ("none", None):
            raise ValueError(f"{path}: normalize_activations={cfg['normalize_activations']!r} is not supported")
        d_in, d_sae, d_out = int(cfg["d_in"]), int(cfg["d_sae"]), int(cfg["d_out"])
        sd, _ = load_tensors(path / SAE_WEIGHTS, what="transcoder (sae-lens format)", device=str(device),
                             tensors={"W_enc": ((d_in, d_sae), None), "b_enc": ((d_sae,), None),
                                      "W_dec": ((d_sae, d_out), None), "b_dec": ((d_out,), None)})
        meta = cfg.get("metadata") or {}
        centre = cfg.get("apply_b_dec_to_input", False)
        if not isinstance(centre, bool):
            raise ValueError(f"{path}: apply_b_dec_to_input must be true or false, got {centre!r}")
        if centre:
            if d_in != d_out:
                raise ValueError(f"{path}: apply_b_dec_to_input subtracts b_dec [d_out={d_out}] from the input "
                                 f"[d_in={d_in}]; the sizes differ, so this file cannot mean that")
            # input centring ReLU((x − b_dec) W_enc + b_enc) = ReLU(x W_enc + (b_enc − b_dec W_enc)): folded, exact
            sd["b_enc"] = (sd["b_enc"].double() - sd["b_dec"].double() @ sd["W_enc"].double()).to(sd["b_enc"].dtype)
        tc = cls(d_in, d_sae, d_out, hook_name=meta.get("hook_name") or "",
                 hook_name_out=meta.get("hook_name_out") or "", model_name=meta.get("model_name") or "",
                 dtype=sd["W_enc"].dtype, seed=None)
        tc.load_state_dict({k: sd[k] for k in ("W_enc", "b_enc", "W_dec", "b_dec")})
        return tc.to(device)

    def to_sae_lens(self):
        """This transcoder as a ``sae_lens.Transcoder`` (same weights)."""
        from sae_lens.saes.sae import SAEMetadata
        from sae_lens.saes.transcoder import Transcoder as SLTranscoder, TranscoderConfig
        cfg = TranscoderConfig(d_in=self.d_in, d_sae=self.d_sae, d_out=self.d_out,
                               dtype=str(self.W_enc.dtype).removeprefix("torch."), device="cpu",
                               apply_b_dec_to_input=False, metadata=SAEMetadata(hook_name=self.hook_name, model_name=self.model_name))
        sl = SLTranscoder(cfg)
        sl.load_state_dict({k: v.detach().cpu() for k, v in self.state_dict().items()})
        return sl

    @classmethod
    def from_sae_lens(cls, sl) -> "Transcoder":
        """A plain ReLU ``sae_lens.Transcoder`` as ours (same weights)."""
        if getattr(sl.cfg, "architecture", lambda: "")() != "transcoder":
            raise ValueError(f"only plain ReLU sae-lens transcoders convert, got {sl.cfg.architecture()!r}")
        meta = sl.cfg.metadata
        tc = cls(sl.cfg.d_in, sl.cfg.d_sae, sl.cfg.d_out, hook_name=getattr(meta, "hook_name", "") or "",
                 model_name=getattr(meta, "model_name", "") or "", dtype=sl.W_enc.dtype, seed=None)
        tc.load_state_dict({k: getattr(sl, k).detach().cpu() for k in ("W_enc", "b_enc", "W_dec", "b_dec")})
        return tc


# ====================================================================== splicing
class _AtOutput(nn.Module):
    """Adapter so the capture layer's ``model.splice`` can run a transcoder at ``hook_mlp_out``.

    ``model.splice`` calls ``encode(x)`` with the tensor of the hook it sits on (the MLP output); a
    transcoder must read the MLP *input* of the same pass instead. An intervention on ``ln2.hook_normalized``
    stores that input in ``self.stash`` (it fires earlier in the same forward), and ``encode`` ignores
    ``x`` except to check the shapes line up. With ``use_error_term=True`` the splice then adds
    ``mlp_out - TC(h̄)`` (the transcoder's own error), as sae-lens's transcoder splice does.
    """

    def __init__(self, tc: Transcoder) -> None:
        super().__init__()
        self.tc = tc
        self.stash: torch.Tensor | None = None

    def remember(self, t: torch.Tensor, ctx) -> None:
        self.stash = t

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stash
        if h is None or h.shape[:-1] != x.shape[:-1]:
            raise RuntimeError("transcoder splice: the MLP input of this pass was not seen (ln2.hook_normalized "
                               "did not fire before hook_mlp_out)")
        return self.tc.encode(h)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.tc.decode(z)


class Spliced:
    """A transcoder spliced at one layer; a context manager, or open until :meth:`close` (a "permanent" swap).

    While open, every forward (and every generation pass) of ``model`` uses ``TC(h̄)`` as the output of MLP
    ``layer``; feature activations are the hook ``blocks.{l}.hook_mlp_out.hook_sae_acts_post``
    (:attr:`features`), capturable, patchable and differentiable like any hook.
    """

    def __init__(self, model, layer: int, transcoder: Transcoder, use_error_term: bool = False) -> None:
        import contextlib
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < model.cfg.n_layers:
            raise ValueError(f"layer must be an integer in 0..{model.cfg.n_layers - 1}, got {layer!r}")
        if transcoder.d_in != model.cfg.d_model or transcoder.d_out != model.cfg.d_model:
            raise ValueError(f"transcoder maps {transcoder.d_in} -> {transcoder.d_out}, model has d_model="
                             f"{model.cfg.d_model}")
        self.model, self.layer, self.transcoder = model, layer, transcoder
        self.at = hook_out(layer)
        self.features = f"{self.at}.hook_sae_acts_post"
        self._adapter = _AtOutput(transcoder)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(model.intervene({hook_in(layer): self._adapter.remember}))
        self._stack.enter_context(model.splice(self._adapter, at=self.at, use_error_term=use_error_term))

    def close(self) -> None:
        """Undo the splice (idempotent)."""
        self._stack.close()
        self._adapter.stash = None

    def __enter__(self) -> "Spliced":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def splice(model, layer: int, transcoder: Transcoder, use_error_term: bool = False) -> Spliced:
    """Replace MLP ``layer``'s output by ``transcoder(ln2 input)``: ``with splice(model, l, tc) as s:`` or
    ``s = splice(model, l, tc)`` ... ``s.close()``. Features: hook ``s.features``."""
    return Spliced(model, layer, transcoder, use_error_term)


# ====================================================================== harvesting and training
def _texts_in_batches(texts: Sequence[str], batch: int) -> Iterator[list[str]]:
    for i in range(0, len(texts), batch):
        yield list(texts[i:i + batch])


def harvest_pairs(model, layer: int, texts: Sequence[str], batch_size: int = 16,
                  max_length: int | None = 128) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Stream ``(h̄ [n, d], mlp_out [n, d])`` of every real token of ``texts``, one text batch at a time
    (runs the model only up to ``layer``)."""
    yield from _pairs_of(model, layer, (model.tokenize(chunk, max_length=max_length)
                                        for chunk in _texts_in_batches(texts, batch_size)))


def _pairs_of(model, layer: int, batches: Iterable[dict]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`harvest_pairs` of batches already tokenized."""
    names = [hook_in(layer), hook_out(layer)]
    for batch in batches:
        _, cache = model.run_with_cache(batch, names=names, stop_at_layer=layer + 1)
        keep = batch["attention_mask"].bool().to(cache[names[0]].device)
        yield cache[names[0]][keep].float(), cache[names[1]][keep].float()


@dataclass
class TranscoderTrainingConfig:
    """Hyper-parameters of :func:`train_transcoder` (see the module docstring for the schedule)."""

    d_sae: int = 1024
    l1_coefficient: float = 1e-3
    l1_warmup_frac: float = 0.05
    lr: float = 1e-3
    lr_decay_frac: float = 0.2
    batch_size: int = 256
    n_epochs: int = 1
    text_batch_size: int = 16
    max_length: int | None = 128
    buffer_batches: int = 16
    dead_window: int = 20_000
    resample_every: int = 500
    resample_dead: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_sae", "batch_size", "n_epochs", "text_batch_size", "buffer_batches", "dead_window",
                     "resample_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not (isinstance(self.l1_coefficient, (int, float)) and self.l1_coefficient >= 0):
            raise ValueError(f"l1_coefficient must be a number >= 0, got {self.l1_coefficient!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"lr must be a number > 0, got {self.lr!r}")
        for name in ("l1_warmup_frac", "lr_decay_frac"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 <= v <= 1):
                raise ValueError(f"{name} must be in [0, 1], got {v!r}")
        if self.max_length is not None and (not isinstance(self.max_length, int) or self.max_length <= 0):
            raise ValueError(f"max_length must be a positive integer or None, got {self.max_length!r}")


@dataclass
class TranscoderTraining(Result):
    """History of :func:`train_transcoder`: per-step ``loss``, ``mse``, ``l1``, ``l0`` and the resamplings."""

    kind = "transcoder_training"
    loss: list[float] = field(default_factory=list)
    mse: list[float] = field(default_factory=list)
    l0: list[float] = field(default_factory=list)
    l1_coefficient: list[float] = field(default_factory=list)
    resampled: list[int] = field(default_factory=list)
    n_tokens: int = 0
    config: dict = field(default_factory=dict)

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame({"step": range(len(self.loss)), "loss": self.loss, "mse": self.mse, "l0": self.l0,
                             "l1_coefficient": self.l1_coefficient})

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
        fig = make_subplots(rows=1, cols=2, subplot_titles=("MSE", "L0"))
        fig.add_trace(go.Scatter(y=self.mse, name="mse"), row=1, col=1)
        fig.add_trace(go.Scatter(y=self.l0, name="L0"), row=1, col=2)
        fig.update_layout(title="transcoder training")
        return fig


def _steps_per_epoch(n_tokens: int, batch_size: int) -> int:
    return max(1, n_tokens // batch_size)


class _Trainer:
    """The training loop shared by :func:`train_transcoder` (pairs harvested on the fly) and
    :func:`train_transcoder_from_store` (pairs read from an activation store): Adam, the λ warm-up and lr
    decay schedules, dead-feature bookkeeping and resampling (module docstring)."""

    def __init__(self, tc: Transcoder, cfg: TranscoderTrainingConfig, total: int) -> None:
        self.tc, self.cfg, self.total = tc, cfg, total
        self.warm = max(1, int(cfg.l1_warmup_frac * total))
        decay_start = int((1 - cfg.lr_decay_frac) * total)
        self.opt = torch.optim.Adam(tc.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: 1.0 if s < decay_start else max(0.0, (total - s) / max(1, total - decay_start)))
        self.last_fired = torch.zeros(cfg.d_sae, dtype=torch.long)  # token counter at the last firing
        self.hist = TranscoderTraining(config=dataclasses.asdict(cfg))
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.step, self.seen, self.first = 0, 0, True

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One optimiser step on inputs ``x [b, d_in]`` and MLP outputs ``y [b, d_out]``."""
        tc, cfg = self.tc, self.cfg
        x, y = x.to(tc.W_enc.dtype), y.to(tc.W_enc.dtype)
        if self.first:  # b_dec starts at the mean output (geometric-median-like init of sae-lens, mean version)
            with torch.no_grad():
                tc.b_dec.copy_(y.mean(0).to(tc.b_dec.dtype))
            self.first = False
        lam = cfg.l1_coefficient * min(1.0, (self.step + 1) / self.warm)
        z = tc.encode(x)
        recon = tc.decode(z)
        err = (recon - y).pow(2).sum(-1)
        mse = err.mean()
        l1 = (z * tc.W_dec.norm(dim=1)).sum(-1).mean()
        loss = mse + lam * l1
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sched.step()
        hist = self.hist
        with torch.no_grad():
            fired = (z > 0).any(0)
            self.seen += len(x)
            self.last_fired[fired] = self.seen
            hist.loss.append(float(loss)), hist.mse.append(float(mse))
            hist.l0.append(float((z > 0).float().sum(-1).mean())), hist.l1_coefficient.append(lam)
            if (cfg.resample_dead and self.step > 0 and self.step % cfg.resample_every == 0
                    and self.step < 0.8 * self.total and self.seen >= cfg.dead_window):
                dead = (self.seen - self.last_fired >= cfg.dead_window).nonzero().flatten()
                if len(dead):
                    _resample(tc, self.opt, dead, x, y - recon.detach(), err.detach(), self.gen)
                    self.last_fired[dead] = self.seen
                hist.resampled.append(int(len(dead)))
        self.step += 1

    def finish(self) -> tuple[Transcoder, TranscoderTraining]:
        self.hist.n_tokens = self.seen
        self.tc.eval()
        return self.tc, self.hist

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: Path, position: dict) -> None:
        """Atomically write weights, Adam moments, dead-feature counters, RNG and history to ``path``."""
        tensors = {f"tc.{k}": v.detach().cpu().contiguous() for k, v in self.tc.state_dict().items()}
        names = ["W_enc", "b_enc", "W_dec", "b_dec"]
        params = dict(self.tc.named_parameters())
        steps = {}
        for n in names:
            st = self.opt.state.get(params[n])
            if st:
                tensors[f"adam.{n}.exp_avg"] = st["exp_avg"].contiguous()
                tensors[f"adam.{n}.exp_avg_sq"] = st["exp_avg_sq"].contiguous()
                steps[n] = float(st["step"])
        tensors["last_fired"] = self.last_fired
        tensors["rng"] = self.gen.get_state()
        h = self.hist
        meta = {"step": self.step, "seen": self.seen, "first": self.first, "adam_steps": steps, "position": position,
                "total": self.total, "config": dataclasses.asdict(self.cfg),
                "hist": {"loss": h.loss, "mse": h.mse, "l0": h.l0, "l1_coefficient": h.l1_coefficient,
                         "resampled": h.resampled}}
        with output_dir(path, writer="interp.editing.transcoder_checkpoint") as tmp:
            save_tensors(tmp / "state.safetensors", tensors, meta)

    def load(self, path: Path) -> dict:
        """Restore a checkpoint written by :meth:`save`; returns its data position."""
        t, meta = load_tensors(path / "state.safetensors", what="transcoder checkpoint",
                               required=("step", "config", "total", "position"))
        if meta["config"] != dataclasses.asdict(self.cfg) or meta["total"] != self.total:
            raise ValueError(f"checkpoint {path} was written with another configuration; use a new folder")
        self.tc.load_state_dict({k[3:]: v for k, v in t.items() if k.startswith("tc.")})
        params = dict(self.tc.named_parameters())
        for n, st in meta["adam_steps"].items():
            self.opt.state[params[n]] = {"step": torch.tensor(st), "exp_avg": t[f"adam.{n}.exp_avg"].clone(),
                                         "exp_avg_sq": t[f"adam.{n}.exp_avg_sq"].clone()}
        self.last_fired = t["last_fired"].clone()
        self.gen.set_state(t["rng"])
        self.step, self.seen, self.first = meta["step"], meta["seen"], meta["first"]
        import warnings
        with warnings.catch_warnings():  # the lr schedule is a pure function of the step: replay it
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(self.step):
                self.sched.step()
        h = meta["hist"]
        self.hist.loss, self.hist.mse, self.hist.l0 = h["loss"], h["mse"], h["l0"]
        self.hist.l1_coefficient, self.hist.resampled = h["l1_coefficient"], h["resampled"]
        return meta["position"]


def default_corpus() -> list[str]:
    """The built-in training text of :func:`train_transcoder` (and ROME's second moments,
    ``interp.editing.default_texts``): the King James Bible of :mod:`interp.data` in 2,434 passages of 10
    verses (Ruth held out), each cut at the config's ``max_length`` tokens when training."""
    from interp.data import text_passages
    return text_passages(None, 10)


def train_transcoder(model, layer: int, texts: Sequence[str] | None = None,
                     config: TranscoderTrainingConfig | None = None,
                     transcoder: Transcoder | None = None) -> tuple[Transcoder, TranscoderTraining]:
    """Train a transcoder of MLP ``layer`` on the tokens of ``texts`` (activations harvested through the
    capture layer in text batches, shuffled in a streaming buffer). Returns ``(transcoder, history)``.

    ``texts`` defaults to the built-in corpus (:func:`default_corpus`: 2,434 passages, at most ``max_length``
    = 128 tokens each, ~310k tokens with SmolLM2's tokenizer: one epoch is ~1,200 steps of 256 rows)."""
    cfg = config or TranscoderTrainingConfig()
    if texts is None:
        texts = default_corpus()
    if not texts:
        raise ValueError("texts is empty: pass the real text to train on")
    d = model.cfg.d_model
    torch.manual_seed(cfg.seed)
    tc = transcoder or Transcoder(d, cfg.d_sae, d, hook_name=hook_in(layer), hook_name_out=hook_out(layer),
                                  seed=cfg.seed)
    # tokenized once (a third of the default's time was tokenizing twice): the count sizes the schedules
    encoded = [model.tokenize(c, max_length=cfg.max_length) for c in _texts_in_batches(texts, cfg.text_batch_size)]
    n_tok = sum(int(b["attention_mask"].sum()) for b in encoded)
    total = _steps_per_epoch(n_tok, cfg.batch_size) * cfg.n_epochs
    tr = _Trainer(tc, cfg, total)
    bar = progress(total=total, desc=f"transcoder L{layer}")

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(cfg.n_epochs):
            buf_x, buf_y, size = [], [], 0
            for x, y in _pairs_of(model, layer, encoded):
                buf_x.append(x), buf_y.append(y)
                size += len(x)
                if size >= cfg.buffer_batches * cfg.batch_size:
                    yield from _drain(buf_x, buf_y, cfg.batch_size, tr.gen, keep_tail=True)
                    size = sum(len(t) for t in buf_x)
            yield from _drain(buf_x, buf_y, cfg.batch_size, tr.gen, keep_tail=False)

    for x, y in batches():
        if tr.step >= total:
            break
        tr.update(x, y)
        bar.update(1)
    bar.close()
    return tr.finish()


def train_transcoder_from_store(store, layer: int, config: TranscoderTrainingConfig | None = None,
                                checkpoint: str | Path | None = None, checkpoint_every: int = 200,
                                max_steps: int | None = None, transcoder: Transcoder | None = None
                                ) -> tuple[Transcoder, TranscoderTraining]:
    """Train a transcoder of MLP ``layer`` from an :class:`interp.store.ActivationStore` (or its path) holding
    ``blocks.{l}.ln2.hook_normalized`` and ``blocks.{l}.hook_mlp_out`` (harvest them with
    :func:`interp.store.harvest`). ``config.n_epochs`` passes over the store, shuffled by the store's reader
    (seed ``config.seed + epoch``); ``batch_size`` rows per step.

    ``checkpoint``: a folder written atomically every ``checkpoint_every`` steps (weights, Adam moments,
    dead-feature counters, RNG, history, data position); when it exists, training resumes from it and the
    result equals an uninterrupted run's. ``max_steps`` stops early (e.g. a time-boxed background run; the
    checkpoint is written then), leaving the schedules sized for the full run.
    """
    from interp.store import ActivationStore
    cfg = config or TranscoderTrainingConfig()
    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    names = [hook_in(layer), hook_out(layer)]
    for n in names:
        if n not in store:
            raise KeyError(f"{n!r} is not in the store {str(store.path)!r}; it holds {store.names}")
    d_in, d_out = store.shapes[names[0]][-1], store.shapes[names[1]][-1]
    torch.manual_seed(cfg.seed)
    tc = transcoder or Transcoder(d_in, cfg.d_sae, d_out, hook_name=names[0], hook_name_out=names[1],
                                  model_name=str(store.model.get("spec", "")), seed=cfg.seed)
    per_epoch = max(1, len(store) // cfg.batch_size)
    total = per_epoch * cfg.n_epochs
    tr = _Trainer(tc, cfg, total)
    ckpt = Path(checkpoint) if checkpoint is not None else None
    pos = {"epoch": 0, "batch": 0}
    if ckpt is not None and (ckpt / "state.safetensors").is_file():
        pos = tr.load(ckpt)
    stop = total if max_steps is None else min(total, max_steps)
    bar = progress(total=total, initial=tr.step, desc=f"transcoder L{layer} (store)")
    epoch = pos["epoch"]
    while tr.step < stop and epoch < cfg.n_epochs:
        for b, batch in enumerate(store.batches(cfg.batch_size, shuffle=True, seed=cfg.seed + epoch, names=names,
                                                drop_last=True)):
            if epoch == pos["epoch"] and b < pos["batch"]:
                continue  # consumed before the checkpoint
            if tr.step >= stop:
                break
            tr.update(batch[names[0]].float(), batch[names[1]].float())
            bar.update(1)
            if ckpt is not None and tr.step % checkpoint_every == 0:
                tr.save(ckpt, {"epoch": epoch, "batch": b + 1})
        else:
            epoch += 1
            pos = {"epoch": epoch, "batch": 0}
            continue
        pos = {"epoch": epoch, "batch": b}
        break
    bar.close()
    if ckpt is not None:
        tr.save(ckpt, pos if tr.step < total else {"epoch": cfg.n_epochs, "batch": 0})
    return tr.finish()


def _drain(buf_x: list, buf_y: list, batch: int, gen: torch.Generator, keep_tail: bool):
    x, y = torch.cat(buf_x), torch.cat(buf_y)
    perm = torch.randperm(len(x), generator=gen)
    x, y = x[perm], y[perm]
    n_full = len(x) // batch if keep_tail else math.ceil(len(x) / batch)
    # keep half the buffer for mixing with the next harvest when streaming
    n_out = max(1, n_full // 2) if keep_tail else n_full
    for i in range(n_out):
        yield x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
    buf_x.clear(), buf_y.clear()
    if keep_tail and n_out * batch < len(x):
        buf_x.append(x[n_out * batch:]), buf_y.append(y[n_out * batch:])


def _resample(tc: Transcoder, opt: torch.optim.Optimizer, dead: torch.Tensor, x: torch.Tensor,
              resid: torch.Tensor, err: torch.Tensor, gen: torch.Generator) -> None:
    """Re-initialise ``dead`` features on high-error inputs (probability ∝ squared error)."""
    probs = (err / err.sum()).clamp_min(0)
    idx = torch.multinomial(probs, len(dead), replacement=True, generator=gen)
    alive = torch.ones(tc.d_sae, dtype=torch.bool)
    alive[dead] = False
    enc_norm = tc.W_enc[:, alive].norm(dim=0).mean() if alive.any() else torch.tensor(1.0)
    xin = x[idx] / x[idx].norm(dim=-1, keepdim=True).clamp_min(1e-8)
    rdir = resid[idx] / resid[idx].norm(dim=-1, keepdim=True).clamp_min(1e-8)
    tc.W_enc[:, dead] = (xin * 0.2 * enc_norm).T.to(tc.W_enc.dtype)
    tc.b_enc[dead] = 0
    tc.W_dec[dead] = rdir.to(tc.W_dec.dtype)
    for p, sl in ((tc.W_enc, (slice(None), dead)), (tc.b_enc, (dead,)), (tc.W_dec, (dead,))):
        st = opt.state.get(p)
        if st:
            for k in ("exp_avg", "exp_avg_sq"):
                st[k][sl] = 0


# ====================================================================== evaluation
@dataclass
class TranscoderMetrics(Result):
    """Quality of a transcoder on held-out text.

    ``fve``: fraction of variance of ``mlp_out`` explained (1 - SSE / SS around the mean); ``l0``: mean
    active features per token; ``dead_frac``: features that never fired on this text; ``ce_clean``,
    ``ce_spliced``, ``ce_mlp_zero``: next-token loss of the model, with the transcoder replacing the MLP,
    and with the MLP output zeroed; ``ce_recovered = (ce_zero - ce_spliced) / (ce_zero - ce_clean)``.
    """

    kind = "transcoder_metrics"
    layer: int
    n_tokens: int
    fve: float
    mse: float
    l0: float
    dead_frac: float
    ce_clean: float
    ce_spliced: float
    ce_mlp_zero: float
    ce_recovered: float
    feature_density: torch.Tensor | None = None  # [d_sae] fraction of tokens on which each feature fires

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{k: getattr(self, k) for k in ("layer", "n_tokens", "fve", "mse", "l0", "dead_frac",
                                                            "ce_clean", "ce_spliced", "ce_mlp_zero", "ce_recovered")}])

    def figure(self):
        import plotly.graph_objects as go
        dens = self.feature_density.clamp_min(1e-7).log10().numpy() if self.feature_density is not None else []
        fig = go.Figure(go.Histogram(x=dens, nbinsx=50))
        fig.update_layout(title=f"feature density (log10), L0={self.l0:.1f}, FVE={self.fve:.3f}",
                          xaxis_title="log10 firing frequency")
        return fig


@torch.no_grad()
def evaluate_transcoder(model, layer: int, transcoder: Transcoder, texts: Sequence[str], batch_size: int = 16,
                        max_length: int | None = 128) -> TranscoderMetrics:
    """FVE, L0, dead fraction and the spliced next-token loss of ``transcoder`` on ``texts``."""
    from interp.model import next_token_loss
    sse = ss = sq = s1 = 0.0
    n = 0
    l0 = 0.0
    fired = torch.zeros(transcoder.d_sae)
    encoded = [model.tokenize(c, max_length=max_length) for c in _texts_in_batches(texts, batch_size)]
    for x, y in _pairs_of(model, layer, encoded):
        z = transcoder.encode(x)
        sse += float((transcoder.decode(z) - y).pow(2).sum())
        sq += float(y.pow(2).sum())
        s1 = s1 + y.sum(0)
        n += len(y)
        l0 += float((z > 0).sum())
        fired += (z > 0).float().sum(0)
    ss = sq - float((s1 * s1).sum()) / max(n, 1)
    losses = {"clean": [], "spliced": [], "zero": []}
    weights = []
    for tokens in encoded:
        batch = model.prepare(tokens)
        w = float(((batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]).sum()))
        weights.append(w)
        losses["clean"].append(float(next_token_loss(model(batch), batch)))
        with splice(model, layer, transcoder):
            losses["spliced"].append(float(next_token_loss(model(batch), batch)))
        with model.intervene({hook_out(layer): lambda t, ctx: torch.zeros_like(t)}):
            losses["zero"].append(float(next_token_loss(model(batch), batch)))
    wts = np.asarray(weights) / max(sum(weights), 1)
    ce = {k: float(np.dot(wts, v)) for k, v in losses.items()}
    denom = ce["zero"] - ce["clean"]
    return TranscoderMetrics(layer=layer, n_tokens=n, fve=1 - sse / max(ss, 1e-12), mse=sse / max(n, 1),
                             l0=l0 / max(n, 1), dead_frac=float((fired == 0).float().mean()),
                             ce_clean=ce["clean"], ce_spliced=ce["spliced"], ce_mlp_zero=ce["zero"],
                             ce_recovered=(ce["zero"] - ce["spliced"]) / denom if abs(denom) > 1e-12 else float("nan"),
                             feature_density=fired / max(n, 1))


def _model_identity(model) -> str:
    """The model's name (its HF folder or hub name, else its family): part of the keys of cached defaults."""
    hc = getattr(getattr(model, "hf_model", None), "config", None)
    return str(getattr(hc, "_name_or_path", "") or getattr(model.cfg, "family", ""))


#: default transcoders of this process, by stage key: ``default_transcoder`` returns the same object each call
_DEFAULT_TRANSCODERS: dict[str, Transcoder] = {}


def default_transcoder(model, layer: int, config: TranscoderTrainingConfig | None = None,
                       texts: Sequence[str] | None = None) -> Transcoder:
    """The transcoder of MLP ``layer`` that :func:`interp.editing.tcpe` uses when given none: trained by
    :func:`train_transcoder` (on ``texts``, default the built-in corpus) once per model (its name and the layer's
    MLP weights), layer, config and corpus, stored as a resumable stage (``interp.stages.Stages``
    ``"editing/transcoder"``) and read back by later calls in any process. Within a process every call returns
    the same object, so ``splice(model, default_transcoder(model, layer))`` uses a transcoder that
    ``tcpe(..., apply=True)`` edited."""
    import hashlib

    from interp.stages import Stages

    cfg = config or TranscoderTrainingConfig()
    corpus = list(texts) if texts is not None else default_corpus()
    h = hashlib.sha1()
    for name in ("W_in", "W_out"):
        h.update(model.weight(name)[layer].detach().float().cpu().contiguous().numpy().tobytes())
    key = {"schema": 1, "model": _model_identity(model), "mlp": h.hexdigest(),
           "layer": layer, "config": dataclasses.asdict(cfg),
           "corpus": hashlib.sha1("\x00".join(corpus).encode()).hexdigest()}
    st = Stages("editing/transcoder", key)
    if st.key in _DEFAULT_TRANSCODERS:
        return _DEFAULT_TRANSCODERS[st.key]
    state = st("transcoder", lambda: {"state": dict(train_transcoder(model, layer, corpus, cfg)[0].state_dict())})
    d = model.cfg.d_model
    tc = Transcoder(d, cfg.d_sae, d, hook_name=hook_in(layer), hook_name_out=hook_out(layer), seed=cfg.seed)
    tc.load_state_dict({k: torch.as_tensor(v) for k, v in state["state"].items()})
    _DEFAULT_TRANSCODERS[st.key] = tc
    return tc


__all__ = ["Transcoder", "Spliced", "splice", "hook_in", "hook_out", "harvest_pairs", "TranscoderTrainingConfig",
           "TranscoderTraining", "train_transcoder", "train_transcoder_from_store", "TranscoderMetrics", "evaluate_transcoder",
           "default_corpus", "default_transcoder"]
