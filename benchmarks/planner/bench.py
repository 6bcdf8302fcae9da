"""Planner quality and speed on the committed instances, and what re-planning is worth.

    python benchmarks/planner/bench.py quality [--families small medium large hard mixed]
        [--solvers ...] [--threads 2] [--json results.jsonl] [--instances hard-3 ...]
        [--deterministic-time UNITS]
    python benchmarks/planner/bench.py introspection [--families small medium]
    python benchmarks/planner/bench.py bounds [--families ...] [--instances ...]

``quality``: per instance, every solver's makespan over the best lower bound known (the
analytic bound or any solver's proven one), its solve seconds, the share of the
possible gain over sequential it captures, (sequential - plan) / (sequential - bound),
and cpsat's gain over sequential (current practice) and over Saturn's MILP at the same
time limit (10 s on instances of at most 24 tasks, 60 s on the others). Every plan is
checked by the validator; an invalid plan stops the benchmark. A summary follows: mean
share captured per solver, and issue 22's goals checked row by row. Each row records the
machine's load average before and after it (the machine may be shared), and
``--deterministic-time`` bounds cpsat by CP-SAT's deterministic time instead of the
clock (the same plan however busy the machine is). ``compare.py`` sets two runs side by
side.

``bounds``: per instance, the greedy makespan and each lower bound in turn (analytic,
energetic, lane), with no clock in any of them: the same figures on any machine, so two
commits compare exactly (run one with ``PYTHONPATH=<its worktree>/src``).

``introspection``: each instance replayed with actual lengths = estimate x lognormal
noise (sigma 0.1 and 0.3, three seeds), planned once or re-planned whenever a task
ends, both by ``greedy`` (0.2 s a plan, so that a replay of a hundred re-plans stays
short).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from dione.plan import Plan, PlanningProblem, check_plan, load_problem, lower_bound, solve
from dione.plan.greedy import greedy
from dione.plan.simulate import noisy_lengths, simulate

INSTANCES = Path(__file__).with_name("instances")
SOLVERS = ["sequential", "greedy", "saturn-milp", "cpsat"]
FAMILIES = ["small", "medium", "large", "hard", "mixed"]
SMALL_TASKS = 24  # up to this many tasks: a 10 s limit, and cpsat should prove the optimum
HARD_MEDIUM = range(40, 81)  # tasks of a hard medium instance: cpsat within 1.03 x bound


def time_limit(problem: PlanningProblem) -> float:
    return 10.0 if len(problem.tasks) <= SMALL_TASKS else 60.0


def captured(sequential: float, plan: float, bound: float) -> float:
    """The share of the possible gain over sequential that a plan captures (1: all)."""
    return (sequential - plan) / (sequential - bound) if sequential > bound else 1.0


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


def quality(families: list[str], threads: int | None, solvers: list[str],
            record: Path | None, milp_max_tasks: int, only: list[str] | None = None,
            deterministic_time: float | None = None) -> None:
    rows: list[dict[str, Any]] = []
    for family in families:
        print(f"\n### {family} (threads {threads or 'all'}; time limit 10 s up to "
              f"{SMALL_TASKS} tasks, 60 s above)\n")
        print("| instance | tasks | nodes | limit s | best bound, h | " + " | ".join(
            f"{s} / LB" for s in solvers) + " | " + " | ".join(
            f"{s} captured" for s in solvers if s != "sequential")
            + " | cpsat status | cpsat from | cpsat s | saturn-milp s | load |")
        print("| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in solvers)
              + " | " + " | ".join("---:" for s in solvers if s != "sequential")
              + " | --- | --- | ---: | ---: | ---: |")
        for _, name, problem in instances([family]):
            if only and name not in only:
                continue
            limit = time_limit(problem)
            load_before = os.getloadavg()[0]
            plans = {s: checked(solve(problem, s, limit, threads,
                                      deterministic_time if s == "cpsat" else None),
                                problem, name)
                     for s in dict.fromkeys(["sequential", *solvers])
                     if s != "saturn-milp" or len(problem.tasks) <= milp_max_tasks}
            bound = max([lower_bound(problem)] + [p.lower_bound for p in plans.values()])
            seq = plans["sequential"].makespan
            row: dict[str, Any] = {"instance": name, "family": family,
                                   "tasks": len(problem.tasks), "nodes": len(problem.nodes),
                                   "limit": limit, "bound": bound, "threads": threads,
                                   "deterministic_time": deterministic_time,
                                   "load": [load_before, os.getloadavg()[0]],
                                   "plans": {s: {"makespan": p.makespan, "status": p.status,
                                                 "seconds": p.solve_seconds,
                                                 "bound": p.lower_bound,
                                                 "from": p.notes.get("plan_from")}
                                             for s, p in plans.items()}}
            rows.append(row)
            ratios, shares = [], []
            for s in solvers:
                if s not in plans:
                    ratios.append("skipped")
                    shares.append("-")
                    continue
                plan = plans[s]
                if plan.assignments:
                    ratios.append(f"{plan.makespan / bound:.3f}")
                    if s != "sequential":
                        shares.append(f"{captured(seq, plan.makespan, bound):.1%}")
                else:
                    ratios.append("not built" if "reason" in plan.notes else "none found")
                    if s != "sequential":
                        shares.append("-")
            cpsat = plans.get("cpsat")
            milp = plans.get("saturn-milp")
            print(f"| {name} | {len(problem.tasks)} | {len(problem.nodes)} | {limit:g} | "
                  f"{bound / 3600:.2f} | " + " | ".join(ratios) + " | " + " | ".join(shares)
                  + f" | {cpsat.status if cpsat else '-'}"
                  f" | {cpsat.notes.get('plan_from', '-') if cpsat else '-'}"
                  f" | {f'{cpsat.solve_seconds:.1f}' if cpsat else '-'}"
                  f" | {f'{milp.solve_seconds:.1f}' if milp else '-'}"
                  f" | {load_before:.1f}-{row['load'][1]:.1f} |", flush=True)
            if record is not None:
                with record.open("a") as out:
                    out.write(json.dumps(row) + "\n")
    summary(rows, solvers)


def summary(rows: list[dict[str, Any]], solvers: list[str]) -> None:
    """Mean share captured per solver, and issue 22's goals row by row."""
    if not rows:
        return
    print("\n| solver | instances with a plan | mean share of the gain captured | "
          "mean plan / LB |")
    print("| --- | ---: | ---: | ---: |")
    for s in solvers:
        if s == "sequential":
            continue
        found = [r for r in rows
                 if s in r["plans"] and r["plans"][s]["makespan"] != float("inf")]
        if not found:
            continue
        share = statistics.mean(captured(r["plans"]["sequential"]["makespan"],
                                         r["plans"][s]["makespan"], r["bound"])
                                for r in found)
        ratio = statistics.mean(r["plans"][s]["makespan"] / r["bound"] for r in found)
        print(f"| {s} | {len(found)} of {len(rows)} | {share:.1%} | {ratio:.3f} |")
    if "cpsat" not in solvers:
        return
    worse = [r["instance"] for r in rows
             if "greedy" in r["plans"] and r["plans"]["cpsat"]["makespan"]
             > r["plans"]["greedy"]["makespan"] + 1e-6]
    small = [r for r in rows if r["tasks"] <= SMALL_TASKS]
    unproven = [r["instance"] for r in small if r["plans"]["cpsat"]["status"] != "optimal"]
    medium = [r for r in rows if r["family"] == "hard" and r["tasks"] in HARD_MEDIUM]
    far = [f"{r['instance']} {r['plans']['cpsat']['makespan'] / r['bound']:.3f}"
           for r in medium if r["plans"]["cpsat"]["makespan"] > 1.03 * r["bound"]]
    print(f"\n- cpsat above greedy: {', '.join(worse) or 'none'}")
    print(f"- instances of at most {SMALL_TASKS} tasks not proven optimal within 10 s: "
          f"{', '.join(unproven) or 'none'} (of {len(small)})")
    print(f"- hard medium instances above 1.03 x the best bound: {', '.join(far) or 'none'} "
          f"(of {len(medium)})")


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


def bounds(families: list[str], only: list[str] | None) -> None:
    from dione.plan.bounds import energetic_bound
    from dione.plan.greedy import greedy_placements
    from dione.plan.lanes import lane_bound

    print("\n| instance | nodes | greedy, s | analytic, s | energetic, s | lane, s | "
          "greedy / lane |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for _, name, problem in instances(families):
        if only and name not in only:
            continue
        plan = greedy_placements(problem, None).makespan
        analytic = lower_bound(problem)
        energetic = max(analytic, energetic_bound(problem, analytic, plan))
        lane = max(energetic, lane_bound(problem, energetic, plan))
        sizes = [n.devices for n in problem.nodes]
        nodes = " + ".join(f"{sizes.count(d)} x {d}" for d in sorted(set(sizes), reverse=True))
        print(f"| {name} | {nodes} | {plan:,.1f} | {analytic:,.1f} | {energetic:,.1f} | "
              f"{lane:,.1f} | {plan / lane:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["quality", "introspection", "bounds"])
    parser.add_argument("--families", nargs="+", default=None, choices=FAMILIES)
    parser.add_argument("--solvers", nargs="+", default=SOLVERS, choices=SOLVERS)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--milp-max-tasks", type=int, default=SMALL_TASKS,
                        help="skip saturn-milp above this many tasks: it overran 60 s by "
                        "70-480 s on medium instances without a plan (issue 6)")
    parser.add_argument("--instances", nargs="+", default=None,
                        help="only these instances (e.g. hard-3 hard-5)")
    parser.add_argument("--deterministic-time", type=float, default=None,
                        help="bound cpsat by this much CP-SAT deterministic time instead")
    parser.add_argument("--json", type=Path, default=None,
                        help="append one JSON line per instance here (raw figures)")
    args = parser.parse_args()
    if args.what == "quality":
        quality(args.families or FAMILIES, args.threads, args.solvers, args.json,
                args.milp_max_tasks, args.instances, args.deterministic_time)
    elif args.what == "bounds":
        bounds(args.families or FAMILIES, args.instances)
    else:
        introspection(args.families or ["small", "medium"], args.seeds)


if __name__ == "__main__":
    main()
