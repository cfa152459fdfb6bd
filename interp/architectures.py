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


class Columns(Lens):
    """Columns ``index`` of the last axis, in that order (a copy): one of q, k, v out of a fused projection
    whose layout interleaves them (per head, per key/value group, per model-parallel shard); see
    :func:`qkv_columns`. A write puts the new columns back in place."""

    def __init__(self, index: torch.Tensor):
        self.index = index

    def get(self, raw):
        return raw.index_select(-1, self.index.to(raw.device))

    def set(self, raw, value):
        return raw.index_copy(-1, self.index.to(raw.device), value.to(raw.dtype))


class Scaled(Lens):
    """``factor * raw``: a sub-layer output that the block multiplies before the residual add (Granite's
    ``residual_multiplier``, its ``embedding_multiplier``); a write stores ``value / factor``."""

    def __init__(self, factor: float):
        if not factor:
            raise ValueError("Scaled needs a non-zero factor")
        self.factor = float(factor)

    def get(self, raw):
        return raw * self.factor

    def set(self, raw, value):
        return value / self.factor


#: the fused query/key/value layouts :func:`qkv_columns` knows
QKV_LAYOUTS = ("split", "concat", "per_head", "grouped", "codegen")


def qkv_columns(layout: str, which: int, n_heads: int, n_kv_heads: int, d_head: int, shards: int = 4) -> torch.Tensor:
    """The columns of a fused q/k/v projection's output that hold q (``which=0``), k (1) or v (2), ordered as
    ``[head, d_head]`` (``n_heads`` heads for q, ``n_kv_heads`` for k and v).

    Layouts (from each family's Hugging Face code): ``concat`` ``[q | k | v]`` (GPT-2, Phi-3, multi-query
    GPT-BigCode and Falcon); ``per_head`` ``[head][q | k | v]`` (GPT-NeoX, Bloom, multi-head Falcon and
    GPT-BigCode); ``grouped`` ``[kv group][q x (H / kv) | k | v]`` (Falcon's new decoder architecture);
    ``codegen`` ``[shard][q | v | k]`` over CodeGen's ``shards`` model-parallel shards."""
    H, K, d = n_heads, n_kv_heads, d_head
    if layout == "concat":
        start = (0, H * d, H * d + K * d)[which]
        return torch.arange(start, start + (H if which == 0 else K) * d)
    if layout == "per_head":
        if K != H:
            raise ValueError("the per-head q/k/v layout has as many key/value heads as query heads")
        return (torch.arange(H)[:, None] * 3 * d + which * d + torch.arange(d)[None, :]).flatten()
    if layout == "grouped":
        G = H // K
        group = torch.arange(K) * (G + 2) * d
        if which == 0:
            return (group[:, None, None] + torch.arange(G)[None, :, None] * d + torch.arange(d)).flatten()
        return (group[:, None] + (G + which - 1) * d + torch.arange(d)[None, :]).flatten()
    if layout == "codegen":
        local = H * d // shards
        f = torch.arange(H * d)
        offset = (0, 2, 1)[which] * local  # each shard holds [q | v | k]
        return (f // local) * 3 * local + f % local + offset
    raise ValueError(f"unknown q/k/v layout {layout!r}; known: {', '.join(QKV_LAYOUTS)}")


class NormLens(Lens):
    """``hook_scale`` / ``hook_normalized`` of a LayerNorm or RMSNorm module, as TransformerLens defines them.

    ``hook_scale`` is ``sqrt(mean(x_c^2) + eps)`` (``[..., 1]``; ``x_c`` = ``x`` centred for LayerNorm, ``x``
    for RMSNorm) and ``hook_normalized`` is ``x_c / scale``, *before* the norm's weight and bias, on
    every backend. Both are computed from the module's input (HF exposes only the weighted output). As in
    TransformerLens, ``hook_normalized`` is ``x_c / s`` with ``s`` the (possibly hooked) ``hook_scale`` of the same
    call (passed as ``scale``), and a write to either recomputes the module output as
    ``x_c / s * (w + offset) + b`` (``offset`` is 1 for Gemma's ``(1 + w)`` RMSNorm); with a graph the output is
    recomputed so, which makes both sites differentiable (gradients and backward hooks) as TL's.
    """

    needs_input = True

    def __init__(self, part: str, kind: str, offset: float = 0.0):
        if part not in ("scale", "normalized") or kind not in ("layer", "rms"):
            raise ValueError(f"NormLens(part={part!r}, kind={kind!r})")
        self.part, self.kind, self.offset = part, kind, offset

    @staticmethod
    def _eps(module) -> float:
        for key in ("eps", "variance_epsilon", "epsilon", "layer_norm_eps"):
            v = getattr(module, key, None)
            if isinstance(v, (int, float)):
                return float(v)
        if type(module).__name__ == "OlmoLayerNorm":  # F.layer_norm(..., eps=1e-5), hard-coded by the module
            return 1e-5
        raise ValueError(f"cannot find the epsilon of {type(module).__name__}")

    def parts(self, module, x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale [..., 1], normalized [..., d])`` of the norm input ``x`` in float32; a given ``scale`` (the
        hooked ``hook_scale``) is used instead of the one computed from ``x``."""
        xf = x.float()
        if self.kind == "layer":
            xf = xf - xf.mean(-1, keepdim=True)
        if scale is None:
            scale = (xf.pow(2).mean(-1, keepdim=True) + self._eps(module)).sqrt()
        return scale, xf / scale.float()

    def get_io(self, module, inp: torch.Tensor, out: Any, scale: torch.Tensor | None = None) -> torch.Tensor:
        s, normalized = self.parts(module, inp, scale)
        return (s if self.part == "scale" else normalized).to(inp.dtype)

    def set_io(self, module, inp: torch.Tensor, out: Any, value: torch.Tensor) -> Any:
        w = getattr(module, "weight", None)
        b = getattr(module, "bias", None)
        y = value.float() if self.part == "normalized" else self.parts(module, inp, value)[1]
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
    #: the module sees the tokens flattened to rows (``[batch * pos, ...]``, OPT's MLP): the backend shows
    #: hooks ``[batch, pos, ...]`` and flattens writes back
    token_rows: bool = False

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
    qkv_layout: str = "split"  # "split" (separate q/k/v) or a fused layout of qkv_columns
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
    mlp_module: str | None = None  # the whole MLP (a mixture of experts has no single mlp_out projection)
    resid_mid_at_mlp: bool = False  # post-norm blocks (OLMo-2/3): resid_mid is the MLP module's input
    attention_hooks: bool = True  # the attention module calls transformers' attention interface (pattern etc.)
    token_rows: tuple[str, ...] = ()  # hooks whose module sees [batch * pos, ...] rows (OPT's MLP half)
    residual_multiplier: float = 1.0  # Granite: sub-layer outputs are scaled before the residual add
    embedding_multiplier: float = 1.0  # Granite: the token embedding is scaled before block 0

    def sites(self) -> dict[str, Site]:
        """Canonical name -> Site for every hook this architecture offers, in execution order."""
        out: dict[str, Site] = {}
        first = Item(0)
        if self.embed:
            emb = first >> Scaled(self.embedding_multiplier) if self.embedding_multiplier != 1.0 else first
            out["hook_embed"] = Site(self.embed, "output", emb)
        if self.pos_embed:  # a learned position table (GPT-2, OPT): what it adds to the residual stream
            out["hook_pos_embed"] = Site(self.pos_embed, "output", first)
        added = first >> Scaled(self.residual_multiplier) if self.residual_multiplier != 1.0 else first
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
            else:
                for i, h in enumerate(("q", "k", "v")):
                    heads = Heads(self.n_heads if i == 0 else self.n_kv_heads)
                    cols = qkv_columns(self.qkv_layout, i, self.n_heads, self.n_kv_heads, self.d_head)
                    lens = LastDimSlice(int(cols[0]), int(cols[-1]) + 1) if self.qkv_layout == "concat" else Columns(cols)
                    s[f"attn.hook_{h}"] = Site(sub(self.qkv), "output", lens >> heads)
            if self.attention_hooks:
                for kind in (("rot_q", "rot_k") if self.rotary else ()) + ("attn_scores", "pattern"):
                    s[f"attn.hook_{kind}"] = Site(sub(self.attn), "attention")
            s["attn.hook_z"] = Site(sub(self.o), "input", Heads(self.n_heads))
            s["attn.hook_result"] = Site(sub(self.o), "output", HeadResult(self.n_heads))
            s["hook_attn_out"] = Site(sub(self.attn_out_norm or self.o), "output", added)
            if self.resid_mid_from:
                s["hook_resid_mid"] = Site(sub(self.resid_mid_from), "output", first)
            elif self.resid_mid_at_mlp and self.mlp_module:
                s["hook_resid_mid"] = Site(sub(self.mlp_module), "input")
            elif not self.parallel and self.ln2:
                s["hook_resid_mid"] = Site(sub(self.ln2), "input")
            if self.mlp_out:
                s["mlp.hook_post"] = Site(sub(self.mlp_out), "input")
            s["hook_mlp_out"] = Site(sub(self.mlp_out_norm or self.mlp_out or self.mlp_module), "output", added)
            s["hook_resid_post"] = Site(blk, "output", first)
            for hook in BLOCK_HOOKS:
                if hook in s:
                    site = s[hook]
                    if hook in self.token_rows:
                        site = Site(site.module, site.io, site.lens, token_rows=True)
                    out[f"blocks.{layer}.{hook}"] = site
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
    # the adapter is chosen by config.architectures, which is None for any model built in memory (and may name
    # a base model): fall back on the model's own class, then on the family's causal-LM class
    own = type(model).__name__
    wanted = _FOR_TYPE.get(cfg.model_type) or (own if own.endswith(("ForCausalLM", "LMHeadModel")) else None)
    if not archs or (wanted and archs[0] != wanted):
        adapter_cfg = type(cfg).from_dict(cfg.to_dict())
        adapter_cfg.architectures = [wanted or own]
    try:
        adapter = _tl_adapter(adapter_cfg)
    except Exception as exc:  # noqa: BLE001 - re-raised with the cause, in one line
        raise UnsupportedArchitecture(
            f"no architecture map for the {cfg.model_type!r} family ({own}) on the torch and nnsight backends: "
            f"TransformerLens has no adapter for {adapter_cfg.architectures[0]!r}; pass arch=ArchSpec(...) to "
            "interp.wrap") from exc
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
    layout = "split" if (q and k and v) else _fused_layout(cfg)
    n_heads = int(tl.n_heads)
    n_kv = _kv_heads(cfg, int(getattr(tl, "n_key_value_heads", None) or n_heads))
    d_head = int(tl.d_head)
    post_norm = cfg.model_type == "bert"
    ln1 = local(name(bsub.get("ln1")))  # BERT (post-norm): the attention block's output LayerNorm
    ln2 = local(name(bsub.get("ln2")))
    attn_out_norm, mlp_out_norm = local(name(bsub.get("ln1_post"))), local(name(bsub.get("ln2_post")))
    mlp_path = local(name(mlp_node)) if mlp_node is not None else None
    resid_mid_at_mlp = False
    if cfg.model_type in _POST_NORM_BLOCKS:  # OLMo-2/3: x + norm(attn(x)), then h + norm(mlp(h)); no pre-norms
        attn_out_norm, mlp_out_norm = _POST_NORM_BLOCKS[cfg.model_type]
        ln1 = ln2 = None
        resid_mid_at_mlp = True
    if cfg.model_type == "falcon":  # the new layout has one norm per branch; the multi-query one a single norm
        two = hasattr(block0, "ln_attn")
        ln1 = "ln_attn" if two else "input_layernorm"
        ln2 = "ln_mlp" if two else ("post_attention_layernorm" if hasattr(block0, "post_attention_layernorm") else None)
    resid_mid_from = local(name(bsub.get("ln1"))) if post_norm else None
    token_rows = _OPT_ROWS if cfg.model_type == "opt" else ()
    if cfg.model_type == "opt" and not getattr(cfg, "do_layer_norm_before", True):
        # post-norm OPT (opt-350m): x = norm1(x + attn(x)), then norm2(x + mlp(x)), as BERT: resid_mid is the
        # first norm's output, attn_out / mlp_out the sub-layers' outputs before the add
        resid_mid_from, ln1, ln2 = "self_attn_layer_norm", None, None
        token_rows = tuple(h for h in _OPT_ROWS if h != "hook_resid_mid")
    ln_module = block0.get_submodule(ln1 or ln2) if (ln1 or ln2) else block0.get_submodule(resid_mid_from) \
        if resid_mid_from else None
    mlp_out = in_mlp("out")
    parallel = bool(getattr(cfg, "use_parallel_residual", False) or getattr(cfg, "parallel_attn", False)
                    or getattr(cfg, "new_decoder_architecture", False)) or cfg.model_type in _PARALLEL_BLOCKS
    spec = ArchSpec(
        family=cfg.model_type, n_layers=int(tl.n_layers), n_heads=n_heads, n_kv_heads=n_kv,
        d_model=int(tl.d_model), d_head=d_head,
        embed=path(name(comp.get("embed"))),
        blocks=blocks, attn=attn, q=q, k=k, v=v, qkv=qkv, qkv_layout=layout, o=in_attn("o"),
        ln1=ln1, ln2=ln2,
        norm_kind=_norm_kind(ln_module), norm_offset=1.0 if cfg.model_type.startswith("gemma") else 0.0,
        act=_act_path(block0, mlp_path) if mlp_out else None, mlp_gate_path=in_mlp("gate") if mlp_out else None,
        mlp_in=in_mlp("in") if mlp_out else None, mlp_out=mlp_out,
        attn_out_norm=attn_out_norm, mlp_out_norm=mlp_out_norm,
        resid_mid_from=resid_mid_from,
        ln_final=None if post_norm else path(name(comp.get("ln_final"))),
        parallel=parallel,
        vocab=getattr(tl, "d_vocab", None),
        rotary=getattr(tl, "positional_embedding_type", None) == "rotary",
        pos_embed=path(name(comp.get("pos_embed"))),
        mlp_module=mlp_path, resid_mid_at_mlp=resid_mid_at_mlp,
        attention_hooks=_calls_attention_interface(block0.get_submodule(attn)) if attn else False,
        token_rows=token_rows,
        # Granite and its MoE variants scale sub-layer outputs and the embedding (x + m * f(x))
        residual_multiplier=float(getattr(cfg, "residual_multiplier", None) or 1.0),
        embedding_multiplier=float(getattr(cfg, "embedding_multiplier", None) or 1.0),
    )
    missing = [f for f in ("attn", "o") if getattr(spec, f) is None]
    if spec.mlp_out is None and spec.mlp_module is None:
        missing.append("mlp")
    if missing or (layout != "split" and qkv is None):
        raise UnsupportedArchitecture(f"the architecture map for the {cfg.model_type!r} family ({own}) is incomplete "
                                      f"(no {', '.join(missing) or 'fused qkv projection'} found) on the torch and "
                                      "nnsight backends; try backend='transformer_lens'")
    return spec


class UnsupportedArchitecture(ValueError):
    """No (complete) map of canonical hooks for this family on the torch / nnsight backends."""


#: families whose decoder blocks run attention and MLP in parallel from one residual stream (no resid_mid)
_PARALLEL_BLOCKS = frozenset({"gptj", "codegen", "phi", "cohere"})
#: post-norm blocks: (attention output norm, MLP output norm) inside the block
_POST_NORM_BLOCKS = {"olmo2": ("post_attention_layernorm", "post_feedforward_layernorm"),
                     "olmo3": ("post_attention_layernorm", "post_feedforward_layernorm")}
#: OPT flattens the tokens to rows for the second half of its decoder layer
_OPT_ROWS = ("hook_resid_mid", "ln2.hook_scale", "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_post",
             "hook_mlp_out")


def _fused_layout(cfg) -> str:
    """The fused q/k/v layout of a family (see :func:`qkv_columns`), read from its Hugging Face code."""
    t = cfg.model_type
    if t in ("gpt_neox", "bloom"):
        return "per_head"
    if t == "falcon":
        if getattr(cfg, "new_decoder_architecture", False):
            return "grouped"
        return "concat" if getattr(cfg, "multi_query", False) else "per_head"
    if t == "gpt_bigcode":
        return "concat" if getattr(cfg, "multi_query", True) else "per_head"
    if t == "codegen":
        return "codegen"
    return "concat"


def _kv_heads(cfg, default: int) -> int:
    """Key/value heads as the Hugging Face module computes them (TransformerLens's config can say otherwise
    for multi-query layouts)."""
    t = cfg.model_type
    if t == "falcon":
        if getattr(cfg, "new_decoder_architecture", False):
            return int(cfg.num_kv_heads)
        return 1 if getattr(cfg, "multi_query", False) else int(cfg.num_attention_heads)
    if t == "gpt_bigcode":
        return 1 if getattr(cfg, "multi_query", True) else int(cfg.n_head)
    kv = getattr(cfg, "num_key_value_heads", None)
    return int(kv) if kv else default


def _calls_attention_interface(attn: nn.Module) -> bool:
    """Whether an attention module computes attention through ``transformers``' attention interface (where
    :mod:`interp.backends.attention` sees the pattern); Bloom, Falcon and GPT-Neo compute it inline."""
    import inspect
    for mod in attn.modules():  # the module itself or the self-attention it wraps (BERT, ViT)
        try:
            src = inspect.getsource(type(mod).forward)
        except (OSError, TypeError):
            continue
        if "ALL_ATTENTION_FUNCTIONS" in src or "attention_interface" in src:
            return True
    return False


def _norm_kind(module: nn.Module | None) -> str:
    """``"layer"`` (centred: LayerNorm, Cohere's bias-free LayerNorm, OLMo's weightless one) or ``"rms"``."""
    if module is None or isinstance(module, nn.LayerNorm):
        return "layer"
    cls = type(module).__name__.lower()
    if "rms" in cls:
        return "rms"
    if "layernorm" in cls or getattr(module, "bias", None) is not None:
        return "layer"
    return "rms" if hasattr(module, "variance_epsilon") else "layer"


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
