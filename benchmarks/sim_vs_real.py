"""The virtual cluster against reality: a real `dione run` of the demo, then the same
workload simulated from the same profile, each task slowed as the run measured it.

    python benchmarks/sim_vs_real.py [--slow-task chargpt-lr0.001-batch_size16]

On this machine's local CPU devices: profile the demo workload (a fresh catalog), run it
for real; then again with one task far slower than profiled (a sleep per step its trials
did not see: re-planning must act). For each real run, the simulation gets the same
tasks and the same profile (from the catalog), and a scenario whose per-task slowdown is
the task's mean measured step time over its trial's (so the simulator knows the speeds
the run measured, as the issue asks, but not its plans, slices or start-ups). Printed:
the makespans, their ratio, and whether the first plans agree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from dione.orchestrate import RunOptions, run_workload
from dione.orchestrate.plans import read_plans
from dione.profile import Catalog, profile_workload
from dione.simulate import Scenario, simulate_profile
from dione.spec import load_workload, local_cluster
from dione.state.store import RunStore

HERE = Path(__file__).resolve().parent


def measured_slowdown(run_dir: Path, profile) -> dict[str, float]:
    """Per task: its mean step time over the run, over its trial's for the same option."""
    found: dict[str, float] = {}
    with RunStore(run_dir) as store:
        for task in store.tasks():
            ratios = []
            for s in store.slices(task.name):
                steps = store.slice_step_seconds(s.id)
                option = profile.task(task.name).option(s.technique, len(s.device_ids))
                if steps and option is not None and option.record.step_seconds:
                    ratios.append(statistics.fmean(steps) / option.record.step_seconds)
            if ratios:
                found[task.name] = statistics.fmean(ratios)
    return found


def first_plan(run_dir: Path) -> list[tuple[str, str, int]]:
    plans = read_plans(run_dir)
    return sorted((a.task, a.technique, a.devices) for a in plans[0].run_clock)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow-task", default="chargpt-lr0.001-batch_size16")
    parser.add_argument("--slow-seconds", type=float, default=0.05)
    args = parser.parse_args()
    tasks = list(load_workload(HERE / "slow_demo.py"))
    cluster = local_cluster()
    print("| run | real makespan s | simulated s | simulated / real | real plans | "
          "simulated plans | same first plan |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        catalog = str(Path(scratch) / "catalog.sqlite")
        with Catalog(catalog) as cat:
            profile = profile_workload(tasks, cluster, cat)
        for label, slow in (("demo", None), ("one task slowed", args.slow_task)):
            if slow:
                os.environ["DIONE_BENCH_SLOW"] = slow
                os.environ["DIONE_BENCH_SLOW_SECONDS"] = str(args.slow_seconds)
            real_dir = Path(scratch) / f"real-{time.monotonic_ns()}"
            real = run_workload(tasks, cluster, real_dir, RunOptions(catalog=catalog))
            os.environ.pop("DIONE_BENCH_SLOW", None)
            assert all(t.status == "done" for t in real.tasks)
            scenario = Scenario(task_slowdown=measured_slowdown(real_dir, profile),
                                curve="flat")
            sim_dir = Path(scratch) / f"sim-{time.monotonic_ns()}"
            simulated = simulate_profile(tasks, profile, sim_dir, cluster=cluster,
                                         scenario=scenario,
                                         options=RunOptions(catalog=catalog))
            print(f"| {label} | {real.makespan:.1f} | {simulated.makespan:.1f} | "
                  f"{simulated.makespan / real.makespan:.3f} | {real.plans_adopted} | "
                  f"{simulated.plans_adopted} | "
                  f"{'yes' if first_plan(real_dir) == first_plan(sim_dir) else 'no'} |",
                  flush=True)
            print("  slowdowns measured: " + ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(scenario.task_slowdown.items())))


if __name__ == "__main__":
    main()
