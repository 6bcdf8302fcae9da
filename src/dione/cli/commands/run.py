"""``dione run``: validate, profile, plan and train a workload to its end; or, with
``--current-practice``, each task in turn on all devices."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dione.cli.console import complain, console
from dione.cli.errors import EXIT_FAILED, BadInput
from dione.cli.inputs import claimed, default_run_dir, ray_launcher, valid_tasks
from dione.cli.parser import OPTION_FLAGS, run_options
from dione.cli.saved_run import SavedRun, dashboard_places, same_workload
from dione.cli.views import print_results, print_sequential_results, profile_lines
from dione.state.summaries import error_line

__all__ = ["command", "execute"]


def command(args: argparse.Namespace) -> int:
    options = run_options(vars(args))
    run_dir = Path(args.out) if args.out else default_run_dir(args.workload)
    if args.current_practice:
        return _current_practice(args, options, run_dir)
    if args.technique:
        raise BadInput("--technique forces one technique for current practice; add "
                       "--current-practice, or restrict techniques in the task")
    tensorboard, mlflow = dashboard_places(args.tensorboard, args.mlflow)
    run = SavedRun(str(Path(args.workload).resolve()), options, args.devices, args.ray,
                   tensorboard, mlflow, ray_env=tuple(args.ray_env))
    return execute(args.workload, run, run_dir, record=run)


def _moved_not_another(run_dir: Path, before: str, workload: str, names: set[str]) -> None:
    """Refuse, as the workload ``before`` moved to ``workload``, a file that holds none
    of the run's tasks: another workload, whose tasks would be mixed into the run."""
    from dione.state.store import STORE_FILE, RunStore

    if not (run_dir / STORE_FILE).is_file():
        return
    with RunStore(run_dir) as store:
        known = [t.name for t in store.tasks()]
    if known and not names & set(known):
        shown = ", ".join(known[:5]) + (", ..." if len(known) > 5 else "")
        raise BadInput(f"{workload} holds none of the tasks of the run in {run_dir} ({shown}): "
                       f"it is another workload, not {before} moved; give the file that "
                       "workload moved to, or start the new one in a run directory of its "
                       "own (dione run --out)")


def execute(workload_file: str, run: SavedRun, run_dir: Path, *,
            record: SavedRun | None, replacing: str | None = None) -> int:
    """Validate, profile, plan, run, report: the body of ``run`` and ``resume``. The run
    directory is touched only once the workload is known to start; then ``record`` is
    written to its ``run.json`` (for ``dione resume``), replacing one of the same
    workload or of ``replacing`` (a workload that moved), never another's."""
    launcher = ray_launcher(run.ray, run.devices, run.ray_env)
    try:
        return _execute_on(workload_file, run, run_dir, record, replacing, launcher)
    finally:
        if launcher is not None:
            launcher.shutdown()


def _execute_on(workload_file: str, run: SavedRun, run_dir: Path, record: SavedRun | None,
                replacing: str | None, launcher: Any) -> int:
    from dione.orchestrate import RunEvent, run_workload
    from dione.orchestrate.progress import LiveProgress
    from dione.orchestrate.run import RunDirError
    from dione.report import report_after_run
    from dione.report.page import LiveReport
    from dione.spec.cluster import ClusterError

    tasks, problems, cluster = valid_tasks(workload_file, run.devices, "started", launcher)
    if replacing is not None:  # `resume --workload`: the same workload, moved
        _moved_not_another(run_dir, replacing, workload_file,
                           {t.name for t in tasks} | {p.task for p in problems if p.task})
    if record:  # once the workload and devices are known good: their errors come first
        same_workload(run_dir, replacing or record.workload)
    with claimed(run_dir):
        from dione.report.dashboards import open_dashboards

        try:  # before run.json: a dashboard it cannot write is refused, not recorded
            boards = open_dashboards(run_dir, tensorboard=run.tensorboard, mlflow=run.mlflow,
                                     tasks=tasks)
        except (RuntimeError, ValueError) as err:  # the extra is missing; a bad place
            raise BadInput(str(err)) from None
        if record:
            record.write(run_dir)
        where = ", ".join(f"{n.devices} {n.kind} device(s) of {n.name}" for n in cluster)
        console.print(f"dione run: {len(tasks)} task(s) on {where}; run dir {run_dir}")
        # RUN_DIR/report/index.html (and the dashboards), fresh while it runs.
        page = LiveReport(run_dir, boards=boards)
        with LiveProgress(console) as live:
            def said(event: RunEvent) -> None:
                live.event(f"[{event.kind}] {event.message}")
                if event.kind in ("planned", "replanned", "slice_finished", "task_stopped"):
                    page.touch()

            stopped = False  # by Ctrl-C or SIGTERM (not a refusal: maybe another's run)
            try:
                result = run_workload(tasks, cluster, run_dir, run.options, on_event=said,
                                      on_profile_event=profile_lines(), view=live.update,
                                      launcher=launcher, invalid=problems)
            except (RunDirError, ClusterError) as err:
                raise BadInput(str(err)) from None
            except KeyboardInterrupt:
                stopped = True
                raise
            finally:
                for trouble in page.close():  # the final report comes next, written once
                    complain("warning", trouble)
                if stopped:  # it says where the run stands, as `dione status` does (it
                    # showed the live page's last rewrite, up to 30 s before the stop);
                    # every task of the store: those `dione add` gave it too
                    report_after_run(run_dir, None, stopped=True)
        problem = report_after_run(run_dir, None)  # every task of the run, not only these
        if problem:
            complain("warning", problem)
    print_results(result, run_dir)
    if run.tensorboard:
        console.print(f"TensorBoard: tensorboard --logdir {run.tensorboard}")
    if run.mlflow:
        console.print(f"MLflow: mlflow ui --backend-store-uri {run.mlflow}")
    # A task its stopping rule stopped ended as asked (its reason is in the results).
    failed = [t for t in result.tasks if t.status not in ("done", "stopped")]
    logs = _failure_logs(run_dir, [t.task for t in failed if t.status == "failed"])
    for t in failed:
        error = str(t.error or "")
        begins = f"task {t.task!r} {t.status}: "  # a divergence's message does
        # Its last line here; the traceback, which names the user's line, in its log.
        last = error_line(error) + (f" (its traceback: {logs[t.task]})" if t.task in logs
                                    else "")
        complain(f"task {t.task} {t.status}", last.removeprefix(begins))
    _say_left_out(problems)
    for why in result.invalid:  # changed since the run recorded it: left as it was
        complain("not trained this session", why)
    return EXIT_FAILED if failed or problems or result.invalid else 0


def _failure_logs(run_dir: Path, names: Sequence[str]) -> dict[str, Path]:
    """Per failed task, the log of its newest failed slice that holds the traceback."""
    from dione.state.slice_logs import failure_log
    from dione.state.store import RunStore

    if not names:
        return {}
    with RunStore(run_dir) as store:
        slices = store.slices()
    return {name: log for name in names
            if (log := failure_log(run_dir, slices, name)) is not None}


def _say_left_out(problems: Sequence[Any]) -> None:
    """A closing line per task validation left out (said once, before profiling: the
    exit status 1 at the end had no reason near it)."""
    from dione.orchestrate.run import invalid_by_task

    for name, why in invalid_by_task(problems).items():
        complain(f"task {name} not trained (invalid)", "; ".join(why))


def _current_practice(args: argparse.Namespace, options: Any, run_dir: Path) -> int:
    from dione.orchestrate.run import RunDirError, invalid_by_task
    from dione.orchestrate.sequential import run_sequential
    from dione.report import report_after_run
    from dione.techniques import technique_names

    if args.ray is not None or args.ray_env:
        raise BadInput("--current-practice trains on this machine's devices, one task after "
                       "another; drop --ray, or drop --current-practice to plan the cluster")
    if args.technique is not None and args.technique not in technique_names():
        raise BadInput(f"--technique {args.technique!r} is not a technique; choose one of "
                       f"{', '.join(technique_names())}")
    tasks, problems, cluster = valid_tasks(args.workload, args.devices, "started")
    # What the baseline does not do (no plan, no profile, no dashboard): said, not
    # ignored without a word. Of the option flags it uses --slice-steps, --timeout and
    # --storage (and --technique, its own).
    unused = [name for name in ("--tensorboard", "--mlflow", *(
        f.name for f in OPTION_FLAGS if f.field not in ("slice_steps", "timeout", "storage")))
        if getattr(args, name.removeprefix("--").replace("-", "_"), None) not in (None, False)]
    if unused:
        complain("warning", f"--current-practice trains each task in turn without a plan "
                 f"or a profile: {', '.join(unused)} do(es) nothing here")
    ruled = [t.name for t in tasks if t.stopping is not None]
    if ruled:  # the baseline trains everything: said, so no one compares it unawares
        complain("warning", f"--current-practice trains every task to its end; the stopping "
                 f"rules of {len(ruled)} task(s) ({', '.join(ruled[:5])}"
                 f"{', ...' if len(ruled) > 5 else ''}) are not applied. Drop "
                 "--current-practice to apply them")
    node = cluster.nodes[0]
    # Recorded as `dione run` records a planned run: export and dione.load read the
    # workload from it; resume names the command that continues it.
    saved = SavedRun(str(Path(args.workload).resolve()), options, args.devices,
                     current_practice=args.technique or "")
    same_workload(run_dir, saved.workload)  # never over another workload's record
    with claimed(run_dir):  # created private; never under a live launcher's run
        saved.write(run_dir)
    console.print(f"dione run: {len(tasks)} task(s) on {node.devices} {node.kind} device(s) of "
                  f"{node.name}, each in turn on all devices (current practice); run dir "
                  f"{run_dir}")

    def report(task: Any, result: Any) -> None:
        loss = f"{result.losses[-1]:.4f}" if result.losses else "-"
        console.print(f"  {task.name}: steps {result.start_step}-{result.end_step} under "
                      f"{result.technique} in {result.seconds:.1f} s, loss {loss}")

    try:
        outcomes = run_sequential(tasks, cluster, run_dir, technique=args.technique,
                                  slice_steps=options.slice_steps, timeout=options.timeout,
                                  on_slice=report, storage=options.storage,
                                  invalid=invalid_by_task(problems))
    except RunDirError as err:
        raise BadInput(str(err)) from None
    trouble = report_after_run(run_dir, [o.task for o in outcomes])
    if trouble:
        complain("warning", trouble)
    print_sequential_results(outcomes, run_dir)
    failed = [o for o in outcomes if o.error]
    for o in failed:
        complain(f"task {o.task} failed", str(o.error))
    _say_left_out(problems)
    return EXIT_FAILED if failed or problems else 0
