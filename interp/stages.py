"""Resumable stages: the one cache helper of every reproduction recipe (and the key the zoo shares).

A long run (train a model, harvest activations, fit a probe, evaluate) is a sequence of *stages*. Each
stage's output is stored once it is complete and read back when the same run is started again, so an
interrupted run resumes at the first stage that did not finish, and a changed config or changed code never
reuses a stale stage:

- a run's folder is ``cache_dir()/stages/<name>/<key>/`` where ``key`` is :func:`interp.configs.digest` of
  the run's config, its code version and the interp version — the same canonical hash that keys the zoo's
  recipes. The code version (:func:`code_version`) hashes the source of the named modules *and of every
  module of the project they import* (a static walk of their ``import`` statements, function-level imports
  included, restricted to the ``interp`` packages), so an edit of library code (``next_token_loss`` in
  ``interp/model.py``) gives a new key to exactly the runs whose code reaches it. Without ``code`` the
  module that creates the :class:`Stages` is the root of that walk;
- a stage is stored as ``<stage>/value.json`` (+ ``value.safetensors`` for tensors and arrays, also inside
  dicts, lists and :class:`interp.results.Result` objects) or, for stages that write files, as a folder;
  either is written through the toolkit's atomic writers, so a stage killed half-way leaves nothing that
  reads as finished, and the temporaries such a kill leaves are removed by the next run;
- every stored stage holds its full key (run name, stage name, config, code version, interp version) and a
  checksum of its value, its tensors or each of its files. A read checks both; a stage that fails (edited
  value, flipped tensor, stages swapped or copied in from another config, an edited, added or deleted file
  of a folder stage, a damaged file) is recomputed with a :class:`StageWarning` naming it, or, with
  ``on_mismatch="refuse"``, raises :class:`StageIntegrityError` naming it;
- concurrent runs of one stage (Ray tasks, two shells) serialise on a file lock per stage, and the waiting
  one then reads the finished output instead of computing it again.

Values are read back without pickle (JSON + safetensors).
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, TypeVar

from filelock import FileLock, Timeout

from .configs import config_to_dict, digest
from .io import SerializationError, atomic_write_text, load_tensors_json, replace_dir, save_tensors_json

T = TypeVar("T")

_DONE = ".stage.json"  # written last inside a folder stage
_SCHEMA = "interp.stage"
_SCHEMA_VERSION = 2  # 2: full key and checksums stored, checked on every read
#: the top-level packages whose modules count as the project's code in :func:`code_version`
PROJECT_PACKAGES: tuple[str, ...] = ("interp",)
#: project modules left out of code versions: the reproduction framework (``interp.apps.reproduce``, and its
#: deprecated alias ``interp.reproduce``) and this module run no stage's computation (they store, judge and report it; a change of the stored format bumps ``_SCHEMA_VERSION``)
FRAMEWORK_MODULES: tuple[str, ...] = ("interp.apps.reproduce", "interp.reproduce", "interp.stages")
ON_MISMATCH = ("recompute", "refuse")


class StageIntegrityError(RuntimeError):
    """A stored stage does not match its key or its checksum (and ``on_mismatch="refuse"``)."""


class StageWarning(UserWarning):
    """A stored stage failed its check and is recomputed."""


# ============================================================================ code versions
_IMPORTS_BY_HASH: dict[str, tuple[tuple[int, str, tuple[str, ...]], ...]] = {}
_SPECS: dict[str, tuple[str | None, tuple[str, ...] | None]] = {}


def _under(name: str, packages: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _in_project(name: str) -> bool:
    return _under(name, PROJECT_PACKAGES) and not _under(name, FRAMEWORK_MODULES)


def _locate(name: str) -> tuple[str | None, tuple[str, ...] | None]:
    """``(source file, package search locations)`` of module ``name`` without importing it (its parent
    packages only where a plain path search cannot find it); ``(None, None)`` when it is not a module."""
    if name in _SPECS:
        return _SPECS[name]
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__spec__", None) is not None:
        f, paths = getattr(mod, "__file__", None), getattr(mod, "__path__", None)
        found = (f, tuple(paths) if paths is not None else None)
    else:
        spec = None
        parent, _, _ = name.rpartition(".")
        locations: tuple[str, ...] | None = ()
        if parent:
            _, locations = _locate(parent)
            if locations:
                spec = importlib.machinery.PathFinder.find_spec(name, list(locations))
        # the plain path search cannot see the folders installed under the namespace (probes/ ->
        # interp.probes): ask the import system, which imports nothing but the (project's top) parent
        if spec is None and locations is not None and (not parent or parent in PROJECT_PACKAGES):
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError, AttributeError):
                spec = None
        if spec is None:
            found = (None, None)
        else:
            origin = spec.origin if spec.has_location else None
            locs = spec.submodule_search_locations
            found = (origin, tuple(locs) if locs is not None else None)
    _SPECS[name] = found
    return found


def _imports(source: bytes, digest_: str) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """The import statements of a module's source (function-level ones too): ``(level, module, names)``."""
    if digest_ not in _IMPORTS_BY_HASH:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(0, a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                found.append((node.level, node.module or "", tuple(a.name for a in node.names)))
        _IMPORTS_BY_HASH[digest_] = tuple(found)
    return _IMPORTS_BY_HASH[digest_]


def _resolve(level: int, module: str, package: str) -> str | None:
    if level == 0:
        return module
    base = package.split(".") if package else []
    if level - 1 > len(base) or not base:
        return None
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def import_closure(*roots: str) -> dict[str, Path]:
    """Module name -> source file of ``roots`` (dotted module names) and of every module of the project
    (:data:`PROJECT_PACKAGES`) they import, directly or through other project modules, found by reading their
    ``import`` statements (nothing is imported; parent packages count, as Python runs their ``__init__``)."""
    files: dict[str, Path] = {}
    todo = [n for r in roots for n in _with_parents(r) if _in_project(n) or n == r]
    while todo:
        name = todo.pop()
        if name in files:
            continue
        origin, locations = _locate(name)
        if origin is None or not origin.endswith(".py"):
            continue
        path = Path(origin)
        files[name] = path
        data = path.read_bytes()
        package = name if locations is not None else name.rpartition(".")[0]
        for level, mod, names in _imports(data, hashlib.sha256(data).hexdigest()):
            target = _resolve(level, mod, package)
            if not target:
                continue
            for cand in [target, *(f"{target}.{n}" for n in names if n != "*")]:
                if _in_project(cand):
                    todo += [p for p in _with_parents(cand) if _in_project(p) and p not in files]
    return files


def code_files(*sources: str | ModuleType | Path) -> dict[str, Path]:
    """The files :func:`code_version` hashes, by a machine-independent name (module name, or the file name
    for paths). A module counts with the project modules it imports (:func:`import_closure`); a package
    counts with every ``.py`` module below it and their imports; a :class:`~pathlib.Path` is just that file
    (or every ``.py`` file below that folder)."""
    out: dict[str, Path] = {}
    roots: list[str] = []
    for src in sources:
        if isinstance(src, Path):
            for f in (sorted(src.rglob("*.py")) if src.is_dir() else [src]):
                out[f"file:{f.relative_to(src) if src.is_dir() else f.name}"] = f
            continue
        name = src if isinstance(src, str) else src.__name__
        roots.append(name)
        origin, locations = _locate(name)
        if origin is None and isinstance(src, ModuleType) and getattr(src, "__file__", None):
            out[f"module:{name}"] = Path(src.__file__)  # a module outside the project (a script, a test)
            _SPECS[name] = (src.__file__, None)
        if locations:  # a package: every module below it
            for loc in locations:
                for f in sorted(Path(loc).rglob("*.py")):
                    rel = f.relative_to(loc).with_suffix("")
                    parts = [p for p in rel.parts if p != "__init__"]
                    roots.append(".".join([name, *parts]))
    for mod, f in import_closure(*roots).items():
        out[f"module:{mod}"] = f
    return out


def code_version(*sources: str | ModuleType | Path) -> str:
    """A hash of the source of ``sources`` (modules or packages, by object or dotted name, or paths) and of
    every project module they import (:func:`code_files`), so any edit of the code that computes a stage —
    the recipe's own or the library's — gives a new key (and hence a recomputation) rather than a stale
    cache hit. The hash names files by module, not by path: the same code gives the same version on any
    machine. A module already imported counts with its source as first hashed in this process."""
    h = hashlib.sha256()
    for name, f in sorted(code_files(*sources).items()):
        h.update(name.encode() + b"\x00")
        h.update(_source_digest(name, f))
    return h.hexdigest()[:16]


#: digests of the source of modules this process has imported, taken the first time they are hashed
_LOADED_DIGESTS: dict[str, bytes] = {}


def _source_digest(name: str, f: Path) -> bytes:
    """The sha256 of a module's source. For a module this process has imported, the source as first hashed
    here is kept for the process: the code it runs is the code it imported, whatever the file says later
    (another edit of the file gives a new key in the next process, not half-way through a run)."""
    mod = sys.modules.get(name.partition(":")[2]) if name.startswith("module:") else None
    loaded = mod is not None and getattr(mod, "__file__", None) and Path(mod.__file__) == f
    key = str(f)
    if loaded and key in _LOADED_DIGESTS:
        return _LOADED_DIGESTS[key]
    digest_ = hashlib.sha256(f.read_bytes()).digest()
    if loaded:
        _LOADED_DIGESTS[key] = digest_
    return digest_


def stages_root() -> Path:
    """Where stages are kept: ``<interp cache dir>/stages`` (``$INTERP_CACHE_DIR`` moves it with the zoo)."""
    from .zoo.registry import cache_dir

    return cache_dir() / "stages"


def _check_stage_name(stage: str) -> str:
    if not isinstance(stage, str) or not stage or stage.startswith(".") or any(c in stage for c in "/\\:"):
        raise ValueError(f"a stage name is a plain token without '/', '\\\\', ':' or a leading dot, got {stage!r}")
    return stage


def _caller_module(depth: int = 2) -> ModuleType | str | None:
    """The module that called the caller (the default root of a :class:`Stages` run's code)."""
    frame = inspect.currentframe()
    try:
        for _ in range(depth):
            frame = frame.f_back if frame is not None else None
        if frame is None:
            return None
        name = frame.f_globals.get("__name__")
        mod = sys.modules.get(name) if name else None
        return mod if mod is not None else name
    finally:
        del frame


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _folder_manifest(folder: Path) -> dict[str, str]:
    """``relative path -> sha256`` of every file of a folder stage (its marker excepted)."""
    out = {}
    for here, dirs, names in os.walk(folder):
        dirs.sort()
        for n in sorted(names):
            p = Path(here) / n
            rel = p.relative_to(folder).as_posix()
            if rel != _DONE:
                out[rel] = "link:" + os.readlink(p) if p.is_symlink() else _file_digest(p)
    return out


def _skeleton_digest(skeleton: Any) -> str:
    from .io import _json_default

    text = json.dumps(skeleton, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(text.encode()).hexdigest()


def _signature(d: Path) -> tuple:
    """Sizes and modification times of a stage's files: a verified stage is not hashed again in this process
    while they are unchanged."""
    sig = []
    for here, dirs, names in os.walk(d):
        dirs.sort()
        for n in sorted(names):
            try:
                st = os.stat(Path(here) / n, follow_symlinks=False)
            except OSError:
                continue
            sig.append((os.path.relpath(Path(here) / n, d), st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(sig)


#: stage folders verified in this process, with the signature of their files then
_VERIFIED: dict[str, tuple] = {}


class Stages:
    """The stages of one run: ``stages("train", fn)`` returns the stored output of stage ``train`` or computes
    ``fn()``, stores it and returns it.

    ``name`` names the run's family (e.g. ``"reproduce/repit"``); ``config`` is the run's typed config (a
    dataclass or JSON value); ``code`` is what :func:`code_version` hashes (default: the module that creates
    this object, with the project modules it imports; ``()``: no code). ``root`` defaults to
    :func:`stages_root`. ``fresh=True`` ignores (and replaces) stored stages. ``on_mismatch``: what a read
    does with a stored stage that fails its key or checksum check: ``"recompute"`` (with a
    :class:`StageWarning`) or ``"refuse"`` (:class:`StageIntegrityError`); ``None`` reads
    ``$INTERP_STAGES_ON_MISMATCH`` (default ``recompute``).
    """

    def __init__(self, name: str, config: Any, code: Iterable[str | ModuleType | Path] | None = None,
                 root: str | Path | None = None, fresh: bool = False, on_mismatch: str | None = None) -> None:
        import interp

        if not isinstance(name, str) or not name or ".." in name.split("/") or name.startswith("/"):
            raise ValueError(f"a stages name is a relative token like 'reproduce/repit', got {name!r}")
        on_mismatch = on_mismatch or os.environ.get("INTERP_STAGES_ON_MISMATCH") or "recompute"
        if on_mismatch not in ON_MISMATCH:
            raise ValueError(f"on_mismatch must be one of {', '.join(ON_MISMATCH)}, got {on_mismatch!r}")
        if code is None:
            caller = _caller_module()
            code = [caller] if caller is not None else []
        code = list(code)
        self.name = name
        self.config = config_to_dict(config)
        self.code = code_version(*code) if code else ""
        self.identity = {"name": name, "config": self.config, "code": self.code, "interp": interp.__version__}
        self.key = digest(self.identity)
        self.folder = Path(root if root is not None else stages_root()) / name / self.key
        self.fresh = fresh
        self.on_mismatch = on_mismatch
        self.computed: list[str] = []  # stages computed (not read back) by this object, in order
        self.recomputed: list[tuple[str, str]] = []  # (stage, why) of stored stages that failed their check
        self._sweep_all()

    # ------------------------------------------------------------------ integrity
    def _what(self, stage: str) -> str:
        return f"stage {stage!r} of {self.name} ({self.folder})"

    def _check_meta(self, stage: str, meta: Any) -> None:
        """Raise :class:`SerializationError` unless ``meta`` is this run's stage ``stage`` (full key)."""
        if not isinstance(meta, dict) or meta.get("schema") != _SCHEMA or meta.get("schema_version") != _SCHEMA_VERSION:
            raise SerializationError("written by another version of interp.stages (no key or checksum to check)")
        if meta.get("stage") != stage:
            raise SerializationError(f"it holds stage {meta.get('stage')!r} (stages swapped or copied)")
        if meta.get("key") != self.key or meta.get("identity") != json.loads(json.dumps(self.identity)):
            theirs = meta.get("identity") if isinstance(meta.get("identity"), dict) else {}
            parts = [k for k in ("name", "config", "code", "interp") if theirs.get(k) != self.identity.get(k)]
            raise SerializationError(f"its key is another run's (differs in: {', '.join(parts) or 'key'})")

    def _verify(self, stage: str) -> str | None:
        """Why stored stage ``stage`` cannot be used (``None``: it is intact and this run's; or not stored)."""
        d = self._stage_dir(stage)
        sig = _signature(d)
        if _VERIFIED.get(str(d)) == sig:
            return None
        try:
            if (d / "value.json").is_file():
                meta = json.loads((d / "value.json").read_text(encoding="utf-8"))
                self._check_meta(stage, meta)
                if _skeleton_digest(meta.get("value")) != meta.get("checksum", {}).get("value"):
                    raise SerializationError("value.json's value does not match its checksum (edited or damaged)")
                t = d / "value.safetensors"
                want = meta.get("checksum", {}).get("tensors")
                have = _file_digest(t) if t.is_file() else None
                if have != want:
                    raise SerializationError("value.safetensors does not match its checksum"
                                             + (" (missing)" if have is None else " (edited or damaged)"))
                extra = sorted(set(os.listdir(d)) - {"value.json", "value.safetensors"})
                if extra:
                    raise SerializationError(f"unexpected file(s) {extra}")
            elif (d / _DONE).is_file():
                meta = json.loads((d / _DONE).read_text(encoding="utf-8"))
                self._check_meta(stage, meta)
                files = _folder_manifest(d)
                want = meta.get("files")
                if not isinstance(want, dict) or files != want:
                    want = want if isinstance(want, dict) else {}
                    changed = sorted(k for k in set(files) & set(want) if files[k] != want[k])
                    missing, added = sorted(set(want) - set(files)), sorted(set(files) - set(want))
                    raise SerializationError("its files do not match their checksums: "
                                             + "; ".join(f"{w} {v[:5]}" + ("..." if len(v) > 5 else "")
                                                         for w, v in (("edited", changed), ("deleted", missing),
                                                                      ("added", added)) if v))
            else:
                return None
        except (OSError, ValueError, RecursionError, SerializationError, AttributeError) as exc:
            return str(exc) or type(exc).__name__
        _VERIFIED[str(d)] = sig
        return None

    def _reject(self, stage: str, why: str) -> None:
        """A stored stage failed its check: refuse, or warn and delete it (it is recomputed)."""
        msg = f"{self._what(stage)} failed its check: {why}"
        if self.on_mismatch == "refuse":
            raise StageIntegrityError(msg + "; delete it (or run without refusing) to recompute it")
        warnings.warn(msg + "; recomputing it", StageWarning, stacklevel=3)
        shutil.rmtree(self._stage_dir(stage), ignore_errors=True)
        _VERIFIED.pop(str(self._stage_dir(stage)), None)
        self.recomputed.append((stage, why))

    # ------------------------------------------------------------------ leftovers
    def _sweep(self, stage: str) -> None:
        """Remove what a killed build of ``stage`` left (its temporary folder, a replaced folder not yet
        deleted); called while holding the stage's lock, so no live build owns them."""
        if not self.folder.is_dir():
            return
        for p in self.folder.glob(f".{stage}.*"):
            rest = p.name[len(stage) + 2:]
            if p.is_dir() and (rest.endswith(".tmp") and "." not in rest[:-4] or rest.startswith("old.")):
                shutil.rmtree(p, ignore_errors=True)

    def _sweep_all(self) -> None:
        """Remove the leftovers of killed builds of every stage of this run whose lock is free."""
        if not self.folder.is_dir():
            return
        stages = set()
        for p in self.folder.iterdir():
            if p.name.startswith(".") and p.is_dir() and (p.name.endswith(".tmp") or ".old." in p.name):
                base = p.name[1:-4] if p.name.endswith(".tmp") else p.name[1:].split(".old.")[0]
                stages.add(base.rsplit(".", 1)[0] if p.name.endswith(".tmp") else base)
        for stage in stages:
            try:
                with FileLock(str(self.folder / f".{stage}.lock"), timeout=0):
                    self._sweep(stage)
            except Timeout:
                continue  # a live build of that stage

    # ------------------------------------------------------------------ values
    def _stage_dir(self, stage: str) -> Path:
        return self.folder / _check_stage_name(stage)

    def done(self, stage: str) -> bool:
        """Is ``stage`` stored, complete and intact (its key and checksums checked), and not to be recomputed
        (``fresh``)? A stored stage that fails the check is handled as on a read (deleted and reported, or
        refused)."""
        d = self._stage_dir(stage)
        if not ((d / "value.json").is_file() or (d / _DONE).is_file()):
            return False
        if self.fresh and stage not in self.computed:
            return False  # a fresh run recomputes it
        why = self._verify(stage)
        if why is not None:
            self._reject(stage, why)
            return False
        return True

    def __call__(self, stage: str, compute: Callable[[], T]) -> T:
        """The output of ``stage``: read back if stored (and intact), else ``compute()`` stored and returned.

        The output may hold JSON values, tensors, numpy arrays and :class:`interp.results.Result` objects,
        in dicts and lists (tuples come back as lists).
        """
        d = self._stage_dir(stage)
        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.folder / f".{stage}.lock")):
            self._sweep(stage)
            if self.fresh and stage not in self.computed:
                shutil.rmtree(d, ignore_errors=True)
            elif (d / "value.json").is_file() or (d / _DONE).is_file():
                why = self._verify(stage) if (d / "value.json").is_file() else "a folder stage read as a value"
                if why is None:
                    try:
                        return self._read(d)
                    except (SerializationError, KeyError, ValueError, TypeError, RecursionError) as exc:
                        why = f"unreadable ({exc})"
                self._reject(stage, why)
            t0 = time.perf_counter()
            value = compute()
            self._write(d, stage, value, time.perf_counter() - t0)
            self.computed.append(stage)
            return value

    def _write(self, d: Path, stage: str, value: Any, seconds: float) -> None:
        from .io import _json_default
        from .results import _flatten_tensors

        tensors: dict = {}
        skeleton = _flatten_tensors("value", value, tensors)
        skeleton = json.loads(json.dumps(skeleton, default=_json_default))  # as it reads back
        meta = {"schema": _SCHEMA, "schema_version": _SCHEMA_VERSION, "run": self.name, "stage": stage,
                "key": self.key, "identity": self.identity, "value": skeleton, **_timing(seconds)}
        with replace_dir(d) as tmp:
            t_file, _ = save_tensors_json(tmp, tensors, meta, tensor_file="value.safetensors", json_file="value.json")
            meta["checksum"] = {"value": _skeleton_digest(skeleton),
                                "tensors": _file_digest(t_file) if t_file is not None else None}
            atomic_write_text(tmp / "value.json", json.dumps(meta, indent=2, default=_json_default))
        _VERIFIED[str(d)] = _signature(d)

    def _read(self, d: Path) -> Any:
        from .results import _restore

        tensors, meta = load_tensors_json(d, tensor_file="value.safetensors", json_file="value.json",
                                          what=f"stage {d.name!r} of {self.name}", tensors_optional=True)
        return _restore(meta.get("value"), tensors)

    # ------------------------------------------------------------------ folders
    def path(self, stage: str, build: Callable[[Path], None]) -> Path:
        """A stage whose output is a folder of files: ``build(tmp)`` writes into an empty temporary folder
        that becomes ``<run>/<stage>/`` once ``build`` returns (a marker file written last, with the stage's
        key and a checksum of every file, tells a finished folder from a killed or altered one). Returns the
        folder."""
        d = self._stage_dir(stage)
        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.folder / f".{stage}.lock")):
            self._sweep(stage)
            if (d / _DONE).is_file() or (d / "value.json").is_file():
                if self.fresh and stage not in self.computed:
                    pass
                else:
                    why = self._verify(stage) if (d / _DONE).is_file() else "a value stage read as a folder"
                    if why is None:
                        return d
                    self._reject(stage, why)
            with replace_dir(d) as tmp:
                t0 = time.perf_counter()
                build(tmp)
                marker = {"schema": _SCHEMA, "schema_version": _SCHEMA_VERSION, "run": self.name, "stage": stage,
                          "key": self.key, "identity": self.identity, "files": _folder_manifest(tmp),
                          **_timing(time.perf_counter() - t0)}
                atomic_write_text(tmp / _DONE, json.dumps(marker, indent=2))
            _VERIFIED[str(d)] = _signature(d)
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
            except (OSError, ValueError, RecursionError):
                continue
            if not isinstance(meta, dict):
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


__all__ = ["ON_MISMATCH", "PROJECT_PACKAGES", "StageIntegrityError", "StageWarning", "Stages", "code_files",
           "code_version", "import_closure", "stages_root"]
