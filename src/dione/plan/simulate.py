"""Replays a plan when tasks take longer or shorter than estimated, with or without re-planning.

Each task's actual length is its planned option's seconds times a lognormal factor
(median 1, ``sigma`` the standard deviation of its log). Replay keeps the plan's order
on every device and starts each task as soon as all its devices are free (nobody waits
for a planned clock time). With re-planning, every time a task ends the tasks not yet
started are planned again around the running ones, whose remaining time is known from
their measured speed (as dione's introspection knows it): the re-planner is told the
truth about running tasks and only estimates about the rest.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dione.plan.plan import Plan
from dione.plan.problem import Busy, PlanningProblem

__all__ = ["Simulation", "noisy_lengths", "simulate"]

Planner = Callable[[PlanningProblem], Plan]


@dataclass(frozen=True)
class Simulation:
    """What happened: the actual makespan, the first plan's, and how often it re-planned."""

    makespan: float
    planned_makespan: float
    replans: int


def noisy_lengths(problem: PlanningProblem, sigma: float, seed: int) -> dict[str, float]:
    """Each task's actual/estimated factor, the same whatever option it ends up with."""
    rng = random.Random(seed)
    return {t.name: math.exp(rng.gauss(0.0, sigma)) for t in problem.tasks}


def _queues(plan: Plan) -> dict[tuple[str, int], deque[str]]:
    queues: dict[tuple[str, int], deque[str]] = {}
    for a in sorted(plan.assignments, key=lambda a: (a.start, a.task)):
        for device in a.device_ids:
            queues.setdefault((a.node, device), deque()).append(a.task)
    return queues


def simulate(problem: PlanningProblem, planner: Planner, factors: dict[str, float],
             replan: bool) -> Simulation:
    """Run ``planner``'s plan of ``problem`` with actual lengths = seconds x factor."""
    plan = planner(problem)
    planned_makespan = plan.makespan
    assignments = {a.task: a for a in plan.assignments}
    queues = _queues(plan)
    running: dict[str, float] = {}  # task -> actual end
    devices_of: dict[str, tuple[str, tuple[int, ...]]] = {}
    started: set[str] = set()
    held: dict[tuple[str, int], str] = {}  # device -> the running task on it
    now, replans = 0.0, 0

    def start_ready() -> None:
        progress = True
        while progress:
            progress = False
            for name, a in list(assignments.items()):
                if name in started:
                    continue
                keys = [(a.node, d) for d in a.device_ids]
                if all(queues[k] and queues[k][0] == name and k not in held for k in keys):
                    for k in keys:
                        queues[k].popleft()
                        held[k] = name
                    started.add(name)
                    running[name] = now + (a.end - a.start) * factors[name]
                    devices_of[name] = (a.node, a.device_ids)
                    progress = True

    start_ready()
    while running:
        name = min(running, key=lambda n: running[n])
        now = running.pop(name)
        node, ids = devices_of[name]
        for d in ids:
            held.pop((node, d))
        waiting = [t for t in problem.tasks if t.name not in started]
        if replan and waiting:
            busy = tuple(Busy(n, devices_of[n][0], devices_of[n][1], end - now)
                         for n, end in running.items())
            remaining = PlanningProblem(problem.nodes, tuple(waiting), busy)
            new_plan = planner(remaining)
            replans += 1
            assignments = {a.task: a for a in new_plan.assignments}
            queues = {k: deque() for k in queues}
            for key, order in _queues(new_plan).items():
                queues[key] = order
        start_ready()
    if len(started) != len(problem.tasks):
        raise RuntimeError("the replay stalled: the plan's device orders disagree")
    return Simulation(now, planned_makespan, replans)
