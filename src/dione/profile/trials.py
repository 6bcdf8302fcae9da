"""Which trials a workload needs: task x technique x device count x knob setting, one
per fingerprint, so tasks of one speed group share them."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dione.launch.slice import total_steps
from dione.profile.catalog import Catalog
from dione.profile.fingerprint import (
    callable_name,
    code_digest,
    module_name,
    speed_signature,
    technique_identity,
    trial_fingerprint,
)
from dione.profile.results import NotApplicable, Skipped, TaskProfile
from dione.profile.trial import TrialSpec
from dione.spec.cluster import Node
from dione.spec.devices import device_counts
from dione.spec.task import Task
from dione.techniques.base import Technique
from dione.techniques.registry import techniques

__all__ = ["PendingTrial", "WantedTrials", "device_counts", "evaluation_arguments", "speed_group",
           "wanted_trials"]


# How many other tasks a shared trial may run as, each after the one before diverged
# (a sweep of many diverging rates ran every trial once per task).
_STAND_INS = 2


@dataclass
class PendingTrial:
    """A trial to run, for the tasks that share it."""

    spec: TrialSpec
    group: str
    tasks: list[str]
    shards_memory: bool
    # Fingerprints of the same configuration with one memory-saving knob off: this
    # trial runs only if each of them ran out of memory.
    lighter: list[str] = field(default_factory=list)
    repeat: bool = False  # a feasible trial run again, merged into its record
    code: str = ""  # the digest of the task's code (a crash is cached with it)
    # The other tasks sharing it, in turn: where the trial diverges (its task's learning
    # rate, which the fingerprint leaves out), it runs again as the next one.
    stand_ins: list[Task] = field(default_factory=list)
    diverged_as: tuple[str, ...] = ()  # the tasks it ran as before, each of which diverged
    # The task it crashed as before (where it crashes once, it runs once again as the
    # next task sharing it: that task's data set or loss may be what raised).
    crashed_as: tuple[str, ...] = ()
    # An evaluation of each evaluate function of the tasks sharing it, (evaluation key,
    # evaluate), the first task's first: a trial of the same model and batch may time any
    # of them, so each is run (and what it returns checked) once, not only the first
    # task's (a sweep mixing evaluate functions in one speed group ran one of them). One
    # a key: a sweep's partials or closures of one function, made per task, are many.
    evaluations: list[tuple[str, Any]] = field(default_factory=list)
    # As it runs: the key of the evaluation it times (its task's evaluate is that one).
    evaluation_key: str | None = None
    # Run again only to time an evaluation: its record (the catalog's) stands as it was.
    for_evaluation: bool = False
    # Under a memory cap: the same trial's fingerprint without one (its catalog row
    # serves where its peak is under the cap: every trial was timed again for any cap).
    uncapped: str | None = None

    def times(self, key: str) -> bool:
        """Whether it may time an evaluation of this key."""
        return any(k == key for k, _ in self.evaluations)


@dataclass
class WantedTrials:
    """Every task's profile (still without trials), the trials wanted by fingerprint,
    and each task's fingerprints in enumeration order."""

    profiles: list[TaskProfile]
    wanted: dict[str, PendingTrial]
    by_task: dict[str, list[str]]

    def group_of(self) -> dict[str, str]:
        """Each wanted trial's speed group, by fingerprint."""
        return {f: w.group for f, w in self.wanted.items()}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def speed_group(signature: Mapping[str, Any]) -> str:
    """The name of the group of tasks with this speed signature (they share trials)."""
    return _digest(signature)


def _evaluation_key(signature: Mapping[str, Any], task: Task, device: str) -> str | None:
    if task.evaluate is None:
        return None
    func = getattr(task.evaluate, "func", task.evaluate)
    module = module_name(func) if hasattr(func, "__module__") else ""
    # As catalogs have keyed it (module, then name or repr), but an object with the
    # default repr by its class: that repr holds a memory address.
    name = callable_name(func).removeprefix(f"{module}.")
    return _digest([signature, module, name, device])


# Values whose text is the same in every process (an object's default repr holds its
# address: a decorator's closure, torch.no_grad's, would never be found again).
_PLAIN = (str, int, float, bool, type(None))


def evaluation_arguments(evaluate: Any) -> str:
    """The arguments of a partial ``evaluate``, or the plain values (names, numbers) a
    closure captured, as text (empty for a plain function, or a closure that captured
    anything else): the evaluation key leaves them out, and they may change what it
    returns (two closures of one factory kept one row of returns, the last's)."""
    if isinstance(evaluate, functools.partial):
        return repr((evaluate.args, sorted(evaluate.keywords.items())))
    try:
        values = tuple(c.cell_contents for c in getattr(evaluate, "__closure__", None) or ())
    except ValueError:  # a cell not yet filled
        return ""
    return repr(values) if values and all(isinstance(v, _PLAIN) for v in values) else ""


def _lighter_settings(knobs: Mapping[str, Any], technique: Technique,
                      settings: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Settings among ``settings`` one memory-saving step lighter than ``knobs`` (the
    technique says which: a memory knob off, fewer accumulation parts)."""
    candidates = [technique.resolve(k) for k in technique.lighter(knobs)]
    return [s for s in settings if dict(s) in candidates]


def _accumulation_refused(task: Task, technique: Technique, count: int) -> str | None:
    """Why ``technique`` on ``count`` devices does not split ``task``'s batch into
    smaller passes (None: not for a reason of exactness)."""
    if task.allow_inexact:
        return None
    try:
        inexact = technique.task_inexactness(task, count,
                                             technique.resolve({"accumulation": 2}))
    except Exception:  # a user's technique: its knob_settings already said what it could
        return None
    return None if inexact is None else (
        f"{inexact}; set allow_inexact=True to allow it")


def _knobs_key(knobs: Mapping[str, Any]) -> str:
    return json.dumps(knobs, sort_keys=True, default=str)


def wanted_trials(tasks: Sequence[Task], node: Node, threads: int, device: str,
                  catalog: Catalog, reprofile: bool, memory_cap_bytes: int | None = None
                  ) -> WantedTrials:
    """The trials ``tasks`` need on a node like ``node`` (``threads`` per CPU slot,
    described as ``device``, capped at ``memory_cap_bytes`` per device), with each
    task's skips and cached evaluation time; a task that cannot be fingerprinted gets a
    profile with its error and no trials."""
    profiles: list[TaskProfile] = []
    wanted: dict[str, PendingTrial] = {}
    by_task: dict[str, list[str]] = {}
    for task in tasks:
        try:
            signature = speed_signature(task)
            steps = total_steps(task)
        except Exception as err:  # one broken task must not stop the others
            profiles.append(TaskProfile(task.name, "", 0,
                                        error=f"{type(err).__name__}: {err}"))
            continue
        group = speed_group(signature)
        code = code_digest(task)
        profile = TaskProfile(task.name, group, steps,
                              evaluations=len(task.evaluation_steps(steps)),
                              restarts=len(task.slice_ends(steps)))
        profiles.append(profile)
        by_task[task.name] = []
        eval_key = profile.evaluation_key = _evaluation_key(signature, task, device)
        profile.evaluate = task.evaluate
        if eval_key is not None:
            cached_eval = catalog.evaluation_seconds(eval_key)
            if cached_eval is not None and not reprofile:
                profile.evaluation_seconds = cached_eval
                profile.cached_metrics = catalog.evaluation_metrics(
                    eval_key, evaluation_arguments(task.evaluate))
        for technique in techniques():
            if not task.allows(technique.name):
                profile.skipped.append(Skipped(
                    technique.name, technique.name,
                    f"task {task.name!r} allows only {', '.join(task.techniques or ())}"))
                continue
            for count in device_counts(node.devices):
                try:  # a user's technique: its failure leaves it out for this task alone
                    settings = technique.knob_settings(task, count, node.kind)
                    reasons = [] if settings else technique.check(task, count, {}, node.kind)
                except Exception as err:
                    profile.not_applicable.append(NotApplicable(
                        technique.name, count, f"{technique.name}'s knob_settings or check "
                        f"raised {type(err).__name__}: {err}"))
                    continue
                if not settings:
                    profile.not_applicable.append(NotApplicable(
                        technique.name, count,
                        "; ".join(reasons) or f"{technique.name} proposes no setting"))
                    continue
                resolved = [technique.resolve(s) for s in settings]
                if (profile.accumulation_refused is None and "accumulation" in technique.knobs
                        and all(k.get("accumulation", 1) == 1 for k in resolved)):
                    profile.accumulation_refused = _accumulation_refused(task, technique, count)
                identity = technique_identity(technique)
                fingerprints = {
                    _knobs_key(k): trial_fingerprint(
                        signature, identity, k, count, node.kind, threads,
                        memory_cap_bytes, node.model)
                    for k in resolved}
                for knobs in resolved:
                    fingerprint = fingerprints[_knobs_key(knobs)]
                    by_task[task.name].append(fingerprint)
                    if fingerprint in wanted:
                        wanted[fingerprint].tasks.append(task.name)
                        if eval_key is not None and not wanted[fingerprint].times(eval_key):
                            wanted[fingerprint].evaluations.append((eval_key, task.evaluate))
                        if len(wanted[fingerprint].stand_ins) < _STAND_INS:
                            wanted[fingerprint].stand_ins.append(task)
                        continue
                    lighter = [fingerprints[_knobs_key(k)]
                               for k in _lighter_settings(knobs, technique, resolved)]
                    wanted[fingerprint] = PendingTrial(
                        TrialSpec(task, technique.name, knobs, count, fingerprint, device),
                        group, [task.name], technique.shards_memory, lighter, code=code,
                        evaluations=[] if eval_key is None else [(eval_key, task.evaluate)],
                        uncapped=None if memory_cap_bytes is None else trial_fingerprint(
                            signature, identity, knobs, count, node.kind, threads,
                            model=node.model))
    return WantedTrials(profiles, wanted, by_task)
