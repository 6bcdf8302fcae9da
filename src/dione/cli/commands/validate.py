"""``dione validate``: every problem of a workload at once, before anything starts."""

from __future__ import annotations

import argparse

from dione.cli.console import console
from dione.cli.errors import BadInput
from dione.cli.inputs import load

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.spec.cluster import ClusterError, local_cluster
    from dione.spec.validate import WorkloadError
    from dione.techniques.checking import check_workload

    workload = load(args.workload)
    try:
        node = local_cluster(args.devices).nodes[0] if args.devices else None
    except ClusterError as err:
        raise BadInput(str(err)) from None
    # Without --devices, what this machine gives a run (its GPUs, else a CPU slot per
    # core): 2 CPU devices were assumed, which refused on a GPU machine a task only a
    # CUDA technique trains.
    here = node or local_cluster().nodes[0]
    _, found = check_workload(workload, node.devices if node is not None else None,
                              here.kind, here.devices)
    if found.problems:
        # The warnings and notes too: they were held back until every problem was
        # fixed, a second round of findings there all along (a review).
        besides = found.lines()[len(found.problems):]  # lines() says the problems first
        if besides:
            console.print(f"{args.workload}: besides the problems below:")
        for line in besides:
            console.print(f"  {line}")
        raise BadInput(str(WorkloadError(found.problems)))
    console.print(f"{args.workload}: {len(workload)} task(s), no problems")
    for line in found.lines():
        console.print(f"  {line}")
    return 0
