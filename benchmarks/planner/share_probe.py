"""cpsat on chosen instances with the whole model's share of the time varied (the rest
goes to the search around the plan): which half makes the plan where.

    python benchmarks/planner/share_probe.py mixed-2 --shares 0.25 0.5 1.0 --runs 2
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from dione.plan import check_plan, load_problem
from dione.plan.cpsat import cpsat

INSTANCES = Path(__file__).with_name("instances")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("instances", nargs="+")
    parser.add_argument("--shares", nargs="+", type=float, default=[0.25, 0.5, 1.0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--limit", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print("| instance | share | run | plan, s | plan / bound | from | load |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for name in args.instances:
        path = INSTANCES / f"{name}.json"
        problem = load_problem(path if path.exists() else path.with_suffix(".json.gz"))
        for run in range(args.runs):
            for share in args.shares:  # shares interleaved: the machine's drift hits all
                before = os.getloadavg()[0]
                plan = cpsat(problem, args.limit, args.threads, whole_model_share=share)
                assert check_plan(plan, problem) == [], name
                print(f"| {name} | {share} | {run + 1} | {plan.makespan:,.1f} | "
                      f"{plan.makespan / plan.lower_bound:.3f} | "
                      f"{plan.notes.get('plan_from')} | "
                      f"{before:.1f}-{os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
