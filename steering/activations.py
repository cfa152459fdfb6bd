"""Reading residual-stream activations at chosen positions, and difference-in-means vectors.

Everything goes through the capture layer (``model.run_with_cache``) under canonical hook names. Text
prompts are tokenized with left padding, so negative positions (``-1`` = last token) index the same
real tokens in every row.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from interp.names import parse, unknown_message
from interp.progress import progress

from .base import batches, n_prompts, prepared


def _stop_layer(model, names: Sequence[str]) -> int | None:
    """The smallest ``stop_at_layer`` that still fires every one of ``names`` (``None``: run the whole model).

    Block hooks only ever need blocks ``0..max layer``; stopping there also skips the unembedding."""
    layers = [parse(n)[0] for n in names]
    if any(layer is None for layer in layers):
        return None
    return max(layers) + 1


@torch.no_grad()
def collect(model, prompts: Any, names: Sequence[str], positions: Sequence[int] = (-1,),
            batch_size: int = 16, desc: str | None = None) -> torch.Tensor:
    """Activations of ``names`` at ``positions`` for every prompt.

    Args:
        prompts: list of strings (left-padded on tokenization) or token ids ``[n, pos]``.
        names: canonical hook names (no globs, no bare suffixes), e.g.
            ``[f"blocks.{l}.hook_resid_pre" for l in ...]``, in any order, repeats allowed.
        positions: negative (from the end) or non-negative indices into each prompt.

    Returns:
        float32 tensor ``[n_prompts, len(names), len(positions), d]`` on the CPU. Axis 1 follows the CALLER's
        order: ``out[:, i]`` is ``names[i]``, whatever order the capture layer resolves or runs the hooks in
        (the cache is read by name, never by resolution order).

    Raises:
        ValueError: a name that is not exactly one of the model's hook names (unknown, a glob or a suffix).
    """
    if isinstance(names, str):
        raise TypeError("names must be a list of hook names, not a single string")
    names = list(names)
    if not names:
        raise ValueError("names is empty: pass at least one hook name")
    available = model.hook_names()
    known = set(available)
    bad = [n for n in names if not isinstance(n, str) or n not in known]
    if bad:
        raise ValueError(f"collect needs exact hook names of this model (no globs or suffixes); {len(bad)} "
                         f"are not: {unknown_message(str(bad[0]), available)}")
    unique = list(dict.fromkeys(names))
    positions = list(positions)
    stop = _stop_layer(model, unique)
    out = []
    total = (n_prompts(prompts) + batch_size - 1) // batch_size
    for batch in progress(batches(prompts, batch_size), desc=desc or "activations", total=total):
        _, cache = model.run_with_cache(prepared(model, batch), names=unique, stop_at_layer=stop)
        acts = torch.stack([cache[n][:, positions] for n in names], dim=1)  # [b, names, pos, d], caller's order
        out.append(acts.float().cpu())
    return torch.cat(out, dim=0)


def last_token(model, prompts: Any, hook: str, batch_size: int = 16) -> torch.Tensor:
    """Activations of one hook at each prompt's last token: ``[n_prompts, d]`` (float32, CPU).

    ``collect(model, prompts, [hook], (-1,), batch_size)[:, 0, 0]``: strings are tokenized with left padding and
    without added special tokens, so position ``-1`` is each prompt's own last token.
    """
    return collect(model, prompts, [hook], (-1,), batch_size)[:, 0, 0]


def mean_difference(positive_acts: torch.Tensor, negative_acts: torch.Tensor) -> torch.Tensor:
    """Difference in means over the prompt axis: ``mean(positive) - mean(negative)``, shapes ``[n, ...]`` -> ``[...]``."""
    if positive_acts.shape[1:] != negative_acts.shape[1:]:
        raise ValueError(f"activation shapes differ: {tuple(positive_acts.shape)} vs {tuple(negative_acts.shape)}")
    return positive_acts.mean(0) - negative_acts.mean(0)


def resid_names(model, hook: str = "hook_resid_pre", layers: Sequence[int] | None = None) -> list[str]:
    """``blocks.{l}.<hook>`` for ``layers`` (default: every layer)."""
    layers = range(model.cfg.n_layers) if layers is None else layers
    return [f"blocks.{int(layer)}.{hook}" for layer in layers]
