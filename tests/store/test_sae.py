"""sae-lens's trainer fed from a store: an SAE and a transcoder train and their losses fall."""
from __future__ import annotations

import pytest
import torch

from interp.store import ActivationStore, SAETrainConfig, harvest, train_sae, train_transcoder


@pytest.fixture(scope="module")
def store(model, texts, tmp_path_factory) -> ActivationStore:
    out = tmp_path_factory.mktemp("sae") / "store"
    return harvest(model, texts * 2, ["blocks.1.hook_resid_post", "blocks.1.hook_resid_mid", "blocks.1.hook_mlp_out"],
                   out, context_size=32, batch_size=4, shard_mb=0.1).store


def test_sae_trains_with_sae_lens_trainer(store):
    from sae_lens import StandardTrainingSAE

    res = train_sae(store, "blocks.1.hook_resid_post", SAETrainConfig(d_sae=128, steps=300, batch_size=64, lr=3e-3,
                                                                       l1_coefficient=1e-3))
    assert isinstance(res.sae, StandardTrainingSAE) and res.sae.W_dec.shape == (128, 64)
    early, late = res.early_late("mse_loss")
    assert late < 0.1 * early, (early, late)
    x = store["blocks.1.hook_resid_post"][:256]
    fvu = ((res.sae(x) - x) ** 2).sum(-1).mean() / ((x - x.mean(0)) ** 2).sum(-1).mean()
    assert fvu < 0.2
    assert list(res.to_frame().columns[:3]) == ["step", "loss", "mse_loss"] and len(res.to_frame()) == 300
    assert len(res.figure().data) >= 2 and "sae" not in res.to_dict()


def test_topk_and_normalisation(store):
    res = train_sae(store, "blocks.1.hook_resid_post", d_sae=64, steps=60, batch_size=64, architecture="topk", k=8,
                    lr=3e-3, normalize_activations="expected_average_only_in")
    early, late = res.early_late("mse_loss", window=10)
    assert late < early
    with pytest.raises(ValueError, match="unknown sae-lens architecture"):
        train_sae(store, "blocks.1.hook_resid_post", architecture="nope", steps=1)
    with pytest.raises(KeyError, match="not in the store"):
        train_sae(store, "blocks.0.hook_resid_post", steps=1)


def test_transcoder_predicts_mlp_output(store):
    res = train_transcoder(store, "blocks.1.hook_resid_mid", "blocks.1.hook_mlp_out", d_sae=128, steps=300,
                           batch_size=64, lr=3e-3, l1_coefficient=1e-3)
    early, late = res.early_late("mse_loss")
    assert late < 0.1 * early, (early, late)
    tc = res.sae.to_sae_lens()
    x, y = store["blocks.1.hook_resid_mid"][:256], store["blocks.1.hook_mlp_out"][:256]
    fvu = ((tc(x) - y) ** 2).sum(-1).mean() / ((y - y.mean(0)) ** 2).sum(-1).mean()
    assert fvu < 0.3, fvu
    assert tc.W_dec.shape == (128, 64) and tc.cfg.d_out == 64
