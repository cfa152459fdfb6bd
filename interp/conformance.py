"""Conformance of a wrapped causal LM to Hugging Face's own module arithmetic, site group by site group.

The oracle never goes through a backend of ours: it runs the Hugging Face model itself, one unpadded
sequence at a time (so a padded batch must give the same numbers as the sequences alone), and reads

- the residual stream at each decoder layer's input and output (``hook_resid_pre`` / ``hook_resid_post``);
- what the attention and the MLP *add* to the residual stream, by running each decoder layer again on
  the same inputs with its MLP's output set to zero: ``attn_out = layer(x | mlp = 0) - x`` and
  ``mlp_out = layer(x) - layer(x | mlp = 0)``, which holds for sequential and parallel blocks, post-norms
  and residual multipliers alike (a post-norm or a multiplier of zero is zero);
- the per-head query, key and value projections, computed from the attention module's input and its
  weights with the family's own split of a fused projection (:data:`QKV_SPLITS`, written from each
  family's ``modeling_*.py``);
- the attention pattern from eager attention with ``output_attentions=True``, and the logits.

Writes are held to the same oracle (:func:`check_writes`): a vector added through ``model.intervene`` at the
residual stream, the attention output and the MLP output of the middle layer must give the logits of the
HF model with that vector added by a forward hook on its own module (the decoder layer's input or output,
or the submodule whose output is the branch's contribution, found from the oracle: :func:`branch_points`).

:func:`check` compares a :class:`~interp.Model` with that oracle and returns a :class:`Conformance`
(one status per site group); the support matrix in ``docs/architectures.md`` is generated from it
(``python scripts/support_matrix.py``), and ``tests/conformance/`` runs it over every family.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

#: the site groups :func:`check` reads and compares
READ_GROUPS = ("residual", "attn_out", "mlp_out", "qkv", "pattern", "norms", "logits")
#: the columns of the support matrix, in order: the hooks fire, the read groups, the writes (:func:`check_writes`)
GROUPS = ("fires", *READ_GROUPS, "writes")


# ------------------------------------------------------------------------------- per-family oracle
def _heads(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.unflatten(-1, (n, -1))


def _split_separate(attn: nn.Module, x: torch.Tensor, h: int, kv: int):
    names = [("q_proj", "k_proj", "v_proj"), ("query", "key", "value")]
    sub = getattr(attn, "attention", attn)  # GPT-Neo wraps its self-attention once more
    for trio in names:
        if all(hasattr(sub, n) for n in trio):
            q, k, v = (getattr(sub, n)(x) for n in trio)
            return _heads(q, h), _heads(k, kv), _heads(v, kv)
    raise KeyError(f"no q/k/v projections in {type(attn).__name__}")


def _split_concat(proj: str):
    """``[q (H d) | k (kv d) | v (kv d)]`` along the last axis (GPT-2, Phi-3, GPT-BigCode and Falcon
    multi-query)."""
    def split(attn, x, h, kv):
        y = getattr(attn, proj)(x)
        d = y.shape[-1] // (h + 2 * kv)
        q, k, v = y.split((h * d, kv * d, kv * d), dim=-1)
        return _heads(q, h), _heads(k, kv), _heads(v, kv)
    return split


def _split_per_head(proj: str):
    """``[head][q | k | v]`` (GPT-NeoX, Bloom, Falcon's old multi-head layout, GPT-BigCode multi-head)."""
    def split(attn, x, h, kv):
        y = _heads(getattr(attn, proj)(x), h)
        q, k, v = y.chunk(3, dim=-1)
        return q, k, v
    return split


def _split_falcon(attn, x, h, kv):
    cfg = attn.config
    y = attn.query_key_value(x)
    d = attn.head_dim
    if cfg.new_decoder_architecture:  # per key/value group: [q x (h / kv) | k | v]
        g = y.unflatten(-1, (kv, h // kv + 2, d))
        return g[..., :-2, :].flatten(-3, -2), g[..., -2, :], g[..., -1, :]
    if cfg.multi_query:
        return _split_concat("query_key_value")(attn, x, h, 1)
    return _split_per_head("query_key_value")(attn, x, h, kv)


def _split_bigcode(attn, x, h, kv):
    if attn.multi_query:
        return _split_concat("c_attn")(attn, x, h, 1)
    return _split_per_head("c_attn")(attn, x, h, kv)


def _split_codegen(attn, x, h, kv):
    """CodeGen's projection is interleaved across its 4 model-parallel shards, each ``[q | v | k]``."""
    y = attn.qkv_proj(x)
    shards = y.unflatten(-1, (attn.mp_num, -1))
    q, v, k = shards.chunk(3, dim=-1)
    return _heads(q.flatten(-2), h), _heads(k.flatten(-2), kv), _heads(v.flatten(-2), kv)


#: model_type -> ``fn(attention module, its input, n_heads, n_kv_heads) -> (q, k, v)`` per head
QKV_SPLITS: dict[str, Callable] = {
    "gpt2": _split_concat("c_attn"), "phi3": _split_concat("qkv_proj"), "gpt_neox": _split_per_head("query_key_value"),
    "bloom": _split_per_head("query_key_value"), "falcon": _split_falcon, "gpt_bigcode": _split_bigcode,
    "codegen": _split_codegen,
}

#: model_type -> (attention module, the module whose output is the MLP's contribution before any residual
#: add inside the module) within a decoder layer; the default is ("self_attn", "mlp")
LAYER_PARTS: dict[str, tuple[str, str]] = {
    "gpt2": ("attn", "mlp"), "gptj": ("attn", "mlp"), "gpt_neo": ("attn", "mlp"), "gpt_bigcode": ("attn", "mlp"),
    "codegen": ("attn", "mlp"), "gpt_neox": ("attention", "mlp"), "opt": ("self_attn", "fc2"),
    "bloom": ("self_attention", "mlp.dense_4h_to_h"), "falcon": ("self_attention", "mlp"),
}


def _layers(hf_model: nn.Module) -> nn.ModuleList:
    for _, mod in hf_model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) and len(list(mod[0].children())) >= 2:
            return mod
    raise ValueError(f"no decoder layers found in {type(hf_model).__name__}")


def _heads_of(cfg) -> tuple[int, int]:
    h = (getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None) or getattr(cfg, "num_heads"))
    kv = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_kv_heads", None) or h
    if cfg.model_type == "falcon" and not cfg.new_decoder_architecture:
        kv = 1 if cfg.multi_query else h
    if cfg.model_type == "gpt_bigcode":
        kv = 1 if cfg.multi_query else h
    return int(h), int(kv)


@dataclass
class Reference:
    """The oracle's tensors for one unpadded sequence (``[pos, ...]``; per layer lists)."""

    logits: torch.Tensor
    resid_pre: list[torch.Tensor]
    resid_post: list[torch.Tensor]
    attn_out: list[torch.Tensor]
    mlp_out: list[torch.Tensor]
    attn_in: list[torch.Tensor]
    q: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    pattern: list[torch.Tensor | None]


def _zero_output(module: nn.Module, args: tuple, out: Any) -> Any:
    """A forward hook that replaces a module's (first) output with zeros (a new tensor)."""
    if isinstance(out, tuple):
        return (torch.zeros_like(out[0]),) + tuple(out[1:])
    return torch.zeros_like(out)


def _first(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


@torch.no_grad()
def reference(hf_model: nn.Module, input_ids: torch.Tensor) -> Reference:
    """Run ``hf_model`` (eager attention) on one sequence ``input_ids`` ``[pos]`` and read the oracle's tensors."""
    cfg = hf_model.config
    attn_name, mlp_name = LAYER_PARTS.get(cfg.model_type, ("self_attn", "mlp"))
    layers = _layers(hf_model)
    h, kv = _heads_of(cfg)
    calls: list[tuple[tuple, dict]] = []
    outs: list[torch.Tensor] = []
    attn_in: list[torch.Tensor] = []
    handles = []
    for layer in layers:
        handles.append(layer.register_forward_pre_hook(lambda m, a, k: calls.append((a, dict(k))), with_kwargs=True))
        handles.append(layer.register_forward_hook(
            lambda m, a, o: outs.append((o[0] if isinstance(o, tuple) else o).detach().clone())))
        handles.append(layer.get_submodule(attn_name).register_forward_pre_hook(
            lambda m, a, k: attn_in.append(_first(a, k).detach().clone()), with_kwargs=True))
    impl = cfg._attn_implementation
    cfg._attn_implementation = "eager"
    try:
        out = hf_model(input_ids=input_ids[None], use_cache=False, output_attentions=True)
    finally:
        cfg._attn_implementation = impl
        for hd in handles:
            hd.remove()
    attentions = getattr(out, "attentions", None) or [None] * len(layers)
    # each layer again, on the same inputs, with its MLP's contribution set to zero
    zero_runs: list[torch.Tensor] = []
    for layer, (args, kwargs) in zip(layers, calls):
        zero = layer.get_submodule(mlp_name).register_forward_hook(_zero_output)
        try:
            o = layer(*args, **kwargs)
        finally:
            zero.remove()
        zero_runs.append((o[0] if isinstance(o, tuple) else o)[0])
    split = QKV_SPLITS.get(cfg.model_type, _split_separate)
    q, k, v = [], [], []
    for layer, x in zip(layers, attn_in):
        a, b, c = split(layer.get_submodule(attn_name), x, h, kv)
        q.append(a[0]), k.append(b[0]), v.append(c[0])
    pre = [_first(a, kw)[0].detach() for a, kw in calls]
    post = [o[0] for o in outs]
    return Reference(
        logits=out.logits[0], resid_pre=pre, resid_post=post,
        attn_out=[z - p for z, p in zip(zero_runs, pre)], mlp_out=[o - z for o, z in zip(post, zero_runs)],
        attn_in=[x[0] for x in attn_in], q=q, k=k, v=v,
        pattern=[None if a is None else a[0] for a in attentions])


# -------------------------------------------------------------------------------------- comparison
@dataclass
class GroupResult:
    """One site group's outcome: ``status`` is ``"ok"``, ``"wrong"``, ``"missing"`` (not offered: refused by
    name) or ``"error"``; ``error`` the largest relative difference seen, ``site`` where."""

    status: str
    error: float = 0.0
    site: str = ""
    detail: str = ""


@dataclass
class Conformance:
    """The outcome of :func:`check` for one family on one backend."""

    family: str
    backend: str
    groups: dict[str, GroupResult] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(g.status in ("ok", "missing") for g in self.groups.values())

    def failures(self) -> dict[str, GroupResult]:
        return {k: g for k, g in self.groups.items() if g.status not in ("ok", "missing")}

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "backend": self.backend, "passed": self.passed,
                "groups": {k: vars(g) for k, g in self.groups.items()}}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if got.shape != want.shape:
        return float("inf")
    return float((got - want).abs().max() / (want.abs().max() + 1e-6))


class _Worst:
    def __init__(self) -> None:
        self.error, self.site, self.missing, self.compared = 0.0, "", [], 0

    def add(self, site: str, got: torch.Tensor | None, want: torch.Tensor) -> None:
        if got is None:
            self.missing.append(site)
            return
        e = _rel(got, want)
        self.compared += 1
        if not e <= self.error or not self.site:  # NaN and inf count as the worst
            self.error, self.site = e, site

    def result(self, tol: float) -> GroupResult:
        if self.missing and not self.compared:
            return GroupResult("missing", site=self.missing[0])
        ok = self.error <= tol
        return GroupResult("ok" if ok else "wrong", self.error, self.site,
                           f"missing {self.missing[:2]}" if self.missing else "")


def check(model, hf_model: nn.Module, sequences: list[list[int]], padding_side: str = "right",
          tol: float = 1e-4) -> Conformance:
    """Compare ``model`` (an :class:`interp.Model` over ``hf_model`` or a copy of it) with the oracle.

    ``sequences``: token ids of different lengths, run as one padded batch (``padding_side``) through
    ``model`` and one by one through ``hf_model``; only real positions are compared. ``tol``: the largest
    relative difference (max |got - want| / max |want|) accepted per site group."""
    refs = [reference(hf_model, torch.tensor(s)) for s in sequences]
    n_layers = len(refs[0].resid_pre)
    width = max(map(len, sequences))
    pad = 0
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    slots = []
    for i, s in enumerate(sequences):
        lo = 0 if padding_side == "right" else width - len(s)
        ids[i, lo:lo + len(s)] = torch.tensor(s)
        mask[i, lo:lo + len(s)] = 1
        slots.append(slice(lo, lo + len(s)))
    result = Conformance(getattr(model.cfg, "family", "?"), model.backend)
    names = model.hook_names()
    with model.capture(names) as cache:
        logits = model(ids, attention_mask=mask)
    silent = [n for n in names if n not in cache]
    result.groups["fires"] = GroupResult("wrong" if silent else "ok", site=silent[0] if silent else "",
                                         detail=f"{len(silent)} listed names never fired" if silent else "")

    def get(name: str, i: int) -> torch.Tensor | None:
        if name not in cache:
            return None
        return cache[name][i]

    groups = {g: _Worst() for g in READ_GROUPS}
    for i, (ref, sl) in enumerate(zip(refs, slots)):
        groups["logits"].add("logits", logits[i, sl], ref.logits)
        for l in range(n_layers):
            b = f"blocks.{l}."
            res = groups["residual"]
            t = get(b + "hook_resid_pre", i)
            res.add(b + "hook_resid_pre", None if t is None else t[sl], ref.resid_pre[l])
            t = get(b + "hook_resid_post", i)
            res.add(b + "hook_resid_post", None if t is None else t[sl], ref.resid_post[l])
            if b + "hook_resid_mid" in names:
                res.add(b + "hook_resid_mid", get(b + "hook_resid_mid", i)[sl], ref.resid_pre[l] + ref.attn_out[l])
            t = get(b + "hook_attn_out", i)
            groups["attn_out"].add(b + "hook_attn_out", None if t is None else t[sl], ref.attn_out[l])
            t = get(b + "hook_mlp_out", i)
            groups["mlp_out"].add(b + "hook_mlp_out", None if t is None else t[sl], ref.mlp_out[l])
            for part, want in (("q", ref.q[l]), ("k", ref.k[l]), ("v", ref.v[l])):
                t = get(f"{b}attn.hook_{part}", i)
                groups["qkv"].add(f"{b}attn.hook_{part}", None if t is None else t[sl], want)
            if ref.pattern[l] is not None:
                t = get(b + "attn.hook_pattern", i)
                groups["pattern"].add(b + "attn.hook_pattern", None if t is None else t[:, sl, sl], ref.pattern[l])
            t = get(b + "ln1.hook_normalized", i)
            if t is not None:
                w, bias, _, _ = model._block_norm(l, "ln1")
                y = t[sl].double() * (1 if w is None else w.double()) + (0 if bias is None else bias.double())
                groups["norms"].add(b + "ln1.hook_normalized", y, ref.attn_in[l])
    for g, worst in groups.items():
        if g == "norms" and not worst.compared and not worst.missing:
            result.groups[g] = GroupResult("missing", detail="no ln1.hook_normalized")
            continue
        if g == "pattern" and not worst.compared and not worst.missing:
            result.groups[g] = GroupResult("missing", detail="the oracle has no attention weights")
            continue
        result.groups[g] = worst.result(tol)
    return result


# ---------------------------------------------------------------------------------------------- writes
#: the sites :func:`check_writes` writes to (a vector added at the middle decoder layer)
WRITE_SITES = ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "hook_resid_post")


def _output(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _add_to_output(delta: torch.Tensor):
    def hook(module: nn.Module, args: tuple, out: Any) -> Any:
        if isinstance(out, tuple):
            return (out[0] + delta,) + tuple(out[1:])
        return out + delta
    return hook


def _add_to_input(delta: torch.Tensor):
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (args[0] + delta,) + tuple(args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + delta}
    return hook


@torch.no_grad()
def branch_points(hf_model: nn.Module, input_ids: torch.Tensor, layer: int, tol: float = 1e-5,
                  ref: Reference | None = None) -> dict[str, tuple[str, float]]:
    """Where decoder layer ``layer`` of ``hf_model`` forms what its attention and its MLP add to the residual
    stream: ``{"attn": (submodule path, factor), "mlp": (...)}`` with ``added = factor * output``.

    Found from the oracle alone, not from any map of ours: the outermost submodule of the layer whose output
    on ``input_ids`` ``[pos]`` is, up to one scalar factor, the :func:`reference`'s ``attn_out`` / ``mlp_out``
    (the attention module itself, a post-norm where the family has one, Bloom's output projections; the factor
    is Granite's residual multiplier, else 1). Raises ``ValueError`` when no submodule matches. ``ref``: the
    :func:`reference` of ``input_ids``, if already computed."""
    ref = ref if ref is not None else reference(hf_model, input_ids)
    block = _layers(hf_model)[layer]
    outputs: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            o = _output(out)
            if isinstance(o, torch.Tensor):  # a copy: some blocks add to a branch output in place (Falcon)
                outputs.setdefault(name, o.detach().clone())
        return hook

    handles = [m.register_forward_hook(keep(n)) for n, m in block.named_modules() if n]
    cfg = hf_model.config
    impl, cfg._attn_implementation = cfg._attn_implementation, "eager"
    try:
        hf_model(input_ids=input_ids[None], use_cache=False)
    finally:
        cfg._attn_implementation = impl
        for h in handles:
            h.remove()
    found = {}
    for part, want in (("attn", ref.attn_out[layer]), ("mlp", ref.mlp_out[layer])):
        for name, _ in block.named_modules():  # pre-order: the outermost match first
            out = outputs.get(name)
            if not isinstance(out, torch.Tensor) or out.numel() != want.numel() or out.shape[-1] != want.shape[-1]:
                continue  # [1, pos, d], or [pos, d] where a block flattens the batch (OPT's MLP)
            o, w = out.reshape(want.shape).double(), want.double()
            factor = float((o * w).sum() / (o * o).sum().clamp_min(1e-30))
            if _rel(factor * o, w) <= tol:
                found[part] = (name, factor)
                break
        else:
            raise ValueError(f"{cfg.model_type}: no submodule of decoder layer {layer} outputs its {part} branch")
    return found


@torch.no_grad()
def _oracle_written(hf_model: nn.Module, input_ids: torch.Tensor, layer: int, site: str, delta: torch.Tensor,
                    points: dict[str, tuple[str, float]]) -> torch.Tensor:
    """The logits ``[pos, vocab]`` of ``hf_model`` on ``input_ids`` with ``delta`` added at ``site`` of
    decoder ``layer``, through forward hooks on Hugging Face's own modules."""
    block = _layers(hf_model)[layer]
    if site == "hook_resid_pre":
        handle = block.register_forward_pre_hook(_add_to_input(delta), with_kwargs=True)
    elif site == "hook_resid_post":
        handle = block.register_forward_hook(_add_to_output(delta))
    else:
        name, factor = points["attn" if site == "hook_attn_out" else "mlp"]
        handle = block.get_submodule(name).register_forward_hook(_add_to_output(delta / factor))
    cfg = hf_model.config
    impl, cfg._attn_implementation = cfg._attn_implementation, "eager"
    try:
        return hf_model(input_ids=input_ids[None], use_cache=False).logits[0]
    finally:
        cfg._attn_implementation = impl
        handle.remove()


def check_writes(model, hf_model: nn.Module, sequences: list[list[int]], padding_side: str = "right",
                 tol: float = 1e-4, layer: int | None = None) -> GroupResult:
    """Hold ``model``'s writes to the oracle: a vector added at each of :data:`WRITE_SITES` of decoder
    ``layer`` (default: the middle one) through ``model.intervene``, on the padded batch of ``sequences``,
    against ``hf_model`` run one sequence at a time with the same vector added by a forward hook at the
    matching Hugging Face module (:func:`branch_points`). Compares the logits of real positions; one
    :class:`GroupResult` over the sites (``"missing"`` for a site the backend refuses to write, by name)."""
    n_layers = len(_layers(hf_model))
    layer = n_layers // 2 if layer is None else layer
    first = reference(hf_model, torch.tensor(sequences[0]))
    points = branch_points(hf_model, torch.tensor(sequences[0]), layer, tol=max(tol, 1e-5), ref=first)
    dtype = next(hf_model.parameters()).dtype
    gen = torch.Generator().manual_seed(0)
    scale = float(first.resid_pre[layer].norm(dim=-1).mean())
    delta = torch.randn(hf_model.config.get_text_config().hidden_size, generator=gen, dtype=torch.float64)
    delta = (delta * scale / delta.norm()).to(dtype)
    width = max(map(len, sequences))
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    slots = []
    for i, s in enumerate(sequences):
        lo = 0 if padding_side == "right" else width - len(s)
        ids[i, lo:lo + len(s)], mask[i, lo:lo + len(s)] = torch.tensor(s), 1
        slots.append(slice(lo, lo + len(s)))
    offered = set(model.hook_names())
    # captured beside each write where offered: the torch and nnsight backends then run their own eager attention,
    # as in the read check (Hugging Face's eager attention in float64, the suite's dtype, gives fully masked rows
    # NaN: its softmax runs in float32, where float64's mask value is -inf; the plain forward refuses that by name)
    probe = [n for n in ("blocks.0.attn.hook_pattern",) if n in offered]
    worst = _Worst()
    for site in WRITE_SITES:
        name = f"blocks.{layer}.{site}"
        if name not in offered:
            worst.add(name, None, torch.zeros(()))
            continue
        with model.intervene({name: lambda t, ctx: t + delta.to(device=t.device, dtype=t.dtype)}), \
                model.capture(probe):
            logits = model(ids, attention_mask=mask)
        for i, (s, sl) in enumerate(zip(sequences, slots)):
            want = _oracle_written(hf_model, torch.tensor(s), layer, site, delta, points)
            worst.add(name, logits[i, sl], want)
    return worst.result(tol)


# ------------------------------------------------------------------------------------ the family suite
#: token ids of the suite's padded batch (three lengths)
SEQUENCES = [[5, 17, 33, 90, 12, 7, 101], [44, 3, 250], [9, 9, 200, 18, 64]]
#: families whose HF code cannot run in float64 (grouped expert matmuls) or gives NaN there (Bloom's alibi with
#: a float64 padding mask): checked in float32
FLOAT32 = frozenset({"bloom", "mixtral", "qwen2_moe"})
#: a name per site group, to ask for a group a backend does not offer
GROUP_PROBE = {"qkv": "blocks.0.attn.hook_q", "pattern": "blocks.0.attn.hook_pattern",
               "norms": "blocks.0.ln1.hook_normalized", "attn_out": "blocks.0.hook_attn_out",
               "mlp_out": "blocks.0.hook_mlp_out", "residual": "blocks.0.hook_resid_mid"}


def suite_dtype(family: str) -> torch.dtype:
    return torch.float32 if family in FLOAT32 else torch.float64


def suite_tolerance(family: str) -> float:
    return 1e-4 if family in FLOAT32 else 1e-6


def save_family(family: str, folder) -> str:
    """Build the suite's tiny ``family`` checkpoint (:func:`interp.testing.tiny_causal_lm`, peaked attention) and
    save it with its tokenizer to ``folder``, as a training run would."""
    from .testing import tiny_causal_lm, tiny_tokenizer
    model = tiny_causal_lm(family, peaked=3.0, dtype=suite_dtype(family))
    model.save_pretrained(folder)
    tiny_tokenizer(folder)
    return str(folder)


@dataclass
class PairOutcome:
    """One (family, backend) pair of the suite: ``statuses`` ``{column: status}`` (the support matrix's row
    cell), the load refusal's message (if any), the wrapped model and the per-padding results of the reads
    (:func:`check`) and the writes (:func:`check_writes`)."""

    statuses: dict[str, str]
    refusal: str | None = None
    model: Any = None
    results: dict[str, Conformance] = field(default_factory=dict)
    writes: dict[str, GroupResult] = field(default_factory=dict)
    padding_refusals: dict[str, str] = field(default_factory=dict)


def run_pair(family: str, backend: str, folder: str) -> PairOutcome:
    """Load ``folder`` (saved by :func:`save_family`) on ``backend`` by path and hold it to the oracle with the
    batch padded on the right and on the left."""
    import warnings

    import transformers

    from . import load
    from .selfcheck import SelfCheckError
    dtype = suite_dtype(family)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # eager attention, as the oracle's: HF's own implementations can disagree (Falcon with alibi scales the
            # alibi bias in eager attention but not in sdpa)
            model = load(folder, backend=backend, dtype=dtype, attn_implementation="eager")
    except (SelfCheckError, ValueError) as exc:
        return PairOutcome({"load": "refused"}, refusal=str(exc))
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()
    out = PairOutcome({"load": "ok"}, model=model)
    for side in ("right", "left"):
        try:
            result = out.results[side] = check(model, ref, SEQUENCES, side, tol=suite_tolerance(family))
        except RuntimeError as exc:  # the backend refuses this padding for this family, by name
            out.padding_refusals[side] = str(exc)
            for g in GROUPS:
                out.statuses[g if side == "right" else f"{g} (left padding)"] = "refused"
            continue
        for g, r in result.groups.items():
            out.statuses[g if side == "right" else f"{g} (left padding)"] = r.status
        try:
            written = out.writes[side] = check_writes(model, ref, SEQUENCES, side, tol=suite_tolerance(family))
            status = written.status
        except RuntimeError as exc:  # refused by name (NaN at real tokens)
            out.padding_refusals[f"{side}, writes"] = str(exc)
            status = "refused"
        out.statuses["writes" if side == "right" else "writes (left padding)"] = status
    return out
