"""ROME / TCPE / FT edits: the algebra (hand computations), masks, apply/revert, save, and config errors."""
import pytest
import torch

import interp
from interp.editing import (Edit, EditConfig, EditRequest, FineTuneConfig, MLPSite, TranscoderSite,
                            compute_key, fine_tune, rome, second_moment, tcpe)
from interp.editing.rome import _mask_rows

interp.set_progress(False)
TEXTS = [f"Note {i}: a person named Ann {i % 7} lives near the river {i * 3 % 11}." for i in range(24)]
REQ = EditRequest("Fact: {} lives in", "Bob", " Xy")
CFG = EditConfig(context_template_length_params=(), v_num_grad_steps=5)
TEMPLATES = ["{}", "Some context here. {}"]



def test_request_and_config_validation():
    with pytest.raises(ValueError, match="exactly one"):
        EditRequest("no slot", "a", " b")
    with pytest.raises(ValueError, match="target"):
        EditRequest("{} is", "a", "")
    with pytest.raises(ValueError, match="v_lr"):
        EditConfig(v_lr=0)
    with pytest.raises(ValueError, match="kl_prompts"):
        EditConfig(kl_prompts=("no slot",))
    with pytest.raises(ValueError, match="norm_constraint"):
        FineTuneConfig(norm_constraint=-1)


def test_key_is_template_mean_at_subject_last(model):
    site = MLPSite(model, 1)
    k = compute_key(site, REQ, TEMPLATES)
    # by hand: subject-last position of each text, from its own tokenisation
    keys = []
    for t in TEMPLATES:
        text = t.format(REQ.text)
        idx = len(model.to_tokens(t.format("Fact: Bob"))[0]) - 1
        _, c = model.run_with_cache(text, names=["blocks.1.mlp.hook_post"])
        keys.append(c["blocks.1.mlp.hook_post"][0, idx])
    assert torch.allclose(k, torch.stack(keys).mean(0), atol=1e-5)


def test_second_moment_by_hand(model):
    site = MLPSite(model, 2)
    C = second_moment(site, TEXTS[:5], n_tokens=10_000)
    _, c = model.run_with_cache(model.tokenize(TEXTS[:5]), names=["blocks.2.mlp.hook_post"])
    mask = model.tokenize(TEXTS[:5])["attention_mask"].bool()
    k = c["blocks.2.mlp.hook_post"][mask].double()
    assert torch.allclose(C.double(), k.T @ k / len(k), atol=1e-6)
    assert second_moment(site, TEXTS[:5], n_tokens=10_000) is C  # cached


def test_rome_rank_one_exact_apply_revert_save(model, tmp_path):
    W0 = model.weight("W_out").clone()
    C = second_moment(MLPSite(model, 1), TEXTS)
    e = rome(model, REQ, 1, C=C, config=CFG, templates=TEMPLATES)
    assert e.applied and e.residual < 1e-3
    assert torch.linalg.matrix_rank(e.delta.double(), rtol=1e-5) == 1
    W1 = model.weight("W_out")
    assert torch.allclose(W1[1] - W0[1], e.delta, atol=1e-6)       # the live weight changed, layer 1 only
    assert torch.equal(W1[0], W0[0]) and torch.equal(W1[2], W0[2])
    # ROME (official) solves r at the plain prompt's key k0: W' k0 + b = v* (ROME's compute_v), not at k*
    k0 = compute_key(MLPSite(model, 1), REQ, ["{}"])
    assert e.log["right_vector_key"] == "prompt"
    v = k0 @ W1[1] + model.weight("b_out")[1]
    assert torch.allclose(v, e.v_star, rtol=1e-3, atol=1e-4)        # W' k0 + b = v*
    assert e.log["residual_k_star"] > 1e-3                          # (k* is the mean over two templates, ≠ k0)
    # the left vector is C^-1 k* up to scale
    ck = torch.linalg.lstsq(C.double(), e.k_star.double()[:, None]).solution[:, 0].float()
    assert torch.allclose(e.u, ck / ck.norm(), atol=1e-4)
    # the model's own MLP output at the subject, plain prompt, now moves by (k·u) r
    e.revert(model)
    assert torch.allclose(model.weight("W_out"), W0, atol=1e-6)
    e.save(tmp_path / "edit")
    back = Edit.load(tmp_path / "edit")
    assert torch.equal(back.delta, e.delta) and back.method == "rome"
    with pytest.raises(RuntimeError, match="not applied"):
        e.revert(model)


def test_tcpe_mask_and_limits(model, tc):
    C = second_moment(TranscoderSite(model, 1, tc), TEXTS)
    full = tcpe(model, REQ, 1, tc, tau=-1, C=C, config=CFG, templates=TEMPLATES, apply=False)
    assert full.residual < 1e-3 and full.n_changed == tc.d_sae
    k = full.k_star
    tau = float(k[k > 0].median())
    masked = tcpe(model, REQ, 1, tc, tau=tau, C=C, config=CFG, templates=TEMPLATES, apply=False)
    S = ((k > 0) & (k >= tau)).nonzero().flatten()
    assert torch.equal(masked.rows, S) and masked.n_changed == len(S) < full.n_changed
    assert torch.count_nonzero(masked.delta.abs().sum(1)) <= len(S)
    assert torch.allclose(masked.delta[S], full.delta[S]) and masked.delta[~torch.isin(torch.arange(len(k)), S)].abs().max() == 0
    # tau = 0 keeps the support of k*, which is all that W' k* sees: exact again
    zero = tcpe(model, REQ, 1, tc, tau=0.0, C=C, config=CFG, templates=TEMPLATES, apply=False)
    assert zero.residual < 1e-3 and zero.n_changed == int((k > 0).sum())
    abl = tcpe(model, REQ, 1, tc, tau=tau, C=C, config=CFG, templates=TEMPLATES, ablate=True, apply=False)
    assert abl.n_changed == tc.d_sae - len(S)
    # apply / revert on the transcoder, visible through the splice
    W0 = tc.W_dec.detach().clone()
    masked.apply(transcoder=tc)
    assert torch.allclose(tc.W_dec - W0, masked.delta)
    masked.revert(transcoder=tc)
    assert torch.allclose(tc.W_dec, W0)
    with pytest.raises(ValueError, match="transcoder="):
        masked.apply(model)
    assert torch.equal(_mask_rows(torch.tensor([0.0, 0.2, 0.05, -0.1]), 0.1, False), torch.tensor([False, True, False, False]))


def test_compute_v_moves_target_and_edit_changes_prediction(model, tc):
    # subject at the end of the prompt: in a random model only the predicting position's own MLP output
    # reliably moves its logits (attention from far positions is diffuse)
    req = EditRequest("Fact: {}", "Bob", " X")
    cfg = EditConfig(context_template_length_params=(), v_num_grad_steps=40, v_lr=0.5, clamp_norm_factor=50)
    e = rome(model, req, 1, texts=TEXTS, config=cfg, templates=TEMPLATES, apply=False)
    assert e.log["nll"][-1] < e.log["nll"][0] - 0.1
    tgt = model.to_tokens(req.target, prepend_bos=False)[0, 0]
    before = model(req.text)[0, -1].log_softmax(-1)[tgt]
    e.apply(model)
    after = model(req.text)[0, -1].log_softmax(-1)[tgt]
    e.revert(model)
    assert after > before + 0.1


def test_fine_tune_respects_constraint(model):
    W0 = model.weight("W_out").clone()
    e = fine_tune(model, REQ, 1, FineTuneConfig(steps=3, norm_constraint=1e-3))
    assert e.delta.abs().max() <= 1e-3 + 1e-9 and e.log["nll"][-1] <= e.log["nll"][0]
    assert torch.allclose(model.weight("W_out")[1] - W0[1], e.delta, atol=1e-6)
    e.revert(model)
    assert torch.allclose(model.weight("W_out"), W0, atol=1e-6)


def test_fact_token_last(model):
    site = MLPSite(model, 1)
    k = compute_key(site, REQ, ["{}"], fact_token="last")
    _, c = model.run_with_cache(REQ.text, names=["blocks.1.mlp.hook_post"])
    assert torch.allclose(k, c["blocks.1.mlp.hook_post"][0, -1], atol=1e-5)
    with pytest.raises(ValueError, match="fact_token"):
        EditConfig(fact_token="first")


def test_edit_batch_is_sequential(model):
    from interp.editing import edit_batch
    W0 = model.weight("W_out").clone()
    reqs = [REQ, EditRequest("Fact: {} works in", "Ann", " Zq")]
    edits = edit_batch(rome, reqs, model, 2, texts=TEXTS, config=CFG, templates=TEMPLATES)
    # both edit layer 2's rows: edit 0 lies under edit 1, so only edit 1 is held exactly (``applied`` is read
    # from the weights); reverting edit 1 brings back exactly the weights edit 0 left
    assert len(edits) == 2 and edits[1].applied and not edits[0].applied
    assert torch.allclose(model.weight("W_out")[2] - W0[2], edits[0].delta + edits[1].delta, atol=1e-5)
    # the second edit was computed on the already-edited model: its own key/value hold exactly after both
    W = model.weight("W_out")[2]
    k0 = compute_key(MLPSite(model, 2), reqs[1], ["{}"])  # ROME's right vector holds at the plain prompt's key
    assert torch.allclose(k0 @ W + model.weight("b_out")[2], edits[1].v_star, rtol=1e-3, atol=1e-4)
    with pytest.raises(RuntimeError, match="not applied"):
        edits[0].revert(model)  # out of order: refused, nothing changed
    edits[1].revert(model)
    assert edits[0].applied and not edits[1].applied
    edits[0].revert(model)
    assert torch.equal(model.weight("W_out"), W0)  # reverted in reverse order: the saved weights, bit for bit


def _word_model():
    """An untrained 3-layer GPT-2 over the KECode toy's word-level vocabulary (decodes without leading spaces)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from interp.benchmarks.tcpe.kecode_toy import CodeTask, code_tokenizer
    tok = code_tokenizer(CodeTask(seed=0))
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=48, n_embd=32, n_layer=3, n_head=4, n_inner=64,
                                    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                    pad_token_id=tok.pad_token_id)).eval()
    return interp.wrap(hf, tok, backend="torch")


def test_context_templates_word_level_tokenizer_has_no_unknown_words():
    """Regression: seed word + continuation were glued as strings ("The" + "str a" -> unknown "Thestr") and the
    period stuck to the last word ("=." unknown), so every template but "{}" fed <unk> tokens to the model."""
    from interp.editing import context_templates
    m = _word_model()
    tpl = context_templates(m, EditConfig(template_scheme="seed_words", n_templates=5, template_length=6))
    unk = m.tokenizer.unk_token_id
    prompt = "str a = A0 ( i0 ) ; => str a ="
    for t, seed in zip(tpl[1:], ("The", "Therefore", "Because", "I", "You")):
        ids = m.tokenize([t.format(prompt)])["input_ids"][0].tolist()
        assert unk not in ids, (t, m.tokenizer.convert_ids_to_tokens(ids))
        assert m.tokenizer.convert_ids_to_tokens(ids[1]) == seed           # after <bos>: the seed word itself
        assert t.endswith(" . {}")


def test_context_templates_bpe_are_rome_strings(model):
    """Ours (``template_scheme="seed_words"``): on a BPE tokenizer decode(seed + sampled tokens) + ". {}"."""
    from interp.editing import context_templates
    cfg = EditConfig(template_scheme="seed_words", n_templates=2, template_length=5, template_seed=3)
    tpl = context_templates(model, cfg)
    gen = model.generate(["The", "Therefore"], max_new_tokens=5, do_sample=True, seed=3, return_text=False)
    for t, w, g in zip(tpl[1:], ("The", "Therefore"), gen.tolist()):
        ids = model.tokenizer(w, add_special_tokens=False)["input_ids"] + [x for x in g if x >= 0
                                                                          and x != model.tokenizer.eos_token_id]
        txt = model.tokenizer.decode(ids, skip_special_tokens=True).replace("{", " ").replace("}", " ").strip()
        assert t == txt + ". {}"


def test_second_moment_disk_cache(model, tc, tmp_path):
    """The on-disk cache returns the computed C; a file made for other weights is recomputed, not reused."""
    import sys
    R = sys.modules["interp.editing.rome"]
    f = str(tmp_path / "C.safetensors")
    site = MLPSite(model, 1)
    C = second_moment(site, TEXTS, n_tokens=300, cache_file=f)
    R._MOM2.clear()
    assert torch.equal(second_moment(site, TEXTS, n_tokens=300, cache_file=f), C)   # read back from the file
    R._MOM2.clear()
    other = MLPSite(model, 2)                                                         # other key weights: stale
    assert not torch.allclose(second_moment(other, TEXTS, n_tokens=300, cache_file=f), C)


def test_edit_plan_extends_without_changing_its_start():
    from interp.benchmarks.tcpe.real_facts import all_facts, edit_plan
    facts = all_facts()[:30]
    a, b = edit_plan(facts, 5, seed=1), edit_plan(facts, 12, seed=1)
    assert b[:5] == a and len({f for f, _ in b}) == 12
    assert all(new != f.obj and new in {o for o in __import__("interp.benchmarks.tcpe.real_facts", fromlist=["x"])
                                        .RELATIONS[f.relation][2].values()} for f, new in b)


def test_left_vector_on_a_low_rank_second_moment():
    """Regression (toy at layer 0): a rank-8 C of 64 features stored in float32 made the default least-squares
    driver return u = 0, which normalised to NaN. Then the left vector is the min-norm solution (C⁺k, normalised);
    on a well-conditioned C it is C⁻¹k."""
    from interp.editing import left_vector
    g = torch.Generator().manual_seed(0)
    Z = torch.relu(torch.randn(4000, 8, dtype=torch.float64, generator=g)
                   @ torch.randn(8, 64, dtype=torch.float64, generator=g) - 1.0)
    Z[:, :30] = 0                                                   # dead features: zero rows/columns of C
    C = (Z.T @ Z / len(Z)).float()
    k = Z[:7].mean(0).float()                                       # a key in C's range
    # (the old code: torch.linalg.lstsq(C.double(), k[:, None]) -> all zeros here -> u / |u| = NaN)
    u, driver = left_vector(C, k)
    assert torch.isfinite(u).all() and abs(float(u.norm()) - 1) < 1e-5
    Cu = C.double() @ u.double()
    assert float(Cu @ k.double() / Cu.norm() / k.norm()) > 0.999    # C u ∝ k: u solves the system
    if driver == "gelsd":
        ref = torch.linalg.pinv(C.double(), hermitian=True, rtol=1e-10) @ k.double()
        assert torch.allclose(u.double(), ref / ref.norm(), atol=1e-4)
    assert float(u[:30].abs().max()) == 0                           # nothing on never-active features
    assert float(u @ k) > 0
    with pytest.raises(ValueError, match="range of the second moment"):
        left_vector(C, torch.eye(64)[0])                            # a dead feature only: no update exists
    real_lstsq = torch.linalg.lstsq                                 # round-off instead of an exact zero (the solve
    def noisy(A, B, driver=None):                                   # gave 1.8e-13 at some memory offsets): still refused
        out = real_lstsq(A, B, driver=driver)
        return type("S", (), {"solution": out.solution + 1.8e-13})()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.linalg, "lstsq", noisy)
        with pytest.raises(ValueError, match="range of the second moment"):
            left_vector(C, torch.eye(64)[0])
    full = C.double() + 0.1 * torch.eye(64, dtype=torch.float64)
    u2, d2 = left_vector(full.float(), k)
    ref2 = torch.linalg.solve(full, k.double())
    assert d2 == "gelsy" and torch.allclose(u2.double(), ref2 / ref2.norm(), atol=1e-5)
    eps, _ = left_vector(C, torch.eye(64)[0], eps=1e-3)             # the documented regularisation
    assert torch.isfinite(eps).all() and float(eps[0]) > 0.99


def test_relative_ridge_on_the_second_moment(model):
    """mom2_eps_rel adds mom2_eps_rel * mean(diag C) to C's diagonal before solving for u (same v*, same key)."""
    from interp.editing import rank_one
    site = MLPSite(model, 1)
    C = second_moment(site, TEXTS)
    e = rank_one(site, REQ, C, EditConfig(context_template_length_params=(), v_num_grad_steps=2, mom2_eps_rel=0.5), templates=TEMPLATES)
    eps = 0.5 * float(C.diagonal().double().mean())
    ref = torch.linalg.solve(C.double() + eps * torch.eye(len(C), dtype=torch.float64), e.k_star.double())
    assert torch.allclose(e.u.double(), ref / ref.norm(), atol=1e-5)
    assert e.residual < 1e-3                                         # still exact at k*: W' k* + b = v*
    assert e.log["cos_uk"] > 0


def test_moment_diagnostics_sees_never_active_features_and_the_ridge():
    """On a C with two never-active features and a rarely-active one, the diagnostic counts them, its active
    block's smallest eigenvalue is tiny, and a ridge raises cos(u, k*) (the quantity the ridge is chosen from)."""
    from interp.editing import moment_diagnostics
    g = torch.Generator().manual_seed(0)
    Z = torch.relu(torch.randn(5000, 16, dtype=torch.float64, generator=g))
    Z[:, :2] = 0                                       # never active
    Z[1:, 2] = 0                                       # active on one sample only
    Z[0, 2] = 1.0
    Z[:, 3] = Z[:, 4] * 1.0001                        # nearly collinear pair
    C = (Z.T @ Z / len(Z)).float()
    k = Z[:3].mean(0).float()
    d = moment_diagnostics(C, k[None], eps_rels=(0.0, 1e-2))
    assert d["d"] == 16 and d["n_never_active"] == 2 and d["n_blind"] == [0]
    assert d["eig_min"] < 1e-6 and 0 < d["eig_min_active"] < 1e-6 * d["mean_diag"] and d["n_tiny_active"] >= 1
    assert d["cos_uk_ridge0.01"][0] > d["cos_uk_ridge0"][0]


def test_tau_for_fraction_is_the_smallest_grid_tau_meeting_the_mask_size():
    from interp.benchmarks.tcpe.real_facts import tau_for_fraction
    keys = torch.zeros(2, 100)
    keys[0, :10] = torch.arange(1, 11) / 10           # 0.1 .. 1.0
    keys[1, :6] = torch.arange(1, 7) / 10             # 0.1 .. 0.6
    assert tau_for_fraction(keys, 0.1) == (0.0, 0.08)  # mean support 8 <= 10
    t, f = tau_for_fraction(keys, 0.05)                # mean |S| <= 5: tau 0.4 keeps 7 and 3
    assert t == pytest.approx(0.301) and f == 0.05     # smallest grid tau above 0.3 (0.3 keeps 8 and 4: 6)


def test_second_moments_of_two_sites_in_one_pass_equal_the_single_site_ones(model, tc, tmp_path):
    """One forward pass for the MLP key and the spliced transcoder's features (same layer) gives each site's own
    C (the splice at hook_mlp_out leaves mlp.hook_post alone); the sparse-column accumulation is exact; each
    result is written to the single-site cache file."""
    import sys
    from interp.editing import second_moments
    R = sys.modules["interp.editing.rome"]
    sites = [TranscoderSite(model, 1, tc), MLPSite(model, 1)]
    R._MOM2.clear()
    files = [str(tmp_path / "tc.safetensors"), str(tmp_path / "mlp.safetensors")]
    both = second_moments(sites, TEXTS, n_tokens=300, cache_files=files)
    R._MOM2.clear()
    alone = [second_moment(s, TEXTS, n_tokens=300) for s in sites]
    for a, b in zip(both, alone):
        assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-7)
    R._MOM2.clear()
    assert torch.equal(second_moment(sites[0], TEXTS, n_tokens=300, cache_file=files[0]), both[0])  # read back
    with pytest.raises(ValueError, match="at most one TranscoderSite"):
        second_moments([TranscoderSite(model, 1, tc), MLPSite(model, 2)], TEXTS)


def test_cached_second_moment_is_checked_on_read(model, tmp_path):
    """ROME's cached C (stage ``editing/mom2``) carries a checksum: a flipped bit in the stored tensor is found
    on the next read and C recomputed (issue #42: it was returned as good)."""
    import warnings

    from interp.editing.rome import default_second_moment
    from interp.stages import StageWarning

    site = MLPSite(model, 1)
    cfg = EditConfig(mom2_n_samples=4, v_num_grad_steps=2)
    C = default_second_moment(site, cfg, root=tmp_path)
    (f,) = (tmp_path / "editing" / "mom2").glob("*/C/value.safetensors")
    data = bytearray(f.read_bytes())
    data[-2] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.warns(StageWarning, match=r"stage 'C' of editing/mom2 .*checksum"):
        again = default_second_moment(site, cfg, root=tmp_path)
    assert torch.equal(again, C)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StageWarning)
        assert torch.equal(default_second_moment(site, cfg, root=tmp_path), C)  # stored again, intact


def test_cached_default_transcoder_is_checked_on_read(model, tmp_path, monkeypatch):
    """The default transcoder (stage ``editing/transcoder``) carries a checksum and its code key: a flipped bit
    in the stored weights is found on the next read (in a new process: here, the in-process cache cleared) and
    the transcoder retrained, not returned as good (issue #42)."""
    from interp.editing import transcoders as tcmod
    from interp.editing.transcoders import TranscoderTrainingConfig, default_transcoder
    from interp.stages import StageWarning

    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tcmod, "_DEFAULT_TRANSCODERS", {})
    cfg = TranscoderTrainingConfig(d_sae=32, batch_size=64, text_batch_size=4, max_length=16, buffer_batches=2)
    texts = ["The cat sat on the mat.", "A dog ran in the park.", "Paris is in France."] * 4
    first = default_transcoder(model, 1, cfg, texts)
    (f,) = (tmp_path / "stages" / "editing" / "transcoder").glob("*/transcoder/value.safetensors")
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x10
    f.write_bytes(bytes(data))
    monkeypatch.setattr(tcmod, "_DEFAULT_TRANSCODERS", {})
    with pytest.warns(StageWarning, match=r"stage 'transcoder' of editing/transcoder .*checksum"):
        again = default_transcoder(model, 1, cfg, texts)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
