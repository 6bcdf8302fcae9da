"""Validation of a sweep over learning rates: seconds to validate N tasks of one model.

Validation builds each task's model for real, puts batches through it (the loss's
halves, the pipelines' stages, the buffers it writes, the parameters its loss reaches):
seconds a task for a model of some millions of parameters, before profiling starts.
Tasks alike (up to their optimizer's numbers) are now tried once. Run it under two
checkouts, alternating, to compare (the machine is shared):

    for k in 1 2 3; do for src in /tmp/before/src src; do
        PYTHONPATH=$src .venv/bin/python benchmarks/validation_sweep.py --tasks 8; done; done
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

import dione
from dione import Task
from dione.techniques.validation import valid_tasks
from dione.zoo.hf import gpt2_tiny, lm_data


def sweep(count: int, layers: int, width: int, vary: str = "lr") -> list[Task]:
    """``count`` fine-tunes of one GPT-2 (the model's own loss) over learning rates, or
    over training lengths (``vary="steps"``)."""
    model = functools.partial(gpt2_tiny, layers=layers, width=width)
    return [Task(name=f"{vary}{k}", model=model, data=lm_data, batch_size=16,
                 steps=100 * (k + 1) if vary == "steps" else 100,
                 optimizer=functools.partial(torch.optim.AdamW, lr=1e-4 * (
                     k + 1 if vary == "lr" else 1)))
            for k in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--vary", choices=("lr", "steps"), default="lr",
                        help="what the sweep's tasks differ in")
    args = parser.parse_args()
    valid_tasks(sweep(1, 1, 32))  # imports and first-call costs, outside the timing
    tasks = sweep(args.tasks, args.layers, args.width, args.vary)
    params = sum(p.numel() for p in tasks[0].model().parameters())
    start = time.perf_counter()
    valid, problems = valid_tasks(tasks)
    seconds = time.perf_counter() - start
    assert not problems and len(valid) == args.tasks, problems
    print(f"dione {dione.__file__.rsplit('/src/', 1)[0]}: {args.tasks} tasks ({args.vary}) of "
          f"{params / 1e6:.1f}M parameters validated in {seconds:.1f} s "
          f"({seconds / args.tasks:.2f} s a task)")


if __name__ == "__main__":
    main()
