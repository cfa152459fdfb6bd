"""Transcoder training from an activation store: it learns, and a checkpointed, interrupted run resumes to the
same weights as an uninterrupted one."""
import pytest
import torch

import interp
from interp.editing import Transcoder, TranscoderTrainingConfig, train_transcoder_from_store
from interp.testing import tiny_model

interp.set_progress(False)
TEXTS = [f"Row {i}: the quick brown fox {i * 7 % 13} jumps over {i % 5} lazy dogs near {i * 3} trees." for i in range(40)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from interp.store import harvest
    torch.manual_seed(0)
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    model = interp.wrap(hf, tok, backend="torch")
    out = tmp_path_factory.mktemp("acts") / "store"
    harvest(model, TEXTS, ["blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"], out, context_size=16,
            batch_size=4, shard_mb=0.02)
    return out


CFG = TranscoderTrainingConfig(d_sae=96, batch_size=32, n_epochs=3, l1_coefficient=1e-4, resample_every=4,
                               dead_window=64)


def test_learns_and_resumes(store, tmp_path):
    from interp.store import ActivationStore
    st = ActivationStore(store)
    assert len(st.shards) > 1 and len(st) // 32 * 3 > 8
    full, hist = train_transcoder_from_store(store, 1, CFG)
    assert hist.mse[-1] < 0.5 * hist.mse[0]
    assert len(hist.mse) == len(st) // 32 * 3 and hist.n_tokens == 32 * len(hist.mse)
    ck = tmp_path / "ckpt"
    part, h1 = train_transcoder_from_store(store, 1, CFG, checkpoint=ck, checkpoint_every=3, max_steps=7)
    assert len(h1.mse) == 7 and (ck / "state.safetensors").is_file()
    again, h2 = train_transcoder_from_store(store, 1, CFG, checkpoint=ck, checkpoint_every=3)
    assert h2.mse == pytest.approx(hist.mse, rel=1e-5)                 # same data order and steps after resuming
    for k in ("W_enc", "b_enc", "W_dec", "b_dec"):
        assert torch.allclose(getattr(again, k), getattr(full, k), atol=1e-5), k
    with pytest.raises(ValueError, match="another configuration"):
        train_transcoder_from_store(store, 1, TranscoderTrainingConfig(d_sae=96, batch_size=16), checkpoint=ck)
    with pytest.raises(KeyError, match="not in the store"):
        train_transcoder_from_store(store, 2, CFG)
    assert isinstance(full, Transcoder) and full.hook_name == "blocks.1.ln2.hook_normalized"
