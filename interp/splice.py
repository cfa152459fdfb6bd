"""SAEs (and transcoders) spliced into a model as hook points.

``with model.splice(sae, at="blocks.5.hook_resid_post"):`` replaces the activation at ``at`` by the SAE's
output for every forward inside the block, and the SAE's internal tensors become hook names of the
model, named as sae-lens names them::

    blocks.5.hook_resid_post.hook_sae_input       [batch, pos, d_in]
    blocks.5.hook_resid_post.hook_sae_acts_pre    [batch, pos, d_sae]
    blocks.5.hook_resid_post.hook_sae_acts_post   [batch, pos, d_sae]   the latents
    blocks.5.hook_resid_post.hook_sae_recons      [batch, pos, d_in]
    blocks.5.hook_resid_post.hook_sae_error       [batch, pos, d_in]    with use_error_term=True
    blocks.5.hook_resid_post.hook_sae_output      [batch, pos, d_in]

They can be captured (``run_with_cache``), intervened on and patched like any other hook, on every
backend, and gradients flow through them (``gradients``, ``forward_with_grad``). With
``use_error_term=True`` the output is ``recons + error`` where ``error = x - recons`` is computed
without gradient, so the spliced model reproduces the clean logits exactly while latents stay
differentiable (as sae-lens does).

An SAE is an sae-lens ``SAE`` (its own forward runs, with our hooks on its hook points, so every
architecture sae-lens has, JumpReLU, TopK, gated, ..., works as sae-lens defines it), or any module
with ``encode(x) -> latents`` and ``decode(latents) -> recons`` (e.g. our transcoders).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

SAE_HOOKS = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons",
             "hook_sae_error", "hook_sae_output")


class Splice:
    """One SAE spliced at one hook: an intervention on ``at`` that runs the SAE and fires its hooks."""

    def __init__(self, model, sae: Any, at: str, use_error_term: bool = False) -> None:
        if not (hasattr(sae, "hook_dict") or (hasattr(sae, "encode") and hasattr(sae, "decode"))):
            raise TypeError(f"cannot splice {type(sae).__name__}: expected an sae-lens SAE or a module with "
                            "encode(x) and decode(latents)")
        self.model, self.sae, self.at, self.use_error_term = model, sae, at, bool(use_error_term)
        self.names = [f"{at}.{h}" for h in SAE_HOOKS if h != "hook_sae_error" or self.use_error_term]

    def intervention(self, virtual: dict[str, list[Callable]]) -> Callable:
        """The function to run at ``at`` for one forward, calling ``virtual`` (name -> hook fns)."""
        def run(x: torch.Tensor, ctx) -> torch.Tensor:
            return self._forward(x, ctx, virtual)
        return run

    def _fire(self, hook: str, t: torch.Tensor, ctx, virtual) -> torch.Tensor:
        fns = virtual.get(f"{self.at}.{hook}")
        if not fns:
            return t
        out, _ = self.model._call_hooks(f"{self.at}.{hook}", t, fns, True, _PassOf(ctx))
        return out

    def _forward(self, x: torch.Tensor, ctx, virtual) -> torch.Tensor:
        dtype = _dtype(self.sae, x)
        xs = x.to(dtype)
        if hasattr(self.sae, "hook_dict") and all(h in self.sae.hook_dict for h in SAE_HOOKS):
            fwd = [(h, (lambda t, hook, h=h: self._fire(h, t, ctx, virtual))) for h in SAE_HOOKS
                   if f"{self.at}.{h}" in virtual]
            old = getattr(self.sae, "use_error_term", False)
            try:
                self.sae.use_error_term = self.use_error_term
                with self.sae.hooks(fwd_hooks=fwd):
                    out = self.sae(xs)
            finally:
                self.sae.use_error_term = old
            return out.to(x.dtype)
        # generic encode/decode module
        xs = self._fire("hook_sae_input", xs, ctx, virtual)
        acts = self.sae.encode(xs)
        acts = self._fire("hook_sae_acts_pre", acts, ctx, virtual)
        acts = self._fire("hook_sae_acts_post", acts, ctx, virtual)
        recons = self._fire("hook_sae_recons", self.sae.decode(acts), ctx, virtual)
        out = recons
        if self.use_error_term:
            with torch.no_grad():
                err = xs - self.sae.decode(self.sae.encode(xs))
            out = recons + self._fire("hook_sae_error", err, ctx, virtual)
        return self._fire("hook_sae_output", out, ctx, virtual).to(x.dtype)


class _PassOf:
    """A stand-in pass context built from the base hook's ``HookContext`` (so spliced hooks see the
    same mask, pass index and past length as the hook they sit on)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def query_mask(self, n: int):
        m = self.ctx.attention_mask
        return m if m is None or m.shape[-1] == n else None

    @property
    def attention_mask(self):
        return self.ctx.key_mask

    @property
    def pass_index(self):
        return self.ctx.pass_index

    @property
    def past_length(self):
        return self.ctx.past_length

    @property
    def generating(self):
        return self.ctx.generating

    @property
    def run(self):
        return _RunId(self.ctx.run_id)


class _RunId:
    def __init__(self, run_id: int) -> None:
        self.run_id = run_id


def _dtype(module: Any, like: torch.Tensor) -> torch.dtype:
    for p in getattr(module, "parameters", lambda: iter(()))():
        if p.is_floating_point():
            return p.dtype
    return like.dtype


__all__ = ["Splice", "SAE_HOOKS"]
