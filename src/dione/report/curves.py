"""Learning curves of a run: per task its training loss by step and each evaluated
metric by the step it was evaluated at, one line each, marked where a task stopped,
diverged or failed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dione.report.colours import task_colours
from dione.state.summaries import TaskSummary

__all__ = ["draw_curves"]

# How a task that did not finish ends its line.
ENDS = {"stopped": ("x", "stopped"), "diverged": ("*", "diverged"), "failed": ("v", "failed")}
# Past this many tasks only each panel's best (by its last value) get colours and a
# legend, the others grey: twenty colours over 57 tasks told none apart.
NAMED = 10


def _named_colour(rank: int) -> Any:
    """The colour of the task ranked ``rank`` among the named: tab10's, its grey left
    out (the 8th best was drawn grey among the grey lines), then black."""
    import matplotlib

    return (*(matplotlib.colormaps["tab10"](i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)),
            "black")[rank]


def draw_curves(tasks: Sequence[TaskSummary], losses: Mapping[str, Sequence[tuple[int, float]]],
                evaluations: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
                path: Path, simulated: bool = False,
                lower: Mapping[str, bool] | None = None) -> None:
    """One panel for the training loss, one per evaluated metric; a line per task (past
    20 tasks, each panel's best ``NAMED`` by their last value in colour and named, the
    rest grey; ``lower``: metric -> whether lower is better, default loss-like)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = sorted({m for per_task in evaluations.values() for m in per_task})
    panels = ["loss", *metrics]
    # A task whose loss spiked (a learning rate too high) squashed every other line flat
    # near zero: where the losses span more than 100 times, the loss axis is logarithmic.
    # A diverged task's last loss is NaN or infinite: drawn to its last finite value,
    # where its mark goes (a NaN kept the axis linear and put the mark nowhere).
    losses = {task: [(s, v) for s, v in points if math.isfinite(v)]
              for task, points in losses.items()}
    log_loss = log_scaled(losses)
    figure, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)),
                                squeeze=False)
    colours = task_colours([t.task for t in tasks])  # as the Gantt chart's
    status = {t.task: t.status for t in tasks}
    many = len(tasks) > 20
    for index, panel in enumerate(panels):
        ax = axes[index][0]
        lines = {t.task: (losses.get(t.task, []) if panel == "loss"
                          else evaluations.get(t.task, {}).get(panel, [])) for t in tasks}
        best = _best(lines, (lower or {}).get(panel, True)) if many else []
        for task in (t.task for t in tasks):
            points = lines[task]
            if not points:
                continue
            steps, values = zip(*points, strict=True)
            named = not many or task in best
            colour = (colours[task] if not many else
                      _named_colour(best.index(task)) if named else "0.75")
            ax.plot(steps, values, color=colour, linewidth=1 if named else 0.6,
                    marker="o" if panel != "loss" and named else None, markersize=3,
                    label=task if named else None, zorder=2 if named else 1)
            end = ENDS.get(status.get(task, ""))
            if end is not None:
                # In the task's own colour (black marks of several tasks could not be
                # told apart), edged black to stand out.
                ax.plot(steps[-1], values[-1], marker=end[0], color=colour,
                        markeredgecolor="black" if named else "0.5",
                        markeredgewidth=1.5 if named else 0.8, markersize=9 if named else 5,
                        zorder=3 if named else 1)
        if panel == "loss" and log_loss:
            ax.set_yscale("log")
        title = ("training loss" + (" (log scale)" if log_loss else "") if panel == "loss"
                 else f"evaluated {panel}")
        mark = "SIMULATED: " if simulated else ""
        ax.set_title(f"{mark}{title} by step (x: stopped, *: diverged, v: failed)"
                     + (f"; the best {len(best)} by their last value named, the rest grey"
                        if many else ""), fontsize=9, loc="left")
        if many and best:  # best first
            handles, labels = ax.get_legend_handles_labels()
            ranked = sorted(zip(handles, labels, strict=True),
                            key=lambda pair: best.index(pair[1]))
            ax.legend([h for h, _ in ranked], [label for _, label in ranked], fontsize=6,
                      ncol=2)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if not many:  # every panel: the evaluation panels had none
        for row in axes:
            if row[0].get_legend_handles_labels()[0]:
                row[0].legend(fontsize=6, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def log_scaled(losses: Mapping[str, Sequence[tuple[int, float]]]) -> bool:
    """Whether the loss panel is logarithmic: the finite losses span more than 100 times
    and are all positive (a task whose loss spiked squashed every other line flat)."""
    finite = [v for points in losses.values() for _, v in points if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    return bool(positive) and len(positive) == len(finite) and max(positive) > 100 * min(
        positive)


def _best(lines: Mapping[str, Sequence[tuple[int, float]]], lower: bool) -> list[str]:
    """The ``NAMED`` tasks whose last value is best (finite values only), best first."""
    last = {task: points[-1][1] for task, points in lines.items()
            if points and math.isfinite(points[-1][1])}
    return sorted(last, key=lambda t: last[t] if lower else -last[t])[:NAMED]
