"""`dione run` against current practice, and re-planning against a fixed plan.

    python benchmarks/end_to_end.py [--repeats 2] [--slow-task chargpt-lr0.001-batch_size16]

On this machine's local CPU devices, one benchmark run:

1. profiles the demo workload with a fresh catalog (its cost is reported apart);
2. end to end, alternating, ``--repeats`` times: current practice (each task in turn on
   all devices, ddp, the same steps; ``dione run --current-practice``) against ``dione
   run`` (planned, re-planning on): actual makespans, and dione's first planned makespan;
3. re-planning, alternating: one task made much slower than profiled (a sleep per step
   that the trials did not see), ``dione run`` with re-planning against ``--no-replan``.

Gantt charts go to benchmarks/figures/: `demo_gantt.png` (a last, unslowed `dione run`)
and `replanning_gantt.png` (the last re-planning run of part 3).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dione.orchestrate import RunOptions, run_sequential, run_workload
from dione.profile import Catalog, profile_workload
from dione.spec import load_workload, local_cluster

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--slow-task", default="chargpt-lr0.001-batch_size16")
    parser.add_argument("--slow-seconds", type=float, default=0.05)
    args = parser.parse_args()
    tasks = list(load_workload(HERE / "slow_demo.py"))
    cluster = local_cluster()
    node = cluster.nodes[0]
    print(f"{len(tasks)} tasks of the demo workload on {node.devices} {node.kind} devices\n")
    with tempfile.TemporaryDirectory() as scratch:
        catalog = str(Path(scratch) / "catalog.sqlite")
        began = time.perf_counter()
        with Catalog(catalog) as cat:
            profile = profile_workload(tasks, cluster, cat)
        print(f"profiling: {profile.trials_run} trials in {time.perf_counter() - began:.1f} s "
              "(fresh catalog; every later run finds them all in it)\n")
        options = RunOptions(catalog=catalog)

        def dione_run(label: str, **changes: object) -> tuple[float, float, Path]:
            run_dir = Path(scratch) / f"{label}-{time.monotonic_ns()}"
            result = run_workload(tasks, cluster, run_dir,
                                  RunOptions(**{**options.__dict__, **changes}))
            assert all(t.status == "done" for t in result.tasks), result.tasks
            return result.makespan, result.planned_makespan, run_dir

        def current_practice() -> float:
            run_dir = Path(scratch) / f"current-{time.monotonic_ns()}"
            began = time.perf_counter()
            outcomes = run_sequential(tasks, cluster, run_dir)
            assert not any(o.error for o in outcomes), [o.error for o in outcomes]
            return time.perf_counter() - began

        print("| round | current practice s | dione run s | dione first plan s | "
              "current / dione |")
        print("| --- | --- | --- | --- | --- |")
        ratios = []
        for repeat in range(args.repeats):
            order = ["current", "dione"] if repeat % 2 == 0 else ["dione", "current"]
            measured: dict[str, float] = {}
            planned = 0.0
            for which in order:
                if which == "current":
                    measured[which] = current_practice()
                else:
                    measured[which], planned, _ = dione_run("dione")
            ratio = measured["current"] / measured["dione"]
            ratios.append(ratio)
            print(f"| {repeat + 1} | {measured['current']:.1f} | {measured['dione']:.1f} | "
                  f"{planned:.1f} | {ratio:.2f} |", flush=True)
        print(f"\nmedian current / dione: {statistics.median(ratios):.2f}\n")

        os.environ["DIONE_BENCH_SLOW"] = args.slow_task
        os.environ["DIONE_BENCH_SLOW_SECONDS"] = str(args.slow_seconds)
        print(f"re-planning: {args.slow_task} sleeps {args.slow_seconds * 1000:.0f} ms per "
              "step, unseen by its trials\n")
        print("| round | fixed plan s | re-planning s | fixed / re-planning |")
        print("| --- | --- | --- | --- |")
        ratios = []
        for repeat in range(args.repeats):
            order = [False, True] if repeat % 2 == 0 else [True, False]
            measured_replan: dict[bool, float] = {}
            for replan in order:
                measured_replan[replan], _, run_dir = dione_run(
                    "replan" if replan else "fixed", replan=replan)
                if replan:
                    shutil.copy(run_dir / "report" / "gantt.png",
                                HERE / "figures" / "replanning_gantt.png")
            ratio = measured_replan[False] / measured_replan[True]
            ratios.append(ratio)
            print(f"| {repeat + 1} | {measured_replan[False]:.1f} | "
                  f"{measured_replan[True]:.1f} | {ratio:.2f} |", flush=True)
        print(f"\nmedian fixed / re-planning: {statistics.median(ratios):.2f}")
        del os.environ["DIONE_BENCH_SLOW"]
        _, _, run_dir = dione_run("final")
        shutil.copy(run_dir / "report" / "gantt.png", HERE / "figures" / "demo_gantt.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
