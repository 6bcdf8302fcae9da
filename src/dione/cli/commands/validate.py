"""``dione validate``: every problem of a workload at once, before anything starts."""

from __future__ import annotations

import argparse

from dione.cli.console import console
from dione.cli.errors import BadInput
from dione.cli.inputs import load

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.spec.cluster import ClusterError, local_cluster
    from dione.spec.validate import WorkloadError, validate_workload
    from dione.techniques import technique_names

    workload = load(args.workload)
    try:
        devices = local_cluster(args.devices).nodes[0].devices if args.devices else None
    except ClusterError as err:
        raise BadInput(str(err)) from None
    problems = validate_workload(workload, devices, technique_names())
    if problems:
        raise BadInput(str(WorkloadError(problems)))
    console.print(f"{args.workload}: {len(workload)} task(s), no problems")
    return 0
