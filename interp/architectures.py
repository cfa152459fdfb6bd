"""Where each canonical hook lives inside a Hugging Face module tree (torch and nnsight backends).

The module paths come from TransformerLens's bridge architecture adapters (``component_mapping``:
embed, blocks, ln1, ln2, attn.q/k/v/o or attn.qkv, mlp.in/out, ln_final, ...), so every architecture
TransformerLens knows is covered without a hand-written table. Written by hand is only what no library
has: the per-head views on raw HF modules (:class:`Heads`, the joint-QKV slicing of GPT-2 and
GPT-NeoX) and the DINOv2 layout, which TransformerLens does not cover.

A :class:`Site` says where a canonical tensor lives: a module path, whether it is that module's input
(first positional argument) or output, and a :class:`Lens` that reads the canonical tensor out of the
raw value and writes a replacement back.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .names import BLOCK_HOOKS, order_key


# --------------------------------------------------------------------------------------------- lenses
class Lens:
    """A view into a raw module value: ``get(raw) -> tensor`` and ``set(raw, tensor) -> new raw``."""

    writable: bool = True

    def get(self, raw: Any) -> torch.Tensor:
        raise NotImplementedError

    def set(self, raw: Any, value: torch.Tensor) -> Any:
        raise NotImplementedError

    def __rshift__(self, other: "Lens") -> "Lens":
        return Chain(self, other)


class Identity(Lens):
    def get(self, raw):
        return raw

    def set(self, raw, value):
        return value


class Item(Lens):
    """Element ``index`` of a tuple output (a bare tensor counts as a 1-tuple)."""

    def __init__(self, index: int, writable: bool = True):
        self.index = index
        self.writable = writable

    def get(self, raw):
        if isinstance(raw, (tuple, list)):
            return raw[self.index]
        if hasattr(raw, "to_tuple") and not isinstance(raw, torch.Tensor):
            return raw.to_tuple()[self.index]
        if self.index == 0:
            return raw
        raise TypeError(f"expected a tuple output with an element {self.index}, got {type(raw).__name__}")

    def set(self, raw, value):
        if isinstance(raw, (tuple, list)):
            items = list(raw)
            items[self.index] = value
            return type(raw)(items) if isinstance(raw, tuple) and type(raw) is tuple else tuple(items)
        return value


class Heads(Lens):
    """``[..., n_heads * d_head]`` <-> ``[..., n_heads, d_head]``."""

    def __init__(self, n_heads: int):
        self.n_heads = n_heads

    def get(self, raw):
        return raw.unflatten(-1, (self.n_heads, -1))

    def set(self, raw, value):
        return value.flatten(-2)


class LastDimSlice(Lens):
    """Columns ``[start, stop)`` of the last axis (GPT-2's joint ``c_attn`` output holds q | k | v)."""

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop

    def get(self, raw):
        return raw[..., self.start:self.stop]

    def set(self, raw, value):
        return torch.cat([raw[..., :self.start], value.to(raw.dtype), raw[..., self.stop:]], dim=-1)


class InterleavedQKV(Lens):
    """GPT-NeoX's ``query_key_value`` output: per head ``[q | k | v]``; gives ``[..., head, d_head]``."""

    def __init__(self, n_heads: int, which: int):
        self.n_heads, self.which = n_heads, which

    def get(self, raw):
        per_head = raw.unflatten(-1, (self.n_heads, -1))
        d = per_head.shape[-1] // 3
        return per_head[..., self.which * d:(self.which + 1) * d]

    def set(self, raw, value):
        per_head = raw.unflatten(-1, (self.n_heads, -1))
        d = per_head.shape[-1] // 3
        parts = [per_head[..., i * d:(i + 1) * d] for i in range(3)]
        parts[self.which] = value.to(raw.dtype)
        return torch.cat(parts, dim=-1).flatten(-2)


class NormLens(Lens):
    """``hook_scale`` / ``hook_normalized`` of a LayerNorm or RMSNorm module, as TransformerLens defines them.

    ``hook_scale`` is ``sqrt(mean(x_c^2) + eps)`` (``[..., 1]``; ``x_c`` = ``x`` centred for LayerNorm, ``x``
    for RMSNorm) and ``hook_normalized`` is ``x_c / scale``, *before* the norm's weight and bias, on
    every backend. Both are computed from the module's input (HF exposes only the weighted output);
    ``hook_scale`` is read-only, and a write to ``hook_normalized`` recomputes the module output as
    ``normalized * (w + offset) + b`` (``offset`` is 1 for Gemma's ``(1 + w)`` RMSNorm).
    """

    needs_input = True

    def __init__(self, part: str, kind: str, offset: float = 0.0):
        if part not in ("scale", "normalized") or kind not in ("layer", "rms"):
            raise ValueError(f"NormLens(part={part!r}, kind={kind!r})")
        self.part, self.kind, self.offset = part, kind, offset
        self.writable = part == "normalized"

    @staticmethod
    def _eps(module) -> float:
        for key in ("eps", "variance_epsilon", "epsilon"):
            v = getattr(module, key, None)
            if isinstance(v, (int, float)):
                return float(v)
        raise ValueError(f"cannot find the epsilon of {type(module).__name__}")

    def parts(self, module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        if self.kind == "layer":
            xf = xf - xf.mean(-1, keepdim=True)
        scale = (xf.pow(2).mean(-1, keepdim=True) + self._eps(module)).sqrt()
        return scale, xf / scale

    def get_io(self, module, inp: torch.Tensor, out: Any) -> torch.Tensor:
        scale, normalized = self.parts(module, inp)
        return (scale if self.part == "scale" else normalized).to(inp.dtype)

    def set_io(self, module, inp: torch.Tensor, out: Any, value: torch.Tensor) -> Any:
        w = getattr(module, "weight", None)
        b = getattr(module, "bias", None)
        y = value.float()
        if w is not None:
            y = y * (w.float() + self.offset)
        if b is not None:
            y = y + b.float()
        y = y.to(out.dtype if isinstance(out, torch.Tensor) else value.dtype)
        return Item(0).set(out, y)


class HeadResult(Lens):
    """``attn.hook_result``: each head's output ``z_h @ W_O[h]`` ``[..., head, d_model]``, without the output
    bias (TransformerLens adds ``b_O`` after the sum over heads), read at the attention output projection
    from its input ``z`` and its weight (``nn.Linear`` ``[d_model, H * d_head]`` or GPT-2's ``Conv1D``
    ``[H * d_head, d_model]``). Computed in float32, as :meth:`interp.Cache.stack_head_results` does. A write
    replaces the projection's output by ``sum_h result_h + b_O``."""

    needs_input = True

    def __init__(self, n_heads: int):
        self.n_heads = n_heads

    def _w_o(self, module) -> torch.Tensor:
        w = module.weight.float()
        if type(module).__name__ != "Conv1D":
            w = w.T  # [in = H * d_head, d_model]
        return w.unflatten(0, (self.n_heads, -1))  # [H, d_head, d_model]

    def get_io(self, module, inp: torch.Tensor, out: Any) -> torch.Tensor:
        z = inp.unflatten(-1, (self.n_heads, -1))
        return torch.einsum("...he,hed->...hd", z.float(), self._w_o(module)).to(inp.dtype)

    def set_io(self, module, inp: torch.Tensor, out: Any, value: torch.Tensor) -> Any:
        y = value.float().sum(-2)
        b = getattr(module, "bias", None)
        if b is not None:
            y = y + b.float()
        return Item(0).set(out, y.to(Item(0).get(out).dtype))


class Chain(Lens):
    def __init__(self, *lenses: Lens):
        self.lenses = lenses
        self.writable = all(lens.writable for lens in lenses)

    def get(self, raw):
        for lens in self.lenses:
            raw = lens.get(raw)
        return raw

    def set(self, raw, value):
        inner = [raw]
        for lens in self.lenses[:-1]:
            inner.append(lens.get(inner[-1]))
        for lens, outer in zip(reversed(self.lenses), reversed(inner)):
            value = lens.set(outer, value)
        return value


# ---------------------------------------------------------------------------------------------- sites
@dataclass(frozen=True)
class Site:
    """A canonical activation inside an HF module tree."""

    module: str
    io: str  # "input" | "output" | "attention" (inside the attention function: see backends/attention.py)
    lens: Lens = field(default_factory=Identity)

    @property
    def needs_input(self) -> bool:
        """The lens reads the module's input as well as its output (``get_io`` / ``set_io``)."""
        return bool(getattr(self.lens, "needs_input", False))


@dataclass
class ArchSpec:
    """Module paths of one architecture (relative to the root module handed to the backend)."""

    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    embed: str | None
    blocks: str
    attn: str
    q: str | None = None
    k: str | None = None
    v: str | None = None
    qkv: str | None = None
    qkv_layout: str = "split"  # "split" (separate q/k/v), "concat" (GPT-2), "interleaved" (NeoX)
    o: str | None = None
    ln1: str | None = None
    ln2: str | None = None
    norm_kind: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    norm_offset: float = 0.0  # 1.0 where the RMSNorm multiplies by (1 + w) (Gemma)
    act: str | None = None  # the MLP's activation module (its input is mlp.hook_pre)
    mlp_gate_path: str | None = None  # gated MLP (Llama, Gemma): the gate branch; mlp_in is the linear branch

    @property
    def mlp_gate(self) -> bool:
        return self.mlp_gate_path is not None
    mlp_in: str | None = None
    mlp_out: str | None = None
    attn_out_norm: str | None = None  # Gemma-2/3 post-attention norm, DINOv2 layer scale
    mlp_out_norm: str | None = None
    resid_mid_from: str | None = None  # post-norm models (BERT): output of this module
    ln_final: str | None = None
    parallel: bool = False  # GPT-NeoX/Pythia parallel attention+MLP: there is no resid_mid
    vocab: int | None = None
    rotary: bool = False  # rotary position embeddings: attn.hook_rot_q / hook_rot_k exist
    pos_embed: str | None = None  # a learned position table (GPT-2's wpe): ``W_pos``

    def sites(self) -> dict[str, Site]:
        """Canonical name -> Site for every hook this architecture offers, in execution order."""
        out: dict[str, Site] = {}
        first = Item(0)
        if self.embed:
            out["hook_embed"] = Site(self.embed, "output", first)
        for layer in range(self.n_layers):
            blk = f"{self.blocks}.{layer}"
            sub = lambda p: f"{blk}.{p}"  # noqa: E731
            s: dict[str, Site] = {"hook_resid_pre": Site(blk, "input")}
            for ln, path in (("ln1", self.ln1), ("ln2", self.ln2)):
                if path:
                    for part in ("scale", "normalized"):
                        s[f"{ln}.hook_{part}"] = Site(sub(path), "output", NormLens(part, self.norm_kind, self.norm_offset))
            if self.act:
                s["mlp.hook_pre"] = Site(sub(self.act), "input")
            elif self.mlp_in and not self.mlp_gate:  # the activation is a function (ESM): its input is mlp_in's output
                s["mlp.hook_pre"] = Site(sub(self.mlp_in), "output", first)
            if self.mlp_gate and self.mlp_in:
                s["mlp.hook_pre_linear"] = Site(sub(self.mlp_in), "output", first)
            if self.qkv_layout == "split":
                s["attn.hook_q"] = Site(sub(self.q), "output", Heads(self.n_heads))
                s["attn.hook_k"] = Site(sub(self.k), "output", Heads(self.n_kv_heads))
                s["attn.hook_v"] = Site(sub(self.v), "output", Heads(self.n_kv_heads))
            elif self.qkv_layout == "concat":
                d = self.n_heads * self.d_head
                for i, h in enumerate(("q", "k", "v")):
                    s[f"attn.hook_{h}"] = Site(sub(self.qkv), "output", LastDimSlice(i * d, (i + 1) * d) >> Heads(self.n_heads))
            else:
                for i, h in enumerate(("q", "k", "v")):
                    s[f"attn.hook_{h}"] = Site(sub(self.qkv), "output", InterleavedQKV(self.n_heads, i))
            for kind in (("rot_q", "rot_k") if self.rotary else ()) + ("attn_scores", "pattern"):
                s[f"attn.hook_{kind}"] = Site(sub(self.attn), "attention")
            s["attn.hook_z"] = Site(sub(self.o), "input", Heads(self.n_heads))
            s["attn.hook_result"] = Site(sub(self.o), "output", HeadResult(self.n_heads))
            s["hook_attn_out"] = Site(sub(self.attn_out_norm or self.o), "output", first)
            if self.resid_mid_from:
                s["hook_resid_mid"] = Site(sub(self.resid_mid_from), "output", first)
            elif not self.parallel and self.ln2:
                s["hook_resid_mid"] = Site(sub(self.ln2), "input")
            s["mlp.hook_post"] = Site(sub(self.mlp_out), "input")
            s["hook_mlp_out"] = Site(sub(self.mlp_out_norm or self.mlp_out), "output", first)
            s["hook_resid_post"] = Site(blk, "output", first)
            for hook in BLOCK_HOOKS:
                if hook in s:
                    out[f"blocks.{layer}.{hook}"] = s[hook]
        if self.ln_final:
            for part in ("scale", "normalized"):
                out[f"ln_final.hook_{part}"] = Site(self.ln_final, "output", NormLens(part, self.norm_kind, self.norm_offset))
        return dict(sorted(out.items(), key=lambda kv: order_key(kv[0], self.n_layers)))


# ------------------------------------------------------------------------------------ path resolution
def resolve_path(root: nn.Module, path: str) -> str | None:
    """Find ``path`` in ``root``; adapters name paths from the *ForCausalLM* class, so a base model
    (``LlamaModel``, ``BertModel``) is matched by suffix (``model.layers`` -> ``layers``) and a wrapper
    with an extra prefix by unique suffix."""
    names = dict(root.named_modules())
    if path in names:
        return path
    parts = path.split(".")
    for i in range(1, len(parts)):
        cand = ".".join(parts[i:])
        if cand in names:
            return cand
    hits = [n for n in names if n.endswith("." + path)]
    return min(hits, key=len) if hits else None


def _hf_config(model: nn.Module):
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise ValueError(f"{type(model).__name__} has no `.config`: the torch and nnsight backends need a "
                         "Hugging Face PreTrainedModel (or pass arch=ArchSpec(...) to interp.wrap)")
    return cfg


def _tl_adapter(hf_config):
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory
    from transformer_lens.model_bridge.sources.transformers import (
        determine_architecture_from_hf_config, map_default_transformer_lens_config)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tl_cfg = map_default_transformer_lens_config(hf_config)
        bridge_cfg = TransformerBridgeConfig.from_dict(dict(tl_cfg.__dict__))
        bridge_cfg.architecture = determine_architecture_from_hf_config(hf_config)
        return ArchitectureAdapterFactory.select_architecture_adapter(bridge_cfg)


_FOR_TYPE = {"bert": "BertForMaskedLM", "vit": "ViTForImageClassification", "gpt2": "GPT2LMHeadModel",
             "gpt_neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
             "qwen2": "Qwen2ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
             "gemma3_text": "Gemma3ForCausalLM"}


def arch_spec(model: nn.Module) -> ArchSpec:
    """Derive the :class:`ArchSpec` of a Hugging Face model from TransformerLens's adapter for it."""
    cfg = _hf_config(model)
    if cfg.model_type == "dinov2":
        return _dinov2_spec(model, cfg)
    if cfg.model_type == "esm":
        return _esm_spec(model, cfg)
    adapter_cfg = cfg
    archs = list(getattr(cfg, "architectures", None) or [])
    wanted = _FOR_TYPE.get(cfg.model_type)
    if wanted and (not archs or archs[0] != wanted):
        adapter_cfg = type(cfg).from_dict(cfg.to_dict())
        adapter_cfg.architectures = [wanted]
    try:
        adapter = _tl_adapter(adapter_cfg)
    except Exception as exc:  # noqa: BLE001 - re-raised with the cause
        raise ValueError(f"no architecture map for model_type={cfg.model_type!r} "
                         f"({type(model).__name__}): {exc}") from exc
    comp = adapter.component_mapping
    tl = adapter.cfg

    def name(node) -> str | None:
        return getattr(node, "name", None) if node is not None else None

    def path(p: str | None) -> str | None:
        return resolve_path(model, p) if p else None

    blocks_node = comp["blocks"]
    blocks = path(name(blocks_node))
    if blocks is None:
        raise ValueError(f"cannot find the blocks ({name(blocks_node)}) of {type(model).__name__}")
    bsub = blocks_node.submodules
    block0 = model.get_submodule(f"{blocks}.0")

    def local(p: str | None) -> str | None:
        return resolve_path(block0, p) if p else None

    attn_node = bsub["attn"]
    attn = local(name(attn_node))
    asub = getattr(attn_node, "submodules", {}) or {}
    mlp_node = bsub.get("mlp")
    msub = getattr(mlp_node, "submodules", {}) or {}

    def in_attn(key: str) -> str | None:
        n = name(asub.get(key))
        if n is None:
            return None
        return local(f"{name(attn_node)}.{n}") if name(attn_node) else local(n)

    def in_mlp(key: str) -> str | None:
        n = name(msub.get(key))
        if n is None:
            return None
        return local(f"{name(mlp_node)}.{n}") if name(mlp_node) else local(n)

    q, k, v, qkv = in_attn("q"), in_attn("k"), in_attn("v"), in_attn("qkv")
    layout = "split" if (q and k and v) else ("interleaved" if cfg.model_type == "gpt_neox" else "concat")
    n_heads = int(tl.n_heads)
    n_kv = int(getattr(tl, "n_key_value_heads", None) or n_heads)
    post_norm = cfg.model_type == "bert"
    ln1 = local(name(bsub.get("ln1")))  # BERT (post-norm): the attention block's output LayerNorm
    ln_module = block0.get_submodule(ln1) if ln1 else None
    mlp_path = local(name(mlp_node)) if mlp_node is not None else None
    spec = ArchSpec(
        family=cfg.model_type, n_layers=int(tl.n_layers), n_heads=n_heads, n_kv_heads=n_kv,
        d_model=int(tl.d_model), d_head=int(tl.d_head),
        embed=path(name(comp.get("embed"))) if cfg.model_type != "vit" else path(name(comp.get("embed"))),
        blocks=blocks, attn=attn, q=q, k=k, v=v, qkv=qkv, qkv_layout=layout, o=in_attn("o"),
        ln1=ln1, ln2=local(name(bsub.get("ln2"))),
        norm_kind=_norm_kind(ln_module), norm_offset=1.0 if cfg.model_type.startswith("gemma") else 0.0,
        act=_act_path(block0, mlp_path), mlp_gate_path=in_mlp("gate"),
        mlp_in=in_mlp("in"), mlp_out=in_mlp("out"),
        attn_out_norm=local(name(bsub.get("ln1_post"))), mlp_out_norm=local(name(bsub.get("ln2_post"))),
        resid_mid_from=local(name(bsub.get("ln1"))) if post_norm else None,
        ln_final=None if post_norm else path(name(comp.get("ln_final"))),
        parallel=bool(getattr(cfg, "use_parallel_residual", False)),
        vocab=getattr(tl, "d_vocab", None),
        rotary=getattr(tl, "positional_embedding_type", None) == "rotary",
        pos_embed=path(name(comp.get("pos_embed"))),
    )
    missing = [f for f in ("attn", "o", "mlp_out") if getattr(spec, f) is None]
    if missing or (layout != "split" and qkv is None):
        raise ValueError(f"architecture map for {cfg.model_type!r} is incomplete (missing {missing})")
    return spec


def _norm_kind(module: nn.Module | None) -> str:
    if module is None or isinstance(module, nn.LayerNorm) or getattr(module, "bias", None) is not None:
        return "layer"
    return "rms" if "rms" in type(module).__name__.lower() or hasattr(module, "variance_epsilon") else "layer"


def norm_parts(module: nn.Module, offset: float = 0.0) -> tuple[torch.Tensor | None, torch.Tensor | None, str, float]:
    """``(weight (+ offset), bias, kind, eps)`` of a LayerNorm/RMSNorm module (HF or TransformerLens)."""
    w = getattr(module, "weight", None)
    if w is None:
        w = getattr(module, "w", None)
    b = getattr(module, "bias", None)
    if b is None:
        b = getattr(module, "b", None)
    kind = _norm_kind(module) if not hasattr(module, "w") else ("layer" if b is not None else "rms")
    eps = NormLens._eps(module) if any(hasattr(module, k) for k in ("eps", "variance_epsilon", "epsilon")) else 1e-5
    w = None if w is None else (w.detach() + offset)
    return w, None if b is None else b.detach(), kind, eps


_ACT_NAMES = ("act_fn", "act", "activation", "activation_fn", "intermediate_act_fn")


def _act_path(block: nn.Module, mlp_path: str | None) -> str | None:
    """The MLP activation module of a block (its input is ``mlp.hook_pre``), if it is a module."""
    roots = [mlp_path] if mlp_path else []
    roots += [n for n, _ in block.named_modules() if n.endswith("intermediate")]
    for root in roots:
        mod = block.get_submodule(root)
        for attr in _ACT_NAMES:
            child = getattr(mod, attr, None)
            if isinstance(child, nn.Module) and not list(child.parameters()):
                return f"{root}.{attr}"
    return None


def _dinov2_spec(model: nn.Module, cfg) -> ArchSpec:
    """DINOv2 (not covered by TransformerLens): pre-norm ViT blocks with layer scale."""
    blocks = resolve_path(model, "encoder.layer")
    prefix = blocks[: -len("encoder.layer")]
    n_heads = cfg.num_attention_heads
    return ArchSpec(
        family="dinov2", n_layers=cfg.num_hidden_layers, n_heads=n_heads, n_kv_heads=n_heads,
        d_model=cfg.hidden_size, d_head=cfg.hidden_size // n_heads, embed=f"{prefix}embeddings",
        blocks=blocks, attn="attention", q="attention.q_proj", k="attention.k_proj", v="attention.v_proj",
        o="attention.o_proj", ln1="norm1", ln2="norm2", mlp_in="mlp.fc1", mlp_out="mlp.fc2",
        act=_act_path(model.get_submodule(f"{blocks}.0"), "mlp"),
        attn_out_norm="layer_scale1", mlp_out_norm="layer_scale2", ln_final=f"{prefix}layernorm",
    )


def _esm_spec(model: nn.Module, cfg) -> ArchSpec:
    """ESM / ESM-2 (``EsmForMaskedLM``, ``EsmModel``; not covered by TransformerLens): pre-norm blocks whose
    output modules add the residual themselves (``attention.output`` = ``dense`` + residual, ``output`` =
    ``dense`` + residual), the MLP activation a function (``mlp.hook_pre`` is the output of
    ``intermediate.dense``), a final ``emb_layer_norm_after``, rotary embeddings (ESM-2) or learned absolute
    positions (ESM-1b). ESM scales the query by ``1/sqrt(d_head)`` *before* rotary, so ``attn.hook_rot_q`` is
    that scaled, rotated query and ``hook_attn_scores`` is ``rot_q @ rot_k^T``."""
    blocks = resolve_path(model, "encoder.layer")
    if blocks is None:
        raise ValueError(f"cannot find the ESM blocks (encoder.layer) of {type(model).__name__}")
    prefix = blocks[: -len("encoder.layer")]
    n_heads = cfg.num_attention_heads
    final = f"{prefix}encoder.emb_layer_norm_after"
    has_final = final in dict(model.named_modules())
    lm = "lm_head" in dict(model.named_children())
    return ArchSpec(
        family="esm", n_layers=cfg.num_hidden_layers, n_heads=n_heads, n_kv_heads=n_heads,
        d_model=cfg.hidden_size, d_head=cfg.hidden_size // n_heads, embed=f"{prefix}embeddings",
        blocks=blocks, attn="attention", q="attention.self.query", k="attention.self.key",
        v="attention.self.value", o="attention.output.dense", ln1="attention.LayerNorm", ln2="LayerNorm",
        mlp_in="intermediate.dense", mlp_out="output.dense", ln_final=final if has_final else None,
        rotary=getattr(cfg, "position_embedding_type", "absolute") == "rotary",
        vocab=cfg.vocab_size if lm else None,
    )
