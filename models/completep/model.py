"""Pre-norm GPT with QK-norm, vectorised over an ensemble of independently trained members.

Every parameter carries a leading member axis ``E``: member ``e`` is a full GPT with its own weights,
hyperparameters and multipliers, and all members are trained in the same batched matrix products (one
``bmm`` per layer for all of them). Members never interact: the loss is the sum of the members' losses,
so each member's gradient is exactly its own. This turns a learning-rate grid of small models into one
efficient CPU run; ``E = 1`` is an ordinary single model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import GPTConfig, ModuleMultipliers
from .parameterization import MATRIX_KINDS, attention_scale, residual_multiplier, tensor_rule


@dataclass(frozen=True)
class ParamInfo:
    """Where a parameter sits: its ``kind`` (a parameterization rule), module type and layer (or None)."""

    name: str
    kind: str
    module: str
    layer: int | None


def _rms(x: torch.Tensor) -> torch.Tensor:
    """Root-mean-square per member: ``x`` ``[E, ...]`` -> ``[E]``."""
    return x.detach().float().pow(2).flatten(1).mean(1).sqrt()


class EnsembleGPT(nn.Module):
    """``n_members`` independent pre-norm GPTs of shape ``cfg``.

    Per layer: ``h = h + r_attn * Attn(LN(h))``, ``h = h + r_mlp * MLP(LN(h))`` with ``r`` the residual
    multiplier (``m_L^-alpha`` under CompleteP) times the member's per-module/per-layer ``mult``;
    LayerNorms carry gains only (no biases anywhere); QK-norm is an RMS norm over the head dimension with
    one gain vector ``[head_dim]`` shared across heads; learned absolute position embeddings; untied
    unembedding. Matrices are stored ``[E, d_in, d_out]``.
    """

    def __init__(self, cfg: GPTConfig, n_members: int = 1) -> None:
        super().__init__()
        if n_members < 1:
            raise ValueError(f"n_members must be >= 1, got {n_members}")
        self.cfg = cfg
        self.n_members = n_members
        E, n, V, dh = n_members, cfg.width, cfg.vocab_size, cfg.head_dim
        f = cfg.mlp_ratio * n

        def p(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(E, *shape))

        self.tok_emb = p(V, n)
        self.pos_emb = p(cfg.seq_len, n)
        self.blocks = nn.ModuleList()
        for _ in range(cfg.depth):
            blk = nn.Module()
            blk.ln1, blk.w_qkv, blk.w_o = p(n), p(n, 3 * n), p(n, n)
            if cfg.qk_norm:
                blk.q_gain, blk.k_gain = p(dh), p(dh)
            blk.ln2, blk.w_fc, blk.w_proj = p(n), p(n, f), p(f, n)
            self.blocks.append(blk)
        self.ln_f = p(n)
        self.w_out = p(n, V)
        # forward multipliers per member (set by `configure`): input, per-layer branches, logits
        self.register_buffer("emb_mult", torch.ones(E))
        self.register_buffer("attn_mult", torch.ones(E, cfg.depth))
        self.register_buffer("mlp_mult", torch.ones(E, cfg.depth))
        self.register_buffer("logit_mult", torch.ones(E))
        self.res_mult = residual_multiplier(cfg)
        self.attn_scale = attention_scale(cfg)
        self._infos = self._param_infos()

    # ------------------------------------------------------------------ parameter bookkeeping
    def _param_infos(self) -> dict[str, ParamInfo]:
        infos = {"tok_emb": ParamInfo("tok_emb", "embedding", "embedding", None),
                 "pos_emb": ParamInfo("pos_emb", "embedding", "embedding", None)}
        for layer in range(self.cfg.depth):
            for leaf, kind, module in (("ln1", "hidden_gain", "attention"), ("w_qkv", "hidden_in", "attention"),
                                       ("q_gain", "qk_gain", "attention"), ("k_gain", "qk_gain", "attention"),
                                       ("w_o", "hidden_out", "attention"), ("ln2", "hidden_gain", "mlp"),
                                       ("w_fc", "hidden_in", "mlp"), ("w_proj", "hidden_out", "mlp")):
                if leaf.endswith("_gain") and not self.cfg.qk_norm:
                    continue
                name = f"blocks.{layer}.{leaf}"
                infos[name] = ParamInfo(name, kind, module, layer)
        infos["ln_f"] = ParamInfo("ln_f", "final_gain", "unembedding", None)
        infos["w_out"] = ParamInfo("w_out", "unembedding", "unembedding", None)
        return infos

    def param_infos(self) -> list[tuple[nn.Parameter, ParamInfo]]:
        """Every parameter with its kind, module and layer, in a fixed order."""
        params = dict(self.named_parameters())
        return [(params[name], info) for name, info in self._infos.items()]

    @torch.no_grad()
    def configure(self, init_stds: list[float], multipliers: list[ModuleMultipliers | None],
                  seeds: list[int]) -> None:
        """Initialise member ``e`` with base std ``init_stds[e]``, multipliers and generator seed ``seeds[e]``.

        Matrices: ``N(0, (std * rule.init * zeta_init)^2)``; gains: 1. Members with equal seeds draw the same
        standard-normal noise, so they differ only by their hyperparameters.
        """
        E = self.n_members
        if not (len(init_stds) == len(multipliers) == len(seeds) == E):
            raise ValueError(f"need {E} init stds, multipliers and seeds, got "
                             f"{len(init_stds)}, {len(multipliers)}, {len(seeds)}")
        cfg, L = self.cfg, self.cfg.depth
        pairs = self.param_infos()
        for e in range(E):
            mult = multipliers[e] or ModuleMultipliers()
            gen = torch.Generator().manual_seed(int(seeds[e]))
            for param, info in pairs:
                if info.kind in MATRIX_KINDS:
                    std = init_stds[e] * tensor_rule(info.kind, cfg).init * mult.factor("init", info.module, info.layer, L)
                    param[e] = torch.randn(param.shape[1:], generator=gen) * std
                else:
                    param[e] = 1.0
            self.emb_mult[e] = mult.factor("mult", "embedding")
            self.logit_mult[e] = mult.factor("mult", "unembedding")
            for layer in range(L):
                self.attn_mult[e, layer] = mult.factor("mult", "attention", layer, L)
                self.mlp_mult[e, layer] = mult.factor("mult", "mlp", layer, L)

    @torch.no_grad()
    def keep_members(self, keep: torch.Tensor) -> None:
        """Keep only the members in the boolean mask ``keep`` ``[E]`` (e.g. drop diverged runs to save compute).
        Parameters are replaced by new (sliced) ``nn.Parameter`` objects: hand :meth:`param_infos` to the
        optimizer again."""
        if keep.dtype != torch.bool or keep.shape != (self.n_members,):
            raise ValueError(f"keep must be a bool mask of shape ({self.n_members},), got {keep.dtype} {tuple(keep.shape)}")
        if not keep.any():
            raise ValueError("keep_members would leave an empty ensemble")
        for module in self.modules():
            for name, param in list(module._parameters.items()):
                if param is not None:
                    setattr(module, name, nn.Parameter(param.detach()[keep].contiguous()))
        for name in ("emb_mult", "attn_mult", "mlp_mult", "logit_mult"):
            setattr(self, name, getattr(self, name)[keep].contiguous())
        self.n_members = int(keep.sum())

    # ------------------------------------------------------------------ forward
    def _ln(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        E = self.n_members
        return F.layer_norm(x, (x.shape[-1],), eps=self.cfg.norm_eps) * gain.view(E, 1, 1, -1)

    @staticmethod
    def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``x`` ``[E, B, T, d_in]`` @ ``w`` ``[E, d_in, d_out]`` -> ``[E, B, T, d_out]`` (one bmm)."""
        E, B, T, d = x.shape
        return torch.bmm(x.reshape(E, B * T, d), w).view(E, B, T, w.shape[-1])

    def _qk_norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        E = self.n_members
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * gain.view(E, 1, 1, 1, -1)

    def _attention(self, blk: nn.Module, h: torch.Tensor) -> torch.Tensor:
        E, B, T, n = h.shape
        H, dh = self.cfg.n_heads, self.cfg.head_dim
        q, k, v = self._mm(h, blk.w_qkv).view(E, B, T, 3, H, dh).unbind(3)  # each [E, B, T, H, dh]
        if self.cfg.qk_norm:
            q, k = self._qk_norm(q, blk.q_gain), self._qk_norm(k, blk.k_gain)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.permute(0, 1, 3, 2, 4).reshape(E * B, H, T, dh)

        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True, scale=self.attn_scale)
        y = y.view(E, B, H, T, dh).permute(0, 1, 3, 2, 4).reshape(E, B, T, n)
        return self._mm(y, blk.w_o)

    def _mlp(self, blk: nn.Module, h: torch.Tensor) -> torch.Tensor:
        return self._mm(F.gelu(self._mm(h, blk.w_fc)), blk.w_proj)

    def forward(self, idx: torch.Tensor, record: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits ``[E, B, T, V]`` for token ids ``idx`` ``[B, T]`` (shared by all members) or ``[E, B, T]``.

        If ``record`` is a dict it receives per-member activation RMS values ``[E]``: ``embed`` (scaled
        embedding), ``resid`` (mean over layers of the residual stream after each block), ``resid_final``
        (before the final LayerNorm), ``attn_out`` / ``mlp_out`` (last block's branch outputs before the
        residual multiplier) and ``logits``.
        """
        E = self.n_members
        if idx.dim() == 2:
            idx = idx.unsqueeze(0).expand(E, -1, -1)
        if idx.dim() != 3 or idx.shape[0] != E:
            raise ValueError(f"idx must be [B, T] or [{E}, B, T], got shape {tuple(idx.shape)}")
        T = idx.shape[-1]
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len {self.cfg.seq_len}")
        members = torch.arange(E).view(E, 1, 1)
        x = (self.tok_emb[members, idx] + self.pos_emb[:, None, :T]) * self.emb_mult.view(E, 1, 1, 1)
        resid_rms = []
        a = m = x
        for layer, blk in enumerate(self.blocks):
            a = self._attention(blk, self._ln(x, blk.ln1))
            x = x + (self.res_mult * self.attn_mult[:, layer]).view(E, 1, 1, 1) * a
            m = self._mlp(blk, self._ln(x, blk.ln2))
            x = x + (self.res_mult * self.mlp_mult[:, layer]).view(E, 1, 1, 1) * m
            if record is not None:
                resid_rms.append(_rms(x))
        logits = self._mm(self._ln(x, self.ln_f), self.w_out) * self.logit_mult.view(E, 1, 1, 1)
        if record is not None:
            record["embed"] = _rms(self.tok_emb[members, idx] * self.emb_mult.view(E, 1, 1, 1))
            record["resid"] = torch.stack(resid_rms).mean(0) if resid_rms else _rms(x)
            record["resid_final"] = _rms(x)
            record["attn_out"] = _rms(a)
            record["mlp_out"] = _rms(m)
            record["logits"] = _rms(logits)
        return logits

    def loss(self, idx: torch.Tensor, targets: torch.Tensor,
             record: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-member mean cross-entropy ``[E]`` and Z-loss term ``mean(logsumexp(logits)^2)`` ``[E]``."""
        logits = self.forward(idx, record=record)
        E, B, T, V = logits.shape
        if targets.dim() == 2:
            targets = targets.unsqueeze(0).expand(E, -1, -1)
        flat = logits.reshape(E, B * T, V).float()
        lse = torch.logsumexp(flat, dim=-1)
        picked = flat.gather(-1, targets.reshape(E, B * T, 1)).squeeze(-1)
        return (lse - picked).mean(1), lse.pow(2).mean(1)
