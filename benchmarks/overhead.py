"""Per-step time of `dione train` slices against a hand-written PyTorch loop, as ratios.

    python benchmarks/overhead.py [--steps 300] [--repeats 3] [--models chargpt digits]

For each model and (technique, devices) the two run as ``--repeats`` back-to-back pairs
on the same cores with the same thread counts; each run's steady-state step time is
the median of its steps after a warm-up. This machine is shared and its speed drifts by
10% and more between runs, so the figure is the median of the pairs' ratios (each pair
close in time) with their range. Slice start-up (process start, data, checkpoint save)
is reported apart: it is paid once per slice, not per step.

A second table runs dione's training loop (the `single` technique, called directly) and
the plain loop alternately in this one process on one core: what dione's loop itself
adds per step, apart from where the operating system puts each process.
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
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from models import MODELS

from dione.launch import local_placement, run_slice
from dione.spec import Node, Task
from dione.spec.devices import available_cores

WARMUP = 20


def steady(step_seconds: list[float]) -> float:
    return statistics.median(step_seconds[WARMUP:])


def plain(model: str, world: int, steps: int, threads: int, cores: list[list[int]] | None,
          folder: Path) -> float:
    out = folder / f"plain-{model}-{world}.json"
    command = [sys.executable, str(Path(__file__).with_name("plain_loop.py")), model,
               str(world), str(steps), str(out), str(threads)]
    if cores:
        command.append(json.dumps(cores))
    # The same thread settings dione's workers get (torchrun sets OMP_NUM_THREADS too).
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    subprocess.run(command, check=True, env=env, timeout=900)
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


def in_process_table(models: list[str], steps: int, repeats: int) -> str:
    """dione's training loop and the plain loop, alternating in one process on one core:
    what dione's loop itself adds per step, free of process start and placement."""
    import torch

    from dione.techniques import SliceContext, SliceSpec, get_technique

    os.sched_setaffinity(0, {available_cores()[0]})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    lines = ["| model | plain loop ms/step | dione loop ms/step | dione / plain, median of "
             "pairs (range) |", "| --- | ---: | ---: | ---: |"]
    for model in models:
        setup = MODELS[model]
        task = Task(name=model, model=setup.model, data=setup.data, loss=setup.loss,
                    optimizer=setup.optimizer, batch_size=setup.batch_size, steps=steps)
        single = get_technique("single")
        plains, diones = [], []
        for _ in range(repeats):
            spec = SliceSpec(task=task, technique=single, knobs={}, device_kind="cpu",
                             device_ids=(0,), start_step=0, end_step=steps, resume_from=None,
                             run_dir="unused", save=False)
            diones.append(steady(single.train(SliceContext(spec, 0, 1)).step_seconds))
            plains.append(steady(plain_steps(setup, steps)))
        ratios = [d / p for d, p in zip(diones, plains, strict=True)]
        lines.append(f"| {model} | {spread(plains)} | {spread(diones)} | "
                     f"{ratio_spread(ratios)} |")
    torch.set_num_threads(threads)
    os.sched_setaffinity(0, set(available_cores()))
    return "\n".join(lines)


def plain_steps(setup: Any, steps: int) -> list[float]:
    """The plain loop's step times, in this process (plain_loop.py's own loop)."""
    import torch
    from plain_loop import run_steps

    torch.manual_seed(0)
    model = setup.model()
    return run_steps(setup, model, setup.optimizer(model.parameters()), steps)[0]


def spread(seconds: list[float]) -> str:
    """Median of the runs, and their range, in milliseconds."""
    values = [s * 1e3 for s in seconds]
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def ratio_spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--models", nargs="+", default=["chargpt-wide", "chargpt", "digits"])
    parser.add_argument("--configs", nargs="+", default=["single:1", "ddp:2"])
    args = parser.parse_args()
    cores = available_cores()
    node = Node("bench", len(cores), "cpu", len(cores))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for model in args.models:
            for technique, world in ((c.split(":")[0], int(c.split(":")[1]))
                                     for c in args.configs):
                if world > len(cores):
                    continue
                placement = local_placement(node, range(world))
                pins = [list(c) for c in placement.cores] if placement.cores else None
                plains, diones, startups = [], [], []
                for repeat in range(args.repeats):
                    # Pairs alternate which goes first, so drift and order hit both alike.
                    for first in ((True, False) if repeat % 2 else (False, True)):
                        if first:
                            step, startup = dione(model, technique, world, args.steps, node,
                                                  folder)
                            diones.append(step)
                            startups.append(startup)
                        else:
                            plains.append(plain(model, world, args.steps, placement.threads,
                                                pins, folder))
                ratios = [d / p for d, p in zip(diones, plains, strict=True)]
                rows.append((model, f"{technique} x{world}", plains, diones, ratios,
                             statistics.median(startups)))
                print(f"{model} {technique} x{world}: plain {spread(plains)}, dione "
                      f"{spread(diones)}, ratio {ratio_spread(ratios)}", flush=True)
    print()
    print(in_process_table(args.models, args.steps, args.repeats))
    print()
    print("| model | technique | plain loop ms/step | dione ms/step | dione / plain, "
          "median of pairs (range) | slice start-up + save, s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for model, config, plains, diones, ratios, startup in rows:
        print(f"| {model} | {config} | {spread(plains)} | {spread(diones)} | "
              f"{ratio_spread(ratios)} | {startup:.1f} |")


if __name__ == "__main__":
    main()
