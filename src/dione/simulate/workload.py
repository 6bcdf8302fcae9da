"""A simulated workload from a planner problem: per task, its options' seconds become a
profile (step time = seconds / steps), and a task that is never trained stands for it."""

from __future__ import annotations

from typing import Any, NoReturn

from dione.plan.cluster_text import parse_nodes
from dione.plan.problem import Option as PlannedOption
from dione.plan.problem import PlanningProblem
from dione.profile.catalog import TrialRecord
from dione.profile.results import Profile, ProfiledOption, TaskProfile
from dione.spec.cluster import Cluster, Node
from dione.spec.stopping import StoppingRule
from dione.spec.task import Task
from dione.techniques.registry import technique_names

__all__ = ["parse_cluster", "problem_cluster", "problem_workload"]


def _never(*args: Any, **kwargs: Any) -> NoReturn:
    raise RuntimeError("a simulated task is never trained: it has no model, data or "
                       "optimizer")


def problem_workload(problem: PlanningProblem, steps: int, cluster: Cluster,
                     stopping: StoppingRule | None = None) -> tuple[list[Task], Profile]:
    """Tasks of ``steps`` steps each, and their profile on ``cluster``: each technique and
    width of the problem at its fastest knobs, its seconds spread evenly over the steps
    (no start-up, no load or save); every task shares ``stopping``, if given."""
    if steps < 1:
        raise ValueError(f"steps must be a positive whole number, not {steps}")
    known = set(technique_names())
    unknown = sorted({o.technique for t in problem.tasks for o in t.options} - known)
    if unknown:
        raise ValueError(f"the problem's technique(s) {', '.join(unknown)} are not registered "
                         f"(registered: {', '.join(sorted(known))}); rename them in the "
                         "problem file to the technique each stands for")
    tasks, profiles = [], []
    for t in problem.tasks:
        tasks.append(Task(name=t.name, model=_never, data=_never, optimizer=_never,
                          batch_size=1, steps=steps, stopping=stopping))
        # A profile keeps one option per technique, width and node kind: its fastest knobs.
        fastest: dict[tuple[str, int, str | None], PlannedOption] = {}
        for o in t.options:
            key = (o.technique, o.devices, o.kind)
            if key not in fastest or o.seconds < fastest[key].seconds:
                fastest[key] = o
        options = [ProfiledOption(o.technique, dict(o.knobs), o.devices, TrialRecord(
            fingerprint=f"simulated:{t.name}:{o.technique}:{o.devices}"
                        + (f":{o.kind}" if o.kind else ""),
            technique=o.technique, knobs=dict(o.knobs), devices=o.devices,
            device=o.kind or "simulated", status="ok", step_seconds=o.seconds / steps,
            measured_steps=steps, trial_seconds=o.seconds), o.kind)
            for o in fastest.values()]
        profiles.append(TaskProfile(task=t.name, group=t.name, total_steps=steps,
                                    options=options))
    return tasks, Profile(cluster=cluster, tasks=profiles)


def problem_cluster(problem: PlanningProblem) -> Cluster:
    """The problem's own nodes, as accelerator nodes of their kinds."""
    return Cluster([Node(n.name, n.devices, "cuda", model=n.kind) for n in problem.nodes])


def parse_cluster(text: str) -> Cluster:
    """``--cluster``'s text (``dione.plan.cluster_text.parse_nodes``) as accelerator
    nodes of their kinds."""
    return Cluster([Node(n.name, n.devices, "cuda", model=n.kind) for n in parse_nodes(text)])
