"""Ctrl-C and SIGTERM stop a run the same way at any moment: as an exception on the main
thread, so every gang is cancelled, its slice recorded as interrupted and the scratch
cleaned, in the CLI and under ``dione.run()`` alike; the caller's handlers come back
afterwards (a notebook keeps its own)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Terminated", "interruptible"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be: the same clean stop."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"stopped by signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """For the block: SIGINT raises KeyboardInterrupt and SIGTERM raises Terminated (on
    the main thread; elsewhere signals cannot be handled and nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        for signum, handler in zip((signal.SIGINT, signal.SIGTERM), before, strict=True):
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
