"""What profiling found: per task its options and trials, the workload's profile, and the
progress events a caller's display follows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dione.profile.catalog import TrialRecord
from dione.spec.cluster import Cluster
from dione.spec.evaluated import listed_metrics, metric_mistake, missing_metrics, missing_said
from dione.spec.task import Task
from dione.state.summaries import error_line, raised_at
from dione.words import some

__all__ = ["NotApplicable", "Profile", "ProfileEvent", "ProfiledOption", "Skipped",
           "TaskProfile", "TrialEvaluation", "evaluation_mistake", "remembered_mistake"]


@dataclass(frozen=True)
class ProfiledOption:
    """A feasible way to train a task, with its fastest knob setting and its trial (the
    planner's view of it, seconds and all, is ``dione.orchestrate.estimates``')."""

    technique: str
    knobs: dict[str, Any]
    devices: int
    record: TrialRecord
    # The node kind it was measured on, where a (simulated) cluster's kinds each have
    # options of their own (``dione.plan.problem.Option.kind``); None: every node.
    kind: str | None = None

    def seconds(self, steps: int, resumed: bool = False, evaluation: float = 0.0) -> float:
        """Predicted seconds to train ``steps`` steps in one slice (and evaluate)."""
        return self.record.slice_seconds(steps, resumed) + evaluation


@dataclass(frozen=True)
class Skipped:
    """Something the profile did not try, and why: a trial (the profiling budget ran
    out, a lighter setting already failed) or a whole technique the task does not allow."""

    technique: str
    label: str  # what was not tried, as shown: "ddp x2", "gpipe x2 microbatches=4", "fsdp"
    reason: str


@dataclass(frozen=True)
class NotApplicable:
    """A technique that proposes no setting for the task at a device count, and why
    (e.g. single on 2 devices, gpipe on a model it cannot split)."""

    technique: str
    devices: int
    reason: str

    @property
    def label(self) -> str:
        return f"{self.technique} x{self.devices}"


@dataclass(frozen=True)
class TrialEvaluation:
    """What a trial's evaluation of the task gave: its seconds (None where it failed),
    the names of the metrics it returned, or why it failed."""

    seconds: float | None
    metrics: tuple[str, ...]
    error: str | None


@dataclass
class TaskProfile:
    """What profiling found for one task."""

    task: str
    group: str  # tasks with the same group share trials
    total_steps: int
    options: list[ProfiledOption] = field(default_factory=list)
    trials: list[TrialRecord] = field(default_factory=list)  # every knob setting, any status
    skipped: list[Skipped] = field(default_factory=list)
    not_applicable: list[NotApplicable] = field(default_factory=list)
    evaluation_seconds: float = 0.0
    # How many times the whole task evaluates (eval_every, rungs, the end; 0: no evaluate).
    evaluations: int = 1
    # How many times a slice must end before the task does (its evaluations and rungs
    # before the end), each then paying a resumed slice's start.
    restarts: int = 0
    error: str | None = None  # the task could not be profiled at all
    # A trial of its group that diverged as this task and then ran as another (its
    # options are the other's timing; the task, diverged under that trial, would again).
    diverged_trial: TrialRecord | None = None
    evaluation_key: str | None = None  # tasks with this key share their evaluation's trial
    # The task's evaluate (a trial's evaluation judges the tasks whose evaluate is it).
    evaluate: Any = field(default=None, repr=False, compare=False)
    # Why smaller passes (accumulation) were not tried: they would train otherwise than
    # single (None: they were, or the task allows it, or no technique has them).
    accumulation_refused: str | None = None
    # What this profiling's trial of the evaluation gave (None: not run this time; the
    # catalog gave its seconds, or the task has no evaluate).
    evaluated: TrialEvaluation | None = None
    # Where the catalog gave the evaluation's seconds: the metrics' names it returned
    # when it was timed (None: not known), which may no longer be what it returns.
    cached_metrics: tuple[str, ...] | None = None

    def why_no_option(self) -> str:
        """Why no configuration fits, from the trials' failures and the skips."""
        reasons = [f"{r.technique} x{r.devices}: {r.status}" + self._as_others(r)
                   + (f" ({error_line(r.reason)[:160]}{raised_at(r.reason)})" if r.reason
                      else "")
                   for r in self.trials if not r.feasible]
        others = [f"{s.label}: {s.reason}" for s in self.skipped]
        others += [f"{s.label}: {s.reason}" for s in self.not_applicable]
        if reasons and others:  # a trial's failure alone: what was skipped or never
            # applied buried it (seven such clauses after a crash: a review)
            reasons.append(f"{len(others)} other setting(s) skipped or not applicable")
        else:
            reasons += others
        # One line: the closing lines, `dione status` and summary.csv show an error's
        # last line, and showed "(see `dione profile`)" alone.
        failed = [r for r in self.trials if not r.feasible]
        if failed and all(r.status == "oom" for r in failed):
            head = "no configuration fits: out of memory under every option tried"
            capped = any("memory cap" in (r.reason or "") for r in failed)
            fix = ("; " + ("raise the memory cap (--memory-cap)" if capped else
                           "give devices with more memory") + ", or make the batch or the "
                   "model smaller")
            if self.accumulation_refused is not None:  # the usual fix, not offered
                fix += (f" (smaller passes by accumulation were not tried: "
                        f"{self.accumulation_refused})")
        else:
            head, fix = "no configuration fits: every trial failed or was skipped", ""
            if any(r.status == "crash" and r.extra.get("from_catalog") for r in failed):
                # A data set fixed since, its code as it was, crashed from the catalog
                # with no trial run and no word of how to run one (a review).
                fix = ("; its crashes are the catalog's, recorded under the same code: "
                       "`--reprofile` runs the trials again (a data set fixed since?)")
        return (head + (": " + "; ".join(reasons[:12]) if reasons else "")
                + ("; ..." if len(reasons) > 12 else "") + fix
                + " (`dione profile` shows each trial)")

    def _as_others(self, record: TrialRecord) -> str:
        """" as TASK, ..." where a crash this task shares was of another task's run of
        the trial (its data set or loss may be what raised): every task it crashed as, this
        one too; "" otherwise."""
        names = list(record.extra.get("crashed_as", ()))
        if all(n == self.task for n in names):
            return ""
        return f" as {' and '.join(repr(n) for n in names)}"

    def not_tried(self) -> list[tuple[str, str]]:
        """(technique, why) for each technique this task had no trial of at any device
        count, and why not (e.g. "gpipe": the model is not an nn.Sequential): the
        reasons at the largest device count, where a count is least often the reason."""
        tried = {r.technique for r in self.trials} | {s.technique for s in self.skipped}
        widest: dict[str, NotApplicable] = {}
        for skip in self.not_applicable:
            known = widest.get(skip.technique)
            if skip.technique not in tried and (known is None or skip.devices >= known.devices):
                widest[skip.technique] = skip
        result = []
        for technique, skip in widest.items():
            # The task's name out of its reasons, so that tasks with one reason group.
            parts = [part.replace(f"task {self.task!r}: ", "").replace(f" {self.task!r}", "")
                     for part in skip.reason.split("; ")]
            result.append((technique, "; ".join(dict.fromkeys(parts))))
        return result

    def option(self, technique: str, devices: int, kind: str | None = None
               ) -> ProfiledOption | None:
        """Its option of ``technique`` on ``devices`` devices for a node of ``kind``."""
        return next((o for o in self.options if o.technique == technique
                     and o.devices == devices and o.kind in (None, kind)), None)


@dataclass
class Profile:
    """A workload's profile: per task its options, and what the profiling cost."""

    cluster: Cluster
    tasks: list[TaskProfile]
    trials_run: int = 0
    trials_cached: int = 0
    seconds: float = 0.0
    # The trials (by fingerprint) taken from the catalog, not run now.
    from_catalog: frozenset[str] = frozenset()

    def task(self, name: str) -> TaskProfile:
        """The profile of task ``name`` (KeyError: none), from an index of ``tasks``
        rebuilt when the list changed (a run that grows extends it): a run of 1,000
        tasks asks this hundreds of thousands of times."""
        index: dict[str, TaskProfile] | None = self.__dict__.get("_index")
        if index is None or len(index) != len(self.tasks) or name not in index:
            index = {t.task: t for t in self.tasks}
            self.__dict__["_index"] = index
        return index[name]


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

    # As a RunEvent has them, so that one on_event callback reads both.
    @property
    def task(self) -> str | None:
        """The task, where the trial is one task's alone (None: a speed group's)."""
        return self.tasks[0] if len(self.tasks) == 1 else None

    @property
    def message(self) -> str:
        """The event in words, one line."""
        tasks = some(self.tasks)
        if self.kind == "not_tried":
            return f"not tried: {self.label} for {tasks}: {self.reason}"
        if self.record is None:
            said = {"started": "started" + (f" on {self.node}" if self.node else "")}.get(
                self.kind, f"{self.kind}: {self.reason}" if self.reason else self.kind)
            return f"trial {self.label} ({tasks}): {said}"
        record = self.record
        pace = f", {record.step_seconds * 1000:.1f} ms/step" if record.step_seconds else ""
        why = ("" if record.feasible or not record.reason
               else f": {record.reason.strip().splitlines()[0][:300]}")
        return f"trial {self.label} ({tasks}): {self.kind}, {record.status}{pace}{why}"

    @property
    def data(self) -> dict[str, Any]:
        """The numbers: the tasks, trials in this profile, the node, and a trial's
        status, seconds per step and peak memory where it has them."""
        record = self.record
        return {"tasks": list(self.tasks), "total": self.total,
                **({"node": self.node} if self.node else {}),
                **({"technique": record.technique, "devices": record.devices,
                    "knobs": dict(record.knobs), "status": record.status,
                    "step_seconds": record.step_seconds,
                    "peak_memory_bytes": record.peak_memory_bytes} if record else {})}


def evaluation_mistake(task: Task, evaluated: TrialEvaluation | None) -> str | None:
    """The metric ``task``'s stopping rule judges, or its ``keep_best`` names, where its
    profiling trial's evaluation did not return it (None: it did, or none ran): found in
    seconds, not at the task's first rung (nor, for keep_best, never)."""
    if evaluated is None or evaluated.error:
        return None
    mistake = metric_mistake(task, evaluated.metrics, "in its profiling trial")
    if mistake is None:
        return None
    rule = task.stopping
    return (f"{mistake}, then {rule.retry if rule is not None else 'resume'} (nothing was "
            "trained)")


def remembered_mistake(task: Task, metrics: tuple[str, ...] | None) -> str | None:
    """As ``evaluation_mistake``, where no trial ran the evaluation this time and the
    catalog remembers the ``metrics`` it returned when it was timed: a warning, since
    evaluate may have changed since (None: nothing to say)."""
    missing = [] if metrics is None else missing_metrics(task, metrics)
    if not missing:
        return None
    then = " and ".join(("the rule fails the task at its first rung" if part == "rule"
                         else "keep_best keeps nothing") for part, _ in missing)
    return (f"{missing_said(task, missing)} (it returned {listed_metrics(metrics or ())} "
            f"when the catalog timed it): if it still does, {then}; stop, fix it and resume "
            "(`--reprofile` runs it again)")


