"""The GAVEL reproduction's zoo entry ``gavel-ce-world``: the CE-world LM (declared through ``pyproject.toml``'s
``interp.zoo`` entry point, which names :func:`entries`; nothing registers at import time). The world and the
builder are :mod:`.ce_world`, imported only when the entry is built."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from interp.zoo.registry import ZooEntry

ZOO_NAME = "gavel-ce-world"


@dataclass
class CEWorldConfig:
    """The CE-world LM (2 layers, d 64, 4 query / 2 KV heads so the GQA readout is exercised)."""

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    length: int = 40
    steps: int = 600
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 0
    min_phrase_accuracy: float = 0.9

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "length", "steps", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"CEWorldConfig.{name} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("CEWorldConfig.n_heads must be a multiple of n_kv_heads")
        if self.length < 20:
            raise ValueError(f"CEWorldConfig.length must be at least 20, got {self.length}")


def _build(out: Path, params: Mapping[str, Any]) -> dict:
    from .ce_world import build_ce_world_model

    return build_ce_world_model(out, params)


CE_WORLD = ZooEntry(
    name=ZOO_NAME,
    description="GAVEL CE world: 2-layer Llama (d 64, 4 query / 2 KV heads) trained by next-token prediction on "
                "conversations with 4 CE token families (benchmarks/gavel/ce_world.py).",
    source="trained locally on interp.benchmarks.gavel.ce_world.make_conversation",
    architecture="llama", size="~0.1M", builder=_build, params=asdict(CEWorldConfig()))


def entries() -> tuple[ZooEntry, ...]:
    """The zoo entries of this package (the ``interp.zoo`` entry point)."""
    return (CE_WORLD,)


__all__ = ["CE_WORLD", "CEWorldConfig", "ZOO_NAME", "entries"]
