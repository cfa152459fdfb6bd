"""Shared base of the backends that run a Hugging Face module (torch hooks and nnsight)."""
from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Iterator

import torch
from torch import nn

from ..architectures import ArchSpec, Site, arch_spec
from ..model import HookSet, Model, ModelConfig


class HFModel(Model):
    """A Model over a ``transformers`` module with an :class:`ArchSpec` locating the canonical hooks."""

    def __init__(self, hf_model: nn.Module, tokenizer=None, spec: ArchSpec | None = None) -> None:
        self.hf_model = hf_model.eval()
        self.spec = spec or arch_spec(hf_model)
        self.sites: dict[str, Site] = self.spec.sites()
        hf_cfg = getattr(hf_model, "config", None)
        vocab = getattr(hf_cfg, "vocab_size", None) if hf_cfg is not None else None
        is_lm = hasattr(hf_model, "get_output_embeddings") and hf_model.get_output_embeddings() is not None \
            and self.spec.family not in ("bert",)
        modality = "vision" if self.spec.family in ("vit", "dinov2") else "text"
        super().__init__(tokenizer, ModelConfig(self.spec.family, self.spec.n_layers, self.spec.n_heads,
                                                self.spec.n_kv_heads, self.spec.d_model, self.spec.d_head,
                                                vocab, bool(is_lm), modality))

    def _all_hook_names(self) -> list[str]:
        return list(self.sites)

    @property
    def device(self) -> torch.device:
        try:
            return next(self.hf_model.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def _float_dtype(self) -> torch.dtype:
        for p in self.hf_model.parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.float32

    # ------------------------------------------------------------------ helpers for subclasses
    def _groups(self, hooks: HookSet) -> dict[tuple[str, str], list[tuple[str, Site, list]]]:
        """Hooks grouped by (module path, "input"/"output"), in canonical order within a group."""
        groups: dict[tuple[str, str], list] = defaultdict(list)
        for name in self.sites:
            if name in hooks and hooks[name]:
                site = self.sites[name]
                groups[(site.module, site.io)].append((name, site, hooks[name]))
        unknown = [n for n in hooks if n not in self.sites]
        if unknown:
            from ..names import UnknownHookError, unknown_message
            raise UnknownHookError(unknown_message(unknown[0], list(self.sites)))
        return groups

    def _apply(self, entries: list[tuple[str, Site, list]], raw: Any) -> tuple[Any, bool]:
        """Run the hook functions of one module call on its raw input/output value."""
        changed_any = False
        for name, site, fns in entries:
            t, changed = self._call_hooks(name, site.lens.get(raw), fns, site.lens.writable)
            if changed:
                raw = site.lens.set(raw, t)
                changed_any = True
        return raw, changed_any

    def _output(self, out: Any) -> Any:
        if hasattr(out, "logits") and out.logits is not None:
            return out.logits
        if hasattr(out, "last_hidden_state"):
            return out.last_hidden_state
        return out[0] if isinstance(out, (tuple, list)) else out

    def _kwargs(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        if "pixel_values" in batch:
            return {"pixel_values": batch["pixel_values"]}
        kw = dict(batch)
        if self.spec.family == "bert":
            kw["token_type_ids"] = torch.zeros_like(kw["input_ids"])
        kw["use_cache"] = False
        if not self._accepts_position_ids:
            kw.pop("position_ids", None)
        return kw

    @property
    def _accepts_position_ids(self) -> bool:
        import inspect
        try:
            return "position_ids" in inspect.signature(self.hf_model.forward).parameters
        except (TypeError, ValueError):
            return False

    @contextlib.contextmanager
    def _eager_if_needed(self, hooks: HookSet) -> Iterator[None]:
        """Attention weights exist only under eager attention: switch for the duration if a pattern is hooked."""
        need = any(self.sites[n].needs_eager for n in hooks if n in self.sites and hooks[n])
        configs = []
        if need:
            seen = set()
            for m in self.hf_model.modules():
                c = getattr(m, "config", None)
                if c is not None and id(c) not in seen and hasattr(c, "_attn_implementation"):
                    seen.add(id(c))
                    if c._attn_implementation != "eager":
                        configs.append((c, c._attn_implementation))
                        c._attn_implementation = "eager"
        try:
            yield
        finally:
            for c, impl in configs:
                c._attn_implementation = impl
