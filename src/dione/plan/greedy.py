"""Fast heuristics: list scheduling of efficient options, then widening the critical tasks.

``greedy`` chooses every task's option for a target makespan T, as two-phase schedulers
of malleable tasks do: the fewest device-seconds among the options no longer than T
(the fastest if none is). Each target's choice is list-scheduled, longest first, onto
the node where each task ends earliest; the best of a sweep of targets is then improved
by giving the task that ends last (and, failing that, the longest tasks) a faster, wider
option while that shortens the plan. On nodes of different sizes it also tries the
tasks that the fewest devices can hold first, puts a task on the smallest node where it
ends as early, and lets the improvement give a task a narrower option too, one that more
nodes can hold (mixed-1, nodes of 8, 4 and 4: 18,189 s against 21,120 s without these).
``sequential`` is current practice: each task in turn on a whole node at its fastest
option there.

The improvement passes are bounded by work (task placements evaluated), not by wall
time, so the same problem gives the same greedy plan on a quiet or a busy machine, and
``cpsat``, which starts from this plan, can promise never to be worse than it. The wall
time limit only stops a pass that would otherwise run far too long (a plan cut that way
says so in its notes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dione.plan.bounds import lower_bound
from dione.plan.plan import Plan, assign_device_ids, left_shift
from dione.plan.problem import Option, PlanningProblem
from dione.plan.timeline import NodeTimeline

__all__ = [
    "GREEDY_WORK",
    "GreedyResult",
    "Placement",
    "greedy",
    "greedy_placements",
    "list_schedule",
    "placements_plan",
    "sequential",
    "spread",
]

Placement = tuple[str, Option, str, float]  # task, option, node, start

# Task placements (one task tried on one node) the improvement passes may evaluate: about
# 3 s on one core of this machine; a medium instance (100 tasks, 8 nodes) gets 400 trials.
GREEDY_WORK = 1_000_000
# Task placements that cost about what a unit of CP-SAT's deterministic time does in wall
# time (5 s): 3-4 us a placement here on 1,000 tasks and 64 nodes. A simulation counts a
# re-plan's greedy work in these units beside CP-SAT's own: uncounted, a re-plan of 800
# tasks that greedy alone planned (4 s) cost the virtual clock nothing, and the run
# re-planned at every slice end.
PLACEMENTS_PER_UNIT = 1_500_000


def _timelines(problem: PlanningProblem) -> dict[str, NodeTimeline]:
    lines = {n.name: NodeTimeline(n.devices) for n in problem.nodes}
    for b in problem.busy:
        lines[b.node].reserve(0.0, b.until, len(b.device_ids))
    return lines


def list_schedule(
    problem: PlanningProblem, choice: dict[str, Option], order: Sequence[str],
    demand: Callable[[Option, int], int] = lambda option, _: option.devices,
) -> tuple[list[Placement], float]:
    """Place tasks in ``order``, each at the node and time where its chosen option ends
    earliest (on nodes of several kinds, the same technique, knobs and width on each
    kind it has an option for); ``demand(option, node devices)`` is the devices it
    blocks. Returns the placements and their makespan."""
    lines = _timelines(problem)
    placed: list[Placement] = []
    makespan = max((b.until for b in problem.busy), default=0.0)
    release = problem.releases()
    tasks = {t.name: t for t in problem.tasks}
    kinds = len({n.kind for n in problem.nodes}) > 1
    for name in order:
        chosen, task = choice[name], tasks[name]
        # Per node kind, the option it runs there (one of no kind: every node's): the
        # same technique and width, at that kind's fastest knobs.
        twins: dict[str | None, Option] = {}
        if kinds and chosen.kind:
            for o in task.options:
                if o.technique == chosen.technique and o.devices == chosen.devices and (
                        o.kind not in twins or o.seconds < twins[o.kind].seconds):
                    twins[o.kind] = o
            twins[chosen.kind] = chosen
        ready = release.get(name, 0.0)
        best: tuple[float, int, float, str, Option] | None = None
        empty: set[tuple[int, str | None]] = set()  # nodes with nothing on them, one seen
        for node in problem.nodes:
            option = twins.get(node.kind, chosen) if twins else chosen
            if not task.may_run(option, node):
                continue
            if lines[node.name].empty:
                # Every node with nothing on it of one size (and kind) gives the same
                # end, and the first such wins a tie: the others need no look (a cluster
                # of hundreds of nodes took most of a re-plan's time here).
                if (node.devices, node.kind) in empty:
                    continue
                empty.add((node.devices, node.kind))
            need = demand(option, node.devices)
            if best is not None and \
                    max(lines[node.name].first_free(need), ready) + option.seconds \
                    > best[0] + 1e-9:
                continue  # it cannot end as early here: the search would not take it
            start = lines[node.name].earliest_start(need, option.seconds, ready)
            end = start + option.seconds
            # Where it ends as early, the smallest node: the larger ones stay free for
            # tasks that only they can hold.
            if best is None or end < best[0] - 1e-9 or \
                    (end <= best[0] + 1e-9 and node.devices < best[1]):
                best = (end, node.devices, start, node.name, option)
        if best is None:
            raise ValueError(f"task {name!r}: option {chosen.technique} on {chosen.devices} "
                             "devices fits no node")
        end, _, start, node_name, option = best
        lines[node_name].reserve(start, end, demand(option, problem.node(node_name).devices))
        placed.append((name, option, node_name, start))
        makespan = max(makespan, end)
    return placed, makespan


def placements_plan(
    solver: str, status: str, problem: PlanningProblem, placed: Sequence[Placement],
    began: float, bound: float | None = None, notes: dict[str, object] | None = None,
) -> Plan:
    """A plan from placements: device ids assigned, makespan and bound reported."""
    assignments = left_shift(assign_device_ids(placed, problem), problem)
    makespan = max([a.end for a in assignments] + [b.until for b in problem.busy] + [0.0])
    return Plan(solver=solver, status=status, makespan=makespan,
                lower_bound=lower_bound(problem) if bound is None else bound,
                assignments=tuple(sorted(assignments, key=lambda a: (a.start, a.task))),
                solve_seconds=time.perf_counter() - began, notes=notes or {})


_ORDERS: tuple[Callable[[Option], tuple[float, ...]], ...] = (
    lambda o: (-o.seconds,),  # longest first
    lambda o: (-o.device_seconds,),  # most work first
    lambda o: (-o.devices, -o.seconds),  # widest first
)


def _mixed(problem: PlanningProblem) -> bool:
    """Whether the nodes differ in size or kind."""
    return len({(n.devices, n.kind) for n in problem.nodes}) > 1


def _orders(problem: PlanningProblem, choice: dict[str, Option]) -> list[list[str]]:
    names = [t.name for t in problem.tasks]
    orders = [sorted(names, key=lambda n: (*order(choice[n]), n)) for order in _ORDERS]
    if _mixed(problem):
        # On nodes of different sizes or kinds, the tasks fewest devices can hold first
        # (then longest first): placed early, they are not left waiting for the nodes
        # that tasks others could hold took.
        room: dict[tuple[int, str | None], int] = {}

        def holders(option: Option) -> int:
            key = (option.devices, option.kind)
            if key not in room:
                room[key] = sum(n.devices for n in problem.nodes if option.fits(n))
            return room[key]

        orders.append(sorted(names, key=lambda n: (holders(choice[n]), -choice[n].seconds, n)))
    return orders


def _best_order(problem: PlanningProblem, choice: dict[str, Option]
                ) -> tuple[list[Placement], float]:
    results = [list_schedule(problem, choice, order) for order in _orders(problem, choice)]
    return min(results, key=lambda r: r[1])


def greedy(problem: PlanningProblem, time_limit: float = 10.0) -> Plan:
    """List scheduling with improvement passes bounded by work; ``time_limit`` s is only a
    safety stop."""
    began = time.perf_counter()
    result = greedy_placements(problem, time_limit)
    return placements_plan("greedy", "feasible", problem, result.placed, began,
                           notes=result.notes())


# Targets, as multiples of the lower bound; infinity: every task at its fewest
# device-seconds, whatever its length.
TARGETS = (1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, math.inf)


def allotment(problem: PlanningProblem, target: float) -> dict[str, Option]:
    """Per task, the fewest device-seconds among options of at most ``target`` seconds
    (the fastest option where none is that short)."""
    choice = {}
    for task in problem.tasks:
        fits = problem.fitting_any_node(task)
        short = [o for o in fits if o.seconds <= target]
        choice[task.name] = (min(short, key=lambda o: (o.device_seconds, o.seconds)) if short
                             else min(fits, key=lambda o: (o.seconds, o.device_seconds)))
    return choice


@dataclass
class GreedyResult:
    """The greedy placements, their makespan, and what the search did to find them."""

    placed: list[Placement]
    makespan: float
    trials: int
    cut_by_time: bool
    work: int = 0  # task placements evaluated, the list schedules of each target included

    @property
    def units(self) -> float:
        """``work`` in CP-SAT's deterministic time, for a simulation to charge."""
        return self.work / PLACEMENTS_PER_UNIT

    def notes(self) -> dict[str, object]:
        notes: dict[str, object] = {"improvement_trials": self.trials}
        if self.cut_by_time:
            notes["cut_by_time"] = ("the time limit stopped the improvement passes before "
                                    "their work budget: another run may give another plan")
        return notes


def greedy_placements(problem: PlanningProblem, time_limit: float | None = 10.0,
                      work: int = GREEDY_WORK) -> GreedyResult:
    """The greedy placements within ``work`` task placements (``time_limit`` seconds at
    most; None: no wall-time stop, fully reproducible).

    Every target's allotment is improved, not just the best one: a tight target can
    start worse than a loose one and still improve to a better plan (one long task made
    wide, then the tasks that had to wait for it widened in turn).
    """
    began = time.perf_counter()
    deadline = math.inf if time_limit is None else began + time_limit
    bound = lower_bound(problem)
    best: tuple[list[Placement], float] | None = None
    trials, spent, cut, built = 0, 0, False, 0
    targets = _affordable_targets(problem, work)
    per_trial = _trial_work(problem)  # a target's list schedules cost one trial's work
    for index, factor in enumerate(targets):
        if best is not None and time.perf_counter() > deadline:
            cut = True
            break
        share = (work - spent) // (len(targets) - index)
        choice = allotment(problem, bound * factor)
        placed, makespan = _best_order(problem, choice)
        improvement = _improve(problem, choice, placed, makespan, share, deadline)
        placed, makespan = improvement.placed, improvement.makespan
        trials += improvement.trials
        spent += improvement.trials * per_trial
        built += per_trial
        cut = cut or improvement.cut_by_time
        if best is None or makespan < best[1] - 1e-9:
            best = (placed, makespan)
    assert best is not None
    # Current practice too: where every option scales linearly, whole nodes in turn are
    # optimal, and the allotments above (the fewest device-seconds first) can miss it.
    placed, makespan = whole_nodes_in_turn(problem)
    if makespan < best[1] - 1e-9:
        best = (placed, makespan)
    return GreedyResult(best[0], best[1], trials, cut, spent + built + per_trial)


def _affordable_targets(problem: PlanningProblem, work: int) -> tuple[float, ...]:
    """Every target, unless their list schedules alone would take more than ``work``:
    then as many as half of it pays for, spread evenly from the tightest to infinity (the
    other half for improvement). A re-plan of 800 tasks on 64 nodes built 13 targets'
    schedules, 10 s of wall time, with work left for a few improvement trials only."""
    base = _trial_work(problem)  # one target's list schedules: one trial's work
    if len(TARGETS) * base <= work:
        return TARGETS
    count = max(1, work // (2 * base))
    if count == 1:
        return TARGETS[:1]
    last = len(TARGETS) - 1
    return tuple(TARGETS[round(i * last / (count - 1))] for i in range(count))


def _trial_work(problem: PlanningProblem) -> int:
    """Task placements one trial evaluates: every order, every task, every node."""
    orders = len(_ORDERS) + _mixed(problem)
    return orders * len(problem.tasks) * len(problem.nodes)


def _improve(problem: PlanningProblem, choice: dict[str, Option], placed: list[Placement],
             makespan: float, work: int, deadline: float) -> GreedyResult:
    """Widen the last-ending, then the longest tasks, one faster option at a time, while
    that shortens the plan (first improvement wins, then start over)."""
    tasks = {t.name: t for t in problem.tasks}
    max_trials = work // _trial_work(problem)
    mixed = _mixed(problem)
    trials = 0
    improved = True
    while improved and trials < max_trials:
        if time.perf_counter() > deadline:
            return GreedyResult(placed, makespan, trials, True)
        improved = False
        ends = sorted(((start + option.seconds, name) for name, option, _, start in placed),
                      reverse=True)
        last = [name for _, name in ends[:3]]
        longest = sorted(tasks, key=lambda n: -choice[n].seconds)[:10]
        for name in dict.fromkeys(last + longest):
            # Faster options, and on nodes of different sizes or kinds narrower ones
            # and those of other kinds too: a task that only the large (or fast) nodes
            # can hold may end sooner on a small (or slow) one.
            current = choice[name]
            others = sorted((o for o in problem.fitting_any_node(tasks[name])
                             if o.seconds < current.seconds
                             or (mixed and (o.devices < current.devices
                                            or o.kind != current.kind))),
                            key=lambda o: o.device_seconds)
            for option in others:
                trial = {**choice, name: option}
                trial_placed, trial_makespan = _best_order(problem, trial)
                trials += 1
                if trial_makespan < makespan - 1e-9:
                    choice, placed, makespan = trial, trial_placed, trial_makespan
                    improved = True
                    break
                if trials >= max_trials:
                    break
            if improved or trials >= max_trials:
                break
    return GreedyResult(placed, makespan, trials, False)


# The techniques HyperSched and Ray Tune's ResourceChangingScheduler widen a trial with.
DATA_PARALLEL = ("single", "ddp")


def spread(problem: PlanningProblem) -> Plan:
    """Freed devices spread evenly (HyperSched, SoCC 2019; Ray Tune's
    ``ResourceChangingScheduler`` with ``DistributeResources``), a baseline for model
    selection: the cluster's devices shared equally by the tasks there are (those to
    plan and those running), each at the widest data-parallel option within its share,
    but never below its base: the width where it spends the fewest device-seconds, as a
    user sizes a trial for its model (``DistributeResources`` gives each trial at least
    its base resources). A model whose replica fits no device scales as sharded data
    parallel (``fsdp``) instead (at one device each, a 6.7B model of the planner's
    families would take 13 times its 8-device time). Placed in the problem's order
    where it ends earliest. No solver: a rule, applied at every re-plan."""
    began = time.perf_counter()
    running = {b.task for b in problem.busy} - {t.name for t in problem.tasks}
    share = max(1, sum(n.devices for n in problem.nodes)
                // max(1, len(problem.tasks) + len(running)))
    choice = {}
    for task in problem.tasks:
        fits = problem.fitting_any_node(task)
        family = ([o for o in fits if o.technique in DATA_PARALLEL]
                  or [o for o in fits if o.technique == "fsdp"] or fits)
        base = min(family, key=lambda o: (o.devices * o.seconds, o.devices)).devices
        within = [o for o in family if o.devices <= max(share, base)]
        choice[task.name] = max(within, key=lambda o: (o.devices, -o.seconds))
    placed, _ = list_schedule(problem, choice, [t.name for t in problem.tasks])
    return placements_plan("spread", "feasible", problem, placed, began)


def sequential(problem: PlanningProblem) -> Plan:
    """Current practice: tasks in the given order, each alone on a whole node at its
    fastest option there; nodes work side by side, each on one task at a time (a task
    goes where it ends earliest, and where it ends as early, on the smallest node)."""
    began = time.perf_counter()
    placed, _ = whole_nodes_in_turn(problem)
    return placements_plan("sequential", "feasible", problem, placed, began)


def whole_nodes_in_turn(problem: PlanningProblem) -> tuple[list[Placement], float]:
    """Current practice's placements and makespan (``sequential``): each task in turn on
    a whole node, at its fastest option there, the node where it ends first; of those
    where it ends as early, the smallest (the larger stay free for tasks only they
    hold), then the first in the cluster's order (as ``dione.simulate.current_practice``
    has it: one baseline, whatever the node sizes)."""
    lines = _timelines(problem)
    release = problem.releases()
    placed: list[Placement] = []
    makespan = max((b.until for b in problem.busy), default=0.0)
    for task in problem.tasks:
        best: tuple[float, int, float, Option, str] | None = None
        for node in problem.nodes:
            fitting = task.fitting(node)
            if not fitting:
                continue
            option = min(fitting, key=lambda o: o.seconds)
            start = lines[node.name].earliest_start(node.devices, option.seconds,
                                                    release.get(task.name, 0.0))
            end = start + option.seconds
            if best is None or end < best[0] - 1e-9 or (
                    end <= best[0] + 1e-9 and node.devices < best[1]):
                best = (end, node.devices, start, option, node.name)
        if best is None:
            raise ValueError(f"task {task.name!r}: no option fits any node")
        end, _, start, option, name = best
        lines[name].reserve(start, end, problem.node(name).devices)
        placed.append((task.name, option, name, start))
        makespan = max(makespan, end)
    return placed, makespan
