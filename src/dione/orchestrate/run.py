"""The run loop: profile, plan, execute the plan as gangs in slices, re-plan.

    profile (catalog) -> problem -> plan -> launch each assignment when its devices are
    free, in each device's planned order -> at every slice end (and every
    ``replan_interval`` seconds) re-plan the remaining work from measured speeds and
    adopt the new plan when it finishes earlier by more than ``replan_margin``.

Everything that matters lives in the run directory: the run store (slices, metrics,
checkpoints), ``run.json`` (how the run was started, for ``dione resume``), every plan
adopted (``plans/``); ``dione.report.write_report`` draws the report from them (``dione
run`` and ``dione.run()`` do once the loop ends). Killing the process loses no step before each
task's last checkpoint; running it again (``dione resume``) continues from there.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dione.launch.local import LOCAL, Launcher, warm_up, warm_up_free
from dione.orchestrate.additions import TaskInbox
from dione.orchestrate.options import RunDirError, RunEvent, RunOptions, claim_run_dir
from dione.orchestrate.plans import read_plans
from dione.orchestrate.records import RunState
from dione.orchestrate.runner import Runner
from dione.profile.catalog import Catalog
from dione.profile.profiler import profile_workload
from dione.profile.results import ProfileEvent
from dione.spec.cluster import Cluster, ClusterError
from dione.spec.task import Task
from dione.spec.validate import Problem
from dione.state.store import STORE_FILE, RunStore
from dione.state.summaries import best_kept, exactness_of, leaderboard, summaries

__all__ = ["RunDirError", "RunEvent", "RunOptions", "RunResult", "TaskResult", "claim_run_dir",
           "run_workload"]


_T = TypeVar("_T")

@dataclass
class TaskResult:
    """How one task ended: what trained it (``techniques`` in turn, each on
    ``devices[i]`` devices: counts, not device ids), its final loss, metrics and
    checkpoint."""

    task: str
    status: str  # done | stopped | failed | diverged | pending | paused (at a rung)
    techniques: list[str] = field(default_factory=list)
    # The device count each of ``techniques`` trained on, in turn (not device ids: the
    # report names those, as node:ids).
    devices: list[int] = field(default_factory=list)
    seconds: float = 0.0
    steps: int = 0
    total_steps: int = 0
    final_loss: float | None = None
    evaluation: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    error: str | None = None
    # How the steps that did not train as single would trained (empty: every step did).
    inexact: list[str] = field(default_factory=list)
    # How the steps that trained as single would in distribution only did (dropout).
    statistical: list[str] = field(default_factory=list)
    # The step ``evaluation`` is from (None: none): before ``steps`` where a later
    # evaluation failed or it ended between evaluations; its checkpoint is at ``steps``.
    evaluated_at: int | None = None
    # With keep_best: the step where its metric was best, and the checkpoint kept there
    # (``dione.load(..., best=True)`` loads it).
    best_step: int | None = None
    best_checkpoint: str | None = None
    # The task's hyperparameters (``grid``'s axes), as the leaderboards show them.
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    # The run directory its history is read from, when asked for.
    run_dir: Path | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def losses(self) -> list[tuple[int, float]]:
        """(step, loss) of every step it trained, as Optuna's intermediate values or a Ray
        Tune result's metrics; read from the run directory when first asked for (a
        sweep of long tasks held every step of every task in memory)."""
        return self._history(lambda store: store.losses(self.task), [])

    @functools.cached_property
    def evaluations(self) -> dict[str, list[tuple[int, float]]]:
        """Per metric, (step, value) of every evaluation, read as ``losses`` is."""
        return self._history(lambda store: store.evaluations(self.task), {})

    def _history(self, read: Callable[[RunStore], _T], none: _T) -> _T:
        """What ``read`` finds in the run's store (``none`` for a result made by hand);
        a run directory moved or deleted since is said, not read as no history. (Not in
        ``dataclasses.asdict``; what a later session of the run added is read too.)"""
        if self.run_dir is None:
            return none
        if not (self.run_dir / STORE_FILE).is_file():
            raise FileNotFoundError(
                f"task {self.task!r}'s history is read from its run directory "
                f"{self.run_dir}, which holds no run store now (moved or deleted): read it "
                "before moving the directory, or give the new place (dataclasses.replace("
                "result, run_dir=NEW))")
        with RunStore(self.run_dir) as store:
            return read(store)

    @property
    def exactness(self) -> str:
        return exactness_of(self.inexact, self.statistical)

    @property
    def evaluated_before(self) -> bool:
        """Whether ``evaluation`` is of weights before those it trained to."""
        return self.evaluated_at is not None and self.evaluated_at < self.steps


@dataclass
class RunResult:
    """A finished run: per task its result; the makespan planned first and measured."""

    run_dir: Path
    tasks: list[TaskResult]
    makespan: float
    planned_makespan: float
    plans_adopted: int
    profile_seconds: float
    # Tasks left out, and why: invalid, or changed since the run recorded them.
    invalid: list[str] = field(default_factory=list)
    slices: int = 0  # launched in this session
    replans: int = 0  # re-plans solved beside execution (the first plan not counted)
    replan_seconds: float = 0.0  # their solver time, beside execution
    # Metric -> "min"/"max", as the run's stopping rules or Optuna study judge them.
    directions: dict[str, str] = field(default_factory=dict)
    # How far the first plan counted its tasks (``AdoptedPlan.horizon``): its makespan is
    # the sweep's end only where this is "full".
    planned_horizon: str = "full"

    def task(self, name: str) -> TaskResult:
        """The result of task ``name`` (KeyError naming the tasks there are)."""
        found = next((t for t in self.tasks if t.task == name), None)
        if found is None:
            raise KeyError(f"the run has no task {name!r}; its tasks: "
                           + (", ".join(t.task for t in self.tasks) or "none"))
        return found

    def leaderboard(self, metric: str) -> list[TaskResult]:
        """These results ranked by ``metric``, best first, as the report's leaderboard
        ranks them: those trained to their end, then those that did not (stopped at a
        rung, failed or interrupted on the way: their value is of that step; the report
        lists a failed one unranked, at its place). Lower or
        higher is better as the run's stopping rule or Optuna study has it, else as the
        name says (loss, error: lower). Left out: a diverged task, and a done one whose
        last evaluation failed (its value would be of earlier weights than it exports).
        The results as the run ended: a later session's are in its own result."""
        seen = sorted({m for t in self.tasks for m in t.evaluation})
        if metric not in seen:
            raise ValueError(f"no task of run {self.run_dir} has a value of {metric!r}; "
                             f"its metrics: {', '.join(seen) or 'none (no task evaluated)'}")
        return leaderboard(self.tasks, metric, self.directions)

    def best(self, metric: str) -> TaskResult | None:
        """The report's rank 1 of ``leaderboard(metric)``: its first task that did not
        fail (None: no task is ranked); check its ``status``: it did not train to its end
        only where no task that did has a value."""
        return next((t for t in self.leaderboard(metric) if t.status != "failed"), None)


def _results(tasks: Sequence[Task], run_dir: Path) -> list[TaskResult]:
    with RunStore(run_dir) as store:
        recorded = {s.task: s for s in summaries(store, [t.name for t in tasks])}
        best = {t.name: found[0] for t in tasks if not isinstance(
            found := best_kept(store, t.name, (t.keep_best, t.best_mode())), str)}
    return [TaskResult(
        task=s.task, status=s.status, techniques=s.techniques, devices=s.device_counts,
        seconds=s.seconds, steps=s.steps, total_steps=s.total_steps, final_loss=s.final_loss,
        evaluation=s.evaluation, checkpoint=s.checkpoint, error=s.error, inexact=s.inexact,
        statistical=s.statistical, evaluated_at=s.evaluated_at,
        best_step=best[t.name].step if t.name in best else None,
        best_checkpoint=best[t.name].path if t.name in best else None,
        hyperparameters=dict(t.hyperparameters), run_dir=run_dir.resolve())
        if (s := recorded.get(t.name)) is not None else TaskResult(
            t.name, "pending", hyperparameters=dict(t.hyperparameters),
            run_dir=run_dir.resolve())
        for t in tasks]


def _recorded_makespan(run_dir: Path) -> float:
    """A run that had nothing left to train (resumed once done): from its start (its
    first plan's clock, or its first slice) to its last slice's end, as the store and
    the plans have them (this session's clock saw none of it), as the report says it."""
    with RunStore(run_dir) as store:
        done = [s for s in store.slices() if s.status == "done" and s.ended_at is not None]
    if not done:
        return 0.0
    starts = [p.clock_zero for p in read_plans(run_dir)] + [s.started_at for s in done]
    return max(s.ended_at or 0.0 for s in done) - min(starts)


def run_workload(
    tasks: Sequence[Task],
    cluster: Cluster,
    run_dir: str | Path,
    options: RunOptions | None = None,
    *,
    on_event: Callable[[RunEvent], None] | None = None,
    on_profile_event: Callable[[ProfileEvent], None] | None = None,
    view: Callable[[RunState], None] | None = None,
    launcher: Launcher | None = None,
    inbox: TaskInbox | None = None,
    invalid: Sequence[Problem] = (),
) -> RunResult:
    """Train every task to its end as early as possible; resumes what ``run_dir`` holds.
    ``launcher``: what runs the gangs (default: this machine's warm workers, which take
    a cluster of one node; a cluster of several needs a RayLauncher). ``inbox``: tasks
    added while it runs (it then ends once the inbox is closed and every task ended);
    ``dione add``'s requests are taken either way. ``invalid``: the problems of the
    workload's tasks validation refused, kept in the run store for its status and report.
    The result covers every task the run took, added ones after the others."""
    options = options or RunOptions()
    run_dir = Path(run_dir)
    if launcher is None:
        if len(cluster.nodes) > 1:
            raise ClusterError(
                f"a cluster of {len(cluster.nodes)} nodes needs Ray to reach them: run with "
                "--ray ADDRESS (Python: dione.run(..., ray=ADDRESS)); without Ray, dione "
                "trains on this machine only, as one node")
        launcher = LOCAL
    if len(cluster.nodes) > 1 and options.storage is None and on_event is not None:
        # Each node writes its checkpoints where it runs: a task moved to another node
        # resumes only where the run directory is one folder they all share (review).
        on_event(RunEvent("storage_unset", f"{len(cluster.nodes)} nodes and no --storage "
                          f"(storage=): each node writes checkpoints into {run_dir} as it "
                          "sees it, so a task resumes on another node only where that "
                          "folder is shared by them all (NFS, a shared volume); else give "
                          "--storage a shared folder"))
    with claim_run_dir(run_dir):
        with RunStore(run_dir) as store:  # this start's: a task fixed since is not listed
            _storage_there(store, options.storage)
            store.set_invalid(invalid_by_task(invalid))
        return _run_claimed(tasks, cluster, run_dir, options, on_event, on_profile_event, view,
                            launcher, inbox)


def _storage_there(store: RunStore, storage: str | None) -> None:
    """Refuse a run whose checkpoints were written to ``storage`` (``--storage``) while
    that folder is not there (unmounted, moved): it was made again, empty, and a later
    mount or move back nested the checkpoints under it (review)."""
    if storage is None or Path(storage).exists():
        return
    root = Path(storage).resolve()
    if any(Path(c.path).resolve().is_relative_to(root)
           for t in store.tasks() for c in store.checkpoints(t.name)):
        raise RunDirError(f"the run's checkpoints are in its storage {storage}, which is "
                          "not there (not mounted, or moved): mount it or put it back, "
                          "then go on; to train anew, use a new run directory")


def _free_nodes(launcher: Launcher, cluster: Cluster,
                emit: Callable[[RunEvent], None]) -> tuple[Cluster, list[str]]:
    """The cluster's nodes whose devices the launcher could reserve, warmed (the
    profile's trials and the run's slices start on warm workers), and the names of the
    others, each held by another job and said, to join the run once its devices are
    free (a run stopped at its start with free nodes beside it, a review)."""
    warm, busy = warm_up_free(launcher, cluster.nodes)
    for err in busy:
        emit(RunEvent("node_busy", f"{err}; the run goes on without node {err.node}, "
                      "which joins it at a re-plan once Ray grants its devices"))
    return (Cluster(warm) if busy else cluster), [err.node for err in busy]


def invalid_by_task(invalid: Sequence[Problem]) -> dict[str, list[str]]:
    """Validation's problems as the run store keeps them: by task, each "field: why"."""
    refused: dict[str, list[str]] = {}
    for problem in invalid:
        # Not "workload" for a task of no name: a task of that name read as refused.
        name = ("(the workload)" if problem.task is None
                else problem.task or "(a task with no name)")
        refused.setdefault(name, []).append(f"{problem.field}: {problem.message}")
    return refused


def _run_claimed(
    tasks: Sequence[Task], cluster: Cluster, run_dir: Path, options: RunOptions,
    on_event: Callable[[RunEvent], None] | None,
    on_profile_event: Callable[[ProfileEvent], None] | None,
    view: Callable[[RunState], None] | None, launcher: Launcher, inbox: TaskInbox | None,
) -> RunResult:
    emit = on_event or (lambda event: None)
    began = time.perf_counter()
    cluster, awaited = _free_nodes(launcher, cluster, emit)
    with RunStore(run_dir) as store:  # `dione status` says so meanwhile
        store.set_profiling(len(tasks))
    try:
        with Catalog(options.catalog) as catalog:
            profile = profile_workload(tasks, cluster, catalog, options=options.trial,
                                       reprofile=options.reprofile,
                                       budget=options.profile_budget,
                                       on_event=on_profile_event, launcher=launcher,
                                       storage=options.storage)
    finally:
        with RunStore(run_dir) as store:
            store.set_profiling(None)
    profile_seconds = time.perf_counter() - began
    emit(RunEvent("profiled", f"{profile.trials_run} trial(s) run, {profile.trials_cached} "
                  f"taken from the catalog, in {profile_seconds:.0f} s"))
    runner = Runner(tasks, cluster, run_dir, profile, options, emit, view or (lambda s: None),
                    launcher, inbox=inbox, awaited=awaited)
    warm_up(launcher, runner.cluster.nodes)  # workers a trial ended are started again
    try:
        runner.run()
    finally:
        runner.store.close()
    makespan = runner.now() if runner.slices_launched else _recorded_makespan(run_dir)
    emit(RunEvent("finished", f"makespan {makespan:.1f} s"))
    taken = [r.task for r in runner.state.records.values()]  # with those added
    with RunStore(run_dir) as store:
        directions = store.directions()
    return RunResult(run_dir.resolve(), _results(taken, run_dir), makespan,
                     runner.first_planned or 0.0, runner.plans_adopted, profile_seconds,
                     slices=runner.slices_launched, replans=runner.replanner.solves,
                     replan_seconds=runner.replanner.seconds, directions=directions,
                     planned_horizon=runner.first_horizon,
                     invalid=list(runner.changed.values()))
