"""A Gantt chart of the first plan against what actually ran: a row per device, or, on a
cluster of more devices than a page can show one per row, a row per node."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dione.orchestrate.plans import AdoptedPlan
from dione.report.colours import task_colours

__all__ = ["draw_gantt"]

# More device rows than this and each node is one row, its devices stacked in it (720
# devices drew a 79,000-pixel-tall image, past what image readers open by default).
MAX_DEVICE_ROWS = 64
# The figure's height at most, in inches (about 4,400 pixels at the saved resolution).
MAX_HEIGHT = 40.0
MAX_LABELS = 400  # per panel: past this, labels cost more time than they tell
LEGEND_TASKS = 20  # past this, colours repeat: a legend would name several tasks alike
NUMBERED_TASKS = 120  # past this, a list of the tasks' numbers is taller than the chart
Bar = tuple[str, int, str, str, float, float, str]  # node, device, task, technique, ...


def draw_gantt(plan: AdoptedPlan | None, slices: Sequence[Any], zero: float,
               path: Path, simulated: bool = False,
               which: str = "plan (first adopted)",
               ended: Mapping[str, str] | None = None, order: Sequence[str] = (),
               resumed: Sequence[tuple[float, float]] = ()) -> None:
    """Two panels, each with its time axis: the first adopted plan and the actual slices
    (failed or interrupted ones hatched, drawn at least a sliver wide), seconds from the
    run's start; the last slice of a task its rule stopped (``ended``: task -> status)
    marked with an x at its end; a label where its bar has room for it, and a legend of
    the tasks' colours (as the learning curves colour them: ``order``, the workload's)
    up to 20 tasks; past that (colours repeat), up to 120, each task a number, on its
    bars and in a list under the chart; a dashed line where the run was resumed
    (``resumed``: each session after the first, its start in seconds from the run's and
    the seconds the run stood still before it, left out of the actual panel's axis: a
    run resumed the next day was a sliver of bars at each end); a simulated run's says so
    in both titles."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    planned: list[Bar] = []
    if plan is not None:
        offset = plan.clock_zero - zero
        for a in plan.run_clock:
            for device in a.device_ids:
                planned.append((a.node, device, a.task, a.technique, a.start + offset,
                                a.end + offset, "done"))
    def live(at: float) -> float:  # seconds from the start, the time stood still out
        return at - sum(idle for start, idle in resumed if at >= start)

    actual: list[Bar] = []
    for s in slices:
        end = s.ended_at if s.ended_at is not None else s.started_at
        for device in s.device_ids:
            actual.append((s.node, device, s.task, s.technique, live(s.started_at - zero),
                           live(end - zero), s.status))
    last: dict[str, Any] = {}  # each task's last actual slice: where a stop is marked
    for s in slices:
        if s.status == "done" and (s.task not in last or s.end_step >= last[s.task].end_step):
            last[s.task] = s
    stops = [s for task, s in last.items() if (ended or {}).get(task) == "stopped"]
    layout = _Layout(planned + actual)
    span = max([r[5] for r in planned + actual] + [1e-3])
    tasks = {r[2] for r in planned + actual}
    colour = {t: c for t, c in task_colours(order, tasks).items() if t in tasks}
    row_inches = min(0.5, max(0.05, (MAX_HEIGHT - 2.2) / 2 / max(1, len(layout.rows))))
    legend = 0 < len(colour) <= LEGEND_TASKS  # short slices leave most bars unlabelled
    # Past it, a number per task tells bars of one colour apart, and fits bars a name
    # does not (48 tasks: one bar was labelled, the colours repeated, no legend).
    numbers = {} if legend or not colour or len(colour) > NUMBERED_TASKS else {
        t: i + 1 for i, t in enumerate([t for t in order if t in colour]
                                       + sorted(t for t in colour if t not in order))}
    listed = [f"{n} {t}" for t, n in sorted(numbers.items(), key=lambda item: item[1])]
    legend_inches = (0.2 + 0.2 * math.ceil(len(colour) / 4) if legend
                     else 0.2 + 0.13 * math.ceil(len(listed) / 3) if listed else 0.0)
    height = 2.2 + row_inches * len(layout.rows) * 2 + legend_inches
    figure, axes = plt.subplots(2, 1, sharex=True, squeeze=True, figsize=(11, height))
    mark = "SIMULATED: " if simulated else ""
    for ax, bars, title in ((axes[0], planned, f"{mark}{which}"),
                            (axes[1], actual, f"{mark}actual" + (" (virtual cluster)"
                                                                 if simulated else ""))):
        _draw_bars(ax, bars, layout, span, colour, row_inches, numbers)
        if not bars:  # every task failed or was refused before a plan, or a slice ran
            said = ("no plan was adopted" if plan is None else "the plan assigned nothing") \
                if bars is planned else "no slice ran"
            ax.text(0.5, 0.5, said,
                    transform=ax.transAxes, ha="center", va="center", fontsize=9)
            if not (planned or actual):
                ax.set_xticks([])  # no time passed on either: no axis of it
        if bars is actual:
            for start, _ in resumed:  # the gap before it stood still (killed, stopped)
                ax.axvline(live(start), color="0.3", linestyle="--", linewidth=1)
                ax.text(live(start), -0.42, " resumed", fontsize=7, va="top", color="0.3")
            for s in stops:
                for device in s.device_ids:
                    ax.plot(live((s.ended_at or s.started_at) - zero),
                            layout.middle(s.node, device), marker="x", color="black",
                            markersize=7, markeredgewidth=2)
        layout.label_rows(ax, row_inches)
        cut_short = bars is actual and any(r[6] not in ("done", "running") for r in bars)
        ax.set_title(title + (" (x: a task its rule stopped)" if bars is actual and stops
                              else "") + ("; hatched: a slice that failed or was cut short"
                                          if cut_short else "")
                     + ("; a row per node, its devices stacked" if layout.by_node else "")
                     + ("; dashed: resumed" if bars is actual and resumed else ""),
                     fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelbottom=True)  # a time axis under each panel
        stood = sum(idle for _, idle in resumed) if bars is actual else 0.0
        ax.set_xlabel("seconds from the run's start" + (
            f", the {stood:.0f} s it stood still between sessions left out" if stood else ""),
            fontsize=8)
    if legend:
        from matplotlib.patches import Patch

        figure.legend(handles=[Patch(facecolor=c, edgecolor="black", label=t)
                               for t, c in colour.items()], loc="lower center",
                      ncol=min(4, len(colour)), fontsize=7, frameon=False)
    if listed:
        rows = math.ceil(len(listed) / 3)
        for column in range(3):
            figure.text(0.02 + 0.33 * column, (legend_inches - 0.1) / height,
                        "\n".join(listed[column * rows:(column + 1) * rows]),
                        fontsize=6, va="top", family="monospace")
    figure.tight_layout(rect=(0, legend_inches / height, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


class _Layout:
    """Where a device's bar goes: its own row, or its band of its node's row."""

    def __init__(self, bars: Sequence[Bar]) -> None:
        devices = sorted({(r[0], r[1]) for r in bars}, key=lambda d: (_natural(d[0]), d[1]))
        self.by_node = len(devices) > MAX_DEVICE_ROWS
        if self.by_node:
            self.rows = sorted({node for node, _ in devices}, key=_natural)  # n2 before n10
            # A node's width as the run used it: its devices seen, up to the highest id.
            self.width = {node: 1 + max(d for n, d in devices if n == node)
                          for node in self.rows}
        else:
            self.rows = [f"{node}:{device}" for node, device in devices]
        self.index = {row: i for i, row in enumerate(self.rows)}

    def band(self, node: str, device: int) -> tuple[float, float]:
        """The top and height of a device's bar (rows at integers, first on top)."""
        if not self.by_node:
            return self.index[f"{node}:{device}"] - 0.4, 0.8
        size = 0.9 / self.width[node]
        return self.index[node] - 0.45 + device * size, size

    def middle(self, node: str, device: int) -> float:
        top, height = self.band(node, device)
        return top + height / 2

    def label_rows(self, ax: Any, row_inches: float) -> None:
        # Every row named where the names fit (8 points is about 0.11 inch), else every
        # k-th: a label per row at 0.05 inch would be a black smear.
        every = max(1, round(0.11 / row_inches))
        ticks = range(0, len(self.rows), every)
        ax.set_yticks(list(ticks), [self.rows[i] for i in ticks],
                      fontsize=8 if every == 1 else 6)
        # First row on top, no empty band around (one empty band where there is no row).
        ax.set_ylim(max(1, len(self.rows)) - 0.5, -0.5)


def _draw_bars(ax: Any, bars: Sequence[Bar], layout: _Layout, span: float,
               colour: Mapping[str, Any], row_inches: float,
               numbers: Mapping[str, int] | None = None) -> None:
    """The bars as two collections (drawn whole, not one artist per bar: thousands of
    slices took most of a minute), cut ones hatched; labels where they have room (a
    task's number, where ``numbers`` gives one)."""
    from matplotlib.collections import PolyCollection

    shapes: dict[bool, tuple[list[list[tuple[float, float]]], list[Any]]] = {
        False: ([], []), True: ([], [])}
    labels = []
    for node, device, task, technique, start, end, status in bars:
        cut = status not in ("done", "running")
        width = max(end - start, 0.004 * span if cut else 1e-3)
        top, height = layout.band(node, device)
        verts, faces = shapes[cut]
        verts.append([(start, top), (start + width, top), (start + width, top + height),
                      (start, top + height)])
        faces.append(colour[task])
        # Room for it: wide enough (narrower labels overlapped) and a row of its own.
        if numbers and end - start > 0.015 * span and not layout.by_node \
                and row_inches >= 0.1:
            labels.append((start + (end - start) / 2, top + height / 2, str(numbers[task])))
        elif end - start > 0.06 * span and not layout.by_node and row_inches >= 0.3:
            labels.append((start + (end - start) / 2, top + height / 2, f"{task}\n{technique}"))
    for cut, (verts, faces) in shapes.items():
        if verts:
            ax.add_collection(PolyCollection(verts, facecolors=faces, edgecolors="black",
                                             linewidths=0.5 if len(verts) < 2000 else 0.2,
                                             hatch="//" if cut else None))
    for x, y, text in labels[:MAX_LABELS]:
        ax.text(x, y, text, ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_xlim(0, span * 1.01)


def _natural(row: str) -> list[Any]:
    """A row's sort key: its numbers as numbers (n2:1 before n10:0)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", row)]
