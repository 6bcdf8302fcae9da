"""Lower bounds on the makespan that any plan of a problem must reach."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from dione.plan.problem import Option, PlanningProblem, TaskOptions

__all__ = ["lower_bound", "min_device_seconds", "min_seconds", "work_within_bound"]


def min_seconds(task: TaskOptions, problem: PlanningProblem) -> float:
    """The task's fastest option that fits some node."""
    widest = max(n.devices for n in problem.nodes)
    return min(o.seconds for o in task.options if o.devices <= widest)


def min_device_seconds(task: TaskOptions, problem: PlanningProblem) -> float:
    """The task's least device-time (devices x seconds) over options that fit some node."""
    widest = max(n.devices for n in problem.nodes)
    return min(o.device_seconds for o in task.options if o.devices <= widest)


def work_within_bound(options: Sequence[Sequence[Option]], capacity: int, held: float = 0.0
                      ) -> float:
    """The least makespan M at which every task's cheapest option no longer than M fits
    the area: sum over tasks of min{devices x seconds : seconds <= M} + ``held`` <=
    ``capacity`` x M.

    A plan of makespan M runs each task at an option no longer than M, so this is a lower
    bound; it is tighter than the plain area bound when the cheapest options are long
    (one device for hours) and a short plan must pay for faster, wider ones.
    """
    if not options:
        return held / capacity
    # Below the slowest task's fastest option no plan exists; above it the needed area
    # only falls, step by step at each option's length, while capacity x M grows.
    floor = max(min(o.seconds for o in task) for task in options)
    steps = sorted({o.seconds for task in options for o in task if o.seconds >= floor}
                   | {floor})

    def need(limit: float) -> float:
        return held + sum(min(o.device_seconds for o in task if o.seconds <= limit)
                          for task in options)

    # The first step at whose end the area fits (need(step) <= capacity x next step).
    def fits_by_next(index: int) -> bool:
        after = steps[index + 1] if index + 1 < len(steps) else float("inf")
        return need(steps[index]) <= capacity * after

    index = bisect.bisect_left(range(len(steps)), True, key=fits_by_next)
    return max(steps[index], need(steps[index]) / capacity)


def lower_bound(problem: PlanningProblem) -> float:
    """The largest of four bounds, each a time no plan can beat:

    - the longest task, each at its fastest option (plus when its node frees up,
      when every node is busy with running tasks until then);
    - all tasks' least device-time spread over all devices, counting the time devices
      are still held by running tasks;
    - the same restricted to the nodes wider than w, for the tasks that need more
      than w devices whatever option they take (refines the bound when narrow nodes
      cannot help the widest tasks);
    - the area of the cheapest options no longer than the plan itself
      (``work_within_bound``), which charges long tasks for the faster options a short
      plan forces on them.
    """
    tasks = problem.tasks
    if not tasks:
        return max((b.until for b in problem.busy), default=0.0)
    busy_area = {n.name: 0.0 for n in problem.nodes}
    for b in problem.busy:
        busy_area[b.node] += b.until * len(b.device_ids)
    # No task starts before some device somewhere is free.
    earliest = min(min(times) for times in problem.free_at().values())
    bound = max(earliest + min_seconds(t, problem) for t in tasks)
    area = sum(min_device_seconds(t, problem) for t in tasks) + sum(busy_area.values())
    bound = max(bound, area / problem.total_devices)
    widest = max(n.devices for n in problem.nodes)
    fitting = [[o for o in t.options if o.devices <= widest] for t in tasks]
    bound = max(bound, work_within_bound(fitting, problem.total_devices,
                                         sum(busy_area.values())))
    for width in sorted({n.devices for n in problem.nodes})[:-1]:
        wide = [n for n in problem.nodes if n.devices > width]
        needy = [t for t in tasks
                 if min(o.devices for o in t.options) > width]
        if needy:
            need = sum(min_device_seconds(t, problem) for t in needy)
            need += sum(busy_area[n.name] for n in wide)
            bound = max(bound, need / sum(n.devices for n in wide))
    return bound
