"""Ctrl-C and SIGTERM stop a run the same way at any moment: as an exception on the main
thread, so every gang is cancelled, its slice recorded as interrupted and the scratch
cleaned, in the CLI and under ``dione.run()`` alike; the caller's handlers come back
afterwards (a notebook keeps its own)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

from dione.launch.signals import stop_handlers_kept

__all__ = ["Signals", "Terminated", "interruptible"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be: the same clean stop."""


class Signals:
    """The stop the block's handlers raised last, if any: Python drops one raised where
    it cannot propagate (a weakref callback, a ``__del__``: "Exception ignored in"), and
    the block then went on as if none came; its caller can still see it."""

    def __init__(self) -> None:
        self.received: KeyboardInterrupt | None = None

    def interrupt(self, signum: int, frame: FrameType | None) -> None:
        self.received = KeyboardInterrupt()
        raise self.received

    def terminate(self, signum: int, frame: FrameType | None) -> None:
        self.received = Terminated(f"stopped by signal {signal.Signals(signum).name}")
        raise self.received


@contextlib.contextmanager
def interruptible() -> Iterator[Signals]:
    """For the block: SIGINT raises KeyboardInterrupt and SIGTERM raises Terminated (on
    the main thread; elsewhere signals cannot be handled and nothing changes)."""
    seen = Signals()
    with stop_handlers_kept() as main:
        if main:
            signal.signal(signal.SIGINT, seen.interrupt)
            signal.signal(signal.SIGTERM, seen.terminate)
        yield seen
