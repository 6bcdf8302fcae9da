"""``dione simulate``: a problem's tasks on a virtual cluster, through the real orchestrator."""

from __future__ import annotations

import argparse
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dione.cli.console import complain, console
from dione.cli.errors import EXIT_FAILED, BadInput
from dione.cli.inputs import problem_refused, say_kinds_replaced, say_problem_notes
from dione.words import some

if TYPE_CHECKING:
    from dione.orchestrate.options import RunEvent

__all__ = ["command"]


# Wall seconds between progress lines: a large simulation re-plans for minutes.
PROGRESS_SECONDS = 15.0


class _Progress:
    """Every ``PROGRESS_SECONDS`` of wall time at most, a line of where the simulation
    stands (it printed nothing for minutes): at its events, and from a thread of its own
    where none comes (a plan's solve: 45 s for 200 tasks on 16 nodes)."""

    def __init__(self) -> None:
        self.began = self.last = time.monotonic()
        self.seen = {"slice_finished": 0, "planned": 0, "replanned": 0,
                     "planner_fell_back": 0}
        self.fell_back = ""  # the first solve that found no plan, and why
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._quiet, name="dione-simulate-progress",
                                        daemon=True)
        self._thread.start()

    def heard(self, event: RunEvent) -> None:
        if event.kind in self.seen:
            self.seen[event.kind] += 1
        if event.kind == "planner_fell_back" and not self.fell_back:
            self.fell_back = event.message
        self._say("")

    def _quiet(self) -> None:
        while not self._stop.wait(1.0):
            self._say(" (still working)")

    def _say(self, note: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self.last < PROGRESS_SECONDS:
                return
            self.last = now
            console.print(f"... {now - self.began:.0f} s: {self.seen['slice_finished']} "
                          f"slices ended, {self.seen['planned'] + self.seen['replanned']} "
                          f"plan(s) adopted{note}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _first_placed(run_dir: Path) -> int | None:
    """How many tasks the run's first plan placed (None: no plan was adopted)."""
    from dione.orchestrate.plans import read_plans

    plans = read_plans(run_dir)
    return len({a.task for a in plans[0].plan.assignments}) if plans else None


def command(args: argparse.Namespace) -> int:
    from dione.orchestrate.estimates import planning_nodes
    from dione.orchestrate.options import RunOptions
    from dione.orchestrate.plans import horizon_said
    from dione.plan import ProblemError, load_problem
    from dione.simulate import Scenario, ScenarioError, load_scenario, parse_cluster, simulate
    from dione.simulate.run import without_avoid_lists

    try:
        cluster = parse_cluster(args.cluster) if args.cluster is not None else None
        scenario = load_scenario(args.scenario) if args.scenario else Scenario()
    except (ValueError, ScenarioError) as err:
        raise BadInput(str(err)) from None
    from dione.techniques.registry import technique_names

    try:  # --cluster stands in for the file's cluster, which may then be left out
        loaded = load_problem(args.problem, planning_nodes(cluster) if cluster else None,
                              fitting=False, techniques=technique_names())
    except (OSError, ProblemError) as err:
        raise problem_refused(args.problem, err, cluster is not None) from None
    avoiding = [t.name for t in loaded.tasks if t.avoid]
    if avoiding:  # a run's nodes where its tasks failed: not this simulation's
        complain("warning", f"the avoid lists of {len(avoiding)} task(s) "
                 f"({', '.join(avoiding[:4])}{', ...' if len(avoiding) > 4 else ''}) in the "
                 "problem are not simulated: each task may run on every node (`dione plan` "
                 "honours them; a simulated run's tasks avoid the nodes they fail on)")
    loaded = without_avoid_lists(loaded)  # before left_out reads them
    problem, left_out = loaded.left_out()
    kept = {t.name for t in problem.tasks}
    dropped = dict(zip([t.name for t in loaded.tasks if t.name not in kept], left_out,
                       strict=True))
    say_problem_notes(problem, left_out)
    if cluster is not None:
        say_kinds_replaced(args.problem, problem)
    released = [t.name for t in problem.tasks if t.release]
    if released or problem.busy:  # a snapshot of a live run's problem, say
        complain("warning", "the simulation starts every task at 0 s on idle devices: "
                 + "; ".join(part for part in (
                     released and f"the release times of {len(released)} task(s) "
                     f"({', '.join(released[:4])}{', ...' if len(released) > 4 else ''})",
                     problem.busy and f"{len(problem.busy)} busy device range(s)")
                     if part)
                 + " in the problem are not simulated (`dione plan` honours them)")
    if not problem.tasks:
        raise BadInput(f"{args.problem}: no task fits the cluster (why, for each, above): give "
                       "nodes wide enough and of the options' kinds (--cluster)")
    # Only the file's type cut off: at its first dot, sweep.v1.json and sweep.v2.json
    # shared one folder, the second replacing the first (review).
    name = re.sub(r"(\.json)?(\.gz)?$", "", Path(args.problem).name) or "problem"
    # The cluster in the default name: "2 nodes against 4" keeps both (the second
    # replaced the first, unsaid: review).
    on = ("-" + re.sub(r"[^A-Za-z0-9.]+", "-", args.cluster.strip()).strip("-")
          if args.cluster else "")
    out = Path(args.out or Path("runs") / f"simulate-{name}{on}")
    from dione.state.store import SIMULATED_FILE

    if (out / SIMULATED_FILE).is_file():
        console.print(f"replacing the earlier simulation in {out} (--out keeps each apart)")
    try:
        options = RunOptions(solver=args.solver, time_limit=args.time_limit,
                             replan_time_limit=args.replan_time_limit,
                             replan=not args.no_replan, replan_interval=args.replan_interval,
                             replan_share=args.replan_share,
                             slice_seconds=args.slice_seconds, max_failures=args.max_failures,
                             stall_factor=args.stall_factor, stall_grace=args.stall_grace)
    except ValueError as err:  # flags wrong together (a traceback: a review)
        raise BadInput(str(err)) from None
    progress = _Progress()
    try:
        result = simulate(problem, out, cluster=cluster, scenario=scenario, steps=args.steps,
                          options=options, left_out=dropped, on_event=progress.heard)
    except ValueError as err:
        raise BadInput(str(err)) from None
    finally:
        progress.close()
    fell_back = progress.seen["planner_fell_back"]
    if fell_back:  # (the figures below are greedy's there: said first, not only in the report)
        complain("warning", progress.fell_back
                 + (f" ({fell_back} solves fell back so)" if fell_back > 1 else "")
                 + ": give --time-limit and --replan-time-limit more (wall seconds for "
                 "every solver but cpsat)")
    done = sum(1 for s in result.statuses.values() if s == "done")
    console.print(f"SIMULATED (virtual cluster, no task trained): "
                  f"{len(result.statuses) + len(dropped)} tasks, {done} done"
                  + (f", {len(dropped)} left out (no node holds them)" if dropped else ""))
    # Current practice trains every task the plan holds to its end: a run that failed
    # some did less work, and its makespan is no saving.
    unfinished = [t for t, s in result.statuses.items() if s not in ("done", "stopped")]
    ratio = (f" (not comparable: {len(unfinished)} task(s) did not finish here)" if unfinished
             else f" ({result.makespan / result.current_practice:.2f} of it)"
             if result.current_practice > 0 else "")
    covers = horizon_said(result.planned_horizon, ", {}")
    placed = _first_placed(out)
    if placed is not None and placed < len(result.statuses):  # as the report says it
        covers += f", placing {placed} of the {len(result.statuses)} tasks"
    console.print(f"makespan {result.makespan:.1f} s (first plan: "
                  f"{result.planned_makespan:.1f} s{covers}); current practice "
                  f"{result.current_practice:.1f} s{ratio}"
                  + (" - which plays the scenario's slowdowns, node losses and joins, but "
                     "not its failures, faulty nodes, spread or stopping rules"
                     if scenario.failures or scenario.spread or scenario.faulty_nodes
                     else ""))
    unplayed = scenario.unplayed(result.makespan)
    if unplayed:  # (current practice, still running then, may have played it: a review)
        baseline = scenario.unplayed(result.current_practice)
        played = [u for u in unplayed if u not in baseline]
        complain("note", f"the scenario's {some(unplayed, 4)}: at or after the run's end "
                 f"({result.makespan:.1f} s), never played in it"
                 + (f"; current practice, which ran to {result.current_practice:.1f} s, "
                    f"played {some(played, 4)}" if played else ""))
    console.print(f"{result.slices} slices, {result.plans_adopted} plan(s) adopted, "
                  f"{result.replans} re-plans solved in {result.replan_seconds:.1f} s; "
                  f"simulated in {result.wall_seconds:.1f} s")
    for task, status in sorted(result.statuses.items()):
        if status != "done":  # with why, as the report says it (not only there: review)
            why = result.errors.get(task)
            console.print(f"  {task}: {status}" + (f" - {why}" if why else ""))
    console.print(f"report: {out / 'report' / 'index.html'}")
    # A task no node holds fails the sweep as an invalid task fails a run (exit 0 read as
    # a sweep that fits the cluster).
    return EXIT_FAILED if unfinished or dropped else 0

