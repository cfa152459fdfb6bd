"""GAVEL's activations: per-token attention value readouts (``attn.hook_z``) over a contiguous layer range.

For each layer ℓ in the range the readout ``r = A·V`` before the output projection is taken per token
(``blocks.ℓ.attn.hook_z``, ``[batch, pos, n_heads, d_head]``). Under grouped-query attention the official
code averages the attention probabilities over the query heads of each KV group before multiplying by the
group's values; since ``z_h = A_h V_g`` is linear in ``A_h`` this equals the mean of ``z`` over the query
heads of the group, which is what :func:`group_readout` computes (query head ``h`` belongs to KV group
``h // (n_heads / n_kv_heads)``, the Hugging Face ``repeat_kv`` layout). The per-layer vectors are stacked
into one feature of width ``n_layers_used * n_kv_heads * d_head`` per token.

Conversations are lists of ``{"role", "content"}`` messages (or plain strings). They are rendered with the
tokenizer's chat template when it has one (message by message, so every token knows its message's role)
and otherwise as ``"role: content\\n"`` lines; only the tokens of the scored roles (the assistant's, as in
the paper) are kept. Padding never reaches the features.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import torch

from interp.progress import progress

Message = Mapping[str, str]
Conversation = Union[str, Sequence[Message], torch.Tensor, tuple]
ROLES = ("system", "user", "assistant")

__all__ = ["FeatureSpec", "group_readout", "encode_conversation", "conversation_features", "text_features"]


@dataclass(frozen=True)
class FeatureSpec:
    """Which readout: ``layers`` (a contiguous range) and whether to group query heads per KV head."""

    layers: tuple[int, ...]
    group_kv: bool = True

    def __post_init__(self) -> None:
        layers = tuple(int(x) for x in self.layers)
        object.__setattr__(self, "layers", layers)
        if not layers:
            raise ValueError("FeatureSpec.layers must name at least one layer")
        if list(layers) != list(range(layers[0], layers[0] + len(layers))) or layers[0] < 0:
            raise ValueError(f"FeatureSpec.layers must be a contiguous increasing range of layer indices, got {layers}")

    @classmethod
    def range(cls, start: int, stop: int, group_kv: bool = True) -> "FeatureSpec":
        """Layers ``start .. stop-1``."""
        return cls(tuple(range(start, stop)), group_kv)

    def names(self) -> list[str]:
        return [f"blocks.{layer}.attn.hook_z" for layer in self.layers]

    def check(self, model) -> None:
        if self.layers[-1] >= model.cfg.n_layers:
            raise ValueError(f"FeatureSpec.layers go up to {self.layers[-1]} but the model has "
                             f"{model.cfg.n_layers} layers")

    def width(self, model) -> int:
        heads = model.cfg.n_kv_heads if self.group_kv else model.cfg.n_heads
        return len(self.layers) * heads * model.cfg.d_head


def group_readout(z: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """``z [..., n_heads, d_head]`` -> ``[..., n_kv_heads * d_head]``: mean over the query heads of each KV group."""
    n_heads, d_head = z.shape[-2], z.shape[-1]
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    g = z.reshape(*z.shape[:-2], n_kv_heads, n_heads // n_kv_heads, d_head).mean(-2)
    return g.reshape(*z.shape[:-2], n_kv_heads * d_head)


def _pieces(model, conv: Conversation) -> list[tuple[str, str]]:
    """``[(role, text)]``: the rendered conversation cut at message boundaries."""
    if isinstance(conv, str):
        return [("assistant", conv)]
    msgs = []
    for i, m in enumerate(conv):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a mapping with role in {ROLES} and string content, got {m!r}")
        msgs.append({"role": m["role"], "content": m["content"]})
    if not msgs:
        raise ValueError("a conversation needs at least one message")
    tok = model.tokenizer
    if getattr(tok, "chat_template", None):
        rendered, prev, out = [], "", []
        for i in range(len(msgs)):
            full = tok.apply_chat_template(msgs[: i + 1], tokenize=False)
            if not full.startswith(prev):  # template not prefix-stable: fall back to plain lines
                break
            out.append((msgs[i]["role"], full[len(prev):]))
            prev = full
        else:
            return out
    return [(m["role"], f"{m['role']}: {m['content']}\n") for m in msgs]


def encode_conversation(model, conv: Conversation, roles: Sequence[str] = ("assistant",),
                        max_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[T]`` and a boolean mask ``[T]`` of the tokens whose role is in ``roles``.

    ``conv`` may also be token ids ``[T]`` (every token scored) or a pair ``(ids [T], scored mask [T])``.
    """
    if isinstance(conv, torch.Tensor) or (isinstance(conv, tuple) and len(conv) == 2
                                          and isinstance(conv[0], torch.Tensor)):
        ids_t, keep_t = (conv, torch.ones(len(conv), dtype=torch.bool)) if isinstance(conv, torch.Tensor) else conv
        if ids_t.dim() != 1 or keep_t.shape != ids_t.shape or len(ids_t) == 0:
            raise ValueError("token-id conversations must be a non-empty [T] tensor (and a [T] bool mask)")
        ids_t, keep_t = ids_t.long(), keep_t.bool()
        if max_length is not None:
            ids_t, keep_t = ids_t[:max_length], keep_t[:max_length]
        return ids_t, keep_t
    ids, keep = [], []
    for role, text in _pieces(model, conv):
        t = model.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.extend(t)
        keep.extend([role in roles] * len(t))
    if max_length is not None:
        ids, keep = ids[:max_length], keep[:max_length]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(keep, dtype=torch.bool)


@torch.no_grad()
def _features_of_ids(model, spec: FeatureSpec, seqs: list[torch.Tensor], batch_size: int,
                     desc: str = "gavel features") -> list[torch.Tensor]:
    names = spec.names()
    out: list[torch.Tensor] = []
    for start in progress(range(0, len(seqs), batch_size), desc=desc):
        chunk = seqs[start:start + batch_size]
        _, cache = model.run_with_cache(model.pad_token_ids(chunk), names=names,
                                        stop_at_layer=spec.layers[-1] + 1)
        z = torch.stack([cache[name] for name in names], dim=2).float()  # [B, S, L, H, d]
        feats = group_readout(z, model.cfg.n_kv_heads) if spec.group_kv else z.flatten(-2)
        feats = feats.flatten(2).cpu()  # [B, S, L*H*d]
        out.extend(feats[i, :len(s)] for i, s in enumerate(chunk))
    return out


def conversation_features(model, convs: Sequence[Conversation], spec: FeatureSpec,
                          roles: Sequence[str] = ("assistant",), batch_size: int = 8,
                          max_length: int = 256) -> list[torch.Tensor]:
    """Per conversation, the features ``[T_scored, width]`` of its tokens whose role is in ``roles``.

    ``max_length`` truncates each rendered conversation (the paper extracts at most 256 tokens).
    """
    spec.check(model)
    enc = [encode_conversation(model, c, roles, max_length) for c in convs]
    feats = _features_of_ids(model, spec, [e[0] for e in enc], batch_size)
    return [f[keep] for f, (_, keep) in zip(feats, enc)]


def text_features(model, texts: Sequence[str], spec: FeatureSpec, batch_size: int = 8,
                  max_length: int = 256) -> list[torch.Tensor]:
    """Features ``[T, width]`` of every token of each plain text (tokenised without special tokens)."""
    return conversation_features(model, list(texts), spec, batch_size=batch_size, max_length=max_length)
