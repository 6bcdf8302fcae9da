"""Running trials on devices: side by side where the devices allow, fewer devices first,
skipping those that an earlier trial's out-of-memory or a lighter setting's fit decides."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dione.launch.local import LOCAL, Launcher
from dione.launch.scratch import clean_stale_scratch, scratch_dir
from dione.profile.catalog import Catalog, TrialRecord
from dione.profile.choice import merged_runs
from dione.profile.options import TrialOptions
from dione.profile.results import ProfileEvent, TaskProfile, TrialEvaluation
from dione.profile.trial import run_trial
from dione.profile.trials import PendingTrial, evaluation_arguments
from dione.spec.cluster import Node
from dione.spec.sameness import same_function
from dione.techniques.registry import get_technique

__all__ = ["ProfilingSession", "run_trials"]


def _parts(technique: str, devices: int, knobs: Mapping[str, Any]) -> int:
    """How many passes a trial splits the batch into, as its technique says (for a
    replicating one, devices x accumulation: the more, the smaller each device's
    activations)."""
    return get_technique(technique).batch_parts(devices, knobs)[0]


@dataclass(kw_only=True)
class ProfilingSession:
    """What every pass of trials of one profile shares (built by keyword: its fields are
    many, several of one type)."""

    nodes: Sequence[Node]
    catalog: Catalog
    options: TrialOptions
    group_of: Mapping[str, str]  # fingerprint -> speed group
    profiles: list[TaskProfile]  # told the evaluation time a trial measured
    emit: Callable[[ProfileEvent], None]
    began: float  # time.monotonic() at the profile's start, for the budget
    budget: float | None = None
    parallel: bool = True
    scratch: str | Path | None = None
    launcher: Launcher = LOCAL
    storage: str | Path | None = None


def _listed(evaluations: Sequence[tuple[str, Any]], key: str, evaluate: Any) -> bool:
    """Whether ``evaluations`` (key, evaluate) hold this evaluation."""
    return any(k == key and same_function(e, evaluate) for k, e in evaluations)


def run_trials(pending: list[PendingTrial], results: dict[str, TrialRecord],
               setting: ProfilingSession, counted: int = 0) -> tuple[int, dict[str, str]]:
    """Run the pending trials on the setting's nodes (each trial on one node, where enough
    devices are free), filling ``results``; how many ran, and why each trial not run was
    skipped (by fingerprint). Events count ``counted`` earlier trials of the same profile
    in their total."""
    return _Pass(pending, results, setting, counted).run()


class _Pass:
    """One pass over pending trials: the queue, what runs where, and what was decided."""

    def __init__(self, pending: list[PendingTrial], results: dict[str, TrialRecord],
                 setting: ProfilingSession, counted: int) -> None:
        # Fewer devices first: a replicating technique's failure there prunes the rest.
        pending.sort(key=lambda p: (p.spec.devices, p.spec.technique))
        self.setting = setting
        self.results = results
        self.queue = list(pending)
        self.total = counted + len(pending)
        self.free = {n.name: list(range(n.devices)) for n in setting.nodes}
        self.running: dict[Future[tuple[TrialRecord, TrialEvaluation | None]],
                           tuple[PendingTrial, Node, list[int]]] = {}
        # Evaluations (key, evaluate) timed or being timed in this pass, and those whose
        # returns the catalog knows (timed before).
        self.evaluated: list[tuple[str, Any]] = []
        self.known = [(p.evaluation_key, p.evaluate) for p in setting.profiles
                      if p.evaluation_key is not None and p.cached_metrics is not None]
        # Trials skipped because a lighter setting fits: the record that showed it.
        self.covered: dict[str, TrialRecord] = {}
        self.skips: dict[str, str] = {}
        self.cancel = threading.Event()
        self.run_count = 0
        self.lanes = sum(n.devices for n in setting.nodes) if setting.parallel else 1

    # -- what decides a trial's fate ---------------------------------------------------

    def oom_below(self, trial: PendingTrial) -> TrialRecord | None:
        """A replicating trial of the same group, out of memory with no more on each
        device than ``trial`` would hold: the same whole replica, and a share of the
        batch per pass at most as large (single x1 out of memory says nothing of
        accumulation 2, nor of ddp x2, whose passes are half as large)."""
        if trial.shards_memory:
            return None
        parts = _parts(trial.spec.technique, trial.spec.devices, trial.spec.knobs)
        # The same technique, or one device (which holds no communication buffers: a
        # DDP trial out of memory says nothing of single, whose replica has none).
        return next((other for fingerprint, other in self.results.items()
                     if other.status == "oom"
                     and _parts(other.technique, other.devices, other.knobs) >= parts
                     and (other.technique == trial.spec.technique or other.devices == 1)
                     and not get_technique(other.technique).shards_memory
                     and self.setting.group_of.get(fingerprint) == trial.group), None)

    def waits_for(self, trial: PendingTrial) -> bool:
        """Whether a trial whose result decides this one's fate is still to finish: a
        replicating trial of its group on fewer devices, or a lighter knob setting; or a
        run of the same trial is running."""
        running = [p for p, _, _ in self.running.values()]
        if any(p.spec.fingerprint == trial.spec.fingerprint for p in running):
            return True  # a run of it again (another evaluation) shares its folders
        earlier = [*self.queue, *running]
        if any(p.spec.fingerprint in trial.lighter for p in earlier):
            return True
        if trial.shards_memory:
            return False
        return any(not p.shards_memory and p.group == trial.group
                   and p.spec.devices < trial.spec.devices for p in earlier)

    def fits_lighter(self, trial: PendingTrial) -> TrialRecord | None:
        """A lighter setting (memory knobs off) that did not run out of memory."""
        for f in trial.lighter:
            if f in self.results and self.results[f].status != "oom":
                return self.results[f]
            if f in self.covered:
                return self.covered[f]
        return None

    def skip(self, trial: PendingTrial, reason: str) -> None:
        self.queue.remove(trial)
        self.skips[trial.spec.fingerprint] = reason
        self.setting.emit(ProfileEvent("skipped", trial.spec.label, tuple(trial.tasks),
                                       reason=reason, total=self.total))

    def _decided(self, trial: PendingTrial) -> bool:
        """Skip ``trial`` if the budget or an earlier result rules it out; whether it was."""
        budget = self.setting.budget
        if budget is not None and time.monotonic() - self.setting.began > budget:
            self.skip(trial, f"over the profiling budget of {budget:g} s")
            return True
        culprit = self.oom_below(trial)
        if culprit is not None:
            accumulated = culprit.knobs.get("accumulation", 1)
            self.skip(trial, f"{culprit.technique} x{culprit.devices}"
                      + (f" (accumulation {accumulated})" if accumulated != 1 else "")
                      + f" ran out of memory, and {trial.spec.technique} keeps a whole model "
                      "replica per device with passes no smaller")
            return True
        if self.waits_for(trial):
            return True
        lighter = self.fits_lighter(trial)
        if lighter is not None:
            self.covered[trial.spec.fingerprint] = lighter
            off = [f"{k}={v}" for k, v in lighter.knobs.items() if trial.spec.knobs[k] != v]
            self.skip(trial, f"the faster setting {', '.join(off)} (its memory knobs off) "
                      + ("fits in memory" if lighter.feasible else
                         f"failed ({lighter.status}), not for lack of memory")
                      + ", and this one only trades speed for memory")
            return True
        return False

    # -- starting and finishing ------------------------------------------------------

    def start_what_fits(self, pool: ThreadPoolExecutor, root: Path,
                        shared: Path | None) -> None:
        for trial in list(self.queue):
            if self._decided(trial):
                continue
            node = next((n for n in self.setting.nodes
                         if len(self.free.get(n.name, ())) >= trial.spec.devices), None)
            if len(self.running) >= self.lanes or node is None:
                continue
            self.queue.remove(trial)
            left = self.free[node.name]
            devices, left[:] = left[:trial.spec.devices], left[trial.spec.devices:]
            trial = self._with_evaluation(trial)
            spec = trial.spec
            self.setting.emit(ProfileEvent("started", spec.label, tuple(trial.tasks),
                                           total=self.total, node=node.name))
            future = pool.submit(run_trial, spec, node, devices, root, self.setting.options,
                                 self.cancel, self.setting.launcher, shared)
            self.running[future] = (trial, node, devices)

    def _timed(self, key: str, evaluate: Any) -> bool:
        return _listed(self.evaluated, key, evaluate)

    def _known(self, key: str, evaluate: Any) -> bool:
        return _listed(self.known, key, evaluate)

    def _with_evaluation(self, trial: PendingTrial) -> PendingTrial:
        """``trial`` as it runs: timing one of its tasks' evaluations not timed yet in
        this pass (its task, with that evaluate, trains as it would), or none: one the
        catalog does not know before one it does, its own task's first."""
        spec = dataclasses.replace(trial.spec, evaluate=False)
        own = spec.task.evaluate
        for key, evaluate in sorted(trial.evaluations, key=lambda pair: (
                self._known(*pair), not same_function(pair[1], own))):
            if not self._timed(key, evaluate):
                self.evaluated.append((key, evaluate))
                task = spec.task if evaluate is spec.task.evaluate else dataclasses.replace(
                    spec.task, evaluate=evaluate)
                spec = dataclasses.replace(spec, task=task, evaluate=True)
                return dataclasses.replace(trial, spec=spec, evaluation_key=key)
        return dataclasses.replace(trial, spec=spec, evaluation_key=None)

    def _untimed(self, trial: PendingTrial) -> None:
        """The evaluation ``trial`` was to time is for another trial to time."""
        ran = trial.spec.task.evaluate
        self.evaluated = [(k, e) for k, e in self.evaluated
                          if not (k == trial.evaluation_key and same_function(e, ran))]

    def finish(self, future: Future[tuple[TrialRecord, TrialEvaluation | None]]) -> None:
        trial, node, devices = self.running.pop(future)
        record, evaluated = future.result()
        setting = self.setting
        if record.status == "node_lost" and any(n != node.name for n in self.free):
            # Not the trial's doing: the node leaves the profile, and the trial runs
            # again on another; nothing goes to the catalog.
            if self.free.pop(node.name, None) is not None:
                setting.launcher.forget_node(node.name)
                self.lanes = max(1, self.lanes - node.devices) if setting.parallel else 1
            self.queue.append(trial)
            if trial.spec.evaluate:
                self._untimed(trial)
            return
        if node.name in self.free:
            self.free[node.name] = sorted(self.free[node.name] + devices)
        self.run_count += 1
        if record.status == "timeout" and record.extra.get("trained") \
                and not trial.for_evaluation:
            # It trained, then ran out of time in the evaluation it timed: the
            # configuration is timed again without it, nothing cached of this run. Where
            # the evaluation hung (half the timeout), its failure goes to its tasks (no
            # other trial runs it); otherwise another trial times it (a slow build had
            # failed the task: a regression review).
            if trial.evaluation_key is not None and evaluated is not None:
                self._evaluated(trial, evaluated)
            elif trial.evaluation_key is not None:
                self._untimed(trial)
            self.queue.append(dataclasses.replace(
                trial, spec=dataclasses.replace(trial.spec, evaluate=False),
                evaluation_key=None, evaluations=[]))
            self.total += 1
            setting.emit(ProfileEvent("finished", trial.spec.label, tuple(trial.tasks),
                                      record, total=self.total))
            return
        if trial.for_evaluation:  # its timing is not merged: a run per session, unbounded
            if trial.spec.evaluate and trial.evaluation_key is not None:
                self._evaluated(trial, evaluated)
            setting.emit(ProfileEvent("finished", trial.spec.label, tuple(trial.tasks),
                                      record, total=self.total))
            return
        if trial.repeat:
            record = merged_runs(self.results[trial.spec.fingerprint], record)
        if record.status == "diverged" and trial.stand_ins and not trial.repeat:
            # Its task's learning rate, not the configuration: time it on the next task
            # that shares it (a sweep's one diverging rate left every other rate of its
            # group with no configuration that fits); its evaluation too, below.
            record.extra["diverged_as"] = [*trial.diverged_as, trial.spec.task.name]
            for profile in self.setting.profiles:  # not launched to diverge again
                if profile.task == trial.spec.task.name:
                    profile.diverged_trial = record
            self.queue.append(dataclasses.replace(
                trial, spec=dataclasses.replace(trial.spec, task=trial.stand_ins[0]),
                stand_ins=trial.stand_ins[1:],
                diverged_as=(*trial.diverged_as, trial.spec.task.name)))
            self.total += 1
        elif record.status == "crash" and trial.stand_ins and not trial.repeat \
                and not trial.crashed_as:
            # Its task's own data or loss may have raised, not the configuration: a bad
            # item in one task's data set failed every task sharing its trials, with that
            # task's error (a review). Run once again as the next task; crashing there
            # too, it is the configuration's.
            self.queue.append(dataclasses.replace(
                trial, spec=dataclasses.replace(trial.spec, task=trial.stand_ins[0]),
                stand_ins=trial.stand_ins[1:], crashed_as=(trial.spec.task.name,)))
            self.total += 1
        else:
            if record.status == "crash":  # as which tasks: named where another's reads it
                record.extra["crashed_as"] = [*trial.crashed_as, trial.spec.task.name]
            if record.status == "diverged":  # whose learning rates: those tasks diverged,
                # the group's others never ran (their own profile says no option fits)
                record.extra["diverged_as"] = [*trial.diverged_as, trial.spec.task.name]
            self.results[trial.spec.fingerprint] = record
            if record.status == "crash":
                record.extra["code"] = trial.code
            if record.status == "timeout":  # a longer limit may see it through
                record.extra["timeout"] = setting.options.timeout
            # A divergence depends on the learning rate, which the fingerprint leaves
            # out: it must not stand for the task's whole group later; a lost node (the
            # last one) says nothing about the configuration.
            # Nor one timed beside another dione process's training: its contention.
            if record.status not in ("diverged", "node_lost") and \
                    not record.extra.get("beside"):
                setting.catalog.put(record)
        if trial.spec.evaluate and trial.evaluation_key is not None:
            self._evaluated(trial, evaluated)
        setting.emit(ProfileEvent("finished", trial.spec.label, tuple(trial.tasks), record,
                                  total=self.total))

    def _evaluated(self, trial: PendingTrial, evaluated: TrialEvaluation | None) -> None:
        """What the evaluation ``trial`` timed gave, to the tasks whose evaluate it ran
        (the key leaves out a partial's arguments, and a stand-in's evaluate may be another
        function of the same name), its cost to those of its key, and to the catalog."""
        key, ran = trial.evaluation_key, trial.spec.task.evaluate
        assert key is not None
        if evaluated is None:  # the trial ended before it evaluated: another times it
            # (no other runs it now: a pass lists each evaluation once until then)
            self._untimed(trial)
            return
        if evaluated.seconds is not None:
            self.setting.catalog.put_evaluation_seconds(
                key, evaluated.seconds, evaluated.metrics, evaluation_arguments(ran))
        for profile in self.setting.profiles:
            if profile.evaluation_key != key:
                continue
            if same_function(profile.evaluate, ran):  # what it returned, or why it failed
                profile.evaluated = evaluated
                if evaluated.seconds is not None:
                    profile.evaluation_seconds = evaluated.seconds
            elif profile.evaluated is None and evaluated.seconds is not None:
                # Of its key but not its own (another partial's arguments): until its
                # own is timed, the nearest cost there is.
                profile.evaluation_seconds = evaluated.seconds

    def run(self) -> tuple[int, dict[str, str]]:
        clean_stale_scratch()  # what killed launchers left behind
        own_scratch = scratch_dir("trials")
        shared = None
        storage = self.setting.storage
        if storage is not None:  # trials' checkpoints, where the nodes that run them reach
            Path(storage).mkdir(parents=True, exist_ok=True)
            shared = Path(tempfile.mkdtemp(prefix="dione-trials-", dir=storage))
        scratch = self.setting.scratch
        with ThreadPoolExecutor(max_workers=max(1, self.lanes)) as pool:
            root = Path(scratch) if scratch is not None else own_scratch
            try:
                while self.queue or self.running:
                    self.start_what_fits(pool, root, shared)
                    if not self.running:
                        if self.queue:
                            raise RuntimeError("trial scheduling is stuck: nothing runs and "
                                               f"{len(self.queue)} trial(s) wait")
                        continue
                    done, _ = wait(list(self.running), return_when=FIRST_COMPLETED)
                    for future in done:
                        self.finish(future)
            except BaseException:
                self.cancel.set()  # every running gang stops; the pool then joins its threads
                raise
            finally:
                shutil.rmtree(own_scratch, ignore_errors=True)
                if shared is not None:
                    shutil.rmtree(shared, ignore_errors=True)
        return self.run_count, self.skips
