"""What a new rank of a Hugging Face task costs with the spawner importing transformers
before it forks (``spawner.PRELOADED_PACKAGES``) against each rank importing it itself.

    python benchmarks/preload.py [--rounds 3] [--slices 4]

A child process per variant and round (alternating which goes first), as one launcher:
it validates a tiny GPT-2 task (which imports transformers here, as `dione run` does),
then runs ``--slices`` 2-rank ddp slices of 2 steps, each on new workers (the idle ones
ended between slices, as a failed gang's or a new run's are), and reports each slice's
wall time and the CPU time of the whole child with its workers. The figures to compare
are the ratios within a round: this machine is shared.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(preload: bool, slices: int) -> dict[str, object]:
    """One launcher's run of ``slices`` cold 2-rank slices (see the module's docstring)."""
    import functools

    import torch

    from dione import Task
    from dione.launch.pool import local_pool, shutdown_local_pool
    from dione.launch.slice import local_placement, run_slice
    from dione.spec import Node
    from dione.techniques.validation import valid_tasks
    from dione.zoo.hf import gpt2_tiny, lm_data

    task = Task(name="gpt2", model=gpt2_tiny, data=lm_data, batch_size=8, steps=2,
                optimizer=functools.partial(torch.optim.AdamW, lr=1e-3))
    valid, problems = valid_tasks([task])
    assert valid and not problems, problems
    local_pool()._preload = preload
    walls = []
    with tempfile.TemporaryDirectory() as folder:
        for index in range(slices):
            began = time.perf_counter()
            run_slice(task, "ddp", Path(folder) / str(index),
                      local_placement(Node("here", 2, "cpu"), [0, 1]), steps=2)
            walls.append(time.perf_counter() - began)
            shutdown_local_pool(keep_spawner=True)  # the next slice forks new ranks
    shutdown_local_pool()
    own, theirs = (resource.getrusage(resource.RUSAGE_SELF),
                   resource.getrusage(resource.RUSAGE_CHILDREN))
    cpu = own.ru_utime + own.ru_stime + theirs.ru_utime + theirs.ru_stime
    return {"walls": walls, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "on", args.slices)))
        return
    print(f"{args.slices} cold 2-rank ddp slices of a tiny GPT-2 per child; slice wall "
          "time is the median of the slices after the first (the first also starts the "
          "spawner)")
    print("| round | variant | first slice s | median later slice s | child CPU s |")
    print("| ---: | --- | ---: | ---: | ---: |")
    ratios: dict[str, list[float]] = {"slice": [], "cpu": []}
    for round_ in range(args.rounds):
        figures = {}
        order = ["on", "off"] if round_ % 2 == 0 else ["off", "on"]
        for variant in order:
            out = subprocess.run([sys.executable, __file__, "--child", variant, "--slices",
                                  str(args.slices)], check=True, capture_output=True,
                                 text=True).stdout
            figures[variant] = json.loads(out.strip().splitlines()[-1])
            walls = figures[variant]["walls"]
            print(f"| {round_ + 1} | preload {variant} | {walls[0]:.2f} | "
                  f"{statistics.median(walls[1:]):.2f} | {figures[variant]['cpu']:.1f} |",
                  flush=True)
        ratios["slice"].append(statistics.median(figures["on"]["walls"][1:])
                               / statistics.median(figures["off"]["walls"][1:]))
        ratios["cpu"].append(figures["on"]["cpu"] / figures["off"]["cpu"])
    for what, values in ratios.items():
        print(f"preload on / off, {what}: median {statistics.median(values):.3f} "
              f"(range {min(values):.3f}-{max(values):.3f})")


if __name__ == "__main__":
    main()
