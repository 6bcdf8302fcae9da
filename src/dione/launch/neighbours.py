"""Other dione processes training on this machine: a trial timed beside one measures
their contention, not its own speed, and must not stand in the catalog for later runs.

Each process that runs a local gang holds an exclusive lock on a file of its own (named
by its pid) in a folder of the user's while the gang runs; another process finds it
held. Locks go with their process however it ends, so a killed one is never counted."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["others_training", "training_here"]

_lock = threading.Lock()
# Gangs of this process running (one mark for all), those of them that train a task's
# slice (not a trial), and the mark's descriptor.
_held: dict[str, int] = {"count": 0, "slices": 0, "fd": -1}
# A mark younger than this is never taken for one left behind: its process may be
# between creating it and locking it.
_YOUNG_SECONDS = 60.0


def _folder() -> Path:
    """Where processes mark their training: ``$DIONE_TRAINING_MARKS`` (a test suite's
    workers, each its own), else a folder of the user's in the temporary folder."""
    given = os.environ.get("DIONE_TRAINING_MARKS")
    return Path(given) if given else Path(tempfile.gettempdir()) / f"dione-training-{os.getuid()}"


@contextlib.contextmanager
def training_here(slice_of_a_task: bool = False) -> Iterator[None]:
    """Mark this process as training on this machine's devices while inside (gangs of
    one process side by side share one mark); ``slice_of_a_task``: a task's slice, not
    a trial (a trial of a task added to a live run shares the cores with it)."""
    with _lock:
        if _held["count"] == 0:
            fd = -1
            try:
                folder = _folder()
                folder.mkdir(mode=0o700, exist_ok=True)
                fd = os.open(folder / f"{os.getpid()}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                _held["fd"] = fd
            except OSError:  # a mark is advice: training goes on without one
                if fd >= 0:
                    os.close(fd)
                _held["fd"] = -1
        _held["count"] += 1
        _held["slices"] += slice_of_a_task
    try:
        yield
    finally:
        with _lock:
            _held["count"] -= 1
            _held["slices"] -= slice_of_a_task
            if _held["count"] == 0 and _held["fd"] >= 0:
                with contextlib.suppress(OSError):
                    (_folder() / f"{os.getpid()}.lock").unlink()
                os.close(_held["fd"])
                _held["fd"] = -1


def others_training() -> list[int]:
    """The pids of the processes of this user training on this machine now, other than
    this one's trials: other processes, and this one while it trains a task's slice."""
    with _lock:
        found = [os.getpid()] if _held["slices"] else []
    try:
        files = list(_folder().glob("*.lock"))
    except OSError:
        return found
    for file in files:
        if not file.stem.isdigit() or int(file.stem) == os.getpid():
            continue
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            found.append(int(file.stem))
        except OSError:
            pass
        else:  # a mark its process left (it ended between unlock and unlink), unless
            # young: its process may not have locked it yet
            with contextlib.suppress(OSError):
                if time.time() - file.stat().st_mtime > _YOUNG_SECONDS:
                    file.unlink()
        finally:
            os.close(fd)
    return sorted(found)
