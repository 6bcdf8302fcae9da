"""The trial runner's predictions against real full slices, and what profiling costs.

    python benchmarks/profile_accuracy.py [--workload examples/demo.py] [--repeats 1]

1. Profiles the workload with a fresh catalog (every trial runs) and times it.
2. For every option the planner could pick, one task of each speed group (tasks that
   differ only in learning rate train at the same speed) trains all its steps in one
   slice from scratch, evaluation included, alone on the machine: measured wall seconds
   against the profile's prediction for that slice.
3. Cost: profiling seconds against the workload's predicted total (the sum over tasks of
   their fastest option, and the planned makespan), for the workload and for the same
   workload ten times longer (the same trials serve it: steps are not part of a
   fingerprint).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from dione.launch import local_placement, run_slice, total_steps
from dione.plan import PlanningProblem, solve
from dione.profile import Catalog, profile_workload
from dione.spec import load_workload, local_cluster


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="examples/demo.py")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--serial", action="store_true", help="one trial at a time")
    args = parser.parse_args()
    tasks = list(load_workload(args.workload))
    cluster = local_cluster()
    node = cluster.nodes[0]
    with tempfile.TemporaryDirectory() as scratch, Catalog(Path(scratch) / "c.sqlite") as cat:
        began = time.perf_counter()
        profile = profile_workload(tasks, cluster, cat, parallel=not args.serial)
        profile_seconds = time.perf_counter() - began
        print(f"profile of {args.workload}: {profile.trials_run} trials "
              f"({'one at a time' if args.serial else 'in parallel where devices allow'}) in "
              f"{profile_seconds:.1f} s on {node.devices} {node.kind} devices\n")
        print("| task | technique | devices | knobs | predicted s | measured s | error | "
              "steps predicted / measured s | rest predicted / measured s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        errors = []
        seen_groups = set()
        for task in tasks:
            tp = profile.task(task.name)
            if tp.group in seen_groups:
                continue
            seen_groups.add(tp.group)
            for option in tp.options:
                predicted = option.seconds(tp.total_steps, False, tp.evaluation_seconds)
                for repeat in range(args.repeats):
                    run_dir = Path(scratch) / f"{task.name}-{option.technique}-" \
                        f"{option.devices}-{repeat}"
                    began = time.perf_counter()
                    result = run_slice(task, option.technique, run_dir,
                              local_placement(node, list(range(option.devices))),
                              knobs=option.knobs)
                    measured = time.perf_counter() - began
                    error = predicted / measured - 1
                    errors.append(error)
                    knobs = ", ".join(f"{k}={v}" for k, v in option.knobs.items()
                                      if k in ("micro_batches", "reshard_after_forward",
                                               "activation_checkpointing"))
                    # The warm-up excess is part of the steps on both sides.
                    steps_predicted = (tp.total_steps * (option.record.step_seconds or 0.0)
                                       + option.record.warmup_excess_seconds)
                    steps_measured = sum(result.step_seconds)
                    print(f"| {task.name} | {option.technique} | {option.devices} | {knobs} | "
                          f"{predicted:.2f} | {measured:.2f} | {error:+.1%} | "
                          f"{steps_predicted:.2f} / {steps_measured:.2f} | "
                          f"{predicted - steps_predicted:.2f} / "
                          f"{measured - steps_measured:.2f} |", flush=True)
        absolute = sorted(abs(e) for e in errors)
        print(f"\n{len(errors)} options: median |error| {statistics.median(absolute):.1%}, "
              f"worst {absolute[-1]:.1%}, within 10%: "
              f"{sum(a <= 0.10 for a in absolute)}, beyond 25%: "
              f"{sum(a > 0.25 for a in absolute)}\n")

        print("| workload | profiling s | sum of fastest options s | planned makespan s | "
              "profiling / makespan |")
        print("| --- | --- | --- | --- | --- |")
        for factor in (1, 10):
            problem_tasks = []
            fastest = 0.0
            for task in tasks:
                tp = profile.task(task.name)
                steps = total_steps(task) * factor
                tp_long = replace(tp, total_steps=steps)
                options = tp_long.problem_options()
                fastest += min(o["seconds"] for o in options)
                problem_tasks.append({"name": task.name, "options": options})
            problem = PlanningProblem.from_json(
                {"cluster": cluster.to_json(), "tasks": problem_tasks})
            plan = solve(problem, "cpsat", 10.0)
            print(f"| {Path(args.workload).stem} x{factor} steps | {profile_seconds:.0f} | "
                  f"{fastest:.0f} | {plan.makespan:.0f} | "
                  f"{profile_seconds / plan.makespan:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
