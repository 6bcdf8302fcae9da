"""A workload checked before anything starts, as ``dione validate`` and ``dione.validate``
report it: every problem at once, the techniques that will not train a task and why,
and the warnings of what would make a run other than it reads."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dione.spec.task import Task
from dione.spec.validate import Problem
from dione.techniques.validation import profiled_widths, trained_by_none, valid_tasks
from dione.words import some

__all__ = ["Validation", "check_workload", "untrained_evaluation"]


@dataclass
class Validation:
    """What checking a workload found: the tasks a run would train, each problem that
    leaves one out (with its fix), per technique the tasks it will not train and why,
    and warnings, each with the tasks it is of."""

    tasks: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # each: task, field, message
    refused: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    warnings: dict[str, list[str]] = field(default_factory=dict)
    devices: int = 0  # the width it was judged for
    odd_batches: list[str] = field(default_factory=list)  # not a multiple of devices
    evaluated: list[str] = field(default_factory=list)  # what each evaluate returned

    @property
    def ok(self) -> bool:
        """Whether every task is valid (refusals and warnings aside)."""
        return not self.problems

    def lines(self) -> list[str]:
        """What was found, a line each, problems first (`dione validate` refuses a
        workload with any before it prints these; ``dione.validate``'s caller printed
        ``lines()`` of an invalid one and saw nothing of them: a notebook review)."""
        said = [f"problem: {problem}" for problem in self.problems]
        said += self.evaluated
        said += [f"{technique} will not train {', '.join(names)}: {why}"
                for (technique, why), names in self.refused.items()]
        said += [f"warning: {', '.join(names)}: {doubt}"
                 for doubt, names in self.warnings.items()]
        if self.odd_batches:
            said.append(f"data parallelism over all {self.devices} devices will not train "
                        f"{', '.join(self.odd_batches)}: the batch size is not a multiple "
                        f"of {self.devices}; plans give them fewer devices")
        return said


def check_workload(workload: Iterable[Task], devices: int | None, kind: Any,
                   widest: int) -> tuple[list[Task], Validation]:
    """The valid tasks of ``workload`` and what checking it found, judged for a node of
    ``widest`` devices of ``kind`` (``devices``: the width given, if one was)."""
    from dione.spec.batch import split_problem
    from dione.spec.metrics import doubtful_direction
    from dione.spec.stopping import too_few_sharing
    from dione.spec.validate import (
        keep_best_doubts,
        late_evaluation,
        rule_cadence_doubt,
        training_loss_doubt,
    )

    workload = list(workload)
    tasks, problems = valid_tasks(workload, devices)
    problems = _misspelt_keep_best(problems, workload, kind)
    # A task every technique it allows refuses would fail after profiling ("no
    # configuration fits"): a problem of its own, as a run finds it.
    tasks, untrainable = trained_by_none(tasks, widest, kind)
    problems += untrainable
    found = Validation([t.name for t in tasks], problems, devices=devices or widest)
    tasks = _check_evaluations(tasks, found, kind)
    for task in tasks:  # what will not train a task that is otherwise fine, by reason
        said = {**task.refused_techniques, **_model_refusals(task, widest, kind)}
        for technique, reason in said.items():
            why = reason.replace(f"task {task.name!r}: ", "")
            found.refused.setdefault((technique, why), []).append(task.name)
    for task in tasks:  # a stopping rule judging its metric the other way, or idle
        rule = task.stopping
        steps = task.steps
        for doubt in (rule and rule.metric != "loss"
                      and doubtful_direction(rule.metric, rule.mode, rule.mode_fix),
                      rule and isinstance(steps, int) and not isinstance(steps, bool)
                      and not rule.mistakes() and rule.never_stops(steps)):
            if doubt:
                found.warnings.setdefault(doubt, []).append(task.name)
    for lonely, names in too_few_sharing(tasks):  # a rule that compares too few tasks
        found.warnings.setdefault(lonely, []).extend(names)
    for task in tasks:  # evaluates at its end anyway (eval_every does nothing); keep_best
        for doubt in [late_evaluation(task), rule_cadence_doubt(task),
                      *keep_best_doubts(task), training_loss_doubt(task)]:
            if doubt:
                found.warnings.setdefault(doubt, []).append(task.name)
    if devices is not None:  # allowed single: trained on fewer devices, not refused
        found.odd_batches = [t.name for t in tasks
                             if split_problem(t.batch_size, devices, "devices")]
    return tasks, found


def _check_evaluations(tasks: list[Task], found: Validation, kind: Any) -> list[Task]:
    """Each of the tasks' ``evaluate`` functions run once (``untrained_evaluation``):
    a metric a task's stopping rule or ``keep_best`` names that it does not return, or a
    return that is no dict of numbers, is the task's problem (a run would fail it after
    profiling); an evaluate that raises here is a warning (it may need what only the
    run's devices have; the run fails a task whose rule judges an evaluated metric where
    it raises there). Returns the tasks without a problem."""
    import time

    from dione.spec.evaluated import (
        judged_on_evaluation,
        listed_metrics,
        metric_mistake,
        missing_metrics,
    )
    from dione.spec.sameness import same_function
    from dione.spec.validate import raised_line

    groups: list[list[Task]] = []  # tasks of one evaluate function
    for task in tasks:
        if task.evaluate is not None:
            alike = next((g for g in groups if same_function(g[0].evaluate, task.evaluate)),
                         None)
            if alike is not None:
                alike.append(task)
            else:
                groups.append([task])
    refused: set[str] = set()
    for alike in groups:
        first, names = alike[0], some([t.name for t in alike], 2)
        began = time.perf_counter()
        try:
            returned = untrained_evaluation(first, kind)
        except Exception as err:
            # A warning, not a problem: evaluate may need what only the run's devices
            # or nodes have (a GPU, a file on the cluster), and the run checks it there.
            from dione.techniques.evaluate import EvaluateReturned

            if isinstance(err, EvaluateReturned):
                # What it returned is no dict of numbers: no device makes that right, so
                # a problem of each task (a warning let the run train them, every
                # evaluation failing, exit 0: a review).
                what = str(err).split(" returned ", 1)[-1]  # it named the first task
                for task in alike:
                    found.problems.append(Problem(task.name, "evaluate",
                                                  f"returned {what}"))
                    refused.add(task.name)
                continue
            line = f"evaluate raised {raised_line(err)}"
            judged = [t for t in alike if judged_on_evaluation(t)]
            if judged:
                found.warnings.setdefault(
                    f"{line} on {first.name}'s untrained model here: where "
                    "it does so on the run's devices too, a run fails "
                    + ("them before they train (their" if len(judged) > 1 else
                       "it before it trains (its")
                    + " stopping rule judges what evaluate returns); fix evaluate, unless "
                    "it needs what only the cluster has", []).extend(
                    t.name for t in judged)
            rest = [t for t in alike if t not in judged]
            if rest:
                found.warnings.setdefault(
                    f"{line} on {first.name}'s untrained model here: a run "
                    f"trains {'them' if len(rest) > 1 else 'it'} but "
                    f"{'their' if len(rest) > 1 else 'its'} evaluations fail where it does "
                    "so on the run's devices too; fix evaluate, unless it needs what only "
                    "the cluster has", []).extend(t.name for t in rest)
            continue
        if returned is None:
            continue
        found.evaluated.append(f"evaluate of {names} returned {listed_metrics(returned)} "
                               f"on an untrained model ({time.perf_counter() - began:.1f} s)")
        for task in alike:
            mistake = metric_mistake(task, returned, "on its untrained model")
            if mistake is not None:
                part = missing_metrics(task, returned)[0][0]
                found.problems.append(Problem(task.name, "stopping" if part == "rule"
                                              else "keep_best", mistake))
                refused.add(task.name)
    found.tasks = [name for name in found.tasks if name not in refused]
    return [t for t in tasks if t.name not in refused]


def _misspelt_keep_best(problems: list[Problem], workload: list[Task],
                        kind: Any) -> list[Problem]:
    """``problems``, each that nothing says which way a task's keep_best is better told
    anew from what its evaluate returns on the untrained model: where it lacks the name,
    that (with the name it likely meant; a misspelt keep_best was told to give
    keep_best_mode, and only once it had, that the name was wrong: a review); where it
    returns it, that the mode is the fix. Evaluated once per model and evaluate (a
    sweep's), watched as validation's factories are."""
    from dione.spec.evaluated import metric_mistake
    from dione.spec.sameness import same_function
    from dione.spec.validate import UNKNOWN_DIRECTION
    from dione.spec.waiting import watched

    tried: list[tuple[Task, tuple[str, ...] | None]] = []
    told = []
    for problem in problems:
        task = next((t for t in workload if t.name == problem.task), None)
        if problem.field != "keep_best" or UNKNOWN_DIRECTION not in problem.message \
                or task is None:
            told.append(problem)
            continue
        alike = [r for t, r in tried if same_function(t.model, task.model)
                 and same_function(t.evaluate, task.evaluate)]
        returned = alike[0] if alike else None
        if not alike:
            try:
                returned = watched(functools.partial(untrained_evaluation, task, kind),
                                   task.name, "model() and evaluate on it")
            except Exception:  # raised here: the mode is all there is to say
                returned = None
            tried.append((task, returned))
        mistake = None if returned is None else metric_mistake(
            task, returned, "on its untrained model")
        if mistake is not None:
            told.append(Problem(problem.task, "keep_best", mistake))
        elif returned is not None:  # it returns that name: only the mode is missing
            told.append(Problem(problem.task, "keep_best", f"its name {task.keep_best!r} "
                                f"{UNKNOWN_DIRECTION}, and evaluate returns it: give "
                                "keep_best_mode='min' or 'max'"))
        else:
            told.append(problem)
    return told


def untrained_evaluation(task: Task, kind: Any = "cpu") -> tuple[str, ...] | None:
    """The metrics ``task``'s ``evaluate`` returns, run once here on its model as its
    seed builds it (untrained), as Lightning's sanity check runs validation before
    training; on the first GPU where ``kind`` is "cuda" and one is here. None: no
    evaluate, or a model too big to build here (or that cannot be built: its own
    problem, said by validation). Raises what evaluate raises."""
    import torch

    from dione.spec.validate import REAL_FORWARD_BYTES, build_model, in_a_group
    from dione.techniques.evaluate import evaluate_model, fresh_model

    if task.evaluate is None:
        return None
    try:
        size = sum(p.numel() * p.element_size() for p in build_model(task.model).parameters())
    except Exception:
        return None
    if size > REAL_FORWARD_BYTES:
        return None
    device = torch.device("cuda" if kind == "cuda" and torch.cuda.is_available() else "cpu")
    with in_a_group():
        return tuple(evaluate_model(task, fresh_model(task).to(device)))


def _model_refusals(task: Any, devices: int, kind: Any) -> dict[str, str]:
    """Techniques (the task allows) that will not train it on ``devices`` devices for
    what its model is (BatchNorm under a split batch, a pipeline's cut), as their own
    checks say; not what is said elsewhere (a batch that does not divide, a technique
    the task must opt in to). One that trains it on fewer devices is said to refuse
    only the wider ones (gpipe in 2 stages but not 4)."""
    from dione.techniques.registry import techniques

    found = {}
    for technique in techniques():
        knobs = technique.resolve({})
        if (not task.allows(technique.name) or technique.name in task.refused_techniques
                or (technique.inexactness(knobs) is not None and not task.allow_inexact)):
            continue
        try:
            said = _refusal(technique, task, devices, kind, knobs)
        except Exception as err:  # a technique of the user's: said, as profiling says it
            said = (f"{technique.name}'s knob_settings or check raised "
                    f"{type(err).__name__}: {err}")
        if said:
            found[technique.name] = said
    return found


def _refusal(technique: Any, task: Any, devices: int, kind: Any,
             knobs: dict[str, Any]) -> str | None:
    """Why ``technique`` will not train ``task`` on up to ``devices`` devices (None: it
    will, with some setting)."""
    from dione.spec.batch import split_problem

    count = profiled_widths(technique, devices)[-1]  # its widest (single's only)
    parts, what = technique.batch_parts(count, knobs)
    odd = split_problem(task.batch_size, parts, what, task.name) if isinstance(
        parts, int) else None
    reasons = [r for r in technique.check(task, count, {}, kind) if r != odd]
    if not reasons or technique.knob_settings(task, count, kind):
        return None  # its defaults fit, or another setting of it does
    narrower = [c for c in profiled_widths(technique, devices)
                if c < count and technique.knob_settings(task, c, kind)]
    return (f"not on {count} devices (it does on {', '.join(map(str, narrower))}): "
            if narrower else "") + "; ".join(reasons)
