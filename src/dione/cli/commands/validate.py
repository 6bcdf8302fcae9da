"""``dione validate``: every problem of a workload at once, before anything starts."""

from __future__ import annotations

import argparse
from typing import Any

from dione.cli.console import console
from dione.cli.errors import BadInput
from dione.cli.inputs import load

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.spec.cluster import ClusterError, local_cluster
    from dione.spec.metrics import doubtful_direction
    from dione.spec.validate import (
        WorkloadError,
        keep_best_doubts,
        late_evaluation,
        training_loss_doubt,
    )
    from dione.techniques.validation import trained_by_none, valid_tasks

    workload = load(args.workload)
    try:
        node = local_cluster(args.devices).nodes[0] if args.devices else None
    except ClusterError as err:
        raise BadInput(str(err)) from None
    devices = node.devices if node is not None else None
    tasks, problems = valid_tasks(workload, devices)
    # Without --devices, what this machine gives a run (its GPUs, else a CPU slot per
    # core): 2 CPU devices were assumed, which refused on a GPU machine a task only a
    # CUDA technique trains.
    here = node or local_cluster().nodes[0]
    # A task every technique it allows refuses would fail after profiling ("no
    # configuration fits"): a problem of its own, as a run finds it.
    tasks, untrainable = trained_by_none(tasks, here.devices, here.kind)
    problems += untrainable
    said = {task.name: {**task.refused_techniques,
                        **_model_refusals(task, here.devices, here.kind)} for task in tasks}
    if problems:
        raise BadInput(str(WorkloadError(problems)))
    console.print(f"{args.workload}: {len(workload)} task(s), no problems")
    # What will not train a task that is otherwise fine: said per reason, tasks grouped.
    refused: dict[tuple[str, str], list[str]] = {}
    for task in tasks:
        for technique, reason in said[task.name].items():
            why = reason.replace(f"task {task.name!r}: ", "")
            refused.setdefault((technique, why), []).append(task.name)
    for (technique, why), names in refused.items():
        console.print(f"  {technique} will not train {', '.join(names)}: {why}")
    doubted: dict[str, list[str]] = {}  # a stopping rule judging its metric the other way
    for task in tasks:
        rule = task.stopping
        doubt = rule and rule.metric != "loss" and doubtful_direction(rule.metric, rule.mode)
        if doubt:
            doubted.setdefault(doubt, []).append(task.name)
        steps = task.steps
        idle = rule and isinstance(steps, int) and not isinstance(steps, bool) and \
            not rule.mistakes() and rule.never_stops(steps)
        if idle:
            doubted.setdefault(idle, []).append(task.name)
    for task in tasks:  # evaluates at its end anyway: eval_every does nothing
        late = late_evaluation(task)
        if late:
            doubted.setdefault(late, []).append(task.name)
        for doubt in [*keep_best_doubts(task), training_loss_doubt(task)]:
            if doubt:
                doubted.setdefault(doubt, []).append(task.name)
    for doubt, names in doubted.items():
        console.print(f"  warning: {', '.join(names)}: {doubt}")
    if devices is not None:  # allowed single: trained on fewer devices, not refused
        from dione.spec.batch import split_problem

        odd = [t.name for t in tasks if split_problem(t.batch_size, devices, "devices")]
        if odd:
            console.print(f"  data parallelism over all {devices} devices will not train "
                          f"{', '.join(odd)}: the batch size is not a multiple of {devices}; "
                          "plans give them fewer devices")
    return 0


def _model_refusals(task: Any, devices: int, kind: Any) -> dict[str, str]:
    """Techniques (the task allows) that will not train it on ``devices`` devices for
    what its model is (BatchNorm under a split batch, a pipeline's cut), as their own
    checks say; not what is said elsewhere (a batch that does not divide, a technique
    the task must opt in to). One that trains it on fewer devices is said to refuse
    only the wider ones (gpipe in 2 stages but not 4)."""
    from dione.spec.batch import split_problem
    from dione.techniques import techniques
    from dione.techniques.validation import profiled_widths

    found = {}
    for technique in techniques():
        knobs = technique.resolve({})
        if (not task.allows(technique.name) or technique.name in task.refused_techniques
                or (technique.inexactness(knobs) is not None and not task.allow_inexact)):
            continue
        count = profiled_widths(technique, devices)[-1]  # its widest (single's only)
        parts, what = technique.batch_parts(count, knobs)
        odd = split_problem(task.batch_size, parts, what, task.name) if isinstance(
            parts, int) else None
        reasons = [r for r in technique.check(task, count, {}, kind) if r != odd]
        if reasons and technique.knob_settings(task, count, kind):
            continue  # its defaults do not fit, another setting of it does
        if reasons:
            narrower = [c for c in profiled_widths(technique, devices)
                        if c < count and technique.knob_settings(task, c, kind)]
            found[technique.name] = (f"not on {count} devices (it does on "
                                     f"{', '.join(map(str, narrower))}): " if narrower
                                     else "") + "; ".join(reasons)
    return found
