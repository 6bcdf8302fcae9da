"""Can a logic-based Benders split prove small plans optimal within ``cpsat``'s 10 s?

    python benchmarks/planner/benders.py small-3 small-4 small-6 hard-2 --limit 60
    python benchmarks/planner/benders.py small-3 small-4 --check-plan   # the checks alone

The master picks each task's option and node only (exactly one each, the makespan at
least every chosen length, each node's area at most its devices x the makespan, and the
cuts so far); its optimum is a lower bound on every plan. Each node's chosen tasks then
go to a check: one CP-SAT model of that node alone (a cumulative resource, tasks wider
than half of it never overlapping), its makespan minimised. Where a node's tasks need
longer than the master's makespan, a deletion filter shrinks them to a core (a subset
that still does not fit), and the cut "these tasks with these options on one node take
at least the core's own makespan" goes to the master for every node of that size.
When no node needs longer, the master's assignment is a plan that meets the bound.

Lengths are whole seconds rounded down in both, a relaxation of the problem, so the
bound holds in seconds; the plans the checks find are re-timed exactly (a valid plan).
Running tasks (``busy``) are not modelled: the committed small instances have none.
A probe of issue 22's last untried idea, offline; not part of ``cpsat``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from pathlib import Path

from ortools.sat.python import cp_model

from dione.plan import Option, PlanningProblem, load_problem
from dione.plan.bounds import lower_bound
from dione.plan.cpsat import cpsat, raised_bounds
from dione.plan.options import useful_options

INSTANCES = Path(__file__).parent / "instances"
Chosen = tuple[int, Option]  # task index, option


def node_makespan(chosen: list[Chosen], devices: int, limit: float,
                  at_most: int | None = None) -> tuple[int | None, bool]:
    """The least makespan (whole seconds, lengths floored) of ``chosen`` on one node of
    ``devices`` devices, and whether it is proven; with ``at_most``, only whether they
    fit by then (the makespan found, or None where they do not)."""
    model = cp_model.CpModel()
    horizon = sum(math.floor(o.seconds) for _, o in chosen)
    makespan = model.new_int_var(0, horizon, "makespan")
    intervals, widths, wide = [], [], []
    for t, option in chosen:
        length = math.floor(option.seconds)
        start = model.new_int_var(0, horizon - length, f"start {t}")
        interval = model.new_fixed_size_interval_var(start, length, f"task {t}")
        intervals.append(interval)
        widths.append(option.devices)
        if 2 * option.devices > devices:
            wide.append(interval)
        model.add(makespan >= start + length)
    model.add_cumulative(intervals, widths, devices)
    if len(wide) > 1:
        model.add_no_overlap(wide)
    if at_most is not None:
        model.add(makespan <= at_most)
    else:
        model.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, limit)
    solver.parameters.num_workers = 2
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        return None, True
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, False
    return int(solver.value(makespan)), status == cp_model.OPTIMAL


def core(chosen: list[Chosen], devices: int, fits_by: int, limit: float) -> list[Chosen]:
    """A subset of ``chosen`` that still does not fit by ``fits_by`` on one node, found
    by dropping the shortest tasks first while it stays so (a check that gives no answer
    keeps the task: the core stays valid, only larger)."""
    kept = sorted(chosen, key=lambda c: -c[1].seconds * c[1].devices)
    for candidate in sorted(chosen, key=lambda c: c[1].seconds * c[1].devices):
        rest = [c for c in kept if c != candidate]
        found, proven = node_makespan(rest, devices, limit, at_most=fits_by)
        if found is None and proven:
            kept = rest
    return kept


def benders(problem: PlanningProblem, plan: float, limit: float, log: list[str]
            ) -> tuple[float, float, int, int]:
    """The bound (s), the best plan found by the checks (s), iterations and cuts, within
    ``limit`` seconds; ``plan``: a known plan's makespan (the master's upper limit)."""
    began = time.perf_counter()
    if problem.busy:
        raise SystemExit("running tasks are not modelled here")
    model = cp_model.CpModel()
    top = math.floor(plan)
    first = math.floor(raised_bounds(problem, lower_bound(problem), plan)[1])
    makespan = model.new_int_var(first, top, "makespan")
    choice: dict[tuple[int, int, int], cp_model.IntVar] = {}
    options = [useful_options(t) for t in problem.tasks]
    for t, usable in enumerate(options):
        present = []
        for k, option in enumerate(usable):
            for n, node in enumerate(problem.nodes):
                if option.devices <= node.devices and option.seconds <= plan:
                    var = model.new_bool_var(f"{t} {k} {n}")
                    choice[(t, k, n)] = var
                    present.append(var)
                    model.add(makespan >= math.floor(option.seconds)).only_enforce_if(var)
        model.add_exactly_one(present)
    for n, node in enumerate(problem.nodes):
        model.add(sum(math.floor(options[t][k].seconds) * options[t][k].devices * var
                      for (t, k, m), var in choice.items() if m == n)
                  <= node.devices * makespan)
    same_size: dict[int, list[int]] = defaultdict(list)
    for n, node in enumerate(problem.nodes):
        same_size[node.devices].append(n)
    model.minimize(makespan)
    bound, best, iterations, cuts = float(first), math.inf, 0, 0
    while time.perf_counter() - began < limit:
        iterations += 1
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.05, limit - (time.perf_counter() - began))
        solver.parameters.num_workers = 2
        status = solver.solve(model)
        if status == cp_model.INFEASIBLE:  # no plan shorter than ``plan`` exists
            bound = plan
            break
        if status != cp_model.OPTIMAL:
            break
        master = int(solver.value(makespan))
        bound = max(bound, master)
        on: dict[int, list[Chosen]] = defaultdict(list)
        picked: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for (t, k, n), var in choice.items():
            if solver.boolean_value(var):
                on[n].append((t, options[t][k]))
                picked[n].append((t, k))
        longest, exact = 0, True
        for n, chosen in on.items():
            devices = problem.nodes[n].devices
            left = limit - (time.perf_counter() - began)
            need, proven = node_makespan(chosen, devices, left)
            if need is None:
                exact = False
                break
            longest = max(longest, need)
            if need <= master:
                continue
            kept = core(chosen, devices, master, min(2.0, left))
            floor_of_core, _ = node_makespan(kept, devices, left)
            at_least = master + 1 if floor_of_core is None else max(master + 1, floor_of_core)
            index = dict(picked[n])  # task -> its option's index
            for m in same_size[devices]:
                literals = [choice[(t, index[t], m)] for t, _ in kept]
                model.add(makespan >= at_least).only_enforce_if(literals)
                cuts += 1
            exact = exact and proven
        if exact and longest <= master:
            best = min(best, longest)  # floored lengths: a plan within the rounding
            bound = float(master)
            break
        if exact:
            best = min(best, longest)
        model.clear_hints()
        for var in choice.values():
            model.add_hint(var, solver.boolean_value(var))
        log.append(f"  {time.perf_counter() - began:6.1f} s  iteration {iterations}: "
                   f"bound {bound:,.0f}, cuts {cuts}")
    return bound, best, iterations, cuts


def check_plan(name: str, problem: PlanningProblem, limit: float) -> None:
    """Print, per node of ``cpsat``'s 10 s plan, its tasks' least makespan with the plan's
    options fixed (the check alone), and whether it was proven within ``limit``."""
    plan = cpsat(problem, time_limit=10, threads=2)
    index = {task.name: t for t, task in enumerate(problem.tasks)}
    on: dict[str, list[Chosen]] = defaultdict(list)
    for a in plan.assignments:
        option = next(o for o in problem.task(a.task).options if o.technique == a.technique
                      and o.devices == a.devices and o.knobs == a.knobs)
        on[a.node].append((index[a.task], option))
    sizes = {node.name: node.devices for node in problem.nodes}
    for node, chosen in sorted(on.items()):
        began = time.perf_counter()
        found, proven = node_makespan(chosen, sizes[node], limit)
        print(f"| {name} | {node} | {len(chosen)} | {plan.makespan:,.0f} | "
              f"{'-' if found is None else f'{found:,}'} | "
              f"{'yes' if proven else 'no'} ({time.perf_counter() - began:.1f} s) |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instances", nargs="+")
    parser.add_argument("--limit", type=float, default=60.0)
    parser.add_argument("--trace", action="store_true", help="print every iteration")
    parser.add_argument("--check-plan", action="store_true",
                        help="only the checks, on cpsat's plan (limit: per node)")
    args = parser.parse_args()
    if args.check_plan:
        print("| instance | node | tasks | plan, s | the node's best schedule, s | proven |")
        print("| --- | --- | ---: | ---: | ---: | --- |")
        for name in args.instances:
            check_plan(name, load_problem(INSTANCES / f"{name}.json"), args.limit)
        return
    print("| instance | plan (cpsat 10 s), s | bound before, s | Benders bound, s | "
          "gap | iterations | cuts | seconds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.instances:
        problem = load_problem(INSTANCES / f"{name}.json")
        plan = cpsat(problem, time_limit=10, threads=2)
        before = max(plan.lower_bound, lower_bound(problem))
        log: list[str] = []
        began = time.perf_counter()
        bound, _, iterations, cuts = benders(problem, plan.makespan, args.limit, log)
        took = time.perf_counter() - began
        if args.trace:
            print("\n".join(log))
        print(f"| {name} | {plan.makespan:,.0f} | {before:,.0f} | {bound:,.0f} | "
              f"{(plan.makespan - bound) / plan.makespan:.2%} | {iterations} | {cuts} | "
              f"{took:.1f} |", flush=True)


if __name__ == "__main__":
    main()
