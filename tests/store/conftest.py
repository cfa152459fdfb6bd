"""Fixtures for the store tests: a 3-layer tiny Llama saved to disk (loadable by path from a subprocess
or a Ray worker), with non-unit weights so that activations are O(1)-O(10), and a small corpus."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import interp
from interp.testing import tiny_model

WORDS = ("the quick brown fox jumps over the lazy dog while seven wise owls count silver stars above "
         "a quiet river").split()


def corpus(n_docs: int = 16, seed: int = 0) -> list[str]:
    """Documents of varied length (some longer than a context, some a few tokens)."""
    g = torch.Generator().manual_seed(seed)
    docs = []
    for i in range(n_docs):
        n = int(torch.randint(1, 25, (1,), generator=g))
        idx = torch.randint(0, len(WORDS), (n,), generator=g).tolist()
        docs.append(f"doc {i}: " + " ".join(WORDS[j] for j in idx))
    return docs


def make_model_folder(folder: Path, seed: int = 0) -> Path:
    hf, _tok = tiny_model("llama", seed=seed, folder=folder, n_layers=3)
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(40)
        for layer in hf.model.layers:
            for lin in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                lin.weight.mul_(6)
            layer.post_attention_layernorm.weight.mul_(1.5)
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return make_model_folder(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def model(model_dir) -> interp.Model:
    return interp.load(str(model_dir))


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return corpus()


@pytest.fixture(scope="session")
def other_model(tmp_path_factory) -> interp.Model:
    """The same architecture with other weights (seed 1)."""
    return interp.load(str(make_model_folder(tmp_path_factory.mktemp("tiny-llama-1"), seed=1)))
