"""A task's factory (``model()``, ``data()``) called by validation with a deadline: one
that never returns (a download or a lock that hangs) held up every task of the workload,
silent; now it is said, and past the deadline its task alone is left out."""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["FactoryHung", "within_deadline"]

# Said once a factory has run this long (a model built on the meta device, a data set
# read from disk take seconds), and its task left out past the deadline (a hub download
# of a large model may take minutes).
SAID_SECONDS = 30.0
DEADLINE_SECONDS = 600.0

T = TypeVar("T")

# The functions behind factories that hung: a sweep's other tasks built by the same
# function are left out at once, not each after the whole deadline.
_hung: list[Any] = []


class FactoryHung(Exception):
    """A task's factory did not return in time: the task's problem, said as is."""


def _function(factory: Any) -> Any:
    """What a factory calls in the end: a partial's function (a sweep's tasks differ in
    its arguments, and a download that hangs hangs for each)."""
    while isinstance(factory, functools.partial):
        factory = factory.func
    return factory


def within_deadline(call: Callable[[], T], factory: Any, task: str, what: str) -> T:
    """``call()``, which calls ``factory`` (task ``task``'s ``what``: "model()"), run in
    a thread of its own: its result or what it raised; FactoryHung where it has not
    returned by ``DEADLINE_SECONDS`` (or an earlier task's factory of the same function
    did not). The thread is left behind (Python cannot stop one): a daemon, it does not
    hold the process at its exit."""
    function = _function(factory)
    if any(function is hung for hung in _hung):
        raise FactoryHung(f"did not return in {DEADLINE_SECONDS:.0f} s for another task "
                          f"built by {getattr(function, '__name__', 'it')}: left out with it")
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, name=f"dione-{what}-{task}", daemon=True)
    thread.start()
    thread.join(min(SAID_SECONDS, DEADLINE_SECONDS))
    if thread.is_alive() and DEADLINE_SECONDS > SAID_SECONDS:
        warnings.warn(f"task {task!r}: its {what} has not returned in {SAID_SECONDS:.0f} s "
                      f"(a download? a lock?); the task is left out if it has not by "
                      f"{DEADLINE_SECONDS:.0f} s", stacklevel=3)
        thread.join(DEADLINE_SECONDS - SAID_SECONDS)
    if thread.is_alive():
        _hung.append(function)
        raise FactoryHung(f"did not return in {DEADLINE_SECONDS:.0f} s (a download or a "
                          "lock that never ends?): the task is left out, the others go on; "
                          "fix it, then resume or run it again")
    if "error" in box:
        raise box["error"]
    return cast(T, box["value"])
