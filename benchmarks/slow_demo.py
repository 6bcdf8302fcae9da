"""The demo workload, with a switch that makes one task slower than profiled.

``DIONE_BENCH_SLOW=<task name>`` adds ``DIONE_BENCH_SLOW_SECONDS`` (default 0.05) of sleep to
each of that task's steps; profile without it, run with it, and the run meets a task
that is much slower than its catalog entry (benchmarks/end_to_end.py's re-planning part).
"""

import dataclasses
import functools
import os
import time
from pathlib import Path

from dione import Workload, load_workload


def slowed(name, loss, output, target):
    if os.environ.get("DIONE_BENCH_SLOW") == name:
        time.sleep(float(os.environ.get("DIONE_BENCH_SLOW_SECONDS", "0.05")))
    return loss(output, target)


_demo = load_workload(Path(__file__).resolve().parent.parent / "examples" / "demo.py")
workload = Workload([dataclasses.replace(t, loss=functools.partial(slowed, t.name, t.loss))
                     for t in _demo])
