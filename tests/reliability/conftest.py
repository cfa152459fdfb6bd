"""Shared fixtures of the reliability tests."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from interp.testing import tiny_model


def model_folder(folder: Path, scale: float = 1.0) -> Path:
    """A tiny 2-layer Llama saved to ``folder``; ``scale`` perturbs every weight by the same relative amount."""
    hf, _ = tiny_model("llama", seed=0, folder=folder, n_layers=2)
    if scale != 1.0:
        with torch.no_grad():
            for p in hf.parameters():
                p.mul_(scale)
        hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return model_folder(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def perturbed_dir(tmp_path_factory) -> Path:
    """The same model with every weight scaled by 1.001 (another checkpoint of the same shape)."""
    return model_folder(tmp_path_factory.mktemp("llama-perturbed"), scale=1.001)
