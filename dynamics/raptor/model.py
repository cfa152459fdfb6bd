"""The Raptor surrogate: k << L weight-tied blocks that reproduce every intermediate layer of a ViT.

Re-implemented from the paper and the official code (``KempnerInstitute/raptor``: ``block.py``, ``raptor.py``):

* block: pre-LN ViT block, multi-head self-attention + MLP (SwiGLU as in the final runs, or GELU), LayerScale
  initialised to ``1e-5``. The SwiGLU hidden width is ``mlp_ratio * d`` (official ``block.py``:
  ``Linear(d, 2 * hid) -> silu(x1) * x2 -> Linear(hid, d)`` with ``hid = int(d * mlp_ratio)``); our earlier
  ``2/3 * mlp_ratio * d`` (the LLaMA convention, 25% fewer block parameters at d = 64) stays as
  ``swiglu_hidden="two_thirds"``;
* depth conditioning ("depth scaling"): ``t_proj = Linear(1, 16) -> SiLU -> Linear(16, 3d)`` with the last layer's
  weight *and bias* initialised ``N(0, 1e-4)`` (official; ``t_bias_init="zeros"`` is our earlier zero bias);
  ``(t1, t2, t3) = t_proj(t) + 1`` where ``t`` is the float index of the *output*
  layer (1-based, as in the code's rollout ``t = output_layer``)::

      x = x + t1 * LS1(Attn(LN1 x));  x = x + t2 * LS2(MLP(LN2 x));  return t3 * x

  so the dynamical system is non-autonomous. ``depth_scaling=False`` drops ``t_proj`` (the ablation);
* routing: output layer ``t`` (1-based) uses block ``j`` = the first threshold with ``t <= thresholds[j]``,
  the last block beyond all thresholds (Raptor2 on DINOv2-B: ``[7]``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
import torch.nn.functional as F

from interp.io import SerializationError, build_checked, load_tensors_json, output_dir, save_tensors_json

__all__ = ["RaptorConfig", "RaptorBlock", "Raptor"]


@dataclass
class RaptorConfig:
    """Architecture of a Raptor surrogate.

    ``n_layers``: teacher depth L; ``thresholds``: routing, strictly increasing 1-based output layers in
    ``[1, L - 1]``, one fewer than the number of blocks (``[]`` = one block; ``list(range(1, L))`` = one block per
    layer, the k = L sanity check); ``mlp``: ``"swiglu"`` or ``"gelu"``; ``swiglu_hidden``: ``"official"``
    (hidden width ``int(mlp_ratio * d)``, the official ``block.py``) or ``"two_thirds"`` (ours before issue #33:
    ``int(2/3 * mlp_ratio * d)``); ``t_bias_init``: ``"normal"`` (official: ``t_proj``'s last bias ~ N(0, 1e-4),
    like its weight) or ``"zeros"`` (ours before issue #33).
    """

    d_model: int
    n_heads: int
    n_layers: int
    thresholds: list[int] = field(default_factory=list)
    mlp_ratio: float = 4.0
    mlp: str = "swiglu"
    layerscale_init: float = 1e-5
    depth_scaling: bool = True
    t_hidden: int = 16
    swiglu_hidden: str = "official"
    t_bias_init: str = "normal"

    def __post_init__(self):
        for name in ("d_model", "n_heads", "n_layers", "t_hidden"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"RaptorConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"RaptorConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        th = [int(t) for t in self.thresholds]
        if any(b <= a for a, b in zip(th, th[1:])) or any(not 1 <= t <= self.n_layers - 1 for t in th):
            raise ValueError(f"RaptorConfig.thresholds must be strictly increasing 1-based layers in [1, "
                             f"{self.n_layers - 1}]; got {self.thresholds}")
        self.thresholds = th
        if self.mlp not in ("swiglu", "gelu"):
            raise ValueError(f"RaptorConfig.mlp must be 'swiglu' or 'gelu', got {self.mlp!r}")
        if self.swiglu_hidden not in ("official", "two_thirds"):
            raise ValueError(f"RaptorConfig.swiglu_hidden must be 'official' or 'two_thirds', got {self.swiglu_hidden!r}")
        if self.t_bias_init not in ("normal", "zeros"):
            raise ValueError(f"RaptorConfig.t_bias_init must be 'normal' or 'zeros', got {self.t_bias_init!r}")
        if self.mlp_ratio <= 0 or self.layerscale_init < 0:
            raise ValueError("RaptorConfig.mlp_ratio must be > 0 and layerscale_init >= 0")

    @property
    def n_blocks(self) -> int:
        return len(self.thresholds) + 1

    @property
    def mlp_hidden(self) -> int:
        """Hidden width of the MLP: ``int(mlp_ratio * d)`` (GELU; SwiGLU official), ``int(2/3 * mlp_ratio * d)``
        (SwiGLU with ``swiglu_hidden="two_thirds"``)."""
        if self.mlp == "swiglu" and self.swiglu_hidden == "two_thirds":
            return max(1, int(self.mlp_ratio * self.d_model * 2 / 3))
        return max(1, int(self.mlp_ratio * self.d_model))

    @classmethod
    def from_phases(cls, parts: list[list[int]], **kwargs) -> "RaptorConfig":
        """Config whose routing follows contiguous phases of 0-based block indices (from :func:`phases`)."""
        flat = [l for p in parts for l in p]
        if flat != list(range(len(flat))):
            raise ValueError(f"phases must be contiguous and cover 0..L-1 in order; got {parts}")
        return cls(n_layers=len(flat), thresholds=[p[-1] + 1 for p in parts[:-1]], **kwargs)


class _SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.w12 = nn.Linear(d, 2 * hidden)
        self.w3 = nn.Linear(hidden, d)

    def forward(self, x):
        a, b = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(a) * b)


class RaptorBlock(nn.Module):
    """One weight-tied block. ``forward(x [..., tokens, d], t [...])`` with ``t`` the 1-based output layer."""

    def __init__(self, cfg: RaptorConfig):
        super().__init__()
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, cfg.n_heads, batch_first=True)
        self.ls1 = nn.Parameter(torch.full((d,), cfg.layerscale_init))
        self.ln2 = nn.LayerNorm(d)
        if cfg.mlp == "swiglu":
            self.mlp = _SwiGLU(d, cfg.mlp_hidden)
        else:
            self.mlp = nn.Sequential(nn.Linear(d, cfg.mlp_hidden), nn.GELU(), nn.Linear(cfg.mlp_hidden, d))
        self.ls2 = nn.Parameter(torch.full((d,), cfg.layerscale_init))
        self.t_proj = None
        if cfg.depth_scaling:
            self.t_proj = nn.Sequential(nn.Linear(1, cfg.t_hidden), nn.SiLU(), nn.Linear(cfg.t_hidden, 3 * d))
            nn.init.normal_(self.t_proj[2].weight, std=1e-4)
            if cfg.t_bias_init == "normal":
                nn.init.normal_(self.t_proj[2].bias, std=1e-4)
            else:
                nn.init.zeros_(self.t_proj[2].bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
        lead, (T, d) = x.shape[:-2], x.shape[-2:]
        h = x.reshape(-1, T, d)
        if self.t_proj is not None:
            tt = torch.as_tensor(t, dtype=x.dtype, device=x.device).expand(lead).reshape(-1, 1, 1)
            t1, t2, t3 = (self.t_proj(tt) + 1).chunk(3, dim=-1)          # each [n, 1, d]
        else:
            t1 = t2 = t3 = 1.0
        a = self.ln1(h)
        h = h + t1 * self.ls1 * self.attn(a, a, a, need_weights=False)[0]
        h = h + t2 * self.ls2 * self.mlp(self.ln2(h))
        return (t3 * h).reshape(*lead, T, d)


class Raptor(nn.Module):
    """k weight-tied blocks routed by layer thresholds; ``forward(a_start, start, end)`` rolls out
    autoregressively and returns every output ``[end - start, batch, tokens, d]`` (layers ``start+1..end``)."""

    def __init__(self, cfg: RaptorConfig):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(RaptorBlock(cfg) for _ in range(cfg.n_blocks))

    def block_index(self, t: int) -> int:
        """Block used to produce 1-based output layer ``t``."""
        if not 1 <= t <= self.cfg.n_layers:
            raise ValueError(f"output layer must be in [1, {self.cfg.n_layers}], got {t}")
        for j, th in enumerate(self.cfg.thresholds):
            if t <= th:
                return j
        return len(self.cfg.thresholds)

    def step(self, x: torch.Tensor, t: int) -> torch.Tensor:
        """One layer: produce output layer ``t`` (1-based) from layer ``t - 1``."""
        return self.blocks[self.block_index(t)](x, float(t))

    def forward(self, a_start: torch.Tensor, start: int = 0, end: int | None = None) -> torch.Tensor:
        end = self.cfg.n_layers if end is None else end
        if not 0 <= start < end <= self.cfg.n_layers:
            raise ValueError(f"need 0 <= start < end <= {self.cfg.n_layers}; got start={start}, end={end}")
        if a_start.dim() != 3 or a_start.shape[-1] != self.cfg.d_model:
            raise ValueError(f"a_start must be [batch, tokens, {self.cfg.d_model}]; got {tuple(a_start.shape)}")
        outs, x = [], a_start
        for t in range(start + 1, end + 1):
            x = self.step(x, t)
            outs.append(x)
        return torch.stack(outs)

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """``path/config.json`` + ``path/model.safetensors`` (atomic)."""
        with output_dir(path, overwrite=overwrite, writer="Raptor.save") as tmp:
            save_tensors_json(tmp, self.state_dict(), asdict(self.cfg), tensor_file="model.safetensors",
                              json_file="config.json", indent=None)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "Raptor":
        """Read a model written by :meth:`save` (a config without ``swiglu_hidden``, saved before issue #33, was
        built with the 2/3 width and is read so); the configuration is checked against the weights' shapes
        before anything is allocated (:class:`interp.io.SerializationError` naming the file otherwise)."""
        tensors, cfg = load_tensors_json(path, tensor_file="model.safetensors", json_file="config.json", what="Raptor")
        where = Path(path) / "config.json"
        if isinstance(cfg, dict) and "swiglu_hidden" not in cfg:
            cfg = {**cfg, "swiglu_hidden": "two_thirds"}  # saved before issue #33: built with the 2/3 width
        try:
            config = RaptorConfig(**cfg)
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"{where}: not a RaptorConfig ({exc})") from None
        return build_checked(lambda: cls(config), tensors, where)
