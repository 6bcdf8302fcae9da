"""Undominated options and integer ticks: what every CP-SAT model of a problem shares."""

from __future__ import annotations

import math
from collections.abc import Sequence

from dione.plan.problem import Option, PlanningProblem, TaskOptions
from dione.plan.timeline import NodeTimeline

__all__ = ["TICKS_PER_HORIZON", "Placement", "fitting_options", "tick_starts", "ticks",
           "useful_for", "useful_options"]

Placement = tuple[str, Option, str, float]  # task, option, node, start

# Coarser ticks prove optimality far sooner (a small instance: 0.3 s at 2,000 ticks, 6 s
# at 10,000, unproven in 10 s at 200,000); every tick of rounding costs the reported
# lower bound one tick per task of the longest chain, and re-timing the found plan in
# exact seconds gives back what rounding added to it.
TICKS_PER_HORIZON = 5_000


def ticks(seconds: float, tick: float) -> int:
    """``seconds`` in whole ticks, rounded up (so a tick schedule stays valid in seconds)."""
    return math.ceil(seconds / tick - 1e-9)


def useful_options(task: TaskOptions) -> list[Option]:
    """The options not dominated by another (as fast or faster on as few or fewer
    devices, on every node it may use): a plan using a dominated option can swap in its
    dominator and stay valid."""
    kept: list[Option] = []
    # Options of no kind first among equals: they fit every node of the others' kinds.
    for option in sorted(task.options, key=lambda o: (o.devices, o.seconds, o.kind is not None)):
        if not any(_dominates(k, option) for k in kept):
            kept.append(option)
    return kept


def _dominates(first: Option, second: Option) -> bool:
    return (first.devices <= second.devices and first.seconds <= second.seconds
            and first.on_kind_of(second))


def fitting_options(task: TaskOptions, makespan: float, devices: int) -> list[Option]:
    """The useful options a plan ending by ``makespan`` on nodes of at most ``devices``
    devices could give the task (of any kind: bounds relax kinds away)."""
    return [o for o in useful_options(task) if o.devices <= devices and o.seconds <= makespan]


def useful_for(useful: Sequence[Option], option: Option) -> Option:
    """The useful option a plan would swap in for ``option`` (itself if useful)."""
    return min((o for o in useful if _dominates(o, option)),
               key=lambda o: (o.seconds, o.devices))


def tick_starts(problem: PlanningProblem, placed: Sequence[Placement], tick: float
                ) -> dict[str, int]:
    """Starts in ticks that keep ``placed`` valid with lengths rounded up: each task, in
    start order, at the first tick from its own (and from its release) where its node
    has room."""
    lines = {n.name: NodeTimeline(n.devices) for n in problem.nodes}
    for b in problem.busy:
        lines[b.node].reserve(0, ticks(b.until, tick), len(b.device_ids))
    starts = {}
    release = problem.releases()
    for name, option, node, start in sorted(placed, key=lambda p: (p[3], p[0])):
        length = ticks(option.seconds, tick)
        not_before = max(math.floor(start / tick + 1e-9),
                         ticks(release.get(name, 0.0), tick))
        begin = int(lines[node].earliest_start(option.devices, length, not_before))
        lines[node].reserve(begin, begin + length, option.devices)
        starts[name] = begin
    return starts
