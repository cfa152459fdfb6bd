"""Typed configs as data: one ``to_dict`` / ``from_dict`` pair for every dataclass config of the toolkit, and
one canonical hash (:func:`digest`) that the zoo's recipe keys and the reproduction stages share.

A config stored in a record or a result is a plain JSON object (tuples become lists, paths strings, nested
dataclasses objects); :func:`config_from_dict` turns it back into the typed dataclass, checking every field
name against the class (an unknown or misspelt field is an error naming it and the valid ones) and
rebuilding nested dataclass fields and tuples from the annotations.

A function with many options takes them either as keywords or as one ready typed config
(:func:`config_from_call` builds it and refuses both at once); configs validate their fields with
:func:`require`, one line naming the field, the value and what is expected.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import hashlib
import json
import math
import numbers
import types
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A stored config does not fit its dataclass (unknown field, wrong kind of value)."""


def config_to_dict(config: Any) -> Any:
    """The JSON-ready form of a (possibly nested) dataclass config: tuples as lists, paths as strings,
    mappings with string keys. Plain JSON values pass through; anything else raises ``TypeError``."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: config_to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, Mapping):
        return {str(k): config_to_dict(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [config_to_dict(v) for v in config]
    if isinstance(config, Path):
        return str(config)
    if config is None or isinstance(config, (bool, int, float, str)):
        return config
    try:
        import numpy as np

        if isinstance(config, (np.floating, np.integer, np.bool_)):
            return config.item()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"cannot store a {type(config).__name__} in a config (JSON values, tuples, paths and "
                    "dataclasses only)")


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Turn a JSON value back into annotation ``tp`` (dataclasses and tuples; other values as they are)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected an object for {tp.__name__}, got {type(value).__name__}")
        return config_from_dict(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            if dataclasses.is_dataclass(arg) and isinstance(value, Mapping):
                return config_from_dict(arg, value, where)
            if typing.get_origin(arg) in (tuple, typing.Tuple) and isinstance(value, list):
                return _coerce(arg, value, where)
        return value
    if origin in (tuple, typing.Tuple) and isinstance(value, list):
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if args and len(args) == len(value):
            return tuple(_coerce(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        return tuple(value)
    if origin is collections.abc.Sequence and isinstance(value, list):
        (arg,) = typing.get_args(tp) or (Any,)
        return tuple(_coerce(arg, v, f"{where}[{i}]") for i, v in enumerate(value))
    if tp is Path and isinstance(value, str):
        return Path(value)
    return value


def config_from_dict(cls: type[T], data: Mapping[str, Any], where: str = "config") -> T:
    """Rebuild dataclass ``cls`` from :func:`config_to_dict`'s output; ``where`` prefixes error messages.

    Unknown fields raise :class:`ConfigError` naming the closest valid ones; missing fields take the
    dataclass defaults (a field without default that is missing is an error too).
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"config_from_dict needs a dataclass type, got {cls!r}")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected an object for {cls.__name__}, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(str(k), list(fields), n=2, cutoff=0.6)
            hints.append(f"{k!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
        raise ConfigError(f"{where}: unknown field(s) {', '.join(hints)} for {cls.__name__}; valid: "
                          f"{', '.join(fields)}")
    try:
        hints_ = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - unresolvable forward references: values stay as stored
        hints_ = {}
    kwargs = {k: _coerce(hints_.get(k, Any), v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def config_from_call(cls: type[T], config: T | None, keywords: Mapping[str, Any], where: str) -> T:
    """The typed config of a function that takes its options either as keywords or as one ready ``config``.

    ``keywords`` are the options the caller gave (only those it gave); ``where`` (the function's name)
    prefixes the errors. Giving both, a ``config`` of another class, an unknown option (named with the
    closest valid ones) or missing a field without default raises :class:`ConfigError`; the class's own
    ``__post_init__`` validates the values.
    """
    if config is not None:
        if keywords:
            raise ConfigError(f"{where}: pass either config= or the options as keywords, not both; got config= "
                              f"and {', '.join(keywords)}")
        if not isinstance(config, cls):
            raise ConfigError(f"{where}: config must be a {cls.__name__}, got {type(config).__name__}")
        return config
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
               if f.init and f.name not in keywords and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)} (fields of {cls.__name__} without default)")
    return config_from_dict(cls, keywords, where)


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy; ``True`` is not)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite real number (Python or NumPy; ``True`` is not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def is_sequence(value: Any) -> bool:
    """Whether ``value`` is a list, tuple or other sequence (not a string) or a 1-D array."""
    return (isinstance(value, collections.abc.Sequence) and not isinstance(value, (str, bytes))) \
        or getattr(value, "ndim", None) == 1


def require(ok: bool, name: str, value: Any, expected: str) -> None:
    """Raise :class:`ConfigError` ``"<name> must be <expected>; got <value>"`` unless ``ok`` (config validation)."""
    if not ok:
        raise ConfigError(f"{name} must be {expected}; got {value!r}")


def canonical_json(obj: Any) -> str:
    """The canonical JSON text of ``obj`` (sorted keys, no spaces; dataclasses through :func:`config_to_dict`)."""
    return json.dumps(config_to_dict(obj), sort_keys=True, separators=(",", ":"))


def digest(obj: Any) -> str:
    """First 16 hex digits of the SHA-256 of :func:`canonical_json` — the one cache key of the toolkit (zoo
    recipes and reproduction stages)."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


__all__ = ["ConfigError", "canonical_json", "config_from_call", "config_from_dict", "config_to_dict", "digest",
           "is_int", "is_number", "is_sequence", "require"]
