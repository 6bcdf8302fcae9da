"""The ``dione`` command: parses arguments and calls the parts; no logic of its own."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["main"]

EXIT_FAILED = 1  # training failed
EXIT_BAD_INPUT = 2  # the command, workload or cluster is wrong: nothing started

# Off a terminal (CI logs, pipes) rich would fold tables at 80 columns: give them room.
_WIDTH = None if sys.stdout.isatty() else 160
console = Console(highlight=False, markup=False, width=_WIDTH, soft_wrap=True)
# Errors are never folded: a message must stay greppable whole, whatever the width.
errors = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def _complain(label: str, message: str) -> None:
    """Print ``label: message`` to stderr, the label in red (the message never as markup)."""
    errors.print(Text(f"{label}: ", style="red") + Text(message))


class BadInput(Exception):
    """An input problem: printed as is, exit status 2."""


def _parse_knob(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise BadInput(f"--knob {text!r}: write KEY=VALUE, "
                       "e.g. --knob activation_checkpointing=true")
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return key, lowered == "true"
    for kind in (int, float):
        try:
            return key, kind(raw)
        except ValueError:
            pass
    return key, raw


def _load(path: str) -> Any:
    from dione.spec.workload import WorkloadFileError, load_workload

    try:
        return load_workload(path)
    except WorkloadFileError as err:
        raise BadInput(str(err)) from None


def _valid_tasks(workload_file: str, devices: str | None, what: str,
                 launcher: Any = None) -> tuple[Any, Any, Any]:
    """The workload's valid tasks, the problems of the others (printed), and the cluster
    (the local machine, or the Ray launcher's nodes); BadInput when the cluster is wrong
    or no task is valid (nothing ``what``)."""
    from dione.spec.cluster import Cluster, ClusterError, local_cluster
    from dione.spec.validate import split_valid
    from dione.techniques import technique_names

    workload = _load(workload_file)
    try:
        cluster = local_cluster(devices) if launcher is None else Cluster(launcher.nodes())
    except ClusterError as err:
        raise BadInput(str(err)) from None
    tasks, problems = split_valid(workload, None, technique_names(), cluster.nodes[0].kind)
    for problem in problems:
        _complain("invalid", str(problem))
    if not tasks:
        raise BadInput(f"no task of the workload is valid; nothing {what}")
    return tasks, problems, cluster


def _launcher(args: argparse.Namespace) -> Any:
    """The Ray launcher when ``--ray`` was given (None: this machine's workers)."""
    if getattr(args, "ray", None) is None:
        return None
    if getattr(args, "devices", None):
        raise BadInput("--devices describes this machine; with --ray the cluster's nodes "
                       "and devices come from Ray: leave --devices out")
    from dione.launch.ray_launcher import RayLauncher
    from dione.spec.cluster import ClusterError

    try:
        return RayLauncher(args.ray)
    except ClusterError as err:
        raise BadInput(str(err)) from None


def _default_run_dir(workload: str) -> Path:
    return Path("runs") / Path(workload).stem


def _claimed(run_dir: Path) -> Any:
    """The run directory created private and locked for this command; BadInput saying
    why it cannot be (another live launcher, not private, not writable)."""
    from dione.orchestrate.options import RunDirError, claim_run_dir

    try:
        return claim_run_dir(run_dir)
    except RunDirError as err:
        raise BadInput(str(err)) from None


def _cmd_validate(args: argparse.Namespace) -> int:
    from dione.spec.cluster import ClusterError, local_cluster
    from dione.spec.validate import WorkloadError, validate_workload
    from dione.techniques import technique_names

    workload = _load(args.workload)
    try:
        devices = local_cluster(args.devices).nodes[0].devices if args.devices else None
    except ClusterError as err:
        raise BadInput(str(err)) from None
    problems = validate_workload(workload, devices, technique_names())
    if problems:
        raise BadInput(str(WorkloadError(problems)))
    console.print(f"{args.workload}: {len(workload)} task(s), no problems")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from dione.launch.slice import SliceError, local_placement, run_slice
    from dione.spec.cluster import ClusterError, Node, local_cluster
    from dione.spec.validate import WorkloadError, check_task
    from dione.techniques import get_technique, technique_names

    workload = _load(args.workload)
    try:
        task = workload.task(args.task)
        technique = get_technique(args.technique)
    except KeyError as err:
        raise BadInput(err.args[0]) from None
    if workload.names().count(args.task) > 1:
        raise BadInput(f"task {args.task!r}: {workload.names().count(args.task)} tasks share "
                       "this name; names must be unique")
    try:  # cpu:N, cuda:N, or N of this machine's kind, as every other command takes it
        asked = local_cluster(args.devices).nodes[0]
    except ClusterError as err:
        raise BadInput(str(err)) from None
    count = asked.devices
    # The batch split is the technique's to judge (below): a pipeline splits into
    # micro-batches, not into one share per device.
    problems = check_task(task, None, technique_names(), asked.kind)
    if problems:
        raise BadInput(str(WorkloadError(problems)))
    node = local_cluster().nodes[0]
    if asked.kind != node.kind:  # CPU slots asked for on a machine with GPUs
        node = Node(node.name, max(count, node.cores or 1), "cpu", node.cores)
    if node.kind == "cpu" and count > node.devices:
        # CPU slots are virtual: allow more than the cores, each rank then gets one thread.
        node = Node(node.name, count, "cpu", node.cores)
    knobs = dict(_parse_knob(k) for k in args.knob)
    reasons = technique.check(task, count, knobs, node.kind)
    if reasons:
        raise BadInput(f"{technique.name} cannot train task {task.name!r} on {count} "
                       "device(s): " + "; ".join(reasons))
    run_dir = Path(args.out) if args.out else _default_run_dir(args.workload)
    with _claimed(run_dir):
        try:
            result = run_slice(task, technique, run_dir,
                               local_placement(node, range(count)), knobs=knobs,
                               steps=args.steps, timeout=args.timeout,
                               on_progress=_live_steps())
        except SliceError as err:
            _complain("diverged" if err.reason == "diverged" else "error", str(err))
            return EXIT_FAILED
    for warning in result.warnings:
        _complain("warning", warning)
    if result.extra.get("stages"):
        console.print("stages: " + "; ".join(
            f"{k}: {s}" for k, s in enumerate(result.extra["stages"])))
    for index, (loss, seconds) in enumerate(zip(result.losses, result.step_seconds, strict=True)):
        console.print(f"step {result.start_step + index + 1:>6}  loss {loss:.6f}  "
                      f"{seconds * 1000:8.2f} ms")
    console.print(
        f"task {task.name}: steps {result.start_step}-{result.end_step} under {technique.name} on "
        f"{count} device(s) in {result.seconds:.1f} s; checkpoint {result.checkpoint}"
    )
    if result.evaluation:
        console.print("evaluation: " + ", ".join(f"{k}={v:.4f}" for k, v in
                                                 result.evaluation.items()))
    if result.evaluation_error:
        _complain("evaluation failed", result.evaluation_error)
        return EXIT_FAILED
    return 0


def _live_steps() -> Any:
    """Progress while a slice trains (each rank reports about once a second): the step
    rank 0 reached, its pace, and the latest loss a rank holds (its share of the batch;
    the exact global losses follow when the slice ends)."""
    latest: dict[int, dict[str, Any]] = {}

    def show(rank: int, record: dict[str, Any]) -> None:
        latest[rank] = record
        if rank != 0:
            return
        pace = record.get("seconds_per_step")
        holder = next((r for r in sorted(latest) if latest[r].get("loss") is not None), None)
        console.print(Text(
            f"  ... step {record['step']}"
            + (f", {pace * 1000:.1f} ms/step" if pace else "")
            + (f", loss {latest[holder]['loss']:.4f} (rank {holder})" if holder is not None
               else "")))

    return show


def _trial_options(args: argparse.Namespace) -> Any:
    from dione.profile import TrialOptions

    return TrialOptions(warmup_steps=args.warmup_steps, measure_steps=args.measure_steps,
                        timeout=args.trial_timeout, repeats=args.trial_repeats,
                        memory_cap_bytes=_parse_bytes(args.memory_cap)
                        if args.memory_cap else None)


def _run_options(args: argparse.Namespace) -> Any:
    from dione.orchestrate import RunOptions

    return RunOptions(
        solver=args.solver, time_limit=args.time_limit, replan=not args.no_replan,
        replan_interval=args.replan_interval, slice_steps=args.slice_steps,
        slice_seconds=args.slice_seconds, max_failures=args.max_failures,
        timeout=args.timeout, catalog=args.catalog, reprofile=args.reprofile,
        profile_budget=args.budget, trial=_trial_options(args), storage=args.storage)


def _execute(workload_file: str, args: argparse.Namespace, run_dir: Path,
             saved: dict[str, Any] | None = None) -> int:
    """Validate, profile, plan, run, report: the body of ``run`` and ``resume``. The run
    directory is touched only once the workload is known to start; ``saved`` is then
    written to its ``run.json`` (for ``dione resume``)."""
    launcher = _launcher(args)
    try:
        return _execute_on(workload_file, args, run_dir, saved, launcher)
    finally:
        if launcher is not None:
            launcher.shutdown()


def _execute_on(workload_file: str, args: argparse.Namespace, run_dir: Path,
                saved: dict[str, Any] | None, launcher: Any) -> int:
    from dione.orchestrate import RunEvent, run_workload
    from dione.orchestrate.progress import LiveProgress
    from dione.orchestrate.run import RunDirError
    from dione.spec.cluster import ClusterError

    tasks, problems, cluster = _valid_tasks(workload_file, args.devices, "started", launcher)
    options = _run_options(args)
    with _claimed(run_dir):
        if saved is not None:
            try:
                (run_dir / "run.json").write_text(json.dumps(saved, indent=1) + "\n")
            except OSError as err:
                raise BadInput(f"cannot write {run_dir / 'run.json'}: {err.strerror}; give "
                               "a run directory you can write (--out)") from None
        where = ", ".join(f"{n.devices} {n.kind} device(s) of {n.name}" for n in cluster)
        console.print(f"dione run: {len(tasks)} task(s) on {where}; run dir {run_dir}")
        with LiveProgress(console) as live:
            def said(event: RunEvent) -> None:
                live.event(f"[{event.kind}] {event.message}")

            try:
                result = run_workload(tasks, cluster, run_dir, options, on_event=said,
                                      on_profile_event=_profile_printer(), view=live.update,
                                      launcher=launcher)
            except (RunDirError, ClusterError) as err:
                raise BadInput(str(err)) from None
    _print_results(result, run_dir)
    failed = [t for t in result.tasks if t.status != "done"]
    for t in failed:
        _complain(f"task {t.task} {t.status}", str(t.error or ""))
    return EXIT_FAILED if failed or problems else 0


def _print_results(result: Any, run_dir: Path) -> None:
    """The run's table of per-task results, and where its report went."""
    metrics = sorted({k for t in result.tasks for k in t.evaluation})
    table = Table(title=f"results ({run_dir}): makespan {result.makespan:.1f} s, first plan "
                  f"{result.planned_makespan:.1f} s, {result.plans_adopted} plan(s), profiling "
                  f"{result.profile_seconds:.0f} s")
    table.add_column("task", no_wrap=True)
    for column in ("status", "techniques", "devices", "seconds", "final loss", *metrics):
        table.add_column(column, justify="left" if column in ("status", "techniques")
                         else "right")
    for t in result.tasks:
        table.add_row(t.task, t.status, ", ".join(t.techniques) or "-",
                      ", ".join(map(str, t.devices)) or "-", f"{t.seconds:.1f}",
                      "-" if t.final_loss is None else f"{t.final_loss:.4f}",
                      *(f"{t.evaluation[m]:.4f}" if m in t.evaluation else "-"
                        for m in metrics))
    console.print(table)
    console.print(f"report: {run_dir / 'report'} (summary.md, gantt.png, timeline.csv, "
                  "metrics.csv); plans: " + str(run_dir / "plans"))


def _cmd_run(args: argparse.Namespace) -> int:
    if args.current_practice:
        return _run_current_practice(args)
    if args.technique:
        raise BadInput("--technique forces one technique for current practice; add "
                       "--current-practice, or restrict techniques in the task")
    run_dir = Path(args.out) if args.out else _default_run_dir(args.workload)
    if args.storage:  # workers on other nodes, and a later resume, need it absolute
        args.storage = str(Path(args.storage).resolve())
    saved = {k: v for k, v in vars(args).items() if k not in ("handler",)}
    saved["workload"] = str(Path(args.workload).resolve())
    return _execute(args.workload, args, run_dir, saved)


def _cmd_resume(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    saved_file = run_dir / "run.json"
    if not saved_file.is_file():
        raise BadInput(f"{run_dir} has no run.json: it was not started by `dione run` "
                       "(give the run directory that `dione run --out` wrote)")
    try:
        saved = json.loads(saved_file.read_text())
        workload = saved["workload"]
        parsed = build_parser().parse_args(["run", workload])
    except (OSError, ValueError, KeyError, TypeError, SystemExit) as err:
        raise BadInput(f"{saved_file} is unreadable or damaged ({type(err).__name__}: {err}); "
                       "start the run again with `dione run WORKLOAD --out "
                       f"{run_dir}`, which keeps every checkpoint") from None
    for key, value in saved.items():
        setattr(parsed, key, value)
    if args.timeout is not None:
        parsed.timeout = args.timeout
    console.print(f"resuming {run_dir} ({workload})")
    return _execute(workload, parsed, run_dir)


def _cmd_report(args: argparse.Namespace) -> int:
    from dione.report import write_report

    try:
        folder = write_report(args.run_dir)
    except FileNotFoundError as err:
        raise BadInput(str(err)) from None
    console.print((folder / "summary.md").read_text())
    console.print(f"written: {folder}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import sqlite3
    import time

    from dione.report import read_plans, summaries
    from dione.state.lock import lock_holder
    from dione.state.store import STORE_FILE, RunStore

    run_dir = Path(args.run_dir)
    if not (run_dir / STORE_FILE).is_file():
        raise BadInput(f"{run_dir} is not a dione run directory (no {STORE_FILE})")
    try:
        with RunStore(run_dir) as store:
            tasks = summaries(store)
            running = [s for s in store.slices() if s.status == "running"]
        plans = read_plans(run_dir)
    except (OSError, sqlite3.Error, ValueError) as err:
        raise BadInput(f"{run_dir} cannot be read ({type(err).__name__}: {err})") from None
    holder = lock_holder(run_dir)
    if holder is not None and holder.alive:
        live = f"live: launcher pid {holder.pid} on {holder.host}"
    elif running:
        # The store says running, but no launcher holds the directory: it died.
        live = ("dead: its launcher "
                + (f"(pid {holder.pid} on {holder.host}) " if holder is not None else "")
                + "is gone; `dione resume` continues from the last checkpoints")
        running = []
    else:
        live = "no launcher running"
    table = Table(title=f"{run_dir}: {sum(t.status == 'done' for t in tasks)} of {len(tasks)} "
                  f"task(s) done, {len(plans)} plan(s) adopted; {live}")
    for column in ("task", "status", "steps", "techniques", "final loss", "evaluation",
                   "running now"):
        table.add_column(column)
    for t in tasks:
        now = [s for s in running if s.task == t.task]
        table.add_row(t.task, t.status, f"{t.steps}/{t.total_steps}",
                      ", ".join(t.techniques) or "-",
                      "-" if t.final_loss is None else f"{t.final_loss:.4f}",
                      ", ".join(f"{k}={v:.4f}" for k, v in t.evaluation.items()) or "-",
                      "; ".join(f"{s.technique} on {s.node}:{s.device_ids} steps "
                                f"{s.start_step}-{s.end_step} for "
                                f"{time.time() - s.started_at:.0f} s" for s in now) or "-")
    console.print(table)
    return 0


def _run_current_practice(args: argparse.Namespace) -> int:
    from dione.orchestrate.sequential import run_sequential

    tasks, problems, cluster = _valid_tasks(args.workload, args.devices, "started")
    node = cluster.nodes[0]
    run_dir = Path(args.out) if args.out else _default_run_dir(args.workload)
    console.print(f"dione run: {len(tasks)} task(s) on {node.devices} {node.kind} device(s) of "
                  f"{node.name}, each in turn on all devices (current practice); run dir "
                  f"{run_dir}")

    def report(task: Any, result: Any) -> None:
        loss = f"{result.losses[-1]:.4f}" if result.losses else "-"
        console.print(f"  {task.name}: steps {result.start_step}-{result.end_step} under "
                      f"{result.technique} in {result.seconds:.1f} s, loss {loss}")

    outcomes = run_sequential(tasks, cluster, run_dir, technique=args.technique,
                              slice_steps=args.slice_steps, timeout=args.timeout,
                              on_slice=report, storage=args.storage)
    metrics = sorted({k for o in outcomes for k in o.evaluation})
    table = Table(title=f"results ({run_dir})")
    table.add_column("task", no_wrap=True)
    for column in ("technique", "devices", "seconds", "final loss", *metrics, "status"):
        table.add_column(column, justify="left" if column in ("technique", "status") else "right")
    for o in outcomes:
        table.add_row(
            o.task, o.technique or "-", str(o.devices), f"{o.seconds:.1f}",
            "-" if o.final_loss is None else f"{o.final_loss:.4f}",
            *(f"{o.evaluation[m]:.4f}" if m in o.evaluation else "-" for m in metrics),
            "failed" if o.error else "done",
        )
    console.print(table)
    failed = [o for o in outcomes if o.error]
    for o in failed:
        _complain(f"task {o.task} failed", str(o.error))
    return EXIT_FAILED if failed or problems else 0


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse names the option)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1: use 1 or more")
    return value


def _parse_bytes(text: str) -> int:
    units = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = raw[-1] if raw and raw[-1] in units else ""
    try:
        value = float(raw[: len(raw) - len(unit)] if unit else raw)
    except ValueError:
        raise BadInput(f"--memory-cap {text!r}: write a size such as 2GiB, 512MiB or "
                       "1000000000") from None
    if value <= 0:
        raise BadInput(f"--memory-cap {text!r} must be positive")
    return int(value * units[unit])


def _task_list(names: Sequence[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _profile_printer() -> Any:
    """A progress callback for profile events: a bar on a terminal, lines elsewhere."""
    from dione.profile import ProfileEvent

    def show(event: ProfileEvent) -> None:
        if event.kind in ("finished", "skipped"):
            record = event.record
            what = (f"{record.status}" + (f", {record.step_seconds * 1000:.1f} ms/step"
                                          if record.step_seconds else "")
                    if record else f"skipped: {event.reason}")
            console.print(Text(f"  trial {event.label} ({', '.join(event.tasks)[:60]}): "
                               f"{what}"))
        elif event.kind == "not_tried":
            console.print(Text(f"  not tried: {event.label} for {_task_list(event.tasks)}: "
                               f"{event.reason}"))

    return show


def _profile(args: argparse.Namespace, tasks: Any, cluster: Any, launcher: Any = None) -> Any:
    """Profile ``tasks``, with a progress bar on a terminal; the Profile."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from dione.profile import Catalog, ProfileEvent, profile_workload

    progress = Progress(TextColumn("profiling"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.description}"), console=console,
                        disable=not console.is_terminal)
    bar = progress.add_task("", total=None)
    lines = _profile_printer()

    def show(event: ProfileEvent) -> None:
        if event.total:
            progress.update(bar, total=event.total)
        if event.kind in ("finished", "skipped"):
            progress.advance(bar)
        if event.kind == "started":
            progress.update(bar, description=f"{event.label} ({', '.join(event.tasks)[:60]})")
        if not console.is_terminal and event.kind != "not_tried":  # the table says it
            lines(event)

    with Catalog(args.catalog) as catalog, progress:
        return profile_workload(tasks, cluster, catalog, options=_trial_options(args),
                                reprofile=args.reprofile, budget=args.budget,
                                parallel=not args.serial, on_event=show, storage=args.storage,
                                **({"launcher": launcher} if launcher is not None else {}))


def _print_profile(profile: Any) -> None:
    """Per task: its chosen options, its failed trials and deliberate skips."""
    from dione.techniques import get_technique

    table = Table(title=f"profile: {profile.trials_run} trial(s) run, {profile.trials_cached} "
                  f"from the catalog, {profile.seconds:.0f} s")
    for column in ("task", "technique", "devices", "knobs", "ms/step", "spread",
                   "seconds (all steps)", "peak MiB", "note"):
        table.add_column(column, overflow="fold")
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
            table.add_row(
                task.task, record.technique, str(record.devices), knobs,
                f"{record.step_seconds * 1000:.1f}" if record.step_seconds else "-",
                f"{record.spread:.0%}" if record.spread is not None else "-", seconds,
                f"{record.peak_memory_bytes / 2**20:.0f}" if record.peak_memory_bytes else "-",
                note)
        for what, reason in task.skipped:
            table.add_row(task.task, what, "", "", "", "", "", "", f"skipped: {reason}")
        for technique, reason in task.not_tried():
            table.add_row(task.task, technique, "", "", "", "", "", "", f"not tried: {reason}")
    console.print(table)


def _cmd_profile(args: argparse.Namespace) -> int:
    launcher = _launcher(args)
    try:
        tasks, problems, cluster = _valid_tasks(args.workload, args.devices, "profiled",
                                                launcher)
        profile = _profile(args, tasks, cluster, launcher)
    finally:
        if launcher is not None:
            launcher.shutdown()
    _print_profile(profile)
    problem = profile.problem()
    text = json.dumps(problem, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
        console.print(f"problem for the planner: {args.output} ({len(problem['tasks'])} "
                      "task(s)); next: dione plan " + args.output)
    unprofiled = [t.task for t in profile.tasks if not t.options]
    for name in unprofiled:
        _complain("no feasible option", f"task {name}: every configuration failed or was "
                  "skipped; see the table")
    return EXIT_FAILED if unprofiled or problems else 0


def _add_profile_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalog", help="trial catalog SQLite file (default: $DIONE_CATALOG "
                        "or ~/.cache/dione/catalog.sqlite)")
    parser.add_argument("--reprofile", action="store_true",
                        help="run every trial again, ignoring the catalog")
    parser.add_argument("--budget", type=float, help="seconds of profiling after which no "
                        "new trial starts")
    parser.add_argument("--memory-cap", help="memory per device, e.g. 2GiB: a trial above it "
                        "counts as out of memory (default: the device's own limit)")
    parser.add_argument("--warmup-steps", type=int, default=5, help="steps not timed (5)")
    parser.add_argument("--measure-steps", type=int, default=20, help="steps timed (20)")
    parser.add_argument("--trial-repeats", type=_positive_int, default=1,
                        help="times each option's fastest setting is measured, at different "
                        "moments; the median is kept (1; 3 outvotes one slow spell of a "
                        "shared machine)")
    parser.add_argument("--trial-timeout", type=float, default=300.0,
                        help="seconds after which a trial counts as timed out (300)")
    parser.add_argument("--serial", action="store_true",
                        help="one trial at a time, even where devices allow more")


def _add_ray_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                        help="run on a Ray cluster (ADDRESS as ray.init takes it; default "
                        "auto): its alive nodes and their GPUs (else CPUs) are the cluster; "
                        "a task stays within one node; needs `pip install 'dione[ray]'`")
    parser.add_argument("--storage", metavar="PATH",
                        help="where checkpoints go (default: the run directory); with more "
                        "than one node, a folder every node reaches at this same path")


def _cmd_plan(args: argparse.Namespace) -> int:
    from dione.plan import ProblemError, check_plan, load_plan, load_problem, solve

    if args.check:
        if len(args.files) != 2:
            raise BadInput("--check takes PLAN.json PROBLEM.json")
        plan_file, problem_file = args.files
    else:
        if len(args.files) != 1:
            raise BadInput("give one PROBLEM.json (or --check PLAN.json PROBLEM.json)")
        problem_file, plan_file = args.files[0], None
    try:
        problem = load_problem(problem_file)
    except ProblemError as err:
        raise BadInput(f"{problem_file}: {err}") from None
    if plan_file is not None:
        try:
            plan = load_plan(plan_file)
        except (OSError, ValueError) as err:
            raise BadInput(f"{plan_file}: {err}") from None
        reasons = check_plan(plan, problem)
        if reasons:
            for reason in reasons:
                _complain("invalid", reason)
            return EXIT_FAILED
        console.print(f"{plan_file}: a valid plan of {problem_file}, makespan "
                      f"{plan.makespan:.1f} s")
        return 0
    try:
        plan = solve(problem, args.solver, args.time_limit, args.threads,
                     args.deterministic_time)
    except ValueError as err:
        raise BadInput(str(err)) from None
    text = json.dumps(plan.to_json(), indent=1)
    summary = (f"{plan.solver}: {plan.status}, makespan {plan.makespan:.1f} s, lower bound "
               f"{plan.lower_bound:.1f} s (gap {plan.gap:.2%}), solved in "
               f"{plan.solve_seconds:.2f} s")
    if args.output:
        Path(args.output).write_text(text + "\n")
        console.print(summary)
    else:
        print(text)
        errors.print(summary)
    return 0 if plan.assignments else EXIT_FAILED


def _cmd_export(args: argparse.Namespace) -> int:
    from dione.state.export import (
        ExportError,
        export_model,
        load_trained,
        trained_checkpoint,
        workload_of_run,
    )

    try:
        checkpoint = trained_checkpoint(args.run_dir, args.task, args.latest)
        workload = _load(args.workload or workload_of_run(args.run_dir))
        task = workload.task(args.task)
    except ExportError as err:
        raise BadInput(str(err)) from None
    except KeyError as err:
        raise BadInput(f"{err.args[0]}; give the workload the run was started with "
                       "(--workload)") from None
    model = load_trained(task, checkpoint)
    folder = export_model(model, args.output, task, checkpoint)
    files = ", ".join(sorted(p.name for p in folder.iterdir()))
    console.print(f"task {task.name}: weights of {checkpoint} written to {folder} ({files})")
    return 0


def _cmd_techniques(args: argparse.Namespace) -> int:
    from dione.techniques import techniques

    rows = [{"name": t.name, "exact": t.exact, "knobs": dict(t.knobs)} for t in techniques()]
    console.print_json(json.dumps(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    parser = argparse.ArgumentParser(prog="dione", description=__doc__)
    try:
        installed = version("dione")
    except PackageNotFoundError:
        installed = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"dione {installed}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="profile, plan and train every task of a workload "
                              "to the end, re-planning as real speeds come in")
    run.add_argument("workload", help="a Python file that defines `workload`")
    run.add_argument("--devices", help="e.g. cpu:4 or cuda:8 (default: every GPU, else one "
                     "CPU slot per core)")
    run.add_argument("--out", help="run directory (default: runs/<workload name>)")
    _add_ray_option(run)
    run.add_argument("--solver", default="cpsat",
                     choices=["cpsat", "greedy", "sequential", "saturn-milp"])
    run.add_argument("--time-limit", type=float, default=10.0,
                     help="seconds for the first plan (10)")
    run.add_argument("--no-replan", action="store_true", help="keep the first plan")
    run.add_argument("--replan-interval", type=float, default=60.0,
                     help="re-plan at least this often, in seconds (60)")
    run.add_argument("--slice-steps", type=int, help="checkpoint every this many steps")
    run.add_argument("--slice-seconds", type=float,
                     help="aim for slices of this many seconds (default: at least 300, and "
                     "20 times the slice start-up each option measured)")
    run.add_argument("--max-failures", type=int, default=3,
                     help="a task whose slices failed this often is failed (3)")
    run.add_argument("--timeout", type=float, help="seconds after which a slice is stopped")
    run.add_argument("--current-practice", action="store_true",
                     help="no profiling or planning: each task in turn on all devices")
    run.add_argument("--technique", help="with --current-practice: force this technique")
    _add_profile_options(run)
    run.set_defaults(handler=_cmd_run)

    resume = commands.add_parser("resume", help="finish a run that was stopped or killed")
    resume.add_argument("run_dir")
    resume.add_argument("--timeout", type=float, help="seconds after which a slice is stopped")
    resume.set_defaults(handler=_cmd_resume)

    report = commands.add_parser("report", help="(re)write a run's report and print it")
    report.add_argument("run_dir")
    report.set_defaults(handler=_cmd_report)

    status = commands.add_parser("status", help="show a running or finished run")
    status.add_argument("run_dir")
    status.set_defaults(handler=_cmd_status)

    prof = commands.add_parser("profile", help="time each task's configurations with short "
                               "real trials; write the planner's problem")
    prof.add_argument("workload")
    prof.add_argument("--devices", help="e.g. cpu:4 or cuda:8 (default: the local machine)")
    prof.add_argument("-o", "--output", help="write the problem JSON here")
    _add_ray_option(prof)
    _add_profile_options(prof)
    prof.set_defaults(handler=_cmd_profile)

    train = commands.add_parser("train", help="train one slice of one task")
    train.add_argument("workload")
    train.add_argument("--task", required=True)
    train.add_argument("--technique", required=True)
    train.add_argument("--devices", default="1",
                       help="e.g. cpu:2 or cuda:2, or 2 of this machine's kind (1)")
    train.add_argument("--steps", type=int, help="steps in this slice (default: to the end)")
    train.add_argument("--knob", action="append", default=[], metavar="KEY=VALUE")
    train.add_argument("--out", help="run directory (default: runs/<workload name>)")
    train.add_argument("--timeout", type=float, help="seconds after which the gang is stopped")
    train.set_defaults(handler=_cmd_train)

    validate = commands.add_parser("validate", help="report every problem of a workload")
    validate.add_argument("workload")
    validate.add_argument("--devices", help="check batch sizes against this device count")
    validate.set_defaults(handler=_cmd_validate)

    plan = commands.add_parser("plan", help="solve a problem JSON into a plan JSON, or "
                               "--check a plan")
    plan.add_argument("files", nargs="+", metavar="FILE",
                      help="PROBLEM.json, or with --check: PLAN.json PROBLEM.json")
    plan.add_argument("--check", action="store_true", help="check that a plan is valid")
    plan.add_argument("--solver", default="cpsat",
                      choices=["cpsat", "greedy", "sequential", "saturn-milp"])
    plan.add_argument("--time-limit", type=float, default=10.0, help="seconds (default 10)")
    plan.add_argument("--threads", type=int, help="solver threads (default: every core)")
    plan.add_argument("--deterministic-time", type=float, metavar="UNITS",
                      help="cpsat only: bound the search by CP-SAT's deterministic time "
                      "instead of the clock, so the same problem gives the same plan on a "
                      "busy machine (the time limit then stops nothing; measured here: a "
                      "unit took about 5 s on one thread, and 20-45 s on two interleaved "
                      "threads)")
    plan.add_argument("-o", "--output", help="write the plan JSON here (default: stdout)")
    plan.set_defaults(handler=_cmd_plan)

    export = commands.add_parser(
        "export", help="write a finished task's trained weights as safetensors (Hugging "
        "Face models: save_pretrained output)")
    export.add_argument("run_dir")
    export.add_argument("task")
    export.add_argument("-o", "--output", required=True, help="folder to write")
    export.add_argument("--workload", help="the workload file (default: the one the run "
                        "was started with, from its run.json)")
    export.add_argument("--latest", action="store_true",
                        help="take the newest checkpoint of a task that is not done")
    export.set_defaults(handler=_cmd_export)

    listing = commands.add_parser("techniques", help="list registered techniques and knobs")
    listing.set_defaults(handler=_cmd_techniques)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except BadInput as err:
        _complain("error", str(err))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        errors.print("interrupted; every gang was stopped, checkpoints kept")
        return 130


if __name__ == "__main__":
    sys.exit(main())
