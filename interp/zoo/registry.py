"""The zoo registry: named model recipes, cached as HF-format folders keyed by a hash of the recipe.

A :class:`ZooEntry` knows how to obtain one model (load it from a package that ships the weights, or
train it locally). Building writes a normal Hugging Face folder (``config.json`` + ``model.safetensors``
+ tokenizer or preprocessor files) under ``cache_dir()/zoo/<name>-<recipe hash>/``:

- the folder is written through :func:`interp.io.atomic_dir`, so it appears in one rename once the build
  (including its sanity checks) has succeeded; an interrupted or failed build leaves nothing at that
  path, and a build killed outright leaves only a hidden ``.<name>-<hash>.*.tmp`` sibling, which the next
  build of that entry removes;
- the last file written inside is ``zoo.json`` (recipe, hash, build metrics); a folder without it is
  never treated as a cache hit;
- the recipe is the entry's name, version, hyper-parameters, the versions of the packages it reads
  weights from, and the recipe hashes of the entries it is built from, so changing any of them gives a
  new hash and hence a rebuild;
- concurrent builds of one recipe (several processes or pytest-xdist workers) serialise on a file lock
  per entry and recipe hash, and the waiting ones then find the finished folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from filelock import FileLock

from ..io import atomic_dir, atomic_write_json

#: Environment variable that overrides the cache root (the zoo lives in its ``zoo/`` subfolder).
CACHE_ENV = "INTERP_CACHE_DIR"
#: Name of the metadata file that marks a finished build.
META_FILE = "zoo.json"
#: Entry-point group through which other packages register zoo entries (a callable returning entries).
ENTRY_POINT_GROUP = "interp.zoo"

Builder = Callable[[Path, Mapping[str, Any]], "Mapping[str, Any] | None"]


@dataclass(frozen=True)
class ZooEntry:
    """One named recipe.

    ``builder(out_dir, params)`` writes the HF-format folder into ``out_dir`` (an empty temporary
    folder) and may return a JSON-serialisable dict of build metrics (stored in ``zoo.json``). It must
    raise if its own sanity check fails, so that a wrong model is never cached.
    """

    name: str
    description: str
    source: str
    architecture: str
    size: str
    builder: Builder
    version: int = 1
    params: Mapping[str, Any] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    slow: bool = False

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in "/\\: ") or self.name.startswith("."):
            raise ValueError(f"zoo entry name must be a plain non-empty token without '/', ':' or spaces, got {self.name!r}")
        if not callable(self.builder):
            raise TypeError(f"zoo entry {self.name!r}: builder must be callable, got {type(self.builder).__name__}")


@dataclass(frozen=True)
class ZooInfo:
    """What :func:`info` reports about an entry."""

    name: str
    description: str
    source: str
    architecture: str
    size: str
    path: Path | None
    recipe_hash: str
    recipe: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    slow: bool = False


_REGISTRY: dict[str, ZooEntry] = {}
_lock = threading.RLock()
_plugins_loaded = False


def register(entry: ZooEntry, replace: bool = False) -> ZooEntry:
    """Add ``entry`` to the zoo (``replace=True`` to overwrite an entry of the same name)."""
    if not isinstance(entry, ZooEntry):
        raise TypeError(f"register expects a ZooEntry, got {type(entry).__name__}")
    with _lock:
        if entry.name in _REGISTRY and not replace and _REGISTRY[entry.name] is not entry:
            raise ValueError(f"zoo entry {entry.name!r} is already registered (pass replace=True to override)")
        _REGISTRY[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove an entry from the registry (its cache stays on disk)."""
    with _lock:
        _REGISTRY.pop(name, None)


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        found = obj() if callable(obj) and not isinstance(obj, ZooEntry) else obj
        for entry in ([found] if isinstance(found, ZooEntry) else list(found)):
            if entry.name not in _REGISTRY:
                register(entry)


def available() -> list[str]:
    """Sorted names of all registered entries."""
    _load_plugins()
    return sorted(_REGISTRY)


def get_entry(name: str) -> ZooEntry:
    """The registered entry ``name`` (a leading ``zoo:`` is accepted)."""
    if not isinstance(name, str):
        raise TypeError(f"zoo entry name must be a string, got {type(name).__name__}")
    if name.startswith("zoo:"):
        name = name[4:]
    _load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown zoo entry {name!r}; available: {', '.join(available())}") from None


def cache_dir() -> Path:
    """Root of the interp cache: ``$INTERP_CACHE_DIR`` if set, else the user cache dir (platformdirs)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("interp"))


def zoo_dir() -> Path:
    return cache_dir() / "zoo"


def _package_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


def recipe(name: str) -> dict:
    """The full recipe of an entry: what its cache key is computed from."""
    entry = get_entry(name)
    return {
        "name": entry.name,
        "version": entry.version,
        "params": json.loads(json.dumps(dict(entry.params), sort_keys=True, default=str)),
        "packages": {p: _package_version(p) for p in entry.packages},
        "requires": {r: recipe_hash(r) for r in entry.requires},
    }


def recipe_hash(name: str) -> str:
    """First 16 hex digits of the SHA-256 of the canonical JSON recipe."""
    blob = json.dumps(recipe(name), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _folder(entry: ZooEntry, digest: str) -> Path:
    return zoo_dir() / f"{entry.name}-{digest}"


def _is_complete(folder: Path) -> bool:
    return folder.is_dir() and (folder / META_FILE).is_file()


def _read_meta(folder: Path) -> dict:
    try:
        return json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return {}


def cached_path(name: str) -> Path | None:
    """The finished cache folder of ``name`` for its current recipe, or ``None`` if not built."""
    entry = get_entry(name)
    folder = _folder(entry, recipe_hash(entry.name))
    return folder if _is_complete(folder) else None


def info(name: str) -> ZooInfo:
    """Description, source, architecture, size, cache state and recipe hash of an entry."""
    entry = get_entry(name)
    digest = recipe_hash(entry.name)
    folder = _folder(entry, digest)
    done = _is_complete(folder)
    meta = _read_meta(folder) if done else {}
    return ZooInfo(
        name=entry.name, description=entry.description, source=entry.source,
        architecture=entry.architecture, size=entry.size, path=folder if done else None,
        recipe_hash=digest, recipe=recipe(entry.name), metrics=dict(meta.get("metrics") or {}), slow=entry.slow,
    )


def _remove_leftovers(entry: ZooEntry, digest: str) -> None:
    """Delete temporary folders that killed builds of this entry left behind (caller holds the lock)."""
    root = zoo_dir()
    if not root.is_dir():
        return
    stem = f".{entry.name}-{digest}."
    for p in root.iterdir():
        if p.name.startswith(stem) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
    # a folder at the final path without zoo.json cannot come from atomic_dir, but never trust it
    final = _folder(entry, digest)
    if final.exists() and not _is_complete(final):
        shutil.rmtree(final, ignore_errors=True)


def build(name: str, force: bool = False) -> Path:
    """Build entry ``name`` into the cache (a no-op when already cached, unless ``force``); returns the folder."""
    entry = get_entry(name)
    for dep in entry.requires:  # dependencies first, outside this entry's lock
        path(dep)
    digest = recipe_hash(entry.name)
    final = _folder(entry, digest)
    if not force and _is_complete(final):
        return final
    lock_dir = zoo_dir() / ".locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_dir / f"{entry.name}-{digest}.lock")):  # one lock per recipe
        if not force and _is_complete(final):
            return final
        _remove_leftovers(entry, digest)
        started = time.time()
        with atomic_dir(final) as tmp:
            metrics = entry.builder(tmp, dict(entry.params)) or {}
            meta = {
                "name": entry.name, "recipe_hash": digest, "recipe": recipe(entry.name),
                "architecture": entry.architecture, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "build_seconds": round(time.time() - started, 1), "metrics": dict(metrics),
            }
            if not (tmp / "config.json").is_file():
                raise RuntimeError(f"zoo entry {entry.name!r}: builder wrote no config.json into the folder")
            atomic_write_json(tmp / META_FILE, meta)
    return final


def path(name: str) -> Path:
    """The local HF-format folder of entry ``name``, building (and caching) it first if needed."""
    found = cached_path(name)
    return found if found is not None else build(name)
