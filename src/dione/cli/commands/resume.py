"""``dione resume``: finish a stopped run with the options it was started with, any flag
given now replacing its saved value."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from shlex import quote

from dione.cli.commands.run import execute
from dione.cli.console import console
from dione.cli.errors import BadInput
from dione.cli.inputs import claimed, saved_ray_env
from dione.cli.parser import run_options
from dione.cli.saved_run import dashboard_places, load_saved_run
from dione.state.store import how_to_continue

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    saved = load_saved_run(run_dir)
    if saved.current_practice is not None:  # trained one task after another, unplanned
        raise BadInput(f"{run_dir} is a current-practice run (each task in turn on all "
                       f"devices): {how_to_continue(run_dir)} continues it from its "
                       "checkpoints")
    with claimed(run_dir):  # a live launcher's directory: refused now, before torch loads
        pass
    workload = args.workload or saved.workload
    if args.workload is None and not Path(workload).is_file():
        raise BadInput(f"{workload}, the workload this run started with, is not there: if "
                       f"it moved, give its new place with `dione resume {quote(str(run_dir))} "
                       "--workload NEW.py`")
    if args.ray is not None and saved.ray is None:
        raise BadInput(f"{run_dir} trained on this machine's devices, not on a Ray cluster: "
                       "resume it without --ray (a run stays on the kind of cluster it "
                       "started on)")
    ray = args.ray or saved.ray
    if saved.devices is not None and ray is None:  # the user gave no --devices: say whose
        from dione.spec.cluster import ClusterError, parse_devices

        try:
            parse_devices(saved.devices)
        except ClusterError as err:
            raise BadInput(f"{run_dir}/run.json records devices {saved.devices!r}, which "
                           f"dione cannot read ({err}); put back the value the run was "
                           "started with (cpu:4, cuda:2)") from None
    tensorboard, mlflow = dashboard_places(args.tensorboard, args.mlflow)
    ray_env = tuple(args.ray_env or saved_ray_env(run_dir, saved.ray_env))
    run = dataclasses.replace(saved, workload=workload, ray=ray,
                              options=run_options(vars(args), base=saved.options),
                              tensorboard=tensorboard or saved.tensorboard,
                              mlflow=mlflow or saved.mlflow,
                              ray_env=ray_env)
    console.print(f"resuming {run_dir} ({workload})")
    # A workload or a cluster that moved is recorded at its new place, for the next
    # resume and export; the options given now are not: the next resume starts again
    # from the saved ones. A workload given while the saved one is still there is this
    # resume's only (recorded, a refused one, of other steps, was the next resume's too).
    workload_moved = workload != saved.workload and not Path(saved.workload).is_file()
    moved = dataclasses.replace(saved, workload=workload if workload_moved else
                                saved.workload, ray=ray) if (
        workload_moved or ray != saved.ray) else None
    return execute(workload, run, run_dir, record=moved, replacing=saved.workload)
