"""What replacing a failed gang's workers costs: forked by the spawner against started
as new interpreters (the code before the spawner), side by side.

    python benchmarks/worker_restart.py --before PATH/TO/OLD/src [--rounds 2] [--pairs 5]

Each round runs both variants, alternating which goes first, each in a child process
whose ``PYTHONPATH`` selects the code (``--before``: the ``src`` of a checkout of the
commit before the spawner; the other is this checkout). A child, as one launcher:

- ``pairs`` times, a 2-rank ddp slice whose rank 1 raises at its first step (the gang
  fails, its workers are ended), then a good 2-rank ddp slice of 2 steps, which must
  start new workers: the good slice's fixed cost (wall time less its steps) and the
  pair's wall time;
- a profile of a task too big for a 512 MiB memory cap (every trial runs out of memory,
  each ends its gang's workers): its wall time, and how many trials ran.

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
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

WORKLOAD = '''
import functools, os
import torch
import torch.distributed as dist
from torch import nn
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train


def faulty_loss(output, target):
    if dist.get_rank() == 1:
        raise ValueError("injected failure on rank 1")
    return torch.nn.functional.cross_entropy(output, target)


def big_model():  # some 400 MB with Adam's moments: over a 512 MiB cap
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 2048),
                         *(nn.Linear(2048, 2048) for _ in range(6)), nn.Linear(2048, 10))


def task(name, loss, model=functools.partial(digits_mlp, hidden=16, depth=1),
         techniques=None):
    return Task(name=name, model=model, data=digits_train, loss=loss,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16,
                steps=100, techniques=techniques)


workload = Workload([task("good", torch.nn.functional.cross_entropy),
                     task("faulty", faulty_loss),
                     task("big", torch.nn.functional.cross_entropy, big_model,
                          ("single", "ddp", "fsdp"))])
'''


def child(out: Path, workload: Path, pairs: int) -> None:
    """Fail and recover ``pairs`` times, then profile the big task; write the timings."""
    from dione.launch.slice import SliceError, local_placement, run_slice
    from dione.profile import TrialOptions, profile_workload
    from dione.profile.catalog import Catalog
    from dione.spec.cluster import Cluster, Node
    from dione.spec.workload import load_workload

    node = Node("bench", 2, "cpu")
    tasks = {task.name: task for task in load_workload(workload)}
    placement = local_placement(node, [0, 1])
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for pair in range(pairs):
            began = time.perf_counter()
            try:
                run_slice(tasks["faulty"], "ddp", Path(scratch) / f"faulty{pair}", placement,
                          steps=2, evaluate=False)
                raise AssertionError("the faulty slice did not fail")
            except SliceError:
                pass
            good = run_slice(tasks["good"], "ddp", Path(scratch) / f"good{pair}", placement,
                             steps=2, evaluate=False)
            rows.append({"fixed": good.seconds - sum(good.step_seconds),
                         "pair": time.perf_counter() - began})
        options = replace(TrialOptions(warmup_steps=1, measure_steps=2, timeout=300),
                          memory_cap_bytes=2**29)
        began = time.perf_counter()
        with Catalog(Path(scratch) / "catalog.sqlite") as catalog:
            profile = profile_workload([tasks["big"]], Cluster([node]), catalog,
                                       options=options)
        seconds = time.perf_counter() - began
        trials = profile.task("big").trials
    out.write_text(json.dumps({"pairs": rows, "profile": seconds, "trials": len(trials),
                               "oom": sum(t.status == "oom" for t in trials)}))


def run_child(src: Path, folder: Path, label: str, pairs: int) -> dict[str, Any]:
    out = folder / f"{label}-{time.monotonic_ns()}.json"
    workload = folder / "workload.py"
    workload.write_text(WORKLOAD)
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, __file__, "--child", str(out), "--workload",
                    str(workload), "--pairs", str(pairs)], check=True, env=env, timeout=1800)
    return dict(json.loads(out.read_text()))


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.2f} ({q[0]:.2f}-{q[2]:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="src folder of the code to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--workload", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.workload, args.pairs)
        return
    if args.before is None:
        parser.error("--before PATH/TO/OLD/src is required")
    variants = {"before": args.before.resolve(), "spawner": ROOT / "src"}
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for label in order:
                result = run_child(variants[label], Path(tmp), label, args.pairs)
                results[label].append(result)
                print(f"round {round_} {label}: good slice after a failed gang, fixed "
                      + ", ".join(f"{p['fixed']:.2f}" for p in result["pairs"])
                      + f" s; profile {result['profile']:.1f} s ({result['trials']} trials, "
                      f"{result['oom']} out of memory)", flush=True)
    print("\n| variant | good slice after a failed gang: fixed cost, s | failed + good "
          "slice, s | profile of the OOM task, s |")
    print("| --- | --- | --- | --- |")
    for label in variants:
        fixed = [p["fixed"] for r in results[label] for p in r["pairs"]]
        pair = [p["pair"] for r in results[label] for p in r["pairs"]]
        profile = [r["profile"] for r in results[label]]
        print(f"| {label} | {spread(fixed)} | {spread(pair)} | "
              + ", ".join(f"{p:.1f}" for p in profile) + " |")
    for round_ in range(args.rounds):
        before, spawner = results["before"][round_], results["spawner"][round_]
        pair_ratio = (sum(p["pair"] for p in before["pairs"])
                      / sum(p["pair"] for p in spawner["pairs"]))
        print(f"round {round_}: before / spawner, failed + good pairs {pair_ratio:.2f}, "
              f"profile {before['profile'] / spawner['profile']:.2f}")


if __name__ == "__main__":
    main()
