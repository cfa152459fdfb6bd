"""The ``torch`` backend: plain ``register_forward_hook`` / ``register_forward_pre_hook`` on HF modules.

The cheapest path: hooks are installed only for the names in use, and removed afterwards (also on an
exception). Hooks of open ``capture``/``intervene`` contexts are real torch hooks, so they also see
forward passes the user runs on ``model.hf_model`` directly and ``hf_model.generate``. Hooks the user
registered on the modules themselves are never touched.
"""
from __future__ import annotations

import os
import threading
from functools import partial
from typing import Any, Callable

import torch

from ..model import HookSet, StopForward, _open, _Opened
from ..run import current_pass

#: ``INTERP_DEBUG=1``: verify after every run that the model is clean (no hooks of the run left behind)
DEBUG = os.environ.get("INTERP_DEBUG", "") not in ("", "0")
#: held while this backend registers or removes module hooks. PyTorch's registration is not atomic: it numbers
#: handles from one global counter without a lock (two threads can get the same number, and removing one hook
#: then drops the other's ``with_kwargs`` flag) and stores the hook before its ``with_kwargs`` flag (a forward
#: running meanwhile calls it with the wrong arguments; seen in the threads stress test). So registrations
#: are serialised here, and those of contexts also wait for the model's running run (``Model._locked``).
_HOOKS_LOCK = threading.RLock()
from .hf import HFModel


class TorchModel(HFModel):
    backend = "torch"

    def _install(self, hooks: HookSet, run=None) -> Callable[[], None]:
        """Register ``hooks``; with ``run`` (a :class:`~interp.run.Run`), they act only in passes of that run
        (a run's own hooks must not fire in another thread's forward of the same module); with an open
        context (``interp.model._Opened``), only in forwards of the thread that opened it."""
        switch, slots = self._attention_install(hooks, run)
        handles: list[Any] = [switch, slots]  # recorded before they act: removal is safe at any point
        fns: list[Any] = []
        try:
            switch.enter()
            slots.enter()
            with _HOOKS_LOCK:
                for (path, io), entries in self._groups(hooks).items():
                    module = self._submodule(path)
                    if io == "output":
                        fns.append(partial(self._out_hook, entries, run))
                        handles.append(module.register_forward_hook(fns[-1], with_kwargs=True))
                    else:
                        fns.append(partial(self._in_hook, entries, run))
                        handles.append(module.register_forward_pre_hook(fns[-1], with_kwargs=True))
        except BaseException:
            try:
                _remove(handles)
            finally:
                with _HOOKS_LOCK:
                    self._sweep_hooks(fns)  # a hook registered just before the interruption, handle unrecorded
            raise
        return partial(_remove, handles)

    def _out_hook(self, entries, run, module, args, kwargs, output):
        if self._foreign(run):
            return None
        inp = args[0] if args else next(iter(kwargs.values()), None)
        new, changed = self._apply(entries, output, None, module, inp)
        return new if changed else None

    def _in_hook(self, entries, run, module, args, kwargs):
        if self._foreign(run):
            return None
        if args:
            new, changed = self._apply(entries, args[0], None, module, args[0])
            return ((new, *args[1:]), kwargs) if changed else None
        key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
        new, changed = self._apply(entries, kwargs[key], None, module, kwargs[key])
        return (args, {**kwargs, key: new}) if changed else None

    def _push(self, hooks: HookSet):
        # contexts become real torch hooks at once, so raw hf_model calls and HF generate in the thread that
        # opened them see them too (they act only where the context is visible: other threads never see it);
        # hooks of spliced SAEs are not module hooks: they stay with the model and run inside the splice
        real = {n: f for n, f in hooks.items() if n in self.sites}
        virtual = {n: f for n, f in hooks.items() if n not in self.sites}
        entry = _Opened(self, virtual)
        close = _open(entry)
        try:
            with self._locked():  # never while a run of this model is between its module hooks
                remove = self._install(real, entry)
        except BaseException:
            close()
            raise

        def both() -> None:
            try:
                close()
            finally:
                with self._locked():
                    remove()
        return both

    def _forward(self, batch, hooks, stop_at_layer, grad):
        run = current_pass(self).run
        remove = self._install(hooks, run)
        stop_handle = None
        if stop_at_layer is not None:
            block = self.hf_model.get_submodule(f"{self.spec.blocks}.{stop_at_layer - 1}")

            def stop(module, args, output):
                if not self._foreign(run):
                    raise StopForward
            stop_handle = block.register_forward_hook(stop)
        try:
            with (torch.enable_grad() if grad else torch.no_grad()):
                return self._output(self.hf_model(**self._kwargs(batch)), batch)
        except StopForward:
            return None
        finally:
            try:
                if stop_handle is not None:
                    stop_handle.remove()
            finally:
                remove()
                if DEBUG:
                    self._assert_clean(run)

    def _assert_clean(self, run) -> None:
        """Debug mode (``INTERP_DEBUG=1``): after a run, none of its hooks may be left on the module tree and
        no attention config may still be switched by it (only hooks of open contexts stay)."""
        left = [name for name, m in self.hf_model.named_modules()
                for fn in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
                if getattr(fn, "func", None) in (self._out_hook, self._in_hook) and len(fn.args) > 1 and fn.args[1] is run]
        if left:
            raise RuntimeError(f"interp debug check: hooks of a finished run are still on {left[:3]}")


def _remove(handles: list[Any]) -> None:
    """Remove every handle (hooks and the eager-attention switch), in reverse order of installation.

    All are attempted even if one fails; a failure is then raised (never swallowed), after the rest
    were removed."""
    errors: list[BaseException] = []
    with _HOOKS_LOCK:
        while handles:
            h = handles.pop()
            try:
                h.remove()
            except BaseException as exc:  # noqa: BLE001 - re-raised below once everything is removed
                errors.append(exc)
    if errors:
        raise errors[0]
