"""Does a technique's step time drift over a long slice? Early against late steps.

    python benchmarks/slice_drift.py [--task digits-lr0.001-batch_size32] [--repeats 2]

Trials time a few dozen steps at a slice's start and the planner multiplies them out to
the whole slice, so a step time that grows as the slice goes on (a leak, a list that
grows every step) makes every prediction for a long slice too low. For each technique
on 2 CPU slots (single on 1), one task of the demo workload trains all its steps in one
slice; printed: the mean step time of steps 5-25 (what a trial times), of the last 100
steps, and their ratio, the median over ``--repeats`` slices.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import dione
from dione.launch import local_placement, run_slice
from dione.spec import load_workload, local_cluster

TECHNIQUES = {"single": 1, "ddp": 2, "fsdp": 2, "gpipe": 2, "1f1b": 2, "xpipe": 2}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="examples/demo.py")
    parser.add_argument("--task", default="digits-lr0.001-batch_size32")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    task = next(t for t in load_workload(args.workload) if t.name == args.task)
    node = local_cluster().nodes[0]
    print(f"dione from {Path(dione.__file__).parent}; task {task.name}, "
          f"median of {args.repeats} slices\n")
    print("| technique | steps | ms/step, steps 5-25 | ms/step, last 100 | last / early |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as scratch:
        for technique, devices in TECHNIQUES.items():
            knobs = {"micro_batches": 2} if technique in ("gpipe", "1f1b", "xpipe") else {}
            early, late = [], []
            for repeat in range(args.repeats):
                result = run_slice(task, technique, Path(scratch) / f"{technique}-{repeat}",
                                   local_placement(node, list(range(devices))), knobs=knobs)
                early.append(statistics.fmean(result.step_seconds[5:25]))
                late.append(statistics.fmean(result.step_seconds[-100:]))
            e, la = statistics.median(early), statistics.median(late)
            print(f"| {technique} x{devices} | {len(result.step_seconds)} | {e * 1000:.2f} | "
                  f"{la * 1000:.2f} | {la / e:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
