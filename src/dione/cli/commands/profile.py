"""``dione profile``: short real trials of each task's configurations; the planner's problem."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dione.cli.console import complain, console
from dione.cli.errors import EXIT_FAILED
from dione.cli.inputs import output_file, ray_launcher, valid_tasks, write_output
from dione.cli.parser import run_options
from dione.cli.views import print_profile, profile_progress

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    options = run_options(vars(args))
    output = output_file(args.output)  # before the trials, not after them
    launcher = ray_launcher(args.ray, args.devices, args.ray_env)
    try:
        tasks, problems, cluster = valid_tasks(args.workload, args.devices, "profiled",
                                               launcher)
        if launcher is not None:  # a node another job holds: profiled on the others
            cluster = _free(launcher, cluster)
        profile = _profile(tasks, cluster, options, not args.serial, launcher)
    finally:
        if launcher is not None:
            launcher.shutdown()
    print_profile(profile)
    from dione.orchestrate.estimates import profile_problem

    problem = profile_problem(profile)
    text = json.dumps(_with_sources(problem.to_json(), profile, args, options), indent=1)
    if output is not None and not problem.tasks:  # `dione plan` would refuse it
        complain("warning", f"no task has a feasible option: {args.output} not written")
    elif output is not None:
        write_output(output, text + "\n")
        console.print(f"problem for the planner: {args.output} ({len(problem.tasks)} "
                      "task(s)); next: dione plan " + args.output)
    unprofiled = [t.task for t in profile.tasks if not t.options]
    for name in unprofiled:
        complain("no feasible option", f"task {name}: every configuration failed or was "
                 "skipped; see the table")
    return EXIT_FAILED if unprofiled or problems else 0


def _free(launcher: Any, cluster: Any) -> Any:
    """The Ray cluster's nodes whose devices Ray grants, those it does not said: where
    the widest was held, the profile measured on it alone and failed (a review)."""
    from dione.cli.errors import BadInput
    from dione.launch.local import warm_up_free
    from dione.spec.cluster import Cluster, ClusterError

    try:
        warm, busy = warm_up_free(launcher, cluster.nodes)
    except ClusterError as err:
        raise BadInput(str(err)) from None
    for held in busy:
        complain("warning", f"{held}; profiled without node {held.node}")
    return Cluster(warm) if busy else cluster


def _with_sources(data: dict[str, Any], profile: Any, args: argparse.Namespace,
                  options: Any) -> dict[str, Any]:
    """The problem's JSON saying where its seconds come from (the file said nothing of
    its profile, device, versions or trials): ``sources["profile"]`` the profile as a
    whole, each option's ``source`` its trial (its catalog fingerprint, timed steps and
    spread)."""
    import time

    import torch

    from dione._version import __version__
    from dione.profile.catalog import default_catalog_path

    trial = options.trial
    devices = sorted({o.record.device for t in profile.tasks for o in t.options})
    data["sources"] = {"profile": (
        f"dione profile {args.workload} at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}: dione "
        f"{__version__}, torch {torch.__version__}, {'; '.join(devices) or 'no device'}, "
        f"catalog {options.catalog or default_catalog_path()}; trials of {trial.warmup_steps} "
        f"warm-up and {trial.measure_steps} timed steps ({profile.trials_run} run now, "
        f"{profile.trials_cached} from the catalog, each with the steps it timed); an "
        "option's seconds: fixed + warm-up excess + steps x mean step, and the "
        "evaluations")}
    by_task = {t.task: t for t in profile.tasks}
    for task in data["tasks"]:
        for option, profiled in zip(task["options"], by_task[task["name"]].options,
                                    strict=True):
            record = profiled.record
            option["source"] = (f"profile: trial {record.fingerprint[:12]}, "
                                f"{record.measured_steps} steps timed"
                                + (f", spread {record.spread:.0%}" if record.spread is not None
                                   else ""))
    return data


def _profile(tasks: Any, cluster: Any, options: Any, parallel: bool, launcher: Any) -> Any:
    """Profile ``tasks`` on ``cluster`` as ``options`` say, showing progress; the Profile."""
    from dione.profile import Catalog, profile_workload

    with Catalog(options.catalog) as catalog, profile_progress() as show:
        return profile_workload(tasks, cluster, catalog, options=options.trial,
                                reprofile=options.reprofile, budget=options.profile_budget,
                                parallel=parallel, on_event=show, storage=options.storage,
                                **({"launcher": launcher} if launcher is not None else {}))
