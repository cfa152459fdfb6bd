"""Fixtures of the zoo tests.

Real entries build into the normal cache (``$INTERP_CACHE_DIR`` or the user cache dir), once per
machine; the session-scoped fixtures below share each loaded model across the tests of a run.
Tests of the cache mechanism use a throw-away cache directory (``tmp_zoo``) and tiny entries.
"""
from __future__ import annotations

import pytest


@pytest.fixture
def tmp_zoo(tmp_path, monkeypatch):
    """An empty cache root for this test only."""
    root = tmp_path / "cache"
    monkeypatch.setenv("INTERP_CACHE_DIR", str(root))
    return root


@pytest.fixture(scope="session")
def smollm2_dir():
    from interp import zoo

    return zoo.path("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def minilm_dir():
    from interp import zoo

    return zoo.path("minilm-l6")


@pytest.fixture(scope="session")
def dinov2_dir():
    from interp import zoo

    return zoo.path("dinov2-s14")


@pytest.fixture(scope="session")
def toy_grammar_dir():
    from interp import zoo

    return zoo.path("toy-grammar")
