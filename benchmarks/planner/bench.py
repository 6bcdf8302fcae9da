"""Planner quality and speed on the committed instances, and what re-planning is worth.

    python benchmarks/planner/bench.py quality [--families small medium large]
    python benchmarks/planner/bench.py introspection [--families small medium]

``quality``: per instance, every solver's makespan over the instance's lower bound, its
solve seconds, and cpsat's gain over sequential (current practice) and over Saturn's
MILP at the same time limit (10 s on small instances, 60 s on the others). Every plan
is checked by the validator; an invalid plan stops the benchmark.

``introspection``: each instance replayed with actual lengths = estimate x lognormal
noise (sigma 0.1 and 0.3, three seeds), planned once or re-planned whenever a task
ends, both by ``greedy`` (0.2 s a plan, so that a replay of a hundred re-plans stays
short).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from dione.plan import Plan, PlanningProblem, check_plan, load_problem, lower_bound, solve
from dione.plan.greedy import greedy
from dione.plan.simulate import noisy_lengths, simulate

INSTANCES = Path(__file__).with_name("instances")
TIME_LIMITS = {"small": 10.0, "medium": 60.0, "large": 60.0}
SOLVERS = ["sequential", "greedy", "saturn-milp", "cpsat"]


def instances(families: list[str]) -> list[tuple[str, str, PlanningProblem]]:
    found = []
    for family in families:
        for path in sorted(INSTANCES.glob(f"{family}-*.json*"),
                           key=lambda p: int(p.name.split(".")[0].split("-")[1])):
            found.append((family, path.name.split(".")[0], load_problem(path)))
    return found


def checked(plan: Plan, problem: PlanningProblem, name: str) -> Plan:
    if plan.assignments:
        reasons = check_plan(plan, problem)
        if reasons:
            sys.exit(f"{name}: {plan.solver} returned an invalid plan: {reasons[:3]}")
    return plan


def quality(families: list[str], threads: int | None) -> None:
    for family in families:
        limit = TIME_LIMITS[family]
        print(f"\n### {family} (time limit {limit:g} s, threads {threads or 'all'})\n")
        print("| instance | tasks | nodes | lower bound, h | " + " | ".join(
            f"{s} / LB" for s in SOLVERS) + " | cpsat status | cpsat s | saturn-milp s | "
            "cpsat vs sequential | cpsat vs saturn-milp |")
        print("| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in SOLVERS)
              + " | --- | ---: | ---: | ---: | ---: |")
        for _, name, problem in instances([family]):
            bound = lower_bound(problem)
            plans = {s: checked(solve(problem, s, limit, threads), problem, name)
                     for s in SOLVERS}
            bound = max([bound] + [p.lower_bound for p in plans.values()])
            cells = []
            for s in SOLVERS:
                plan = plans[s]
                if plan.assignments:
                    cells.append(f"{plan.makespan / bound:.3f}")
                else:
                    cells.append("not built" if "reason" in plan.notes else "none found")
            cpsat, seq, milp = plans["cpsat"], plans["sequential"], plans["saturn-milp"]
            versus_milp = (f"{1 - cpsat.makespan / milp.makespan:.1%} lower"
                           if milp.assignments else "-")
            print(f"| {name} | {len(problem.tasks)} | {len(problem.nodes)} | "
                  f"{bound / 3600:.2f} | " + " | ".join(cells)
                  + f" | {cpsat.status} | {cpsat.solve_seconds:.1f} | "
                  f"{milp.solve_seconds:.1f} | {1 - cpsat.makespan / seq.makespan:.1%} lower"
                  f" | {versus_milp} |", flush=True)


def introspection(families: list[str], seeds: int) -> None:
    print("\n| instance | sigma | planned once, h | re-planned, h | re-planned / once | "
          "re-plans per run |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")

    def planner(problem: PlanningProblem) -> Plan:
        return greedy(problem, time_limit=0.2)

    for _, name, problem in instances(families):
        for sigma in (0.1, 0.3):
            once, again, replans = [], [], []
            for seed in range(seeds):
                factors = noisy_lengths(problem, sigma, seed)
                once.append(simulate(problem, planner, factors, replan=False).makespan)
                result = simulate(problem, planner, factors, replan=True)
                again.append(result.makespan)
                replans.append(result.replans)
            ratio = statistics.mean(a / o for a, o in zip(again, once, strict=True))
            print(f"| {name} | {sigma} | {statistics.mean(once) / 3600:.2f} | "
                  f"{statistics.mean(again) / 3600:.2f} | {ratio:.3f} | "
                  f"{statistics.mean(replans):.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["quality", "introspection"])
    parser.add_argument("--families", nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    if args.what == "quality":
        quality(args.families or ["small", "medium", "large"], args.threads)
    else:
        introspection(args.families or ["small", "medium"], args.seeds)


if __name__ == "__main__":
    main()
