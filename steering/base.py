"""The steering interface: :class:`SteeringVector`, :class:`SteeringMethod`, :class:`SteeringData` and the registry.

A steering method is one class with a ``fit(model, data, val=None) -> SteeringVector``. A
:class:`SteeringVector` is the fitted object: it knows the canonical hook names it writes to, the
position rule, the operation and its tensors; it turns itself into capture-layer interventions
(:meth:`SteeringVector.interventions`, :meth:`SteeringVector.apply`, usable around ``model(...)`` and
``model.generate(...)``) and saves/loads as ``vector.safetensors`` + ``vector.json``.

Registry: every method, built-in or third-party, is declared in the entry-point group ``interp.steering``
(the built-ins in interp's own ``pyproject.toml``)::

    [project.entry-points."interp.steering"]
    my_method = "my_package.module:MyMethod"

and found by :func:`get` and :func:`available` without anything registering at import time. Entry points are
read from the installed metadata: after adding one, reinstall (``pip install -e .``). :func:`register` adds a
method for the current process only (notebooks, tests).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Iterator, Sequence

import torch

from interp.interventions import (Add, HookContext, Intervention, ProjectOut, check_number, check_positions,
                                  check_tensor)
from interp.io import MissingFileError, SerializationError, load_tensors_json, output_dir, save_tensors_json
from interp.registry import Registry

#: Entry-point group through which other packages add steering methods.
ENTRY_POINT_GROUP = "interp.steering"
#: Operations a :class:`SteeringVector` knows how to turn into interventions.
OPERATIONS = ("add", "project_out", "affine")
FORMAT_VERSION = 1


# ============================================================================ interventions
class AffineAblate(Intervention):
    """Affine direction ablation (RepIt step 5; Marshall et al.'s affine concept editing).

    ``x <- x - (x . r_hat) r_hat + (mu . r_hat) r_hat + coeff * r`` on the last axis, where
    ``r_hat = r / ||r||`` and ``mu`` is a reference activation (the harmless mean). With ``reference=None``
    this is plain projection; ``coeff = 0`` is ablation, ``coeff > 0`` adds the direction back.
    ``positions`` follows :mod:`interp.interventions` (``None``: every position, also each generated token).
    """

    def __init__(self, direction: torch.Tensor, reference: torch.Tensor | None = None, coeff: float = 0.0,
                 positions: Sequence[int] | None = None):
        r = torch.as_tensor(direction, dtype=torch.float32)
        if r.dim() != 1:
            raise ValueError(f"AffineAblate direction must be a vector [d], got shape {tuple(r.shape)}")
        norm = r.norm()
        if not torch.isfinite(norm) or norm == 0:
            raise ValueError("AffineAblate direction must be finite and non-zero")
        self.r, self.r_hat = r, r / norm
        self.ref_coef = 0.0 if reference is None else float(torch.as_tensor(reference, dtype=torch.float32) @ self.r_hat)
        if reference is not None and tuple(torch.as_tensor(reference).shape) != tuple(r.shape):
            raise ValueError(f"reference has shape {tuple(torch.as_tensor(reference).shape)}, expected {tuple(r.shape)}")
        self.coeff, self.positions = float(coeff), positions

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        from interp.interventions import _apply

        if tensor.shape[-1] != self.r.shape[0]:
            raise ValueError(f"AffineAblate direction has dimension {self.r.shape[0]}, but {ctx.name!r} has last "
                             f"axis {tensor.shape[-1]} (activation {tuple(tensor.shape)})")
        r_hat = self.r_hat.to(tensor.device)
        shift = (self.ref_coef * r_hat + self.coeff * self.r.to(tensor.device))

        def edit(t: torch.Tensor) -> torch.Tensor:
            tf = t.float()
            return (tf - (tf @ r_hat)[..., None] * r_hat + shift).to(t.dtype)
        return _apply(tensor, ctx, self.positions, None, edit)


# ============================================================================ data
@dataclass
class SteeringData:
    """Contrastive prompts for fitting a steering vector.

    ``positive``: prompts that show the behaviour (e.g. harmful requests, which the model refuses);
    ``negative``: prompts that do not (harmless requests). Each is a list of strings (already chat-formatted,
    see :func:`steering.refusal.refusal_data`; tokenized without adding special tokens) or token ids
    ``[n, pos]`` of equal length (no padding).
    ``categories``: optional label per positive prompt (needed by RepIt).
    """

    positive: Any
    negative: Any
    categories: list[str] | None = None

    def __post_init__(self) -> None:
        for name in ("positive", "negative"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                if value.dim() != 2 or value.is_floating_point():
                    raise ValueError(f"SteeringData.{name} as a tensor must be token ids [n, pos], got "
                                     f"{value.dtype} {tuple(value.shape)}")
            elif isinstance(value, str) or not all(isinstance(t, str) for t in value):
                raise TypeError(f"SteeringData.{name} must be a list of strings or token ids [n, pos]")
            else:
                setattr(self, name, list(value))
            if len(getattr(self, name)) == 0:
                raise ValueError(f"SteeringData.{name} is empty")
        if self.categories is not None:
            self.categories = [str(c) for c in self.categories]
            if len(self.categories) != len(self.positive):
                raise ValueError(f"SteeringData.categories has {len(self.categories)} labels for "
                                 f"{len(self.positive)} positive prompts; expected one label per prompt")

    def of_category(self, *names: str) -> Any:
        """Positive prompts whose category is one of ``names``."""
        if self.categories is None:
            raise ValueError("this SteeringData has no categories")
        keep = [i for i, c in enumerate(self.categories) if c in names]
        return select(self.positive, keep)

    @property
    def category_names(self) -> list[str]:
        """Categories in order of first appearance."""
        return list(dict.fromkeys(self.categories or []))


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` formats conversations (a Hugging Face ``chat_template`` is set)."""
    return tokenizer is not None and getattr(tokenizer, "chat_template", None) is not None


def select(prompts: Any, index: Sequence[int]) -> Any:
    """Rows ``index`` of a prompt list or id tensor."""
    if isinstance(prompts, torch.Tensor):
        return prompts[torch.as_tensor(list(index), dtype=torch.long)]
    return [prompts[i] for i in index]


def spread(prompts: Any, k: int | None) -> Any:
    """At most ``k`` prompts spread evenly over the list (``None``: all): categories are contiguous in the data,
    so this keeps every category where a prefix would not."""
    if k is None or n_prompts(prompts) <= k:
        return prompts
    idx = torch.linspace(0, n_prompts(prompts) - 1, k).round().long().unique().tolist()
    return select(prompts, idx)


def n_prompts(prompts: Any) -> int:
    return int(prompts.shape[0]) if isinstance(prompts, torch.Tensor) else len(prompts)


def batches(prompts: Any, batch_size: int) -> Iterator[Any]:
    """Consecutive slices of a prompt list or id tensor."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for i in range(0, n_prompts(prompts), batch_size):
        yield prompts[i:i + batch_size]


def prepared(model, prompts: Any) -> Any:
    """Model inputs for a batch: strings are tokenized with LEFT padding (so position ``-1`` is the
    last real token of every row) and without added special tokens (prompts are chat-formatted, the
    template already holds them); id tensors pass through."""
    if isinstance(prompts, torch.Tensor):
        return prompts
    return model.tokenize(list(prompts), padding_side="left", add_special_tokens=False)


# ============================================================================ the fitted object
@dataclass
class SteeringVector:
    """A fitted steering intervention.

    Fields:
        method: registry name of the method that produced it.
        operation: ``"add"`` (``x + scale * direction``), ``"project_out"`` (remove the span of
            ``direction`` ``[d]`` or ``[k, d]``) or ``"affine"`` (:class:`AffineAblate` with ``reference`` and
            ``coeff = scale``).
        hooks: canonical hook names or globs the operation applies at (e.g. ``("blocks.7.hook_resid_pre",)``).
        direction: ``[d]`` (``[k, d]`` for ``project_out``).
        positions: position rule: ``None`` = every position of every pass (prompt and each generated
            token); otherwise indices of the current pass (negative from the end; ``(-1,)`` = last token).
        scale: coefficient of ``add`` / ``affine``.
        reference: ``[d]`` reference activation of ``affine`` (its component along the direction is restored).
        tensors: further named tensors the method keeps (e.g. RepIt's naive vector and correction).
        metadata: JSON-ready facts (layer, fit position, hyper-parameters, scores).
    """

    method: str
    operation: str
    hooks: tuple[str, ...]
    direction: torch.Tensor
    positions: tuple[int, ...] | None = None
    scale: float = 1.0
    reference: torch.Tensor | None = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"unknown operation {self.operation!r}; expected one of {', '.join(OPERATIONS)}")
        if isinstance(self.hooks, str):
            self.hooks = (self.hooks,)  # one name, never split into characters
        self.hooks = tuple(self.hooks)
        if not self.hooks:
            raise ValueError("a SteeringVector needs at least one hook name")
        bad = [h for h in self.hooks if not isinstance(h, str) or not h]
        if bad:
            raise TypeError(f"hook names must be non-empty strings, got {bad[0]!r}")
        self.direction = check_tensor(self.direction, "steering direction").detach().float().cpu()
        want = (1, 2) if self.operation == "project_out" else (1,)
        if self.direction.dim() not in want:
            raise ValueError(f"operation {self.operation!r} needs a direction of shape "
                             f"{'[d] or [k, d]' if len(want) == 2 else '[d]'}, got {tuple(self.direction.shape)}")
        if not torch.isfinite(self.direction).all():
            raise ValueError("steering direction has non-finite entries")
        self.positions = check_positions(self.positions)
        if self.reference is not None:
            self.reference = check_tensor(self.reference, "steering reference").detach().float().cpu()
            if self.reference.shape != self.direction.shape[-1:]:
                raise ValueError(f"reference has shape {tuple(self.reference.shape)}, expected "
                                 f"{tuple(self.direction.shape[-1:])}")
        self.tensors = {k: torch.as_tensor(v).detach().cpu() for k, v in self.tensors.items()}
        self.scale = check_number(self.scale, "steering scale")

    # ------------------------------------------------------------------ views
    @property
    def d_model(self) -> int:
        return int(self.direction.shape[-1])

    @property
    def layer(self) -> int | None:
        """The layer of a single-layer vector (from ``metadata['layer']``), else ``None``."""
        layer = self.metadata.get("layer")
        return None if layer is None else int(layer)

    @property
    def unit(self) -> torch.Tensor:
        """The direction normalised to unit length (rows normalised for ``[k, d]``)."""
        return self.direction / self.direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)

    def with_scale(self, scale: float) -> "SteeringVector":
        """A copy with another coefficient."""
        return replace(self, scale=float(scale), tensors=dict(self.tensors), metadata=dict(self.metadata))

    # ------------------------------------------------------------------ interventions
    def intervention(self) -> Intervention:
        """The capture-layer intervention applied at each of :attr:`hooks`."""
        pos = list(self.positions) if self.positions is not None else None
        if self.operation == "add":
            return Add(self.direction, scale=self.scale, positions=pos)
        if self.operation == "project_out":
            return ProjectOut(self.direction, positions=pos)
        return AffineAblate(self.direction, reference=self.reference, coeff=self.scale, positions=pos)

    def interventions(self) -> dict[str, Intervention]:
        """``{hook name or glob: intervention}`` for :meth:`interp.Model.intervene`."""
        fn = self.intervention()
        return {h: fn for h in self.hooks}

    @contextlib.contextmanager
    def apply(self, model) -> Iterator[Any]:
        """``with vector.apply(model): model(...) / model.generate(...)``."""
        if model.cfg is not None and model.cfg.d_model != self.d_model:
            raise ValueError(f"steering vector has d_model {self.d_model}, the model has {model.cfg.d_model}")
        with model.intervene(self.interventions()) as m:
            yield m

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write ``path/vector.safetensors`` (tensors) and ``path/vector.json`` (everything else).

        Through the toolkit's writer rule (:func:`interp.io.output_dir`): atomic; an earlier saved vector
        at ``path`` is replaced, files the user added to the folder stay; a file, a symbolic link or a
        non-empty folder this did not write raise :class:`interp.io.OutputError` unless ``overwrite=True``.
        """
        tensors = {"direction": self.direction.contiguous()}
        if self.reference is not None:
            tensors["reference"] = self.reference.contiguous()
        for k, v in self.tensors.items():
            tensors[f"tensors.{k}"] = v.contiguous()
        meta = {"format_version": FORMAT_VERSION, "class": type(self).__name__, "method": self.method,
                "operation": self.operation, "hooks": list(self.hooks),
                "positions": None if self.positions is None else list(self.positions),
                "scale": self.scale, "metadata": _jsonable(self.metadata)}

        def legacy(folder: Path) -> list[str] | None:  # a vector saved before output manifests existed
            names = ["vector.json", "vector.safetensors"]
            return names if all((folder / n).is_file() for n in names) else None

        with output_dir(path, overwrite=overwrite, writer="SteeringVector.save", legacy=legacy) as tmp:
            save_tensors_json(tmp, tensors, meta, stem="vector")
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "SteeringVector":
        """Read a vector written by :meth:`save` (JSON + safetensors, no pickle).

        Called on the base class, the vector comes back as the ``vector_class`` of the method that made it
        (looked up in the registry), so plug-in methods with their own vector class round-trip too.
        """
        path = Path(path)
        if not (path / "vector.json").exists() or not (path / "vector.safetensors").exists():
            raise MissingFileError(f"{path} is not a saved steering vector (expected vector.json and "
                                   "vector.safetensors)")
        raw, meta = load_tensors_json(path, stem="vector", what="steering vector", tensors=("direction",),
                                      required=("format_version", "method", "operation", "hooks", "positions",
                                                "scale", "metadata"))
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path}: unsupported steering-vector format {meta.get('format_version')!r}")
        where = path / "vector.json"
        # a saved file is untrusted: a string where a list belongs would be split into characters
        if not isinstance(meta["hooks"], list) or not all(isinstance(h, str) for h in meta["hooks"]):
            raise SerializationError(f"{where}: 'hooks' must be a list of hook names, got {meta['hooks']!r}")
        if meta["positions"] is not None and (not isinstance(meta["positions"], list) or not all(
                isinstance(p, int) and not isinstance(p, bool) for p in meta["positions"])):
            raise SerializationError(f"{where}: 'positions' must be null or a list of integers, "
                                     f"got {meta['positions']!r}")
        for key in ("method", "operation"):
            if not isinstance(meta[key], str):
                raise SerializationError(f"{where}: {key!r} must be a string, got {meta[key]!r}")
        if not isinstance(meta["metadata"], dict):
            raise SerializationError(f"{where}: 'metadata' must be an object, got {meta['metadata']!r}")
        target = cls
        if cls is SteeringVector:
            with contextlib.suppress(KeyError):
                target = get(meta["method"]).vector_class
        return target(method=meta["method"], operation=meta["operation"], hooks=tuple(meta["hooks"]),
                      direction=raw["direction"],
                      positions=None if meta["positions"] is None else tuple(meta["positions"]),
                      scale=meta["scale"], reference=raw.get("reference"),
                      tensors={k[len("tensors."):]: v for k, v in raw.items() if k.startswith("tensors.")},
                      metadata=meta["metadata"])

    def _repr_html_(self) -> str:
        """In Jupyter: method, operation, hooks, size, norm, scale and positions as a table."""
        import html

        rows = {"method": self.method, "operation": self.operation, "hooks": ", ".join(self.hooks),
                "d_model": self.d_model, "direction norm": f"{float(torch.as_tensor(self.direction).float().norm()):.4g}",
                "scale": f"{self.scale:g}", "positions": self.positions,
                **{f"metadata.{k}": v for k, v in list(self.metadata.items())[:8]}}
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td style='text-align:left'>"
                       f"{html.escape(str(v))[:200]}</td></tr>" for k, v in rows.items())
        return f"<div><b>SteeringVector</b><table>{body}</table></div>"

    def __repr__(self) -> str:
        where = self.hooks[0] + (f" (+{len(self.hooks) - 1})" if len(self.hooks) > 1 else "")
        return (f"SteeringVector(method={self.method!r}, operation={self.operation!r}, hooks={where}, "
                f"d={self.d_model}, scale={self.scale:g}, positions={self.positions})")


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


# ============================================================================ the method interface
@dataclass
class AuditFit:
    """A method's fit as the audit's steering check evaluates it on the refusal data set
    (:meth:`SteeringMethod.audit_fit`).

    Fields:
        vector: the fitted vector; its condition in the section is named after the method.
        baselines: further named vectors evaluated beside it (and listed before it), e.g. RepIt's ``"natural"``
            (its target vector without isolation). Names must differ from ``"none"`` and from the method's name.
        targets: the harm categories the vector is meant to act on (the table's ``target`` group; the examples
            are drawn from them); empty: every harmful prompt counts as ``non-target``.
        rho: an isolation strength the method chose (RepIt's rho), shown in the section; ``None``: none.
        dims_90: how many residual dimensions hold 90% of the squared norm of the method's correction, where it
            has one (RepIt); ``None`` otherwise.
    """

    vector: SteeringVector
    baselines: dict[str, SteeringVector] = field(default_factory=dict)
    targets: list[str] = field(default_factory=list)
    rho: float | None = None
    dims_90: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.vector, SteeringVector):
            raise TypeError(f"AuditFit.vector must be a SteeringVector, got {type(self.vector).__name__}")
        bad = [k for k, v in self.baselines.items() if not isinstance(v, SteeringVector)]
        if bad:
            raise TypeError(f"AuditFit.baselines[{bad[0]!r}] must be a SteeringVector")
        if "none" in self.baselines:
            raise ValueError("AuditFit.baselines cannot be named 'none' (the unsteered condition)")
        self.targets = [str(t) for t in self.targets]


class SteeringMethod:
    """Base class of steering methods. Subclasses set ``name`` and implement :meth:`fit`.

    A method is configured at construction (``Method(config)`` or ``Method(**config_fields)`` when it has a
    ``config_class``) and fitted with ``fit(model, data=None, val=None)`` (``data=None``: the built-in contrast
    set, :func:`default_data`); diagnostics of the last fit may be
    kept on the instance (attributes ending in ``_``).

    The audit's steering check (``steering/audit_check.py``) runs every method through this interface only: it
    refuses bad options with :meth:`check_options` (before any model loads), builds the method with
    :meth:`for_audit` from the user's options (``--set steering.X=V``, passed as given) and fits it with
    :meth:`audit_fit`. A method overrides these to add its own rules, audit defaults or extra conditions (RepIt
    does all three); :attr:`needs_categories` and :attr:`audit_title` say how the check evaluates and names it.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type | None] = None
    vector_class: ClassVar[type[SteeringVector]] = SteeringVector
    #: ``fit`` needs harm-category labels on the positive prompts: the audit evaluates the method on the refusal
    #: data set only, and a behaviour is fitted with the check's ``behaviour_method`` instead
    needs_categories: ClassVar[bool] = False
    #: the audit section's title when the method is evaluated on refusal (``None``: "Steering: method NAME on ...")
    audit_title: ClassVar[str | None] = None

    @classmethod
    def option_names(cls) -> list[str]:
        """Names of the config fields (the options the method takes; empty without a ``config_class``)."""
        return [f.name for f in fields(cls.config_class)] if cls.config_class is not None else []

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Refuse ``options`` (config field -> typed value) this method cannot be built with, before any model
        loads: ``ValueError`` naming the method and the option. The base checks the names; a method with rules
        on the values extends it (``super().check_options(options)`` first)."""
        opts = cls.option_names()
        bad = sorted(set(options) - set(opts))
        if bad:
            raise ValueError(f"method {cls.name!r} has no option {bad[0]!r}; options: {', '.join(opts) or '(none)'}")

    @classmethod
    def for_audit(cls, model, options: dict[str, Any], val_per_category: int) -> "SteeringMethod":
        """The method as the audit's steering check fits it on the refusal data set: ``options`` are the user's
        (validated by :meth:`check_options`) and win over any default a method adds here from the model or the
        check's data sizes (``val_per_category``: harmful validation prompts per category). Default:
        ``cls(**options)``."""
        return cls(**options)

    def audit_fit(self, model, train: SteeringData, val: SteeringData) -> AuditFit:
        """Fit for the audit's refusal evaluation: ``train``/``val`` are the refusal data set's splits (harmful
        ``positive`` with ``categories``, harmless ``negative``). Default: :meth:`fit` and the vector alone."""
        return AuditFit(self.fit(model, train, val))

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        if self.config_class is None:
            if config is not None or overrides:
                raise TypeError(f"{type(self).__name__} takes no configuration")
            self.config = None
            return
        if config is None:
            config = self.config_class()
        elif not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} expects a {self.config_class.__name__}, "
                            f"got {type(config).__name__}")
        if overrides:
            known = {f.name for f in fields(self.config_class)}
            bad = sorted(set(overrides) - known)
            if bad:
                raise TypeError(f"unknown option(s) {bad} for {type(self).__name__}; known: {sorted(known)}")
            config = replace(config, **overrides)
        self.config = config

    def fit(self, model, data: SteeringData | None = None, val: SteeringData | None = None) -> SteeringVector:
        raise NotImplementedError(f"{type(self).__name__} must implement fit(model, data, val=None)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})" if self.config is not None else f"{type(self).__name__}()"


# ============================================================================ registry
def _validate(cls: Any, name: str | None) -> None:
    if not (isinstance(cls, type) and issubclass(cls, SteeringMethod)):
        raise TypeError(f"only SteeringMethod subclasses can be registered, got {cls!r}")
    if not name or not isinstance(name, str) or any(ch.isspace() for ch in name):
        raise ValueError(f"{cls.__name__} needs a non-empty name without spaces (set the class attribute "
                         "`name` or pass name=...)")


#: the steering methods (entry-point group ``interp.steering``), under the shared rules of
#: :class:`interp.registry.Registry`
METHODS: Registry[type[SteeringMethod]] = Registry("steering method", ENTRY_POINT_GROUP, validate=_validate)


def register(cls: type[SteeringMethod] | None = None, *, name: str | None = None, replace: bool = False):
    """Register a :class:`SteeringMethod` subclass under ``name`` (default: ``cls.name``). Usable as a decorator."""
    return METHODS.register(cls, name, replace)


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (no error if absent)."""
    METHODS.unregister(name)


def reload_entry_points() -> None:
    """Import the ``interp.steering`` plug-ins not loaded yet (e.g. after installing one in this process)."""
    METHODS.load_all()


def get(name: str) -> type[SteeringMethod]:
    """The method class registered as ``name``: ``steering.get("repit")(targets=(...)).fit(model, data)``.

    An unknown name raises a ``KeyError`` naming the closest methods; a plug-in that fails to import raises
    :class:`interp.registry.PluginError` (a ``KeyError`` and an ``ImportError``) naming it and the cause.
    """
    return METHODS.get(name)


def available() -> list[str]:
    """Names of every steering method (built-ins and plug-ins), sorted. The plug-ins are imported, so that a
    broken one is reported now (a ``RuntimeWarning`` naming it and the cause; its name stays listed and
    :func:`get` raises why)."""
    return METHODS.available(load=True)
