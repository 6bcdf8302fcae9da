"""Issue 39's lead measured: plans where a task may change its option once, on its node
(two stretches: a share of its steps under one option, the rest under another), against
SPASE's one option per task, on the planner's synthetic instances. A prototype model of
our own (not ``dione.plan.cpsat``): each task picks, on one node, either one option or a
pair of its options (the fastest per width) with a split of 1/4, 1/2 or 3/4, the second
stretch starting as the first ends; each node a cumulative resource; makespan
minimised. Both models are solved alike (CP-SAT, one worker, the same deterministic
time), so the figures do not depend on the machine's load.

    python benchmarks/stretch_planning.py --instances small-2,small-4 --nodes 2
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

from ortools.sat.python import cp_model

from dione.plan.problem import NodeSpec, Option, PlanningProblem, TaskOptions, load_problem
from dione.plan.solve import solve

INSTANCES = Path(__file__).parent / "planner" / "instances"
SPLITS = (0.25, 0.5, 0.75)
TICKS = 2000  # over the horizon


def fastest_by_width(task: TaskOptions, devices: int) -> dict[int, Option]:
    best: dict[int, Option] = {}
    for option in task.options:
        if option.devices <= devices and (option.devices not in best
                                          or option.seconds < best[option.devices].seconds):
            best[option.devices] = option
    return best


def solve_stretches(problem: PlanningProblem, horizon: float, two: bool,
                    deterministic: float) -> tuple[str, float, float, int]:
    """(status, makespan s, bound s, tasks split) of the model with or without pairs."""
    tick = horizon / TICKS
    model = cp_model.CpModel()
    limit = TICKS + len(problem.tasks) * 2
    makespan = model.new_int_var(0, limit, "makespan")
    on_node: dict[str, list[tuple[cp_model.IntervalVar, int]]] = {n.name: [] for n in
                                                                   problem.nodes}
    pairs = []
    for task in problem.tasks:
        chosen = []
        for node in problem.nodes:
            widths = fastest_by_width(task, node.devices)
            for width, option in widths.items():
                present = model.new_bool_var("")
                length = math.ceil(option.seconds / tick)
                start = model.new_int_var(0, limit, "")
                end = model.new_int_var(0, limit, "")
                on_node[node.name].append((model.new_optional_interval_var(
                    start, length, end, present, ""), width))
                model.add(end <= makespan).only_enforce_if(present)
                chosen.append(present)
            if not two:
                continue
            for (wa, a), (wb, b) in itertools.permutations(widths.items(), 2):
                for share in SPLITS:
                    present = model.new_bool_var("")
                    first = math.ceil(share * a.seconds / tick)
                    second = math.ceil((1 - share) * b.seconds / tick)
                    start, middle, end = (model.new_int_var(0, limit, "") for _ in range(3))
                    on_node[node.name] += [
                        (model.new_optional_interval_var(start, first, middle, present, ""),
                         wa),
                        (model.new_optional_interval_var(middle, second, end, present, ""),
                         wb)]
                    model.add(end <= makespan).only_enforce_if(present)
                    chosen.append(present)
                    pairs.append(present)
        model.add_exactly_one(chosen)
    for node in problem.nodes:
        model.add_cumulative([i for i, _ in on_node[node.name]],
                             [w for _, w in on_node[node.name]], node.devices)
    model.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = deterministic
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return solver.status_name(status), float("inf"), 0.0, 0
    split = sum(solver.value(p) for p in pairs)
    return (solver.status_name(status), solver.objective_value * tick,
            solver.best_objective_bound * tick, split)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default="small-2,small-4,small-6,mixed-1")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--deterministic-time", type=float, default=30.0)
    args = parser.parse_args()
    print("| instance | dione's cpsat plan s | one option s (status) | two stretches s "
          "(status, tasks split) | two / one |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in args.instances.split(","):
        problem = load_problem(INSTANCES / f"{name}.json",
                               nodes=[NodeSpec(f"n{i}", 8) for i in range(args.nodes)])
        plan = solve(problem, "cpsat", time_limit=60, deterministic_time=1.0)
        horizon = plan.makespan * 1.2
        one = solve_stretches(problem, horizon, False, args.deterministic_time)
        two = solve_stretches(problem, horizon, True, args.deterministic_time)
        print(f"| {name} | {plan.makespan:,.0f} | {one[1]:,.0f} ({one[0].lower()}) | "
              f"{two[1]:,.0f} ({two[0].lower()}, {two[3]}) | {two[1] / one[1]:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
