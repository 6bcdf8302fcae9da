"""How far a plan can be from optimal: the devices-as-bins packing solved exactly, offline.

    python benchmarks/planner/lane_ip.py small-4 --makespans 66600 66700 66760 --limit 60

``dione.plan.lanes`` bounds the makespan by the configuration LP of a packing: each
device a bin of the makespan's length, a task on d devices a piece of its length on d
of them, time and start forgotten. This script asks the integer question instead (does
*any* packing fit M?) with CP-SAT, for each makespan given. INFEASIBLE proves that no
plan ends by M: a bound for the benchmark tables, too slow for the planner's 10 s (1-17 s
per makespan on small-4, and no answer within 60 s on the two-node small-6).

What makes it answer at all is the devices' symmetry: every device of a node is
interchangeable, so the task with the longest shortest option can have its pieces on
devices 0..d-1 of the first node, and loads fall in device order within each group of
devices still interchangeable (without that, 174 s for what takes 15-17 s with it).
Lengths are floored to 1/20,000 of M, which only admits more packings, so the proof
stays valid. Clusters of identical nodes with nothing running only.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from pathlib import Path

from ortools.sat.python import cp_model

from dione.plan import PlanningProblem, load_problem
from dione.plan.options import useful_options

UNITS = 20_000
INSTANCES = Path(__file__).parent / "instances"


def packing_model(problem: PlanningProblem, makespan: float) -> cp_model.CpModel | None:
    """The packing of ``problem``'s tasks onto its devices as bins of ``makespan``;
    None where some task has no option that short (no plan ends by it)."""
    sizes = {n.devices for n in problem.nodes}
    if len(sizes) != 1 or problem.busy:
        raise SystemExit("lane_ip.py handles clusters of identical nodes with nothing "
                         "running; this problem has other nodes or running tasks")
    width, nodes = sizes.pop(), len(problem.nodes)
    unit = makespan / UNITS
    tasks = []
    for task in problem.tasks:
        usable = [o for o in useful_options(task) if o.seconds <= makespan and o.devices <= width]
        if not usable:
            return None
        tasks.append(usable)
    # The task whose pieces are longest whatever it takes goes first, on fixed devices.
    tasks.sort(key=lambda usable: -min(o.seconds for o in usable))
    model = cp_model.CpModel()
    pieces: dict[tuple[int, int], list[tuple[cp_model.IntVar, int]]] = {
        (n, d): [] for n in range(nodes) for d in range(width)}
    for k, usable in enumerate(tasks):
        chosen = []
        for option in usable:
            length = math.floor(option.seconds / unit + 1e-9)
            for n in range(nodes if k else 1):
                x = model.new_bool_var("")
                chosen.append(x)
                if k == 0 or option.devices == width:
                    for d in range(option.devices):
                        pieces[(n, d)].append((x, length))
                    continue
                on = [model.new_bool_var("") for _ in range(width)]
                for d, z in enumerate(on):
                    model.add_implication(z, x)
                    pieces[(n, d)].append((z, length))
                model.add(sum(on) == option.devices * x)
        model.add_exactly_one(chosen)
    load = {key: sum(length * x for x, length in items) for key, items in pieces.items()}
    for key in pieces:
        model.add(load[key] <= UNITS)
    # Devices still interchangeable: on node 0, those within each block the first task
    # may have filled (0..d-1 for each of its widths d); on other nodes, all of them.
    cuts = sorted({o.devices for o in tasks[0]} | {0, width})
    for a, b in itertools.pairwise(cuts):
        for d in range(a, b - 1):
            model.add(load[(0, d)] >= load[(0, d + 1)])
    for n in range(1, nodes):
        for d in range(width - 1):
            model.add(load[(n, d)] >= load[(n, d + 1)])
    for n in range(1, nodes - 1):
        model.add(sum(load[(n, d)] for d in range(width))
                  >= sum(load[(n + 1, d)] for d in range(width)))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instance", help="a name in benchmarks/planner/instances, or a path")
    parser.add_argument("--makespans", type=float, nargs="+", required=True)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per makespan")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    path = Path(args.instance)
    if not path.exists():
        path = INSTANCES / f"{args.instance}.json"
    problem = load_problem(path)
    for makespan in args.makespans:
        began = time.perf_counter()
        model = packing_model(problem, makespan)
        if model is None:
            answer = "INFEASIBLE (some task has no option this short)"
        else:
            solver = cp_model.CpSolver()
            solver.parameters.max_time_in_seconds = args.limit
            solver.parameters.num_workers = args.threads
            answer = solver.status_name(solver.solve(model))
        print(f"{args.instance} M={makespan:.1f}: {answer} in "
              f"{time.perf_counter() - began:.1f} s", flush=True)


if __name__ == "__main__":
    main()
