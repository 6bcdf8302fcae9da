"""Train one slice of one task on given devices, recorded in the run store.

This is the single path by which anything trains: ``dione train``, the trial runner
and the orchestrator all call ``run_slice``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dione.launch.local import GangError, Placement, run_local_gang
from dione.spec.cluster import Node
from dione.spec.devices import available_cores, cores_for_slot, threads_per_slot
from dione.spec.task import Task
from dione.state.checkpoint import prune_checkpoints
from dione.state.store import RunStore
from dione.techniques.base import SliceSpec, Technique
from dione.techniques.registry import get_technique

__all__ = [
    "SliceError",
    "SliceResult",
    "TrialSettings",
    "local_placement",
    "run_slice",
    "total_steps",
]


class SliceError(RuntimeError):
    """A slice that cannot start or did not finish; the message says why."""

    def __init__(self, message: str, reason: str = "refused", error_type: str | None = None):
        super().__init__(message)
        self.reason = reason  # refused | raised | signal | exit | timeout
        self.error_type = error_type  # the failing rank's exception type, when it raised


@dataclass(frozen=True)
class TrialSettings:
    """What a profiling trial adds to a slice."""

    memory_cap_bytes: int | None = None
    probe_load: bool = True
    evaluate: bool = False


@dataclass(frozen=True)
class SliceResult:
    """A finished slice: its steps, per-step losses and times, checkpoint and timings."""

    slice_id: int
    task: str
    technique: str
    start_step: int
    end_step: int
    losses: list[float]
    step_seconds: list[float]
    checkpoint: str | None
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: list[int] = field(default_factory=list)
    evaluation: dict[str, float] = field(default_factory=dict)
    evaluation_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what the technique adds


def local_placement(node: Node, device_ids: Sequence[int]) -> Placement:
    """A placement on this machine: each CPU slot pinned to its share of the cores."""
    cores = available_cores()
    if node.kind == "cuda":
        return Placement(node.name, "cuda", tuple(device_ids),
                         threads_per_slot(node.devices, len(cores)))
    slots = max(node.devices, max(device_ids) + 1)
    pins = [cores_for_slot(i, slots, cores) for i in device_ids]
    return Placement(
        node.name, "cpu", tuple(device_ids), threads_per_slot(slots, len(cores)),
        None if any(p is None for p in pins) else tuple(tuple(p) for p in pins if p),
    )


def total_steps(task: Task) -> int:
    """The task's length in steps (reads the data set's size when given in epochs)."""
    if task.steps is not None:
        return task.steps
    return task.total_steps(len(task.data()))  # type: ignore[arg-type]


def run_slice(
    task: Task,
    technique: str | Technique,
    run_dir: str | Path,
    placement: Placement,
    *,
    knobs: Mapping[str, Any] | None = None,
    steps: int | None = None,
    timeout: float | None = None,
    keep_checkpoints: int = 2,
    evaluate: bool = True,
    store: RunStore | None = None,
    trial: TrialSettings | None = None,
    cancel: threading.Event | None = None,
    on_begin: Callable[[int, Path], None] | None = None,
) -> SliceResult:
    """Train ``task`` from its latest checkpoint in ``run_dir`` for ``steps`` steps (None:
    to the end) under ``technique`` on ``placement``; record it; raise SliceError if it
    cannot start or fails (the store then says why, and no checkpoint is lost).

    ``evaluate``: run the task's evaluation when the slice ends the task; ``trial``
    adds what the trial runner measures (a memory cap, a load probe, an evaluation
    whatever the step). Setting ``cancel`` stops the gang; the slice is then recorded
    as interrupted and GangInterrupted raised. ``on_begin(slice_id, folder)`` is called
    once the slice is recorded, before its gang starts (its workers write progress
    files into ``folder``)."""
    method = get_technique(technique) if isinstance(technique, str) else technique
    knobs = dict(knobs or {})
    devices = len(placement.device_ids)
    reasons = method.check(task, devices, knobs, placement.kind)
    if reasons:
        raise SliceError(f"cannot train task {task.name!r} with {method.name} on {devices} "
                         "device(s): " + "; ".join(reasons))
    own_store = store is None
    db = RunStore(run_dir) if store is None else store
    try:
        total = total_steps(task)
        db.register_task(task.name, total, task.batch_size, task.hyperparameters)
        db.recover_interrupted()
        latest = db.latest_checkpoint(task.name)
        start = latest.step if latest else 0
        if start >= total:
            raise SliceError(f"task {task.name!r} is already trained to step {start} of {total} "
                             f"in {run_dir}; nothing to do")
        if steps is not None and steps < 1:
            raise SliceError(f"steps must be positive, not {steps}")
        end = total if steps is None else min(total, start + steps)
        spec = SliceSpec(
            task=task, technique=method, knobs=knobs, device_kind=placement.kind,
            device_ids=placement.device_ids, start_step=start, end_step=end,
            resume_from=latest.path if latest else None, run_dir=str(Path(run_dir).resolve()),
            evaluate=task.evaluate is not None and (
                (evaluate and end == total) or (trial is not None and trial.evaluate)),
            memory_cap_bytes=trial.memory_cap_bytes if trial else None,
            probe_load=trial.probe_load if trial else False,
        )
        slice_id = db.begin_slice(task.name, method.name, method.resolve(knobs), placement.node,
                                  placement.device_ids, start, end)
        began = time.perf_counter()
        folder = Path(run_dir) / "logs" / f"slice-{slice_id:06d}-{task.name}"
        if on_begin is not None:
            on_begin(slice_id, folder)
        try:
            outcomes = run_local_gang(spec, placement, folder, timeout, cancel)
        except GangError as err:
            message = (f"task {task.name!r}, steps {start}-{end}, {method.name} on "
                       f"{placement.node} devices {list(placement.device_ids)}: {err}")
            db.fail_slice(slice_id, message)
            raise SliceError(message, err.reason, err.error_type) from err
        except BaseException as err:
            db.fail_slice(slice_id, f"interrupted: {type(err).__name__}", status="interrupted")
            raise
        seconds = time.perf_counter() - began
        lead = outcomes[0]
        evaluation_error = lead.extra.get("evaluation_error")
        peak = [o.peak_memory_bytes for o in outcomes]
        db.finish_slice(slice_id, lead.losses, lead.step_seconds, lead.checkpoint,
                        {**lead.timings, "wall": seconds}, max(peak), lead.evaluation)
        if evaluation_error:
            db.set_task_status(task.name, "done" if end == total else "pending",
                               f"evaluation failed:\n{evaluation_error}")
        gone = prune_checkpoints(run_dir, task.name, keep_checkpoints)
        if gone:
            db.forget_checkpoints(task.name, [str(p) for p in gone])
        return SliceResult(
            slice_id=slice_id, task=task.name, technique=method.name, start_step=start,
            end_step=end, losses=lead.losses, step_seconds=lead.step_seconds,
            checkpoint=lead.checkpoint, seconds=seconds, timings=lead.timings,
            peak_memory_bytes=peak, evaluation=lead.evaluation,
            evaluation_error=evaluation_error,
            extra={k: v for k, v in lead.extra.items() if k != "evaluation_error"},
        )
    finally:
        if own_store:
            db.close()
