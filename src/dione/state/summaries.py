"""A run's tasks as its store has them, one summary each: how far each trained, under
what, how long, its final loss and evaluation, and how its steps that did not train as
single would trained. The report, `dione status` and a run's result all read these."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from dione.frames import user_frame
from dione.state.store import CheckpointRecord, RunStore, SliceRecord, best_evaluation

__all__ = ["TaskSummary", "as_left", "best_kept", "closing_summaries", "error_line",
           "exactness_of", "figure", "final_results", "inexact_spans", "leaderboard",
           "lower_is_better", "short_error", "summaries", "techniques_in_turn"]


@dataclass
class TaskSummary:
    """One task as the report shows it."""

    task: str
    status: str
    steps: int
    total_steps: int
    techniques: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    seconds: float = 0.0
    final_loss: float | None = None
    evaluation: dict[str, float] = field(default_factory=dict)
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    checkpoint: str | None = None  # the latest complete one
    device_counts: list[int] = field(default_factory=list)  # of the slices that trained it
    # How its steps that did not train as single would trained (empty: all did).
    inexact: list[str] = field(default_factory=list)
    cut_short: bool = False  # its latest slice was interrupted (or runs still)
    # How its steps that trained as single would in distribution only (dropout) did.
    statistical: list[str] = field(default_factory=list)
    evaluated_at: int | None = None  # the step of ``evaluation`` (None: no evaluation)
    metrics_seen: frozenset[str] = frozenset()  # in any of its evaluations

    @property
    def evaluated_before(self) -> bool:
        """Whether its metrics are of weights before those it trained to (a later
        evaluation failed; or it ended between evaluations)."""
        return self.evaluated_at is not None and self.evaluated_at < self.steps

    @property
    def last_evaluation_failed(self) -> bool:
        """Whether it trained to its end and its last evaluation failed, its metrics of
        earlier weights (one stopped or interrupted between evaluations failed none)."""
        return self.status == "done" and self.evaluated_before

    @property
    def trained(self) -> str:
        """For the CSV and MLflow: exact, or inexact or statistical and how; nothing for
        a task that trained no step (the tables' "-": a task diverged at its first
        steps read "exact" in summary.csv only)."""
        if not self.steps:
            return ""
        if self.inexact:
            return "inexact: " + "; ".join(self.inexact)
        if not self.statistical:
            return "exact"
        return "statistical: " + "; ".join(note.replace("statistical, not bitwise: ", "")
                                           for note in self.statistical)

    @property
    def exactness(self) -> str:
        return exactness_of(self.inexact, self.statistical)


def exactness_of(inexact: Sequence[str], statistical: Sequence[str]) -> str:
    """One word for the tables, from a task's spans of each: exact, statistical
    (single's training in distribution: dropout drew masks of its own) or INEXACT (the
    task's opt-in)."""
    return "INEXACT" if inexact else "statistical" if statistical else "exact"


def techniques_in_turn(slices: Sequence[SliceRecord]) -> list[str]:
    """The techniques that trained a task, in turn (a slice that diverged trained too:
    its task's only one where the first slice diverged)."""
    techniques: list[str] = []
    for s in slices:
        if s.status in ("done", "diverged") and (not techniques
                                                 or techniques[-1] != s.technique):
            techniques.append(s.technique)
    return techniques


def inexact_spans(slices: Sequence[SliceRecord], note: str = "inexactness") -> list[str]:
    """How the finished slices of one task that did not train as single would trained
    (``note="statistical"``: that did so in distribution only): consecutive ones with
    the same note as one span of steps."""
    spans: list[tuple[int, int, str]] = []
    for s in slices:
        said = getattr(s, note)
        if s.status not in ("done", "diverged") or said is None:  # both trained
            continue
        if spans and spans[-1][1] == s.start_step and spans[-1][2] == said:
            spans[-1] = (spans[-1][0], s.end_step, said)
        else:
            spans.append((s.start_step, s.end_step, said))
    return [f"steps {a}-{b}, {said}" for a, b, said in spans]


def summaries(store: RunStore, names: Sequence[str] | None = None) -> list[TaskSummary]:
    """The run's tasks (``names``: those only) as the report shows them; a pending task
    waiting at a rung for its rule's decision (pausing ASHA, successive halving) is
    ``paused``, its steps the rung's."""
    result = []
    paused = store.paused()
    for record in store.tasks():
        if names is not None and record.name not in names:
            continue
        slices = store.slices(record.name)
        done = [s for s in slices if s.status == "done"]
        # The slices that trained it (a diverged one too: its steps to the divergence),
        # and a failed task's attempts (its row read 0.0 s on no device), those cancelled
        # as stalled among them (183 s of devices read 0.0 s: a review).
        held = [s for s in slices if s.status in ("done", "diverged")
                or (record.status == "failed" and (s.status == "failed" or s.stalled))]
        devices: list[str] = []
        for s in held:
            where = f"{s.node}:{','.join(map(str, s.device_ids))}"
            if where not in devices:
                devices.append(where)
        latest = store.latest_checkpoint(record.name)
        loss = store.last_loss(record.name)
        # Trained to: its newest checkpoint; a simulated run keeps none, only its slices.
        trained = latest.step if latest else 0
        if latest is None and done and not any(s.checkpoint for s in done):
            trained = max(s.end_step for s in done)
        status = ("paused" if record.status == "pending" and record.name in paused
                  else record.status)
        error = record.error
        if record.status == "done" and trained < record.total_steps and any(
                s.checkpoint for s in done):  # (said: it read "done 30/40", no word why)
            gone = (": its storage (--storage) not mounted?"
                    if store.checkpoints_elsewhere(record.name)
                    else ": deleted; its weights are gone")
            error = (f"its final checkpoint (step {record.total_steps}) is not on disk"
                     + (f"; its newest is at step {trained}: `dione resume` trains its last "
                        "steps again" if latest else gone)
                     + (f"\n{error}" if error else ""))
        evaluated_at, evaluation = store.latest_evaluation(record.name)
        result.append(TaskSummary(
            record.name, status, trained, record.total_steps,
            techniques_in_turn(slices), devices,
            # A slice's own seconds: to its checkpoint where its evaluation hung after.
            sum(s.timings.get("wall", (s.ended_at or s.started_at) - s.started_at)
                for s in held),
            loss, evaluation,
            dict(record.hyperparameters), error, latest.path if latest else None,
            sorted({len(s.device_ids) for s in held}), inexact_spans(slices),
            bool(slices) and slices[-1].status in ("interrupted", "running"),
            inexact_spans(slices, "statistical"), evaluated_at,
            frozenset(store.evaluations(record.name))))
    return result


def closing_summaries(store: RunStore) -> list[TaskSummary]:
    """The run's tasks as a dashboard records them when it closes: as its launcher left
    them (``as_left``) where none holds the run now, or this process does (the command
    that ran it closes its dashboards before it lets go of the run: after Ctrl-C they
    read "pending" where the report said "interrupted", a review); they read "running"
    or "pending" after a kill or Ctrl-C otherwise."""
    from dione.state.lock import held_elsewhere

    tasks = summaries(store)
    return tasks if held_elsewhere(store.run_dir) else as_left(tasks)


def final_results(task: TaskSummary) -> dict[str, float]:
    """A task's results as a dashboard's "final/" metrics: its final loss, and its last
    evaluation only where that was of the weights it trained to (one of earlier weights,
    a later evaluation having failed, would be ranked against the others' final ones:
    the report lists such a task apart)."""
    results = {} if task.evaluated_before else {f"final/{k}": v
                                                 for k, v in task.evaluation.items()}
    if task.final_loss is not None:
        results["final/loss"] = task.final_loss
    return results


def as_left(tasks: Sequence[TaskSummary], by_slices: bool = False) -> list[TaskSummary]:
    """The tasks as a run whose launcher is gone left them: one it was training (the
    store still says ``running``: the launcher was killed) or had begun and not ended
    (``pending`` with steps trained or its slice cut short: stopped by Ctrl-C or
    SIGTERM) is ``interrupted``, so that both ways of stopping a run read alike; `dione
    resume` continues each. ``by_slices`` (a ``dione train`` folder, where a slice of
    some of a task's steps is what was asked): only a slice cut short interrupts."""
    return [replace(t, status="interrupted")
            if t.status == "running" or (t.status == "pending" and (
                t.cut_short or (t.steps and not by_slices)))
            else t for t in tasks]


def figure(value: float) -> str:
    """A loss or metric as the tables show it: four decimals, or three significant
    digits where those would read 0.0000 (a loss of 4e-06 is not zero), or a whole
    number of 10 or more as one (a count of 242 read "242.0000")."""
    if value != 0 and abs(value) < 5e-4:
        return f"{value:.3e}"
    if math.isfinite(value) and float(value).is_integer() and abs(value) >= 10:
        return f"{int(value)}"
    return f"{value:.4f}"


def exception_line(error: str) -> str:
    """The line of a traceback that names its last exception ("RuntimeError: CUDA
    error: ..."), not what follows it (CUDA's messages all end alike); else its last."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return next((line for line in reversed(lines) if _EXCEPTION.match(line)),
                lines[-1] if lines else error)


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b:?")


def short_error(error: str | None) -> str:
    """An error in one line: its first, and its last where the first only introduces
    a traceback (``evaluation failed:``, whose first line alone said nothing)."""
    if not error or not error.strip():
        return ""
    first = error.strip().splitlines()[0]
    return f"{first} {error_line(error)}" if first.endswith(":") else first


def error_line(error: str) -> str:
    """An error's one line to show: a traceback's last (the exception and its message)."""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else error


# A traceback's frame line, as Python prints it.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.MULTILINE)


def raised_at(error: str) -> str:
    """Where a traceback's exception was raised in the user's code, " (at file:line)": its
    last frame outside dione and installed packages (else outside dione); "" where it
    names none. A trial's crash said its exception alone, and its traceback was kept only
    in the catalog (a review)."""
    found = user_frame([(m["file"], int(m["line"])) for m in _FRAME.finditer(error)])
    return f" (at {found[0]}:{found[1]})" if found else ""


def lower_is_better(metric: str, directions: Mapping[str, str] | None = None) -> bool:
    """Whether a smaller value of ``metric`` is better: as the run's stopping rules (or
    its Optuna study) judge it (``directions``: metric -> "min"/"max", the store's),
    else guessed from its name (losses, errors, nll, mse...; higher where it says
    neither)."""
    if directions and metric in directions:
        return directions[metric] == "min"
    from dione.spec.metrics import direction_by_name

    return direction_by_name(metric) == "min"


class Ranked(Protocol):
    """What a leaderboard reads of a task (a ``TaskSummary``, or a run's ``TaskResult``)."""

    status: str
    steps: int
    total_steps: int
    evaluation: dict[str, float]
    evaluated_at: int | None

    @property
    def evaluated_before(self) -> bool: ...


R = TypeVar("R", bound=Ranked)


def leaderboard(tasks: Sequence[R], metric: str,
                directions: Mapping[str, str] | None = None) -> list[R]:
    """Tasks with ``metric``, best first (``directions``: as ``lower_is_better``): those
    that trained to their end, then those that did not (stopped at a rung, or failed,
    paused or interrupted on the way: their value is of that step, not comparable with
    a final one). A diverged task is ranked by no metric, nor a done one whose final
    evaluation failed (its metrics are of earlier weights than those it exports): they
    are listed after the board."""
    scored = [t for t in tasks if metric in t.evaluation and t.status != "diverged"
              and not (t.status == "done" and t.evaluated_before)]
    sign = 1 if lower_is_better(metric, directions) else -1
    return sorted(scored, key=lambda t: (t.steps < t.total_steps, t.evaluation[metric] * sign))


def rank_key(task: Any, metric: str) -> tuple[bool, str]:
    """What a leaderboard ranks alike: values that print alike, of tasks that both
    trained to their end or both did not (exact techniques differ from single in the
    last bits: "4.0368" ranked 1, 1 and 3 read as a difference)."""
    return task.steps < task.total_steps, figure(task.evaluation[metric])


def best_kept(store: RunStore, task: str, fallback: tuple[str | None, str | None]
              ) -> tuple[CheckpointRecord, float, str, str] | str:
    """The checkpoint of ``task`` where its ``keep_best`` metric was best, with that
    value, the metric and its direction: by the metric and direction the run pruned by
    (``fallback``, the task's own, where it recorded none). Where there is none, or the
    best evaluation's checkpoint is gone, why (a sentence that follows the task's name)."""
    recorded = store.keep_best(task)
    metric, mode = recorded if recorded is not None else fallback
    if recorded is not None and metric is None:
        return ("had its keep_best removed: its checkpoints are pruned by none since, so "
                "no checkpoint is kept for being best")
    if metric is None or mode is None:
        return ("names no keep_best metric, so no checkpoint was kept for being best "
                "(keep_best='METRIC' on the task keeps it from then on)")
    evaluated = store.evaluations(task)
    points = evaluated.get(metric, [])
    if not points:
        returned = ", ".join(repr(m) for m in sorted(evaluated))
        # A value that is not finite is not recorded: the store cannot tell it from none.
        return (f"has no value of {metric!r} (keep_best) recorded: its evaluate did not "
                "return it, or returned NaN or inf each time (" + (
                    f"recorded: {returned}" if returned else "nothing was recorded") + ")")
    found = store.best_checkpoint(task, metric, mode)
    if found is None:
        return (f"has no checkpoint at a step where {metric!r} was evaluated (steps "
                f"{', '.join(str(s) for s, _ in points)})")
    record, value = found
    top_step, top = best_evaluation(points, mode)
    if (top < value) if mode == "min" else (top > value):  # a better one's checkpoint went
        return (f"has its best {metric} ({top:.6g} at step {top_step}) in no checkpoint "
                f"it keeps (pruned before keep_best named {metric!r}, or set aside as "
                f"corrupt); the best it keeps is {value:.6g}, at step {record.step}")
    return record, value, metric, mode
