"""A model family with a fitted reverse-distillation chain, applied to new sequences."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from interp.io import atomic_dir, legacy_by_json, load_json, save_tensors_json

from .plm import embed_residues, load_plm
from .scaler import RDChain, ScalerConfig

__all__ = ["ReverseDistilledFamily"]


#: a family folder written before the writer had its own name (its manifest names the shared "interp")
_LEGACY_FAMILY = legacy_by_json("family.json", ("family.json", "chain/chain.json", "chain/scalers.safetensors",
                                                "chain/.interp-output.json"), "models")


class ReverseDistilledFamily:
    """A family of models (ascending width) with a fitted :class:`RDChain`: embeds new sequences.

    ``models``: zoo names or HF folders of ``EsmForMaskedLM`` models. ``embed(seqs)`` returns, per level
    ``i``, the per-residue RD embeddings (one ``[L_j, k_i]`` tensor per sequence); level 0 is the smallest model's
    own embedding, level ``i`` starts with level ``i - 1`` (Matryoshka).
    """

    def __init__(self, models: Sequence[str], chain: RDChain):
        if len(models) != len(chain.widths):
            raise ValueError(f"{len(models)} models but the chain has {len(chain.widths)} levels")
        self.models, self.chain = list(models), chain
        self._loaded: list | None = None

    def _plms(self) -> list:
        if self._loaded is None:
            self._loaded = [load_plm(m) for m in self.models]
        return self._loaded

    def raw(self, sequences: Sequence[str], batch_size: int = 16) -> list[list[torch.Tensor]]:
        """Per model: per-residue embeddings of each sequence."""
        return [embed_residues(m, sequences, batch_size) for m in self._plms()]

    @classmethod
    def fit(cls, models: Sequence[str], sequences: Sequence[str], config: ScalerConfig | None = None,
            batch_size: int = 16) -> "ReverseDistilledFamily":
        """Embed ``sequences`` with every model and fit the chain on all their residues."""
        plms = [load_plm(m) for m in models]
        embs = [torch.cat(embed_residues(m, sequences, batch_size)) for m in plms]
        fam = cls(models, RDChain.fit(embs, config))
        fam._loaded = plms
        return fam

    def apply(self, raw: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """RD embeddings from already computed per-model embeddings (as returned by :meth:`raw`)."""
        lengths = [len(e) for e in raw[0]]
        levels = self.chain.transform([torch.cat(e) for e in raw])
        return [list(torch.split(lv, lengths)) for lv in levels]

    def embed(self, sequences: Sequence[str], batch_size: int = 16) -> list[list[torch.Tensor]]:
        return self.apply(self.raw(sequences, batch_size))

    def save(self, path: str | Path) -> Path:
        """``family.json`` (model names) + the chain (``chain.json``, ``scalers.safetensors``)."""
        path = Path(path)
        with atomic_dir(path, writer="ReverseDistilledFamily.save", former=("interp",), legacy=_LEGACY_FAMILY) as tmp:
            self.chain.save(tmp / "chain")
            save_tensors_json(tmp, {}, {"models": [str(m) for m in self.models]}, stem="family")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ReverseDistilledFamily":
        path = Path(path)
        meta = load_json(path / "family.json", what="ReverseDistilledFamily", required=("models",))
        return cls(meta["models"], RDChain.load(path / "chain"))
