"""The zoo registry: named model recipes, cached as HF-format folders keyed by a hash of the recipe.

A :class:`ZooEntry` knows how to obtain one model (load it from a package that ships the weights, or
train it locally). Building writes a normal Hugging Face folder (``config.json`` + ``model.safetensors``
+ tokenizer or preprocessor files) under ``cache_dir()/zoo/<name>-<recipe hash>/``:

- the folder is written through :func:`interp.io.replace_dir`, so it appears in one rename once the build
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

Integrity: ``zoo.json`` records, for every file of the build, its size, modification time, a *sample hash*
(SHA-256 over the size, the first and last MiB and 4 KiB of every MiB in between; the whole file up to
4 MiB) and its full SHA-256, plus a checksum of ``zoo.json`` itself. Every load (:func:`path`, hence
``interp.load("zoo:NAME")``) checks sizes and sample hashes (tens of ms for SmolLM2-135M's 517 MiB, see
docs/reliability.md) and computes the full SHA-256 of any file whose modification time changed; :func:`verify` with ``full=True`` (``interp zoo verify``) hashes every file
completely. A mismatch raises :class:`ZooIntegrityError` naming the damaged file and the command that
rebuilds the entry. Folders built before checksums were recorded are adopted on their first load: the
checksums are computed and recorded then (with a warning that the folder itself could not be verified).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from filelock import FileLock

from ..configs import digest
from ..io import atomic_write_json, replace_dir
from ..registry import Registry

#: Environment variable that overrides the cache root (the zoo lives in its ``zoo/`` subfolder).
CACHE_ENV = "INTERP_CACHE_DIR"
#: Name of the metadata file that marks a finished build.
META_FILE = "zoo.json"
#: Entry-point group that declares the zoo's entries, built-in or not: each entry point names a function
#: ``entries() -> Iterable[ZooEntry]`` (a module ``zoo.py``'s ``entries``)
ENTRY_POINT_GROUP = "interp.zoo"

Builder = Callable[[Path, Mapping[str, Any]], "Mapping[str, Any] | None"]

#: Version of the integrity record in ``zoo.json`` (the ``files`` and ``checksum`` fields; 2: sample hash with
#: 4 KiB blocks every MiB). An older record is checked with full hashes once and then rewritten.
INTEGRITY_VERSION = 2
_EDGE = 1 << 20  # the sample hash reads the first and last MiB ...
_STRIDE, _BLOCK, _MAX_BLOCKS = 1 << 20, 1 << 12, 4096  # ... and 4 KiB every MiB in between (at most 4096 blocks)
_SMALL = 4 << 20  # files up to 4 MiB (configs, tokenizers) are hashed completely
_CHUNK = 1 << 22


class ZooIntegrityError(RuntimeError):
    """A cached zoo folder does not match the checksums recorded when it was built."""


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


def _validate(entry: Any, name: str | None) -> None:
    if not isinstance(entry, ZooEntry):
        raise TypeError(f"register expects a ZooEntry, got {type(entry).__name__}")
    if name is not None and name != entry.name:
        raise ValueError(f"zoo entry {entry.name!r} cannot be registered under another name ({name!r})")


def _expand(found: Any, ep_name: str) -> dict[str, ZooEntry]:
    """A zoo plug-in is one kind of object: a function ``entries()`` returning an iterable of :class:`ZooEntry`
    (one entry, or a family). It must return the same objects on every call (several entry points may name it)."""
    if isinstance(found, ZooEntry) or not callable(found):
        raise TypeError(f"a zoo entry point names a function returning ZooEntry objects (a zoo.py module's "
                        f"'entries'), got {type(found).__name__}")
    entries = found()
    if isinstance(entries, ZooEntry) or isinstance(entries, (str, bytes)):
        raise TypeError(f"the entries function must return an iterable of ZooEntry, got {type(entries).__name__}")
    entries = list(entries)
    for e in entries:
        _validate(e, None)
    return {e.name: e for e in entries}


#: the zoo's entries (entry-point group ``interp.zoo``), under the shared registry rules of
#: :class:`interp.registry.Registry`; an entry point provides one entry or a family. Its name is one of the
#: names it provides (then ``zoo:NAME`` resolves without importing any other plug-in) or the family's name
ZOO: Registry[ZooEntry] = Registry("zoo entry", ENTRY_POINT_GROUP, validate=_validate, expand=_expand)
_plugins_loaded = False  # every declared plug-in was imported once (listing needs their family names)


def register(entry: ZooEntry, replace: bool = False) -> ZooEntry:
    """Add ``entry`` to the zoo of this process (``replace=True`` to overwrite an entry of the same name): for
    tests and notebooks. A package declares its entries through the ``interp.zoo`` entry points instead."""
    _validate(entry, None)
    return ZOO.register(entry, entry.name, replace)


def unregister(name: str) -> None:
    """Remove an entry from the registry (its cache stays on disk)."""
    ZOO.unregister(name)


def _load_plugins() -> None:
    """Import the declared plug-ins once (a broken one is a warning naming it; :func:`get_entry` raises why)."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        ZOO.load_all()


def available() -> list[str]:
    """Sorted names of all entries: registered ones and those of the ``interp.zoo`` plug-ins (imported
    once to learn their family names; a plug-in that fails is listed under its entry-point name)."""
    _load_plugins()
    return ZOO.available()


def get_entry(name: str) -> ZooEntry:
    """The registered entry ``name`` (a leading ``zoo:`` is accepted). Unknown names raise a ``KeyError``
    naming the closest entries; a broken plug-in raises :class:`interp.registry.PluginError` with the cause."""
    if not isinstance(name, str):
        raise TypeError(f"zoo entry name must be a string, got {type(name).__name__}")
    if name.startswith("zoo:"):
        name = name[4:]
    return ZOO.get(name)


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
    return digest(recipe(name))


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
    # a folder at the final path without zoo.json cannot come from replace_dir, but never trust it
    final = _folder(entry, digest)
    if final.exists() and not _is_complete(final):
        shutil.rmtree(final, ignore_errors=True)


# ------------------------------------------------------------------------------------ integrity
def _sample_hash(f: Path, size: int) -> str:
    """SHA-256 over the size, the first and last MiB and 4 KiB of every MiB in between (all of a small file).

    Any change to a contiguous MiB of the file (a tensor of a MiB or more, overwritten or zeroed) changes it.
    """
    h = hashlib.sha256(size.to_bytes(8, "little"))
    with open(f, "rb") as fh:
        if size <= _SMALL:
            h.update(fh.read())
        else:
            h.update(fh.read(_EDGE))
            stride = max(_STRIDE, -(-(size - 2 * _EDGE) // _MAX_BLOCKS))
            for pos in range(_EDGE, size - _EDGE, stride):
                fh.seek(pos)
                h.update(fh.read(_BLOCK))
            fh.seek(size - _EDGE)
            h.update(fh.read(_EDGE))
    return h.hexdigest()


def _full_hash(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _meta_checksum(meta: Mapping[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _file_records(folder: Path) -> dict[str, dict[str, Any]]:
    """Size, modification time, sample hash and SHA-256 of every file under ``folder`` except ``zoo.json``."""
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        if rel == META_FILE:
            continue
        st = f.stat()
        out[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sample": _sample_hash(f, st.st_size),
                    "sha256": _full_hash(f)}
    return out


def _seal(meta: dict) -> dict:
    """Add the integrity version and the checksum of ``zoo.json``'s own content."""
    meta = {**meta, "integrity_version": INTEGRITY_VERSION}
    meta["checksum"] = _meta_checksum(meta)
    return meta


def _damaged(name: str, folder: Path, what: str) -> ZooIntegrityError:
    return ZooIntegrityError(f"zoo cache of {name!r} is damaged: {what} (in {folder}). Rebuild it with: "
                             f"interp zoo build {name} --force   (Python: interp.zoo.build({name!r}, force=True))")


def _check_folder(name: str, folder: Path, full: bool) -> tuple[dict, dict[str, int]]:
    """Verify ``folder`` against its ``zoo.json``; return the record and ``{file: mtime_ns}`` of files whose
    modification time changed but whose full hash still matched. Raises :class:`ZooIntegrityError`."""
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except FileNotFoundError:
        raise _damaged(name, folder, f"{META_FILE} is missing") from None
    except (OSError, ValueError) as exc:
        raise _damaged(name, folder, f"{META_FILE} is unreadable or truncated ({exc})") from None
    if not isinstance(meta, dict):
        raise _damaged(name, folder, f"{META_FILE} does not hold a record")
    if "files" not in meta and "checksum" not in meta:
        return meta, {}  # built before checksums were recorded: adopted by the caller
    if meta.get("checksum") != _meta_checksum(meta) or not isinstance(meta.get("files"), dict):
        raise _damaged(name, folder, f"{META_FILE} was modified or truncated (its checksum does not match)")
    outdated = meta.get("integrity_version") != INTEGRITY_VERSION  # other sample hashes: full hashes, once
    touched: dict[str, int] = {}
    for rel, rec in sorted(meta["files"].items()):
        f = folder / rel
        if not f.is_file():
            raise _damaged(name, folder, f"{rel} is missing")
        st = f.stat()
        if st.st_size != rec["size"]:
            raise _damaged(name, folder, f"{rel} has {st.st_size} bytes, {rec['size']} were written (truncated "
                                         "or overwritten)")
        if not outdated and _sample_hash(f, st.st_size) != rec["sample"]:
            raise _damaged(name, folder, f"{rel} has changed (sample hash mismatch)")
        if full or outdated or st.st_mtime_ns != rec["mtime_ns"]:
            if _full_hash(f) != rec["sha256"]:
                raise _damaged(name, folder, f"{rel} has changed (SHA-256 mismatch)")
            if outdated or st.st_mtime_ns != rec["mtime_ns"]:
                touched[rel] = st.st_mtime_ns
    return meta, touched


def _verified(entry: ZooEntry, folder: Path, full: bool = False) -> Path:
    """Verify a complete cache folder; adopt an old one without checksums; record changed mtimes of intact files."""
    meta, touched = _check_folder(entry.name, folder, full)
    if "files" in meta and not touched:
        return folder
    try:
        with FileLock(str(_lock_path(entry, folder.name.rsplit("-", 1)[-1]))):
            meta, touched = _check_folder(entry.name, folder, full)  # another process may have updated it
            if "files" not in meta:
                warnings.warn(f"zoo cache of {entry.name!r} in {folder} was built before checksums were "
                              "recorded; recording them now (the folder itself cannot be verified: rebuild with "
                              f"'interp zoo build {entry.name} --force' to be sure)", stacklevel=3)
                meta = _seal({**meta, "files": _file_records(folder)})
                atomic_write_json(folder / META_FILE, meta)
            elif touched:  # a copied cache or an older record: intact (full hashes matched), record it anew
                files = {k: ({**v, "mtime_ns": touched[k], "sample": _sample_hash(folder / k, v["size"])}
                             if k in touched else v) for k, v in meta["files"].items()}
                atomic_write_json(folder / META_FILE, _seal({**meta, "files": files}))
    except OSError as exc:  # a read-only cache still loads; it just cannot remember what was checked
        warnings.warn(f"zoo cache of {entry.name!r}: could not record checksums in {folder} ({exc})", stacklevel=3)
    return folder


def verify(name: str, full: bool = True) -> Path:
    """Check the cached folder of ``name`` against the checksums recorded at build time; return the folder.

    ``full=True`` (the default here, and ``interp zoo verify``) computes the SHA-256 of every file;
    ``full=False`` is the cheap check every load does (sizes and sample hashes). Raises
    :class:`ZooIntegrityError` naming the damaged file, or ``FileNotFoundError`` when ``name`` is not built.
    """
    entry = get_entry(name)
    folder = _folder(entry, recipe_hash(entry.name))
    if not _is_complete(folder):
        raise FileNotFoundError(f"zoo entry {entry.name!r} is not built (run: interp zoo build {entry.name})")
    return _verified(entry, folder, full=full)


def _lock_path(entry: ZooEntry, digest: str) -> Path:
    lock_dir = zoo_dir() / ".locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    return lock_dir / f"{entry.name}-{digest}.lock"


def build(name: str, force: bool = False) -> Path:
    """Build entry ``name`` into the cache; returns the folder.

    A no-op when already cached (after the cheap integrity check, which raises :class:`ZooIntegrityError`
    on a damaged folder), unless ``force``, which rebuilds and replaces the folder.
    """
    entry = get_entry(name)
    for dep in entry.requires:  # dependencies first, outside this entry's lock
        path(dep)
    digest = recipe_hash(entry.name)
    final = _folder(entry, digest)
    if not force and _is_complete(final):
        return _verified(entry, final)
    with FileLock(str(_lock_path(entry, digest))):  # one lock per recipe
        if not force and _is_complete(final):  # another process built it meanwhile (verified below, unlocked)
            built = False
        else:
            built = True
            _build_locked(entry, digest, final)
    return final if built else _verified(entry, final)


def _build_locked(entry: ZooEntry, digest: str, final: Path) -> None:
    """Run the builder into a temporary folder and swap it in (the caller holds the entry's lock)."""
    _remove_leftovers(entry, digest)
    started = time.time()
    with replace_dir(final) as tmp:
        metrics = entry.builder(tmp, dict(entry.params)) or {}
        meta = {
            "name": entry.name, "recipe_hash": digest, "recipe": recipe(entry.name),
            "architecture": entry.architecture, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "build_seconds": round(time.time() - started, 1), "metrics": dict(metrics),
        }
        if not (tmp / "config.json").is_file():
            raise RuntimeError(f"zoo entry {entry.name!r}: builder wrote no config.json into the folder")
        meta["files"] = _file_records(tmp)
        atomic_write_json(tmp / META_FILE, _seal(meta))


def path(name: str) -> Path:
    """The local HF-format folder of entry ``name``, building (and caching) it first if needed.

    A cached folder is checked against its recorded checksums first (sizes and sample hashes, see the
    module docstring); a damaged one raises :class:`ZooIntegrityError` naming the file and the rebuild command.
    """
    found = cached_path(name)
    return _verified(get_entry(name), found) if found is not None else build(name)
