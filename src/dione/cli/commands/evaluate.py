"""``dione evaluate``: a run's finished tasks evaluated again on their final weights
(those whose final evaluation failed or never ran, or the tasks named)."""

from __future__ import annotations

import argparse
import functools

from dione.cli.console import complain, console
from dione.cli.errors import EXIT_FAILED, BadInput
from dione.cli.inputs import load

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.orchestrate.evaluate_again import (
        EvaluationAgain,
        evaluate_again,
        tasks_to_evaluate,
    )
    from dione.state.export import ExportError, workload_of_task
    from dione.state.lock import RunDirBusy, lock_holder
    from dione.state.summaries import error_line, figure

    holder = lock_holder(args.run_dir)
    if holder is not None and holder.alive:  # said first: what is done is still moving
        raise BadInput(f"{args.run_dir} is being trained now by a dione launcher (pid "
                       f"{holder.pid} on host {holder.host}): evaluate its tasks once it "
                       "ends (a run evaluates each task it finishes itself)")
    loaded = functools.cache(load)  # each workload file once
    try:
        tasks = tasks_to_evaluate(args.run_dir, args.task, lambda name: loaded(
            args.workload or workload_of_task(args.run_dir, name)))
        if not tasks:
            console.print(f"every done task of {args.run_dir} that evaluates has its final "
                          "evaluation; name tasks to evaluate them again")
            return 0
    except (ValueError, ExportError) as err:
        raise BadInput(str(err)) from None
    except KeyError as err:
        raise BadInput(f"{err.args[0]}; give the workload the run was started with "
                       "(--workload)") from None

    def told(outcome: EvaluationAgain) -> None:
        if outcome.error is not None:
            complain("evaluation failed", f"{outcome.task}: {error_line(outcome.error)}")
            return
        metrics = ", ".join(f"{k} {figure(v)}" for k, v in sorted(outcome.evaluation.items())
                            if k not in outcome.not_finite)
        unfinite = ", ".join(f"{k} {outcome.evaluation[k]}" for k in outcome.not_finite)
        console.print(f"{outcome.task} at step {outcome.step}: {metrics or 'no metric'}"
                      + (f" ({unfinite}: not finite, not recorded)" if unfinite else ""))

    try:
        outcomes = evaluate_again(args.run_dir, tasks, args.device, told)
    except RunDirBusy as err:
        raise BadInput(str(err)) from None
    except (ValueError, ExportError) as err:
        raise BadInput(str(err)) from None
    from dione.report import write_report

    folder = write_report(args.run_dir)
    failed = [o.task for o in outcomes if o.error is not None]
    kept = [o for o in outcomes if o.error is None and len(o.not_finite) < len(o.evaluation)]
    console.print(f"{len(kept)} of {len(outcomes)} task(s) evaluated and recorded"
                  + (f" ({len(outcomes) - len(failed) - len(kept)} gave no finite metric)"
                     if len(outcomes) - len(failed) > len(kept) else "")
                  + f"; report: {folder / 'index.html'}")
    return EXIT_FAILED if failed else 0
