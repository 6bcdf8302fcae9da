"""One session of a run: launch planned slices as gangs, watch them, re-plan beside them.

Each assignment starts when its devices are free, in each device's planned order; a
gang runs in a thread of its own (``launching``), so several train at once. At slice
ends, on drift and every ``replan_interval`` seconds the remaining work is planned again
beside execution (``replanning``), from the estimates (``estimates``) and over the nodes
alive then: a lost node leaves the plan, one that joined (Ray) enters it. A slice that
runs far past its prediction is reported, then cancelled and retried. Each task's
state is one record (``records``); the clock is the process's (``dione.clock``), so
the same loop runs a simulated cluster.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from shlex import quote

from dione import clock
from dione.launch.local import GangInterrupted, Launcher
from dione.launch.slice import DIVERGED_ADVICE, STALLED, SliceError, SliceResult
from dione.orchestrate.additions import Intake, Profiling, TaskInbox, request_message
from dione.orchestrate.estimates import Estimates, planning_nodes
from dione.orchestrate.launching import SliceLaunching, SliceStarter, launchable
from dione.orchestrate.options import RunDirError, RunEvent, RunOptions
from dione.orchestrate.plans import (
    AdoptedPlan,
    horizon_said,
    next_plan_file,
    plan_files,
    write_plan,
)
from dione.orchestrate.records import RunningSlice, RunState, TaskRecord, TaskStatus
from dione.orchestrate.replanning import (
    PlanCandidate,
    Replanner,
    retimed_end,
    solve_or_fall_back,
)
from dione.plan.plan import Assignment
from dione.plan.problem import Busy, PlanningProblem
from dione.profile.results import (
    Profile,
    ProfiledOption,
    evaluation_mistake,
    remembered_mistake,
)
from dione.spec.cluster import Cluster, ClusterError, Node
from dione.spec.evaluated import judging_failed_evaluation
from dione.spec.metrics import doubtful_direction
from dione.spec.settings import (
    SAID_SETTINGS,
    kept_as_recorded,
    model_shapes,
    read_changes,
    training_settings,
)
from dione.spec.stopping import (
    Decision,
    StoppingRule,
    legacy_rule_key,
    rule_key,
    too_few_sharing,
)
from dione.spec.task import Task
from dione.spec.validate import keep_best_doubts, late_evaluation, rule_cadence_doubt
from dione.state.checkpoint import (
    CheckpointError,
    file_times,
    quarantine,
    verify_checkpoint,
)
from dione.state.disk import DiskFull
from dione.state.store import EVALUATION_FAILED, CheckpointRecord, RunStore
from dione.state.summaries import error_line, exception_line
from dione.techniques.registry import get_technique
from dione.words import some

__all__ = ["Runner"]

# How often the loop looks at its gangs when none ends (seconds); on a virtual clock,
# where only events move anything, the loop needs fewer turns between them.
TICK = 1.0
VIRTUAL_TICK = 30.0
# What a re-plan's solve is counted at on a virtual clock, per unit of CP-SAT's
# deterministic time it spent (measured: about 5 s of one thread), so that the
# re-planning budget holds in a simulation without reading the wall clock.
VIRTUAL_SECONDS_PER_UNIT = 5.0
# Owed re-plans (a stop freed devices) are solved at once whatever the budget: by the
# run's solver while they have taken at most this share of the run's time so far, then
# by greedy (a simulated sweep's, at 5 s a unit, stay far below it).
OWED_SHARE = 0.25

ENDED = ("done", "stopped", "diverged")  # a task of these statuses never trains again

# How a run whose task failed for a fixable cause goes on, from each way of starting it.
_RESUME = ("`dione resume` the run (from Python: dione.run again; dione.optuna: optimize "
           "again with retry_failed=True)")


class Runner:
    """One session of a run: executes and re-plans until every task has ended."""

    def __init__(self, tasks: Sequence[Task], cluster: Cluster, run_dir: Path,
                 profile: Profile, options: RunOptions,
                 on_event: Callable[[RunEvent], None], view: Callable[[RunState], None],
                 launcher: Launcher, *, launching: SliceStarter | None = None,
                 virtual: bool = False, inbox: TaskInbox | None = None,
                 awaited: Sequence[str] = ()) -> None:
        """``launching``: what starts slices (default: gangs on ``launcher``); ``virtual``:
        the run is simulated on a virtual clock (``dione.simulate``), so every solve runs at
        once on one thread within a deterministic time, and no rule reads solve times: the
        same inputs give the same plans. ``inbox``: tasks a caller adds while it runs
        (``dione add``'s requests in the store are taken either way). ``awaited``: nodes
        left out of ``cluster`` while another job holds their devices, which join the run
        once ``launcher.alive_nodes`` lists them."""
        self.cluster = cluster
        # Every node's kind, those lost too (a slice there may still end well).
        self.node_kinds = {n.name: n.model for n in cluster}
        self.launcher = launcher
        self.run_dir = run_dir
        self.profile = profile
        self.options = options
        self.emit = on_event
        self.view = view
        self.store = RunStore(run_dir)
        self.store.recover_interrupted()
        self.virtual = virtual
        # What a warning questioned once: rules' directions, keep_best doubts, and the
        # tasks whose slices' evaluations lacked their keep_best metric.
        self._doubted: set[str | tuple[str, ...] | tuple[str, str, int]] = set()
        # id -> (rule, its key when the run first saw it): ``_rule_key``.
        self._rule_keys: dict[int, tuple[object, str]] = {}
        edited = self._edited_rule(tasks)
        if edited:
            self.store.close()
            raise RunDirError(edited)
        records = {}
        changed: dict[str, str] = {}
        for task in tasks:
            try:
                records[task.name] = self._record(task)
            except ValueError as err:  # the store knows it with other training
                changed[task.name] = str(err)
        if changed and not records:  # nothing left to run: the command's error
            self.store.close()
            raise RunDirError(next(iter(changed.values())))
        if changed:
            # That task alone is left as it was, invalid this session: one edited task
            # kept every other from resuming (a review).
            self.store.set_invalid({**self.store.invalid(),
                                    **{name: [why] for name, why in changed.items()}})
            for name, why in changed.items():
                self.emit(RunEvent("task_refused", f"{name}: not trained this session: "
                                   f"{why}", name))
        tasks = [t for t in tasks if t.name not in changed]
        self.changed = changed  # task -> why it was left out (the result's ``invalid``)
        self.state = RunState(records, [], clock_zero=clock.now())
        # From the store's decisions (a resumed run decides as the uninterrupted one
        # would): who was judged at each rung of each rule, with what value, in the order
        # they came, (rule, step) -> {task: value} (a synchronous rung's cohort is these
        # and the tasks waiting there); and each task's own values at its rungs, in order
        # (Patience, Median).
        self.judged: dict[tuple[str, int], dict[str, float]] = {}
        self.curves: dict[tuple[str, str], list[float]] = {}
        self.waiting: dict[tuple[str, int], dict[str, float]] = {}
        self.rules: set[str] = set()
        # (node, exception line) -> {task: run-clock time it raised it there}, and when
        # each node last ended a slice well: two tasks failing alike on a node that has
        # trained nothing since show the node at fault (``_shunned``).
        self.raised_on: dict[tuple[str, str], dict[str, float]] = {}
        self.stalls_own: set[str] = set()  # tasks that stalled on two nodes: their own
        self.trained_on: dict[str, float] = {}
        self._read_decisions(tasks)
        self.estimates = Estimates.of_run(profile, self.store)
        # Nodes this run has known: another that the launcher reports later joined.
        self.known = {n.name for n in [*cluster, *(launcher.alive_nodes() or [])]
                      if n.name not in awaited}
        # The run's own nodes, busy at its start: they join as soon as they are free,
        # --no-replan or not (it keeps the nodes the run started with: a review).
        self.awaited = set(awaited)
        self.unused_joins: dict[str, Node] = {}  # nodes that joined under --no-replan
        # task -> per kind of node its options are for (None: any), the fewest devices
        self._fewest: dict[str, dict[str | None, int]] = {}
        self.plans_adopted = len(plan_files(run_dir))
        self.first_planned: float | None = None
        self.first_horizon = "full"  # how far the first plan counted its tasks
        self.first_solve_seconds = 0.0  # the first plan's solve, on every core
        self.first_solve_units = 0.0  # its CP-SAT deterministic time (virtual runs)
        self.slices_launched = 0  # in this session
        self._beat = self.store.beat_every()  # the store hears this launcher lives
        self.tick = VIRTUAL_TICK if virtual else TICK
        self.replanner = Replanner(options.solver, options.replan_time_limit,
                                   beside=not virtual, deterministic=virtual)
        self.launching: SliceStarter = launching or SliceLaunching(
            launcher, run_dir, options.storage, options.timeout)
        # A simulated run has no one to add tasks: its inputs are fixed.
        self.intake = None if virtual else Intake(self.store, inbox, Profiling(
            options.catalog, options.trial, launcher, options.storage))
        self._say_left_out(tasks)
        self._say_too_few(tasks)

    def _say_too_few(self, tasks: Sequence[Task]) -> None:
        """A rule that compares tasks, shared by too few of them to stop any: said once
        (each rung still cuts a slice; a review's one-task sweep paid for nothing)."""
        for lonely, names in too_few_sharing(tasks, self._rule_key):
            self.emit(RunEvent("stopping_rule_doubtful", f"{', '.join(names)}: {lonely}",
                               names[0]))

    def _say_too_few_added(self, added: set[str]) -> None:
        """As ``_say_too_few``, for tasks added to the live run: a rule of theirs shared
        by too few of the run's tasks, said once a rule (a run started so said it, an
        addition did not: a review)."""
        every = [r.task for r in self.state.records.values()]
        for lonely, names in too_few_sharing(every, self._rule_key) if added else ():
            rule = self._rule_key(self.state.records[names[0]].task.stopping)
            if added & set(names) and ("few", rule) not in self._doubted:
                self._doubted.add(("few", rule))
                self.emit(RunEvent("stopping_rule_doubtful", f"{', '.join(names)} (added "
                                   f"to the run): {lonely}", names[0]))

    def _say_left_out(self, tasks: Sequence[Task]) -> None:
        """Tasks of the run, not ended, that the workload given no longer defines (a
        resume with another file): left as they are, and said (they were dropped, the
        command said nothing and exited 0: review)."""
        # Those validation refused are given too, and said as invalid (they read as not
        # in the workload, with another workload as the fix: a review).
        given = {t.name for t in tasks} | set(self.store.invalid()) | {
            n for a in self.store.additions("waiting", "taken") for n in a.names}
        absent = [t for t in self.store.tasks() if t.name not in given
                  and t.status not in ("done", "stopped", "diverged", "failed", "invalid")]
        if absent:
            listed = some([f"{t.name} ({t.status})" for t in absent], 5)
            self.emit(RunEvent("task_left_out", f"{len(absent)} task(s) of the run are not in "
                               f"the workload given and are left as they are, untrained: "
                               f"{listed}; give the workload that defines them "
                               "(`dione resume RUN_DIR --workload FILE`) to train them", None))

    def _rule_key(self, rule: object) -> str:
        """``rule_key`` of ``rule`` as it was when the run first saw it: a rule that
        learns from the tasks that ended (its ``ended`` hook) in attributes keeps its key
        through the run (it changed at each end: the rule's later tasks were judged as
        the first at their rungs: a review). Per run, not per process: a rule edited
        between two runs in one process is seen edited (a regression review)."""
        known = self._rule_keys.get(id(rule))
        if known is None or known[0] is not rule:
            known = self._rule_keys[id(rule)] = (rule, rule_key(rule))
        return known[1]

    def _read_decisions(self, tasks: Sequence[Task]) -> None:
        """The store's decisions of the stopping rules of ``tasks`` not read before. A run
        of the version before keyed them by ``legacy_rule_key``, which one text may give
        rules that differ (a class of no repr: its address stripped), so those are read
        for the tasks under the rule only, before its own (they were made before)."""
        under: dict[str, tuple[str, set[str]]] = {}
        for task in tasks:
            if task.stopping is not None:
                legacy, names = under.setdefault(self._rule_key(task.stopping),
                                                 (legacy_rule_key(task.stopping), set()))
                names.add(task.name)
        for rule, (legacy, names) in under.items():
            if rule in self.rules:
                continue
            self.rules.add(rule)
            before = [d for d in self.store.decisions({legacy}) if d[0] in names] \
                if legacy != rule else []
            for name, step, value, _, _ in [*before, *self.store.decisions({rule})]:
                self.curves.setdefault((rule, name), []).append(value)
                self.judged.setdefault((rule, step), {})[name] = value

    def _edited_rule(self, tasks: Sequence[Task]) -> str | None:
        """Why the run cannot go on where a task its rule judged has another rule now, one
        the store holds none of its decisions under (None: none has). The whole run, not
        the task alone: a rule judges its tasks together, and a resume under an edited
        one (eta 2 -> 4) judged its rungs anew from nothing and stopped the sweep's best
        after one comparison (a review). A rule taken off judges nothing: not refused."""
        edits: dict[tuple[str, str], list[str]] = {}
        for task in tasks:
            if task.stopping is None:
                continue
            now = self._rule_key(task.stopping)
            before = self.store.decided_rules(task.name)
            if before and not {now, legacy_rule_key(task.stopping)} & before:
                edits.setdefault((" or ".join(sorted(before)), now), []).append(task.name)
        if not edits:
            return None
        changes = "; ".join(f"{some(names, 4)}: {before} -> {now}"  # each (a review)
                            for (before, now), names in edits.items())
        return (f"the stopping rule changed since the run judged by it ({changes}): the "
                "run's decisions so far were made under the recorded rule, and another "
                "would judge its rungs from nothing; put the rule back to resume the run, "
                "or train under the new one in a new run directory (a rule of your own "
                "that did not change: give it a repr the same in every process)")

    def _record(self, task: Task, settle: bool = True) -> TaskRecord:
        """A task as the store has it: registered, trained to its latest checkpoint;
        (with ``settle``) ended where profiling found no way to train it."""
        total = self.profile.task(task.name).total_steps
        settings = training_settings(task)
        # Built by validation already, here as there; a simulated task has no model (and
        # a simulation no torch).
        shapes = None if self.virtual else model_shapes(task)
        if shapes is not None:  # one that cannot be built here is left to its slices
            settings["model"] = shapes
        before = self.store.task(task.name)
        ended = before.status if before is not None and before.status in ENDED else None
        resumed = self.store.latest_checkpoint(task.name) is not None
        for said in read_changes(task.name, self.store.changed_settings(task.name, settings),
                                 ended, resumed):
            self.emit(RunEvent("training_changed", said, task.name))  # a number it reads
        # Where no step reads the new value, the old stays recorded, and is said again.
        self.store.register_task(task.name, total, task.batch_size, task.hyperparameters,
                                 settings, said_only=SAID_SETTINGS,
                                 kept=kept_as_recorded(ended is not None, resumed))
        rule = task.stopping
        if rule is not None and rule.metric != "loss":  # the leaderboards rank by it
            self.store.add_directions({rule.metric: rule.mode})
            doubt = doubtful_direction(rule.metric, rule.mode, rule.mode_fix)
            key = self._rule_key(rule)
            if doubt and key not in self._doubted:  # once a rule, not once a task
                self._doubted.add(key)
                self.emit(RunEvent("stopping_rule_doubtful", f"{task.name} (and the tasks "
                                   f"that share its rule): {doubt}", task.name))
        idle = rule.never_stops(total) if rule is not None else None
        if idle and ("idle", self._rule_key(rule), total) not in self._doubted:  # once
            self._doubted.add(("idle", self._rule_key(rule), total))
            self.emit(RunEvent("stopping_rule_doubtful", f"{task.name} (and the tasks of "
                               f"its length that share its rule): {idle}", task.name))
        for late in (late_evaluation(task, total), rule_cadence_doubt(task)):
            if late:
                self.emit(RunEvent("eval_every_doubtful", f"{task.name}: {late}", task.name))
        for doubt in keep_best_doubts(task, total):  # once a doubt: a sweep's tasks share it
            if doubt not in self._doubted:
                self._doubted.add(doubt)
                self.emit(RunEvent("keep_best_doubtful", f"{task.name} (and any task alike): "
                                   f"{doubt}", task.name))
        latest = self.store.latest_checkpoint(task.name)
        done = latest.step if latest else 0
        stored = self.store.task(task.name)
        marked_done = stored is not None and stored.status == "done"
        if marked_done and latest is not None:
            done = self._final_checkpoint(task.name, latest, total)
        elif marked_done and self.store.checkpoints(task.name):
            fix = ("its --storage not mounted? Mount it and resume" if
                   self.store.checkpoints_elsewhere(task.name) else "deleted")
            self.emit(RunEvent("checkpoint_missing", f"{task.name}: done, but none of its "
                               f"checkpoints is on disk ({fix}): kept done, its weights out "
                               "of reach; else train it anew in a new run directory",
                               task.name))
        slices = self.store.slices(task.name)
        status = TaskStatus.PENDING
        # (Done with no checkpoint on disk at all: kept done, not trained from scratch
        # unasked; a --storage not mounted looks so.)
        if done >= total or (marked_done and latest is None):
            status = TaskStatus.DONE
        elif stored is not None and stored.status == "stopped":
            status = TaskStatus.STOPPED  # its rule stopped it: it never trains again
        elif stored is not None and stored.status == "diverged":
            group = self.profile.task(task.name).group
            if slices or any(
                    p.group == group and p.task != task.name for p in self.profile.tasks):
                # Training it on would repeat the divergence: the user must change it.
                # (One that shares its trials with others, a sweep's rate among rates,
                # would take theirs, which say nothing of its own: kept so.)
                status = TaskStatus.DIVERGED
            else:
                # Diverged in its profiling trial, no step trained, and no other task's
                # trial stands for it: the trial it has now judges it (a loss or data
                # fixed since: a resume profiled it again, the trial passed, and it
                # stayed diverged; unchanged, its trial diverges again, never cached).
                self.store.set_task_status(task.name, "pending")
        inexact = any(s.status in ("done", "diverged") and s.inexactness is not None
                      for s in slices)
        record = TaskRecord(task, total, done, status, inexact=inexact)
        if settle:
            self._settle_profiled(record)
        return record

    def _final_checkpoint(self, name: str, latest: CheckpointRecord, total: int) -> int:
        """The step a done task's weights are kept at: its final checkpoint's, where that
        is on disk and intact; else (deleted, or changed since: it was exported and
        evaluated as it was, or an older one as the trained model, unsaid, and a resume
        left it so: review) the newest intact one's, the bad one set aside and the task
        pending again, to train its last steps anew."""
        found: CheckpointRecord | None = latest
        if latest.step < total:
            why = "no longer on disk"
        else:
            files = file_times(latest.path)
            if self.store.verified_checkpoints().get(latest.path) == files:
                return latest.step  # read whole before, unchanged since: not read again
            try:
                verify_checkpoint(latest.path)
                self.store.keep_verified(latest.path, files)
                return latest.step
            except CheckpointError as err:
                moved = quarantine(latest.path) if Path(latest.path).is_dir() else None
                self.store.forget_checkpoints(name, [latest.path])
                why = f"not to be trusted ({err}){f'; moved to {moved}' if moved else ''}"
                found = self.store.latest_checkpoint(name)
        step = found.step if found is not None else 0
        self.store.set_task_status(name, "pending")
        self.emit(RunEvent("checkpoint_quarantined", f"{name}: done, but its final "
                           f"checkpoint (step {total}) is {why}: its steps from {step} "
                           "train again", name))
        return step

    def _settle_profiled(self, record: TaskRecord) -> None:
        """What a pending task's profile says before it trains: failed where its trial's
        evaluation lacks its rule's metric (an evaluation that failed is said); where no
        option fits, diverged if a trial's loss did (it would again, under any exact
        technique: the user must change it; a sweep's searcher proposes it no more),
        else failed with every trial's reason."""
        profile = self.profile.task(record.name)
        if record.status != TaskStatus.PENDING:
            return
        mistake = evaluation_mistake(record.task, profile.evaluated)
        if mistake is not None:  # named now, not at the first rung
            self._give_up(record, mistake, f"{record.name}: {mistake}")
            return
        doubt = None if profile.evaluated is not None else remembered_mistake(
            record.task, profile.cached_metrics)
        if doubt is not None:  # evaluate may have changed since: said, not failed
            self.emit(RunEvent("evaluation_doubtful", f"{record.name}: {doubt}", record.name))
        if profile.evaluated is not None and profile.evaluated.error:
            last = profile.evaluated.error.strip().splitlines()[-1]
            unjudged = judging_failed_evaluation(record.task, last, "in its profiling trial")
            if unjudged is not None:  # it trained to its first rung, to fail there
                rule = record.task.stopping
                assert rule is not None
                why = f"{unjudged}, then {rule.retry} (nothing was trained)"
                self._give_up(record, why, f"{record.name}: {why}")
                return
            # Said now, not first at a rung or the end: its training stands either way.
            self.emit(RunEvent("evaluation_failed", f"{record.name}: its evaluation failed "
                               f"in its profiling trial ({last}): it will fail where the task "
                               "evaluates, its training kept; fix evaluate, then `dione "
                               "evaluate RUN_DIR` (from Python: dione.evaluate(run_dir)) "
                               "once the run ended records it at the "
                               "task's end (one at a rung is not run again: stop and resume "
                               "before it)",
                               record.name))
        # Diverged only where a trial ran as this very task: a task of its speed group
        # whose trials all diverged as others never ran (failed: a resume profiles it).
        diverged = [t for t in profile.trials if t.status == "diverged"
                    and record.name in t.extra.get("diverged_as", ())]
        if profile.options:
            # Its group's trial diverged as it, then fit as another task: under an exact
            # technique it would diverge under each (its first steps are single's), so
            # it is not launched to find that again.
            diverged = [t for t in (profile.diverged_trial,)
                        if t is not None and _exact(t.technique)]
            if not diverged:
                return
        if diverged and profile.error is None:
            trial = diverged[0]
            why = (trial.reason or "its loss was not finite").split(DIVERGED_ADVICE)[0]
            why = why.strip().splitlines()[-1]
            ran = trial.extra["diverged_as"]
            said = (f"diverged in its profiling trial ({trial.technique} x{trial.devices}"
                    + (f", which diverged as each of {', '.join(ran)}; the last: "
                       if len(ran) > 1 else "): ") + why
                    + "; it trained no step: fix what made it diverge (a learning rate, "
                    "a loss or data problem), then resume (which profiles it again where "
                    "it shares its trials with no other task) or train it under a new "
                    "name")
            record.status = TaskStatus.DIVERGED
            self.store.set_task_status(record.name, "diverged", said)
            self.emit(RunEvent("task_diverged", f"{record.name} {said}", record.name))
            self._ended(record, {})
            return
        others = sorted({n for t in profile.trials if t.status == "diverged"
                         for n in t.extra.get("diverged_as", ())})
        reason = profile.error or (
            f"no configuration could be timed: the trial it shares with {', '.join(others)} "
            "diverged as each of them (their learning rates) and was not run as this task: "
            "lower those rates, or leave those tasks out, then resume" if others
            else profile.why_no_option())
        self._give_up(record, reason, f"{record.name}: {reason}")

    # -- tasks added while it runs ---------------------------------------------------

    def take_additions(self) -> None:
        """Start profiling what was added since; add a profiled batch's tasks (a task the
        plan does not cover is owed a re-plan: the loop asks one)."""
        if self.intake is None:
            return
        self.intake.poll(self.state.records.keys(), self.cluster)
        arrival = self.intake.ready()
        if arrival is None:
            return
        if arrival.profile is not None:
            self.profile.tasks.extend(arrival.profile.tasks)
        self._read_decisions(arrival.tasks)
        # Taken by an earlier session of the run (a resume takes them again): said as such.
        again = {n for r in arrival.requests if r.state == "taken" for n in r.names}
        added: list[TaskRecord] = []
        for task in arrival.tasks:
            edited = self._edited_rule([task])  # as a resume is refused (a review)
            if edited:
                arrival.refused[task.name] = edited
                continue
            try:
                record = self.state.records[task.name] = self._record(task, settle=False)
            except ValueError as err:  # the store knows it with other training
                arrival.refused[task.name] = str(err)
                continue
            if self.changed.pop(task.name, None) is not None:  # given back as recorded:
                # no longer left as it was (it read so after it trained: a review)
                left = self.store.invalid()
                left.pop(task.name, None)
                self.store.set_invalid(left)
            added.append(record)
            # Only the inbox's own: a searcher reads a name there as its task taken, and
            # a `dione add` request's task of that name is not its (an Optuna trial whose
            # name an add had taken waited for ever, the run with it).
            if self.intake.inbox is not None and task.name in arrival.from_inbox:
                self.intake.inbox.taken[task.name] = task
            if task.name in again:
                self.emit(RunEvent("task_readded", f"{task.name}: taken again from its "
                                   "`dione add` request, as the run first took it", task.name))
                continue
            self.emit(RunEvent("task_added", f"{task.name}: added to the run "
                               f"({arrival.trials}); planned at the next re-plan", task.name))
        for record in added:  # said after it was added (it read failed, then added)
            self._settle_profiled(record)
        self._say_too_few_added({r.name for r in added})
        for name, why in arrival.refused.items():
            if self.intake.inbox is not None:
                try:
                    self.intake.inbox.refuse(name, why)
                except Exception as err:  # the caller's hook: the run goes on
                    why += f" (and the inbox's on_refused failed: {type(err).__name__}: {err})"
            self.emit(RunEvent("task_refused", f"{name}: not added: {why}",
                               name if name in self.state.records else None))
        for source, names in arrival.duplicates.items():
            for name, why in names.items():
                self.emit(RunEvent("task_refused", f"{name} (request {source}): not added "
                                   f"again: {why}"))
        for request in arrival.requests:
            state, message = request_message(request, arrival)
            if request.state == "taken" and state == "taken":
                continue  # an earlier session took it, and takes it again: its record stands
            if request.id in arrival.requests_refused and request.state != "refused":
                # Refused whole (its file failed to load): said once, traceback and all.
                self.emit(RunEvent("task_refused", f"request to add "
                                   f"{', '.join(request.names)} refused: {message}"))
            self.store.settle_addition(request.id, state, message)

    # -- the clock -------------------------------------------------------------------

    def now(self) -> float:
        """Seconds on the run clock (from this session's start)."""
        return clock.now() - self.state.clock_zero

    # -- estimates of what runs ------------------------------------------------------

    def predicted_slice_end(self, record: TaskRecord) -> float:
        """Run-clock time a running task ends its current slice: its pace so far times
        the steps left, plus the save (and evaluation, at the task's end) its trial
        measured."""
        running = record.running
        assert running is not None
        progress = self._progress(record)
        if progress is None:
            # No pace heard yet (a rank tells it from its second step, at most once a
            # second). Past its predicted end all that is known is that the slice runs
            # late, not by how much: expect it to run late as long again as it has so
            # far. Expecting it to end at once had plans queue work behind a slice held
            # on its first step while another device stood idle; expecting the whole
            # slice again released a task's later steps long after a slice a few percent
            # late had ended (a simulated sweep of 50 on 2 nodes: 25% longer).
            now = self.now()
            if now <= running.predicted_end:
                return running.predicted_end
            return now + max(0.0, now - running.began - running.predicted_seconds)
        step, pace, heard = progress
        option = self.profiled_option(running.assignment)
        tail = option.record.save_seconds if option is not None else 0.0
        if running.evaluates:
            tail += self.profile.task(record.name).evaluation_seconds
        return max(self.now(), heard + pace * (running.end_step - step)) + tail

    def _progress(self, record: TaskRecord) -> tuple[int, float, float] | None:
        """(steps done, seconds per step, run-clock time heard) of a running slice, as its
        ranks reported."""
        assert record.running is not None
        for said in list(record.running.progress.values()):
            if said.get("loss") is not None:
                record.last_loss = float(said["loss"])
        lead = record.running.progress.get(0)
        pace = None if lead is None else lead.get("seconds_per_step")
        if lead is None or pace is None:
            return None
        heard = float(lead.get("heard_at", clock.now())) - self.state.clock_zero
        return int(lead["step"]), float(pace), heard

    def _running_end(self) -> float:
        return max((self.predicted_slice_end(r) for r in self.state.records.values()
                    if r.running), default=0.0)

    # -- planning --------------------------------------------------------------------

    def problem(self) -> tuple[PlanningProblem, float]:
        """The remaining work as a planner problem, and the run-clock time it starts at.

        A running task holds its devices until its slice ends; the steps after it are
        planned anew, free to move (another technique, width or node) but released
        only then. Pinned to their devices for the whole task instead, as they were,
        running survivors of a sweep were never widened: each re-plan found its
        makespan fixed by another pinned narrow task, and every task was free only at
        its own slice ends (50 tasks under ASHA on 4 simulated nodes: 32% of the
        devices busy over the last half of the run)."""
        now = self.now()
        shunned = self._shunned()
        tasks = [replace(self.estimates.task_options(
            r.name, self.planned_steps(r, r.done_steps), r.done_steps > 0,
            self.planned_evaluations(r, r.done_steps), self.planned_restarts(r, r.done_steps)),
            priority=self.promotion_priority(r), avoid=self._avoided(r, shunned))
                 for r in self._pending_that_fit()]
        nodes = {n.name for n in self.cluster}
        busy = []
        for r in self.state.records.values():
            running = r.running
            if running is None or running.assignment.node not in nodes:
                continue  # a lost node's slices are ending
            a = running.assignment
            until = round(max(0.0, self.predicted_slice_end(r) - now), 3)
            if r.total > running.end_step:
                tasks.append(replace(self.estimates.task_options(
                    r.name, self.planned_steps(r, running.end_step), True,
                    self.planned_evaluations(r, running.end_step),
                    self.planned_restarts(r, running.end_step)), release=until,
                    priority=self.promotion_priority(r), avoid=self._avoided(r, shunned)))
            busy.append(Busy(r.name, a.node, a.device_ids, until))
        return PlanningProblem(planning_nodes(self.cluster), tuple(tasks), tuple(busy)), now

    def promotion_priority(self, record: TaskRecord) -> float:
        """How each plan favours the task (below 0, lower first; ``plan.favour``): under
        a pausing rule, as Li et al.'s ASHA hands out work, promotions before new
        configurations, from the highest rung down, and at a rung the best there first
        (a likely winner's long future starts sooner, and the next rung is reached best
        first, so fewer are promoted there for arriving early); under a rule that
        favours its tasks begun (``begun_first``), those, the furthest first; 0 for every
        other task."""
        rule = record.task.stopping
        if rule is not None and rule.begun_first and record.done_steps > 0:
            return -1.0 - record.done_steps / max(1, record.total)
        if rule is None or not rule.pausing:
            return 0.0
        passed = [step for step in rule.rungs(record.total) if step <= record.done_steps]
        values = self.judged.get((self._rule_key(rule), passed[-1]), {}) if passed else {}
        if record.name not in values:
            return 0.0
        own = values[record.name]
        better = sum(v < own if rule.mode == "min" else v > own for v in values.values())
        return -len(passed) + 0.999 * better / len(values)

    def horizon(self, records: Iterable[TaskRecord]) -> str:
        """How far a plan of ``records`` counts their steps: "full" where it counts every
        task to its end, else the stopping horizon that cut one short ("rung",
        "expected")."""
        for record in records:
            if record.status in (TaskStatus.PENDING, TaskStatus.RUNNING):
                horizon = self._horizon_of(record)
                done = record.done_steps
                # Past its last rung a task is planned to its end: no shorter horizon.
                if horizon != "full" and self.planned_steps(record, done) < record.total - done:
                    return horizon
        return "full"

    def _horizon_of(self, record: TaskRecord) -> str:
        """The stopping horizon the planner counts ``record``'s steps by."""
        rule = record.task.stopping
        horizon = self.options.stopping_horizon
        if horizon == "auto":
            horizon = "rung" if rule is not None and rule.pausing else "full"
        return "full" if rule is None else horizon

    def planned_steps(self, record: TaskRecord, done: int) -> int:
        """The steps after ``done`` the planner counts for a task: all of them; under
        ``stopping_horizon="expected"``, what its stopping rule leaves expected; under
        ``"rung"`` (and ``"auto"`` for a pausing rule), those to its next rung (all that
        are left after the last)."""
        rule, horizon = record.task.stopping, self._horizon_of(record)
        if rule is None or horizon == "full":
            return record.total - done
        if horizon == "rung":
            return (rule.next_rung(done, record.total) or record.total) - done
        return max(1, round(rule.expected_steps(done, record.total)))

    def planned_evaluations(self, record: TaskRecord, done: int) -> int:
        """The evaluations within the steps the planner counts after ``done``."""
        return record.evaluations(done, done + self.planned_steps(record, done))

    def planned_restarts(self, record: TaskRecord, done: int) -> int:
        """The slices that must end and start again within the steps the planner counts
        after ``done`` (at its evaluations and rungs, and every ``slice_steps``): each
        costs a slice's start. (Slices of ``slice_seconds``, whose steps differ by option,
        are not counted: by default each start is at most a twentieth of its slice.)"""
        # (`slice_steps` counted: a plan of 12 slices was the plan of one, 3.4 s for 8.9)
        return record.restarts(done, done + self.planned_steps(record, done),
                               self.options.slice_steps)

    def pinned_end(self, record: TaskRecord) -> float:
        """Run-clock time a running task ends if its later slices follow on its devices
        under its option."""
        running = record.running
        assert running is not None
        end = self.predicted_slice_end(record)
        after = record.total - running.end_step
        option = self.profiled_option(running.assignment)
        if after > 0 and option is not None:
            end += self.estimates.option_seconds(
                record.name, option, self.planned_steps(record, running.end_step), True,
                self.planned_evaluations(record, running.end_step),
                self.planned_restarts(record, running.end_step))
        return end

    def _lead(self) -> float:
        """How near its end a running slice's task is planned free to move: two solves,
        so that the plan is ready when the slice ends, and a turn of the loop."""
        return max(2 * self.expected_solve_seconds(), self.tick)

    def expected_solve_seconds(self) -> float:
        """The next re-plan's solve: the mean of those before (at first, the first
        plan's, at most the re-plan time limit); on a virtual clock, the same in CP-SAT's
        deterministic time, at VIRTUAL_SECONDS_PER_UNIT."""
        replanner = self.replanner
        if self.virtual:  # counted, not timed: the same inputs give the same re-plans
            units = (replanner.units / replanner.solves if replanner.solves
                     else min(self.first_solve_units, self.options.replan_time_limit))
            return VIRTUAL_SECONDS_PER_UNIT * units
        if replanner.solves:
            return replanner.seconds / replanner.solves
        return min(self.first_solve_seconds, self.options.replan_time_limit)

    def _pending_that_fit(self) -> list[TaskRecord]:
        """Pending tasks some node of the cluster can hold. Another one (its nodes were
        lost) waits out of the plan, in case a node that holds it joins (Ray)."""
        widest: dict[str | None, int] = {}  # per kind of node, and of all (None)
        for n in self.cluster:
            for kind in (None, n.model):
                widest[kind] = max(widest.get(kind, 0), n.devices)
        return [r for r in self.state.with_status(TaskStatus.PENDING)
                if any(widest.get(kind, 0) >= fewest
                       for kind, fewest in self._fewest_devices(r.name).items())]

    def _fewest_devices(self, task: str) -> dict[str | None, int]:
        """Per kind of node ``task``'s options are for (None: any node), the fewest
        devices one of them takes (asked at every turn of the loop for every pending
        task: 10% of a 1,000-task simulation's time, unkept)."""
        if task not in self._fewest:
            fewest: dict[str | None, int] = {}
            for o in self.profile.task(task).options:
                fewest[o.kind] = min(fewest.get(o.kind, sys.maxsize), o.devices)
            self._fewest[task] = fewest
        return self._fewest[task]

    def _avoided(self, record: TaskRecord, shunned: frozenset[str]) -> frozenset[str]:
        """The nodes of the cluster ``record``'s task avoids, while another node holds
        it (a suspect node beats none): those it failed on twice alike, and ``shunned``
        (``_shunned``)."""
        avoid = frozenset(n.name for n in self.cluster
                          if n.name in record.avoid or n.name in shunned)
        if not avoid:
            return frozenset()
        others = [n for n in self.cluster if n.name not in avoid]
        return avoid if any(self._holds(n, record.name) for n in others) else frozenset()

    def _steer_off(self, shunned: frozenset[str]) -> None:
        """Take out of the plan each pending task's assignment on a node it now avoids:
        the task is then uncovered and owed a re-plan that places it elsewhere (kept,
        its retry would start at once where it failed)."""
        records = self.state.records
        self.state.plan = [
            a for a in self.state.plan
            if records[a.task].status != TaskStatus.PENDING
            or a.node not in self._avoided(records[a.task], shunned)]

    def _shunned(self) -> frozenset[str]:
        """Nodes at fault, which every task avoids: two tasks raised the same exception
        there since it last ended a slice well (a broken accelerator fails each task it
        is given; a task's own bug fails it anywhere, and others train there)."""
        return frozenset(node for node, _ in self.raised_on if self._at_fault(node))

    def _at_fault(self, node: str) -> bool:
        """Whether two tasks raised one exception on ``node`` since it last trained well."""
        well = self.trained_on.get(node, -math.inf)
        return any(sum(at > well for at in tasks.values()) >= 2
                   for (where, _), tasks in self.raised_on.items() if where == node)

    def _stalled_elsewhere(self, task: str, node: str) -> bool:
        """Whether ``task`` stalled on a node other than ``node`` too, now or before:
        then its stalls are its own, taken back as evidence against any node and never
        counted again (a stall back on the first node counted anew: a review)."""
        if task not in self.stalls_own and any(
                task in tasks for (where, line), tasks in self.raised_on.items()
                if line == STALLED and where != node):
            self.stalls_own.add(task)
            for (_, line), tasks in self.raised_on.items():
                if line == STALLED:
                    tasks.pop(task, None)
        return task in self.stalls_own

    def _note_raised(self, record: TaskRecord, raised: tuple[int, str, str] | None,
                     forgive: bool = True) -> str | None:
        """Keep who raised what where; the node, where this shows it at fault now (then,
        where ``forgive``, every task's failures there are forgiven, up to
        ``max_failures`` a task)."""
        if raised is None:
            return None
        _, line, node = raised
        before = self._at_fault(node)
        self.raised_on.setdefault((node, line), {})[record.name] = self.now()
        if before or not self._at_fault(node):
            return None
        for r in self.state.records.values() if forgive else ():
            take = min(r.failed_on.pop(node, 0), self.options.max_failures - r.forgiven)
            r.failures -= take
            r.forgiven += take
        return node

    def _holds(self, node: Node, task: str) -> bool:
        """Whether ``node`` can hold one of ``task``'s options."""
        fewest = self._fewest_devices(task)
        return node.devices >= min(fewest.get(None, sys.maxsize),
                                   fewest.get(node.model, sys.maxsize))

    def _fail_the_unplaceable(self) -> bool:
        """Give up the pending tasks no node left can hold (the run cannot wait for ever
        with nothing else to do); whether there were any."""
        placeable = {r.name for r in self._pending_that_fit()}
        stranded = [r for r in self.state.with_status(TaskStatus.PENDING)
                    if r.name not in placeable]
        for record in stranded:
            needs = []  # per kind of node its options are for (None: any node)
            for kind, fewest in sorted(self._fewest_devices(record.name).items(),
                                       key=lambda item: (item[0] is not None, item[0] or "")):
                widest = max((n.devices for n in self.cluster
                              if kind is None or n.model == kind), default=0)
                where = "one node" if kind is None else f"a node of kind {kind}"
                left = ((f"the widest node left has {widest}" if kind is None
                         else f"the widest left has {widest}") if widest
                        else "none is left" if kind else "no node is left")
                needs.append(f"at least {fewest} devices on {where}, and {left}")
            # Only where a node left unused could hold it (review: it blamed the flag for
            # a task no node of the cluster can hold).
            unused = not self.options.replan and any(
                self._holds(n, record.name)
                for n in [*self.unused_joins.values(), *self.launcher.joining_later()])
            message = (f"{record.name} cannot be placed: its options need "
                       + "; or ".join(needs) + "; "
                       + ("a node that joins later would hold it, and is not used under "
                          "--no-replan: simulate without that flag to use it"
                          if unused and self.virtual else
                          "simulate again with such a node kept (a scenario without its "
                          "loss)" if self.virtual else "resume the run once such a node "
                          "is back"))
            self._give_up(record, message, message)
        return bool(stranded)

    def _wait_for_a_join(self) -> bool:
        """With nothing to run but tasks no node here can hold, wait for the next node
        known to join (a simulated cluster's scenario says when; a real one cannot, and
        those tasks fail, to be resumed); whether there was one."""
        at = self.launcher.next_join()
        if at is None or not self.options.replan:  # --no-replan: a joining node unused
            return False  # (the run's own busy nodes: a real run, which knows no future)
        clock.wait_any([], max(0.0, at - clock.now()))
        self._join_new_nodes()
        return True

    def _join_new_nodes(self) -> None:
        """Add the nodes that joined the cluster since (of the kind the profile measured,
        whose options stand for every such node)."""
        kind = self.cluster.nodes[0].kind
        measured = set(self.node_kinds.values())
        new = [n for n in self.launcher.alive_nodes() or []
               if n.name not in self.known and n.kind == kind]
        # A node of a model no node of the run's profile was (an A100 beside H100s)
        # would be planned with the others' seconds and memory: left to a resume, which
        # profiles it (a regression review). A simulated problem's options stand for the
        # nodes its file says they do.
        unmeasured = [] if self.virtual else [n for n in new if n.model not in measured]
        for node in unmeasured:
            self.known.add(node.name)
            self.launcher.forget_node(node.name)  # its devices, if reserved, let go
            self.emit(RunEvent("node_unmeasured", f"node {node.name} ({node.model}) joined "
                               "the cluster, but this run profiled "
                               f"{', '.join(sorted(str(m) for m in measured))} nodes only: "
                               "it is not planned; `dione resume` the run to profile and "
                               "use it"))
        joined = [n for n in new if n not in unmeasured]
        if not self.options.replan:
            # The run's own nodes only, as --no-replan says: a run without re-planning
            # measured against one with it gained the node too, understating what
            # re-planning buys (a simulate review).
            for node in [n for n in joined if n.name not in self.awaited]:
                joined.remove(node)
                self.known.add(node.name)
                self.unused_joins[node.name] = node
                self.launcher.forget_node(node.name)
                self.emit(RunEvent("node_joined", f"node {node.name} ({node.devices} "
                                   f"{node.kind} device(s)) joined the cluster; not used: "
                                   "--no-replan keeps the nodes the run started with"))
        if not joined:
            return
        self.known |= {n.name for n in joined}
        self.cluster = Cluster([*self.cluster, *joined])
        self.node_kinds.update((n.name, n.model) for n in joined)
        for node in joined:
            self.emit(RunEvent("node_joined", f"node {node.name} ({node.devices} {node.kind} "
                               "device(s)) joined the cluster; the plan now uses it"))

    def _snapshot(self) -> tuple[PlanningProblem, float] | None:
        """The problem to plan now (None: nothing pending fits a node, and no running
        task goes on after its slice). A running task's later steps are planned even
        when nothing is pending: once every survivor of a sweep ran, none was ever
        planned again, and each kept the width it started at."""
        pending = self.state.any_pending()
        if not pending and not any(r.running for r in self.state.records.values()):
            return None
        self._join_new_nodes()
        problem, at = self.problem()
        if not problem.tasks:
            if pending:  # what is pending waits for a node wide enough
                self.state.plan = []
            return None
        self.replanner.hasten = self._hastens()
        return problem, at

    def _hastens(self) -> bool:
        """Whether plans end each task as early as idle devices allow: with a stopping
        rule a rung reached sooner is judged sooner (``plan.hasten``); the baselines
        (``spread``, ``sequential``, ``saturn-milp``) are left as their rules are."""
        return self.options.solver in ("cpsat", "greedy") and any(
            r.task.stopping is not None for r in self.state.records.values())

    def plan_now(self) -> None:
        """Plan the remaining work at once and adopt it (the first plan, or one for a
        plan that lost its tasks); nothing runs meanwhile that it would delay."""
        taken = self._snapshot()
        if taken is None:
            return
        problem, at = taken
        limit = self.options.time_limit
        began = time.perf_counter()
        plan, fell_back = solve_or_fall_back(problem, self.options.solver, limit,
                                             1 if self.virtual else None, self.virtual,
                                             self._hastens())
        if not self.first_solve_seconds:
            self.first_solve_seconds = time.perf_counter() - began
            self.first_solve_units = float(plan.notes.get("deterministic_spent", 0.0))
        self._adopt(PlanCandidate(plan, problem, at, fell_back), first=True)

    def _uncovered(self) -> bool:
        """Whether a pending task some node can hold has no assignment in the plan (its
        node was lost, it is new): a re-plan is owed, whatever re-planning has cost."""
        planned = {a.task for a in self.state.plan}
        return any(r.name not in planned for r in self._pending_that_fit())

    def ask_replan(self, owed: bool = False) -> None:
        """Plan again beside execution; adopted by a later turn of the loop. Not while
        re-planning would pass ``replan_share`` of the run's time, this solve counted at
        the mean of those before it (at first, the first plan's), unless ``owed``: a solve
        takes a core from the gangs (200 five-step tasks on 2 cores asked one at every
        slice end, and ran 1.3-1.5 times as long as with no re-planning). Owed solves
        are not held to the budget nor counted in it: on a sweep whose stops each owed
        one, they spent it, and the survivors then stayed at the widths they started at
        (a 50-task ASHA sweep on 4 simulated nodes: 38 owed solves, then 1 of 202 asked).
        Owed solves past ``OWED_SHARE`` of the run's time are greedy's (milliseconds): a
        48-task sweep of seconds-long tasks spent 8 of its 11 s solving them on 2 cores."""
        if not self.options.replan and not owed:
            return
        replanner = self.replanner
        spent = (VIRTUAL_SECONDS_PER_UNIT * (replanner.units - replanner.owed_units)
                 if self.virtual else replanner.seconds - replanner.owed_seconds)
        expected = self.expected_solve_seconds()  # this one's
        budget = self.options.replan_share * max(self.now(), 0.0)
        if not owed and spent + expected > budget:
            return
        owed_spent = (VIRTUAL_SECONDS_PER_UNIT * replanner.owed_units if self.virtual
                      else replanner.owed_seconds)
        quick = owed and owed_spent + expected > OWED_SHARE * max(self.now(), 0.0)
        replanner.ask(self._snapshot, owed, quick)

    def _adopt(self, candidate: PlanCandidate, first: bool = False) -> None:
        """Take ``candidate`` as the plan if it is the first, or ends earlier than the
        current one re-timed under the same estimates by more than the margin. Its
        assignments of tasks that started a slice since it was asked for are left out:
        they run, and go on where they run (as each running task the candidate did not
        place does); so are those on a node lost since (their tasks are then uncovered,
        and owed a re-plan)."""
        if candidate.fell_back:
            self.emit(RunEvent("planner_fell_back", f"{candidate.fell_back}; planning with "
                               "greedy instead"))
        records = self.state.records
        alive = {n.name for n in self.cluster}  # a node lost while it was solved is gone
        assignments = [a for a in candidate.absolute()
                       if a.node in alive and self._placeable(a, candidate.at)]
        if not first:
            current = retimed_end(self.state.plan, candidate.problem, candidate.at)
            new_end = max((a.end for a in assignments), default=candidate.at)
            if self.options.replan_rule == "saturn":  # it must save the interval + 500 s
                saving = self.options.replan_interval + 500.0
            else:
                saving = self.options.replan_margin * max((current or 0.0) - candidate.at, 0.0)
            if current is not None and new_end >= current - saving:
                self._estimate()
                return
        placed = {a.task for a in assignments}
        # Not on a node lost since: a slice there may still end well (its result came
        # back as the node went), and its task's next slice must not be launched there
        # (it then has no assignment, and is owed a re-plan).
        assignments += [self._continuation(r) for r in records.values()
                        if r.running is not None and r.name not in placed
                        and r.running.assignment.node in alive]
        self.state.plan = assignments
        self._estimate()
        horizon = self.horizon(records.values())
        if self.first_planned is None:
            self.first_planned, self.first_horizon = self.state.estimated_finish, horizon
        write_plan(next_plan_file(self.run_dir), AdoptedPlan(
            candidate.plan, candidate.at, self.state.clock_zero, tuple(assignments),
            candidate.problem, horizon))
        self.plans_adopted += 1
        plan = candidate.plan
        self.emit(RunEvent("planned" if first else "replanned",
                           f"{plan.solver} ({plan.status}): finish at "
                           f"{self.state.estimated_finish:.1f} s{horizon_said(horizon)}",
                           data={"finish": self.state.estimated_finish,
                                 "solver": plan.solver, "status": plan.status,
                                 "horizon": horizon}))

    def _drifted(self) -> bool:
        """Whether a running slice's pace puts its end off the plan by more than 5%
        (then its new end becomes the expectation, so one drift asks one re-plan)."""
        drifted = False
        for record in self.state.records.values():
            running = record.running
            if running is None:
                continue
            expected = self.predicted_slice_end(record)
            length = max(running.predicted_end - running.began, 1.0)
            if abs(expected - running.predicted_end) > 0.05 * length:
                running.predicted_end = expected
                drifted = True
        return drifted and self.state.any_pending()

    def _ending_soon(self) -> bool:
        """Whether a slice whose task goes on after it came near its end (within
        ``_lead``): a plan that may move the task is wanted by then (once per slice)."""
        now, lead = self.now(), self._lead()
        soon = False
        for record in self.state.records.values():
            running = record.running
            if (running is not None and not running.planned_ahead
                    and running.end_step < record.total
                    and self.predicted_slice_end(record) - now <= lead):
                running.planned_ahead = soon = True
        return soon

    # -- execution -------------------------------------------------------------------

    def node_kind(self, node: str) -> str | None:
        """The kind a planning problem gives ``node`` (None: none given)."""
        return self.node_kinds.get(node)

    def profiled_option(self, a: Assignment) -> ProfiledOption | None:
        """The profile's option ``a`` runs: its technique and width on its node's kind."""
        return self.profile.task(a.task).option(a.technique, a.devices,
                                                self.node_kind(a.node))

    def launch(self, a: Assignment) -> Future[SliceResult]:
        record = self.state.records[a.task]
        option = self.profiled_option(a)
        assert option is not None
        steps = self.estimates.slice_steps(option, record.remaining, self.options.slice_steps,
                                           self.options.slice_seconds)
        start = record.done_steps
        rule = record.task.stopping
        rung = None if rule is None else rule.next_rung(start, record.total)
        # A slice ends at each rung and each step the task evaluates after.
        forced = next((s for s in record.task.slice_ends(record.total) if s > start), None)
        if forced is not None and start + steps >= forced:
            steps = forced - start
        end = start + steps
        evaluates = end in record.task.evaluation_steps(record.total)
        predicted = self.estimates.option_seconds(a.task, option, steps, start > 0,
                                                  int(evaluates))
        running = RunningSlice(a, self.now(), start, end, self.now() + predicted,
                               predicted, at_rung=rung == end, evaluates=evaluates)
        record.running, record.status = running, TaskStatus.RUNNING
        self.slices_launched += 1
        technique = get_technique(a.technique)
        if technique.task_inexactness(record.task, len(a.device_ids),
                                      technique.resolve(a.knobs)) is not None:
            record.inexact = True
        self.emit(RunEvent("slice_started", f"{a.task}: steps {start}-{start + steps} under "
                           f"{a.technique} on {a.node} devices {list(a.device_ids)}", a.task))
        return self.launching.start(record, running, self.cluster.node(a.node))

    def finished(self, name: str, future: Future[SliceResult]) -> bool:
        """Record a slice's end; whether it departs from the plan enough to re-plan."""
        record = self.state.records[name]
        running = record.running
        assert running is not None
        record.running = None
        try:
            result = future.result()
        except GangInterrupted:
            if running.stalled is None:
                raise  # the run is stopping: its gangs were cancelled
            return self._failed(record, SliceError(running.stalled, "stalled"),
                                running.start_step, running.assignment.node)
        except SliceError as err:
            if err.reason == "node_lost":  # not the task's fault: plan it anew elsewhere
                self._lose_node(running.assignment.node, record, err)
                return True
            return self._failed(record, err, running.start_step, running.assignment.node)
        self.trained_on[running.assignment.node] = self.now()
        for warning in result.warnings:
            self.emit(RunEvent("checkpoint_quarantined", warning, name))
        for doubt in result.doubts:  # once a task: it would say the same at every slice
            if ("slice", name) not in self._doubted:
                self._doubted.add(("slice", name))
                self.emit(RunEvent("keep_best_doubtful", doubt, name))
        if result.evaluation_error:  # the store keeps the traceback with the slice
            self.emit(RunEvent("evaluation_failed", f"{name}: its evaluation at step "
                               f"{result.end_step} failed (its training stands): "
                               f"{error_line(result.evaluation_error)}", name))
        unfinite = {m: v for m, v in result.evaluation.items() if not math.isfinite(v)}
        if unfinite and not result.evaluation_error:  # a real slice's says it (its error)
            self.emit(RunEvent("evaluation_not_finite", f"{name}: evaluated at step "
                               f"{result.end_step}, " + ", ".join(
                                   f"{m} is {v}" for m, v in sorted(unfinite.items()))
                               + " (not recorded)", name))
        record.done_steps = result.end_step
        self.estimates.measured_slice(name, result.technique, running.assignment.devices,
                                      result.step_seconds,
                                      self.node_kind(running.assignment.node))
        if result.losses:
            record.last_loss = result.losses[-1]
        ended = result.end_step >= record.total
        record.status = TaskStatus.DONE if ended else TaskStatus.PENDING
        if ended:
            self.store.set_task_status(name, "done", result.evaluation_error and
                                       f"{EVALUATION_FAILED}:\n{result.evaluation_error}")
            self._ended(record, result.evaluation)
        elapsed = self.now() - running.began
        planned = running.predicted_end - running.began  # revised from its pace, if heard
        revised = (f", {planned:.1f} s from its pace" if abs(
            planned - running.predicted_seconds) > 0.05 * max(planned, 1.0) else "")
        self.emit(RunEvent("slice_finished", f"{name}: steps {result.start_step}-"
                           f"{result.end_step} in {elapsed:.1f} s (predicted "
                           f"{running.predicted_seconds:.1f} s at its launch{revised})"
                           + (" - done" if ended else ""), name, data={
                               "start_step": result.start_step, "end_step": result.end_step,
                               "seconds": elapsed, "predicted": running.predicted_seconds,
                               "loss": result.losses[-1] if result.losses else None,
                               "evaluation": dict(result.evaluation),
                               "technique": result.technique,
                               "devices": running.assignment.devices, "done": ended}))
        if running.at_rung and not ended:
            unjudged = self._unjudgeable(record, result)
            if unjudged:  # a rule that cannot judge must not stop it for a NaN
                self._give_up(record, unjudged, f"{name}: {unjudged}")
                return True
            value = self._rung_value(record, result.end_step, result.evaluation)
            rule = record.task.stopping
            if rule is not None and rule.waits_at_rungs:
                self._wait_at_rung(record, result.end_step, value)
                return True  # its devices are free for the others meanwhile
            if self._judge(record, result.end_step, value):
                return False  # stopped: a re-plan for its devices was asked at once
        return abs(elapsed - planned) > 0.05 * max(planned, 1.0)

    def _wait_at_rung(self, record: TaskRecord, step: int, value: float) -> None:
        """Hold a task at a rung of its synchronous or pausing rule until the others
        reach it, or until it is promoted."""
        rule = record.task.stopping
        assert rule is not None
        record.status = TaskStatus.WAITING
        self.store.set_paused(record.name, step)  # `dione status` and the report say so
        self.waiting.setdefault((self._rule_key(rule), step), {})[record.name] = value
        self.emit(RunEvent("rung_waiting", f"{record.name}: {rule.metric} {value:.4g} at "
                           f"step {step}; it waits there "
                           + ("until it ranks among the best there or no longer can"
                              if rule.pausing else "for the others"), record.name))

    def _release_cohorts(self) -> None:
        """Judge together each synchronous rung that every task under its rule has
        reached or ended before: the best go on, the rest stop; and at each rung of a
        pausing rule, promote or stop whom its rule can decide now."""
        for key in sorted(self.waiting, key=lambda k: k[1]):
            name, step = key
            # Tasks that may still reach the rung (a pausing rule's paused lower down too).
            owed = [r for r in self.state.records.values()
                    if r.task.stopping is not None
                    and self._rule_key(r.task.stopping) == name
                    and (r.status in (TaskStatus.PENDING, TaskStatus.RUNNING)
                         or (r.status == TaskStatus.WAITING and r.task.stopping.pausing))
                    and r.done_steps < step and step in r.task.stopping.rungs(r.total)]
            rule = self.state.records[next(iter(self.waiting[key]))].task.stopping
            assert rule is not None
            if rule.pausing:
                self._promote(key, rule, len(owed))
                continue
            if owed:
                continue
            waiting = self.waiting.pop(key)
            # With those judged there before: a run killed while it recorded a cohort's
            # decisions judges the rest of it as the whole cohort was judged.
            cohort = {**self.judged.get(key, {}), **waiting}
            try:
                together = rule.decide_together(step, cohort)
            except Exception as err:
                self._rule_raised(rule, err, [self.state.records[t] for t in waiting], step)
                continue
            for task, decision in together.items():
                if task not in waiting:
                    continue
                record = self.state.records[task]
                record.status = TaskStatus.PENDING
                self._apply(record, decision, replan=False)
            self.ask_replan(owed=self.options.replan)  # at once: the cohort goes on

    def _promote(self, key: tuple[str, int], rule: StoppingRule, to_come: int) -> None:
        """Decide the tasks paused at a rung of pausing ``rule`` that it can decide now,
        with ``to_come`` more tasks able to reach the rung."""
        waiting = self.waiting[key]
        values = {**self.judged.get(key, {}), **waiting}
        try:
            decided = rule.decide_paused(key[1], values, sorted(waiting), to_come)
        except Exception as err:
            del self.waiting[key]
            self._rule_raised(rule, err, [self.state.records[t] for t in waiting], key[1])
            return
        for task, decision in sorted(decided.items()):
            del waiting[task]
            record = self.state.records[task]
            record.status = TaskStatus.PENDING
            self._apply(record, decision, replan=False)
        if not waiting:
            del self.waiting[key]
        if decided:
            self.ask_replan(owed=self.options.replan)  # at once: devices or work changed

    @staticmethod
    def _unjudgeable(record: TaskRecord, result: SliceResult) -> str | None:
        """Why the task's stopping rule cannot judge it at the rung ``result`` ended at
        (its metric is evaluated, and the evaluation failed or did not return it), with
        the fix; None where it can."""
        rule = record.task.stopping
        if rule is None or rule.metric == "loss" or rule.metric in result.evaluation:
            return None
        step = result.end_step
        if result.evaluation_error:
            return (f"{rule.judged_by} judges {rule.metric!r} at step {step}, but its "
                    f"evaluation there failed: {error_line(result.evaluation_error)}; fix "
                    f"the task's evaluate, then {_RESUME}")
        returned = ", ".join(repr(m) for m in sorted(result.evaluation)) or "nothing"
        return (f"{rule.judged_by} judges {rule.metric!r}, which its evaluate did not "
                f"return at step {step} (it returned {returned}): name one of those as "
                f"{rule.metric_fix}, or return {rule.metric!r} from evaluate, then "
                f"{_RESUME}")

    def _rung_value(self, record: TaskRecord, step: int,
                    evaluation: Mapping[str, float]) -> float:
        """The task's metric at rung ``step``: the mean of the store's last
        ``loss_window`` losses up to it, or the evaluated metric (NaN: none)."""
        rule = record.task.stopping
        assert rule is not None
        if rule.metric == "loss":
            mean = self.store.mean_loss(record.name, rule.loss_window, up_to=step)
            return math.nan if mean is None else mean
        return float(evaluation.get(rule.metric, math.nan))

    def _judge_missed_rungs(self) -> None:
        """A run killed after a slice ended at a rung but before its decision was
        recorded: that rung is judged now, from what the store holds (the losses up
        to it, or the evaluation recorded there), before anything trains past it."""
        decided = {(t, at) for t, at, *_ in self.store.decisions()}  # read once, not per task
        for record in self.state.records.values():
            rule = record.task.stopping
            step = record.done_steps
            if (rule is None or record.status != TaskStatus.PENDING
                    or step not in rule.rungs(record.total)
                    or (record.name, step) in decided):
                continue
            evaluated = {m: v for m, points in self.store.evaluations(record.name).items()
                         for at, v in points if at == step}
            value = self._rung_value(record, step, evaluated)
            if math.isnan(value) and rule.metric != "loss" and self._train_to_rung_again(
                    record, step):
                continue  # judged when it reaches the rung again, as any task is
            if rule.waits_at_rungs:  # it waits there again
                self._wait_at_rung(record, step, value)
                continue
            if math.isnan(value) and rule.metric != "loss":
                self.emit(RunEvent("rung_unjudged", f"{record.name}: no {rule.metric} was "
                                   f"recorded at rung {step} before the run stopped; it goes "
                                   "on unjudged there", record.name))
                continue
            self._judge(record, step, value, replan=False)  # the first plan comes next

    def _train_to_rung_again(self, record: TaskRecord, step: int) -> bool:
        """A task at rung ``step`` with no metric recorded there (its evaluation failed,
        and was fixed before this resume; or the run stopped between the checkpoint and
        the evaluation): its checkpoint at the rung is set aside, so that it trains that
        stretch again from the one before (as it trained it: a resume is bit for bit
        under exact techniques) and is evaluated and judged at the rung as any task is,
        not let past it unjudged (nor ranked last for a NaN). Whether it was."""
        latest = self.store.latest_checkpoint(record.name)
        if latest is None or latest.step != step:
            return False
        self.store.forget_checkpoints(record.name, [latest.path])
        shutil.rmtree(latest.path, ignore_errors=True)  # the stretch writes it anew
        older = self.store.latest_checkpoint(record.name)
        record.done_steps = older.step if older else 0
        rule = record.task.stopping
        assert rule is not None
        self.emit(RunEvent("rung_retrained", f"{record.name}: no {rule.metric} was recorded "
                           f"at rung {step} (its evaluation failed, or the run stopped "
                           f"before it); it trains again from step {record.done_steps} to "
                           "the rung, to be evaluated and judged there", record.name))
        return True

    def _judge(self, record: TaskRecord, step: int, value: float,
               replan: bool = True) -> bool:
        """Apply the task's stopping rule to ``value`` at rung ``step``; whether it
        stopped the task (recorded with the rung, the value and the reason)."""
        rule = record.task.stopping
        assert rule is not None
        recorded = list(self.judged.get((self._rule_key(rule), step), {}).values())
        curve = self.curves.get((self._rule_key(rule), record.name), [])
        try:
            decision = rule.decide(step, value, recorded, record.name, curve)
        except Exception as err:
            self._rule_raised(rule, err, [record], step)
            return True  # it trains no further
        return self._apply(record, decision, replan)

    def _rule_raised(self, rule: StoppingRule, err: Exception, records: list[TaskRecord],
                     step: int) -> None:
        """A stopping rule (a user's) that raised judging ``records`` at rung ``step``:
        those tasks fail, their training to the rung kept, and the run goes on for every
        other (it ended the run, an unrelated task's slice lost: a review)."""
        said = repr(rule)
        said = said if len(said) <= 120 else said[:117] + "..."  # (cut unsaid: a review)
        error = (f"{rule.judged_by} ({said}) raised judging it at step {step}: "
                 f"{type(err).__name__}: {err}; fix the rule, then {_RESUME}")
        for record in records:
            self._give_up(record, error, f"{record.name}: {error}")
        self.ask_replan(owed=self.options.replan)  # their planned steps are free

    def _apply(self, record: TaskRecord, decision: Decision, replan: bool) -> bool:
        """Record a decision of the task's rule and act on it; whether it stopped."""
        rule = record.task.stopping
        assert rule is not None
        step, value = decision.rung, decision.value
        self.curves.setdefault((self._rule_key(rule), record.name), []).append(value)
        self.judged.setdefault((self._rule_key(rule), step), {})[record.name] = value
        self.store.record_decision(record.name, self._rule_key(rule), step, rule.metric, value,
                                   decision.stop, decision.reason)
        judged = {"step": step, "metric": rule.metric, "value": value}
        if not decision.stop:
            self.emit(RunEvent("rung_passed", f"{record.name}: {decision.reason}",
                               record.name, data=judged))
            return False
        record.status = TaskStatus.STOPPED
        self.emit(RunEvent("task_stopped", f"{record.name}: {decision.reason}", record.name,
                           data=judged))
        self._ended(record, {rule.metric: value} if rule.metric != "loss" else {})
        if replan:
            self.ask_replan(owed=self.options.replan)  # past the budget (none: --no-replan)
        return True

    def _ended(self, record: TaskRecord, evaluation: Mapping[str, float]) -> None:
        """Tell the task's stopping rule, if it has one, that the task ended."""
        rule = record.task.stopping
        if rule is None:
            return
        # Its final "loss" as at a rung: the mean of its last loss_window steps (an
        # Optuna study was told one batch's loss, beside intermediate windows' means).
        final = self.store.mean_loss(record.name, rule.loss_window)
        try:
            rule.ended(record.name, record.status.value,
                       record.last_loss if final is None else final, evaluation)
        except Exception as err:  # the rule's own bookkeeping: the run goes on
            self.emit(RunEvent("stopping_rule_failed", f"{record.name}: {rule!r} could not "
                               f"record its end: {type(err).__name__}: {err}", record.name))

    def _give_up(self, record: TaskRecord, error: str, said: str) -> None:
        """End a task failed: the store keeps ``error``, the run's event says ``said``,
        and its stopping rule hears of it as of any other end."""
        record.status = TaskStatus.FAILED
        self.store.set_task_status(record.name, "failed", error)
        self.emit(RunEvent("task_failed", said, record.name))
        self._ended(record, {})

    def _failed(self, record: TaskRecord, err: SliceError, start: int | None = None,
                node: str = "") -> bool:
        """A slice that failed (from step ``start``, on ``node``): the task retried, or
        ended (diverged, a failure no retry can mend, the same exception from the same
        step twice, on two nodes or where no other node holds it, or too many
        failures)."""
        name = record.name
        if err.disk_full is not None:
            # Every task's next checkpoint would fail there too: the run stops, each
            # task at its last checkpoint (it failed them one by one, each a slice lost);
            # no failure is the task's (the store put it back to pending with the slice).
            record.status = TaskStatus.PENDING
            raise DiskFull(self.store.checkpoint_root(self.options.storage), err.disk_full,
                           "the run stopped, every task at its last checkpoint; free space "
                           "there (or give --storage a larger disk), then `dione resume "
                           f"{quote(str(self.store.run_dir))}`")
        record.failures += 1
        if node:
            record.failed_on[node] = record.failed_on.get(node, 0) + 1
        # The exception's own line, with its type (a traceback's last line can be a
        # note every error of its kind ends with: CUDA's "Compile with ...").
        raised = ((start, f"{err.error_type}: {exception_line(str(err))}", node)
                  if err.reason == "raised" and start is not None else None)
        previous, record.last_raised = record.last_raised, raised
        # A stall is a node's evidence too: two tasks stalled on a node that trained
        # nothing since (a hung or crawling device) show it at fault, as two alike
        # exceptions do (a node a thousand times slow failed every task planned there:
        # a simulate review). Not forgiven: a task slow everywhere keeps its tries, and
        # once it stalls on a second node its stalls are its own, no node's (two slow
        # tasks kept healthy nodes out to the end: a regression review).
        stalled = ((start, STALLED, node) if err.reason == "stalled" and node
                   and start is not None and len(self.cluster.nodes) > 1
                   and not self._stalled_elsewhere(record.name, node) else None)
        faulty = self._note_raised(record, raised or stalled, forgive=stalled is None)
        shunned = self._shunned()
        same = again = False
        # Not where a node at fault raised either (the same error on two faulty nodes
        # read as the task's own bug, and a healthy third node never trained it: review).
        if raised is not None and previous is not None and raised[:2] == previous[:2] \
                and raised[2] not in shunned and previous[2] not in shunned:
            # Twice on one node of several: the node may be at fault (a review's broken
            # node failed a task that a resume then trained elsewhere), retried.
            same = True
            again = raised[2] != previous[2] or not self._elsewhere(record, node)
        if err.reason == "diverged":  # the store already says so, with the step
            record.status = TaskStatus.DIVERGED
            self.emit(RunEvent("task_diverged", str(err).splitlines()[0], name))
            self._ended(record, {})
        elif not err.retryable:
            self._give_up(record, str(err), f"{name} failed, and no retry can succeed until "
                          "the disk, the permissions or the task change: "
                          f"{str(err).splitlines()[0]}")
        elif again:  # a bug of the task's: a third try (Ray: a cold actor) would fail alike
            # Its slices' start, not where it raised (read as the step it failed at).
            self._give_up(record, str(err), f"{name} failed twice in a slice from step "
                          f"{start} with the same error, which a retry would raise again: "
                          "fix the task, then "
                          f"{_RESUME}: {str(err).splitlines()[0]}")
        elif record.failures >= self.options.max_failures:
            self._give_up(record, str(err), f"{name} failed {record.failures} times; giving "
                          f"up: {err}")
        else:
            record.status = TaskStatus.PENDING
            # (Forgiven, a count of attempts would read "attempt 0 of 3".)
            said = [] if faulty and not stalled else [f"attempt {record.failures} of "
                                                      f"{self.options.max_failures}"]
            if faulty:
                said.append(f"{'stalled as' if stalled else 'the same error as'} another "
                            f"task on node {node}, which has trained nothing since: the node "
                            "is at fault, left out of every task's plan while others hold "
                            "them" + ("" if stalled else ", its failures not counted"))
            elif same:  # (not again: another node holds it)
                record.avoid.add(node)
                said.append(f"the same error on node {node} again: the node may be at "
                            "fault; retried on another")
            if faulty or same:
                self._steer_off(shunned)
            self.emit(RunEvent("slice_failed", f"{name} failed ({', '.join(said)}), will "
                               f"retry: {str(err).splitlines()[0]}", name))
        return True

    def _elsewhere(self, record: TaskRecord, node: str) -> bool:
        """Whether a node of the cluster other than ``node`` can hold one of the task's
        options (its fewest devices)."""
        return any(n.name != node and self._holds(n, record.name) for n in self.cluster)

    def _lose_node(self, node: str, record: TaskRecord, err: SliceError) -> None:
        """A node left the cluster under a running slice: the task goes back to pending
        (from its last checkpoint), the node's devices leave the plan."""
        record.status = TaskStatus.PENDING
        # Each of the node's slices ends so; a plan adopted between two of them kept
        # their continuations there.
        self.state.plan = [a for a in self.state.plan if a.node != node]
        if any(n.name == node for n in self.cluster):
            self._join_new_nodes()  # one that joined since the last plan is left too
            left = [n for n in self.cluster if n.name != node]
            if not left:
                raise ClusterError(f"node {node} was lost and no node is left to train on: "
                                   "the run stops here, its checkpoints kept; `dione "
                                   "resume` it once nodes are back")
            self.cluster = Cluster(left)
            self.launcher.forget_node(node)
            self.emit(RunEvent("node_lost", f"node {node} left the cluster; its work is "
                               "planned again on the others", record.name))
        self.emit(RunEvent("slice_failed", f"{record.name}: {str(err).splitlines()[0]}",
                           record.name))

    def check_stalls(self) -> None:
        """A slice far past its prediction: said once past ``stall_warning`` times it,
        cancelled (then retried) past ``stall_factor`` times it, each plus the grace."""
        options = self.options
        now = self.now()
        for record in self.state.records.values():
            running = record.running
            if running is None or running.stalled is not None:
                continue
            elapsed, predicted = now - running.began, running.predicted_seconds
            if (options.stall_factor is not None
                    and elapsed > options.stall_factor * predicted + options.stall_grace):
                running.stalled = (
                    f"{record.name}: its slice (steps {running.start_step}-"
                    f"{running.end_step}) ran {elapsed:.0f} s against a prediction of "
                    f"{predicted:.1f} s, past {options.stall_factor:g} times it and "
                    f"{options.stall_grace:g} s: "
                    + ("stalled in its evaluation, cancelled: its training is kept, its "
                       "evaluation owed" if running.in_evaluation else "stalled, cancelled")
                    + " (--stall-factor and --stall-grace change the bound)")
                self.emit(RunEvent("slice_cancelled", running.stalled, record.name))
                running.cancel.reason = f"{STALLED}: {running.stalled}"
                running.cancel.set()
            elif (not running.stall_warned
                  and elapsed > options.stall_warning * predicted + options.stall_grace / 2):
                running.stall_warned = True
                factor = options.stall_factor
                self.emit(RunEvent("slice_slow", f"{record.name}: its slice has run "
                                   f"{elapsed:.0f} s against a prediction of {predicted:.1f} "
                                   + ("s, in its evaluation (trained and saved): stalled? "
                                      if running.in_evaluation else "s: stalled? ")
                                   + ("(no stall factor: it is not cancelled)" if factor is None
                                      else f"(at {factor:g} times it and "
                                      f"{options.stall_grace:g} s the evaluation is "
                                      "cancelled and owed, the training kept)"
                                      if running.in_evaluation else
                                      f"(it is cancelled and retried at {factor:g} times it "
                                      f"and {options.stall_grace:g} s)"),
                                   record.name))

    def _placeable(self, a: Assignment, at: float) -> bool:
        """Whether a plan solved from the state at ``at`` may place ``a``'s task: it is
        pending, or runs the slice it ran then (its steps after it were planned)."""
        record = self.state.records[a.task]
        if record.status == TaskStatus.PENDING:
            return True
        return record.running is not None and record.running.began <= at

    def _continuation(self, record: TaskRecord) -> Assignment:
        """A running task's later slices on its devices, under its option, at once."""
        running = record.running
        assert running is not None
        return replace(running.assignment, start=running.began,
                       end=self.pinned_end(record))

    def _estimate(self) -> None:
        """The run's expected end: the plan's last end, or a running slice's if later."""
        records = self.state.records
        self.state.estimated_finish = max(
            max((a.end for a in self.state.plan
                 if records[a.task].status in (TaskStatus.PENDING, TaskStatus.RUNNING)),
                default=0.0),
            self._running_end())

    def run(self) -> None:
        """Plan, launch, watch, re-plan, until every task has ended."""
        self._judge_missed_rungs()
        self._release_cohorts()
        self.plan_now()
        futures: dict[Future[SliceResult], str] = {}
        last_replan = self.now()
        try:
            while True:
                self.take_additions()
                candidate = self.replanner.ready()
                if candidate is not None:
                    self._adopt(candidate)
                alive = {n.name for n in self.cluster}
                for a in launchable(self.state.plan, self.state.records):
                    if a.node not in alive:  # never launched on a lost node: re-planned
                        self.state.plan.remove(a)
                        continue
                    futures[self.launch(a)] = a.task
                if not futures:
                    if self.state.any_pending() and self.replanner.busy:
                        # a plan for what is pending is on its way
                        clock.wait_any(self.replanner.waitable(), self.tick)
                        continue
                    if self.state.any_pending():
                        self.plan_now()  # the plan lost its tasks: plan again
                        if not launchable(self.state.plan, self.state.records):
                            if self._wait_for_a_join():
                                continue
                            if self._fail_the_unplaceable():
                                continue
                            raise RuntimeError("no pending task can be placed")
                        continue
                    if self.intake is not None and self.intake.expecting():
                        # more tasks may come (an open inbox, a batch profiling)
                        clock.wait_any(self.intake.waitable(), self.tick)
                        continue
                    break
                intake = self.intake.waitable() if self.intake is not None else []
                ended = clock.wait_any([*futures, *self.replanner.waitable(), *intake],
                                       self.tick)
                # In launch order, not the set's (its order is the futures' addresses: two
                # slices ending at one virtual instant were taken in either order, and a
                # re-plan asked between them saw one or the other still running, so a
                # simulation's plans differed from one run to the next).
                done = [f for f in futures if f in ended]
                depart = False
                for future in done:
                    depart |= self.finished(futures.pop(future), future)
                self._release_cohorts()  # after any end: a failed task is owed no more
                self.check_stalls()
                interval = self.now() - last_replan > self.options.replan_interval
                if self._uncovered():
                    self.ask_replan(owed=True)
                elif interval or (self.options.replan_rule == "dione" and (
                        depart or self._drifted() or self._ending_soon())):
                    self.ask_replan()
                    last_replan = self.now()
                elif done:
                    self._estimate()
                self.view(self.state)
                if not self.virtual:
                    self._beat()  # a kill -9 cuts its slices short here, not earlier
        except BaseException:
            for record in self.state.records.values():  # every gang stops; their
                if record.running is not None:  # slices are recorded interrupted
                    record.running.cancel.set()
            for future in futures:
                if self.virtual:  # a simulated slice ends only as its clock moves: none
                    break  # will, and it holds no gang to wait for
                future.exception()  # waits; their errors (GangInterrupted) stay in them
            raise
        finally:
            self.replanner.close()
            self.launching.close()
            if self.intake is not None:
                self.intake.close()
            if not any(r.running for r in self.state.records.values()) \
                    and not self.state.any_pending():
                self.state.estimated_finish = self.now()  # nothing left to estimate
            self.view(self.state)


def _exact(technique: str) -> bool:
    """Whether ``technique`` trains as single does (a user's no longer registered: no)."""
    try:
        return bool(get_technique(technique).exact)
    except (KeyError, ValueError):
        return False

