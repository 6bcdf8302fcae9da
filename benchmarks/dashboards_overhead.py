"""TensorBoard and MLflow written as a run trains, against neither: the same run side by
side, in alternating order.

    python benchmarks/dashboards_overhead.py [--tasks 12] [--steps 2000] [--repeats 3]
    python benchmarks/dashboards_overhead.py --hidden 512 --batch 256 --steps 1000  # ~10-ms steps

Digits MLPs (an evaluation at the end of each) on this machine's 2 CPU slots, through
``dione.run``. The dashboards are written from the run store by the launcher's live
report thread (every 30 s after a change) and closed after the run (each done task's
model exported to MLflow): the workers never write them. Reported per mode: the run's
makespan (its first slice's start to its last slice's end) and the wall time of the
whole ``dione.run`` call (closing the dashboards included), and the ratios on / off.
The catalog is filled by one run before the timed ones.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import dione
from dione.profile import TrialOptions
from dione.spec import Task
from dione.zoo import digits_mlp, digits_train
from dione.zoo.digits import digits_accuracy


def tasks(count: int, steps: int, hidden: int = 64, batch: int = 32) -> list[Task]:
    return [Task(name=f"lr-{i}", model=functools.partial(digits_mlp, hidden=hidden, depth=2),
                 data=digits_train, loss=torch.nn.functional.cross_entropy,
                 optimizer=functools.partial(torch.optim.Adam, lr=1e-3 * (1 + i)),
                 batch_size=batch, steps=steps, seed=i, evaluate=digits_accuracy,
                 hyperparameters={"lr": 1e-3 * (1 + i)})
            for i in range(count)]


def one(work: list[Task], folder: Path, name: str, catalog: str,
        dashboards: bool) -> tuple[float, float]:
    boards = ({"tensorboard": str(folder / f"tb-{name}"),
               "mlflow": f"sqlite:///{folder / 'mlflow.db'}"} if dashboards else {})
    began = time.perf_counter()
    result = dione.run(work, devices="cpu:2", run_dir=str(folder / name), quiet=True,
                       catalog=catalog, time_limit=5.0,
                       trial=TrialOptions(warmup_steps=2, measure_steps=5), **boards)
    wall = time.perf_counter() - began
    assert all(t.status == "done" for t in result.tasks)
    return result.makespan, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64, help="the MLP's width")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    work = tasks(args.tasks, args.steps, args.hidden, args.batch)
    with tempfile.TemporaryDirectory(prefix="dione-bench-") as tmp:
        folder = Path(tmp)
        os.chdir(folder)  # MLflow puts a SQLite store's artifacts in ./mlruns
        catalog = str(folder / "catalog.sqlite")
        one(work, folder, "warm", catalog, False)  # profiles once; not timed
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for repeat in range(args.repeats):
            for on in ((False, True) if repeat % 2 == 0 else (True, False)):
                runs[on].append(one(work, folder, f"{'on' if on else 'off'}-{repeat}",
                                    catalog, on))
                makespan, wall = runs[on][-1]
                print(f"repeat {repeat} dashboards {'on ' if on else 'off'}: makespan "
                      f"{makespan:.1f} s, dione.run {wall:.1f} s", flush=True)
    med = {on: (statistics.median(m for m, _ in r), statistics.median(w for _, w in r))
           for on, r in runs.items()}
    print(f"{args.tasks} tasks x {args.steps} steps, {args.repeats} repeats (medians)")
    print("| dashboards | makespan s | dione.run s |")
    print("|---|---|---|")
    for on in (False, True):
        print(f"| {'TensorBoard + MLflow' if on else 'none'} | {med[on][0]:.1f} | "
              f"{med[on][1]:.1f} |")
    print(f"on / off: makespan {med[True][0] / med[False][0]:.3f}, "
          f"dione.run {med[True][1] / med[False][1]:.3f}")
    pairs = [on[0] / off[0] for on, off in zip(runs[True], runs[False], strict=True)]
    print("makespan on / off, repeat by repeat: " + ", ".join(f"{p:.3f}" for p in pairs))


if __name__ == "__main__":
    main()
