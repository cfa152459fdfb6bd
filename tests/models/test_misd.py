"""Tests for models.misd (confidence recalibration for misclassification detection) and its reproduction's stand-in
VLMs (interp.benchmarks.misd: the toy digits MLP, the DINOv2 + MiniLM zero-shot classifier). The digest's criteria
on the full runs are the recipe's claims (benchmarks/misd/claims.yaml), checked by tests/reproduce."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from interp.benchmarks.misd.toy import MisDToyResult, ToyMisDConfig, toy_experiment, train_toy_classifier
from interp.benchmarks.misd.zero_shot import (
    ZeroShotConfig, fit_projection, load_fashion_mnist, load_image_set, unseen_accuracy, zero_shot_experiment,
    zero_shot_from_features, zero_shot_logits,
)
from interp.models.misd import (
    LMN, LMNConfig, MisDTable, aurc, auroc, evaluate, fit_lmn, fit_temperature, fpr_at_tpr_errors, misd_metrics, psi,
    surrogate_loss,
)


def test_psi_unit_values_and_limits():
    s = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    assert torch.allclose(psi(s), s, atol=1e-12)
    grid = torch.linspace(0, 1, 101, dtype=torch.float64)
    assert torch.allclose(psi(grid, lam=100.0), grid, atol=1e-5)      # λ → ∞: the diagonal
    step = psi(grid, lam=1e-3)
    assert (step[grid < 0.45] < 1e-6).all() and (step[grid > 0.55] > 1 - 1e-6).all()  # λ → 0: a step
    # hand value: λ = 0.05, s = 0.6 -> (σ(2) − σ(−10)) / (σ(10) − σ(−10))
    sig = lambda x: 1 / (1 + np.exp(-x))
    assert float(psi(0.6)) == pytest.approx((sig(2) - sig(-10)) / (sig(10) - sig(-10)), rel=1e-10)
    assert (psi(grid)[grid > 0.5] >= grid[grid > 0.5]).all()          # sharper than the diagonal above 0.5
    with pytest.raises(ValueError, match="lam"):
        psi(0.3, lam=0)


def test_metrics_against_hand_and_sklearn():
    conf = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    correct = np.array([1, 1, 0, 1, 0, 0], dtype=bool)
    assert auroc(conf, correct) == pytest.approx(roc_auc_score(correct, conf))
    assert auroc(conf, correct) == pytest.approx(8 / 9)
    # errors at conf 0.7, 0.5, 0.4: flagging 90 % of 3 needs all 3 -> threshold 0.7 flags correct 0.6: 1/3
    assert fpr_at_tpr_errors(conf, correct) == pytest.approx(1 / 3)
    # risks at coverage 1..6: 0, 0, 1/3, 1/4, 2/5, 3/6
    assert aurc(conf, correct) == pytest.approx(np.mean([0, 0, 1 / 3, 1 / 4, 2 / 5, 3 / 6]))
    with pytest.raises(ValueError, match="both correct and wrong"):
        auroc(conf, np.ones(6, bool))


def _toy_outputs(n=200, C=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, C, generator=g) * 3
    labels = torch.where(torch.rand(n, generator=g) < 0.7, logits.argmax(-1), torch.randint(0, C, (n,), generator=g))
    return logits, torch.randn(n, 7, generator=g), torch.randn(C, 6, generator=g), labels


def test_lmn_keeps_argmax_and_starts_at_unit_temperature():
    logits, emb, text, labels = _toy_outputs()
    net = LMN(5, 7, 6)
    assert torch.allclose(net.temperature(logits, emb, text), torch.ones(len(logits)), atol=2e-3)
    trained = fit_lmn(logits, emb, text, labels, LMNConfig(steps=50))
    with torch.no_grad():
        z = trained(logits, emb, text)
        tau = trained.temperature(logits, emb, text)
    assert (tau > 0).all() and tau.std() > 0                          # instance-wise, positive
    assert torch.equal(z.argmax(-1), logits.argmax(-1))               # argmax unchanged on 100 %
    with pytest.raises(ValueError, match="one text row per class"):
        net(logits, emb, text[:3])


def test_surrogate_loss_pushes_the_right_way():
    # a confident wrong sample: the loss decreases when its logits are flattened (τ smaller)
    z = torch.tensor([[4.0, 0.0, 0.0]])
    wrong, right = torch.tensor([1]), torch.tensor([0])
    assert surrogate_loss(0.5 * z, wrong) < surrogate_loss(z, wrong)
    # a low-confidence correct sample: the loss decreases when sharpened
    z = torch.tensor([[0.5, 0.0, 0.0]])
    assert surrogate_loss(3 * z, right) < surrogate_loss(z, right)
    # hand value, φ = sum, β = 0.6, one correct and one wrong sample
    z = torch.tensor([[1.0, 0.0], [2.0, 0.0]])
    y = torch.tensor([0, 1])
    p = z.softmax(-1)
    s = p.max(-1).values
    ce = -p[0, 0].log()
    kl = -np.log(2) - p[1].log().mean()
    want = 0.6 * (1 - psi(s[0])) * ce + 0.4 * psi(s[1]) * kl
    assert float(surrogate_loss(z, y)) == pytest.approx(float(want), rel=1e-6)
    assert float(surrogate_loss(z, y, fusion="product")) == pytest.approx(float((1 - psi(s[0])) * ce * psi(s[1]) * kl), rel=1e-6)


def test_temperature_scaling_recovers_a_known_temperature():
    g = torch.Generator().manual_seed(1)
    true = torch.randn(4000, 4, generator=g) * 2
    labels = torch.distributions.Categorical(logits=true).sample()
    T = fit_temperature(true * 3.0, labels)     # logits 3x too sharp -> T ≈ 3
    assert T == pytest.approx(3.0, rel=0.1)


def test_config_validation():
    with pytest.raises(ValueError, match="beta"):
        LMNConfig(beta=1.5)
    with pytest.raises(ValueError, match="fusion"):
        LMNConfig(fusion="max")
    with pytest.raises(ValueError, match="shots"):
        ToyMisDConfig(shots=0)


def test_toy_pipeline_one_seed(tmp_path):
    cfg = ToyMisDConfig(seeds=(0,), lmn=LMNConfig(steps=100))
    clf = train_toy_classifier(cfg, 0)
    assert len(clf.cal[2]) == 160 and torch.bincount(clf.cal[2]).eq(16).all()
    table = evaluate(clf.cal, clf.test, clf.text_emb, cfg.lmn)
    assert isinstance(table, MisDTable) and table.argmax_unchanged == 1.0
    accs = {m["accuracy"] for m in table.metrics.values()}
    assert len(accs) == 1 and 0.7 < accs.pop() < 0.95                # under-trained, accuracy unchanged
    assert set(table.to_frame()["method"]) == {"msp", "temperature", "lmn_ce", "lmn"}
    table.figure()
    table.save(tmp_path / "t")
    # the recipe's toy unit is the same pipeline: one seed of toy_experiment gives the same table
    res = toy_experiment(cfg)
    assert isinstance(res, MisDToyResult) and res.argmax_unchanged == [1.0]
    assert res.tables[0]["msp"] == pytest.approx(misd_metrics(clf.test[0], clf.test[2]))
    assert res.gain().shape == (1,) and len(res.to_frame()) == 4


def test_image_sets():
    xtr, ytr, xte, yte, names = load_image_set("digits", n_train=100, n_test=50)
    assert xtr.shape == (1000, 8, 8) and xtr.dtype == np.uint8 and xtr.max() == 255 and len(names) == 10
    assert np.bincount(ytr).tolist() == [100] * 10 and np.bincount(yte).tolist() == [50] * 10
    with pytest.raises(ValueError, match="split"):
        load_fashion_mnist("val")
    with pytest.raises(ValueError, match="name"):
        load_image_set("cifar")


def test_projection_aligns_synthetic_pairs_and_generalises():
    # image features = a fixed linear map of the class text feature + noise: the contrastive projection trained
    # on 7 classes must classify the 3 unseen classes by their text features above chance
    g = torch.Generator().manual_seed(0)
    txt = torch.randn(10, 20, generator=g)
    A = torch.randn(20, 30, generator=g)
    y = torch.arange(7).repeat_interleave(40)
    img = txt[y] @ A + 0.3 * torch.randn(len(y), 30, generator=g)
    p_i, p_t, _ = fit_projection(img, txt, y, dim=16, steps=200)
    yu = torch.tensor([7, 8, 9]).repeat_interleave(30)
    imgu = txt[yu] @ A + 0.3 * torch.randn(len(yu), 30, generator=g)
    with torch.no_grad():
        s = F.normalize(p_i(imgu), dim=-1) @ F.normalize(p_t(txt[7:]), dim=-1).T
    assert (s.argmax(-1) + 7 == yu).double().mean() > 0.6


def _synthetic_bank(seed=0, n_templates=3, d_txt=20, d_img=30, n_per=40):
    # caption embedding = class direction + template offset + small noise; image = class direction @ A + noise
    g = torch.Generator().manual_seed(seed)
    cls, tmpl = torch.randn(10, d_txt, generator=g), 3 * torch.randn(n_templates, 1, d_txt, generator=g)
    bank = F.normalize(cls[None] + tmpl + 0.1 * torch.randn(n_templates, 10, d_txt, generator=g), dim=-1)
    A = torch.randn(d_txt, d_img, generator=g)
    y = torch.arange(10).repeat_interleave(n_per)
    img = cls[y] @ A + 0.3 * torch.randn(len(y), d_img, generator=g)
    return bank, img, y


@pytest.mark.parametrize("cfg", [
    ZeroShotConfig(text_map="fixed", templates=("{}", "a {}", "the {}"), center_text=True, temperature=0.1, steps=200),
    ZeroShotConfig(text_map="fixed", templates=("{}", "a {}", "the {}"), per_template_anchors=True, rank=8, steps=200),
    ZeroShotConfig(text_map="fixed", templates=("{}", "a {}", "the {}"), orth=1.0, weight_decay=0.1, steps=200),
    ZeroShotConfig(templates=("{}", "a {}", "the {}"), dim=16, steps=200)])
def test_zero_shot_alignment_options_generalise_on_synthetic_features(cfg):
    bank, img, y = _synthetic_bank()
    if cfg.center_text:
        bank = bank - bank.mean(1, keepdim=True)
        assert bank.mean(1).abs().max() < 1e-6
    seen, unseen = list(range(7)), [7, 8, 9]
    tr = torch.isin(y, torch.tensor(seen)) & (torch.arange(len(y)) % 2 == 0)
    te = torch.arange(len(y)) % 2 == 1
    logits, emb, temb = zero_shot_logits(img[tr], y[tr], img[te], bank, seen, cfg, seed=0)
    assert logits.shape == (int(te.sum()), 10) and temb.shape[0] == 10
    assert torch.allclose(emb.norm(dim=-1), torch.ones(len(emb)), atol=1e-5)
    assert unseen_accuracy(logits, y[te], unseen) > 0.6          # chance 1/3
    # hand check of unseen_accuracy: only the unseen rows count, choosing among the unseen columns
    lg = torch.tensor([[9.0, 0, 1, 0], [9.0, 0, 0, 1], [0, 9.0, 0, 0]])
    assert unseen_accuracy(lg, torch.tensor([2, 2, 1]), [2, 3]) == 0.5


def test_zero_shot_config_validation_and_from_features_table():
    with pytest.raises(ValueError, match="templates"):
        ZeroShotConfig(templates=("no slot",))
    with pytest.raises(ValueError, match="rank"):
        ZeroShotConfig(rank=4)                                      # low rank needs the fixed text space
    bank, img, y = _synthetic_bank(1)
    r = zero_shot_from_features(img[::2], y[::2].numpy(), img[1::2], y[1::2].numpy(), bank, unseen=(7, 8, 9), shots=4,
                                lmn=LMNConfig(steps=20), config=ZeroShotConfig(text_map="fixed", steps=100))
    assert r.argmax_unchanged == 1.0 and r.seen_classes == list(range(7)) and set(r.table) >= {"msp", "lmn"}


from interp.benchmarks.misd.zero_shot import FASHION_MNIST_ROOT, has_fashion_mnist  # noqa: E402

needs_fashion = pytest.mark.skipif(
    not has_fashion_mnist(),
    reason=f"Fashion-MNIST absent ({FASHION_MNIST_ROOT}: Debian package dataset-fashion-mnist, installed by scripts/setup.sh as root)")


@needs_fashion
def test_fashion_mnist_idx_reader():
    x, y = load_fashion_mnist("t10k", limit=50)
    assert x.shape == (50, 28, 28) and x.dtype == np.uint8 and y.shape == (50,) and set(y.tolist()) <= set(range(10))
    # known first labels of the t10k split (ankle boot, pullover, trouser, trouser, shirt) and header-free pixels
    assert y[:5].tolist() == [9, 2, 1, 1, 6] and x[0, 0, 0] == 0 and x.max() > 200
    x2, y2 = load_fashion_mnist("t10k", limit=50)
    assert x2 is x and not x.flags.writeable                       # memoised, read-only


@pytest.mark.slow
@needs_fashion
@pytest.mark.xfail(raises=AssertionError, strict=True, reason=(
    "Measured 2026-12-01, 5 seeds, the original recipe (ZeroShotConfig(): two learned linear maps into a 128-d "
    "space, the dataset's class names in 'a photo of a {}'; projection trained on 7 Fashion-MNIST classes, 100 "
    "images each; unseen trouser, sandal, bag): held-out accuracy 0.281, 0.268, 0.281, 0.368, 0.250 (mean 0.289, "
    "chance 0.333). Prompt ensembles (0.289), a map into the frozen MiniLM space (0.282), caption centring, "
    "T = 0.07, weight decay, rank 8/32 and orthogonality penalties (0.148-0.318) do not fix it: MiniLM puts "
    "'sandal' nearest 'shirt'/'bag' and 'trouser' nearest 'ankle boot', so the text geometry of the held-out "
    "classes disagrees with the image geometry. Descriptive names (FASHION_ZERO_SHOT) do transfer: 0.611."))
def test_zero_shot_fashion_mnist_unseen_above_chance(tmp_path, monkeypatch):
    import interp

    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path / "cache"))
    im, tm = interp.load("zoo:dinov2-s14", backend="torch"), interp.load("zoo:minilm-l6", backend="torch")
    r = zero_shot_experiment(im, tm, dataset="fashion-mnist")
    assert r.unseen_accuracy > 1 / 3   # same criterion as the digits run (which passes: 0.398)
