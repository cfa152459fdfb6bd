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

Which tokens of a scored message (``mask``): ``"content"`` (official, the default) keeps the tokens that
overlap the message's content and leaves out the chat template's header and end-of-turn tokens (the
official segmenters return the content span between ``<|im_start|>assistant\\n`` and ``<|im_end|>``, between
``[/INST]`` and ``</s>``, ...); ``"message"`` (ours before the fix) keeps every token the template renders
for the message, header included.

Truncation (``max_length``): ``None`` (official evaluation, the default) keeps the whole conversation; an
integer keeps that many tokens, by default the LAST ones (``truncation="left"``, as the official training
set does); ``truncation="right"`` keeps the first ones (ours before the fix, which dropped most assistant
tokens of long multi-turn conversations).

Turns (``return_runs=True``): the lengths of the contiguous runs of scored tokens (one per assistant turn),
which :meth:`~interp.probes.gavel.CEDetector.sequence_probs` needs to cut windows per turn as the official
evaluation does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import torch

from interp.progress import progress

Message = Mapping[str, str]
Conversation = Union[str, Sequence[Message], torch.Tensor, tuple]
ROLES = ("system", "user", "assistant")

__all__ = ["FeatureSpec", "group_readout", "encode_conversation", "conversation_features", "text_features",
           "scored_runs", "conversation_runs", "MASKS", "TRUNCATIONS"]

#: which tokens of a scored message are kept: ``content`` (official) or ``message`` (header included, ours before)
MASKS = ("content", "message")
#: which end a ``max_length`` truncation keeps: ``left`` cuts the start (official training), ``right`` the end
TRUNCATIONS = ("left", "right")

#: the official layer range (Mistral-7B-Instruct-v0.2, 32 layers): ``selected_layers_range [13, 27)``
OFFICIAL_LAYERS = (13, 27)
OFFICIAL_N_LAYERS = 32


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

    @classmethod
    def official(cls, n_layers: int, group_kv: bool = True) -> "FeatureSpec":
        """The official layer range mapped to a model of ``n_layers`` layers by the same relative position.

        The official config reads layers 13-26 (``range(13, 27)``, 14 layers) of the paper's 32-layer
        Mistral-7B; here ``start = round(13 n / 32)`` and ``stop = round(27 n / 32)`` (at least one layer), e.g.
        32 layers -> 13-26, SmolLM2-135M's 30 layers -> 12-24 (13 layers), 2 layers -> 1-1 (the CE world and
        the toy models use every layer instead; a choice of their recipes).
        """
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")
        a, b = OFFICIAL_LAYERS
        start = min(int(round(a * n_layers / OFFICIAL_N_LAYERS)), n_layers - 1)
        stop = max(start + 1, min(n_layers, int(round(b * n_layers / OFFICIAL_N_LAYERS))))
        return cls.range(start, stop, group_kv)

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
        prev, out = "", []
        for i in range(len(msgs)):
            full = tok.apply_chat_template(msgs[: i + 1], tokenize=False)
            if not full.startswith(prev):  # template not prefix-stable: fall back to plain lines
                break
            out.append((msgs[i]["role"], full[len(prev):]))
            prev = full
        else:
            return out
    return [(m["role"], f"{m['role']}: {m['content']}\n") for m in msgs]


def _check_options(mask: str, truncation: str, max_length: int | None) -> None:
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS} ('content' is the official), got {mask!r}")
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {TRUNCATIONS} ('left' keeps the end, as the official "
                         f"training does), got {truncation!r}")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"max_length must be None (no truncation, official) or a positive integer, got {max_length!r}")


def _scored_tokens(tok, text: str, content: str, scored: bool, mask: str) -> tuple[list[int], list[bool]]:
    """Token ids of one rendered message and which are scored: all of them (``message``) or those that
    overlap the content's characters (``content``; needs a fast tokenizer's offset mapping)."""
    if not scored or mask == "message":
        t = tok(text, add_special_tokens=False)["input_ids"]
        return t, [scored] * len(t)
    off0 = text.find(content) if content else -1
    if off0 < 0:  # no content to find: nothing of this message is scored
        t = tok(text, add_special_tokens=False)["input_ids"]
        return t, [False] * len(t)
    try:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError):  # slow tokenizer: tokenise the three parts apart
        parts = [text[:off0], content, text[off0 + len(content):]]
        ids, keep = [], []
        for i, part in enumerate(parts):
            t = tok(part, add_special_tokens=False)["input_ids"] if part else []
            ids += t
            keep += [i == 1] * len(t)
        return ids, keep
    end = off0 + len(content)
    keep = [e > s and s < end and e > off0 for s, e in enc["offset_mapping"]]
    return list(enc["input_ids"]), keep


def encode_conversation(model, conv: Conversation, roles: Sequence[str] = ("assistant",),
                        max_length: int | None = None, mask: str = "content", truncation: str = "left"
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[T]`` and a boolean mask ``[T]`` of the scored tokens (role in ``roles``).

    ``mask``: ``"content"`` (official) scores only the tokens of a message's content, ``"message"`` (ours
    before) also the chat template's header / end-of-turn tokens. ``max_length``: ``None`` (official
    evaluation) keeps every token; otherwise the last (``truncation="left"``, official training) or first
    (``"right"``) ``max_length`` tokens are kept. ``conv`` may also be token ids ``[T]`` (every token scored)
    or a pair ``(ids [T], scored mask [T])`` (``mask`` does not apply: the given mask is used).
    """
    _check_options(mask, truncation, max_length)
    if isinstance(conv, torch.Tensor) or (isinstance(conv, tuple) and len(conv) == 2
                                          and isinstance(conv[0], torch.Tensor)):
        ids_t, keep_t = (conv, torch.ones(len(conv), dtype=torch.bool)) if isinstance(conv, torch.Tensor) else conv
        if ids_t.dim() != 1 or keep_t.shape != ids_t.shape or len(ids_t) == 0:
            raise ValueError("token-id conversations must be a non-empty [T] tensor (and a [T] bool mask)")
        ids_t, keep_t = ids_t.long(), keep_t.bool()
    else:
        ids, keep = [], []
        contents = [conv] if isinstance(conv, str) else [m["content"] for m in conv] if len(conv) else []
        for (role, text), content in zip(_pieces(model, conv), contents):
            t, k = _scored_tokens(model.tokenizer, text, content, role in roles, mask)
            ids.extend(t)
            keep.extend(k)
        ids_t, keep_t = torch.tensor(ids, dtype=torch.long), torch.tensor(keep, dtype=torch.bool)
    if max_length is not None and len(ids_t) > max_length:
        sl = slice(len(ids_t) - max_length, None) if truncation == "left" else slice(0, max_length)
        ids_t, keep_t = ids_t[sl], keep_t[sl]
    return ids_t, keep_t


def scored_runs(keep: torch.Tensor) -> list[int]:
    """Lengths of the contiguous runs of ``True`` in a scored mask ``[T]`` (one per assistant turn), in order.

    E.g. ``[F, T, T, F, F, T]`` -> ``[2, 1]``.
    """
    k = keep.bool().flatten().to(torch.int8)
    if not len(k):
        return []
    edges = torch.diff(k, prepend=k.new_zeros(1), append=k.new_zeros(1))  # +1 at a run's start, -1 after its end
    starts, ends = (edges == 1).nonzero().flatten(), (edges == -1).nonzero().flatten()
    return (ends - starts).tolist()


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


def default_spec(model, spec: "FeatureSpec | None" = None) -> "FeatureSpec":
    """``spec``, or when None the paper's readout mapped to the model: ``FeatureSpec.official(n_layers)``."""
    return FeatureSpec.official(model.cfg.n_layers) if spec is None else spec


def conversation_features(model, convs: Sequence[Conversation], spec: FeatureSpec | None = None,
                          roles: Sequence[str] = ("assistant",), batch_size: int = 8,
                          max_length: int | None = None, mask: str = "content", truncation: str = "left",
                          return_runs: bool = False):
    """Per conversation, the features ``[T_scored, width]`` of its scored tokens (role in ``roles``).

    ``max_length``/``truncation``/``mask``: as :func:`encode_conversation` (defaults official: no
    truncation, content tokens only; the paper's 256-token training cut keeps the END: ``max_length=256``).
    ``return_runs=True`` also returns, per conversation, the lengths of its scored runs (one per assistant
    turn; :func:`scored_runs`), for :meth:`CEDetector.sequence_probs`. ``spec=None``: the paper's layer range
    mapped to the model (:meth:`FeatureSpec.official`). ``convs`` has no default: they are what is monitored
    (the built-in labelled set is :mod:`.library`, e.g. ``ce_conversations``).
    """
    spec = default_spec(model, spec)
    spec.check(model)
    enc = [encode_conversation(model, c, roles, max_length, mask, truncation) for c in convs]
    feats = _features_of_ids(model, spec, [e[0] for e in enc], batch_size)
    out = [f[keep] for f, (_, keep) in zip(feats, enc)]
    if return_runs:
        return out, [scored_runs(keep) for _, keep in enc]
    return out


def conversation_runs(model, convs: Sequence[Conversation], roles: Sequence[str] = ("assistant",),
                      max_length: int | None = None, mask: str = "content", truncation: str = "left"
                      ) -> list[list[int]]:
    """Per conversation, the lengths of its scored runs (tokenisation only; the same cut as
    :func:`conversation_features` with the same options), for :meth:`CEDetector.sequence_probs`."""
    return [scored_runs(encode_conversation(model, c, roles, max_length, mask, truncation)[1]) for c in convs]


def text_features(model, texts: Sequence[str], spec: FeatureSpec | None = None, batch_size: int = 8,
                  max_length: int | None = None) -> list[torch.Tensor]:
    """Features ``[T, width]`` of every token of each plain text (tokenised without special tokens);
    ``spec=None``: :meth:`FeatureSpec.official` of the model."""
    return conversation_features(model, list(texts), spec, batch_size=batch_size, max_length=max_length)
