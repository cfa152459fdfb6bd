"""Reverse distillation: consistently scaling protein language model representations (Catrina et al., ICLR 2026).

Given per-residue embeddings ``H_r`` ``[L, k_r]`` of a smaller model and ``H_p`` ``[L, k_p]`` of a larger one of the
same family, fit a linear map ``H_r -> H_p`` (PCR with the Johnstone threshold by default; OLS or ridge), take the
top ``k_p - k_r`` principal directions of the residual and output ``[H_r, H_res]`` (Matryoshka: the first ``k_r``
dimensions are exactly the smaller model's embedding). Chains over several sizes accumulate the RD embedding.
Official code: ``rohitsinghlab/plm_reverse_distillation`` (read, not copied).

Public API::

    ScalerConfig, RDScaler, NaiveScaler, RDChain, fit_pcr, fit_linear_map, fit_residual_pca,
    johnstone_threshold, estimate_noise_variance, reconstruction_r2      # the method
    ReverseDistilledFamily                                               # models + fitted chain -> new sequences
    PLMConfig, embed_residues, load_plm, family                          # the protein MLM family (zoo entries)
    load_proteins, split_proteins, residue_tasks, sequence_tasks, hmm_domain_labels, TASKS
    probe_score, exactness

The zoo entries ``protein-mlm-{32,64,128}`` and ``protein-mlm-toy-{8,16,24}`` are declared through the
``interp.zoo`` entry point ``protein-mlm`` (:func:`.zoo.entries`); nothing registers at import time. The
validations (the digest's synthetic latent-factor family, the protein family beside the paper's ProteinGym
numbers) are the reproduction recipe ``interp reproduce reverse_distillation``
(``benchmarks/reverse_distillation/``).
"""
from .family import ReverseDistilledFamily
from .plm import ESM_TOKENS, PLMConfig, embed_residues, load_plm, make_tokenizer, masked_lm_eval, train_plm
from .probes import exactness, probe_score
from .proteins import (TASKS, ProteinSet, Task, hmm_domain_labels, load_proteins, residue_tasks, sequence_tasks,
                       split_proteins, window_mean)
from .scaler import (REGRESSORS, VARIANTS, LinearMap, NaiveScaler, RDChain, RDScaler, ResidualPCA, ScalerConfig,
                     estimate_noise_variance, fit_linear_map, fit_pcr, fit_residual_pca, johnstone_threshold,
                     reconstruction_r2)
from .zoo import FAMILY, TOY_FAMILY, family, family_configs

__all__ = [
    "ESM_TOKENS", "FAMILY", "LinearMap", "NaiveScaler", "PLMConfig",
    "ProteinSet", "RDChain", "RDScaler", "REGRESSORS", "ResidualPCA", "ReverseDistilledFamily",
    "ScalerConfig", "TASKS", "TOY_FAMILY", "Task",
    "VARIANTS", "embed_residues", "estimate_noise_variance", "exactness", "family", "family_configs",
    "fit_linear_map", "fit_pcr", "fit_residual_pca", "hmm_domain_labels", "johnstone_threshold", "load_plm",
    "load_proteins", "make_tokenizer", "masked_lm_eval", "probe_score", "reconstruction_r2",
    "residue_tasks", "sequence_tasks", "split_proteins", "train_plm", "window_mean",
]
