"""The ``transformer_lens`` backend: a TransformerBridge (TL 3.x/4.x) or a HookedTransformer (TL 3.x).

Canonical names are TransformerLens's own names, so hooks map one to one. A bridge is put in
compatibility mode (without weight processing, so its outputs equal the HF model's) to expose the
classic hook names with their classic shapes.
"""
from __future__ import annotations

import warnings
from functools import partial
from typing import Any

import torch

from ..interventions import HookContext
from ..model import HookSet, Model, ModelConfig
from ..names import BLOCK_HOOKS, order_key


def _canonical_set(n_layers: int) -> list[str]:
    names = ["hook_embed"] + [f"blocks.{l}.{h}" for l in range(n_layers) for h in BLOCK_HOOKS]
    return names + ["ln_final.hook_normalized"]


class TLModel(Model):
    backend = "transformer_lens"

    def __init__(self, tl_model, tokenizer=None) -> None:
        from transformer_lens import HookedTransformer

        self.tl = tl_model.eval()
        self.is_bridge = not isinstance(tl_model, HookedTransformer)
        if self.is_bridge and not getattr(tl_model, "compatibility_mode", False):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tl_model.enable_compatibility_mode(no_processing=True)
        c = tl_model.cfg
        offered = set(tl_model.hook_dict)
        self._names = sorted((n for n in _canonical_set(c.n_layers) if n in offered),
                             key=lambda n: order_key(n, c.n_layers))
        self.hf_model = getattr(tl_model, "original_model", None)
        family = getattr(c, "original_architecture", None) or getattr(c, "architecture", None) or "transformer_lens"
        n_kv = getattr(c, "n_key_value_heads", None) or c.n_heads
        super().__init__(tokenizer if tokenizer is not None else tl_model.tokenizer,
                         ModelConfig(str(family), c.n_layers, c.n_heads, n_kv, c.d_model, c.d_head,
                                     getattr(c, "d_vocab", None), True, "text"))

    def _all_hook_names(self) -> list[str]:
        return self._names

    @property
    def device(self) -> torch.device:
        try:
            return next(self.tl.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def _tl_hook(self, name: str, fns: list, tensor: torch.Tensor, hook: Any) -> torch.Tensor | None:
        ctx: HookContext = self._context(name)
        changed = False
        for fn in fns:
            out = fn(tensor, ctx)
            if out is None or out is tensor:
                continue
            if not isinstance(out, torch.Tensor) or out.shape != tensor.shape:
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"intervention on {name!r} returned {shape}; expected a tensor of shape "
                                 f"{tuple(tensor.shape)}")
            tensor, changed = out, True
        return tensor if changed else None

    def _forward(self, batch, hooks: HookSet, stop_at_layer, grad):
        unknown = [n for n in hooks if n not in self._names]
        if unknown:
            from ..names import UnknownHookError, unknown_message
            raise UnknownHookError(unknown_message(unknown[0], self._names))
        fwd_hooks = [(n, partial(self._tl_hook, n, fns)) for n, fns in hooks.items() if fns]
        kwargs: dict[str, Any] = {"attention_mask": batch["attention_mask"], "return_type": "logits",
                                  "stop_at_layer": stop_at_layer}
        if self.is_bridge:
            kwargs["position_ids"] = batch["position_ids"]
        with (torch.enable_grad() if grad else torch.no_grad()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = self.tl.run_with_hooks(batch["input_ids"], fwd_hooks=fwd_hooks, **kwargs)
        return None if stop_at_layer is not None else out
