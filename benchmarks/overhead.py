"""Per-step time of `dione train` slices against a hand-written PyTorch loop, as ratios.

    python benchmarks/overhead.py [--steps 300] [--repeats 3] [--models chargpt digits]

For each model and (technique, devices) the two run alternately, ``--repeats`` times
each, on the same cores with the same thread counts; each run's steady-state step time
is the median of its steps after a warm-up, and the ratio is dione's median over the
plain loop's. Slice start-up (process start, data, checkpoint save) is reported apart:
it is paid once per slice, not per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from models import MODELS

from dione.launch import local_placement, run_slice
from dione.spec import Node, Task
from dione.spec.devices import available_cores

WARMUP = 20
CONFIGS = [("single", 1), ("ddp", 2)]


def steady(step_seconds: list[float]) -> float:
    return statistics.median(step_seconds[WARMUP:])


def plain(model: str, world: int, steps: int, threads: int, cores: list[list[int]] | None,
          folder: Path) -> float:
    out = folder / f"plain-{model}-{world}.json"
    command = [sys.executable, str(Path(__file__).with_name("plain_loop.py")), model,
               str(world), str(steps), str(out), str(threads)]
    if cores:
        command.append(json.dumps(cores))
    subprocess.run(command, check=True)
    return steady(json.loads(out.read_text())["step_seconds"])


def dione(model: str, technique: str, world: int, steps: int, node: Node,
          folder: Path) -> tuple[float, float]:
    setup = MODELS[model]
    task = Task(name=model, model=setup.model, data=setup.data, loss=setup.loss,
                optimizer=setup.optimizer, batch_size=setup.batch_size, steps=steps)
    with tempfile.TemporaryDirectory(dir=folder) as run_dir:
        result = run_slice(task, technique, run_dir, local_placement(node, range(world)),
                           evaluate=False)
    training = sum(result.step_seconds)
    return steady(result.step_seconds), result.seconds - training


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["chargpt-wide", "chargpt", "digits"])
    args = parser.parse_args()
    cores = available_cores()
    node = Node("bench", len(cores), "cpu", len(cores))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for model in args.models:
            for technique, world in CONFIGS:
                if world > len(cores):
                    continue
                placement = local_placement(node, range(world))
                pins = [list(c) for c in placement.cores] if placement.cores else None
                plains, diones, startups = [], [], []
                for _ in range(args.repeats):  # alternate, so drift hits both alike
                    plains.append(plain(model, world, args.steps, placement.threads, pins,
                                        folder))
                    step, startup = dione(model, technique, world, args.steps, node, folder)
                    diones.append(step)
                    startups.append(startup)
                p, d = statistics.median(plains), statistics.median(diones)
                rows.append((model, f"{technique} x{world}", p * 1e3, d * 1e3, d / p,
                             statistics.median(startups)))
                print(f"{model} {technique} x{world}: plain {p * 1e3:.2f} ms, dione "
                      f"{d * 1e3:.2f} ms, ratio {d / p:.3f}", flush=True)
    print()
    print("| model | technique | plain loop ms/step | dione ms/step | dione / plain | "
          "slice start-up + save, s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for model, config, p, d, ratio, startup in rows:
        print(f"| {model} | {config} | {p:.2f} | {d:.2f} | {ratio:.3f} | {startup:.1f} |")


if __name__ == "__main__":
    main()
