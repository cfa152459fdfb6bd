"""Zoo entries of the locally trained protein MLM family, declared through the ``interp.zoo`` entry point
``protein-mlm`` (:func:`entries`; nothing registers at import time).

* ``protein-mlm-32``, ``protein-mlm-64``, ``protein-mlm-128``: the family of the reproduction's full run
  (2 / 3 / 4 layers, 600 steps of 16 crops of 96 residues on the 1,680 training proteins; slow builds);
* ``protein-mlm-toy-8``, ``-16``, ``-24``: a 1-layer toy family (60 steps on 200 proteins, seconds to build) for
  tests (also of the ESM architecture's capture) and the notebook.

Use :func:`family` to get the names of a family in ascending width.
"""
from __future__ import annotations

import functools

from pathlib import Path
from typing import Any, Mapping

from interp.zoo.registry import ZooEntry

from .plm import PLMConfig

__all__ = ["FAMILY", "TOY_FAMILY", "family", "family_configs"]

FAMILY = ("protein-mlm-32", "protein-mlm-64", "protein-mlm-128")
TOY_FAMILY = ("protein-mlm-toy-8", "protein-mlm-toy-16", "protein-mlm-toy-24")


def family_configs(toy: bool = False) -> dict[str, PLMConfig]:
    """Name -> :class:`PLMConfig` of the real (or toy) family."""
    if toy:
        return {name: PLMConfig(width=w, n_layers=1, n_heads=2, steps=60, batch_size=8, crop=64, lr=1e-2,
                                max_proteins=200, n_eval_proteins=40, max_heldout_loss=2.996)  # ln 20
                for name, w in zip(TOY_FAMILY, (8, 16, 24))}
    return {name: PLMConfig(width=w, n_layers=layers, n_heads=heads)
            for name, w, layers, heads in zip(FAMILY, (32, 64, 128), (2, 3, 4), (2, 4, 4))}


def family(toy: bool = False) -> tuple[str, ...]:
    """Zoo names of the family, ascending width."""
    return TOY_FAMILY if toy else FAMILY


def _builder(out: Path, params: Mapping[str, Any]):
    from .plm import build_plm

    return build_plm(out, params)


@functools.lru_cache(maxsize=None)
def entries() -> tuple[ZooEntry, ...]:
    """The zoo entries of the protein family (full and toy); the ``interp.zoo`` entry point of this package (the
    same objects on every call)."""
    out = []
    for toy in (False, True):
        for name, cfg in family_configs(toy).items():
            out.append(ZooEntry(
                name=name,
                description=(f"{'toy ' if toy else ''}ESM-2-style protein masked LM (EsmForMaskedLM, width {cfg.width}, "
                             f"{cfg.n_layers} layer(s), rotary, ESM-2 alphabet) trained from scratch on the training "
                             "split of pyhmmer's bundled proteome; reverse-distillation family "
                             "(interp.models.reverse_distillation)."),
                source="trained locally on pyhmmer tests/data/seqs/938293.PRJEB85.HG003687.faa",
                architecture="EsmForMaskedLM",
                size=f"width {cfg.width}, {cfg.n_layers} layer(s)",
                builder=_builder,
                params=cfg.to_params(),
                packages=("pyhmmer",),
                slow=not toy,
            ))
    return tuple(out)
