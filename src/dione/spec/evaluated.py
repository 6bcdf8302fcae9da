"""The metrics a task's stopping rule and ``keep_best`` name, held against those its
``evaluate`` returned: said the same way by a profiling trial and by `dione validate`."""

from __future__ import annotations

import difflib

from dione.spec.task import Task

__all__ = ["judged_on_evaluation", "judging_failed_evaluation", "listed_metrics",
           "metric_mistake", "missing_metrics", "missing_said"]


def missing_metrics(task: Task, returned: tuple[str, ...]) -> list[tuple[str, str]]:
    """(part, metric) for each of "rule" (its stopping rule's metric, unless the training
    loss) and "keep_best" that names a metric ``returned`` lacks: both at once, so that
    one fix is not followed by another refusal."""
    rule = task.stopping
    named = [("rule", rule.metric if rule is not None and rule.metric != "loss" else None),
             ("keep_best", task.keep_best)]
    return [(part, metric) for part, metric in named
            if metric is not None and metric not in returned]


def missing_said(task: Task, missing: list[tuple[str, str]]) -> str:
    """What names the missing metric(s), as a sentence's start."""
    judged_by = task.stopping.judged_by if task.stopping is not None else ""
    said = {"rule": f"{judged_by} judges {{!r}}", "keep_best": "keep_best names {!r}"}
    if len(missing) == 2 and missing[0][1] == missing[1][1]:
        return (f"{judged_by} judges {missing[0][1]!r} and keep_best names it, which "
                "its evaluate does not return")
    which = "which its evaluate does not return" if len(missing) == 1 else \
        "neither of which its evaluate returns"
    return " and ".join(said[part].format(metric) for part, metric in missing) + f", {which}"


def listed_metrics(metrics: tuple[str, ...]) -> str:
    """``metrics`` as a sentence lists them."""
    return ", ".join(repr(m) for m in metrics) or "no metric"


def metric_mistake(task: Task, returned: tuple[str, ...], where: str) -> str | None:
    """Why ``task`` cannot run as written where its evaluate returned ``returned``
    (``where``: when it did, "in its profiling trial"), with the fix; None where every
    metric it names is among them."""
    missing = missing_metrics(task, returned)
    if not missing:
        return None
    rule = task.stopping
    fixes = [rule.metric_fix if part == "rule" and rule is not None else "keep_best"
             for part, _ in missing]
    named = f" as {' and '.join(fixes)}" if fixes != ["keep_best"] else ""
    near = [close[0] for _, metric in missing
            for close in [difflib.get_close_matches(metric, returned, n=1, cutoff=0.75)]
            if close]
    meant = f"did you mean {' and '.join(map(repr, dict.fromkeys(near)))}? Else " if near else ""
    return (f"{missing_said(task, missing)} (it returned {listed_metrics(returned)} "
            f"{where}): {meant}name one of those{named}, or return it from evaluate")


def judging_failed_evaluation(task: Task, error: str, where: str) -> str | None:
    """Why ``task`` cannot be judged where its evaluate raised ``error`` (``where``: when
    it did), if its stopping rule judges a metric evaluate returns: it would train to its
    first rung and fail there; None where its rule judges the training loss, or it has
    none (its training stands without evaluations)."""
    rule = task.stopping
    if rule is None or not judged_on_evaluation(task):
        return None
    return (f"its evaluate raised {error} {where}, and {rule.judged_by} judges "
            f"{rule.metric!r} from it, so no rung could judge the task: fix evaluate")


def judged_on_evaluation(task: Task) -> bool:
    """Whether ``task``'s stopping rule judges a metric its evaluate returns (not the
    training loss)."""
    return task.stopping is not None and task.stopping.metric != "loss"
