"""ROME / TCPE against the official code (issue #35 items 7-10, #34 §4): each test compares with a hand computation
or the official formula on fixed small inputs, and names what the code before the fix did instead."""
import pytest
import torch

import interp
from interp.editing import (EditConfig, EditRequest, MLPSite, TranscoderSite, compute_key, compute_v,
                            context_templates, default_second_moment, default_texts, kl_term, rank_one, rome,
                            second_moment, tcpe, tcpe_batch, weight_decay_term)

interp.set_progress(False)
TEXTS = [f"Note {i}: a person named Ann {i % 7} lives near the river {i * 3 % 11}." for i in range(24)]
REQ = EditRequest("Fact: {} lives in", "Bob", " Xy")
TEMPLATES = ["{}", "Some context here. {}"]



# ---------------------------------------------------------------------------------------------- item 7
def test_kl_and_weight_decay_terms_by_hand():
    """KL(p_δ‖p₀) = Σ p_δ (log p_δ − log p₀) (ROME's ``kl_div(p0, p_δ, log_target=True)``); the code before used
    KL(p₀‖p_δ), which differs on these numbers. ROME's decay is ‖δ‖/‖v₀‖², ours before ‖δ‖²/‖v₀‖²."""
    p0 = torch.tensor([[0.7, 0.2, 0.1]])
    pd = torch.tensor([[0.2, 0.5, 0.3]])
    hand = float((pd * (pd.log() - p0.log())).sum())                 # 0.2 ln(2/7) + 0.5 ln(2.5) + 0.3 ln 3
    assert abs(hand - (0.2 * -1.252763 + 0.5 * 0.916291 + 0.3 * 1.098612)) < 1e-5
    assert abs(float(kl_term(pd.log(), p0.log())) - hand) < 1e-6
    other = float((p0 * (p0.log() - pd.log())).sum())
    assert abs(float(kl_term(pd.log(), p0.log(), "p0||p_delta")) - other) < 1e-6 and abs(other - hand) > 0.04
    d, v0 = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 2.0])
    assert abs(float(weight_decay_term(d, v0, 0.5)) - 0.5 * 5 / 4) < 1e-6          # ROME: ‖δ‖/‖v₀‖²
    assert abs(float(weight_decay_term(d, v0, 0.5, "squared")) - 0.5 * 25 / 4) < 1e-6


def _rome_reference_v(model, req, templates, steps, lr, wd, kl_factor, clamp, stop=5e-2):
    """ROME's ``compute_v`` loop written out (kmeng01/rome ``rome/compute_v.py``): δ at the subject's last token of
    every rewriting prompt and of the KL prompt "{} is a"; loss = NLL + kl_factor·KL(p_δ‖p₀) + wd·‖δ‖/‖v₀‖²; break
    when loss < 0.05 or at the last iteration (before its step); Adam step; clamp ‖δ‖ ≤ clamp·‖v₀‖."""
    tok = model.tokenizer
    tgt = tok(req.target, add_special_tokens=False)["input_ids"]
    prompts, idx, tpos = [], [], []
    for t in templates:
        p = model.tokenize([t.format(req.text)])["input_ids"][0].tolist()
        prompts.append(p + tgt[:-1])
        idx.append(len(model.tokenize([t.format(req.prompt.split("{}")[0] + req.subject)])["input_ids"][0]) - 1)
        tpos.append(list(range(len(p) - 1, len(p) - 1 + len(tgt))))
    kl = model.tokenize([f"{req.subject} is a"])["input_ids"][0].tolist()
    prompts.append(kl)
    idx.append(len(model.tokenize([req.subject])["input_ids"][0]) - 1)
    n = len(templates)
    batch = model.pad_token_ids(prompts)
    delta = torch.zeros(model.cfg.d_model, requires_grad=True)
    st = {}

    def hook(t, ctx):
        st.setdefault("v0", t[0, idx[0]].detach().float().clone())
        add = torch.zeros_like(t)
        for i, j in enumerate(idx):
            add[i, j] = 1
        return t + add * delta

    opt = torch.optim.Adam([delta], lr=lr)
    kl0 = None
    with model.intervene({"blocks.1.hook_mlp_out": hook}):
        for it in range(steps):
            logits = model.forward_with_grad(batch).float()
            klp = logits[n, idx[n]].log_softmax(-1)[None]
            if kl0 is None:
                kl0 = klp.detach().clone()
            lp = logits.log_softmax(-1)
            nll = -torch.stack([torch.stack([lp[i, tpos[i][j], tgt[j]] for j in range(len(tgt))]).sum() / len(tgt)
                                for i in range(n)]).mean()
            klv = (klp.exp() * (klp - kl0)).sum(-1).mean()
            loss = nll + kl_factor * klv + wd * delta.norm() / st["v0"].norm() ** 2
            if loss < stop or it == steps - 1:
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                if delta.norm() > clamp * st["v0"].norm():
                    delta[...] = delta * clamp * st["v0"].norm() / delta.norm()
    return st["v0"] + delta.detach()


def test_compute_v_follows_rome_loop(model):
    """v* of the default config equals ROME's loop written out; the three choices of the code before (stop on the
    NLL alone with a step at every iteration, ‖δ‖² decay, KL(p₀‖p_δ)) give another v*."""
    cfg = EditConfig(v_num_grad_steps=6, v_lr=0.3, v_weight_decay=0.5, kl_factor=1.0, clamp_norm_factor=4)
    v, log = compute_v(MLPSite(model, 1), REQ, TEMPLATES, cfg)
    ref = _rome_reference_v(model, REQ, TEMPLATES, 6, 0.3, 0.5, 1.0, 4)
    assert len(log["nll"]) == 6                                       # 6 evaluations, 5 steps
    assert float((v - ref).norm() / ref.norm()) < 1e-5
    old = EditConfig(v_num_grad_steps=6, v_lr=0.3, v_weight_decay=0.5, kl_factor=1.0, clamp_norm_factor=4,
                     stop_rule="nll", weight_decay_form="squared", kl_direction="p0||p_delta")
    v_old, _ = compute_v(MLPSite(model, 1), REQ, TEMPLATES, old)
    assert float((v_old - ref).norm() / ref.norm()) > 1e-3


def test_rome_stop_rule_checks_the_total_loss(model):
    """ROME stops when the TOTAL loss is below the threshold, so a decay term keeps it going where the NLL alone
    (the rule before) would stop."""
    import dataclasses
    base = EditConfig(v_num_grad_steps=8, v_lr=0.05, v_weight_decay=0.0, kl_factor=0.0, clamp_norm_factor=100,
                      kl_prompts=(), nll_stop=0.0)
    _, log = compute_v(MLPSite(model, 1), REQ, TEMPLATES, base)
    n0, n1 = log["nll"][:2]
    assert n1 < n0 and len(log["nll"]) == 8
    T = (n0 + n1) / 2
    runs = {}
    for rule, wd in (("rome", 0.0), ("nll", 1e4), ("rome", 1e4)):
        _, lg = compute_v(MLPSite(model, 1), REQ, TEMPLATES, dataclasses.replace(base, stop_rule=rule, nll_stop=T,
                                                                                   v_weight_decay=wd))
        runs[rule, wd] = len(lg["nll"])
    assert runs["rome", 0.0] == 2 and runs["nll", 1e4] == 2 and runs["rome", 1e4] > 2


def test_right_vector_at_the_plain_prompt_key_for_rome_and_at_k_star_for_tcpe(model, tc):
    """ROME: r = (v* − (k₀W + b)) / (uᵀk₀) with k₀ the plain prompt's key; TCPE's code: at k*. By hand from the
    edit's u, v* and the keys. (The code before used k* for both.)"""
    site = MLPSite(model, 1)
    C = second_moment(site, TEXTS)
    cfg = EditConfig(v_num_grad_steps=3)
    e = rank_one(site, REQ, C, cfg, templates=TEMPLATES)
    k0 = compute_key(site, REQ, ["{}"])
    r = (e.v_star - (k0 @ site.W() + site.b())) / float(e.u @ k0)
    assert torch.allclose(e.delta, e.u[:, None] * r[None, :], atol=1e-5)
    e2 = rank_one(site, REQ, C, EditConfig(v_num_grad_steps=3, right_vector_key="k_star"), templates=TEMPLATES)
    assert float((e2.delta - e.delta).norm() / e.delta.norm()) > 1e-3
    ts = TranscoderSite(model, 1, tc)
    Ct = second_moment(ts, TEXTS)
    et = rank_one(ts, REQ, Ct, EditConfig(v_num_grad_steps=3, mom2_eps=1e-4), tau=-1.0, templates=TEMPLATES)
    rt = (et.v_star - (et.k_star @ ts.W() + ts.b())) / float(et.u @ et.k_star)
    assert et.log["right_vector_key"] == "k_star" and torch.allclose(et.delta, et.u[:, None] * rt[None, :], atol=1e-5)


def test_context_templates_rome_scheme(model):
    """ROME: "{}" + 10 texts of 4 and 10 of 9 tokens sampled (top-5) from <|endoftext|>, each + ". {}"; TCPE: one
    of 9 tokens. (Before: 5 templates, 10 tokens after the seed words The, Therefore, ...)"""
    tpl = context_templates(model, EditConfig(template_seed=7))
    assert len(tpl) == 21 and tpl[0] == "{}" and all(t.endswith(". {}") for t in tpl[1:])
    start = torch.full((10, 1), model.tokenizer.bos_token_id)
    for j, (length, sl) in enumerate(((5, slice(1, 11)), (10, slice(11, 21)))):
        gen = model.generate(start, max_new_tokens=length - 1, do_sample=True, top_k=5, seed=7 + j, stop_at_eos=False,
                             return_text=False)
        assert gen.shape == (10, length - 1)
        for t, g in zip(tpl[sl], gen.tolist()):
            ids = [x for x in g if x not in model.tokenizer.all_special_ids]
            assert t == model.tokenizer.decode(ids).replace("{", "{{").replace("}", "}}") + ". {}"
    assert context_templates(model, EditConfig(template_seed=7)) == tpl           # seeded: the same again
    assert len(context_templates(model, EditConfig.tcpe(template_seed=7))) == 2


# ---------------------------------------------------------------------------------------------- item 8
def test_tcpe_preset_and_multi_edit_scheme(model, tc):
    """TCPE's hyper-parameters; its multi-edit scheme: each masked update computed on the UNEDITED transcoder,
    the sum scaled by 1/upd_decay (1.1). (Before: no preset, edits only sequential.)"""
    c = EditConfig.tcpe()
    assert (c.v_num_grad_steps, c.v_lr, c.clamp_norm_factor, c.v_weight_decay, c.stop_rule, c.weight_decay_form,
            c.right_vector_key, c.context_template_length_params, c.mom2_n_samples, c.mom2_eps) == \
        (600, 0.01, 18.0, 1e-3, "tcpe", "squared", "k_star", ((10, 1),), 500_000, 1e-8)
    ts = TranscoderSite(model, 1, tc)
    C = second_moment(ts, TEXTS)
    cfg = EditConfig.tcpe(v_num_grad_steps=4, v_lr=0.05, mom2_eps=1e-4)
    reqs = [REQ, EditRequest("Fact: {} works in", "Ann", " Zq")]
    W0 = tc.W_dec.detach().clone()
    parts = [tcpe(model, r, 1, tc, tau=0.0, C=C, config=cfg, templates=TEMPLATES, apply=False) for r in reqs]
    e = tcpe_batch(model, reqs, 1, tc, tau=0.0, C=C, config=cfg, templates=TEMPLATES, upd_decay=1.1)
    assert torch.allclose(tc.W_dec.detach() - W0, (parts[0].delta + parts[1].delta) / 1.1, atol=1e-6)
    e.revert(transcoder=tc)
    assert torch.equal(tc.W_dec.detach(), W0)
    one = tcpe(model, REQ, 1, tc, tau=0.0, C=C, config=cfg, templates=TEMPLATES, apply=False, upd_decay=1.1)
    assert torch.allclose(one.delta, parts[0].delta / 1.1, atol=1e-7)


def test_tcpe_stop_rule_stagnation(model):
    """TCPE stops (only with ≥ 500 steps) after 3 consecutive steps whose NLL fell by < 1e-3; no 0.05 threshold."""
    cfg = EditConfig.tcpe(v_num_grad_steps=500, v_lr=1e-6, kl_prompts=())
    _, log = compute_v(MLPSite(model, 1), REQ, TEMPLATES, cfg)
    assert len(log["nll"]) == 4                                        # 1 + 3 stagnant evaluations
    _, log2 = compute_v(MLPSite(model, 1), REQ, TEMPLATES, EditConfig.tcpe(v_num_grad_steps=5, v_lr=1e-6))
    assert len(log2["nll"]) == 5


# ---------------------------------------------------------------------------------------------- item 9
def test_second_moment_counts_texts(model):
    """C over every token of the first n_samples TEXTS (ROME's mom2_n_samples), by hand."""
    site = MLPSite(model, 1)
    C = second_moment(site, TEXTS, n_samples=3)
    batch = model.tokenize(TEXTS[:3])
    _, cache = model.run_with_cache(batch, names=[site.key])
    k = cache[site.key][batch["attention_mask"].bool()].double()
    assert torch.allclose(C.double(), k.T @ k / len(k), atol=1e-6)
    assert not torch.allclose(second_moment(site, TEXTS, n_samples=4), C)


# ---------------------------------------------------------------------------------------------- #34 §4
def test_rome_from_defaults_uses_a_cached_built_in_corpus(model, tmp_path, monkeypatch):
    """``rome(model, request, layer)`` without C or texts: C from the built-in corpus (KJV passages), computed once
    and stored as a stage; a second call reads it back."""
    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path))
    cfg = EditConfig(mom2_n_samples=12, v_num_grad_steps=2)
    e = rome(model, EditRequest("The capital of {} is", "Italy", " Berlin"), layer=1, config=cfg, apply=False)
    assert e.method == "rome" and bool(torch.isfinite(e.delta).all())
    site = MLPSite(model, 1)
    texts = default_texts()
    assert len(texts) > 1000 and all(t.strip() for t in texts[:12])
    C = default_second_moment(site, cfg)
    assert torch.allclose(C, second_moment(site, texts, n_samples=12), atol=1e-6)
    stored = list((tmp_path / "stages" / "editing" / "mom2").glob("*/C/value.json"))
    assert len(stored) == 1 and list((tmp_path / "stages" / "editing" / "mom2").glob("*/templates/value.json"))


# ---------------------------------------------------------------------------------------------- #42 item 7
def test_kl_mode_tcpe_code_is_the_official_zero_kl_term(model):
    """TCPE's official code never adds δ at the KL prompt, so its KL term is identically zero:
    ``kl_mode="tcpe_code"`` gives that behaviour (v* as with kl_factor = 0), the default keeps ROME's KL term."""
    site = MLPSite(model, 1)
    steps = dict(v_num_grad_steps=4, v_lr=0.5, stop_rule="none")
    v_code, log_code = compute_v(site, REQ, TEMPLATES, EditConfig(kl_mode="tcpe_code", **steps))
    v_nokl, log_nokl = compute_v(site, REQ, TEMPLATES, EditConfig(kl_factor=0.0, **steps))
    _, log_rome = compute_v(site, REQ, TEMPLATES, EditConfig(kl_factor=10.0, **steps))
    assert torch.allclose(v_code, v_nokl, atol=1e-5) and log_code["loss"] == pytest.approx(log_nokl["loss"], abs=1e-6)
    assert log_code["kl"] == [0.0] * len(log_code["kl"])  # the KL prompt never sees δ: identically zero
    # ROME's: the KL prompt receives δ, so its logits move off the unedited ones once δ moves (in this tiny
    # model with sharpened embeddings by little: |KL| ~ 1e-10, against exactly 0 above)
    assert all(k != 0.0 for k in log_rome["kl"][1:])
    assert EditConfig.tcpe().kl_mode == "rome" and EditConfig.tcpe(kl_mode="tcpe_code").kl_mode == "tcpe_code"
    with pytest.raises(ValueError, match="kl_mode"):
        EditConfig(kl_mode="zero")
