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
from collections.abc import Iterator
from pathlib import Path

__all__ = ["others_training", "training_here"]

_lock = threading.Lock()
_held: dict[str, int] = {"count": 0, "fd": -1}


def _folder() -> Path:
    """Where processes mark their training: ``$DIONE_TRAINING_MARKS`` (a test suite's
    workers, each its own), else a folder of the user's in the temporary folder."""
    given = os.environ.get("DIONE_TRAINING_MARKS")
    return Path(given) if given else Path(tempfile.gettempdir()) / f"dione-training-{os.getuid()}"


@contextlib.contextmanager
def training_here() -> Iterator[None]:
    """Mark this process as training on this machine's devices while inside (gangs of
    one process side by side share one mark)."""
    with _lock:
        if _held["count"] == 0:
            try:
                folder = _folder()
                folder.mkdir(mode=0o700, exist_ok=True)
                fd = os.open(folder / f"{os.getpid()}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                _held["fd"] = fd
            except OSError:  # a mark is advice: training goes on without one
                _held["fd"] = -1
        _held["count"] += 1
    try:
        yield
    finally:
        with _lock:
            _held["count"] -= 1
            if _held["count"] == 0 and _held["fd"] >= 0:
                with contextlib.suppress(OSError):
                    (_folder() / f"{os.getpid()}.lock").unlink()
                os.close(_held["fd"])
                _held["fd"] = -1


def others_training() -> list[int]:
    """The pids of the other processes of this user training on this machine now."""
    found = []
    try:
        files = list(_folder().glob("*.lock"))
    except OSError:
        return []
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
        else:  # a mark its process left (it ended between unlock and unlink)
            with contextlib.suppress(OSError):
                file.unlink()
        finally:
            os.close(fd)
    return sorted(found)
