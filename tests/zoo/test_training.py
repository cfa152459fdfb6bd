"""The shared small-LM trainer and word-level tokenizer builder (interp.training)."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from interp.training import LMTrainConfig, train_lm, warmup_cosine, word_level_tokenizer

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


def test_word_level_tokenizer_options():
    """The options the recipes' tokenizers need: punctuation split off (toy-refusal), the decoder's clean-up (the
    GAVEL CE world), extra special tokens (toy-refusal's ``<eoi>``)."""
    words = VOCAB + [".", "<eoi>"]
    plain = word_level_tokenizer(words, add_bos=False)
    split = word_level_tokenizer(words, add_bos=False, split_punctuation=True)
    assert plain("the cat.")["input_ids"] == [4, 3]  # "cat." is one (unknown) word
    assert split("the cat.")["input_ids"] == [4, 5, 10]
    assert plain.decode([4, 5, 10]) == "the cat ."
    assert word_level_tokenizer(words, cleanup=True).decode([4, 5, 10]) == "the cat."
    tok = word_level_tokenizer(words, additional_special_tokens=["<eoi>"])
    assert "<eoi>" in tok.all_special_tokens and tok.convert_tokens_to_ids("<eoi>") == 11
    assert tok.decode(tok("the cat <eoi>")["input_ids"], skip_special_tokens=True) == "the cat"
    assert plain.decode(plain("the cat <eoi>")["input_ids"], skip_special_tokens=True) == "the cat <eoi>"
    with pytest.raises(ValueError, match=r"\['<sep>'\]"):
        word_level_tokenizer(words, additional_special_tokens=["<sep>"])


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


def _hand_written_loop(ref, opt, sched, batches, steps: int, loss_fn=None, clip_params=None,
                       clip: float | None = 1.0) -> list[float]:
    """The loop the builders used to write by hand: loss, zero_grad, backward, clip to norm ``clip`` (``None``:
    no clipping), step, schedule."""
    losses = []
    for _ in range(steps):
        batch = next(batches)
        loss = loss_fn(ref, batch) if loss_fn else ref(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(clip_params if clip_params is not None else ref.parameters(), clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def _assert_same_weights(a, b) -> None:
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), k


def test_train_lm_is_the_zoo_loop_bit_for_bit():
    """The loop the zoo builders used to write by hand (AdamW betas (0.9, 0.98), warm-up + cosine, clip 1.0)."""
    ref = _tiny_lm()
    opt = torch.optim.AdamW(ref.parameters(), lr=CFG.lr, weight_decay=CFG.weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, CFG.warmup, CFG.steps))
    ref_losses = _hand_written_loop(ref, opt, sched, _batches(), CFG.steps)
    model = _tiny_lm()
    losses = train_lm(model, _batches(), CFG)
    assert losses == ref_losses
    _assert_same_weights(ref, model)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("cfg", [CFG, LMTrainConfig(steps=12, lr=1e-2, schedule="one_cycle", pct_start=0.25),
                                 LMTrainConfig(steps=12, lr=1e-2, schedule=lambda s: 0.9 ** s)],
                         ids=["warmup_cosine", "one_cycle", "function"])
def test_train_lm_resumes_to_the_same_weights(tmp_path, cfg):
    full = _tiny_lm()
    full_losses = train_lm(full, _batches(), cfg)

    class Stop(Exception):
        pass

    def stop_at_8(step, loss):
        if step == 7:
            raise Stop

    part = _tiny_lm()
    with pytest.raises(Stop):
        train_lm(part, _batches(), cfg, checkpoint=tmp_path / "ckpt", every=5, on_step=stop_at_8)
    assert (tmp_path / "ckpt" / "train_state.json").is_file()
    resumed = _tiny_lm(seed=1)  # other initial weights: the checkpoint replaces them
    losses = train_lm(resumed, _batches(), cfg, checkpoint=tmp_path / "ckpt", every=5)
    assert losses == full_losses
    _assert_same_weights(full, resumed)
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


def test_train_lm_one_cycle_is_the_hand_written_loop():
    """``schedule="one_cycle"``: the GAVEL CE world's loop (AdamW betas (0.9, 0.999), torch's OneCycleLR with
    pct_start 0.1, which also cycles the first beta, clip 1.0), bit for bit."""
    cfg = LMTrainConfig(steps=12, lr=1e-2, betas=(0.9, 0.999), schedule="one_cycle", pct_start=0.1)
    ref = _tiny_lm()
    opt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1)
    ref_losses = _hand_written_loop(ref, opt, sched, _batches(), cfg.steps)
    model = _tiny_lm()
    seen = []
    losses = train_lm(model, _batches(), cfg, on_step=lambda step, loss: seen.append(step))
    assert losses == ref_losses and seen == list(range(cfg.steps))
    _assert_same_weights(ref, model)
    sgd = torch.optim.SGD(_tiny_lm().parameters(), lr=1e-2)
    assert cfg.scheduler(sgd).get_last_lr()[0] == pytest.approx(cfg.lr / 25)  # one-cycle starts at lr / 25
    assert LMTrainConfig(steps=12, lr=1e-2, warmup=3).scheduler(torch.optim.SGD(_tiny_lm().parameters(), lr=1e-2)) \
        .get_last_lr()[0] == pytest.approx(1e-2 / 3)  # the default warm-up + cosine starts at lr / warmup


def test_train_lm_masked_labels_frozen_layers_and_extra_params_bit_for_bit():
    """The toy-refusal and planning loops: a batch dict with labels masked by -100, a frozen module (never in the
    optimizer; its missing gradient leaves the clipping norm unchanged), and extra trained parameters outside the
    model with a custom loss (the planning MTP heads)."""
    extra = torch.nn.Parameter(torch.full((len(VOCAB),), 0.1))

    def make():
        model = _tiny_lm()
        model.model.layers[0].mlp.requires_grad_(False)
        return model

    def batches():
        for ids in _batches():
            labels = ids.clone()
            labels[:, :5] = -100
            yield {"input_ids": ids, "labels": labels}

    def loss_fn(model, batch):
        out = model(**batch)
        return out.loss + 0.1 * (out.logits[:, -1] * extra).mean().abs()

    ref = make()
    params = [p for p in ref.parameters() if p.requires_grad] + [extra]
    opt = torch.optim.AdamW(params, lr=CFG.lr, weight_decay=CFG.weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, CFG.warmup, CFG.steps))
    ref_losses = _hand_written_loop(ref, opt, sched, batches(), CFG.steps, loss_fn=loss_fn,
                                    clip_params=list(ref.parameters()) + [extra])  # frozen ones included: no grad
    ref_extra = extra.detach().clone()
    with torch.no_grad():
        extra.fill_(0.1)
    model = make()
    frozen = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    losses = train_lm(model, batches(), CFG, params=list(model.parameters()) + [extra], loss_fn=loss_fn)
    assert losses == ref_losses and torch.equal(extra, ref_extra)
    assert not torch.equal(extra, torch.full_like(extra, 0.1))  # the extra parameters were trained
    _assert_same_weights(ref, model)
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, frozen)


def _padded_batches(seed: int = 0):
    """Batches of a tokenizer's padded output: labels are the ids with the padding masked by -100."""
    rng = random.Random(seed)
    while True:
        lengths = [rng.randrange(3, 12) for _ in range(4)]
        ids = torch.zeros(4, max(lengths), dtype=torch.long)  # <pad> = 0, on the right
        mask = torch.zeros_like(ids)
        for i, n in enumerate(lengths):
            ids[i, :n] = torch.tensor([rng.randrange(4, len(VOCAB)) for _ in range(n)])
            mask[i, :n] = 1
        yield {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def test_train_lm_is_the_tcpe_toys_loop_bit_for_bit():
    """The TCPE facts / code toys' loop: AdamW (betas (0.9, 0.999)), torch's OneCycleLR with pct_start 0.05, no
    gradient clipping, padded batches with the padding masked."""
    cfg = LMTrainConfig(steps=12, lr=1e-2, betas=(0.9, 0.999), clip=None, schedule="one_cycle", pct_start=0.05)
    ref = _tiny_lm()
    opt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.05)
    ref_losses = _hand_written_loop(ref, opt, sched, _padded_batches(), cfg.steps, loss_fn=lambda m, b: m(**b).loss,
                                    clip=None)
    model = _tiny_lm()
    assert train_lm(model, _padded_batches(), cfg) == ref_losses
    _assert_same_weights(ref, model)
    clipped = _tiny_lm()  # the clipping is really off: with it the weights differ
    train_lm(clipped, _padded_batches(), dataclasses.replace(cfg, clip=1e-3))
    assert not torch.equal(clipped.lm_head.weight, model.lm_head.weight)


def test_train_lm_schedule_function_is_the_copypaste_toys_loop_bit_for_bit():
    """``schedule=`` a function: the CopyPaste toy's loop (AdamW betas (0.9, 0.999), ``LambdaLR`` of
    ``interp.training.warmup_cosine_fraction``, which reaches its floor at the last step, unlike
    :func:`interp.training.warmup_cosine`; clip 1.0; padded batches), bit for bit."""
    from interp.training import warmup_cosine_fraction as fractional_warmup_cosine

    steps = 12
    factor = lambda s: fractional_warmup_cosine(s, steps, 0.25, 0.05)  # noqa: E731
    ref = _tiny_lm()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    ref_losses = _hand_written_loop(ref, opt, sched, _padded_batches(), steps, loss_fn=lambda m, b: m(**b).loss)
    cfg = LMTrainConfig(steps=steps, lr=1e-2, betas=(0.9, 0.999), schedule=factor)
    model = _tiny_lm()
    assert train_lm(model, _padded_batches(), cfg) == ref_losses
    _assert_same_weights(ref, model)
    # not the default schedule with the same warm-up (3 steps): that one reaches its floor a step after the end
    assert factor(steps - 1) == pytest.approx(0.05) and warmup_cosine(steps - 1, 3, steps) > 0.07
    sched = cfg.scheduler(torch.optim.SGD(_tiny_lm().parameters(), lr=1e-2))
    assert sched.get_last_lr()[0] == pytest.approx(1e-2 / 3)  # factor(0): first of 3 warm-up steps


def test_lm_train_config_rejects_unknown_schedules():
    with pytest.raises(ValueError, match="schedule must be one of"):
        LMTrainConfig(steps=10, schedule="linear")
    with pytest.raises(ValueError, match="pct_start"):
        LMTrainConfig(steps=10, schedule="one_cycle", pct_start=1.0)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        LMTrainConfig(steps=10, optimizer="sgd")


def test_train_lm_adam_is_the_polca_loop_bit_for_bit():
    """``optimizer="adam"``, no schedule change, no clipping: the POLCA addition loop (torch's Adam with its
    defaults, ``zero_grad`` then ``backward`` then ``step``), bit for bit; ``on_step`` sees every step's loss."""
    ref = _tiny_lm()
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    batches = _batches()
    ref_losses = []
    for _ in range(CFG.steps):
        loss = (lambda b: ref(input_ids=b, labels=b).loss)(next(batches))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    cfg = LMTrainConfig(steps=CFG.steps, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999), clip=None,
                        schedule="constant", optimizer="adam")
    model, seen = _tiny_lm(), []
    assert train_lm(model, _batches(), cfg, on_step=lambda step, loss: seen.append((step, loss))) == ref_losses
    assert seen == list(enumerate(ref_losses))
    _assert_same_weights(ref, model)


def test_limit_threads_caps_and_restores():
    from threadpoolctl import threadpool_info

    from interp.training import limit_threads

    before = torch.get_num_threads()
    blas_before = [p["num_threads"] for p in threadpool_info()]
    with limit_threads(1):
        assert torch.get_num_threads() == 1
        assert all(p["num_threads"] == 1 for p in threadpool_info())
    with limit_threads(1, blas=False):
        assert torch.get_num_threads() == 1
        assert [p["num_threads"] for p in threadpool_info()] == blas_before
    with limit_threads(None):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_threads must be an integer >= 1 or None"):
            with limit_threads(bad):
                pass


def test_set_seed_seeds_every_generator():
    import numpy as np

    from interp.training import set_seed

    g = set_seed(7)
    a = (random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=g)))
    g = set_seed(7)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=g))) == a


def test_warmup_cosine_fraction():
    from interp.training import warmup_cosine_fraction

    f = [warmup_cosine_fraction(s, 20, 0.1, 0.1) for s in range(20)]
    assert f[:2] == [0.5, 1.0]  # round(0.1 * 20) = 2 warm-up steps
    assert f[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(f[1:], f[2:]))
    with pytest.raises(ValueError, match="total_steps must be >= 1"):
        warmup_cosine_fraction(0, 0)


def test_old_paths_re_export_the_kit_with_a_warning():
    import interp.models.common as common
    import interp.training as kit
    import interp.zoo.training as old

    with pytest.warns(DeprecationWarning, match="moved to interp.training.train_lm"):
        assert old.train_lm is kit.train_lm
    with pytest.warns(DeprecationWarning, match="moved to interp.training.warmup_cosine_fraction"):
        assert common.warmup_cosine is kit.warmup_cosine_fraction
    with pytest.warns(DeprecationWarning):
        assert common.limit_threads is kit.limit_threads and common.set_seed is kit.set_seed
    with pytest.raises(AttributeError):
        old.nothing_here  # noqa: B018
