"""The real models of the zoo load offline and pass their sanity checks on every backend that supports them."""
from __future__ import annotations

import json

import pytest
import torch

import interp
from interp import zoo
from interp.apps.zoo.real import MINILM_CHECK, mean_pool


# ------------------------------------------------------------------------------------------- SmolLM2
def test_smollm2_folder(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576 and cfg["num_key_value_heads"] == 3
    meta = zoo.info("smollm2-135m")
    assert meta.path == smollm2_dir and meta.metrics["ioi_top_token"] == " Mary"
    assert meta.metrics["n_params"] == 134_515_008


@pytest.fixture(scope="module")
def smollm2_models(smollm2_dir):
    return {}


@pytest.mark.parametrize("backend", ["torch", "nnsight", "transformer_lens"])
def test_smollm2_paris_on_backend(smollm2_dir, smollm2_models, backend):
    m = interp.load("zoo:smollm2-135m", backend=backend)
    out = m.generate("The capital of France is", max_new_tokens=2)
    assert out[0].startswith(" Paris"), out
    logits = m("The capital of France is")
    smollm2_models[backend] = logits[0, -1]
    if "torch" in smollm2_models and backend != "torch":  # every backend gives the same logits
        torch.testing.assert_close(smollm2_models[backend], smollm2_models["torch"], atol=1e-3, rtol=1e-4)


# ------------------------------------------------------------------------------------------- MiniLM
@pytest.mark.parametrize("backend", ["torch", "nnsight"])
def test_minilm_paraphrase_vs_unrelated(minilm_dir, backend):
    m = interp.load("zoo:minilm-l6", backend=backend)
    batch = m.tokenize(list(MINILM_CHECK))
    hidden = m(batch)
    hidden = getattr(hidden, "last_hidden_state", hidden)
    emb = torch.nn.functional.normalize(mean_pool(hidden, batch["attention_mask"]), dim=-1)
    para, unrel = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
    assert para > 0.6 and unrel < 0.2, (para, unrel)


def test_minilm_refused_by_transformer_lens(minilm_dir):
    with pytest.raises(ValueError, match="TransformerLens cannot bridge|backend='torch'"):
        interp.load("zoo:minilm-l6", backend="transformer_lens")


# ------------------------------------------------------------------------------------------- DINOv2
@pytest.mark.parametrize("backend", ["torch", "nnsight"])
def test_dinov2_equals_reference(dinov2_dir, backend):
    from safetensors.torch import load_file

    ref = load_file(str(dinov2_dir / "reference.safetensors"))  # onnxruntime output stored at build time
    m = interp.load("zoo:dinov2-s14", backend=backend)
    out = m(ref["pixel_values"])
    out = getattr(out, "last_hidden_state", out)
    assert out.shape == ref["last_hidden_state"].shape == (2, 257, 384)
    assert float((out - ref["last_hidden_state"]).abs().max()) < 1e-4
    assert zoo.info("dinov2-s14").metrics["max_abs_error_vs_onnxruntime"] < 1e-4


def test_dinov2_refused_by_transformer_lens(dinov2_dir):
    with pytest.raises(ValueError, match=r"TransformerLens cannot bridge the .dinov2. family \(Dinov2Model\): TransformerLens has no adapter"):
        interp.load("zoo:dinov2-s14", backend="transformer_lens")


def test_dinov2_folder(dinov2_dir):
    cfg = json.loads((dinov2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Dinov2Model"] and cfg["patch_size"] == 14 and cfg["num_hidden_layers"] == 12
    pre = json.loads((dinov2_dir / "preprocessor_config.json").read_text())
    assert pre["crop_size"] == {"height": 224, "width": 224}


def test_dinov2_matches_onnxruntime_directly(dinov2_dir):
    """Independent of the stored reference: a fresh input through onnxruntime and the cached model."""
    from transformers import Dinov2Model

    from interp.apps.zoo.real import _onnx_path, onnx_backbone_reference

    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(7))
    ref = onnx_backbone_reference(_onnx_path(), x)
    model = Dinov2Model.from_pretrained(dinov2_dir).eval()
    with torch.no_grad():
        got = model(pixel_values=x).last_hidden_state
    assert float((got - ref).abs().max()) < 1e-4
