"""Typed result objects shared by every analyzer and experiment.

A result is a dataclass deriving from :class:`Result`. It gets, for free:

* ``save(path)`` / ``load(path)``: tensors and arrays go to ``path/tensors.safetensors``, everything
  else (numbers, strings, lists, dicts of those) to ``path/result.json``; written through the toolkit's
  writer rule (:func:`interp.io.output_dir`: atomic, replaces only its own earlier output, keeps the user's
  files, refuses anything else unless ``overwrite=True``), read back without pickle.
* ``to_dict()``: a JSON-ready summary (tensors become nested lists).

Subclasses implement ``to_frame()`` (a tidy :class:`pandas.DataFrame`) and ``figure()`` (a plotly figure).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from .io import SerializationError, check_output, load_tensors_json, output_dir, save_tensors_json

SCHEMA_VERSION = 1


#: every :class:`Result` subclass by qualified name, so that a result nested in another one (a field holding a
#: result) is restored by looking its type up here, never by importing a module named in a file
_RESULT_TYPES: dict[str, type] = {}


def _is_tensor_like(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _type_name(cls: type) -> str:
    """The name a saved result records for its type: ``module.qualname``, or the class's own ``saved_type`` (a
    class that moved keeps the name its files were written under, so they load and are rewritten identically)."""
    fixed = cls.__dict__.get("saved_type")
    return fixed if isinstance(fixed, str) else f"{cls.__module__}.{cls.__qualname__}"


def _is_nested(value: Any) -> bool:
    return _is_tensor_like(value) or isinstance(value, (dict, list, tuple, Result))


def _flatten_tensors(prefix: str, value: Any, out: dict[str, torch.Tensor]) -> Any:
    """Move tensors (also inside dicts, lists and nested results) into ``out``; return the JSON skeleton with
    references."""
    if isinstance(value, Result) and dataclasses.is_dataclass(value):
        return {"__result__": _type_name(type(value)),
                "fields": {f.name: _flatten_tensors(f"{prefix}.{f.name}", getattr(value, f.name), out)
                           for f in dataclasses.fields(value)}}
    if _is_tensor_like(value):
        key = prefix
        tensor = torch.as_tensor(value).detach().cpu().contiguous()
        out[key] = tensor
        return {"__tensor__": key, "numpy": isinstance(value, np.ndarray), "dtype": _dtype_name(tensor.dtype),
                "shape": list(tensor.shape)}
    if isinstance(value, dict):
        return {"__dict__": {str(k): _flatten_tensors(f"{prefix}.{k}", v, out) for k, v in value.items()}}
    if isinstance(value, (list, tuple)) and any(_is_nested(v) for v in value):
        return {"__list__": [_flatten_tensors(f"{prefix}.{i}", v, out) for i, v in enumerate(value)]}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    return value


def _dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (how ``result.json`` records a tensor's dtype)."""
    return str(dtype).removeprefix("torch.")


class _TensorMismatch(SerializationError):
    """A tensor of ``tensors.safetensors`` that is not what ``result.json`` recorded (the loader adds the folder)."""


def _checked_tensor(ref: dict, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tensor ``ref`` (a ``{"__tensor__": key, "dtype", "shape"}`` entry of ``result.json``) refers to,
    after checking that it has the dtype and shape recorded when the result was saved.

    A tensor file that was replaced or edited (an ``int8`` tensor where a ``float32`` one was saved, another
    shape) raises :class:`SerializationError`, naming the field, never a silently different value. Results
    saved before dtypes and shapes were recorded have neither, and only the key is checked."""
    key = ref["__tensor__"]
    if not isinstance(key, str):
        raise _TensorMismatch(f"result.json: a tensor reference must name a tensor, got {key!r}")
    if key not in tensors:
        raise KeyError(key)
    t = tensors[key]
    dtype, shape = ref.get("dtype"), ref.get("shape")
    if dtype is not None and _dtype_name(t.dtype) != dtype:
        raise _TensorMismatch(f"tensors.safetensors: tensor {key!r} has dtype {_dtype_name(t.dtype)}, but "
                                 f"result.json records {dtype!r} (the tensor file was replaced or edited)")
    if shape is not None and list(t.shape) != shape:
        raise _TensorMismatch(f"tensors.safetensors: tensor {key!r} has shape {list(t.shape)}, but result.json "
                                 f"records {shape!r} (the tensor file was replaced or edited)")
    return t


def _restore(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if "__tensor__" in value:
            t = _checked_tensor(value, tensors)
            return t.numpy() if value.get("numpy") else t
        if "__dict__" in value:
            return {k: _restore(v, tensors) for k, v in value["__dict__"].items()}
        if "__list__" in value:
            return [_restore(v, tensors) for v in value["__list__"]]
        if "__result__" in value:
            cls = _RESULT_TYPES.get(value["__result__"])
            if cls is None:
                raise SerializationError(f"nested result of unknown type {value['__result__']!r} (import the module "
                                         "that defines it first)")
            return cls(**{k: _restore(v, tensors) for k, v in value["fields"].items()})
        return value
    return value


def _short(value: Any, limit: int = 80) -> str:
    """A one-line description of a field for display (tensors by shape and dtype)."""
    if _is_tensor_like(value):
        return f"{type(value).__name__} {tuple(value.shape)} {value.dtype}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _legacy_result_files(folder: Path) -> list[str] | None:
    """The files of a result saved before output manifests existed (so that it is replaced, not refused)."""
    try:
        meta = json.loads((folder / "result.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not {"schema_version", "type", "fields"} <= set(meta):
        return None
    return [n for n in ("result.json", "tensors.safetensors") if (folder / n).is_file()]


class Result:
    """Mixin for dataclass results: ``save``/``load``/``to_dict``; subclasses add ``to_frame``/``figure``."""

    kind: ClassVar[str] = "result"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _RESULT_TYPES[_type_name(cls)] = cls

    def to_frame(self):  # pragma: no cover - each subclass defines its table
        raise TypeError(f"{type(self).__name__} defines no table view")

    def figure(self):  # pragma: no cover - each subclass defines its figure
        raise TypeError(f"{type(self).__name__} defines no figure")

    #: rows of the table shown in a notebook (the rest is in ``to_frame()``)
    display_rows: ClassVar[int] = 20

    def _repr_html_(self) -> str:
        """In Jupyter: the result's type and its summary table (the first :attr:`display_rows` rows of
        ``to_frame()``; ``.figure()`` draws it)."""
        import html

        head = f"<b>{html.escape(type(self).__name__)}</b>"
        try:
            df = self.to_frame()
        except (TypeError, NotImplementedError, AttributeError, KeyError, ValueError):
            df = None
        if df is None:
            fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)} if dataclasses.is_dataclass(self) else {}
            rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_short(v))}</td></tr>" for k, v in fields.items())
            return f"<div>{head}<table>{rows}</table></div>"
        more = f"<p>{len(df)} rows; showing {self.display_rows} (<code>.to_frame()</code> has all)</p>" \
            if len(df) > self.display_rows else ""
        return f"<div>{head} <code>.figure()</code> draws it{df.head(self.display_rows).to_html(max_cols=20)}{more}</div>"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (tensors and arrays as nested lists)."""
        def convert(v: Any) -> Any:
            if isinstance(v, Result) and dataclasses.is_dataclass(v):
                return v.to_dict()
            if _is_tensor_like(v):
                return torch.as_tensor(v).detach().cpu().tolist()
            if isinstance(v, dict):
                return {str(k): convert(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [convert(x) for x in v]
            if isinstance(v, (np.floating, np.integer, np.bool_)):
                return v.item()
            if isinstance(v, Path):
                return str(v)
            return v
        return {f.name: convert(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the result to the folder ``path``; returns the folder written.

        A missing or empty folder, or one holding an earlier saved result, is fine (the earlier result's
        files are replaced atomically; files the user added there stay). A file at ``path``, a symbolic
        link, or a non-empty folder this did not write raise :class:`interp.io.OutputError`, unless
        ``overwrite=True`` (which writes into such a folder or the link's target, replacing only files of
        the same names; a file is never replaced by a folder).
        """
        if not dataclasses.is_dataclass(self):
            raise TypeError(f"{type(self).__name__} must be a dataclass to be saved")
        tensors: dict[str, torch.Tensor] = {}
        skeleton = {f.name: _flatten_tensors(f.name, getattr(self, f.name), tensors) for f in dataclasses.fields(self)}
        meta = {"schema_version": SCHEMA_VERSION, "type": _type_name(type(self)),
                "fields": skeleton}
        with output_dir(path, overwrite=overwrite, writer="Result.save", legacy=_legacy_result_files) as tmp:
            save_tensors_json(tmp, tensors, meta, tensor_file="tensors.safetensors", json_file="result.json")
        return Path(path)

    @staticmethod
    def check_save(path: str | Path, overwrite: bool = False) -> Path:
        """Raise :class:`interp.io.OutputError` now if :meth:`save` to ``path`` would be refused.

        For scripts that compute a result for minutes and save it at the end: check the folder first.
        """
        return check_output(path, ("result.json", "tensors.safetensors"), overwrite=overwrite, writer="Result.save",
                            legacy=_legacy_result_files)

    @classmethod
    def load(cls, path: str | Path):
        """Read a result written by :meth:`save` (no pickle: JSON + safetensors).

        A missing ``result.json`` raises :class:`interp.io.MissingFileError` (a ``FileNotFoundError``); a
        malformed file, a missing key, a tensor the JSON refers to but the tensor file lacks, or a tensor
        whose dtype or shape differ from those ``result.json`` recorded at save time raise
        :class:`interp.io.SerializationError` naming the file; another result type raises ``TypeError``.
        """
        path = Path(path)
        tensors, meta = load_tensors_json(path, tensor_file="tensors.safetensors", json_file="result.json",
                                          what="result", tensors_optional=True)
        expected = _type_name(cls)
        if meta.get("type") != expected:
            raise TypeError(f"{path} holds a {meta.get('type')}, not a {expected}")
        if not isinstance(meta.get("fields"), dict):
            raise SerializationError(f"{path / 'result.json'}: missing key 'fields' (the result's values)")
        try:
            values = {k: _restore(v, tensors) for k, v in meta["fields"].items()}
        except KeyError as exc:
            raise SerializationError(f"{path / 'tensors.safetensors'}: missing tensor {exc.args[0]!r} (referred to by "
                                     "result.json)") from None
        except RecursionError:
            raise SerializationError(f"{path / 'result.json'}: values nested too deeply to be a saved result") from None
        except _TensorMismatch as exc:  # a tensor that does not match what was saved: name the folder
            raise SerializationError(f"{path}/{exc}") from None
        return cls(**values)  # type: ignore[call-arg]


@dataclasses.dataclass
class TableResult(Result):
    """A result that is one table: ``rows`` (one dict per row) and an optional ``baseline`` dict of the
    reference numbers the rows are compared with. ``to_frame()`` is the rows as a DataFrame; subclasses add
    ``figure()`` and summaries."""

    rows: list[dict] = dataclasses.field(default_factory=list)
    baseline: dict = dataclasses.field(default_factory=dict)

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows)
