"""Which commit the code runs from, and whether the code differs from it: provenance that both applications
record (``interp audit``'s ``provenance`` and ``interp reproduce``'s records)."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

#: folders whose changes make the tree dirty for a record (the code a recipe can run); docs, tests and
#: notebooks do not change a record's numbers
CODE_PATHS = ("interp", "probes", "steering", "editing", "dynamics", "models", "benchmarks", "pyproject.toml",
              "setup.py", "constraints.txt")


def repository_root() -> Path:
    """The folder that holds the ``interp`` package (the repository root of a source checkout)."""
    import interp

    return Path(interp.__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repository_root()), *args], capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """``{"commit", "dirty", "dirty_files"}`` of the checkout the code runs from (``commit`` ``None`` outside
    a git checkout). ``dirty``: a tracked file of the code (:data:`CODE_PATHS`) differs from the commit, or an
    untracked one exists there; records made so cannot be traced to a commit."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "dirty_files": []}
    status = _git("status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS) or ""
    files = sorted(p for p in (line[3:].strip() for line in status.splitlines() if line.strip())
                   if "__pycache__" not in p)
    return {"commit": commit.strip(), "dirty": bool(files), "dirty_files": files[:50]}


__all__ = ["CODE_PATHS", "git_state", "repository_root"]
