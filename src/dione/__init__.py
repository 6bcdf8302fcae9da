"""dione: train many deep-learning models at once, finishing the whole batch early."""

import os
from typing import Any

from dione.spec import Cluster, Node, Task, Workload, grid, load_workload, local_cluster
from dione.techniques import SliceContext, SliceOutcome, Technique, get_technique, register

__version__ = "0.1.0"


def run(workload: Any, *, devices: str | None = None, run_dir: str = "runs/dione",
        ray: str | None = None, **options: Any) -> Any:
    """Profile, plan and train every task of ``workload`` (a Workload, a list of tasks or
    a workload file's path) on this machine (``devices`` as ``--devices``), or on the Ray
    cluster at ``ray`` (an address as ``ray.init`` takes it, e.g. ``"auto"``), as ``dione
    run`` does; ``options`` are ``dione.orchestrate.RunOptions`` fields. Returns the
    ``RunResult``: per task its status, final loss, evaluation and checkpoint; invalid
    tasks are left out and listed in its ``invalid``. Calling it
    again with the same ``run_dir`` resumes an interrupted run."""
    # Imported here: workers import this package and need none of the planning stack.
    from dione.orchestrate import RunOptions, run_workload
    from dione.spec.validate import split_valid
    from dione.techniques import technique_names

    if isinstance(workload, (str, os.PathLike)):
        workload = load_workload(os.fspath(workload))
    tasks, problems = split_valid(Workload(list(workload)), None, technique_names())
    if not tasks:
        raise ValueError("no task of the workload is valid:\n"
                         + "\n".join(str(p) for p in problems))
    if ray is None:
        result = run_workload(tasks, local_cluster(devices), run_dir, RunOptions(**options))
    else:
        from dione.launch.ray_launcher import RayLauncher

        launcher = RayLauncher(ray)
        try:
            result = run_workload(tasks, Cluster(launcher.nodes()), run_dir,
                                  RunOptions(**options), launcher=launcher)
        finally:
            launcher.shutdown()
    result.invalid = [str(p) for p in problems]  # a bad task stops only itself
    return result

__all__ = [
    "Cluster",
    "Node",
    "SliceContext",
    "SliceOutcome",
    "Task",
    "Technique",
    "Workload",
    "__version__",
    "get_technique",
    "grid",
    "load_workload",
    "local_cluster",
    "register",
    "run",
]
