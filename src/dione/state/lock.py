"""One launcher per run directory: an exclusive lock its live holder keeps.

Two launchers on one run directory would both train every task and delete each
other's half-written checkpoints. The holder keeps an ``flock`` on the run directory
itself for as long as it lives (the kernel drops it when the process dies, however it
dies): a lock on a file in it could be bypassed by deleting the file, which leaves the
holder locking a name no one else opens. It writes its host and pid to ``RUN_DIR/lock``
(never through a symlink) so that a second launcher can say who holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar

__all__ = ["LOCK_FILE", "LockHolder", "RunDirBusy", "RunLock", "held_elsewhere", "launcher_gone",
           "lock_holder", "pid_alive"]

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


def _holder_record(run_dir: Path) -> dict[str, Any] | None:
    """What the holder wrote to ``RUN_DIR/lock`` (None: nothing readable; a symlink is
    not followed)."""
    try:
        # Non-blocking: a FIFO there would wait for a writer for ever.
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, a FIFO: nothing a holder wrote
        os.close(fd)
        return None
    with os.fdopen(fd) as file:
        return _read(file)


def _directory(run_dir: Path) -> int:
    return os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)


def launcher_gone(run_dir: str | Path) -> bool:
    """Whether no launcher holds the run now (it ended, or was killed)."""
    holder = lock_holder(run_dir)
    return holder is None or not holder.alive


def held_elsewhere(run_dir: str | Path) -> bool:
    """Whether a live launcher other than this process holds the run now."""
    return Path(run_dir).resolve() not in RunLock._held and not launcher_gone(run_dir)


def lock_holder(run_dir: str | Path) -> LockHolder | None:
    """Who holds the lock of ``run_dir`` (alive), or last held it (not alive); None if
    no launcher ever took it."""
    run_dir = Path(run_dir)
    record = _holder_record(run_dir)
    try:
        fd = _directory(run_dir)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        alive = True
    else:
        alive = False
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    if record is None and not alive:
        return None
    record = record or {}
    return LockHolder(str(record.get("host", "?")), int(record.get("pid", 0)),
                      float(record.get("since", 0.0)), alive)


@dataclass
class _Hold:
    """This process's hold of a run directory: the thread that holds it, the ``RunLock``
    objects that took it there (one per take), and the locked descriptor the last
    release closes."""

    thread: threading.Thread
    takers: list[RunLock]
    fd: int


class RunLock:
    """``with RunLock(run_dir):`` holds the run directory, or raises RunDirBusy naming
    the live holder. Re-entrant within a thread (the CLI holds it around the run loop,
    which takes it too); another thread of the process is refused as another process
    is (two ``dione.run`` calls at once on one folder both trained it, each task twice
    into the same checkpoints: a review), unless the thread that held it has ended (it
    held the folder for the rest of the process: a review). The last release lets go."""

    # Run directories this process holds, and who holds each (under ``_guard``).
    _held: ClassVar[dict[Path, _Hold]] = {}
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.path = self.run_dir / LOCK_FILE
        # Taken by ``acquire`` and not yet entered: the next ``with`` is that take's
        # (``with claim_run_dir(d):``), not another.
        self._adopt = False

    def acquire(self) -> None:
        self._take()
        self._adopt = True

    def _take(self) -> None:
        here = threading.current_thread()
        with RunLock._guard:
            hold = RunLock._held.get(self.run_dir)
            if hold is not None:
                if hold.thread is not here and hold.thread.is_alive():
                    raise RunDirBusy(
                        f"{self.run_dir} is in use by another call in this process "
                        f"(thread {hold.thread.name}); wait for it to finish, or use "
                        "another run directory")
                if hold.thread is not here:  # it ended holding it: its takes are gone
                    hold.thread, hold.takers = here, []
                hold.takers.append(self)
                return
            fd = _directory(self.run_dir)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                record = _holder_record(self.run_dir) or {}
                since = record.get("since")
                when = (time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since))
                        if isinstance(since, (int, float)) else "")
                raise RunDirBusy(
                    f"{self.run_dir} is in use by another dione launcher (pid "
                    f"{record.get('pid', '?')} on host {record.get('host', '?')}{when}); "
                    "wait for it to finish or stop it, or use another run directory"
                ) from None
            try:
                self._write_holder()
            except BaseException:
                os.close(fd)
                raise
            RunLock._held[self.run_dir] = _Hold(here, [self], fd)

    def _write_holder(self) -> None:
        """Who holds it, in ``RUN_DIR/lock``: a symlink there is replaced, not followed
        (its target may be anyone's file)."""
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            # A FIFO would block the open; a folder fail it (neither is a holder's record).
            if self.path.is_dir() and not self.path.is_symlink():
                os.rmdir(self.path)  # empty only: a folder of anything is left, and said
            else:
                self.path.unlink()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as file:
            os.fchmod(file.fileno(), 0o600)
            file.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                   "since": time.time()}))

    def release(self) -> None:
        """Let go of one take of this object's; the folder once none is left (a take
        of a thread that ended, since taken over, is gone: nothing to let go)."""
        with RunLock._guard:
            self._adopt = False
            hold = RunLock._held.get(self.run_dir)
            if hold is None or self not in hold.takers:
                return
            hold.takers.remove(self)
            if not hold.takers:
                del RunLock._held[self.run_dir]
                fcntl.flock(hold.fd, fcntl.LOCK_UN)
                os.close(hold.fd)

    def __enter__(self) -> RunLock:
        # ``with claim_run_dir(d):`` enters a lock already taken: taking it again nested
        # left it held after the block (a Python session that ran dione kept every run
        # directory locked, and `dione status` called its finished runs live); a ``with``
        # of an object already entered takes it again (its inner exit let go of it).
        if self._adopt:
            self._adopt = False
        else:
            self._take()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _forget_holds() -> None:
    """In a forked child: the parent's holds are the parent's (the child saw the folder
    its own, and its release would have unlocked the parent's descriptor: a review)."""
    RunLock._held = {}
    RunLock._guard = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_holds)
