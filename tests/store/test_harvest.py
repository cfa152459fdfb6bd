"""harvest + ActivationStore: values, layout, resume, refusal of changed inputs, corruption, reader."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from interp.store import (ActivationStore, CorruptShardError, HarvestResult, IncompatibleStoreError, StoreError,
                          harvest)

NAMES = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z", "blocks.1.hook_mlp_out"]
KW = dict(context_size=16, batch_size=3, shard_mb=0.15)


@pytest.fixture(scope="module")
def store_dir(model, texts, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("h") / "store"
    harvest(model, texts, NAMES, out, **KW)
    return out


def test_rows_equal_a_direct_forward(model, store_dir):
    store = ActivationStore(store_dir, verify=True)
    assert store.names == NAMES and len(store.shards) >= 3
    assert store.shapes == {NAMES[0]: (64,), NAMES[1]: (4, 16), NAMES[2]: (64,)}
    assert len(store) == store.n_contexts * 16
    for ctx in (0, store.n_contexts // 2, store.n_contexts - 1):
        ids = store.context_tokens(ctx).long()[None]
        _, cache = model.run_with_cache(ids, names=NAMES)
        rows = store.rows(slice(ctx * 16, ctx * 16 + 16))
        for n in NAMES:
            torch.testing.assert_close(rows[n], cache[n][0], rtol=1e-5, atol=1e-5)
        assert ids[0, 0].item() == model.tokenizer.bos_token_id


def test_manifest_records_what_was_harvested(store_dir, texts):
    man = json.loads((store_dir / "manifest.json").read_text())
    assert man["complete"] and man["names"] == NAMES and man["dtype"] == "float32"
    assert man["n_tokens"] == man["n_contexts"] * 16 == sum(s["n_rows"] for s in man["shards"].values())
    assert man["data"]["kind"] == "texts" and len(man["data"]["fingerprint"]) == 64
    assert man["n_documents"] <= len(texts)
    assert all(len(s["sha256"]) == 64 for s in man["shards"].values())
    assert man["shapes"][NAMES[1]] == [4, 16]


def test_stops_after_the_deepest_layer(model, texts, tmp_path):
    with model.capture(["blocks.1.hook_resid_post", "blocks.2.hook_resid_post"]) as seen:
        harvest(model, texts[:10], ["blocks.1.hook_resid_mid"], tmp_path / "s", context_size=16, batch_size=4)
    assert "blocks.1.hook_resid_post" in seen and "blocks.2.hook_resid_post" not in seen


def test_rerun_skips_and_interrupted_run_resumes_identically(model, texts, store_dir, tmp_path):
    again = harvest(model, texts, NAMES, store_dir, **KW)
    assert isinstance(again, HarvestResult) and again.shards_written == 0 and again.tokens_computed == 0
    # simulate a crash after two shards: drop the later shards from the manifest and the disk
    out = tmp_path / "s"
    full = harvest(model, texts, NAMES, out, **KW)
    man = json.loads((out / "manifest.json").read_text())
    for key in [k for k in man["shards"] if int(k) >= 2]:
        (out / man["shards"].pop(key)["file"]).unlink()
    (out / "shard_000003.safetensors").write_bytes(b"half-written junk")  # stray file not in the manifest
    man["complete"] = False
    (out / "manifest.json").write_text(json.dumps(man))
    res = harvest(model, texts, NAMES, out, **KW)
    assert res.shards_skipped == 2 and res.shards_written == full.n_shards - 2
    for e in full.shards:
        assert (out / e["file"]).read_bytes() == (store_dir / e["file"]).read_bytes()


def test_changed_config_data_or_model_is_refused(model, other_model, texts, store_dir):
    with pytest.raises(IncompatibleStoreError, match="context_size"):
        harvest(model, texts, NAMES, store_dir, **{**KW, "context_size": 32})
    with pytest.raises(IncompatibleStoreError, match="names"):
        harvest(model, texts, NAMES[:1], store_dir, **KW)
    with pytest.raises(IncompatibleStoreError, match="data"):
        harvest(model, texts[:-1] + ["another document"], NAMES, store_dir, **KW)
    with pytest.raises(IncompatibleStoreError, match="model changed"):
        harvest(other_model, texts, NAMES, store_dir, **KW)


def test_corrupt_shard_is_named_and_repaired(model, texts, tmp_path):
    out = tmp_path / "s"
    harvest(model, texts, NAMES, out, **KW)
    shard = out / "shard_000001.safetensors"
    good = shard.read_bytes()
    shard.write_bytes(good[:-8] + b"\x00" * 8)
    with pytest.raises(CorruptShardError, match="shard_000001.safetensors"):
        ActivationStore(out, verify=True)
    with pytest.raises(CorruptShardError, match="shard_000001.safetensors"):
        harvest(model, texts, NAMES, out, **KW)
    res = harvest(model, texts, NAMES, out, **KW, repair=True)
    assert res.shards_written == 1 and shard.read_bytes() == good


def test_batches_cover_every_row_once_and_mix_shards(store_dir):
    store = ActivationStore(store_dir)
    seen = torch.cat([b["row"] for b in store.batches(32, seed=1, names=NAMES[:1], with_rows=True)])
    assert sorted(seen.tolist()) == list(range(len(store)))
    a = [b.clone() for b in store.batches(32, seed=1, names=NAMES[0])]
    b = [b.clone() for b in store.batches(32, seed=1, names=NAMES[0])]
    c = [b.clone() for b in store.batches(32, seed=2, names=NAMES[0])]
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and not torch.equal(a[0], c[0])
    assert all(x.shape == (32, 64) for x in a[:-1])
    first = next(store.batches(32, seed=1, names=NAMES[:1], with_rows=True))
    shard_of = np.searchsorted(store._offsets, first["row"].numpy(), side="right") - 1
    assert len(set(shard_of.tolist())) > 1  # a batch draws rows from several shards
    torch.testing.assert_close(first[NAMES[0]], store[NAMES[0]][first["row"]])
    ordered = torch.cat(list(store.batches(50, shuffle=False, names=NAMES[2])))
    torch.testing.assert_close(ordered, store[NAMES[2]].load())


def test_dataset_and_provenance(store_dir, texts, model):
    store = ActivationStore(store_dir)
    ds = store.dataset(NAMES[1])
    assert len(ds) == len(store)
    torch.testing.assert_close(ds[len(store) - 5], store[NAMES[1]][len(store) - 5])
    loader = torch.utils.data.DataLoader(store.dataset(NAMES[:1]), batch_size=20)
    assert next(iter(loader))[NAMES[0]].shape == (20, 64)
    prov = store.provenance(range(len(store)))
    real = prov[prov.position >= 0]
    tok = model.tokenizer
    for _, r in real.sample(25, random_state=0).iterrows():
        ids = tok(texts[r.document], add_special_tokens=False)["input_ids"]
        assert ids[r.position] == r.token
    assert (prov.offset == 0).sum() == store.n_contexts
    assert "[[" in store.text(int(real.row.iloc[10]), tok, window=4)


def test_sources_files_jsonl_dataset_npy(model, texts, tmp_path):
    txt = tmp_path / "c.txt"
    txt.write_text("\n".join(texts) + "\n\n")
    jl = tmp_path / "c.jsonl"
    jl.write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(texts)))
    import datasets
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "ds"))
    ids = [model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    arr = np.array([(i * 3)[:20] for i in ids], dtype=np.int64)
    np.save(tmp_path / "c.npy", arr)
    kw = dict(context_size=16, batch_size=4)
    ref = ActivationStore(harvest(model, texts, NAMES[:1], tmp_path / "ref", **kw).path)
    for src in (txt, jl, tmp_path / "ds"):
        s = ActivationStore(harvest(model, src, NAMES[:1], tmp_path / f"o-{src.name}", **kw).path)
        torch.testing.assert_close(s[NAMES[0]].load(), ref[NAMES[0]].load())
    s = ActivationStore(harvest(model, tmp_path / "c.npy", NAMES[:1], tmp_path / "o-npy", **kw).path)
    from sae_lens.tokenization_and_batching import concat_and_batch_sequences
    bos = model.tokenizer.bos_token_id
    ref_ctx = list(concat_and_batch_sequences(iter(torch.from_numpy(arr)), 16, bos, None, bos))
    assert torch.equal(torch.stack(ref_ctx), torch.stack([s.context_tokens(i).long() for i in range(s.n_contexts)]))
    s2 = ActivationStore(harvest(model, torch.from_numpy(arr), NAMES[:1], tmp_path / "o-tensor", **kw).path)
    torch.testing.assert_close(s2[NAMES[0]].load(), s[NAMES[0]].load())


def test_dtype_and_max_tokens(model, texts, tmp_path):
    res = harvest(model, texts, NAMES[:1], tmp_path / "s", context_size=16, batch_size=4, dtype="bfloat16",
                  max_tokens=100)
    store = ActivationStore(res.path)
    assert len(store) == 96 and store[NAMES[0]][:3].dtype == torch.bfloat16
    assert res.to_frame()["n_rows"].sum() == 96 and res.figure() is not None


def test_bad_inputs_raise_clear_errors(model, texts, tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        harvest(model, texts, NAMES, tmp_path / "a", dtype="int8")
    with pytest.raises(ValueError, match="batch_size"):
        harvest(model, texts, NAMES, tmp_path / "a", batch_size=0)
    with pytest.raises(ValueError, match="hook_pattern"):
        harvest(model, texts, ["blocks.0.attn.hook_pattern"], tmp_path / "b", context_size=16)
    with pytest.raises(KeyError, match="unknown hook name"):
        harvest(model, texts, ["blocks.0.hook_resid_pots"], tmp_path / "c", context_size=16)
    with pytest.raises(ValueError, match="no complete context"):
        harvest(model, ["hi"], NAMES, tmp_path / "d", context_size=64)
    with pytest.raises(FileNotFoundError):
        harvest(model, tmp_path / "missing.txt", NAMES, tmp_path / "e")
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not an activation store"):
        harvest(model, texts, NAMES, tmp_path / "f")
    with pytest.raises(ValueError, match="engine='ray' needs a model spec"):
        import interp
        from interp.testing import tiny_model
        hf, tok = tiny_model("llama")
        harvest(interp.wrap(hf, tok), texts, NAMES, tmp_path / "g", engine="ray")
    with pytest.raises(StoreError, match="not an activation store"):
        ActivationStore(tmp_path)
