"""The RepIt reproduction's zoo entry ``toy-refusal`` (declared through ``pyproject.toml``'s ``interp.zoo`` entry
point, which names :func:`entries`; nothing registers at import time). Its name, version and params are those of
the entry ``interp.zoo.builtin`` registered before it moved to the recipe, so its cache key
(``tests/zoo/test_moved_entries.py`` pins it) and every cached build stay valid. The builder is
:mod:`.toy_model`, imported only when the entry is built."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from interp.zoo.registry import ZooEntry


@dataclass
class ToyRefusalConfig:
    """Model size and training recipe of ``zoo:toy-refusal`` (the recipe's 2-layer, d = 64 transformer)."""

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 256
    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    seed: int = 0
    #: layers trained without their MLP (down projection zero and frozen), so that the early layers only move
    #: words into the end-of-instruction positions and the refusal decision is computed later
    attention_only_layers: tuple[int, ...] = (0,)
    num_threads: int | None = 1
    #: build fails unless held-out accuracy of the first response token (refuse vs comply) reaches this
    min_accuracy: float = 0.98

    def to_params(self) -> dict:
        return asdict(self)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "ToyRefusalConfig":
        params = dict(params)
        params["attention_only_layers"] = tuple(params.get("attention_only_layers", ()))
        return cls(**params)


def _build(out: Path, params: Mapping[str, Any]) -> dict:
    from .toy_model import build_toy_refusal

    return build_toy_refusal(out, params)


TOY_REFUSAL = ZooEntry(
    name="toy-refusal",
    description="2-layer Llama (d 64) trained from scratch to refuse six-word requests that combine a shared "
                "harmful-intent word with a harmful topic (bio, chem, nuclear, cyber, fraud, violence); the "
                "CPU-scale category-refusal model of the RepIt validation (data: interp.benchmarks.repit.toy_data).",
    source="trained locally on interp.benchmarks.repit.toy_data.instructions",
    architecture="LlamaForCausalLM",
    size="0.14M params",
    builder=_build,
    params=ToyRefusalConfig().to_params(),
)


def entries() -> tuple[ZooEntry, ...]:
    """The zoo entries of this package (the ``interp.zoo`` entry point)."""
    return (TOY_REFUSAL,)


__all__ = ["TOY_REFUSAL", "ToyRefusalConfig", "entries"]
