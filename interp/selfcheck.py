"""The self-check at load: one short forward that holds a wrapped model to the capture layer's contract.

``interp.load`` and ``interp.wrap`` run it by default (``check=False`` skips it) and keep the outcome as
``model.self_check`` (a :class:`SelfCheck`; ``interp audit`` records ``to_dict()``). On a probe of a few
token ids it checks, per block, the residual identities that define the sub-layer hooks

- ``resid_pre[l + 1] == resid_post[l]``;
- ``resid_mid == resid_pre + attn_out`` and ``resid_post == resid_mid + mlp_out`` (sequential blocks), or
  ``resid_post == resid_pre + attn_out + mlp_out`` (parallel blocks);

that every listed hook of the first and the last block (and every identity hook of each block) fires; that the logits recomputed from the final residual stream through the final
norm and the unembedding (``W_U``, ``b_U``; Gemma-2/3's final soft-capping) equal the model's logits; and,
on the ``transformer_lens`` backend, that the bridge's logits equal those of the Hugging Face module it
wraps, computed before the bridge was booted (the oracle a bridge bug cannot reach).

A site that alone is wrong (an identity fails where the others hold it to one name), or a listed name that
never fires, is withdrawn from ``hook_names()`` with a warning, and asking for it names the reason. A
wrong final residual stream, unembedding or bridge raises :class:`SelfCheckError` naming the family,
the backend, the site and the measured difference.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

#: probe length (tokens) and batch
PROBE_SHAPE = (1, 4)
#: hooks read in every block (the residual identities); the first and the last block have all of theirs read
IDENTITY_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
#: vocabulary columns the recomputed logits are compared on (all of them for vocabularies up to this size)
LOGIT_COLUMNS = 1024


class SelfCheckError(ValueError):
    """The wrapped model does not meet the capture layer's contract on this backend."""


class SelfCheckWarning(UserWarning):
    """A site was withdrawn from ``hook_names()`` by the self-check."""


@dataclass
class SelfCheck:
    """The outcome of :func:`self_check`.

    ``errors``: the largest relative difference measured per check (``max |lhs - rhs| / max |rhs|``);
    ``withdrawn``: names removed from ``hook_names()`` with their reason; ``tolerance``: the relative
    difference accepted (from the model's dtype); ``seconds``: the check's cost."""

    family: str
    backend: str
    passed: bool
    errors: dict[str, float] = field(default_factory=dict)
    withdrawn: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    tolerance: float = 0.0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "backend": self.backend, "passed": self.passed,
                "errors": {k: (v if v == v and v != float("inf") else str(v)) for k, v in self.errors.items()},
                "withdrawn": dict(self.withdrawn), "skipped": list(self.skipped), "tolerance": self.tolerance,
                "seconds": round(self.seconds, 4)}


def tolerance(dtype: torch.dtype) -> float:
    """The relative difference accepted for identities computed in ``dtype`` (a few ulps of the sums)."""
    return {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 3e-2)


def logit_tolerance(dtype: torch.dtype) -> float:
    """The relative difference accepted between logits computed two ways in ``dtype`` (another order of the
    same operations, softmax kept in float32 by some implementations); the bugs it guards against are 1e-2 and up."""
    return {torch.float64: 1e-6, torch.float32: 1e-3}.get(dtype, 5e-2)


def probe_ids(vocab: int | None, shape: tuple[int, int] = PROBE_SHAPE) -> torch.Tensor:
    """Fixed token ids ``[batch, pos]`` below ``vocab`` (the same for every load: a deterministic check)."""
    v = max(2, min(int(vocab or 256), 50_000))
    g = torch.Generator().manual_seed(20261206)
    return torch.randint(1, v, shape, generator=g)


def _rel(lhs: torch.Tensor, rhs: torch.Tensor) -> float:
    lhs, rhs = lhs.double(), rhs.double()
    return float((lhs - rhs).abs().max() / rhs.abs().max().clamp_min(1e-12))


def reference_logits(hf_model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor | None:
    """The Hugging Face module's own logits on ``ids`` (taken before a bridge rewires the module)."""
    try:
        with torch.no_grad():
            out = hf_model(input_ids=ids.to(next(hf_model.parameters()).device), use_cache=False)
    except Exception:  # noqa: BLE001 - no oracle for this model; the other checks still run
        return None
    logits = getattr(out, "logits", None)
    return None if logits is None else logits.detach().float().cpu()


def self_check(model, reference: torch.Tensor | None = None, ids: torch.Tensor | None = None) -> SelfCheck:
    """Run the self-check on ``model`` (see the module docstring); withdraws wrong sites, raises
    :class:`SelfCheckError` where the model cannot be trusted at all. ``reference``: the HF module's logits on
    ``ids`` (the ``transformer_lens`` backend's oracle)."""
    t0 = time.perf_counter()
    cfg = model.cfg
    result = SelfCheck(str(cfg.family), model.backend, True)
    if getattr(cfg, "modality", "text") != "text":
        result.skipped.append("not a text model")
        result.seconds = time.perf_counter() - t0
        return result
    ids = probe_ids(cfg.d_vocab) if ids is None else ids
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    tol = result.tolerance = tolerance(dtype)
    from .names import parse
    all_names = model.hook_names()
    ends = (0, cfg.n_layers - 1)
    names = [n for n in all_names if parse(n)[0] is None or parse(n)[0] in ends or parse(n)[1] in IDENTITY_HOOKS]
    kind = lambda n: parse(n)[1] if parse(n)[0] is not None else n  # noqa: E731 - the hook, without its block

    def run(wanted):
        with torch.no_grad(), model.capture(wanted) as got:
            out = model(ids.to(model.device), attention_mask=torch.ones_like(ids).to(model.device))
        return out, got

    try:
        logits, cache = run(names)
    except Exception:  # noqa: BLE001 - some site cannot be computed on this model: find which, one hook at a time
        broken: dict[str, str] = {}
        for hook in dict.fromkeys(map(kind, names)):
            probe = next(n for n in names if kind(n) == hook)
            try:
                run([probe])
            except Exception as exc:  # noqa: BLE001 - recorded as the reason the site is withdrawn
                broken[hook] = f"raises {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        if not broken:
            raise
        for n in all_names:
            if kind(n) in broken:
                result.withdrawn[n] = broken[kind(n)]
        names = [n for n in names if kind(n) not in broken]
        logits, cache = run(names)
    captured = set(cache.keys())
    silent = {kind(n) for n in names if n not in captured}
    for n in all_names:  # a hook that never fires in the first or the last block fires in none
        if kind(n) in silent:
            result.withdrawn[n] = "listed but never fired"

    def have(n: str) -> bool:
        return n in captured

    def add_error(key: str, value: float) -> None:
        result.errors[key] = max(result.errors.get(key, 0.0), value)

    wrong: dict[str, str] = {}
    # post-norm encoders (BERT) normalise after the residual add: attn_out / mlp_out are defined before it there
    identities = getattr(model, "_residual_identities", lambda: True)()
    if not identities:
        result.skipped.append("residual identities (post-norm blocks)")
    for l in range(cfg.n_layers if identities else 0):
        b = f"blocks.{l}."
        pre, post = b + "hook_resid_pre", b + "hook_resid_post"
        if not (have(pre) and have(post)):
            continue
        nxt = f"blocks.{l + 1}.hook_resid_pre"
        if have(nxt):
            e = _rel(cache[nxt], cache[post])
            add_error("resid_post == next resid_pre", e)
            if not e <= tol:
                wrong[nxt] = f"differs from {post} by {e:.2e} (relative)"
        attn, mlp, mid = b + "hook_attn_out", b + "hook_mlp_out", b + "hook_resid_mid"
        if not (have(attn) and have(mlp)):
            continue
        e_sum = _rel(cache[pre] + cache[attn] + cache[mlp], cache[post])
        add_error("resid_pre + attn_out + mlp_out == resid_post", e_sum)
        if have(mid):
            e_mid = _rel(cache[pre] + cache[attn], cache[mid])
            e_post = _rel(cache[mid] + cache[mlp], cache[post])
            add_error("resid_pre + attn_out == resid_mid", e_mid)
            add_error("resid_mid + mlp_out == resid_post", e_post)
            ok_sum, ok_mid, ok_post = e_sum <= tol, e_mid <= tol, e_post <= tol
            if ok_sum and not ok_mid and not ok_post:
                wrong[mid] = f"resid_pre + attn_out + mlp_out == resid_post holds but resid_mid is off by {e_mid:.2e}"
            elif not ok_sum and ok_mid and not ok_post:
                wrong[mlp] = f"resid_mid + mlp_out differs from resid_post by {e_post:.2e}"
            elif not ok_sum and not ok_mid and ok_post:
                wrong[attn] = f"resid_pre + attn_out differs from resid_mid by {e_mid:.2e}"
            elif not (ok_sum and ok_mid and ok_post):
                for n in (attn, mlp, mid):
                    wrong[n] = f"the residual identities of block {l} fail (up to {max(e_sum, e_mid, e_post):.2e})"
        elif not e_sum <= tol:
            for n in (attn, mlp):
                wrong[n] = f"resid_pre + attn_out + mlp_out differs from resid_post by {e_sum:.2e}"
    result.withdrawn.update(wrong)
    # logits from the final residual stream, through the final norm and the unembedding
    last = f"blocks.{cfg.n_layers - 1}.hook_resid_post"
    # only where the backend offers a final norm of the residual stream (a masked LM's head transforms it first)
    if getattr(cfg, "is_causal_lm", False) and have(last) and torch.is_tensor(logits) \
            and "ln_final.hook_normalized" in all_names:
        try:
            cols = _columns(logits.shape[-1], logits)
            recomputed = _logits_from_resid(model, cache[last], cols)
        except (KeyError, NotImplementedError, AttributeError, ValueError, TypeError) as exc:
            # no single final norm / unembedding to read (e.g. dynamics.untie_gpt2's position-split modules)
            result.skipped.append(f"logits from the residual stream: {exc}")
        else:
            e = _rel(recomputed, logits[..., cols.to(logits.device)])
            result.errors["logits == unembed(ln_final(resid_post[-1]))"] = e
            if not e <= logit_tolerance(dtype):
                result.passed = False
                _refuse(model, "ln_final / W_U / the last hook_resid_post",
                        f"logits recomputed from {last} through the final norm and W_U differ from the model's "
                        f"by {e:.2e} (relative)")
    if reference is not None and torch.is_tensor(logits):
        e = _rel(logits.float().cpu(), reference)
        result.errors["logits == Hugging Face module's logits"] = e
        if not e <= logit_tolerance(dtype):
            result.passed = False
            _refuse(model, "logits", f"the {model.backend} backend's logits differ from those of the Hugging Face "
                                     f"module it wraps by {e:.2e} (relative)")
    if result.withdrawn:
        model._withdraw(result.withdrawn)
        shown = ", ".join(list(result.withdrawn)[:4]) + (" ..." if len(result.withdrawn) > 4 else "")
        warnings.warn(f"interp self-check: {len(result.withdrawn)} hook name(s) of the {cfg.family} model on the "
                      f"{model.backend} backend withdrawn from hook_names() ({shown}): "
                      f"{next(iter(result.withdrawn.values()))}", SelfCheckWarning, stacklevel=3)
    result.seconds = time.perf_counter() - t0
    return result


def _refuse(model, site: str, what: str) -> None:
    other = "backend='torch' or 'nnsight'" if model.backend == "transformer_lens" else "backend='transformer_lens'"
    raise SelfCheckError(f"interp self-check failed for the {model.cfg.family} family on the {model.backend} backend "
                         f"at {site}: {what}. This backend is wrong for this model: try {other}, or pass check=False "
                         "to load it anyway")


def _columns(vocab: int, logits: torch.Tensor) -> torch.Tensor:
    """The vocabulary columns to compare: every one up to :data:`LOGIT_COLUMNS`, else a fixed spread of them
    plus each position's top token (where the logit lens is read)."""
    if vocab <= LOGIT_COLUMNS:
        return torch.arange(vocab)
    spread = torch.linspace(0, vocab - 1, LOGIT_COLUMNS).long()
    return torch.cat([spread, logits.detach().reshape(-1, vocab).argmax(-1).cpu()]).unique()


def _logits_from_resid(model, resid: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``ln_final(resid) @ W_U[:, cols] + b_U[cols]`` in float64 (with the family's final soft-capping)."""
    w, b, kind, eps = model._final_norm()
    x = resid.double()
    if kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    x = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    if w is not None:
        x = x * w.double().to(x.device)
    if b is not None:
        x = x + b.double().to(x.device)
    W_U = model.weight("W_U")[:, cols.to(resid.device)].double().to(x.device)
    try:
        b_U = model.weight("b_U")[cols.to(resid.device)].double().to(x.device)
    except KeyError:
        b_U = 0.0
    out = x @ W_U + b_U
    cap = model._final_softcap() if hasattr(model, "_final_softcap") else None
    if cap:
        out = torch.tanh(out / cap) * cap
    return out
