"""Window targets from sentence-level CE annotations (a documented choice, not in the paper).

The paper's ERI data label every generated token of a rewrite with its CE. For ready texts whose CE sentences
are known (character spans per message), a token carries a CE when it overlaps one of that CE's sentences, and
a window (as :func:`~interp.probes.gavel.detector.make_windows` cuts them) is labelled from its tokens: 1 when at
least half of them carry the CE, 0 when none does, NaN (left out of the loss by ``masked_bce``) otherwise.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .detector import make_windows
from .features import _pieces

__all__ = ["token_ce_labels", "window_labels", "labelled_windows"]


def token_ce_labels(model, conv, ces: Sequence[str], roles=("assistant",), mask: str = "content"
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids ``[T]``, scored mask ``[T]`` (tokens of ``roles``) and CE labels ``[T, C]`` of a conversation.

    ``conv`` has ``messages`` (chat messages) and ``spans`` (``(message index, start, end, ce)`` character
    spans inside a message's content), e.g. a :class:`~interp.probes.gavel.library.LabelledConversation`.
    A token is labelled 1 for a CE where it overlaps a sentence of that CE; tokenisation is that of
    :func:`~interp.probes.gavel.features.encode_conversation` (chat template rendered message by message), and so
    is the scored mask (``mask="content"``, official: the content tokens of a scored message, not the template's
    header; ``"message"``: every token of it).
    """
    if mask not in ("content", "message"):
        raise ValueError(f"mask must be 'content' (official) or 'message', got {mask!r}")
    ces = list(ces)
    tok = model.tokenizer
    ids, keep, labels = [], [], []
    for m, (role, text) in enumerate(_pieces(model, conv.messages)):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        content = conv.messages[m]["content"]
        off0 = text.find(content) if content else -1
        lab = torch.zeros(len(enc["input_ids"]), len(ces))
        for mi, a, b, ce in conv.spans:
            if mi != m or off0 < 0:
                continue
            if ce not in ces:
                raise ValueError(f"span CE {ce!r} is not one of the detector's CEs {ces}")
            for t, (s, e) in enumerate(enc["offset_mapping"]):
                if s < off0 + b and e > off0 + a and e > s:
                    lab[t, ces.index(ce)] = 1
        ids += enc["input_ids"]
        if mask == "message" or role not in roles:
            keep += [role in roles] * len(enc["input_ids"])
        else:
            end = off0 + len(content)
            keep += [off0 >= 0 and e > s and s < end and e > off0 for s, e in enc["offset_mapping"]]
        labels.append(lab)
    return torch.tensor(ids), torch.tensor(keep), torch.cat(labels)


def window_labels(token_labels: torch.Tensor, window: int = 5) -> torch.Tensor:
    """``[T, C]`` token labels -> ``[W, C]`` window targets (windows as :func:`make_windows` cuts them): 1 when at
    least half the window's tokens carry the CE, 0 when none does, NaN (left out of the loss) otherwise."""
    frac = make_windows(token_labels, window).float().mean(1)
    out = torch.full_like(frac, float("nan"))
    out[frac >= 0.5] = 1.0
    out[frac == 0] = 0.0
    return out


def labelled_windows(feats: Sequence[torch.Tensor], token_labels: Sequence[torch.Tensor], window: int = 5
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Full windows ``[N, window, d]`` and their targets ``[N, C]`` of several scored spans (``feats[i]``:
    ``[T_i, d]``, ``token_labels[i]``: ``[>= T_i, C]``; features may be truncated, labels are cut to match)."""
    xw, yw = [], []
    for f, lab in zip(feats, token_labels):
        w = make_windows(f, window)
        if w.shape[1] == window:
            xw.append(w)
            yw.append(window_labels(lab[: len(f)], window))
    if not xw:
        raise ValueError(f"no span is at least {window} tokens long: no full window to train on")
    return torch.cat(xw), torch.cat(yw)
