"""Where a reproduction ran, and the fixed numeric settings it ran under.

A record's numbers depend on more than the code and the config: the thread count (reductions split
differently), the BLAS library and the kernel it picked for this CPU (OpenBLAS chooses by CPU, and
``OPENBLAS_CORETYPE`` overrides it), the vector kernels torch dispatches to (AVX2 or AVX512;
``ATEN_CPU_CAPABILITY`` overrides it), and the numeric stack's versions. :func:`provenance` collects them
(threadpoolctl reports the loaded BLAS and OpenMP libraries), with the git commit of the code and whether the
tree was dirty; :func:`numeric_settings` runs a block under a fixed thread count with deterministic settings.
"""
from __future__ import annotations

import contextlib
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from interp.apps.gitstate import CODE_PATHS, git_state, repository_root

#: environment variables that change which kernels or how many threads the numeric libraries use
ENV_PREFIXES = ("OPENBLAS_", "GOTO", "MKL_", "OMP_", "BLIS_", "VECLIB_", "KMP_", "ATEN_", "TORCH_NUM_")
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_simd() -> list[str]:
    """The CPU's vector instruction sets that change which kernels run (``avx``, ``avx2``, ``avx512*``, ``fma``,
    ``amx*``; Linux only)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "sse4_2"))
    except OSError:
        pass
    return []


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def blas_info() -> list[dict[str, Any]]:
    """The BLAS and OpenMP libraries loaded in this process (threadpoolctl): API, library, version, kernel
    (``architecture``), threading layer and thread count."""
    from threadpoolctl import threadpool_info

    keep = ("user_api", "internal_api", "prefix", "version", "architecture", "threading_layer", "num_threads")
    return [{k: lib.get(k) for k in keep if lib.get(k) is not None} | {"file": Path(lib.get("filepath", "")).name}
            for lib in threadpool_info()]


def provenance(threads: int | None = None) -> dict[str, Any]:
    """Where this run ran: git commit and dirty flag, CPU model and count, the run's fixed thread count,
    Python and the numeric stack's versions, the BLAS/OpenMP libraries and kernels in use, and the
    environment settings that choose them."""
    import numpy  # noqa: F401 - loaded so that threadpoolctl sees its BLAS
    import torch

    try:
        import scipy.linalg  # noqa: F401
    except ImportError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count()
    return {
        **git_state(),
        "cpu": cpu_model(), "cpu_simd": cpu_simd(), "cpu_count": os.cpu_count(), "cpus_available": affinity,
        "threads": threads, "torch_threads": torch.get_num_threads(),
        # the vector kernels torch dispatches to (AVX2 vs AVX512 changes float results; ATEN_CPU_CAPABILITY sets it)
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(), "platform": platform.platform(),
        "packages": {d: _version(d) for d in ("numpy", "scipy", "scikit-learn", "torch", "threadpoolctl")},
        "blas": blas_info(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


@contextlib.contextmanager
def numeric_settings(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` threads for torch, BLAS and OpenMP (threadpoolctl) and torch's
    deterministic algorithms (warn-only: an op without a deterministic kernel warns instead of failing);
    the earlier settings come back afterwards."""
    import torch
    from threadpoolctl import threadpool_limits

    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    before = torch.get_num_threads()
    det, det_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(det, warn_only=det_warn)


__all__ = ["CODE_PATHS", "ENV_PREFIXES", "blas_info", "cpu_model", "cpu_simd", "git_state", "numeric_settings", "provenance",
           "repository_root"]
