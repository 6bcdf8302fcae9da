"""The one bridge from a profile to a planning problem: how long an option takes.

``dione profile -o`` and every plan of a run take an option's seconds from here, by one
rule: the trial's prediction for the remaining steps (fixed cost, warm-up excess, steps,
the checkpoint load of a resumed task, the evaluation at the end), with the step time
this task measured under that technique and device count in place of the trial's where
it has run so, and elsewhere the trial's scaled as the task's measured step times were
to its trials'. So the same profile gives the same problem either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from dione.plan.problem import NodeSpec, PlanningProblem, TaskOptions
from dione.plan.problem import Option as PlannedOption
from dione.profile.results import Profile, ProfiledOption, TaskProfile
from dione.spec.cluster import Cluster
from dione.state.store import RunStore

__all__ = ["AUTO_SLICE_FLOOR_SECONDS", "AUTO_SLICE_START_UP_SHARE", "Estimates",
           "auto_slice_seconds", "planning_nodes", "profile_problem", "task_options"]

# The default slice: long enough that its start-up (warm workers: about 0.2-0.8 s on 2
# CPU cores, benchmarks/RESULTS.md) is at most this share of it, and at least the floor,
# so that re-planning (a solve at every slice end) runs about once per task per floor.
AUTO_SLICE_START_UP_SHARE = 0.05
AUTO_SLICE_FLOOR_SECONDS = 300.0

# A task measured this many times slower (or faster) than profiled under the options it
# ran is taken to be so under the others; nearer 1, the slices' own spread (a slice's
# pace varies by some 10% on a shared machine) is no slowdown of the task.
SLOWDOWN_SEEN = 1.25

# (technique, devices, node kind) -> the mean step time this task measured so, if it ran so.
Measured = Callable[[str, int, "str | None"], "float | None"]


def auto_slice_seconds(start_up_seconds: float) -> float:
    """The default slice length for an option whose slices cost ``start_up_seconds`` to
    start (its trial's fixed cost plus the checkpoint load a resumed slice adds)."""
    return max(AUTO_SLICE_FLOOR_SECONDS, start_up_seconds / AUTO_SLICE_START_UP_SHARE)


def planning_nodes(cluster: Cluster) -> tuple[NodeSpec, ...]:
    """The cluster's nodes as a planning problem names them."""
    return tuple(NodeSpec(n.name, n.devices, n.model) for n in cluster)


def option_seconds(profile: TaskProfile, option: ProfiledOption, steps: int, resumed: bool,
                   measured: float | None = None, evaluations: int | None = None,
                   restarts: int | None = None) -> float:
    """Seconds for ``steps`` more steps of the task under ``option`` (and its
    ``evaluations``, default: the whole task's): the trial's prediction for one slice,
    plus a resumed slice's start for each of its ``restarts`` (slices that must end on
    the way, at its evaluations and rungs; default: the whole task's), with ``measured``
    (this task's own mean step time under the option) in place of the trial's step time
    where it is known."""
    count = profile.evaluations if evaluations is None else evaluations
    seconds = option.seconds(steps, resumed, profile.evaluation_seconds * count)
    again = profile.restarts if restarts is None else restarts
    if again:  # each a resumed slice's start under this option
        seconds += again * option.seconds(0, resumed=True)
    if measured is not None and option.record.step_seconds is not None:
        seconds += steps * (measured - option.record.step_seconds)
    return seconds


def task_options(profile: TaskProfile, steps: int | None = None, resumed: bool = False,
                 measured: Measured | None = None, evaluations: int | None = None,
                 restarts: int | None = None) -> TaskOptions:
    """The planner's options for ``steps`` remaining steps (default: all), their
    ``evaluations`` and ``restarts`` (default: the whole task's), in milliseconds (what
    problem files have always held, so plans stay the same)."""
    remaining = profile.total_steps if steps is None else steps
    return TaskOptions(profile.task, tuple(
        PlannedOption(o.technique, o.devices, round(max(0.001, option_seconds(
            profile, o, remaining, resumed,
            measured(o.technique, o.devices, o.kind) if measured else None, evaluations,
            restarts)), 3),
            dict(o.knobs), o.kind)
        for o in profile.options))


def profile_problem(profile: Profile) -> PlanningProblem:
    """The planning problem of a profile before anything trained (``dione profile -o``):
    every task that has an option."""
    return PlanningProblem(planning_nodes(profile.cluster), tuple(
        task_options(t) for t in profile.tasks if t.options))


@dataclass
class _Steps:
    """A running mean of measured step times."""

    total: float = 0.0
    count: int = 0

    def add(self, seconds: list[float]) -> None:
        self.total += sum(seconds)
        self.count += len(seconds)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count >= 2 else None


@dataclass
class Estimates:
    """A run's estimates: the profile's options, corrected by the step times each task
    measured (kept as running means, so a re-plan costs no store query per option)."""

    profile: Profile
    # (task, technique, devices, kind of the option's nodes: None where it has none)
    _steps: dict[tuple[str, str, int, str | None], _Steps] = field(default_factory=dict)
    _of_task: dict[str, set[tuple[str, str, int, str | None]]] = field(default_factory=dict)

    @classmethod
    def of_run(cls, profile: Profile, store: RunStore) -> Estimates:
        """Estimates with every step time the run's store holds (each slice's first step,
        which pays for warm-up, left out)."""
        estimates = cls(profile)
        kinds = {n.name: n.model for n in profile.cluster}
        profiled = {t.task for t in profile.tasks}
        for record in store.slices():
            # (A task of the run the workload no longer defines is not planned: its
            # slices taught nothing to look up; a KeyError stopped the resume, review.)
            if record.status == "done" and record.task in profiled:
                estimates.measured_slice(record.task, record.technique,
                                         len(record.device_ids),
                                         store.slice_step_seconds(record.id),
                                         kinds.get(record.node))
        return estimates

    def _option_kind(self, task: str, technique: str, devices: int,
                     node_kind: str | None) -> str | None:
        """The kind of the option a slice on a node of ``node_kind`` ran (None: the
        task's options have no kind, or none is that node's)."""
        option = self.profile.task(task).option(technique, devices, node_kind)
        return None if option is None else option.kind

    def measured_slice(self, task: str, technique: str, devices: int,
                       step_seconds: list[float], node_kind: str | None = None) -> None:
        """A finished slice's step times (its first, the warm-up, left out), on a node
        of ``node_kind``."""
        key = (task, technique, devices, self._option_kind(task, technique, devices,
                                                            node_kind))
        self._steps.setdefault(key, _Steps()).add(step_seconds[1:])
        self._of_task.setdefault(task, set()).add(key)

    def measured_step(self, task: str, technique: str, devices: int,
                      kind: str | None = None) -> float | None:
        found = self._steps.get((task, technique, devices, kind))
        return None if found is None else found.mean

    def expected_step(self, task: str, technique: str, devices: int,
                      kind: str | None = None) -> float | None:
        """The task's step time under an option: as it measured there, else the
        profile's scaled by how much slower (or faster) than profiled the task ran under
        the options it did run (a task slower than profiled is so under every
        technique: a re-plan that moved it to an option it had not tried took that one
        at its profiled speed, and the task hopped from option to option, slower each
        time than planned); None where it ran under none."""
        own = self.measured_step(task, technique, devices, kind)
        if own is not None:
            return own
        profile = self.profile.task(task)
        measured = profiled = 0.0
        for key in self._of_task.get(task, ()):
            steps, ran = self._steps[key], profile.option(key[1], key[2], key[3])
            if steps.mean is not None and ran is not None and ran.record.step_seconds:
                measured += steps.total
                profiled += steps.count * ran.record.step_seconds
        option = profile.option(technique, devices, kind)
        if not profiled or option is None or not option.record.step_seconds:
            return None
        ratio = measured / profiled
        if abs(math.log(ratio)) < math.log(SLOWDOWN_SEEN):
            return None  # within a slice's own spread: the profile stands
        return option.record.step_seconds * ratio

    def option_seconds(self, task: str, option: ProfiledOption, steps: int,
                       resumed: bool, evaluations: int, restarts: int = 0) -> float:
        return option_seconds(self.profile.task(task), option, steps, resumed,
                              self.expected_step(task, option.technique, option.devices,
                                                 option.kind),
                              evaluations, restarts)

    def task_options(self, task: str, steps: int, resumed: bool,
                     evaluations: int, restarts: int = 0) -> TaskOptions:
        return task_options(self.profile.task(task), steps, resumed,
                            lambda technique, devices, kind: self.expected_step(
                                task, technique, devices, kind),
                            evaluations, restarts)

    def slice_steps(self, option: ProfiledOption, remaining: int, slice_steps: int | None,
                    slice_seconds: float | None) -> int:
        """How many steps the next slice under ``option`` trains: ``slice_steps``, or
        about ``slice_seconds`` of them (default: ``auto_slice_seconds``), at most what
        remains."""
        if slice_steps:
            return min(remaining, slice_steps)
        seconds = slice_seconds or auto_slice_seconds(
            option.record.fixed_seconds + option.record.load_seconds)
        if option.record.step_seconds:
            return min(remaining, max(1, math.ceil(seconds / option.record.step_seconds)))
        return remaining
