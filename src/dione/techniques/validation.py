"""A workload validated against the registered techniques: the problems of its tasks, and
for each valid task the techniques found unable to train it (``pipeline_probe``)."""

from __future__ import annotations

from collections.abc import Iterable

from dione.spec.devices import DeviceKind, device_counts
from dione.spec.draws import generators_kept
from dione.spec.task import Task
from dione.spec.validate import Problem, checked_task, split_valid
from dione.techniques.base import Technique
from dione.techniques.exactness import synced_norms_on_cpu
from dione.techniques.pipeline.probe import with_refusals
from dione.techniques.registry import technique_names, techniques

__all__ = ["profiled_widths", "trained_by_none", "valid_task", "valid_tasks"]


def _inexact() -> list[str]:
    return [t.name for t in techniques() if not t.exact]


def valid_tasks(tasks: Iterable[Task], devices: int | None = None,
                kind: DeviceKind | None = None) -> tuple[list[Task], list[Problem]]:
    """The tasks that can run (each with its refused techniques) and the problems of the
    others; a bad task stops only itself."""
    from dione.spec.workload import Workload

    # Validation's forwards draw and seed (LayerDrop; a pipeline's probe seeds torch):
    # not the caller's generators (a notebook's every seed drew alike after: a review).
    with generators_kept():
        valid, problems = split_valid(Workload(list(tasks)), devices, technique_names(),
                                      kind, _inexact())
        return with_refusals(valid), problems


def valid_task(task: Task, kind: DeviceKind | None = None) -> tuple[Task, list[Problem]]:
    """One task as it will train (``dione.spec.validate.checked_task``) and its problems;
    where it has none, with its refused techniques."""
    with generators_kept():
        task, problems = checked_task(task, None, technique_names(), kind, _inexact())
        return (task if problems else with_refusals([task])[0]), problems


def profiled_widths(technique: Technique, devices: int) -> list[int]:
    """The device counts profiling tries ``technique`` on, up to ``devices`` (single's
    one only)."""
    return [1] if technique.name == "single" else device_counts(devices)


def _proposes(technique: Technique, task: Task, devices: int, kind: DeviceKind) -> bool:
    """Whether ``technique`` proposes a setting for ``task`` on ``devices`` devices (a
    user's technique that raises proposes none, as profiling leaves it out)."""
    try:
        return bool(technique.knob_settings(task, devices, kind))
    except Exception:
        return False


def trained_by_none(tasks: Iterable[Task], devices: int, kind: DeviceKind
                    ) -> tuple[list[Task], list[Problem]]:
    """The tasks some technique they allow proposes a setting for on a device count up
    to ``devices`` (as profiling will find), and a problem for each of the others,
    naming every technique's reason at ``devices`` (they failed after profiling, "no
    configuration fits", and ``dione validate`` said "no problems")."""
    kept, problems = [], []
    for task in tasks:
        synced = synced_norms_on_cpu(task) if kind != "cuda" else None
        if synced:  # by the nodes' kind: a Ray run's launcher may have no GPU itself
            problems.append(Problem(task.name, "model", synced))
            continue
        allowed = [t for t in techniques() if task.allows(t.name)]
        if any(_proposes(t, task, c, kind) for t in allowed
               for c in profiled_widths(t, devices)):
            kept.append(task)
            continue
        by_reason: dict[str, list[str]] = {}  # gpipe and 1f1b refuse a model alike
        for technique in allowed:
            try:
                said = technique.check(task, profiled_widths(technique, devices)[-1], {},
                                       kind)
            except Exception as err:
                said = [f"its check raised {type(err).__name__}: {err}"]
            # Micro-batches that do not divide the batch are its defaults' only: the
            # settings tried include a count that does.
            said = [r for r in said if "micro-batches" not in r] or said
            why = "; ".join(said) or f"{technique.name} proposes no setting"
            by_reason.setdefault(why.replace(f"task {task.name!r}: ", ""),
                                 []).append(technique.name)
        names = ", ".join(task.techniques) if task.techniques else "every technique"
        reasons = "; ".join(", ".join(n) + ": " + why for why, n in by_reason.items())
        problems.append(Problem(task.name, "techniques", (
            f"no technique it allows ({names}) will train it on up to {devices} device(s) "
            f"({reasons}); allow single (techniques=None allows every exact one), or fix "
            "what each names")))
    return kept, problems
