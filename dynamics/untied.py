"""m-untied training (Rofin, Naghiyev & Hahn, ICLR 2026): remove *circuit sharing* between positions.

Positions ``< m`` are computed by one transformer, positions ``>= m`` by a second, independently
parameterised one that reads the first one's KV cache (the official code's ``HFSplitDecoderModel``: two
``GPT2LMHeadModel``s, the second called on ``x[:, m:]`` with ``past_key_values`` of the first; the cache is
not detached, so pre-caching from the second network's losses into the first still works).

Here the same computation lives *inside one* ``transformers`` GPT-2 model, so every ``interp`` backend and
:func:`~interp.dynamics.decompose_gradient` run it unchanged: every position-wise module (token embedding,
``ln_1``, ``c_attn``, ``c_proj``, ``ln_2``, ``c_fc``, MLP ``c_proj``, ``ln_f``, the LM head) is replaced by a
:class:`PositionSplit` that applies copy A to positions ``< m`` and copy B to positions ``>= m`` (a split of the
sequence axis, then a concatenation: no wasted compute). Attention itself has no parameters, so the queries of
positions ``>= m`` (from B) read keys/values of positions ``< m`` (from A's projections of A's residual stream)
— exactly "reading the first network's KV cache". Each copy keeps GPT-2's tie between its own token embedding
and its own LM head. The position embedding ``wpe`` is split too, as in the official code: there the second
network is called on ``x[:, m:]`` with a cache of length ``m``, so its position ids are ``m, m+1, ...`` and it adds
rows ``m..`` of *its own* ``wpe`` (network A's rows ``< m`` of A's table). ``PositionSplit(wpe_A, wpe_B, m)`` on
the ``[1, seq]`` position ids does exactly that. (Until issue #33 one table, A's, served both networks, so
``untie_gpt2(second=B)`` silently dropped B's position embeddings.)

Limits: positions are the sequence index, so inputs must be whole sequences from position 0 (no incremental
decoding with a KV cache, no left padding).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

_BLOCK_MODULES = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")


class PositionSplit(nn.Module):
    """``[batch, pos, ...] -> [batch, pos, ...]``: ``a`` on positions ``< m``, ``b`` on positions ``>= m``
    (the sequence axis is dim 1 of the input)."""

    def __init__(self, a: nn.Module, b: nn.Module, m: int):
        super().__init__()
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"split position m must be a positive integer, got {m!r}")
        self.a, self.b, self.m = a, b, m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] <= self.m:
            return self.a(x)
        return torch.cat([self.a(x[:, : self.m].contiguous()), self.b(x[:, self.m:].contiguous())], 1)

    def extra_repr(self) -> str:
        return f"m={self.m}"


class _TiedHead(nn.Module):
    """LM head that reads its weight from an embedding module (GPT-2's weight tying, kept per copy)."""

    def __init__(self, emb: nn.Embedding):
        super().__init__()
        self.emb = [emb]        # a list: not registered as a submodule (the weight belongs to the embedding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.emb[0].weight.T


def _get(root: nn.Module, path: str) -> nn.Module:
    for p in path.split("."):
        root = getattr(root, p)
    return root


def _set(root: nn.Module, path: str, mod: nn.Module) -> None:
    *parents, last = path.split(".")
    for p in parents:
        root = getattr(root, p)
    setattr(root, last, mod)


def untie_gpt2(hf, m: int, second: "nn.Module | None" = None, seed: int | None = None):
    """Turn a ``transformers`` ``GPT2LMHeadModel`` into its m-untied variant *in place* and return it.

    Network A is ``hf``'s current weights. Network B is ``second``'s weights if given (another
    ``GPT2LMHeadModel`` of the same config, *all* of them: positions ``>= m`` add rows ``m..`` of B's ``wpe``, as the
    official second network, which runs with position ids ``m..`` after A's cache), otherwise a fresh, independent
    initialisation of the same config (seeded by ``seed`` if given), as the official code's second
    ``GPT2LMHeadModel``. The model's parameter count roughly doubles; names become e.g.
    ``transformer.h.0.attn.c_attn.a.weight`` / ``....b.weight``.
    """
    import transformers as T
    if not isinstance(hf, T.GPT2LMHeadModel):
        raise TypeError(f"untie_gpt2 needs a transformers GPT2LMHeadModel, got {type(hf).__name__}")
    if not 1 <= m < hf.config.n_positions:
        raise ValueError(f"m must be in 1..{hf.config.n_positions - 1}, got {m}")
    if isinstance(hf.transformer.wte, PositionSplit):
        raise ValueError("model is already untied")
    if second is None:
        if seed is not None:
            torch.manual_seed(seed)
        second = T.GPT2LMHeadModel(hf.config).to(dtype=hf.dtype)
    elif not isinstance(second, T.GPT2LMHeadModel) or second.config.n_embd != hf.config.n_embd \
            or second.config.n_layer != hf.config.n_layer or second.config.vocab_size != hf.config.vocab_size:
        raise ValueError("second must be a GPT2LMHeadModel of the same shape (n_embd, n_layer, vocab_size)")
    if second.config.n_positions < hf.config.n_positions:
        raise ValueError(f"second has {second.config.n_positions} positions, the model {hf.config.n_positions}: "
                         "network B needs a position table at least as long")
    second = copy.deepcopy(second)
    for i, (blk_a, blk_b) in enumerate(zip(hf.transformer.h, second.transformer.h)):
        for path in _BLOCK_MODULES:
            _set(blk_a, path, PositionSplit(_get(blk_a, path), _get(blk_b, path), m))
    hf.transformer.ln_f = PositionSplit(hf.transformer.ln_f, second.transformer.ln_f, m)
    wte_a, wte_b = hf.transformer.wte, second.transformer.wte
    if wte_b.weight is wte_a.weight:
        raise ValueError("second shares its embedding tensor with the model")
    hf.transformer.wte = PositionSplit(wte_a, wte_b, m)
    hf.transformer.wpe = PositionSplit(hf.transformer.wpe, second.transformer.wpe, m)   # position ids [1, seq]
    hf.lm_head = PositionSplit(_TiedHead(wte_a), _TiedHead(wte_b), m)
    hf.config.untied_split = m
    return hf


def is_untied(hf) -> bool:
    return isinstance(getattr(getattr(hf, "transformer", None), "wte", None), PositionSplit)


def second_network_params(hf) -> dict[str, torch.Tensor]:
    """Name -> parameter of network B (positions ``>= m``) of an :func:`untie_gpt2` model."""
    out = {}
    for name, p in hf.named_parameters():
        parts = name.split(".")
        for k, part in enumerate(parts[:-1]):
            if part == "b" and isinstance(_get(hf, ".".join(parts[:k])), PositionSplit):
                out[name] = p
                break
    return out
