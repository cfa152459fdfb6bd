"""CopyPasteLLM (Long et al., ICLR 2026): copy-paste answers against contextual hallucination.

* copying metrics kappa / delta on whitespace tokens (Eq. 1, Alg. 4) and the CP-Refine copy score;
* CopyPaste prompting (CP-Order, CP-Link, CP-Refine) around any text generator;
* preference construction (Alg. 2: filter, Elo tournament, answer stamping) and DPO (beta = 0.3, own loss);
* Context-Parameter Copying Capturing (Alg. 3) through the :mod:`interp` capture layer.

The validations (the digest's toy and the SmolLM2-135M LoRA-DPO run) are the reproduction recipe
``interp reproduce copypaste`` (``benchmarks/copypaste/``).

Public API::

    copy_fragments, copy_metrics, copy_score
    cp_order, cp_link, cp_refine, RefineConfig, RefineTrace, parse_extracted, parse_order
    Candidate, PreferencePair, PreferenceConfig, build_pairs, elo_tournament
    DPOConfig, dpo_loss, sequence_logprobs, encode_pairs, dpo_train, DPOHistory
    CaptureConfig, CaptureResult, capture_copying
"""
from .capture import FUNCTION_WORDS, CaptureConfig, CaptureResult, capture_copying
from .dpo import DPOConfig, DPOHistory, EncodedPairs, dpo_loss, dpo_train, encode_pairs, sequence_logprobs
from .metrics import copy_fragments, copy_metrics, copy_score
from .preference import Candidate, PreferenceConfig, PreferencePair, SampleScores, build_pairs, elo_tournament
from .prompting import RefineConfig, RefineTrace, cp_link, cp_order, cp_refine, parse_extracted, parse_order, split_sentences

__all__ = [
    "FUNCTION_WORDS", "CaptureConfig", "CaptureResult", "capture_copying", "DPOConfig", "DPOHistory", "EncodedPairs",
    "dpo_loss", "dpo_train", "encode_pairs", "sequence_logprobs", "copy_fragments", "copy_metrics", "copy_score",
    "Candidate", "PreferenceConfig", "PreferencePair", "SampleScores", "build_pairs", "elo_tournament",
    "RefineConfig", "RefineTrace", "cp_link", "cp_order", "cp_refine", "parse_extracted", "parse_order",
    "split_sentences",
]
