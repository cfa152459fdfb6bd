"""Resumable stages: the one cache helper of every reproduction recipe (and the key the zoo shares).

A long run (train a model, harvest activations, fit a probe, evaluate) is a sequence of *stages*. Each
stage's output is stored once it is complete and read back when the same run is started again, so an
interrupted run resumes at the first stage that did not finish, and a changed config never reuses a stale
stage:

- a run's folder is ``cache_dir()/stages/<name>/<key>/`` where ``key`` is :func:`interp.configs.digest` of
  the run's config, its code version (:func:`code_version`: a hash of the source files that compute it) and
  the interp version — the same canonical hash that keys the zoo's recipes;
- a stage is stored as ``<stage>/value.json`` (+ ``value.safetensors`` for tensors and arrays, also inside
  dicts, lists and :class:`interp.results.Result` objects) or, for stages that write files, as a folder;
  either is written through the toolkit's atomic writers, so a stage killed half-way leaves nothing that
  reads as finished;
- concurrent runs of one stage (Ray tasks, two shells) serialise on a file lock per stage, and the waiting
  one then reads the finished output instead of computing it again.

Values are read back without pickle (JSON + safetensors); a stored stage is trusted only as far as its own
files go (a damaged file raises :class:`interp.io.SerializationError` naming it; delete the stage folder
or call :meth:`Stages.forget` to recompute).
"""
from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, TypeVar

from filelock import FileLock

from .configs import config_to_dict, digest
from .io import load_tensors_json, replace_dir, save_tensors_json

T = TypeVar("T")

_DONE = ".stage.json"  # written last inside a folder stage


def code_version(*sources: str | ModuleType | Path) -> str:
    """A hash of the source files of ``sources`` (modules or packages, by object or dotted name, or paths).

    A package counts with every ``.py`` file below it, so any edit of the code that computes a stage gives a
    new key (and hence a recomputation) rather than a stale cache hit.
    """
    h = hashlib.sha256()
    files: list[Path] = []
    for src in sources:
        if isinstance(src, Path):
            files += sorted(src.rglob("*.py")) if src.is_dir() else [src]
            continue
        mod = importlib.import_module(src) if isinstance(src, str) else src
        paths = getattr(mod, "__path__", None)
        if paths:  # a package: every module below it
            for p in paths:
                files += sorted(Path(p).rglob("*.py"))
        elif getattr(mod, "__file__", None):
            files.append(Path(mod.__file__))
    for f in sorted(set(files)):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def stages_root() -> Path:
    """Where stages are kept: ``<interp cache dir>/stages`` (``$INTERP_CACHE_DIR`` moves it with the zoo)."""
    from .zoo.registry import cache_dir

    return cache_dir() / "stages"


def _check_stage_name(stage: str) -> str:
    if not isinstance(stage, str) or not stage or stage.startswith(".") or any(c in stage for c in "/\\:"):
        raise ValueError(f"a stage name is a plain token without '/', '\\\\', ':' or a leading dot, got {stage!r}")
    return stage


class Stages:
    """The stages of one run: ``stages("train", fn)`` returns the stored output of stage ``train`` or computes
    ``fn()``, stores it and returns it.

    ``name`` names the run's family (e.g. ``"reproduce/repit"``); ``config`` is the run's typed config (a
    dataclass or JSON value); ``code`` is what :func:`code_version` hashes. ``root`` defaults to
    :func:`stages_root`. ``fresh=True`` ignores (and replaces) stored stages.
    """

    def __init__(self, name: str, config: Any, code: Iterable[str | ModuleType | Path] = (),
                 root: str | Path | None = None, fresh: bool = False) -> None:
        import interp

        if not isinstance(name, str) or not name or ".." in name.split("/") or name.startswith("/"):
            raise ValueError(f"a stages name is a relative token like 'reproduce/repit', got {name!r}")
        self.name = name
        self.config = config_to_dict(config)
        self.code = code_version(*code) if code else ""
        self.key = digest({"name": name, "config": self.config, "code": self.code, "interp": interp.__version__})
        self.folder = Path(root if root is not None else stages_root()) / name / self.key
        self.fresh = fresh
        self.computed: list[str] = []  # stages computed (not read back) by this object, in order

    # ------------------------------------------------------------------ values
    def _stage_dir(self, stage: str) -> Path:
        return self.folder / _check_stage_name(stage)

    def done(self, stage: str) -> bool:
        """Is ``stage`` stored (complete)?"""
        d = self._stage_dir(stage)
        return (d / "value.json").is_file() or (d / _DONE).is_file()

    def __call__(self, stage: str, compute: Callable[[], T]) -> T:
        """The output of ``stage``: read back if stored, else ``compute()`` stored and returned.

        The output may hold JSON values, tensors, numpy arrays and :class:`interp.results.Result` objects,
        in dicts and lists (tuples come back as lists).
        """
        d = self._stage_dir(stage)
        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.folder / f".{stage}.lock")):
            if self.fresh and stage not in self.computed:
                shutil.rmtree(d, ignore_errors=True)
            elif (d / "value.json").is_file():
                return self._read(d)
            t0 = time.perf_counter()
            value = compute()
            self._write(d, value, time.perf_counter() - t0)
            self.computed.append(stage)
            return value

    def _write(self, d: Path, value: Any, seconds: float) -> None:
        from .results import _flatten_tensors

        tensors: dict = {}
        skeleton = _flatten_tensors("value", value, tensors)
        meta = {"schema": "interp.stage", "run": self.name, "key": self.key, "value": skeleton,
                **_timing(seconds)}
        with replace_dir(d) as tmp:
            save_tensors_json(tmp, tensors, meta, tensor_file="value.safetensors", json_file="value.json")

    def _read(self, d: Path) -> Any:
        from .results import _restore

        tensors, meta = load_tensors_json(d, tensor_file="value.safetensors", json_file="value.json",
                                          what=f"stage {d.name!r} of {self.name}", tensors_optional=True)
        return _restore(meta.get("value"), tensors)

    # ------------------------------------------------------------------ folders
    def path(self, stage: str, build: Callable[[Path], None]) -> Path:
        """A stage whose output is a folder of files: ``build(tmp)`` writes into an empty temporary folder
        that becomes ``<run>/<stage>/`` once ``build`` returns (a marker file written last tells a finished
        folder from a killed one). Returns the folder."""
        d = self._stage_dir(stage)
        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.folder / f".{stage}.lock")):
            if (d / _DONE).is_file() and not (self.fresh and stage not in self.computed):
                return d
            with replace_dir(d) as tmp:
                t0 = time.perf_counter()
                build(tmp)
                (tmp / _DONE).write_text(json.dumps({"run": self.name, "key": self.key,
                                                     **_timing(time.perf_counter() - t0)}))
            self.computed.append(stage)
            return d

    def stored_seconds(self, before: float) -> float:
        """Compute time (seconds) of this run's stored stages that were finished before the wall-clock time
        ``before`` (``time.time()``): what a resumed run did not have to redo. Stages stored without timing
        (older versions) count 0."""
        total = 0.0
        if not self.folder.is_dir():
            return total
        for d in self.folder.iterdir():
            marker = d / "value.json" if (d / "value.json").is_file() else d / _DONE
            if not marker.is_file():
                continue
            try:
                meta = json.loads(marker.read_text()) if marker.name == _DONE else _read_timing(marker)
            except (OSError, ValueError):
                continue
            finished, seconds = meta.get("finished"), meta.get("seconds")
            if isinstance(finished, (int, float)) and isinstance(seconds, (int, float)) and finished < before:
                total += float(seconds)
        return total

    def forget(self, stage: str | None = None) -> None:
        """Delete one stored stage (or, with ``None``, every stage of this run)."""
        shutil.rmtree(self._stage_dir(stage) if stage is not None else self.folder, ignore_errors=True)

    def __repr__(self) -> str:
        return f"Stages({self.name!r}, key={self.key})"


def _timing(seconds: float) -> dict[str, float]:
    """What a stage records about its computation: its compute time and when it finished (``time.time()``)."""
    return {"seconds": round(float(seconds), 3), "finished": time.time()}


def _read_timing(value_json: Path) -> dict:
    """``seconds`` / ``finished`` of a stored value stage (its ``value.json`` meta)."""
    meta = json.loads(value_json.read_text())
    return {k: meta.get(k) for k in ("seconds", "finished")} if isinstance(meta, dict) else {}


__all__ = ["Stages", "code_version", "stages_root"]
