"""``dione train``: one slice of one task under a named technique, printing each step."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dione.cli.console import complain, console
from dione.cli.errors import EXIT_FAILED, BadInput
from dione.cli.inputs import claimed, default_run_dir, load
from dione.cli.values import parse_knob
from dione.cli.views import live_steps

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.launch.scratch import clean_stale_scratch
    from dione.launch.slice import SliceError, SliceRequest, local_placement, run_request
    from dione.spec.cluster import ClusterError, Node, local_cluster
    from dione.spec.validate import WorkloadError
    from dione.state.store import RunStore
    from dione.techniques import get_technique
    from dione.techniques.validation import valid_task

    workload = load(args.workload)
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
    task, problems = valid_task(task, asked.kind)
    if problems:
        raise BadInput(str(WorkloadError(problems)))
    node = local_cluster().nodes[0]
    if asked.kind != node.kind:  # CPU slots asked for on a machine with GPUs
        node = Node(node.name, max(count, node.cores or 1), "cpu", node.cores)
    if node.kind == "cpu" and count > node.devices:
        # CPU slots are virtual: allow more than the cores, each rank then gets one thread.
        node = Node(node.name, count, "cpu", node.cores)
    knobs = dict(parse_knob(k) for k in args.knob)
    reasons = technique.check(task, count, knobs, node.kind)
    if reasons:
        raise BadInput(f"{technique.name} cannot train task {task.name!r} on {count} "
                       "device(s): " + "; ".join(reasons))
    ends = [what for what, has in (("eval_every", task.eval_every),
                                   ("stopping rule", task.stopping is not None),
                                   ("keep_best", task.keep_best is not None)) if has]
    if ends:
        # One slice: its evaluations and rungs are `dione run`'s (it ended each slice at
        # them); trained as one, the task said nothing of it and evaluated at the end only.
        verb = "are" if len(ends) > 1 else "is"
        console.print(f"note: {task.name}'s {' and '.join(ends)} {verb} `dione run`'s (it ends "
                      "a slice at each): `dione train` trains one slice, which evaluates "
                      "only where it ends the task")
    run_dir = Path(args.out) if args.out else default_run_dir(args.workload)
    clean_stale_scratch()  # what killed launchers left in $TMPDIR, as profiling removes it
    with claimed(run_dir), RunStore(run_dir) as store:
        try:
            request = SliceRequest(task, technique, local_placement(node, range(count)),
                                   run_dir, knobs=knobs, steps=args.steps,
                                   timeout=args.timeout)
            # The store hears it live as a run's launcher beats: a slice a kill -9 cuts
            # short ends at the last beat, not at its own start (it read 0 s).
            live, beat = live_steps(), store.beat_every()

            def heard(rank: int, record: dict[str, Any]) -> None:
                live(rank, record)
                beat()

            result = run_request(request, store=store, on_progress=heard)
        except SliceError as err:
            if err.reason == "trained":  # not a failure: said, and done
                console.print(str(err))
                return 0
            if err.reason == "refused":  # trained otherwise there: bad input, not a crash
                raise BadInput(str(err)) from None
            if err.reason == "diverged":  # the steps that show how it blew up, as kept
                _print_diverged_steps(run_dir, task.name)
            complain("diverged" if err.reason == "diverged" else "error", str(err))
            return EXIT_FAILED
    for warning in [*result.warnings, *result.doubts]:
        complain("warning", warning)
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
    # How it trained, as `dione run`'s table and `dione status` say (it said nothing).
    if result.inexactness:
        console.print(f"trained INEXACT (not as single would; the task opted in): "
                      f"{result.inexactness}")
    elif result.extra.get("exactness"):
        console.print(f"trained {result.extra['exactness']}")  # "statistical, not bitwise: ..."
    else:
        console.print("trained exact (as single would)")
    if result.evaluation:
        console.print("evaluation: " + ", ".join(f"{k}={v:.4f}" for k, v in
                                                 result.evaluation.items()))
    if result.evaluation_error:
        complain("evaluation failed", result.evaluation_error)
        return EXIT_FAILED
    return 0


def _print_diverged_steps(run_dir: Path, task: str) -> None:
    """The step lines of the slice that diverged, as a finished slice prints its own
    (they were only in the store: the lines that show how the loss blew up)."""
    from dione.state.store import RunStore

    with RunStore(run_dir) as store:
        last = next((s for s in reversed(store.slices(task)) if s.status == "diverged"), None)
        rows = [] if last is None else store.metrics(task, after=last.start_step)
    for step, loss, seconds in rows:
        console.print(f"step {step:>6}  loss {loss:.6f}  {seconds * 1000:8.2f} ms")
