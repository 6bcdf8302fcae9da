"""Planning a run's remaining work: the first plan before anything starts, every later one
beside execution.

A re-plan is asked for (a slice ended, a running slice's pace moved its end, a task or a
node came or went, the interval passed) and solved on a thread of its own from a
snapshot of the problem, while the run goes on launching from the current plan; the
next turn of the loop adopts it if it ends earlier than the current plan re-timed under
the same estimates by more than the margin. A request made while a solve runs is
served by the next solve. Saturn, by contrast, stops execution to re-solve at fixed
intervals.

    loop:  launch ─ launch ─ wait ─ slice ends: ask ─ launch ─ wait ─ adopt ─ launch ...
    thread:                                     └── solve(snapshot) ──┘
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from dione.plan.favour import favoured
from dione.plan.hasten import hasten as hastened
from dione.plan.plan import Assignment, Plan
from dione.plan.problem import PlanningProblem
from dione.plan.solve import solve

__all__ = ["PlanCandidate", "Replanner", "retimed_end"]


@dataclass(frozen=True)
class PlanCandidate:
    """A solved plan, the problem it solved, and the run-clock time the problem was
    taken at (its times are relative to that)."""

    plan: Plan
    problem: PlanningProblem
    at: float
    fell_back: str | None = None  # why greedy planned instead of the solver asked for

    def absolute(self) -> list[Assignment]:
        return [a.shifted(self.at) for a in self.plan.assignments]


def solve_or_fall_back(problem: PlanningProblem, solver: str, limit: float,
                       threads: int | None = None, deterministic: bool = False,
                       hasten: bool = False) -> tuple[Plan, str | None]:
    """The plan ``solver`` finds within ``limit`` seconds on ``threads`` (None: every
    core), or greedy's where it finds none (saturn-milp's model too large to build: the
    run goes on), with why. ``deterministic``: cpsat's ``limit`` is in its deterministic
    time, so the plan does not depend on how fast the machine ran the solve.
    ``hasten`` (a run with stopping rules): a pausing rule's promoted tasks then end
    sooner where the makespan allows (``plan.favour``), and each task as early as idle
    devices allow (``plan.hasten``)."""
    problem.check()  # what a problem file must be, the solvers may rely on
    if deterministic and solver == "cpsat":
        # The clock's limit, far beyond the deterministic one, only guards a hang.
        plan = solve(problem, solver, max(60.0, 100 * limit), threads, limit)
    else:
        plan = solve(problem, solver, limit, threads)
    fell_back = None
    if not plan.assignments:
        reason = plan.notes.get("reason") or "no plan within the time limit"
        fell_back = f"{plan.solver} ({plan.status}): {reason}"
        plan = solve(problem, "greedy", limit)
    return (hastened(favoured(plan, problem), problem) if hasten else plan), fell_back


class Replanner:
    """Solves re-plans one at a time on a thread of its own; the loop polls for them."""

    def __init__(self, solver: str, limit: float, beside: bool = True,
                 deterministic: bool = False) -> None:
        """``beside``: solve on a thread of its own (False: at once, on the caller's
        thread, as a simulation on a virtual clock must, so that its plans do not
        depend on how fast the solver ran)."""
        self.solver = solver
        self.limit = limit
        self.beside = beside
        self.deterministic = deterministic
        # Each plan's tasks ended as early as idle devices allow (set by the runner
        # before each solve: a run with stopping rules, where ends sooner judge sooner).
        self.hasten = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dione-replan")
        self._solving: Future[PlanCandidate] | None = None
        self._wanted: Callable[[], tuple[PlanningProblem, float] | None] | None = None
        self._wanted_owed = False
        self._wanted_quick = True
        self._lock = threading.Lock()
        self.solves = 0
        self.seconds = 0.0  # spent solving re-plans (beside execution)
        self.units = 0.0  # of CP-SAT's deterministic time they spent (deterministic solves)
        # The part of both spent on owed solves (a stop freed devices, a node or task
        # came or went): the re-planning budget holds the others only.
        self.owed_seconds = 0.0
        self.owed_units = 0.0

    def ask(self, snapshot: Callable[[], tuple[PlanningProblem, float] | None],
            owed: bool = False, quick: bool = False) -> None:
        """Plan again from ``snapshot()`` (the problem now and its time; None: nothing to
        plan): at once if no solve runs, else as soon as the running one ends. ``owed``:
        the solve is counted apart from the budgeted ones (a request served together
        with an owed one is owed); ``quick``: by greedy, in milliseconds (an owed solve
        past its own budget; one served with a request that is not quick is not)."""
        with self._lock:
            if self._solving is None:
                self._start(snapshot, owed, quick)
            else:
                self._wanted = snapshot
                self._wanted_owed |= owed
                self._wanted_quick &= quick

    def _start(self, snapshot: Callable[[], tuple[PlanningProblem, float] | None],
               owed: bool, quick: bool = False) -> None:
        taken = snapshot()  # on the loop's thread: the state does not move under it
        if taken is None:
            return
        problem, at = taken
        if self.beside:
            self._solving = self._pool.submit(self._solve, problem, at, owed, quick)
        else:
            done: Future[PlanCandidate] = Future()
            try:
                done.set_result(self._solve(problem, at, owed, quick))
            except Exception as err:
                done.set_exception(err)
            self._solving = done

    def _solve(self, problem: PlanningProblem, at: float, owed: bool,
               quick: bool = False) -> PlanCandidate:
        began = time.perf_counter()
        units = 0.0
        try:
            # One thread beside execution: the gangs keep the other cores.
            plan, fell_back = solve_or_fall_back(
                problem, "greedy" if quick else self.solver, self.limit,
                1 if self.beside or self.deterministic else None, self.deterministic,
                self.hasten)
            units = float(plan.notes.get("deterministic_spent", 0.0))
        finally:
            spent = time.perf_counter() - began
            self.seconds += spent
            self.units += units
            if owed:
                self.owed_seconds += spent
                self.owed_units += units
            self.solves += 1
        return PlanCandidate(plan, problem, at, fell_back)

    def ready(self) -> PlanCandidate | None:
        """A solved candidate, if one is (the solve's own error is raised); a request
        that waited for it is started."""
        with self._lock:
            if self._solving is None or not self._solving.done():
                return None
            candidate = self._solving.result()
            self._solving = None
            if self._wanted is not None:
                wanted, self._wanted = self._wanted, None
                owed, self._wanted_owed = self._wanted_owed, False
                quick, self._wanted_quick = self._wanted_quick, True
                self._start(wanted, owed, quick)
            return candidate

    @property
    def busy(self) -> bool:
        return self._solving is not None

    def waitable(self) -> list[Future[PlanCandidate]]:
        """The solve in flight, for the loop to wait on beside its gangs."""
        solving = self._solving
        return [] if solving is None else [solving]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def retimed_end(plan: list[Assignment], problem: PlanningProblem, at: float) -> float | None:
    """When ``plan`` would finish under ``problem``'s estimates (each device keeps its
    order, each task starts once its devices are free and not before ``at`` plus its
    release); None if it no longer covers the problem's tasks."""
    # Per (task, technique, devices, kind of node: None for an option every node takes).
    seconds = {(t.name, o.technique, o.devices, o.kind): o.seconds
               for t in problem.tasks for o in t.options}
    kinds = {n.name: n.kind for n in problem.nodes}
    free: dict[tuple[str, int], float] = {}
    for busy in problem.busy:
        for device in busy.device_ids:
            free[(busy.node, device)] = at + busy.until
    pending = {t.name for t in problem.tasks}
    release = problem.releases()
    end = at
    covered = set()
    for a in sorted(plan, key=lambda a: a.start):
        if a.task not in pending:
            continue
        key = (a.task, a.technique, a.devices, kinds.get(a.node))
        if key not in seconds:  # the task's option of no kind, if it has one
            key = (a.task, a.technique, a.devices, None)
        if key not in seconds:
            return None
        devices = [(a.node, d) for d in a.device_ids]
        start = max([at + release[a.task], *(free.get(d, at) for d in devices)])
        finish = start + seconds[key]
        for d in devices:
            free[d] = finish
        end = max(end, finish)
        covered.add(a.task)
    return end if covered == pending else None
