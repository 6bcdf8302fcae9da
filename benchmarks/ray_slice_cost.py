"""A warm slice's fixed cost on the Ray launcher against this machine's workers, side by side.

    python benchmarks/ray_slice_cost.py [--slices 10] [--technique single]

One task (the test suite's small digits MLP), slices of 2 steps, one after another on
warm workers: the local launcher on 2 CPU slots, and the Ray launcher on one fake Ray
node of 2 CPUs (``ray.cluster_utils.Cluster`` on this machine), alternating slice by
slice. A slice's fixed cost is its wall time in ``run_slice`` less its steps: the gang's
start, the checkpoint load and save, the reply and the store's bookkeeping. The first
slice on each launcher (a cold checkpoint path, first imports) is left out.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
from pathlib import Path
from typing import Any


def _task() -> Any:
    import torch

    from dione import Task
    from dione.zoo import digits_mlp, digits_train

    return Task(name="t", model=functools.partial(digits_mlp, hidden=32, depth=2),
                data=digits_train, loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16,
                steps=10_000, seed=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slices", type=int, default=10)
    parser.add_argument("--technique", default="single", choices=["single", "ddp"])
    args = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster as RayCluster

    from dione.launch.local import LOCAL
    from dione.launch.ray_launcher import RayLauncher
    from dione.launch.slice import run_slice
    from dione.spec.cluster import Node

    devices = [0] if args.technique == "single" else [0, 1]
    cluster = RayCluster(initialize_head=True, head_node_args={"num_cpus": 0,
                                                               "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    on_ray = RayLauncher()
    launchers = {"local": (LOCAL, Node("here", 2, "cpu")), "ray": (on_ray, on_ray.nodes()[0])}
    costs: dict[str, list[float]] = {"local": [], "ray": []}
    task = _task()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for launcher, node in launchers.values():
                launcher.warm_up(node)
            for index in range(args.slices + 1):
                order = ["local", "ray"] if index % 2 == 0 else ["ray", "local"]
                for label in order:
                    launcher, node = launchers[label]
                    result = run_slice(task, args.technique, Path(tmp) / label,
                                       launcher.placement(node, devices), steps=2,
                                       launcher=launcher)
                    if index > 0:
                        costs[label].append(result.seconds - sum(result.step_seconds))
    finally:
        on_ray.shutdown()
        ray.shutdown()
        cluster.shutdown()
    local, remote = (statistics.median(costs[k]) for k in ("local", "ray"))
    for label, values in costs.items():
        q = statistics.quantiles(values, n=4)
        print(f"{args.technique}: fixed cost per warm slice, {label}: median "
              f"{statistics.median(values):.3f} s (IQR {q[0]:.3f}-{q[2]:.3f}, "
              f"{len(values)} slices)")
    print(f"{args.technique}: ray / local = {remote / local:.2f}")


if __name__ == "__main__":
    main()
