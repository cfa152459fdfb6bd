"""The write check of the conformance suite (interp.conformance.check_writes) and the refusal of NaN at real tokens.

The family suite (test_families.py) runs ``check_writes`` on every family and backend; here: the branch points it
finds are the ones each family's ``modeling_*.py`` names (known answers), a mis-mapped write is reported as wrong
at its site, and a padded forward pass that Hugging Face's float64 eager attention turns to NaN at real tokens is
refused in one line instead of returning NaN logits."""
from __future__ import annotations

import warnings

import pytest
import torch
import transformers

import interp
from interp.conformance import SEQUENCES, branch_points, check_writes, save_family


def _hf(folder, dtype=torch.float64, attn="eager"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn).eval()


@pytest.mark.parametrize("family,attn,mlp,factor", [
    ("llama", "self_attn", "mlp", 1.0),
    ("gemma2", "post_attention_layernorm", "post_feedforward_layernorm", 1.0),  # post-norms: what is added
    ("bloom", "self_attention.dense", "mlp.dense_4h_to_h", 1.0),  # the residual is added inside the modules
    ("granite", "self_attn", "mlp", None),  # the residual multiplier is the factor
    ("opt", "self_attn", "fc2", 1.0),  # the MLP runs on [batch * pos, d]
])
def test_branch_points_are_the_modeling_files(family, attn, mlp, factor, tmp_path):
    hf = _hf(save_family(family, tmp_path / family), torch.float32 if family == "bloom" else torch.float64)
    points = branch_points(hf, torch.tensor(SEQUENCES[0]), 1, tol=1e-4)
    want = factor if factor is not None else hf.config.residual_multiplier
    assert points["attn"][0] == attn and points["mlp"][0] == mlp
    assert points["attn"][1] == pytest.approx(want, rel=1e-5) and points["mlp"][1] == pytest.approx(want, rel=1e-5)
    if factor is None:
        assert want != 1.0  # the test family has a real multiplier


class _Misrouted:
    """A model whose writes to ``hook_attn_out`` land on ``hook_mlp_out`` (a planted mapping bug)."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def intervene(self, interventions):
        return self.model.intervene({k.replace("hook_attn_out", "hook_mlp_out"): v for k, v in interventions.items()})

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)


@pytest.mark.parametrize("backend", ["torch", "transformer_lens"])
def test_writes_pass_and_a_misrouted_write_is_caught(backend, tmp_path):
    folder = save_family("llama", tmp_path / "llama")
    hf = _hf(folder)
    model = interp.load(folder, backend=backend, dtype=torch.float64, attn_implementation="eager")
    for side in ("right", "left"):
        assert check_writes(model, hf, SEQUENCES, side, tol=1e-6).status == "ok"
    bad = check_writes(_Misrouted(model), hf, SEQUENCES, "right", tol=1e-6)
    assert bad.status == "wrong" and bad.site == "blocks.1.hook_attn_out" and bad.error > 1e-3


def _left_padded():
    width = max(map(len, SEQUENCES))
    ids = torch.zeros((len(SEQUENCES), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(SEQUENCES):
        ids[i, width - len(s):], mask[i, width - len(s):] = torch.tensor(s), 1
    return ids, mask


@pytest.mark.parametrize("backend", ["torch", "nnsight"])
def test_nan_at_real_tokens_is_refused_in_one_line(backend, tmp_path):
    """HF's eager attention in float64 runs its softmax in float32, where the float64 mask value is -inf: a fully
    padded query row becomes NaN and reaches the real rows. The plain forward refuses; sdpa gives HF's numbers."""
    folder = save_family("llama", tmp_path / "llama")
    ids, mask = _left_padded()
    with torch.no_grad():
        raw = _hf(folder)(input_ids=ids, attention_mask=mask).logits
    assert raw[mask.bool()].isnan().any()  # the upstream behaviour being guarded against
    model = interp.load(folder, backend=backend, dtype=torch.float64, attn_implementation="eager")
    with pytest.raises(RuntimeError, match=r"NaN at real tokens of this left-padded batch for the llama family") as e:
        model(ids, attention_mask=mask)
    assert "\n" not in str(e.value) and "attn_implementation='sdpa'" in str(e.value)
    sdpa = interp.load(folder, backend=backend, dtype=torch.float64, attn_implementation="sdpa")
    got = sdpa(ids, attention_mask=mask)
    hf = _hf(folder, attn="sdpa")  # each sequence alone (no padding); eager's softmax would run in float32
    for i, s in enumerate(SEQUENCES):
        with torch.no_grad():
            want = hf(input_ids=torch.tensor(s)[None]).logits[0]
        assert torch.allclose(got[i, mask[i].bool()], want, atol=1e-12, rtol=0)
