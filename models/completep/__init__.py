"""Completed Hyperparameter Transfer across Modules, Width, Depth, Batch and Duration (Complete(d)P; Mlodozeniec
et al., ICLR 2026), on top of CompleteP (Dey et al. 2025), at CPU scale.

A pre-norm GPT with QK-norm whose initialisation, per-tensor AdamW hyperparameters (LR, weight decay,
epsilon) and forward multipliers follow CompleteP's width (``m_N``) and depth (``m_L``, ``alpha``) rules with
the Complete(d)P corrections, next to the standard (GPT-2) parameterization; the SDE rules for batch size and
training duration (:func:`sde_scale`); per-module / per-depth multipliers in the paper's Kronecker form
(:class:`ModuleMultipliers`) with trust-region random search (:func:`trust_region_search`). The validation
experiments on the King James Bible at character level are the reproduction recipe
``interp reproduce completep`` (``benchmarks/completep/``).

Public API::

    GPTConfig, HParams, ModuleMultipliers, sde_scale       # configuration and transfer rules
    tensor_rule, residual_multiplier, attention_scale        # the parameterization tables
    EnsembleGPT, EnsembleAdamW, MemberSpec, train_ensemble   # model, optimizer, training
    load_kjv_corpus, CharTokenizer, kjv_text                 # data
    trust_region_search                                      # per-module multiplier search
"""
from .config import BLOCK_MODULES, FINAL_GAIN_EPS, HP_TYPES, MODULES, PARAMETERIZATIONS, GPTConfig, HParams, ModuleMultipliers, sde_scale
from .data import CharCorpus, CharTokenizer, kjv_text, load_kjv_corpus
from .model import EnsembleGPT, ParamInfo
from .optim import EnsembleAdamW, TensorHParams
from .search import trust_region_search
from .parameterization import PARAM_KINDS, TensorRule, attention_scale, residual_multiplier, tensor_rule
from .train import EnsembleRun, MemberSpec, evaluate, tensor_hparams, train_ensemble

__all__ = [
    "BLOCK_MODULES", "FINAL_GAIN_EPS", "HP_TYPES", "MODULES", "PARAMETERIZATIONS", "PARAM_KINDS", "CharCorpus", "CharTokenizer",
    "EnsembleAdamW", "EnsembleGPT", "EnsembleRun", "GPTConfig", "HParams",
    "MemberSpec", "ModuleMultipliers", "ParamInfo", "TensorHParams", "TensorRule", "attention_scale",
    "evaluate", "kjv_text", "load_kjv_corpus", "residual_multiplier", "sde_scale", "tensor_hparams", "tensor_rule",
    "train_ensemble", "trust_region_search",
]
