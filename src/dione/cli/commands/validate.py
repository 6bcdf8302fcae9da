"""``dione validate``: every problem of a workload at once, before anything starts."""

from __future__ import annotations

import argparse

from dione.cli.console import console
from dione.cli.errors import BadInput
from dione.cli.inputs import load

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.spec.cluster import ClusterError, local_cluster
    from dione.spec.metrics import doubtful_direction
    from dione.spec.validate import WorkloadError
    from dione.techniques.validation import valid_tasks

    workload = load(args.workload)
    try:
        devices = local_cluster(args.devices).nodes[0].devices if args.devices else None
    except ClusterError as err:
        raise BadInput(str(err)) from None
    tasks, problems = valid_tasks(workload, devices)
    if problems:
        raise BadInput(str(WorkloadError(problems)))
    console.print(f"{args.workload}: {len(workload)} task(s), no problems")
    # What will not train a task that is otherwise fine: said per reason, tasks grouped.
    refused: dict[tuple[str, str], list[str]] = {}
    for task in tasks:
        for technique, reason in task.refused_techniques.items():
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
