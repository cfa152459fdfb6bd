"""Issue #34 §4: every public method runs from one call with its documented defaults.

Each test calls one entry point of probes/, steering/, editing/ or dynamics/ with nothing but the model (and the
arguments that name the question itself: ROME's fact, an ERI's CE), on a tiny test model, and checks a property
the default must have: the built-in data it documents (same numbers as passing that data explicitly), shapes,
finiteness. The planning analyses run their default data with a small VQ-VAE budget (their default budget,
2,000 examples and 1,500 steps, is minutes even on a tiny model). ``test_smollm2_defaults`` (slow) calls the same
entry points on ``zoo:smollm2-135m``.
"""
from __future__ import annotations

import math

import pytest
import torch

import interp
from interp.testing import tiny_model

TINY_LAYERS = 3


@pytest.fixture(scope="module")
def lm():
    hf, tok = tiny_model("llama", n_layers=TINY_LAYERS, seed=0)
    return interp.wrap(hf, tok, backend="torch")


@pytest.fixture(scope="module")
def vit():
    hf, _ = tiny_model("vit", n_layers=TINY_LAYERS, seed=0)  # image_size 32, patch 8
    return interp.wrap(hf, None, backend="torch")


# ------------------------------------------------------------------------------------------- built-in data
def test_text_passages_cover_the_book_without_the_heldout_book():
    from interp.data import heldout_text, kjv_text, text_passages

    p = text_passages()
    assert len(p) == 100 and len(set(p)) == 100 and text_passages() == p
    lines = kjv_text().splitlines()
    assert p[0] == " ".join(lines[:3])                      # Genesis 1:1-3
    assert p[-1].endswith(lines[-1])                         # ... to the last verse of Revelation
    ruth = heldout_text().splitlines()[0]
    assert all(ruth not in x for x in text_passages(None))
    with pytest.raises(ValueError, match="positive integer"):
        text_passages(0)


def test_digits_sample_takes_a_side_the_model_accepts(vit):
    from interp.data import digits_sample

    x, y = digits_sample(vit, n=5)
    assert x.shape == (5, 3, 32, 32) and len(y) == 5         # this ViT takes only its own 32 px
    hf, _ = tiny_model("dinov2", n_layers=2, seed=0)          # DINOv2 interpolates: the default 56 px
    x56, y56 = digits_sample(interp.wrap(hf, None, backend="torch"), n=5)
    assert x56.shape == (5, 3, 56, 56) and (y56 == y).all()  # same digits, same order
    assert vit.cfg.image_size == 32


# ------------------------------------------------------------------------------------------- probes.heads
def test_score_heads_defaults_are_the_documented_passages(lm):
    from interp.data import text_passages
    from interp.probes.heads import score_heads

    s = score_heads(lm)
    a = s.per_input["AHON (LN)"]
    assert a.shape == (100, TINY_LAYERS, 4) and torch.isfinite(a).all()
    ref = score_heads(lm, text_passages(100), "AHON (LN)", batch_size=8, max_length=128)
    torch.testing.assert_close(a, ref.per_input["AHON (LN)"])


def test_head_means_default(lm):
    from interp.data import text_passages
    from interp.probes.heads import head_means

    m = head_means(lm)
    assert m.shape == (TINY_LAYERS, 4, 16) and torch.isfinite(m).all() and m.abs().sum() > 0
    # the same token-weighted mean from the documented inputs in one padded batch
    one = head_means(lm, lm.tokenize(text_passages(100), max_length=128))
    torch.testing.assert_close(m, one, rtol=1e-4, atol=1e-5)


def test_dynamic_zeroing_default_threshold(lm):
    from interp.probes.heads import BEST_SCORE, dynamic_zeroing, score_heads

    dz = dynamic_zeroing(lm)
    assert dz.threshold == pytest.approx(score_heads(lm, scores=BEST_SCORE).threshold(BEST_SCORE, 0.1))


def test_evaluate_ablation_default_heads(lm):
    from interp.probes.heads import evaluate_ablation, score_heads

    r = evaluate_ablation(lm)
    mask = score_heads(lm).inactive()
    assert r.n_heads == pytest.approx(float(mask.sum((1, 2)).float().mean()))
    assert 0 < r.n_heads < TINY_LAYERS * 4 and len(r.random) == 5
    assert math.isfinite(r.baseline) and r.ablated != r.baseline


def test_inactive_sweep_default(lm):
    from interp.probes.heads import PAPER_FRACTIONS, inactive_sweep

    r = inactive_sweep(lm)
    assert len(r.values) == len(PAPER_FRACTIONS) and r.fractions[0] == 0.0
    assert r.values[0] == pytest.approx(r.baseline)           # fraction 0 zeroes nothing
    assert r.heads_zeroed[0] == 0 and r.heads_zeroed[-1] > 0


# ------------------------------------------------------------------------------------------- probes.gavel
def test_gavel_features_default_spec(lm):
    from interp.probes.gavel import FeatureSpec, conversation_features, text_features

    spec = FeatureSpec.official(TINY_LAYERS)
    f = text_features(lm, ["a plain text"])
    assert f[0].shape == (12, len(spec.layers) * lm.cfg.n_kv_heads * 16)
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    torch.testing.assert_close(conversation_features(lm, [conv])[0], conversation_features(lm, [conv], spec)[0])


def test_gavel_elicit_default_texts(lm):
    from interp.probes.gavel import elicit
    from interp.probes.gavel.library import NEUTRAL

    texts, feats = elicit(lm, "phishing", max_new_tokens=3)
    assert len(texts) == len(feats) == len(NEUTRAL)
    assert all(f.shape[0] <= 2 and torch.isfinite(f).all() for f in feats)


def test_gavel_template_detector_and_monitor(lm):
    from interp.probes.gavel import FeatureSpec, Monitor, template_detector
    from interp.probes.gavel.library import CE_TEMPLATES, library_rules

    det = template_detector(lm)
    assert det.ces == list(CE_TEMPLATES) and det.spec == FeatureSpec.official(TINY_LAYERS)
    again = template_detector(lm)                           # read back from its stage: the same detector
    torch.testing.assert_close(again.thresholds, det.thresholds)
    mon = Monitor(lm)
    assert [r.name for r in mon.rules] == [r.name for r in library_rules()]
    out = mon.generate("Write me a message.", max_new_tokens=8)
    assert out.window_probs.shape[1] == len(CE_TEMPLATES) and torch.isfinite(out.window_probs).all()


# ------------------------------------------------------------------------------------------- probes.planning
def test_planning_text_task():
    from interp.data import text_passages
    from interp.probes.planning import TextContinuation

    task = TextContinuation()
    ex = task.examples(5, seed=1)
    assert ex == task.examples(5, seed=1) and len({e.prompt for e in ex}) == 5
    passages = [p.split() for p in text_passages(None)]
    for e in ex:
        words = (e.prompt + " " + e.target).split()
        assert len(e.prompt.split()) == 24 and len(e.target.split()) == 8
        assert any(p[:32] == words for p in passages)
        assert task.is_correct(e, e.target) and not task.is_correct(e, "")


def test_planning_analyses_default_data(lm):
    from interp.probes.planning import BlockMapConfig, HorizonConfig, block_layer_map, branch_awareness, horizon_curve

    small = dict(n_examples=40, n_codes=4, train={"steps": 20}, n_perm=2)
    m = block_layer_map(lm, config=BlockMapConfig(**small))
    assert m.source == "10 texts" and m.nmi_t.shape == (m.nmi_t.shape[0], TINY_LAYERS)
    h = horizon_curve(lm, config=HorizonConfig(**small, max_tau=2))
    assert h.task == "text-continuation" and h.taus == [0, 1, 2] and len(h.mi) == 3
    with pytest.raises(ValueError, match="needs task="):
        branch_awareness(lm)


# ------------------------------------------------------------------------------------------- steering
def test_steering_default_data(lm):
    from interp.data import category_names
    from interp.steering import DiffInMeans, DirectionalAblation, RepIt, collect, default_data

    data = default_data(lm)
    assert len(data.positive) == 12 * len(category_names(harmful=True)) and len(data.negative) == 128
    v = DiffInMeans().fit(lm)
    name = f"blocks.{TINY_LAYERS // 2}.hook_resid_pre"
    pos = collect(lm, data.positive, [name])[:, 0, 0].mean(0)
    neg = collect(lm, data.negative, [name])[:, 0, 0].mean(0)
    torch.testing.assert_close(v.direction, pos - neg, rtol=1e-4, atol=1e-5)
    a = DirectionalAblation().fit(lm)
    torch.testing.assert_close(a.direction, v.direction / v.direction.norm(), rtol=1e-4, atol=1e-5)
    r = RepIt().fit(lm)
    assert r.metadata["targets"] == ["bio", "chem", "nuclear"] and torch.isfinite(r.direction).all()


# ------------------------------------------------------------------------------------------- dynamics
def test_vision_dynamics_default_images(vit):
    from interp.data import digits_sample
    from interp.dynamics.raptor import layer_distances, phases, teacher_activations
    from interp.dynamics.trajectories import basin_perturbation, residual_stream, trajectory_metrics

    d = layer_distances(vit)
    assert d.n_images == 200 and d.cosine.shape == (TINY_LAYERS, TINY_LAYERS)
    assert torch.allclose(torch.diagonal(torch.as_tensor(d.cosine)), torch.zeros(TINY_LAYERS), atol=1e-5)
    assert sum(len(p) for p in phases(d).parts) == TINY_LAYERS
    acts = teacher_activations(vit)
    assert acts.shape == (TINY_LAYERS + 1, 200, 17, 64)
    torch.testing.assert_close(residual_stream(vit), acts)
    torch.testing.assert_close(acts, teacher_activations(vit, digits_sample(vit)[0]))
    t = trajectory_metrics(vit)
    assert t.basin_accuracy is not None and t.basin_accuracy.shape == (TINY_LAYERS + 1,) and t.n_images == 200
    b = basin_perturbation(vit)
    assert b.basin_kept is not None and b.basin_kept.shape == (TINY_LAYERS - 1,)


def test_dynamics_task_generators_default_size():
    from interp.dynamics.tasks import DEFAULT_N, addition, conditioned_majority, majority

    for gen in (majority, addition, conditioned_majority):
        assert gen().tokens.shape[0] == DEFAULT_N


# ------------------------------------------------------------------- editing and influence (called, not changed here)
REQUEST = ("The capital of {} is", "Italy", " Berlin")


def test_rome_default(lm):
    from interp.editing import EditRequest, rome

    e = rome(lm, EditRequest(*REQUEST), layer=1, apply=False)
    assert e.delta.shape[1] == lm.cfg.d_model
    assert torch.isfinite(e.delta).all() and e.delta.abs().sum() > 0


def test_fine_tune_default(lm):
    from interp.editing import EditRequest, fine_tune

    e = fine_tune(lm, EditRequest(*REQUEST), layer=1, apply=False)
    assert torch.isfinite(e.delta).all() and e.delta.abs().sum() > 0


def test_tcpe_default(lm):
    """Without a transcoder, TCPE trains one on the built-in corpus (cached; the same object on every call, so
    the edit applies to the transcoder one splices)."""
    from interp.editing import EditConfig, EditRequest, default_transcoder, tcpe

    tc = default_transcoder(lm, 1)
    assert tc is default_transcoder(lm, 1) and tc.W_dec.shape[1] == lm.cfg.d_model
    before = tc.W_dec.detach().clone()
    e = tcpe(lm, EditRequest(*REQUEST), layer=1, config=EditConfig.tcpe(v_num_grad_steps=40))
    assert torch.isfinite(e.delta).all() and e.delta.abs().sum() > 0
    assert not torch.equal(tc.W_dec, before)  # applied to the default transcoder


def test_train_transcoder_default(lm):
    """The built-in corpus is the default training text: the same transcoder as passing it explicitly."""
    from interp.editing import TranscoderTrainingConfig, default_corpus, train_transcoder

    cfg = TranscoderTrainingConfig(d_sae=32, max_length=16)
    tc, history = train_transcoder(lm, 1, config=cfg)
    tc2, _ = train_transcoder(lm, 1, default_corpus(), config=cfg)
    assert tc.W_dec.shape == (32, lm.cfg.d_model) and torch.equal(tc.W_dec, tc2.W_dec)
    assert len(history.loss) > 0 and all(math.isfinite(v) for v in history.loss)


def test_decompose_gradient_default(lm):
    """Defaults: 8 built-in passages cut to 32 tokens, the residual after the middle block, the middle position;
    the parts add up to the full gradient."""
    from interp.dynamics import decompose_gradient, default_tokens

    res = decompose_gradient(lm)
    tokens = default_tokens(lm)
    assert tokens.shape == (8, 32)
    ref = decompose_gradient(lm, tokens, f"blocks.{TINY_LAYERS // 2}.hook_resid_post", 16)
    for name, g in res.full.items():
        assert torch.equal(g, ref.full[name])
        assert torch.allclose(res.direct[name] + res.precached[name] + res.shared[name], g, atol=1e-5)


def test_untie_gpt2_default():
    """``m`` (where network B takes over) names the question, like ROME's layer; network B defaults to a fresh
    initialisation of the same config."""
    from interp.dynamics import untie_gpt2

    hf, _ = tiny_model("gpt2", n_layers=2, seed=0)
    assert untie_gpt2(hf, 4, seed=0) is hf


# ------------------------------------------------------------------------------------------- slow: SmolLM2
@pytest.mark.slow
def test_smollm2_defaults():
    """Every entry point above on ``zoo:smollm2-135m`` from one call (planning with a small VQ-VAE budget)."""
    from interp.probes.gavel import Monitor, template_detector
    from interp.probes.heads import dynamic_zeroing, evaluate_ablation, score_heads
    from interp.probes.planning import BlockMapConfig, HorizonConfig, block_layer_map, horizon_curve
    from interp.steering import DiffInMeans, DirectionalAblation, RepIt

    model = interp.load("zoo:smollm2-135m", backend="torch")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    s = score_heads(model)
    assert s.per_input["AHON (LN)"].shape == (100, L, H) and torch.isfinite(s.per_input["AHON (LN)"]).all()
    assert math.isfinite(dynamic_zeroing(model).threshold)
    r = evaluate_ablation(model, n_random=1)
    assert math.isfinite(r.ablated) and r.n_heads > 0
    for method in (DiffInMeans(), DirectionalAblation(), RepIt()):
        v = method.fit(model)
        assert torch.isfinite(v.direction).all() and v.direction.shape == (model.cfg.d_model,)
    det = template_detector(model)
    out = Monitor(model, det).generate("Write a short note to a friend.", max_new_tokens=8)
    assert torch.isfinite(out.window_probs).all()
    small = dict(n_examples=200, n_codes=8, train={"steps": 100}, n_perm=2)
    m = block_layer_map(model, config=BlockMapConfig(**small, map_layers=(0, L // 2, L - 1)))
    assert m.nmi_t.shape[1] == 3
    # H holds ~870 states per set on SmolLM2 (29 layers x the prompt): ~21 CPU-s per VQ-VAE step at batch 128
    # (benchmarks/speed/results/planning.md), so the horizon check trains its H code on small batches, few steps
    tiny_h = {**small, "train": {"steps": 20, "batch_size": 16}}
    h = horizon_curve(model, config=HorizonConfig(**tiny_h, max_tau=3))
    assert h.task == "text-continuation" and len(h.mi) == 4
