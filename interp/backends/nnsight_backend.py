"""The ``nnsight`` backend: an nnsight 0.8 trace over the HF module.

nnsight replaces a module's forward and interleaves the trace body with the model's execution, so a
trace must request module values in the order the model produces them. That order is measured once
per model (a recording forward with plain torch hooks) and the requested hooks are visited in it.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..model import HookSet
from ..run import current_pass
from .hf import HFModel


class NNsightModel(HFModel):
    backend = "nnsight"

    def __init__(self, hf_model, tokenizer=None, spec=None, nn_model=None) -> None:
        super().__init__(hf_model, tokenizer, spec)
        from nnsight import NNsight

        self.nn = nn_model if nn_model is not None else NNsight(self.hf_model)
        self._order: dict[tuple[str, str], int] | None = None

    def _execution_order(self, kwargs: dict[str, Any]) -> dict[tuple[str, str], int]:
        """First-call order of every (module, input/output) that carries a canonical hook."""
        if self._order is None:
            seen: dict[tuple[str, str], int] = {}
            handles = []
            for path in {s.module for s in self.sites.values()}:
                mod = self.hf_model.get_submodule(path)

                def pre(m, a, k, path=path):
                    seen.setdefault((path, "input"), len(seen))

                def post(m, a, o, path=path):
                    seen.setdefault((path, "output"), len(seen))
                handles += [mod.register_forward_pre_hook(pre, with_kwargs=True), mod.register_forward_hook(post)]
            try:
                ids = kwargs.get("input_ids")
                probe = {k: (v[:1, :2] if ids is not None and v.shape[:2] == ids.shape else v[:1])
                         for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
                probe.update({k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)})
                with torch.no_grad():
                    self.hf_model(**probe)
            finally:
                for h in handles:
                    h.remove()
            self._order = seen
        return self._order

    def _envoy(self, path: str):
        """The envoy of a module path, matched by module identity (a child named ``output`` or
        ``input``, as in BERT, would otherwise resolve to nnsight's value accessors)."""
        env = self.nn
        for part in path.split("."):
            target = env._module.get_submodule(part)
            env = next((c for c in env._children if c._module is target), None) or getattr(env, part)
        return env

    def _forward(self, batch, hooks: HookSet, stop_at_layer, grad):
        kwargs = self._kwargs(batch)
        groups = self._groups(hooks)
        order = self._execution_order(kwargs) if groups or stop_at_layer else {}
        keys = sorted(groups, key=lambda k: order.get(k, math.inf))
        stop_key = (f"{self.spec.blocks}.{stop_at_layer - 1}", "output") if stop_at_layer else None
        if stop_key is not None:
            keys = [k for k in keys if order.get(k, math.inf) <= order[stop_key]]
        result: list[Any] = []
        run_ctx = current_pass(self)  # nnsight runs the trace body in a worker thread: hand it over
        # hooks inside the attention function are called from the model's own forward, not through the trace
        with (torch.enable_grad() if grad else torch.no_grad()), self._attention_hooks_installed(hooks, None, run_ctx):
            with self.nn.trace(**kwargs) as tracer:
                for key in keys:
                    env = self._envoy(key[0])
                    inp = env.input if key[1] == "input" or any(site.needs_input for _, site, _ in groups[key]) else None
                    raw = env.output if key[1] == "output" else inp
                    new, changed = self._apply(groups[key], raw, run_ctx, env._module, inp)
                    if changed:
                        if key[1] == "output":
                            env.output = new
                        else:
                            env.input = new
                if stop_key is not None:
                    if stop_key not in keys:
                        self._envoy(stop_key[0]).output
                    tracer.stop()
                else:
                    result.append(self.nn.output.save())
        return self._output(result[0], batch) if result else None
