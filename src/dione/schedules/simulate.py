"""Run a schedule on paper: per-stage times in, timeline, time per mini-batch and bubble out.

Each stage does its actions in list order; an action starts when the stage is free and
its input is there: a forward on stage k > 0 needs the same micro-batch's forward on
stage k-1 plus one transfer, a backward on stage k < K-1 needs the backward on stage
k+1 plus one transfer. Sends are asynchronous (as torch's isend), so a transfer delays
the receiver but does not occupy either stage.

A weight several stages hold (tied input and output embeddings) makes their updates one
collective (``dione.techniques.pipeline.shared``): each holder's update of mini-batch i starts
once every holder has reached its own. Under a flush (gpipe, 1f1b) that wait is hidden,
as the next forwards wait for stage 0's update anyway; under xpipe the later stage idles
until the mini-batch's gradient has travelled back to the earlier one, every mini-batch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dione.schedules.actions import Action, Schedule, ScheduleError

__all__ = ["Span", "StageTimes", "Timeline", "simulate", "spans_of"]


@dataclass(frozen=True)
class StageTimes:
    """Seconds per micro-batch of each stage's forward and backward, per mini-batch of
    its optimizer step, and of one activation or gradient transfer between stages.
    ``overhead`` is added to every forward and backward: what the runtime itself costs
    per action (its Python, posting sends and receives, waking up when one arrives)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    update: tuple[float, ...]
    transfer: float = 0.0
    overhead: float = 0.0

    @classmethod
    def uniform(cls, stages: int, forward: float, backward: float, update: float = 0.0,
                transfer: float = 0.0) -> StageTimes:
        return cls((forward,) * stages, (backward,) * stages, (update,) * stages, transfer)

    def duration(self, stage: int, action: Action) -> float:
        table = {"F": self.forward, "B": self.backward, "U": self.update}[action.kind]
        return table[stage] + (self.overhead if action.kind != "U" else 0.0)


@dataclass(frozen=True)
class Span:
    """When one action ran (or would run) on one stage."""

    stage: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """Spans per stage, from the simulator or from a real run's log."""

    schedule: Schedule
    spans: tuple[tuple[Span, ...], ...]

    @property
    def makespan(self) -> float:
        return max((s.end for stage in self.spans for s in stage), default=0.0)

    @property
    def per_minibatch(self) -> float:
        """Mean seconds per mini-batch over the run."""
        return self.makespan / self.schedule.minibatches

    def busy(self, stage: int) -> float:
        return sum(s.end - s.start for s in self.spans[stage])

    @property
    def bubble_fraction(self) -> float:
        """The share of stage-time spent idle between time 0 and the last action's end."""
        total = self.makespan * len(self.spans)
        if total == 0:
            return 0.0
        return 1.0 - sum(self.busy(k) for k in range(len(self.spans))) / total

    def action_times(self, statistic: Callable[[list[float]], float] = statistics.median,
                     transfer: float = 0.0) -> StageTimes:
        """Each stage's forward, backward and update durations summarised by
        ``statistic``: stage times for the simulator, from a real run's timeline."""
        durations: dict[tuple[int, str], list[float]] = {}
        for k, spans in enumerate(self.spans):
            for span in spans:
                durations.setdefault((k, span.action.kind), []).append(span.end - span.start)
        forward, backward, update = (
            tuple(statistic(durations.get((k, kind), [0.0])) for k in range(len(self.spans)))
            for kind in "FBU")
        return StageTimes(forward, backward, update, transfer)

    def render(self, unit: float | None = None, until: float | None = None,
               since: float = 0.0) -> str:
        """One row per stage, one cell per ``unit`` seconds (default: the shortest action),
        idle cells as dots, from time ``since`` to ``until`` (default: the end):
        ``stage 0: F0 F1 .. .. B0 B0 U0``."""
        durations = [s.end - s.start for stage in self.spans for s in stage if s.end > s.start]
        if unit is None:
            unit = min(durations, default=1.0)
        if unit <= 0:
            raise ValueError(f"a cell must last a positive time, not {unit}")
        end = self.makespan if until is None else min(until, self.makespan)
        cells = max(1, round((end - since) / unit))
        t = self.schedule.micro_batches
        width = max((len(s.action.label(t)) for stage in self.spans for s in stage), default=2)
        rows = []
        for k, stage in enumerate(self.spans):
            row = ["." * width] * cells
            for span in stage:
                if span.end <= span.start:
                    continue  # an instant (an update that costs nothing) takes no cell
                first = round((span.start - since) / unit)
                last = max(first + 1, round((span.end - since) / unit))
                for c in range(max(first, 0), min(last, cells)):
                    row[c] = span.action.label(t).ljust(width)
            rows.append(f"stage {k}: " + " ".join(row))
        return "\n".join(rows)


def _inputs(action: Action, stage: int, depth: int) -> list[tuple[str, int]]:
    """The (kind, stage) whose same micro-batch must be done first, across a link."""
    if action.kind == "F" and stage > 0:
        return [("F", stage - 1)]
    if action.kind == "B" and stage < depth - 1:
        return [("B", stage + 1)]
    return []


def simulate(schedule: Schedule, times: StageTimes,
             shared: Sequence[Sequence[int]] = ()) -> Timeline:
    """The timeline of ``schedule`` with these stage times; ScheduleError on a deadlock.
    ``shared`` lists, per weight that several stages hold, those stages
    (``SharedWeight.stages``): their updates wait for each other."""
    depth = schedule.depth
    if any(not 0 <= k < depth for stages in shared for k in stages):
        raise ValueError(f"shared weights must be held by stages 0 to {depth - 1}, not "
                         f"{[list(stages) for stages in shared]}")
    # Each stage's fellow holders of any weight it shares, itself included.
    holders = {k: {h for stages in shared if k in stages for h in stages}
               for k in range(depth)}
    reached: dict[tuple[int, int], float] = {}  # (stage, mini-batch): at its update
    for name, values in (("forward", times.forward), ("backward", times.backward),
                         ("update", times.update)):
        if len(values) != depth or any(v < 0 or math.isnan(v) for v in values):
            raise ValueError(f"{name} times must be {depth} non-negative numbers, not {values}")
    done: dict[tuple[str, int, int, int | None], float] = {}
    free = [0.0] * depth
    position = [0] * depth
    spans: list[list[Span]] = [[] for _ in range(depth)]
    remaining = sum(len(s) for s in schedule.stages)
    while remaining:
        progressed = False
        for k, actions in enumerate(schedule.stages):
            while position[k] < len(actions):
                action = actions[position[k]]
                keys = [(kind, src, action.minibatch, action.micro)
                        for kind, src in _inputs(action, k, depth)]
                if any(key not in done for key in keys):
                    break
                start = max([free[k]] + [done[key] + times.transfer for key in keys])
                if action.kind == "U" and len(holders[k]) > 1:
                    reached.setdefault((k, action.minibatch), start)
                    arrivals = [reached.get((h, action.minibatch)) for h in holders[k]]
                    if None in arrivals:
                        break
                    # The work starts with the last holder; the wait before is idle.
                    start = max(a for a in arrivals if a is not None)
                end = start + times.duration(k, action)
                done[(action.kind, k, action.minibatch, action.micro)] = end
                spans[k].append(Span(k, action, start, end))
                free[k] = end
                position[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            waiting = ", ".join(
                f"stage {k} at {actions[position[k]].label(schedule.micro_batches)}"
                for k, actions in enumerate(schedule.stages) if position[k] < len(actions))
            raise ScheduleError(f"schedule {schedule.name!r} deadlocks: {waiting} wait on "
                                "each other")
    return Timeline(schedule, tuple(tuple(s) for s in spans))


def spans_of(schedule: Schedule, per_stage: Sequence[Sequence[tuple[float, float]]]) -> Timeline:
    """A timeline from measured (start, end) pairs, one per action in schedule order."""
    spans = []
    for k, (actions, measured) in enumerate(zip(schedule.stages, per_stage, strict=True)):
        if len(actions) != len(measured):
            raise ValueError(f"stage {k} ran {len(measured)} actions; its list has "
                             f"{len(actions)}")
        spans.append(tuple(Span(k, a, s, e) for a, (s, e) in zip(actions, measured,
                                                                    strict=True)))
    return Timeline(schedule, tuple(spans))
