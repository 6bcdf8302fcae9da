"""Launching a run's planned slices: which assignments may start now, and starting one as
a gang in a thread of its own (``run_slice``), its progress heard, its cancel its own."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol

from dione import clock
from dione.launch.local import Launcher
from dione.launch.slice import SliceRequest, SliceResult, run_request
from dione.orchestrate.records import RunningSlice, TaskRecord, TaskStatus
from dione.plan.plan import Assignment
from dione.spec.cluster import Node

__all__ = ["SliceLaunching", "SliceStarter", "launchable"]


def launchable(plan: list[Assignment], records: dict[str, TaskRecord]) -> list[Assignment]:
    """Assignments of pending tasks whose devices are free and that come first on each
    of them in the plan's order (a device keeps its planned order: a running task's
    next slices hold their place on it)."""
    busy = {(r.running.assignment.node, d) for r in records.values() if r.running
            for d in r.running.assignment.device_ids}
    first_on: dict[tuple[str, int], str] = {}
    for a in sorted(plan, key=attrgetter("start")):
        if records[a.task].status not in (TaskStatus.PENDING, TaskStatus.RUNNING):
            continue
        for d in a.device_ids:
            first_on.setdefault((a.node, d), a.task)
    ready = []
    for a in plan:
        if records[a.task].status != TaskStatus.PENDING:
            continue
        devices = [(a.node, d) for d in a.device_ids]
        if any(d in busy for d in devices):
            continue
        if all(first_on.get(d) == a.task for d in devices):
            ready.append(a)
            busy.update(devices)
    return ready


class SliceStarter(Protocol):
    """What starts a run's slices: gangs (``SliceLaunching``) or simulated ones."""

    def start(self, record: TaskRecord, running: RunningSlice, node: Node
              ) -> Future[SliceResult]:
        """Train ``running``'s steps of ``record``'s task as its assignment says."""

    def close(self) -> None:
        """Let go of what it holds, once the run has ended."""


class SliceLaunching:
    """Starts slices as gangs on the launcher, each in a thread of the pool."""

    def __init__(self, launcher: Launcher, run_dir: Path, storage: str | None,
                 timeout: float | None) -> None:
        self.launcher = launcher
        self.run_dir = run_dir
        self.storage = storage
        self.timeout = timeout
        # A thread per running gang; nodes may join, and threads start only when needed.
        self.pool = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="dione-gang")

    def start(self, record: TaskRecord, running: RunningSlice, node: Node
              ) -> Future[SliceResult]:
        """Train ``running``'s steps of ``record``'s task as its assignment says."""
        a = running.assignment

        def heard(rank: int, said: dict[str, Any]) -> None:
            if said.get("evaluating"):  # trained and saved: its evaluation runs
                running.in_evaluation = True
                return
            # When it was heard: the steps left count from then, not from the loop's turn.
            running.progress[rank] = {**said, "heard_at": clock.now()}

        request = SliceRequest(
            task=record.task, technique=a.technique,
            placement=self.launcher.placement(node, list(a.device_ids)), run_dir=self.run_dir,
            knobs=dict(a.knobs), steps=running.end_step - running.start_step,
            total=record.total,  # no data set loaded per slice
            timeout=self.timeout, storage=self.storage,
            # eval_every, or a rung judged on an evaluated metric: it evaluates at its end.
            evaluate_at_end=running.evaluates)
        return self.pool.submit(run_request, request, cancel=running.cancel,
                                on_progress=heard, launcher=self.launcher)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
