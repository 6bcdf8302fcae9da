"""Two runs of ``bench.py quality --json`` side by side: cpsat's plan / bound and status in each.

    python benchmarks/planner/compare.py quiet.jsonl busy.jsonl [--names quiet busy]

The bound of each row is the best known in either run (so that a plan is measured against
the same bound in both), and the machine's load average during each row is shown, so a
difference can be read against how busy the machine was.
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
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--names", nargs=2, default=["first", "second"])
    args = parser.parse_args()
    first, second = rows(args.first), rows(args.second)
    a, b = args.names
    print(f"| instance | best bound, h | greedy / LB | cpsat / LB, {a} | cpsat / LB, {b} | "
          f"cpsat status, {a} / {b} | cpsat from, {a} / {b} | load, {a} | load, {b} |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    ratios: dict[str, list[float]] = {a: [], b: []}
    for name in [n for n in first if n in second]:
        one, two = first[name], second[name]
        bound = max(one["bound"], two["bound"])
        greedy = one["plans"]["greedy"]["makespan"] / bound
        cells = []
        for label, row in ((a, one), (b, two)):
            ratio = row["plans"]["cpsat"]["makespan"] / bound
            ratios[label].append(ratio)
            cells.append(f"{ratio:.3f}")
        status = " / ".join(r["plans"]["cpsat"]["status"] for r in (one, two))
        source = " / ".join(str(r["plans"]["cpsat"]["from"]) for r in (one, two))
        loads = [f"{r['load'][0]:.1f}-{r['load'][1]:.1f}" if "load" in r else "-"
                 for r in (one, two)]
        print(f"| {name} | {bound / 3600:.2f} | {greedy:.3f} | {cells[0]} | {cells[1]} | "
              f"{status} | {source} | {loads[0]} | {loads[1]} |")
    for label in (a, b):
        if ratios[label]:
            print(f"\n- {label}: mean cpsat / LB {statistics.mean(ratios[label]):.4f}, "
                  f"worst {max(ratios[label]):.3f}")


if __name__ == "__main__":
    main()
