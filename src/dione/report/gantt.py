"""A Gantt chart of the first plan against what actually ran, one row per device."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dione.orchestrate.plans import AdoptedPlan

__all__ = ["draw_gantt"]


def draw_gantt(plan: AdoptedPlan | None, slices: Sequence[Any], zero: float,
               path: Path, simulated: bool = False,
               which: str = "plan (first adopted)",
               ended: Mapping[str, str] | None = None) -> None:
    """Two panels sharing the time axis: the first adopted plan and the actual slices
    (failed or interrupted ones hatched, drawn at least a sliver wide), seconds from the
    run's start; the last slice of a task its rule stopped (``ended``: task -> status)
    marked with an x at its end; a label where its bar has room for it; a simulated
    run's says so in both titles."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    planned = []
    if plan is not None:
        offset = plan.clock_zero - zero
        for a in plan.run_clock:
            for device in a.device_ids:
                planned.append((f"{a.node}:{device}", a.task, a.technique,
                                a.start + offset, a.end + offset, "done"))
    actual = []
    for s in slices:
        end = s.ended_at if s.ended_at is not None else s.started_at
        for device in s.device_ids:
            actual.append((f"{s.node}:{device}", s.task, s.technique, s.started_at - zero,
                           end - zero, s.status))
    last: dict[str, Any] = {}  # each task's last actual slice: where a stop is marked
    for s in slices:
        if s.status == "done" and (s.task not in last or s.end_step >= last[s.task].end_step):
            last[s.task] = s
    stops = [s for task, s in last.items() if (ended or {}).get(task) == "stopped"]
    rows = sorted({r[0] for r in planned + actual}, key=_natural)  # n2 before n10
    span = max([r[4] for r in planned + actual] + [1e-3])
    tasks = sorted({r[1] for r in planned + actual})
    colours = plt.get_cmap("tab20")
    colour = {t: colours(i % 20) for i, t in enumerate(tasks)}
    figure, axes = plt.subplots(2, 1, sharex=True, figsize=(11, 1.2 + 0.5 * len(rows) * 2 + 1),
                                squeeze=True)
    mark = "SIMULATED: " if simulated else ""
    for ax, bars, title in ((axes[0], planned, f"{mark}{which}"),
                            (axes[1], actual, f"{mark}actual" + (" (virtual cluster)"
                                                                 if simulated else ""))):
        for row, task, technique, start, end, status in bars:
            y = rows.index(row)
            cut = status not in ("done", "running")
            ax.barh(y, max(end - start, 0.004 * span if cut else 1e-3), left=start,
                    color=colour[task], edgecolor="black", linewidth=0.5,
                    hatch="//" if cut else None)
            if end - start > 0.06 * span:  # room for it: narrower labels overlapped
                ax.text(start + (end - start) / 2, y, f"{task}\n{technique}", ha="center",
                        va="center", fontsize=6, clip_on=True)
        if bars is actual:
            for s in stops:
                for device in s.device_ids:
                    ax.plot((s.ended_at or s.started_at) - zero,
                            rows.index(f"{s.node}:{device}"), marker="x", color="black",
                            markersize=7, markeredgewidth=2)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # first row on top, no empty band around them
        cut_short = bars is actual and any(r[5] not in ("done", "running") for r in bars)
        ax.set_title(title + (" (x: a task its rule stopped)" if bars is actual and stops
                              else "") + ("; hatched: a slice that failed or was cut short"
                                          if cut_short else ""), fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[1].set_xlabel("seconds from the run's start")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _natural(row: str) -> list[Any]:
    """A device row's sort key: its numbers as numbers (n2:1 before n10:0)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", row)]
