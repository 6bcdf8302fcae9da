"""SPASE with OR-Tools CP-SAT: option, node and start of every task in one model.

For each task t, each of its options o and each node n wide enough, an optional
interval of o's length on n, all sharing t's start; exactly one is present. Each node
is a cumulative resource of its device count; the objective is the makespan. Times are
integer ticks: lengths are rounded *up*, so a tick schedule stays valid in seconds.

Above ``MAX_INTERVALS`` optional intervals the one model is too large to solve well in
a few seconds, so the planner decomposes: the greedy plan fixes each task's node, one
small model per node re-plans that node, then pairs of nodes (the one that ends last
with the one that ends first) are re-planned together while time remains.

The greedy plan is always a candidate: it is the hint, and whenever CP-SAT ends with
nothing or with something longer (a short limit, a busy machine, one thread), the
greedy plan is returned, with notes that say so. Tasks with the same options are
interchangeable; their starts are ordered, which keeps one of each set of mirror-image
plans. With ``deterministic_time`` the search is bounded by CP-SAT's deterministic time
instead of the clock, so the same problem gives the same plan however loaded the
machine is.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from dione.plan.bounds import lower_bound
from dione.plan.greedy import Placement, greedy_placements, placements_plan
from dione.plan.plan import Plan
from dione.plan.problem import NodeSpec, Option, PlanningProblem, TaskOptions
from dione.plan.timeline import NodeTimeline
from dione.spec.devices import available_cores

__all__ = ["MAX_INTERVALS", "TICKS_PER_HORIZON", "build_model", "cpsat", "identical_groups",
           "useful_options"]

MAX_INTERVALS = 12_000
# Coarser ticks prove optimality far sooner (a small instance: 0.3 s at 2,000 ticks, 6 s
# at 10,000, unproven in 10 s at 200,000); every tick of rounding costs the reported
# lower bound one tick per task of the longest chain, and re-timing the found plan in
# exact seconds gives back what rounding added to it.
PORTFOLIO = ("max_lp", "quick_restart", "default_lp", "no_lp", "core", "reduced_costs",
             "pseudo_costs", "fixed")
TICKS_PER_HORIZON = 5_000


def useful_options(task: TaskOptions) -> list[Option]:
    """The options not dominated by another (as fast or faster on as few or fewer
    devices): a plan using a dominated option can swap in its dominator and stay valid."""
    kept: list[Option] = []
    for option in sorted(task.options, key=lambda o: (o.devices, o.seconds)):
        if not any(k.devices <= option.devices and k.seconds <= option.seconds for k in kept):
            kept.append(option)
    return kept


@dataclass
class SpaseModel:
    """The CP-SAT model of a problem with its variables, for solving and reading back."""

    model: cp_model.CpModel
    tick: float
    starts: dict[str, cp_model.IntVar]
    choices: dict[tuple[str, int, str], cp_model.IntVar]  # (task, option index, node)
    options: dict[str, list[Option]]
    makespan: cp_model.IntVar


def _ticks(seconds: float, tick: float) -> int:
    return math.ceil(seconds / tick - 1e-9)


def identical_groups(problem: PlanningProblem) -> list[list[str]]:
    """Tasks the planner cannot tell apart (the same useful devices and seconds), in
    problem order; groups of two or more only.

    Two such tasks can swap their whole assignments (option, node, start) and the plan
    stays valid with the same makespan, as with the learning-rate variants of a grid.
    """
    groups: dict[tuple[tuple[int, float], ...], list[str]] = defaultdict(list)
    for task in problem.tasks:
        groups[tuple((o.devices, o.seconds) for o in useful_options(task))].append(task.name)
    return [names for names in groups.values() if len(names) > 1]


def build_model(problem: PlanningProblem, horizon: float, symmetry: bool = True
                ) -> SpaseModel:
    """The CP-SAT model of ``problem`` with every task ending by ``horizon`` seconds;
    ``symmetry``: order the starts of interchangeable tasks.

    A pure function of the problem: no solving, no side effects.
    """
    tick = max(horizon, 1e-9) / TICKS_PER_HORIZON
    # Rounding every length up can push a chain of n tasks past the horizon by n ticks.
    limit = _ticks(horizon, tick) + len(problem.tasks) + 1
    model = cp_model.CpModel()
    makespan = model.new_int_var(0, limit, "makespan")
    intervals: dict[str, list[tuple[cp_model.IntervalVar, int]]] = defaultdict(list)
    loads: dict[str, list[tuple[cp_model.IntVar, int]]] = defaultdict(list)
    starts, choices, options = {}, {}, {}
    for b in problem.busy:
        until = _ticks(b.until, tick)
        if until > 0:
            intervals[b.node].append((model.new_fixed_size_interval_var(0, until, f"busy {b.task}"),
                                      len(b.device_ids)))
        model.add(makespan >= until)
    for task in problem.tasks:
        usable = useful_options(task)
        options[task.name] = usable
        start = model.new_int_var(0, limit, f"start {task.name}")
        starts[task.name] = start
        present = []
        length_terms = []
        for i, option in enumerate(usable):
            length = _ticks(option.seconds, tick)
            for node in problem.nodes:
                if option.devices > node.devices:
                    continue
                chosen = model.new_bool_var(f"{task.name} {i} {node.name}")
                interval = model.new_optional_fixed_size_interval_var(
                    start, length, chosen, f"{task.name} {i} on {node.name}")
                intervals[node.name].append((interval, option.devices))
                loads[node.name].append((chosen, option.devices * length))
                choices[(task.name, i, node.name)] = chosen
                present.append(chosen)
                length_terms.append(length * chosen)
        model.add_exactly_one(present)
        model.add(makespan >= start + sum(length_terms))
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
        busy_area = sum(_ticks(b.until, tick) * len(b.device_ids) for b in problem.busy
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
            # The same position in the same (devices, seconds) list: an equal option.
            index = [(o.devices, o.seconds) for o in options[owner]].index(
                (option.devices, option.seconds))
            result[name] = (name, options[name][index], node, start)
    return [result[p[0]] for p in placed]


def _tick_starts(problem: PlanningProblem, placed: Sequence[Placement], tick: float
                 ) -> dict[str, int]:
    """Starts in ticks that keep ``placed`` valid with lengths rounded up: each task, in
    start order, at the first tick from its own where its node has room."""
    lines = {n.name: NodeTimeline(n.devices) for n in problem.nodes}
    for b in problem.busy:
        lines[b.node].reserve(0, _ticks(b.until, tick), len(b.device_ids))
    starts = {}
    for name, option, node, start in sorted(placed, key=lambda p: (p[3], p[0])):
        length = _ticks(option.seconds, tick)
        begin = int(lines[node].earliest_start(option.devices, length,
                                               math.floor(start / tick + 1e-9)))
        lines[node].reserve(begin, begin + length, option.devices)
        starts[name] = begin
    return starts


def _nodes_by_load(problem: PlanningProblem, placed: Sequence[Placement], tick: float
                   ) -> list[Placement]:
    """The same plan with identical nodes relabelled so that their loads fall in node
    order, as ``_break_node_symmetry`` asks (a hint that breaks it is lost)."""
    load: dict[str, int] = defaultdict(int)
    for _, option, node, _ in placed:
        load[node] += option.devices * _ticks(option.seconds, tick)
    rename = {}
    for group in _identical_nodes(problem):
        names = [n.name for n in group]
        for target, source in zip(names, sorted(names, key=lambda n: -load[n]), strict=True):
            rename[source] = target
    return [(task, option, rename.get(node, node), start) for task, option, node, start
            in placed]


def _identical_nodes(problem: PlanningProblem) -> list[list[NodeSpec]]:
    """Nodes of the same size with nothing running, in problem order."""
    held = {b.node for b in problem.busy}
    groups: dict[int, list[NodeSpec]] = defaultdict(list)
    for node in problem.nodes:
        if node.name not in held:
            groups[node.devices].append(node)
    return list(groups.values())


def _hint(spase: SpaseModel, problem: PlanningProblem, placed: Sequence[Placement],
          symmetry: bool) -> None:
    # Dominated options are not in the model: the useful option that replaces each.
    placed = [(name, _useful_for(spase.options[name], option), node, start)
              for name, option, node, start in placed]
    placed = _nodes_by_load(problem, placed, spase.tick)
    if symmetry:
        placed = _sorted_within_groups(problem, placed)
    chosen = {name: (option, node) for name, option, node, _ in placed}
    starts = _tick_starts(problem, placed, spase.tick)
    for (name, i, node), var in spase.choices.items():
        option, hinted_node = chosen[name]
        spase.model.add_hint(var, node == hinted_node and spase.options[name][i] == option)
    ends = [starts[name] + _ticks(option.seconds, spase.tick) for name, option, _, _ in placed]
    for name, var in spase.starts.items():
        spase.model.add_hint(var, starts[name])
    ends += [_ticks(b.until, spase.tick) for b in problem.busy]
    spase.model.add_hint(spase.makespan, max([*ends, 0]))


def _useful_for(useful: Sequence[Option], option: Option) -> Option:
    """The useful option a plan would swap in for ``option`` (itself if useful)."""
    return min((o for o in useful if o.devices <= option.devices and o.seconds <= option.seconds),
               key=lambda o: (o.seconds, o.devices))


@dataclass
class Budget:
    """How long the search may go on: wall seconds, or CP-SAT's deterministic time (the
    same work on a busy machine as on a quiet one)."""

    seconds: float
    deterministic: bool
    began: float = 0.0
    spent: float = 0.0

    def __post_init__(self) -> None:
        self.began = time.perf_counter()

    def left(self) -> float:
        if self.deterministic:
            return self.seconds - self.spent
        return self.seconds - (time.perf_counter() - self.began)

    def limit(self, solver: cp_model.CpSolver, seconds: float) -> None:
        if self.deterministic:
            solver.parameters.max_deterministic_time = max(0.05, seconds)
        else:
            solver.parameters.max_time_in_seconds = max(0.05, seconds)

    def charge(self, solver: cp_model.CpSolver) -> None:
        self.spent += solver.deterministic_time


def _solve(problem: PlanningProblem, placed: Sequence[Placement], horizon: float,
           seconds: float, threads: int, budget: Budget, symmetry: bool = True
           ) -> tuple[list[Placement] | None, str, float]:
    """Solve one model with the given placements as a hint; the placements found (None:
    none), CP-SAT's status name, and its bound in seconds (valid for the original)."""
    spase = build_model(problem, horizon, symmetry)
    _hint(spase, problem, placed, symmetry)
    solver = cp_model.CpSolver()
    budget.limit(solver, seconds)
    solver.parameters.num_workers = threads
    solver.parameters.random_seed = 1
    # Stronger cumulative reasoning: it proves instances the defaults leave open.
    solver.parameters.use_overload_checker_in_cumulative = True
    solver.parameters.use_timetable_edge_finding_in_cumulative = True
    solver.parameters.use_conservative_scale_overload_checker = True
    solver.parameters.use_dynamic_precedence_in_cumulative = True
    if threads == 1:
        solver.parameters.linearization_level = 2
    elif budget.deterministic:
        # Parallel workers race on the clock; interleaved, they do the same work in the
        # same order whatever the load.
        solver.parameters.interleave_search = True
    elif threads < len(PORTFOLIO):
        # CP-SAT's default for few workers leaves out the subsolvers that prove these
        # models optimal (seen: 3 tasks unproven in 10 s on 2 workers, proven in 0.01 s
        # with max_lp); choose them, still on ``threads`` threads.
        solver.parameters.subsolvers.extend(PORTFOLIO[:threads])
    status = solver.solve(spase.model)
    budget.charge(solver)
    name = solver.status_name(status)
    # The rounded-up lengths lengthen any chain of tasks by at most one tick each.
    bound = max(0.0, (solver.best_objective_bound - longest_chain(problem, horizon))
                * spase.tick)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, name, bound
    found: list[Placement] = []
    for (task, i, node), var in spase.choices.items():
        if solver.boolean_value(var):
            found.append((task, spase.options[task][i], node,
                          solver.value(spase.starts[task]) * spase.tick))
    return found, name, bound


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


def _makespan(placed: Sequence[Placement], problem: PlanningProblem) -> float:
    return max([start + option.seconds for _, option, _, start in placed]
               + [b.until for b in problem.busy] + [0.0])


def _subproblem(problem: PlanningProblem, names: set[str], nodes: set[str]) -> PlanningProblem:
    return PlanningProblem(
        tuple(n for n in problem.nodes if n.name in nodes),
        tuple(t for t in problem.tasks if t.name in names),
        tuple(b for b in problem.busy if b.node in nodes),
    )


def _decomposed(problem: PlanningProblem, placed: list[Placement], budget: Budget,
                threads: int) -> tuple[list[Placement], dict[str, int]]:
    """Re-plan node by node, then node pairs, keeping whatever is better."""
    by_node: dict[str, list[Placement]] = defaultdict(list)
    for p in placed:
        by_node[p[2]].append(p)
    stats = {"node_models": 0, "pair_models": 0, "pair_improvements": 0}

    def resolve(nodes: set[str], seconds: float) -> bool:
        current = [p for n in nodes for p in by_node[n]]
        if not current:
            return False
        sub = _subproblem(problem, {p[0] for p in current}, nodes)
        before = _makespan(current, sub)
        found, _, _ = _solve(sub, current, before, seconds, threads, budget)
        if found is None or _makespan(found, sub) >= before - 1e-9:
            return False
        for n in nodes:
            by_node[n] = [p for p in found if p[2] == n]
        return True

    nodes = [n.name for n in problem.nodes]
    per_node = max(0.05, budget.left() * 0.4 / max(1, len(nodes)))
    for n in sorted(nodes, key=lambda n: -_makespan(by_node[n], problem)):
        if budget.left() <= 0:
            break
        resolve({n}, per_node)
        stats["node_models"] += 1
    tried: set[tuple[str, str]] = set()
    while budget.left() > 0.1:
        spans = sorted(nodes, key=lambda n: _makespan(by_node[n], problem))
        pair = next(((spans[-1], low) for low in spans[:-1]
                     if (spans[-1], low) not in tried), None)
        if pair is None:
            break
        tried.add(pair)
        stats["pair_models"] += 1
        if resolve(set(pair), min(2.0, budget.left())):
            stats["pair_improvements"] += 1
            tried.clear()
    return [p for n in nodes for p in by_node[n]], stats


def cpsat(problem: PlanningProblem, time_limit: float = 10.0, threads: int | None = None,
          deterministic_time: float | None = None, symmetry: bool = True) -> Plan:
    """Solve within ``time_limit`` seconds on ``threads`` workers (default: every core),
    or within ``deterministic_time`` units of CP-SAT's deterministic time (then the
    clock stops nothing, and the same problem always gives the same plan); never returns
    a plan worse than ``greedy``'s (at the same limit)."""
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

    def greedy_plan(status: str, why: str, bound: float = analytic) -> Plan:
        return placements_plan("cpsat", status, problem, placed, began, bound,
                               {**notes, "plan_from": "greedy", "why": why})

    if start.makespan <= analytic * (1 + 1e-9):
        return greedy_plan("optimal", "greedy meets the lower bound")
    if budget.left() <= 0.05:
        return greedy_plan("feasible", "greedy used the whole time limit; CP-SAT did not run")
    if size <= MAX_INTERVALS:
        found, status, bound = _solve(problem, placed, start.makespan, budget.left(), workers,
                                      budget, symmetry)
        notes["cpsat_status"] = status
        label = "optimal" if status == "OPTIMAL" else "feasible"
        bound = max(analytic, bound)
        if found is None:
            return greedy_plan(label, f"CP-SAT found no plan ({status})", bound)
        # Compare after exact re-timing: ticks round lengths up, greedy's are exact.
        plan = placements_plan("cpsat", label, problem, found, began, bound,
                               {**notes, "plan_from": "cpsat"})
        fallback = greedy_plan(label, "CP-SAT's plan is no shorter than greedy's", bound)
        return plan if plan.makespan < fallback.makespan - 1e-9 else fallback
    found_placed, stats = _decomposed(problem, placed, budget, workers)
    notes.update(stats, method="decomposed by node")
    plan = placements_plan("cpsat", "feasible", problem, found_placed, began, analytic,
                           {**notes, "plan_from": "cpsat"})
    fallback = greedy_plan("feasible", "the node-by-node re-plans found nothing shorter")
    return plan if plan.makespan < fallback.makespan - 1e-9 else fallback
