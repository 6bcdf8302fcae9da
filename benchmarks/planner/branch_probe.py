"""Does branching on the longest tasks first help ``cpsat``'s whole model prove plans?

    python benchmarks/planner/branch_probe.py small-3 small-4 small-6 --longest 0 5

The case split of ``lane_ip.py --split`` (the longest task on each node and device
count, one case each) proves small-6 to 0.29% offline, in minutes. The question here is
whether the same split done inside one CP-SAT search fits ``cpsat``'s 10 s: the whole
model as ``cpsat`` builds it (greedy's hint, the energetic and lane bounds), one run per
instance and setting, with a decision strategy on the choice literals (option x node) of
the ``--longest`` tasks with the longest shortest options, literals tried true first.
``--workers`` names the subsolvers: ``default`` is ``cpsat``'s own two (max_lp and
quick_restart), ``max_lp,fixed`` puts one worker on the strategy (``fixed`` follows it
to the letter). ``--semi-active`` instead adds, for every task, "it starts at 0 or when
another task ends" (some optimal plan is left-shifted so), to see whether pruning starts
helps the proof.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from ortools.sat.python import cp_model

from dione.plan import load_problem
from dione.plan.bounds import lower_bound
from dione.plan.budget import PORTFOLIO, Budget, cp_solver
from dione.plan.cpsat import SpaseModel, add_plan_hint, build_model, raised_bounds
from dione.plan.greedy import greedy_placements
from dione.plan.options import ticks
from dione.plan.problem import PlanningProblem

INSTANCES = Path(__file__).parent / "instances"


def probe(problem: PlanningProblem, longest: int, workers: str, limit: float,
          semi_active: bool = False) -> tuple[str, float, float, float, float]:
    """CP-SAT's status, seconds, best plan and bound (seconds), and the analytic bound."""
    greedy = greedy_placements(problem, None)
    bound = raised_bounds(problem, lower_bound(problem), greedy.makespan)[1]
    spase = build_model(problem, greedy.makespan)
    spase.model.add(spase.makespan >= math.floor(bound / spase.tick))
    add_plan_hint(spase, problem, greedy.placed, True)
    if semi_active:
        _starts_at_an_end(spase, problem)
    first = sorted(problem.tasks, key=lambda t: -min(o.seconds for o in t.options))[:longest]
    literals = [var for task in first for (name, _, _), var in spase.choices.items()
                if name == task.name]
    if literals:
        spase.model.add_decision_strategy(literals, cp_model.CHOOSE_FIRST,
                                          cp_model.SELECT_MAX_VALUE)
    if workers == "default":
        solver = cp_solver(Budget(limit, False), limit, 2)
    else:
        # As many threads as the portfolio has, so cp_solver names no subsolvers itself.
        solver = cp_solver(Budget(limit, False), limit, len(PORTFOLIO))
        solver.parameters.num_workers = len(workers.split(","))
        solver.parameters.subsolvers.extend(workers.split(","))
    began = time.perf_counter()
    status = solver.solve(spase.model)
    return (solver.status_name(status), time.perf_counter() - began,
            solver.objective_value * spase.tick, solver.best_objective_bound * spase.tick,
            bound)


def _starts_at_an_end(spase: SpaseModel, problem: PlanningProblem) -> None:
    """Each task starts at 0, when a running task ends, or when another task ends."""
    model = spase.model
    length = {t.name: sum(ticks(spase.options[t.name][i].seconds, spase.tick) * var
                          for (name, i, _), var in spase.choices.items() if name == t.name)
              for t in problem.tasks}
    moments = {0, *(ticks(b.until, spase.tick) for b in problem.busy)}
    for task in problem.tasks:
        start, reasons = spase.starts[task.name], []
        for moment in sorted(moments):
            reasons.append(model.new_bool_var(f"{task.name} starts at {moment}"))
            model.add(start == moment).only_enforce_if(reasons[-1])
        for other in problem.tasks:
            if other.name != task.name:
                reasons.append(model.new_bool_var(f"{task.name} after {other.name}"))
                model.add(start == spase.starts[other.name] + length[other.name]
                          ).only_enforce_if(reasons[-1])
        model.add_bool_or(reasons)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instances", nargs="+")
    parser.add_argument("--longest", type=int, nargs="+", default=[0, 5])
    parser.add_argument("--workers", nargs="+", default=["default", "max_lp,fixed"])
    parser.add_argument("--limit", type=float, default=10.0)
    parser.add_argument("--semi-active", action="store_true",
                        help="starts only at 0 or another task's end")
    args = parser.parse_args()
    print("| instance | longest | workers | status | seconds | plan, s | CP-SAT bound, s |"
          " analytic bound, s |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for name in args.instances:
        problem = load_problem(INSTANCES / f"{name}.json")
        for workers in args.workers:
            for longest in args.longest:
                status, seconds, plan, found, bound = probe(problem, longest, workers,
                                                            args.limit, args.semi_active)
                print(f"| {name} | {longest} | {workers} | {status} | {seconds:.1f} | "
                      f"{plan:,.0f} | {found:,.0f} | {bound:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
