"""Tests of interp.dynamics.raptor: layer distances, phases (planted block recurrence), Raptor training."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import interp
import interp.testing
from interp.dynamics.raptor import (cut_value, distances_from_stack, dp_phases, layer_distances, maxcut_phases, phases,
                                    token_summaries)

torch.set_num_threads(1)
interp.set_progress(False)

PLANTED = [[0, 1], [2, 3, 4], [5, 6, 7]]


def planted_vit(arch: str = "dinov2", parts=PLANTED, seed: int = 0):
    """A tiny ViT whose blocks are tied copies, one block per planted phase; each phase's block adds a large
    constant (MLP output bias) along its own direction, 10x larger than the previous phase's, so the block outputs
    of one phase point alike and differ from the other phases'. Norm weights perturbed (non-unit)."""
    L = sum(len(p) for p in parts)
    hf, _ = interp.testing.tiny_model(arch, n_layers=L, perturb_norms=True, seed=seed)
    layers = hf.encoder.layer if hasattr(hf, "encoder") else hf.vit.encoder.layer
    g = torch.Generator().manual_seed(seed)
    d = hf.config.hidden_size
    dirs = torch.linalg.qr(torch.randn(d, len(parts), generator=g))[0].T
    with torch.no_grad():
        for k, p in enumerate(parts):
            src = layers[p[0]]
            fc2 = src.mlp.fc2 if hasattr(src.mlp, "fc2") else None
            if fc2 is None:  # HF ViT: output.dense carries the MLP's second projection
                src.output.dense.bias.copy_(dirs[k] * 5.0 * 10 ** k)
            else:
                fc2.bias.copy_(dirs[k] * 5.0 * 10 ** k)
            for l in p[1:]:
                layers[l].load_state_dict(src.state_dict())
    return hf


@pytest.fixture(scope="module")
def planted():
    hf = planted_vit()
    return interp.wrap(hf, None, backend="torch")


def test_token_summaries_and_distance_hand_computation():
    # 2 layers, 1 image, CLS + 1 register + 2 patches, d = 2
    resid = torch.tensor([[[[1., 0.], [9., 9.], [0., 1.], [0., 3.]]],
                          [[[0., 2.], [9., 9.], [0., 2.], [0., 2.]]]])
    s = token_summaries(resid, n_registers=1)
    assert torch.allclose(s[0, 0], torch.tensor([[1., 0.], [0., 2.]]))
    cos, mse = distances_from_stack(s)
    # cls: cos((1,0),(0,2)) = 0 -> 1; patch-mean: (0,2) vs (0,2) -> 0; mean 0.5
    assert cos[0, 1].item() == pytest.approx(0.5)
    assert cos[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    # mse: cls ((1-0)^2 + (0-2)^2)/2 = 2.5; patches 0 -> 1.25
    assert mse[0, 1].item() == pytest.approx(1.25)
    with pytest.raises(ValueError, match="CLS token"):
        token_summaries(torch.zeros(1, 1, 2, 4), n_registers=1)


def test_maxcut_hand_matrix():
    # two obvious blocks {0,1,2} and {3,4}, interleaved order must not matter for max-cut
    D = np.ones((5, 5)) - np.eye(5)
    for a, b in itertools.product(range(3), range(3)):
        D[a, b] = 0.0 if a == b else 0.1
    D[3, 4] = D[4, 3] = 0.1
    res = maxcut_phases(D, frac=0.1)
    assert res.parts == [[0, 1, 2], [3, 4]]
    assert res.cut == pytest.approx(6.0)
    assert res.gains == [pytest.approx(6.0)]
    # threshold 0.95 * 6.4 = 6.08 > gain 6 keeps one phase; 0.9 * 6.4 = 5.76 splits
    assert maxcut_phases(D, frac=0.95).parts == [[0, 1, 2, 3, 4]]
    # permuting the layers permutes the phases (max-cut does not assume contiguity)
    perm = [3, 0, 4, 1, 2]
    Dp = D[np.ix_(perm, perm)]
    got = maxcut_phases(Dp, frac=0.1).parts
    assert sorted(sorted(perm[i] for i in p) for p in got) == [[0, 1, 2], [3, 4]]
    assert not maxcut_phases(Dp, frac=0.1).contiguous


def test_dp_is_exact_against_enumeration():
    rng = np.random.default_rng(0)
    for L in (6, 7, 9):
        X = rng.normal(size=(L, L))
        D = np.abs(X + X.T)
        np.fill_diagonal(D, 0)
        for k in (2, 3):
            best = -1.0
            for cuts in itertools.combinations(range(1, L), k - 1):
                bounds = (0,) + cuts + (L,)
                parts = [list(range(bounds[i], bounds[i + 1])) for i in range(k)]
                if min(map(len, parts)) < 2:
                    continue
                best = max(best, cut_value(D, parts))
            res = dp_phases(D, n_phases=k)
            assert res.cut == pytest.approx(best)
            assert res.contiguous and len(res.parts) == k


def test_bad_inputs():
    with pytest.raises(ValueError, match="square"):
        phases(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="method"):
        phases(np.zeros((4, 4)), method="spectral")
    with pytest.raises(ValueError, match="n_phases"):
        dp_phases(np.zeros((4, 4)), n_phases=3)
    with pytest.raises(ValueError, match="NaN"):
        phases(np.full((4, 4), np.nan))


@pytest.mark.parametrize("method", ["maxcut", "dp"])
def test_planted_recurrence_is_recovered(planted, method):
    images = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    dist = layer_distances(planted, images, batch_size=4)
    assert dist.cosine.shape == (8, 8)
    assert torch.allclose(dist.cosine, dist.cosine.T, atol=1e-5)
    assert phases(dist, n_phases=3, method=method).parts == PLANTED
    res = phases(dist, frac=0.05, method=method)
    assert res.parts == PLANTED, (res.parts, dist.cosine)
    assert res.thresholds == [1, 4]
    fig = dist.figure(res.parts)
    assert len(fig.layout.shapes) == 4


def test_layer_distances_batches_agree(planted):
    images = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    a = layer_distances(planted, images, batch_size=5)
    b = layer_distances(planted, images, batch_size=2)
    assert torch.allclose(a.cosine, b.cosine, atol=1e-5) and torch.allclose(a.mse, b.mse, rtol=1e-4)


# ----------------------------------------------------------------------------------------------- Raptor
from interp.dynamics.raptor import (Raptor, RaptorConfig, RaptorTrainConfig, evaluate_raptor, layer_r2,  # noqa: E402
                                    teacher_activations, train_raptor, weighted_mse)
import interp.dynamics.raptor.train as raptor_train  # noqa: E402


def test_routing_and_config_validation():
    r = Raptor(RaptorConfig(d_model=8, n_heads=2, n_layers=8, thresholds=[2, 5]))
    assert [r.block_index(t) for t in range(1, 9)] == [0, 0, 1, 1, 1, 2, 2, 2]
    assert RaptorConfig.from_phases(PLANTED, d_model=8, n_heads=2).thresholds == [2, 5]
    with pytest.raises(ValueError, match="thresholds"):
        RaptorConfig(d_model=8, n_heads=2, n_layers=8, thresholds=[5, 2])
    with pytest.raises(ValueError, match="thresholds"):
        RaptorConfig(d_model=8, n_heads=2, n_layers=8, thresholds=[8])
    with pytest.raises(ValueError, match="divisible"):
        RaptorConfig(d_model=9, n_heads=2, n_layers=8)
    with pytest.raises(ValueError, match="mlp"):
        RaptorConfig(d_model=8, n_heads=2, n_layers=8, mlp="relu")
    with pytest.raises(ValueError, match="batch_size"):
        RaptorTrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="stage2_weights"):
        RaptorTrainConfig(stage2_weights=(1.0, -1.0, 0.0))


def test_block_equations_by_hand():
    torch.manual_seed(0)
    cfg = RaptorConfig(d_model=8, n_heads=2, n_layers=4, layerscale_init=0.5, mlp="gelu")
    blk = Raptor(cfg).blocks[0]
    with torch.no_grad():
        blk.t_proj[2].weight.normal_(std=0.3)
        blk.t_proj[2].bias.normal_(std=0.3)
    x = torch.randn(3, 5, 8)
    t1, t2, t3 = (blk.t_proj(torch.tensor([[3.0]])) + 1).chunk(3, -1)
    a = blk.ln1(x)
    h = x + t1 * blk.ls1 * blk.attn(a, a, a, need_weights=False)[0]
    h = h + t2 * blk.ls2 * blk.mlp(blk.ln2(h))
    assert torch.allclose(blk(x, 3.0), t3 * h, atol=1e-6)
    # a per-row t (teacher forcing over several layers at once) equals one call per layer
    xs = torch.randn(2, 3, 5, 8)
    both = blk(xs, torch.tensor([[1.0], [2.0]]).expand(2, 3))
    assert torch.allclose(both[1], blk(xs[1], 2.0), atol=1e-6)
    # at the paper's init (LayerScale 1e-5, t_proj ~ N(0, 1e-4)) a block is nearly the identity
    fresh = Raptor(RaptorConfig(d_model=8, n_heads=2, n_layers=4)).blocks[0]
    assert torch.allclose(fresh(x, 2.0), x, atol=1e-2)


def test_weighted_mse_hand_computation():
    pred = torch.zeros(1, 4, 2)
    target = torch.tensor([[[1., 1.], [2., 2.], [3., 3.], [0., 0.]]])  # cls, 1 register, 2 patches
    # cls mse 1, register 4, patches (9 + 0)/2 = 4.5
    assert weighted_mse(pred, target, (0.45, 0.10, 0.45), n_registers=1).item() == pytest.approx(
        0.45 * 1 + 0.10 * 4 + 0.45 * 4.5)
    # no registers: renormalised over cls and patches; patches = (4 + 9 + 0) / 3
    assert weighted_mse(pred, target, (0.34, 0.33, 0.33)).item() == pytest.approx(
        (0.34 * 1 + 0.33 * 13 / 3) / 0.67)
    assert weighted_mse(pred, target, None).item() == pytest.approx(target.pow(2).mean().item())


def _teacher_stream(n=96, L=4, T=5, d=16, seed=0):
    """A stream produced by a known 2-block Raptor (thresholds [2]) with large LayerScale: a student with the
    same routing can fit it, a 1-block student cannot fit it as well."""
    torch.manual_seed(seed)
    teacher = Raptor(RaptorConfig(d_model=d, n_heads=2, n_layers=L, thresholds=[2], layerscale_init=0.6,
                                  depth_scaling=False, mlp="gelu"))
    a0 = torch.randn(n, T, d)
    with torch.no_grad():
        return torch.cat([a0[None], teacher(a0)])


def test_training_fits_a_planted_two_block_stream():
    acts = _teacher_stream()
    cfg = RaptorTrainConfig(stage1_steps=150, stage2_steps=100, batch_size=32, lr=3e-3)
    r2 = {}
    for k, th in ((2, [2]), (1, [])):
        torch.manual_seed(1)
        student = Raptor(RaptorConfig(d_model=16, n_heads=2, n_layers=4, thresholds=th, mlp="gelu"))
        before, _ = layer_r2(student, acts)
        hist = train_raptor(student, acts, cfg)
        r2[k], _ = layer_r2(student, acts)
        assert hist.losses["stage2"][-1] < hist.losses["stage2"][0]
        assert r2[k].mean() > before.mean()
    # the stream is dominated by a_0 (residual), so compare the unexplained variance: the matching routing
    # leaves well under half of what one shared block leaves (measured 0.0096 vs 0.021 at these settings)
    assert r2[2].mean() > 0.98, r2
    assert (1 - r2[1]).mean() > 1.8 * (1 - r2[2]).mean(), r2


def test_checkpoint_resume_is_exact(tmp_path, monkeypatch):
    acts = _teacher_stream(n=32)
    cfg = RaptorTrainConfig(stage1_steps=8, stage2_steps=6, batch_size=8, checkpoint_every=3)
    make = lambda: (torch.manual_seed(3), Raptor(RaptorConfig(d_model=16, n_heads=2, n_layers=4, thresholds=[2])))[1]
    ref = make()
    ref_hist = train_raptor(ref, acts, cfg)
    real = raptor_train._lr_at
    calls = {"n": 0}

    def flaky(step, steps, c):
        calls["n"] += 1
        if calls["n"] == 13:  # inside block 1 of stage 1, after its checkpoint at step 3
            raise KeyboardInterrupt
        return real(step, steps, c)

    monkeypatch.setattr(raptor_train, "_lr_at", flaky)
    student = make()
    with pytest.raises(KeyboardInterrupt):
        train_raptor(student, acts, cfg, checkpoint=tmp_path / "ck")
    monkeypatch.setattr(raptor_train, "_lr_at", real)
    resumed = make()
    hist = train_raptor(resumed, acts, cfg, checkpoint=tmp_path / "ck")
    for (k, v), w in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(v, w, atol=1e-6), k
    assert hist.losses.keys() == ref_hist.losses.keys()
    assert all(np.allclose(hist.losses[u], ref_hist.losses[u], atol=1e-6) for u in ref_hist.losses)
    # save / load round trip
    resumed.save(tmp_path / "model")
    again = Raptor.load(tmp_path / "model")
    assert torch.allclose(again(acts[0, :4]), resumed(acts[0, :4]))


def test_normalize_layers_divides_each_layer_loss_by_the_teacher_variance():
    # a k = L stream whose layers differ in scale by 10x per layer; every sample is the same image, so the loss of
    # the first step does not depend on which samples the batch draws
    L, T, d = 3, 4, 8
    g = torch.Generator().manual_seed(0)
    one = torch.randn(L + 1, 1, T, d, generator=g) * (10.0 ** torch.arange(L + 1.0)).view(-1, 1, 1, 1)
    acts = one.expand(-1, 6, -1, -1).contiguous()
    var = torch.stack([acts[l].reshape(-1, d).var(0).mean() for l in range(L + 1)])
    rcfg = RaptorConfig(d_model=d, n_heads=2, n_layers=L, thresholds=[1, 2])
    for normalize in (False, True):
        torch.manual_seed(5)
        raptor = Raptor(rcfg)
        with torch.no_grad():  # the loss of step 0 of each stage-1 unit, by hand (only block j has moved since)
            want = [torch.mean((raptor.blocks[j](acts[j, :1], float(j + 1)) - acts[j + 1, :1]) ** 2).item()
                    / (var[j + 1].item() if normalize else 1.0) for j in range(L)]
        cfg = RaptorTrainConfig(stage1_steps=1, stage2_steps=0, batch_size=4, cls_weighting=False,
                                normalize_layers=normalize)
        hist = train_raptor(raptor, acts, cfg)
        got = [hist.losses[f"stage1/block{j}"][0] for j in range(L)]
        assert got == pytest.approx(want, rel=1e-4), (normalize, got, want)
    # normalised, the three layers' losses are of one order; plain, they span 10^4 (the layers' variance)
    assert max(want) / min(want) < 30


def test_teacher_activations_and_evaluation_on_a_vit(planted):
    images = torch.randn(24, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    acts = teacher_activations(planted, images, batch_size=10)
    assert acts.shape == (9, 24, 17, 64)
    _, cache = planted.run_with_cache(images[:2], names=["blocks.0.hook_resid_pre", "blocks.7.hook_resid_post"])
    assert torch.allclose(acts[0, :2], cache["blocks.0.hook_resid_pre"], atol=1e-5)
    assert torch.allclose(acts[8, :2], cache["blocks.7.hook_resid_post"], atol=1e-5)
    raptor = Raptor(RaptorConfig.from_phases(PLANTED, d_model=64, n_heads=4))
    y = np.arange(24) % 2
    fit = evaluate_raptor(raptor, acts[:, :12], y[:12], acts[:, 12:], y[12:], final_norm=planted.apply_ln_final)
    assert fit.r2.shape == (8,) and fit.r2_pooled.shape == (8,)
    # pooled R² by hand for the first layer
    with torch.no_grad():
        roll = raptor(acts[0, 12:])
    yv = acts[1, 12:].double().reshape(-1, 64)
    sse = ((roll[0].double().reshape(-1, 64) - yv) ** 2).sum()
    assert fit.r2_pooled[0].item() == pytest.approx(float(1 - sse / ((yv - yv.mean(0)) ** 2).sum()), rel=1e-4)
    assert 0.0 <= fit.probe_acc_teacher <= 1.0
    assert set(fit.to_frame().columns) == {"name", "layer", "r2", "r2_official"}
    # the official R² per layer (layer_r2_official, one batch here) and its last entry: what the official trainer logs
    assert fit.r2_official.shape == (8,)
    from interp.dynamics.raptor import r2_score_official
    assert fit.end_r2_official == pytest.approx(r2_score_official(roll[-1], acts[8, 12:]), rel=1e-4)
    assert fit.mean_r2_official == pytest.approx(float(fit.r2_official.mean()))


def test_audit_check_on_a_tiny_vit(planted, tmp_path):
    from interp.apps.audit import AuditData
    from interp.dynamics.raptor.audit_check import RaptorCheck, RaptorCheckConfig
    with pytest.raises(ValueError, match="raptor.n_images"):
        RaptorCheckConfig(n_images=0)
    check = RaptorCheck(RaptorCheckConfig(n_images=12, image_size=32))
    res = check.run(planted, AuditData.builtin())
    assert res.distances.cosine.shape == (8, 8)
    assert "dp/k=2" in res.phases and res.fit is None
    rendered = check.render(res)
    assert len(rendered.figures) == 2 and "speed jumps" in rendered.html.lower()
    # the report writes the check's result (nested results: distances, trajectories) and reads it back
    from interp.dynamics.raptor.audit_check import RaptorCheckResult
    back = RaptorCheckResult.load(res.save(tmp_path / "raptor"))
    assert torch.equal(back.distances.cosine, res.distances.cosine) and back.phases == res.phases
    assert torch.equal(back.trajectories.speed["cls"], res.trajectories.speed["cls"])
    assert back.trajectories.to_frame().equals(res.trajectories.to_frame())
    assert check.to_json(res)["schema"] == "interp.checks.raptor/1"
    # with a (one-step) Raptor fit: the official R² is reported beside ours, and survives the save / load round trip
    fitted = RaptorCheck(RaptorCheckConfig(n_images=12, image_size=32, fit=True, steps=1, batch_size=4))
    res = fitted.run(planted, AuditData.builtin())
    summ = fitted.summary(res)
    assert summ["Raptor R² official (last layer)"] == res.fit.end_r2_official
    assert summ["Raptor mean R² (ours, per feature)"] == res.fit.mean_r2
    assert "official definition" in fitted.render(res).html
    back = RaptorCheckResult.load(res.save(tmp_path / "raptor_fit"))
    assert torch.equal(back.fit.r2_official, res.fit.r2_official)


# ------------------------------------------------------------------------------------ data and recipe plumbing
def test_digits_images_in_interp_data():
    """interp.data.digits_images: the 1,797 sklearn digits, raw in [0, 1] at 8 px, grey replicated and
    ImageNet-normalised at other sizes; bad arguments are refused."""
    from interp.data import digits_images
    from interp.data.digits import IMAGENET_MEAN, IMAGENET_STD
    raw, y = digits_images(8, channels=1, normalize=False)
    assert raw.shape == (1797, 1, 8, 8) and raw.dtype == torch.float32 and y.shape == (1797,)
    assert float(raw.min()) == 0.0 and float(raw.max()) == 1.0 and set(y.tolist()) == set(range(10))
    x, y2 = digits_images(16)
    assert x.shape == (1797, 3, 16, 16) and np.array_equal(y, y2)
    grey = x * IMAGENET_STD + IMAGENET_MEAN                     # undo the normalisation: the channels agree
    assert torch.allclose(grey[:, 0], grey[:, 1], atol=1e-5) and torch.allclose(grey[:, 0], grey[:, 2], atol=1e-5)
    up = torch.nn.functional.interpolate(raw[:3], size=(16, 16), mode="bilinear", align_corners=False)
    assert torch.allclose(grey[:3, :1], up, atol=1e-5)
    with pytest.raises(ValueError, match="channels"):
        digits_images(8, channels=2)
    with pytest.raises(ValueError, match="normalisation"):
        digits_images(8, channels=1)
    with pytest.raises(ValueError, match="size"):
        digits_images(0)


def test_real_image_split_teacher_and_probe_baselines(planted):
    from interp.benchmarks.raptor.experiments import (DigitsConfig, digits_teacher_model, probe_baselines,
                                                      real_image_split, train_digits_teacher)
    from interp.data import digits_images
    from interp.dynamics.raptor import linear_probe_accuracy, probe_features, teacher_activations
    from interp.models.misd import has_fashion_mnist
    name, xtr, ytr, xte, yte = real_image_split("digits", n_train=7, n_test=5, size=28)
    assert name == "digits" and xtr.shape == (7, 3, 28, 28) and xte.shape == (5, 3, 28, 28)
    x, y = digits_images(28)
    perm = np.random.default_rng(0).permutation(len(y))
    assert torch.equal(xtr, x[perm[:7]]) and np.array_equal(yte, y[perm[7:12]])
    if has_fashion_mnist():
        from interp.benchmarks.raptor.experiments import fashion_mnist_images
        name, xtr, ytr, xte, yte = real_image_split("auto", n_train=6, n_test=4, size=56)
        assert name == "fashion-mnist" and xtr.shape == (6, 3, 56, 56) and set(ytr) <= set(range(10))
        raw, _ = fashion_mnist_images("t10k", 4, size=28)
        # grey replicated over the channels, then the ImageNet normalisation per channel
        assert torch.allclose(raw[:, 0] * 0.229 + 0.485, raw[:, 1] * 0.224 + 0.456, atol=1e-5)
    with pytest.raises(ValueError, match="dataset"):
        real_image_split("cifar")
    # a digits teacher is a plain state dict (the recipe stores it as a stage); the same config trains the same weights
    cfg = DigitsConfig(n_layers=4, d_model=16, n_heads=2, epochs=1, n_train=64)
    a, b = train_digits_teacher(cfg, 0.0), train_digits_teacher(cfg, 0.0)
    assert all(torch.equal(v, b[k]) for k, v in a.items())
    assert digits_teacher_model(cfg, 0.0, a).config.num_hidden_layers == 4
    with pytest.raises(ValueError, match="n_layers"):
        DigitsConfig(n_layers=3)
    # probe baselines: the probe of evaluate_raptor on the block input, block 0's output and the last layer
    imgs = torch.randn(40, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    labels = (imgs[:, 0].mean((1, 2)) > 0).long().numpy()
    acts = teacher_activations(planted, imgs, batch_size=20)
    base = probe_baselines(acts[:, :24], labels[:24], acts[:, 24:], labels[24:], planted.apply_ln_final)
    f = lambda t: probe_features(t, planted.apply_ln_final).numpy()  # noqa: E731
    assert base["probe_acc_block0"] == linear_probe_accuracy(f(acts[1, :24]), labels[:24], f(acts[1, 24:]), labels[24:])
    assert base["probe_acc_last"] == linear_probe_accuracy(f(acts[-1, :24]), labels[:24], f(acts[-1, 24:]), labels[24:])
    assert set(base) == {"probe_acc_input", "probe_acc_block0", "probe_acc_last"}


def test_recipe_config_refuses_bad_values():
    from interp.benchmarks.raptor import RaptorRecipeConfig
    with pytest.raises(ValueError, match="distinct"):
        RaptorRecipeConfig(p_drops=(0.0,))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        RaptorRecipeConfig(p_drops=(0.0, 1.0))
