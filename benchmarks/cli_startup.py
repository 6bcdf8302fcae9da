"""How long `dione`'s light commands take to start, beside `python -c pass`, in one run.

`dione --help`, `dione plan` on a small problem, `dione status` and `dione report` on a
finished run must not pay for torch (issue 16). Each command runs ``--repeats`` times,
interleaved with the others, and the medians are printed with their ratio to a bare
interpreter. Usage::

    python benchmarks/cli_startup.py RUN_DIR [--repeats 5]

RUN_DIR is any finished run (e.g. ``dione run examples/demo.py --out runs/demo``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROBLEM = Path(__file__).resolve().parent / "planner" / "instances" / "small-1.json"


def seconds(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dione = [sys.executable, "-m", "dione.cli"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "dione --help": [*dione, "--help"],
        "dione plan small-1 (1 s limit)": [*dione, "plan", str(PROBLEM), "--time-limit", "1"],
        "dione status RUN_DIR": [*dione, "status", args.run_dir],
        "dione report RUN_DIR": [*dione, "report", args.run_dir],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, command in commands.items():
            times[name].append(seconds(command))
    base = statistics.median(times["python -c pass"])
    print("| command | median s | / python -c pass |\n| --- | --- | --- |")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| `{name}` | {median:.2f} | {median / base:.1f} |")


if __name__ == "__main__":
    main()
