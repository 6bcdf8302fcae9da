"""Lower bounds on the makespan that any plan of a problem must reach."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from dione.plan.highs import quiet_highs
from dione.plan.problem import NodeSpec, Option, PlanningProblem, TaskOptions

__all__ = ["energetic_bound", "lower_bound", "min_device_seconds", "min_seconds", "on_grid",
           "work_within_bound"]


def min_seconds(task: TaskOptions, problem: PlanningProblem) -> float:
    """The task's fastest option that fits some node."""
    return min(o.seconds for o in problem.fitting_any_node(task))


def min_device_seconds(task: TaskOptions, problem: PlanningProblem) -> float:
    """The task's least device-time (devices x seconds) over options that fit some node."""
    return min(o.device_seconds for o in problem.fitting_any_node(task))


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
    """The largest of five bounds, each a time no plan can beat:

    - the end of the last running task (a plan ends when its last task does, running
      ones included);
    - the longest task, each at its fastest option (plus when its node frees up,
      when every node is busy with running tasks until then, or its release if later);
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
    bound = max(max(earliest, t.release) + min_seconds(t, problem) for t in tasks)
    bound = max([bound] + [b.until for b in problem.busy])
    area = sum(min_device_seconds(t, problem) for t in tasks) + sum(busy_area.values())
    bound = max(bound, area / problem.total_devices)
    fitting = [problem.fitting_any_node(t) for t in tasks]
    bound = max(bound, work_within_bound(fitting, problem.total_devices,
                                         sum(busy_area.values())))
    if len({n.kind for n in problem.nodes}) > 1 and any(
            o.kind for t in tasks for o in t.options):
        bound = max(bound, kinds_area_bound(problem, busy_area))
    for width in sorted({n.devices for n in problem.nodes})[:-1]:
        wide = [n for n in problem.nodes if n.devices > width]
        needy = [t for t in tasks
                 if min(o.devices for o in t.options) > width]
        if needy:
            need = sum(min_device_seconds(t, problem) for t in needy)
            need += sum(busy_area[n.name] for n in wide)
            bound = max(bound, need / sum(n.devices for n in wide))
    return on_grid(problem, bound)


def on_grid(problem: PlanningProblem, bound: float) -> float:
    """``bound`` raised to the next multiple of the problem's seconds' resolution (their
    tenths, say), where no task is released late and nothing runs: an optimal plan then
    starts each task at 0 or as others end, so its makespan is a sum of options'
    seconds, on that grid. (The Llama 2 sweep's plans of seconds in tenths met a bound of
    30,659.5625 s at 30,659.6 s: "feasible, gap 0.00%", the whole time limit spent on the
    proof: review.)"""
    if problem.busy or any(t.release for t in problem.tasks):
        return bound
    seconds = [o.seconds for t in problem.tasks for o in t.options]
    for digits in range(4):  # whole seconds to milliseconds, as profiles round them
        scale = 10.0 ** digits
        # (A float's error, not a fraction of the grid: 100.0000009 s is off it.)
        if all(abs(s * scale - round(s * scale)) <= 1e-9 * max(1.0, s * scale)
               for s in seconds):
            # (A bound's own rounding, a linear program's tolerance, is not a step up.)
            return max(bound, math.ceil(bound * scale * (1 - 1e-9) - 1e-9) / scale)
    return bound


def kinds_area_bound(problem: PlanningProblem, busy_area: dict[str, float]) -> float:
    """The area bound on nodes of several kinds: the least M at which the tasks, each
    split in fractions over the node kinds at its fewest device-seconds on each, fill
    no kind past its devices x M (a linear program; the plain area bound takes every
    task at its fewest device-seconds on any kind, which on a cluster of fast and slow
    nodes counts the slow ones as fast: 15,330 s against a best plan of 23,446 s on
    the mixed Llama 2 table, this bound 23,307 s)."""
    import highspy

    kinds: dict[str | None, list[NodeSpec]] = {}
    for node in problem.nodes:
        kinds.setdefault(node.kind, []).append(node)
    highs = quiet_highs()
    makespan = 0  # column 0; one column per (task, kind) it fits after it
    lower, upper, cost = [0.0], [highspy.kHighsInf], [1.0]
    per_kind: dict[str | None, dict[int, float]] = {k: {} for k in kinds}
    rows: list[tuple[dict[int, float], float, float]] = []
    for task in problem.tasks:
        shares = {}
        for kind, nodes in kinds.items():
            cheapest = min((o.device_seconds for o in task.options
                            if any(o.fits(n) for n in nodes)), default=None)
            if cheapest is not None:
                shares[len(lower)] = 1.0
                per_kind[kind][len(lower)] = cheapest
                lower.append(0.0)
                upper.append(1.0)
                cost.append(0.0)
        rows.append((shares, 1.0, 1.0))
    for kind, nodes in kinds.items():
        held = sum(busy_area[n.name] for n in nodes)
        rows.append(({**per_kind[kind], makespan: -float(sum(n.devices for n in nodes))},
                     -highspy.kHighsInf, -held))
    highs.addVars(len(lower), np.array(lower), np.array(upper))
    highs.changeColsCost(len(cost), np.arange(len(cost), dtype=np.int32), np.array(cost))
    for terms, low, high in rows:
        highs.addRow(low, high, len(terms), np.array(list(terms), dtype=np.int32),
                     np.array(list(terms.values())))
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return 0.0  # no bound (it cannot be infeasible: every task fits some kind)
    # Less the solver's tolerance, so that rounding never lifts it past a true plan.
    return max(0.0, float(highs.getInfo().objective_function_value) * (1 - 1e-7))


def _overloaded(problem: PlanningProblem, makespan: float, lengths_kept: int) -> bool:
    """Whether energetic reasoning proves that no plan ends by ``makespan``.

    Every task runs within [0, M] at an option no longer than M; in any window [a, b] a
    task of length L on d devices occupies at least d x max(0, min(b - a, L - a,
    b - (M - L))) device-seconds (pushed as far left, or right, as it can go), and a
    moldable task at least the least of that over its options. When the tasks need
    more than the cluster's devices x (b - a) in some window, no plan ends by M. The
    window [0, M] is the area bound; the narrower ones catch long tasks that must
    overlap the middle of the plan. Windows start at 0 or M - L and end at M or L for
    the options' lengths L (``lengths_kept`` of them at most, spread over the range).
    """
    options = []
    for task in problem.tasks:
        fitting = [(o.devices, o.seconds) for o in problem.fitting_any_node(task)
                   if o.seconds <= makespan]
        if not fitting:
            return True
        options.append(fitting)
    # Running tasks: from 0 until they end, on their devices.
    options += [[(len(b.device_ids), b.until)] for b in problem.busy if b.until > 0]
    count = max(len(o) for o in options)
    devices = np.array([[o[min(j, len(o) - 1)][0] for j in range(count)] for o in options],
                       dtype=float)
    seconds = np.array([[o[min(j, len(o) - 1)][1] for j in range(count)] for o in options])
    held = np.array([0.0] * len(problem.tasks) + [1.0] * (len(options) - len(problem.tasks)))
    lengths = np.unique(seconds)
    if len(lengths) > lengths_kept:
        lengths = lengths[np.linspace(0, len(lengths) - 1, lengths_kept).astype(int)]
    begins = np.unique(np.concatenate([[0.0], makespan - lengths, lengths]))
    ends = np.unique(np.concatenate([[makespan], lengths, makespan - lengths]))
    begins = begins[(begins >= 0) & (begins < makespan)][:, None]
    ends = ends[(ends > 0) & (ends <= makespan)][None, :]
    width = ends - begins
    need = np.zeros(width.shape)
    for i in range(len(options)):
        least = None
        for j in range(count):
            length = seconds[i, j]
            if held[i]:  # fixed at [0, until]: its overlap with the window
                overlap = np.minimum(length, ends) - begins
            else:
                overlap = np.minimum(np.minimum(width, length - begins),
                                     ends - (makespan - length))
            energy = devices[i, j] * np.maximum(overlap, 0.0)
            least = energy if least is None else np.minimum(least, energy)
        assert least is not None
        need += least
    capacity = problem.total_devices * width
    return bool(np.any((width > 1e-9) & (need > capacity * (1 + 1e-9) + 1e-6)))


def energetic_bound(problem: PlanningProblem, at_least: float, at_most: float,
                    steps: int = 24, lengths_kept: int = 64) -> float:
    """A lower bound by energetic reasoning (``_overloaded``), searched by bisection in
    [``at_least``, ``at_most``]; ``at_least`` when it proves nothing more.

    Any makespan it finds overloaded is a valid bound, so the bisection needs no
    monotonicity to be sound (only to be as tight as it could be).
    """
    low, high = at_least, at_most
    if not problem.tasks or high <= low or not _overloaded(problem, low, lengths_kept):
        return at_least
    for _ in range(steps):
        middle = (low + high) / 2
        if _overloaded(problem, middle, lengths_kept):
            low = middle
        else:
            high = middle
    return low
