"""Reproduction of TCPE ("Precise and Interpretable Editing of Code Knowledge in LLMs", ICLR 2026):
``interp reproduce tcpe``. The method is :mod:`interp.editing` (``rome.py``: TCPE, ROME, FT-L; ``transcoders.py``;
``kecode.py``: the KECode metrics); here: the facts recipe (:mod:`.facts`), the KECode-like toy
(:mod:`.kecode_toy`), the real-model facts (:mod:`.real_facts`) and the recipe."""
from .recipe import RECIPE, TcpeConfig, TcpeRecipe

__all__ = ["RECIPE", "TcpeConfig", "TcpeRecipe"]
