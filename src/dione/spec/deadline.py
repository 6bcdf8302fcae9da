"""A task's factory (``model()``, ``data()``) called by validation with a deadline: one
that never returns (a download or a lock that hangs) held up every task of the workload,
silent; now it is said, and past the deadline its task alone is left out."""

from __future__ import annotations

import signal
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from dione.spec.sameness import same_function

__all__ = ["FactoryHung", "within_deadline"]

# Said once a factory has run this long (a model built on the meta device, a data set
# read from disk take seconds), and its task left out past the deadline (a hub download
# of a large model may take minutes).
SAID_SECONDS = 30.0
DEADLINE_SECONDS = 600.0

T = TypeVar("T")


class FactoryHung(BaseException):
    """A task's factory did not return in time: the task's problem, said as is. Not an
    Exception: a factory's own ``except Exception`` (or validation's meta-device build,
    which tries again on the CPU) must not take it for its own error and go on."""


def within_deadline(call: Callable[[], T], factory: Any, task: str, what: str,
                    hung: list[Any]) -> T:
    """``call()``, which calls ``factory`` (task ``task``'s ``what``: "model()"), on this
    thread (a factory may need the main thread: signal handlers, an event loop):
    FactoryHung where it has not returned by ``DEADLINE_SECONDS``, or where a factory in
    ``hung`` (this validation's that did not: the same function with the same
    arguments, a sweep's tasks alike) is this one. Off the main thread, where no alarm
    can stop it, the wait is only said."""
    if any(same_function(factory, other) for other in hung):
        raise FactoryHung(f"did not return in {DEADLINE_SECONDS:.0f} s for another task "
                          "with the same factory: left out with it")
    said = _Said(task, what)
    if threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        watch = threading.Timer(SAID_SECONDS, said)
        watch.daemon = True
        watch.start()
        try:
            return call()
        finally:
            watch.cancel()

    def on_alarm(signum: int, frame: Any) -> None:
        if not said.done and DEADLINE_SECONDS > SAID_SECONDS:
            said()
            signal.setitimer(signal.ITIMER_REAL, DEADLINE_SECONDS - SAID_SECONDS)
            return
        hung.append(factory)
        raise FactoryHung(f"did not return in {DEADLINE_SECONDS:.0f} s (a download or a "
                          "lock that never ends?): the task is left out, the others go on; "
                          "fix it, then resume or run it again")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    earlier = signal.setitimer(signal.ITIMER_REAL, min(SAID_SECONDS, DEADLINE_SECONDS))
    try:
        return call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if earlier[0] > 0:  # a timer of the caller's: set again (its time here not taken)
            signal.setitimer(signal.ITIMER_REAL, *earlier)


class _Said:
    """Says, once, that a factory has not returned in ``SAID_SECONDS``."""

    def __init__(self, task: str, what: str) -> None:
        self.task, self.what, self.done = task, what, False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        warnings.warn(f"task {self.task!r}: its {self.what} has not returned in "
                      f"{SAID_SECONDS:.0f} s (a download? a lock?); the task is left out "
                      f"if it has not by {DEADLINE_SECONDS:.0f} s", stacklevel=2)
