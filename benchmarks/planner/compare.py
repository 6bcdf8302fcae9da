"""Runs of ``bench.py quality --json`` side by side: cpsat's plan / bound and status in each.

    python benchmarks/planner/compare.py alone.jsonl busy.jsonl [more.jsonl ...]
        [--names alone busy ...]

The bound of each row is the best known in any of the runs (so that a plan is measured
against the same bound in all), and the machine's load average during each row is
shown, so a difference can be read against how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def rows(path: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            found[row["instance"]] = row
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--names", nargs="+", default=None)
    args = parser.parse_args()
    names = args.names or [p.stem for p in args.runs]
    if len(names) != len(args.runs):
        parser.error("give one name per run")
    runs = [rows(p) for p in args.runs]
    print("| instance | best bound, h | greedy / LB | " + " | ".join(
        f"cpsat / LB, {n}" for n in names) + " | cpsat status | load |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in names) + " | --- | --- |")
    ratios: dict[str, list[float]] = {n: [] for n in names}
    for instance in [i for i in runs[0] if all(i in run for run in runs)]:
        mine = [run[instance] for run in runs]
        bound = max(r["bound"] for r in mine)
        greedy = mine[0]["plans"]["greedy"]["makespan"] / bound
        cells = []
        for name, row in zip(names, mine, strict=True):
            ratio = row["plans"]["cpsat"]["makespan"] / bound
            ratios[name].append(ratio)
            cells.append(f"{ratio:.3f}")
        status = " / ".join(r["plans"]["cpsat"]["status"] for r in mine)
        loads = " / ".join(f"{r['load'][0]:.1f}-{r['load'][1]:.1f}" if "load" in r else "-"
                           for r in mine)
        print(f"| {instance} | {bound / 3600:.2f} | {greedy:.3f} | " + " | ".join(cells)
              + f" | {status} | {loads} |")
    print()
    for name in names:
        if ratios[name]:
            print(f"- {name}: mean cpsat / LB {statistics.mean(ratios[name]):.4f}, "
                  f"worst {max(ratios[name]):.3f}")


if __name__ == "__main__":
    main()
