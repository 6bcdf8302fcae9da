"""A workload validated against the registered techniques: the problems of its tasks, and
for each valid task the techniques found unable to train it (``pipeline_probe``)."""

from __future__ import annotations

from collections.abc import Iterable

from dione.spec.devices import DeviceKind
from dione.spec.draws import draws_kept
from dione.spec.task import Task
from dione.spec.validate import Problem, checked_task, split_valid
from dione.techniques.pipeline.probe import with_refusals
from dione.techniques.registry import technique_names, techniques

__all__ = ["valid_task", "valid_tasks"]


def _inexact() -> list[str]:
    return [t.name for t in techniques() if not t.exact]


def valid_tasks(tasks: Iterable[Task], devices: int | None = None,
                kind: DeviceKind | None = None) -> tuple[list[Task], list[Problem]]:
    """The tasks that can run (each with its refused techniques) and the problems of the
    others; a bad task stops only itself."""
    from dione.spec.workload import Workload

    with draws_kept():  # validation's forwards may draw (LayerDrop): not the caller's
        valid, problems = split_valid(Workload(list(tasks)), devices, technique_names(),
                                      kind, _inexact())
        return with_refusals(valid), problems


def valid_task(task: Task, kind: DeviceKind | None = None) -> tuple[Task, list[Problem]]:
    """One task as it will train (``dione.spec.validate.checked_task``) and its problems;
    where it has none, with its refused techniques."""
    with draws_kept():
        task, problems = checked_task(task, None, technique_names(), kind, _inexact())
        return (task if problems else with_refusals([task])[0]), problems
