"""A plan: for every task one option, a node, device ids and a start time; and its checker."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dione.plan.problem import NodeSpec, Option, PlanningProblem

__all__ = [
    "Assignment",
    "Plan",
    "assign_device_ids",
    "assignment_from_json",
    "check_plan",
    "left_shift",
    "load_plan",
    "matching_option",
]

# Plans are JSON with times in seconds: allow float rounding, never real overlap.
TIME_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Assignment:
    """Task ``task`` runs ``option`` on ``device_ids`` of ``node`` from ``start`` to ``end``."""

    task: str
    technique: str
    knobs: Mapping[str, Any]
    node: str
    device_ids: tuple[int, ...]
    start: float
    end: float

    @property
    def devices(self) -> int:
        return len(self.device_ids)

    def shifted(self, seconds: float) -> Assignment:
        """The same assignment ``seconds`` later (a plan's times moved onto a run's clock)."""
        return replace(self, knobs=dict(self.knobs), start=self.start + seconds,
                       end=self.end + seconds)

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "technique": self.technique, "knobs": dict(self.knobs),
                "node": self.node, "device_ids": list(self.device_ids),
                "start": self.start, "end": self.end}


@dataclass(frozen=True)
class Plan:
    """The solver's answer, with its status, makespan and proven lower bound together."""

    solver: str
    status: str  # optimal | feasible | infeasible | unknown
    makespan: float
    lower_bound: float
    assignments: tuple[Assignment, ...]
    solve_seconds: float = 0.0
    notes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        """makespan / lower bound - 1: 0 where the plan meets its bound; an ``optimal``
        plan proven on CP-SAT's tick grid may keep a gap of at most that grid's rounding."""
        return self.makespan / self.lower_bound - 1 if self.lower_bound > 0 else 0.0

    def assignment(self, task: str) -> Assignment:
        for a in self.assignments:
            if a.task == task:
                return a
        raise KeyError(task)

    def to_json(self) -> dict[str, Any]:
        # A plan not found has an infinite makespan, which strict JSON cannot hold.
        makespan = self.makespan if math.isfinite(self.makespan) else None
        return {"solver": self.solver, "status": self.status, "makespan": makespan,
                "lower_bound": self.lower_bound, "solve_seconds": self.solve_seconds,
                "notes": dict(self.notes),
                "assignments": [a.to_json() for a in self.assignments]}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Plan:
        try:
            return Plan(
                solver=str(data["solver"]), status=str(data["status"]),
                makespan=_finite(data, "makespan"), lower_bound=_finite(data, "lower_bound"),
                solve_seconds=float(data.get("solve_seconds", 0.0)),
                notes=dict(data.get("notes", {})),
                assignments=tuple(assignment_from_json(a) for a in data["assignments"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a plan: {type(err).__name__}: {err}") from None


def assignment_from_json(data: Mapping[str, Any]) -> Assignment:
    """An assignment as ``Assignment.to_json`` writes it (extra fields ignored)."""
    ids = data["device_ids"]
    if not isinstance(ids, list) or any(
            not isinstance(d, int) or isinstance(d, bool) for d in ids):
        raise ValueError(f"task {data.get('task')!r}: device_ids must be a list of "
                         f"integers, not {ids!r}")
    return Assignment(str(data["task"]), str(data["technique"]), dict(data.get("knobs", {})),
                      str(data["node"]), tuple(ids), _finite(data, "start"),
                      _finite(data, "end"))


def _finite(data: Mapping[str, Any], field: str) -> float:
    value = float(data[field])
    if not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number of seconds, not {value}")
    return value


def load_plan(path: str | Path) -> Plan:
    return Plan.from_json(json.loads(Path(path).read_text()))


def matching_option(assignment: Assignment, options: Sequence[Option],
                    node: NodeSpec | None = None) -> Option | None:
    """The option of ``options`` that ``assignment`` runs on ``node`` (its kind's, where
    options differ by kind; None: none of them)."""
    knobs = json.dumps(dict(assignment.knobs), sort_keys=True)
    for option in options:
        if option.key()[:3] == (assignment.technique, knobs, assignment.devices) and (
                node is None or option.kind in (None, node.kind)):
            return option
    return None


def check_plan(plan: Plan, problem: PlanningProblem) -> list[str]:
    """Every reason ``plan`` is not a valid plan of ``problem`` (empty: it is valid).

    Valid (DESIGN.md): every task has exactly one assignment taken from its options,
    its length equals that option's seconds, and no device holds two tasks at once
    (nor a task while it is busy with one already running).
    """
    reasons = []
    nodes = {n.name: n for n in problem.nodes}
    tasks = {t.name: t for t in problem.tasks}
    seen: dict[str, int] = defaultdict(int)
    for a in plan.assignments:
        seen[a.task] += 1
    for name in tasks:
        if seen[name] == 0:
            reasons.append(f"task {name!r} has no assignment")
        elif seen[name] > 1:
            reasons.append(f"task {name!r} has {seen[name]} assignments")
    for name in seen:
        if name not in tasks:
            reasons.append(f"task {name!r} is not in the problem")
    occupancy: dict[tuple[str, int], list[tuple[float, float, str]]] = defaultdict(list)
    for b in problem.busy:
        for device in b.device_ids:
            occupancy[(b.node, device)].append((0.0, b.until, f"running task {b.task!r}"))
    for a in plan.assignments:
        where = f"task {a.task!r}"
        if a.task in tasks and a.node in nodes:  # (an unknown node is said below)
            option = matching_option(a, tasks[a.task].options, nodes[a.node])
            if option is None:
                kind = nodes[a.node].kind
                reasons.append(f"{where}: {a.technique} {dict(a.knobs)} on {a.devices} devices "
                               f"is not one of its options"
                               f"{f' on nodes of kind {kind}' if kind else ''}")
            elif a.node in tasks[a.task].avoid:
                reasons.append(f"{where}: placed on node {a.node}, which it avoids")
            # The tolerance, plus what rounding end - start can lose far from time 0.
            elif abs((a.end - a.start) - option.seconds) > TIME_TOLERANCE * max(
                    1.0, option.seconds) + 4 * math.ulp(abs(a.end)):
                reasons.append(f"{where}: runs {a.end - a.start:g} s, but its option takes "
                               f"{option.seconds:g} s")
        if a.start < -TIME_TOLERANCE:
            reasons.append(f"{where}: starts at {a.start:g} s, before time 0")
        elif a.task in tasks and a.start < tasks[a.task].release - TIME_TOLERANCE * max(
                1.0, tasks[a.task].release):
            reasons.append(f"{where}: starts at {a.start:g} s, before its release at "
                           f"{tasks[a.task].release:g} s")
        node = nodes.get(a.node)
        if node is None:
            reasons.append(f"{where}: unknown node {a.node!r}")
            continue
        if len(set(a.device_ids)) != len(a.device_ids):
            reasons.append(f"{where}: device ids {list(a.device_ids)} repeat a device")
        outside = [d for d in a.device_ids if not 0 <= d < node.devices]
        if outside:
            reasons.append(f"{where}: node {a.node!r} has no device(s) {outside}")
        if a.end - a.start <= TIME_TOLERANCE:
            continue  # no device time: it holds no device from anything else
        for device in set(a.device_ids):
            occupancy[(a.node, device)].append((a.start, a.end, where))
    for (node_name, device), spans in occupancy.items():
        spans.sort()
        for i, (_, end, first) in enumerate(spans):  # every pair, not only neighbours
            for start, other_end, second in spans[i + 1:]:
                if start >= end - TIME_TOLERANCE:
                    break  # sorted by start: none later overlaps this one
                reasons.append(f"device {device} of node {node_name!r} holds {first} and "
                               f"{second} at once (from {start:g} s to "
                               f"{min(end, other_end):g} s)")
    if plan.assignments:  # the running tasks count: the makespan is when all work ends
        latest = max([a.end for a in plan.assignments] + [b.until for b in problem.busy])
        if abs(latest - plan.makespan) > TIME_TOLERANCE * max(1.0, latest):
            reasons.append(f"makespan {plan.makespan:g} s is not the last end, {latest:g} s")
    # Each assignment may lose up to the tolerance (a task of under a microsecond holds
    # no device time at all), so the bound may pass the makespan by that much per task.
    if plan.lower_bound > plan.makespan * (1 + TIME_TOLERANCE) \
            + TIME_TOLERANCE * max(1, len(plan.assignments)):
        reasons.append(f"lower_bound {plan.lower_bound:g} s is above the makespan "
                       f"{plan.makespan:g} s: no plan ends before its own bound")
    return reasons


def assign_device_ids(
    placed: Sequence[tuple[str, Option, str, float]], problem: PlanningProblem
) -> list[Assignment]:
    """Give each placed (task, option, node, start) device ids, in start order.

    Any placement within each node's device count admits this: at a task's start at
    most ``capacity - demand`` devices are busy, so enough are free. Among the free
    devices it takes those that became free last, which keeps long idle devices
    together for wide tasks.
    """
    free_at = problem.free_at()
    result = []
    for task, option, node, start in sorted(placed, key=lambda p: (p[3], -p[1].devices)):
        times = free_at[node]
        if option.seconds <= TIME_TOLERANCE:  # no device time to speak of: any devices do
            chosen = sorted(range(len(times)), key=lambda d: (times[d], d))[: option.devices]
            result.append(Assignment(task, option.technique, dict(option.knobs), node,
                                     tuple(sorted(chosen)), start, start))
            continue
        # Devices free by the start; only if too few, those free within the relative
        # tolerance of a solver's rounding (a device free 0.5 s later at 1e6 s must not
        # look free while another is).
        free = [d for d, t in enumerate(times) if t <= start + TIME_TOLERANCE]
        if len(free) < option.devices:
            free = [d for d, t in enumerate(times)
                    if t <= start + TIME_TOLERANCE * max(1.0, start)]
        if len(free) < option.devices:
            raise ValueError(f"task {task!r}: only {len(free)} of {option.devices} devices of "
                             f"node {node!r} are free at {start:g} s; the placement "
                             "exceeds the node's capacity")
        chosen = sorted(sorted(free, key=lambda d: (-times[d], d))[: option.devices])
        end = start + option.seconds
        for d in chosen:
            times[d] = end
        result.append(Assignment(task, option.technique, dict(option.knobs), node,
                                 tuple(chosen), start, end))
    return result


def left_shift(assignments: Sequence[Assignment], problem: PlanningProblem) -> list[Assignment]:
    """Re-time assignments exactly: in their start order, each starts as soon as all its
    devices are free and not before its release. Keeps every device's order, so it
    stays valid and ends no later; it removes what rounding (integer ticks, solver
    tolerances) added to the times."""
    free = problem.free_at()
    release = problem.releases()
    result = []
    for a in sorted(assignments, key=lambda a: (a.start, a.task)):
        begin = max([release.get(a.task, 0.0), *(free[a.node][d] for d in a.device_ids)])
        length = a.end - a.start
        if length <= TIME_TOLERANCE:
            # No device time: it delays nothing after it (it sorted after tasks that
            # start with it and would otherwise hold their devices' next tasks back).
            result.append(Assignment(a.task, a.technique, dict(a.knobs), a.node,
                                     a.device_ids, begin, begin))
            continue
        for d in a.device_ids:
            free[a.node][d] = begin + length
        result.append(Assignment(a.task, a.technique, dict(a.knobs), a.node, a.device_ids,
                                 begin, begin + length))
    return result
