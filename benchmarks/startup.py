"""What starting a slice costs, warm workers against the code before them, side by side.

    python benchmarks/startup.py --before PATH/TO/OLD/src [--rounds 3] [--profile]
        [--heavy transformers]

Each round runs both variants, alternating which goes first, each in a child process
whose ``PYTHONPATH`` selects the code (``--before``: the ``src`` of a checkout of the
commit before warm workers; the other is this checkout). A child trains the demo's six
tasks, each 10 steps under ``single`` on one device and then 10 more under ``ddp`` on
two (so half the slices load a checkpoint), one slice after another, and reports each
slice's fixed cost: its wall time less its steps (no slice evaluates). ``--profile``
also times ``dione profile examples/demo.py`` from an empty catalog per variant and
round. ``--heavy MODULE`` adds a child whose workload imports MODULE and runs the same
slices, to show whether that import is paid once per worker or once per slice.
The figures to compare are the ratios within a round: this machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo.py"


def child(out: Path, workload: Path) -> None:
    """Train each task's two slices; write every slice's fixed cost."""
    from dione.launch.slice import local_placement, run_slice
    from dione.spec.cluster import Node
    from dione.spec.workload import load_workload

    node = Node("bench", 2, "cpu")
    rows = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for task in load_workload(workload):
            for technique, devices in (("single", [0]), ("ddp", [0, 1])):
                result = run_slice(task, technique, Path(scratch) / task.name,
                                   local_placement(node, devices), steps=10, evaluate=False)
                rows.append({"task": task.name, "technique": technique,
                             "seconds": result.seconds,
                             "fixed": result.seconds - sum(result.step_seconds)})
    out.write_text(json.dumps({"slices": rows, "total": time.perf_counter() - began}))


def run_child(src: Path, folder: Path, label: str, workload: Path) -> dict[str, Any]:
    out = folder / f"{label}-{time.monotonic_ns()}.json"
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, __file__, "--child", str(out), "--workload",
                    str(workload)], check=True, env=env, timeout=1800)
    return dict(json.loads(out.read_text()))


def time_profile(src: Path, folder: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    catalog = folder / f"catalog-{time.monotonic_ns()}.sqlite"
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dione.cli", "profile", str(DEMO), "--catalog",
                    str(catalog), "--devices", "cpu:2"], check=True, env=env, timeout=1800,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.2f} ({q[0]:.2f}-{q[2]:.2f})"


def heavy_workload(module: str, folder: Path) -> Path:
    """The demo workload, importing ``module`` first (as a Hugging Face workload would)."""
    file = folder / "heavy.py"
    file.write_text(f"import {module}  # noqa: F401\n" + DEMO.read_text())
    return file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="src folder of the code to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--heavy", help="a module the heavy workload imports")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--workload", type=Path, default=DEMO, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.workload)
        return
    if args.before is None:
        parser.error("--before PATH/TO/OLD/src is required")
    variants = {"before": args.before.resolve(), "warm": ROOT / "src"}
    fixed: dict[str, list[float]] = {k: [] for k in variants}
    later: dict[str, list[float]] = {k: [] for k in variants}
    totals: dict[str, list[float]] = {k: [] for k in variants}
    profiles: dict[str, list[float]] = {k: [] for k in variants}
    heavy_rows: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        heavy = heavy_workload(args.heavy, folder) if args.heavy else None
        for round_ in range(args.rounds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for label in order:
                result = run_child(variants[label], folder, label, DEMO)
                costs = [row["fixed"] for row in result["slices"]]
                fixed[label] += costs
                later[label] += costs[1:]
                totals[label].append(result["total"])
                print(f"round {round_} {label}: slices {len(costs)}, fixed median "
                      f"{statistics.median(costs):.2f} s, first {costs[0]:.2f} s, total "
                      f"{result['total']:.1f} s", flush=True)
                if heavy is not None:
                    rows = run_child(variants[label], folder, label + "-heavy", heavy)["slices"]
                    heavy_rows[label] += rows
                    print(f"round {round_} {label} importing {args.heavy}: fixed "
                          + ", ".join(f"{r['fixed']:.1f}" for r in rows), flush=True)
                if args.profile:
                    seconds = time_profile(variants[label], folder)
                    profiles[label].append(seconds)
                    print(f"round {round_} {label}: dione profile {seconds:.1f} s", flush=True)
    print("\n| variant | slices | fixed cost per slice, s: median (IQR) | after the first slice "
          "| 12 slices, s |")
    print("| --- | --- | --- | --- | --- |")
    for label in variants:
        print(f"| {label} | {len(fixed[label])} | {spread(fixed[label])} | "
              f"{spread(later[label])} | {spread(totals[label])} |")
    ratios = [b / w for b, w in zip(totals["before"], totals["warm"], strict=True)]
    print(f"\nbefore / warm, 12 slices, per round: {', '.join(f'{r:.2f}' for r in ratios)}")
    if args.profile:
        ratios = [b / w for b, w in zip(profiles["before"], profiles["warm"], strict=True)]
        print("dione profile from an empty catalog, s: before "
              + ", ".join(f"{s:.0f}" for s in profiles["before"]) + "; warm "
              + ", ".join(f"{s:.0f}" for s in profiles["warm"])
              + "; before / warm per round: " + ", ".join(f"{r:.2f}" for r in ratios))
    if heavy is not None:
        for label in variants:
            costs = [r["fixed"] for r in heavy_rows[label]]
            print(f"importing {args.heavy}, {label}: first slice {costs[0]:.1f} s, the others "
                  f"{spread(costs[1:])} s")


if __name__ == "__main__":
    main()
