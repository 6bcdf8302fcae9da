"""A gang, whatever runs it: hand each rank its job, watch replies and deaths, end together.

Both launchers (local warm workers, Ray actors) drive their members through this one
loop. A member takes a job, says how it goes (``progress`` records for the live view,
``log`` bytes when its output stays on another node: appended to the rank's log here),
replies (``result``, ``error``, or ``lost`` when it died or its reply was cut short),
and says how it ended when lost. The first failure ends
the whole gang; the error names the rank that caused it, not the ranks that merely
lost their peer. A gang past its timeout, or cancelled, is ended the same way.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dione.spec.devices import DeviceKind
from dione.spec.workload import loaded_workload_sources
from dione.techniques.base import SliceOutcome, SliceSpec

__all__ = [
    "GangError",
    "GangInterrupted",
    "Lost",
    "Member",
    "Placement",
    "describe_failure",
    "signal_name",
    "watch_gang",
    "workload_sources",
]

_POLL_SECONDS = 0.02
# When the first rank to fail only lost its peer, how long the others get to report:
# the rank that caused it has usually raised a moment before; a Ray actor's death reaches
# the driver through the raylet and the GCS, seconds later on a loaded machine. Paid only
# on a failure whose cause is still unheard.
_ROOT_CAUSE_GRACE_SECONDS = 10.0


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
        # raised | signal | exit | timeout | interrupted | node_lost
        self.reason = reason
        self.error_type = error_type  # the exception's type name when reason is raised


@dataclass(frozen=True)
class Lost:
    """How a member that stopped answering ended: ``reason`` (signal | exit |
    node_lost) and a phrase that follows "rank r (device d)"."""

    reason: str
    what: str


class Member(Protocol):
    """One rank's worker, as the gang loop drives it."""

    def send(self, job: Any) -> bool:
        """Hand over a job; False when the worker is already gone."""

    def reply(self) -> tuple[str, Any] | None:
        """The next message: ``("progress", record)`` or ``("log", bytes)`` while the job
        runs, then ``("result", outcome)``, ``("error", record)`` or ``("lost", None)``;
        None while nothing new is there."""

    def lost(self) -> Lost:
        """How it ended, once it replied ``lost``."""


def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


# A line Python's warnings module prints for a source file ("/x/file.py:12: UserWarning:
# text"); the source line it quotes follows, indented. Only at the line's start and for a
# .py file: an error line that quotes one ("RuntimeError: a.py:3: UserWarning: ...") says
# why the rank died, and a warning of frozen code quotes no line.
_WARNING_LINE = re.compile(r"^\S+\.py:\d+: \w*Warning: ")


def _log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` of a rank's log, less the warnings libraries printed there (a
    killed rank's log otherwise read as torch's deprecation notes, as if they were why)."""
    try:
        text = path.read_text(errors="replace").rstrip().splitlines()
    except OSError:
        return ""
    kept: list[str] = []
    quoted = False  # the line after a warning: the source line it quotes
    for line in text:
        if _WARNING_LINE.match(line):
            quoted = True
            continue
        if quoted and line[:1].isspace():
            quoted = False
            continue
        quoted = False
        kept.append(line)
    return "\n".join(kept[-lines:])


def workload_sources() -> dict[str, tuple[str, str]]:
    """Each workload file loaded here: module name -> (path, source as it was loaded),
    for workers to import afresh (by value: on another host the path may not exist;
    and the file may have been edited since)."""
    return loaded_workload_sources()


# Said where a rank's log shows its ranks ran different collectives (gloo aborts so).
_MISMATCH = (" Its ranks ran different collectives: a layer or parameter used by some "
             "batches and not others (a branch on the data) desynchronises {}, whose ranks "
             "must run the same collectives at every step; leave it out of the task's "
             "techniques.")


def describe_failure(
    folder: Path, errors: dict[int, dict[str, Any]], lost: dict[int, Lost],
    spec: SliceSpec, placement: Placement,
) -> GangError:
    """The root cause: a rank that died on its own (killed, its node lost) before one
    that raised, and among those that raised, the first whose error was its own rather
    than a peer's disappearance; else the first that stopped answering."""

    def who(rank: int) -> str:
        role = spec.technique.rank_role(rank, len(placement.device_ids))
        return f"rank {rank} (device {placement.device_ids[rank]}{', ' + role if role else ''})"

    died = [r for r, how in sorted(lost.items()) if how.reason in ("signal", "node_lost")]
    if died:
        rank = died[0]
        tail = _log_tail(folder / f"rank{rank}.log")
        return GangError(f"{who(rank)} {lost[rank].what}; the gang was stopped."
                         + (_MISMATCH.format(spec.technique.name) if "collective mismatch"
                            in (tail or "") else "")
                         + (f"\nlast lines of its log:\n{tail}" if tail else ""),
                         rank, lost[rank].reason)
    own = [r for r in errors if not errors[r]["communication"]] or list(errors)
    if own:
        rank = min(own, key=lambda r: float(errors[r]["time"]))
        err = errors[rank]
        return GangError(f"{who(rank)} raised {err['type']}: {err['message']}\n"
                         f"{err['traceback']}", rank, "raised", str(err["type"]))
    rank = min(lost, default=0)
    tail = _log_tail(folder / f"rank{rank}.log")
    what = lost[rank].what if rank in lost else "stopped answering"
    return GangError(f"{who(rank)} {what}" + (f"\nlast lines of its log:\n{tail}" if tail else ""),
                     rank, "exit")


Heard = Callable[[int, str, Any], None]


def _collect(members: Sequence[Member], replies: dict[int, tuple[str, Any]],
             heard: Heard) -> None:
    """Add the reply of every rank that has one waiting and had none yet; pass on what
    the ranks said meanwhile (progress, output)."""
    for rank, member in enumerate(members):
        while rank not in replies and (reply := member.reply()) is not None:
            if reply[0] in ("progress", "log"):
                heard(rank, *reply)
            else:
                replies[rank] = reply


def _hearing(folder: Path, on_progress: Callable[[int, dict[str, Any]], None] | None
             ) -> Heard:
    """What to do with a rank's messages: progress to ``on_progress``, output to its log."""

    def heard(rank: int, kind: str, payload: Any) -> None:
        if kind == "log":
            with open(folder / f"rank{rank}.log", "ab") as log:
                log.write(payload)
        elif on_progress is not None:
            on_progress(rank, payload)

    return heard


def _await_root_cause(members: Sequence[Member], replies: dict[int, tuple[str, Any]],
                      heard: Heard) -> None:
    """Collect what the other ranks have said, and while every failure so far is a rank
    that only lost its peer, give them a moment more: ending them now would lose the
    root cause's own error."""
    deadline = time.monotonic() + _ROOT_CAUSE_GRACE_SECONDS
    while True:
        _collect(members, replies, heard)
        only_peers_lost = all(kind == "result" or (kind == "error" and payload["communication"])
                              for kind, payload in replies.values())
        if not only_peers_lost or len(replies) == len(members) or time.monotonic() > deadline:
            return
        time.sleep(_POLL_SECONDS)


def watch_gang(
    members: Sequence[Member], jobs: Sequence[Any], spec: SliceSpec, placement: Placement,
    folder: Path, end: Callable[[], None], timeout: float | None = None,
    cancel: threading.Event | None = None,
    on_progress: Callable[[int, dict[str, Any]], None] | None = None,
    write_stacks: Callable[[], None] | None = None,
) -> list[SliceOutcome]:
    """Send each member its job and wait for every outcome, passing each rank's
    progress to ``on_progress(rank, record)``; on the first failure, a timeout or a
    cancel, ``end()`` the gang and raise GangError or GangInterrupted. Past its timeout,
    or cancelled with a reason (a stall; a stop gives none), ``write_stacks()`` first
    has the ranks write where they are into their logs."""
    world = len(members)
    heard = _hearing(folder, on_progress)
    replies: dict[int, tuple[str, Any]] = {}
    for rank, (member, job) in enumerate(zip(members, jobs, strict=True)):
        if not member.send(job):
            replies[rank] = ("lost", None)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        _collect(members, replies, heard)
        if len(replies) == world and all(k == "result" for k, _ in replies.values()):
            return [replies[r][1] for r in range(world)]
        if any(kind != "result" for kind, _ in replies.values()):
            _await_root_cause(members, replies, heard)
            lost = {r: members[r].lost() for r, (kind, _) in replies.items() if kind == "lost"}
            end()  # the ranks still running only wait for peers that will never come
            errors = {r: p for r, (kind, p) in replies.items() if kind == "error"}
            raise describe_failure(folder, errors, lost, spec, placement)
        if cancel is not None and cancel.is_set():
            if write_stacks is not None and getattr(cancel, "reason", None):
                write_stacks()
            end()
            raise GangInterrupted("the gang was asked to stop")
        if deadline is not None and time.monotonic() > deadline:
            if write_stacks is not None:
                write_stacks()
            end()
            running = [r for r in range(world) if r not in replies]
            raise GangError(
                f"the gang ran past its timeout of {timeout:g} s and was stopped "
                f"(ranks still running: {running}); raise the timeout if the slice "
                "is just slow, else look for a hang in rank logs under "
                f"{folder}" + (" (each running rank's stack at the stop is there)"
                               if write_stacks is not None else ""),
                running[0] if running else None, "timeout")
        time.sleep(_POLL_SECONDS)
