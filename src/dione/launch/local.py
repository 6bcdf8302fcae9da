"""Gangs of local warm workers: hand a slice to one worker per device, watch, end together.

Each rank is a warm worker of this process's pool (``pool``): started once per device
slot, it serves slice after slice. A gang rendezvouses through a FileStore in a private
scratch folder (0700, see ``scratch``): no port another host or user could reach; the
slice, the results and the errors travel over the workers' connections, so nothing is
unpickled from a run directory. Gloo binds to the loopback interface. The first
failure ends the whole gang: its workers are terminated, then killed, with their
children, and the next slice gets fresh ones; the error names the rank that caused
it, not the ranks that merely lost their peer. A gang past its timeout, or cancelled,
is ended the same way.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import cloudpickle

from dione.launch.pool import WarmWorker, local_pool
from dione.launch.scratch import scratch_dir
from dione.launch.worker import Job
from dione.spec.devices import DeviceKind
from dione.spec.workload import loaded_workload_files
from dione.techniques.base import SliceOutcome, SliceSpec

__all__ = ["GangError", "GangInterrupted", "Placement", "run_local_gang"]

_POLL_SECONDS = 0.02
# How long a worker that stopped answering gets to show its exit status.
_EXIT_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class Placement:
    """Where a gang runs: a node's devices, and each rank's threads and CPU cores."""

    node: str
    kind: DeviceKind
    device_ids: tuple[int, ...]
    threads: int
    cores: tuple[tuple[int, ...], ...] | None = None


class GangInterrupted(Exception):
    """The caller asked a running gang to stop (its cancel event was set)."""


class GangError(RuntimeError):
    """A gang that did not finish: which rank, why, and what it said."""

    def __init__(self, message: str, rank: int | None, reason: str,
                 error_type: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.reason = reason  # raised | signal | exit | timeout | interrupted
        self.error_type = error_type  # the exception's type name when reason is raised


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").rstrip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _describe_failure(
    folder: Path, errors: dict[int, dict[str, Any]], codes: dict[int, int | None],
    ended_by_us: set[int], spec: SliceSpec, placement: Placement,
) -> GangError:
    """The root cause among the ranks that failed on their own: ``errors`` are the
    reports of ranks that raised, ``codes`` the exit status of ranks that died or went
    silent (negative: by a signal; None: still exiting), ``ended_by_us`` the ranks this
    launcher stopped."""

    def who(rank: int) -> str:
        role = spec.technique.rank_role(rank, len(placement.device_ids))
        return f"rank {rank} (device {placement.device_ids[rank]}{', ' + role if role else ''})"

    signalled = [(r, c) for r, c in codes.items() if c is not None and c < 0]
    if signalled:
        rank, code = signalled[0]
        tail = _log_tail(folder / f"rank{rank}.log")
        return GangError(
            f"{who(rank)} was killed by "
            f"{_signal_name(code)}; the gang was stopped."
            + (f"\nlast lines of its log:\n{tail}" if tail else ""),
            rank, "signal",
        )
    own = [r for r in errors if not errors[r]["communication"]] or list(errors)
    if own:
        rank = min(own, key=lambda r: float(errors[r]["time"]))
        err = errors[rank]
        return GangError(
            f"{who(rank)} raised {err['type']}: "
            f"{err['message']}\n{err['traceback']}",
            rank, "raised", str(err["type"]),
        )
    rank = min(codes, default=min(ended_by_us, default=0))
    tail = _log_tail(folder / f"rank{rank}.log")
    status = codes.get(rank)
    return GangError(
        f"{who(rank)} " + ("stopped answering" if status is None else
                           f"exited with status {status}")
        + (f"\nlast lines of its log:\n{tail}" if tail else ""),
        rank, "exit",
    )


def _exit_code(worker: WarmWorker) -> int | None:
    """A worker's exit status once it stopped answering (it may still be exiting)."""
    deadline = time.monotonic() + _EXIT_GRACE_SECONDS
    while worker.process.poll() is None and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    return worker.process.poll()


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
    world = len(placement.device_ids)
    workers: list[WarmWorker] = []
    try:
        workers = pool.take(placement.kind, placement.device_ids, placement.threads)
        payload = cloudpickle.dumps(spec)
        modules = loaded_workload_files()  # the slice refers to their functions
        collective = float(os.environ.get("DIONE_COLLECTIVE_TIMEOUT", "1800"))
        replies: dict[int, tuple[str, Any]] = {}
        for rank, worker in enumerate(workers):
            job = Job(payload, modules, rank, str(private / "store"),
                      str(folder / f"rank{rank}.log"), str(folder / f"progress-{rank}.json"),
                      placement.threads,
                      placement.cores[rank] if placement.cores is not None else None,
                      collective)
            if not worker.send(job):
                replies[rank] = ("lost", None)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for rank, worker in enumerate(workers):
                if rank not in replies:
                    reply = worker.reply()
                    if reply is None and not worker.alive():
                        reply = worker.reply() or ("lost", None)  # the last words first
                    if reply is not None:
                        replies[rank] = reply
            if len(replies) == world and all(k == "result" for k, _ in replies.values()):
                pool.give_back(workers)
                return [replies[r][1] for r in range(world)]
            if any(kind != "result" for kind, _ in replies.values()):
                ended_by_us = set(range(world)) - set(replies)
                # Workers that died or whose connection broke: how they ended.
                codes = {r: _exit_code(workers[r]) for r, (kind, _) in replies.items()
                         if kind == "lost"}
                pool.end(workers)
                for rank in ended_by_us:  # what the others said before they were ended
                    reply = workers[rank].reply()
                    if reply is not None and reply[0] == "error":
                        replies[rank] = reply
                errors = {r: p for r, (kind, p) in replies.items() if kind == "error"}
                raise _describe_failure(folder, errors, codes, ended_by_us - set(errors),
                                        spec, placement)
            if cancel is not None and cancel.is_set():
                pool.end(workers)
                raise GangInterrupted("the gang was asked to stop")
            if deadline is not None and time.monotonic() > deadline:
                pool.end(workers)
                running = [r for r in range(world) if r not in replies]
                raise GangError(
                    f"the gang ran past its timeout of {timeout:g} s and was stopped "
                    f"(ranks still running: {running}); raise the timeout if the slice "
                    "is just slow, else look for a hang in rank logs under "
                    f"{folder}", running[0] if running else None, "timeout")
            pending = [w.connection for r, w in enumerate(workers) if r not in replies]
            wait(pending, timeout=_POLL_SECONDS * 10)
    except BaseException:
        pool.end(workers)  # Ctrl-C or any launcher error: no rank survives the launcher
        raise
    finally:
        shutil.rmtree(private, ignore_errors=True)
