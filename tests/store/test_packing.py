"""Packing equals sae-lens's own concat_and_batch_sequences, and provenance points at the right tokens."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sae_lens.tokenization_and_batching import concat_and_batch_sequences

from interp.store import pack

BOS, SEP = 1, 1


def _docs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(60):
        n = int(rng.integers(0, 40))
        d = rng.integers(2, 50, n)
        if i % 7 == 0 and n:
            d[0] = BOS  # already starts with BOS: no extra BOS/separator may be inserted
        docs.append(d.astype(np.int64))
    return docs


@pytest.mark.parametrize("ctx,bos,sep", [(16, BOS, SEP), (7, BOS, 3), (16, None, None), (5, BOS, None), (2, BOS, SEP)])
def test_pack_equals_sae_lens(ctx, bos, sep):
    docs = _docs(ctx)
    ours = [c.tokens for c in pack(iter(docs), ctx, bos, sep)]
    ref = [t.numpy() for t in concat_and_batch_sequences(iter(torch.from_numpy(d) for d in docs), ctx,
                                                           begin_batch_token_id=bos, sequence_separator_token_id=sep)]
    assert len(ours) == len(ref) > 5
    np.testing.assert_array_equal(np.stack(ours), np.stack(ref))


def test_provenance_points_at_source_tokens():
    docs = _docs(3)
    n_real = 0
    for c in pack(iter(docs), 16, BOS, SEP):
        assert c.tokens[0] == BOS
        real = c.pos >= 0
        for t, d, p in zip(c.tokens[real], c.doc[real], c.pos[real]):
            assert docs[d][p] == t
        n_real += int(real.sum())
        assert np.all(c.tokens[~real] == BOS)
    # every source token before the dropped tail is stored exactly once
    assert n_real > 0.8 * sum(len(d) for d in docs)


def test_hand_packed_example():
    docs = [np.array([5, 6, 7]), np.array([8, 9]), np.array([1, 4])]
    out = list(pack(iter(docs), 4, 1, 1))
    # [BOS 5 6 7] | [BOS 8 9 SEP?] -> doc 2 starts with BOS: no separator -> [BOS 8 9 1] | tail [4] dropped
    assert [c.tokens.tolist() for c in out] == [[1, 5, 6, 7], [1, 8, 9, 1]]
    assert out[1].doc.tolist() == [1, 1, 1, 2] and out[1].pos.tolist() == [-1, 0, 1, 0]


def test_bad_context_size():
    with pytest.raises(ValueError, match="context_size"):
        list(pack(iter([np.arange(5)]), 1, 1, 1))
