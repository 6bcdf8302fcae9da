"""Learning curves of a run: per task its training loss by step and each evaluated
metric by the step it was evaluated at, one line each, marked where a task stopped,
diverged or failed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dione.state.summaries import TaskSummary

__all__ = ["draw_curves"]

# How a task that did not finish ends its line.
ENDS = {"stopped": ("x", "stopped"), "diverged": ("*", "diverged"), "failed": ("v", "failed")}


def draw_curves(tasks: Sequence[TaskSummary], losses: Mapping[str, Sequence[tuple[int, float]]],
                evaluations: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
                path: Path, simulated: bool = False) -> None:
    """One panel for the training loss, one per evaluated metric; a line per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = sorted({m for per_task in evaluations.values() for m in per_task})
    panels = ["loss", *metrics]
    # A task whose loss spiked (a learning rate too high) squashed every other line flat
    # near zero: where the losses span more than 100 times, the loss axis is logarithmic.
    positive = [v for points in losses.values() for _, v in points if v > 0]
    log_loss = bool(positive) and max(positive) > 100 * min(positive) and all(
        v > 0 for points in losses.values() for _, v in points)
    figure, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)),
                                squeeze=False)
    colours = plt.get_cmap("tab20")
    status = {t.task: t.status for t in tasks}
    for index, panel in enumerate(panels):
        ax = axes[index][0]
        for k, task in enumerate(t.task for t in tasks):
            points = (losses.get(task, []) if panel == "loss"
                      else evaluations.get(task, {}).get(panel, []))
            if not points:
                continue
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, color=colours(k % 20), linewidth=1,
                    marker="o" if panel != "loss" else None, markersize=3, label=task)
            end = ENDS.get(status.get(task, ""))
            if end is not None:
                # In the task's own colour (black marks of several tasks could not be
                # told apart), edged black to stand out.
                ax.plot(steps[-1], values[-1], marker=end[0], color=colours(k % 20),
                        markeredgecolor="black", markeredgewidth=1.5, markersize=9)
        if panel == "loss" and log_loss:
            ax.set_yscale("log")
        title = ("training loss" + (" (log scale)" if log_loss else "") if panel == "loss"
                 else f"evaluated {panel}")
        mark = "SIMULATED: " if simulated else ""
        ax.set_title(f"{mark}{title} by step (x: stopped, *: diverged, v: failed)",
                     fontsize=9, loc="left")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if len(tasks) <= 20:  # every panel: the evaluation panels had none
        for row in axes:
            if row[0].get_legend_handles_labels()[0]:
                row[0].legend(fontsize=6, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
