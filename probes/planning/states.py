"""State sets: which (layer, position) hidden states form a set, and harvesting them through :mod:`interp`.

A *state set* ``G_S = {h_t^l : (l, t) in S}`` is defined relative to an *anchor* position ``T`` of a token
sequence (the last prompt token in the planning analyses) by a :class:`SetSpec`:

* ``SetSpec.prefix(layers)``: every position ``0..T`` at each layer of ``layers`` (the paper's ``H`` uses all
  layers except the last);
* ``SetSpec.block(layer, k, size)``: position block ``B_k^l`` = positions ``T-k*size .. T-(k-1)*size-1`` at
  one layer (``k = 1`` is the most recent block; the anchor itself is *not* in any block, it is
  ``SetSpec.state(layer, 0)``, which the conditional block analysis conditions on);
* ``SetSpec.state(layer, offset)``: the single state at ``T + offset`` (``Z_{T+τ}^L``);
* ``SetSpec.span(layers, offset, size)``: consecutive positions from ``T + offset`` (a path or continuation).

Hook point: ``blocks.{l}.hook_resid_post`` (block outputs; the digest marks post vs pre UNCERTAIN; we take
post, so the last layer's state is the residual stream before the final norm, and "all layers except the
last" are ``l = 0..L-2``). Any canonical hook with ``[batch, pos, d]`` activations can be chosen instead.

Every state carries its layer index and a *position label* for the VQ-VAE's position embedding: the
distance ``T - t`` to the anchor for prefix and block sets (so that sets of prompts of different lengths
line up at the end), ``0`` for single states. :func:`harvest_sets` runs the model in batches with right
padding, excludes padding, and keeps only the requested states (never a full ``[layers, pos, d]`` cache of
the dataset), so memory scales with the sets, not with the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from interp.model import Model
from interp.progress import progress

__all__ = ["StateSets", "SetSpec", "harvest_sets", "final_layer", "prefix_layers"]


@dataclass
class StateSets:
    """``N`` padded sets of hidden states.

    ``states [N, S, d]`` (float), ``layers [N, S]`` and ``positions [N, S]`` (long: layer index and position
    label of each state), ``mask [N, S]`` (bool, True = a real state, False = padding)."""

    states: torch.Tensor
    layers: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor

    def __post_init__(self):
        n, s = self.mask.shape
        if self.states.shape[:2] != (n, s) or self.layers.shape != (n, s) or self.positions.shape != (n, s):
            raise ValueError(f"StateSets shapes disagree: states {tuple(self.states.shape)}, layers "
                             f"{tuple(self.layers.shape)}, positions {tuple(self.positions.shape)}, mask {(n, s)}")
        if n and not bool(self.mask.any(1).all()):
            raise ValueError("every state set needs at least one real state")

    def __len__(self) -> int:
        return self.mask.shape[0]

    @property
    def d(self) -> int:
        return self.states.shape[-1]

    @property
    def sizes(self) -> torch.Tensor:
        """Number of real states per set, ``[N]``."""
        return self.mask.sum(1)

    def __getitem__(self, idx) -> "StateSets":
        if isinstance(idx, int):
            idx = slice(idx, idx + 1)
        return StateSets(self.states[idx], self.layers[idx], self.positions[idx], self.mask[idx])

    @classmethod
    def from_list(cls, sets: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                  dtype: torch.dtype = torch.float32) -> "StateSets":
        """Pad ``[(states [s_i, d], layers [s_i], positions [s_i]), ...]`` into one :class:`StateSets`."""
        if not sets:
            raise ValueError("no state sets given")
        n, s, d = len(sets), max(x[0].shape[0] for x in sets), sets[0][0].shape[-1]
        states = torch.zeros(n, s, d, dtype=dtype)
        layers = torch.zeros(n, s, dtype=torch.long)
        positions = torch.zeros(n, s, dtype=torch.long)
        mask = torch.zeros(n, s, dtype=torch.bool)
        for i, (x, l, p) in enumerate(sets):
            k = x.shape[0]
            states[i, :k] = x.to(dtype)
            layers[i, :k] = torch.as_tensor(l)
            positions[i, :k] = torch.as_tensor(p)
            mask[i, :k] = True
        return cls(states, layers, positions, mask)

    @classmethod
    def cat(cls, parts: Sequence["StateSets"]) -> "StateSets":
        """Concatenate along the set axis (padding to the largest set size)."""
        s = max(p.mask.shape[1] for p in parts)

        def pad(t: torch.Tensor, value=0) -> torch.Tensor:
            extra = s - t.shape[1]
            if extra == 0:
                return t
            shape = (t.shape[0], extra) + tuple(t.shape[2:])
            return torch.cat([t, torch.full(shape, value, dtype=t.dtype)], 1)

        return cls(torch.cat([pad(p.states) for p in parts]), torch.cat([pad(p.layers) for p in parts]),
                   torch.cat([pad(p.positions) for p in parts]), torch.cat([pad(p.mask, False) for p in parts]))


@dataclass(frozen=True)
class SetSpec:
    """Which states, relative to an anchor ``T``, form one set (see the module docstring)."""

    kind: str                   # "prefix" | "block" | "state" | "span"
    layers: tuple[int, ...]
    offset: int = 0             # block/span: first position is T + offset; state: the position is T + offset
    size: int | None = 1        # block/span length (span: None = to the end of the sequence)

    @staticmethod
    def prefix(layers: Sequence[int]) -> "SetSpec":
        return SetSpec("prefix", tuple(int(l) for l in layers))

    @staticmethod
    def block(layer: int, k: int, size: int) -> "SetSpec":
        if k < 1 or size < 1:
            raise ValueError(f"block index k and size must be >= 1, got k={k}, size={size}")
        return SetSpec("block", (int(layer),), offset=-k * size, size=size)

    @staticmethod
    def state(layer: int, offset: int = 0) -> "SetSpec":
        return SetSpec("state", (int(layer),), offset=int(offset))

    @staticmethod
    def span(layers: Sequence[int], offset: int = 0, size: int | None = None) -> "SetSpec":
        """Positions ``T+offset .. T+offset+size-1`` (``size=None``: to the end of the sequence) at each of
        ``layers``; position labels count from the span's start (a continuation or a path)."""
        return SetSpec("span", tuple(int(l) for l in layers), offset=int(offset), size=size)

    def select(self, anchor: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(layers [s], positions [s], position labels [s])`` for a sequence of ``length`` tokens."""
        if self.kind == "prefix":
            pos = torch.arange(0, anchor + 1)
        elif self.kind == "block":
            pos = torch.arange(anchor + self.offset, anchor + self.offset + self.size)
        elif self.kind == "state":
            pos = torch.tensor([anchor + self.offset])
        elif self.kind == "span":
            end = length if self.size is None else anchor + self.offset + self.size
            pos = torch.arange(anchor + self.offset, end)
        else:
            raise ValueError(f"unknown SetSpec kind {self.kind!r}")
        pos = pos[(pos >= 0) & (pos < length)]
        if len(pos) == 0:
            raise ValueError(f"{self} selects no position for anchor {anchor} in a sequence of {length} tokens")
        nl = len(self.layers)
        layers = torch.tensor(self.layers).repeat_interleave(len(pos))
        positions = pos.repeat(nl)
        if self.kind == "state":
            labels = torch.zeros_like(positions)
        elif self.kind == "span":
            labels = positions - (anchor + self.offset)
        else:
            labels = (anchor - positions).clamp_min(0)
        return layers, positions, labels


def final_layer(model: Model) -> int:
    """Index of the last block (``L - 1``)."""
    return model.cfg.n_layers - 1


def prefix_layers(model: Model) -> list[int]:
    """All layers except the last (the paper's ``H``): ``0..L-2`` (``[0]`` for a one-layer model)."""
    return list(range(max(1, model.cfg.n_layers - 1)))


def harvest_sets(model: Model, sequences: Sequence[torch.Tensor], anchors: Sequence[tuple[int, int]],
                 specs: Mapping[str, SetSpec | Sequence[SetSpec]], hook: str = "hook_resid_post",
                 batch_size: int = 32, dtype: torch.dtype = torch.float32,
                 desc: str = "harvest") -> dict[str, StateSets]:
    """Collect state sets through ``model`` (any backend).

    ``sequences``: token ids, one 1-D tensor per sequence (unpadded, with any BOS the model expects).
    ``anchors``: ``(sequence index, anchor position T)`` pairs; every pair gives one set per spec, in order.
    ``specs``: name -> :class:`SetSpec` (or a list of specs whose states are merged into one set).
    Sequences are run ``batch_size`` at a time, right-padded; padding never enters a set.
    Returns name -> :class:`StateSets` with ``len == len(anchors)``.
    """
    specs = {k: (list(v) if isinstance(v, (list, tuple)) else [v]) for k, v in specs.items()}
    layers = sorted({l for v in specs.values() for s in v for l in s.layers})
    if not layers:
        raise ValueError("no layers requested")
    if max(layers) >= model.cfg.n_layers or min(layers) < 0:
        raise ValueError(f"layers {layers} outside 0..{model.cfg.n_layers - 1}")
    names = [f"blocks.{l}.{hook}" for l in layers]
    row = {l: i for i, l in enumerate(layers)}
    by_seq: dict[int, list[int]] = {}
    for j, (si, _) in enumerate(anchors):
        by_seq.setdefault(int(si), []).append(j)
    order = sorted(by_seq)
    out: dict[str, list] = {k: [None] * len(anchors) for k in specs}
    for b0 in progress(range(0, len(order), batch_size), desc=desc):
        seq_ids = order[b0:b0 + batch_size]
        seqs = [torch.as_tensor(sequences[i]).long().flatten() for i in seq_ids]
        _, cache = model.run_with_cache(model.pad_token_ids(seqs), names=names, device="cpu")
        acts = torch.stack([cache[nm] for nm in names])  # [n_layers, batch, pos, d]
        for r, si in enumerate(seq_ids):
            length = len(seqs[r])
            for j in by_seq[si]:
                anchor = int(anchors[j][1])
                if not 0 <= anchor < length:
                    raise ValueError(f"anchor {anchor} outside sequence {si} of {length} tokens")
                for name, group in specs.items():
                    parts = [s.select(anchor, length) for s in group]
                    ls = torch.cat([p[0] for p in parts])
                    ps = torch.cat([p[1] for p in parts])
                    lab = torch.cat([p[2] for p in parts])
                    rows = torch.tensor([row[int(l)] for l in ls])
                    out[name][j] = (acts[rows, r, ps].to(dtype), ls, lab)
    return {k: StateSets.from_list(v, dtype=dtype) for k, v in out.items()}
