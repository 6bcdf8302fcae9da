"""Re-planning at scale: many short tasks, with re-planning on against off, side by side.

    python benchmarks/replan_scale.py [--tasks 200] [--steps 5] [--repeats 2]
    python benchmarks/replan_scale.py --tasks 2000 --steps 5 --repeats 1 --only-replan

Tiny tasks (the digits MLP, batch 16, ``single`` only) on this machine's 2 CPU slots:
every slice end asks for a re-plan of hundreds of pending tasks. Before re-planning ran
beside execution, each re-plan held the loop for its solve (200 five-step tasks: 146.7 s
with re-planning against 6.5 s without). Reported per run: the makespan, the slices
launched, the re-plans solved and their solver time (beside execution), the first
plan's makespan, and the
launcher's time per slice (a slice's wall time less its steps': store, gang, checkpoint).
The profile (one speed group: a handful of trials) is measured once, before the runs.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
from pathlib import Path

import torch

from dione.orchestrate import RunOptions, run_workload
from dione.profile import TrialOptions
from dione.spec import Task, local_cluster
from dione.state.store import RunStore
from dione.zoo import digits_mlp, digits_train


def tasks(count: int, steps: int) -> list[Task]:
    return [Task(name=f"t{i:04d}", model=functools.partial(digits_mlp, hidden=8, depth=1),
                 data=digits_train, loss=torch.nn.functional.cross_entropy,
                 optimizer=functools.partial(torch.optim.Adam, lr=1e-3 * (1 + i % 7)),
                 batch_size=16, steps=steps, seed=i, techniques=("single",))
            for i in range(count)]


def one(work: list[Task], folder: Path, catalog: str, replan: bool) -> dict[str, float]:
    run_dir = folder / ("replan" if replan else "fixed")
    result = run_workload(work, local_cluster("cpu:2"), run_dir, RunOptions(
        catalog=catalog, replan=replan, time_limit=10.0,
        trial=TrialOptions(warmup_steps=1, measure_steps=3)))
    assert all(t.status == "done" for t in result.tasks), [t for t in result.tasks
                                                          if t.status != "done"][:3]
    with RunStore(run_dir) as store:
        overheads = [(s.ended_at or s.started_at) - s.started_at
                     - sum(store.slice_step_seconds(s.id)) for s in store.slices()
                     if s.status == "done"]
    return {"makespan": result.makespan, "planned": result.planned_makespan,
            "slices": result.slices,
            "replans": result.replans, "replan_seconds": result.replan_seconds,
            "slice_overhead": statistics.median(overheads)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only-replan", action="store_true")
    args = parser.parse_args()
    work = tasks(args.tasks, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        catalog = str(folder / "catalog.sqlite")
        rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for repeat in range(args.repeats):
            for replan in ((True,) if args.only_replan else (repeat % 2 == 0, repeat % 2 != 0)):
                found = one(work, folder / f"r{repeat}", catalog, replan)
                rows[replan].append(found)
                print(f"replan={replan}: makespan {found['makespan']:.1f} s (the first plan "
                      f"said {found['planned']:.1f} s), slices "
                      f"{found['slices']:.0f}, re-plans {found['replans']:.0f} taking "
                      f"{found['replan_seconds']:.1f} s beside execution, launcher per "
                      f"slice {found['slice_overhead'] * 1000:.0f} ms", flush=True)
    if rows[True] and rows[False]:
        ratio = [a["makespan"] / b["makespan"] for a, b in zip(rows[True], rows[False],
                                                               strict=True)]
        print(f"\n{args.tasks} tasks of {args.steps} steps: re-planning on / off = "
              + ", ".join(f"{r:.2f}" for r in ratio))


if __name__ == "__main__":
    main()
