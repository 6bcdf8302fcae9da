"""A run on a virtual cluster: the real orchestrator (planner, re-planning, slicing,
retries, node loss, store and report) driven by a virtual clock and simulated slices."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dione import clock
from dione.orchestrate.estimates import auto_slice_seconds, planning_nodes
from dione.orchestrate.options import (
    RUN_DIR_ENTRIES,
    SIMULATION_OPTIONS,
    RunDirError,
    RunEvent,
    RunOptions,
    claim_run_dir,
)
from dione.orchestrate.runner import Runner
from dione.plan.problem import PlanningProblem
from dione.profile.results import Profile
from dione.simulate.launching import SimulatedLaunching, VirtualCluster
from dione.simulate.scenario import Scenario
from dione.simulate.virtual_clock import VirtualClock
from dione.simulate.workload import problem_cluster, problem_workload
from dione.spec.cluster import Cluster
from dione.spec.stopping import StoppingRule
from dione.spec.task import Task
from dione.state.private import write_private
from dione.state.store import SIMULATED_FILE, RunStore
from dione.state.summaries import short_error

__all__ = ["SimulationResult", "current_practice", "simulate", "simulate_profile",
           "without_avoid_lists"]


@dataclass
class SimulationResult:
    """A simulated run: its makespan (virtual seconds), the first plan's, current
    practice's on the same cluster and scenario, and what the simulation cost."""

    run_dir: Path
    makespan: float
    planned_makespan: float
    current_practice: float  # 0 where not computed (a workload's profile)
    statuses: dict[str, str]  # task -> done | failed | ...
    slices: int
    plans_adopted: int
    replans: int
    replan_seconds: float  # wall seconds the re-plans' solves took
    wall_seconds: float  # the whole simulation's
    planned_horizon: str = "full"  # how far the first plan counted (AdoptedPlan.horizon)
    errors: dict[str, str] = field(default_factory=dict)  # a failed task's, in one line


def current_practice(problem: PlanningProblem, cluster: Cluster, scenario: Scenario,
                     steps: int = 100, options: RunOptions | None = None) -> float:
    """Saturn's baseline: each task in turn (in the problem's order) on a whole node, at
    its fastest option there, the node where it ends first (of those where it ends as
    early, the smallest, then the first in the cluster's order: the ``sequential``
    solver's rule), slowed as the scenario slows it (its spread and failures left out); a node
    serves from its join to its loss, and a task its node's loss cuts short goes on
    from its last checkpoint on the next free node that holds it. It checkpoints as a
    simulated run of ``steps`` steps a task under ``options`` does, where each slice
    ends (``slice_steps``, or about ``slice_seconds`` of profiled time): what it did
    since is lost with the node, as the run's slice is (it kept every second of it, so
    the ``sequential`` solver's own run ended after it: review). When the last task
    ends; a task no node holds is left out (the plan fails it too)."""
    options = options or RunOptions()
    # (The simulated options start no process and load nothing: the run's default slice.)
    every_seconds = options.slice_seconds or auto_slice_seconds(0.0)
    sizes = {n.name: n.devices for n in cluster}
    nodes = dict(zip(sizes, planning_nodes(cluster), strict=True))
    free = {n.name: float(scenario.node_joins.get(n.name, 0.0)) for n in cluster}
    lost = {n.name: float(scenario.node_losses.get(n.name, math.inf)) for n in cluster}
    end = 0.0
    for task in problem.tasks:
        left, ready = 1.0, 0.0  # the share of its work not done, and from when
        while left > 1e-12:
            holding = [n for n in free if max(free[n], ready) < lost[n]
                       and task.fitting(nodes[n])]
            if not holding:
                break  # no node (left) holds it
            lengths = {n: min(o.seconds for o in task.fitting(nodes[n]))
                       * scenario.task_slowdown.get(task.name, 1.0)
                       * scenario.node_slowdown.get(n, 1.0) for n in holding}
            # (min keeps the first of equal keys: the cluster's order, not the names')
            node = min(holding, key=lambda n: (max(free[n], ready) + left * lengths[n],
                                               sizes[n]))
            seconds = lengths[node]
            start = max(free[node], ready)
            finish = start + left * seconds
            if finish <= lost[node]:
                free[node], left, end = finish, 0.0, max(end, finish)
            else:  # the node is lost under it: to its last checkpoint, the rest moves on
                step = min(o.seconds for o in task.fitting(nodes[node])) / steps
                between = options.slice_steps or max(1, math.ceil(every_seconds / step))
                done = math.floor((lost[node] - start) / seconds * steps + 1e-9)
                left -= (done - done % between) / steps
                free[node] = ready = lost[node]
    return end


def simulate(
    problem: PlanningProblem,
    run_dir: str | Path,
    *,
    cluster: Cluster | None = None,
    scenario: Scenario | None = None,
    steps: int = 100,
    options: RunOptions | None = None,
    on_event: Callable[[RunEvent], None] | None = None,
    stopping: StoppingRule | None = None,
    left_out: Mapping[str, str] | None = None,
    report: bool = True,
) -> SimulationResult:
    """Run ``problem``'s tasks (``steps`` steps each, sharing ``stopping`` if given) on
    ``cluster`` (default: the problem's nodes) as ``scenario`` says, on a virtual clock;
    the run directory holds the store, plans and (``report``) report of a real run,
    marked simulated. ``left_out``: tasks of the problem no node holds, with why (from
    ``PlanningProblem.left_out``): the report lists them, as a run lists invalid tasks.
    The tasks' ``avoid`` lists are not played (a simulated task avoids the nodes it
    fails on itself)."""
    if not isinstance(problem, PlanningProblem):
        raise TypeError(f"simulate takes a PlanningProblem (dione.plan.load_problem(path)), "
                        f"not {type(problem).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"steps must be a whole number >= 1, not {steps!r}")
    if steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, not {steps!r}")
    if options is not None and not isinstance(options, RunOptions):
        raise TypeError(f"options must be a RunOptions (dione.orchestrate.RunOptions(...)), "
                        f"not {type(options).__name__}")
    if isinstance(cluster, str) or not isinstance(cluster, (Cluster, type(None))):
        raise TypeError("simulate takes cluster=parse_cluster('4x8') (a Cluster), not "
                        f"{type(cluster).__name__}")
    if not isinstance(scenario, (Scenario, type(None))):
        raise TypeError("simulate takes scenario=Scenario(...) or load_scenario(path), not "
                        f"{type(scenario).__name__}")
    scenario = scenario or Scenario()
    problem = without_avoid_lists(problem)
    # The problem's own words for its nodes (A100), where they are the cluster.
    cluster = cluster or problem_cluster(problem)
    tasks, profile = problem_workload(problem, steps, cluster, stopping)
    result = simulate_profile(tasks, profile, run_dir, cluster=cluster, scenario=scenario,
                              options=options, on_event=on_event,
                              baseline=current_practice(problem, cluster, scenario, steps,
                                                        options),
                              left_out=left_out)
    if report:
        from dione.report import write_report

        write_report(run_dir)
    return result


def without_avoid_lists(problem: PlanningProblem) -> PlanningProblem:
    """``problem`` with no task avoiding a node: avoid lists name where a run's tasks
    failed, and a simulated task avoids the nodes it fails on itself (a list kept bound
    current practice and the left out, not the run: review)."""
    return replace(problem, tasks=tuple(replace(t, avoid=frozenset()) for t in problem.tasks))


def simulate_profile(
    tasks: Sequence[Task],
    profile: Profile,
    run_dir: str | Path,
    *,
    cluster: Cluster,
    scenario: Scenario | None = None,
    options: RunOptions | None = None,
    on_event: Callable[[RunEvent], None] | None = None,
    baseline: float = 0.0,
    left_out: Mapping[str, str] | None = None,
) -> SimulationResult:
    """Run ``tasks`` as ``profile`` predicts them (a real workload's, from the catalog, or
    a problem's) on ``cluster``, as ``scenario`` says, on a virtual clock. ``baseline``:
    current practice's makespan on the same (0: not computed), kept with the run for
    its report."""
    scenario = scenario or Scenario()
    # A task of the problem no node holds is left out and said so: a scenario naming it
    # names no task the problem lacks.
    scenario.check([n.name for n in cluster], [t.name for t in tasks], list(left_out or ()))
    # A slice far past its prediction is cancelled and retried as in a real run
    # (``stall_factor``): a task 20 times slower than profiled ran to its end here, where
    # a run fails it after its retries (review).
    options = options or SIMULATION_OPTIONS
    run_dir = Path(run_dir)
    began = time.perf_counter()
    virtual = VirtualClock()
    with claim_run_dir(run_dir, simulated=True), clock.using(virtual):
        _fresh(run_dir)
        write_private(run_dir / SIMULATED_FILE, json.dumps(
            {"scenario": scenario.to_json(), "tasks": len(tasks),
             "cluster": [{"name": n.name, "devices": n.devices,
                          **({"kind": n.model} if n.model else {})}
                         for n in cluster],
             **({"current_practice": baseline} if baseline else {})},
            indent=1) + "\n")
        machines = VirtualCluster(virtual, scenario, list(cluster))
        launching = SimulatedLaunching(run_dir, profile, virtual, scenario, machines)
        runner = Runner(tasks, Cluster(machines.present_at_start()), run_dir, profile,
                        options, on_event or (lambda e: None),
                        lambda state: None, machines, launching=launching, virtual=True)
        if left_out:  # listed as a run lists the tasks it never started
            runner.store.set_invalid({name: [why] for name, why in left_out.items()})
        try:
            runner.run()
        finally:
            runner.store.close()
        statuses = {name: r.status.value for name, r in runner.state.records.items()}
        with RunStore(run_dir) as store:
            errors = {t.name: short_error(t.error) for t in store.tasks()
                      if t.error and statuses.get(t.name) not in ("done", "stopped")}
        return SimulationResult(
            run_dir, runner.now(), runner.first_planned or 0.0, baseline, statuses,
            runner.slices_launched, runner.plans_adopted, runner.replanner.solves,
            runner.replanner.seconds, time.perf_counter() - began, runner.first_horizon,
            errors)


def _fresh(run_dir: Path) -> None:
    """An empty run directory for the simulation (its lock held): an earlier
    simulation's files there are removed, as it would be redone from scratch (its
    store, plans and report mixed with this one's: a second run found every task done
    and reported a makespan of 0 s); a real run's directory is refused."""
    import shutil

    from dione.state.lock import LOCK_FILE
    from dione.state.store import STORE_FILE

    if not (run_dir / STORE_FILE).exists():
        return
    if not (run_dir / SIMULATED_FILE).is_file():
        raise RunDirError(f"{run_dir} holds a run that trained (no {SIMULATED_FILE}): a "
                          "simulation would mix with it; give another --out")
    for entry in run_dir.iterdir():
        # What a simulation wrote only (another file there, put beside it since, stays).
        if entry.name == LOCK_FILE or entry.name not in RUN_DIR_ENTRIES:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
