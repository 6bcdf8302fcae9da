"""How far a plan can be from optimal: the devices-as-bins packing solved exactly, offline.

    python benchmarks/planner/lane_ip.py small-4 --makespans 66600 66700 66760 --limit 60

``dione.plan.lanes`` bounds the makespan by the configuration LP of a packing: each
device a bin of the makespan's length, a task on d devices a piece of its length on d
of them, time and start forgotten. This script asks the integer question instead (does
*any* packing fit M?) with CP-SAT, for each makespan given. INFEASIBLE proves that no
plan ends by M: a bound for the benchmark tables, too slow for the planner's 10 s (1-4 s
per makespan on small-4, and no answer within 60 s on the two-node small-6).

What makes it answer at all is the devices' symmetry: every device of a node is
interchangeable, so the task with the longest shortest option can have its pieces on
devices 0..d-1 of the first node, and loads fall in device order within each group of
devices still interchangeable (without that, 174 s for what takes 4 s with it). Tasks
stay in problem order: CP-SAT's search follows the order of the variables, and sorting
them longest first made every answer 2-4 times slower on small-4. Lengths are floored
to 1/20,000 of M, which only admits more packings, so the proof stays valid. Clusters of
identical nodes with nothing running only.

``--timed`` keeps time as well: each task gets a start, its pieces on their devices
must not overlap, each node stays a cumulative resource with its area explicit (a draft
without it, tasks sorted longest first, had no answer in 30 s on small-4), and
interchangeable tasks start in problem order. That is the
whole problem (devices need not be adjacent), relaxed only by flooring lengths to
1/1,000,000 of M, so INFEASIBLE proves that no plan ends by M, and a schedule found may
be shorter than any real plan by at most a tick per task. small-4's plan of 66,768 s is
optimal to within 1 s: no plan ends by 66,767 s (7-8 s).

``--split`` asks the timed question case by case where CP-SAT gives no answer within
``--limit``: the longest task not yet placed goes on each node and device count it may
take, one case each, and so on down. On two nodes that is what answers: no plan of
small-6 ends by 23,600 s (71 cases, 160 s at 10 s a case), where the whole question
has no answer in 60 s. A short limit is no faster: cases a longer one closes get split
again and again (3 s a case: no answer in 13 min).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Sequence
from pathlib import Path

from ortools.sat.python import cp_model

from dione.plan import Option, PlanningProblem, load_problem
from dione.plan.cpsat import identical_groups
from dione.plan.options import fitting_options

UNITS = 20_000
# Finer for --timed: starts are in these units too, and a chain of floored lengths
# must not reach a plan's own makespan (small-4: 20,000 admits one 100 s short of it).
TIMED_UNITS = 1_000_000
INSTANCES = Path(__file__).parent / "instances"


# A task's place in a case of --split: (its index in the problem, node index, devices).
Choice = tuple[int, int, int]


def packing_model(problem: PlanningProblem, makespan: float, timed: bool = False,
                  fixed: Sequence[Choice] = ()) -> cp_model.CpModel | None:
    """The packing of ``problem``'s tasks onto its devices as bins of ``makespan``
    (``timed``: with starts, as a schedule), the tasks in ``fixed`` on the given node
    and device count; None where some task has no option that short and fixed (no
    plan ends by it)."""
    sizes = {n.devices for n in problem.nodes}
    if len(sizes) != 1 or problem.busy:
        raise SystemExit("lane_ip.py handles clusters of identical nodes with nothing "
                         "running; this problem has other nodes or running tasks")
    width, nodes = sizes.pop(), len(problem.nodes)
    units = TIMED_UNITS if timed else UNITS
    unit = makespan / units
    tasks = _usable(problem, makespan)
    if tasks is None:
        return None
    # The task whose pieces are longest whatever it takes goes first, on fixed devices.
    first = _longest_first(tasks)[0]
    placed = {k: (n, devices) for k, n, devices in fixed}
    model = cp_model.CpModel()
    # (present, length, start) of every piece a device may hold.
    pieces: dict[tuple[int, int], list[tuple[cp_model.IntVar, int, cp_model.IntVar]]] = {
        (n, d): [] for n in range(nodes) for d in range(width)}
    # (present, length, start, devices) of every option on every node, for --timed.
    runs: dict[int, list[tuple[cp_model.IntVar, int, cp_model.IntVar, int]]] = {
        n: [] for n in range(nodes)}
    starts = {}
    for k, (name, usable) in enumerate(tasks):
        start = starts[name] = model.new_int_var(0, units, f"start {name}")
        chosen = []
        for option in usable:
            length = math.floor(option.seconds / unit + 1e-9)
            for n in range(nodes if k != first else 1):
                if placed.get(k, (n, option.devices)) != (n, option.devices):
                    continue
                x = model.new_bool_var("")
                chosen.append(x)
                model.add(start + length <= units).only_enforce_if(x)
                runs[n].append((x, length, start, option.devices))
                if k == first or option.devices == width:
                    for d in range(option.devices):
                        pieces[(n, d)].append((x, length, start))
                    continue
                on = [model.new_bool_var("") for _ in range(width)]
                for d, z in enumerate(on):
                    model.add_implication(z, x)
                    pieces[(n, d)].append((z, length, start))
                model.add(sum(on) == option.devices * x)
        if not chosen:
            return None
        model.add_exactly_one(chosen)
    load = {key: sum(length * x for x, length, _ in items) for key, items in pieces.items()}
    if timed:
        _add_time(model, problem, pieces, runs, starts, width)
    else:
        for key in pieces:
            model.add(load[key] <= units)
    # Devices still interchangeable: on node 0, those within each block the first task
    # may have filled (0..d-1 for each of its widths d); on other nodes, all of them.
    cuts = sorted({o.devices for o in tasks[first][1]} | {0, width})
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


def _usable(problem: PlanningProblem, makespan: float
            ) -> list[tuple[str, list[Option]]] | None:
    """Each task's useful options that fit a node and ``makespan``, in problem order;
    None where some task has none."""
    width = problem.nodes[0].devices
    tasks = []
    for task in problem.tasks:
        usable = fitting_options(task, makespan, width)
        if not usable:
            return None
        tasks.append((task.name, usable))
    return tasks


def _longest_first(tasks: Sequence[tuple[str, list[Option]]]) -> list[int]:
    """Task indices by their shortest option, longest first (the first is the one whose
    devices are fixed, and --split places them in this order)."""
    return sorted(range(len(tasks)), key=lambda k: -min(o.seconds for o in tasks[k][1]))


def ask(model: cp_model.CpModel, limit: float, threads: int) -> str:
    """CP-SAT's answer to a model within ``limit`` seconds on ``threads`` workers
    (INFEASIBLE: nothing fits; OPTIMAL: something does; UNKNOWN: no answer in time)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = limit
    solver.parameters.num_workers = threads
    return str(solver.status_name(solver.solve(model)))


def split(problem: PlanningProblem, makespan: float, limit: float, threads: int,
          fixed: tuple[Choice, ...] = ()) -> tuple[str, int]:
    """The timed question, asked case by case: where CP-SAT gives no answer within
    ``limit`` seconds, the next longest task is placed on each node and device count
    it may take, one case each. INFEASIBLE: every case is; OPTIMAL: some case has a
    schedule; UNKNOWN: some case stayed open with every task placed. Also the number of
    cases asked."""
    model = packing_model(problem, makespan, True, fixed)
    tasks = _usable(problem, makespan)
    if model is None or tasks is None:
        return "INFEASIBLE", 1
    answer = ask(model, limit, threads)
    # The same order as the model's: its first task is the one it keeps on node 0.
    order = _longest_first(tasks)
    if answer != "UNKNOWN" or len(fixed) == len(order):
        return answer, 1
    k = order[len(fixed)]
    nodes = 1 if not fixed else len(problem.nodes)
    widths = sorted({o.devices for o in tasks[k][1]})
    asked, answers = 1, set()
    for n, devices in itertools.product(range(nodes), widths):
        answer, cases = split(problem, makespan, limit, threads, (*fixed, (k, n, devices)))
        asked += cases
        answers.add(answer)
        if answer in ("OPTIMAL", "FEASIBLE"):
            return answer, asked
    return ("INFEASIBLE" if answers == {"INFEASIBLE"} else "UNKNOWN"), asked


def _add_time(model: cp_model.CpModel, problem: PlanningProblem,
              pieces: dict[tuple[int, int], list[tuple[cp_model.IntVar, int, cp_model.IntVar]]],
              runs: dict[int, list[tuple[cp_model.IntVar, int, cp_model.IntVar, int]]],
              starts: dict[str, cp_model.IntVar], width: int) -> None:
    """A device runs one piece at a time; each node is also a cumulative resource of its
    devices (redundant, but it prunes: 9 s instead of 14 s on small-4); interchangeable
    tasks start in problem order (swapping them first keeps every symmetry above)."""
    # One interval per presence literal: a task on fixed devices shares its node's.
    interval: dict[int, cp_model.IntervalVar] = {}

    def run(x: cp_model.IntVar, length: int, start: cp_model.IntVar) -> cp_model.IntervalVar:
        if x.index not in interval:
            interval[x.index] = model.new_optional_fixed_size_interval_var(start, length, x, "")
        return interval[x.index]

    for node_runs in runs.values():
        # The node's area, explicit so that the LP relaxation sees it.
        model.add(sum(length * devices * x for x, length, _, devices in node_runs)
                  <= width * TIMED_UNITS)
        intervals = [run(x, length, start) for x, length, start, _ in node_runs]
        model.add_cumulative(intervals, [devices for *_, devices in node_runs], width)
        # Tasks wider than half a node never overlap: disjunctive reasoning prunes more.
        wide = [i for i, (*_, devices) in zip(intervals, node_runs, strict=True)
                if 2 * devices > width]
        if len(wide) > 1:
            model.add_no_overlap(wide)
    for items in pieces.values():
        model.add_no_overlap([run(x, length, start) for x, length, start in items])
    for names in identical_groups(problem):
        for first, second in itertools.pairwise(names):
            model.add(starts[first] <= starts[second])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instance", help="a name in benchmarks/planner/instances, or a path")
    parser.add_argument("--makespans", type=float, nargs="+", required=True)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per makespan")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timed", action="store_true",
                        help="a schedule with starts, not only a packing (the exact question)")
    parser.add_argument("--split", action="store_true",
                        help="--timed, with every case that --limit leaves open split "
                             "on where the next longest task runs")
    args = parser.parse_args()
    path = Path(args.instance)
    if not path.exists():
        path = INSTANCES / f"{args.instance}.json"
    problem = load_problem(path)
    for makespan in args.makespans:
        began = time.perf_counter()
        if args.split:
            answer, cases = split(problem, makespan, args.limit, args.threads)
            print(f"{args.instance} M={makespan:.1f}: {answer} in {cases} cases, "
                  f"{time.perf_counter() - began:.1f} s", flush=True)
            continue
        model = packing_model(problem, makespan, args.timed)
        if model is None:
            answer = "INFEASIBLE (some task has no option this short)"
        else:
            answer = ask(model, args.limit, args.threads)
        print(f"{args.instance} M={makespan:.1f}: {answer} in "
              f"{time.perf_counter() - began:.1f} s", flush=True)


if __name__ == "__main__":
    main()
