"""Ordinary mistakes at the API and CLI boundary get one clear error before any slow work (issue #12)."""
from __future__ import annotations

import time

import pytest
import torch
from typer.testing import CliRunner

import interp
from interp.apps.cli import _unavailable, app
from interp.testing import tiny_config, tiny_model


def test_cli_unknown_backend_and_empty_hook_pattern():
    runner = CliRunner()
    res = runner.invoke(app, ["demo", "--backend", "foo"])
    assert res.exit_code == 2 and "unknown backend 'foo'" in res.output and "Traceback" not in res.output
    hf, tok = tiny_model("gpt2", n_layers=3)
    folder = hf.config._name_or_path
    res = runner.invoke(app, ["hooks", folder, "--pattern", "nomatch*"])
    assert res.exit_code == 2 and "closest valid names" in res.output
    res = runner.invoke(app, ["hooks", folder, "--pattern", "blocks.2.hook_resid_post"])
    assert res.exit_code == 0 and res.stdout.strip().splitlines()[-1].endswith("blocks.2.hook_resid_post")


def test_a_failing_optional_command_says_why():
    _unavailable("brokencmd", ImportError("no module named 'frobnicate'"))
    res = CliRunner().invoke(app, ["brokencmd", "--anything"])
    assert res.exit_code == 2 and "failed to import" in res.output and "frobnicate" in res.output


@pytest.mark.parametrize("spec, match", [
    ("smollm2-135m", "write zoo:smollm2-135m"),
    ("./no/such/folder", "no such folder"),
    ("some-org/some-model", "hub"),
])
def test_mistyped_model_names_fail_at_once(spec, match, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        interp.load(spec)
    assert time.perf_counter() - t0 < 5


def test_bridged_module_is_refused_by_other_backends():
    hf, tok = tiny_model("llama", n_layers=3)
    interp.wrap(hf, tok, backend="transformer_lens")
    for backend in ("torch", "nnsight", "transformer_lens"):
        with pytest.raises(ValueError, match="rewires it in place|already bridged"):
            interp.wrap(hf, tok, backend=backend)


def test_tokenizer_less_llama_on_the_transformer_lens_backend():
    torch.manual_seed(0)
    import transformers as T
    hf = T.LlamaForCausalLM(tiny_config("llama", n_layers=3)).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = hf(ids).logits
    model = interp.wrap(hf, None, backend="transformer_lens")
    assert model.tokenizer is None
    assert (model(ids) - want).abs().max() < 1e-5
    with pytest.raises(ValueError, match="no tokenizer"):
        model("text")


@pytest.mark.parametrize("setting, match", [
    ("heads.fraction=-5", "fraction"), ("heads.batch_size=0", "batch_size"),
    ("heads.scores=NOPE", "scores"), ("heads.n_random=-1", "n_random"),
])
def test_bad_audit_settings_fail_before_any_model_loads(setting, match, tmp_path):
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["audit", "zoo:does-not-matter", "--checks", "heads", "--set", setting,
                                   "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and match in res.output and "loading" not in res.output
    assert not (tmp_path / "r").exists() and time.perf_counter() - t0 < 30


def test_pad_token_ids_right_pads_and_matches_unpadded_runs():
    """``Model.pad_token_ids``: right padding with the tokenizer's pad id, mask 1 on real tokens; a padded run
    equals each sequence run alone on its real tokens (3 layers, perturbed norms); no sequences is refused."""
    hf, tok = tiny_model("llama", n_layers=3, perturb_norms=True)
    model = interp.wrap(hf, tok, backend="torch")
    seqs = [[5, 6, 7, 8], torch.tensor([9, 10]), [11]]
    batch = model.pad_token_ids(seqs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, pad, pad], [11, pad, pad, pad]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]
    name = "blocks.2.hook_resid_post"
    _, cache = model.run_with_cache(batch, names=[name])
    for i, s in enumerate(seqs):
        _, alone = model.run_with_cache(torch.as_tensor(s).view(1, -1), names=[name])
        torch.testing.assert_close(cache[name][i, :len(s)], alone[name][0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="no sequences"):
        model.pad_token_ids([])


@pytest.fixture(scope="module")
def three_backends():
    import copy
    hf, tok = tiny_model("llama", seed=7, n_layers=3)
    return {b: interp.wrap(copy.deepcopy(hf) if b == "transformer_lens" else hf, tok, backend=b)
            for b in ("torch", "nnsight", "transformer_lens")}


@pytest.mark.parametrize("backend", ["torch", "nnsight", "transformer_lens"])
def test_one_token_id_dtype_rule_at_every_entry_point(three_backends, backend):
    """Bool token ids are refused as float ones are, in one line naming the dtype, at every entry point of the
    TransformerLens-style API (issue #43): calls, run_with_cache / run_with_hooks, generate, gradients, dicts,
    pad_token_ids, loss_fn, tokens_to_residual_directions, to_string, get_token_position."""
    from interp.model import TokenIdsError

    model = three_backends[backend]
    ids = model.to_tokens(["ab cd", "ef gh"])
    calls = {
        "call": lambda t: model(t),
        "run_with_cache": lambda t: model.run_with_cache(t),
        "run_with_hooks": lambda t: model.run_with_hooks(t, fwd_hooks=[]),
        "generate": lambda t: model.generate(t, max_new_tokens=1),
        "gradients": lambda t: model.gradients(t, "blocks.0.hook_resid_pre"),
        "dict": lambda t: model({"input_ids": t}),
        "pad_token_ids": lambda t: model.pad_token_ids(list(t)),
        "loss_fn": lambda t: model.loss_fn(model(ids), t),
        "tokens_to_residual_directions": lambda t: model.tokens_to_residual_directions(t),
        "get_token_position": lambda t: model.get_token_position(1, t[:1]),
    }
    for bad in (ids.bool(), ids.float()):
        for name, call in calls.items():
            with pytest.raises(TokenIdsError, match="must be an integer tensor") as err:
                call(bad)
            assert str(bad.dtype).replace("torch.", "") in str(err.value), name
            assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)
    images = torch.zeros(1, 3, 8, 8)  # a 4-d float tensor is an image batch, not ids: not this rule's
    with pytest.raises(Exception) as err:
        model(images)
    assert not isinstance(err.value, TokenIdsError)


def test_one_device_rule_names_the_keyword_or_the_option():
    """The library and both CLI commands (audit, harvest) share one rule; only the name in front differs."""
    from interp.validation import check_device

    assert check_device("cpu") == torch.device("cpu") and check_device(None) is None
    for name in ("device", "--device"):
        with pytest.raises(ValueError, match=rf"^{name} 'gpu0' is not a torch device \(e.g. cpu, cuda"):
            check_device("gpu0", name)
        if not torch.cuda.is_available():
            with pytest.raises(ValueError, match=rf"^{name} 'cuda:1' is not available: this machine has no CUDA"):
                check_device("cuda:1", name)


@pytest.mark.parametrize("backend", ["torch", "nnsight", "transformer_lens"])
def test_device_is_checked_before_any_forward(three_backends, backend):
    model = three_backends[backend]
    runs = []
    model.add_hook("blocks.0.hook_resid_pre", lambda t, hook: runs.append(1))
    try:
        for bad in ("nodevice", "cuda:99", 3.5):
            with pytest.raises(ValueError, match="device"):
                model.run_with_cache("ab cd", device=bad)
            with pytest.raises(ValueError, match="device"):
                with model.capture("blocks.0.hook_resid_pre", device=bad):
                    model("ab cd")
        assert runs == []  # refused before the forward pass
        _, cache = model.run_with_cache("ab cd", device="cpu", names="blocks.0.hook_resid_pre")
        assert runs == [1] and cache["blocks.0.hook_resid_pre"].device.type == "cpu"
        with pytest.raises(ValueError, match="device"):
            cache.to("nodevice")
    finally:
        model.reset_hooks()
