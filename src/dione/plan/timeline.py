"""A node's free devices over time, for list scheduling: earliest start of d devices for L s.

The profile is a step function kept as breakpoints::

    free devices
      8 |‾‾‾|         |‾‾‾‾‾‾‾‾‾‾  (after the last breakpoint: all free)
      4 |   |___|‾‾‾‾‾|
      0 |       |__|
        t0  t1  t2 t3  t4
"""

from __future__ import annotations

import bisect

__all__ = ["NodeTimeline"]

_EPSILON = 1e-9


class NodeTimeline:
    """Free device count of one node over time; starts all free from time 0."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.times: list[float] = [0.0]
        self.free: list[int] = [capacity]
        self._first_free: dict[int, float] = {}  # demand -> first_free's answer

    def _split(self, time: float) -> int:
        """Make ``time`` a breakpoint; its index."""
        i = bisect.bisect_right(self.times, time) - 1
        if abs(self.times[i] - time) <= _EPSILON:
            return i
        self.times.insert(i + 1, time)
        self.free.insert(i + 1, self.free[i])
        return i + 1

    def reserve(self, start: float, end: float, demand: int) -> None:
        """Take ``demand`` devices during [start, end)."""
        if end <= start:
            return
        self._first_free.clear()
        first, last = self._split(start), self._split(end)
        for i in range(first, last):
            self.free[i] -= demand
            if self.free[i] < 0:
                raise ValueError(f"over capacity at {self.times[i]:g} s")

    def earliest_start(self, demand: int, length: float, not_before: float = 0.0) -> float:
        """The first time >= ``not_before`` from which ``demand`` devices stay free for
        ``length`` seconds."""
        if demand > self.capacity:
            raise ValueError(f"{demand} devices asked of a node with {self.capacity}")
        times, free = self.times, self.free
        i = max(0, bisect.bisect_right(times, not_before) - 1)
        candidate: float | None = None
        while i < len(times):
            segment_start = max(times[i], not_before)
            if free[i] >= demand:
                if candidate is None:
                    candidate = segment_start
                segment_end = times[i + 1] if i + 1 < len(times) else float("inf")
                if segment_end - candidate >= length - _EPSILON:
                    return candidate
            else:
                candidate = None
            i += 1
        assert candidate is not None  # the last segment is all free, forever
        return candidate

    def first_free(self, demand: int) -> float:
        """The first time ``demand`` devices are free at all: no start of theirs, however
        short, is earlier (kept until the next reservation: a list schedule asks it of
        every node and reserves on one)."""
        if demand not in self._first_free:
            self._first_free[demand] = next(
                (t for t, f in zip(self.times, self.free, strict=True) if f >= demand),
                self.times[-1])
        return self._first_free[demand]

    @property
    def empty(self) -> bool:
        """Whether nothing was ever reserved on it (all free, always)."""
        return len(self.times) == 1

    def finish_time(self) -> float:
        """When the last reservation ends."""
        return self.times[-1] if len(self.times) > 1 else 0.0
