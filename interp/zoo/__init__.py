"""interp.zoo: named models that build offline and cache as plain Hugging Face folders.

``interp.load("zoo:NAME", backend=...)`` loads an entry; :func:`path` gives its local HF folder
(``config.json`` + ``model.safetensors`` + tokenizer or preprocessor files), building it first if needed,
so any tool that reads HF folders can use a zoo model. Entries:

- real models shipped inside packages: ``smollm2-135m`` (SmolLM2-135M-Instruct, de-quantized from GGUF),
  ``minilm-l6`` (all-MiniLM-L6-v2 BERT encoder), ``dinov2-s14`` (DINOv2 ViT-S/14 backbone rebuilt from ONNX);
- ``smollm2-135m-refusal``: SmolLM2 safety-tuned locally (LoRA, merged) on :mod:`interp.data.refusal`;
- ``toy-grammar``: a small Llama trained from scratch on a probabilistic grammar with exactly known
  continuations (:mod:`interp.zoo.grammar`).

The cache lives under :func:`cache_dir` (``$INTERP_CACHE_DIR`` or the user cache dir), one folder per
entry and recipe hash, written atomically and checked on every load against checksums recorded at build
time (:func:`verify` / ``interp zoo verify`` for a full check; see :mod:`interp.zoo.registry`). Other
packages add entries with :func:`register` or through the ``interp.zoo`` entry-point group.

Layering: the capture layer imports only this registry (to resolve ``zoo:NAME``); the training recipes
(:mod:`.grammar`, :mod:`.refusal`, :mod:`.real`) are imported only when an entry is
built, and the data they train on is the public module :mod:`interp.data`, which analyzers use too.
"""
from __future__ import annotations

from .registry import (
    ZooEntry,
    ZooInfo,
    ZooIntegrityError,
    available,
    build,
    cache_dir,
    cached_path,
    get_entry,
    info,
    path,
    recipe,
    recipe_hash,
    register,
    unregister,
    verify,
)
from . import builtin as _builtin  # noqa: E402,F401  (registers the built-in entries)

__all__ = [
    "ZooEntry", "ZooInfo", "ZooIntegrityError", "available", "build", "cache_dir", "cached_path",
    "get_entry", "info", "path", "recipe", "recipe_hash", "register", "unregister", "verify",
]
