"""TransformerLens's utility spellings, for users who import them out of habit.

``get_act_name("resid_post", 3)`` -> ``"blocks.3.hook_resid_post"``, as ``transformer_lens.utils.get_act_name``
spells it (the compact forms ``"resid_post3"``, ``"attn2"``, ``"pre5"`` and the aliases ``attn`` -> pattern,
``key``/``query``/``value``, ``attn_logits``, ``mlp_pre``/``mlp_mid``/``mlp_post`` included); the result is a
canonical interp hook name on every backend.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

#: TransformerLens's aliases of activation names
_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
            "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
#: names that live inside the attention or the MLP component of a block
_COMPONENT = {**dict.fromkeys(("q", "k", "v", "z", "rot_q", "rot_k", "result", "pattern", "attn_scores"), "attn"),
              **dict.fromkeys(("pre", "mid", "post", "pre_linear"), "mlp")}
#: spellings of a component in ``layer_type``
_LAYER_TYPES = {"a": "attn", "attention": "attn", "m": "mlp", "b": "", "block": "", "blocks": ""}
_NORM = ("scale", "normalized")
_COMPACT = re.compile(r"([a-z]+)(\d+)([a-z]?.*)")


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """The full hook name of activation ``name`` at ``layer`` (TransformerLens's rules).

    ``name`` may already be full (``"blocks.0.hook_resid_pre"``: returned as is), compact (``"resid_pre0"``,
    ``"scale4ln1"``) or short with ``layer`` (and ``layer_type`` for norms: ``"ln1"``, ``"ln2"``; ``"a"``/``"m"``
    for attention/MLP). A norm name without a layer is the final norm's (``ln_final.hook_scale``).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"get_act_name expects a non-empty activation name, got {name!r}")
    if layer is None and layer_type is None and ("." in name or name.startswith("hook_")):
        return name
    compact = _COMPACT.match(name)
    if compact is not None:
        name, layer, layer_type = compact.group(1), int(compact.group(2)), compact.group(3) or None
    name = _ALIASES.get(name, name)
    if name in _COMPONENT:
        kind = _COMPONENT[name]
    elif layer_type is not None:
        kind = _LAYER_TYPES.get(layer_type, layer_type)
    else:
        kind = None
    prefix = f"blocks.{layer}." if layer is not None else ""
    full = f"{prefix}{kind + '.' if kind else ''}hook_{name}"
    return f"ln_final.{full}" if name in _NORM and layer is None else full


def test_prompt(prompt: str, answer: str | list[str], model, prepend_space_to_answer: bool = True,
                print_details: bool = True, prepend_bos: bool | None = None, top_k: int = 10) -> list[dict[str, Any]]:
    """TransformerLens's ``utils.test_prompt(prompt, answer, model, ...)`` (TL's argument order): how ``model``
    ranks each token of ``answer`` after ``prompt``, and its top ``top_k`` next tokens, printed like TL with
    ``print_details``; returns one dict per answer token (see :func:`interp.habits.test_prompt`)."""
    from .habits import test_prompt as _test_prompt

    return _test_prompt(model, prompt, answer, prepend_space_to_answer, top_k, print_details, prepend_bos)


def get_device() -> str:
    """TransformerLens's ``utils.get_device()``: ``"cuda"`` if available, else ``"mps"`` where Apple's MPS is
    available and ``TRANSFORMERLENS_ALLOW_MPS=1`` opts in (TL's rule: MPS has known correctness issues), else
    ``"cpu"``; a device name, as TL returns it."""
    import os

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available() and mps.is_built() and os.environ.get("TRANSFORMERLENS_ALLOW_MPS", "") == "1":
        return "mps"
    return "cpu"


def to_numpy(tensor: Any) -> np.ndarray:
    """TransformerLens's ``utils.to_numpy``: a tensor (detached, on the CPU), a list / tuple or a number as a NumPy
    array; an array as it is."""
    if isinstance(tensor, np.ndarray):
        return tensor
    if isinstance(tensor, (list, tuple)):
        return np.array(tensor)
    if isinstance(tensor, torch.Tensor):
        return tensor.detach().cpu().numpy()
    if isinstance(tensor, (int, float, bool, str)):
        return np.array(tensor)
    raise ValueError(f"to_numpy: cannot convert {type(tensor).__name__}")


test_prompt.__test__ = False  # not a pytest test (the name is TransformerLens's)

def lm_cross_entropy_loss(logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
                          per_token: bool = False) -> torch.Tensor:
    """TransformerLens's ``utils.lm_cross_entropy_loss``: each next token's cross-entropy under ``logits
    [batch, pos, vocab]`` given ``tokens [batch, pos]``; the mean over real tokens, or ``[batch, pos - 1]`` with
    ``per_token`` (zero where a token or the next one is padding, as TL's)."""
    from .habits import lm_loss

    loss = lm_loss(logits, tokens, attention_mask, per_token=per_token)
    if per_token and attention_mask is not None:
        m = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
        loss = loss.masked_fill(~m.to(loss.device), 0.0)
    return loss


def lm_accuracy(logits: torch.Tensor, tokens: torch.Tensor, per_token: bool = False) -> torch.Tensor:
    """TransformerLens's ``utils.lm_accuracy``: whether the top prediction at each position is the next token,
    ``[batch, pos - 1]`` booleans with ``per_token``, else their fraction."""
    correct = logits.argmax(dim=-1)[:, :-1] == tokens[:, 1:].to(logits.device)
    return correct if per_token else correct.sum() / correct.numel()


__all__ = ["get_act_name", "get_device", "lm_accuracy", "lm_cross_entropy_loss", "test_prompt", "to_numpy"]
