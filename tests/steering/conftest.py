"""Fixtures of the steering tests.

pytest puts ``tests/`` on ``sys.path`` (rootdir conftest, no ``__init__.py``), where the folder
``tests/steering`` would shadow the real ``steering`` package as a namespace package, because the
editable install's finder comes after the path finder. Put the repository root first.
"""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if sys.path[:1] != [_ROOT]:
    sys.path.insert(0, _ROOT)
if "steering" in sys.modules and getattr(sys.modules["steering"], "__file__", None) is None:
    del sys.modules["steering"]  # a namespace package made of tests/steering

import pytest  # noqa: E402
import torch  # noqa: E402

import interp
from interp.testing import tiny_model


@pytest.fixture(scope="session")
def llama():
    """A tiny random Llama (2 layers, d 64); tests must not modify its weights (copy it instead)."""
    hf, tok = tiny_model("llama", seed=0)
    return interp.wrap(hf, tok, backend="torch")


@pytest.fixture(scope="session")
def make_ids():
    return id_prompts


def id_prompts(n: int, length: int = 10, seed: int = 0, low: int = 65, high: int = 91) -> torch.Tensor:
    """Token-id prompts [n, length] (byte tokens of capital letters by default)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n, length), generator=g)


@pytest.fixture(scope="session")
def toy_refusal_path():
    """The folder of ``zoo:toy-refusal``, built first when the zoo cache is empty (~45 s on one thread).

    Every test that reads the toy model or its zoo metadata depends on this, so the steering tests pass on a
    fresh machine (``INTERP_CACHE_DIR`` pointing at an empty folder), whatever order they run in."""
    import interp.zoo

    return interp.zoo.path("toy-refusal")
