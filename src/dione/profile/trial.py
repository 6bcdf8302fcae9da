"""One trial: a short real slice in a real gang, through the same path as ``dione train``.

The trial trains ``warmup + measure`` steps from scratch in a scratch run directory,
saves its checkpoint and times a load of it (what the next slice's start pays); its
step times, peak memory and timings become a ``TrialRecord``. A failure is recorded,
not raised: out of memory, crash or timeout, with the failing rank's reason.
"""

from __future__ import annotations

import shutil
import statistics
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dione.launch.local import LOCAL, Launcher
from dione.launch.slice import (
    IN_EVALUATE,
    OUTSIDE_THE_GANG,
    TRAINED_FIRST,
    SliceError,
    SliceRequest,
    TrialProbe,
    run_request,
    total_steps,
)
from dione.profile.catalog import TrialRecord
from dione.profile.options import TrialOptions
from dione.profile.results import TrialEvaluation
from dione.profile.simulated import pipeline_technique
from dione.spec.cluster import Node
from dione.spec.task import Task
from dione.state.disk import DiskFull
from dione.techniques.registry import get_technique

__all__ = ["TrialOptions", "TrialSpec", "run_trial"]

_REASON_CHARS = 4000


@dataclass(frozen=True)
class TrialSpec:
    """A configuration to try: a task (standing for its speed group), technique, knobs,
    device count, and the fingerprint under which its result is stored."""

    task: Task
    technique: str
    knobs: Mapping[str, Any]
    devices: int
    fingerprint: str
    device: str  # the device description the fingerprint was made with
    evaluate: bool = False  # also time the task's evaluation (once per task)

    @property
    def label(self) -> str:
        """``technique xN [knobs that differ from the technique's defaults]``."""
        defaults = get_technique(self.technique).knobs
        knobs = ",".join(f"{k}={v}" for k, v in sorted(self.knobs.items())
                         if k not in defaults or defaults[k] != v)
        return f"{self.technique} x{self.devices}" + (f" [{knobs}]" if knobs else "")


# How running out of memory reads: CUDA's OutOfMemoryError, torch's CPU allocator
# ("can't allocate memory ... (Cannot allocate memory)"), Python's MemoryError.
_OOM_TYPES = ("OutOfMemoryError", "MemoryError")
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")


def _classify(err: SliceError) -> str:
    if err.reason in ("diverged", "node_lost"):
        return err.reason
    text = str(err).lower()
    if err.error_type in _OOM_TYPES or any(words in text for words in _OOM_TEXT):
        return "oom"
    return "timeout" if err.reason == "timeout" else "crash"


def _shorten(text: str) -> str:
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + " ..."


def run_trial(
    spec: TrialSpec, node: Node, device_ids: Sequence[int], scratch: Path, options: TrialOptions,
    cancel: threading.Event | None = None, launcher: Launcher = LOCAL,
    storage: Path | None = None,
) -> tuple[TrialRecord, TrialEvaluation | None]:
    """Run ``spec`` on ``device_ids`` of ``node``; its record and, when asked, what the
    task's evaluation gave (its seconds, its metrics' names, or why it failed). Its store
    lives in ``scratch``, its checkpoint in ``storage`` (a folder the node can reach;
    default ``scratch``)."""
    folder = scratch / spec.fingerprint[:16]
    checkpoints = None if storage is None else storage / spec.fingerprint[:16]
    for path in (folder, checkpoints):
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
    steps = trial_steps(total_steps(spec.task), options)
    base = dict(fingerprint=spec.fingerprint, technique=spec.technique, knobs=dict(spec.knobs),
                devices=spec.devices, device=spec.device)
    try:
        request = SliceRequest(
            spec.task, spec.technique, launcher.placement(node, device_ids), folder,
            knobs=spec.knobs, steps=steps, timeout=options.timeout, keep_checkpoints=1,
            evaluate=False, trial=TrialProbe(options.memory_cap_bytes, True, spec.evaluate),
            storage=checkpoints)
        beside = _others_training(node, launcher)
        result = run_request(request, cancel=cancel, launcher=launcher)
        beside = sorted({*beside, *_others_training(node, launcher)})
    except SliceError as err:
        if err.disk_full is not None:  # not the configuration's doing: never cached
            # Named as given: the trial's own folder is two levels under --storage.
            raise DiskFull(folder.parent if checkpoints is None else checkpoints.parent.parent,
                           err.disk_full,
                           "profiling stopped; free space there (or give --storage a "
                           "larger disk), then run again") from None
        if err.reason == OUTSIDE_THE_GANG:
            # Not the configuration's doing (the store, the launcher, the disk): as
            # before such errors were SliceErrors, it ends the profile, never cached.
            raise
        status = _classify(err)
        reason = str(err)
        if status == "timeout" and IN_EVALUATE in reason:  # told to raise its timeout
            reason = (reason.split("; raise the timeout")[0] + f"; {IN_EVALUATE}: fix "
                      "evaluate if it hangs, else raise --trial-timeout")
            # The evaluation's failure, for its tasks: no other trial runs it again (each
            # of a task's trials hung the trial timeout in it, one after another, while
            # no task trained: a review).
            hung = TrialEvaluation(None, (), f"its evaluate did not return within the "
                                   f"trial's {options.timeout:.0f} s (--trial-timeout): fix "
                                   "evaluate if it hangs, else raise --trial-timeout")
            return TrialRecord(**base, status=status, reason=_shorten(reason),  # type: ignore[arg-type]
                               extra={"trained": True}), hung
        if status == "timeout" and TRAINED_FIRST in reason:  # timed again without it
            return TrialRecord(**base, status=status, reason=_shorten(reason),  # type: ignore[arg-type]
                               extra={"trained": True}), None
        elif status == "timeout" and "; raise the timeout" in reason:
            # Its rank logs go with the trial's folder (and the catalog keeps the text):
            # a way to see them, not a path that leads nowhere.
            reason = (reason.split("; raise the timeout")[0] + "; raise --trial-timeout "
                      "if the trial is just slow, else `dione train WORKLOAD --task "
                      f"{spec.task.name} --technique {spec.technique} --devices "
                      f"{spec.devices}` keeps its ranks' logs, to look for a hang")
        return TrialRecord(**base, status=status, reason=_shorten(reason)), None  # type: ignore[arg-type]
    finally:
        for path in (folder, checkpoints):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
    times = result.step_seconds
    warmup = min(options.warmup_steps, len(times) // 2)
    measured = times[warmup:]
    # The mean, not the median: a slice's time is the sum of its steps, and step times
    # are skewed (a collective or the scheduler now and then adds a long one).
    mean = statistics.fmean(measured)
    median = statistics.median(measured)
    quartiles = statistics.quantiles(measured, n=4) if len(measured) > 1 else [median] * 3
    timings = result.timings
    load = timings.get("load_probed", timings.get("saved", 0.0)) - timings.get("saved", 0.0)
    save = timings.get("saved", 0.0) - timings.get("trained", 0.0)
    evaluation = timings.get("evaluate_seconds")
    # A worker's first slice imports the workload's modules; no later slice pays that.
    once = timings.get("first_imports", 0.0)
    record = TrialRecord(
        **base,  # type: ignore[arg-type]
        status="ok",
        step_seconds=mean,
        spread=(quartiles[2] - quartiles[0]) / median if median > 0 else 0.0,
        measured_steps=len(measured),
        warmup_excess_seconds=max(0.0, sum(times[:warmup]) - warmup * mean),
        fixed_seconds=max(0.0, result.seconds - sum(times) - load - (evaluation or 0.0)
                          - once),
        load_seconds=load,
        save_seconds=save,
        peak_memory_bytes=max(result.peak_memory_bytes) if result.peak_memory_bytes else None,
        trial_seconds=result.seconds,
        extra=_stage_times(result.technique, result.extra, len(times)),
    )
    if beside:  # timed their contention too: this profile's, never the catalog's
        record.extra["beside"] = beside
    if not spec.evaluate or (evaluation is None and not result.evaluation_error):
        return record, None
    # What the task's evaluate returned (its metrics' names) or why it failed: a stopping
    # rule's metric it lacks is named before any slice trains, not at the first rung.
    # Not in the record: the catalog keys trials without the evaluate function.
    return record, TrialEvaluation(evaluation, tuple(sorted(result.evaluation)),
                                   result.evaluation_error)


def trial_steps(total: int, options: TrialOptions) -> int:
    """How many steps a trial of a task of ``total`` steps trains: its warm-up and
    measured steps, or all the task has."""
    return min(options.warmup_steps + options.measure_steps, total)


def measured_steps(total: int, options: TrialOptions) -> int:
    """How many of a trial's steps are timed: those past its warm-up (at most half), as
    ``run_trial`` splits them."""
    steps = trial_steps(total, options)
    return steps - min(options.warmup_steps, steps // 2)


def _others_training(node: Node, launcher: Launcher) -> list[int]:
    """Other dione processes training on this machine's CPU cores, which a CPU trial
    shares (a profile beside another stored its task 4x slower than alone, for every
    later run); GPUs apart are not shared so, and a Ray node is another machine."""
    if node.kind != "cpu" or launcher is not LOCAL:
        return []
    from dione.launch.neighbours import others_training

    return others_training()


def _stage_times(technique: str, extra: Mapping[str, Any], minibatches: int) -> dict[str, Any]:
    """Per-stage action times of a pipeline trial that logged its spans, and the stages
    holding each shared weight, for the schedule simulator; the stage layout of any
    pipeline."""
    kept: dict[str, Any] = {}
    if "stages" in extra:
        kept["stages"] = list(extra["stages"])
    if extra.get("shared_stages"):
        kept["shared_stages"] = [list(stages) for stages in extra["shared_stages"]]
    method = pipeline_technique(technique)
    if extra.get("spans") and method is not None:
        times = method.real_timeline(extra, minibatches).action_times()
        kept["stage_times"] = {"forward": list(times.forward), "backward": list(times.backward),
                               "update": list(times.update)}
    return kept
