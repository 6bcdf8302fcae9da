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
        self._watched: set[Future[Any]] = set()
        self._completed = 0  # watched futures done so far

    def watch(self, future: Future[Any]) -> None:
        """Count ``future``'s end, which only an event of this clock brings: ``wait_any``
        then looks at its futures only after an instant that ended one (a simulation of
        1,000 tasks looked at 250 after each of 160,000 progress events)."""
        self._watched.add(future)
        future.add_done_callback(self._count_done)

    def _count_done(self, future: Future[Any]) -> None:
        self._watched.discard(future)
        self._completed += 1

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
        # Futures not watched may end in any event: those are looked at after every one.
        every = any(f not in self._watched for f in waited)
        while self._events and self._events[0][0] <= deadline:
            when = self._events[0][0]
            self.time = when
            completed = self._completed
            while self._events and self._events[0][0] == when:  # every event of this instant
                heapq.heappop(self._events)[2]()
            if every or self._completed != completed:
                done = {f for f in waited if f.done()}
                if done:
                    return done
        self.time = deadline
        return set()

    @property
    def pending(self) -> int:
        """Events scheduled and not yet run."""
        return len(self._events)
