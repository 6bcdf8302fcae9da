"""The trial runner's predictions against real full slices, and what profiling costs.

    python benchmarks/profile_accuracy.py [--workload examples/demo.py] [--repeats 3]

1. Profiles the workload with a fresh catalog (every trial runs) and times it.
2. For every option the planner could pick, one task of each speed group (tasks that
   differ only in learning rate train at the same speed) trains all its steps in one
   slice from scratch, evaluation included, alone on the machine, ``--repeats`` times in
   rounds: the median wall seconds against the profile's prediction for that slice.
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
from pathlib import Path

from dione.launch import local_placement, run_slice, total_steps
from dione.orchestrate.estimates import planning_nodes, task_options
from dione.plan import PlanningProblem, solve
from dione.profile import Catalog, ProfileEvent, TrialOptions, profile_workload
from dione.profile.choice import trial_runs
from dione.profile.results import ProfiledOption, TaskProfile
from dione.spec import load_workload, local_cluster


class FirstPass:
    """Notes when the profile's first pass (every setting once) has ended."""

    def __init__(self) -> None:
        self.total = 0
        self.seen = 0  # trials finished or skipped
        self.count = 0  # trials finished
        self.ended: float | None = None

    def see(self, event: ProfileEvent) -> None:
        if not self.total and event.total:
            self.total = event.total
        if self.ended is None and event.kind in ("finished", "skipped"):
            self.count += event.kind == "finished"
            self.seen += 1
            if self.seen >= self.total:
                self.ended = time.perf_counter()


def first_run_prediction(tp: TaskProfile, option: ProfiledOption) -> float:
    """The option's prediction had each trial run once: the chosen setting's first run,
    the fixed cost the median of every setting's first run."""
    first = [trial_runs(r)[0] for r in tp.trials
             if r.feasible and r.technique == option.technique and r.devices == option.devices]
    own = trial_runs(option.record)[0]
    return (statistics.median(run["fixed_seconds"] for run in first)
            + own["warmup_excess_seconds"] + tp.total_steps * own["step_seconds"]
            + tp.evaluation_seconds)


def summarize(label: str, errors: list[float]) -> None:
    absolute = sorted(abs(e) for e in errors)
    print(f"{len(errors)} options, {label}: median |error| {statistics.median(absolute):.1%}, "
          f"worst {absolute[-1]:.1%}, within 10%: {sum(a <= 0.10 for a in absolute)}, "
          f"beyond 25%: {sum(a > 0.25 for a in absolute)}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="examples/demo.py")
    parser.add_argument("--repeats", type=int, default=3,
                        help="full slices per option; the median is compared")
    parser.add_argument("--serial", action="store_true", help="one trial at a time")
    parser.add_argument("--trial-repeats", type=int, default=1,
                        help="runs of each option's chosen setting; above 1, predictions "
                        "from the first runs alone are shown beside the medians'")
    args = parser.parse_args()
    tasks = list(load_workload(args.workload))
    cluster = local_cluster()
    node = cluster.nodes[0]
    with tempfile.TemporaryDirectory() as scratch, Catalog(Path(scratch) / "c.sqlite") as cat:
        began = time.perf_counter()
        first_pass = FirstPass()
        profile = profile_workload(tasks, cluster, cat, parallel=not args.serial,
                                   options=TrialOptions(repeats=args.trial_repeats),
                                   on_event=first_pass.see)
        profile_seconds = time.perf_counter() - began
        first_seconds = (first_pass.ended or time.perf_counter()) - began
        print(f"profile of {args.workload}: {profile.trials_run} trials "
              f"({'one at a time' if args.serial else 'in parallel where devices allow'}) in "
              f"{profile_seconds:.1f} s on {node.devices} {node.kind} devices; "
              f"the first pass (every setting once): {first_pass.count} trials in "
              f"{first_seconds:.1f} s\n")
        cases = []
        seen_groups = set()
        for task in tasks:
            tp = profile.task(task.name)
            if tp.group in seen_groups:
                continue
            seen_groups.add(tp.group)
            cases += [(task, tp, option) for option in tp.options]
        # Rounds over every option, so a slow spell of the machine spreads over options
        # instead of hitting all the repeats of one.
        walls: dict[int, list[float]] = {i: [] for i in range(len(cases))}
        steps_walls: dict[int, list[float]] = {i: [] for i in range(len(cases))}
        for repeat in range(args.repeats):
            for i, (task, _, option) in enumerate(cases):
                run_dir = (Path(scratch)
                           / f"{task.name}-{option.technique}-{option.devices}-{repeat}")
                began = time.perf_counter()
                result = run_slice(task, option.technique, run_dir,
                                   local_placement(node, list(range(option.devices))),
                                   knobs=option.knobs)
                walls[i].append(time.perf_counter() - began)
                steps_walls[i].append(sum(result.step_seconds))
            print(f"round {repeat + 1} of {args.repeats} done", file=sys.stderr, flush=True)
        print(f"measured: median of {args.repeats} full slices per option, in rounds; "
              f"predicted from the median of {args.trial_repeats} trial run(s) of the chosen "
              "setting" + (", and from the first run alone" if args.trial_repeats > 1 else "")
              + "\n")
        both = args.trial_repeats > 1
        print("| task | technique | devices | knobs | predicted s | measured s (runs) | error | "
              + ("from the first trial: predicted s, error | " if both else "")
              + "steps predicted / measured s | rest predicted / measured s |")
        print("| --- " * (10 if both else 9) + "|")
        errors, first_errors = [], []
        for i, (task, tp, option) in enumerate(cases):
            predicted = option.seconds(tp.total_steps, False, tp.evaluation_seconds)
            measured = statistics.median(walls[i])
            steps_measured = statistics.median(steps_walls[i])
            error = predicted / measured - 1
            errors.append(error)
            first = first_run_prediction(tp, option)
            first_errors.append(first / measured - 1)
            knobs = ", ".join(f"{k}={v}" for k, v in option.knobs.items()
                              if k in ("micro_batches", "reshard_after_forward",
                                       "activation_checkpointing"))
            # The warm-up excess is part of the steps on both sides.
            steps_predicted = (tp.total_steps * (option.record.step_seconds or 0.0)
                               + option.record.warmup_excess_seconds)
            runs = ", ".join(f"{w:.2f}" for w in walls[i])
            print(f"| {task.name} | {option.technique} | {option.devices} | {knobs} | "
                  f"{predicted:.2f} | {measured:.2f} ({runs}) | {error:+.1%} | "
                  + (f"{first:.2f}, {first_errors[-1]:+.1%} | " if both else "")
                  + f"{steps_predicted:.2f} / {steps_measured:.2f} | "
                  f"{predicted - steps_predicted:.2f} / {measured - steps_measured:.2f} |",
                  flush=True)
        print()
        summarize(f"median of {args.trial_repeats} trial run(s)", errors)
        if both:
            summarize("first trial run alone", first_errors)
        print()

        print("| workload | profiling s | sum of fastest options s | planned makespan s | "
              "profiling / makespan |")
        print("| --- | --- | --- | --- | --- |")
        for factor in (1, 10):
            problem_tasks = []
            fastest = 0.0
            for task in tasks:
                tp = profile.task(task.name)
                options = task_options(tp, total_steps(task) * factor)
                fastest += min(o.seconds for o in options.options)
                problem_tasks.append(options)
            problem = PlanningProblem(planning_nodes(cluster), tuple(problem_tasks)).check()
            plan = solve(problem, "cpsat", 10.0)
            print(f"| {Path(args.workload).stem} x{factor} steps | {profile_seconds:.0f} | "
                  f"{fastest:.0f} | {plan.makespan:.0f} | "
                  f"{profile_seconds / plan.makespan:.2f} |")
            if both:
                print(f"| {Path(args.workload).stem} x{factor} steps, first pass only | "
                      f"{first_seconds:.0f} | | | {first_seconds / plan.makespan:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
