"""What a run knows of each task: one record per task, and the run's state the live view
reads (the plan, the estimated finish)."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dione.plan.plan import Assignment
from dione.spec.task import Task

__all__ = ["Cancel", "RunState", "RunningSlice", "TaskRecord", "TaskStatus"]


class Cancel(threading.Event):
    """Set to stop one slice's gang; ``reason`` says why (the store records it)."""

    reason: str | None = None


class TaskStatus(str, Enum):
    """Where a task stands in a run (the run store keeps the same words)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    DIVERGED = "diverged"
    STOPPED = "stopped"  # by its stopping rule, at a rung
    # At a rung of a synchronous or pausing rule, holding no device, until the others
    # reach it or it is promoted (the store keeps it pending: a resumed run waits there
    # again); "paused", as `dione status` and the report call it.
    WAITING = "paused"

    def __str__(self) -> str:
        return self.value

    @property
    def ended(self) -> bool:
        """A task in this state never trains again in this run."""
        return self not in (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING)


@dataclass
class RunningSlice:
    """A slice training now: its assignment, steps, when it should end, what its ranks
    last reported, and the event that stops its gang alone."""

    assignment: Assignment  # times on the run clock
    began: float  # run clock
    start_step: int
    end_step: int
    predicted_end: float  # run clock: the expectation, moved as its pace comes in
    predicted_seconds: float  # as launched: what a stall is measured against
    # Each rank's latest progress record, as its launcher passed it on (gang threads
    # write, the loop reads: each record is replaced whole).
    progress: dict[int, dict[str, Any]] = field(default_factory=dict)
    cancel: Cancel = field(default_factory=Cancel)
    stall_warned: bool = False
    planned_ahead: bool = False  # a re-plan was asked as its end neared (its task goes on)
    at_rung: bool = False  # it ends at a rung of its task's stopping rule
    evaluates: bool = False  # it evaluates where it ends (eval_every, a rung, the end)
    in_evaluation: bool = False  # it trained and saved; its evaluation runs now
    stalled: str | None = None  # why the loop cancelled it (it ran far past its prediction)


@dataclass
class TaskRecord:
    """One task in a run: its length, how far it trained, its status and failures."""

    task: Task
    total: int
    done_steps: int
    status: TaskStatus
    failures: int = 0
    # The step its last failed slice started from, the exception it raised there and the
    # node: the same again (on another node, or where no other can hold it) is the
    # task's own bug, which no retry mends.
    last_raised: tuple[int, str, str] | None = None
    # Nodes it failed on twice alike (the node may be at fault): its retries are planned
    # on the others while one of them holds it.
    avoid: set[str] = field(default_factory=set)
    # Its failures per node, and how many were forgiven as a faulty node's doing (at
    # most ``max_failures``: a bug every task shares looks like faulty nodes too).
    failed_on: dict[str, int] = field(default_factory=dict)
    forgiven: int = 0
    last_loss: float | None = None
    # Some of its steps trained (or train now) under a technique that is not exact.
    inexact: bool = False
    running: RunningSlice | None = None

    def evaluations(self, after: int, until: int) -> int:
        """How many times the task evaluates after step ``after``, up to ``until``."""
        return sum(1 for s in self.task.evaluation_steps(self.total) if after < s <= until)

    def restarts(self, after: int, until: int, every: int | None = None) -> int:
        """How many slices must end after step ``after``, before ``until``, and start
        again: at its evaluations and rungs between, and (``every``: ``slice_steps``)
        each stretch between those cut every so many steps."""
        ends = sorted(s for s in self.task.slice_ends(self.total) if after < s < until)
        if not every:
            return len(ends)
        slices, at = 0, after
        for end in [*ends, until]:
            slices += math.ceil((end - at) / every)
            at = end
        return max(0, slices - 1)

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def remaining(self) -> int:
        return self.total - self.done_steps


@dataclass
class RunState:
    """What the loop knows; read by the live view (from the loop's thread only)."""

    records: dict[str, TaskRecord]
    plan: list[Assignment]  # times on the run clock
    estimated_finish: float = 0.0
    clock_zero: float = 0.0  # the wall time of run-clock 0 in this session

    def with_status(self, *statuses: TaskStatus) -> list[TaskRecord]:
        return [r for r in self.records.values() if r.status in statuses]

    @property
    def running(self) -> dict[str, RunningSlice]:
        return {r.name: r.running for r in self.records.values() if r.running is not None}

    def any_pending(self) -> bool:
        return any(r.status == TaskStatus.PENDING for r in self.records.values())
