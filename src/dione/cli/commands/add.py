"""``dione add``: add tasks of a workload file to a run, live or stopped; a live run
profiles them beside its gangs and plans them at its next re-plan."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from shlex import quote
from typing import TYPE_CHECKING, Any

from dione.cli.console import complain, console
from dione.cli.errors import EXIT_FAILED, BadInput
from dione.cli.inputs import load

if TYPE_CHECKING:
    from dione.spec.task import Task
    from dione.state.store import RunStore

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.spec.validate import repeated_names
    from dione.state.lock import lock_holder
    from dione.state.store import SIMULATED_FILE, STORE_FILE, AlreadyInRun, RunStore, not_a_run
    from dione.techniques.validation import valid_tasks

    run_dir = Path(args.run_dir)
    if not (run_dir / STORE_FILE).is_file():
        raise BadInput(f"{not_a_run(run_dir)}; start a "
                       "run with `dione run WORKLOAD --out RUN_DIR` first")
    if (run_dir / SIMULATED_FILE).is_file():  # its inputs are fixed, and it never resumes
        raise BadInput(f"{run_dir} is a simulated run (`dione simulate`): no task is added "
                       "to it; add the tasks to the problem or workload and simulate again")
    workload = str(Path(args.workload).resolve())
    defined = list(load(workload))
    twice = sorted(repeated_names(defined))
    if twice:  # which of them would be added, no one could tell
        raise BadInput(f"{args.workload} defines more than one task named "
                       f"{', '.join(map(repr, twice))}: give each a name of its own")
    by_name = {t.name: t for t in defined}
    unknown = [n for n in args.task if n not in by_name]
    if unknown:
        raise BadInput(f"{args.workload} defines no task {', '.join(map(repr, unknown))}; "
                       f"it defines {', '.join(by_name) or 'none'}")
    with RunStore(run_dir) as store:
        have = store.names_taken()
        wanted = [by_name[n] for n in args.task] if args.task else [
            t for t in by_name.values() if t.name not in have]
        already = [t.name for t in wanted if t.name in have]
        if already:
            raise BadInput(f"the run already has task(s) {', '.join(already)}: a task added "
                           "needs a name of its own")
        if not wanted:
            # The same name is not the same task: one changed in the file since is said
            # (it read as added before, which it never was).
            changed = [f"{name} ({'; '.join(differ)})" for name, task in by_name.items()
                       if (differ := _trained_otherwise(store, task))]
            raise BadInput(f"every task of {args.workload} is in the run already"
                           + (f" by name, though the file trains {', '.join(changed)} "
                              "otherwise than the run does" if changed else "")
                           + "; add a task with a new name to the file, or name one with "
                           "--task")
        tasks, problems = valid_tasks(wanted)
        for problem in problems:
            complain("invalid", str(problem))
        if not tasks:
            raise BadInput("no task to add is valid (the problems are above)")
        try:  # checked again as it is recorded: another add may have asked meanwhile
            request = store.add_tasks(workload, [t.name for t in tasks], unless_present=True)
        except AlreadyInRun as err:
            raise BadInput(f"{err}: a task added needs a name of its own") from None
    # Some of the file's tasks refused: said as `dione run` says it, by the exit status.
    done = EXIT_FAILED if problems else 0
    names = ", ".join(t.name for t in tasks)
    holder = lock_holder(run_dir)
    if holder is None or not holder.alive:
        console.print(f"asked {run_dir} to add {names}; no launcher runs it now: `dione "
                      f"resume {quote(str(run_dir))}` trains them with the rest")
        return done
    console.print(f"asked the live run in {run_dir} (launcher pid {holder.pid}) to add "
                  f"{names}")
    settled = _wait_for(run_dir, request, args.wait)
    if settled is None:
        console.print(f"the run has not taken them within {args.wait:g} s (it may be "
                      "profiling them); the request stands: `dione status` shows them "
                      "once taken")
        return done
    state, message = settled
    if state == "ended":
        console.print(f"the run ended before taking them; the request stands: `dione "
                      f"resume {quote(str(run_dir))}` trains them with the rest")
        return done
    if state == "refused":
        raise BadInput(f"the run refused them: {message}")
    console.print(f"the run took them: {message}")
    return done


def _wait_for(run_dir: Path, request: int, seconds: float) -> tuple[str, Any] | None:
    """(state, message) once the run has settled ``request``, ("ended", None) once its
    launcher ended without (it waited the whole time and blamed profiling: a review);
    None if not in time."""
    from dione.state.lock import launcher_gone
    from dione.state.store import RunStore

    deadline = time.monotonic() + seconds
    while True:
        gone = launcher_gone(run_dir)  # before the store's state: it may take them, then end
        with RunStore(run_dir) as store:
            found = next(a for a in store.additions() if a.id == request)
        if found.state != "waiting":
            return found.state, found.message
        if gone:
            return "ended", None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def _trained_otherwise(store: RunStore, task: Task) -> list[str]:
    """How the run's task of ``task``'s name trains otherwise than ``task`` would: its
    recorded settings, steps and batch, as "what: run's -> file's"."""
    from dione.spec.settings import training_settings

    record = store.task(task.name)
    differ = store.changed_settings(task.name, training_settings(task))
    if record is not None and isinstance(task.steps, int) and record.total_steps != task.steps:
        differ.append(f"steps: {record.total_steps} -> {task.steps}")
    if record is not None and record.batch_size != task.batch_size:
        differ.append(f"batch_size: {record.batch_size} -> {task.batch_size}")
    return differ
