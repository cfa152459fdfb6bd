"""The shared small-LM trainer and word-level tokenizer builder (interp.zoo.training)."""
from __future__ import annotations

import random

import pytest
import torch

from interp.zoo.training import LMTrainConfig, train_lm, warmup_cosine, word_level_tokenizer

VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>", "the", "cat", "sat", "on", "mat", "dog"]


def test_word_level_tokenizer():
    tok = word_level_tokenizer(VOCAB)
    enc = tok("the cat sat on the mat")["input_ids"]
    assert enc == [1, 4, 5, 6, 7, 4, 8]  # <bos> prepended, ids in list order
    assert tok("the zebra")["input_ids"] == [1, 4, 3]  # unknown word -> <unk>
    assert tok.decode(enc, skip_special_tokens=True) == "the cat sat on the mat"
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 2)
    assert word_level_tokenizer(VOCAB, add_bos=False)("the cat")["input_ids"] == [4, 5]
    with pytest.raises(ValueError, match=r"\['<bos>', '<eos>', '<pad>'\]"):
        word_level_tokenizer(["<unk>", "a"])
    with pytest.raises(ValueError, match="share an id"):
        word_level_tokenizer({"<unk>": 0, "<bos>": 0})


def _tiny_lm(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def _batches(seed: int = 0):
    rng = random.Random(seed)
    while True:
        yield torch.tensor([[rng.randrange(4, len(VOCAB)) for _ in range(12)] for _ in range(4)])


CFG = LMTrainConfig(steps=12, lr=1e-2, warmup=3)


def test_train_lm_is_the_zoo_loop_bit_for_bit():
    """The loop the zoo builders used to write by hand (AdamW betas (0.9, 0.98), warm-up + cosine, clip 1.0)."""
    ref = _tiny_lm()
    opt = torch.optim.AdamW(ref.parameters(), lr=CFG.lr, weight_decay=CFG.weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, CFG.warmup, CFG.steps))
    data = _batches()
    ref_losses = []
    for _ in range(CFG.steps):
        ids = next(data)
        loss = ref(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        sched.step()
        ref_losses.append(float(loss))
    model = _tiny_lm()
    losses = train_lm(model, _batches(), CFG)
    assert losses == ref_losses
    for (k, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), k
    assert losses[-1] < losses[0]


def test_train_lm_resumes_to_the_same_weights(tmp_path):
    full = _tiny_lm()
    full_losses = train_lm(full, _batches(), CFG)

    class Stop(Exception):
        pass

    def stop_at_8(step, loss):
        if step == 7:
            raise Stop

    part = _tiny_lm()
    with pytest.raises(Stop):
        train_lm(part, _batches(), CFG, checkpoint=tmp_path / "ckpt", every=5, on_step=stop_at_8)
    assert (tmp_path / "ckpt" / "train_state.json").is_file()
    resumed = _tiny_lm(seed=1)  # other initial weights: the checkpoint replaces them
    losses = train_lm(resumed, _batches(), CFG, checkpoint=tmp_path / "ckpt", every=5)
    assert losses == full_losses
    for (k, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k
    assert not (tmp_path / "ckpt").exists()  # removed once training completed


def test_train_lm_reports_short_data_and_bad_checkpoints(tmp_path):
    with pytest.raises(ValueError, match="ran out after 2 of 12"):
        train_lm(_tiny_lm(), [next(_batches())] * 2, CFG)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train_state.json").write_text("{not json")
    from interp.io import SerializationError

    with pytest.raises(SerializationError, match="delete it to start over"):
        train_lm(_tiny_lm(), _batches(), CFG, checkpoint=tmp_path / "bad")
    with pytest.raises(ValueError):
        LMTrainConfig(steps=0)


def test_train_lm_keeps_the_users_files_in_the_checkpoint_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    train_lm(_tiny_lm(), _batches(), CFG, checkpoint=tmp_path, every=5)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "train_state.json").exists() and not (tmp_path / "model.safetensors").exists()
