"""Reverse distillation of protein language models (Catrina et al., ICLR 2026): the method
(interp.models.reverse_distillation), its zoo family and its validations (interp.benchmarks.reverse_distillation)."""
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from interp.benchmarks.reverse_distillation import (ProteinRDConfig, ProteinRDResult, SyntheticConfig,
                                                    SyntheticResult, protein_experiment, synthetic_experiment)
from interp.models.reverse_distillation import (FAMILY, TASKS, TOY_FAMILY, NaiveScaler, RDChain, RDScaler,
                                                ReverseDistilledFamily, ScalerConfig, embed_residues,
                                                estimate_noise_variance, exactness, fit_linear_map, fit_pcr,
                                                hmm_domain_labels, johnstone_threshold, load_plm, load_proteins,
                                                probe_score, reconstruction_r2, residue_tasks, sequence_tasks,
                                                split_proteins, window_mean)


# ------------------------------------------------------------------------------------------ fixtures
def _orthonormal_centred(n: int, k: int, seed: int = 0) -> np.ndarray:
    """``[n, k]`` orthonormal columns, each orthogonal to the all-ones vector (so centred)."""
    rng = np.random.default_rng(seed)
    a = np.concatenate([np.ones((n, 1)), rng.standard_normal((n, k))], 1)
    q, _ = np.linalg.qr(a)
    return q[:, 1:]


@pytest.fixture(scope="module")
def family3():
    """Three nested 'models' (widths 6 / 10 / 16) with non-unit scales and shared + new factors."""
    g = torch.Generator().manual_seed(1)
    n = 1500
    f = torch.randn(n, 12, generator=g, dtype=torch.float64)
    scales = torch.linspace(0.5, 3.0, 16, dtype=torch.float64)
    h0 = torch.tanh(f[:, :4] @ torch.randn(4, 6, generator=g, dtype=torch.float64)) * scales[:6]
    h1 = torch.tanh(f[:, :8] @ torch.randn(8, 10, generator=g, dtype=torch.float64)) * scales[:10]
    h2 = torch.tanh(f @ torch.randn(12, 16, generator=g, dtype=torch.float64)) * scales
    noise = [0.05 * torch.randn(n, h.shape[1], generator=g, dtype=torch.float64) for h in (h0, h1, h2)]
    return [(h + e).float() for h, e in zip((h0, h1, h2), noise)]


@pytest.fixture(scope="module")
def toy_models():
    from interp import zoo

    return [zoo.path(name) for name in TOY_FAMILY]


# ------------------------------------------------------------------------------------------ PCR by hand
def test_johnstone_pcr_hand_computation():
    n, p = 5, 3
    u = _orthonormal_centred(n, p)
    eig = np.array([16.0, 1.0, 0.81])                       # S^2 / (n - 1)
    x = (u * np.sqrt(eig * (n - 1))) @ np.eye(p)[[2, 0, 1]] + np.array([1.0, -2.0, 3.0])
    # eig / mean = [2.695, 0.168, 0.136] < (1 + sqrt(3/5))^2 = 3.149 -> all are "noise"; median = 1.0
    assert estimate_noise_variance(torch.tensor(eig), n, p) == pytest.approx(1.0)
    thr = johnstone_threshold(n, p, 1.0)
    assert thr == pytest.approx((1 + math.sqrt(0.6)) ** 2)
    y = np.stack([x[:, 2] * 2.0 + 1.0, x[:, 0] - x[:, 1]], 1)
    fit = fit_pcr(torch.tensor(x), torch.tensor(y))
    assert fit.n_components == 1 and fit.sigma_sq == pytest.approx(1.0) and fit.threshold == pytest.approx(thr)
    assert fit.eigenvalues.numpy() == pytest.approx(eig)
    # by hand: only the top PC (x's third column, variance 16) is kept; OLS of y on its score
    score = x[:, 2] - x[:, 2].mean()
    coef = (score @ (y - y.mean(0))) / (score @ score)
    pred = y.mean(0) + score[:, None] * coef[None, :]
    assert fit(torch.tensor(x)).numpy() == pytest.approx(pred, abs=1e-10)
    assert coef[0] == pytest.approx(2.0)


def test_pcr_variance_fallback_and_sklearn_agreement():
    n, p = 6, 3
    u = _orthonormal_centred(n, p, seed=3)
    x = u * np.sqrt(2.0 * (n - 1))                           # all eigenvalues 2: none passes the threshold
    y = np.random.default_rng(0).standard_normal((n, 2))
    fit = fit_pcr(torch.tensor(x), torch.tensor(y))
    assert fit.n_components == 3                             # cumvar 1/3, 2/3, 1 -> 95 % needs all three
    assert fit_pcr(torch.tensor(x), torch.tensor(y), min_variance_explained=0.5).n_components == 2
    # on generic data PCR == sklearn LinearRegression on the retained PC scores (the code's recipe)
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 8)) @ np.diag([5, 4, 3, 1, 0.1, 0.1, 0.1, 0.1]) + 2.0
    y = x @ rng.standard_normal((8, 4)) + 0.1 * rng.standard_normal((200, 4))
    fit = fit_pcr(torch.tensor(x), torch.tensor(y))
    xc = x - x.mean(0)
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    scores = xc @ vt[: fit.n_components].T
    ref = LinearRegression().fit(scores, y).predict(scores)
    assert 1 <= fit.n_components < 8
    assert fit(torch.tensor(x)).numpy() == pytest.approx(ref, abs=1e-8)


def test_linear_and_ridge_match_sklearn():
    from sklearn.linear_model import LinearRegression, Ridge

    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((50, 5)) * [1, 2, 3, 4, 5] + 1.0, rng.standard_normal((50, 3))
    lin = fit_linear_map(torch.tensor(x), torch.tensor(y), "linear")
    assert lin(torch.tensor(x)).numpy() == pytest.approx(LinearRegression().fit(x, y).predict(x), abs=1e-10)
    rid = fit_linear_map(torch.tensor(x), torch.tensor(y), "ridge", ridge_alpha=7.0)
    assert rid(torch.tensor(x)).numpy() == pytest.approx(Ridge(alpha=7.0).fit(x, y).predict(x), abs=1e-10)


# ------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("regressor", ["linear", "ridge", "pcr"])
def test_rd_step_exactness(family3, regressor):
    h_r, h_p = family3[0], family3[2]
    scaler = RDScaler.fit(h_r, h_p, ScalerConfig(regressor=regressor))
    out = scaler.transform(h_r, h_p)
    assert out.shape == (h_r.shape[0], 16) and out.dtype == h_r.dtype
    assert torch.equal(out[:, :6], h_r)                      # Matryoshka prefix, bit for bit
    ex = exactness(scaler, h_r, h_p)
    assert ex["prefix_exact"] and ex["beats_random"]
    assert ex["r2_rd"] > ex["r2_random_max"] + 1e-3
    if regressor == "linear":
        assert ex["max_abs_corr_input"] < 1e-6
    if regressor == "pcr":
        assert ex["max_abs_corr_retained"] < 1e-6
        if scaler.regression.n_components < 6:               # dropped PCs: residual still correlates with them
            assert ex["max_abs_corr_input"] > 1e-4
    if regressor == "ridge":
        assert ex["max_abs_corr_input"] > 1e-8               # ridge shrinks: not exactly orthogonal


def test_eckart_young_value(family3):
    """With OLS, the reconstruction error of H_p from [H_r, H_res] is exactly the variance the discarded residual
    directions carry (Thm 1)."""
    h_r, h_p = family3[0].double(), family3[2].double()
    scaler = RDScaler.fit(h_r, h_p, ScalerConfig(regressor="linear"))
    resid = h_p - scaler.regression(h_r)
    eig = torch.linalg.svdvals(resid - resid.mean(0)) ** 2
    total = ((h_p - h_p.mean(0)) ** 2).sum()
    expected = 1 - eig[10:].sum() / total
    assert reconstruction_r2(h_p, scaler.transform(h_r, h_p)) == pytest.approx(float(expected), abs=1e-9)


# ------------------------------------------------------------------------------------------ chains
def test_chain_accumulated_variant(family3):
    chain = RDChain.fit(family3, ScalerConfig(regressor="linear"))
    levels = chain.transform(family3)
    assert [lv.shape[1] for lv in levels] == [6, 10, 16]
    assert levels[0] is family3[0]
    assert torch.equal(levels[1][:, :6], family3[0]) and torch.equal(levels[2][:, :10], levels[1])
    # step 2 was fitted on the accumulated 10-d embedding: its residual is uncorrelated with all of it
    ex = exactness(chain.scalers[1], levels[1], family3[2])
    assert ex["max_abs_corr_input"] < 1e-6
    assert torch.allclose(chain.scalers[1].regression.weight,
                          fit_linear_map(levels[1], family3[2]).weight, atol=1e-8)


def test_chain_code_variant(family3):
    acc = RDChain.fit(family3, ScalerConfig(regressor="linear"))
    code = RDChain.fit(family3, ScalerConfig(regressor="linear", variant="code"))
    # the first step is the same; the second is fitted on the raw 10-d model, as scripts/train.py does
    assert torch.equal(code.scalers[0].regression.weight, acc.scalers[0].regression.weight)
    assert torch.allclose(code.scalers[1].regression.weight, fit_linear_map(family3[1], family3[2]).weight, atol=1e-8)
    assert not torch.allclose(code.scalers[1].regression.weight, acc.scalers[1].regression.weight, atol=1e-3)
    levels = code.transform(family3)                     # ... but applied to the accumulated one (RDESM.forward)
    assert torch.equal(levels[2][:, :10], levels[1]) and torch.equal(levels[1][:, :6], family3[0])
    ex = exactness(code.scalers[1], levels[1], family3[2])
    assert ex["max_abs_corr_input"] > 1e-3              # the mismatch: residual no longer orthogonal to its input
    assert reconstruction_r2(family3[2], levels[2]) <= reconstruction_r2(family3[2], acc.transform(family3)[2]) + 1e-12


def test_naive_baseline_is_pca_of_concatenation(family3):
    from sklearn.decomposition import PCA

    h_r, h_p = family3[0], family3[1]
    naive = NaiveScaler.fit(h_r, h_p)
    out = naive.transform(h_r, h_p).double()
    both = torch.cat([h_r, h_p], 1).double().numpy()
    ref = PCA(n_components=10, svd_solver="full").fit_transform(both)
    assert np.abs(out.numpy()) == pytest.approx(np.abs(ref), abs=1e-4)
    chain = RDChain.fit(family3, ScalerConfig(kind="naive"))
    assert [lv.shape[1] for lv in chain.transform(family3)] == [6, 10, 16]


def test_residual_pca_with_fewer_rows_than_directions():
    from interp.models.reverse_distillation import fit_residual_pca

    r = torch.randn(3, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    pca = fit_residual_pca(r, 5)                          # rank 2 after centring: 3 directions complete the basis
    assert torch.allclose(pca.components.T @ pca.components, torch.eye(5, dtype=torch.float64), atol=1e-10)
    assert (pca.explained_variance[2:] < 1e-20).all() and (pca.explained_variance[:2] > 1e-3).all()
    scores = pca.transform(r)
    assert torch.allclose(scores[:, 2:], torch.zeros(3, 3, dtype=torch.float64), atol=1e-10)


def test_save_load_roundtrip(family3, tmp_path):
    for cfg in (ScalerConfig(), ScalerConfig(kind="naive"), ScalerConfig(regressor="ridge", variant="code")):
        chain = RDChain.fit(family3, cfg)
        chain.save(tmp_path / cfg.kind / cfg.regressor)
        loaded = RDChain.load(tmp_path / cfg.kind / cfg.regressor)
        assert loaded.config == cfg and loaded.widths == chain.widths
        new = [h[:100] + 0.01 for h in family3]          # new inputs
        for a, b in zip(chain.transform(new), loaded.transform(new)):
            assert torch.equal(a, b)
    assert (tmp_path / "rd" / "pcr" / "scalers.safetensors").is_file()
    with pytest.raises(FileNotFoundError):
        RDChain.load(tmp_path / "missing")


def test_bad_inputs(family3):
    with pytest.raises(ValueError, match="regressor"):
        ScalerConfig(regressor="lasso")
    with pytest.raises(ValueError, match="variant"):
        ScalerConfig(variant="raw")
    with pytest.raises(ValueError, match="ridge_alpha"):
        ScalerConfig(ridge_alpha=0)
    with pytest.raises(ValueError, match="wider"):
        RDScaler.fit(family3[1], family3[0])
    with pytest.raises(ValueError, match="same rows"):
        RDScaler.fit(family3[0][:10], family3[1][:11])
    bad = family3[0].clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        RDScaler.fit(bad, family3[1])
    with pytest.raises(ValueError, match="increase"):
        RDChain.fit([family3[0], family3[2], family3[1]])
    scaler = RDScaler.fit(family3[0], family3[1])
    with pytest.raises(ValueError, match="maps width"):
        scaler.transform(family3[0], family3[2])
    with pytest.raises(ValueError, match="n_tasks"):
        SyntheticConfig(n_tasks=0)
    with pytest.raises(ValueError, match="kind"):
        probe_score(np.zeros((3, 2)), np.arange(3), np.zeros((3, 2)), np.arange(3), kind="f1")


# ------------------------------------------------------------------------------------------ probes
def test_probe_score_recovers_linear_signal():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 10)) * np.arange(1, 11)
    w = rng.standard_normal(10)
    y = x @ w
    assert probe_score(x[:100], y[:100], x[100:], y[100:]) > 0.99
    assert abs(probe_score(x[:100], rng.standard_normal(100), x[100:], y[100:])) < 0.2
    yb = (y > 0).astype(float)
    assert probe_score(x[:100], yb[:100], x[100:], yb[100:], kind="binary") > 0.95
    multi = probe_score(x[:100], np.stack([y, -y], 1)[:100], x[100:], np.stack([y, -y], 1)[100:])
    assert multi.shape == (2,) and (multi > 0.99).all()


# ------------------------------------------------------------------------------------------ data and tasks
def test_proteins_split_and_tasks():
    prot = load_proteins()
    assert len(prot) == 2100 and prot.n_residues > 600_000
    assert set("".join(prot.sequences[:50])) <= set("ACDEFGHIKLMNPQRSTVWYX")
    train, held = split_proteins(prot)
    assert len(train) + len(held) == 2100 and not set(train.ids) & set(held.ids)
    assert window_mean(np.array([1.0, 2.0, 3.0, 4.0]), 3) == pytest.approx([1.5, 2.0, 3.0, 3.5])
    seq = "D" * 10 + "L" * 19 + "K" * 10                  # one hydrophobic 19-mer (KD 3.8 >= 1.6)
    tasks = residue_tasks([seq])
    tm = tasks["tm_segment"][0]
    assert tm[10:29].all() and tm.sum() < 39 and not tm[:5].any() and not tm[-5:].any()
    assert tasks["charge_w9"][0][0] == pytest.approx(-1.0) and tasks["charge_w9"][0][-1] == pytest.approx(1.0)
    seqs = sequence_tasks(prot.subset([0, 1, 2]))
    assert seqs["gc_content"] == pytest.approx(prot.gc_content[:3])
    assert seqs["log_length"] == pytest.approx(np.log([len(s) for s in prot.sequences[:3]]))
    assert set(tasks) | set(seqs) | {"hmm_domain"} == set(TASKS)


def test_hmm_domain_labels():
    prot = load_proteins()
    labels = hmm_domain_labels(prot)
    hits = [i for i, lab in enumerate(labels) if lab is not None]
    assert 10 <= len(hits) <= 40                          # KR, 2-Hacid_dh_C, ... hits in this proteome
    for i in hits:
        assert labels[i].shape == (len(prot.sequences[i]),) and 0 < labels[i].sum() <= len(prot.sequences[i])


# ------------------------------------------------------------------------------------------ models
def test_embed_residues_padded_batches_equal_single(toy_models):
    model = load_plm(toy_models[1])
    seqs = ["MKVLAAGIL", "MSTNPKPQRKTKRNTNRRPQDVKFPGG", "ACD"]
    batched = embed_residues(model, seqs, batch_size=3)
    single = [embed_residues(model, [s], batch_size=1)[0] for s in seqs]
    for s, b, one in zip(seqs, batched, single):
        assert b.shape == (len(s), 16)                   # BOS/EOS/padding excluded
        assert torch.allclose(b, one, atol=1e-5)
    with pytest.raises(ValueError):
        embed_residues(model, ["MK", ""])


def test_family_fit_save_apply_new_sequences(toy_models, tmp_path):
    prot = load_proteins()
    train, held = split_proteins(prot)
    fam = ReverseDistilledFamily.fit([str(p) for p in toy_models], train.sequences[:20])
    assert fam.chain.widths == (8, 16, 24)
    fam.save(tmp_path / "rd")
    loaded = ReverseDistilledFamily.load(tmp_path / "rd")
    new = held.sequences[:4]
    raw = loaded.raw(new)
    levels = loaded.embed(new)
    assert [lv[0].shape for lv in levels] == [(len(new[0]), 8), (len(new[0]), 16), (len(new[0]), 24)]
    for j in range(len(new)):
        assert torch.equal(levels[0][j], raw[0][j])
        assert torch.equal(levels[1][j][:, :8], raw[0][j]) and torch.equal(levels[2][j][:, :16], levels[1][j])
    ref = fam.chain.transform([torch.cat(r) for r in raw])
    assert torch.equal(torch.cat(levels[2]), ref[2])


# ------------------------------------------------------------------------------------------ experiments (toy)
def test_synthetic_experiment_toy(tmp_path):
    res = synthetic_experiment(SyntheticConfig(n_fit=1500, n_pool=300, n_test=500, n_tasks=6, n_repeats=1))
    assert isinstance(res, SyntheticResult)
    for key in ("prefix_exact", "pcr_residual_uncorrelated_with_retained_pcs", "ols_residual_uncorrelated",
                "reconstruction_beats_random"):
        assert res.checks[key], key
    frame = res.to_frame()
    assert len(frame) == 6 * len(res.scores) and {"raw.16", "rd.64", "rd_code.64", "naive.32"} <= set(res.scores)
    res.figure()
    back = SyntheticResult.load(res.save(tmp_path / "syn"))
    assert torch.equal(back.scores["rd.64"], res.scores["rd.64"])


def test_protein_experiment_toy(toy_models, tmp_path):
    res = protein_experiment(ProteinRDConfig(toy=True, n_fit_proteins=30, max_heldout_proteins=50, n_repeats=1,
                                             n_label_proteins=8, n_label_sequences=20, max_test_residues=2000))
    assert isinstance(res, ProteinRDResult) and res.widths == [8, 16, 24]
    assert set(res.scores) == set(TASKS)
    assert all(e["prefix_exact"] and e["max_abs_corr_retained"] < 1e-6 and e["beats_random"]
               for e in res.exactness.values())
    assert "rd.24 > raw.24" in res.comparisons and "rd.24 > rd.16" in res.comparisons
    assert 0.5 < res.scores["gravy"]["raw.24"] <= 1.0    # composition is linearly readable even from a toy model
    res.figure()
    back = ProteinRDResult.load(res.save(tmp_path / "prot"))
    assert back.comparisons == res.comparisons


# ------------------------------------------------------------------------------------------ slow validation
@pytest.mark.slow
def test_synthetic_exactness_and_raw_width_losing_full_scale():
    res = synthetic_experiment(SyntheticConfig())
    assert all(res.checks[k] for k in ("prefix_exact", "pcr_residual_uncorrelated_with_retained_pcs",
                                       "ols_residual_uncorrelated", "reconstruction_beats_random",
                                       "raw_width_can_lose"))
    assert res.summary["mean_scores"]["rd.64"] > res.summary["mean_scores"]["rd.32"] > res.summary["mean_scores"]["raw.16"]


# The digest's scaling criterion, the full protein family's exactness and the paper's rd > raw comparison are the
# claims of ``interp reproduce reverse_distillation`` (benchmarks/reverse_distillation/claims.yaml); the slow test
# of the recipes' full presets (tests/reproduce/) asserts the verdicts they expect.


# ------------------------------------------------------------------------------------------ zoo entries
def test_protein_zoo_entries_come_from_the_entry_point_only():
    """Nothing registers at import time: importing the package leaves the zoo registry without the protein
    entries until the registry loads its ``interp.zoo`` entry points, which provide all six."""
    code = ("import interp.models.reverse_distillation, interp.benchmarks.reverse_distillation\n"
            "from interp.zoo.registry import ZOO\n"
            "print(sorted(n for n in ZOO._items if n.startswith('protein-mlm')))\n"
            "from interp import zoo\n"
            "print(sorted(n for n in zoo.available() if n.startswith('protein-mlm')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", out
    assert out[1] == str(sorted(FAMILY + TOY_FAMILY)), out


def test_protein_zoo_cache_keys_are_kept():
    """The cache keys of the protein family (recipe hash without the package versions) are those of the entries
    as first declared: moving the declaration must not rebuild them."""
    from interp.configs import digest
    from interp.zoo.registry import recipe

    keys = {n: digest({k: v for k, v in recipe(n).items() if k != "packages"}) for n in FAMILY + TOY_FAMILY}
    assert keys == PINNED_KEYS


PINNED_KEYS = {"protein-mlm-32": "ab91ab0c1ceefafe", "protein-mlm-64": "2174d41e2d570f3d",
               "protein-mlm-128": "33ff9848a699ed1a", "protein-mlm-toy-8": "0deba6082ef4a0e1",
               "protein-mlm-toy-16": "705a3a5adeb6f5b6", "protein-mlm-toy-24": "1d85767c742568d1"}
