"""Reproduction of "Copy-Paste to Mitigate Large Language Model Hallucinations" (CopyPasteLLM, ICLR 2026):
``interp reproduce copypaste``. The method is :mod:`interp.models.copypaste`; the validations are :mod:`.toy`
(the digest's toy) and :mod:`.smollm` (SmolLM2-135M LoRA-DPO)."""
from .recipe import RECIPE, CopyPasteRecipe, CopyPasteRunConfig
from .smollm import FACTS, Fact, SmolConfig, SmolResult, smollm_experiment
from .toy import ToyConfig, ToyResult, toy_experiment, word_tokenizer

__all__ = ["CopyPasteRecipe", "CopyPasteRunConfig", "FACTS", "Fact", "RECIPE", "SmolConfig", "SmolResult", "ToyConfig",
           "ToyResult", "smollm_experiment", "toy_experiment", "word_tokenizer"]
