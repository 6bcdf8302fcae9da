"""Pipeline schedules as data: for each stage, the ordered list of what it does.

An action is the forward (``F``) or backward (``B``) of one micro-batch on a stage, or
the stage's optimizer step (``U``) for one mini-batch. Micro-batch ``j`` of mini-batch
``i`` is written with its global index ``u = T*i + j`` (T micro-batches per mini-batch),
as in DESIGN.md's worked example. Communication is implied, not listed: a forward on
stage k > 0 receives its input from stage k-1, a backward on stage k < K-1 receives
its gradient from stage k+1; the simulator charges a transfer time on those edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Action", "Schedule", "ScheduleError", "gpipe", "one_f_one_b", "xpipe"]

Kind = Literal["F", "B", "U"]


class ScheduleError(ValueError):
    """A schedule that misses, repeats or misorders work, or cannot run (deadlock)."""


@dataclass(frozen=True)
class Action:
    """One unit of a stage's work; ``micro`` is None for an optimizer step."""

    kind: Kind
    minibatch: int
    micro: int | None = None

    def label(self, micro_batches: int) -> str:
        if self.micro is None:
            return f"U{self.minibatch}"
        return f"{self.kind}{self.minibatch * micro_batches + self.micro}"


@dataclass(frozen=True)
class Schedule:
    """``stages`` lists of actions; ``micro_batches`` per mini-batch, ``minibatches`` of them."""

    name: str
    micro_batches: int
    minibatches: int
    stages: tuple[tuple[Action, ...], ...]

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ScheduleError(f"schedule {self.name!r} is not valid: " + "; ".join(problems))

    @property
    def depth(self) -> int:
        return len(self.stages)

    def problems(self) -> list[str]:
        """Every way in which some stage does not do each piece of work exactly once, in
        an order it can (backward after forward, update after the mini-batch's backward)."""
        found = []
        want = {(i, j) for i in range(self.minibatches) for j in range(self.micro_batches)}
        for k, actions in enumerate(self.stages):
            forwards = [(a.minibatch, a.micro) for a in actions if a.kind == "F"]
            backwards = [(a.minibatch, a.micro) for a in actions if a.kind == "B"]
            updates = [a.minibatch for a in actions if a.kind == "U"]
            for kind, done in (("forward", forwards), ("backward", backwards)):
                if len(done) != len(set(done)) or set(done) != want:
                    found.append(f"stage {k} does not run each micro-batch's {kind} once")
            if sorted(updates) != list(range(self.minibatches)) or updates != sorted(updates):
                found.append(f"stage {k} does not update once per mini-batch, in order")
            seen: set[tuple[str, int, int | None]] = set()
            for a in actions:
                if a.kind == "B" and ("F", a.minibatch, a.micro) not in seen:
                    found.append(f"stage {k} runs {a.label(self.micro_batches)} before its "
                                 "forward")
                if a.kind == "U" and any(("B", a.minibatch, j) not in seen
                                         for j in range(self.micro_batches)):
                    found.append(f"stage {k} runs U{a.minibatch} before all of its backwards")
                seen.add((a.kind, a.minibatch, a.micro))
        return found

    def in_flight_peak(self, stage: int) -> int:
        """The most micro-batches whose forward ran on ``stage`` and backward did not yet:
        how many micro-batches' activations the stage holds at once."""
        live = peak = 0
        for a in self.stages[stage]:
            live += {"F": 1, "B": -1, "U": 0}[a.kind]
            peak = max(peak, live)
        return peak

    def minibatches_in_flight_peak(self, stage: int) -> int:
        """The most mini-batches whose first forward ran on ``stage`` and update did not
        yet: how many weight copies XPipe's stage holds at once (one per mini-batch)."""
        live = peak = 0
        for a in self.stages[stage]:
            if a.kind == "F" and a.micro == 0:
                live += 1
            elif a.kind == "U":
                live -= 1
            peak = max(peak, live)
        return peak

    def staleness(self) -> dict[tuple[int, int], int]:
        """For each (mini-batch i, stage k): how many of the stage's updates lie between
        the forward of i's first micro-batch (the bellwether) and i's own update,
        counted from the action lists. Updates land in mini-batch order, so i's update
        is applied to version i, and the bellwether saw version ``i - s``."""
        found = {}
        for k, actions in enumerate(self.stages):
            updates = 0
            for a in actions:
                if a.kind == "U":
                    updates += 1
                elif a.kind == "F" and a.micro == 0:
                    found[(a.minibatch, k)] = a.minibatch - updates
        return found

    def text(self) -> str:
        """The action lists, one row per stage (no timing: see ``Timeline.render``)."""
        return "\n".join(
            f"stage {k}: " + " ".join(a.label(self.micro_batches) for a in actions)
            for k, actions in enumerate(self.stages)
        )


def _check_sizes(stages: int, micro_batches: int, minibatches: int) -> None:
    if stages < 1 or micro_batches < 1 or minibatches < 1:
        raise ScheduleError(
            f"a schedule needs at least one stage, micro-batch and mini-batch, not "
            f"{stages} stages, {micro_batches} micro-batches, {minibatches} mini-batches")


def _per_minibatch(
    name: str, stages: int, micro_batches: int, minibatches: int,
    one: Iterable[tuple[int, Sequence[tuple[Kind, int]]]],
) -> Schedule:
    lists: list[list[Action]] = [[] for _ in range(stages)]
    order = dict(one)
    for i in range(minibatches):
        for k in range(stages):
            lists[k].extend(Action(kind, i, j) for kind, j in order[k])
            lists[k].append(Action("U", i))
    return Schedule(name, micro_batches, minibatches, tuple(tuple(s) for s in lists))


def gpipe(stages: int, micro_batches: int, minibatches: int = 1) -> Schedule:
    """GPipe: all forwards, then all backwards, then the update (a flush per mini-batch).
    Backwards run in micro-batch order, as torch's ``ScheduleGPipe`` runs them."""
    _check_sizes(stages, micro_batches, minibatches)
    forwards: list[tuple[Kind, int]] = [("F", j) for j in range(micro_batches)]
    backwards: list[tuple[Kind, int]] = [("B", j) for j in range(micro_batches)]
    one = ((k, forwards + backwards) for k in range(stages))
    return _per_minibatch("gpipe", stages, micro_batches, minibatches, one)


def one_f_one_b(stages: int, micro_batches: int, minibatches: int = 1) -> Schedule:
    """1F1B (PipeDream-Flush): stage k runs K-k-1 warm-up forwards, then alternates one
    forward and one backward, then drains its backwards; a flush per mini-batch. Stage k
    holds at most K-k micro-batches in flight, against GPipe's T."""
    _check_sizes(stages, micro_batches, minibatches)

    def order(k: int) -> list[tuple[Kind, int]]:
        warmup = min(stages - k - 1, micro_batches)
        actions: list[tuple[Kind, int]] = [("F", j) for j in range(warmup)]
        for j in range(warmup, micro_batches):
            actions += [("F", j), ("B", j - warmup)]
        actions += [("B", j) for j in range(micro_batches - warmup, micro_batches)]
        return actions

    return _per_minibatch("1f1b", stages, micro_batches, minibatches,
                          ((k, order(k)) for k in range(stages)))


def xpipe(stages: int, micro_batches: int, minibatches: int) -> Schedule:
    """XPipe: the micro-batches of all mini-batches form one stream, injected without a
    flush; stage k runs K-k warm-up forwards, then alternates one backward and one
    forward, and updates as soon as the last micro-batch of a mini-batch is back.
    The last mini-batches drain the pipeline (a slice ends with no work in flight)."""
    _check_sizes(stages, micro_batches, minibatches)
    total = micro_batches * minibatches

    def action(kind: Kind, u: int) -> Action:
        return Action(kind, u // micro_batches, u % micro_batches)

    lists = []
    for k in range(stages):
        warmup = min(stages - k, total)
        actions = [action("F", u) for u in range(warmup)]
        forward = warmup
        for u in range(total):
            actions.append(action("B", u))
            if u % micro_batches == micro_batches - 1:
                actions.append(Action("U", u // micro_batches))
            if forward < total:
                actions.append(action("F", forward))
                forward += 1
        lists.append(tuple(actions))
    return Schedule("xpipe", micro_batches, minibatches, tuple(lists))
