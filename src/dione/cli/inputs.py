"""A command's inputs made real: the workload, its valid tasks, the cluster, the run
directory; BadInput saying what is wrong with any of them."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from shlex import quote
from typing import Any

from dione.cli.console import complain
from dione.cli.errors import BadInput
from dione.words import some

__all__ = ["claimed", "default_run_dir", "load", "problem_refused", "ray_environment",
           "ray_launcher", "say_problem_notes", "valid_tasks"]


def load(path: str) -> Any:
    """The ``Workload`` a workload file defines."""
    from dione.spec.workload import WorkloadFileError, load_workload

    try:
        return load_workload(path)
    except WorkloadFileError as err:
        raise BadInput(str(err)) from None


def valid_tasks(workload_file: str, devices: str | None, what: str,
                launcher: Any = None) -> tuple[Any, Any, Any]:
    """The workload's valid tasks, the problems of the others (printed), and the cluster
    (the local machine, or the Ray launcher's nodes); BadInput when the cluster is wrong
    or no task is valid (nothing ``what``)."""
    from dione.spec.cluster import Cluster, ClusterError, local_cluster
    from dione.techniques.validation import trained_by_none
    from dione.techniques.validation import valid_tasks as checked

    workload = load(workload_file)
    try:
        cluster = local_cluster(devices) if launcher is None else Cluster(launcher.nodes())
    except ClusterError as err:
        raise BadInput(str(err)) from None
    tasks, problems = checked(workload, None, cluster.nodes[0].kind)
    _say_shared_cores(cluster, launcher)
    # A task no technique it allows trains on the widest node: refused now, not failed
    # after profiling.
    tasks, untrainable = trained_by_none(tasks, max(n.devices for n in cluster),
                                         cluster.nodes[0].kind)
    problems = [*problems, *untrainable]
    for problem in problems:
        complain("invalid", str(problem))
    if not tasks:
        raise BadInput(f"no task of the workload is valid; nothing {what}")
    return tasks, problems, cluster


def _say_shared_cores(cluster: Any, launcher: Any) -> None:
    """Warn where this machine's CPU slots outnumber its cores (``shared_cores``)."""
    from dione.spec.devices import shared_cores

    node = cluster.nodes[0]
    said = shared_cores(node.kind, node.devices) if launcher is None else None
    if said is not None:
        complain("warning", said.replace("devices cpu:", "--devices cpu:"))


def problem_refused(path: str, err: Exception, cluster_given: bool) -> BadInput:
    """A problem file's mistakes as a command says them; where it lacks a cluster and
    none was given, that ``--cluster`` can give one."""
    hint = ("; or give the cluster as --cluster 4x8 (it stands in for the file's)"
            if not cluster_given and "cluster: must be" in str(err) else "")
    # The workflow's first file for its second (review); not one missing, or a folder.
    if path.endswith(".py") and Path(path).is_file() and "not JSON" in str(err):
        return BadInput(f"{path} is a workload, not a problem file: `dione profile {quote(path)} "
                        "-o problem.json` measures it and writes one to give here")
    return BadInput(f"{path}: {err}{hint}")


def say_kinds_replaced(path: str, problem: Any) -> None:
    """Where ``--cluster`` gave ``problem`` nodes of a kind the file's nodes are not, and
    options of no kind stand for them: note that those take the seconds measured on the
    file's nodes (A100 nodes planned with H100 times, unsaid: review)."""
    from dione.plan import ProblemError, load_problem

    try:
        given = {n.kind for n in load_problem(path, fitting=False).nodes if n.kind}
    except (OSError, ProblemError):  # a file of no cluster: nothing to compare
        return
    new = sorted({n.kind for n in problem.nodes if n.kind} - given)
    alike = [t.name for t in problem.tasks if any(o.kind is None for o in t.options)]
    if given and new and alike:
        complain("note", f"the options of no kind (of {len(alike)} task(s)) were measured "
                 f"on the file's {', '.join(sorted(given))} nodes: on --cluster's "
                 f"{', '.join(new)} nodes they take the same seconds; give each kind's "
                 "options apart (\"kind\") for the plan to tell them apart")


def say_problem_notes(problem: Any, left_out: Sequence[str]) -> None:
    """What a plan or a simulation of a problem file does not see or cannot use (its
    caveats, knobs its techniques do not take), and the tasks it left out, said."""
    # The others are planned, as a run trains the others; tasks left out for one reason
    # said once (a cluster of the wrong kinds left out every task of a sweep, a line each).
    by_reason: dict[str, list[str]] = {}
    for reason in left_out:
        name, _, why = reason.partition(": ")
        by_reason.setdefault(why if why else reason, []).append(name)
    for why, names in by_reason.items():
        if len(names) > 3:
            shown = some([n.removeprefix("task ") for n in names])
            complain("warning", f"{len(names)} tasks ({shown}): {why}")
        else:
            for name in names:
                complain("warning", f"{name}: {why}")
    for caveat in problem.caveats():  # of what is planned: those left out, said first
        complain("note", caveat)
    for knob in problem.unknown_knobs():
        complain("warning", knob)


def output_file(path: str | None) -> Path | None:
    """``-o FILE`` checked before any work: its folder exists and it is not a folder;
    BadInput naming the fix otherwise (else it would fail only once the work is done)."""
    if path is None:
        return None
    file = Path(path)
    if file.is_dir():
        raise BadInput(f"-o {path} is a folder; give a file name (e.g. {file / 'out.json'})")
    if not file.parent.is_dir():
        raise BadInput(f"-o {path}: the folder {file.parent} does not exist; create it, or "
                       "give a file in an existing folder")
    return file


def write_output(file: Path, text: str) -> None:
    """Write ``text`` to an ``-o`` file; BadInput saying why it cannot be."""
    try:
        file.write_text(text)
    except OSError as err:
        raise BadInput(f"cannot write {file}: {err.strerror or err}; give a file you can "
                       "write (-o)") from None


def ray_launcher(address: str | None, devices: str | None,
                 env: Sequence[str] = ()) -> Any:
    """The Ray launcher for ``--ray ADDRESS`` (None without it: this machine's workers),
    its workers given ``env`` (``--ray-env``'s NAME=VALUE or NAME items)."""
    if address is None:
        if env:
            raise BadInput("--ray-env sets variables in a Ray cluster's workers: add --ray, "
                           "or set the variable in this shell for this machine's workers")
        return None
    variables = ray_environment(env)
    if devices:
        raise BadInput("--devices describes this machine; with --ray the cluster's nodes "
                       "and devices come from Ray: leave --devices out")
    from dione.launch.ray_launcher import RayLauncher
    from dione.spec.cluster import ClusterError

    try:
        return RayLauncher(address, env=variables)
    except ClusterError as err:
        raise BadInput(str(err)) from None


def saved_ray_env(run_dir: Path, items: Sequence[str]) -> list[str]:
    """A run's recorded ``--ray-env`` items, less those naming a variable dione sets in
    its workers itself (recorded by a dione that took them and replaced them unsaid: a
    resume refused them, and no flag clears the record: a regression review), said."""
    dropped = [i for i in items if i.partition("=")[0] in _SET_BY_DIONE]
    if dropped:
        complain("warning", f"{run_dir}/run.json records --ray-env {', '.join(dropped)}: "
                 "dione sets those in its Ray workers itself, so they are left out (they "
                 "never took effect)")
    return [i for i in items if i not in dropped]


def ray_environment(items: Sequence[str]) -> dict[str, str]:
    """``--ray-env`` items as variables: NAME=VALUE as given, NAME with this process's
    value; BadInput naming the item and the fix where one is neither."""
    variables = {}
    for item in items:
        name, given, value = item.partition("=")
        if not _VARIABLE.fullmatch(name):
            raise BadInput(f"--ray-env {item!r}: give NAME=VALUE or NAME, NAME a variable "
                           "name (letters, digits, _)")
        if name in _SET_BY_DIONE:
            raise BadInput(f"--ray-env {name}: dione sets {name} in its Ray workers itself "
                           f"({_SET_BY_DIONE[name]}): leave it out of --ray-env")
        if not given:
            if name not in os.environ:
                raise BadInput(f"--ray-env {name}: {name} is not set in this shell; "
                               f"export it, or give --ray-env {name}=VALUE")
            value = os.environ[name]
        variables[name] = value
    return variables


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_THREADS = ("each device's process gets its node's cores shared among its devices "
            "(torch.set_num_threads per slice, whatever this says)")
_INTERFACE = ("a gang's ranks talk within their node, over loopback unless this shell "
              "sets it (dione passes this shell's value)")
# Variables the Ray launcher sets in each actor's environment, and why.
_SET_BY_DIONE = {"OMP_NUM_THREADS": _THREADS, "MKL_NUM_THREADS": _THREADS,
                 "GLOO_SOCKET_IFNAME": _INTERFACE, "NCCL_SOCKET_IFNAME": _INTERFACE}


def default_run_dir(workload: str) -> Path:
    """``runs/<workload file's name>``."""
    return Path("runs") / Path(workload).stem


def claimed(run_dir: Path) -> Any:
    """The run directory created private and locked for this command; BadInput saying
    why it cannot be (another live launcher, not private, not writable)."""
    from dione.orchestrate.options import RunDirError, claim_run_dir

    try:
        return claim_run_dir(run_dir)
    except RunDirError as err:
        raise BadInput(str(err)) from None
