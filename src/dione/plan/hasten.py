"""A plan's tasks ended as early as the devices idle around them allow, no other task moved.

A makespan-optimal plan says nothing of when the tasks before the last end: any end up
to the makespan is as good to the solver. Under a stopping rule it is not: a task that
reaches its rung sooner is judged sooner, and a decision sooner frees devices (a stop)
or lets a winner go on (a promotion). ``hasten`` takes each assignment in start order
and moves it, at the same start, to the option of its task on the same node that ends
it earliest on devices free meanwhile (its own, and others idle over the whole span),
where that ends it at least 1% sooner. Every other assignment keeps its devices and
times, so the plan stays valid and its makespan never grows.
"""

from __future__ import annotations

from dataclasses import replace

from dione.plan.plan import TIME_TOLERANCE, Assignment, Plan
from dione.plan.problem import Option, PlanningProblem

__all__ = ["hasten"]

Span = tuple[float, float, str]  # start, end, the task holding a device then


def hasten(plan: Plan, problem: PlanningProblem) -> Plan:
    """``plan`` with each task at the option ending it soonest on devices left idle."""
    tasks = {t.name: t for t in problem.tasks}
    held: dict[tuple[str, int], list[Span]] = {}
    for busy in problem.busy:
        for device in busy.device_ids:
            held.setdefault((busy.node, device), []).append((float("-inf"), busy.until, ""))
    for a in plan.assignments:
        for device in a.device_ids:
            held.setdefault((a.node, device), []).append((a.start, a.end, a.task))
    result = []
    for a in sorted(plan.assignments, key=lambda a: (a.start, a.task)):
        task = tasks.get(a.task)
        faster = _faster(a, task.fitting(problem.node(a.node)) if task else [], held,
                         problem.node(a.node).devices)
        if faster is not None:
            for device in a.device_ids:
                held[(a.node, device)].remove((a.start, a.end, a.task))
            for device in faster.device_ids:
                held.setdefault((a.node, device), []).append(
                    (faster.start, faster.end, a.task))
            a = faster
        result.append(a)
    # The last end, busy devices' included (the solvers count them alike).
    last = max([*(a.end for a in result), *(b.until for b in problem.busy)], default=0.0)
    return replace(plan, assignments=tuple(result), makespan=min(plan.makespan, last))


def _faster(a: Assignment, options: list[Option], held: dict[tuple[str, int], list[Span]],
            size: int) -> Assignment | None:
    """The assignment of ``a``'s task at ``a``'s start ending it soonest, 1% sooner at
    least, on devices of its node free over the whole span (None: no such option)."""
    best: Assignment | None = None
    # Its own devices first (a slice may go on where it ran), then the lowest free.
    order = [*a.device_ids, *(d for d in range(size) if d not in a.device_ids)]
    for option in options:
        end = a.start + option.seconds
        if end > a.end - max(TIME_TOLERANCE, 0.01 * (a.end - a.start)):
            continue
        if best is not None and end >= best.end:
            continue
        free = [d for d in order
                if all(e <= a.start + TIME_TOLERANCE or s >= end - TIME_TOLERANCE
                       or who == a.task for s, e, who in held.get((a.node, d), []))]
        if len(free) < option.devices:
            continue
        best = Assignment(a.task, option.technique, dict(option.knobs), a.node,
                          tuple(sorted(free[:option.devices])), a.start, end)
    return best
