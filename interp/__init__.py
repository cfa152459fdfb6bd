"""interp: one activation-capture layer over TransformerLens, nnsight and plain PyTorch hooks.

TransformerLens hook names (``blocks.{l}.hook_resid_post``, ``blocks.{l}.attn.hook_z`` ...) are the
common language on every backend. ``interp.load`` / ``interp.wrap`` return a :class:`Model` that can
capture, cache and intervene (add, scale, ablate, project out, patch) through one API::

    model = interp.load("zoo:smollm2-135m", backend="nnsight")
    logits, cache = model.run_with_cache("The capital of France is", names="blocks.*.hook_resid_post")
    with model.intervene({"blocks.3.hook_resid_post": interp.Add(vector, scale=4.0)}):
        print(model.generate("Tell me a story", max_new_tokens=20))
"""
from .cache import Cache
from .interventions import Ablate, Add, Compose, HookContext, Intervention, Patch, ProjectOut, Scale
from .loading import BACKENDS, load, wrap
from .model import GradientResult, Model, ModelConfig
from .names import HookNotFiredError, UnknownHookError
from .progress import progress, set_progress
from .results import Result

__all__ = ["load", "wrap", "Model", "ModelConfig", "Cache", "GradientResult", "BACKENDS",
           "Add", "Scale", "Ablate", "ProjectOut", "Patch", "Compose", "Intervention", "HookContext",
           "UnknownHookError", "HookNotFiredError", "progress", "set_progress", "Result"]
__version__ = "0.1.0"

#: submodules reachable as attributes without an import of their own, as TransformerLens users write
#: ``transformer_lens.utils`` / ``transformer_lens.patching`` (loaded on first access)
_LAZY_SUBMODULES = ("utils", "patching", "viz")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
