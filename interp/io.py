"""Safe writing: nothing half-written where a complete output is expected, and nothing of the user's lost.

Two layers:

* :func:`atomic_write_bytes` / :func:`atomic_write_text` / :func:`atomic_write_json` write one file via a
  temporary sibling and an atomic rename; :func:`replace_dir` swaps a whole folder in with one rename and is
  meant only for folders this program owns entirely (the zoo cache).
* :func:`output_dir` (also available as :func:`atomic_dir`, its former name) is **the writer rule** for
  every output folder a user names (``Result.save``, ``SteeringVector.save``, ``interp audit --out``, the
  ``save`` methods of the analyzers and paper models):

  - everything is written into a temporary folder first and moved into place only when complete; a failure
    (or an interruption) leaves the previous output exactly as it was and no temporary folder behind;
  - a folder it writes is marked by a manifest, ``.interp-output.json``, listing the files it wrote. On a
    re-run it replaces only those files: anything the user added to the folder (``notes.txt``, ``mydata/``,
    even a file inside one of its sub-folders) is left alone;
  - the manifest records which writer made the folder (``Result.save``, ``SteeringVector.save``,
    ``interp audit``, ``interp reproduce`` ...); a writer refuses (:class:`OutputError`) a folder another kind
    of writer made unless ``overwrite=True`` (``--force``), and then replaces that output by the same rule
    as its own (the files the manifest lists; the user's files stay);
  - it refuses (:class:`OutputError`) to write into a non-empty folder it did not write, and to replace a
    file of the user's that happens to have the name of one of its outputs, unless asked
    (``overwrite=True``, ``--force``); even then only same-named files are replaced, nothing else is removed;
  - it never turns a file into a folder, never replaces a folder of the user's by a file, and never
    replaces a symbolic link at the output path: it refuses, or (``overwrite=True``) writes into the link's
    target and leaves the link in place;
  - parent folders it had to create are removed again when the write fails.

  :func:`check_output` applies the same checks without writing, so commands can refuse before slow work.

One serialisation path for tensors plus facts (results, steering vectors, detectors, scalers, checkpoints):
:func:`save_tensors_json` writes ``<stem>.safetensors`` + ``<stem>.json`` (or one ``.safetensors`` file with
the facts in its metadata, :func:`save_tensors`), each file atomically; :func:`load_tensors_json` /
:func:`load_tensors` read them back without pickle and check what the caller needs (keys of the JSON,
names, shapes and dtypes of the tensors), raising :class:`SerializationError` that names the file and the
problem. Writers that own a folder call them inside :func:`output_dir`. Loaders of saved modules build them
with :func:`build_checked`, which checks the saved configuration against the file's tensors on the ``meta``
device first, so an inflated or edited configuration is refused before anything is allocated.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

#: Name of the manifest that marks a folder written by :func:`output_dir`.
MANIFEST = ".interp-output.json"
MANIFEST_SCHEMA = "interp.output"
MANIFEST_VERSION = 1
_NEW_PREFIX = ".interp-new-"
_OLD_PREFIX = ".interp-old-"

#: Callable recognising an output written before manifests existed: ``legacy(folder)`` returns the
#: relative paths of the files it wrote there, or ``None`` when the folder is not such an output.
LegacyFiles = Callable[[Path], "Sequence[str] | None"]


class OutputError(ValueError):
    """An output path cannot be written without replacing or deleting something that is not ours."""


# ------------------------------------------------------------------------------ single files
def _make_parents(folder: Path) -> list[Path]:
    """``mkdir -p folder``; return the folders it created, deepest first (to remove them after a failure)."""
    created: list[Path] = []
    p = folder
    while not p.exists() and not p.is_symlink():
        created.append(p)
        if p.parent == p:
            break
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    return created


def _umask() -> int:
    """The process umask, read without changing it where the system allows (Linux), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mkdtemp(parent: Path, prefix: str, suffix: str = "") -> Path:
    """A new uniquely named folder in ``parent`` with the usual permissions (``tempfile.mkdtemp`` makes it
    private, mode 0700, which an output folder created by renaming it would keep)."""
    import secrets

    for _ in range(100):
        d = parent / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {parent}")


def _remove_if_empty(folders: Iterable[Path]) -> None:
    for d in folders:
        with contextlib.suppress(OSError):
            d.rmdir()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and an atomic rename.

    Parent folders are created as needed and removed again when the write fails.
    """
    path = Path(path)
    created = _make_parents(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private (0600)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    except BaseException:
        _remove_if_empty(created)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default))


def _json_default(obj: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().tolist()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


@contextlib.contextmanager
def replace_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces ``path`` as a whole, in one rename.

    Only for folders this program owns entirely, where nobody keeps files of their own (the zoo cache):
    everything in an existing folder at ``path`` is replaced. Every output a user names goes through
    :func:`output_dir` instead. A symbolic link or a file at ``path`` is refused. On an exception (or an
    interruption) the temporary folder and any parent folders created for it are removed and ``path`` is
    untouched.
    """
    path = Path(path)
    if path.is_symlink():
        raise OutputError(f"{str(path)!r} is a symbolic link; refusing to replace it with a folder")
    if path.exists() and not path.is_dir():
        raise OutputError(f"{str(path)!r} exists and is not a folder; refusing to replace a file with a folder")
    created = _make_parents(path.parent)
    try:
        tmp = _mkdtemp(path.parent, f".{path.name}.", ".tmp")
        try:
            yield tmp
            if path.exists():
                old = path.with_name(f".{path.name}.old.{os.getpid()}")
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except BaseException:
        _remove_if_empty(created)
        raise


# ------------------------------------------------------------------------- the writer rule
def read_manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of a folder written by :func:`output_dir`, or ``None`` (missing or unreadable)."""
    f = Path(folder) / MANIFEST
    try:
        meta = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or meta.get("schema") != MANIFEST_SCHEMA:
        return None
    files, dirs = meta.get("files"), meta.get("dirs", [])
    if not isinstance(files, list) or not isinstance(dirs, list):
        return None
    if not all(isinstance(x, str) and _safe_rel(x) for x in [*files, *dirs]):
        return None
    return meta


def legacy_by_json(json_file: str, files: Sequence[str], key: str, value: Any = None) -> LegacyFiles:
    """A ``legacy`` recogniser (see :func:`output_dir`) for writers that mark their output with a JSON file:
    the folder is theirs when ``json_file`` holds a JSON object whose ``key`` equals ``value`` (is present,
    when ``value`` is ``None``); it wrote those of ``files`` that exist there. Never raises."""

    def recognise(folder: Path) -> list[str] | None:
        try:
            meta = json.loads((Path(folder) / json_file).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(meta, dict) or key not in meta or (value is not None and meta[key] != value):
            return None
        return [f for f in files if (Path(folder) / f).is_file()]

    return recognise


def _safe_rel(rel: str) -> bool:
    p = Path(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts


def _ancestors(rel: str) -> list[str]:
    """``"a/b/c.txt"`` -> ``["a", "a/b"]``."""
    parts = Path(rel).parts
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _through_link(root: Path, rel: str) -> bool:
    """Does ``root/rel`` pass through a symbolic link inside ``root``?"""
    return any((root / d).is_symlink() for d in _ancestors(rel))


def _is_leftover(name: str) -> bool:
    return name.startswith(_NEW_PREFIX) or name.startswith(_OLD_PREFIX)


class _Target:
    """The checked state of an output path: where to write, and which files there are ours."""

    def __init__(self, path: str | os.PathLike, overwrite: bool, writer: str, legacy: LegacyFiles | None,
                 former: Sequence[str] = ()) -> None:
        if not isinstance(path, (str, os.PathLike)) or str(path) == "":
            raise OutputError(f"output path must be a non-empty path, got {path!r}")
        p = Path(path).expanduser().absolute()
        self.requested = p
        if p.is_symlink():
            if not overwrite:
                raise OutputError(f"output path {str(p)!r} is a symbolic link (to {os.readlink(p)!r}); refusing to "
                                  "replace it: pass the target folder itself, or overwrite=True (--force) to write "
                                  "into the link's target")
            p = p.resolve()
        self.path, self.overwrite, self.writer = p, overwrite, writer
        if p.exists() and not p.is_dir():
            raise OutputError(f"output path {str(p)!r} exists and is not a folder; refusing to replace a file with "
                              "a folder (even with overwrite): choose another path or remove the file yourself")
        ancestor = p.parent
        while not ancestor.exists() and not ancestor.is_symlink():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise OutputError(f"output folder {str(p)!r} is not writable: {str(ancestor)!r} is not a folder")
        if not os.access(p if p.is_dir() else ancestor, os.W_OK | os.X_OK):
            raise OutputError(f"output folder {str(p)!r} is not writable (no write permission in "
                              f"{str(p if p.is_dir() else ancestor)!r})")
        self.exists = p.is_dir()
        self.owned: set[str] = set()
        self.owned_dirs: set[str] = set()
        if not self.exists:
            return
        entries = [e for e in os.listdir(p) if not _is_leftover(e)]
        manifest = read_manifest(p)
        if manifest is not None:
            other = manifest.get("writer")
            # a name this writer had before (the shared default "interp"): its own output if `legacy` says so
            adopted = other in tuple(former) and legacy is not None and legacy(p) is not None
            if other != writer and not overwrite and not adopted:
                who = f"{other}" if isinstance(other, str) and other else "an unknown writer (its manifest names none)"
                raise OutputError(f"output folder {str(p)!r} holds output written by {who}, not by {writer} (see its "
                                  f"{MANIFEST}); refusing to replace another writer's output: choose another folder, "
                                  "or pass overwrite=True (--force) to replace that output (the files its manifest "
                                  "lists are replaced; files you added stay)")
            self.owned = set(manifest["files"])
            self.owned_dirs = set(manifest.get("dirs", []))
        elif legacy is not None and entries and (found := legacy(p)) is not None:
            self.owned = {str(x) for x in found if _safe_rel(str(x))}
            self.owned_dirs = {d for x in self.owned for d in _ancestors(x)}
        elif entries and not overwrite:
            why = "its manifest is unreadable" if (p / MANIFEST).exists() else f"it has no {MANIFEST}"
            raise OutputError(f"output folder {str(p)!r} is not empty and was not written by {writer} ({why}); "
                              "refusing to mix its files with new output: choose a new or empty folder, or pass "
                              "overwrite=True (--force) to write into it (your files stay; only files with the "
                              "names of the new outputs are replaced)")

    def conflicts(self, rels: Iterable[str]) -> list[str]:
        """What under the output would block writing ``rels`` (files; folders end in ``/``), and why."""
        out: list[str] = []
        for rel in sorted(rels):
            is_dir, rel = rel.endswith("/"), rel.rstrip("/")
            blocked = False
            for d in _ancestors(rel) + ([rel] if is_dir else []):  # the folders it needs
                q = self.path / d
                if q.is_symlink():
                    out.append(f"{d} (a symbolic link where a folder is needed)")
                elif q.exists() and not q.is_dir() and d not in self.owned:
                    out.append(f"{d} (a file where a folder is needed)")
                else:
                    continue
                blocked = True
                break
            q = self.path / rel
            if blocked or is_dir:
                continue
            if q.is_dir() and not q.is_symlink():
                out.append(f"{rel} (a folder where a file is needed)")
            elif (q.exists() or q.is_symlink()) and rel not in self.owned and not self.overwrite:
                out.append(f"{rel} (a file this program did not write)")
        return out

    def refuse_conflicts(self, rels: Iterable[str]) -> None:
        bad = self.conflicts(rels)
        if bad:
            hint = "" if self.overwrite else " (overwrite=True / --force replaces files of the same name)"
            raise OutputError(f"refusing to write into {str(self.path)!r}: it would replace or remove "
                              f"{', '.join(bad)}; choose another folder or move them away{hint}")


def check_output(path: str | os.PathLike, names: Sequence[str] = (), *, overwrite: bool = False,
                 writer: str = "interp", legacy: LegacyFiles | None = None, former: Sequence[str] = ()) -> Path:
    """Check, without writing anything, that :func:`output_dir` could write ``names`` to ``path``.

    ``names`` are relative paths of the files the writer is going to create, and of folders with a
    trailing ``/`` (top-level names are enough to catch the common conflicts early). Returns the folder
    that would be written (the target of a symbolic link when ``overwrite=True``); raises
    :class:`OutputError` with the reason otherwise.
    """
    target = _Target(path, overwrite, writer, legacy, former)
    target.refuse_conflicts(names)
    return target.path


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, *, overwrite: bool = False, writer: str = "interp",
               legacy: LegacyFiles | None = None, former: Sequence[str] = ()) -> Iterator[Path]:
    """Yield an empty temporary folder; on success its files become the output at ``path``.

    The rules are in the module docstring. ``writer`` names the kind of writer (recorded in the manifest
    and compared on the next write: a folder of another writer is refused unless ``overwrite``); ``legacy``
    recognises outputs of this writer from before manifests existed (so they are replaced, not refused);
    ``former`` lists names this writer recorded before it had its own (the shared default ``"interp"``): a
    manifest naming one of them counts as this writer's when ``legacy`` recognises the folder.
    On an exception nothing at ``path`` changes (files replaced during the final moves are restored).
    """
    target = _Target(path, overwrite, writer, legacy, former)
    p = target.path
    created = _make_parents(p.parent)
    try:
        if target.exists:  # staging inside the folder keeps every move on one file system
            tmp = _mkdtemp(p, _NEW_PREFIX)
        else:
            tmp = _mkdtemp(p.parent, f".{p.name}{_NEW_PREFIX}")
    except OSError as exc:
        _remove_if_empty(created)
        raise OutputError(f"output folder {str(p)!r} is not writable: {exc.strerror or exc}") from None
    try:
        yield tmp
        files, dirs = _walk(tmp)
        if MANIFEST in files:
            raise OutputError(f"{MANIFEST} is reserved for the output manifest; a writer may not create it")
        manifest = {"schema": MANIFEST_SCHEMA, "schema_version": MANIFEST_VERSION, "writer": writer,
                    "files": sorted(files)}
        if not target.exists:
            manifest["dirs"] = sorted(dirs)
            atomic_write_json(tmp / MANIFEST, manifest)
            try:
                os.rename(tmp, p)  # fails rather than replace if something appeared there meanwhile
            except OSError as exc:
                if not p.exists():
                    raise
                raise OutputError(f"{str(p)!r} appeared while this output was being written (another writer?); "
                                  "nothing there was replaced: run again to write into it") from exc
            return
        target.refuse_conflicts(files)
        _commit_into(target, tmp, files, dirs, manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_if_empty(created)
        raise


def atomic_dir(path: str | os.PathLike, *, overwrite: bool = False, writer: str = "interp",
               legacy: LegacyFiles | None = None, former: Sequence[str] = ()):
    """The writer rule under its historical name: exactly :func:`output_dir` (kept so that every writer that
    used ``atomic_dir`` follows the rule)."""
    return output_dir(path, overwrite=overwrite, writer=writer, legacy=legacy, former=former)


def _walk(root: Path) -> tuple[list[str], list[str]]:
    """Relative paths of the files (and symbolic links) and of the folders under ``root``."""
    files: list[str] = []
    dirs: list[str] = []
    for here, subdirs, names in os.walk(root):
        rel = Path(here).relative_to(root)
        for d in list(subdirs):
            if (Path(here) / d).is_symlink():
                subdirs.remove(d)
                names.append(d)
            else:
                dirs.append((rel / d).as_posix())
        files.extend((rel / n).as_posix() for n in names)
    return files, dirs


def _commit_into(target: _Target, tmp: Path, files: list[str], dirs: list[str], manifest: dict) -> None:
    """Move the new files from ``tmp`` into the existing folder, replacing only owned (or allowed) files."""
    p = target.path
    backup = _mkdtemp(p, _OLD_PREFIX)
    moved_out: list[str] = []  # files moved from p into the backup (old outputs, replaced files)
    moved_in: list[str] = []  # new files moved into p
    made: list[str] = []  # folders created in p
    try:
        # 1. move the old outputs and the files being replaced out of the way (into the backup); never
        #    through a symbolic link the user put in place of one of our folders
        for rel in sorted((target.owned | set(files)) - {MANIFEST}):
            q = p / rel
            if _through_link(p, rel) or not (q.exists() or q.is_symlink()) or (q.is_dir() and not q.is_symlink()):
                continue
            (backup / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(q, backup / rel)
            moved_out.append(rel)
        # 2. create the folders and move the new files in
        for d in sorted(dirs, key=lambda s: len(Path(s).parts)):
            if not (p / d).is_dir():
                (p / d).mkdir()
                made.append(d)
        for rel in sorted(files):
            os.replace(tmp / rel, p / rel)
            moved_in.append(rel)
        # 3. old output folders that are now empty go (a folder holding a file of the user's stays)
        stale = sorted(target.owned_dirs - set(dirs), key=lambda s: -len(Path(s).parts))
        _remove_if_empty(p / d for d in stale if not _through_link(p, d) and not (p / d).is_symlink())
        # 4. the manifest last: from here on the new output is the recorded one
        manifest["dirs"] = sorted(d for d in target.owned_dirs | set(dirs)
                                  if (p / d).is_dir() and not (p / d).is_symlink())
        atomic_write_json(p / MANIFEST, manifest)
    except BaseException:
        for rel in reversed(moved_in):
            with contextlib.suppress(OSError):
                os.replace(p / rel, tmp / rel)
        for d in sorted(made, key=lambda s: -len(Path(s).parts)):
            with contextlib.suppress(OSError):
                (p / d).rmdir()
        for rel in moved_out:
            with contextlib.suppress(OSError):
                (p / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(backup / rel, p / rel)
        shutil.rmtree(backup, ignore_errors=True)
        raise
    # 5. clean up: the backup, the staging folder, and what killed earlier runs left behind
    shutil.rmtree(backup, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    for e in os.listdir(p):
        if _is_leftover(e) and (p / e).is_dir() and not (p / e).is_symlink():
            shutil.rmtree(p / e, ignore_errors=True)


# ------------------------------------------------------------------ tensors + JSON (one path)
#: key of the JSON facts in a single ``.safetensors`` file's metadata (:func:`save_tensors`)
SAFETENSORS_META_KEY = "interp.meta"


class SerializationError(ValueError):
    """A saved file is missing, malformed or lacks what its reader needs (the message names the file)."""


class MissingFileError(SerializationError, FileNotFoundError):
    """A file of a saved object is not there (also a ``FileNotFoundError``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _tensor_dict(tensors: "Mapping[str, Any]") -> dict:
    """CPU, contiguous, detached tensors; a storage shared between entries is copied (safetensors refuses it)."""
    import torch

    out: dict = {}
    seen: set[tuple[int, int]] = set()
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError(f"tensor names must be strings, got {k!r}")
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"tensor {k!r} is a {type(v).__name__}, not a torch.Tensor")
        t = v.detach().cpu().contiguous()
        ptr = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if t.numel() and ptr in seen:
            t = t.clone()
        seen.add(ptr)
        out[k] = t
    return out


def _paths(path: str | os.PathLike, stem: str | None, tensor_file: str | None = None,
           json_file: str | None = None) -> tuple[Path, Path]:
    """``(tensor file, JSON file)``: ``folder/stem.*`` when ``stem`` is given, else ``path`` itself as the stem;
    ``tensor_file`` / ``json_file`` name a file inside the folder ``path`` explicitly."""
    p = Path(path)
    base = p / stem if stem is not None else (p.with_suffix("") if p.suffix in (".json", ".safetensors") else p)
    return (p / tensor_file if tensor_file is not None else base.with_name(base.name + ".safetensors"),
            p / json_file if json_file is not None else base.with_name(base.name + ".json"))


def _meta_json(meta: "Mapping[str, Any]", indent: int | None) -> str:
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a mapping (a JSON object), got {type(meta).__name__}")
    return json.dumps(dict(meta), indent=indent, default=_json_default)


def save_tensors_json(path: str | os.PathLike, tensors: "Mapping[str, Any]", meta: "Mapping[str, Any]", *,
                      stem: str | None = None, tensor_file: str | None = None, json_file: str | None = None,
                      indent: int | None = 2) -> tuple[Path, Path | None]:
    """Write ``tensors`` (``{name: Tensor}``) to a safetensors file and ``meta`` (JSON-ready) to a JSON file.

    Files: ``path/<stem>.safetensors`` + ``path/<stem>.json`` with ``stem``; ``path.safetensors`` +
    ``path.json`` without; ``tensor_file`` / ``json_file`` name either file inside the folder ``path``
    explicitly (formats with fixed names, e.g. sae-lens's ``sae_weights.safetensors`` + ``cfg.json``). No
    tensors: no tensor file (and ``None`` returned for it). Each file is written atomically; writers of a
    whole folder call this inside :func:`output_dir`. Returns ``(tensor file, JSON file)``.
    """
    from safetensors.torch import save

    t_path, j_path = _paths(path, stem, tensor_file, json_file)
    text = _meta_json(meta, indent)
    td = _tensor_dict(tensors)
    if td:
        atomic_write_bytes(t_path, save(td))
    atomic_write_text(j_path, text)
    return (t_path if td else None), j_path


def _read_json(f: Path, what: str) -> dict:
    try:
        text = f.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"{f}: missing (expected the JSON file of a saved {what})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SerializationError(f"{f}: unreadable ({exc})") from None
    return _json_object(text, f, what)


def _json_object(text: str, f: Path, what: str, place: str = "") -> dict:
    """``text`` parsed as a JSON object; otherwise a :class:`SerializationError` naming ``f`` (and ``place``)."""
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise SerializationError(f"{f}: malformed JSON{place} ({exc}); the saved {what} is damaged or truncated") from None
    except RecursionError:
        raise SerializationError(f"{f}: JSON{place} nested too deeply to be the saved {what}; the file is damaged "
                                 "or not one this program wrote") from None
    if not isinstance(meta, dict):
        raise SerializationError(f"{f}:{place} holds a JSON {type(meta).__name__}, not the object of a saved {what}")
    return meta


def _read_safetensors(f: Path, what: str, device: str) -> tuple[dict, dict]:
    """Tensors and raw metadata of one safetensors file (safe: no pickle)."""
    from safetensors import safe_open

    if not f.is_file():
        raise MissingFileError(f"{f}: missing (expected the tensor file of a saved {what})")
    try:
        with safe_open(str(f), framework="pt", device=device) as fh:
            raw = dict(fh.metadata() or {})
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types; name the file
        raise SerializationError(f"{f}: not a readable safetensors file ({type(exc).__name__}: {exc}); the saved "
                                 f"{what} is damaged or truncated") from None
    return tensors, raw


def load_torch(path: str | os.PathLike, *, what: str = "object") -> Any:
    """A file written by ``torch.save`` (optimizer and scheduler states), read with
    ``torch.load(weights_only=True)`` onto the CPU: a pickle that names anything outside torch's allow-list of
    tensor and container types is refused, and no code from the file runs.

    Every way the read can fail is a :class:`SerializationError` naming the file (a missing file a
    :class:`MissingFileError`): the refusal of such a pickle (``pickle.UnpicklingError``), a truncated or
    empty file (``EOFError``, ``RuntimeError``), a file that is no torch archive, nesting that exhausts the
    recursion limit. The message is one line (the unpickler's own runs to a dozen).
    """
    import torch

    f = Path(path)
    if not f.is_file():
        raise MissingFileError(f"{f}: missing (expected the torch file of a saved {what})")
    try:
        with open(f, "rb") as fh:
            return torch.load(fh, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch.load raises many types (UnpicklingError, EOFError, ...)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise SerializationError(f"{f}: not a readable torch file of a saved {what} ({type(exc).__name__}: "
                                 f"{first}); it is damaged, truncated or was not written by this program "
                                 "(only tensors and plain containers are loaded)") from None


def check_meta(meta: "Mapping[str, Any]", required: "Iterable[str]", where: str | os.PathLike) -> None:
    """Raise :class:`SerializationError` naming ``where`` unless every key of ``required`` is in ``meta``."""
    missing = [k for k in required if k not in meta]
    if missing:
        raise SerializationError(f"{where}: missing key{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(map(repr, missing))} (has: {', '.join(map(repr, meta)) or 'nothing'})")


def check_tensors(tensors: "Mapping[str, Any]", spec: "Mapping[str, Any] | Iterable[str]",
                  where: str | os.PathLike) -> None:
    """Raise :class:`SerializationError` naming ``where`` unless ``tensors`` has every name of ``spec``, with
    its shape and dtype when ``spec`` is ``{name: (shape, dtype)}`` (``None`` entries accept anything)."""
    spec = dict(spec) if isinstance(spec, Mapping) else {k: (None, None) for k in spec}
    missing = [k for k in spec if k not in tensors]
    if missing:
        raise SerializationError(f"{where}: missing tensor{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(map(repr, missing))}")
    for k, (shape, dtype) in spec.items():
        t = tensors[k]
        if shape is not None and (t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape))):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise SerializationError(f"{where}: tensor {k!r} has shape {list(t.shape)}, expected {want}")
        if dtype is not None:
            allowed = tuple(dtype) if isinstance(dtype, (tuple, list, set)) else (dtype,)
            if t.dtype not in allowed:
                raise SerializationError(f"{where}: tensor {k!r} has dtype {t.dtype}, expected "
                                         f"{' or '.join(map(str, allowed))}")


def load_tensors_json(path: str | os.PathLike, *, stem: str | None = None, tensor_file: str | None = None,
                      json_file: str | None = None, what: str = "object", required: "Iterable[str]" = (),
                      tensors: "Mapping[str, Any] | Iterable[str]" = (), tensors_optional: bool = False,
                      device: str = "cpu") -> tuple[dict, dict]:
    """Read what :func:`save_tensors_json` wrote: ``(tensors, meta)``, with safe loading only.

    ``what`` names the object in errors; ``required`` are keys ``meta`` must have; ``tensors`` the tensor
    names it must have (``{name: (shape, dtype)}`` to check shapes and dtypes too). The JSON file is
    read first (a missing one is the usual sign of a wrong folder). ``tensors_optional``: a missing tensor
    file reads as no tensors (writers that skip an empty one). Errors: :class:`SerializationError`
    naming the file and the problem (missing, malformed JSON, not a safetensors file, a missing key or
    tensor, a wrong shape or dtype).
    """
    t_path, j_path = _paths(path, stem, tensor_file, json_file)
    meta = _read_json(j_path, what)
    check_meta(meta, required, j_path)
    if tensors_optional and not t_path.exists():
        found: dict = {}
    else:
        found, _ = _read_safetensors(t_path, what, device)
    check_tensors(found, tensors, t_path)
    return found, meta


def build_checked(factory: "Callable[[], Any]", state: "Mapping[str, Any]", where: str | os.PathLike, *,
                  optional: "Iterable[str]" = ()):
    """``factory()`` with ``state`` loaded into it, after checking, on the ``meta`` device (nothing allocated),
    that the module the saved configuration declares has exactly the file's tensors with their shapes.

    For loaders of saved modules (a config JSON beside a safetensors file): an inflated or edited config
    (``hidden: 10**6`` beside a few KB of weights) is refused before anything is allocated, with a
    :class:`SerializationError` naming ``where``, the tensor and both shapes; so is a config the module
    cannot be built from. ``optional``: tensors a file may lack (they keep the module's initial values;
    for files from before an option existed). Returns the module (train/eval mode as built).
    """
    import torch

    try:
        with torch.device("meta"):
            skeleton = factory()
    except (TypeError, ValueError, RuntimeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        raise SerializationError(f"{where}: the saved configuration does not describe a valid model "
                                 f"({type(exc).__name__}: {exc})") from None
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    optional = set(optional)
    missing = sorted(set(expected) - set(state) - optional)
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise SerializationError(f"{where}: the weights do not match the saved configuration (missing "
                                 f"{missing[:8]}, unexpected {unexpected[:8]})")
    for k, v in state.items():
        if not isinstance(v, torch.Tensor):
            raise SerializationError(f"{where}: {k!r} is a {type(v).__name__}, not a tensor")
        if tuple(v.shape) != expected[k]:
            raise SerializationError(f"{where}: tensor {k!r} has shape {list(v.shape)} but the saved configuration "
                                     f"declares {list(expected[k])}; the configuration or the weights were changed")
    del skeleton
    module = factory()
    module.load_state_dict(dict(state), strict=not optional)
    return module


def load_json(path: str | os.PathLike, *, what: str = "object", required: "Iterable[str]" = ()) -> dict:
    """A JSON object file (the facts of a saved object without tensors), checked like :func:`load_tensors_json`."""
    meta = _read_json(Path(path), what)
    check_meta(meta, required, path)
    return meta


def save_tensors(path: str | os.PathLike, tensors: "Mapping[str, Any]", meta: "Mapping[str, Any] | None" = None) -> Path:
    """One ``.safetensors`` file holding ``tensors`` and, in its metadata, ``meta`` as JSON (atomic write)."""
    from safetensors.torch import save

    extra = None if meta is None else {SAFETENSORS_META_KEY: _meta_json(meta, None)}
    return atomic_write_bytes(path, save(_tensor_dict(tensors), metadata=extra))


def load_tensors(path: str | os.PathLike, *, what: str = "object", required: "Iterable[str]" = (),
                 tensors: "Mapping[str, Any] | Iterable[str]" = (), device: str = "cpu") -> tuple[dict, dict]:
    """Read a file written by :func:`save_tensors` (or any safetensors file): ``(tensors, meta)``, checked
    like :func:`load_tensors_json` (``meta`` is ``{}`` when the file carries none)."""
    f = Path(path)
    found, raw = _read_safetensors(f, what, device)
    meta = _json_object(raw[SAFETENSORS_META_KEY], f, what, " in its metadata") if SAFETENSORS_META_KEY in raw else {}
    check_meta(meta, required, f)
    check_tensors(found, tensors, f)
    return found, meta


__all__ = ["MANIFEST", "MissingFileError", "OutputError", "SerializationError", "atomic_dir", "atomic_write_bytes", "atomic_write_json", "atomic_write_text",
           "build_checked", "check_meta", "check_output", "check_tensors", "legacy_by_json", "load_json", "load_tensors", "load_tensors_json", "load_torch", "output_dir",
           "read_manifest", "replace_dir", "save_tensors", "save_tensors_json"]
