"""Profile a workload: which trials to run, run them (in parallel where devices allow),
choose each task's options, and write the planner's problem.

Trials are enumerated per task x technique x device count (1, 2, 4, ... and the
node's own count) x knob setting the technique proposes; tasks with equal speed
signatures share them, and trials already in the catalog are not run again. A
replicating technique (single, ddp) is skipped at device counts where one with fewer
devices already ran out of memory; configurations the task or technique excludes are
skipped with the reason; an overall time budget stops new trials.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dione.launch.local import LOCAL, Launcher, warm_up
from dione.launch.scratch import clean_stale_scratch, scratch_dir
from dione.launch.slice import total_steps
from dione.profile.catalog import Catalog, TrialRecord
from dione.profile.fingerprint import (
    code_digest,
    device_description,
    speed_signature,
    trial_fingerprint,
)
from dione.profile.trial import TrialOptions, TrialSpec, run_trial, simulated_step_seconds
from dione.spec.cluster import Cluster, Node
from dione.spec.task import Task
from dione.techniques.registry import get_technique, techniques

__all__ = [
    "Option",
    "Profile",
    "ProfileEvent",
    "TaskProfile",
    "device_counts",
    "profile_workload",
]


def device_counts(devices: int) -> list[int]:
    """1, 2, 4, ... up to ``devices``, and ``devices`` itself."""
    counts, count = [], 1
    while count < devices:
        counts.append(count)
        count *= 2
    return [*counts, devices]


@dataclass(frozen=True)
class Option:
    """A feasible way to train a task, with its fastest knob setting and its trial."""

    technique: str
    knobs: dict[str, Any]
    devices: int
    record: TrialRecord

    def seconds(self, steps: int, resumed: bool = False, evaluation: float = 0.0) -> float:
        """Predicted seconds to train ``steps`` steps in one slice (and evaluate)."""
        return self.record.slice_seconds(steps, resumed) + evaluation


@dataclass
class TaskProfile:
    """What profiling found for one task."""

    task: str
    group: str  # tasks with the same group share trials
    total_steps: int
    options: list[Option] = field(default_factory=list)
    trials: list[TrialRecord] = field(default_factory=list)  # every knob setting, any status
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (configuration, reason)
    # Configurations a technique cannot take at all (e.g. single on 2 devices).
    not_applicable: list[tuple[str, str]] = field(default_factory=list)
    evaluation_seconds: float = 0.0
    error: str | None = None  # the task could not be profiled at all

    def why_no_option(self) -> str:
        """Why no configuration fits, from the trials' failures and the skips."""
        reasons = [f"{r.technique} x{r.devices}: {r.status}"
                   + (f" ({(r.reason or '').strip().splitlines()[-1][:160]})" if r.reason else "")
                   for r in self.trials if not r.feasible]
        reasons += [f"{what}: {why}" for what, why in [*self.skipped, *self.not_applicable]]
        return ("no configuration fits: every trial failed or was skipped"
                + (":\n  " + "\n  ".join(reasons[:12]) if reasons else "")
                + ("\n  ..." if len(reasons) > 12 else "") + "\n(see `dione profile`)")

    def not_tried(self) -> list[tuple[str, str]]:
        """(technique, why) for each technique this task had no trial of at any device
        count, and why not (e.g. "gpipe": the model is not an nn.Sequential): the
        reasons at the largest device count, where a count is least often the reason."""
        tried = {r.technique for r in self.trials} | {what.split(" ")[0]
                                                     for what, _ in self.skipped}
        widest: dict[str, tuple[int, str]] = {}
        for what, why in self.not_applicable:
            technique, _, count = what.rpartition(" x")
            if technique not in tried and int(count) >= widest.get(technique, (0, ""))[0]:
                widest[technique] = (int(count), why)
        result = []
        for technique, (_, why) in widest.items():
            # The task's name out of its reasons, so that tasks with one reason group.
            parts = [part.replace(f"task {self.task!r}: ", "").replace(f" {self.task!r}", "")
                     for part in why.split("; ")]
            result.append((technique, "; ".join(dict.fromkeys(parts))))
        return result

    def option(self, technique: str, devices: int) -> Option | None:
        return next((o for o in self.options
                     if o.technique == technique and o.devices == devices), None)

    def problem_options(self, steps: int | None = None,
                        resumed: bool = False) -> list[dict[str, Any]]:
        """The problem JSON's options for ``steps`` remaining steps (default: all)."""
        remaining = self.total_steps if steps is None else steps
        return [{"technique": o.technique, "knobs": o.knobs, "devices": o.devices,
                 "seconds": round(o.seconds(remaining, resumed, self.evaluation_seconds), 3)}
                for o in self.options]


@dataclass
class Profile:
    """A workload's profile: per task its options, and what the profiling cost."""

    cluster: Cluster
    tasks: list[TaskProfile]
    trials_run: int = 0
    trials_cached: int = 0
    seconds: float = 0.0

    def task(self, name: str) -> TaskProfile:
        return next(t for t in self.tasks if t.task == name)

    def problem(self) -> dict[str, Any]:
        """The planner's problem JSON (DESIGN.md): every task that has an option."""
        return {"cluster": self.cluster.to_json(),
                "tasks": [{"name": t.task, "options": t.problem_options()}
                          for t in self.tasks if t.options]}


@dataclass(frozen=True)
class ProfileEvent:
    """Progress for a caller's display: a trial ``started``, ``finished``, ``cached``
    or ``skipped`` (with its reason); at the end, per technique a task could not use at
    all, ``not_tried`` (label: the technique, with the reason)."""

    kind: str
    label: str
    tasks: tuple[str, ...]
    record: TrialRecord | None = None
    reason: str | None = None
    total: int = 0  # trials to run in this profile
    node: str | None = None  # where a trial ``started``


@dataclass
class _Pending:
    spec: TrialSpec
    group: str
    tasks: list[str]
    shards_memory: bool
    evaluation_key: str | None
    # Fingerprints of the same configuration with one memory-saving knob off: this
    # trial runs only if each of them ran out of memory.
    lighter: list[str] = field(default_factory=list)
    repeat: bool = False  # a feasible trial run again, merged into its record
    code: str = ""  # the digest of the task's code (a crash is cached with it)


def _lighter_settings(knobs: Mapping[str, Any], technique: Any,
                      settings: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Settings among ``settings`` one memory-saving step lighter than ``knobs`` (the
    technique says which: a memory knob off, fewer accumulation parts)."""
    candidates = [technique.resolve(k) for k in technique.lighter(knobs)]
    return [s for s in settings if dict(s) in candidates]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _evaluation_key(signature: Mapping[str, Any], task: Task, device: str) -> str | None:
    if task.evaluate is None:
        return None
    func = getattr(task.evaluate, "func", task.evaluate)
    return _digest([signature, getattr(func, "__module__", ""),
                    getattr(func, "__qualname__", repr(func)), device])


def profile_workload(
    tasks: Sequence[Task],
    cluster: Cluster,
    catalog: Catalog,
    *,
    options: TrialOptions | None = None,
    reprofile: bool = False,
    budget: float | None = None,
    parallel: bool = True,
    scratch: str | Path | None = None,
    on_event: Callable[[ProfileEvent], None] | None = None,
    launcher: Launcher = LOCAL,
    storage: str | Path | None = None,
) -> Profile:
    """Profile ``tasks`` for ``cluster``'s first node (nodes are assumed alike), reusing
    the catalog unless ``reprofile``; never raises for a failing trial or task. Trials
    run side by side on every node of the same kind and threads per device (they share
    catalog entries), each where its devices are free.
    ``storage``: where trials write their checkpoints, a folder every node can reach
    (default: a private folder on this machine)."""
    options = options or TrialOptions()
    began = time.monotonic()
    node = cluster.nodes[0]
    # The threads a slot gets where the trials run (a Ray node's cores, not this machine's).
    threads = launcher.placement(node, [0]).threads if node.kind == "cpu" else 1
    alike = [n for n in cluster if n.kind == node.kind and n.devices >= node.devices
             and (n.kind != "cpu" or launcher.placement(n, [0]).threads == threads)]
    device = device_description(node.kind, threads)
    emit = on_event or (lambda event: None)
    profiles: list[TaskProfile] = []
    wanted: dict[str, _Pending] = {}  # fingerprint -> trial
    by_task: dict[str, list[str]] = {}
    for task in tasks:
        try:
            signature = speed_signature(task)
            steps = total_steps(task)
        except Exception as err:  # one broken task must not stop the others
            profiles.append(TaskProfile(task.name, "", 0,
                                        error=f"{type(err).__name__}: {err}"))
            continue
        group = _digest(signature)
        code = code_digest(task)
        profile = TaskProfile(task.name, group, steps)
        profiles.append(profile)
        by_task[task.name] = []
        eval_key = _evaluation_key(signature, task, device)
        if eval_key is not None:
            cached_eval = catalog.evaluation_seconds(eval_key)
            if cached_eval is not None and not reprofile:
                profile.evaluation_seconds = cached_eval
        for technique in techniques():
            if not task.allows(technique.name):
                profile.skipped.append((technique.name, f"task {task.name!r} allows only "
                                        f"{', '.join(task.techniques or ())}"))
                continue
            for count in device_counts(node.devices):
                settings = technique.knob_settings(task, count, node.kind)
                if not settings:
                    reasons = technique.check(task, count, {}, node.kind)
                    profile.not_applicable.append((
                        f"{technique.name} x{count}",
                        "; ".join(reasons) or f"{technique.name} proposes no setting"))
                    continue
                resolved = [technique.resolve(s) for s in settings]
                fingerprints = {
                    json.dumps(k, sort_keys=True, default=str): trial_fingerprint(
                        signature, technique.name, k, count, node.kind, threads)
                    for k in resolved}
                for knobs in resolved:
                    fingerprint = fingerprints[json.dumps(knobs, sort_keys=True, default=str)]
                    by_task[task.name].append(fingerprint)
                    if fingerprint in wanted:
                        wanted[fingerprint].tasks.append(task.name)
                        continue
                    lighter = [fingerprints[json.dumps(k, sort_keys=True, default=str)]
                               for k in _lighter_settings(knobs, technique, resolved)]
                    wanted[fingerprint] = _Pending(
                        TrialSpec(task, technique.name, knobs, count, fingerprint, device),
                        group, [task.name], technique.shards_memory, eval_key, lighter,
                        code=code)
    results: dict[str, TrialRecord] = {}
    pending: list[_Pending] = []
    for fingerprint, trial in wanted.items():
        cached = None if reprofile else catalog.get(fingerprint)
        if cached is not None and cached.status == "crash" and cached.extra.get(
                "code") != trial.code:
            cached = None  # it crashed under code that has changed since: try again
        if cached is not None:
            results[fingerprint] = cached
            emit(ProfileEvent("cached", trial.spec.label, tuple(trial.tasks), cached))
        else:
            pending.append(trial)
    group_of = {f: w.group for f, w in wanted.items()}
    if pending:
        # A trial times a slice on warm workers, as the run will: none pays a start.
        warm_up(launcher, alike)
    trials_run, skips = _run_pending(pending, results, group_of, alike, catalog, options,
                                     budget, parallel, scratch, began, emit, profiles,
                                     launcher=launcher, storage=storage)
    # Repeats: each option's chosen setting again, at a later moment (a whole pass of
    # other trials lies between), until it has ``options.repeats`` runs; a repeat can
    # change which setting is fastest, so a few more passes may follow.
    counted = trials_run + len(skips)
    for _ in range(2 * (options.repeats - 1)):
        again = _repeats_due(profiles, by_task, wanted, results, options.repeats)
        if not again:
            break
        # A repeat skipped (over the budget) leaves its record with fewer runs: no skip.
        ran, skipped = _run_pending(again, results, group_of, alike, catalog, options, budget,
                                    parallel, scratch, began, emit, profiles, counted,
                                    launcher=launcher, storage=storage)
        trials_run += ran
        counted += ran + len(skipped)
    _cross_check(results, group_of, catalog)
    for profile in profiles:
        if profile.error is not None:
            continue
        own = by_task[profile.task]
        profile.trials = [results[f] for f in own if f in results]
        profile.skipped += [(wanted[f].spec.label, reason) for f, reason in skips.items()
                            if f in own]
        profile.options = _options(profile.trials, profile.total_steps)
    # Say once, per technique and reason, which techniques a task could not use and why.
    not_tried: dict[tuple[str, str], list[str]] = {}
    for profile in profiles:
        for name, why in profile.not_tried():
            not_tried.setdefault((name, why), []).append(profile.task)
    for (name, why), names in not_tried.items():
        emit(ProfileEvent("not_tried", name, tuple(names), reason=why))
    return Profile(cluster, profiles, trials_run, len(wanted) - len(pending),
                   time.monotonic() - began)


def _options(trials: Sequence[TrialRecord], steps: int) -> list[Option]:
    """Per (technique, devices) the knob setting whose steps are fastest, its fixed cost
    the median over every feasible setting's trial.

    The knobs (micro-batches, resharding, activation checkpointing) change the steps,
    not the start-up, save and exit that make up the fixed cost; and picking the
    setting with the smallest *whole* prediction would also pick the trial whose
    start-up happened to be quickest: a prediction biased low by the noise of one
    process start (up to 0.5 s on a small CPU).
    """
    by_key: dict[tuple[str, int], list[TrialRecord]] = {}
    for record in trials:
        if record.feasible:
            by_key.setdefault((record.technique, record.devices), []).append(record)
    options = []
    for (technique, devices), records in sorted(by_key.items(), key=lambda kv: kv[0][::-1]):
        best = min(records, key=lambda r: r.warmup_excess_seconds + steps * (r.step_seconds or 0))
        fixed = statistics.median(r.fixed_seconds for r in records)
        options.append(Option(technique, dict(best.knobs), devices,
                              dataclasses.replace(best, fixed_seconds=fixed)))
    return options


def _runs(record: TrialRecord) -> list[dict[str, float]]:
    """A record's runs: each run's own timings (one run unless the trial was repeated)."""
    return list(record.extra.get("runs") or [{
        "step_seconds": record.step_seconds or 0.0, "fixed_seconds": record.fixed_seconds,
        "warmup_excess_seconds": record.warmup_excess_seconds,
        "load_seconds": record.load_seconds, "trial_seconds": record.trial_seconds}])


def _merged(old: TrialRecord, new: TrialRecord) -> TrialRecord:
    """One record from a trial and its repeat: each timing the median over the runs
    (a run that hit a slow spell of a shared machine is outvoted from three on)."""
    if not new.feasible:  # a repeat that failed where the first run fitted: keep the runs
        return dataclasses.replace(old, extra={**old.extra, "failed_repeat": new.reason})
    runs = _runs(old) + _runs(new)

    def median(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    return dataclasses.replace(
        old, step_seconds=median("step_seconds"), fixed_seconds=median("fixed_seconds"),
        warmup_excess_seconds=median("warmup_excess_seconds"),
        load_seconds=median("load_seconds"),
        measured_steps=old.measured_steps + new.measured_steps,
        trial_seconds=old.trial_seconds + new.trial_seconds,
        peak_memory_bytes=max((m for m in (old.peak_memory_bytes, new.peak_memory_bytes)
                               if m is not None), default=None),
        extra={**old.extra, "runs": runs})


def _repeats_due(profiles: Sequence[TaskProfile], by_task: Mapping[str, list[str]],
                 wanted: Mapping[str, _Pending], results: Mapping[str, TrialRecord],
                 repeats: int) -> list[_Pending]:
    """The chosen settings (one per task, technique and device count) that have fewer
    than ``repeats`` runs: trials to run again, without timing the evaluation again."""
    due: dict[str, _Pending] = {}
    for profile in profiles:
        if profile.error is not None:
            continue
        trials = [results[f] for f in by_task[profile.task] if f in results]
        for option in _options(trials, profile.total_steps):
            fingerprint = option.record.fingerprint
            if len(_runs(results[fingerprint])) < repeats and fingerprint in wanted:
                due[fingerprint] = dataclasses.replace(
                    wanted[fingerprint], evaluation_key=None, lighter=[], repeat=True)
    return list(due.values())


def _run_pending(
    pending: list[_Pending], results: dict[str, TrialRecord], group_of: Mapping[str, str],
    nodes: Sequence[Node], catalog: Catalog, options: TrialOptions, budget: float | None,
    parallel: bool, scratch: str | Path | None, began: float,
    emit: Callable[[ProfileEvent], None], profiles: list[TaskProfile], counted: int = 0,
    launcher: Launcher = LOCAL, storage: str | Path | None = None,
) -> tuple[int, dict[str, str]]:
    """Run the pending trials on ``nodes``' devices (each trial on one node, where enough
    are free), filling ``results``; how many ran,
    and why each trial not run was skipped (by fingerprint). Events count ``counted``
    earlier trials of the same profile in their total."""
    skips: dict[str, str] = {}
    # Fewer devices first: a replicating technique's failure there prunes the rest.
    pending.sort(key=lambda p: (p.spec.devices, p.spec.technique))
    total = counted + len(pending)
    free = {n.name: list(range(n.devices)) for n in nodes}
    running: dict[Future[tuple[TrialRecord, float | None]],
                  tuple[_Pending, Node, list[int]]] = {}
    evaluated: set[str] = set()  # evaluation keys measured or being measured
    cancel = threading.Event()
    run_count = 0
    lanes = sum(n.devices for n in nodes) if parallel else 1

    def oom_below(trial: _Pending) -> TrialRecord | None:
        """A replicating trial of the same group, on no more devices, out of memory."""
        if trial.shards_memory:
            return None
        return next((other for fingerprint, other in results.items()
                     if other.status == "oom" and other.devices <= trial.spec.devices
                     and not get_technique(other.technique).shards_memory
                     and group_of.get(fingerprint) == trial.group), None)

    def waits_for(trial: _Pending) -> bool:
        """Whether a trial whose result decides this one's fate is still to finish: a
        replicating trial of its group on fewer devices, or a lighter knob setting."""
        earlier = [*queue, *(p for p, _, _ in running.values())]
        if any(p.spec.fingerprint in trial.lighter for p in earlier):
            return True
        if trial.shards_memory:
            return False
        return any(not p.shards_memory and p.group == trial.group
                   and p.spec.devices < trial.spec.devices for p in earlier)

    # Trials skipped because a lighter setting fits: the record that showed it.
    covered: dict[str, TrialRecord] = {}

    def fits_lighter(trial: _Pending) -> TrialRecord | None:
        """A lighter setting (memory knobs off) that did not run out of memory."""
        for f in trial.lighter:
            if f in results and results[f].status != "oom":
                return results[f]
            if f in covered:
                return covered[f]
        return None

    def skip(trial: _Pending, reason: str) -> None:
        queue.remove(trial)
        skips[trial.spec.fingerprint] = reason
        emit(ProfileEvent("skipped", trial.spec.label, tuple(trial.tasks), reason=reason,
                          total=total))

    queue = list(pending)
    clean_stale_scratch()  # what killed launchers left behind
    own_scratch = scratch_dir("trials")
    shared = None
    if storage is not None:  # trials' checkpoints, where the nodes that run them reach
        Path(storage).mkdir(parents=True, exist_ok=True)
        shared = Path(tempfile.mkdtemp(prefix="dione-trials-", dir=storage))
    with ThreadPoolExecutor(max_workers=max(1, lanes)) as pool:
        root = Path(scratch) if scratch is not None else own_scratch
        try:
            while queue or running:
                for trial in list(queue):
                    if budget is not None and time.monotonic() - began > budget:
                        skip(trial, f"over the profiling budget of {budget:g} s")
                        continue
                    culprit = oom_below(trial)
                    if culprit is not None:
                        skip(trial, f"{culprit.technique} x{culprit.devices} ran out of memory "
                             f"and {trial.spec.technique} keeps a whole model replica per "
                             "device")
                        continue
                    if waits_for(trial):
                        continue
                    lighter = fits_lighter(trial)
                    if lighter is not None:
                        covered[trial.spec.fingerprint] = lighter
                        off = [f"{k}={v}" for k, v in lighter.knobs.items()
                               if trial.spec.knobs[k] != v]
                        skip(trial, f"the lighter setting {', '.join(off)} "
                             + ("fits in memory" if lighter.feasible else
                                f"failed ({lighter.status}), not for lack of memory")
                             + ", and this one only trades speed for memory")
                        continue
                    node = next((n for n in nodes
                                 if len(free.get(n.name, ())) >= trial.spec.devices), None)
                    if len(running) >= lanes or node is None:
                        continue
                    queue.remove(trial)
                    left = free[node.name]
                    devices, left[:] = left[:trial.spec.devices], left[trial.spec.devices:]
                    spec = trial.spec
                    if trial.evaluation_key and trial.evaluation_key not in evaluated:
                        evaluated.add(trial.evaluation_key)
                        spec = dataclasses.replace(spec, evaluate=True)
                    emit(ProfileEvent("started", spec.label, tuple(trial.tasks), total=total,
                                      node=node.name))
                    running[pool.submit(run_trial, spec, node, devices, root, options,
                                        cancel, launcher, shared)] = (trial, node, devices)
                if not running:
                    if queue:
                        raise RuntimeError("trial scheduling is stuck: nothing runs and "
                                           f"{len(queue)} trial(s) wait")
                    continue
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in done:
                    trial, node, devices = running.pop(future)
                    record, evaluation = future.result()
                    if record.status == "node_lost" and any(n != node.name for n in free):
                        # Not the trial's doing: the node leaves the profile, and the
                        # trial runs again on another; nothing goes to the catalog.
                        if free.pop(node.name, None) is not None:
                            launcher.forget_node(node.name)
                            lanes = max(1, lanes - node.devices) if parallel else 1
                        queue.append(trial)
                        if trial.evaluation_key is not None:
                            evaluated.discard(trial.evaluation_key)
                        continue
                    if node.name in free:
                        free[node.name] = sorted(free[node.name] + devices)
                    run_count += 1
                    if trial.repeat:
                        record = _merged(results[trial.spec.fingerprint], record)
                    results[trial.spec.fingerprint] = record
                    if record.status == "crash":
                        record.extra["code"] = trial.code
                    # A divergence depends on the learning rate, which the fingerprint
                    # leaves out: it must not stand for the task's whole group later; a
                    # lost node (the last one) says nothing about the configuration.
                    if record.status not in ("diverged", "node_lost"):
                        catalog.put(record)
                    if trial.evaluation_key is not None:
                        if evaluation is not None:
                            catalog.put_evaluation_seconds(trial.evaluation_key, evaluation)
                            for profile in profiles:
                                if profile.group == trial.group:
                                    profile.evaluation_seconds = evaluation
                        elif not any(p.evaluation_key == trial.evaluation_key
                                     for p, _, _ in running.values()):
                            evaluated.discard(trial.evaluation_key)  # another trial times it
                    emit(ProfileEvent("finished", trial.spec.label, tuple(trial.tasks), record,
                                      total=total))
        except BaseException:
            cancel.set()  # every running gang stops; the pool then joins its threads
            raise
        finally:
            shutil.rmtree(own_scratch, ignore_errors=True)
            if shared is not None:
                shutil.rmtree(shared, ignore_errors=True)
    return run_count, skips


def _cross_check(results: dict[str, TrialRecord], group_of: Mapping[str, str],
                 catalog: Catalog) -> None:
    """For pipeline trials, the schedule simulator's step time from per-stage action times
    (the trial's own, or those of another pipeline trial on the same stages and
    micro-batches); the measured time stays the one predictions use."""
    for fingerprint, record in results.items():
        if not record.feasible or "micro_batches" not in record.knobs:
            continue
        if record.simulated_step_seconds is not None:
            continue
        source = record if "stage_times" in record.extra else None
        if source is None:
            source = next((other for other_fp, other in results.items()
                           if other.feasible and "stage_times" in other.extra
                           and group_of.get(other_fp) == group_of.get(fingerprint)
                           and other.devices == record.devices
                           and other.knobs.get("micro_batches") == record.knobs["micro_batches"]),
                          None)
        if source is None:
            record.simulation_note = ("measured; no per-action stage times to simulate "
                                      "(the trial logged no timeline)")
            continue
        simulated = simulated_step_seconds(record.technique, source.extra["stage_times"],
                                           int(record.knobs["micro_batches"]))
        record.simulated_step_seconds = simulated
        assert record.step_seconds is not None
        error = simulated / record.step_seconds - 1
        record.simulation_note = (
            f"measured {record.step_seconds * 1000:.1f} ms/step used; the simulator gives "
            f"{simulated * 1000:.1f} ms ({error:+.0%}) from "
            f"{'its own' if source is record else source.technique + ' trial'} action times")
        catalog.put(record)
