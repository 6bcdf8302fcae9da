"""Live progress of a run in the terminal (``rich``); plain event lines off a terminal."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from dione.clock import now

if TYPE_CHECKING:  # the runner pulls in launchers and solvers; the view needs its types only
    from dione.orchestrate.records import RunState

__all__ = ["LiveProgress"]


class LiveProgress:
    """Per task: status, technique, devices, step of total, latest loss, ETA; and the
    workload's estimated finish. Use as a context manager around the run."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = Live(console=console, refresh_per_second=2, transient=False) \
            if console.is_terminal else None
        self._last = 0.0
        self._state: RunState | None = None  # the newest given, drawn or not

    def __enter__(self) -> LiveProgress:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            if self._state is not None:  # the frame left on screen is the run's end (an
                self._draw(self._state)  # update skipped within 0.4 s showed "pending")
            self.live.__exit__(*exc)

    def event(self, message: str) -> None:
        """A line for the log: above the live table on a terminal, plain elsewhere."""
        self.console.print(Text(message))

    def update(self, state: RunState) -> None:
        if self.live is None:
            return
        self._state = state
        now = time.time()
        if now - self._last < 0.4:
            return
        self._last = now
        self._draw(state)

    def _draw(self, state: RunState) -> None:
        assert self.live is not None
        # The lines that fit under the events above it: rich crops a taller table from
        # the bottom, and a sweep's running tasks were never on screen. A name folded
        # over lines takes as many: the rows are counted from a first rendering.
        room = max(6, self.console.size.height - 8)
        rows = room
        lines = self._lines(state, rows)
        if len(lines) > room and len(state.records) > 1:
            per_row = max(1.0, (len(lines) - 4) / min(rows, len(state.records)))
            rows = max(2, int((room - 4) / per_row))
            lines = self._lines(state, rows)
        # Rendered once here: every event line printed above it redraws the live part,
        # and laying a 48-row table out again each time took a core's worth on a
        # small machine (42 ms a draw against 3 ms for the lines).
        self.live.update(_Lines(lines))

    def _lines(self, state: RunState, rows: int) -> list[list[Segment]]:
        return self.console.render_lines(self.render(state, rows), self.console.options,
                                         pad=False)

    @staticmethod
    def render(state: RunState, rows: int | None = None) -> _Frame:
        """The summary line, then a row per task: running ones first, then those the
        plan starts soonest, then ended ones; at most ``rows`` (the rest
        counted in a last row); laid out for the width it is drawn at."""
        return _Frame(state, rows)


_COLUMNS = ("task", "status", "technique", "devices", "step", "loss", "ETA s", "trained")
# Left out in turn where the width is short: the figures and the name come first.
_DROPPED = ((), ("trained",), ("trained", "technique"), ("trained", "technique", "ETA s"))


class _Frame:
    """The live table of ``state``, laid out for the console's width when drawn."""

    def __init__(self, state: RunState, rows: int | None) -> None:
        self.state = state
        self.rows = rows

    def __rich_console__(self, console: Console, options: Any) -> Any:
        yield _frame(self.state, self.rows, options.max_width)


def _frame(state: RunState, rows: int | None, width: int) -> Group:
    clock = now() - state.clock_zero
    plan = {a.task: a for a in state.plan}
    place = {name: i for i, name in enumerate(state.records)}
    order = sorted(state.records, key=lambda name: _shown_first(
        state.records[name], plan.get(name), place[name]))
    shown = order if rows is None or len(order) <= rows else order[:max(1, rows - 1)]
    cells: list[tuple[str, ...]] = []
    for name in shown:
        record = state.records[name]
        running = record.running
        # An ended task holds no devices (it showed its stale plan's until a re-plan).
        where = (running.assignment if running
                 else None if record.status.ended else plan.get(name))
        step = record.done_steps
        if running is not None and 0 in running.progress:
            step = running.progress[0].get("step", step)
        eta = "-"
        if record.status in ("running", "pending") and where is not None:
            end = running.predicted_end if running else where.end
            eta = f"{max(0.0, end - clock):.0f}"
        loss = record.last_loss
        cells.append((
            name, str(record.status), where.technique if where else "-",
            f"{where.node}:{','.join(map(str, where.device_ids))}" if where else "-",
            f"{step}/{record.total}", "-" if loss is None else f"{loss:.4f}", eta,
            "INEXACT" if record.inexact
            else "-" if running is None and not record.done_steps else "exact"))
    hidden = order[len(shown):]
    if hidden:  # said in the name's column, which folds (in status it took the width)
        cells.append((f"... {len(hidden)} more: "
                      f"{_counts(state.records[n] for n in hidden)}", *[""] * 7))
    # The name keeps a width of its own (the figures took all 80 columns and left it
    # none), and folds (a grid's points differ at its end: cut, three read "gpt2-lr0…");
    # the figures keep theirs, the least needed columns left out where they do not fit
    # (cropped, a 72-column terminal read "tr" for "trained").
    longest = max((len(name) for name in state.records), default=4)

    def needed(columns: tuple[str, ...]) -> int:
        return sum(max([len(c), *(len(row[_COLUMNS.index(c)]) for row in cells)]) + 3
                   for c in columns if c != "task")

    for dropped in _DROPPED:
        columns = tuple(c for c in _COLUMNS if c not in dropped)
        if needed(columns) + min(longest, 12) <= width:
            break
    name_width = max(4, min(longest, 12, width - needed(columns) - 1))
    # No outer border: 80 columns hold the figures and a part of the name.
    table = Table(expand=False, box=box.MINIMAL, pad_edge=False)
    for column in columns:
        table.add_column(column, justify="right" if column in ("step", "loss", "ETA s")
                         else "left", overflow="fold",
                         no_wrap=column not in ("task", "devices"),
                         min_width=name_width if column == "task" else None)
    for row in cells:
        table.add_row(*(row[_COLUMNS.index(c)] for c in columns))
    left = any(not r.status.ended for r in state.records.values())
    counts = _counts(state.records.values())
    finish = Text(f"elapsed {clock:.0f} s, estimated finish at "
                  f"{state.estimated_finish:.0f} s; {counts}" if left
                  else f"elapsed {clock:.0f} s, nothing left to train; {counts}")
    return Group(finish, table)


def _shown_first(record: Any, planned: Any, index: int) -> tuple[int, float, int]:
    """A task's place in the live table: running, then waiting to train (soonest planned
    first), then ended; within each as the run has them."""
    if record.running is not None:
        return (0, 0.0, index)
    if not record.status.ended:
        return (1, planned.start if planned is not None else float("inf"), index)
    return (2, 0.0, index)


def _counts(records: Any) -> str:
    """How many tasks stand where: "3 running, 40 pending, 5 done"."""
    tally: dict[str, int] = {}
    for record in records:
        status = "running" if record.running is not None else str(record.status)
        tally[status] = tally.get(status, 0) + 1
    order = ("running", "paused", "pending", "done", "stopped", "diverged", "failed")
    return ", ".join(f"{tally[status]} {status}" for status in sorted(
        tally, key=lambda s: order.index(s) if s in order else len(order)))


class _Lines:
    """Lines rendered once, drawn again as they are."""

    def __init__(self, lines: list[list[Segment]]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Console, options: Any) -> Any:
        for line in self.lines:
            yield from line
            yield Segment.line()
