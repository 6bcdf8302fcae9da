"""Gangs of local warm workers: one worker of this process's pool per device.

Each rank is a warm worker (``pool``): started once per device slot, it serves slice
after slice. A gang rendezvouses through a FileStore in a private scratch folder (0700,
see ``scratch``): no port another host or user could reach; the slice, the results and
the errors travel over the workers' connections, so nothing is unpickled from a run
directory; gloo binds to the loopback interface. ``gang.watch_gang`` watches them; a
gang that failed, timed out or was cancelled has its workers ended (the next slice
gets fresh ones), a finished one hands them back.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import cloudpickle

from dione.launch.gang import (
    GangError,
    GangInterrupted,
    Placement,
    watch_gang,
    workload_sources,
)
from dione.launch.pool import WarmWorker, local_pool
from dione.launch.scratch import scratch_dir
from dione.launch.worker import Job
from dione.techniques.base import SliceOutcome, SliceSpec

__all__ = ["GangError", "GangInterrupted", "Placement", "collective_timeout", "run_local_gang"]


def collective_timeout() -> float:
    """Seconds a collective or the rendezvous may wait ($DIONE_COLLECTIVE_TIMEOUT)."""
    return float(os.environ.get("DIONE_COLLECTIVE_TIMEOUT", "1800"))


def run_local_gang(
    spec: SliceSpec, placement: Placement, folder: str | Path, timeout: float | None = None,
    cancel: threading.Event | None = None,
) -> list[SliceOutcome]:
    """Run ``spec`` on a gang of warm workers, one per device; each rank's outcome, or a
    GangError. Setting ``cancel`` (from another thread) stops the gang and raises
    GangInterrupted."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pool = local_pool()
    private = scratch_dir("gang")
    workers: list[WarmWorker] = []
    try:
        workers = pool.take(placement.kind, placement.device_ids, placement.threads)
        payload, modules = cloudpickle.dumps(spec), workload_sources()
        jobs = [Job(payload, modules, rank, str(private), str(folder / f"rank{rank}.log"),
                    str(folder / f"progress-{rank}.json"), placement.threads,
                    placement.cores[rank] if placement.cores is not None else None,
                    collective_timeout())
                for rank in range(len(workers))]
        outcomes = watch_gang(workers, jobs, spec, placement, folder,
                              lambda: pool.end(workers), timeout, cancel)
        pool.give_back(workers)
        return outcomes
    except BaseException:
        pool.end(workers)  # Ctrl-C or any launcher error: no rank survives the launcher
        raise
    finally:
        shutil.rmtree(private, ignore_errors=True)
