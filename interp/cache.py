"""The activation cache: canonical keys, detached tensors, stacking helpers."""
from __future__ import annotations

import fnmatch
from collections.abc import MutableMapping
from typing import Any, Iterator, Mapping

import torch

from .names import UnknownHookError, expand, parse, unknown_message

#: TransformerLens's short hook names for ``cache[short, layer]``
_SHORT = {"resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid", "resid_post": "hook_resid_post",
          "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out", "q": "attn.hook_q", "k": "attn.hook_k",
          "v": "attn.hook_v", "z": "attn.hook_z", "pattern": "attn.hook_pattern", "attn": "attn.hook_pattern",
          "scores": "attn.hook_attn_scores", "attn_scores": "attn.hook_attn_scores", "rot_q": "attn.hook_rot_q",
          "rot_k": "attn.hook_rot_k", "result": "attn.hook_result", "pre": "mlp.hook_pre", "pre_linear": "mlp.hook_pre_linear",
          "post": "mlp.hook_post", "mlp_post": "mlp.hook_post", "scale": "hook_scale",
          "normalized": "hook_normalized", "embed": "hook_embed"}


def _long_name(short: str, layer: int | None = None, kind: str | None = None) -> str:
    """``("resid_post", 3)`` -> ``blocks.3.hook_resid_post``; ``("scale", 2, "ln1")`` ->
    ``blocks.2.ln1.hook_scale``; ``("scale",)`` -> ``ln_final.hook_scale``."""
    hook = _SHORT.get(short, short)
    if layer is None:
        return f"ln_final.{hook}" if hook in ("hook_scale", "hook_normalized") else hook
    if hook in ("hook_scale", "hook_normalized"):
        return f"blocks.{layer}.{kind or 'ln1'}.{hook}"
    return f"blocks.{layer}.{hook}"


def _pos(t: torch.Tensor, pos_slice: Any, dim: int = -2) -> torch.Tensor:
    """TransformerLens's ``pos_slice`` on the position axis ``dim`` of ``t`` (``[..., pos, d]``): ``None`` keeps
    all, an int selects one position and drops the axis, a tuple ``(start, stop[, step])`` or a ``slice``
    slices, a list or tensor of ints indexes."""
    if pos_slice is None:
        return t
    if isinstance(pos_slice, bool):
        raise TypeError(f"pos_slice must be an int, tuple, slice, list or tensor, got {pos_slice!r}")
    if isinstance(pos_slice, int):
        return t.select(dim, pos_slice)
    if isinstance(pos_slice, tuple):
        pos_slice = slice(*pos_slice)
    if isinstance(pos_slice, slice):
        idx = [slice(None)] * t.dim()
        idx[dim] = pos_slice
        return t[tuple(idx)]
    return t.index_select(dim % t.dim(), torch.as_tensor(pos_slice, dtype=torch.long, device=t.device))


def _project(stack: torch.Tensor, project_output_onto: torch.Tensor | None) -> torch.Tensor:
    """TransformerLens's ``project_output_onto``: ``stack [..., d]`` times a ``[d]`` direction (the last axis dropped)
    or a ``[d, n]`` matrix (the last axis becomes ``n``); ``None`` leaves the stack as it is."""
    if project_output_onto is None:
        return stack
    proj = torch.as_tensor(project_output_onto)
    if proj.dim() not in (1, 2) or proj.shape[0] != stack.shape[-1]:
        raise ValueError(f"project_output_onto must be [d_model] or [d_model, n] with d_model = "
                         f"{stack.shape[-1]}, got shape {tuple(proj.shape)}")
    return stack @ proj.to(stack.device, stack.dtype)


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"  # pragma: no cover


class CacheDict(MutableMapping[str, torch.Tensor]):
    """TransformerLens's ``cache.cache_dict`` over an interp :class:`Cache`: ``{name: tensor}``, live (reads go to
    the cache, writes and deletes change it)."""

    def __init__(self, cache: "Cache") -> None:
        self._cache = cache

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._cache._data:
            raise KeyError(name)
        return self._cache[name]

    def __setitem__(self, name: str, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"cache_dict[{name!r}] must be a tensor, got {type(tensor).__name__}")
        self._cache._data[name] = [tensor]

    def __delitem__(self, name: str) -> None:
        del self._cache._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._cache._data))

    def __len__(self) -> int:
        return len(self._cache._data)

    def __repr__(self) -> str:
        return f"CacheDict({list(self._cache._data)})"


class Cache(Mapping[str, torch.Tensor]):
    """Activations keyed by canonical hook name.

    Each forward pass that a capture sees adds one entry per hook. ``cache[name]`` returns the
    tensor of a single pass, or the passes concatenated along the batch axis (axis 0) when there were
    several with matching shapes (e.g. several batches); use :meth:`passes` to keep them apart (e.g. the
    steps of ``generate``, whose sequence lengths differ).
    """

    def __init__(self, data: Mapping[str, list[torch.Tensor]] | None = None, model=None, gradient: bool = False,
                 has_batch_dim: bool = True) -> None:
        self._data: dict[str, list[torch.Tensor]] = {k: list(v) for k, v in (data or {}).items()}
        #: the model that filled the cache (for weights and norms in the analysis helpers), or None
        self.model = model
        #: whether the cache holds gradients d(scalar)/d(activation) (``model.gradients(...).grads``) rather than
        #: activations: helpers that would multiply by weights or normalise refuse such a cache
        self.is_gradient = bool(gradient)
        #: TransformerLens's ``has_batch_dim``: False after :meth:`remove_batch_dim` (``run_with_cache(...,
        #: remove_batch_dim=True)``)
        self.has_batch_dim = bool(has_batch_dim)

    def _like(self, data: Mapping[str, list[torch.Tensor]], has_batch_dim: bool | None = None) -> "Cache":
        """A cache of ``data`` with this one's model and kind."""
        return Cache(data, model=self.model, gradient=self.is_gradient,
                     has_batch_dim=self.has_batch_dim if has_batch_dim is None else has_batch_dim)

    @property
    def cache_dict(self) -> "CacheDict":
        """TransformerLens's ``cache.cache_dict``: a live ``{name: tensor}`` view of this cache; reading gives
        ``cache[name]``, assigning (``cache.cache_dict[name] = t``) stores ``t`` as that name's one tensor, ``del``
        removes the name, as TL's dict does."""
        return CacheDict(self)

    # -- filling
    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._data.setdefault(name, []).append(tensor)

    def clear(self) -> None:
        self._data.clear()

    # -- mapping protocol
    def __getitem__(self, name) -> torch.Tensor:
        if isinstance(name, tuple):  # TransformerLens shorthand: cache["resid_post", 3], cache["scale", 2, "ln1"]
            if len(name) > 1 and isinstance(name[1], int) and name[1] < 0:  # cache["resid_post", -1]: the last layer
                name = (name[0], name[1] + self._layer_count(), *name[2:])
            name = _long_name(*name)
        elif name not in self._data and name in _SHORT:  # cache["scale"], cache["embed"]
            name = _long_name(name)
        if name not in self._data:
            raise UnknownHookError(unknown_message(name, list(self._data)) if self._data else
                                   f"{name!r} is not in this cache (it is empty)")
        parts = self._data[name]
        if len(parts) == 1:
            return parts[0]
        shapes = {tuple(p.shape[1:]) for p in parts}
        if len(shapes) != 1:
            raise ValueError(f"{name!r} was captured in {len(parts)} passes of different shapes "
                             f"{sorted(shapes)}; use cache.passes({name!r})")
        return torch.cat(parts, dim=0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {tuple(v[0].shape)}" + (f" x{len(v)}" if len(v) > 1 else "")
                          for k, v in self._data.items())
        return f"{'GradientCache' if self.is_gradient else 'Cache'}({inner})"

    def _repr_html_(self) -> str:
        """A table of the cached activations in Jupyter: name, shape, dtype, passes and memory."""
        import html

        rows, total = [], 0
        for k, parts in self._data.items():
            nbytes = sum(p.numel() * p.element_size() for p in parts)
            total += nbytes
            shape = tuple(parts[0].shape) if len(parts) == 1 else f"{tuple(parts[0].shape)} x{len(parts)} passes"
            rows.append(f"<tr><td style=\"text-align:left\"><code>{html.escape(k)}</code></td><td>{html.escape(str(shape))}"
                        f"</td><td>{html.escape(str(parts[0].dtype).replace('torch.', ''))}</td><td>{_size(nbytes)}</td></tr>")
        return (f"<div><b>Cache</b>: {len(self._data)} activation(s), {_size(total)}"
                + "<table><tr><th>name</th><th>shape</th><th>dtype</th><th>memory</th></tr>" + "".join(rows)
                + "</table></div>")

    def passes(self, name: str) -> list[torch.Tensor]:
        """The tensors of ``name``, one per forward pass, in the order they ran."""
        if name not in self._data:
            raise UnknownHookError(unknown_message(name, list(self._data)))
        return list(self._data[name])

    # -- helpers
    def stack(self, pattern: str) -> torch.Tensor:
        """Stack a per-layer hook over layers: ``cache.stack("hook_resid_post")`` -> ``[layer, ...]``.

        ``pattern`` is a block-hook suffix or a glob over the cache's keys; layers are sorted.
        """
        names = [n for n in self._data if fnmatch.fnmatchcase(n, pattern)
                 or fnmatch.fnmatchcase(n, f"blocks.*.{pattern}")]
        if not names:
            raise UnknownHookError(unknown_message(pattern, list(self._data)))
        names.sort(key=lambda n: (parse(n)[0] if parse(n)[0] is not None else -1, n))
        return torch.stack([self[n] for n in names])

    def select(self, patterns) -> "Cache":
        """A new cache with only the keys matching ``patterns``."""
        keep = expand(patterns, list(self._data))
        return self._like({k: self._data[k] for k in keep})

    def to(self, device=None, dtype=None) -> "Cache":
        """The cache on ``device`` / in ``dtype`` (floating tensors only); the device is checked first."""
        from .validation import check_device

        device = check_device(device)
        return self._like({k: [t.to(device=device, dtype=dtype if t.is_floating_point() else None) for t in v]
                           for k, v in self._data.items()})

    # -- TransformerLens-style analysis (need the model that filled the cache)
    def _need_model(self):
        if self.model is None:
            raise ValueError("this cache has no model attached (it was built by hand); set cache.model = model")
        return self.model

    def _n_layers(self) -> int:
        return self._need_model().cfg.n_layers

    def _layer_count(self) -> int:
        """The model's layer count, or (a cache built by hand) one more than the largest layer it holds."""
        if self.model is not None:
            return self.model.cfg.n_layers
        layers = [parse(k)[0] for k in self._data if parse(k)[0] is not None]
        return max(layers) + 1 if layers else 0

    def _layer_arg(self, layer: int | None) -> int:
        """TransformerLens's ``layer`` argument: ``None`` or ``-1`` is every layer (``n_layers``)."""
        n = self._n_layers()
        layer = n if layer is None or layer == -1 else layer
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n:
            raise ValueError(f"layer must be in 0..{n} (or -1 / None for all), got {layer!r}")
        return layer

    def remove_batch_dim(self) -> "Cache":
        """TransformerLens's ``remove_batch_dim``: drop the batch axis of a one-example run's cache, in place (as
        TL's), and return the cache. A second call warns and changes nothing, as TL's."""
        if not self.has_batch_dim:
            import warnings
            warnings.warn("remove_batch_dim: this cache has no batch axis already", stacklevel=2)
            return self
        if any(p.shape[0] != 1 for parts in self._data.values() for p in parts):
            raise ValueError("remove_batch_dim needs a cache of a one-example run (batch 1)")
        self._data = {k: [p[0] for p in v] for k, v in self._data.items()}
        self.has_batch_dim = False
        return self

    def apply_slice_to_batch_dim(self, batch_slice: Any) -> "Cache":
        """TransformerLens's ``apply_slice_to_batch_dim``: a cache of the batch rows ``batch_slice`` selects (an int
        selects one row and drops the batch axis, a tuple or ``slice`` slices, a list or tensor indexes)."""
        if not self.has_batch_dim:
            if batch_slice is None:
                return self._like(self._data)
            raise ValueError("cannot index into a cache without a batch axis (remove_batch_dim was applied)")
        keep_axis = batch_slice is None or isinstance(batch_slice, bool) or not isinstance(batch_slice, int)
        return self._like({k: [_pos(self[k], batch_slice, dim=0)] for k in self._data}, has_batch_dim=keep_axis)

    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False, apply_ln: bool = False,
                          pos_slice: Any = None, mlp_input: bool = False, return_labels: bool = False):
        """The residual stream as it accumulates, TransformerLens's way: ``blocks.{l}.hook_resid_pre`` for
        ``l = 0..layer`` (``layer = None`` or ``-1``: every layer, then the final residual, label
        ``final_post``), with ``hook_resid_mid`` after each pre when ``incl_mid``, and after the last one when
        ``mlp_input`` (the input of ``layer``'s MLP): ``[k, batch, pos, d]``. ``pos_slice`` selects positions
        (an int drops the axis, as in TL; a tuple is a slice).

        ``apply_ln`` as TransformerLens: for the final layer (the logit lens) each entry passes through the
        final norm module with its own, recomputed statistics (weight and bias included, so ``entry @ W_U + b_U``
        are the logits that residual would give; the last entry gives the model's logits); for an earlier
        ``layer`` it is centred (LayerNorm) and divided by this run's cached scale of that block's ``ln1``
        (``ln2`` with ``mlp_input``), without the norm's weight, as :meth:`apply_ln_to_stack`."""
        n = self._n_layers()
        layer = self._layer_arg(layer)
        names, labels = [], []
        for l in range(layer + 1):
            if l == n:
                names.append(f"blocks.{n - 1}.hook_resid_post")
                labels.append("final_post")
                continue
            names.append(f"blocks.{l}.hook_resid_pre")
            labels.append(f"{l}_pre")
            if (incl_mid and l < layer) or (mlp_input and l == layer):
                names.append(f"blocks.{l}.hook_resid_mid")
                labels.append(f"{l}_mid")
        stack = _pos(torch.stack([self[nm] for nm in names]), pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice,
                                           has_batch_dim=self.has_batch_dim, recompute_ln=layer == n)
        return (stack, labels) if return_labels else stack

    def _embed_parts(self) -> tuple[list[torch.Tensor], list[str]]:
        """The embedding parts of a decomposition, as TransformerLens: ``hook_embed`` (label ``embed``) and, on
        models with learned positions, ``hook_pos_embed`` (``pos_embed``), each ``[batch, pos, d]``; a cache
        without ``hook_embed`` (filtered by name) gives ``blocks.0.hook_resid_pre`` as one ``embed`` part."""
        if "hook_embed" not in self._data:
            return [self["blocks.0.hook_resid_pre"]], ["embed"]
        parts, labels = [self["hook_embed"]], ["embed"]
        if "hook_pos_embed" in self._data:
            parts.append(self["hook_pos_embed"].expand_as(parts[0]))  # a [1, pos, d] table broadcast to the batch
            labels.append("pos_embed")
        return parts, labels

    def decompose_resid(self, layer: int | None = None, mlp_input: bool = False, mode: str = "all",
                        apply_ln: bool = False, pos_slice: Any = None, incl_embeds: bool = True,
                        return_labels: bool = False):
        """The residual stream before ``layer`` (default ``None`` / ``-1``: the final one) as its additive parts,
        TransformerLens's: the embeddings (``embed`` = ``hook_embed`` and, with learned positions, ``pos_embed``
        = ``hook_pos_embed``; left out with ``incl_embeds=False``), then each layer's ``hook_attn_out`` and
        ``hook_mlp_out`` (``mode="attn"`` / ``"mlp"``: only those; attention-only models have no MLP part):
        ``[k, batch, pos, d]``; the parts sum to the residual (pre-norm, sequential models). ``mlp_input`` adds
        ``layer``'s ``hook_attn_out`` (the parts then sum to the input of ``layer``'s MLP). ``apply_ln`` passes
        them through the norm that reads them (the final norm, or ``layer``'s ``ln1`` / ``ln2`` with
        ``mlp_input``) as :meth:`apply_ln_to_stack` does; ``pos_slice`` as in :meth:`accumulated_resid`.
        Arguments in TransformerLens's order."""
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        layer = self._layer_arg(layer)
        incl_attn = mode != "mlp"
        incl_mlp = mode != "attn" and not getattr(self._need_model().cfg, "attn_only", False)
        parts, labels = self._embed_parts() if incl_embeds else ([], [])
        names = []
        for l in range(layer):
            if incl_attn:
                names.append(f"blocks.{l}.hook_attn_out")
                labels.append(f"{l}_attn_out")
            if incl_mlp:
                names.append(f"blocks.{l}.hook_mlp_out")
                labels.append(f"{l}_mlp_out")
        if mlp_input and incl_attn:
            if layer == self._n_layers():
                raise ValueError("mlp_input needs a block's layer (0..n_layers-1): the final norm reads no MLP")
            names.append(f"blocks.{layer}.hook_attn_out")
            labels.append(f"{layer}_attn_out")
        parts = parts + [self[nm] for nm in names]
        if not parts:
            raise ValueError("decompose_resid: nothing to decompose (incl_embeds=False before layer 0)")
        stack = _pos(torch.stack(parts), pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def stack_head_results(self, layer: int | None = -1, return_labels: bool = False, incl_remainder: bool = False,
                           pos_slice: Any = None, apply_ln: bool = False):
        """Each head's direct contribution to the residual stream, ``z_h @ W_O[l, h]``, for layers
        ``0..layer-1`` (``-1`` / ``None``: every layer): ``[layer * head, batch, pos, d]`` (labels ``L{l}H{h}``).
        The output bias ``b_O`` is not included (it belongs to no head); ``incl_remainder`` adds the rest of
        ``blocks.{layer-1}.hook_resid_post`` as a last component (label ``remainder``). ``apply_ln`` and
        ``pos_slice`` as in :meth:`decompose_resid`. A cache holding ``attn.hook_result`` (each head's output,
        ``[batch, pos, head, d]``) is read from there, as TransformerLens does.

        On a gradient cache (``model.gradients(...).grads``) the result is the gradient with respect to each head's
        output, which is ``attn.hook_result``'s gradient (take it: ``model.gradients(x,
        "blocks.*.attn.hook_result")``); ``dL/dz @ W_O`` is not that gradient, so a gradient cache without
        ``hook_result`` is refused, as are ``incl_remainder`` and ``apply_ln`` there."""
        model = self._need_model()
        n = self._layer_arg(layer)
        if self.is_gradient and (incl_remainder or apply_ln):
            raise ValueError("this cache holds gradients: incl_remainder / apply_ln have no meaning for gradients "
                             "(they add and normalise activations)")
        W_O = None
        parts, labels = [], []
        for l in range(n):
            result = f"blocks.{l}.attn.hook_result"
            if result in self._data:
                r = self[result]  # [b, p, H, d]
                parts.append(r.movedim(-2, 0))
                labels += [f"L{l}H{h}" for h in range(r.shape[-2])]
                continue
            if self.is_gradient:
                raise ValueError(f"this cache holds gradients and has no {result!r}: a head's gradient in the "
                                 "residual stream is the gradient at attn.hook_result (model.gradients(inputs, "
                                 "'blocks.*.attn.hook_result')); dL/dz @ W_O is not a gradient of anything")
            if W_O is None:
                W_O = model.weight("W_O")  # [L, H, d_head, d]
            z = self[f"blocks.{l}.attn.hook_z"]  # [b, p, H, d_head]
            parts.append(torch.einsum("...phe,hed->h...pd", z.float(), W_O[l].float().to(z.device)).to(z.dtype))
            labels += [f"L{l}H{h}" for h in range(z.shape[-2])]
        stack = torch.cat(parts) if parts else torch.zeros(0, *self["blocks.0.hook_resid_pre"].shape)
        if incl_remainder:
            total = self[f"blocks.{n - 1}.hook_resid_post"] if n else self["blocks.0.hook_resid_pre"]
            stack = torch.cat([stack, (total - stack.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, n)
        stack = _pos(stack, pos_slice)
        return (stack, labels) if return_labels else stack

    def get_neuron_results(self, layer: int, neuron_slice: Any = None, pos_slice: Any = None,
                           project_output_onto: torch.Tensor | None = None) -> torch.Tensor:
        """TransformerLens's ``get_neuron_results``: each neuron's output in the residual stream at ``layer``,
        ``post[..., n] * W_out[layer, n]``, ``[batch, pos, neuron, d_model]`` (``b_out`` belongs to no neuron).
        ``neuron_slice`` / ``pos_slice`` as TL's ``Slice``: an int selects one (dropping its axis, as TL), a tuple
        or ``slice`` slices, a list or tensor indexes. ``project_output_onto`` (``[d_model]`` or ``[d_model, n]``)
        projects each output, as TL's (the last axis dropped, or ``n``)."""
        model = self._need_model()
        post = _pos(self[f"blocks.{layer}.mlp.hook_post"], pos_slice)  # [b, p, d_mlp]
        W_out = model.weight("W_out")[layer]  # [d_mlp, d]
        post, W_out = _pos(post, neuron_slice, dim=-1), _pos(W_out, neuron_slice, dim=0)
        out = (post.float()[..., None] * W_out.float().to(post.device)).to(post.dtype)
        return _project(out, project_output_onto)

    def stack_neuron_results(self, layer: int | None = None, pos_slice: Any = None, neuron_slice: Any = None,
                             return_labels: bool = False, incl_remainder: bool = False, apply_ln: bool = False,
                             project_output_onto: torch.Tensor | None = None):
        """TransformerLens's ``stack_neuron_results``: every neuron's output (:meth:`get_neuron_results`) of layers
        ``0..layer-1`` (``None`` / ``-1``: every layer), ``[layer * neuron, batch, pos, d_model]``, labels
        ``L{l}N{n}``; ``incl_remainder`` adds the rest of the residual stream before ``layer`` (label
        ``remainder``), ``apply_ln`` normalises as :meth:`apply_ln_to_stack` at ``layer``, then
        ``project_output_onto`` projects as :meth:`get_neuron_results` (TL's argument order)."""
        n = self._layer_arg(layer)
        if self.is_gradient:
            raise ValueError("this cache holds gradients: neuron outputs are products of activations and weights")
        if isinstance(neuron_slice, int) and not isinstance(neuron_slice, bool):
            neuron_slice = [neuron_slice]  # one neuron per layer: keep the neuron axis the stack is made of
        parts, labels = [], []
        for l in range(n):
            out = self.get_neuron_results(l, neuron_slice, pos_slice)  # [b, p, m, d]
            parts.append(out.movedim(-2, 0))
            ids = _pos(torch.arange(self[f"blocks.{l}.mlp.hook_post"].shape[-1]), neuron_slice, dim=0)
            labels += [f"L{l}N{i}" for i in ids.tolist()]
        resid = _pos(self[f"blocks.{n}.hook_resid_pre"] if n < self._n_layers()
                     else self[f"blocks.{n - 1}.hook_resid_post"], pos_slice)
        stack = torch.cat(parts) if parts else resid.new_zeros((0, *resid.shape))
        if incl_remainder:
            stack = torch.cat([stack, (resid - stack.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, n, pos_slice=pos_slice)
        stack = _project(stack, project_output_onto)
        return (stack, labels) if return_labels else stack

    def compute_head_results(self) -> None:
        """TransformerLens's ``compute_head_results``: add ``blocks.{l}.attn.hook_result`` (each head's output in
        the residual stream, ``z @ W_O`` without ``b_O``, ``[batch, pos, head, d_model]``) for every layer that has
        ``hook_z`` and no ``hook_result`` yet. Refused on a gradient cache (see :meth:`stack_head_results`)."""
        if self.is_gradient:
            raise ValueError("this cache holds gradients: the head results of a gradient cache are the gradients at "
                             "attn.hook_result (model.gradients(inputs, 'blocks.*.attn.hook_result')), not dL/dz @ W_O")
        W_O = self._need_model().weight("W_O")
        for l in range(self._n_layers()):
            z_name, result = f"blocks.{l}.attn.hook_z", f"blocks.{l}.attn.hook_result"
            if result in self._data or z_name not in self._data:
                continue
            self._data[result] = [torch.einsum("...he,hed->...hd", z.float(), W_O[l].float().to(z.device)).to(z.dtype)
                                  for z in self._data[z_name]]

    def stack_activation(self, activation_name: str, layer: int = -1, sublayer_type: str | None = None) -> torch.Tensor:
        """TransformerLens's ``stack_activation``: ``activation_name`` (a short name, as :func:`interp.utils.get_act_name`
        takes it) of layers ``0..layer-1`` (``-1`` / ``None``: every layer) stacked, ``[layer, ...]``."""
        from .utils import get_act_name

        n = self._layer_arg(layer)
        return torch.stack([self[get_act_name(activation_name, l, sublayer_type)] for l in range(n)])

    def get_full_resid_decomposition(self, layer: int | None = None, mlp_input: bool = False,
                                     expand_neurons: bool = True, apply_ln: bool = False, pos_slice: Any = None,
                                     return_labels: bool = False, project_output_onto: torch.Tensor | None = None):
        """TransformerLens's ``get_full_resid_decomposition`` (its argument order): the residual stream before
        ``layer`` (``None`` / ``-1``: the final one; with ``mlp_input``, the input of ``layer``'s MLP) as each
        head's output (``L{l}H{h}``, :meth:`stack_head_results`), each neuron's output ``post * W_out[n]``
        (``L{l}N{n}``; each layer's ``mlp_out``, ``b_out`` included, when ``expand_neurons=False``, labelled
        ``{l}_mlp_out``), the embeddings (``embed`` and, with learned positions, ``pos_embed``, as
        :meth:`decompose_resid`) and the biases (``bias``: every ``b_O``, and every ``b_out`` with ``expand_neurons``):
        ``[k, batch, pos, d]``, summing to the residual. ``apply_ln`` / ``pos_slice`` as in :meth:`decompose_resid`.
        ``project_output_onto`` (``[d]`` or ``[d, n]``, e.g. a logit direction) projects each component: the last axis
        becomes ``n`` (dropped for ``[d]``), as TransformerLens (here computed after the decomposition: the same
        numbers, without TL's saving of memory)."""
        model = self._need_model()
        if self.is_gradient:
            raise ValueError("this cache holds gradients: a decomposition of the residual stream into weighted "
                             "parts is defined for activations only")
        n = self._layer_arg(layer)
        if mlp_input and n == self._n_layers():
            raise ValueError("mlp_input needs a block's layer (0..n_layers-1): the final norm reads no MLP")
        heads, labels = self.stack_head_results(n + (1 if mlp_input else 0), return_labels=True)
        parts = [heads]
        for l in range(n):
            if expand_neurons:
                neurons = self.get_neuron_results(l).movedim(-2, 0)  # [d_mlp, b, p, d]
                parts.append(neurons)
                labels += [f"L{l}N{i}" for i in range(neurons.shape[0])]
            else:
                parts.append(self[f"blocks.{l}.hook_mlp_out"][None])  # b_out included, as TL
                labels.append(f"{l}_mlp_out")
        embeds, embed_labels = self._embed_parts()
        embed = embeds[0]
        parts += [e[None] for e in embeds]
        labels += embed_labels
        bias = model.accumulated_bias(n, mlp_input, include_mlp_biases=expand_neurons)
        parts.append(bias.to(embed.device, embed.dtype).expand_as(embed)[None])
        labels.append("bias")
        stack = _pos(torch.cat(parts), pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, n, mlp_input, pos_slice=pos_slice)
        stack = _project(stack, project_output_onto)
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(self, stack: torch.Tensor, layer: int | None = None, mlp_input: bool = False,
                          pos_slice: Any = None, batch_slice: Any = None, has_batch_dim: bool = True,
                          recompute_ln: bool = False, *, include_weight: bool = False,
                          include_bias: bool = False) -> torch.Tensor:
        """TransformerLens's ``apply_ln_to_stack``: treat components ``stack [k, *batch_and_pos, d]`` as the input
        of a norm and apply that norm's scaling as this run applied it: centre each component (LayerNorm) and
        divide by the run's cached ``hook_scale``. The result is linear in the components.

        As TransformerLens, the norm's weight and bias are **not** applied (TL assumes ``fold_ln`` moved them into
        the next weights; interp models are never folded, so this is TL's number on the same, unfolded weights:
        the components' ``@ W_U`` then do not sum to the logit when the norm's weight is not 1).
        ``include_weight=True`` multiplies by the norm's weight (then the attributions sum to the logit, less
        the bias term :meth:`ln_bias_term`, a constant), ``include_bias=True`` also adds the bias to every
        component (interp's keywords, beyond TL's).

        Arguments as TransformerLens's: ``layer`` ``None`` / ``-1`` / ``n_layers`` is the final norm; another
        layer is that block's ``ln1`` (the attention input), or its ``ln2`` with ``mlp_input=True``.
        ``pos_slice``: the stack holds only these positions (already sliced; the scale is sliced the same way).
        ``batch_slice`` slices the stack's batch axis (axis 1, when ``has_batch_dim``) and the scale's alike.
        ``has_batch_dim=False``: the stack has no batch axis. ``recompute_ln=True`` at the final layer passes each
        component through the final norm with statistics of its own, weight and bias included (TL's
        ``model.ln_final(component)``: the logit lens of :meth:`accumulated_resid`); elsewhere it is ignored, as
        in TL."""
        model = self._need_model()
        if self.is_gradient:
            raise ValueError("this cache holds gradients: a norm is applied to activations, not to gradients")
        n = self._n_layers()
        if layer is None or layer == -1 or layer == n:
            which, scale_name = "ln_final", "ln_final.hook_scale"
        elif isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < n:
            which = "ln2" if mlp_input else "ln1"
            scale_name = f"blocks.{layer}.{which}.hook_scale"
        else:
            raise ValueError(f"apply_ln_to_stack: layer {layer!r} out of range: None, -1 or {n} (the final norm) "
                             f"or a block 0..{n - 1}")
        w, b, kind = model.norm_parts(which, None if which == "ln_final" else layer)
        if has_batch_dim and batch_slice is not None:
            stack = _pos(stack, batch_slice, dim=1)
        x = stack.float()
        if kind == "layer":
            x = x - x.mean(-1, keepdim=True)
        if recompute_ln and which == "ln_final":  # TL's ln_final(component): own statistics, weight and bias
            eps = model._final_norm()[3]
            x = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            include_weight = include_bias = True
        else:
            scale = self[scale_name].float()
            if batch_slice is not None and self.has_batch_dim:
                scale = _pos(scale, batch_slice, dim=0)
            x = x / _pos(scale, pos_slice, dim=-2).to(x.device)
        if include_weight and w is not None:
            x = x * w.float().to(x.device)
        if include_bias and b is not None:
            x = x + b.float().to(x.device)
        return x.to(stack.dtype)

    def ln_bias_term(self) -> torch.Tensor:
        """The final norm's bias (``[d]``, zeros for RMSNorm): the constant that completes a decomposition
        passed through :meth:`apply_ln_to_stack` with ``include_weight=True``."""
        model = self._need_model()
        w, b, _ = model.ln_final_parts()
        return b if b is not None else torch.zeros(model.cfg.d_model)

    def logit_attrs(self, residual_stack: torch.Tensor, tokens, incorrect_tokens=None, pos_slice: Any = None,
                    batch_slice: Any = None, has_batch_dim: bool = True, *, pos: int | None = None) -> torch.Tensor:
        """TransformerLens's ``logit_attrs``: how much each component of ``residual_stack`` ``[k, *batch_and_pos,
        d]`` (a decomposition of the final residual, not yet normalised) writes in the direction of ``tokens``
        (minus ``incorrect_tokens`` when given, of the same shape): ``apply_ln_to_stack(residual_stack, -1,
        pos_slice=pos_slice, batch_slice=batch_slice, has_batch_dim=has_batch_dim)`` (TL's: no norm weight)
        times :meth:`interp.Model.tokens_to_residual_directions`, summed over ``d``: ``[k, *batch_and_pos]``.
        ``tokens`` is a string (one token), an int, or ``[batch]`` / ``[batch, pos]`` ids.

        ``pos=`` (keyword only) is interp's earlier form: ``residual_stack`` already through
        :meth:`apply_ln_to_stack`, position ``pos`` taken here, ``W_U`` directions per batch row."""
        model = self._need_model()

        def ids(t):
            if isinstance(t, str):
                t = model.to_single_token(t)
            return torch.as_tensor(t, dtype=torch.long)
        if incorrect_tokens is not None and ids(tokens).shape != ids(incorrect_tokens).shape:
            raise ValueError(f"tokens and incorrect_tokens must have the same shape, got {tuple(ids(tokens).shape)} "
                             f"and {tuple(ids(incorrect_tokens).shape)}")
        dirs = model.tokens_to_residual_directions(tokens).float()  # [..., d]
        if incorrect_tokens is not None:
            dirs = dirs - model.tokens_to_residual_directions(incorrect_tokens).float()
        if pos is not None:
            if pos_slice is not None or batch_slice is not None:
                raise ValueError("logit_attrs: give pos= (interp's form, a normalised stack) or TL's pos_slice / "
                                 "batch_slice, not both")
            x = residual_stack[..., pos, :].float() if has_batch_dim else residual_stack.float()
            return (x * dirs.to(x.device)).sum(-1)
        scaled = self.apply_ln_to_stack(residual_stack, -1, pos_slice=pos_slice, batch_slice=batch_slice,
                                        has_batch_dim=has_batch_dim)
        return (scaled.float() * dirs.to(scaled.device)).sum(-1)

    def mean(self, name: str, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mean of ``cache[name]`` over batch and positions.

        ``mask`` (``[batch, pos]``, 1 = real token) excludes padding; it must match the activation's
        batch and position axes (``[batch, pos, ...]``, or ``[batch, head, q, k]`` for patterns, whose
        query axis is used), otherwise a ``ValueError`` says what was expected.
        """
        t = self[name]
        if mask is None:
            return t.float().mean(dim=tuple(range(min(2, t.dim() - 1)))).to(t.dtype)
        hook = parse(name)[1]
        pos_axis = 2 if hook in ("attn.hook_pattern", "attn.hook_attn_scores") else 1
        if t.dim() < 3 or (t.shape[0], t.shape[pos_axis]) != tuple(mask.shape):
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not match {name!r}, whose activation is "
                             f"{tuple(t.shape)}; expected [batch, pos] = "
                             f"{(t.shape[0], t.shape[pos_axis]) if t.dim() >= 3 else 'n/a (no position axis)'}")
        t = t.movedim(pos_axis, 1)
        m = mask.to(t.device, torch.float32).reshape(*mask.shape, *([1] * (t.dim() - 2)))
        return ((t.float() * m).sum((0, 1)) / m.sum((0, 1)).clamp_min(1)).to(t.dtype)
