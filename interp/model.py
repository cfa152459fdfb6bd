"""`Model`: one handle over a backend, with the same verbs everywhere.

Backends implement two things: the canonical hook names they offer and ``_forward(inputs, hooks,
stop_at_layer, grad)``, which runs one forward pass with ``hooks`` (canonical name -> list of
``fn(tensor, ctx)``) applied in order. Everything else — caching, capture and intervention contexts,
gradients, tokenization with correct padding, generation — is written once, here.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from .cache import Cache
from .interventions import HookContext, InterventionFn
from .names import HookNotFiredError, UnknownHookError, expand, parse, unknown_message

Inputs = Any  # str | list[str] | LongTensor [batch, pos] | dict(input_ids, attention_mask) | FloatTensor pixels
HookSet = dict[str, list[InterventionFn]]


class StopForward(Exception):
    """Raised inside a hook to end the forward pass early (``stop_at_layer``)."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape facts of the wrapped model."""

    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_vocab: int | None
    is_causal_lm: bool
    modality: str  # "text" | "vision"


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
        self._active: list[HookSet] = []  # hooks of open capture/intervene contexts, outermost first
        self._mask: torch.Tensor | None = None
        self._pass = 0

    # ------------------------------------------------------------------ backend interface
    def _all_hook_names(self) -> list[str]:
        raise NotImplementedError

    def _forward(self, inputs: dict[str, torch.Tensor], hooks: HookSet, stop_at_layer: int | None,
                 grad: bool) -> Any:
        raise NotImplementedError

    def _push(self, hooks: HookSet) -> Callable[[], None]:
        """Activate ``hooks`` for every forward until the returned callable is called."""
        self._active.append(hooks)

        def pop() -> None:
            with contextlib.suppress(ValueError):
                self._active.remove(hooks)
        return pop

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    # ------------------------------------------------------------------ names
    def hook_names(self, pattern: str | Sequence[str] | None = None) -> list[str]:
        """Canonical hook names this model offers, optionally filtered by a glob or a list of names/globs.

        With a list, the result is in the caller's order (see :func:`interp.names.expand`); with ``None``
        or one glob, in the model's execution order. Unknown names are dropped here (use them in
        ``run_with_cache`` to get an error naming the closest valid ones)."""
        return expand(pattern, self._all_hook_names(), strict=False)

    def _resolve(self, names) -> list[str]:
        return expand(names, self._all_hook_names())

    # ------------------------------------------------------------------ inputs
    def tokenize(self, texts: str | Sequence[str], padding_side: str | None = None,
                 add_special_tokens: bool = True, max_length: int | None = None) -> dict[str, torch.Tensor]:
        """Tokenize with padding: ``{"input_ids": [batch, pos], "attention_mask": [batch, pos]}``.

        ``padding_side`` defaults to the tokenizer's. Either side gives the same results on real
        tokens, because position ids are computed from the attention mask.
        """
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids, or wrap(model, tokenizer=...)")
        tok = self.tokenizer
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
        if isinstance(texts, str):
            texts = [texts]
        old = tok.padding_side
        try:
            if padding_side is not None:
                if padding_side not in ("left", "right"):
                    raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
                tok.padding_side = padding_side
            enc = tok(list(texts), return_tensors="pt", padding=True, add_special_tokens=add_special_tokens,
                      truncation=max_length is not None, max_length=max_length)
        finally:
            tok.padding_side = old
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def prepare(self, inputs: Inputs, attention_mask: torch.Tensor | None = None,
                padding_side: str | None = None) -> dict[str, torch.Tensor]:
        """Turn user inputs into forward kwargs on the model's device (adds ``position_ids`` for text)."""
        if isinstance(inputs, (str, list, tuple)) and (isinstance(inputs, str) or all(isinstance(t, str) for t in inputs)):
            batch = self.tokenize(inputs, padding_side=padding_side)
        elif isinstance(inputs, Mapping):
            batch = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "pixel_values")}
            if not batch:
                raise ValueError(f"input dict needs 'input_ids' or 'pixel_values', got keys {sorted(inputs)}")
        elif isinstance(inputs, torch.Tensor):
            if inputs.is_floating_point():
                if inputs.dim() != 4:
                    raise ValueError(f"float inputs are images [batch, channel, height, width]; got {tuple(inputs.shape)}")
                batch = {"pixel_values": inputs}
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
            batch["pixel_values"] = batch["pixel_values"].to(self._float_dtype())
            return batch
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(ids)
        batch["attention_mask"] = mask.to(ids.device, torch.long)
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp_min(0)
        return batch

    def _float_dtype(self) -> torch.dtype:
        return torch.float32

    # ------------------------------------------------------------------ running
    def _run(self, inputs: Inputs, hooks: HookSet | None = None, stop_at_layer: int | None = None,
             grad: bool = False, attention_mask=None) -> Any:
        batch = self.prepare(inputs, attention_mask)
        merged: HookSet = defaultdict(list)
        for hs in self._active:
            for k, v in hs.items():
                merged[k].extend(v)
        for k, v in (hooks or {}).items():
            merged[k].extend(v)
        if stop_at_layer is not None and not (0 < stop_at_layer <= self.cfg.n_layers):
            raise ValueError(f"stop_at_layer must be in 1..{self.cfg.n_layers}, got {stop_at_layer}")
        self._mask = batch.get("attention_mask")
        try:
            return self._forward(batch, dict(merged), stop_at_layer, grad)
        finally:
            self._mask = None
            self._pass += 1

    def _context(self, name: str) -> HookContext:
        return HookContext(name=name, attention_mask=self._mask, pass_index=self._pass)

    def _call_hooks(self, name: str, tensor: torch.Tensor, fns: Sequence[InterventionFn],
                    writable: bool = True) -> tuple[torch.Tensor, bool]:
        """Run ``fns`` in order on the canonical tensor of ``name``; returns ``(tensor, changed)``.

        Every backend calls this, so the shape checks and error messages are the same everywhere.
        """
        ctx = self._context(name)
        changed = False
        for fn in fns:
            out = fn(tensor, ctx)
            if out is None or out is tensor:
                continue
            if not isinstance(out, torch.Tensor) or out.shape != tensor.shape:
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"intervention on {name!r} returned {shape}; expected a tensor of "
                                 f"shape {tuple(tensor.shape)}")
            if not writable:
                raise ValueError(f"{name!r} can be captured but not modified on the {self.backend} "
                                 "backend (HF attention returns the pattern after using it); "
                                 "intervene on attn.hook_z or use backend='transformer_lens'")
            tensor, changed = out, True
        return tensor, changed

    def __call__(self, inputs: Inputs, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[batch, pos, vocab]`` (or the model's natural output, e.g. hidden states ``[batch, pos, d]``)."""
        return self._run(inputs, attention_mask=attention_mask)

    forward = __call__

    def run_with_cache(self, inputs: Inputs, names: str | Sequence[str] | None = None,
                       stop_at_layer: int | None = None, device: str | torch.device | None = None,
                       dtype: torch.dtype | None = None, attention_mask: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor | None, Cache]:
        """Run once and return ``(output, cache)``; ``cache[name]`` is detached.

        ``stop_at_layer=l`` runs blocks ``0..l-1`` only (output is ``None``); ``device``/``dtype`` choose
        where the cache is kept. Every requested hook must fire, or :class:`HookNotFiredError` is raised.
        """
        wanted = self._resolve(names)
        if stop_at_layer is not None:
            late = [n for n in wanted if (parse(n)[0] is not None and parse(n)[0] >= stop_at_layer)
                    or n == "ln_final.hook_normalized"]
            if late and names is not None:
                raise HookNotFiredError(f"hooks {late[:3]}... run after stop_at_layer={stop_at_layer}")
            wanted = [n for n in wanted if n not in late]
        cache = Cache()
        out = self._run(inputs, self._capture_hooks(wanted, cache, device, dtype), stop_at_layer,
                        attention_mask=attention_mask)
        _check_fired(wanted, cache)
        return out, cache

    def _capture_hooks(self, names: list[str], cache: Cache, device, dtype) -> HookSet:
        def make(name: str):
            def save(t: torch.Tensor, ctx: HookContext) -> None:
                t = t.detach()
                if device is not None or dtype is not None:
                    t = t.to(device=device, dtype=dtype if t.is_floating_point() else None)
                cache.add(name, t)
            return save
        return {n: [make(n)] for n in names}

    @contextlib.contextmanager
    def capture(self, names: str | Sequence[str] | None = None, device=None, dtype=None) -> Iterator[Cache]:
        """``with model.capture(names) as cache:`` records every forward pass run inside the block.

        Passes accumulate: ``cache[name]`` concatenates them along the batch axis when shapes match;
        ``cache.passes(name)`` keeps them apart (e.g. generation steps).
        """
        wanted = self._resolve(names)
        cache = Cache()
        pop = self._push(self._capture_hooks(wanted, cache, device, dtype))
        try:
            yield cache
        finally:
            pop()

    @contextlib.contextmanager
    def intervene(self, interventions: Mapping[str, InterventionFn | Sequence[InterventionFn]]) -> Iterator["Model"]:
        """``with model.intervene({name_or_pattern: intervention, ...}):`` — applies to every forward and
        to :meth:`generate` inside the block; a pattern applies the intervention at every matching hook."""
        hooks: HookSet = defaultdict(list)
        for pattern, fns in interventions.items():
            fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
            for fn in fns:
                if not callable(fn):
                    raise TypeError(f"intervention for {pattern!r} is not callable: {fn!r}")
            for name in self._resolve(pattern):
                hooks[name].extend(fns)
        pop = self._push(dict(hooks))
        try:
            yield self
        finally:
            pop()

    def gradients(self, inputs: Inputs, names: str | Sequence[str],
                  loss_fn: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor] | None = None,
                  attention_mask: torch.Tensor | None = None) -> GradientResult:
        """Gradient of a scalar with respect to named activations.

        ``loss_fn(output, batch) -> scalar``; the default is the mean next-token cross-entropy over
        real (non-padding) tokens. Parameter gradients are not accumulated.
        """
        wanted = self._resolve(names)
        acts = Cache()
        deltas: dict[str, list[torch.Tensor]] = defaultdict(list)

        def make(name: str):
            def probe(t: torch.Tensor, ctx: HookContext) -> torch.Tensor:
                acts.add(name, t.detach())
                delta = torch.zeros_like(t, requires_grad=True)
                deltas[name].append(delta)
                return t + delta
            return probe

        batch = self.prepare(inputs, attention_mask)
        out = self._run(batch, {n: [make(n)] for n in wanted}, grad=True)
        value = (loss_fn or next_token_loss)(out, batch)
        if value.dim() != 0:
            raise ValueError(f"loss_fn must return a scalar, got shape {tuple(value.shape)}")
        _check_fired(wanted, acts)
        flat = [(n, d) for n in wanted for d in deltas[n]]
        grads_t = torch.autograd.grad(value, [d for _, d in flat], allow_unused=True)
        grads = Cache()
        for (n, d), g in zip(flat, grads_t):
            grads.add(n, torch.zeros_like(d) if g is None else g.detach())
        return GradientResult(value.detach(), acts, grads)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, inputs: Inputs, max_new_tokens: int = 32, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, seed: int | None = None,
                 stop_at_eos: bool = True, return_text: bool = True, padding_side: str = "left"):
        """Continue each prompt by ``max_new_tokens`` tokens (greedy unless ``do_sample``).

        Interventions and captures of open contexts apply at every step. Prompts are left-padded, so
        batched results equal unbatched ones. Returns the new text of each prompt (or the new token ids
        ``[batch, new]`` with ``return_text=False``).
        """
        batch = self.prepare(inputs, padding_side=padding_side)
        if "input_ids" not in batch:
            raise ValueError("generate needs text or token ids")
        ids, mask = batch["input_ids"], batch["attention_mask"]
        gen = torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None
        new = self._generate_ids(ids, mask, max_new_tokens, do_sample, temperature, top_k, gen, stop_at_eos)
        if not return_text:
            return new
        return [self.tokenizer.decode(row[row != -1], skip_special_tokens=True) for row in new]

    def _eos_ids(self) -> set[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        return set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))

    def _generate_ids(self, ids, mask, max_new_tokens, do_sample, temperature, top_k, gen, stop_at_eos):
        """Generic loop (no key-value cache): one full forward per new token. Backends may override."""
        eos = self._eos_ids()
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        out = []
        for _ in range(max_new_tokens):
            logits = self._run({"input_ids": ids, "attention_mask": mask})
            nxt = sample_next(logits[:, -1, :], do_sample, temperature, top_k, gen)
            nxt = torch.where(done, torch.full_like(nxt, -1), nxt)
            out.append(nxt)
            if stop_at_eos and eos:
                done |= torch.isin(nxt, torch.tensor(sorted(eos), device=nxt.device))
            ids = torch.cat([ids, nxt.clamp_min(0)[:, None]], dim=1)
            mask = torch.cat([mask, (~done | (nxt >= 0)).long()[:, None]], dim=1)
            if done.all():
                break
        return torch.stack(out, dim=1) if out else ids[:, :0]


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


def _check_fired(names: list[str], cache: Cache) -> None:
    missing = [n for n in names if n not in cache]
    if missing:
        raise HookNotFiredError(f"hooks never fired during the forward pass: {missing[:5]}"
                                f"{' ...' if len(missing) > 5 else ''}")


__all__ = ["Model", "ModelConfig", "GradientResult", "StopForward", "UnknownHookError", "unknown_message",
           "next_token_loss", "sample_next"]
