"""Slices on a virtual cluster: each takes the time its option's profile predicts, times
what the scenario says, on the virtual clock; it is recorded in the run store as a real
slice is (steps, losses, step times), with no process, gang or checkpoint."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from numbers import Integral
from pathlib import Path
from typing import Any

from dione.launch.gang import GangInterrupted
from dione.launch.local import Placement
from dione.launch.slice import SliceError, SliceResult
from dione.orchestrate.records import Cancel, RunningSlice, TaskRecord
from dione.profile.results import Profile
from dione.simulate.scenario import Scenario
from dione.simulate.virtual_clock import VirtualClock
from dione.spec.cluster import Node
from dione.state.store import RunStore
from dione.techniques.registry import get_technique

__all__ = ["SimulatedLaunching", "VirtualCluster"]


class VirtualCluster:
    """The launcher side of a simulated run (``dione.launch.local.Launcher``): it starts
    no gang; its nodes join and leave when the scenario says."""

    def __init__(self, clock: VirtualClock, scenario: Scenario,
                 nodes: Sequence[Node] = ()) -> None:
        self.clock = clock
        self.scenario = scenario
        self.nodes = list(nodes)
        self.forgotten: set[str] = set()

    def lost(self, node: str) -> bool:
        at = self.scenario.node_losses.get(node)
        return at is not None and at <= self.clock.now()

    def placement(self, node: Node, device_ids: Any) -> Placement:
        raise RuntimeError("a virtual cluster places no gang")

    def run_gang(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a virtual cluster runs no gang")

    def warm_up(self, node: Node) -> None:
        return None

    def forget_node(self, name: str) -> None:
        self.forgotten.add(name)

    def alive_nodes(self) -> list[Node] | None:
        """The nodes there now: those that have joined and not been lost."""
        if not self.scenario.node_joins:
            return None  # none joins: the run's cluster stands
        now = self.clock.now()
        return [n for n in self.nodes if self.scenario.node_joins.get(n.name, 0.0) <= now
                and not self.lost(n.name)]

    def next_join(self) -> float | None:
        """When the next node the scenario has join comes (None: no more will)."""
        now = self.clock.now()
        later = [at for at in self.scenario.node_joins.values() if at > now]
        return min(later, default=None)

    def joining_later(self) -> list[Node]:
        """The nodes the scenario has join after now."""
        now = self.clock.now()
        return [n for n in self.nodes if self.scenario.node_joins.get(n.name, 0.0) > now]

    def present_at_start(self) -> list[Node]:
        """The nodes the run starts with (those the scenario has join later, or lost at
        its start, left out: one lost at 0 s was planned, its slices failing at once)."""
        return [n for n in self.nodes if self.scenario.node_joins.get(n.name, 0.0) <= 0
                and not self.lost(n.name)]

    def shutdown(self) -> None:
        return None


class SimulatedLaunching:
    """Starts slices on the virtual clock (``dione.orchestrate.launching.SliceLaunching``'s
    part for a simulated run)."""

    def __init__(self, run_dir: Path, profile: Profile, clock: VirtualClock,
                 scenario: Scenario, cluster: VirtualCluster) -> None:
        self.store = RunStore(run_dir)
        self.profile = profile
        self.clock = clock
        self.scenario = scenario
        self.cluster = cluster
        seed = scenario.seed  # a numpy integer is no seed random.Random takes
        self.rng = random.Random(int(seed) if isinstance(seed, Integral) else seed)
        self.failures_left = dict(scenario.failures)
        self.curves = scenario.assigned_curves([t.task for t in profile.tasks])

    def start(self, record: TaskRecord, running: RunningSlice, node: Node
              ) -> Future[SliceResult]:
        a = running.assignment
        name, start, end = record.name, running.start_step, running.end_step
        task_profile = self.profile.task(name)
        option = task_profile.option(a.technique, a.devices, node.model)
        assert option is not None
        trial = option.record
        assert trial.step_seconds is not None  # a profile's options are feasible
        factor = self.scenario.factor(name, a.node, self.rng)
        step = trial.step_seconds * factor
        before = (trial.fixed_seconds + trial.warmup_excess_seconds
                  + (trial.load_seconds if start > 0 else 0.0))
        trained = before + (end - start) * step  # its seconds to its save
        seconds = trained + (task_profile.evaluation_seconds if running.evaluates else 0.0)
        technique = get_technique(a.technique)
        knobs = technique.resolve(a.knobs)
        slice_id = self.store.begin_slice(name, a.technique, knobs, a.node, a.device_ids,
                                          start, end, technique.inexactness(knobs))
        future: Future[SliceResult] = Future()
        future.set_running_or_notify_cancel()
        self.clock.watch(future)
        began = self.clock.now()
        where = f"task {name!r}, steps {start}-{end}, {a.technique} on {a.node} devices " \
                f"{list(a.device_ids)}"
        lost_at = self.scenario.node_losses.get(a.node)

        def fail(message: str, reason: str, error_type: str | None = None) -> None:
            if future.done():  # cancelled as stalled before
                return
            self.store.fail_slice(slice_id, message)
            future.set_exception(SliceError(message, reason, error_type))

        def interrupted() -> None:
            """Cancelled by the run loop (stalled, far past its prediction), as a real
            gang is: the slice recorded interrupted, nothing of it kept; in its
            evaluation, its training kept and the evaluation owed, as a real slice's (it
            was retried whole: a regression review)."""
            if future.done():
                return
            if running.in_evaluation:
                finish(trained, "the evaluation was cancelled as stalled, "
                       "far past its prediction (simulated)")
                return
            self.store.fail_slice(slice_id, f"interrupted: {running.cancel.reason}",
                                  status="interrupted")
            future.set_exception(GangInterrupted(running.cancel.reason))

        running.cancel = _VirtualCancel(lambda: self.clock.at(self.clock.now(), interrupted))

        def finish(took: float = seconds, evaluation_error: str | None = None) -> None:
            if future.done():
                return
            losses = self.scenario.losses(name, record.total, start, end,
                                          self.curves.get(name))
            self.store.finish_slice(slice_id, losses, [step] * (end - start), None,
                                    {"wall": took, "simulated": 1.0},
                                    evaluation_error=evaluation_error)
            future.set_result(SliceResult(
                slice_id=slice_id, task=name, technique=a.technique, start_step=start,
                end_step=end, losses=losses, step_seconds=[step] * (end - start),
                checkpoint=None, seconds=took, timings={"wall": took},
                evaluation_error=evaluation_error, inexactness=technique.inexactness(knobs)))

        if running.evaluates and task_profile.evaluation_seconds > 0:
            # Trained and saved: the evaluation runs now, as rank 0 tells a real run.
            self.clock.at(began + trained, functools.partial(_evaluating, future, running))

        # Progress as ranks report it (a real rank: at most once a second): the pace from
        # the second step, then every tenth of the slice, so the loop sees a slow slice.
        count = end - start
        for k in sorted({2, *(round(j * count / 10) for j in range(1, 10))}):
            if 2 <= k < count:
                at = began + before + k * step
                said: dict[str, Any] = {"step": start + k, "loss": None,
                                        "seconds": before + k * step,
                                        "seconds_per_step": step, "heard_at": at}
                self.clock.at(at, functools.partial(_heard, future, running, said))
        if a.node in self.scenario.faulty_nodes:
            # As a broken accelerator fails: the same exception from the same step, at
            # the slice's start, however often the node is given it.
            self.clock.at(began + before, lambda: fail(
                f"{where}: failed on a faulty node (simulated)\nRuntimeError: CUDA error: "
                f"uncorrectable ECC error encountered (simulated: node {a.node} is faulty)",
                "raised", "RuntimeError"))
        elif lost_at is not None and lost_at < began + seconds:
            self.clock.at(lost_at, lambda: fail(f"{where}: node {a.node} was lost "
                                                "(simulated)", "node_lost"))
        elif self.failures_left.get(name, 0) > 0:
            self.failures_left[name] -= 1
            # A transient failure (a rank lost), retried up to --max-failures: not an
            # exception the task raises, which a retry from the same step raises again.
            # As its last step ends, before the save (at the slice's end it fell inside
            # an evaluation, where a real slice that exits keeps its training: review).
            self.clock.at(began + trained, lambda: fail(
                f"{where}: an injected failure (simulated)", "exit"))
        else:
            self.clock.at(began + seconds, finish)
        return future

    def close(self) -> None:
        self.store.close()


class _VirtualCancel(Cancel):
    """A slice's cancel event that ends its simulated slice when set."""

    def __init__(self, on_set: Callable[[], None]) -> None:
        super().__init__()
        self._on_set = on_set

    def set(self) -> None:
        if not self.is_set():
            super().set()
            self._on_set()


def _evaluating(future: Future[SliceResult], running: RunningSlice) -> None:
    """A simulated slice's training done, its evaluation begun (as long as it runs)."""
    if not future.done():
        running.in_evaluation = True


def _heard(future: Future[SliceResult], running: RunningSlice, said: dict[str, Any]) -> None:
    """A simulated rank's progress report, as long as its slice runs."""
    if not future.done():
        running.progress[0] = said
