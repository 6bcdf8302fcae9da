"""SPASE with OR-Tools CP-SAT: option, node and start of every task in one model.

For each task t, each of its options o and each node n wide enough, an optional
interval of o's length on n, all sharing t's start; exactly one is present. Each node
is a cumulative resource of its device count; the objective is the makespan. Times are
integer ticks: lengths are rounded *up*, so a tick schedule stays valid in seconds.

The whole model runs for part of the time limit; a large-neighbourhood search of our
own (``dione.plan.lns``: a window of tasks re-solved, the rest kept) then works on the
best plan for the rest. Above ``MAX_INTERVALS`` optional intervals the whole model is
too large to solve well in a few seconds, and the search starts from the greedy plan.
The model is told the energetic lower bound (``dione.plan.bounds``) and the bound of
devices as bins (``dione.plan.lanes``), which prove some plans optimal that CP-SAT's own
bound leaves open.

The greedy plan is always a candidate: it is the hint, and whenever CP-SAT ends with
nothing or with something longer (a short limit, a busy machine, one thread), the
greedy plan is returned, with notes that say so. Tasks with the same options are
interchangeable; their starts are ordered, which keeps one of each set of mirror-image
plans. Tasks that take a whole node run last on it, which keeps one of each set of plans
that differ only in where those tasks sit. With ``deterministic_time`` the search is
bounded by CP-SAT's deterministic time instead of the clock, so the same problem gives
the same plan however loaded the machine is.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from dione.plan.bounds import energetic_bound, lower_bound, on_grid
from dione.plan.budget import Budget, cp_solver
from dione.plan.greedy import greedy_placements, placements_plan
from dione.plan.lanes import lane_bound
from dione.plan.lns import improve, retimed
from dione.plan.options import (
    TICKS_PER_HORIZON,
    Placement,
    tick_starts,
    ticks,
    useful_for,
    useful_options,
)
from dione.plan.plan import Plan
from dione.plan.problem import NodeSpec, Option, PlanningProblem
from dione.spec.devices import available_cores

__all__ = ["MAX_INTERVALS", "TICKS_PER_HORIZON", "add_plan_hint", "build_model", "cpsat",
           "identical_groups", "longest_chain", "raised_bounds", "useful_options"]

MAX_INTERVALS = 12_000


@dataclass
class SpaseModel:
    """The CP-SAT model of a problem with its variables, for solving and reading back."""

    model: cp_model.CpModel
    tick: float
    starts: dict[str, cp_model.IntVar]
    choices: dict[tuple[str, int, str], cp_model.IntVar]  # (task, option index, node)
    options: dict[str, list[Option]]
    makespan: cp_model.IntVar


def identical_groups(problem: PlanningProblem) -> list[list[str]]:
    """Tasks the planner cannot tell apart (the same useful devices and seconds, the
    same release, the same nodes avoided), in problem order; groups of two or more only.

    Two such tasks can swap their whole assignments (option, node, start) and the plan
    stays valid with the same makespan, as with the learning-rate variants of a grid.
    """
    groups: dict[tuple[float, frozenset[str], tuple[tuple[int, float, str | None], ...]],
                 list[str]] = defaultdict(list)
    for task in problem.tasks:
        options = tuple((o.devices, o.seconds, o.kind) for o in useful_options(task))
        groups[(task.release, task.avoid, options)].append(task.name)
    return [names for names in groups.values() if len(names) > 1]


def build_model(problem: PlanningProblem, horizon: float, symmetry: bool = True
                ) -> SpaseModel:
    """The CP-SAT model of ``problem`` with every task ending by ``horizon`` seconds;
    ``symmetry``: order the starts of interchangeable tasks, and run tasks that take a
    whole node last on it (both keep one plan of each set of equivalent ones).

    A pure function of the problem: no solving, no side effects.
    """
    tick = max(horizon, 1e-9) / TICKS_PER_HORIZON
    # Rounding every length up can push a chain of n tasks past the horizon by n ticks.
    limit = ticks(horizon, tick) + len(problem.tasks) + 1
    model = cp_model.CpModel()
    makespan = model.new_int_var(0, limit, "makespan")
    intervals: dict[str, list[tuple[cp_model.IntervalVar, int]]] = defaultdict(list)
    loads: dict[str, list[tuple[cp_model.IntVar, int]]] = defaultdict(list)
    starts, choices, options = {}, {}, {}
    for b in problem.busy:
        until = ticks(b.until, tick)
        if until > 0:
            intervals[b.node].append((model.new_fixed_size_interval_var(0, until, f"busy {b.task}"),
                                      len(b.device_ids)))
        model.add(makespan >= until)
    # (chosen, length, start) of each choice, whole-node options apart from the others.
    whole: dict[str, list[tuple[cp_model.IntVar, int, cp_model.IntVar]]] = defaultdict(list)
    part: dict[str, list[tuple[cp_model.IntVar, int, cp_model.IntVar]]] = defaultdict(list)
    for task in problem.tasks:
        usable = useful_options(task)
        options[task.name] = usable
        start = model.new_int_var(min(ticks(task.release, tick), limit), limit,
                                  f"start {task.name}")
        starts[task.name] = start
        present = []
        length_terms = []
        for i, option in enumerate(usable):
            length = ticks(option.seconds, tick)
            for node in problem.nodes:
                if not task.may_run(option, node):
                    continue
                chosen = model.new_bool_var(f"{task.name} {i} {node.name}")
                interval = model.new_optional_fixed_size_interval_var(
                    start, length, chosen, f"{task.name} {i} on {node.name}")
                intervals[node.name].append((interval, option.devices))
                loads[node.name].append((chosen, option.devices * length))
                choices[(task.name, i, node.name)] = chosen
                (whole if option.devices == node.devices else part)[node.name].append(
                    (chosen, length, start))
                present.append(chosen)
                length_terms.append(length * chosen)
        model.add_exactly_one(present)
        model.add(makespan >= start + sum(length_terms))
    # Closing the gaps a whole-node task leaves would move others before their release.
    if symmetry and not any(t.release for t in problem.tasks):
        _whole_node_tasks_last(model, problem, makespan, limit, whole, part)
    for node in problem.nodes:
        if intervals[node.name]:
            model.add_cumulative([i for i, _ in intervals[node.name]],
                                 [d for _, d in intervals[node.name]], node.devices)
            # Two tasks wider than half the node never overlap: say so, since disjunctive
            # reasoning prunes far more than the cumulative constraint alone.
            wide = [i for i, d in intervals[node.name] if 2 * d > node.devices]
            if len(wide) > 1:
                model.add_no_overlap(wide)
        # The area bound per node, explicit so the linear relaxation sees it.
        busy_area = sum(ticks(b.until, tick) * len(b.device_ids) for b in problem.busy
                        if b.node == node.name)
        if loads[node.name]:
            model.add(sum(a * c for c, a in loads[node.name]) + busy_area
                      <= node.devices * makespan)
    _break_node_symmetry(model, problem, loads)
    if symmetry:
        for names in identical_groups(problem):
            for first, second in itertools.pairwise(names):
                model.add(starts[first] <= starts[second])
    model.minimize(makespan)
    return SpaseModel(model, tick, starts, choices, options, makespan)


def _whole_node_tasks_last(
        model: cp_model.CpModel, problem: PlanningProblem, makespan: cp_model.IntVar,
        limit: int, whole: dict[str, list[tuple[cp_model.IntVar, int, cp_model.IntVar]]],
        part: dict[str, list[tuple[cp_model.IntVar, int, cp_model.IntVar]]]) -> None:
    """Tasks that take a whole node run last on it, one after another, up to the end.

    Nothing overlaps a task on every device of its node, so cutting such tasks out of a
    node's schedule and closing the gaps keeps the rest valid (running tasks hold
    devices from time 0, before any of them); put back at the end, they end by the same
    makespan. Every plan has such a twin, so this loses no optimum, and the search no
    longer tries each whole-node task in every gap (small-3 on 2 workers: proven optimal
    in 3.4-7.7 s in 10 runs of 10; without it, within 20 s in 1 run of 6).
    """
    for node in problem.nodes:
        if not whole[node.name]:
            continue
        tail = model.new_int_var(0, limit, f"whole-node tail of {node.name}")
        model.add(tail == sum(length * chosen for chosen, length, _ in whole[node.name]))
        for chosen, length, start in part[node.name]:
            model.add(start + length <= makespan - tail).only_enforce_if(chosen)
        for chosen, _, start in whole[node.name]:
            model.add(start >= makespan - tail).only_enforce_if(chosen)


def _break_node_symmetry(model: cp_model.CpModel, problem: PlanningProblem,
                         loads: dict[str, list[tuple[cp_model.IntVar, int]]]) -> None:
    """Identical nodes (same size, nothing running) are interchangeable: order them by
    load, which keeps one of every set of mirror-image solutions."""
    for group in _identical_nodes(problem):
        for first, second in itertools.pairwise(group):
            model.add(sum(a * c for c, a in loads[first.name])
                      >= sum(a * c for c, a in loads[second.name]))


def _sorted_within_groups(problem: PlanningProblem, placed: Sequence[Placement]
                          ) -> list[Placement]:
    """The same plan with interchangeable tasks swapped so that their starts follow
    problem order, as the symmetry constraints ask (a hint that breaks them is lost)."""
    by_task = {p[0]: p for p in placed}
    result = dict(by_task)
    for names in identical_groups(problem):
        members = [n for n in names if n in by_task]
        slots = sorted((by_task[n] for n in members), key=lambda p: (p[3], p[0]))
        options = {n: useful_options(problem.task(n)) for n in members}
        for name, (owner, option, node, start) in zip(members, slots, strict=True):
            # The same position in the same (devices, seconds, kind) list: an equal option.
            index = [(o.devices, o.seconds, o.kind) for o in options[owner]].index(
                (option.devices, option.seconds, option.kind))
            result[name] = (name, options[name][index], node, start)
    return [result[p[0]] for p in placed]


def _nodes_by_load(problem: PlanningProblem, placed: Sequence[Placement], tick: float
                   ) -> list[Placement]:
    """The same plan with identical nodes relabelled so that their loads fall in node
    order, as ``_break_node_symmetry`` asks (a hint that breaks it is lost)."""
    load: dict[str, int] = defaultdict(int)
    for _, option, node, _ in placed:
        load[node] += option.devices * ticks(option.seconds, tick)
    rename = {}
    for group in _identical_nodes(problem):
        names = [n.name for n in group]
        for target, source in zip(names, sorted(names, key=lambda n: -load[n]), strict=True):
            rename[source] = target
    return [(task, option, rename.get(node, node), start) for task, option, node, start
            in placed]


def _identical_nodes(problem: PlanningProblem) -> list[list[NodeSpec]]:
    """Nodes of the same size and kind with nothing running and no task avoiding them,
    in problem order."""
    held = {b.node for b in problem.busy} | {n for t in problem.tasks for n in t.avoid}
    groups: dict[tuple[int, str | None], list[NodeSpec]] = defaultdict(list)
    for node in problem.nodes:
        if node.name not in held:
            groups[(node.devices, node.kind)].append(node)
    return list(groups.values())


def add_plan_hint(spase: SpaseModel, problem: PlanningProblem, placed: Sequence[Placement],
                  symmetry: bool) -> None:
    """Hint ``placed`` to the model, made to satisfy its symmetry constraints (built with
    ``symmetry``) and its tick grid, so that CP-SAT starts from that plan."""
    # Dominated options are not in the model: the useful option that replaces each.
    placed = [(name, useful_for(spase.options[name], option), node, start)
              for name, option, node, start in placed]
    placed = _nodes_by_load(problem, placed, spase.tick)
    if symmetry:
        placed = _whole_node_last(problem, placed)
    starts = tick_starts(problem, placed, spase.tick)
    ends = [starts[name] + ticks(option.seconds, spase.tick) for name, option, _, _ in placed]
    ends += [ticks(b.until, spase.tick) for b in problem.busy]
    makespan = max([*ends, 0])
    if symmetry:
        # Rounding up may have left gaps in a node's tail: close them, ending at the end.
        sizes = {n.name: n.devices for n in problem.nodes}
        by_node: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
        for name, option, node, _ in placed:
            if option.devices == sizes[node]:
                by_node[node].append((starts[name], name, ticks(option.seconds, spase.tick)))
        for tail in by_node.values():
            end = makespan
            for _, name, length in sorted(tail, reverse=True):
                starts[name] = end = end - length
        # In ticks, as the model orders them (moving tails can reorder across nodes).
        placed = _sorted_within_groups(problem, [(name, option, node, starts[name])
                                                 for name, option, node, _ in placed])
        starts = {name: int(start) for name, _, _, start in placed}
    chosen = {name: (option, node) for name, option, node, _ in placed}
    for (name, i, node), var in spase.choices.items():
        option, hinted_node = chosen[name]
        spase.model.add_hint(var, node == hinted_node and spase.options[name][i] == option)
    for name, var in spase.starts.items():
        spase.model.add_hint(var, starts[name])
    spase.model.add_hint(spase.makespan, makespan)


def _whole_node_last(problem: PlanningProblem, placed: Sequence[Placement]
                     ) -> list[Placement]:
    """The same plan with each node's whole-node tasks cut out, the gaps closed, and
    those tasks put back one after another up to the plan's end, as
    ``_whole_node_tasks_last`` asks; it ends no later."""
    sizes = {n.name: n.devices for n in problem.nodes}
    end = max([*(a + o.seconds for _, o, _, a in placed), *(b.until for b in problem.busy),
               0.0])
    moved: dict[str, Placement] = {}
    for node in problem.nodes:
        here = sorted((p for p in placed if p[2] == node.name), key=lambda p: (p[3], p[0]))
        tail = [p for p in here if p[1].devices == sizes[node.name]]
        for name, option, _, start in here:
            if option.devices < sizes[node.name]:
                # Earlier whole-node tasks ended before it began: close their gaps.
                cut = sum(o.seconds for _, o, _, a in tail if a + o.seconds <= start + 1e-9)
                moved[name] = (name, option, node.name, start - cut)
        at = end - sum(o.seconds for _, o, _, _ in tail)
        for name, option, _, _ in tail:
            moved[name] = (name, option, node.name, at)
            at += option.seconds
    return [moved[p[0]] for p in placed]


def _solve(problem: PlanningProblem, placed: Sequence[Placement], horizon: float,
           seconds: float, threads: int, budget: Budget, symmetry: bool = True,
           bound: float = 0.0) -> tuple[list[Placement] | None, str, float]:
    """Solve one model with the given placements as a hint; the placements found (None:
    none), CP-SAT's status name, and its bound in seconds (valid for the original).
    ``bound``: a known lower bound in seconds, given to the model."""
    spase = build_model(problem, horizon, symmetry)
    # Any tick plan re-timed in seconds ends no later, so it too ends after ``bound``.
    spase.model.add(spase.makespan >= math.floor(bound / spase.tick))
    add_plan_hint(spase, problem, placed, symmetry)
    solver = cp_solver(budget, seconds, threads)
    status = solver.solve(spase.model)
    budget.charge(solver)
    name = solver.status_name(status)
    # The rounded-up lengths lengthen any chain of tasks by at most one tick each.
    found_bound = max(0.0, (solver.best_objective_bound - longest_chain(problem, horizon))
                      * spase.tick)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, name, found_bound
    found: list[Placement] = []
    for (task, i, node), var in spase.choices.items():
        if solver.boolean_value(var):
            found.append((task, spase.options[task][i], node,
                          solver.value(spase.starts[task]) * spase.tick))
    return found, name, found_bound


def raised_bounds(problem: PlanningProblem, bound: float, plan: float
                  ) -> tuple[float, float]:
    """``bound`` raised by the energetic bound, then that by the lane bound, each asked
    to prove ``plan``'s makespan (they stop once they reach it): both, in that order."""
    energetic = max(bound, energetic_bound(problem, bound, plan))
    return energetic, max(energetic, lane_bound(problem, energetic, plan))


def longest_chain(problem: PlanningProblem, horizon: float) -> int:
    """At most how many tasks can run one after another within ``horizon`` seconds."""
    shortest = sorted(min(o.seconds for o in t.options) for t in problem.tasks)
    total, count = 0.0, 0
    for seconds in shortest:
        total += seconds
        if total > horizon:
            break
        count += 1
    return count


# The share of the time the whole model gets before the search around its best plan
# takes over (CP-SAT's own neighbourhoods stall on the hard instances: seen on hard-3,
# no better plan between 7 s and 34 s of 60).
WHOLE_MODEL_SHARE = 0.5


def cpsat(problem: PlanningProblem, time_limit: float = 10.0, threads: int | None = None,
          deterministic_time: float | None = None, symmetry: bool = True,
          whole_model_share: float = WHOLE_MODEL_SHARE) -> Plan:
    """Solve within ``time_limit`` seconds on ``threads`` workers (default: every core),
    or within ``deterministic_time`` units of CP-SAT's deterministic time (then the
    clock stops nothing, and the same problem always gives the same plan); never returns
    a plan worse than ``greedy``'s (at the same limit).

    The whole model runs first (``whole_model_share`` of the time; all of it where the
    model is too large, above ``MAX_INTERVALS`` optional intervals, goes to the search
    instead), then the large-neighbourhood search of ``dione.plan.lns`` around the best
    plan so far."""
    began = time.perf_counter()
    deterministic = deterministic_time is not None
    if deterministic_time is not None and deterministic_time <= 0:
        raise ValueError(f"the deterministic time must be positive, not {deterministic_time}")
    workers = threads or len(available_cores())
    # The same greedy as the greedy solver's: bounded by work, stopped by the same
    # clock (never, when deterministic), so its plan is exactly greedy's.
    start = greedy_placements(problem, None if deterministic else time_limit)
    placed = start.placed
    budget = Budget(deterministic_time if deterministic_time is not None
                    else time_limit - (time.perf_counter() - began), deterministic)
    analytic = lower_bound(problem)
    size = sum(len(useful_options(t)) * len(problem.nodes) for t in problem.tasks)
    notes: dict[str, object] = {"greedy_makespan": start.makespan, "optional_intervals": size,
                                **start.notes()}
    if deterministic:
        notes["deterministic_time"] = deterministic_time

    # What a simulation charges for this solve: CP-SAT's deterministic time and greedy's
    # work in the same units.
    notes["greedy_units"] = start.units

    def greedy_plan(status: str, why: str) -> Plan:
        """Greedy's plan, with the bound as raised so far (``analytic`` read now: a
        default argument kept the value before the energetic and lane bounds)."""
        notes["deterministic_spent"] = budget.spent + start.units
        return placements_plan("cpsat", status, problem, placed, began, analytic,
                               {**notes, "plan_from": "greedy", "why": why})

    def finish(best: Sequence[Placement], source: str, status: str, bound: float) -> Plan:
        notes["deterministic_spent"] = budget.spent + start.units
        return _finish(problem, best, source, status, began, bound, notes, placed)

    if start.makespan <= analytic * (1 + 1e-9):
        return greedy_plan("optimal", "greedy meets the lower bound")
    if size <= 4 * MAX_INTERVALS:
        notes["energetic_bound"], analytic = raised_bounds(problem, analytic, start.makespan)
        analytic = notes["lane_bound"] = on_grid(problem, analytic)
        if start.makespan <= analytic * (1 + 1e-9):
            return greedy_plan("optimal", "greedy meets the energetic or lane lower bound")
    if budget.left() <= 0.05:
        return greedy_plan("feasible", "greedy used the whole time limit; CP-SAT did not run")
    bound, best, source = analytic, list(placed), "greedy"
    if size <= MAX_INTERVALS:
        found, status, found_bound = _solve(
            problem, placed, start.makespan, budget.left() * whole_model_share, workers,
            budget, symmetry, analytic)
        notes["cpsat_status"] = status
        bound = max(bound, on_grid(problem, found_bound))
        if found is None:
            notes["whole_model"] = f"CP-SAT found no plan ({status})"
        else:
            # Compare after exact re-timing: ticks round lengths up, greedy's are exact.
            found = retimed(problem, found)[0]
            if _makespan(found) < start.makespan - 1e-9:
                best, source = found, "cpsat"
        if status == "FEASIBLE" and budget.left() > 1.0 and _near(best, bound):
            # Within PROOF_GAP of the bound a search for shorter plans can gain little;
            # what is missing is the proof, and CP-SAT's proofs here come from a whole
            # model run (small-3: 3-8 s), so the rest of the time goes to a second one,
            # hinted with the best plan, instead of the search around it.
            notes["second_whole_model"] = True
            again, status, found_bound = _solve(problem, best, start.makespan, budget.left(),
                                                workers, budget, symmetry, bound)
            notes["cpsat_status"] = status
            bound = max(bound, found_bound)
            if again is not None:
                again = retimed(problem, again)[0]
                if _makespan(again) < _makespan(best) - 1e-9:
                    best, source = again, "cpsat"
        if status == "OPTIMAL":
            return finish(best, source, "optimal", bound)
    else:
        notes["method"] = "search around the greedy plan (the whole model is too large)"
    if budget.left() > 0.05:
        before = _makespan(best)
        searched, stats = improve(problem, best, budget, workers, bound)
        notes.update(stats.notes())
        bound = max(bound, stats.bound)
        if _makespan(searched) < before - 1e-9:
            best, source = searched, "lns"
        if stats.bound:
            # A window of every task, solved to optimality: the whole model, proven.
            return finish(best, source, "optimal", bound)
    return finish(best, source, "feasible", bound)


# How close (a share of the plan) the best plan must be to the bound before the rest of
# the time goes to proving it rather than to searching for a shorter one.
PROOF_GAP = 0.005


def _makespan(placed: Sequence[Placement]) -> float:
    return max((a + o.seconds for _, o, _, a in placed), default=0.0)


def _near(placed: Sequence[Placement], bound: float) -> bool:
    """Whether ``placed`` ends within ``PROOF_GAP`` of ``bound``."""
    return _makespan(placed) - bound <= PROOF_GAP * _makespan(placed)


def _finish(problem: PlanningProblem, best: Sequence[Placement], source: str, status: str,
            began: float, bound: float, notes: dict[str, object],
            greedy_placed: Sequence[Placement]) -> Plan:
    """The plan of ``best``, or greedy's where it is no shorter (the promise), with the
    status ``optimal`` wherever the plan meets the bound."""
    plan = placements_plan("cpsat", status, problem, best, began, bound,
                           {**notes, "plan_from": source})
    fallback = placements_plan("cpsat", status, problem, greedy_placed, began, bound,
                               {**notes, "plan_from": "greedy",
                                "why": "the search found nothing shorter than greedy's plan"})
    chosen = plan if plan.makespan < fallback.makespan - 1e-9 else fallback
    if chosen.makespan <= bound * (1 + 1e-9) and chosen.status != "optimal":
        chosen = dataclasses.replace(chosen, status="optimal", notes={
            **chosen.notes, "why_optimal": "the plan meets the bound"})
    return chosen
