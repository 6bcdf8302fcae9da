"""The report of a run directory: timeline, metrics, per-task summary, leaderboard, Gantt.

Everything is read back from the run store and the adopted plans, so ``dione report``
redraws it at any time, for a running, finished or interrupted run.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dione.orchestrate.plans import AdoptedPlan, horizon_said, read_plans
from dione.state.lock import launcher_gone
from dione.state.private import private_dir
from dione.state.slice_logs import failure_log
from dione.state.store import (
    SIMULATED_FILE,
    STORE_FILE,
    RunStore,
    SliceRecord,
    how_to_continue,
    not_a_run,
)
from dione.state.summaries import (
    TaskSummary,
    as_left,
    best_kept,
    error_line,
    figure,
    leaderboard,
    lower_is_better,
    rank_key,
    short_error,
    summaries,
)
from dione.words import some

__all__ = ["MetricsWritten", "lower_is_better", "report_after_run", "write_report"]


def _stood_still(plans: Sequence[AdoptedPlan], slices: Sequence[Any]
                 ) -> list[tuple[float, float]]:
    """Each session after the first: when it started, and for how long before it the
    run stood still (from the last slice that ended before it, or the session before's
    start where that is later: a session killed before any slice ended was counted
    twice, and the chart drew the next session's bars before its start)."""
    stood = []
    starts = sorted({p.clock_zero for p in plans})
    for previous, start in itertools.pairwise(starts):
        before = [s.ended_at for s in slices if s.ended_at is not None and s.started_at < start]
        stood.append((start, max(0.0, start - max([*before, previous]))))
    return stood


def _sessions(plans: Sequence[AdoptedPlan], slices: Sequence[Any], zero: float) -> list[str]:
    """Where the run was resumed, and the time it stood still between sessions (which
    the actual end above counts, and a session's own makespan, as `dione run` and
    `dione resume` print it, does not)."""
    stood = _stood_still(plans, slices)
    if not stood:
        return []
    starts = [start for start, _ in stood]
    idle = sum(seconds for _, seconds in stood)
    return [f"Resumed {len(starts)} time(s), at "
            + ", ".join(f"{start - zero:.1f} s" for start in starts)
            + f" from the first start; {idle:.1f} s of that stood still between sessions "
            "(counted in the actual end; each session's own makespan is what `dione run` and "
            "`dione resume` printed)."]


def _simulated_setting(run_dir: Path | None, unfinished: int = 0) -> list[str]:
    """A simulated run's cluster, scenario and current practice (from its
    SIMULATED_FILE), as lines of the summary; ``unfinished``: tasks the run did not
    finish (current practice trains each to its end: no saving to read)."""
    try:
        setting = json.loads((run_dir / SIMULATED_FILE).read_text()) if run_dir else {}
    except (OSError, ValueError):
        return []
    lines = []
    nodes = setting.get("cluster") or []
    if nodes:
        lines.append("Cluster: " + some([f"{n.get('name')} ({n.get('devices')} "
                                         f"{n.get('kind') or ''} devices)".replace("  ", " ")
                                         for n in nodes], 16) + ".")
    scenario = {k: v for k, v in (setting.get("scenario") or {}).items() if v}
    lines.append(f"Scenario: {json.dumps(scenario, sort_keys=True) if scenario else 'none'}.")
    if setting.get("current_practice"):
        # The rule `simulate.run.current_practice` plays: "the next free node" read
        # otherwise where nodes differ in speed or kind (a review checked it by hand).
        lines.append(f"Current practice (each task in turn on a whole node, the one where "
                     f"it ends first, at its fastest option there, to its end; the same "
                     f"cluster, slowdowns, node losses and joins, "
                     f"without the scenario's failures, faulty nodes and spread, and no "
                     f"stopping rule): "
                     f"{setting['current_practice']:.1f} s"
                     + (f" (not comparable: {unfinished} task(s) did not finish here, as "
                        "`dione simulate` says)" if unfinished else "") + ".")
    return [*lines, ""]


def _as_left(s: SliceRecord, store: RunStore, heard: float) -> SliceRecord:
    """A slice as the timeline shows it with no launcher left: one the store still calls
    running is interrupted, ended where its last step the store kept did or when the
    store last heard from the run (``heard``), whichever is later; an interrupted one
    ends at the last step it kept (its planned end was never reached)."""
    if s.status not in ("running", "interrupted"):
        return s
    seconds = store.slice_step_seconds(s.id)
    s = replace(s, end_step=s.start_step + len(seconds))
    if s.status == "interrupted":
        return s
    return replace(s, status="interrupted",
                   ended_at=max(s.started_at + sum(seconds), heard),
                   error=f"its launcher is gone; {how_to_continue(store.run_dir)} "
                   "continues from the last checkpoint")


def _run_start(store: RunStore, plans: Sequence[AdoptedPlan]) -> float:
    starts = [p.clock_zero for p in plans]
    starts += [s.started_at for s in store.slices()]
    return min(starts) if starts else 0.0


# The learning-curve figure's points per task at most: a long run's steps, in windows.
CURVE_POINTS = 2000


@dataclass
class MetricsWritten:
    """What a caller that keeps ``metrics.csv`` up to date (the live report) wrote there:
    each task's last step, and the file as it left it (another writer since, such as
    ``dione report``, makes the next write a whole one)."""

    steps: dict[str, int] = field(default_factory=dict)
    signature: tuple[int, int, int] | None = None


def write_report(run_dir: str | Path, names: Sequence[Any] | None = None,
                 written: MetricsWritten | None = None, stopped: bool = False,
                 into: str | Path | None = None) -> Path:
    """Write ``<run_dir>/report/`` (or ``into``: a run directory one cannot write, a
    colleague's); its folder. ``names``: tasks (or their names) to include (default:
    every task in the store). ``written``: what this caller wrote to ``metrics.csv``
    before (updated here): only the steps since are appended, where a long run's file
    would otherwise be rewritten whole each time. ``stopped``: by its own launcher,
    interrupted, which still holds the run (read as one that is gone)."""
    run_dir = Path(run_dir)
    if not (run_dir / STORE_FILE).is_file():
        raise FileNotFoundError(not_a_run(run_dir))
    folder = private_dir(run_dir / "report" if into is None else into)
    wanted = None if names is None else [getattr(n, "name", n) for n in names]
    plans = read_plans(run_dir)
    gone = stopped or launcher_gone(run_dir)
    simulated = (run_dir / SIMULATED_FILE).is_file()
    # Each CSV row says whether it was measured or simulated: the files of a real run and
    # of its simulation, read together for comparison, are told apart row by row.
    mark = "true" if simulated else "false"
    with RunStore(run_dir) as store:
        zero = _run_start(store, plans)
        heard = store.last_heard()
        # An interrupted slice ends at the last step it kept, whoever writes the report
        # (the resuming launcher too); a running one, with no launcher left, is one.
        slices = [_as_left(s, store, heard) if gone or s.status == "interrupted" else s
                  for s in store.slices() if wanted is None or s.task in wanted]
        with open(folder / "timeline.csv", "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["slice", "task", "technique", "knobs", "node", "device_ids",
                             "start_step", "end_step", "start_s", "end_s", "status", "error",
                             "simulated"])
            for s in slices:
                writer.writerow([s.id, s.task, s.technique, json.dumps(s.knobs), s.node,
                                 " ".join(map(str, s.device_ids)), s.start_step, s.end_step,
                                 f"{s.started_at - zero:.3f}",
                                 "" if s.ended_at is None else f"{s.ended_at - zero:.3f}",
                                 s.status, short_error(s.error), mark])
        _write_metrics(store, folder / "metrics.csv", wanted, written, mark)
        tasks = summaries(store, wanted)
        invalid = store.invalid()
        directions = store.directions()
        curves = {t.task: store.loss_curve(t.task, CURVE_POINTS) for t in tasks}
        evaluated = {t.task: store.evaluations(t.task) for t in tasks}
        kept_best = {t.task: best_kept(store, t.task, (None, None)) for t in tasks
                     if (recorded := store.keep_best(t.task)) and recorded[0] is not None}
    with open(folder / "evaluations.csv", "w", newline="") as out:  # eval_every's too
        writer = csv.writer(out)
        writer.writerow(["task", "step", "metric", "value", "simulated"])
        writer.writerows([task, step, metric, repr(value), mark]
                         for task, curves_of in evaluated.items()
                         for metric, points in sorted(curves_of.items())
                         for step, value in points)
    if gone:  # a task its launcher left unfinished waits for `dione resume`
        tasks = as_left(tasks)
    metrics = sorted({m for t in tasks for m in t.evaluation})
    # Each hyperparameter its own column too, as a Ray Tune result's config/lr (a JSON
    # column alone asked a reader to parse it to sort or group a sweep).
    axes = sorted({k for t in tasks for k in t.hyperparameters})
    with open(folder / "summary.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["task", "status", "steps", "total_steps", "techniques", "devices",
                         "seconds", "final_loss", *metrics, "evaluated_at_step",
                         "hyperparameters", *(f"config/{k}" for k in axes), "trained",
                         "error", "stop_reason", "simulated"])
        for t in tasks:
            # A stopping rule's reason is no error (a script counting errors counted
            # every loser a rule stopped).
            said = short_error(t.error)
            writer.writerow([t.task, t.status, t.steps, t.total_steps, " ".join(t.techniques),
                             " ".join(t.devices), f"{t.seconds:.2f}",
                             "" if t.final_loss is None else repr(t.final_loss),
                             *(t.evaluation.get(m, "") for m in metrics),
                             "" if t.evaluated_at is None else t.evaluated_at,
                             json.dumps(t.hyperparameters),
                             *(_cell(t.hyperparameters[k]) if k in t.hyperparameters
                               else "" for k in axes),
                             "" if simulated else t.trained,  # a simulation trains none
                             "" if t.status == "stopped" else said,
                             said if t.status == "stopped" else "", mark])
        # Tasks validation left out: a script reading this file saw a clean run.
        listed = {t.task for t in tasks}
        for name, problems in invalid.items():
            if name not in listed:
                writer.writerow([name, "invalid", 0, "", "", "", "0.00", "",
                                 # Not known (a task validation refused): blank, not
                                 # "{}", which read as a task of no hyperparameters.
                                 *("" for _ in metrics), "", "", *("" for _ in axes), "",
                                 "; ".join(problems), "", mark])
    (folder / "summary.md").write_text(_markdown(tasks, metrics, plans, slices, zero,
                                                 simulated, invalid, directions, run_dir,
                                                 kept_best))
    from dione.report.gantt import draw_gantt

    draw_gantt(plans[0] if plans else None, slices, zero, folder / "gantt.png", simulated,
               ended={t.task: t.status for t in tasks}, order=[t.task for t in tasks],
               resumed=[(start - zero, idle) for start, idle in _stood_still(plans, slices)])
    from dione.report.curves import draw_curves
    from dione.report.page import write_page

    draw_curves(tasks, curves, evaluated, folder / "curves.png", simulated,
                lower={m: lower_is_better(m, directions) for m in
                       {"loss", *metrics, *(m for per in evaluated.values() for m in per)}})
    write_page(folder)
    for file in folder.iterdir():  # as private as the run directory it reports on
        if file.is_file() and not file.is_symlink():
            file.chmod(0o600)
    return folder


def _write_metrics(store: RunStore, path: Path, wanted: Sequence[str] | None,
                   written: MetricsWritten | None, mark: str) -> None:
    """Every step's loss and seconds, per task: whole, or appended past ``written``
    where the file is as that caller left it."""
    append = written is not None and written.signature is not None \
        and _signature(path) == written.signature
    steps = written.steps if written is not None and append else {}
    with open(path, "a" if append else "w", newline="") as out:
        writer = csv.writer(out)
        if not append:
            writer.writerow(["task", "step", "loss", "step_seconds", "simulated"])
        for task in store.tasks():
            if wanted is not None and task.name not in wanted:
                continue
            rows = store.metrics(task.name, after=steps.get(task.name, 0))
            writer.writerows([task.name, *row, mark] for row in rows)
            if rows:
                steps[task.name] = rows[-1][0]
    if written is not None:
        written.steps, written.signature = steps, _signature(path)


def _signature(path: Path) -> tuple[int, int, int] | None:
    """The file's identity and state (inode, size, change time); None: not there."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def report_after_run(run_dir: str | Path, names: Sequence[Any] | None,
                     stopped: bool = False) -> str | None:
    """Write the report of a run that just ended (``stopped``: interrupted, its tasks
    cut short read as `dione status` reads them); why it could not be (None: written).
    The training is done and kept either way: `dione status` and `dione report` read it."""
    import sqlite3

    try:
        write_report(run_dir, names, stopped=stopped)
    except (OSError, ValueError, sqlite3.Error) as err:
        return (f"the report could not be written ({type(err).__name__}: {err}); the results "
                "stand: `dione status` reads them, `dione report` tries again")
    return None


def _unranked(t: TaskSummary, metric: str) -> str | None:
    """Why ``t`` is listed after ``metric``'s board rather than on it (None: it is on
    it, or has no evaluation to speak of)."""
    if t.status == "diverged":
        return "diverged"
    if t.last_evaluation_failed:
        earlier = (f" (step {t.evaluated_at}'s: {figure(t.evaluation[metric])})"
                   if metric in t.evaluation else "")
        return (f"not ranked: nothing recorded at step {t.steps}, its evaluation failed "
                f"or gave no finite value{earlier}")
    if metric in t.metrics_seen and metric not in t.evaluation:
        return f"not ranked: no finite {metric} at step {t.evaluated_at}"
    return None


def _continues(run_dir: Path, simulated: bool) -> str:
    """What goes on from where ``run_dir``'s run stopped, said as a clause."""
    if simulated:
        return "`dione simulate` again redoes it (a simulation does not resume)"
    return f"{how_to_continue(run_dir)} continues it"


def _markdown(tasks: Sequence[TaskSummary], metrics: Sequence[str],
              plans: Sequence[AdoptedPlan], slices: Sequence[Any], zero: float,
              simulated: bool = False,
              invalid: Mapping[str, Sequence[str]] | None = None,
              directions: Mapping[str, str] | None = None,
              run_dir: Path | None = None,
              kept_best: Mapping[str, Any] | None = None) -> str:
    lines = ["# dione run report" + (": SIMULATED" if simulated else ""), ""]
    if simulated:
        lines += [f"A virtual cluster ran this (`dione simulate`): no task trained; times are "
                  f"virtual seconds and losses follow a curve, as {SIMULATED_FILE} says.", ""]
        lines += _simulated_setting(run_dir, sum(
            1 for t in tasks if t.status not in ("done", "stopped")))
    halted = [t.task for t in tasks if t.status == "interrupted"]  # (a run left so)
    if halted:  # it read as a finished run's page, its leaders provisional unsaid (review)
        left = sum(1 for t in tasks if t.status in ("interrupted", "pending", "paused"))
        lines += [f"**Not finished**: the run stopped with {left} of its {len(tasks)} tasks "
                  f"not ended ({len(halted)} interrupted mid-way); the tables and leaderboards "
                  "below are as far as each trained"
                  # What continues this kind of run (`dione resume` refused a train
                  # folder, a Python run and a simulation: a review).
                  + (f"; {_continues(run_dir, simulated)}" if run_dir else "") + ".", ""]
    ended = [s.ended_at - zero for s in slices if s.ended_at is not None]
    if plans:
        first = plans[0]
        placed = {a.task for a in first.plan.assignments}
        # A task only a node that joins later can hold is not in it: said, or "planned
        # 100 s, ended 1,500 s" reads as drift.
        covers = (f" (it placed {len(placed)} of the {len(tasks)} tasks; the others were "
                  "planned later)" if len(placed) < len(tasks) else "")
        # Not the sweep's end: no miss to read.
        covers += horizon_said(first.horizon, " (planned {}, not to the sweep's end)")
        lines.append(f"Planned makespan (first plan, {first.plan.solver}, {first.plan.status}): "
                     f"{first.plan.makespan + first.at:.1f} s{covers}; plans adopted: "
                     f"{len(plans)}.")
    if ended:
        lines.append(f"Actual: last slice ended at {max(ended):.1f} s.")
    lines += _sessions(plans, slices, zero)
    header = ["task", "status", "steps", "techniques", "devices", "seconds", "final loss",
              *metrics, "trained"]
    lines += ["", "## Tasks", "", _row(header), "|" + " --- |" * len(header)]
    for t in tasks:
        loss = "-" if t.final_loss is None else figure(t.final_loss)
        at = f" (step {t.evaluated_at})" if t.evaluated_before else ""
        values = [figure(t.evaluation[m]) + at if m in t.evaluation else "-" for m in metrics]
        lines.append(_row([t.task, t.status, f"{t.steps}/{t.total_steps}",
                           ", ".join(t.techniques) or "-", "; ".join(t.devices) or "-",
                           f"{t.seconds:.1f}", loss, *values,
                           # nothing trained (or simulated): neither
                           "-" if not t.steps or simulated else _exactness(t)]))
    for metric in metrics:
        board = leaderboard(tasks, metric, directions)
        order = "lower" if lower_is_better(metric, directions) else "higher"
        why = ("as the run's stopping rule judges it" if directions and metric in directions
               else "guessed from its name: a stopping rule on it would set it")
        lines += ["", f"## Leaderboard by {metric} ({order} is better, {why})", "",
                  "| rank | task | " + metric + " | hyperparameters | trained |",
                  "| --- | --- | --- | --- | --- |"]
        rank, previous, place = 0, None, 0
        for t in board:
            # Values that read alike (and both trained to their end, or both not) share
            # a rank: exact techniques differ from single in the last bits (reduction
            # order, ~1e-7), and "4.0368" ranked 1, 1 and 3 read as a difference. A
            # failed task is listed with its last value, unranked: no rule judged it.
            key = rank_key(t, metric)
            if t.status != "failed":
                place += 1
                rank, previous = (rank if key == previous else place), key
            at = f"from step {t.evaluated_at}; " if t.evaluated_before else ""
            early = (f" ({at}{t.status} at step {t.steps} of {t.total_steps})"
                     if t.steps < t.total_steps else "")
            lines.append(_row(['-' if t.status == 'failed' else str(rank), t.task,
                               f"{figure(t.evaluation[metric])}{early}",
                               json.dumps(t.hyperparameters),
                               '-' if simulated else _exactness(t)]))
        lines += [_row(["-", t.task, reason, json.dumps(t.hyperparameters), "-"])
                  for t in tasks if (reason := _unranked(t, metric))]
    inexact = [t for t in tasks if t.inexact]
    if inexact:
        lines += ["", "## Trained inexactly", "",
                  "These tasks allowed a technique that does not train as single would "
                  "(allow_inexact=True), and some of their steps trained under it; their "
                  "results are not comparable with exactly trained ones as like for like.",
                  ""]
        lines += [f"- {t.task}: " + "; ".join(t.inexact) for t in inexact]
    statistical = [t for t in tasks if t.statistical and not t.inexact]
    if statistical:
        lines += ["", "## Trained as single would in distribution, not bit for bit", "",
                  "Some steps of these tasks trained on a batch split over devices, "
                  "stages or parts, where what they draw at random (dropout, noise in a "
                  "forward, a collate function's masking, a data set's fetch) each part "
                  "draws apart, or where bf16 or fp16 rounds each part apart: the same "
                  "training as single in distribution, not the same numbers "
                  "(`techniques=('single',)` trains alike under any plan that does not "
                  "accumulate, which it does only where memory runs out, and whose data set "
                  "keeps no generator of its own; each line says why).", ""]
        lines += [f"- {t.task}: " + "; ".join(t.statistical) for t in statistical]
    if kept_best:
        lines += ["", "## Best checkpoints kept (keep_best)", "",
                  "Besides their newest checkpoints, these tasks keep the one where their "
                  "keep_best metric was best, where it is still there: `dione export RUN_DIR "
                  "TASK --best -o DIR` writes it (`dione.load(..., best=True)`).", ""]
        for task, found in kept_best.items():
            if isinstance(found, str):
                lines.append(f"- {task} {found}")
            else:
                record, value, metric, mode = found
                lines.append(f"- {task}: {metric} {figure(value)} at step {record.step} "
                             f"({'lowest' if mode == 'min' else 'highest'})")
    stopped = [t for t in tasks if t.status == "stopped"]
    if stopped:
        lines += ["", "## Stopped early", "",
                  "Their stopping rule stopped these tasks at a rung; their last checkpoint "
                  "is kept (`dione export --latest`).", ""]
        # The rule's reason names the step itself ("... at step 4 ranks ...").
        lines += [f"- {t.task}: {t.error}" if t.error and f"step {t.steps}" in t.error
                  else f"- {t.task} at step {t.steps}: {t.error or ''}" for t in stopped]
    unevaluated = [s for s in slices if s.status == "done" and s.error]
    if unevaluated:
        lines += ["", "## Evaluations that failed", "",
                  "The training of these slices stands; their evaluation's error (its "
                  "whole traceback is the slice's error in the run store):", ""]
        lines += [f"- {s.task} at step {s.end_step}: {error_line(s.error)}"
                  for s in sorted(unevaluated, key=lambda s: (s.task, s.end_step))]
    cut = [s for s in slices if s.status == "interrupted"]
    if cut:
        lines += ["", "## Slices cut short", "",
                  "The launcher stopped (killed, interrupted, or its machine lost) while "
                  "these slices trained; their steps after the last checkpoint are trained "
                  "again by a later slice (hatched in the Gantt chart):", ""]

        def again(cut_slice: Any) -> str:  # said in the past once a later slice began
            later = [s for s in slices if s.task == cut_slice.task
                     and s.started_at > cut_slice.started_at]
            if later:
                first = min(later, key=lambda s: s.started_at)
                return (f"; trained again from step {first.start_step} at "
                        f"{first.started_at - zero:.1f} s")
            return "; not trained again yet (`dione resume` trains it)"

        lines += [f"- {s.task}: from step {s.start_step} under {s.technique}, "
                  f"{s.started_at - zero:.1f}-{(s.ended_at or s.started_at) - zero:.1f} s"
                  + again(s) for s in sorted(cut, key=lambda s: s.started_at)]
    failed = [t for t in tasks if t.status in ("failed", "diverged")]
    if failed:
        lines += ["", "## Failed and diverged tasks", ""]
        for t in failed:
            log = (failure_log(run_dir, slices, t.task)
                   if run_dir is not None and t.status == "failed" else None)
            lines.append(f"- {t.task} ({t.status}): "
                         f"{short_error(t.error)}"
                         + (f" (traceback: `{log.relative_to(run_dir)}`)"
                            if log is not None and run_dir is not None else ""))
    if invalid and simulated:
        lines += ["", "## Tasks left out, never started", "",
                  "No node of the simulated cluster holds these tasks of the problem:", ""]
        lines += [f"- {name}: " + "; ".join(problems) for name, problems in invalid.items()]
    elif invalid:
        recorded = {t.task: t for t in tasks}
        fresh = {n: p for n, p in invalid.items() if n not in recorded}
        if fresh:
            lines += ["", "## Invalid tasks, never started", "",
                      "Validation refused these tasks of the workload when the run (or its "
                      "latest resume) started; fix them, then "
                      + how_to_continue(run_dir) + " trains them."
                      if run_dir is not None else "Validation refused these tasks of the "
                      "workload when the run (or its latest resume) started.", ""]
            lines += [f"- {name}: " + "; ".join(problems) for name, problems in fresh.items()]
        if len(fresh) < len(invalid):  # a record of their own, not trained since
            lines += ["", "## Tasks left as they were", "",
                      "The workload given when the run (or its latest resume) started "
                      "defines these tasks otherwise than the run recorded them, or "
                      "validation refused them; their records stand, untrained since:", ""]
            lines += [f"- {name} ({recorded[name].status} at step {recorded[name].steps}): "
                      + "; ".join(problems) for name, problems in invalid.items()
                      if name in recorded]
    return "\n".join(lines) + "\n"


def _row(cells: list[str]) -> str:
    """A Markdown table row of exactly these cells (a "|" in one escaped: a learning
    rate schedule's "a|b" in a hyperparameter split its row into one more cell)."""
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _exactness(task: TaskSummary) -> str:
    """The "trained" cell: exact, statistical (dropout) or **inexact** (opted in)."""
    return "**inexact**" if task.inexact else task.exactness


def _cell(value: Any) -> Any:
    """A hyperparameter as a CSV cell: text and numbers as they are, anything else (a
    dict, a list, True, None) as JSON, as the hyperparameters column beside it writes it."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
