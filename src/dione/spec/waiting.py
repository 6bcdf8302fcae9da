"""A task's factory (``model()``, ``data()``) called by validation, watched: one that has
not returned in ``SAID_SECONDS`` is said, naming the task (a download or a lock that
never ends held up every task of the workload, silent: a review).

It is only said, never stopped: Python cannot stop a call safely. A factory run in a
thread of its own loses what only the main thread has (a signal handler, an event
loop), and an alarm on the main thread misses waits inside C code, a thread pool's
join and a bare ``except:`` (two regression reviews)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import TypeVar

__all__ = ["watched"]

SAID_SECONDS = 30.0  # a model built on the meta device, a data set read from disk: seconds

T = TypeVar("T")


def watched(call: Callable[[], T], task: str, what: str) -> T:
    """``call()`` (task ``task``'s ``what``: "model()"), on this thread; where it has not
    returned in ``SAID_SECONDS``, a warning says so (from a timer's thread)."""

    def say() -> None:  # from the timer's thread: said as from here, dione's own
        warnings.warn_explicit(
            f"task {task!r}: its {what} has not returned in {SAID_SECONDS:.0f} s (a "
            "download? a lock?); validation waits for it: Ctrl-C stops the command, then "
            "fix it or leave the task out", UserWarning, __file__, 0)

    timer = threading.Timer(SAID_SECONDS, say)
    timer.daemon = True
    timer.start()
    try:
        return call()
    finally:
        timer.cancel()
