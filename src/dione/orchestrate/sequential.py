"""Current practice: each task in turn, on all devices of one node, to the end.

This is the baseline dione's planner must beat (Saturn's "current practice"):
``dione run --current-practice``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dione.launch.local import local_placement
from dione.launch.slice import SliceError, SliceRequest, SliceResult, run_request
from dione.orchestrate.options import claim_run_dir
from dione.spec.cluster import Cluster
from dione.spec.task import Task
from dione.state.store import RunStore
from dione.state.summaries import summaries
from dione.techniques.base import Technique
from dione.techniques.registry import get_technique

__all__ = ["TaskOutcome", "choose_technique", "run_sequential"]

PREFERENCE = ("ddp", "fsdp", "single")


@dataclass
class TaskOutcome:
    """How one task of a run ended."""

    task: str
    technique: str | None
    devices: int
    seconds: float = 0.0
    final_loss: float | None = None
    evaluation: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    slices: list[SliceResult] = field(default_factory=list)
    exactness: str = "exact"  # or statistical (dropout's own masks) or INEXACT


def choose_technique(
    task: Task, devices: int, kind: str, forced: str | None = None
) -> tuple[Technique, int]:
    """The technique and device count current practice would use for ``task``:
    the first of ddp, fsdp, single (or ``forced``) that can train it on all ``devices``,
    else single on one device."""
    names = [forced] if forced else list(PREFERENCE)
    for count in (devices, 1):
        for name in names:
            technique = get_technique(name)
            if not technique.check(task, count, {}, kind):  # type: ignore[arg-type]
                return technique, count
    reasons = get_technique(names[0]).check(task, devices, {}, kind)  # type: ignore[arg-type]
    raise SliceError((f"--technique {forced} cannot train task {task.name!r} (leave "
                      "--technique out for current practice's own choice): " if forced else
                      f"no technique of {', '.join(names)} can train task {task.name!r}: ")
                     + "; ".join(reasons))


def run_sequential(
    tasks: Sequence[Task],
    cluster: Cluster,
    run_dir: str | Path,
    *,
    technique: str | None = None,
    slice_steps: int | None = None,
    timeout: float | None = None,
    on_slice: Callable[[Task, SliceResult], None] | None = None,
    storage: str | Path | None = None,
    invalid: Mapping[str, Sequence[str]] | None = None,
) -> list[TaskOutcome]:
    """Train every task to its end, one after another, on the first node's devices.

    A task that fails is recorded with its error and the next one starts: one bad task
    never takes down the others. Tasks already finished in ``run_dir`` are skipped.
    ``invalid``: the workload's tasks validation refused, by task (kept in the store,
    as a planned run keeps them, for ``dione status`` and the report).
    """
    node = cluster.nodes[0]
    outcomes = []
    with claim_run_dir(run_dir), RunStore(run_dir) as store:
        store.set_invalid(dict(invalid or {}))
        for task in tasks:
            outcome = TaskOutcome(task.name, None, node.devices)
            outcomes.append(outcome)
            try:
                method, count = choose_technique(task, node.devices, node.kind, technique)
                outcome.technique, outcome.devices = method.name, count
                placement = local_placement(node, list(range(count)))
                while True:
                    record = store.task(task.name)
                    if record is not None and record.status == "done":
                        break
                    # (beats as it trains: a kill -9 recorded its slice as ending where
                    # it began)
                    result = run_request(SliceRequest(
                        task, method, placement, run_dir, steps=slice_steps, timeout=timeout,
                        storage=storage), store=store, on_progress=store.beat_every())
                    outcome.slices.append(result)
                    outcome.seconds += result.seconds
                    if on_slice is not None:
                        on_slice(task, result)
            except SliceError as err:
                outcome.error = str(err)
                store_record = store.task(task.name)
                # A diverged task is already recorded so, with its step.
                if store_record is not None and err.reason != "diverged":
                    store.set_task_status(task.name, "failed", str(err))
            losses = store.losses(task.name)
            outcome.final_loss = losses[-1][1] if losses else None
            outcome.evaluation = store.evaluation(task.name)
            said = summaries(store, [task.name])
            outcome.exactness = said[0].exactness if said else "exact"
    return outcomes
