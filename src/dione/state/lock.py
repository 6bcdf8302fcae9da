"""One launcher per run directory: an exclusive lock its live holder keeps.

Two launchers on one run directory would both train every task and delete each
other's half-written checkpoints. The holder keeps an ``flock`` on ``RUN_DIR/lock``
for as long as it lives (the kernel drops it when the process dies, however it dies),
and writes its host and pid there so a second launcher can say who holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar

__all__ = ["LOCK_FILE", "LockHolder", "RunDirBusy", "RunLock", "lock_holder", "pid_alive"]

LOCK_FILE = "lock"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunDirBusy(RuntimeError):
    """Another live launcher holds the run directory."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or last held) a run directory's lock."""

    host: str
    pid: int
    since: float
    alive: bool  # the lock is held now


def _read(file: IO[str]) -> dict[str, Any]:
    file.seek(0)
    try:
        record = json.loads(file.read() or "{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def lock_holder(run_dir: str | Path) -> LockHolder | None:
    """Who holds the lock of ``run_dir`` (alive), or last held it (not alive); None if
    no launcher ever took it."""
    path = Path(run_dir) / LOCK_FILE
    try:
        file = open(path)  # noqa: SIM115 - held across the probe below
    except OSError:
        return None
    with file:
        record = _read(file)
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            alive = True
        else:
            alive = False
            fcntl.flock(file, fcntl.LOCK_UN)
    return LockHolder(str(record.get("host", "?")), int(record.get("pid", 0)),
                      float(record.get("since", 0.0)), alive)


class RunLock:
    """``with RunLock(run_dir):`` holds the run directory, or raises RunDirBusy naming
    the live holder. Re-entrant within a process (the CLI holds it around the run
    loop, which takes it too)."""

    # Locks this process holds, by lock file, with how many holders each has.
    _held: ClassVar[dict[Path, int]] = {}

    def __init__(self, run_dir: str | Path) -> None:
        self.path = (Path(run_dir) / LOCK_FILE).resolve()
        self._file: IO[str] | None = None
        self._nested = False

    def acquire(self) -> None:
        if self.path in RunLock._held:
            RunLock._held[self.path] += 1
            self._nested = True
            return
        file = open(self.path, "a+")  # noqa: SIM115 - kept open while the lock is held
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            record = _read(file)
            file.close()
            since = record.get("since")
            when = (time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since))
                    if isinstance(since, (int, float)) else "")
            raise RunDirBusy(
                f"{self.path.parent} is in use by another dione launcher (pid "
                f"{record.get('pid', '?')} on host {record.get('host', '?')}{when}); wait for "
                "it to finish or stop it, or use another run directory") from None
        os.chmod(self.path, 0o600)
        file.seek(0)
        file.truncate()
        file.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                               "since": time.time()}))
        file.flush()
        self._file = file
        RunLock._held[self.path] = 1

    def release(self) -> None:
        if self._nested:
            RunLock._held[self.path] -= 1
            self._nested = False
        elif self._file is not None:
            del RunLock._held[self.path]
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
