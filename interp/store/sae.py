"""Train sae-lens SAEs and transcoders from an :class:`~interp.store.ActivationStore`.

The adapter feeds sae-lens's own trainer (``sae_lens.SAETrainer``: its Adam optimizer, learning-rate
and coefficient schedules, gradient clipping, dead-feature and sparsity bookkeeping, activation
normalisation and its folding into the weights) from our reader's shuffled batches, driving it through
the per-step seams sae-lens provides for external coordinators (``maybe_reset_sparsity``, ``step``,
``set_final_sae_metadata``) so that every step's losses are recorded. Any sae-lens training
architecture works (``standard``, ``topk``, ``batchtopk``, ``jumprelu``, ...).

sae-lens 6 has no transcoder *training* class (its ``Transcoder`` is inference-only), so
:class:`TranscoderTrainingSAE` adds one on its ``StandardTrainingSAE``: the encoder reads an MLP's input
(``d_in``), the decoder writes its output (``d_out``), the loss is the sae-lens MSE (summed over
features, mean over rows) against the MLP output plus the standard decoder-norm-weighted L1 penalty.
The trainer sees one packed ``[input | output]`` row per token (a single tensor, as its data provider
requires); :meth:`TranscoderTrainingSAE.to_sae_lens` converts the result to sae-lens's ``Transcoder``.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from interp.progress import progress
from interp.results import Result

from .reader import ActivationStore


@dataclass
class SAETrainConfig:
    """Training options (sae-lens's names and meanings).

    - ``architecture``: a sae-lens training architecture (``standard``, ``topk``, ...); ``transcoder`` is
      set by :func:`train_transcoder`.
    - ``d_sae``: dictionary size; ``steps``: optimizer steps; ``batch_size``: rows per step.
    - ``lr``, ``lr_warm_up_steps``, ``lr_decay_steps``, ``lr_scheduler_name``: sae-lens's schedule.
    - ``l1_coefficient`` / ``l1_warm_up_steps`` (standard and transcoder), ``k`` (topk/batchtopk).
    - ``normalize_activations``: ``"none"`` or ``"expected_average_only_in"`` (scaled to norm sqrt(d_in),
      folded back into the weights at the end; not for transcoders).
    - ``seed``: SAE initialisation and data order; ``buffer_rows``: shuffle buffer (see
      :meth:`ActivationStore.batches`); ``device``.
    """

    d_sae: int = 256
    architecture: str = "standard"
    steps: int = 300
    batch_size: int = 256
    lr: float = 3e-4
    lr_warm_up_steps: int = 0
    lr_decay_steps: int = 0
    lr_scheduler_name: str = "constant"
    l1_coefficient: float = 1.0
    l1_warm_up_steps: int = 0
    k: int = 32
    normalize_activations: str = "none"
    seed: int = 0
    buffer_rows: int | None = None
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("d_sae", "steps", "batch_size", "k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.l1_coefficient < 0:
            raise ValueError(f"l1_coefficient must be >= 0, got {self.l1_coefficient!r}")
        if self.normalize_activations not in ("none", "expected_average_only_in"):
            raise ValueError("normalize_activations must be 'none' or 'expected_average_only_in', "
                             f"got {self.normalize_activations!r}")


@dataclass
class SAETrainingResult(Result):
    """A trained sae-lens SAE (``sae``, not saved by :meth:`save`; use ``sae.save_model``) and its
    per-step losses ``history`` (``{"loss": [...], "mse_loss": [...], ...}``)."""

    store: str
    names: list[str]
    architecture: str
    d_in: int
    d_sae: int
    steps: int
    history: dict[str, list[float]]
    sae: Any = None

    kind = "sae_training"

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.pop("sae")
        return d

    def save(self, path):
        sae, self.sae = self.sae, None
        try:
            return super().save(path)
        finally:
            self.sae = sae

    def to_frame(self):
        import pandas as pd
        df = pd.DataFrame(self.history)
        df.insert(0, "step", range(len(df)))
        return df

    def figure(self):
        import plotly.graph_objects as go
        df = self.to_frame()
        fig = go.Figure([go.Scatter(x=df["step"], y=df[c], name=c, mode="lines") for c in df.columns if c != "step"])
        fig.update_layout(title=f"{self.architecture} on {', '.join(self.names)} (d_sae={self.d_sae})",
                          xaxis_title="step", yaxis_title="loss", yaxis_type="log")
        return fig

    def early_late(self, key: str = "loss", window: int = 20) -> tuple[float, float]:
        """Mean of ``history[key]`` over the first and the last ``window`` steps."""
        h = self.history[key]
        w = min(window, max(1, len(h) // 4))
        return sum(h[:w]) / w, sum(h[-w:]) / w


def _provider(store: ActivationStore, names: list[str], cfg: SAETrainConfig) -> Iterator[torch.Tensor]:
    """Endless rows for the trainer: the store's shuffled batches, epoch after epoch (seed + epoch),
    float32, the names concatenated along features (``[input | output]`` for a transcoder)."""
    for epoch in itertools.count():
        for batch in store.batches(cfg.batch_size, shuffle=True, seed=cfg.seed + epoch, names=names,
                                   buffer_rows=cfg.buffer_rows, drop_last=True):
            yield torch.cat([batch[n].reshape(cfg.batch_size, -1).float() for n in names], dim=-1)
        if epoch == 0 and len(store) < cfg.batch_size:
            raise ValueError(f"the store has {len(store)} rows, fewer than batch_size={cfg.batch_size}")


def _fit(sae, provider: Iterator[torch.Tensor], cfg: SAETrainConfig, desc: str) -> dict[str, list[float]]:
    from sae_lens import SAETrainer
    from sae_lens.config import SAETrainerConfig

    torch.manual_seed(cfg.seed)
    tcfg = SAETrainerConfig(total_training_samples=cfg.steps * cfg.batch_size, train_batch_size_samples=cfg.batch_size,
                            lr=cfg.lr, lr_end=cfg.lr / 10 if cfg.lr_decay_steps else cfg.lr,
                            lr_scheduler_name=cfg.lr_scheduler_name, lr_warm_up_steps=cfg.lr_warm_up_steps,
                            lr_decay_steps=cfg.lr_decay_steps, device=cfg.device,
                            n_batches_for_norm_estimate=min(100, cfg.steps))
    trainer = SAETrainer(tcfg, sae, provider)
    if sae.cfg.normalize_activations == "expected_average_only_in":
        trainer.activation_scaler.estimate_scaling_factor(d_in=sae.cfg.d_in, data_provider=provider,
                                                          n_batches_for_norm_estimate=tcfg.n_batches_for_norm_estimate)
    history: dict[str, list[float]] = {}
    sae.to(cfg.device)
    for _ in progress(range(cfg.steps), desc=desc, total=cfg.steps):
        trainer.maybe_reset_sparsity()
        out = trainer.step(next(provider))
        trainer.n_training_steps += 1
        history.setdefault("loss", []).append(float(out.loss.detach()))
        for k, v in out.losses.items():
            history.setdefault(k, []).append(float(v.detach()) if isinstance(v, torch.Tensor) else float(v))
    if trainer.activation_scaler.scaling_factor is not None:
        sae.fold_activation_norm_scaling_factor(trainer.activation_scaler.scaling_factor)
        trainer.activation_scaler.scaling_factor = None
    trainer.set_final_sae_metadata()
    return history


def _width(store: ActivationStore, name: str) -> int:
    if name not in store.shapes:
        raise KeyError(f"{name!r} is not in the store {str(store.path)!r}; it holds {store.names}")
    width = 1
    for s in store.shapes[name]:
        width *= s
    return width


def train_sae(store: ActivationStore | str, name: str, config: SAETrainConfig | None = None, **overrides) -> SAETrainingResult:
    """Train a sae-lens SAE of ``config.architecture`` on the rows of ``name`` with sae-lens's trainer."""
    from sae_lens.registry import get_sae_training_class

    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    cfg = dataclasses.replace(config or SAETrainConfig(), **overrides)
    d_in = _width(store, name)
    try:
        sae_cls, cfg_cls = get_sae_training_class(cfg.architecture)
    except KeyError:
        from sae_lens.registry import SAE_TRAINING_CLASS_REGISTRY
        raise ValueError(f"unknown sae-lens architecture {cfg.architecture!r}; choose from "
                         f"{', '.join(sorted(SAE_TRAINING_CLASS_REGISTRY))}") from None
    fields = {f.name for f in dataclasses.fields(cfg_cls)}
    kwargs = {"d_in": d_in, "d_sae": cfg.d_sae, "device": cfg.device, "normalize_activations": cfg.normalize_activations}
    for key in ("l1_coefficient", "l1_warm_up_steps", "k"):
        if key in fields:
            kwargs[key] = getattr(cfg, key)
    kwargs.update(cfg.extra)
    sae_cfg = cfg_cls(**kwargs)
    sae_cfg.metadata.hook_name = name
    sae_cfg.metadata.context_size = store.context_size
    sae_cfg.metadata.model_name = str(store.model.get("spec"))
    torch.manual_seed(cfg.seed)
    sae = sae_cls(sae_cfg)
    history = _fit(sae, _provider(store, [name], cfg), cfg, f"sae {name}")
    return SAETrainingResult(str(store.path), [name], cfg.architecture, d_in, cfg.d_sae, cfg.steps, history, sae)


# ------------------------------------------------------------------------------------- transcoder
def _transcoder_classes():
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepOutput

    @dataclass
    class TranscoderTrainingSAEConfig(StandardTrainingSAEConfig):
        """StandardTrainingSAEConfig plus the output width ``d_out``; no decoder bias on the input."""

        d_out: int = 0
        apply_b_dec_to_input: bool = False

        @classmethod
        def architecture(cls) -> str:
            return "transcoder"

    class TranscoderTrainingSAE(StandardTrainingSAE):
        """A transcoder on sae-lens's standard SAE: ``ReLU(x W_enc + b_enc) W_dec + b_dec`` with
        ``W_dec`` ``[d_sae, d_out]``, trained to predict the MLP output from the MLP input."""

        def initialize_weights(self) -> None:
            super().initialize_weights()
            d_out = self.cfg.d_out
            w = torch.empty(self.cfg.d_sae, d_out, dtype=self.dtype, device=self.device)
            torch.nn.init.kaiming_uniform_(w)
            if self.cfg.decoder_init_norm is not None:
                w = w / w.norm(dim=-1, keepdim=True) * self.cfg.decoder_init_norm
            self.W_dec = torch.nn.Parameter(w)
            self.b_dec = torch.nn.Parameter(torch.zeros(d_out, dtype=self.dtype, device=self.device))

        def process_sae_in(self, sae_in: torch.Tensor) -> torch.Tensor:
            return self.hook_sae_input(sae_in.to(self.dtype))

        def training_forward_pass(self, step_input):
            x, y = step_input.sae_in[..., :self.cfg.d_in], step_input.sae_in[..., self.cfg.d_in:]
            feature_acts, hidden_pre = self.encode_with_hidden_pre(x)
            out = self.decode(feature_acts)
            mse = self.mse_loss_fn(out, y).sum(dim=-1).mean()
            aux = self.calculate_aux_loss(step_input=step_input, feature_acts=feature_acts, hidden_pre=hidden_pre,
                                          sae_out=out)
            losses = {"mse_loss": mse, **aux}
            return TrainStepOutput(sae_in=x, sae_out=out, feature_acts=feature_acts, hidden_pre=hidden_pre,
                                   loss=sum(losses.values()), losses=losses)

        def to_sae_lens(self):
            """The trained weights as sae-lens's inference ``Transcoder``."""
            from sae_lens.saes.transcoder import Transcoder, TranscoderConfig

            tc = Transcoder(TranscoderConfig(d_in=self.cfg.d_in, d_sae=self.cfg.d_sae, d_out=self.cfg.d_out,
                                             dtype=self.cfg.dtype, device=self.cfg.device,
                                             apply_b_dec_to_input=False, metadata=self.cfg.metadata))
            tc.load_state_dict({k: v.detach().clone() for k, v in self.state_dict().items()
                                if k in ("W_enc", "b_enc", "W_dec", "b_dec")})
            return tc

    return TranscoderTrainingSAE, TranscoderTrainingSAEConfig


def train_transcoder(store: ActivationStore | str, input_name: str, output_name: str,
                     config: SAETrainConfig | None = None, **overrides) -> SAETrainingResult:
    """Train a transcoder (MLP input -> MLP output, e.g. ``blocks.L.ln2.hook_normalized`` ->
    ``blocks.L.hook_mlp_out``) with sae-lens's trainer on a store holding both names."""
    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    cfg = dataclasses.replace(config or SAETrainConfig(), **overrides)
    if cfg.normalize_activations != "none":
        raise ValueError("normalize_activations must be 'none' for a transcoder (input and output scale differently)")
    d_in, d_out = _width(store, input_name), _width(store, output_name)
    cls, cfg_cls = _transcoder_classes()
    sae_cfg = cfg_cls(d_in=d_in, d_sae=cfg.d_sae, d_out=d_out, device=cfg.device, l1_coefficient=cfg.l1_coefficient,
                      l1_warm_up_steps=cfg.l1_warm_up_steps, **cfg.extra)
    sae_cfg.metadata.hook_name = input_name
    sae_cfg.metadata.hook_name_out = output_name
    sae_cfg.metadata.context_size = store.context_size
    torch.manual_seed(cfg.seed)
    sae = cls(sae_cfg)
    history = _fit(sae, _provider(store, [input_name, output_name], cfg), cfg, f"transcoder {input_name}")
    return SAETrainingResult(str(store.path), [input_name, output_name], "transcoder", d_in, cfg.d_sae, cfg.steps,
                             history, sae)


__all__ = ["SAETrainConfig", "SAETrainingResult", "train_sae", "train_transcoder"]
