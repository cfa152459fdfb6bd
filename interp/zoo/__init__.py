"""interp.zoo: named models that build offline and cache as plain Hugging Face folders.

``interp.load("zoo:NAME", backend=...)`` loads an entry; :func:`path` gives its local HF folder
(``config.json`` + ``model.safetensors`` + tokenizer or preprocessor files), building it first if needed,
so any tool that reads HF folders can use a zoo model. Entries:

- real models shipped inside packages: ``smollm2-135m`` (SmolLM2-135M-Instruct, de-quantized from GGUF),
  ``minilm-l6`` (all-MiniLM-L6-v2 BERT encoder), ``dinov2-s14`` (DINOv2 ViT-S/14 backbone rebuilt from ONNX);
- ``smollm2-135m-refusal``: SmolLM2 safety-tuned locally (LoRA, merged) on :mod:`interp.data.refusal`;
- ``toy-grammar``: a small Llama trained from scratch on a probabilistic grammar with exactly known
  continuations (:mod:`interp.data.grammar`);
- the entries of the analyzers and recipes (the protein MLM family, the planning models, ``toy-refusal``,
  ``gavel-ce-world``), declared the same way.

The cache lives under :func:`cache_dir` (``$INTERP_CACHE_DIR`` or the user cache dir), one folder per
entry and recipe hash, written atomically and checked on every load against checksums recorded at build
time (:func:`verify` / ``interp zoo verify`` for a full check; see :mod:`interp.zoo.registry`).

Entries are declared one way, built-in or not: an ``interp.zoo`` entry point (``pyproject.toml``) names the
``entries`` function of a module called ``zoo`` (``interp/apps/zoo/zoo.py`` for the built-ins,
``benchmarks/<paper>/zoo.py``, ``models/<paper>/zoo.py``), which returns the package's :class:`ZooEntry`
objects; nothing registers at import time. A new entry point is seen once the package's metadata is installed
again (``pip install -e .``). :func:`register` adds an entry for the current process only (tests, notebooks).

Layering: this package (the registry, spec parsing, the cache, loading) is kernel; it finds the entries through
the entry points and never imports a builder, which are applications (:mod:`interp.apps.zoo`) or recipe
modules, imported only when an entry is built. The data they train on is the public module :mod:`interp.data`.
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

__all__ = [
    "ZooEntry", "ZooInfo", "ZooIntegrityError", "available", "build", "cache_dir", "cached_path",
    "get_entry", "info", "path", "recipe", "recipe_hash", "register", "unregister", "verify",
]
