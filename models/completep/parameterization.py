"""Per-tensor rules of Complete(d)P (and of the standard / muP baselines): init, AdamW LR, decay, epsilon.

Every parameter tensor has a *kind*; its hyperparameters are the base value times a shape factor from the
tables below (``m_N = width/base_width``, ``m_L = depth/base_depth``, ``a = alpha``).

Complete(d)P (``parameterization="completep"``)::

    kind           init std      LR                  weight decay   Adam eps            forward
    embedding      s             lr                  wd             eps / m_N           x mult_emb
    hidden_in/out  s / sqrt(m_N) lr / m_N * m_L^(a-1) wd * m_N      eps / m_N * m_L^-a  branch x m_L^-a
    hidden_gain    1             lr * m_L^(a-1)      0              eps / m_N * m_L^-a
    qk_gain        1             lr * m_L^(a-1)      0              eps * m_L^-a
    final_gain     1             lr                  0              eps / m_N * m_L^-a  (final_gain_eps="reference")
                                                                    eps / m_N           (final_gain_eps="width")
    unembedding    s / m_N       lr / m_N            wd * m_N       eps                 no logit multiplier
    attention logits: q.k * sqrt(base_head_dim) / head_dim

Sources: the CompleteP reference code (hidden matrices, embedding, gains; the embedding/unembedding epsilon fix
credited there to this paper) and the Complete(d)P changes listed in the digest: QK-norm gains are shared
across heads so their epsilon is constant in width; the output-logit multiplier ``1/m_N`` is removed and
absorbed into the unembedding init (``s/m_N``), LR (``lr/m_N``) and decay (``wd*m_N``). The reference code
scales one epsilon, ``eps / m_N * m_L^-a``, for every parameter group, the final gain included; that is our
default for the final gain, and ``GPTConfig.final_gain_eps="width"`` drops its depth factor (see
``config.FINAL_GAIN_EPS``; which one Complete(d)P uses is not known).
Choices where the paper's Table 1 was not available (UNCERTAIN): the unembedding epsilon is constant in
width (its gradient is width-independent once the multiplier is absorbed); the QK-norm gains take the same
depth factors as the other hidden gains; the attention scale is written so that it equals ``1/sqrt(d)`` at
the base head size (the head size is fixed across widths here, so only the constant matters).

``mup``: as ``completep`` with every depth factor set to 1 (no residual scaling, no depth LR/eps factors).

``sp`` (standard, GPT-2/nanoGPT, the baseline of the CompleteP paper): init std ``s`` for every matrix except
the residual output projections (``s / sqrt(2 L)``), a single LR / decay / epsilon for all tensors, weight
decay on matrices only, ``1/sqrt(head_dim)`` attention, no residual or logit multipliers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config import GPTConfig

PARAM_KINDS = ("embedding", "hidden_in", "hidden_out", "hidden_gain", "qk_gain", "final_gain", "unembedding")
MATRIX_KINDS = ("embedding", "hidden_in", "hidden_out", "unembedding")


@dataclass(frozen=True)
class TensorRule:
    """Shape factors of one tensor kind: multiply the base init std, LR, weight decay and Adam epsilon."""

    init: float
    lr: float
    wd: float
    eps: float


def tensor_rule(kind: str, cfg: GPTConfig) -> TensorRule:
    """The factors of tensor ``kind`` for a model of shape ``cfg`` (see the module table)."""
    if kind not in PARAM_KINDS:
        raise ValueError(f"unknown tensor kind {kind!r}; expected one of {PARAM_KINDS}")
    p = cfg.parameterization
    if p == "sp":
        init = 1.0 / math.sqrt(2 * cfg.depth) if kind == "hidden_out" else 1.0
        decays = kind in MATRIX_KINDS
        return TensorRule(init=init if kind in MATRIX_KINDS else 1.0, lr=1.0, wd=1.0 if decays else 0.0, eps=1.0)
    m_n = cfg.width_mult
    a = cfg.alpha
    m_l = cfg.depth_mult if p == "completep" else 1.0
    depth_lr = m_l ** (a - 1.0)
    depth_eps = m_l ** (-a)
    if kind == "embedding":
        return TensorRule(init=1.0, lr=1.0, wd=1.0, eps=1.0 / m_n)
    if kind in ("hidden_in", "hidden_out"):
        return TensorRule(init=1.0 / math.sqrt(m_n), lr=depth_lr / m_n, wd=m_n, eps=depth_eps / m_n)
    if kind == "hidden_gain":
        return TensorRule(init=1.0, lr=depth_lr, wd=0.0, eps=depth_eps / m_n)
    if kind == "qk_gain":
        return TensorRule(init=1.0, lr=depth_lr, wd=0.0, eps=depth_eps)
    if kind == "final_gain":
        eps = depth_eps / m_n if cfg.final_gain_eps == "reference" else 1.0 / m_n
        return TensorRule(init=1.0, lr=1.0, wd=0.0, eps=eps)
    return TensorRule(init=1.0 / m_n, lr=1.0 / m_n, wd=m_n, eps=1.0)  # unembedding


def residual_multiplier(cfg: GPTConfig) -> float:
    """Multiplier of every residual branch: ``m_L^-alpha`` under CompleteP, 1 otherwise."""
    return cfg.depth_mult ** (-cfg.alpha) if cfg.parameterization == "completep" else 1.0


def attention_scale(cfg: GPTConfig) -> float:
    """Scale of ``q.k``: ``sqrt(base_head_dim)/head_dim`` (muP ``1/d``) or ``1/sqrt(head_dim)`` under SP."""
    if cfg.parameterization == "sp":
        return 1.0 / math.sqrt(cfg.head_dim)
    return math.sqrt(cfg.base_head_dim) / cfg.head_dim
