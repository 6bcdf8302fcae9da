"""Lower bounds on the makespan that any plan of a problem must reach."""

from __future__ import annotations

from dione.plan.problem import PlanningProblem, TaskOptions

__all__ = ["lower_bound", "min_device_seconds", "min_seconds"]


def min_seconds(task: TaskOptions, problem: PlanningProblem) -> float:
    """The task's fastest option that fits some node."""
    widest = max(n.devices for n in problem.nodes)
    return min(o.seconds for o in task.options if o.devices <= widest)


def min_device_seconds(task: TaskOptions, problem: PlanningProblem) -> float:
    """The task's least device-time (devices x seconds) over options that fit some node."""
    widest = max(n.devices for n in problem.nodes)
    return min(o.device_seconds for o in task.options if o.devices <= widest)


def lower_bound(problem: PlanningProblem) -> float:
    """The largest of three bounds, each a time no plan can beat:

    - the longest task, each at its fastest option (plus when its node frees up,
      when every node is busy with running tasks until then);
    - all tasks' least device-time spread over all devices, counting the time devices
      are still held by running tasks;
    - the same restricted to the nodes wider than w, for the tasks that need more
      than w devices whatever option they take (refines the bound when narrow nodes
      cannot help the widest tasks).
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
    for width in sorted({n.devices for n in problem.nodes})[:-1]:
        wide = [n for n in problem.nodes if n.devices > width]
        needy = [t for t in tasks
                 if min(o.devices for o in t.options) > width]
        if needy:
            need = sum(min_device_seconds(t, problem) for t in needy)
            need += sum(busy_area[n.name] for n in wide)
            bound = max(bound, need / sum(n.devices for n in wide))
    return bound
