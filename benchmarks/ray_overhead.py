"""The demo workload on a Ray cluster against this machine's own workers, side by side.

    python benchmarks/ray_overhead.py [--rounds 3] [--out benchmarks/outputs/ray]

Overhead: the same demo workload with the local launcher on 2 CPU slots and with the
Ray launcher on one fake Ray node of 2 CPUs (``ray.cluster_utils.Cluster`` on this
machine), alternating which goes first each round, both starting cold (new workers or
actors); the run's makespan (after profiling, which the catalog serves from the first
round on) and each slice's fixed cost (wall time less its steps and evaluation).

Scale: the workload on one fake node of 1 CPU slot against two such nodes (this machine
has 2 cores, so two 1-slot nodes is all it can scale to honestly), makespan as a ratio,
with each run's Gantt chart copied to ``--out``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo.py"


def _fixed_costs(run_dir: Path) -> list[float]:
    from dione.state import RunStore

    costs = []
    with RunStore(run_dir) as store:
        for s in store.slices():
            if s.status == "done":
                steps = sum(store.slice_step_seconds(s.id))
                wall = s.timings.get("wall", 0.0)
                costs.append(wall - steps - s.timings.get("evaluate_seconds", 0.0))
    return costs


def run_once(label: str, tasks: list[Any], folder: Path, catalog: Path,
             launcher: Any = None, devices: str = "cpu:2") -> tuple[float, list[float], Path]:
    from dione.launch.pool import shutdown_local_pool
    from dione.orchestrate import RunOptions, run_workload
    from dione.spec.cluster import Cluster, local_cluster

    # Both launchers start cold in every run: a Ray cluster is new each time, and this
    # process's warm local workers would otherwise carry over from the previous run.
    shutdown_local_pool()
    cluster = local_cluster(devices) if launcher is None else Cluster(launcher.nodes())
    run_dir = folder / f"{label}-{len(list(folder.glob(label + '-*')))}"
    result = run_workload(tasks, cluster, run_dir, RunOptions(catalog=str(catalog)),
                          launcher=launcher)
    assert all(t.status == "done" for t in result.tasks), result.tasks
    return result.makespan, _fixed_costs(run_dir), run_dir


def with_ray_nodes(slots: list[int], body: Any) -> Any:
    import ray
    from ray.cluster_utils import Cluster as RayCluster

    from dione.launch.ray_launcher import RayLauncher

    cluster = RayCluster(initialize_head=True, head_node_args={"num_cpus": 0,
                                                               "include_dashboard": False})
    for cpus in slots:
        cluster.add_node(num_cpus=cpus)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    launcher = RayLauncher()
    try:
        return body(launcher)
    finally:
        launcher.shutdown()
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "outputs" / "ray")
    args = parser.parse_args()
    from dione.spec.workload import load_workload

    tasks = list(load_workload(DEMO))
    args.out.mkdir(parents=True, exist_ok=True)
    makespans: dict[str, list[float]] = {"local": [], "ray": [], "1 node": [], "2 nodes": []}
    fixed: dict[str, list[float]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        catalog = folder / "catalog.sqlite"
        for round_ in range(args.rounds):
            order = ["local", "ray"] if round_ % 2 == 0 else ["ray", "local"]
            for label in order:
                if label == "local":
                    span, costs, _ = run_once("local", tasks, folder, catalog)
                else:
                    span, costs, _ = with_ray_nodes(
                        [2], lambda launcher: run_once("ray", tasks, folder, catalog, launcher))
                makespans[label].append(span)
                fixed[label] += costs
                print(f"round {round_} {label}: makespan {span:.1f} s, fixed per slice "
                      f"{statistics.median(costs):.2f} s", flush=True)
            for label, slots in (("1 node", [1]), ("2 nodes", [1, 1])):
                span, _, run_dir = with_ray_nodes(
                    slots, lambda launcher, label=label: run_once(
                        label.replace(" ", ""), tasks, folder, catalog, launcher))
                makespans[label].append(span)
                shutil.copy(run_dir / "report" / "gantt.png",
                            args.out / f"gantt-{label.replace(' ', '')}-round{round_}.png")
                print(f"round {round_} {label}: makespan {span:.1f} s", flush=True)
    print("\n| round | local s | ray (1 node, 2 slots) s | ray / local | 1 node x1 s | "
          "2 nodes x1 s | 2 nodes / 1 node |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in range(args.rounds):
        local, ray_, one, two = (makespans[k][r] for k in ("local", "ray", "1 node", "2 nodes"))
        print(f"| {r} | {local:.1f} | {ray_:.1f} | {ray_ / local:.2f} | {one:.1f} | {two:.1f} "
              f"| {two / one:.2f} |")
    for label in ("local", "ray"):
        costs = fixed[label]
        q = statistics.quantiles(costs, n=4)
        print(f"fixed cost per slice, {label}: median {statistics.median(costs):.2f} s "
              f"(IQR {q[0]:.2f}-{q[2]:.2f}, {len(costs)} slices)")


if __name__ == "__main__":
    main()
