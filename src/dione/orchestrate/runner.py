"""One session of a run: launch planned slices as gangs, watch them, re-plan.

Each assignment starts when its devices are free, in each device's planned order; a
gang runs in a thread of its own (run_slice), so several train at once. At slice ends,
on drift and every ``replan_interval`` seconds the remaining work is planned again,
over the nodes alive then: a lost node leaves the plan, one that joined (Ray) enters it.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dione.launch.local import Launcher
from dione.launch.slice import SliceError, SliceResult, run_slice
from dione.orchestrate.options import RunDirError, RunEvent, RunOptions
from dione.plan.plan import Assignment, Plan
from dione.plan.problem import Busy, PlanningProblem, TaskOptions
from dione.plan.solve import solve
from dione.profile.results import Option, Profile, planning_nodes
from dione.report.plans import AdoptedPlan, next_plan_file, plan_files, write_plan
from dione.spec.cluster import Cluster
from dione.spec.task import Task
from dione.state.store import RunStore
from dione.techniques.registry import get_technique

__all__ = ["AUTO_SLICE_FLOOR_SECONDS", "AUTO_SLICE_START_UP_SHARE", "RunState", "Runner",
           "RunningSlice", "auto_slice_seconds"]

# The default slice: long enough that its start-up (warm workers: about 0.2-0.8 s on 2
# CPU cores, benchmarks/RESULTS.md) is at most this share of it, and at least the floor,
# so that re-planning (a solve at every slice end) runs about once per task per floor.
AUTO_SLICE_START_UP_SHARE = 0.05
AUTO_SLICE_FLOOR_SECONDS = 300.0


def auto_slice_seconds(start_up_seconds: float) -> float:
    """The default slice length for an option whose slices cost ``start_up_seconds`` to
    start (its trial's fixed cost plus the checkpoint load a resumed slice adds)."""
    return max(AUTO_SLICE_FLOOR_SECONDS, start_up_seconds / AUTO_SLICE_START_UP_SHARE)


@dataclass
class RunningSlice:
    """A slice training now: its assignment, steps, and what its ranks last reported."""

    assignment: Assignment  # times on the run clock
    began: float  # run clock
    start_step: int
    end_step: int
    predicted_end: float  # run clock
    # Each rank's latest progress record, as its launcher passed it on (gang threads
    # write, the loop reads: each record is replaced whole).
    progress: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass
class RunState:
    """What the loop knows; read by the live view (from the loop's thread only)."""

    tasks: dict[str, Task]
    total: dict[str, int]
    done_steps: dict[str, int]
    status: dict[str, str]  # pending | running | done | failed | diverged
    failures: dict[str, int]
    plan: list[Assignment]  # times on the run clock
    running: dict[str, RunningSlice] = field(default_factory=dict)
    last_loss: dict[str, float] = field(default_factory=dict)
    estimated_finish: float = 0.0
    clock_zero: float = 0.0  # time.time() of run-clock 0 in this session
    # Tasks some of whose steps trained (or train now) under an inexact technique.
    inexact: set[str] = field(default_factory=set)


class Runner:
    """One session of a run: executes and re-plans until every task is done or failed."""

    def __init__(self, tasks: Sequence[Task], cluster: Cluster, run_dir: Path,
                 profile: Profile, options: RunOptions,
                 on_event: Callable[[RunEvent], None], view: Callable[[RunState], None],
                 launcher: Launcher) -> None:
        self.cluster = cluster
        self.launcher = launcher
        self.run_dir = run_dir
        self.profile = profile
        self.options = options
        self.emit = on_event
        self.view = view
        self.store = RunStore(run_dir)
        self.store.recover_interrupted()
        total = {t.name: self.profile.task(t.name).total_steps for t in tasks}
        for task in tasks:
            try:
                self.store.register_task(task.name, total[task.name], task.batch_size,
                                         task.hyperparameters)
            except ValueError as err:
                self.store.close()
                raise RunDirError(str(err)) from None
        done_steps = {}
        status = {}
        for task in tasks:
            latest = self.store.latest_checkpoint(task.name)
            done_steps[task.name] = latest.step if latest else 0
            record = self.store.task(task.name)
            finished = record is not None and record.status == "done"
            status[task.name] = "done" if finished or done_steps[task.name] >= total[
                task.name] else "pending"
            if record is not None and record.status == "diverged":
                # Training it on would repeat the divergence: the user must change it.
                status[task.name] = "diverged"
                continue
            if not self.profile.task(task.name).options and status[task.name] != "done":
                status[task.name] = "failed"
                reason = self.profile.task(task.name).error or self.profile.task(
                    task.name).why_no_option()
                self.store.set_task_status(task.name, "failed", reason)
                self.emit(RunEvent("task_failed", f"{task.name}: {reason}", task.name))
        self.state = RunState({t.name: t for t in tasks}, total, done_steps, status,
                            {t.name: 0 for t in tasks}, [], clock_zero=time.time())
        self.state.inexact = {s.task for s in self.store.slices()
                              if s.status == "done" and s.inexactness is not None}
        # Nodes this run has known: another that the launcher reports later joined.
        self.known = {n.name for n in [*cluster, *(launcher.alive_nodes() or [])]}
        self.plans_adopted = len(plan_files(run_dir))
        self.first_planned: float | None = None
        self.cancel = threading.Event()
        self.slices_launched = 0  # in this session

    # -- estimates -------------------------------------------------------------------

    def now(self) -> float:
        return time.time() - self.state.clock_zero

    def _measured_step(self, name: str, technique: str, devices: int) -> float | None:
        """The mean step time this task measured under (technique, devices), if any
        (each slice's first step, which pays for warm-up, left out)."""
        times: list[float] = []
        for record in self.store.slices(name):
            if (record.status == "done" and record.technique == technique
                    and len(record.device_ids) == devices):
                times += self.store.slice_step_seconds(record.id)[1:]
        return statistics.fmean(times) if len(times) >= 2 else None

    def option_seconds(self, name: str, option: Option, steps: int) -> float:
        """Predicted seconds for ``steps`` more steps of ``name`` under ``option``: the
        catalog's, with the measured step time where this task already ran so."""
        task_profile = self.profile.task(name)
        resumed = self.state.done_steps[name] > 0
        seconds = option.seconds(steps, resumed, task_profile.evaluation_seconds)
        measured = self._measured_step(name, option.technique, option.devices)
        if measured is not None and option.record.step_seconds is not None:
            seconds += steps * (measured - option.record.step_seconds)
        return seconds

    def _slice_steps(self, name: str, option: Option) -> int:
        remaining = self.state.total[name] - self.state.done_steps[name]
        if self.options.slice_steps:
            return min(remaining, self.options.slice_steps)
        seconds = self.options.slice_seconds or auto_slice_seconds(
            option.record.fixed_seconds + option.record.load_seconds)
        if option.record.step_seconds:
            steps = math.ceil(seconds / option.record.step_seconds)
            return min(remaining, max(1, steps))
        return remaining

    # -- planning --------------------------------------------------------------------

    def problem(self) -> tuple[PlanningProblem, float]:
        """The remaining work as a planner problem, and the run-clock time it starts at."""
        now = self.now()
        tasks = []
        for name in self._pending_that_fit():
            remaining = self.state.total[name] - self.state.done_steps[name]
            tasks.append(TaskOptions(name, tuple(
                o.planned(round(max(0.001, self.option_seconds(name, o, remaining)), 3))
                for o in self.profile.task(name).options)))
        nodes = {n.name for n in self.cluster}
        busy = tuple(Busy(name, r.assignment.node, r.assignment.device_ids,
                          round(max(0.0, self.predicted_task_end(name) - now), 3))
                     for name, r in self.state.running.items()
                     if r.assignment.node in nodes)  # a lost node's slices are ending
        return PlanningProblem(planning_nodes(self.cluster), tuple(tasks), busy), now

    def _pending_that_fit(self) -> list[str]:
        """Pending tasks some node of the cluster can hold. Another one (its nodes were
        lost) waits out of the plan, in case a node that holds it joins (Ray)."""
        widest = max((n.devices for n in self.cluster), default=0)
        return [name for name, status in self.state.status.items() if status == "pending"
                and any(o.devices <= widest for o in self.profile.task(name).options)]

    def _fail_the_unplaceable(self) -> bool:
        """Give up the pending tasks no node left can hold (the run cannot wait for ever
        with nothing else to do); whether there were any."""
        widest = max((n.devices for n in self.cluster), default=0)
        placeable = set(self._pending_that_fit())
        stranded = [name for name, status in self.state.status.items()
                    if status == "pending" and name not in placeable]
        for name in stranded:
            least = min(o.devices for o in self.profile.task(name).options)
            message = (f"{name} cannot be placed: its options need at least {least} devices "
                       f"on one node, and the widest node left has {widest}; resume the run "
                       "once such a node is back")
            self.state.status[name] = "failed"
            self.store.set_task_status(name, "failed", message)
            self.emit(RunEvent("task_failed", message, name))
        return bool(stranded)

    def predicted_task_end(self, name: str) -> float:
        """Run-clock time a running task ends its current slice: its pace so far times
        the steps left, plus the save (and evaluation, at the task's end) measured in its
        trial."""
        running = self.state.running[name]
        progress = self._progress(running)
        if progress is None:
            return max(running.predicted_end, self.now())
        step, pace = progress
        option = self.profile.task(name).option(running.assignment.technique,
                                                running.assignment.devices)
        tail = option.record.save_seconds if option is not None else 0.0
        if running.end_step >= self.state.total[name]:
            tail += self.profile.task(name).evaluation_seconds  # the last slice evaluates
        return self.now() + pace * (running.end_step - step) + tail

    def _progress(self, running: RunningSlice) -> tuple[int, float] | None:
        """(steps done, seconds per step) of a running slice, as its ranks reported."""
        for said in list(running.progress.values()):
            if said.get("loss") is not None:
                self.state.last_loss[running.assignment.task] = float(said["loss"])
        record = running.progress.get(0)
        pace = None if record is None else record.get("seconds_per_step")
        return None if record is None or pace is None else (int(record["step"]), float(pace))

    def _join_new_nodes(self) -> None:
        """Add the nodes that joined the cluster since (of the kind the profile measured,
        whose options stand for every such node)."""
        kind = self.cluster.nodes[0].kind
        joined = [n for n in self.launcher.alive_nodes() or []
                  if n.name not in self.known and n.kind == kind]
        if not joined:
            return
        self.known |= {n.name for n in joined}
        self.cluster = Cluster([*self.cluster, *joined])
        for node in joined:
            self.emit(RunEvent("node_joined", f"node {node.name} ({node.devices} {node.kind} "
                               "device(s)) joined the cluster; the plan now uses it"))

    def replan(self, first: bool = False) -> None:
        if not any(s == "pending" for s in self.state.status.values()):
            return
        self._join_new_nodes()
        problem, at = self.problem()
        if not problem.tasks:  # what is pending waits for a node wide enough
            self.state.plan = []
            return
        problem.check()  # what a problem file must be, the solvers may rely on
        limit = self.options.time_limit if first else self.options.replan_time_limit
        plan = solve(problem, self.options.solver, limit)
        if not plan.assignments:  # e.g. saturn-milp's model too large: the run goes on
            reason = plan.notes.get("reason") or "no plan within the time limit"
            self.emit(RunEvent("planner_fell_back", f"{plan.solver} ({plan.status}): "
                               f"{reason}; planning with greedy instead"))
            plan = solve(problem, "greedy", limit)
        candidate = self._absolute(plan, at)
        if not first:
            current = self._retimed_current(problem, at)
            new_end = max((a.end for a in candidate), default=at)
            if current is not None and new_end >= current - self.options.replan_margin * max(
                    current - at, 0.0):
                self.state.estimated_finish = max(current, self._running_end())
                return
        self.state.plan = candidate
        self.state.estimated_finish = max(max((a.end for a in candidate), default=at),
                                          self._running_end())
        if self.first_planned is None:
            self.first_planned = self.state.estimated_finish
        self._save_plan(plan, problem, at)
        self.emit(RunEvent("planned" if first else "replanned",
                           f"{plan.solver} ({plan.status}): finish at "
                           f"{self.state.estimated_finish:.1f} s"))

    def _drifted(self) -> bool:
        """Whether a running slice's pace puts its end off the plan by more than 5%
        (then its new end becomes the expectation, so one drift triggers one re-plan)."""
        drifted = False
        for name, running in self.state.running.items():
            expected = self.predicted_task_end(name)
            length = max(running.predicted_end - running.began, 1.0)
            if abs(expected - running.predicted_end) > 0.05 * length:
                running.predicted_end = expected
                drifted = True
        return drifted and any(s == "pending" for s in self.state.status.values())

    def _running_end(self) -> float:
        return max((self.predicted_task_end(n) for n in self.state.running), default=0.0)

    def _absolute(self, plan: Plan, at: float) -> list[Assignment]:
        return [a.shifted(at) for a in plan.assignments]

    def _retimed_current(self, problem: PlanningProblem, at: float) -> float | None:
        """When the current plan would finish under today's estimates (each device keeps
        its order); None if it no longer covers the pending tasks."""
        seconds = {(t.name, o.technique, o.devices): o.seconds
                   for t in problem.tasks for o in t.options}
        free: dict[tuple[str, int], float] = {}
        for busy in problem.busy:
            for device in busy.device_ids:
                free[(busy.node, device)] = at + busy.until
        pending = {t.name for t in problem.tasks}
        end = at
        covered = set()
        for a in sorted(self.state.plan, key=lambda a: a.start):
            if a.task not in pending:
                continue
            key = (a.task, a.technique, a.devices)
            if key not in seconds:
                return None
            devices = [(a.node, d) for d in a.device_ids]
            start = max([at, *(free.get(d, at) for d in devices)])
            finish = start + seconds[key]
            for d in devices:
                free[d] = finish
            end = max(end, finish)
            covered.add(a.task)
        return end if covered == pending else None

    def _save_plan(self, plan: Plan, problem: PlanningProblem, at: float) -> None:
        adopted = AdoptedPlan(plan, at, self.state.clock_zero, tuple(self.state.plan), problem)
        write_plan(next_plan_file(self.run_dir), adopted)
        self.plans_adopted += 1

    # -- execution -------------------------------------------------------------------

    def launchable(self) -> list[Assignment]:
        """Assignments whose devices are free and that come first on each of them."""
        busy = {(r.assignment.node, d) for r in self.state.running.values()
                for d in r.assignment.device_ids}
        first_on: dict[tuple[str, int], str] = {}
        for a in sorted(self.state.plan, key=lambda a: a.start):
            if self.state.status[a.task] != "pending":
                continue
            for d in a.device_ids:
                first_on.setdefault((a.node, d), a.task)
        ready = []
        for a in self.state.plan:
            if self.state.status[a.task] != "pending":
                continue
            devices = [(a.node, d) for d in a.device_ids]
            if any(d in busy for d in devices):
                continue
            if all(first_on.get(d) == a.task for d in devices):
                ready.append(a)
                busy.update(devices)
        return ready

    def launch(self, pool: ThreadPoolExecutor, a: Assignment) -> Future[SliceResult]:
        name = a.task
        option = self.profile.task(name).option(a.technique, a.devices)
        assert option is not None
        steps = self._slice_steps(name, option)
        start = self.state.done_steps[name]
        running = RunningSlice(a, self.now(), start, start + steps,
                           self.now() + self.option_seconds(name, option, steps))
        self.state.running[name] = running
        self.state.status[name] = "running"
        self.slices_launched += 1
        technique = get_technique(a.technique)
        if technique.inexactness(technique.resolve(a.knobs)) is not None:
            self.state.inexact.add(name)
        node = self.cluster.node(a.node)

        def heard(rank: int, record: dict[str, Any]) -> None:
            running.progress[rank] = record

        self.emit(RunEvent("slice_started", f"{name}: steps {start}-{start + steps} under "
                           f"{a.technique} on {a.node} devices {list(a.device_ids)}", name))
        return pool.submit(run_slice, self.state.tasks[name], a.technique, self.run_dir,
                           self.launcher.placement(node, list(a.device_ids)), knobs=dict(a.knobs),
                           steps=steps, timeout=self.options.timeout, cancel=self.cancel,
                           on_progress=heard, launcher=self.launcher,
                           storage=self.options.storage,
                           total=self.state.total[name])  # no data set loaded per slice

    def finished(self, name: str, future: Future[SliceResult]) -> bool:
        """Record a slice's end; whether it departs from the plan enough to re-plan."""
        running = self.state.running.pop(name)
        try:
            result = future.result()
        except SliceError as err:
            if err.reason == "node_lost":  # not the task's fault: plan it anew elsewhere
                self._lose_node(running.assignment.node, name, err)
                return True
            self.state.failures[name] += 1
            if err.reason == "diverged":  # the store already says so, with the step
                self.state.status[name] = "diverged"
                self.emit(RunEvent("task_diverged", str(err).splitlines()[0], name))
            elif not err.retryable:
                self.state.status[name] = "failed"
                self.store.set_task_status(name, "failed", str(err))
                self.emit(RunEvent("task_failed", f"{name} failed, and no retry can succeed "
                                   "until the disk or the permissions change: "
                                   f"{str(err).splitlines()[0]}", name))
            elif self.state.failures[name] >= self.options.max_failures:
                self.state.status[name] = "failed"
                self.store.set_task_status(name, "failed", str(err))
                self.emit(RunEvent("task_failed", f"{name} failed {self.state.failures[name]} "
                                   f"times; giving up: {err}", name))
            else:
                self.state.status[name] = "pending"
                self.emit(RunEvent("slice_failed", f"{name} failed (attempt "
                                   f"{self.state.failures[name]} of "
                                   f"{self.options.max_failures}), will retry: "
                                   f"{str(err).splitlines()[0]}", name))
            return True
        for warning in result.warnings:
            self.emit(RunEvent("checkpoint_quarantined", warning, name))
        self.state.done_steps[name] = result.end_step
        if result.losses:
            self.state.last_loss[name] = result.losses[-1]
        finished = result.end_step >= self.state.total[name]
        self.state.status[name] = "done" if finished else "pending"
        if finished:
            self.store.set_task_status(name, "done", result.evaluation_error)
        elapsed = self.now() - running.began
        planned = running.predicted_end - running.began
        self.emit(RunEvent("slice_finished", f"{name}: steps {result.start_step}-"
                           f"{result.end_step} in {elapsed:.1f} s (predicted {planned:.1f} s)"
                           + (" - done" if finished else ""), name))
        return not finished or abs(elapsed - planned) > 0.05 * max(planned, 1.0)

    def _lose_node(self, node: str, name: str, err: SliceError) -> None:
        """A node left the cluster under a running slice: the task goes back to pending
        (from its last checkpoint), the node's devices leave the plan."""
        self.state.status[name] = "pending"
        if any(n.name == node for n in self.cluster):
            left = [n for n in self.cluster if n.name != node]
            if not left:
                raise RuntimeError(f"node {node} was lost and no node is left to train on")
            self.cluster = Cluster(left)
            self.launcher.forget_node(node)
            self.state.plan = [a for a in self.state.plan if a.node != node]
            self.emit(RunEvent("node_lost", f"node {node} left the cluster; its work is "
                               "planned again on the others", name))
        self.emit(RunEvent("slice_failed", f"{name}: {str(err).splitlines()[0]}", name))

    def run(self) -> None:
        self.replan(first=True)
        futures: dict[Future[SliceResult], str] = {}
        last_replan = self.now()
        # A thread per running gang; nodes may join, and threads start only when needed.
        with ThreadPoolExecutor(max_workers=1024) as pool:
            try:
                while True:
                    for a in self.launchable():
                        futures[self.launch(pool, a)] = a.task
                    if not futures:
                        if any(s == "pending" for s in self.state.status.values()):
                            self.replan(first=True)  # the plan lost its tasks: plan again
                            if not self.launchable():
                                if self._fail_the_unplaceable():
                                    continue
                                raise RuntimeError("no pending task can be placed")
                            continue
                        break
                    done, _ = wait(list(futures), timeout=1.0, return_when=FIRST_COMPLETED)
                    depart = False
                    for future in done:
                        depart |= self.finished(futures.pop(future), future)
                    interval = self.now() - last_replan > self.options.replan_interval
                    if self.options.replan and (depart or interval or self._drifted()):
                        self.replan()
                        last_replan = self.now()
                    elif done:
                        self.state.estimated_finish = max(
                            max((a.end for a in self.state.plan
                                 if self.state.status[a.task] == "pending"), default=0.0),
                            self._running_end())
                    self.view(self.state)
            except BaseException:
                self.cancel.set()  # every gang stops; their slices are recorded interrupted
                wait(list(futures))  # their errors (GangInterrupted) stay in the futures
                raise
            finally:
                if not self.state.running and not any(
                        s == "pending" for s in self.state.status.values()):
                    self.state.estimated_finish = self.now()  # nothing left to estimate
                self.view(self.state)
