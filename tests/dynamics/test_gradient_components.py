"""Gradient decomposition (Rofin et al., Prop. 3.1) through the capture layer's gradient path."""
import pytest
import torch

import interp
from interp.dynamics.influence import (GradientDecomposition, decompose_gradient, myopic_attention,
                                       register_myopic_attention, stop_gradient_at)
from interp.testing import tiny_model


@pytest.fixture(scope="module")
def gpt2():
    hf, tok = tiny_model("gpt2", n_layers=3, perturb_norms=True)
    return hf.double(), tok


def _ids(vocab, shape=(3, 9), seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("site,pos", [("blocks.0.hook_resid_post", 2), ("blocks.1.hook_resid_post", 5),
                                      ("blocks.2.hook_resid_pre", 0), ("blocks.1.hook_resid_mid", 6)])
def test_parts_sum_to_full_gradient(gpt2, site, pos):
    hf, tok = gpt2
    model = interp.wrap(hf, tok, backend="torch")
    ids = _ids(model.cfg.d_vocab)
    dec = decompose_gradient(model, ids, site, pos, params=dict(hf.named_parameters()))
    assert dec.max_abs_error() < 1e-12
    # the full part is the ordinary gradient of the mean next-token loss
    hf.zero_grad()
    logits = hf(ids).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()
    for n, p in hf.named_parameters():
        torch.testing.assert_close(dec.full[n], p.grad)
    hf.zero_grad()
    # the position's own loss sends signal through the site: direct is non-zero; pre-cached non-zero
    # whenever later positions attend to it through a later layer
    assert dec.norm("direct") > 1e-3 and dec.norm("shared") > 1e-3
    assert dec.norm("precached") > 1e-4
    # parameters before the site only get direct/pre-cached signal through it: wte rows of tokens
    frame = dec.to_frame()
    assert set(frame.component) == {"direct", "precached", "shared", "full"}
    assert dec.figure().data


def test_last_layer_mid_has_no_precached(gpt2):
    """After the last attention no position reads another: pre-cached must be exactly zero."""
    hf, tok = gpt2
    model = interp.wrap(hf, tok, backend="torch")
    dec = decompose_gradient(model, _ids(model.cfg.d_vocab), "blocks.2.hook_resid_mid", 3,
                             params=dict(hf.named_parameters()))
    assert dec.norm("precached") < 1e-12 and dec.norm("direct") > 0


def test_padded_batch_and_other_backends():
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    ids = _ids(hf.config.vocab_size, (3, 8), seed=1)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0
    with pytest.raises(ValueError, match="real tokens"):  # padding at the position or its target is refused
        decompose_gradient(interp.wrap(hf, tok), ids, "blocks.1.hook_resid_post", 6, attention_mask=mask)
    ref = None
    for backend in ("torch", "nnsight", "transformer_lens"):
        model = interp.wrap(hf, tok, backend=backend)
        dec = decompose_gradient(model, ids, "blocks.1.hook_resid_post", 4, attention_mask=mask)
        assert dec.max_abs_error() < 1e-5, backend
        if ref is None:
            ref = dec
        elif backend == "nnsight":  # same HF parameters: the same decomposition
            for c in ("direct", "precached", "shared"):
                assert abs(dec.norm(c) - ref.norm(c)) < 1e-4 * max(ref.norm(c), 1e-3), (backend, c)
        else:  # the TL bridge holds its own parameterisation of the weights: compare the loss only
            assert abs(dec.loss - ref.loss) < 1e-5


def test_myopic_attention_removes_precached():
    hf, tok = tiny_model("gpt2", n_layers=3, perturb_norms=True)
    hf = hf.double()
    ids = _ids(hf.config.vocab_size)
    eager = hf(ids).logits.detach()
    hf.set_attn_implementation(register_myopic_attention())
    torch.testing.assert_close(hf(ids).logits, eager, rtol=0, atol=1e-12)  # same forward values
    model = interp.wrap(hf, tok, backend="torch")
    for site, pos in [("blocks.0.hook_resid_post", 3), ("blocks.1.hook_resid_pre", 1)]:
        dec = decompose_gradient(model, ids, site, pos, params=dict(hf.named_parameters()))
        assert dec.norm("precached") / dec.norm("full") < 1e-6
        assert dec.norm("direct") > 1e-3 and dec.max_abs_error() < 1e-12


def test_myopic_attention_gradients_by_hand():
    """Loss at the last query: gradient reaches only the diagonal key/value, not earlier ones."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.double, requires_grad=True) for _ in range(3))
    out, probs = myopic_attention(None, q, k, v, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, ref)
    out[:, -1].sum().backward()
    assert k.grad[:, :, :-1].abs().max() == 0 and v.grad[:, :, :-1].abs().max() == 0
    assert k.grad[:, :, -1].abs().max() > 0 and v.grad[:, :, -1].abs().max() > 0


def test_bad_inputs(gpt2):
    hf, tok = gpt2
    model = interp.wrap(hf, tok)
    ids = _ids(model.cfg.d_vocab)
    with pytest.raises(ValueError, match="position"):
        decompose_gradient(model, ids, "blocks.0.hook_resid_post", 8)
    with pytest.raises(ValueError, match="exactly one hook"):
        decompose_gradient(model, ids, "blocks.*.hook_resid_post", 1)
    with pytest.raises(ValueError, match="integer tensor"):
        decompose_gradient(model, ids.float(), "blocks.0.hook_resid_post", 1)
    with pytest.raises(KeyError):
        GradientDecomposition("s", 0, {}, {}, {}, {}, 0.0)["nope"]
    x = torch.randn(2, 5, 4, requires_grad=True)
    y = stop_gradient_at(-1)(x, None)
    y.sum().backward()
    assert x.grad[:, -1].abs().max() == 0 and x.grad[:, :-1].min() == 1


def test_last_loss_position_has_no_precached(gpt2):
    """Position S-2 is the last with a loss: no later loss can read it, so pre-cached is exactly zero."""
    hf, tok = gpt2
    model = interp.wrap(hf, tok, backend="torch")
    dec = decompose_gradient(model, _ids(model.cfg.d_vocab), "blocks.0.hook_resid_post", 7,
                             params=dict(hf.named_parameters()))
    assert dec.norm("precached") < 1e-12 and dec.norm("direct") > 0


def test_q_proxy(gpt2):
    from interp.dynamics import q_proxy
    hf, tok = gpt2
    model = interp.wrap(hf.float(), tok)
    ids = _ids(model.cfg.d_vocab, (3, 8))
    dirs = torch.randn(3, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    r = q_proxy(model, ids, "blocks.0.hook_resid_post", 3, dirs)
    assert r.kl.shape == (3, 8) and (r.kl[:, :3] == 0).all()           # earlier positions cannot see the edit
    assert (r.kl[:, 3:] > 0).all()
    torch.testing.assert_close(r.q, r.kl[:, 4:].sum(-1) / r.kl[:, 3])
    # after the last attention layer nothing reaches later positions: Q = 0
    late = q_proxy(model, ids, "blocks.2.hook_resid_mid", 3, dirs)
    assert late.q.abs().max() < 1e-6 and (late.kl[:, 3] > 0).all()
    assert len(r.to_frame()) == 3 and r.figure().data
    hf.double()


def _untied_pair(n_layers=3, m=4, seed=0):
    """An m-untied model and the official construction it must equal: network A on x[:, :m], network B on
    x[:, m:] reading A's KV cache (two GPT-2s, each with its own position table: B's rows m.. serve positions >= m)."""
    import copy

    import transformers as T

    from interp.dynamics.untied import untie_gpt2
    c = T.GPT2Config(n_layer=n_layers, n_embd=16, n_head=2, vocab_size=7, n_positions=16, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    torch.manual_seed(seed)
    A = T.GPT2LMHeadModel(c).double()
    torch.manual_seed(seed + 1)
    B = T.GPT2LMHeadModel(c).double()
    with torch.no_grad():   # non-identity norms in both networks
        for net in (A, B):
            for n, p in net.named_parameters():
                if "ln_" in n:
                    p.add_(0.3 * torch.randn_like(p))
    for net in (A, B):
        net.set_attn_implementation("eager")
    return untie_gpt2(copy.deepcopy(A), m, second=B), A, B


def test_untied_equals_two_networks_with_kv_cache():
    from interp.dynamics.untied import second_network_params
    m = 4
    U, A, B = _untied_pair(m=m)
    ids = _ids(7, (2, 9), seed=3)
    r1 = A(ids[:, :m], use_cache=True)
    r2 = B(ids[:, m:], past_key_values=r1.past_key_values, use_cache=True)
    ref = torch.cat([r1.logits, r2.logits], 1)
    out = U(ids).logits
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    # gradients: the same parameters receive the same gradients (through the cache into A too)
    lossfn = lambda lg: torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, 7), ids[:, 1:].reshape(-1))  # noqa: E731
    ga = torch.autograd.grad(lossfn(ref), [A.transformer.h[0].attn.c_attn.weight, B.transformer.h[2].mlp.c_fc.weight,
                                           A.transformer.wte.weight, B.transformer.wte.weight,
                                           A.transformer.wpe.weight, B.transformer.wpe.weight])
    gu = torch.autograd.grad(lossfn(out), [U.transformer.h[0].attn.c_attn.a.weight, U.transformer.h[2].mlp.c_fc.b.weight,
                                           U.transformer.wte.a.weight, U.transformer.wte.b.weight,
                                           U.transformer.wpe.a.weight, U.transformer.wpe.b.weight])
    for x, y in zip(ga, gu):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)
        assert x.abs().max() > 0
    second = second_network_params(U)
    assert len(second) == sum(1 for _ in B.parameters())
    assert all(".b." in n for n in second)


def test_untied_uses_the_second_networks_position_table():
    """Issue #33: positions >= m add rows m.. of network B's own ``wpe`` (the official second network runs with
    position ids m.. after A's cache), positions < m rows of A's. Before the fix one table (A's) served both, so
    B's position embeddings were dropped: shifting B's rows changed nothing. By hand: shifting B's row m + 1 by
    ``delta`` must change the embedding output at position m + 1 by exactly ``delta`` and nothing else; shifting
    A's row m + 1 (unused by the untied model) must change nothing."""
    m = 4
    U, _, _ = _untied_pair(n_layers=1, m=m)
    ids = _ids(7, (2, 9), seed=6)
    kept = {}
    model = interp.wrap(U, backend="torch")
    with model.intervene({"blocks.0.hook_resid_pre": lambda t, ctx: kept.setdefault("r", t.detach().clone())}):
        model.forward_with_grad(ids)
    base = kept.pop("r")
    delta = torch.linspace(-1, 1, 16, dtype=torch.float64)
    with torch.no_grad():
        U.transformer.wpe.b.weight[m + 1] += delta
    with model.intervene({"blocks.0.hook_resid_pre": lambda t, ctx: kept.setdefault("r", t.detach().clone())}):
        model.forward_with_grad(ids)
    moved = kept.pop("r") - base
    torch.testing.assert_close(moved[:, m + 1], delta.expand(2, -1), rtol=0, atol=1e-12)
    moved[:, m + 1] = 0
    assert moved.abs().max() == 0
    with torch.no_grad():
        U.transformer.wpe.a.weight[m + 1] += delta
    with model.intervene({"blocks.0.hook_resid_pre": lambda t, ctx: kept.setdefault("r", t.detach().clone())}):
        model.forward_with_grad(ids)
    torch.testing.assert_close(kept.pop("r") - base, torch.zeros_like(base).index_fill_(1, torch.tensor([m + 1]), 1)
                               * delta, rtol=0, atol=1e-12)


def test_untied_decomposition_second_network():
    """i < m: the first network computes r_i, so the direct and pre-cached parts are exactly zero on the second
    network's parameters (all of B's gradient is 'shared'), and B's parameters cannot move any feature at r_i
    (∂r_i/∂θ_B = 0), so B's shared gradient has zero influence there. i >= m: B gets direct signal."""
    from interp.dynamics.untied import second_network_params
    m = 4
    U, _, _ = _untied_pair(m=m)
    model = interp.wrap(U, backend="torch")
    ids = _ids(7, (3, 9), seed=4)
    params = dict(U.named_parameters())
    second = set(second_network_params(U))
    for site, pos in [("blocks.0.hook_resid_post", 1), ("blocks.1.hook_resid_post", 2)]:
        dec = decompose_gradient(model, ids, site, pos, params=params)
        assert dec.max_abs_error() < 1e-12
        assert max(float(dec[c][n].abs().max()) for c in ("direct", "precached") for n in second) < 1e-15  # round-off
        assert max(float(dec["precached"][n].abs().max()) for n in params if n not in second) > 1e-4
        assert max(float(dec["shared"][n].abs().max()) for n in second) > 1e-4   # B's own losses
        kept = {}
        with model.intervene({site: lambda t, ctx: kept.setdefault("r", t)}):
            model.forward_with_grad(ids)
        w = torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        g = torch.autograd.grad((kept["r"][:, pos] @ w).sum(), list(params.values()), allow_unused=True)
        assert all(x is None or x.abs().max() == 0 for n, x in zip(params, g) if n in second)
    dec = decompose_gradient(model, ids, "blocks.1.hook_resid_post", 6, params=params)
    assert max(float(dec["direct"][n].abs().max()) for n in second) > 1e-4


def test_untied_myopic_and_config():
    """Myopic attention composes with untying (forward unchanged, pre-cached vanishes); config validation."""
    from interp.benchmarks.influence import MajorityConfig
    U, _, _ = _untied_pair(m=4)
    ids = _ids(7, (2, 9), seed=5)
    ref = U(ids).logits.detach()
    U.set_attn_implementation(register_myopic_attention())
    torch.testing.assert_close(U(ids).logits, ref, rtol=0, atol=1e-12)
    dec = decompose_gradient(interp.wrap(U, backend="torch"), ids, "blocks.0.hook_resid_post", 2,
                             params=dict(U.named_parameters()))
    assert dec.norm("precached") / dec.norm("full") < 1e-6
    with pytest.raises(ValueError, match="variant"):
        MajorityConfig(variant="tied")
    with pytest.raises(ValueError, match="task"):
        MajorityConfig(task="parity")
    with pytest.raises(ValueError, match="split"):
        MajorityConfig(split=0)
    from interp.dynamics.untied import untie_gpt2
    with pytest.raises(ValueError, match="already untied"):
        untie_gpt2(U, 4)


def test_domain_contexts_interleave_and_corpora():
    from interp.benchmarks.influence.q_domains import domain_contexts

    class Tok:      # one token per character
        def __call__(self, t):
            return {"input_ids": [ord(c) for c in t]}
    toks, dom = domain_contexts(Tok(), {"x": "abcdefgh", "y": "ABCDEFGHIJ"}, n_ctx=2, length=3)
    assert toks.tolist() == [[97, 98, 99], [65, 66, 67], [100, 101, 102], [68, 69, 70]]
    assert dom.tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="only 2 contexts"):
        domain_contexts(Tok(), {"x": "abcdefgh"}, n_ctx=3, length=3)


def test_majority_defaults_follow_official_indices():
    """Positions carry the BOS at 0 as in the official sampler (``["<bos>"] + tokens``), so the official
    ``split_index = 10`` is our m as is: every position whose loss predicts an output token (10..19) is on the
    second network; and the probed input positions are NTP-useless (the next token is a uniform input, independent
    of ``is_majority``), unlike position 10, whose next token is always a majority token."""
    from interp.benchmarks.influence.majority import MajorityConfig, _gpt2
    from interp.dynamics.tasks import majority
    cfg = MajorityConfig(variant="untied")
    b = majority(6000, seed=1)
    first_out = min(b.output_positions)                             # 11
    predicts_output = [p for p in range(b.tokens.shape[1] - 1) if p + 1 >= first_out]
    assert cfg.split == min(predicts_output) == 10
    assert _gpt2(cfg, b.vocab_size).config.untied_split == 10
    assert all(p + 1 < first_out and p < cfg.split for p in cfg.probe_positions)
    for p in cfg.probe_positions:       # P(next token = v | is_majority_v at p) = 1/3: useless for NTP
        hit = b.features[:, p].gather(1, b.tokens[:, p + 1, None]).float().mean()
        base = b.features[:, p].float().sum(1).mul(1 / 3).mean()     # the same under independence
        assert abs(float(hit - base)) < 0.03, p
    assert b.features[:, 10].gather(1, b.tokens[:, 11, None]).all()   # position 10: the next token is a majority


def test_ridge_probe_closed_form():
    """The official influence probe is sklearn Ridge with intercept: coef = (XcᵀXc + αI)⁻¹ XcᵀYc (centred)."""
    from interp.dynamics.influence import ridge_probe
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 6, generator=g, dtype=torch.float64) * torch.tensor([1, 2, 3, .5, 1, 4.]) + 3
    Y = (X[:, :3] @ torch.randn(3, 3, generator=g, dtype=torch.float64) > 0).long()
    W = ridge_probe(X, Y, alpha=5.0)
    Xc, Yc = X - X.mean(0), Y.double() - Y.double().mean(0)
    ref = torch.linalg.solve(Xc.T @ Xc + 5.0 * torch.eye(6, dtype=torch.float64), Xc.T @ Yc).T
    assert W.shape == (3, 6)
    torch.testing.assert_close(W.double(), ref, rtol=1e-5, atol=1e-6)
    assert ridge_probe(X, Y[:, 0], 1.0).shape == (1, 6)
    from sklearn.linear_model import Ridge                      # the official probe itself
    sk = Ridge(alpha=5.0).fit(X.numpy(), Y.double().numpy())
    torch.testing.assert_close(W.double(), torch.tensor(sk.coef_), rtol=1e-5, atol=1e-6)
    # batched over a leading (position) axis: the same as one fit per position
    Wb = ridge_probe(torch.stack([X, 2 * X]), torch.stack([Y, Y]), alpha=5.0)
    torch.testing.assert_close(Wb[1], ridge_probe(2 * X, Y, alpha=5.0))


def test_ridge_pearson_is_the_official_probe_metric():
    """Issue #33: the official probing metric is Pearson r between each feature and the Ridge(alpha) prediction on
    the test split (src/probing.py: Ridge(...).fit, predict, scipy.stats.pearsonr per feature); not the accuracy
    of a logistic probe, which gives other numbers on the same data (checked here too)."""
    from scipy.stats import pearsonr
    from sklearn.linear_model import LogisticRegression, Ridge

    from interp.dynamics.influence import ridge_pearson
    g = torch.Generator().manual_seed(3)
    X = torch.randn(2, 300, 5, generator=g, dtype=torch.float64)
    Y = ((X[..., :2] + 0.8 * torch.randn(2, 300, 2, generator=g, dtype=torch.float64)) > 0).long()
    r = ridge_pearson(X[:, :200], Y[:, :200], X[:, 200:], Y[:, 200:], alpha=1.0)
    assert r.shape == (2, 2)
    for k in range(2):
        pred = Ridge(alpha=1.0).fit(X[k, :200].numpy(), Y[k, :200].numpy()).predict(X[k, 200:].numpy())
        for f in range(2):
            assert float(r[k, f]) == pytest.approx(pearsonr(Y[k, 200:, f].numpy(), pred[:, f])[0], abs=1e-10)
    acc = LogisticRegression(max_iter=2000).fit(X[0, :200].numpy(), Y[0, :200, 0].numpy()).score(
        X[0, 200:].numpy(), Y[0, 200:, 0].numpy())
    assert abs(acc - float(r[0, 0])) > 0.05
    const = ridge_pearson(X[0, :200], Y[0, :200], X[0, 200:], torch.zeros(100, 2))
    assert torch.isnan(const).all()                     # a constant feature: NaN, as pearsonr


def test_majority_record_influence_rows_sum_to_full():
    """A tiny Majority run's record: probe Pearson r (official) and logistic accuracy (ours) at the five input
    positions; the influence covers every training step, both layers, every feature and positions 2-19 (the
    official sweep: 2 x 3 x 18 = 108 probes) with rows that sum per optimizer and probe to 'full'; the running
    sums are kept every 10 steps."""
    from interp.benchmarks.influence.majority import (MajorityConfig, majority_record, mean_probe_accuracy,
                                                      mean_probe_pearson)
    cfg = MajorityConfig(d_model=8, n_heads=2, steps=3, batch=4, n_probe=64, seed=2, influence_centered=False)
    rec = majority_record(cfg, track_influence=True)
    assert set(rec["probe_accuracy"]) == set(rec["probe_pearson"]) == {"5", "6", "7", "8", "9"}
    assert mean_probe_accuracy(rec) == pytest.approx(sum(rec["probe_accuracy"].values()) / 5)
    assert mean_probe_pearson(rec) == pytest.approx(sum(rec["probe_pearson"].values()) / 5)
    assert all(-1 <= r <= 1 for r in rec["probe_pearson"].values())
    import pandas as pd
    df = pd.DataFrame(rec["influence"])
    assert len(df[(df.optimizer == "adam") & (df.component == "full")]) == 108
    assert set(df.position) == set(range(2, 20)) and set(df.feature) == {"is_majority_0", "is_majority_1",
                                                                          "is_majority_2"}
    assert set(df.site) == {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post"}
    wide = df.pivot_table(index=["optimizer", "feature", "site", "position"], columns="component", values="influence")
    err = (wide.direct + wide.precached + wide.shared - wide.full).abs() / (1 + wide.full.abs())
    assert float(err.max()) <= 1e-6
    last = wide.xs("blocks.1.hook_resid_post", level="site")       # no attention after the last layer
    assert float(last.precached.abs().max()) <= 1e-6 * (1 + float(last.full.abs().max()))
    assert rec["curves"]["steps"] == [3] and len(rec["curves"]["adam/direct"][0]) == 108
    assert df.influence_centered.isna().all()
    assert majority_record(dataclasses_replace(cfg, variant="myopic"), track_influence=False)["influence"] is None


def test_influence_summary_bootstrap_by_hand():
    """influence_summary: per (feature, site, position, component) the mean over seeds with a bootstrap CI, and
    pre-cached + shared summed per seed before the CI (two seeds whose rows are set by hand)."""
    from interp.benchmarks.influence.majority import influence_summary, summary_row
    from interp.dynamics import bootstrap_ci

    def rec(d, pc, sh):
        return {"influence": [{"optimizer": o, "component": c, "feature": f, "site": "s", "position": 8,
                               "influence": v * (1 if f == "a" else 100), "influence_centered": v / 10}
                              for o in ("adam", "sgd") for f in ("a", "b")
                              for c, v in (("direct", d), ("precached", pc), ("shared", sh), ("full", d + pc + sh))]}
    rows = influence_summary([rec(1.0, -1.0, 3.0), rec(3.0, 0.5, 0.5)], n_boot=200)
    assert summary_row(rows, "direct", 8, "s", "a")["mean"] == pytest.approx(2.0)
    assert summary_row(rows, "direct", 8, "s", "b")["mean"] == pytest.approx(200.0)
    both = summary_row(rows, "precached+shared", 8, "s", "a")
    assert both["mean"] == pytest.approx(1.5)
    assert both["lo"] == pytest.approx(bootstrap_ci([2.0, 1.0], n_boot=200)[1])
    assert summary_row(rows, "full", 8, "s", "a", quantity="centered_influence")["mean"] == pytest.approx(0.35)
    with pytest.raises(KeyError, match="position 9"):
        summary_row(rows, "direct", 9, "s", "a")


def dataclasses_replace(cfg, **kw):
    import dataclasses
    return dataclasses.replace(cfg, **kw)


@pytest.mark.parametrize("myopic,scale", [(False, 1.0), (True, 1.0), (False, 0.5)])
def test_train_with_influence_adam_steps_sum_to_real_update(gpt2, myopic, scale):
    """Adam moments are linear in the gradient and the second moment is shared, so the three per-component Adam
    steps sum to the real Adam update: the 'full' influence must equal Σ_t (θ_t − θ_{t+1})·∇R(θ_t), computed here
    by an independent torch.optim.Adam run; SGD 'full' = Σ_t lr ∇L·∇R; the centred diagnostic likewise with
    R_c = var(⟨w,r⟩ − target). The risk is the official ``mse_loss`` (scale 1; issue #33: until then ½·MSE, every
    influence half the official one) or, as the named option, ½·MSE (scale 0.5). 3 layers, perturbed norms, float64. Myopic: training uses myopic gradients, ∇R
    the ordinary (eager) ones, as the official code (``risk_context``)."""
    import copy

    from interp.dynamics.influence import attention_implementation, train_with_influence
    hf0, _ = gpt2
    hf = copy.deepcopy(hf0)
    ref = copy.deepcopy(hf0)
    train_attn = register_myopic_attention() if myopic else "eager"
    for m in (hf, ref):
        m.set_attn_implementation(train_attn)
    V = hf.config.vocab_size
    batches = _ids(V, (3, 4, 9), seed=11)
    g = torch.Generator().manual_seed(12)
    d = hf.config.n_embd
    spec = [("blocks.0.hook_resid_post", 3, 1), ("blocks.1.hook_resid_post", 6, 2)]    # site, position, hidden idx
    probes = [(f"f{k}", s, p, torch.randn(d, generator=g, dtype=torch.float64),
               torch.randn(3, 4, generator=g, dtype=torch.float64)) for k, (s, p, _) in enumerate(spec)]
    lr = 1e-2
    kw = {} if scale == 1.0 else {"risk_scale": scale}
    fi = train_with_influence(interp.wrap(hf, backend="torch"), dict(hf.named_parameters()), batches, probes, lr=lr,
                              risk_context=lambda: attention_implementation(hf, "eager"), chunk=3, **kw)
    assert hf.config._attn_implementation == train_attn

    params = list(ref.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    want = {o: torch.zeros(2, dtype=torch.float64) for o in ("adam", "sgd", "adam_c")}
    for t, ids in enumerate(batches):
        ref.set_attn_implementation("eager")
        out = ref(ids, output_hidden_states=True)
        ref.set_attn_implementation(train_attn)
        logits = ref(ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
        gl = torch.cat([x.reshape(-1) for x in torch.autograd.grad(loss, params, retain_graph=True)])
        gr, grc = [], []
        for k, (_, _, hidx) in enumerate(spec):
            diff = out.hidden_states[hidx][:, spec[k][1]] @ probes[k][3] - probes[k][4][t]
            mse = torch.nn.functional.mse_loss(out.hidden_states[hidx][:, spec[k][1]] @ probes[k][3], probes[k][4][t])
            for risk, acc in ((scale * mse, gr), (scale * (diff - diff.mean()).pow(2).mean(), grc)):
                gs = torch.autograd.grad(risk, params, retain_graph=True, allow_unused=True)
                acc.append(torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1) for p, x in zip(params, gs)]))
        before = torch.cat([p.detach().reshape(-1) for p in params])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step = before - torch.cat([p.detach().reshape(-1) for p in params])
        for k in range(2):
            want["adam"][k] += step @ gr[k]
            want["adam_c"][k] += step @ grc[k]
            want["sgd"][k] += lr * gl @ gr[k]
    got = fi.influence
    torch.testing.assert_close(got["adam"]["full"], want["adam"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(fi.influence_centered["adam"]["full"], want["adam_c"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got["sgd"]["full"], want["sgd"], rtol=1e-9, atol=1e-14)
    assert want["adam"].abs().min() > 1e-6 and (want["adam"] - want["adam_c"]).abs().min() > 1e-8
    for a, b in zip(hf.parameters(), ref.parameters()):        # the re-run trains exactly like Adam
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert fi.curves_centered["adam"]["direct"].shape == (3, 2) and "influence_centered" in fi.to_frame()


@pytest.mark.parametrize("myopic", [False, True])
def test_vectorised_influence_equals_per_probe_official_formula(gpt2, myopic):
    """The vectorised accumulation (all sites, positions and features at once) against the official algorithm
    written per probe: ``decompose_gradient`` (its own stop-gradient forwards and backward passes) per (site,
    position), ``∇R`` of ``mse_loss(⟨w, r_θ⟩, target)`` per probe by its own backward, SGD ``lr·g_c`` and Adam
    per-component first moments with the full gradient's second moment. Probes at three layers (the last one
    too), two sharing a (site, position), one alone. Myopic: the components come from the myopic graph, ``∇R``
    from ordinary attention (``risk_context``), as the official code. Fails on the code before issue #33 (½ in
    the risk: every component half of this reference)."""
    import copy

    from interp.dynamics.influence import attention_implementation, train_with_influence
    hf0, _ = gpt2
    hf, ref = copy.deepcopy(hf0), copy.deepcopy(hf0)
    attn = register_myopic_attention() if myopic else "eager"
    for m_ in (hf, ref):
        m_.set_attn_implementation(attn)
    risk_ctx = (lambda: attention_implementation(hf, "eager")) if myopic else None
    V, d, lr = hf.config.vocab_size, hf.config.n_embd, 1e-2
    batches = _ids(V, (3, 4, 9), seed=21)
    g = torch.Generator().manual_seed(22)
    spec = [("blocks.0.hook_resid_post", 3), ("blocks.0.hook_resid_post", 3), ("blocks.1.hook_resid_post", 6),
            ("blocks.0.hook_resid_post", 5), ("blocks.2.hook_resid_post", 2)]
    probes = [(f"f{k}", s, p, torch.randn(d, generator=g, dtype=torch.float64),
               torch.randn(3, 4, generator=g, dtype=torch.float64)) for k, (s, p) in enumerate(spec)]
    fi = train_with_influence(interp.wrap(hf, backend="torch"), dict(hf.named_parameters()), batches, probes, lr=lr,
                              centered=False, chunk=4, risk_context=risk_ctx)
    assert fi.influence_centered is None and fi.risk_scale == 1.0
    model = interp.wrap(ref, backend="torch")
    params = dict(ref.named_parameters())
    ts = list(params.values())
    opt = torch.optim.Adam(ts, lr=lr)
    comps = ("direct", "precached", "shared")
    pairs = list(dict.fromkeys(spec))
    mom = {pp: {c: 0.0 for c in comps} for pp in pairs}
    v = 0.0
    want = {o: {c: torch.zeros(len(probes), dtype=torch.float64) for c in comps} for o in ("sgd", "adam")}

    def flat(gs):
        return torch.cat([x.reshape(-1) for x in gs.values()])
    for t, ids in enumerate(batches):
        decs = {pp: decompose_gradient(model, ids, pp[0], pp[1], params=params) for pp in pairs}
        full = flat(decs[pairs[0]].full)
        v = 0.999 * v + 0.001 * full ** 2
        denom = (v / (1 - 0.999 ** (t + 1))).sqrt() + 1e-8
        kept = {}
        with model.intervene({s: (lambda t_, ctx: kept.setdefault(ctx.name, t_)) for s, _ in pairs}), \
                attention_implementation(ref, "eager"):
            model.forward_with_grad(ids)
        grs = []
        for k, (s, p) in enumerate(spec):
            R = torch.nn.functional.mse_loss(kept[s][:, p] @ probes[k][3], probes[k][4][t])
            gg = torch.autograd.grad(R, ts, retain_graph=True, allow_unused=True)
            grs.append(torch.cat([(torch.zeros_like(a) if x is None else x).reshape(-1) for a, x in zip(ts, gg)]))
        for pp in pairs:
            for c in comps:
                mom[pp][c] = 0.9 * mom[pp][c] + 0.1 * flat(decs[pp][c])
        for k, pp in enumerate(spec):
            for c in comps:
                want["sgd"][c][k] += lr * flat(decs[pp][c]) @ grs[k]
                want["adam"][c][k] += (lr * mom[pp][c] / (1 - 0.9 ** (t + 1)) / denom) @ grs[k]
        opt.zero_grad()
        for a, x in zip(ts, decs[pairs[0]].full.values()):
            a.grad = x.clone()
        opt.step()
    for o in want:
        for c in comps:
            torch.testing.assert_close(fi.influence[o][c], want[o][c], rtol=1e-8, atol=1e-12)
        assert float(want[o]["direct"].abs().min()) > 1e-4      # a real comparison, not zeros
    if myopic:      # no pre-caching at all, by construction
        assert float(want["adam"]["precached"].abs().max()) < 1e-10
    else:
        assert float(want["adam"]["precached"][:4].abs().min()) > 1e-5 and abs(float(want["adam"]["precached"][4])) < 1e-12
    assert fi.risk.shape == (3, 5) and fi.curves["adam"]["shared"].shape == (3, 5)


def test_recipe_configs_refuse_bad_values():
    """The influence recipe's configs name the field and what was expected."""
    from interp.benchmarks.influence import InfluenceConfig, MajorityConfig, QDomainsConfig
    with pytest.raises(ValueError, match="at least two seeds"):
        InfluenceConfig(seeds=(0,))
    with pytest.raises(ValueError, match="four variants"):
        InfluenceConfig(variants=("standard", "myopic"))
    with pytest.raises(ValueError, match="conditioned.task"):
        InfluenceConfig(conditioned=MajorityConfig())
    with pytest.raises(ValueError, match="influence_layers"):
        MajorityConfig(influence_layers=(3,))
    with pytest.raises(ValueError, match="influence_features"):
        MajorityConfig(influence_features=(3,))
    with pytest.raises(ValueError, match="influence_risk_scale"):
        MajorityConfig(influence_risk_scale=0)
    assert MajorityConfig().influence_steps is None and MajorityConfig().influence_positions == tuple(range(2, 20))
    with pytest.raises(ValueError, match="q_position"):
        QDomainsConfig(q_length=8, q_position=8)
    with pytest.raises(ValueError, match="n_ctx"):
        QDomainsConfig(n_ctx=0)
