"""One colour per task for every figure of a report, so a colour means one task on a page."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["task_colours"]


def task_colours(order: Sequence[str], also: Iterable[str] = ()) -> dict[str, Any]:
    """tab20's colours by the tasks' ``order`` (the workload's), then ``also`` (tasks
    only a figure knows, sorted); past 20 tasks they repeat."""
    import matplotlib

    colours = matplotlib.colormaps["tab20"]
    names = [*dict.fromkeys(order), *sorted(set(also) - set(order))]
    return {task: colours(i % 20) for i, task in enumerate(names)}
