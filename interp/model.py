"""`Model`: one handle over a backend, with the same verbs everywhere.

Backends implement two things: the canonical hook names they offer and ``_forward(inputs, hooks,
stop_at_layer, grad)``, which runs one forward pass with ``hooks`` (canonical name -> list of
``fn(tensor, ctx)``) applied in order. Everything else — caching, capture and intervention contexts,
gradients, tokenization with correct padding, generation — is written once, here.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch

from .cache import Cache
from .interventions import HookContext, InterventionFn
from .names import HookNotFiredError, UnknownHookError, expand, parse, unknown_message
from .run import current_pass, pass_scope, run_scope
from .validation import TokenIdsError, check_device, check_token_ids

#: which models are currently inside one of their own hook functions (recursion guard)
_IN_HOOK: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("interp_in_hook", default=frozenset())


class _Opened:
    """One open ``capture`` / ``intervene`` / ``splice`` context of one model. It belongs to the thread (the
    :mod:`contextvars` context) that opened it: runs in other threads never see it."""

    __slots__ = ("model", "hooks", "splice_at", "splice", "open")

    def __init__(self, model: "Model", hooks: "HookSet | None" = None, splice_at: str | None = None,
                 splice: Any = None) -> None:
        self.model, self.hooks, self.splice_at, self.splice = model, hooks or {}, splice_at, splice
        self.open = True

    def visible(self) -> bool:
        """Whether this context applies here: open, and opened in the current thread / context."""
        return self.open and any(e is self for e in _OPEN.get())


#: the contexts open in this thread (a :class:`contextvars.ContextVar`, so each thread and each asyncio task
#: has its own), every model's, outermost first
_OPEN: contextvars.ContextVar[tuple[_Opened, ...]] = contextvars.ContextVar("interp_open_contexts", default=())
#: the backward hooks of ``model.hooks(bwd_hooks=...)`` blocks open in this thread / context
_BWD_OPEN: contextvars.ContextVar[tuple] = contextvars.ContextVar("interp_backward_hooks", default=())
#: guards the lazy creation of each model's run lock
_LOCK_GUARD = threading.Lock()


def _open(entry: _Opened) -> Callable[[], None]:
    """Open ``entry`` in the current context; returns its idempotent close (callable from anywhere: a close
    from another thread marks it closed, so it stops applying in the thread that opened it too)."""
    _OPEN.set(_OPEN.get() + (entry,))

    def close() -> None:
        entry.open = False
        current = _OPEN.get()
        if any(e is entry for e in current):
            _OPEN.set(tuple(e for e in current if e is not entry))
    return close

Inputs = Any  # str | list[str] | LongTensor [batch, pos] | dict(input_ids, attention_mask) | FloatTensor pixels
HookSet = dict[str, list[InterventionFn]]


class StopForward(Exception):
    """Raised inside a hook to end the forward pass early (``stop_at_layer``)."""


#: TransformerLens's switches that :meth:`Model.set_use_attn_result` & co. set (and ``model.cfg.<flag> = value``)
_TL_FLAGS = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in")
#: the settable TransformerLens field that is the model's BOS rule
_SETTABLE = (*_TL_FLAGS, "default_prepend_bos")


@dataclass(eq=True)
class ModelConfig:
    """Shape facts of the wrapped model, and TransformerLens's config fields derived from the model.

    The dataclass fields (``n_layers``, ``n_heads``, ``n_kv_heads``, ``d_model``, ``d_head``, ``d_vocab``, ...) are
    facts of the wrapped model: read-only. TransformerLens's own fields are read from the model itself (its
    weights, norms and Hugging Face config; see :meth:`tl_fields`): ``n_ctx``, ``d_mlp``, ``act_fn``,
    ``normalization_type``, ``n_key_value_heads``, ``default_prepend_bos``, ``positional_embedding_type``,
    ``eps``, ``dtype`` ... TransformerLens's switches can be set as in TL: ``model.cfg.default_prepend_bos =
    False`` sets ``model.prepend_bos``, ``model.cfg.use_attn_result = True`` is ``model.set_use_attn_result(True)``.
    """

    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_vocab: int | None
    is_causal_lm: bool
    modality: str  # "text" | "vision"
    #: input image side in pixels that a vision model's position embeddings were built for (None: text model)
    image_size: int | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or (name in self.__dataclass_fields__ and name not in self.__dict__):
            object.__setattr__(self, name, value)  # private state, and the fields while __init__ sets them
            return
        if name in _SETTABLE:
            model = self._owner()
            if name == "default_prepend_bos":
                if not isinstance(value, bool):
                    raise TypeError(f"cfg.default_prepend_bos must be True or False, got {value!r}")
                model.prepend_bos = value
            else:
                getattr(model, f"set_{name}")(value)
            return
        if name in self.__dataclass_fields__ or name in _DERIVED:
            raise AttributeError(f"model.cfg.{name} is a fact of the wrapped model and cannot be set (settable: "
                                 f"{', '.join(_SETTABLE)})")
        raise AttributeError(f"model.cfg has no field {name!r} to set (settable: {', '.join(_SETTABLE)})")

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))

    def _owner(self) -> "Model":
        model = self.__dict__.get("_model", lambda: None)()
        if model is None:
            raise AttributeError("this config belongs to no model (it was built by hand)")
        return model

    def _derive(self, key: str, compute: Callable[["Model"], Any]) -> Any:
        """``compute(model)``, computed once per config (the wrapped model's structure does not change)."""
        memo = self.__dict__.setdefault("_derived", {})
        if key not in memo:
            memo[key] = compute(self._owner())
        return memo[key]

    @property
    def device(self) -> torch.device:
        """The model's current device (TransformerLens's ``model.cfg.device``)."""
        model = getattr(self, "_model", lambda: None)()
        return model.device if model is not None else torch.device("cpu")

    # ---- TransformerLens's config fields, derived from the model (see _tl_field)
    @property
    def n_ctx(self) -> int | None:
        """The longest sequence the model was built for (HF ``max_position_embeddings`` / ``n_positions``, or the
        learned position table's rows)."""
        return self._derive("n_ctx", _n_ctx)

    @property
    def d_mlp(self) -> int | None:
        """The MLP's hidden width (``W_in``'s last axis)."""
        return self._derive("d_mlp", _d_mlp)

    @property
    def act_fn(self) -> str | None:
        """The MLP's activation, as the model's config names it (``"gelu_new"``, ``"silu"``, ...), as TL."""
        return self._derive("act_fn", lambda m: _hf_attr(m, "hidden_act", "activation_function", "hidden_activation"))

    @property
    def normalization_type(self) -> str | None:
        """``"LN"`` (LayerNorm) or ``"RMS"`` (RMSNorm): the blocks' norms, as TL names them (unfolded)."""
        return self._derive("normalization_type", lambda m: {"layer": "LN", "rms": "RMS"}.get(m.norm_parts("ln1", 0)[2]))

    @property
    def final_rms(self) -> bool:
        """Whether the final norm is an RMSNorm."""
        return self._derive("final_rms", lambda m: m.ln_final_parts()[2] == "rms")

    @property
    def eps(self) -> float:
        """The blocks' norm epsilon."""
        return self._derive("eps", lambda m: float(m._block_norm(0, "ln1")[3]))

    @property
    def n_key_value_heads(self) -> int | None:
        """Key/value heads under grouped-query attention; ``None`` when every query head has its own (as TL)."""
        return None if self.n_kv_heads == self.n_heads else self.n_kv_heads

    @property
    def d_vocab_out(self) -> int | None:
        """The unembedding's width (``d_vocab``)."""
        return self.d_vocab

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP is gated (has ``W_gate``: Llama, Gemma, ...)."""
        return self._derive("gated_mlp", _gated)

    @property
    def positional_embedding_type(self) -> str | None:
        """``"standard"`` (a learned position table), ``"rotary"``, or ``None`` (neither found), as TL."""
        return self._derive("positional_embedding_type", _position_kind)

    @property
    def rotary_base(self) -> float:
        """The rotary embedding's base (HF ``rope_theta``); TL's default ``10000.0`` where the model has none."""
        return self._derive("rotary_base", lambda m: _rope_theta(m) or 10000.0)

    @property
    def parallel_attn_mlp(self) -> bool:
        """Whether attention and MLP read the same residual (GPT-J / NeoX style)."""
        return self._derive("parallel_attn_mlp", lambda m: bool(_hf_attr(m, "use_parallel_residual", "parallel_attn")))

    @property
    def attn_only(self) -> bool:
        """Whether the blocks have no MLP."""
        return self._derive("attn_only", lambda m: _d_mlp(m) is None)

    @property
    def original_architecture(self) -> str | None:
        """The Hugging Face architecture (``"LlamaForCausalLM"``, ...)."""
        return self._derive("original_architecture", _architecture)

    @property
    def model_name(self) -> str | None:
        """The name or folder the model was loaded from."""
        return self._derive("model_name", lambda m: _hf_attr(m, "_name_or_path", "model_name"))

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's floating weights."""
        model = self._owner()
        return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

    @property
    def tokenizer_prepends_bos(self) -> bool:
        """Whether the tokenizer itself starts a text with the BOS token."""
        return self._derive("tokenizer_prepends_bos", _tokenizer_adds_bos)

    @property
    def default_prepend_bos(self) -> bool:
        """Whether text inputs start with BOS: ``model.prepend_bos`` when set, else the tokenizer's own rule.
        Settable, as in TL (sets ``model.prepend_bos``)."""
        model = self._owner()
        return bool(model.prepend_bos) if model.prepend_bos is not None else self.tokenizer_prepends_bos

    @property
    def use_attn_result(self) -> bool:
        """TL's switch for ``attn.hook_result`` (interp offers that hook whenever the backend can compute it)."""
        return self._owner()._tl_flag("use_attn_result")

    @property
    def use_split_qkv_input(self) -> bool:
        return self._owner()._tl_flag("use_split_qkv_input")

    @property
    def use_hook_mlp_in(self) -> bool:
        return self._owner()._tl_flag("use_hook_mlp_in")

    @property
    def use_attn_in(self) -> bool:
        return self._owner()._tl_flag("use_attn_in")

    def tl_fields(self) -> dict[str, Any]:
        """TransformerLens's config fields of this model, as a dict (the shape fields under TL's names too)."""
        out = {"n_layers": self.n_layers, "n_heads": self.n_heads, "d_model": self.d_model, "d_head": self.d_head,
               "d_vocab": self.d_vocab}
        out.update({k: getattr(self, k) for k in _DERIVED})
        return out


#: TransformerLens config fields that ModelConfig derives from the model
_DERIVED = ("n_ctx", "d_mlp", "act_fn", "normalization_type", "final_rms", "eps", "n_key_value_heads", "d_vocab_out",
            "gated_mlp", "positional_embedding_type", "rotary_base", "parallel_attn_mlp", "attn_only",
            "original_architecture", "model_name", "dtype", "tokenizer_prepends_bos", "default_prepend_bos",
            *_TL_FLAGS)


def _hf_config(model: "Model") -> Any:
    """The wrapped model's Hugging Face config (``None`` where there is none, e.g. a HookedTransformer)."""
    return getattr(getattr(model, "hf_model", None), "config", None)


def _hf_attr(model: "Model", *keys: str) -> Any:
    """The first of ``keys`` set on the model's HF config (its text config for multimodal models), else on the
    TransformerLens config the model wraps (a HookedTransformer has no HF config); ``None`` if none is."""
    for cfg in (_hf_config(model), getattr(_hf_config(model), "text_config", None),
                getattr(getattr(model, "tl", None), "cfg", None)):
        for k in keys:
            v = getattr(cfg, k, None) if cfg is not None else None
            if v is not None:
                return v
    return None


def _n_ctx(model: "Model") -> int | None:
    n = _hf_attr(model, "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")
    if n is None:
        n = model._max_positions()
    if n is None:
        with contextlib.suppress(KeyError):
            n = model.weight("W_pos").shape[0]
    return None if n is None else int(n)


def _d_mlp(model: "Model") -> int | None:
    try:
        return int(model.weight("W_in").shape[-1])
    except KeyError:
        n = _hf_attr(model, "intermediate_size", "n_inner", "d_mlp")
        return None if n is None else int(n)


def _gated(model: "Model") -> bool:
    try:
        model.weight("W_gate")
        return True
    except KeyError:
        return False


def _position_kind(model: "Model") -> str | None:
    try:
        model.weight("W_pos")
        return "standard"
    except KeyError:
        pass
    if _rope_theta(model) is not None or _hf_attr(model, "rotary_dim", "rotary_pct", "rope_scaling") is not None:
        return "rotary"
    return _hf_attr(model, "positional_embedding_type")


def _rope_theta(model: "Model") -> float | None:
    theta = _hf_attr(model, "rope_theta", "rotary_emb_base", "rotary_base")
    if theta is None:
        params = _hf_attr(model, "rope_parameters")
        theta = params.get("rope_theta") if isinstance(params, Mapping) else None
    return None if theta is None else float(theta)


def _architecture(model: "Model") -> str | None:
    arch = _hf_attr(model, "architectures")
    if isinstance(arch, (list, tuple)) and arch:
        return str(arch[0])
    return _hf_attr(model, "original_architecture")


def _tokenizer_adds_bos(model: "Model") -> bool:
    tok = model.tokenizer
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    if bos is None:
        return False
    ids = tok("a")["input_ids"]
    return bool(ids) and int(ids[0]) == int(bos)


@dataclass
class GradientResult:
    """Output of :meth:`Model.gradients`: the scalar, activations and d(scalar)/d(activation)."""

    value: torch.Tensor
    activations: Cache
    grads: Cache


class Model:
    """A wrapped model. Build with :func:`interp.wrap` or :func:`interp.load`.

    Attributes: ``backend`` (``"torch"``, ``"nnsight"``, ``"transformer_lens"``), ``cfg``
    (:class:`ModelConfig`), ``tokenizer`` (or ``None``), ``hf_model`` (the underlying
    ``transformers`` model where there is one).
    """

    backend: str = "base"

    def __init__(self, tokenizer=None, cfg: ModelConfig | None = None) -> None:
        self.tokenizer = tokenizer
        self.cfg = cfg
        object.__setattr__(cfg, "_model", weakref.ref(self))  # cfg.device follows the model (not a field)
        self._run_lock = threading.RLock()  # runs of one model are serialised (see _locked)

    def __getstate__(self) -> dict[str, Any]:
        # a lock cannot be copied or pickled: a copy of the model gets its own on its first run
        state = self.__dict__.copy()
        state.pop("_run_lock", None)
        return state

    # ------------------------------------------------------------------ per-thread contexts, serialised runs
    def _opened(self) -> list[_Opened]:
        """This model's contexts open in the current thread, outermost first."""
        return [e for e in _OPEN.get() if e.model is self and e.open]

    @property
    def _active(self) -> list[HookSet]:
        """Hooks of the ``capture``/``intervene`` contexts open in the current thread, outermost first (the
        hooks a backend merges into each run; the torch backend installs its contexts as module hooks)."""
        return [e.hooks for e in self._opened() if e.hooks]

    @property
    def _splices(self) -> dict[str, Any]:
        """Base hook name -> Splice of the ``splice`` contexts open in the current thread."""
        return {e.splice_at: e.splice for e in self._opened() if e.splice_at is not None}

    def _locked(self) -> "threading.RLock":
        """The model's run lock: one run at a time per model (a run in another thread waits for it), because
        a run switches state that the backends keep on the shared module (TransformerLens hook points and
        config flags, nnsight's tracer, the attention implementation). Re-entrant: a generation's passes
        are runs inside the generation's hold."""
        lock = self.__dict__.get("_run_lock")
        if lock is None:  # a plug-in backend that did not call Model.__init__
            with _LOCK_GUARD:
                lock = self.__dict__.setdefault("_run_lock", threading.RLock())
        return lock

    # ------------------------------------------------------------------ backend interface
    def _all_hook_names(self) -> list[str]:
        raise NotImplementedError

    def _forward(self, inputs: dict[str, torch.Tensor], hooks: HookSet, stop_at_layer: int | None,
                 grad: bool) -> Any:
        raise NotImplementedError

    def _push(self, hooks: HookSet) -> Callable[[], None]:
        """Activate ``hooks`` for every forward of the current thread until the returned callable is called."""
        return _open(_Opened(self, hooks))

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    # ------------------------------------------------------------------ weights (TransformerLens shapes)
    def weight(self, name: str) -> torch.Tensor:
        """A weight in TransformerLens shape by name (``"W_Q"``, ``"W_U"``, ...; see :mod:`interp.weights`),
        the same on every backend; a detached copy."""
        from .weights import WEIGHT_NAMES
        if name not in WEIGHT_NAMES:
            import difflib
            close = difflib.get_close_matches(name, WEIGHT_NAMES, n=3)
            raise KeyError(f"unknown weight {name!r}; closest: {', '.join(close) or ', '.join(WEIGHT_NAMES)}")
        if "." in name:  # a norm's gain or bias: ln1.w [layer, d_model], ln_final.b [d_model], ...
            which, part = name.split(".")
            layers = [None] if which == "ln_final" else range(self.cfg.n_layers)
            d = self.cfg.d_model
            rows = []
            for layer in layers:
                w, b, _ = self.norm_parts(which, layer)
                t = w if part == "w" else b
                rows.append(t.detach().float().clone() if t is not None
                            else (torch.ones(d) if part == "w" else torch.zeros(d)))
            return rows[0] if which == "ln_final" else torch.stack(rows)
        return self._weight(name)

    def _weight(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    # TransformerLens's attribute spellings (interp.habits): model.W_U, model.blocks[l].attn.W_Q, model.OV, ...
    W_E = property(lambda self: self.weight("W_E"), doc="Token embedding ``[d_vocab, d_model]``.")
    W_pos = property(lambda self: self.weight("W_pos"), doc="Learned position table ``[n_ctx, d_model]``.")
    W_U = property(lambda self: self.weight("W_U"), doc="Unembedding ``[d_model, d_vocab]``.")
    b_U = property(lambda self: self.weight("b_U"), doc="Unembedding bias ``[d_vocab]``.")
    W_Q = property(lambda self: self.weight("W_Q"), doc="``[layer, head, d_model, d_head]``.")
    W_K = property(lambda self: _habits().per_query_head(self, "W_K"),
                   doc="``[layer, head, d_model, d_head]`` (grouped key heads repeated per query head, as TL).")
    W_V = property(lambda self: _habits().per_query_head(self, "W_V"),
                   doc="``[layer, head, d_model, d_head]`` (grouped value heads repeated per query head, as TL).")
    W_O = property(lambda self: self.weight("W_O"), doc="``[layer, head, d_head, d_model]``.")
    b_Q = property(lambda self: self.weight("b_Q"))
    b_K = property(lambda self: _habits().per_query_head(self, "b_K"))
    b_V = property(lambda self: _habits().per_query_head(self, "b_V"))
    b_O = property(lambda self: self.weight("b_O"))
    W_in = property(lambda self: self.weight("W_in"), doc="``[layer, d_model, d_mlp]``.")
    W_gate = property(lambda self: self.weight("W_gate"), doc="``[layer, d_model, d_mlp]`` (gated MLPs).")
    W_out = property(lambda self: self.weight("W_out"), doc="``[layer, d_mlp, d_model]``.")
    b_in = property(lambda self: self.weight("b_in"))
    b_out = property(lambda self: self.weight("b_out"))

    @property
    def blocks(self):
        """``model.blocks[l].attn.W_Q`` / ``.mlp.W_in`` ...: the layer's weights in TransformerLens shapes."""
        return _habits().Blocks(self)

    @property
    def ln_final(self):
        """``model.ln_final.w`` / ``.b``: the final norm's gain and bias (zeros for RMSNorm)."""
        return _habits().Norm(self, "ln_final")

    @property
    def OV(self):
        """``W_V W_O`` per head as a TransformerLens ``FactoredMatrix`` ``[layer, head, d_model, d_model]``."""
        return _habits().factored(self, "OV")

    @property
    def QK(self):
        """``W_Q W_Kᵀ`` per head as a TransformerLens ``FactoredMatrix`` ``[layer, head, d_model, d_model]``."""
        return _habits().factored(self, "QK")

    def tokens_to_residual_directions(self, tokens) -> torch.Tensor:
        """``W_U[:, token]`` for each token (``[..., d_model]``), as TransformerLens."""
        return _habits().tokens_to_residual_directions(self, tokens)

    def test_prompt(self, prompt: str, answer, prepend_space_to_answer: bool = True, top_k: int = 10,
                    print_details: bool = True) -> list[dict[str, Any]]:
        """TransformerLens's ``test_prompt`` (see :func:`interp.habits.test_prompt`)."""
        return _habits().test_prompt(self, prompt, answer, prepend_space_to_answer, top_k, print_details)

    # ------------------------------------------------------------------ more TransformerLens spellings
    #: ``model._W_K`` / ``_W_V`` / ``_b_K`` / ``_b_V``: key/value weights with one entry per key/value head
    #: ``[layer, kv_head, ...]`` (the bridge's ``W_K``; HookedTransformer's ``_W_K``); ``model.W_K`` repeats
    #: them per query head (HookedTransformer's ``W_K``), so ``W_Q[l, h] @ W_K[l, h].T`` is head ``h``'s QK
    _W_K = property(lambda self: self.weight("W_K"), doc="``[layer, kv_head, d_model, d_head]`` (grouped).")
    _W_V = property(lambda self: self.weight("W_V"), doc="``[layer, kv_head, d_model, d_head]`` (grouped).")
    _b_K = property(lambda self: self.weight("b_K"))
    _b_V = property(lambda self: self.weight("b_V"))

    @property
    def unembed(self):
        """``model.unembed.W_U`` / ``.b_U`` (TransformerLens's unembedding module's weights); calling it,
        ``model.unembed(x)``, is ``x @ W_U + b_U`` as TL's module (``[..., d_model] -> [..., d_vocab]``), so the
        logit lens is ``model.unembed(model.ln_final(resid))``; ``apply_ln=True`` applies the final norm first."""
        return _habits().Weights(self, "unembed", {"W_U": "W_U", "b_U": "b_U"},
                                 call=lambda resid, apply_ln=False: self._unembed(resid, apply_ln))

    @property
    def embed(self):
        """``model.embed.W_E`` (TransformerLens's embedding module's weight); ``model.embed(tokens)`` is
        ``W_E[tokens]`` (``[batch, pos] -> [batch, pos, d_model]``), as TL's module."""
        return _habits().Weights(self, "embed", {"W_E": "W_E"},
                                 call=lambda tokens: self.weight("W_E")[torch.as_tensor(tokens, dtype=torch.long)])

    @property
    def pos_embed(self):
        """``model.pos_embed.W_pos`` (models with a learned position table)."""
        return _habits().Weights(self, "pos_embed", {"W_pos": "W_pos"})

    def tl_named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(TransformerLens name, weight in TL shape)`` pairs, as TL's ``tl_named_parameters``: ``embed.W_E``,
        ``pos_embed.W_pos`` (learned tables), ``blocks.{l}.ln1.w`` ..., ``blocks.{l}.attn.W_Q`` ...,
        ``blocks.{l}.mlp.W_in`` ..., ``ln_final.w``, ``unembed.W_U``, ``unembed.b_U``. Detached copies (read
        them; write weights with :meth:`add_to_weight`)."""
        return _habits().tl_named_parameters(self)

    def loss_fn(self, logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
                per_token: bool = False) -> torch.Tensor:
        """TransformerLens's ``loss_fn``: next-token cross-entropy of ``logits`` on ``tokens``, the mean over real
        tokens, or ``[batch, pos - 1]`` with ``per_token``."""
        check_token_ids(torch.as_tensor(tokens), what="tokens")
        return _habits().lm_loss(logits, torch.as_tensor(tokens), attention_mask, per_token)

    def to_single_str_token(self, int_token: int) -> str:
        """TransformerLens's ``to_single_str_token``: the string of one token id."""
        if isinstance(int_token, bool) or not isinstance(int_token, (int, torch.Tensor)) or (
                isinstance(int_token, torch.Tensor) and int_token.numel() != 1):
            raise TypeError(f"to_single_str_token takes one token id (an int), got {int_token!r}")
        return self.to_str_tokens(torch.tensor([int(int_token)]))[0]

    @property
    def all_head_labels(self) -> list[str]:
        """``["L0H0", "L0H1", ...]``, every attention head: TL's bridge property (``model.all_head_labels``) and
        HookedTransformer's method (``model.all_head_labels()``) both work."""
        return _habits().Labels(f"L{l}H{h}" for l in range(self.cfg.n_layers) for h in range(self.cfg.n_heads))

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
        """TransformerLens's ``accumulated_bias`` (see :func:`interp.habits.accumulated_bias`): ``[d_model]``."""
        return _habits().accumulated_bias(self, layer, mlp_input, include_mlp_biases)

    def get_token_position(self, single_token: str | int, input: str | torch.Tensor, mode: str = "first",
                           prepend_bos: bool | None = None, padding_side: str | None = None) -> int:
        """TransformerLens's ``get_token_position``: the position of ``single_token`` (a one-token string or an
        id) in ``input`` (a text, tokenized with the BOS rule, or ids ``[pos]`` / ``[1, pos]``); ``mode`` is
        ``"first"`` or ``"last"``."""
        return _habits().get_token_position(self, single_token, input, mode, prepend_bos, padding_side)

    def eval(self) -> "Model":
        """TransformerLens's ``model.eval()``: wrapped models are always in inference mode; returns the model."""
        for mod in (getattr(self, "hf_model", None), getattr(self, "tl", None)):
            if isinstance(mod, torch.nn.Module):
                mod.eval()
        return self

    def _tl_flag(self, name: str) -> bool:
        return bool(self.__dict__.get("_tl_flags", {}).get(name, False))

    def _set_tl_flag(self, name: str, value: Any) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"set_{name} takes True or False, got {value!r}")
        self.__dict__.setdefault("_tl_flags", {})[name] = value

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """TransformerLens's switch for ``blocks.{l}.attn.hook_result`` (each head's output in the residual
        stream, ``[batch, pos, head, d_model]``). interp offers that hook wherever the backend can compute it, with
        or without the switch (on the transformer_lens backend it is computed only for runs that use it), so
        this records the setting (``model.cfg.use_attn_result``) and checks the hook exists when switched on."""
        self._set_tl_flag("use_attn_result", use_attn_result)
        if use_attn_result and not any(n.endswith("attn.hook_result") for n in self._all_names()):
            self._set_tl_flag("use_attn_result", False)
            raise ValueError(f"attn.hook_result is not offered by this model on the {self.backend} backend")

    def _unsupported_switch(self, name: str, value: bool, hooks: str) -> None:
        self._set_tl_flag(name, value)
        if value:
            self._set_tl_flag(name, False)
            raise ValueError(f"set_{name}(True) adds TransformerLens's {hooks} hooks, which interp does not offer; "
                             "patch the attention input at blocks.{l}.ln1.hook_normalized (every head reads it) "
                             "or a head's q/k/v at attn.hook_q / hook_k / hook_v")

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """TransformerLens's switch for per-head query/key/value inputs (``hook_q_input`` ...): ``False`` is
        accepted; ``True`` is refused in one line (interp has no per-head attention-input hooks)."""
        self._unsupported_switch("use_split_qkv_input", use_split_qkv_input, "hook_q_input / hook_k_input / hook_v_input")

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """TransformerLens's switch for ``hook_mlp_in``: ``False`` accepted, ``True`` refused (use
        ``blocks.{l}.ln2.hook_normalized`` or ``hook_resid_mid``)."""
        self._unsupported_switch("use_hook_mlp_in", use_hook_mlp_in, "hook_mlp_in")

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """TransformerLens's switch for ``hook_attn_in``: ``False`` accepted, ``True`` refused."""
        self._unsupported_switch("use_attn_in", use_attn_in, "hook_attn_in")

    # ------------------------------------------------------------------ persistent hooks (TransformerLens)
    def add_hook(self, name: Any, hook: InterventionFn, dir: str = "fwd", is_permanent: bool = False,
                 prepend: bool = False) -> None:
        """TransformerLens's ``add_hook``: ``hook(tensor, hook_point)`` runs on every later run of this model
        (every thread), until :meth:`reset_hooks` (``is_permanent=True`` survives ``reset_hooks()`` too).
        ``name`` is a hook name, a glob or a callable filter.

        ``dir="bwd"`` adds a backward hook, as TransformerLens's: ``hook(grad, hook_point)`` receives the
        gradient of the activation at that hook (same shape) when ``.backward()`` (or ``torch.autograd.grad``)
        runs through a forward made while the hook was added; a returned tensor replaces that gradient. Forwards
        made while a backward hook is added keep their autograd graph (unless grad mode is off, as in TL).
        ``prepend=True`` runs ``hook`` before those already added at the same name."""
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        if not callable(hook):
            raise TypeError(f"hook for {name!r} is not callable: {hook!r}")
        names = self._resolve(name) if dir == "fwd" else self._backward_sites(name)
        store = self.__dict__.setdefault("_persistent", {True: defaultdict(list), False: defaultdict(list)})
        for n in names:
            fn = hook if dir == "fwd" else _BackwardHook(n, hook)
            if prepend:
                store[bool(is_permanent)][n].insert(0, fn)
            else:
                store[bool(is_permanent)][n].append(fn)

    def _remove_hooks(self, name: str, dir: str = "fwd", including_permanent: bool = False) -> None:
        """Remove the hooks :meth:`add_hook` added at ``name`` (``dir`` ``"fwd"``, ``"bwd"`` or ``"both"``): TL's
        ``hook_dict[name].remove_hooks``."""
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        store = self.__dict__.get("_persistent")
        if not store:
            return
        for permanent in ((False, True) if including_permanent else (False,)):
            fns = store[permanent].get(name, [])
            gone = [f for f in fns if (dir == "both" or (dir == "bwd") == isinstance(f, _BackwardHook))]
            for f in gone:
                if isinstance(f, _BackwardHook):
                    f.live = False
            store[permanent][name] = [f for f in fns if f not in gone]

    @property
    def hook_dict(self) -> dict[str, Any]:
        """TransformerLens's ``model.hook_dict``: ``{hook name: hook point}`` for every hook this model offers, in
        execution order; each point has ``.name``, ``.add_hook``, ``.remove_hooks``, ``.layer()``, ``.ctx``
        (:class:`interp.habits.HookPoint`). The same point object is returned for a name each time."""
        points = self.__dict__.setdefault("_hook_points", {})
        HookPoint = _habits().HookPoint
        return {n: points.setdefault(n, HookPoint(self, n)) for n in self.hook_names()}

    def _backward_sites(self, pattern: Any) -> list[str]:
        """The sites a backward hook on ``pattern`` can fire at. A read-only site (``model.can_write(name)`` is
        False: a site a backend derives beside the forward path) is computed off the graph, so no gradient
        ever reaches it: named alone it is refused in one line (as :meth:`gradients` refuses it); matched by a
        glob or a filter it is left out, with a warning naming the sites left out."""
        names = self._resolve(pattern)
        skipped = [n for n in names if not self.can_write(n)]
        if not skipped:
            return names
        if len(names) == 1:
            raise ValueError(f"a backward hook at {names[0]!r} would never fire on the {self.backend} backend: that "
                             "site is derived beside the forward path (read-only here); hook the norm's input or "
                             "hook_normalized, or use backend='transformer_lens'")
        import warnings
        warnings.warn(f"backward hooks left out at {len(skipped)} read-only site(s) that no gradient reaches on the "
                      f"{self.backend} backend: {skipped[:4]}{' ...' if len(skipped) > 4 else ''}", stacklevel=3)
        return [n for n in names if n not in skipped]

    def reset_hooks(self, including_permanent: bool = False, clear_contexts: bool = True) -> None:
        """Remove the hooks :meth:`add_hook` added, forward and backward (the permanent ones too with
        ``including_permanent``). A removed backward hook no longer fires, also on graphs made before.
        ``clear_contexts`` empties every ``hook.ctx``, as TransformerLens's."""
        if clear_contexts:
            self.__dict__.pop("_hook_ctx", None)
        store = self.__dict__.get("_persistent")
        if store:
            for permanent in ((False, True) if including_permanent else (False,)):
                for fns in store[permanent].values():
                    for fn in fns:
                        if isinstance(fn, _BackwardHook):
                            fn.live = False
                store[permanent].clear()

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[Any, InterventionFn]] = (), bwd_hooks: Sequence = (),
              reset_hooks_end: bool = True) -> Iterator["Model"]:
        """TransformerLens's ``with model.hooks(fwd_hooks=[(name, fn)], bwd_hooks=[(name, fn)]):`` — the hooks
        apply to every run in the block (this thread) and are removed on exit, also when it raises (backward
        hooks then stop firing; run the backward pass inside the block). ``reset_hooks_end=False`` keeps them
        after the block, as TL's: they are added as :meth:`add_hook`'s (every run, every thread) until
        :meth:`reset_hooks`."""
        if not reset_hooks_end:
            for pattern, fns in fwd_hooks:
                for fn in (fns if isinstance(fns, (list, tuple)) else [fns]):
                    self.add_hook(pattern, fn)
            for pattern, fns in bwd_hooks:
                for fn in (fns if isinstance(fns, (list, tuple)) else [fns]):
                    self.add_hook(pattern, fn, dir="bwd")
            yield self
            return
        back = self._hookset([(p, fn) for p0, fn in bwd_hooks for p in [self._backward_sites(p0)]], "backward hook")
        hookset: HookSet = defaultdict(list, {k: list(v) for k, v in self._hookset(fwd_hooks, "hook").items()})
        made = []
        for n, fns in back.items():
            for fn in fns:
                made.append(_BackwardHook(n, fn, self))
                hookset[n].append(made[-1])
        token = _BWD_OPEN.set(_BWD_OPEN.get() + tuple(made))
        try:
            with self.intervene(dict(hookset)):
                yield self
        finally:
            for b in made:
                b.live = False
            _BWD_OPEN.reset(token)

    def _hookset(self, pairs: Iterable[tuple[Any, Any]], what: str = "hook") -> HookSet:
        """``{hook name: [fn, ...]}`` from ``(name, glob or filter; fn or list of fns)`` pairs, checked."""
        hooks: HookSet = defaultdict(list)
        for pattern, fns in pairs:
            fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
            for fn in fns:
                if not callable(fn):
                    raise TypeError(f"{what} for {pattern!r} is not callable: {fn!r}")
            for name in self._resolve(pattern):
                hooks[name].extend(fns)
        return dict(hooks)

    def _persistent_hooks(self) -> HookSet:
        store = self.__dict__.get("_persistent")
        if not store:
            return {}
        out: HookSet = defaultdict(list)
        for permanent in (True, False):
            for k, v in store[permanent].items():
                out[k].extend(v)
        return out

    def add_to_weight(self, name: str, layer: int, delta: torch.Tensor) -> None:
        """Add ``delta`` (TransformerLens shape of ``weight(name)[layer]``) to that weight IN PLACE: the one
        way analyzers write weights (``W_in``, ``W_gate``, ``W_out``, ``W_O`` and their biases). Revert by
        adding ``-delta``; a float64 ``delta`` is added at float64 and rounded once, so adding
        ``saved.double() - now.double()`` restores a saved weight up to float64 round-off. HF backends (torch, nnsight)."""
        raise ValueError(f"editing weights is supported on the torch and nnsight backends, not {self.backend!r}: "
                         "wrap the Hugging Face model with one of those, edit, then wrap it again")

    def write_weight_rows(self, name: str, layer: int, rows: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``values`` into rows ``rows`` of ``weight(name)[layer]`` (TransformerLens shape; rows index its
        first axis: ``W_out [d_mlp, d_model]`` -> neurons, ``W_in``/``W_gate [d_model, d_mlp]`` -> residual
        dimensions, ``W_O`` -> its flattened ``[n_heads * d_head]`` axis, biases -> entries) IN PLACE, in one
        tensor operation, so an interruption (Ctrl-C) leaves all rows written or none. ``values`` has shape
        ``[len(rows), *rest]`` and the weight's own dtype (nothing is rounded here: this is how an edit puts
        back exactly the weights it saved). HF backends (torch, nnsight)."""
        raise ValueError(f"editing weights is supported on the torch and nnsight backends, not {self.backend!r}: "
                         "wrap the Hugging Face model with one of those, edit, then wrap it again")

    def project_out_of_residual_writers(self, direction: torch.Tensor) -> list[str]:
        """Edit the weights IN PLACE so that nothing writes ``direction`` (``[d_model]``) into the residual
        stream: token and learned position embeddings, attention output and MLP output projections
        (biases included) are projected off it. Equal to ablating the direction from every residual
        write at the activation level. Returns the edited module paths. HF backends (torch, nnsight)."""
        raise ValueError(f"editing weights is supported on the torch and nnsight backends, not {self.backend!r}: "
                         "wrap the Hugging Face model with one of those, edit, then wrap it again")

    def can_write(self, name: str) -> bool:
        """Whether interventions may modify hook ``name`` on this backend (all names can be captured)."""
        self._resolve(name)
        return True

    def _final_norm(self) -> tuple[torch.Tensor | None, torch.Tensor | None, str, float]:
        """``(weight, bias, kind, eps)`` of the final norm (backends implement this)."""
        raise NotImplementedError

    def _block_norm(self, layer: int, which: str) -> tuple[torch.Tensor | None, torch.Tensor | None, str, float]:
        """``(weight, bias, kind, eps)`` of block ``layer``'s norm ``which`` (``"ln1"``/``"ln2"``; backends)."""
        raise NotImplementedError

    def norm_parts(self, which: str = "ln_final", layer: int | None = None
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None, str]:
        """``(weight, bias, kind)`` of a norm: ``"ln_final"``, or block ``layer``'s ``"ln1"`` (before attention)
        / ``"ln2"`` (before the MLP); ``kind`` ``"layer"`` or ``"rms"``; ``weight`` includes an ``(1 + w)``
        offset where the architecture has one; ``None`` where absent. Negative layers count from the end."""
        if which == "ln_final":
            return self.ln_final_parts()
        if which not in ("ln1", "ln2"):
            raise ValueError(f"unknown norm {which!r}; choose 'ln1', 'ln2' or 'ln_final'")
        n = self.cfg.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
            raise IndexError(f"{which}: layer {layer!r} out of range: the model has {n} layers")
        return self._block_norm(layer % n, which)[:3]

    def ln_final_parts(self) -> tuple[torch.Tensor | None, torch.Tensor | None, str]:
        """``(weight, bias, kind)`` of the final norm (``kind`` ``"layer"`` or ``"rms"``); ``weight`` already
        includes an ``(1 + w)`` offset where the architecture has one. ``None`` where absent."""
        return self._final_norm()[:3]

    def _unembed(self, resid: torch.Tensor, apply_ln: bool = True) -> torch.Tensor:
        """Logits from a residual stream ``[..., d_model]``: the final norm (if ``apply_ln``), then
        ``@ W_U + b_U``."""
        x = self.apply_ln_final(resid) if apply_ln else resid
        return x @ self.weight("W_U").to(x.dtype) + self.weight("b_U").to(x.dtype)

    def apply_ln_final(self, resid: torch.Tensor) -> torch.Tensor:
        """The final norm applied to ``resid [..., d_model]`` with its own scale (weight and bias included)."""
        w, b, kind = self.ln_final_parts()
        x = resid.float()
        if kind == "layer":
            x = x - x.mean(-1, keepdim=True)
        x = x / (x.pow(2).mean(-1, keepdim=True) + self._final_norm()[3]).sqrt()
        if w is not None:
            x = x * w.float()
        if b is not None:
            x = x + b.float()
        return x.to(resid.dtype)

    # ------------------------------------------------------------------ tokens (TransformerLens habits)
    #: BOS rule of every text input (:meth:`tokenize`, so also ``model("text")``, ``run_with_cache``,
    #: ``generate`` and :meth:`to_tokens`): ``None`` (default, on every backend) lets the tokenizer's own
    #: special-token rule decide, as Hugging Face does (SmolLM2's adds none); ``True`` prepends the BOS token
    #: to rows that do not start with it (TransformerLens's default: set ``model.prepend_bos = True`` to get
    #: TransformerLens's tokens everywhere); ``False`` strips a leading BOS the tokenizer added. Settable.
    prepend_bos: bool | None = None

    def to_tokens(self, texts: str | Sequence[str], prepend_bos: bool | None = None,
                  padding_side: str | None = None) -> torch.Tensor:
        """Token ids ``[batch, pos]`` (padded right by default), with the BOS rule ``prepend_bos`` (default: the
        model's :attr:`prepend_bos`; see there)."""
        return self.tokenize(texts, padding_side=padding_side or "right",
                             prepend_bos=self.prepend_bos if prepend_bos is None else prepend_bos)["input_ids"]

    def _bos_rule(self, rows: list[torch.Tensor], want: bool) -> list[torch.Tensor]:
        """Rows (unpadded ids) with a BOS prepended (``want``) or a leading BOS stripped (``not want``)."""
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if bos is None:
            if want:
                raise ValueError("this tokenizer has no BOS token to prepend (prepend_bos=True)")
            return rows
        head = torch.tensor([bos], dtype=torch.long)
        if want:
            return [r if len(r) and int(r[0]) == bos else torch.cat([head, r]) for r in rows]
        return [r[1:] if len(r) and int(r[0]) == bos else r for r in rows]

    def pad_token_ids(self, seqs: Sequence[Sequence[int] | torch.Tensor]) -> dict[str, torch.Tensor]:
        """Right-pad token-id sequences into a batch: ``{"input_ids": [batch, pos], "attention_mask": [batch,
        pos]}`` (mask 1 on real tokens), padded with the tokenizer's pad id (0 when it has none). Results on
        real tokens do not depend on the pad id, since position ids come from the attention mask."""
        if len(seqs) == 0:
            raise ValueError("pad_token_ids: no sequences")
        for seq in seqs:
            check_token_ids(torch.as_tensor(seq) if isinstance(seq, (list, tuple)) and seq else seq)
        rows = [torch.as_tensor(s, dtype=torch.long).flatten() for s in seqs]
        pad = getattr(self.tokenizer, "pad_token_id", None)
        ids = torch.full((len(rows), max(len(r) for r in rows)), 0 if pad is None else int(pad), dtype=torch.long)
        mask = torch.zeros(ids.shape, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
            mask[i, :len(r)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def to_single_token(self, text: str) -> int:
        """The id of ``text`` if it is exactly one token (else a ValueError naming its tokens)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens ({[self.tokenizer.decode([i]) for i in ids]}), not one")
        return int(ids[0])

    def to_str_tokens(self, text: str | torch.Tensor, prepend_bos: bool | None = None) -> list[str]:
        """The tokens of one text (or a 1-D id tensor) as strings."""
        ids = self.to_tokens(text, prepend_bos)[0] if isinstance(text, str) else torch.as_tensor(text).flatten()
        return [self.tokenizer.decode([int(i)]) for i in ids]

    def to_string(self, tokens: torch.Tensor | Sequence[int]) -> str | list[str]:
        """Decode one id (a 0-d tensor or int) or ``[pos]`` ids to a string, ``[batch, pos]`` ids to a list of strings."""
        t = torch.as_tensor(tokens)
        if t.dim() == 0:
            return self.tokenizer.decode([int(t)])
        if t.dim() == 1:
            return self.tokenizer.decode(t.tolist())
        return [self.tokenizer.decode(row.tolist()) for row in t]

    def run_with_hooks(self, inputs: Inputs, fwd_hooks: Sequence[tuple[Any, InterventionFn]] = (),
                       bwd_hooks: Sequence[tuple[Any, InterventionFn]] = (), reset_hooks_end: bool = True,
                       clear_contexts: bool = False, attention_mask: torch.Tensor | None = None,
                       stop_at_layer: int | None = None, return_type: str | None = "logits",
                       prepend_bos: bool | None = None, padding_side: str | None = None):
        """TransformerLens's ``run_with_hooks`` (TL's argument order): ``fwd_hooks`` is a list of
        ``(name_or_filter, fn)`` where ``fn(tensor, hook)`` may return a replacement (``hook.name`` is the hook's
        name and ``hook.layer()`` its layer, as in TL). With ``reset_hooks_end=True`` (the default) the hooks
        apply to this run only; with ``reset_hooks_end=False`` they stay added after it, forward and backward
        hooks alike, as :meth:`add_hook`'s, until :meth:`reset_hooks` (TL's). Backward hooks with
        ``reset_hooks_end=True`` are removed when the run returns, before any backward pass could fire them (TL
        warns so too). ``return_type`` as in :meth:`__call__`; ``prepend_bos`` / ``padding_side`` rule text
        inputs for this call."""
        hooks: HookSet = defaultdict(list, {k: list(v) for k, v in self._hookset(fwd_hooks).items()})
        if not reset_hooks_end:
            for name, fns in hooks.items():
                for fn in fns:
                    self.add_hook(name, fn)
            hooks = defaultdict(list)  # added: every run applies them, this one too
        if bwd_hooks:
            if reset_hooks_end:
                import warnings
                warnings.warn("backward hooks are removed at the end of run_with_hooks (reset_hooks_end=True), "
                              "before a backward pass can fire them; pass reset_hooks_end=False or use "
                              "model.add_hook(name, fn, dir='bwd')", stacklevel=2)
            else:
                for name, fn in bwd_hooks:
                    self.add_hook(name, fn, dir="bwd")
        inputs = self._text_inputs(inputs, attention_mask, prepend_bos, padding_side)
        if stop_at_layer is not None:
            return self._stopped(inputs, dict(hooks), stop_at_layer, attention_mask)
        return self._shaped(inputs, dict(hooks), attention_mask, return_type)

    def _text_inputs(self, inputs: Inputs, attention_mask, prepend_bos: bool | None, padding_side: str | None) -> Inputs:
        """Texts tokenized with a per-call BOS rule / padding side (TransformerLens's ``prepend_bos=`` and
        ``padding_side=`` arguments); other inputs as they are."""
        if prepend_bos is None and padding_side is None:
            return inputs
        if prepend_bos is not None and not isinstance(prepend_bos, bool):
            raise TypeError(f"prepend_bos must be True, False or None, got {prepend_bos!r}")
        texts = isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs
                                            and all(isinstance(t, str) for t in inputs))
        if not texts:
            return inputs
        self.prepare(inputs)  # the usual checks of texts (empty strings ...)
        return self.tokenize(inputs, padding_side=padding_side,
                             prepend_bos=self.prepend_bos if prepend_bos is None else prepend_bos)

    def _stopped(self, inputs, hooks: HookSet, stop_at_layer: int, attention_mask=None) -> torch.Tensor:
        """Run blocks ``0..stop_at_layer-1`` and return the residual stream there ``[batch, pos, d_model]``
        (``blocks.{stop_at_layer-1}.hook_resid_post``), as TransformerLens does."""
        keep: list[torch.Tensor] = []
        name = f"blocks.{stop_at_layer - 1}.hook_resid_post" if isinstance(stop_at_layer, int) else ""
        hooks = {k: list(v) for k, v in hooks.items()}
        hooks.setdefault(name, []).append(lambda t, ctx: keep.append(t))
        self._run(inputs, hooks, stop_at_layer=stop_at_layer, attention_mask=attention_mask)
        return keep[-1]

    # ------------------------------------------------------------------ names
    def _withdraw(self, reasons: dict[str, str]) -> None:
        """Withdraw hook names from :meth:`hook_names` (the load self-check, :mod:`interp.selfcheck`), keeping
        the reason for the error a request for them gets."""
        self.__dict__.setdefault("_withdrawn", {}).update(reasons)

    def _unavailable_reason(self, name: str) -> str | None:
        """Why a canonical ``name`` is not offered by this model on this backend (``None``: not known)."""
        from .names import BLOCK_HOOKS
        from .support import offered_by
        why = self.__dict__.get("_withdrawn", {}).get(name)
        if why is not None:
            why = f"withdrawn by the load self-check ({why})"
        else:
            layer, hook = parse(name)
            canonical = hook in BLOCK_HOOKS if layer is not None else hook in (
                "hook_embed", "hook_pos_embed", "ln_final.hook_scale", "ln_final.hook_normalized")
            if not canonical or (layer is not None and not 0 <= layer < self.cfg.n_layers):
                return None
            why = self._why_not_offered(hook)
        return (f"{name!r} is not available for the {self.cfg.family} family on the {self.backend} backend: "
                f"{why}{offered_by(self.cfg.family, name, self.backend)}")

    def _why_not_offered(self, hook: str) -> str:
        """Why this backend has no site for a canonical ``hook`` on this model (backends say more)."""
        return "this backend's map of the family has no such site"

    def _all_names(self) -> list[str]:
        """Every hook name: the backend's, with the hooks of spliced SAEs after their base hook."""
        names = self._all_hook_names()
        withdrawn = self.__dict__.get("_withdrawn")
        if withdrawn:
            names = [n for n in names if n not in withdrawn]
        if not self._splices:
            return names
        out: list[str] = []
        for n in names:
            out.append(n)
            if n in self._splices:
                out.extend(self._splices[n].names)
        return out

    @contextlib.contextmanager
    def splice(self, sae: Any, at: str, use_error_term: bool = False) -> Iterator["Model"]:
        """``with model.splice(sae, at="blocks.5.hook_resid_post"):`` runs the SAE (an sae-lens ``SAE`` or
        any module with ``encode``/``decode``) at ``at`` and offers its tensors as hook names
        (``blocks.5.hook_resid_post.hook_sae_acts_post`` ...); see :mod:`interp.splice`."""
        from .splice import Splice
        names = self._resolve(at)
        if not isinstance(at, str) or names != [at]:
            raise ValueError(f"splice at one hook name, got {at!r} (matches {names[:3]})")
        if at in self._splices:
            raise ValueError(f"an SAE is already spliced at {at!r}; close that splice first")
        close = _open(_Opened(self, splice_at=at, splice=Splice(self, sae, at, use_error_term)))
        try:
            yield self
        finally:
            close()

    def hook_names(self, pattern: str | Sequence[str] | None = None) -> list[str]:
        """Canonical hook names this model offers, optionally filtered by a glob or a list of names/globs.

        With a list, the result is in the caller's order (see :func:`interp.names.expand`); with ``None``
        or one glob, in the model's execution order. Unknown names are dropped here (use them in
        ``run_with_cache`` to get an error naming the closest valid ones)."""
        return expand(pattern, self._all_names(), strict=False)

    def _resolve(self, names) -> list[str]:
        try:
            return expand(names, self._all_names())
        except UnknownHookError:
            for n in ([names] if isinstance(names, str) else names if isinstance(names, (list, tuple)) else []):
                why = self._unavailable_reason(n) if isinstance(n, str) else None
                if why:
                    raise UnknownHookError(why) from None
            raise

    # ------------------------------------------------------------------ inputs
    def tokenize(self, texts: str | Sequence[str], padding_side: str | None = None,
                 add_special_tokens: bool = True, max_length: int | None = None,
                 prepend_bos: Any = "model") -> dict[str, torch.Tensor]:
        """Tokenize with padding: ``{"input_ids": [batch, pos], "attention_mask": [batch, pos]}``.

        ``padding_side`` defaults to the tokenizer's. Either side gives the same results on real
        tokens, because position ids are computed from the attention mask. The tokenizer is only read,
        never written (its padding side and pad token stay as they are, also while other threads use it):
        rows are padded here, with the pad token (else the end-of-sequence, else the unknown token, else 0).
        ``prepend_bos``: the BOS rule (default ``"model"``: :attr:`prepend_bos`); applied with
        ``add_special_tokens`` only.
        """
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids, or wrap(model, tokenizer=...)")
        if padding_side is not None and padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        tok = self.tokenizer
        side = padding_side or getattr(tok, "padding_side", "right")
        if isinstance(texts, str):
            texts = [texts]
        enc = tok(list(texts), padding=False, add_special_tokens=add_special_tokens,
                  truncation=max_length is not None, max_length=max_length)
        rows = [torch.as_tensor(r, dtype=torch.long) for r in enc["input_ids"]]
        want = self.prepend_bos if isinstance(prepend_bos, str) and prepend_bos == "model" else prepend_bos
        if add_special_tokens and want is not None:
            rows = self._bos_rule(rows, bool(want))
        pad = next((int(p) for p in (getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None),
                                     getattr(tok, "unk_token_id", None)) if isinstance(p, int)), 0)
        n = max((len(r) for r in rows), default=0)
        ids = torch.full((len(rows), n), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):  # one slice assignment per row (tokenization itself loops over rows too)
            at = slice(n - len(r), n) if side == "left" else slice(0, len(r))
            ids[i, at] = r
            mask[i, at] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def prepare(self, inputs: Inputs, attention_mask: torch.Tensor | None = None,
                padding_side: str | None = None) -> dict[str, torch.Tensor]:
        """Turn user inputs into forward kwargs on the model's device (adds ``position_ids`` for text).

        Refuses, with one line saying what was wrong and what is allowed: empty strings or lists, token
        ids outside the vocabulary, sequences longer than the model's maximum positions, and an
        attention mask whose shape is not the ids' ``[batch, pos]`` or that has a row with no real token.
        """
        if isinstance(inputs, (list, tuple)) and len(inputs) == 0:
            raise ValueError("inputs is an empty list; pass at least one prompt")
        if isinstance(inputs, str) and not inputs:
            raise ValueError("inputs is an empty string; pass some text (or token ids)")
        if isinstance(inputs, (list, tuple)) and all(isinstance(t, str) for t in inputs) and any(not t for t in inputs):
            raise ValueError(f"prompt {[i for i, t in enumerate(inputs) if not t][0]} is an empty string")
        if isinstance(inputs, (str, list, tuple)) and (isinstance(inputs, str) or all(isinstance(t, str) for t in inputs)):
            batch = self.tokenize(inputs, padding_side=padding_side)
        elif isinstance(inputs, Mapping):
            batch = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "pixel_values")}
            if not batch:
                raise ValueError(f"input dict needs 'input_ids' or 'pixel_values', got keys {sorted(inputs)}")
        elif isinstance(inputs, torch.Tensor):
            if inputs.is_floating_point() and inputs.dim() == 4:
                batch = {"pixel_values": inputs}
            elif inputs.is_floating_point() or inputs.is_complex() or inputs.dtype == torch.bool:
                check_token_ids(inputs)
            else:
                ids = inputs[None] if inputs.dim() == 1 else inputs
                if ids.dim() != 2:
                    raise ValueError(f"token ids must be [batch, pos] or [pos], got {tuple(inputs.shape)}")
                batch = {"input_ids": ids}
        else:
            raise TypeError(f"unsupported inputs of type {type(inputs).__name__}: pass a string, a list of "
                            "strings, token ids [batch, pos], a dict with input_ids/attention_mask, or images")
        if attention_mask is not None:
            batch["attention_mask"] = attention_mask
        dev = self.device
        batch = {k: v.to(dev) for k, v in batch.items()}
        if "pixel_values" in batch:
            if batch["pixel_values"].shape[0] == 0:
                raise ValueError(f"images have no rows (shape {tuple(batch['pixel_values'].shape)}); pass at least one")
            batch["pixel_values"] = batch["pixel_values"].to(self._float_dtype())
            return batch
        ids = batch["input_ids"]
        _check_ids(ids, self.cfg.d_vocab, self._max_positions())
        mask = batch.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(ids)
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(ids.shape):
            got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"attention_mask has shape {got}; expected the token ids' shape {tuple(ids.shape)}")
        if mask.is_floating_point() and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("attention_mask must hold 0 (padding) and 1 (real token) only")
        batch["attention_mask"] = mask.to(ids.device, torch.long)
        if not bool(batch["attention_mask"].any(1).all()):
            raise ValueError(f"attention_mask row {int((~batch['attention_mask'].bool().any(1)).nonzero()[0])} "
                             "has no real token")
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp_min(0)
        return batch

    def batches(self, inputs: Inputs, batch_size: int | None = None, padding_side: str | None = None,
                max_length: int | None = None, add_special_tokens: bool = True) -> Iterator[dict[str, torch.Tensor]]:
        """Forward-ready batches of any input kind, ``batch_size`` rows each (``None``: one batch).

        Texts (a string or a list) are tokenized per batch (so each batch pads only to its own longest
        prompt; ``padding_side``, ``max_length`` and ``add_special_tokens`` as in :meth:`tokenize`); token
        ids ``[n, pos]``, dicts with ``input_ids``/``attention_mask`` (or ``pixel_values``) and images
        ``[n, c, h, w]`` are sliced along the first axis. The one batching helper of the analyzers."""
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        if isinstance(inputs, str):
            inputs = [inputs]
        if isinstance(inputs, (list, tuple)):
            if not inputs:
                raise ValueError("inputs is an empty list; pass at least one prompt")
            if not all(isinstance(t, str) for t in inputs):
                raise TypeError("a list of inputs must hold strings (pass token ids as a [batch, pos] tensor)")
            size = batch_size or len(inputs)
            for i in range(0, len(inputs), size):
                yield self.tokenize(list(inputs[i:i + size]), padding_side=padding_side, max_length=max_length,
                                    add_special_tokens=add_special_tokens)
            return
        if isinstance(inputs, Mapping):
            key = "input_ids" if "input_ids" in inputs else "pixel_values"
            if key not in inputs:
                raise ValueError(f"input dict needs 'input_ids' or 'pixel_values', got keys {sorted(inputs)}")
            n = inputs[key].shape[0]
            size = batch_size or n
            for i in range(0, n, size):
                yield {k: v[i:i + size] for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            return
        if isinstance(inputs, torch.Tensor):
            t = inputs[None] if (inputs.dim() == 1 and not inputs.is_floating_point()) else inputs
            key = "pixel_values" if t.is_floating_point() else "input_ids"
            size = batch_size or t.shape[0]
            for i in range(0, t.shape[0], size):
                yield {key: t[i:i + size]}
            return
        raise TypeError(f"unsupported inputs of type {type(inputs).__name__}: pass a string, a list of strings, "
                        "token ids [batch, pos], a dict with input_ids/attention_mask, or images [batch, c, h, w]")

    def _max_positions(self) -> int | None:
        """The longest sequence the model takes (``None``: no fixed limit, e.g. rotary embeddings)."""
        return None

    def _float_dtype(self) -> torch.dtype:
        return torch.float32

    # ------------------------------------------------------------------ running
    def _run(self, inputs: Inputs, hooks: HookSet | None = None, stop_at_layer: int | None = None,
             grad: bool = False, attention_mask=None, prepared: bool = False) -> Any:
        """One forward pass with the hooks of open contexts plus ``hooks``, inside its own pass context.

        ``prepared=True`` takes ``inputs`` as forward kwargs already on the device (generation steps:
        ``input_ids``, ``attention_mask`` over the whole sequence, ``position_ids``, ``past_key_values``,
        ``use_cache``)."""
        if id(self) in _IN_HOOK.get():
            raise RuntimeError("the model was called from inside one of its own hook functions, which would "
                               "run that hook again without end; compute what the hook needs before the "
                               "forward pass (or use a separate model instance)")
        batch = inputs if prepared else self.prepare(inputs, attention_mask)
        merged: HookSet = defaultdict(list)
        for hs in (self._persistent_hooks(), *self._active):
            for k, v in hs.items():
                merged[k].extend(v)
        for k, v in (hooks or {}).items():
            merged[k].extend(v)
        if not grad and torch.is_grad_enabled() and self._backward_hooks_live(merged):
            grad = True  # a backward hook needs this forward's graph (TransformerLens keeps it too)
            with _graph_params(self):
                return self._run_merged(batch, merged, stop_at_layer, grad)
        return self._run_merged(batch, merged, stop_at_layer, grad)

    def _backward_hooks_live(self, merged: HookSet) -> bool:
        """Whether a live backward hook applies to this run: its own or persistent ones (in ``merged``), or those
        of a ``hooks(bwd_hooks=...)`` block open in this thread (some backends install a block's hooks as module
        hooks rather than merging them, so those are tracked apart)."""
        if any(b.owner is self and b.live for b in _BWD_OPEN.get()):
            return True
        return any(isinstance(f, _BackwardHook) and f.live for fns in merged.values() for f in fns)

    def _run_merged(self, batch: dict, merged: HookSet, stop_at_layer: int | None, grad: bool) -> Any:
        if stop_at_layer is not None and (isinstance(stop_at_layer, bool) or not isinstance(stop_at_layer, int)
                                          or not 0 < stop_at_layer <= self.cfg.n_layers):
            raise ValueError(f"stop_at_layer must be an integer in 1..{self.cfg.n_layers}, got {stop_at_layer!r}")
        for at, sp in self._splices.items():  # spliced SAEs: their hooks run inside the SAE at `at`
            virtual = {n: merged.pop(n) for n in sp.names if n in merged}
            merged[at].append(sp.intervention(virtual))
        mask = batch.get("attention_mask")
        ids = batch.get("input_ids")
        past = 0 if mask is None or ids is None else mask.shape[1] - ids.shape[1]
        with self._locked(), pass_scope(self, mask, past):
            return self._forward(batch, dict(merged), stop_at_layer, grad)

    def _context(self, name: str, tensor: torch.Tensor | None = None, pass_ctx=None) -> HookContext:
        """The :class:`HookContext` of one hook call, from the current pass of this model (or ``pass_ctx``,
        for libraries that run hook code in another thread)."""
        p = pass_ctx if pass_ctx is not None else current_pass(self)
        ctx = self.__dict__.setdefault("_hook_ctx", defaultdict(dict))[name]  # TL's hook.ctx, kept per name
        if p is None:  # a raw call of the wrapped module (torch backend context hooks): no mask known
            return HookContext(name=name, ctx=ctx)
        n = None
        if tensor is not None and tensor.dim() >= 2:
            n = tensor.shape[2] if name.endswith(_KEY_BY_QUERY) else tensor.shape[1]
        qmask = p.query_mask(n) if n is not None else p.attention_mask
        return HookContext(name=name, attention_mask=qmask, pass_index=p.pass_index, past_length=p.past_length,
                           key_mask=p.attention_mask, generating=p.generating, run_id=p.run.run_id, ctx=ctx)

    def _call_hooks(self, name: str, tensor: torch.Tensor, fns: Sequence[InterventionFn],
                    writable: bool = True, pass_ctx=None) -> tuple[torch.Tensor, bool]:
        """Run ``fns`` in order on the canonical tensor of ``name``; returns ``(tensor, changed)``.

        Every backend calls this, so the shape checks and error messages are the same everywhere.
        """
        ctx = self._context(name, tensor, pass_ctx)
        changed = False
        if (writable and name.endswith(_FORKED_SITES) and tensor.requires_grad
                and any(getattr(fn, "wants_grad", False) for fn in fns)):
            # the gradient at a site is that of a write there (TL's bridge): hook_resid_mid feeds only the MLP
            # (the residual add after it reads the unhooked value), so its gradient is the MLP branch's, not the
            # residual's; a fresh view handed on to the MLP separates the two
            tensor, changed = tensor.view_as(tensor), True
        token = _IN_HOOK.set(_IN_HOOK.get() | {id(self)})
        try:
            for fn in fns:
                out = fn(tensor, ctx)
                if out is None or out is tensor:
                    continue
                _check_hook_output(name, tensor, out)
                if not writable:
                    raise ValueError(f"{name!r} can be captured but not modified on the {self.backend} "
                                     "backend: it is derived from other tensors "
                                     "(model.can_write(name) tells which names are writable)")
                tensor, changed = out, True
        finally:
            _IN_HOOK.reset(token)
        return tensor, changed

    def __call__(self, inputs: Inputs, attention_mask: torch.Tensor | None = None,
                 stop_at_layer: int | None = None, return_type: str | None = "logits",
                 prepend_bos: bool | None = None, padding_side: str | None = None, loss_per_token: bool = False) -> Any:
        """Logits ``[batch, pos, vocab]`` (or the model's natural output, e.g. hidden states ``[batch, pos, d]``).

        With ``stop_at_layer=l``, runs blocks ``0..l-1`` only and returns the residual stream there
        (``blocks.{l-1}.hook_resid_post``, ``[batch, pos, d_model]``), as TransformerLens does.
        ``return_type`` as in TransformerLens: ``"logits"`` (default), ``"loss"`` (mean next-token
        cross-entropy over real tokens, :func:`interp.habits.lm_loss`), ``"both"`` (``(logits, loss)``) or ``None``.
        ``prepend_bos`` / ``padding_side``: the BOS rule and padding side of text inputs for this call (default:
        :attr:`prepend_bos` and the tokenizer's side), as TransformerLens's per-call arguments. ``loss_per_token``:
        the loss is each next token's cross-entropy, ``[batch, pos - 1]``, as TransformerLens's."""
        inputs = self._text_inputs(inputs, attention_mask, prepend_bos, padding_side)
        if stop_at_layer is not None:
            return self._stopped(inputs, {}, stop_at_layer, attention_mask)
        return self._shaped(inputs, None, attention_mask, return_type, loss_per_token)

    def _shaped(self, inputs: Inputs, hooks: HookSet | None, attention_mask, return_type, per_token: bool = False):
        """One run with ``hooks``, its output shaped by ``return_type`` (checked before the run; the loss per token
        with ``per_token``)."""
        from .habits import RETURN_TYPES, shape_output

        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type must be one of 'logits', 'loss', 'both' or None, got {return_type!r}")
        batch = self.prepare(inputs, attention_mask)
        out = self._run(batch, hooks, prepared=True)
        return out if return_type == "logits" else shape_output(out, batch, return_type, per_token)

    forward = __call__

    def run_with_cache(self, inputs: Inputs, names: str | Sequence[str] | None = None,
                       stop_at_layer: int | None = None, device: str | torch.device | None = None,
                       dtype: torch.dtype | None = None, attention_mask: torch.Tensor | None = None,
                       names_filter: Any = None, return_type: str | None = "logits",
                       remove_batch_dim: bool = False, prepend_bos: bool | None = None,
                       padding_side: str | None = None) -> tuple[Any, Cache]:
        """Run once and return ``(output, cache)``; ``cache[name]`` is detached.

        ``stop_at_layer=l`` runs blocks ``0..l-1`` only (output is ``None``); ``device``/``dtype`` choose
        where the cache is kept. Every requested hook must fire, or :class:`HookNotFiredError` is raised.
        TransformerLens's spellings: ``names_filter`` (a name, list, glob or callable) is ``names``;
        ``return_type`` as in :meth:`__call__`; ``remove_batch_dim=True`` drops the batch axis of a one-example
        run from every cached tensor; ``prepend_bos`` / ``padding_side`` as in :meth:`__call__`. Every argument
        (``device`` included) is checked before the forward pass.
        """
        from .habits import RETURN_TYPES, shape_output

        device = check_device(device)
        inputs = self._text_inputs(inputs, attention_mask, prepend_bos, padding_side)

        if names_filter is not None:
            if names is not None:
                raise ValueError("give names or names_filter (TransformerLens's name for it), not both")
            names = names_filter
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type must be one of 'logits', 'loss', 'both' or None, got {return_type!r}")
        wanted = self._resolve(names)
        if stop_at_layer is not None and (isinstance(stop_at_layer, bool) or not isinstance(stop_at_layer, int)
                                          or not 0 < stop_at_layer <= self.cfg.n_layers):
            raise ValueError(f"stop_at_layer must be an integer in 1..{self.cfg.n_layers}, got {stop_at_layer!r}")
        if stop_at_layer is not None:
            late = [n for n in wanted if (parse(n)[0] is not None and parse(n)[0] >= stop_at_layer)
                    or n == "ln_final.hook_normalized"]
            if late and names is not None:
                raise HookNotFiredError(f"hooks {late[:3]}... run after stop_at_layer={stop_at_layer}")
            wanted = [n for n in wanted if n not in late]
        cache = Cache(model=self)
        batch = self.prepare(inputs, attention_mask)
        if remove_batch_dim and batch.get("input_ids", batch.get("pixel_values")).shape[0] != 1:
            raise ValueError("remove_batch_dim=True needs a run of one example")
        out = self._run(batch, self._capture_hooks(wanted, cache, device, dtype), stop_at_layer, prepared=True)
        _check_fired(wanted, cache)
        if remove_batch_dim:
            cache = Cache({k: [t[0] for t in cache.passes(k)] for k in cache}, model=self, has_batch_dim=False)
        if stop_at_layer is None and return_type != "logits":
            out = shape_output(out, batch, return_type)
        return out, cache

    def _capture_hooks(self, names: list[str], cache: Cache, device, dtype) -> HookSet:
        def make(name: str):
            def save(t: torch.Tensor, ctx: HookContext) -> None:
                # always a copy: the model may later write in place into the tensor it showed the hook
                # (Falcon's mlp_output += attention_output), and a cached view would change with it
                t = t.detach()
                if device is not None or dtype is not None:
                    t = t.to(device=device, dtype=dtype if t.is_floating_point() else None, copy=True)
                else:
                    t = t.clone()
                cache.add(name, t)
            return save
        return {n: [make(n)] for n in names}

    @contextlib.contextmanager
    def capture(self, names: str | Sequence[str] | None = None, device=None, dtype=None) -> Iterator[Cache]:
        """``with model.capture(names) as cache:`` records every forward pass run inside the block.

        Passes accumulate: ``cache[name]`` concatenates them along the batch axis when shapes match;
        ``cache.passes(name)`` keeps them apart (e.g. generation steps). The context belongs to the thread
        that opened it: runs in other threads are not recorded (docs/reliability.md, "Threads").
        """
        wanted = self._resolve(names)
        device = check_device(device)
        cache = Cache(model=self)
        pop = self._push(self._capture_hooks(wanted, cache, device, dtype))
        try:
            yield cache
        finally:
            pop()

    @contextlib.contextmanager
    def intervene(self, interventions: Mapping[str, InterventionFn | Sequence[InterventionFn]]) -> Iterator["Model"]:
        """``with model.intervene({name_or_pattern: intervention, ...}):`` — applies to every forward and
        to :meth:`generate` inside the block; a pattern applies the intervention at every matching hook. The
        context belongs to the thread that opened it: runs in other threads do not see it."""
        pop = self._push(self._hookset(interventions.items(), "intervention"))
        try:
            yield self
        finally:
            pop()

    def gradients(self, inputs: Inputs, names: str | Sequence[str],
                  loss_fn: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor] | None = None,
                  attention_mask: torch.Tensor | None = None) -> GradientResult:
        """Gradient of a scalar with respect to named activations.

        ``loss_fn(output, batch) -> scalar``; the default is the mean next-token cross-entropy over
        real (non-padding) tokens. Gradients are a *read*: the captured tensor's gradient is retained
        (nothing is written into the forward pass), so capture-only sites such as ``attn.hook_pattern``
        work too. Parameter gradients are not accumulated. Interventions of open contexts apply, and
        gradients flow through them (use :meth:`forward_with_grad` to differentiate anything else).
        """
        wanted = self._resolve(names)
        acts = Cache(model=self)
        live: dict[str, list[torch.Tensor]] = defaultdict(list)

        def make(name: str):
            def probe(t: torch.Tensor, ctx: HookContext) -> None:
                if t.requires_grad:
                    live[name].append(t)
                acts.add(name, t.detach().clone())  # a copy: see _capture_hooks
            probe.wants_grad = True  # type: ignore[attr-defined]
            return probe

        batch = self.prepare(inputs, attention_mask)
        with _graph_params(self), torch.enable_grad():  # also when the caller disabled grad mode
            out = self._run(batch, {n: [make(n)] for n in wanted}, grad=True, prepared=True)
            value = (loss_fn or next_token_loss)(out, batch)
            if not isinstance(value, torch.Tensor) or value.dim() != 0:
                raise ValueError(f"loss_fn must return a scalar tensor, got "
                                 f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}")
            _check_fired(wanted, acts)
            flat = [(n, t) for n in wanted for t in live[n]]
            grads_t = torch.autograd.grad(value, [t for _, t in flat], allow_unused=True) if flat else ()
        grads = Cache(model=self, gradient=True)
        got = dict.fromkeys(n for n, _ in flat)
        for (n, t), g in zip(flat, grads_t):
            if g is None and not self.can_write(n):
                # a read-only site computed beside the forward path (a lens that is not writable):
                # zeros here would be silent garbage
                raise ValueError(f"the gradient at {n!r} cannot be read on the {self.backend} backend: that site is "
                                 "derived from its module's input beside the forward path (read-only here); take "
                                 "the gradient at a writable site (e.g. the norm's input or hook_normalized) or use "
                                 "backend='transformer_lens'")
            grads.add(n, torch.zeros_like(t).detach() if g is None else g.detach())
        for n in wanted:  # sites the loss does not depend on through a differentiable path
            if n not in got:
                for a in acts.passes(n):
                    grads.add(n, torch.zeros_like(a))
        return GradientResult(value.detach(), acts, grads)

    def forward_with_grad(self, inputs: Inputs, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """A forward that keeps the autograd graph: gradients of the output, or of anything an open
        intervention or capture computed from activations (e.g. SAE features kept by a hook), can then
        be taken with ``torch.autograd.grad`` (use that, not ``.backward()``, to leave parameter
        ``.grad`` untouched)."""
        batch = self.prepare(inputs, attention_mask)
        with _graph_params(self):
            return self._run(batch, grad=True, prepared=True)

    def parameters(self):
        """The wrapped module's parameters (backends override)."""
        return iter(())

    def named_parameters(self):
        """``(name, parameter)`` pairs of the wrapped module, as ``nn.Module.named_parameters`` gives them."""
        return iter(())

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, inputs: Inputs, max_new_tokens: int = 32, do_sample: bool | None = None,
                 temperature: float | None = None, top_k: int | None = None, seed: int | None = None,
                 stop_at_eos: bool = True, return_text: bool = True, padding_side: str = "left",
                 verbose: bool = False, return_type: str | None = None, prepend_bos: bool | None = None):
        """Continue each prompt by ``max_new_tokens`` tokens: greedy by default; sampled with ``do_sample=True``
        or, as in TransformerLens, whenever a positive ``temperature`` is given (``temperature=0`` is greedy).

        Interventions and captures of open contexts apply at every pass (see :meth:`_generate_ids` for
        what a pass is). Prompts are left-padded by default; with ``padding_side="right"`` (or a
        right-padded batch of ids and mask) each row continues from its own last real token, the new tokens
        following after the padding (masked), so batched results equal unbatched ones either way. ``seed``
        seeds a private generator (the global RNG is untouched). ``max_new_tokens=0`` returns empty
        continuations on every backend. Returns the new text of each prompt (or the new token ids
        ``[batch, new]`` with ``return_text=False``, ``-1`` after a row's end-of-sequence token).

        TransformerLens's spellings: ``verbose=True`` shows a progress bar over the new tokens;
        ``return_type`` as TL's: ``"str"`` (the prompt followed by its continuation: one string for one text, a
        list for a list), ``"tokens"`` (prompt and new ids ``[batch, pos + new]``), ``"input"`` (strings for text
        input, tokens for token input: TL's default); ``None`` keeps interp's (the continuations only, see above);
        ``prepend_bos`` rules text prompts for this call.
        """
        if return_type not in (None, "str", "tokens", "input"):
            raise ValueError(f"return_type must be None, 'str', 'tokens' or 'input', got {return_type!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
        if do_sample is None:
            do_sample = temperature is not None and not (isinstance(temperature, (int, float)) and temperature == 0)
        if temperature is None:
            temperature = 1.0
        if do_sample and not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"temperature must be a positive number when sampling, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
        if not self.cfg.is_causal_lm:
            raise ValueError(f"generate needs a causal language model; this is a {self.cfg.family} "
                             f"{self.cfg.modality} model without a language-model head")
        texts_in = isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and all(isinstance(t, str) for t in inputs))
        if prepend_bos is not None and texts_in:
            self.prepare(inputs)  # the usual checks of texts
            inputs = self.tokenize(inputs, padding_side=padding_side, prepend_bos=prepend_bos)
        batch = self.prepare(inputs, padding_side=padding_side)
        if "input_ids" not in batch:
            raise ValueError("generate needs text or token ids")
        ids, mask = batch["input_ids"], batch["attention_mask"]
        limit = self._max_positions()
        longest = int(mask.sum(1).max())
        if limit is not None and max_new_tokens and longest + max_new_tokens - 1 > limit:
            raise ValueError(f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} needs "
                             f"{longest + max_new_tokens - 1} positions; this model takes at most {limit}")
        gen = torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None
        new = self._generate_ids(ids, mask, max_new_tokens, do_sample, temperature, top_k, gen, stop_at_eos, verbose)
        if return_type == "input":
            return_type = "str" if texts_in else "tokens"
        if return_type is not None:
            return self._with_prompt(ids, mask, new, return_type, single=isinstance(inputs, str))
        if not return_text:
            return new
        return [self.tokenizer.decode(row[row != -1], skip_special_tokens=True) for row in new]

    def _eos_ids(self) -> set[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        return set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))

    #: backends whose forward accepts ``past_key_values``/``use_cache`` and returns ``(logits, past)``
    _kv_cache: bool = False

    def _with_prompt(self, ids: torch.Tensor, mask: torch.Tensor, new: torch.Tensor, return_type: str, single: bool):
        """Prompt followed by continuation, as TransformerLens's ``generate`` returns it: ids ``[batch, pos +
        new]`` (a row's padding and its tokens after end-of-sequence are the pad id), or the decoded strings
        (one string for one text prompt)."""
        pad = next((int(p) for p in (getattr(self.tokenizer, "pad_token_id", None),
                                     getattr(self.tokenizer, "eos_token_id", None)) if isinstance(p, int)), 0)
        rows = [torch.cat([ids[i][mask[i].bool()], new[i][new[i] != -1]]) for i in range(ids.shape[0])]
        if return_type == "tokens":
            n = max(len(r) for r in rows)
            out = torch.full((len(rows), n), pad, dtype=torch.long, device=ids.device)
            for i, r in enumerate(rows):
                out[i, :len(r)] = r
            return out
        texts = [self.tokenizer.decode(r) for r in rows]
        return texts[0] if single else texts

    def _generate_ids(self, ids, mask, max_new_tokens, do_sample, temperature, top_k, gen, stop_at_eos,
                      verbose: bool = False):
        """One generation loop for every backend.

        Pass 0 reads the prompt; pass ``k`` reads the ``k``-th new token against the key-value cache.
        Every built-in backend has one for causal LMs (torch/nnsight: HF's cache; TransformerLens: the
        bridge's HF cache or a HookedTransformer's own), so hooks see only the positions a pass computes;
        a plug-in backend without ``_kv_cache`` recomputes the whole sequence each pass, and interventions
        then apply to every position of every pass. Hooks see each pass with its own context: the mask of
        the whole sequence so far, ``past_length``, ``pass_index``; ``positions=[-1]`` is the last
        prompt token in pass 0 and the new token afterwards, so a steering vector at ``[-1]`` touches
        each token once, exactly as in a KV-cached Hugging Face ``generate`` under hooks.
        """
        eos = self._eos_ids()
        eos_t = torch.tensor(sorted(eos), device=ids.device) if eos else None
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        out = []
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        step = first = {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
        past = None
        with self._locked(), run_scope(self, generating=True):
            steps = range(max_new_tokens)
            if verbose:
                from .progress import progress
                steps = progress(steps, desc="generating", total=max_new_tokens)
            for _ in steps:
                if self._kv_cache:
                    logits, past = self._run({**step, "past_key_values": past, "use_cache": True}, prepared=True)
                else:
                    logits = self._run(step, prepared=True)
                if step is first:  # the prompt: each row's last real token (right padding puts pads after it)
                    n = step["attention_mask"].shape[1]
                    at = (step["attention_mask"] * torch.arange(1, n + 1, device=ids.device)).argmax(1)
                    last = logits[torch.arange(logits.shape[0], device=logits.device), at.to(logits.device)]
                else:  # the new token (with a key-value cache the pass holds only it)
                    last = logits[:, -1, :]
                nxt = sample_next(last, do_sample, temperature, top_k, gen)
                nxt = torch.where(done, torch.full_like(nxt, -1), nxt)
                out.append(nxt)
                if stop_at_eos and eos_t is not None:
                    done |= torch.isin(nxt, eos_t)
                mask = torch.cat([step["attention_mask"], (nxt >= 0).long()[:, None]], dim=1)
                new_pos = step["position_ids"][:, -1:] + 1
                if self._kv_cache:
                    step = {"input_ids": nxt.clamp_min(0)[:, None], "attention_mask": mask, "position_ids": new_pos}
                else:
                    step = {"input_ids": torch.cat([step["input_ids"], nxt.clamp_min(0)[:, None]], 1),
                            "attention_mask": mask, "position_ids": torch.cat([step["position_ids"], new_pos], 1)}
                if done.all():
                    break
        return torch.stack(out, dim=1) if out else ids[:, :0]


@contextlib.contextmanager
def requires_grad(params: "Iterable[torch.Tensor] | Mapping[str, torch.Tensor]") -> Iterator[None]:
    """Make ``params`` (tensors, or a ``{name: tensor}`` mapping) require grad for the block; the ones that
    did not are frozen again afterwards, even on an exception or interruption."""
    tensors = params.values() if isinstance(params, Mapping) else params
    frozen = [p for p in tensors if not p.requires_grad]
    try:
        for p in frozen:
            p.requires_grad_(True)
        yield
    finally:
        for p in frozen:
            p.requires_grad_(False)


def _graph_params(model: "Model"):
    """:func:`requires_grad` on every floating parameter, so a forward builds a graph through the activations
    also when the user froze the model. Gradients are taken with ``torch.autograd.grad`` on activations
    only, so no parameter ``.grad`` is written."""
    return requires_grad([p for p in model.parameters() if p.is_floating_point()])


def _habits():
    from . import habits

    return habits


def sample_next(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None,
                generator: torch.Generator | None) -> torch.Tensor:
    """Next token ids ``[batch]`` from last-position logits ``[batch, vocab]``."""
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / max(temperature, 1e-6)
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1).cpu()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)


def next_token_loss(logits: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over positions whose target is a real token."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask", torch.ones_like(ids))
    logp = logits[:, :-1].float().log_softmax(-1)
    tgt = ids[:, 1:]
    nll = -logp.gather(-1, tgt[..., None]).squeeze(-1)
    keep = (mask[:, 1:] * mask[:, :-1]).float()
    return (nll * keep).sum() / keep.sum().clamp_min(1)


#: why a name is capture-only (every other canonical name, attn.hook_pattern/attn_scores/rot_q/rot_k/result
#: included, is writable on every backend that offers it)
#: hooks whose tensors are ``[batch, head, query_pos, key_pos]`` (the query axis is 2)
_KEY_BY_QUERY = ("attn.hook_pattern", "attn.hook_attn_scores")

#: sites whose tensor is one branch of a fork (a write there reaches only that branch): the gradient a backward hook
#: or :meth:`Model.gradients` reads there is the branch's (see :meth:`Model._call_hooks`)
_FORKED_SITES = ("hook_resid_mid",)


class _BackwardHook:
    """A TransformerLens backward hook at one site: as a forward hook it registers ``fn`` on the activation's
    gradient (a tensor hook), so ``fn(grad, hook)`` runs when a backward pass goes through that activation; a
    returned tensor replaces the gradient. ``live`` turns it off (also for graphs made before)."""

    wants_grad = True

    def __init__(self, name: str, fn: Callable, owner: "Model | None" = None) -> None:
        self.name, self.fn, self.live, self.owner = name, fn, True, owner

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> None:
        if not (self.live and tensor.requires_grad):
            return None

        def on_grad(grad: torch.Tensor) -> torch.Tensor | None:
            if not self.live:
                return None
            out = self.fn(grad, ctx)
            if out is not None:
                _check_hook_output(f"{self.name} (backward)", grad, out)
            return out
        tensor.register_hook(on_grad)
        return None


def _check_ids(ids: torch.Tensor, vocab: int | None, max_positions: int | None) -> None:
    check_token_ids(ids)
    if ids.shape[0] == 0:
        raise ValueError("token ids have no rows (shape %s); pass at least one sequence" % (tuple(ids.shape),))
    if ids.shape[-1] == 0:
        raise ValueError("token ids have no positions (shape %s); pass at least one token" % (tuple(ids.shape),))
    if ids.numel() and vocab is not None:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary (valid ids: 0..{vocab - 1})")
    if max_positions is not None and ids.shape[-1] > max_positions:
        raise ValueError(f"input has {ids.shape[-1]} positions; this model takes at most {max_positions}")


def _check_hook_output(name: str, tensor: torch.Tensor, out: Any) -> None:
    """A hook's replacement must be a tensor of the activation's shape, dtype and device."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"hook function on {name!r} returned {type(out).__name__}; expected None or a tensor "
                        f"of shape {tuple(tensor.shape)}")
    if out.shape != tensor.shape:
        raise ValueError(f"hook function on {name!r} returned shape {tuple(out.shape)}; expected "
                         f"{tuple(tensor.shape)}")
    if out.dtype != tensor.dtype:
        raise TypeError(f"hook function on {name!r} returned dtype {out.dtype}; expected {tensor.dtype} "
                        f"(cast with .to({tensor.dtype}))")
    if out.device != tensor.device:
        raise ValueError(f"hook function on {name!r} returned a tensor on {out.device}; expected {tensor.device}")


def _check_fired(names: list[str], cache: Cache) -> None:
    missing = [n for n in names if n not in cache]
    if missing:
        raise HookNotFiredError(f"hooks never fired during the forward pass: {missing[:5]}"
                                f"{' ...' if len(missing) > 5 else ''}")


__all__ = ["Model", "ModelConfig", "GradientResult", "StopForward", "UnknownHookError", "unknown_message",
           "check_device", "check_token_ids",
           "next_token_loss", "requires_grad", "sample_next"]
