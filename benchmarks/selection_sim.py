"""Model selection on a virtual cluster: the full grid against ASHA whose freed devices
go to the next task queued on them (the first plan kept: what a tuner with fixed
resources does), ASHA whose freed devices are spread evenly over the survivors at
data-parallel widths (HyperSched; Ray Tune's ``ResourceChangingScheduler``: the
``spread`` solver, applied at every re-plan) and ASHA with dione re-planning the
survivors at once, each task planned
at its full remaining length (``stopping_horizon="full"``) or at the length its rule
leaves expected (``"expected"``: each stretch after a rung at 1/eta per rung before it);
and synchronous successive halving (``SuccessiveHalving``, same rungs: a task waits at a
rung, holding no device, until every task has reached it) kept or re-planned.

    python benchmarks/selection_sim.py [--instance mixed-1.json] [--nodes 2] [--curves FILE]

The tasks are a planner family's (``benchmarks/planner/instances``: synthetic option
seconds, not published figures), each 90 steps, all sharing ``Asha(min_steps=10,
eta=3)`` (or ``SuccessiveHalving`` with the same rungs) on the training loss (rungs at
10 and 30 steps); slices of half an hour; re-planning held to 0.1% of the run's time (a
stop re-plans at once, past it); losses follow the simulator's ``exponential`` curve
(per task from the seed: a sweep's configurations differ in where they start and end,
and early and final losses barely agree in rank), or with ``--curves`` a real sweep's
(``selection.py --save-curves``: 16 character GPTs, their curves shared in turn among
the 24 tasks and stretched to 90 steps).
Per row: each way's makespan as a ratio to the full grid's, and the configuration each
picks (the lowest final loss among tasks trained to the end) against the full grid's;
then each way's makespan against a lower bound for the steps it trained
(``lower_bound``), and that bound as a ratio to ASHA kept's makespan: where it is above
0.5, no plan of those steps is at most half of ASHA kept.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dione.orchestrate.options import RunOptions
from dione.plan import PlanningProblem, load_problem
from dione.simulate import Scenario, parse_cluster, simulate
from dione.spec.cluster import Cluster
from dione.spec.stopping import Asha, PausingAsha, SuccessiveHalving
from dione.state.store import RunStore

INSTANCES = Path(__file__).parent / "planner" / "instances"
STEPS = 90


def lower_bound(problem: PlanningProblem, run_dir: Path, cluster: Cluster) -> float:
    """No plan can end the steps this run trained sooner: the longest task's trained
    steps at its fastest option on one node, or all of them at each one's fewest
    device-seconds over every device, packed without a gap (a task stopped at a rung
    has trained to the rung; who passes a rung depends on the order of arrival, so the
    bound is this run's, not every run's)."""
    with RunStore(run_dir) as store:
        trained = {t.name: max([s.end_step for s in store.slices(t.name)
                                if s.status == "done"] or [0]) for t in store.tasks()}
    widest = max(n.devices for n in cluster)
    devices = sum(n.devices for n in cluster)
    longest, area = 0.0, 0.0
    for t in problem.tasks:
        share = trained.get(t.name, 0) / STEPS
        options = [o for o in t.options if o.devices <= widest]
        longest = max(longest, share * min(o.seconds for o in options))
        area += share * min(o.seconds * o.devices for o in options)
    return max(longest, area / devices)


def picked(run_dir: Path) -> tuple[str, float]:
    """The task with the lowest final loss among those trained to the end."""
    with RunStore(run_dir) as store:
        finals = {t.name: store.metrics(t.name)[-1][1] for t in store.tasks()
                  if t.status == "done"}
    best = min(finals, key=lambda name: finals[name])
    return best, finals[best]


# way: (stopping rule, re-plan, horizon, solver); "spread" is HyperSched's rule.
WAYS = {
    "grid": (None, True, "full", "cpsat"),
    "kept": ("asha", False, "full", "cpsat"),
    "spread": ("asha", True, "full", "spread"),
    "replanned": ("asha", True, "full", "cpsat"),
    "expected": ("asha", True, "expected", "cpsat"),
    "rung": ("asha", True, "rung", "cpsat"),
    "paused-kept": ("paused", False, "full", "cpsat"),
    "paused": ("paused", True, "full", "cpsat"),
    "paused-spread": ("paused", True, "full", "spread"),
    "paused-rung": ("paused", True, "rung", "cpsat"),
    "paused-rung-greedy": ("paused", True, "rung", "greedy"),
    "paused-expected": ("paused", True, "expected", "cpsat"),
    "sh-kept": ("sh", False, "full", "cpsat"),
    "sh-replanned": ("sh", True, "full", "cpsat"),
}
TITLES = {"kept": "ASHA, first plan kept", "spread": "ASHA, freed devices spread evenly",
          "replanned": "ASHA re-planned", "expected": "ASHA re-planned, expected horizon",
          "rung": "ASHA re-planned, to the next rung",
          "paused-kept": "pausing ASHA, first plan kept",
          "paused": "pausing ASHA re-planned",
          "paused-spread": "pausing ASHA, freed devices spread evenly",
          "paused-rung": "pausing ASHA re-planned, to the next rung",
          "paused-rung-greedy": "pausing ASHA re-planned to the next rung by greedy",
          "paused-expected": "pausing ASHA re-planned, expected horizon",
          "sh-kept": "SH, first plan kept", "sh-replanned": "SH re-planned"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instance", default="mixed-1.json")
    parser.add_argument("--nodes", default="2")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--curves", metavar="FILE",
                        help="a real sweep's curves (selection.py --save-curves) instead "
                             "of the exponential family")
    parser.add_argument("--replan-share", type=float, default=0.001,
                        help="the share of the run's time re-plans may take")
    parser.add_argument("--replan-time-limit", type=float, default=0.05,
                        help="each re-plan's solve, in CP-SAT's deterministic units")
    parser.add_argument("--slice-seconds", type=float, default=1800.0,
                        help="a slice's length at most (it also ends at each rung)")
    parser.add_argument("--ways", default="grid,kept,spread,replanned,expected",
                        help="the grid first, then any of " + ", ".join(TITLES))
    args = parser.parse_args()
    ways = args.ways.split(",")
    problem = load_problem(INSTANCES / args.instance)
    rules = {"asha": Asha(min_steps=10, eta=3),
             "sh": SuccessiveHalving(min_steps=10, eta=3),
             "paused": PausingAsha(min_steps=10, eta=3)}
    scenario = Scenario(seed=args.seed, spread=0.1, curves=args.curves)
    # Slices of half an hour (and at every rung); re-plans held to 0.1% of the run's
    # time, each counted at 5 s per unit of deterministic time; a stop re-plans past it.
    options = RunOptions(time_limit=1.0, replan_time_limit=args.replan_time_limit,
                         replan_interval=3600.0, replan_share=args.replan_share,
                         slice_seconds=args.slice_seconds)
    print(f"{len(problem.tasks)} tasks of {args.instance} ({STEPS} steps each), "
          f"Asha(min_steps=10, eta=3) on the training loss; losses: "
          f"{args.curves or 'exponential'}\n")
    others = [w for w in ways if w != "grid"]
    print("| nodes | full grid s | " + " | ".join(f"{TITLES[w]} / grid" for w in others)
          + " | " + " | ".join(f"{w}'s pick" for w in ways) + " |")
    print("| ---: | ---: | " + " | ".join("---:" for _ in others) + " | "
          + " | ".join("---" for _ in ways) + " |")
    bounds: dict[tuple[int, str], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for nodes in [int(n) for n in args.nodes.split(",")]:
            cluster = parse_cluster(f"{nodes}x8")
            found = {}
            for way in ways:
                rule, replan, horizon, solver = WAYS[way]
                run_dir = Path(tmp) / f"{way}-{nodes}"
                result = simulate(problem, run_dir, cluster=cluster, scenario=scenario,
                                  steps=STEPS, report=False,
                                  stopping=rules[rule] if rule else None,
                                  options=RunOptions(**{**options.__dict__,
                                                        "replan": replan, "solver": solver,
                                                        "stopping_horizon": horizon}))
                found[way] = (result.makespan, picked(run_dir))
                bounds[nodes, way] = (result.makespan, lower_bound(problem, run_dir, cluster))
            if "grid" not in found:  # (it raised KeyError: a way alone is a run of its own)
                print(f"| {nodes} | - | " + " | ".join(f"{found[w][0]:.0f} s" for w in others)
                      + " | " + " | ".join(f"{found[w][1][0]} ({found[w][1][1]:.4f})"
                                           for w in ways) + " |", flush=True)
                continue
            grid = found["grid"][0]
            print(f"| {nodes} | {grid:.0f} | "
                  + " | ".join(f"{found[w][0] / grid:.3f}" for w in others) + " | "
                  + " | ".join(f"{found[w][1][0]} ({found[w][1][1]:.4f})" for w in ways)
                  + " |", flush=True)
    # How near each way came to what no plan could beat for the steps it trained, and
    # (beside ASHA kept) the least ratio to kept any plan of those steps could reach.
    print("\n| nodes | way | makespan s | lower bound s | makespan / bound | bound / kept |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for (nodes, way), (makespan, bound) in bounds.items():
        kept = bounds.get((nodes, "kept"))
        print(f"| {nodes} | {way} | {makespan:.0f} | {bound:.0f} | {makespan / bound:.2f} | "
              + (f"{bound / kept[0]:.3f}" if kept else "-") + " |")


if __name__ == "__main__":
    main()
