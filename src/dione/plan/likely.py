"""Among plans that end as late, the one that runs first the work a sweep is likeliest
to keep: each node's tasks listed again by their expected seconds, longest first.

Under a stopping rule a task's length is uncertain: planned at its full length (what
every task may still need), a configuration not yet started counts its every step, more
than a survivor's steps left, and a makespan-only plan is as happy to start the new
configurations first, most of which stop at their first rung, while the survivors wait
(seen on the real sweep of ``benchmarks/selection.py``). Asynchronous successive halving
itself promotes before it starts anything new (Li et al., MLSys 2020, Algorithm 2). So a
plan's tasks keep their option and node, and each node's list is scheduled again in the
order of ``expected_share x seconds`` (a survivor past its last rung: all its seconds; a
new configuration: those its chances at the rungs leave), each at the earliest time its
devices are free; the result is taken only where it ends no later than the plan, so the
makespan the solver proved stands.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from dione.plan.plan import Assignment, Plan, assign_device_ids, left_shift, matching_option
from dione.plan.problem import PlanningProblem
from dione.plan.timeline import NodeTimeline

__all__ = ["likely_first"]


def likely_first(problem: PlanningProblem, plan: Plan) -> Plan:
    """``plan`` with each node's tasks in the order of their expected seconds, longest
    first, where that ends no later; else ``plan`` itself (and always where every task is
    certain to run all its seconds)."""
    tasks = {t.name: t for t in problem.tasks}
    if all(t.expected_share == 1.0 for t in tasks.values()) or not plan.assignments:
        return plan
    lines = {n.name: NodeTimeline(n.devices) for n in problem.nodes}
    for b in problem.busy:
        lines[b.node].reserve(0.0, b.until, len(b.device_ids))
    by_node: dict[str, list[Assignment]] = defaultdict(list)
    for a in plan.assignments:
        by_node[a.node].append(a)
    placed = []
    for node, assignments in by_node.items():
        for a in sorted(assignments, key=lambda a: (
                -tasks[a.task].expected_share * (a.end - a.start), a.start, a.task)):
            option = matching_option(a, tasks[a.task].options)
            if option is None:
                return plan  # not this problem's plan: nothing to reorder
            start = lines[node].earliest_start(option.devices, option.seconds,
                                               tasks[a.task].release)
            lines[node].reserve(start, start + option.seconds, option.devices)
            placed.append((a.task, option, node, start))
    assignments = left_shift(assign_device_ids(placed, problem), problem)
    makespan = max([a.end for a in assignments] + [b.until for b in problem.busy] + [0.0])
    if makespan > plan.makespan * (1 + 1e-9):
        return plan
    return dataclasses.replace(
        plan, makespan=makespan,
        assignments=tuple(sorted(assignments, key=lambda a: (a.start, a.task))),
        notes={**plan.notes, "order": "likeliest work first"})
