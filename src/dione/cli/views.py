"""What the commands show: result tables, the profile table, progress while things run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from shlex import quote
from typing import Any

from rich.table import Table
from rich.text import Text

from dione.cli.console import console
from dione.state.summaries import error_line, figure, lower_is_better, rank_key
from dione.words import some

__all__ = ["live_steps", "print_profile", "print_results", "print_sequential_results",
           "print_status", "profile_lines", "profile_progress"]


def live_steps() -> Callable[[int, dict[str, Any]], None]:
    """Progress while a slice trains (each rank reports about once a second): the step
    rank 0 reached, its pace, and the latest loss a rank holds (its share of the batch;
    the exact global losses follow when the slice ends)."""
    latest: dict[int, dict[str, Any]] = {}

    def show(rank: int, record: dict[str, Any]) -> None:
        if record.get("evaluating"):
            console.print(Text("  ... trained and saved; evaluating"))
            return
        latest[rank] = record
        if rank != 0:
            return
        pace = record.get("seconds_per_step")
        holder = next((r for r in sorted(latest) if latest[r].get("loss") is not None), None)
        world = record.get("world", 1)
        # A rank's loss of a gang is its part of the batch (a share, a micro-batch's):
        # said so, since it differs from single's loss at the same step (review).
        console.print(Text(
            f"  ... step {record['step']}"
            + (f", {pace * 1000:.1f} ms/step" if pace else "")
            + ("" if holder is None else f", loss {latest[holder]['loss']:.4f}"
               + (f" (rank {holder} of {world}: its part of the batch; the batch's loss "
                  "follows)" if world > 1 else ""))))

    return show


# The end of the reason a memory-knob setting is skipped for (dione.profile.schedule).
_ROUTINE_SKIP = "this one only trades speed for memory"


def profile_lines(routine: set[str] | None = None) -> Callable[[Any], None]:
    """A callback printing one line per finished, skipped or not-tried trial; a trial
    that failed with its reason (the first line of its error), once per reason.
    ``routine``: the techniques whose routine skips were said before (a notebook's
    earlier runs: said once a session, not at every run), added to as they are said."""
    reasons: set[str] = set()
    routine = set() if routine is None else routine

    def failure(record: Any) -> str:
        reason = (record.reason or "").strip().splitlines()
        said = reason[0][:300] if reason else ""
        if not said or said in reasons:
            return " (as above)" if said else ""
        reasons.add(said)
        return f": {said}"

    def show(event: Any) -> None:
        if event.kind == "skipped" and event.record is None and (
                event.reason or "").endswith(_ROUTINE_SKIP):
            # By design, on every profile: said once per technique, not once per setting.
            technique = event.label.split(" ", 1)[0]
            if technique in routine:
                return
            routine.add(technique)
            console.print(Text(f"  {technique}: settings that only trade speed for memory "
                               "are tried only where a lighter one ran out of memory "
                               f"(e.g. {event.label}: {event.reason})"))
            return
        if event.kind in ("finished", "skipped"):
            record = event.record
            what = (f"{record.status}" + (f", {record.step_seconds * 1000:.1f} ms/step"
                                          if record.step_seconds else "")
                    + ("" if record.feasible else failure(record))
                    + (f" (timed while dione trained beside it on this machine, pid "
                       f"{', '.join(map(str, record.extra['beside']))}: slower than alone, "
                       "so not kept in the catalog)" if record.extra.get("beside") else "")
                    if record else f"skipped: {event.reason}")
            console.print(Text(f"  trial {event.label} ({some(event.tasks, 4)}): "
                               f"{what}"))
        elif event.kind == "not_tried":
            console.print(Text(f"  not tried: {event.label} for {some(event.tasks, 4)}: "
                               f"{event.reason}"))

    return show


@contextmanager
def profile_progress() -> Iterator[Callable[[Any], None]]:
    """A callback for profile events while the block runs: a bar on a terminal, lines
    elsewhere."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(TextColumn("profiling"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.description}"), console=console,
                        disable=not console.is_terminal)
    bar = progress.add_task("", total=None)
    lines = profile_lines()

    def show(event: Any) -> None:
        if event.total:
            progress.update(bar, total=event.total)
        if event.kind in ("finished", "skipped"):
            progress.advance(bar)
        if event.kind == "started":
            progress.update(bar, description=f"{event.label} ({', '.join(event.tasks)[:60]})")
        if not console.is_terminal and event.kind != "not_tried":  # the table says it
            lines(event)

    with progress:
        yield show


def print_profile(profile: Any) -> None:
    """Per task: its chosen options, its failed trials and deliberate skips."""
    from dione.techniques import get_technique

    table = Table(title=f"profile: {profile.trials_run} trial(s) run, {profile.trials_cached} "
                  f"taken from the catalog, {profile.seconds:.0f} s")
    for column in ("task", "technique", "devices", "knobs", "ms/step", "spread",
                   "seconds (all steps)", "peak MiB", "note"):
        table.add_column(column, overflow="fold")
    not_tried: dict[tuple[str, str], list[str]] = {}
    for task in profile.tasks:
        if task.error:
            table.add_row(task.task, "-", "-", "-", "-", "-", "-", "-",
                          f"not profiled: {task.error}")
            continue
        chosen = {o.record.fingerprint for o in task.options}
        shown = [r for r in task.trials if r.fingerprint in chosen or not r.feasible]
        for record in sorted(shown, key=lambda r: (r.devices, r.technique)):
            defaults = get_technique(record.technique).knobs
            knobs = ", ".join(f"{k}={v}" for k, v in record.knobs.items()
                              if defaults.get(k) != v)
            seconds = (f"{record.slice_seconds(task.total_steps) + task.evaluation_seconds:.1f}"
                       if record.feasible else "-")
            note = (record.simulation_note or "" if record.feasible else
                    f"{record.status}: {(record.reason or '').splitlines()[0][:200]}")
            if record.fingerprint in profile.from_catalog:  # not run now: said which
                note = "; ".join(filter(None, ("from the catalog", note)))
            elif record.extra.get("beside"):
                note = "; ".join(filter(None, ("timed beside other training: not kept "
                                               "in the catalog", note)))
            table.add_row(
                task.task, record.technique, str(record.devices), knobs,
                f"{record.step_seconds * 1000:.1f}" if record.step_seconds else "-",
                f"{record.spread:.0%}" if record.spread is not None else "-", seconds,
                f"{record.peak_memory_bytes / 2**20:.0f}" if record.peak_memory_bytes else "-",
                note)
        routine = [skip for skip in task.skipped if skip.reason.endswith(_ROUTINE_SKIP)]
        for skip in task.skipped:
            if skip not in routine:
                table.add_row(task.task, skip.label, "", "", "", "", "", "",
                              f"skipped: {skip.reason}")
        if routine:  # by design on every profile: one row, not one per setting
            techniques = sorted({skip.technique for skip in routine})
            table.add_row(task.task, ", ".join(techniques), "", "", "", "", "", "",
                          f"{len(routine)} setting(s) that only trade speed for memory "
                          "skipped: a lighter one fits in memory")
        for technique, reason in task.not_tried():  # said once below, for every task
            not_tried.setdefault((technique, reason), []).append(task.task)
    console.print(table)
    for (technique, reason), names in not_tried.items():
        console.print(Text(f"not tried: {technique} for {some(names, 4)}: {reason}"))


def print_results(result: Any, run_dir: Path) -> None:
    """A run's table of per-task results, and where its report went."""
    from dione.orchestrate.plans import horizon_said, read_plans

    metrics = sorted({k for t in result.tasks for k in t.evaluation})
    try:  # a resumed run's figures are this session's; the report counts them all
        sessions = len({p.clock_zero for p in read_plans(run_dir)})
    except (OSError, ValueError):
        sessions = 1
    which = " (this session's; the report counts every session)" if sessions > 1 else ""
    if not result.slices:  # nothing left to train: no session figures to give
        title = (f"results ({run_dir}): nothing trained this session; the run's recorded "
                 f"makespan {result.makespan:.1f} s")
    else:
        title = (f"results ({run_dir}): makespan {result.makespan:.1f} s, first plan "
                 f"{result.planned_makespan:.1f} s{horizon_said(result.planned_horizon)}"
                 f"{which}, {result.plans_adopted} plan(s), "
                 f"profiling {result.profile_seconds:.0f} s")
    columns = ["task", "status", "steps", "techniques", "devices", "seconds", "final loss",
               *metrics, "trained"]
    rows = [[t.task, t.status, f"{t.steps}/{t.total_steps}", ", ".join(t.techniques) or "-",
             ", ".join(map(str, t.devices)) or "-", f"{t.seconds:.1f}",
             "-" if t.final_loss is None else figure(t.final_loss),
             *(_evaluated(t, m) for m in metrics),
             t.exactness if t.steps else "-"]  # no step trained: no how
            for t in result.tasks]
    _print_rows(title, columns, rows, left=("status", "techniques", "trained"))
    _say_leaders(result, metrics)
    _say_inexact(result.tasks)
    _say_best(run_dir, {t.task: t.best_step for t in result.tasks
                        if t.best_step is not None and t.best_step != t.steps})
    for t in result.tasks:  # trained, but its last evaluation failed: an earlier's marked
        if t.status == "done" and t.error:
            console.print(Text(f"evaluation failed: {t.task}: {error_line(t.error)} (its "
                               "training stands; the report lists each failure; fix "
                               f"evaluate, then `dione evaluate {quote(str(run_dir))}` "
                               "evaluates it and records it)"))
    _say_report(run_dir, f"; plans: {run_dir / 'plans'}")


def _say_leaders(result: Any, metrics: Sequence[str]) -> None:
    """A line per evaluated metric naming the task the report ranks first, with its
    value and hyperparameters: a 48-task grid's table, in grid order, named none."""
    for metric in metrics:
        best = result.best(metric)
        if best is None or metric not in best.evaluation:
            continue
        how = ", ".join(f"{k}={v}" for k, v in best.hyperparameters.items())
        order = "lower" if lower_is_better(metric, result.directions) else "higher"
        early = (f", {best.status} at step {best.steps} of {best.total_steps}"
                 if best.steps < best.total_steps else "")
        shown = figure(best.evaluation[metric])
        tied = [t.task for t in result.leaderboard(metric) if t is not best  # its rank
                and t.status != "failed" and rank_key(t, metric) == rank_key(best, metric)]
        console.print(Text(f"best by {metric} ({order} is better): {best.task} {shown}{early}"
                           + (f" ({how})" if how else "")
                           + (f"; tied with {some(tied)}" if tied else "")))


def _say_best(run_dir: Path, best: Mapping[str, int]) -> None:
    """A line naming each task's checkpoint kept for being best (keep_best), where it is
    not the last: what export --best gives."""
    if best:
        console.print(Text(f"best checkpoints kept (keep_best): "
                           f"{', '.join(f'{t} at step {s}' for t, s in best.items())}; "
                           f"`dione export {quote(str(run_dir))} TASK --best -o DIR` "
                           "writes one"))


def _evaluated(t: Any, metric: str) -> str:
    """``t``'s value of ``metric``, with its step where it is of earlier weights than
    those ``t`` trained to (a later evaluation failed)."""
    if metric not in t.evaluation:
        return "-"
    return figure(t.evaluation[metric]) + (f" (step {t.evaluated_at})"
                                           if t.evaluated_before else "")


def _print_rows(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
                left: Sequence[str]) -> None:
    """A table of ``rows`` under ``title``; where the terminal is too narrow for it
    whole, a line per row instead (squeezed, a table read "0.…", "do…" and names cut
    to "gpt2-lr0…" alike on 80 columns)."""
    table = Table(title=title)
    longest = max((len(r[0]) for r in rows), default=4)
    table.add_column(columns[0], overflow="fold", min_width=min(longest, 32))
    for column in columns[1:]:
        table.add_column(column, justify="left" if column in left else "right",
                         no_wrap=True)
    for row in rows:
        table.add_row(*row)
    # Each column's widest cell (the name's up to 32) plus its padding and border.
    needed = 1 + min(max(longest, len(columns[0])), 32) + 3 + sum(
        max([len(c), *(len(r[i]) for r in rows)]) + 3 for i, c in enumerate(columns)
        if i > 0)
    if needed <= console.width:
        console.print(table)
        return
    console.print(Text(title))
    for row in rows:
        console.print(Text(f"{row[0]}: " + ", ".join(f"{c} {v}" for c, v in
                                                     zip(columns[1:], row[1:], strict=True))))


def _say_inexact(tasks: Sequence[Any]) -> None:
    """A line per task some of whose steps did not train as single would, saying how;
    and one for those that did so in distribution only (dropout)."""
    for t in tasks:
        if t.inexact:
            console.print(Text(f"inexact: {t.task} ({'; '.join(t.inexact)})"))
    statistical = [t for t in tasks if t.statistical and not t.inexact]
    for t in statistical:
        console.print(Text(f"statistical: {t.task} ({'; '.join(t.statistical)})"))
    if statistical:
        console.print(Text("(statistical: single's training in distribution, not bit for "
                           "bit; techniques=('single',) trains alike under any plan that "
                           "does not accumulate, which it does only where memory runs out, "
                           "and whose data set keeps no generator of its own)"))


def print_sequential_results(outcomes: Sequence[Any], run_dir: Path) -> None:
    """The current-practice baseline's table of per-task outcomes."""
    metrics = sorted({k for o in outcomes for k in o.evaluation})
    columns = ["task", "technique", "devices", "seconds", "final loss", *metrics, "status",
               "trained"]
    rows = [[o.task, o.technique or "-", str(o.devices), f"{o.seconds:.1f}",
             "-" if o.final_loss is None else figure(o.final_loss),
             *(figure(o.evaluation[m]) if m in o.evaluation else "-" for m in metrics),
             "failed" if o.error else "done", o.exactness if o.slices else "-"]
            for o in outcomes]
    _print_rows(f"results ({run_dir})", columns, rows, left=("technique", "status",
                                                             "trained"))
    _say_report(run_dir)


def _say_report(run_dir: Path, more: str = "") -> None:
    """Where a run's report went (the page, and the files beside it)."""
    console.print(f"report: {run_dir / 'report' / 'index.html'} (beside it summary.md, "
                  "summary.csv, gantt.png, curves.png, timeline.csv, metrics.csv, "
                  f"evaluations.csv){more}")


_STOPS_SAID = 5  # stopped tasks whose reasons `dione status` gives, the rest counted


def print_status(run_dir: Path, tasks: Sequence[Any], plans: int, running: Sequence[Any],
                 launcher: str, additions: Sequence[Any] = (),
                 invalid: Mapping[str, Sequence[str]] | None = None,
                 best: Mapping[str, int] | None = None, simulated: bool = False) -> None:
    """A run's tasks as its store has them, with the slices running now, what ``dione
    add`` asked of it that it has not taken (or refused), the workload's tasks
    validation refused (never started), and the step of each checkpoint kept for being
    best (``best``: keep_best's, where it is not the task's last); ``simulated``: by
    ``dione simulate``, which trains nothing (no "trained" to say)."""
    left = {t.task for t in tasks} & set(invalid or {})  # a record of its own: counted
    refused = (f", {len(invalid or {}) - len(left)} invalid (never started)"
               if len(invalid or {}) > len(left) else "") + (
        f", {len(left)} left as it was (changed since the run recorded it, or invalid now)"
        if left else "")
    # Each way a task ended besides done, counted (a sweep's stopped tasks ended as asked).
    ended = "".join(f", {n} {status}" for status in ("stopped", "diverged", "failed")
                    if (n := sum(t.status == status for t in tasks)))
    title = (f"{run_dir}: {sum(t.status == 'done' for t in tasks)} of {len(tasks)} "
             f"task(s) done{ended}{refused}, {plans} plan(s) adopted; {launcher}")
    columns = ["task", "status", "steps", "techniques", "final loss", "evaluation",
               "trained", "running now"]
    rows = []
    for t in tasks:
        now = [s for s in running if s.task == t.task]
        rows.append([t.task, t.status, f"{t.steps}/{t.total_steps}",
                      ", ".join(t.techniques) or "-",
                      "-" if t.final_loss is None else figure(t.final_loss),
                      ", ".join(f"{k}={figure(v)}" for k, v in t.evaluation.items())
                      + (f" (step {t.evaluated_at})" if t.evaluated_before else "") or "-",
                      "-" if simulated or (not t.steps and not now)
                      else "INEXACT" if t.inexact or any(s.inexactness for s in now)
                      else t.exactness,
                      "; ".join(f"{s.technique} on {s.node}:{s.device_ids} steps "
                                f"{s.start_step}-{s.end_step} for "
                                f"{time.time() - s.started_at:.0f} s" for s in now) or "-"])
    # A line per task where the table would not fit (a grid's 48 names read "d-lr0.…"
    # alike on 80 columns, and piped to a file).
    _print_rows(title, columns, rows, left=columns)
    stopped = [t for t in tasks if t.status == "stopped" and t.error]
    for t in tasks:  # why each failed, diverged, was stopped or was not evaluated (a
        # stopped one's rung, value and rule were the report's alone: a review); a
        # sweep's many stops, the first few (a line each made a 100-task sweep's
        # status 90 lines longer: a regression review)
        if t.error and (t.status != "stopped" or t in stopped[:_STOPS_SAID]):
            console.print(f"{t.task} ({t.status}): {error_line(t.error)}", markup=False)
    if len(stopped) > _STOPS_SAID:
        console.print(f"... and {len(stopped) - _STOPS_SAID} more stopped: each one's reason "
                      f"is in the report ({run_dir / 'report' / 'summary.md'})")
    recorded = {t.task for t in tasks}
    for name, problems in (invalid or {}).items():  # one that trained before: as it was
        said = "invalid, left as it was" if name in recorded else "invalid, never started"
        console.print(f"{name} ({said}): {'; '.join(problems)}", markup=False)
    for request in additions:
        if request.state == "waiting":
            console.print(f"asked to add {', '.join(request.names)} (from "
                          f"{request.workload}): not taken yet")
        elif request.state == "refused":
            # Its first line says why; a traceback after it (a workload file that failed
            # to load) was `dione add`'s to print and the run's log's, not a table's.
            first, *rest = (request.message or "").strip().splitlines() or [""]
            console.print(f"refused to add {', '.join(request.names)}: {first}"
                          + (" (its traceback: the launcher's output)" if rest else ""),
                          markup=False)
    _say_inexact(tasks)
    _say_best(run_dir, best or {})
