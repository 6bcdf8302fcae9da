"""Gangs of local worker processes: start, watch, and end them together.

The gang rendezvouses through a FileStore in a private scratch folder (0700, see
``scratch``) that holds the pickled slice and the ranks' results and errors too: no
port that another host or user could reach, nothing unpickled from a run directory.
Gloo binds to the loopback interface. The launcher starts one process per rank in its
own process group and watches them. The first failure ends the whole gang: the others
are terminated, then killed, with their children; the error names the rank that
caused it, not the ranks that merely lost their peer. A gang past its timeout is ended
the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from dione.launch.scratch import scratch_dir
from dione.spec.devices import DeviceKind
from dione.spec.workload import loaded_workload_files
from dione.techniques.base import SliceOutcome, SliceSpec

__all__ = ["GangError", "GangInterrupted", "Placement", "run_local_gang"]

_POLL_SECONDS = 0.02
_TERMINATE_GRACE_SECONDS = 3.0


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


def _end(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """Terminate every process group still alive, then kill what is left; reap all."""
    alive = [p for p in processes if p.poll() is None]
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + _TERMINATE_GRACE_SECONDS
    while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    for p in processes:
        # The whole group: a rank's own children must not outlive it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _error_report(file: Path) -> dict[str, Any] | None:
    """A rank's error report, or None where there is none or it is unreadable (a rank
    killed while writing it): a failure report must never become a second failure."""
    try:
        report = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    keys = ("type", "message", "traceback", "time", "communication")
    return report if isinstance(report, dict) and all(k in report for k in keys) else None


def _describe_failure(
    folder: Path, private: Path, codes: dict[int, int], ended_by_us: set[int], spec: SliceSpec,
    placement: Placement,
) -> GangError:
    """The root cause among the ranks that failed on their own."""

    def who(rank: int) -> str:
        role = spec.technique.rank_role(rank, len(placement.device_ids))
        return f"rank {rank} (device {placement.device_ids[rank]}{', ' + role if role else ''})"

    errors = {}
    for rank in codes:
        report = _error_report(private / f"error-{rank}.json")
        if report is not None:
            errors[rank] = report
    signalled = [r for r, c in codes.items() if c < 0 and r not in ended_by_us]
    if signalled:
        rank = signalled[0]
        tail = _log_tail(folder / f"rank{rank}.log")
        return GangError(
            f"{who(rank)} was killed by "
            f"{_signal_name(codes[rank])}; the gang was stopped."
            + (f"\nlast lines of its log:\n{tail}" if tail else ""),
            rank, "signal",
        )
    own = [r for r in errors if not errors[r]["communication"]] or list(errors)
    if own:
        rank = min(own, key=lambda r: errors[r]["time"])
        err = errors[rank]
        return GangError(
            f"{who(rank)} raised {err['type']}: "
            f"{err['message']}\n{err['traceback']}",
            rank, "raised", err["type"],
        )
    rank = next(r for r, c in codes.items() if c != 0 and r not in ended_by_us)
    tail = _log_tail(folder / f"rank{rank}.log")
    return GangError(
        f"{who(rank)} exited with status {codes[rank]}"
        + (f"\nlast lines of its log:\n{tail}" if tail else ""),
        rank, "exit",
    )


def run_local_gang(
    spec: SliceSpec, placement: Placement, folder: str | Path, timeout: float | None = None,
    cancel: threading.Event | None = None,
) -> list[SliceOutcome]:
    """Run ``spec`` as a gang of local processes; each rank's outcome, or a GangError.
    Setting ``cancel`` (from another thread) stops the gang and raises GangInterrupted."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    private = scratch_dir("gang")
    # Workers import the workload files first: the slice refers to their functions.
    (private / "modules.json").write_text(json.dumps(loaded_workload_files()))
    (private / "slice.pkl").write_bytes(cloudpickle.dumps(spec))
    world = len(placement.device_ids)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(world):
            env = {
                **os.environ,
                "DIONE_PRIVATE_DIR": str(private),
                "DIONE_LAUNCHER_PID": str(os.getpid()),
                "OMP_NUM_THREADS": str(placement.threads),
                "MKL_NUM_THREADS": str(placement.threads),
                "PYTHONUNBUFFERED": "1",
            }
            # A local gang talks over loopback only: no other host can reach its ranks.
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            env.setdefault("NCCL_SOCKET_IFNAME", "lo")
            if placement.cores is not None:
                env["DIONE_CORES"] = ",".join(map(str, placement.cores[rank]))
            with open(folder / f"rank{rank}.log", "wb") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "dione.launch.worker", str(folder), str(rank)],
                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                ))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            codes = {r: p.poll() for r, p in enumerate(processes)}
            if all(c == 0 for c in codes.values()):
                break
            failed = {r: c for r, c in codes.items() if c not in (None, 0)}
            if failed:
                ended_by_us = {r for r, c in codes.items() if c is None}
                _end(processes)
                final = {r: p.returncode for r, p in enumerate(processes)}
                raise _describe_failure(folder, private, final, ended_by_us, spec, placement)
            if cancel is not None and cancel.is_set():
                _end(processes)
                raise GangInterrupted("the gang was asked to stop")
            if deadline is not None and time.monotonic() > deadline:
                _end(processes)
                running = [r for r, c in codes.items() if c is None]
                raise GangError(
                    f"the gang ran past its timeout of {timeout:g} s and was stopped "
                    f"(ranks still running: {running}); raise the timeout if the slice "
                    "is just slow, else look for a hang in rank logs under "
                    f"{folder}", running[0] if running else None, "timeout")
            time.sleep(_POLL_SECONDS)
        return [cloudpickle.loads((private / f"result-{r}.pkl").read_bytes())
                for r in range(world)]
    except BaseException:
        _end(processes)  # Ctrl-C or any launcher error: no rank survives the launcher
        raise
    finally:
        shutil.rmtree(private, ignore_errors=True)
