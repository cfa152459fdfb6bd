"""The Ray engine of :func:`interp.store.harvest` and of multi-checkpoint ``interp audit``.

Harvest: ``num_workers`` Ray actors each load the model once (``interp.load(spec, backend)``) and compute
whole shards, the same function the local engine runs (:func:`interp.store.harvest.compute_shard`), so
the shards are bit-for-bit those of a local run. The driver packs the corpus, hands each actor the token
ids of one shard at a time (at most two shards in flight per actor: bounded memory on both sides), and
keeps the manifest: a worker writes its shard atomically into the store folder, which must therefore
be storage every node can reach (see ``docs/scale.md``), and returns the shard's manifest entry.

Connects to a running cluster when ``RAY_ADDRESS`` is set or ``ray.init`` was called already;
otherwise starts a local one with ``ray.init()``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from interp.store.harvest import HarvestConfig

IN_FLIGHT_PER_WORKER = 2


def ensure_ray():
    """Import ray and connect (``RAY_ADDRESS`` or an existing session, else a local cluster)."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is a dependency of the scale extra
        raise ImportError("engine='ray' needs the 'ray' package (pip install 'interp[scale]')") from exc
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, log_to_driver=False)
    return ray


class _HarvestWorker:
    """Ray actor: loads the model once, then computes and writes shards."""

    def __init__(self, spec: str, backend: str, load_kwargs: dict[str, Any], threads: int) -> None:
        import torch

        import interp
        from interp.progress import set_progress

        torch.set_num_threads(threads)
        set_progress(False)
        self.model = interp.load(spec, backend=backend, **load_kwargs)

    def run(self, folder: str, index: int, first_context: int, contexts: list, names: list[str],
            shapes: dict[str, list[int]], stop: int | None, batch_size: int, dtype: str) -> dict[str, Any]:
        from interp.store.harvest import DTYPES, compute_shard
        from interp.store.manifest import write_shard

        tensors = compute_shard(self.model, contexts, first_context, names, shapes, stop, batch_size, DTYPES[dtype])
        return write_shard(Path(folder), index, first_context, tensors)


def _get(ray, ref):
    """``ray.get(ref)``, with a worker's ``OSError`` (a full disk, a file-size limit) raised as itself: Ray's
    wrapper (``RayTaskError(OSError)``) is an ``OSError`` whose ``errno`` is ``None``, which loses the one-line
    message of ``interp harvest``."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, OSError) and cause.errno is not None:
            raise cause from exc
        raise


def run_shards(todo: Iterator[tuple[int, int, list]], config: "HarvestConfig", *, spec: str, folder: Path,
               names: list[str], shapes: dict[str, list[int]], stop: int | None,
               record: Callable[[int, dict[str, Any], int], None]) -> int:
    """Compute every shard of ``todo`` (``(index, first context id, contexts)``) on ``config.num_workers``
    actors, each loading ``spec`` with ``config.backend`` / ``config.load_kwargs`` and reserving
    ``config.threads_per_worker`` CPUs and ``config.gpus_per_worker`` GPUs; shards are computed in batches of
    ``config.batch_size`` and stored as ``config.dtype``. The per-call things: the store ``folder``, the resolved
    hook ``names``, their feature ``shapes``, the ``stop`` layer, and ``record(index, entry, n_tokens)``, which
    runs on the driver as each shard completes. Returns the number of shards written."""
    ray = ensure_ray()
    num_workers = config.num_workers
    Worker = ray.remote(num_cpus=config.threads_per_worker, num_gpus=config.gpus_per_worker)(_HarvestWorker)
    workers = [Worker.remote(spec, config.backend, dict(config.load_kwargs), config.threads_per_worker)
               for _ in range(num_workers)]
    pending: dict[Any, tuple[int, int, int]] = {}  # ref -> (index, worker, tokens)
    load = [0] * num_workers
    done = 0

    def collect(block_until: int) -> None:
        nonlocal done
        while len(pending) > block_until:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                index, w, n_tokens = pending.pop(ref)
                load[w] -= 1
                record(index, _get(ray, ref), n_tokens)
                done += 1

    try:
        for index, first_context, contexts in todo:
            collect(IN_FLIGHT_PER_WORKER * num_workers - 1)
            w = min(range(num_workers), key=load.__getitem__)
            ref = workers[w].run.remote(str(folder), index, first_context, contexts, names, shapes, stop,
                                        config.batch_size, config.dtype)
            pending[ref] = (index, w, len(contexts) * len(contexts[0].tokens))
            load[w] += 1
        collect(0)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        for worker in workers:
            ray.kill(worker)
    return done


__all__ = ["ensure_ray", "run_shards"]
