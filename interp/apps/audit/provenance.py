"""Where an audited checkpoint comes from: weights fingerprint, path, training step, config hash, software.

:func:`provenance` is what ``results.json`` records under ``"provenance"``; :func:`checkpoint_step` reads a
checkpoint's training step from ``trainer_state.json`` (``global_step``, as the Hugging Face ``Trainer`` writes
it) or from the folder name (``checkpoint-500``, ``step_500``, ``step500``, ``ckpt-3``, ``run-a.step20``, ``500``).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from interp.model import Model

#: a folder name that carries a step: ``checkpoint-500``, ``ckpt_3``, ``step500``, ``global_step-7``, ``iter-9``, ``500``
_STEP_NAME = re.compile(r"^(?:.*[-_.])?(?:checkpoint|ckpt|step|global_step|iter)[-_]?(\d+)$|^(\d+)$", re.IGNORECASE)


def checkpoint_folder(spec: str) -> Path | None:
    """The local folder a model spec names (a ``zoo:`` entry's cache folder), or ``None`` (a hub name)."""
    if spec.startswith("zoo:"):
        try:
            from interp import zoo

            return Path(zoo.path(spec[4:]))
        except Exception:  # noqa: BLE001 - informative only
            return None
    path = Path(spec)
    return path.resolve() if path.is_dir() else None


def checkpoint_step(spec: str) -> int | None:
    """The training step of a checkpoint folder: ``trainer_state.json``'s ``global_step``, else a number that
    ends the folder's name; ``None`` when neither says."""
    folder = checkpoint_folder(spec) if not spec.startswith("zoo:") else None
    if folder is None:
        return None
    state = folder / "trainer_state.json"
    if state.is_file():
        try:
            step = json.loads(state.read_text(encoding="utf-8")).get("global_step")
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                return step
        except (OSError, ValueError, AttributeError):
            pass
    m = _STEP_NAME.match(folder.name)
    return int(m.group(1) or m.group(2)) if m else None


def config_hash(model: Model, folder: Path | None) -> str | None:
    """SHA-256 of the checkpoint's ``config.json`` (its bytes), else of the loaded config (sorted JSON)."""
    if folder is not None and (folder / "config.json").is_file():
        return hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    hf = getattr(model, "hf_model", None)
    cfg = getattr(hf, "config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        return None
    text = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def git_commit() -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the interp checkout this code runs from (:func:`interp.apps.gitstate.git_state`;
    ``(None, None)`` outside a git checkout). ``dirty``: the code differs from the commit."""
    from interp.apps.gitstate import git_state

    state = git_state()
    return state["commit"], state["dirty"]


def self_check(model: Model) -> dict[str, Any] | None:
    """The load self-check's outcome (``model.self_check.to_dict()``) when the model carries one, else ``None``."""
    check = getattr(model, "self_check", None)
    if check is None or not callable(getattr(check, "to_dict", None)):
        return None
    try:
        return dict(check.to_dict())
    except Exception as exc:  # noqa: BLE001 - recorded, never fatal
        return {"passed": getattr(check, "passed", None), "error": f"{type(exc).__name__}: {exc}"}


def provenance(model: Model, spec: str | None, data_hash: str | None, step: int | None = None) -> dict[str, Any]:
    """``{"weights_fingerprint", "checkpoint": {"spec", "path", "step", "config_hash"}, "interp_version",
    "git_commit", "git_dirty", "data_hash", "self_check"}`` of an audited model (``step`` overrides the one read
    from the checkpoint)."""
    import interp
    from interp.store import weights_fingerprint

    spec = spec or str(getattr(model, "source", "") or "")
    folder = checkpoint_folder(spec) if spec else None
    commit, dirty = git_commit()
    return {"weights_fingerprint": weights_fingerprint(model),
            "checkpoint": {"spec": spec or None, "path": None if folder is None else str(folder),
                           "step": step if step is not None else (checkpoint_step(spec) if spec else None),
                           "config_hash": config_hash(model, folder)},
            "interp_version": interp.__version__, "git_commit": commit, "git_dirty": dirty, "data_hash": data_hash,
            "self_check": self_check(model)}


__all__ = ["provenance", "checkpoint_step", "checkpoint_folder", "config_hash", "git_commit", "self_check"]
