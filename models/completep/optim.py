"""AdamW whose hyperparameters are per member and per tensor (vectorised over the ensemble axis).

Same update as ``torch.optim.AdamW`` (decoupled-in-form but lr-coupled decay, PyTorch convention)::

    p <- p * (1 - lr * wd)
    m <- beta1 m + (1 - beta1) g ;  v <- beta2 v + (1 - beta2) g^2
    p <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)

with ``lr, wd, beta1, beta2, eps`` tensors ``[E]`` per parameter tensor. :meth:`EnsembleAdamW.clip_grad_norm_`
clips each member's global gradient norm on its own (``torch.nn.utils.clip_grad_norm_`` per member).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TensorHParams:
    """AdamW hyperparameters of one parameter tensor, one value per member: each field ``[E]``."""

    lr: torch.Tensor
    wd: torch.Tensor
    beta1: torch.Tensor
    beta2: torch.Tensor
    eps: torch.Tensor


class EnsembleAdamW:
    """AdamW over parameters ``[E, ...]`` with per-member, per-tensor hyperparameters ``[E]``."""

    def __init__(self, params: list[torch.nn.Parameter], hparams: list[TensorHParams]) -> None:
        if len(params) != len(hparams):
            raise ValueError(f"{len(params)} parameters but {len(hparams)} hyperparameter sets")
        self.params = params
        self.hparams = hparams
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.t = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: torch.Tensor | float) -> torch.Tensor:
        """Clip every member's global gradient norm (over all of its parameters) to ``max_norm`` in place.

        ``max_norm``: scalar or ``[E]`` (``inf`` = no clipping for that member). As
        ``torch.nn.utils.clip_grad_norm_`` applied to each member alone: member ``e``'s gradients are multiplied
        by ``min(1, max_norm[e] / (norm[e] + 1e-6))``, so a member's clipping never depends on another member's
        gradients. Returns the pre-clipping norms ``[E]``.
        """
        grads = [p.grad for p in self.params if p.grad is not None]
        E = self.params[0].shape[0]
        if not grads:
            return torch.zeros(E)
        norm = torch.stack([g.float().pow(2).flatten(1).sum(1) for g in grads]).sum(0).sqrt()
        max_norm = torch.as_tensor(max_norm, dtype=torch.float32).expand(E)
        if (max_norm <= 0).any() or max_norm.isnan().any():
            raise ValueError(f"max_norm must be positive (inf for no clipping), got {max_norm.tolist()}")
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view((E,) + (1,) * (g.dim() - 1)).to(g.dtype))
        return norm

    @torch.no_grad()
    def step(self, lr_scale: torch.Tensor | float = 1.0) -> None:
        """One update; ``lr_scale`` (scalar or ``[E]``) multiplies every LR (the schedule)."""
        self.t += 1
        E = self.params[0].shape[0]
        scale = torch.as_tensor(lr_scale, dtype=torch.float32).expand(E)
        for p, hp, m, v in zip(self.params, self.hparams, self.exp_avg, self.exp_avg_sq):
            if p.grad is None:
                continue
            shape = (E,) + (1,) * (p.dim() - 1)
            g = p.grad
            lr = (hp.lr * scale).view(shape)
            p.mul_(1.0 - lr * hp.wd.view(shape))
            b1, b2 = hp.beta1.view(shape), hp.beta2.view(shape)
            m.mul_(b1).add_((1.0 - b1) * g)
            v.mul_(b2).add_((1.0 - b2) * g * g)
            bc1 = 1.0 - b1 ** self.t
            bc2 = 1.0 - b2 ** self.t
            denom = (v / bc2).sqrt_().add_(hp.eps.view(shape))
            p.sub_(lr / bc1 * m / denom)

    @torch.no_grad()
    def keep_members(self, keep: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
        """Drop the members outside the boolean mask ``keep`` ``[E]`` from the moments and hyperparameters;
        ``params`` are the sliced parameters (same order) from :meth:`EnsembleGPT.keep_members`."""
        if len(params) != len(self.params):
            raise ValueError(f"expected {len(self.params)} parameters, got {len(params)}")
        self.params = params
        self.exp_avg = [m[keep].contiguous() for m in self.exp_avg]
        self.exp_avg_sq = [v[keep].contiguous() for v in self.exp_avg_sq]
        self.hparams = [TensorHParams(hp.lr[keep], hp.wd[keep], hp.beta1[keep], hp.beta2[keep], hp.eps[keep])
                        for hp in self.hparams]
