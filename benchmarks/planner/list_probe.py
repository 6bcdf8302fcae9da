"""Can a search over start-ordered list schedules prove small plans where CP-SAT cannot?

    python benchmarks/planner/list_probe.py small-4 --makespans 66500 66767 --limit 60

Devices within a node need not be adjacent, so every plan can be rebuilt from its tasks
in order of start: each task, on its node and device count, starts at the earliest time
no earlier than the task before it when enough of the node's devices are free. After
the task before it has started, a node's busy devices only fall, so the rebuilt task
starts no later than in the plan and the makespan does not grow. The search is
therefore complete over orders, options and nodes, and its state is small: the tasks
placed, and per node the sorted times its devices come free, none earlier than the last
start. It is a depth-first search for a plan ending by the makespan asked, with:

- identical tasks placed in a fixed order (swapping them changes no plan);
- a state seen before not searched again;
- an area bound: the devices' busy time so far, plus each task left at its smallest
  device-seconds among options short enough to end in time, fits the cluster by then.

"no plan" proves that no plan ends by the makespan asked; "a plan" shows one does.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from dione.plan import load_problem
from dione.plan.problem import Option, PlanningProblem

INSTANCES = Path(__file__).parent / "instances"

Profile = tuple[float, ...]  # when each device of a node is free, sorted


class _OutOfTime(Exception):
    """The search ran past its limit."""


def fastest_by_width(options: Sequence[Option]) -> list[tuple[int, float]]:
    """(devices, seconds) for every device count faster than every narrower one."""
    best: dict[int, float] = {}
    for option in options:
        best[option.devices] = min(best.get(option.devices, option.seconds), option.seconds)
    kept: list[tuple[int, float]] = []
    for width in sorted(best):
        if not kept or best[width] < kept[-1][1]:
            kept.append((width, best[width]))
    return kept


class ListSearch:
    """The search for one problem; ``plan_by(makespan)`` asks one question."""

    def __init__(self, problem: PlanningProblem, limit: float) -> None:
        sizes = [node.devices for node in problem.nodes]
        self.start_profiles = tuple(tuple([0.0] * size) for size in sizes)
        self.capacity = sum(sizes)
        self.ways = [[fastest_by_width(task.fitting(node)) for node in problem.nodes]
                     for task in problem.tasks]
        count = len(self.ways)
        signature = [json.dumps(ways) for ways in self.ways]
        self.after = [-1] * count  # the identical task that must be placed first
        last: dict[str, int] = {}
        for index, sign in enumerate(signature):
            self.after[index] = last.get(sign, -1)
            last[sign] = index
        area = [min(w * s for node in ways for w, s in node) for ways in self.ways]
        self.order = sorted(range(count), key=lambda i: -area[i])
        self.full = (1 << count) - 1
        self.limit = limit
        self.visited = 0
        self.makespan = 0.0
        self.deadline = 0.0
        self.seen: set[tuple[int, tuple[Profile, ...]]] = set()

    def plan_by(self, makespan: float) -> list[tuple[int, int, int, float, float]] | None:
        """A plan (task, node, devices, start, seconds) ending by ``makespan``, or None."""
        self.seen = set()
        self.deadline = time.monotonic() + self.limit
        self.makespan = makespan
        placed: list[tuple[int, int, int, float, float]] = []
        return placed if self._search(0, self.start_profiles, placed) else None

    def _too_little_room(self, mask: int, profiles: tuple[Profile, ...]) -> bool:
        earliest = min(min(profile) for profile in profiles)
        need = sum(sum(profile) for profile in profiles)
        for index, ways in enumerate(self.ways):
            if mask >> index & 1:
                continue
            areas = [w * s for node in ways for w, s in node if earliest + s <= self.makespan]
            if not areas:
                return True
            need += min(areas)
        return need > self.makespan * self.capacity

    def _search(self, mask: int, profiles: tuple[Profile, ...],
                placed: list[tuple[int, int, int, float, float]]) -> bool:
        self.visited += 1
        if self.visited % 50_000 == 0 and time.monotonic() > self.deadline:
            raise _OutOfTime
        if mask == self.full:
            return True
        if (mask, profiles) in self.seen or self._too_little_room(mask, profiles):
            return False
        self.seen.add((mask, profiles))
        for index in self.order:
            if mask >> index & 1 or (self.after[index] >= 0 and not mask >> self.after[index] & 1):
                continue
            for node, ways in enumerate(self.ways[index]):
                for width, seconds in ways:
                    start = profiles[node][width - 1]
                    if start + seconds > self.makespan:
                        continue
                    after = tuple(
                        tuple(sorted([start + seconds] * width
                                     + [max(t, start) for t in profile[width:]]))
                        if other == node else tuple(max(t, start) for t in profile)
                        for other, profile in enumerate(profiles))
                    placed.append((index, node, width, start, seconds))
                    if self._search(mask | 1 << index, after, placed):
                        return True
                    placed.pop()
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instances", nargs="+")
    parser.add_argument("--makespans", nargs="+", type=float, required=True,
                        help="one question per makespan, asked of every instance")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per question")
    args = parser.parse_args()
    print("| instance | makespan, s | answer | states | seconds |")
    print("| --- | ---: | --- | ---: | ---: |")
    for name in args.instances:
        search = ListSearch(load_problem(INSTANCES / f"{name}.json"), args.limit)
        for makespan in args.makespans:
            search.visited = 0
            began = time.monotonic()
            try:
                answer = "a plan" if search.plan_by(makespan) is not None else "no plan"
            except _OutOfTime:
                answer = "no answer"
            print(f"| {name} | {makespan:,.1f} | {answer} | {search.visited:,} "
                  f"| {time.monotonic() - began:.1f} |", flush=True)


if __name__ == "__main__":
    main()
