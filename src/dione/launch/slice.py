"""Train one slice of one task on given devices, recorded in the run store.

This is the single path by which anything trains: ``dione train``, the trial runner
and the orchestrator all call ``run_slice``.
"""

from __future__ import annotations

import functools
import math
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec

from dione import clock
from dione.launch.local import (
    LOCAL,
    GangError,
    GangInterrupted,
    Launcher,
    OnProgress,
    Placement,
    local_placement,
)
from dione.spec.settings import SAID_SETTINGS, kept_as_recorded, read_changes, training_settings
from dione.spec.task import Task
from dione.state.checkpoint import (
    CorruptCheckpoint,
    file_times,
    prune_checkpoints,
    quarantine,
    verify_checkpoint,
)
from dione.state.slice_logs import log_folder
from dione.state.sqlite import StateFileError
from dione.state.store import CheckpointRecord, RunStore
from dione.techniques.base import SliceOutcome, SliceSpec, Technique
from dione.techniques.exactness import unsaid_split
from dione.techniques.registry import get_technique

__all__ = [
    "SliceError",
    "SliceRequest",
    "SliceResult",
    "TrialProbe",
    "local_placement",
    "run_request",
    "run_slice",
    "total_steps",
]


# What a rank raises when its disk is full (torch's checkpoint writer on a full disk: a
# short write, then its position check, "unexpected pos N vs M", or "file write failed").
_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "unexpected pos",
              "file write failed")
# What a rank raises when no retry can succeed: the disk or the permissions must change.
_PERMANENT_TYPES = ("PermissionError", "UnsafePathError", "CheckpointMismatch")
_PERMANENT_TEXT = ("Read-only file system", "Permission denied", *_FULL_TEXT)
# Where a checkpoint's write fails: torch's checkpoint writer, dione's own files beside it.
_CHECKPOINT_WRITERS = ("CheckpointException", "torch/distributed/checkpoint",
                       "dione/state/checkpoint.py")


class SliceError(RuntimeError):
    """A slice that cannot start or did not finish; the message says why."""

    def __init__(self, message: str, reason: str = "refused", error_type: str | None = None):
        super().__init__(message)
        # refused | trained (nothing left) | raised | signal | exit | timeout | diverged
        # | outside
        self.reason = reason
        self.error_type = error_type  # the failing rank's exception type, when it raised

    @property
    def disk_full(self) -> str | None:
        """Where it failed writing a checkpoint to a full disk (no slice can write there
        until freed): the line of its error that says so; None where it did not (a full
        /dev/shm under a data loader's workers is the task's own failure)."""
        text = str(self)
        if not any(marker in text for marker in _CHECKPOINT_WRITERS):
            return None
        return next((line.strip() for line in text.splitlines()
                     if any(full in line for full in _FULL_TEXT)), None)

    @property
    def retryable(self) -> bool:
        """Whether running the slice again could succeed: not for a diverged loss, nor
        for a disk that is read-only or full, nor for a permission refused."""
        if self.reason == "diverged":
            return False
        return not (self.error_type in _PERMANENT_TYPES
                    or any(text in str(self) for text in _PERMANENT_TEXT))


@dataclass(frozen=True)
class TrialProbe:
    """What a profiling trial adds to a slice: a memory cap, a timed load of the
    checkpoint it saved, an evaluation whatever the step."""

    memory_cap_bytes: int | None = None
    probe_load: bool = True
    evaluate: bool = False


@dataclass(frozen=True)
class SliceRequest:
    """One slice to train: the task, under what technique and knobs, where, how far.

    ``steps``: how many (None: to the task's end); ``total``: the task's length where
    the caller knows it (else read from the data set's size for a task given in epochs:
    the data factory runs again); ``evaluate``: run the task's evaluation when the slice
    ends the task (and, with ``evaluate_at_end``, wherever it ends); ``trial``: what a
    profiling trial adds; ``storage``: where checkpoints go, a folder every node of the
    cluster can reach (default: ``run_dir``; elsewhere, in a folder of this run's own,
    ``RunStore.checkpoint_root``); the run store stays in ``run_dir``."""

    task: Task
    technique: str | Technique
    placement: Placement
    run_dir: str | Path
    knobs: Mapping[str, Any] = field(default_factory=dict)
    steps: int | None = None
    total: int | None = None
    timeout: float | None = None
    keep_checkpoints: int = 2
    evaluate: bool = True
    trial: TrialProbe | None = None
    storage: str | Path | None = None
    evaluate_at_end: bool = False  # also where the slice does not end the task (a rung)


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
    warnings: list[str] = field(default_factory=list)  # e.g. a corrupt checkpoint set aside
    # What may not do what the task meant: a keep_best its evaluation did not return.
    doubts: list[str] = field(default_factory=list)
    inexactness: str | None = None  # how it did not train as single would (None: it did)


def _intact_checkpoint(db: RunStore, task: str, warnings: list[str]
                       ) -> CheckpointRecord | None:
    """The task's newest checkpoint whose files match their digests; each corrupt one on
    the way is quarantined, forgotten by the store and named in ``warnings``."""
    while (latest := db.latest_checkpoint(task)) is not None:
        try:
            verify_checkpoint(latest.path)
            return latest
        except CorruptCheckpoint as err:
            moved = quarantine(latest.path)
            db.forget_checkpoints(task, [latest.path])
            older = db.latest_checkpoint(task)
            warnings.append(f"{err}; it was moved to {moved} and task {task!r} resumes from "
                            + (f"step {older.step}" if older else "scratch"))
    return None


def total_steps(task: Task) -> int:
    """The task's length in steps (reads the data set's size when given in epochs)."""
    if task.steps is not None:
        return task.steps
    return task.total_steps(len(task.data()))  # type: ignore[arg-type]


_P = ParamSpec("_P")
# SliceError's reason for what failed around the gang (the task's data factory, the
# store, the launcher), not in it: retried by the runner, never cached by a trial.
OUTSIDE_THE_GANG = "outside"


def _one_task_fails(run: Callable[_P, SliceResult]) -> Callable[_P, SliceResult]:
    """``run`` with anything it raises but a cancel or an interrupt as a SliceError: a
    task whose data factory raises, or whose checkpoint folder cannot be read, fails its
    own slice (retried, then given up) and never the run of every other task."""

    @functools.wraps(run)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> SliceResult:
        try:
            return run(*args, **kwargs)
        except (SliceError, GangInterrupted, StateFileError):
            raise  # a state file's damage (or a full disk under it) stops the run
        except Exception as err:
            request = args[0] if args else kwargs.get("request")
            task = getattr(request, "task", request)
            raise SliceError(f"task {getattr(task, 'name', task)!r}: the slice failed outside "
                             f"its gang: {type(err).__name__}: {err}", OUTSIDE_THE_GANG,
                             type(err).__name__) from err

    return guarded


def run_slice(task: Task, technique: str | Technique, run_dir: str | Path,
              placement: Placement, **fields: Any) -> SliceResult:
    """``run_request`` of the ``SliceRequest`` these make (``fields``: its other fields,
    and ``run_request``'s keywords): the call to make by hand, as the tests do."""
    hooks = {k: fields.pop(k) for k in ("store", "cancel", "on_begin", "launcher",
                                       "on_progress") if k in fields}
    return run_request(SliceRequest(task, technique, placement, run_dir, **fields), **hooks)


@_one_task_fails
def run_request(
    request: SliceRequest,
    *,
    store: RunStore | None = None,
    cancel: threading.Event | None = None,
    on_begin: Callable[[int, Path], None] | None = None,
    launcher: Launcher | None = None,
    on_progress: OnProgress | None = None,
) -> SliceResult:
    """Train ``request.task`` from its latest checkpoint in ``request.run_dir`` as the
    request says; record it; raise SliceError if it cannot start or fails (the store
    then says why, and no checkpoint is lost).

    ``store``: the run store to record in (default: the run directory's, opened and
    closed here). Setting ``cancel`` stops the gang; the slice is then recorded as
    interrupted and GangInterrupted raised. ``on_begin(slice_id, folder)`` is called
    once the slice is recorded, before its gang starts (its ranks' logs go to
    ``folder``); ``on_progress(rank, record)`` hears each rank's progress while it
    trains. ``launcher``: what runs the gang (default: this machine's warm workers)."""
    task, technique, placement, run_dir = (request.task, request.technique,
                                           request.placement, request.run_dir)
    method = get_technique(technique) if isinstance(technique, str) else technique
    knobs = dict(request.knobs)
    devices = len(placement.device_ids)
    reasons = method.check(task, devices, knobs, placement.kind)
    if reasons:
        raise SliceError(f"cannot train task {task.name!r} with {method.name} on {devices} "
                         "device(s): " + "; ".join(reasons))
    own_store = store is None
    db = RunStore(run_dir) if store is None else store
    try:
        spec, latest, warnings = _slice_spec(db, request, method, knobs)
        start, end = spec.start_step, spec.end_step
        inexactness = method.task_inexactness(task, devices, method.resolve(knobs))
        slice_id = db.begin_slice(task.name, method.name, method.resolve(knobs), placement.node,
                                  placement.device_ids, start, end, inexactness)
        began = clock.now()
        folder = log_folder(Path(run_dir), slice_id, task.name)
        if on_begin is not None:
            on_begin(slice_id, folder)
        where = (f"{method.name} on {placement.node} devices "
                 f"{list(placement.device_ids)}")
        # Rank 0's outcome once trained and saved, while its evaluation runs (a real
        # slice's: a trial that cannot evaluate is timed out, as it was, never cached).
        evaluating: list[SliceOutcome] = []
        # When rank 0 had trained and saved, its evaluate not returned since.
        in_evaluate: list[float] = []

        def heard(rank: int, record: dict[str, Any]) -> None:
            if "trained" in record:
                in_evaluate.append(clock.now())
                if request.trial is None:
                    evaluating.append(record["trained"])
                    if on_progress is not None:  # (a stall now is the evaluation's)
                        on_progress(rank, {"evaluating": True})
            elif "evaluated" in record:  # whatever ends the gang now, not its evaluate
                evaluating.clear()
                in_evaluate.clear()
            elif on_progress is not None:
                on_progress(rank, record)

        try:
            outcomes = (launcher or LOCAL).run_gang(spec, placement, folder, request.timeout,
                                                    cancel, heard)
            seconds = clock.now() - began
        except GangError as err:
            if not (evaluating and err.reason in EVALUATION_LOST):
                # A trial that hung in evaluate was told to raise its timeout (a review):
                # one whose evaluation ran at least half of it (a slow build and training
                # with a quick evaluate after were blamed on evaluate: a regression review).
                trained = bool(request.trial is not None and in_evaluate
                               and err.reason == "timeout")
                hung = trained and clock.now() - in_evaluate[-1] >= 0.5 * (request.timeout or 0)
                message = (f"task {task.name!r}, steps {start}-{end}, {where}: {err}"
                           + (f"; {IN_EVALUATE}" if hung else f"; {TRAINED_FIRST}"
                              if trained else "")
                           + "".join(f"\n{w}" for w in warnings))
                db.fail_slice(slice_id, message)
                raise SliceError(message, err.reason, err.error_type) from err
            ended = (f"stopped by the slice's timeout of {request.timeout or 0:g} s"
                     if err.reason == "timeout" else
                     "its process was killed" if err.reason == "signal" else
                     "its process exited" if err.reason == "exit" else
                     f"its process failed: {str(err).strip().splitlines()[0]}")
            outcomes = [_evaluation_lost(evaluating[-1], ended, request, end)]
            seconds = _trained_seconds(outcomes[0], clock.now() - began)
        except BaseException as err:
            why = getattr(cancel, "reason", None) or type(err).__name__
            lead = evaluating[-1] if evaluating else None
            stalled = why.startswith(STALLED)
            if lead is not None and stalled:  # a loss not finite: diverged, not retried
                _refuse_divergence(db, slice_id, spec, lead, latest, where, warnings)
            if lead is None or not all(math.isfinite(x) for x in lead.losses):
                db.fail_slice(slice_id, f"interrupted: {why}", status="interrupted")
                raise
            # Stopped in its evaluation: its training stands (recorded; the evaluation
            # owed), whether the run goes on (a stall) or stops (Ctrl-C: a resume found
            # the task untrained and trained the slice again, review).
            lead = _evaluation_lost(lead, "cancelled as stalled, far past its prediction"
                                    if stalled else None, request, end)
            _say_unsaid_split(method, task, devices, knobs, inexactness, lead)
            result = _record_finished(db, slice_id, request, spec, method.name, [lead],
                                      _trained_seconds(lead, clock.now() - began),
                                      warnings, inexactness)
            if stalled:
                return result
            raise
        _refuse_divergence(db, slice_id, spec, outcomes[0], latest, where, warnings)
        _say_unsaid_split(method, task, devices, knobs, inexactness, outcomes[0])
        return _record_finished(db, slice_id, request, spec, method.name, outcomes, seconds,
                                warnings, inexactness)
    finally:
        if own_store:
            db.close()


def _best_to_keep(db: RunStore, task: Task, evaluation: dict[str, float],
                  evaluation_error: str | None, step: int,
                  doubts: list[str]) -> CheckpointRecord | None:
    """The checkpoint ``task``'s ``keep_best`` spares (None: none), its metric and mode
    recorded for export (and that it has none, once it had one); a doubt where the
    slice's evaluation lacked that metric."""
    metric, mode = task.keep_best, task.best_mode()
    recorded = db.keep_best(task.name)
    if metric and mode and recorded != (metric, mode):
        db.set_keep_best(task.name, metric, mode)
    elif not (metric and mode) and recorded is not None and recorded[0] is not None:
        db.set_keep_best(task.name, None, None)  # removed: pruned by none from now on
    if not metric or not mode:
        return None
    if evaluation and not evaluation_error and metric not in evaluation:
        returned = ", ".join(repr(m) for m in sorted(evaluation))
        doubts.append(f"{task.name}: keep_best names {metric!r}, which its evaluate did not "
                      f"return at step {step} (it returned {returned}): no checkpoint is "
                      "kept for being best; name one of those")
    found = db.best_checkpoint(task.name, metric, mode)
    return found[0] if found else None


def _prune_logs(run_dir: Path, task: str, db: RunStore, keep: int) -> None:
    """Remove the logs of the task's slices that trained to their end, but its last
    ``keep`` (those of its newest checkpoints; one kept for being best keeps no log: its
    store rows say how it trained): a sweep of short slices left a folder a slice, for
    ever. A failed or interrupted slice's log stays: it says why."""
    done = [s.id for s in db.slices(task) if s.status == "done"]
    for slice_id in done[:-keep] if keep > 0 else done:
        shutil.rmtree(log_folder(run_dir, slice_id, task), ignore_errors=True)


def _slice_spec(db: RunStore, request: SliceRequest, method: Technique, knobs: dict[str, Any]
                ) -> tuple[SliceSpec, CheckpointRecord | None, list[str]]:
    """What the gang trains: from the task's latest intact checkpoint, ``request.steps``
    (or all) of what is left; that checkpoint; warnings about those passed over."""
    task, placement, trial = request.task, request.placement, request.trial
    total = total_steps(task) if request.total is None else request.total
    settings = training_settings(task)
    resumed = db.latest_checkpoint(task.name) is not None
    warnings = read_changes(task.name, db.changed_settings(task.name, settings),
                            resumed=resumed)
    try:
        db.register_task(task.name, total, task.batch_size, task.hyperparameters, settings,
                         said_only=SAID_SETTINGS, kept=kept_as_recorded(False, resumed))
    except ValueError as err:  # the run directory holds the task trained otherwise
        raise SliceError(str(err), "refused") from None
    record = db.task(task.name)
    if record is not None and record.status == "stopped":  # its rule's decision stands
        latest = db.latest_checkpoint(task.name)
        raise SliceError(
            f"task {task.name!r} was stopped by its stopping rule"
            + (f" at step {latest.step}" if latest else "") + f" in {request.run_dir} ("
            f"{(record.error or 'its rung').splitlines()[0]}): a stopped task never trains "
            "again there, so the sweep's decisions stand; to train the configuration on, "
            "train it anew in a run directory of its own (--out DIR); its weights at the "
            "rung: dione export --latest", "refused")
    db.recover_interrupted()
    latest = _intact_checkpoint(db, task.name, warnings)
    start = latest.step if latest else 0
    if start >= total:
        raise SliceError(f"task {task.name!r} is already trained to step {start} of {total} "
                         f"in {request.run_dir}; nothing to do (--out DIR trains it anew in a "
                         "run directory of its own)", "trained")
    if request.steps is not None and request.steps < 1:
        raise SliceError(f"steps must be positive, not {request.steps}")
    end = total if request.steps is None else min(total, start + request.steps)
    spec = SliceSpec(
        task=task, technique=method, knobs=knobs, device_kind=placement.kind,
        device_ids=placement.device_ids, start_step=start, end_step=end,
        resume_from=latest.path if latest else None,
        run_dir=str(db.checkpoint_root(request.storage)),
        evaluate=task.evaluate is not None and (
            (request.evaluate and (end == total or request.evaluate_at_end))
            or (trial is not None and trial.evaluate)),
        memory_cap_bytes=trial.memory_cap_bytes if trial else None,
        probe_load=trial.probe_load if trial else False,
        cut=db.cut(task.name, len(placement.device_ids)),
    )
    return spec, latest, warnings


# A gang that ended so once it trained and saved, before its evaluation returned: the
# evaluation hung or its process died (a node lost may have taken the checkpoint with
# it: that is retried as before).
EVALUATION_LOST = ("timeout", "signal", "exit", "raised")
# How the orchestrator's cancel of a stalled slice begins its reason.
STALLED = "stalled"
# What a trial past its timeout adds where rank 0 had trained and begun its evaluation:
# one that ran half the timeout, or less (the build and training took the time).
IN_EVALUATE = "it had trained: it ran out of time in the task's evaluate, which the trial times too"
TRAINED_FIRST = "it had trained and saved before the evaluation it times began"


def _evaluation_lost(lead: SliceOutcome, why: str | None, request: SliceRequest, end: int
                     ) -> SliceOutcome:
    """``lead`` (rank 0's outcome as it trained and saved), its evaluation marked failed
    for ``why`` (in place; None: the run was stopped meanwhile): the slice is recorded as
    trained, the evaluation as owed."""
    again = f"`dione evaluate {request.run_dir} {request.task.name}`"
    lead.extra["evaluation_error"] = (
        f"its evaluate did not return: {why}; the slice had trained and saved step {end}, which "
        "is kept; " + ("an evaluate that ends its process (SystemExit, os._exit)"
                       if "raised" in why or "exited" in why
                       else "an evaluate that hangs or runs this long")
        + f": fix it (its rank logs hold what it printed), then {again}"
        if why is not None else
        f"its evaluation was cut short by the run's stop; the slice had trained and saved "
        f"step {end}, which is kept: {again} evaluates it")
    return lead


def _trained_seconds(lead: SliceOutcome, since_begun: float) -> float:
    """A slice's seconds to its checkpoint (not the hung evaluation after it)."""
    return float(lead.timings.get("saved", since_begun))


# What a slice's divergence tells the user to do; a profiling trial's divergence, which
# left nothing trained, is said otherwise (the runner cuts this off its reason: the two
# read as one contradicting sentence, a review).
DIVERGED_ADVICE = (". Lower the learning rate, or look for a loss or data problem, then "
                   "train it again under a new task name (`dione add RUN_DIR WORKLOAD` for "
                   "a run) or in a new run directory: a resume leaves a diverged task as it "
                   "is")


def _refuse_divergence(db: RunStore, slice_id: int, spec: SliceSpec, lead: SliceOutcome,
                       latest: CheckpointRecord | None, where: str,
                       warnings: list[str]) -> None:
    """Record the slice as diverged and raise SliceError where a loss was not finite; its
    checkpoint (weights past that step) is removed."""
    diverged = next((i for i, loss in enumerate(lead.losses) if not math.isfinite(loss)),
                    None)
    if diverged is None:
        return
    if lead.checkpoint is not None:  # weights past a non-finite loss: worthless
        shutil.rmtree(lead.checkpoint, ignore_errors=True)
    message = (
        f"task {spec.task.name!r} diverged: its loss was {lead.losses[diverged]} at step "
        f"{spec.start_step + diverged + 1} ({where}); its last finite checkpoint is "
        + (f"step {spec.start_step} ({latest.path})" if latest
           else "none (it had none before this slice)")
        + DIVERGED_ADVICE + "".join(f"\n{w}" for w in warnings))
    db.diverge_slice(slice_id, lead.losses[:diverged + 1],
                     lead.step_seconds[:diverged + 1], message)
    raise SliceError(message, "diverged")


def _say_unsaid_split(method: Technique, task: Task, devices: int, knobs: dict[str, Any],
                      inexactness: Any, lead: SliceOutcome) -> None:
    """A technique of the user's that split the batch (over devices, or in parts or
    micro-batches) and said nothing of how it trained: what dione knows that keeps it
    from single's numbers (dropout, draws, rounding) put in its outcome, as a built-in's
    loop says it (it was recorded exact: review). Its own claim of exactness is its."""
    # A built-in's loop (a subclass of one that keeps its train too) says it itself.
    if type(method).train.__module__.startswith("dione.") or inexactness is not None \
            or lead.extra.get("exactness"):
        return
    resolved = method.resolve(knobs)  # its defaults too
    parts = [resolved.get(k) for k in ("accumulation", "micro_batches")]
    if devices > 1 or any(isinstance(v, int) and v > 1 for v in parts):
        note = unsaid_split(task)
        if note:
            lead.extra["exactness"] = note


def _not_finite(evaluation: Mapping[str, float]) -> str | None:
    """Why an evaluation none of whose metrics is finite counts as failed: the store
    keeps no such figure, and the task read as never evaluated everywhere (a review).
    One finite metric is an evaluation (a perplexity that overflowed beside an accuracy:
    the run says so, and the accuracy ranks it)."""
    odd = {m: v for m, v in evaluation.items() if not math.isfinite(v)}
    if not odd or len(odd) < len(evaluation):
        return None
    return ("evaluate returned " + ", ".join(f"{m} = {v}" for m, v in sorted(odd.items()))
            + ", not finite, so not recorded (a diverged model's figure, or a division by "
            "zero in evaluate)")


def _record_finished(db: RunStore, slice_id: int, request: SliceRequest, spec: SliceSpec,
                     technique: str, outcomes: list[SliceOutcome], seconds: float,
                     warnings: list[str], inexactness: Any) -> SliceResult:
    """Record a slice that trained to its end (its cut, steps, checkpoint, evaluation),
    prune the task's older checkpoints, and say what it did."""
    task, lead = spec.task, outcomes[0]
    evaluation_error = lead.extra.get("evaluation_error") or (
        # A trial's is no failure: it says which metrics evaluate returns, that is all.
        _not_finite(lead.evaluation) if request.trial is None else None)
    devices = len(spec.device_ids)
    if spec.cut is None and "cut" in lead.extra:  # decided now: kept for later slices
        db.keep_cut(task.name, devices, lead.extra["cut"], slice_id)
    peak = [o.peak_memory_bytes for o in outcomes]
    db.finish_slice(slice_id, lead.losses, lead.step_seconds, lead.checkpoint,
                    {**lead.timings, "wall": seconds}, max(peak), lead.evaluation,
                    evaluation_error,
                    lead.extra.get("exactness"))
    registered = db.task(task.name)
    if lead.checkpoint is not None and registered is not None \
            and spec.end_step >= registered.total_steps:
        # A task's final checkpoint, just written with its digests: a resume need not
        # read it whole to trust it while its files stay as they are now.
        db.keep_verified(lead.checkpoint, file_times(lead.checkpoint))
    doubts: list[str] = []
    best = _best_to_keep(db, task, lead.evaluation, evaluation_error, spec.end_step, doubts)
    gone = prune_checkpoints(db.checkpoint_root(request.storage), task.name,
                             request.keep_checkpoints,
                             [c.path for c in db.checkpoints(task.name)],
                             spare=[best.path] if best else [])
    if gone:
        db.forget_checkpoints(task.name, [str(p) for p in gone])
    _prune_logs(Path(request.run_dir), task.name, db, request.keep_checkpoints)
    return SliceResult(
        slice_id=slice_id, task=task.name, technique=technique, start_step=spec.start_step,
        end_step=spec.end_step, losses=lead.losses, step_seconds=lead.step_seconds,
        checkpoint=lead.checkpoint, seconds=seconds, timings=lead.timings,
        peak_memory_bytes=peak, evaluation=lead.evaluation,
        evaluation_error=evaluation_error,
        extra={k: v for k, v in lead.extra.items() if k != "evaluation_error"},
        warnings=warnings, doubts=doubts, inexactness=inexactness,
    )
