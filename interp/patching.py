"""Activation patching, as TransformerLens's ``patching`` module does it, on every backend.

Each function runs the *corrupted* input with one component replaced by its value in the *clean* run
(``clean_cache``, from ``model.run_with_cache(clean)``) and reports ``metric(logits)`` for every choice of
component: by layer and position for the residual stream and the block outputs, by layer and head (over all
positions or per position) for the attention heads' ``z``, ``q``, ``k``, ``v`` and ``pattern``.

The patches are batched: the corrupted input is repeated once per component of one layer and a single
forward pass patches a different component in each copy (rows are split into chunks of ``batch_size``), so
a ``[layer, pos]`` sweep costs ``n_layers`` forwards of a larger batch instead of ``n_layers * pos``
forwards; the result equals patching one component at a time with :class:`interp.Patch` (tested).

``metric(logits) -> scalar`` receives the logits of one patched copy of the corrupted batch (``[batch, pos,
vocab]``), exactly as TransformerLens's ``patching_metric``. :func:`patch` returns a typed
:class:`PatchingResult` (``.values``, ``.to_frame()``, ``.figure()``, ``.save()``); the TransformerLens names
(``get_act_patch_resid_pre`` ...) return the bare tensor, as TransformerLens does; all 18 of TransformerLens
3.9's ``get_act_patch_*`` are here, with TL's shapes (``k`` / ``v`` of a grouped-query model have one column
per key/value head). Every entry point checks its arguments once, with :func:`check_request`, before any
forward pass.

:func:`path_patch` patches the path from sender heads to receiver components only: the senders' outputs
come from the clean run, every other head is frozen at its corrupted value, and the receivers read the
resulting residual stream; the rest of the network then runs on the corrupted input with the receivers'
patched values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import operator
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from .interventions import HookContext, Patch
from .validation import check_token_ids
from .progress import progress
from .results import Result

Metric = Callable[[torch.Tensor], Any]

#: component -> (hook of each layer, axes of the result besides ``layer``)
RESIDUAL = {"resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid", "resid_post": "hook_resid_post",
            "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out"}
HEADS = {"z": "attn.hook_z", "q": "attn.hook_q", "k": "attn.hook_k", "v": "attn.hook_v",
         "pattern": "attn.hook_pattern"}


@dataclass
class PatchingResult(Result):
    """The metric after patching each component. ``values``: ``[layer, pos]``, ``[layer, head]`` or
    ``[layer, pos, head]`` (``axes`` names them); ``clean`` / ``corrupted``: the metric of the unpatched runs."""

    kind = "activation_patching"

    component: str
    axes: list
    values: torch.Tensor
    clean: float
    corrupted: float
    tokens: list = field(default_factory=list)
    #: the model layer of each row of ``values`` (as requested: ``patch(..., layers=[1, 3])`` gives ``[1, 3]``);
    #: empty means rows ``0..n-1`` are layers ``0..n-1``
    layers: list = field(default_factory=list)

    def layer_labels(self) -> list[int]:
        """The model layer of each row of ``values``."""
        return list(self.layers) if self.layers else list(range(self.values.shape[0]))

    def normalised(self) -> torch.Tensor:
        """``(values - corrupted) / (clean - corrupted)``: 0 = no effect, 1 = the clean run's metric."""
        return (self.values - self.corrupted) / (self.clean - self.corrupted)

    def to_frame(self):
        import pandas as pd

        idx = torch.cartesian_prod(*[torch.arange(n) for n in self.values.shape]).reshape(-1, self.values.dim())
        rows = {a: idx[:, i].tolist() for i, a in enumerate(self.axes)}
        if self.axes and self.axes[0] == "layer":  # row i is model layer layer_labels()[i]
            labels = self.layer_labels()
            rows["layer"] = [labels[i] for i in rows["layer"]]
        rows["metric"] = self.values.reshape(-1).tolist()
        return pd.DataFrame(rows)

    def figure(self):
        import plotly.graph_objects as go

        v = self.values
        if v.dim() == 3:  # [layer, pos, head]: summed over heads for the picture
            v = v.sum(-1)
            x_axis = "pos (summed over heads)"
        else:
            x_axis = self.axes[1]
        x = ([f"{i}: {t}" for i, t in enumerate(self.tokens)] if x_axis.startswith("pos") and self.tokens
             else list(range(v.shape[1])))
        lim = float(max(abs(v - self.corrupted).max(), 1e-12))
        fig = go.Figure(go.Heatmap(z=v.numpy(), x=x, y=[str(l) for l in self.layer_labels()], colorscale="RdBu", zmid=self.corrupted,
                                   zmin=self.corrupted - lim, zmax=self.corrupted + lim, colorbar=dict(title="metric")))
        fig.update_layout(title=f"activation patching: {self.component} (clean {self.clean:.3g}, corrupted "
                                f"{self.corrupted:.3g})", xaxis_title=x_axis, yaxis_title="layer",
                          yaxis=dict(autorange="reversed"), height=420)
        return fig


def _as_inputs(model, x, what: str = "corrupted") -> dict[str, torch.Tensor]:
    """``{"input_ids", "attention_mask"}`` of one patching input (token ids ``[batch, pos]`` or ``[pos]``, a dict
    with ``input_ids``, or texts), its ids checked by the toolkit's one token-id rule."""
    if isinstance(x, Mapping):
        if "input_ids" not in x:
            raise ValueError(f"the {what} input dict needs 'input_ids', got keys {sorted(x)}")
        ids = torch.as_tensor(x["input_ids"])
        mask = x.get("attention_mask")
        mask = torch.ones_like(ids, dtype=torch.long) if mask is None else torch.as_tensor(mask)
    elif isinstance(x, torch.Tensor):
        ids, mask = x, None
    elif isinstance(x, str) or (isinstance(x, (list, tuple)) and x and all(isinstance(t, str) for t in x)):
        return dict(model.tokenize(x))
    else:
        raise TypeError(f"the {what} input must be token ids [batch, pos], a dict with input_ids or texts, "
                        f"got {type(x).__name__}")
    check_token_ids(ids, what=f"{what} token ids")
    ids = ids if ids.dim() == 2 else ids[None]
    if ids.dim() != 2:
        raise ValueError(f"{what} token ids must be [batch, pos] or [pos], got shape {tuple(x.shape)}")
    mask = torch.ones_like(ids, dtype=torch.long) if mask is None else (mask if mask.dim() == 2 else mask[None])
    return {"input_ids": ids, "attention_mask": mask}


def _layers_arg(layers: Any, n_layers: int) -> list[int]:
    """``layers=`` of the patching functions: ``None`` (every layer), one integer or a sequence of integers in
    ``-n_layers..n_layers-1`` (negative counts from the end). Integers only: ``0.7``, ``'1'`` and ``True`` are
    refused, never rounded or coerced."""
    if layers is None:
        return list(range(n_layers))
    items = [layers] if _is_int(layers) else layers
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable) or (
            isinstance(items, torch.Tensor) and items.dim() == 0):
        raise TypeError(f"layers must be integers (a list of layer indices), got {layers!r}")
    out = []
    for l in items:
        if isinstance(l, bool) or isinstance(l, (str, bytes, float)):
            raise TypeError(f"layers must be integers in -{n_layers}..{n_layers - 1}, got {l!r} in {layers!r}")
        if isinstance(l, torch.Tensor) and (l.dim() != 0 or l.is_floating_point() or l.dtype == torch.bool):
            raise TypeError(f"layers must be integers in -{n_layers}..{n_layers - 1}, got {l!r} in {layers!r}")
        try:
            i = operator.index(l)
        except TypeError:
            raise TypeError(f"layers must be integers in -{n_layers}..{n_layers - 1}, got {l!r} in {layers!r}") from None
        if not -n_layers <= i < n_layers:
            raise ValueError(f"layers must be in -{n_layers}..{n_layers - 1}, got {i} in {list(items)!r}")
        out.append(i % n_layers)
    if not out:
        raise ValueError("layers is empty; pass at least one layer (or None for every layer)")
    return out


def _is_int(i: Any) -> bool:
    """An integer index (Python, NumPy or a 0-d integer tensor), not a bool."""
    if isinstance(i, bool) or (isinstance(i, torch.Tensor) and (i.dim() or i.is_floating_point() or i.dtype == torch.bool)):
        return False
    try:
        operator.index(i)
    except TypeError:
        return False
    return True


def _check_metric(metric: Any) -> None:
    if not callable(metric):
        raise TypeError(f"metric must be a function of the logits returning a scalar, got {type(metric).__name__}")


def check_request(model, corrupted, metric: Metric, clean: Any = None, layers: Any = None
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None, list[int]]:
    """The one validation of a patching request, shared by :func:`patch`, :func:`patch_values`,
    :func:`path_patch` and every ``get_act_patch_*``, done before any forward pass: the inputs (token ids by
    the toolkit's one dtype rule, see :func:`interp.model.check_token_ids`), clean and corrupted of the same
    ``[batch, pos]`` shape (a batch of one is never broadcast), ``metric`` callable, ``layers`` integers in
    range. Returns ``(corrupted inputs, clean inputs or None, layers)``."""
    _check_metric(metric)
    corrupted_in = _as_inputs(model, corrupted, "corrupted")
    clean_in = None if clean is None else _as_inputs(model, clean, "clean")
    if clean_in is not None and clean_in["input_ids"].shape != corrupted_in["input_ids"].shape:
        raise ValueError(f"clean {tuple(clean_in['input_ids'].shape)} and corrupted "
                         f"{tuple(corrupted_in['input_ids'].shape)} inputs must have the same shape [batch, pos]")
    return corrupted_in, clean_in, _layers_arg(layers, model.cfg.n_layers)


def _scalar(v: Any) -> float:
    """The metric's value as a float; anything but a number or a one-element tensor is refused in one line."""
    if v is None or isinstance(v, (str, bytes, Mapping)) or not (isinstance(v, torch.Tensor) or hasattr(v, "__float__")):
        raise TypeError(f"metric must return a scalar (a number or a one-element tensor), got "
                        f"{type(v).__name__}{'' if v is None else (': ' + repr(v))[:80]}")
    t = torch.as_tensor(v)
    if t.numel() != 1:
        raise ValueError(f"metric must return a scalar, got a tensor of shape {tuple(t.shape)}")
    return float(t)


class _Batched:
    """An intervention for ``copies`` stacked copies of the batch: copy ``i`` gets ``writes[i](view, source)``."""

    def __init__(self, source: torch.Tensor, writes: list[Callable[[torch.Tensor, torch.Tensor], None]], batch: int):
        self.source, self.writes, self.batch = source, writes, batch

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        out = tensor.clone()
        src = self.source.to(device=tensor.device, dtype=tensor.dtype)
        if src.shape[1:] != tensor.shape[1:] or src.shape[0] != self.batch:
            raise ValueError(f"the clean cache's {ctx.name!r} has shape {tuple(src.shape)}, but the corrupted run's is "
                             f"{(self.batch, *tensor.shape[1:])}: clean and corrupted inputs must have the same shape")
        for i, write in enumerate(self.writes):
            write(out[i * self.batch:(i + 1) * self.batch], src)
        return out


def _sweep(model, inputs: dict, name: str, source: torch.Tensor, writes: list, metric: Metric,
           batch_size: int) -> list[float]:
    """Run one patched copy of ``inputs`` per entry of ``writes`` (in chunks); the metric of each."""
    b = inputs["input_ids"].shape[0]
    per = max(1, batch_size // b)
    out: list[float] = []
    for start in range(0, len(writes), per):
        chunk = writes[start:start + per]
        big = {k: v.repeat(len(chunk), *([1] * (v.dim() - 1))) for k, v in inputs.items()}
        with model.intervene({name: _Batched(source, chunk, b)}):
            logits = model(big)
        out += [_scalar(metric(logits[i * b:(i + 1) * b])) for i in range(len(chunk))]
    return out


def _position_write(p: int):
    def write(view: torch.Tensor, src: torch.Tensor) -> None:
        view[:, p] = src[:, p]
    return write


def _head_write(h: int, axis: int, p: int | None = None, pos_axis: int = 1, p2: int | None = None,
                pos2_axis: int | None = None):
    def write(view: torch.Tensor, src: torch.Tensor) -> None:
        idx: list[Any] = [slice(None)] * view.dim()
        idx[axis] = h
        if p is not None:
            idx[pos_axis] = p
        if p2 is not None:
            idx[pos2_axis] = p2
        view[tuple(idx)] = src[tuple(idx)]
    return write


#: ways to sweep a head-indexed activation: result axes besides ``layer``
_HEAD_SWEEPS = {"all_pos": ["head"], "by_pos": ["pos", "head"], "head_dest": ["head", "dest_pos"],
                "head_dest_src": ["head", "dest_pos", "src_pos"]}


def _components(component: str, by_position: bool | str, n_heads: int, T: int) -> tuple[str, list[str], list]:
    """(hook of each layer, result axes besides ``layer``, one write per patched component, in the result's
    row-major order). ``n_heads`` is the head count of the patched activation (the key/value heads for
    ``k``/``v`` under grouped-query attention, as TransformerLens counts them)."""
    if component in RESIDUAL:
        return RESIDUAL[component], ["pos"], [_position_write(p) for p in range(T)]
    if component in HEADS:
        sweep = "by_pos" if by_position is True else ("all_pos" if by_position is False else by_position)
        if sweep not in _HEAD_SWEEPS or (sweep.startswith("head_dest") and component != "pattern"):
            raise ValueError(f"unknown way to sweep {component!r}: {by_position!r}")
        head_axis, pos_axis = (1, 2) if component == "pattern" else (2, 1)
        if sweep == "by_pos":
            writes = [_head_write(h, head_axis, p, pos_axis) for p in range(T) for h in range(n_heads)]
        elif sweep == "head_dest":
            writes = [_head_write(h, 1, p, 2) for h in range(n_heads) for p in range(T)]
        elif sweep == "head_dest_src":
            writes = [_head_write(h, 1, p, 2, q, 3) for h in range(n_heads) for p in range(T) for q in range(T)]
        else:
            writes = [_head_write(h, head_axis) for h in range(n_heads)]
        return HEADS[component], _HEAD_SWEEPS[sweep], writes
    raise ValueError(f"unknown component {component!r}; expected one of {', '.join([*RESIDUAL, *HEADS])}")


def _heads_of(component: str, source: torch.Tensor) -> int:
    """The head count of a cached head activation (``[batch, pos, head, d]``, patterns ``[batch, head, q, k]``)."""
    return int(source.shape[1] if component == "pattern" else source.shape[2])


def patch_values(model, corrupted, clean_cache, metric: Metric, component: str = "resid_pre",
                 by_position: bool | str = False, layers: Sequence[int] | None = None,
                 batch_size: int = 64) -> torch.Tensor:
    """The metric after patching each ``component`` of ``clean_cache`` into the corrupted run (see :func:`patch`):
    ``[layer, pos]``, ``[layer, head]`` or ``[layer, pos, head]`` (``by_position``; for ``pattern`` also
    ``"head_dest"``: ``[layer, head, dest_pos]`` and ``"head_dest_src"``: ``[layer, head, dest_pos, src_pos]``).
    ``k`` and ``v`` of a grouped-query model have one column per key/value head, as in TransformerLens.
    Rows follow ``layers`` (default: every layer)."""
    inputs, _, layers = check_request(model, corrupted, metric, layers=layers)
    T = inputs["input_ids"].shape[1]
    hook = _components(component, by_position, 0, 0)[0]  # an unknown component or sweep fails here
    names = [f"blocks.{l}.{hook}" for l in layers]
    missing = [n for n in names if n not in clean_cache]
    if missing:
        raise KeyError(f"the clean cache has no {missing[0]!r}: capture it (model.run_with_cache(clean) captures all)")
    first = clean_cache[names[0]]
    b = inputs["input_ids"].shape[0]
    pos_axis = 2 if component == "pattern" else 1
    if first.shape[0] != b or first.shape[pos_axis] != T:
        raise ValueError(f"the clean cache's {names[0]!r} is from a run of [batch, pos] = "
                         f"{(first.shape[0], first.shape[pos_axis])}, but the corrupted input is {(b, T)}: "
                         "clean and corrupted inputs must have the same shape")
    n_heads = _heads_of(component, first) if component in HEADS else 0
    _, axes, writes = _components(component, by_position, n_heads, T)
    rows = []
    for name in progress(names, desc=f"patching {component}"):
        rows.append(_sweep(model, inputs, name, clean_cache[name], writes, metric, batch_size))
    values = torch.tensor(rows, dtype=torch.float32)
    sizes = {"pos": T, "head": n_heads, "dest_pos": T, "src_pos": T}
    return values.reshape(len(layers), *[sizes[a] for a in axes])


def patch(model, clean, corrupted, metric: Metric, component: str = "resid_pre", by_position: bool = False,
          layers: Sequence[int] | None = None, batch_size: int = 64) -> PatchingResult:
    """Patch ``component`` of the ``clean`` run into the ``corrupted`` run, one layer and position (or head)
    at a time; a :class:`PatchingResult` with the metric of every patch and of both unpatched runs.

    ``component``: ``resid_pre``, ``resid_mid``, ``resid_post``, ``attn_out``, ``mlp_out`` (``[layer, pos]``)
    or a head activation ``z``, ``q``, ``k``, ``v``, ``pattern`` (``[layer, head]`` over all positions,
    ``[layer, pos, head]`` with ``by_position``). ``clean`` and ``corrupted``: token ids ``[batch, pos]``, dicts
    with ``input_ids`` (and ``attention_mask``) or texts, of the same shape. ``layers``: integers (default:
    every layer); the result's rows are those layers, labelled so in ``to_frame()`` and ``figure()``.
    """
    corrupted_in, clean_in, layer_list = check_request(model, corrupted, metric, clean=clean, layers=layers)
    hook, _, _ = _components(component, by_position, 0, 0)  # an unknown component fails here
    clean_logits, clean_cache = model.run_with_cache(clean_in, names=[f"blocks.{l}.{hook}" for l in layer_list])
    values = patch_values(model, corrupted_in, clean_cache, metric, component, by_position, layer_list, batch_size)
    axes = ["layer", *_components(component, by_position, 0, 0)[1]]
    return PatchingResult(component=component, axes=axes, values=values, clean=_scalar(metric(clean_logits)),
                          corrupted=_scalar(metric(model(corrupted_in))),
                          tokens=model.to_str_tokens(corrupted_in["input_ids"][0]), layers=layer_list)


# ---------------------------------------------------------------------------------------------- path patching
def path_patch(model, clean, corrupted, metric: Metric, receivers: Sequence[str] | Mapping[str, Sequence[int] | None],
               senders: Sequence[tuple[int, int]] | None = None, batch_size: int = 64) -> PatchingResult:
    """Path patching (Wang et al. 2022): the effect of each sender head's clean output on the metric through
    the ``receivers`` only.

    For each sender head ``(layer, head)`` (default: every head): run the corrupted input with that head's
    ``hook_z`` from the clean run and every other head's ``hook_z`` frozen at its corrupted value, and record
    the receivers' activations; then run the corrupted input with only the receivers patched to those values
    and read the metric. ``receivers``: hook names (e.g. ``["blocks.3.attn.hook_q"]``; the final
    ``blocks.{L-1}.hook_resid_post`` measures the direct path), or ``{name: heads}`` to patch some heads of a
    head-indexed hook. Returns ``[layer, head]`` values (``nan`` where a sender cannot reach a receiver: a head
    at or after the receiver's layer).
    """
    corrupted_in, clean_in, _ = check_request(model, corrupted, metric, clean=clean)
    if isinstance(receivers, str):
        receivers = [receivers]
    recv = {r: None for r in receivers} if not isinstance(receivers, Mapping) else dict(receivers)
    n_layers, H = model.cfg.n_layers, model.cfg.n_heads
    z_names = [f"blocks.{l}.attn.hook_z" for l in range(n_layers)]
    clean_logits, clean_cache = model.run_with_cache(clean_in, names=z_names)
    corrupted_logits, corrupt_cache = model.run_with_cache(corrupted_in, names=z_names)
    if senders is None:
        senders = [(l, h) for l in range(n_layers) for h in range(H)]
    bad = [s for s in senders if not (isinstance(s, (tuple, list)) and len(s) == 2
                                      and all(_is_int(i) for i in s)
                                      and 0 <= operator.index(s[0]) < n_layers and 0 <= operator.index(s[1]) < H)]
    if bad:
        raise ValueError(f"senders are (layer, head) pairs with 0 <= layer < {n_layers} and 0 <= head < {H}; "
                         f"got {bad[:3]}")
    senders = [(operator.index(l), operator.index(h)) for l, h in senders]
    reachable = [(l, h) for l, h in senders if any(_reaches(l, r, n_layers) for r in recv)]
    b = corrupted_in["input_ids"].shape[0]
    per = max(1, batch_size // b)
    values = torch.full((n_layers, H), float("nan"))
    for start in range(0, len(reachable), per):
        chunk = reachable[start:start + per]
        big = {k: v.repeat(len(chunk), *([1] * (v.dim() - 1))) for k, v in corrupted_in.items()}
        freeze = {}
        for l in range(n_layers):
            writes = [_sender_write(h if sl == l else None) for sl, h in chunk]
            freeze[z_names[l]] = _Frozen(corrupt_cache[z_names[l]], clean_cache[z_names[l]], writes, b)
        with model.intervene(freeze), model.capture(list(recv)) as got:
            model(big)
        patches = {r: Patch(got[r], heads=heads) for r, heads in recv.items()}
        with model.intervene(patches):
            logits = model(big)
        for i, (l, h) in enumerate(chunk):
            values[l, h] = _scalar(metric(logits[i * b:(i + 1) * b]))
    return PatchingResult(component=f"path to {', '.join(recv)}", axes=["layer", "head"], values=values,
                          clean=_scalar(metric(clean_logits)), corrupted=_scalar(metric(corrupted_logits)),
                          tokens=model.to_str_tokens(corrupted_in["input_ids"][0]))


#: hooks of a block that read the block's own attention output
_AFTER_ATTN = ("hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out", "mlp.hook_pre", "mlp.hook_post",
               "ln2.hook_normalized", "ln2.hook_scale")


def _reaches(sender_layer: int, receiver: str, n_layers: int) -> bool:
    """Can a head of ``sender_layer`` write into what ``receiver`` reads?"""
    from .names import parse

    layer, hook = parse(receiver)
    if layer is None:  # ln_final.*, unembedding inputs: after every block
        return True
    return sender_layer < layer or (sender_layer == layer and hook in _AFTER_ATTN)


class _Frozen:
    """Every copy's heads at their corrupted value, except copy ``i``'s sender head at its clean value."""

    def __init__(self, corrupt: torch.Tensor, clean: torch.Tensor, writes: list, batch: int):
        self.corrupt, self.clean, self.writes, self.batch = corrupt, clean, writes, batch

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        base = self.corrupt.to(device=tensor.device, dtype=tensor.dtype)
        clean = self.clean.to(device=tensor.device, dtype=tensor.dtype)
        out = base.repeat(len(self.writes), *([1] * (base.dim() - 1)))
        for i, write in enumerate(self.writes):
            write(out[i * self.batch:(i + 1) * self.batch], clean)
        return out


def _sender_write(h: int | None):
    def write(view: torch.Tensor, clean: torch.Tensor) -> None:
        if h is not None:
            view[:, :, h] = clean[:, :, h]
    return write


# ------------------------------------------------------------------------------ TransformerLens's spellings
def _tl(component: str, by_position: bool | str = False, shape: str = ""):
    def fn(model, corrupted_tokens, clean_cache, patching_metric: Metric) -> torch.Tensor:
        return patch_values(model, corrupted_tokens, clean_cache, patching_metric, component, by_position)
    sweep = {False: "all positions", True: "by position", "head_dest": "by destination position",
             "head_dest_src": "by destination and source position"}[by_position]
    fn.__name__ = f"get_act_patch_{component}"
    fn.__doc__ = (f"TransformerLens's spelling: the metric after patching each {component} ({sweep}) -> "
                  f"{shape or 'tensor'} (see :func:`patch_values`; arguments ``(model, corrupted_tokens, "
                  "clean_cache, patching_metric)`` as TransformerLens).")
    return fn


get_act_patch_resid_pre = _tl("resid_pre", shape="[layer, pos]")
get_act_patch_resid_mid = _tl("resid_mid", shape="[layer, pos]")
get_act_patch_attn_out = _tl("attn_out", shape="[layer, pos]")
get_act_patch_mlp_out = _tl("mlp_out", shape="[layer, pos]")
get_act_patch_attn_head_out_all_pos = _tl("z", shape="[layer, head]")
get_act_patch_attn_head_q_all_pos = _tl("q", shape="[layer, head]")
get_act_patch_attn_head_k_all_pos = _tl("k", shape="[layer, kv_head]")
get_act_patch_attn_head_v_all_pos = _tl("v", shape="[layer, kv_head]")
get_act_patch_attn_head_pattern_all_pos = _tl("pattern", shape="[layer, head]")
get_act_patch_attn_head_out_by_pos = _tl("z", True, "[layer, pos, head]")
get_act_patch_attn_head_q_by_pos = _tl("q", True, "[layer, pos, head]")
get_act_patch_attn_head_k_by_pos = _tl("k", True, "[layer, pos, kv_head]")
get_act_patch_attn_head_v_by_pos = _tl("v", True, "[layer, pos, kv_head]")
get_act_patch_attn_head_pattern_by_pos = _tl("pattern", "head_dest", "[layer, head, dest_pos]")
get_act_patch_attn_head_pattern_dest_src_pos = _tl("pattern", "head_dest_src", "[layer, head, dest_pos, src_pos]")


def _pad_heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Zero columns after the key/value heads up to ``n_heads`` (TransformerLens's layout of the ``*_every`` stacks
    on grouped-query models)."""
    return torch.nn.functional.pad(t, (0, n_heads - t.shape[-1]))


def get_act_patch_block_every(model, corrupted_tokens, clean_cache, patching_metric: Metric) -> torch.Tensor:
    """TransformerLens's spelling: ``[3, layer, pos]`` for ``resid_pre``, ``attn_out`` and ``mlp_out``."""
    return torch.stack([patch_values(model, corrupted_tokens, clean_cache, patching_metric, c)
                        for c in ("resid_pre", "attn_out", "mlp_out")])


def get_act_patch_attn_head_all_pos_every(model, corrupted_tokens, clean_cache, patching_metric: Metric) -> torch.Tensor:
    """TransformerLens's spelling: ``[5, layer, head]`` for ``z``, ``q``, ``k``, ``v`` and ``pattern``; on a
    grouped-query model the ``k`` and ``v`` rows hold one column per key/value head, then zeros (as TL)."""
    out = [patch_values(model, corrupted_tokens, clean_cache, patching_metric, c) for c in ("z", "q", "k", "v", "pattern")]
    H = out[0].shape[-1]
    return torch.stack([_pad_heads(t, H) for t in out])


def get_act_patch_attn_head_by_pos_every(model, corrupted_tokens, clean_cache, patching_metric: Metric) -> torch.Tensor:
    """TransformerLens's spelling: ``[5, layer, pos, head]`` for ``z``, ``q``, ``k``, ``v`` (by position) and
    ``pattern`` (by destination position); ``k``/``v`` padded with zero columns on grouped-query models (as TL)."""
    out = [patch_values(model, corrupted_tokens, clean_cache, patching_metric, c, True) for c in ("z", "q", "k", "v")]
    H = out[0].shape[-1]
    pattern = patch_values(model, corrupted_tokens, clean_cache, patching_metric, "pattern", "head_dest")
    return torch.stack([_pad_heads(t, H) for t in out] + [pattern.transpose(1, 2)])


__all__ = ["PatchingResult", "check_request", "patch", "patch_values", "path_patch", "get_act_patch_resid_pre",
           "get_act_patch_resid_mid", "get_act_patch_attn_out", "get_act_patch_mlp_out",
           "get_act_patch_attn_head_out_all_pos", "get_act_patch_attn_head_q_all_pos",
           "get_act_patch_attn_head_k_all_pos", "get_act_patch_attn_head_v_all_pos",
           "get_act_patch_attn_head_pattern_all_pos", "get_act_patch_attn_head_out_by_pos",
           "get_act_patch_attn_head_q_by_pos", "get_act_patch_attn_head_k_by_pos",
           "get_act_patch_attn_head_v_by_pos", "get_act_patch_attn_head_pattern_by_pos",
           "get_act_patch_attn_head_pattern_dest_src_pos", "get_act_patch_block_every",
           "get_act_patch_attn_head_all_pos_every", "get_act_patch_attn_head_by_pos_every"]
