"""`interp.load` and `interp.wrap`: from a model spec or an in-memory model to a :class:`Model`."""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from .model import Model
from .registry import Registry

#: the built-in backends
BACKENDS = ("torch", "nnsight", "transformer_lens")


def _backend_class(module: str, cls: str):
    def load():
        import importlib
        return getattr(importlib.import_module(module, __package__), cls)
    load.__qualname__ = f"backend[{module}:{cls}]"
    return load


#: backend name -> zero-argument loader of its :class:`Model` subclass (entry-point group ``interp.backends``
#: for third-party backends: a loader, or the class itself, taking ``(hf_model, tokenizer)``)
BACKEND_REGISTRY: Registry = Registry("backend", "interp.backends", error=ValueError)
BACKEND_REGISTRY.register(_backend_class(".backends.torch_hooks", "TorchModel"), "torch")
BACKEND_REGISTRY.register(_backend_class(".backends.nnsight_backend", "NNsightModel"), "nnsight")
BACKEND_REGISTRY.register(_backend_class(".backends.transformer_lens", "TLModel"), "transformer_lens")


def _check_backend(backend: str) -> str:
    aliases = {"tl": "transformer_lens", "transformerlens": "transformer_lens", "hooks": "torch"}
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, one of {', '.join(BACKEND_REGISTRY.available())}; got {backend!r}")
    backend = aliases.get(backend.lower(), backend.lower())
    if backend not in BACKEND_REGISTRY:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKEND_REGISTRY.available())}")
    return backend


def wrap(model: Any, tokenizer=None, backend: str = "torch", check: bool = True) -> Model:
    """Wrap an in-memory model.

    ``model`` is a ``transformers`` model (any backend), a TransformerLens ``TransformerBridge`` or
    ``HookedTransformer`` (``transformer_lens`` backend), or an ``nnsight.NNsight`` wrapper of an HF model.
    For ``backend="transformer_lens"`` an HF model is booted into a TransformerBridge around the same
    module (no copy of the weights).

    ``check`` (default on) runs the load self-check (:mod:`interp.selfcheck`): one short forward that verifies
    the residual identities, that listed hooks fire, and that logits recomputed from the final residual stream
    equal the model's (on ``transformer_lens``, also that they equal the wrapped Hugging Face module's). A wrong
    site is withdrawn from ``hook_names()`` with a warning; a wrong backend raises
    :class:`~interp.selfcheck.SelfCheckError`. The outcome is ``model.self_check`` (``None`` with ``check=False``).
    """
    state: dict[str, Any] = {}
    wrapped = _wrap(model, tokenizer, backend, check, state)
    wrapped.self_check = None  # type: ignore[attr-defined]
    if check:
        from .selfcheck import self_check
        wrapped.self_check = self_check(wrapped, state.get("reference"), state.get("ids"))  # type: ignore[attr-defined]
    return wrapped


def _wrap(model: Any, tokenizer, backend: str, check: bool, state: dict[str, Any]) -> Model:
    from transformer_lens import HookedTransformer

    backend = _check_backend(backend)
    if model is None:
        raise TypeError("wrap() needs a model (a transformers model, a TransformerLens model or an nnsight "
                        "wrapper), got None")
    if isinstance(model, (str, Path)):
        raise TypeError(f"wrap() needs a model object, got the name {str(model)!r}; load a model by name or "
                        f"folder with interp.load({str(model)!r})")
    if isinstance(model, Model):
        raise TypeError("already an interp.Model")
    is_tl = isinstance(model, HookedTransformer) or type(model).__name__ == "TransformerBridge"
    if is_tl:
        if backend != "transformer_lens":
            inner = getattr(model, "original_model", None)
            if inner is None:
                raise ValueError(f"a HookedTransformer runs only on backend='transformer_lens', not {backend!r}")
            model = inner
        else:
            from .backends.transformer_lens import TLModel
            return TLModel(model, tokenizer)
    nn_wrapper = None
    if type(model).__module__.startswith("nnsight"):
        nn_wrapper, model = model, model._module
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"wrap() needs a model (a transformers model, a TransformerLens model or an nnsight "
                        f"wrapper), got a {type(model).__name__}")
    if getattr(model, "_interp_bridged", False):
        raise ValueError("this Hugging Face module was already wrapped with backend='transformer_lens', which "
                         "rewires it in place; load it again (or wrap copy.deepcopy(model) before bridging) to "
                         f"use it with backend={backend!r}")
    if backend == "nnsight":
        from .backends.nnsight_backend import NNsightModel
        return NNsightModel(model, tokenizer, nn_model=nn_wrapper)
    if backend != "transformer_lens":  # torch, or a plug-in backend: a Model class taking (hf_model, tokenizer)
        found = BACKEND_REGISTRY.get(backend)
        cls = found if isinstance(found, type) else found()
        return cls(model, tokenizer)
    from .backends.transformer_lens import TLModel
    hf_config = getattr(model, "config", None)
    if hf_config is None or not hasattr(hf_config, "model_type"):
        raise ValueError(f"backend='transformer_lens' bridges Hugging Face transformers models (with a .config); "
                         f"got a {type(model).__name__}: use backend='torch' with arch=..., or wrap a transformers model")
    if check:  # the oracle for the bridge: the HF module's own logits, before the bridge rewires it
        from .selfcheck import probe_ids, reference_logits
        state["ids"] = probe_ids(getattr(hf_config, "vocab_size", None))
        state["reference"] = reference_logits(model, state["ids"])
    bridge = _boot_bridge(model, tokenizer)
    try:
        return TLModel(bridge, tokenizer, use_own_tokenizer=tokenizer is not None)
    except Exception as exc:  # noqa: BLE001 - the bridge cannot run this family: say so in one line
        raise ValueError(f"TransformerLens cannot run the {hf_config.model_type!r} family ({type(model).__name__}): "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; use backend='torch' "
                         "or 'nnsight'") from exc


def _boot_bridge(hf_model, tokenizer):
    """Boot a TransformerBridge around an existing HF module (its config and tokenizer read from disk)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    if not getattr(hf_model.config, "architectures", None):
        # TransformerLens picks its adapter by config.architectures, None for a model built in memory: name the
        # model's own class, as save_pretrained would
        hf_model.config.architectures = [type(hf_model).__name__]
    src = getattr(hf_model.config, "_name_or_path", "") or ""
    tmp = None
    if not src or not (Path(src) / "config.json").exists():
        tmp = tempfile.TemporaryDirectory(prefix="interp-bridge-")
        hf_model.config.save_pretrained(tmp.name)
        src = tmp.name
    if tokenizer is not None and "name_or_path" not in getattr(tokenizer, "init_kwargs", {}):
        tmp = tmp or tempfile.TemporaryDirectory(prefix="interp-bridge-")
        tokenizer.save_pretrained(tmp.name)
        tokenizer = AutoTokenizer.from_pretrained(tmp.name)
    if tokenizer is None:
        # the bridge always wants a tokenizer object; a model without one gets a byte-level placeholder
        # inside the bridge only (interp's Model keeps tokenizer=None and refuses text inputs clearly)
        from .testing import tiny_tokenizer
        tmp = tmp or tempfile.TemporaryDirectory(prefix="interp-bridge-")
        tokenizer = tiny_tokenizer(Path(tmp.name) / "placeholder-tokenizer")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            device = next(hf_model.parameters()).device
            bridge = TransformerBridge.boot_transformers(src, hf_model=hf_model, tokenizer=tokenizer, device=device,
                                                         dtype=next(hf_model.parameters()).dtype)
        hf_model._interp_bridged = True
        return bridge
    except Exception as exc:  # noqa: BLE001
        first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        if "Could not determine supported architecture" in first:  # not the adapter list, 150 names long
            first = f"TransformerLens has no adapter for {type(hf_model).__name__}"
        raise ValueError(f"TransformerLens cannot bridge the {hf_model.config.model_type!r} family "
                         f"({type(hf_model).__name__}): {first}; use backend='torch' or 'nnsight'") from exc
    finally:
        if tmp is not None:
            tmp.cleanup()


def _check_source(spec: str) -> None:
    """Fail at once, with what was wrong, for a spec that is neither a local folder nor a hub name we can
    reach: a missing path, a zoo name without ``zoo:``, or a hub name while the hub is off or unreachable
    (instead of transformers' retries). A reachable hub is still tried for any other name."""
    import os

    from huggingface_hub import constants

    p = Path(spec).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise ValueError(f"cannot load model {spec!r}: the folder has no config.json (not a Hugging Face model folder)")
        return
    looks_local = spec.startswith((".", "/", "~")) or os.sep in spec.strip("/").split("/", 1)[-1] or spec.count("/") > 1
    from . import zoo
    names = zoo.available()
    if spec in names:
        raise ValueError(f"cannot load model {spec!r}: it is a zoo entry; write zoo:{spec}")
    if looks_local:
        raise ValueError(f"cannot load model {spec!r}: no such folder")
    import difflib
    close = difflib.get_close_matches(spec, names, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join('zoo:' + c for c in close)}?)" if close else ""
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"cannot load model {spec!r}: not a zoo entry (zoo:NAME) or local folder, and the hub "
                         f"is switched off (HF_HUB_OFFLINE=1){hint}")
    import socket
    from urllib.parse import urlparse

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=3).close()
    except OSError:
        raise ValueError(f"cannot load model {spec!r}: not a zoo entry (zoo:NAME) or local folder, and the hub "
                         f"({constants.ENDPOINT}) cannot be reached from here{hint}") from None


def load(spec: str | Path, backend: str = "torch", device: str | torch.device | None = None,
         dtype: torch.dtype | str | None = None, device_map: str | dict | None = None,
         attn_implementation: str | None = None, check: bool = True, prepend_bos: bool | None = None,
         **from_pretrained_kwargs) -> Model:
    """Load a model by spec and wrap it.

    ``spec`` is ``zoo:NAME`` (see :mod:`interp.zoo`), a local folder in Hugging Face format, or a hub
    name (needs network access). ``device``, ``dtype`` and ``device_map`` go to ``from_pretrained``,
    so ``device_map="auto"`` splits a large model across accelerators the standard way. ``check``: the load
    self-check (see :func:`wrap`). ``prepend_bos``: the model's BOS rule (``model.prepend_bos``; ``True`` is
    TransformerLens's default), so a TL notebook's loading line stays one line.
    """
    import transformers
    from transformers import AutoConfig

    backend = _check_backend(backend)
    spec = str(spec)
    if spec.startswith("zoo:"):
        from . import zoo
        source: str = str(zoo.path(spec[4:]))
    else:
        source = spec
        _check_source(spec)
    try:
        config = AutoConfig.from_pretrained(source)
    except OSError as exc:
        raise ValueError(f"cannot load model {spec!r}: not a zoo name (zoo:NAME), not a local Hugging Face "
                         f"folder, and not reachable on the hub ({exc.__class__.__name__})") from exc
    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        cls = transformers.AutoModelForCausalLM if config.model_type in transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else transformers.AutoModel
    kwargs: dict[str, Any] = dict(from_pretrained_kwargs)
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if device_map is not None:
        kwargs["device_map"] = device_map
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    hf_model = cls.from_pretrained(source, **kwargs).eval()
    if device is not None and device_map is None:
        hf_model = hf_model.to(device)
    tokenizer = None
    if config.model_type not in ("vit", "dinov2"):
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError, TypeError):
            tokenizer = None
    model = wrap(hf_model, tokenizer, backend, check=check)
    if prepend_bos is not None:
        model.prepend_bos = bool(prepend_bos)
    model.source = spec  # type: ignore[attr-defined]
    return model
