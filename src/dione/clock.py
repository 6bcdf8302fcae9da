"""The time a run goes by: the wall clock, or a simulated one (``dione simulate``).

Everything that stamps or waits in the orchestrator, the run store and the slice path
asks this module, so that the same code runs a real cluster on the wall clock and a
simulated one on a virtual clock that jumps from event to event. One clock per process
at a time: a simulation sets its own for as long as it runs (``using``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Protocol

__all__ = ["Clock", "WallClock", "now", "using", "wait_any"]


class Clock(Protocol):
    """Seconds, and a wait for the first of some futures to finish."""

    def now(self) -> float:
        """Seconds since the epoch (or since the simulation began)."""

    def wait_any(self, futures: Iterable[Future[Any]], timeout: float) -> set[Future[Any]]:
        """The futures that are done after waiting up to ``timeout`` seconds for one."""


class WallClock:
    """The real one."""

    def now(self) -> float:
        return time.time()

    def wait_any(self, futures: Iterable[Future[Any]], timeout: float) -> set[Future[Any]]:
        done, _ = wait(list(futures), timeout=timeout, return_when=FIRST_COMPLETED)
        return done


_clock: Clock = WallClock()


def now() -> float:
    """The process's clock's time."""
    return _clock.now()


def wait_any(futures: Iterable[Future[Any]], timeout: float) -> set[Future[Any]]:
    return _clock.wait_any(futures, timeout)


@contextlib.contextmanager
def using(clock: Clock) -> Iterator[Clock]:
    """Run the block on ``clock``; the one before comes back after."""
    global _clock
    before, _clock = _clock, clock
    try:
        yield clock
    finally:
        _clock = before
