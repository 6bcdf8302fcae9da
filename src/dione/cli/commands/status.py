"""``dione status``: a run's tasks and running slices, and whether its launcher lives."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dione.cli.errors import BadInput
from dione.cli.views import print_status

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    import sqlite3

    from dione.orchestrate.plans import read_plans
    from dione.state.lock import lock_holder
    from dione.state.store import SIMULATED_FILE, STORE_FILE, RunStore, not_a_run
    from dione.state.summaries import as_left, best_kept, summaries

    run_dir = Path(args.run_dir)
    if not (run_dir / STORE_FILE).is_file():
        raise BadInput(f"{not_a_run(run_dir)}: give the folder `dione run --out` wrote")
    try:
        with RunStore(run_dir) as store:
            tasks = summaries(store)
            running = [s for s in store.slices() if s.status == "running"]
            additions = store.additions("waiting", "refused")
            invalid = store.invalid()
            profiling = store.profiling()
            # keep_best's checkpoint where it is not the last (what export --best gives),
            # by the metric and direction the run pruned by.
            best = {t.task: kept[0].step for t in tasks
                    if isinstance(kept := best_kept(store, t.task, (None, None)), tuple)
                    and kept[0].step != t.steps}
        plans = read_plans(run_dir)
    except (OSError, sqlite3.Error, ValueError) as err:
        raise BadInput(f"{run_dir} cannot be read ({type(err).__name__}: {err})") from None
    holder = lock_holder(run_dir)
    # How it goes on: a run started from Python (no run.json) by the same call again.
    from dione.state.store import how_to_continue, trained_by_train

    go_on = f"{how_to_continue(run_dir)} continues"
    unfinished = [t for t in tasks if t.status in ("running", "pending", "paused")]
    if holder is not None and holder.alive:
        launcher = f"live: launcher pid {holder.pid} on {holder.host}"
        if profiling:  # before any task is in the store: said, not an empty run
            launcher += (f"; profiling {profiling.get('tasks')} task(s) for "
                         f"{time.time() - float(profiling.get('since', time.time())):.0f} s "
                         "(each trial is a line of the run's output)")
    elif running or any(t.status == "running" for t in tasks):
        # The store says running, but no launcher holds the directory: it died, and what
        # it ran was cut short (as the report shows it).
        launcher = ("dead: its launcher "
                    + (f"(pid {holder.pid} on {holder.host}) " if holder is not None else "")
                    + f"is gone; {go_on} from the last checkpoints")
        running = []
        tasks = as_left(tasks)
    elif unfinished and trained_by_train(run_dir):  # `--steps N` trains part of a task
        launcher = f"no launcher running (a `dione train` folder): {go_on}"
        tasks = as_left(tasks, by_slices=True)
    elif unfinished:
        # Stopped cleanly (Ctrl-C, SIGTERM) before its end: read as a killed run reads.
        launcher = ("no launcher running: the run stopped before its end; "
                    f"{go_on} from the last checkpoints")
        tasks = as_left(tasks)
    elif not tasks:  # tasks are recorded once profiled: a stop before says nothing else
        launcher = ("no launcher running, and no task recorded: the run stopped before its "
                    f"profile ended (or never started); {go_on}")
    else:
        launcher = "no launcher running"
    simulated = (run_dir / SIMULATED_FILE).is_file()
    if simulated:
        launcher = "SIMULATED on a virtual cluster (dione simulate): nothing trained"
    print_status(run_dir, tasks, len(plans), running, launcher, additions, invalid, best,
                 simulated)
    return 0
