"""interp: one activation-capture layer over TransformerLens, nnsight and plain PyTorch hooks.

TransformerLens hook names (``blocks.{l}.hook_resid_post``, ``blocks.{l}.attn.hook_z`` ...) are the
common language on every backend. ``interp.load`` / ``interp.wrap`` return a :class:`Model` that can
capture, cache and intervene (add, scale, ablate, project out, patch) through one API.
"""
from .progress import progress, set_progress
from .results import Result

__all__ = ["progress", "set_progress", "Result"]
__version__ = "0.1.0"
