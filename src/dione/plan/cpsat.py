"""SPASE with OR-Tools CP-SAT: option, node and start of every task in one model.

For each task t, each of its options o and each node n wide enough, an optional
interval of o's length on n, all sharing t's start; exactly one is present. Each node
is a cumulative resource of its device count; the objective is the makespan. Times are
integer ticks: lengths are rounded *up*, so a tick schedule stays valid in seconds.

Above ``MAX_INTERVALS`` optional intervals the one model is too large to solve well in
a few seconds, so the planner decomposes: the greedy plan fixes each task's node, one
small model per node re-plans that node, then pairs of nodes (the one that ends last
with the one that ends first) are re-planned together while time remains.
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
from dione.spec.devices import available_cores

__all__ = ["MAX_INTERVALS", "TICKS_PER_HORIZON", "build_model", "cpsat", "useful_options"]

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


def build_model(problem: PlanningProblem, horizon: float) -> SpaseModel:
    """The CP-SAT model of ``problem`` with every task ending by ``horizon`` seconds.

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
    model.minimize(makespan)
    return SpaseModel(model, tick, starts, choices, options, makespan)


def _break_node_symmetry(model: cp_model.CpModel, problem: PlanningProblem,
                         loads: dict[str, list[tuple[cp_model.IntVar, int]]]) -> None:
    """Identical nodes (same size, nothing running) are interchangeable: order them by
    load, which keeps one of every set of mirror-image solutions."""
    held = {b.node for b in problem.busy}
    groups: dict[int, list[NodeSpec]] = defaultdict(list)
    for node in problem.nodes:
        if node.name not in held:
            groups[node.devices].append(node)
    for group in groups.values():
        for first, second in itertools.pairwise(group):
            model.add(sum(a * c for c, a in loads[first.name])
                      >= sum(a * c for c, a in loads[second.name]))


def _hint(spase: SpaseModel, placed: Sequence[Placement]) -> None:
    chosen = {name: (option.key(), node, start) for name, option, node, start in placed}
    for (name, i, node), var in spase.choices.items():
        key, hinted_node, _ = chosen[name]
        option = spase.options[name][i]
        spase.model.add_hint(var, option.key() == key and node == hinted_node)
    for name, var in spase.starts.items():
        spase.model.add_hint(var, math.floor(chosen[name][2] / spase.tick))


def _solve(problem: PlanningProblem, placed: Sequence[Placement], horizon: float,
           seconds: float, threads: int) -> tuple[list[Placement] | None, str, float]:
    """Solve one model with the given placements as a hint; the placements found (None:
    none), CP-SAT's status name, and its bound in seconds (valid for the original)."""
    spase = build_model(problem, horizon)
    _hint(spase, placed)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, seconds)
    solver.parameters.num_workers = threads
    solver.parameters.random_seed = 1
    # Stronger cumulative reasoning: it proves instances the defaults leave open.
    solver.parameters.use_overload_checker_in_cumulative = True
    solver.parameters.use_timetable_edge_finding_in_cumulative = True
    solver.parameters.use_conservative_scale_overload_checker = True
    solver.parameters.use_dynamic_precedence_in_cumulative = True
    if threads == 1:
        solver.parameters.linearization_level = 2
    elif threads < len(PORTFOLIO):
        # CP-SAT's default for few workers leaves out the subsolvers that prove these
        # models optimal (seen: 3 tasks unproven in 10 s on 2 workers, proven in 0.01 s
        # with max_lp); choose them, still on ``threads`` threads.
        solver.parameters.subsolvers.extend(PORTFOLIO[:threads])
    status = solver.solve(spase.model)
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


def _decomposed(problem: PlanningProblem, placed: list[Placement], deadline: float,
                threads: int) -> tuple[list[Placement], dict[str, int]]:
    """Re-plan node by node, then node pairs, keeping whatever is better."""
    by_node: dict[str, list[Placement]] = defaultdict(list)
    for p in placed:
        by_node[p[2]].append(p)
    stats = {"node_models": 0, "pair_models": 0, "pair_improvements": 0}

    def resolve(nodes: set[str], budget: float) -> bool:
        current = [p for n in nodes for p in by_node[n]]
        if not current:
            return False
        sub = _subproblem(problem, {p[0] for p in current}, nodes)
        before = _makespan(current, sub)
        found, _, _ = _solve(sub, current, before, budget, threads)
        if found is None or _makespan(found, sub) >= before - 1e-9:
            return False
        for n in nodes:
            by_node[n] = [p for p in found if p[2] == n]
        return True

    nodes = [n.name for n in problem.nodes]
    per_node = max(0.05, (deadline - time.perf_counter()) * 0.4 / max(1, len(nodes)))
    for n in sorted(nodes, key=lambda n: -_makespan(by_node[n], problem)):
        if time.perf_counter() > deadline:
            break
        resolve({n}, per_node)
        stats["node_models"] += 1
    tried: set[tuple[str, str]] = set()
    while time.perf_counter() < deadline - 0.1:
        spans = sorted(nodes, key=lambda n: _makespan(by_node[n], problem))
        pair = next(((spans[-1], low) for low in spans[:-1]
                     if (spans[-1], low) not in tried), None)
        if pair is None:
            break
        tried.add(pair)
        stats["pair_models"] += 1
        budget = min(2.0, deadline - time.perf_counter())
        if resolve(set(pair), budget):
            stats["pair_improvements"] += 1
            tried.clear()
    return [p for n in nodes for p in by_node[n]], stats


def cpsat(problem: PlanningProblem, time_limit: float = 10.0, threads: int | None = None
          ) -> Plan:
    """Solve within ``time_limit`` seconds on ``threads`` workers (default: every core);
    never returns a plan worse than ``greedy``'s."""
    began = time.perf_counter()
    deadline = began + time_limit
    workers = threads or len(available_cores())
    placed, greedy_makespan, _ = greedy_placements(problem, min(2.0, time_limit * 0.1))
    analytic = lower_bound(problem)
    size = sum(len(useful_options(t)) * len(problem.nodes) for t in problem.tasks)
    notes: dict[str, object] = {"greedy_makespan": greedy_makespan, "optional_intervals": size}
    if greedy_makespan <= analytic * (1 + 1e-9):
        return placements_plan("cpsat", "optimal", problem, placed, began, analytic,
                               {**notes, "proof": "greedy meets the lower bound"})
    if size <= MAX_INTERVALS:
        found, status, bound = _solve(problem, placed, greedy_makespan,
                                      deadline - time.perf_counter(), workers)
        notes["cpsat_status"] = status
        # Compare after exact re-timing: ticks round lengths up, greedy's are exact.
        best = min([p for p in (found, placed) if p is not None],
                   key=lambda p: placements_plan("cpsat", "", problem, p, began).makespan)
        label = "optimal" if status == "OPTIMAL" else "feasible"
        return placements_plan("cpsat", label, problem, best, began, max(analytic, bound),
                               notes)
    found_placed, stats = _decomposed(problem, placed, deadline, workers)
    notes.update(stats, method="decomposed by node")
    return placements_plan("cpsat", "feasible", problem, found_placed, began, analytic, notes)
