"""A clock that moves only from event to event: a simulated run's time, never the wall's."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

__all__ = ["VirtualClock"]


class VirtualClock:
    """Seconds since the simulation began. ``at(when, action)`` schedules an event (a
    simulated slice ends, a node is lost); ``wait_any`` runs the events due, in time
    order (ties in the order they were scheduled), until one of the futures it waits
    for is done or its timeout has passed, and jumps the time there. Nothing here reads
    the wall clock, so a simulation's times depend on its inputs alone."""

    def __init__(self, start: float = 0.0) -> None:
        self.time = start
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._scheduled = 0

    def now(self) -> float:
        return self.time

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` when the clock reaches ``when`` (at once if it is past)."""
        heapq.heappush(self._events, (max(when, self.time), self._scheduled, action))
        self._scheduled += 1

    def wait_any(self, futures: Iterable[Future[Any]], timeout: float) -> set[Future[Any]]:
        waited = list(futures)
        done = {f for f in waited if f.done()}
        if done:
            return done
        deadline = self.time + timeout
        while self._events and self._events[0][0] <= deadline:
            when = self._events[0][0]
            self.time = when
            while self._events and self._events[0][0] == when:  # every event of this instant
                heapq.heappop(self._events)[2]()
            done = {f for f in waited if f.done()}
            if done:
                return done
        self.time = deadline
        return set()

    @property
    def pending(self) -> int:
        """Events scheduled and not yet run."""
        return len(self._events)
