"""Gangs of local warm workers: one worker of this process's pool per device.

Each rank is a warm worker (``pool``): started once per device slot, it serves slice
after slice. A gang rendezvouses through a FileStore in a private scratch folder (0700,
see ``scratch``): no port another host or user could reach; the slice, the results and
the errors travel over the workers' connections, so nothing is unpickled from a run
directory. gloo's own connections listen on the loopback interface: no other host
reaches them, but another user of this machine could connect, as gloo asks for no
credentials; share a machine only with users you trust. ``gang.watch_gang`` watches them; a
gang that failed, timed out or was cancelled has its workers ended (the next slice
gets fresh ones), a finished one hands them back.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import cloudpickle

from dione.launch.gang import (
    GangError,
    GangInterrupted,
    Placement,
    watch_gang,
    workload_sources,
)
from dione.launch.neighbours import training_here
from dione.launch.pool import WarmWorker, local_pool, write_stacks
from dione.launch.scratch import scratch_dir
from dione.launch.worker import Job
from dione.spec.cluster import Node, NodeBusyError
from dione.spec.devices import available_cores, cores_for_slot, threads_per_slot
from dione.state.private import private_dir
from dione.techniques.base import SliceOutcome, SliceSpec

__all__ = [
    "LOCAL",
    "GangError",
    "GangInterrupted",
    "Launcher",
    "LocalLauncher",
    "OnProgress",
    "Placement",
    "collective_timeout",
    "local_placement",
    "run_local_gang",
]

# Hears a rank's progress record (steps done, loss, pace) while its slice runs.
OnProgress = Callable[[int, dict[str, Any]], None]


def collective_timeout() -> float:
    """Seconds a collective or the rendezvous may wait ($DIONE_COLLECTIVE_TIMEOUT)."""
    return float(os.environ.get("DIONE_COLLECTIVE_TIMEOUT", "1800"))


def run_local_gang(
    spec: SliceSpec, placement: Placement, folder: str | Path, timeout: float | None = None,
    cancel: threading.Event | None = None,
    on_progress: OnProgress | None = None,
) -> list[SliceOutcome]:
    """Run ``spec`` on a gang of warm workers, one per device; each rank's outcome, or a
    GangError. Setting ``cancel`` (from another thread) stops the gang and raises
    GangInterrupted; ``on_progress(rank, record)`` hears each rank's progress."""
    # A trial another process (or this one, beside a task's slice) times meanwhile is
    # told of it.
    with training_here(slice_of_a_task=not spec.probe_load):
        return _run_local_gang(spec, placement, folder, timeout, cancel, on_progress)


def _run_local_gang(spec: SliceSpec, placement: Placement, folder: str | Path,
                    timeout: float | None, cancel: threading.Event | None,
                    on_progress: OnProgress | None) -> list[SliceOutcome]:
    folder = private_dir(folder)
    for rank in range(spec.world):  # private before a worker appends to it
        os.close(os.open(folder / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW,
                         0o600))
    pool = local_pool()
    private = scratch_dir("gang")
    workers: list[WarmWorker] = []
    try:
        workers = pool.take(placement.kind, placement.device_ids, placement.threads)
        payload, modules = cloudpickle.dumps(spec), workload_sources()
        jobs = [Job(payload, modules, rank, str(private), str(folder / f"rank{rank}.log"),
                    placement.threads,
                    placement.cores[rank] if placement.cores is not None else None,
                    collective_timeout())
                for rank in range(len(workers))]
        outcomes = watch_gang(workers, jobs, spec, placement, folder,
                              lambda: pool.end(workers), timeout, cancel, on_progress,
                              lambda: write_stacks(workers))
        pool.give_back(workers)
        return outcomes
    except BaseException:
        pool.end(workers)  # Ctrl-C or any launcher error: no rank survives the launcher
        raise
    finally:
        shutil.rmtree(private, ignore_errors=True)


def local_placement(node: Node, device_ids: Sequence[int]) -> Placement:
    """A placement on this machine: each CPU slot pinned to its share of the cores."""
    cores = available_cores()
    if node.kind == "cuda":
        return Placement(node.name, "cuda", tuple(device_ids),
                         threads_per_slot(node.devices, len(cores)))
    slots = max(node.devices, max(device_ids) + 1)
    pins = [cores_for_slot(i, slots, cores) for i in device_ids]
    return Placement(
        node.name, "cpu", tuple(device_ids), threads_per_slot(slots, len(cores)),
        None if any(p is None for p in pins) else tuple(tuple(p) for p in pins if p),
    )


class Launcher(Protocol):
    """What runs gangs: this machine's warm workers, or a Ray cluster's actors."""

    def placement(self, node: Node, device_ids: Sequence[int]) -> Placement:
        """Where a gang on ``device_ids`` of ``node`` runs, with its threads."""

    def run_gang(self, spec: SliceSpec, placement: Placement, folder: str | Path,
                 timeout: float | None = None, cancel: threading.Event | None = None,
                 on_progress: OnProgress | None = None) -> list[SliceOutcome]:
        """Each rank's outcome, or GangError / GangInterrupted; its progress meanwhile to
        ``on_progress(rank, record)``; its output in ``folder``'s ``rank<r>.log``."""

    def warm_up(self, node: Node) -> None:
        """Start the workers of every device of ``node`` and wait until they are ready."""

    def forget_node(self, name: str) -> None:
        """Drop a node that left the cluster."""

    def alive_nodes(self) -> list[Node] | None:
        """The cluster's nodes alive now, which may have changed (None: a fixed one)."""

    def next_join(self) -> float | None:
        """When a node is known to join next, on ``dione.clock`` (None: none is known;
        only a simulated cluster knows its future)."""

    def joining_later(self) -> list[Node]:
        """The nodes known to join after now (a simulated cluster's; else none)."""

    def shutdown(self) -> None:
        """End every worker this launcher keeps."""


class LocalLauncher:
    """Gangs of this machine's warm workers; a cluster of one node, this machine."""

    def placement(self, node: Node, device_ids: Sequence[int]) -> Placement:
        return local_placement(node, device_ids)

    def run_gang(self, spec: SliceSpec, placement: Placement, folder: str | Path,
                 timeout: float | None = None, cancel: threading.Event | None = None,
                 on_progress: OnProgress | None = None) -> list[SliceOutcome]:
        return run_local_gang(spec, placement, folder, timeout, cancel, on_progress)

    def warm_up(self, node: Node) -> None:
        placement = local_placement(node, range(node.devices))
        local_pool().warm_up(node.kind, placement.device_ids, placement.threads)

    def forget_node(self, name: str) -> None:
        return None

    def alive_nodes(self) -> list[Node] | None:
        return None  # this machine, as --devices describes it

    def next_join(self) -> float | None:
        return None

    def joining_later(self) -> list[Node]:
        return []

    def shutdown(self) -> None:
        return None  # the pool is the process's, shared by its runs; it ends at exit


LOCAL = LocalLauncher()


def warm_up(launcher: Launcher, nodes: Sequence[Node]) -> None:
    """Warm every device's worker of ``nodes``, the nodes side by side (a Ray actor's
    start takes seconds; one node after another would add them up)."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        list(pool.map(launcher.warm_up, nodes))


def warm_up_free(launcher: Launcher, nodes: Sequence[Node]) -> tuple[list[Node],
                                                                      list[NodeBusyError]]:
    """Warm the nodes as ``warm_up`` does; the nodes warmed, and why each other one was
    not: another job holds its devices. Where every node is held, the first one's error
    is raised (nothing to train on)."""
    pool = ThreadPoolExecutor(max_workers=max(1, len(nodes)))
    warming = [(node, pool.submit(launcher.warm_up, node)) for node in nodes]
    warm, busy = [], []
    try:
        for node, done in warming:
            try:
                done.result()
            except NodeBusyError as err:
                busy.append(err)
            else:
                warm.append(node)
    finally:
        # Not waiting for a node's devices on Ctrl-C or SIGTERM (minutes): the caller's
        # ``launcher.shutdown`` withdraws the request, which ends that wait.
        pool.shutdown(wait=False, cancel_futures=True)
    if not warm and busy:
        raise busy[0]
    return warm, busy
