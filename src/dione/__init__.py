"""dione: train many deep-learning models at once, finishing the whole batch early."""

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dione._lazy import lazy_exports
from dione._version import __version__

if TYPE_CHECKING:
    from dione.orchestrate import RunEvent, RunOptions, RunResult, TaskResult
    from dione.orchestrate.additions import TaskInbox
    from dione.spec import (
        Cluster,
        Node,
        Task,
        Workload,
        grid,
        load_workload,
        local_cluster,
        samples,
        shifted_tokens,
        tokens,
    )
    from dione.spec.stopping import Asha, Median, Patience, PausingAsha, SuccessiveHalving
    from dione.techniques import (
        SliceContext,
        SliceOutcome,
        Technique,
        get_technique,
        register,
    )


# Imported on first use: `import dione` (the CLI, every worker) must not pay for torch.
__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("Asha", "Median", "Patience", "PausingAsha", "SuccessiveHalving"),
                   "dione.spec.stopping"),
    **dict.fromkeys(("Cluster", "Node", "Task", "Workload", "grid", "load_workload",
                     "local_cluster", "samples", "shifted_tokens", "tokens"), "dione.spec"),
    **dict.fromkeys(("SliceContext", "SliceOutcome", "Technique", "get_technique",
                     "register"), "dione.techniques"),
    "TaskInbox": "dione.orchestrate.additions",
    # What dione.run returns, takes and tells on_event, for help() and type hints.
    **dict.fromkeys(("RunEvent", "RunOptions", "RunResult", "TaskResult"),
                   "dione.orchestrate"),
    "ProfileEvent": "dione.profile",
})


def _keeps_draws(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` leaving the caller's global generators (torch's CPU, Python's,
    NumPy's) as they were: a notebook's next draws go on as if it had not been called
    (validation seeded torch's; the first run's imports drew from Python's: a notebook
    review)."""
    import functools

    @functools.wraps(function)
    def kept(*args: Any, **kwargs: Any) -> Any:
        from dione.spec.draws import generators_kept

        with generators_kept():
            return function(*args, **kwargs)

    return kept


def _devices_text(devices: Any) -> None:
    """Refuse ``devices`` that is not None or text as ``--devices`` takes it."""
    if devices is not None and not isinstance(devices, str):
        raise ValueError(f"devices must be text as --devices takes it ('cpu:2', 'cuda:4'), "
                         f"not {devices!r}")


@_keeps_draws
def run(workload: Any, *, devices: str | None = None, run_dir: str = "runs/dione",
        ray: str | None = None, on_event: Callable[[Any], None] | None = None,
        quiet: bool = False, tensorboard: str | None = None,
        mlflow: str | bool | None = None, inbox: Any = None,
        ray_env: Mapping[str, str] | Sequence[str] | None = None, **options: Any) -> Any:
    """Profile, plan and train every task of ``workload`` (a Workload, a list of tasks, a
    task, or a workload file's path) on this machine (``devices`` as ``--devices``), or on the Ray
    cluster at ``ray`` (an address as ``ray.init`` takes it, e.g. ``"auto"``), as ``dione
    run`` does, into ``run_dir`` (default ``runs/dione``; the command's is
    ``runs/<workload name>``); ``options`` are ``dione.orchestrate.RunOptions`` fields.
    Each event (a ``ProfileEvent`` while profiling, then a ``RunEvent`` per plan, slice
    and task) goes to ``on_event``, and, unless ``quiet``, is printed as one line, as ``dione run``
    prints it off a terminal; an exception ``on_event`` raises stops the run (its gangs
    stopped, its report written, as Ctrl-C does) and reaches the caller. Returns the
    ``RunResult``: per task its status, final loss, evaluation and checkpoint; invalid
    tasks are left out and listed in its ``invalid``. Calling it
    again with the same ``run_dir`` resumes an interrupted run. ``tensorboard`` (a
    folder) and ``mlflow`` (a tracking URI, or True for MLflow's default) are written
    as it trains, as ``dione run --tensorboard/--mlflow`` write them; the run's page,
    ``run_dir/report/index.html``, is kept fresh either way. ``inbox``: a
    ``dione.TaskInbox`` another thread adds tasks to while the run trains (a sequential
    searcher's next configurations); the run then ends once the inbox is closed and
    every task ended, and its result covers the added tasks too. ``ray_env``: variables
    the Ray workers get (they start with their node's environment, not this process's):
    a mapping, or ``--ray-env``'s items (``"NAME=VALUE"``, or ``"NAME"`` for this
    process's value, read again each time and never written down: a secret)."""
    # Imported here: workers import this package and need none of the planning stack.
    from dione.orchestrate import RunOptions, run_workload
    from dione.orchestrate.interrupts import interruptible
    from dione.orchestrate.options import RunDirError
    from dione.report import report_after_run
    from dione.spec import Cluster, ClusterError, load_workload, local_cluster
    from dione.state.store import STORE_FILE
    from dione.techniques.validation import valid_tasks

    _argument_types(workload=workload, run_dir=run_dir, on_event=on_event)
    env = _ray_env(ray, ray_env)
    workload_file = None
    if isinstance(workload, (str, os.PathLike)):
        workload_file = os.fspath(workload)
        workload = load_workload(workload_file)
    _devices_text(devices)
    if not isinstance(quiet, bool):
        raise TypeError(f"quiet must be True or False, not {quiet!r}")
    workload = _tasks_of(workload)
    _known_options(options)
    tasks, problems = valid_tasks(workload)
    if inbox is not None:  # the run waits for the inbox's tasks: it may start with none
        problems = [p for p in problems if p.field != "tasks"]
    _some_valid(tasks, problems, inbox)
    said = _said(on_event, quiet)
    run_options = RunOptions(**options)  # bad options are named before anything starts
    # Devices checked before run.json records them (a bad one made every resume fail).
    try:
        cluster = local_cluster(devices) if ray is None else None
    except ClusterError as err:  # in this call's words, not the command line's
        raise ClusterError(str(err).replace("--devices ", "devices=")) from None
    if cluster is not None:
        tasks, problems = _trainable(tasks, problems, cluster.nodes[0], inbox)
        from dione.spec.devices import shared_cores

        crowded = shared_cores(cluster.nodes[0].kind, cluster.nodes[0].devices)
        if crowded is not None:  # a warning, as dione run gives it
            warnings.warn(crowded, stacklevel=_outside_dione())
    if workload_file is not None:  # `dione resume`, `export` and `dione.load` read it
        _record_run(workload_file, run_dir, run_options, devices, ray, tensorboard, mlflow,
                    env)
    page = _LivePage(run_dir, list(tasks), tensorboard, mlflow)
    # Ctrl-C (and SIGTERM) stop the run cleanly at any moment; the caller's handlers are
    # put back after (a notebook's interrupt keeps working).
    try:
        with interruptible():
            if ray is None:
                assert cluster is not None
                result = run_workload(tasks, cluster, run_dir, run_options,
                                      on_event=page.seeing(said[0], inbox),
                                      on_profile_event=said[1], inbox=inbox,
                                      invalid=problems)
            else:
                from dione.cli.inputs import ray_environment
                from dione.launch.ray_launcher import RayLauncher

                launcher = RayLauncher(ray, env=ray_environment(env))
                try:
                    nodes = launcher.nodes()  # widest first, as profiling takes them
                    tasks, problems = _trainable(tasks, problems, nodes[0], inbox)
                    result = run_workload(tasks, Cluster(nodes), run_dir,
                                          run_options, launcher=launcher,
                                          on_event=page.seeing(said[0], inbox),
                                          on_profile_event=said[1], inbox=inbox,
                                          invalid=problems)
                finally:
                    launcher.shutdown()
    except BaseException as err:
        # Whatever ends it (Ctrl-C, SIGTERM, an on_event that raised), the live page's
        # thread goes (it went on rewriting a "live" page after an on_event raised, for
        # as long as the notebook lived) and the report says where the run stands: not
        # for a refusal, which may be of another run's directory; every task the store
        # holds, those added while it ran too.
        page.close()
        refused = isinstance(err, (RunDirError, ClusterError))
        if not refused and os.path.isfile(os.path.join(run_dir, STORE_FILE)):
            # What stopped the run is what the caller must see, not a report's failure
            # (said in a line, as the success path says its troubles).
            try:
                trouble = report_after_run(run_dir, None, stopped=True)
            except Exception as failed:
                trouble = f"the report could not be written ({type(failed).__name__}: {failed})"
            if trouble:
                warnings.warn(f"the stopped run's {trouble.removeprefix('the ')}",
                              stacklevel=_outside_dione())
        if isinstance(err, RunDirError) and "(--out)" in str(err):  # this call's words
            raise RunDirError(str(err).replace("(--out)", "(run_dir=)")) from None
        raise
    troubles = page.close()
    problem = report_after_run(run_dir, None)  # every task of the run, not only these
    for trouble in [*troubles, *([problem] if problem else [])]:
        warnings.warn(trouble, stacklevel=_outside_dione())
    # A bad task stops only itself; a changed one's reason, from the run, after them.
    result.invalid = [str(p) for p in problems] + result.invalid
    return result


def _tasks_of(workload: Any) -> list[Any]:
    """``workload`` (a Workload, a list of tasks, a task) as a list of tasks; TypeError
    naming the items that are none (a dict gave its keys: an AttributeError on the
    first)."""
    from dione.spec.task import Task

    tasks: list[Any] = [workload] if isinstance(workload, Task) else list(workload)
    strays = [f"item {i} is a {type(t).__name__}" for i, t in enumerate(tasks)
              if not isinstance(t, Task)]
    if strays:
        raise TypeError("workload must be a workload file's path, a dione.Workload or a list "
                        f"of dione.Task: {'; '.join(strays[:3])}"
                        + ("; a dict's tasks are list(d.values())" if any(
                            "str" in s for s in strays) else ""))
    return tasks


def _some_valid(tasks: Sequence[Any], problems: Sequence[Any], inbox: Any) -> None:
    """Refuse a workload left with no task (one with an inbox may start with none)."""
    if not tasks and inbox is None:
        raise ValueError("no task of the workload is valid:\n"
                         + "\n".join(str(p) for p in problems))


def _trainable(tasks: list[Any], problems: list[Any], widest: Any, inbox: Any
               ) -> tuple[list[Any], list[Any]]:
    """``tasks`` less those no technique they allow trains on the ``widest`` node, whose
    problems join ``problems`` (refused now, not failed after profiling)."""
    from dione.techniques.validation import trained_by_none

    tasks, untrainable = trained_by_none(tasks, widest.devices, widest.kind)
    problems = [*problems, *untrainable]
    _some_valid(tasks, problems, inbox)
    return tasks, problems


def _known_options(options: Mapping[str, Any]) -> None:
    """Every keyword of ``dione.run`` beyond its own is a ``RunOptions`` field: a TypeError
    naming each unknown one with the field it likely misspells (it said
    ``RunOptions.__init__() got an unexpected keyword argument``, the first only)."""
    import dataclasses
    import difflib

    from dione.orchestrate import RunOptions

    fields = sorted(f.name for f in dataclasses.fields(RunOptions))
    unknown = [k for k in options if k not in fields]
    if unknown:
        said = [f"{k!r}" + (f" (did you mean {close[0]!r}?)" if (
            close := difflib.get_close_matches(k, fields, 1)) else "") for k in unknown]
        raise TypeError(f"dione.run() got unknown option(s) {', '.join(said)}; its options "
                        f"beside its own arguments (dione.orchestrate.RunOptions): "
                        f"{', '.join(fields)}")


def _ray_env(ray: str | None, env: Mapping[str, str] | Sequence[str] | None) -> list[str]:
    """``ray_env`` checked (text names and values, only with ``ray``), as ``--ray-env``
    items: what run.json records."""
    if not env:
        return []
    if ray is None:
        raise ValueError("ray_env sets variables in a Ray cluster's workers: give ray= too, "
                         "or set the variables in os.environ for this machine's workers")
    items: list[Any] | None  # a generator is read once, here: kept, not used up
    if isinstance(env, Mapping):
        items = [f"{k}={v}" if isinstance(k, str) and isinstance(v, str) else None
                 for k, v in env.items()]
    else:
        items = None if isinstance(env, str) else list(env)
    if items is None or not all(isinstance(item, str) for item in items):
        raise ValueError(f"ray_env must map variable names to text values, or list "
                         f"'NAME=VALUE' and 'NAME' items, not {env!r}")
    from dione.cli.errors import BadInput
    from dione.cli.inputs import ray_environment

    try:  # checked as --ray-env checks them
        ray_environment(items)
    except BadInput as err:
        raise ValueError(str(err).replace("--ray-env", "ray_env")) from None
    return items


def _record_run(workload_file: str, run_dir: str, options: Any, devices: str | None,
                ray: str | None, tensorboard: str | None, mlflow: str | bool | None,
                ray_env: Sequence[str]) -> None:
    """Write ``run_dir/run.json`` as ``dione run`` does (the workload file, the options,
    the cluster, the dashboards), under the run directory's lock; a directory another
    workload's run holds is refused (ValueError), as ``dione run`` refuses it."""
    from pathlib import Path

    from dione.cli.errors import BadInput
    from dione.cli.saved_run import SavedRun, dashboard_places, same_workload
    from dione.orchestrate.options import claim_run_dir

    workload = str(Path(workload_file).resolve())
    folder = Path(run_dir)
    try:
        same_workload(folder, workload)  # as `dione run` refuses it
        with claim_run_dir(folder):
            SavedRun(workload, options, devices, ray, *dashboard_places(tensorboard, mlflow),
                     ray_env=tuple(ray_env)).write(folder)
    except BadInput as err:
        raise ValueError(str(err)) from None


class _LivePage:
    """``dione.run``'s live page and dashboards: opened once the run directory holds its
    store (at the run's first event), touched by the events that change what they
    show, closed with the results. A dashboard that cannot be written stops nothing."""

    def __init__(self, run_dir: str, tasks: Any, tensorboard: str | None,
                 mlflow: str | bool | None) -> None:
        import importlib.util
        from pathlib import Path

        self._run_dir = Path(run_dir)
        self._places = (tensorboard, mlflow)
        self._tasks = tasks
        self._page: Any = None
        self._troubles: list[str] = []
        for module, wanted in (("tensorboard", tensorboard), ("mlflow", mlflow)):
            if wanted and importlib.util.find_spec(module) is None:  # before any training
                raise RuntimeError(f"{module}= needs the {module} package: pip install "
                                   f"'dione[{module}]'")

    def seeing(self, said: Callable[[Any], None], inbox: Any = None) -> Callable[[Any], None]:
        def event(e: Any) -> None:
            if self._page is None:
                self._open()
            if e.kind == "task_added" and inbox is not None and e.task in inbox.taken:
                self._tasks.append(inbox.taken[e.task])  # its model goes to the dashboards
            if e.kind in ("planned", "replanned", "slice_finished", "task_stopped"):
                self._page.touch()
            said(e)
        return event

    def _open(self) -> None:
        from dione.report.dashboards import open_dashboards
        from dione.report.page import LiveReport

        tensorboard, mlflow = self._places
        try:
            boards = open_dashboards(self._run_dir, tensorboard=tensorboard, mlflow=mlflow,
                                     tasks=self._tasks)
        except Exception as err:
            boards = []
            self._troubles.append(f"the dashboards could not be opened: {err}")
        self._page = LiveReport(self._run_dir, boards=boards)

    def close(self) -> list[str]:
        closed = list(self._page.close()) if self._page is not None else []
        return self._troubles + closed


# Techniques whose routine profiling skips this process has printed: a notebook's runs
# said the same six lines at every call (review).
_ROUTINE_SAID: set[str] = set()


def _said(on_event: Callable[[Any], None] | None, quiet: bool
          ) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
    """(run events, profile events) to ``on_event`` and, unless ``quiet``, a line each."""
    from dione.cli.console import console
    from dione.cli.views import profile_lines

    lines = profile_lines(_ROUTINE_SAID)

    def run_event(event: Any) -> None:
        if not quiet:
            console.print(f"[{event.kind}] {event.message}", markup=False, highlight=False)
        elif event.kind in WARNED or event.kind.endswith("_doubtful"):
            # What may make a result other than it reads: quiet hides progress, not this.
            warnings.warn(f"[{event.kind}] {event.message}", stacklevel=_outside_dione())
        if on_event is not None:
            on_event(event)

    def profile_event(event: Any) -> None:
        if not quiet:
            lines(event)
        if on_event is not None:
            on_event(event)

    return run_event, profile_event


# Events a quiet run still says (as warnings): each may make a result other than it reads.
WARNED = ("training_changed", "evaluation_failed", "task_failed", "task_refused",
          "stopping_rule_failed", "checkpoint_quarantined", "checkpoint_missing",
          "task_left_out")


def _outside_dione() -> int:
    """The stack level of the first caller outside dione (the user's dione.run line), for
    a warning said deep inside a run; beyond the stack, Python names ``sys``."""
    import sys

    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "dione":
        frame, level = frame.f_back, level + 1
    return level


def shutdown() -> None:
    """End this process's warm workers, which ``dione.run`` keeps between runs (a
    second run starts its slices in a fraction of a second), with their memory (on
    GPUs, their CUDA contexts): a notebook frees them so; the next run starts new ones.
    They end with the process anyway. Workers a run training now in this process (in
    another thread) holds are left to it, with what starts them, and said so."""
    from dione.launch.pool import shutdown_local_pool

    busy = shutdown_local_pool()
    if busy:
        warnings.warn(f"dione.shutdown(): {busy} worker(s) are training a run in this "
                      "process now: they are left to it (and what forks workers, with "
                      "them); the idle ones ended. Call dione.shutdown() again once that "
                      "run has ended", stacklevel=2)


def _argument_types(*, workload: Any = None, run_dir: Any = "", on_event: Any = None,
                    latest: bool = False) -> None:
    """TypeError naming the argument of ``run`` or ``load`` given a value of a wrong
    type (it failed deep inside: "'int' object is not iterable")."""
    from collections.abc import Iterable

    from dione.spec.task import Task

    if not (workload is None or isinstance(workload, (str, os.PathLike, Task, Iterable))):
        raise TypeError(f"workload must be a workload file's path, a dione.Workload or a "
                        f"list of dione.Task, not {type(workload).__name__}")
    if not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError(f"run_dir must be a folder's path, not {type(run_dir).__name__}")
    if on_event is not None and not callable(on_event):
        raise TypeError(f"on_event must be a function of one RunEvent, not "
                        f"{type(on_event).__name__}")
    if not isinstance(latest, bool):
        raise TypeError(f"latest must be True or False, not {latest!r}")


def load(run_dir: str | os.PathLike[str], task: str, *, workload: Any = None,
         latest: bool = False, best: bool = False, step: int | None = None) -> Any:
    """The trained model of ``task`` in ``run_dir``: a fresh, unwrapped model (on the
    CPU, in eval mode) with the weights of its final checkpoint, whatever technique
    trained it. ``workload`` (a file, a Workload or a list of tasks) defaults to the
    file the run was started with (its ``run.json``); ``latest`` takes the newest
    checkpoint of a task that is not done, ``best`` the one where its ``keep_best``
    metric was best, ``step`` the one it keeps at that step (one of the three at most).
    Its ``dione_trained`` attribute says how it was trained (the step, the techniques in
    turn, and ``exactness``: exact, statistical or inexact, with the spans and why, as
    ``dione export``'s ``dione.json`` does); loading an inexactly trained one warns."""
    from dione.spec import load_workload
    from dione.state.export import (
        kept_checkpoint,
        load_trained,
        loaded_provenance,
        model_edited,
        trained_checkpoint,
        workload_of_task,
    )

    _argument_types(workload=workload, run_dir=run_dir, latest=latest)
    if not isinstance(best, bool):
        raise TypeError(f"best must be True or False, not {best!r}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"step must be a step number or None, not {step!r}")
    if step is not None and step < 1:
        raise ValueError(f"step must be 1 or more (a checkpoint after that many steps), "
                         f"not {step}")
    if latest + best + (step is not None) > 1:
        raise ValueError("give one of latest, best and step, not several")
    run_dir = os.fspath(run_dir)
    from dione.spec.task import Task

    if isinstance(workload, Task):  # one task: as a list of it
        workload = [workload]
    if workload is None or isinstance(workload, (str, os.PathLike)):
        workload = load_workload(os.fspath(workload or workload_of_task(run_dir, task)))
    matching = [t for t in workload if t.name == task]
    if not matching:
        raise KeyError(f"the workload has no task {task!r}; its tasks: "
                       + ", ".join(t.name for t in workload))
    checkpoint = (kept_checkpoint(run_dir, matching[0], best=best, step=step)[0]
                  if best or step is not None else trained_checkpoint(run_dir, task, latest))
    model: Any = load_trained(matching[0], checkpoint)
    edited = model_edited(run_dir, matching[0], model)
    if edited:
        warnings.warn(edited, stacklevel=2)
    # How it was trained, as `dione export`'s dione.json says: a model trained inexactly
    # (xpipe) must not pass for one trained as single would in a comparison.
    model.dione_trained = trained = loaded_provenance(run_dir, task, checkpoint)
    if trained.get("exactness") == "inexact":
        spans = "; ".join(trained["inexact"])
        warnings.warn(f"task {task!r} (step {trained['step']}) trained inexactly, not as "
                      f"single would ({spans}): its model.dione_trained says how",
                      stacklevel=2)
    return model


@_keeps_draws
def validate(workload: Any, *, devices: str | None = None) -> Any:
    """Check ``workload`` (a Workload, a list of tasks, a task, or a workload file's
    path) as ``dione validate`` does, training nothing: a ``Validation`` with the
    ``tasks`` a run would train, every ``problem`` that leaves one out (each with its
    ``task``, ``field`` and ``message``; ``ok`` where there is none), per technique and
    reason the tasks it will not train (``refused``), ``warnings`` with their tasks,
    and ``lines()``, all said as the command says them. ``devices`` as ``dione.run``'s
    (default: what this machine gives a run)."""
    from dione.spec import ClusterError, load_workload, local_cluster
    from dione.techniques.checking import check_workload

    _argument_types(workload=workload)
    _devices_text(devices)
    if isinstance(workload, (str, os.PathLike)):
        workload = load_workload(os.fspath(workload))
    workload = _tasks_of(workload)
    try:
        node = local_cluster(devices).nodes[0]
    except ClusterError as err:  # in this call's words, as dione.run's (a review)
        raise ClusterError(str(err).replace("--devices ", "devices=")) from None
    return check_workload(workload, node.devices if devices is not None else None,
                          node.kind, node.devices)[1]


def evaluate(run_dir: str | os.PathLike[str], tasks: Sequence[str] = (), *,
             workload: Any = None, device: str = "cpu") -> list[Any]:
    """Evaluate done tasks of a run that has ended on their final weights, in this
    process on ``device``, and record each as the run would have (then its report is
    written again): ``tasks`` by name, or every done task whose final evaluation failed
    (a bug in ``evaluate``, fixed since) or never ran. ``workload`` (a file, a Workload
    or a list of tasks) defaults to the file each task was started or added with. Each
    result has ``task``, ``step``, ``evaluation`` (its metrics) and ``error`` (the
    traceback where its evaluate raised again: that task is left as it was, the others
    are evaluated all the same)."""
    import functools

    from dione.orchestrate.evaluate_again import evaluate_again, tasks_to_evaluate
    from dione.report import write_report
    from dione.spec import load_workload
    from dione.spec.task import Task
    from dione.state.export import workload_of_task

    _argument_types(workload=workload, run_dir=run_dir)
    if isinstance(tasks, str):
        tasks = [tasks]
    run_dir = os.fspath(run_dir)
    if isinstance(workload, Task):
        workload = [workload]
    loaded = functools.cache(load_workload)  # each workload file once

    def workload_for(name: str) -> Any:
        if workload is not None and not isinstance(workload, (str, os.PathLike)):
            return workload
        return loaded(os.fspath(workload or workload_of_task(run_dir, name)))

    done = evaluate_again(run_dir, tasks_to_evaluate(run_dir, list(tasks), workload_for),
                          device)
    if done:
        write_report(run_dir)
    return done


__all__ = [
    "Asha",
    "Cluster",
    "Median",
    "Node",
    "Patience",
    "PausingAsha",
    "ProfileEvent",
    "RunEvent",
    "RunOptions",
    "RunResult",
    "SliceContext",
    "SliceOutcome",
    "SuccessiveHalving",
    "Task",
    "TaskInbox",
    "TaskResult",
    "Technique",
    "Workload",
    "__version__",
    "evaluate",
    "get_technique",
    "grid",
    "load",
    "load_workload",
    "local_cluster",
    "register",
    "run",
    "samples",
    "shifted_tokens",
    "shutdown",
    "tokens",
    "validate",
]
