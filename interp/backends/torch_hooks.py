"""The ``torch`` backend: plain ``register_forward_hook`` / ``register_forward_pre_hook`` on HF modules.

The cheapest path: hooks are installed only for the names in use, and removed afterwards (also on an
exception). Hooks of open ``capture``/``intervene`` contexts are real torch hooks, so they also see
forward passes the user runs on ``model.hf_model`` directly and ``hf_model.generate``. Hooks the user
registered on the modules themselves are never touched.
"""
from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Callable

import torch

from ..model import HookSet, StopForward
from .hf import HFModel


class TorchModel(HFModel):
    backend = "torch"

    def _install(self, hooks: HookSet) -> Callable[[], None]:
        handles: list[Any] = []
        eager = self._eager_if_needed(hooks)
        try:
            eager.__enter__()
            handles.append(eager)
            for (path, io), entries in self._groups(hooks).items():
                module = self.hf_model.get_submodule(path)
                if io == "output":
                    handles.append(module.register_forward_hook(partial(self._out_hook, entries)))
                else:
                    handles.append(module.register_forward_pre_hook(partial(self._in_hook, entries), with_kwargs=True))
        except BaseException:
            _remove(handles)
            raise
        return partial(_remove, handles)

    def _out_hook(self, entries, module, args, output):
        new, changed = self._apply(entries, output)
        return new if changed else None

    def _in_hook(self, entries, module, args, kwargs):
        if args:
            new, changed = self._apply(entries, args[0])
            return ((new, *args[1:]), kwargs) if changed else None
        key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
        new, changed = self._apply(entries, kwargs[key])
        return (args, {**kwargs, key: new}) if changed else None

    def _push(self, hooks: HookSet):
        # contexts become real torch hooks at once, so raw hf_model calls and HF generate see them too
        return self._install(hooks)

    def _forward(self, batch, hooks, stop_at_layer, grad):
        remove = self._install(hooks)
        stop_handle = None
        if stop_at_layer is not None:
            block = self.hf_model.get_submodule(f"{self.spec.blocks}.{stop_at_layer - 1}")

            def stop(module, args, output):
                raise StopForward
            stop_handle = block.register_forward_hook(stop)
        try:
            with (torch.enable_grad() if grad else torch.no_grad()):
                return self._output(self.hf_model(**self._kwargs(batch)))
        except StopForward:
            return None
        finally:
            if stop_handle is not None:
                stop_handle.remove()
            remove()

    def _generate_ids(self, ids, mask, max_new_tokens, do_sample, temperature, top_k, gen, stop_at_eos):
        """Hugging Face ``generate`` (with its key-value cache); context hooks fire at every step."""
        if gen is not None:
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        eos = sorted(self._eos_ids())
        pad = getattr(self.tokenizer, "pad_token_id", None)
        kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=do_sample,
                                      pad_token_id=pad if pad is not None else (eos[0] if eos else 0))
        if do_sample:
            kwargs.update(temperature=temperature, top_k=top_k or 0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if stop_at_eos and eos:
            kwargs["eos_token_id"] = eos
        else:
            kwargs["eos_token_id"] = None
        self._mask = mask
        try:
            out = self.hf_model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        finally:
            self._mask = None
        new = out[:, ids.shape[1]:].clone()
        if stop_at_eos and eos:  # mark tokens after the first eos as absent (-1)
            is_eos = torch.isin(new, torch.tensor(eos, device=new.device))
            after = (is_eos.cumsum(1) - is_eos.long()) > 0
            new[after] = -1
        return new


def _remove(handles: list[Any]) -> None:
    for h in reversed(handles):
        with contextlib.suppress(Exception):
            if hasattr(h, "remove"):
                h.remove()
            else:
                h.__exit__(None, None, None)
    handles.clear()
