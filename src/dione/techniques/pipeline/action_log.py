"""The action log of a pipeline stage under torch's schedules: when each forward,
backward and update ran (the work, not the waits), so a slice's outcome holds its real
timeline for the report and the simulator."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dione.schedules import Action, Schedule
from dione.schedules.actions import Kind

__all__ = ["ActionLog", "on_one_clock"]


def on_one_clock(
    origins: Sequence[float], per_stage: Sequence[Sequence[tuple[float, float]]],
) -> list[list[tuple[float, float]]]:
    """Each stage's (start, end) spans, logged in seconds from that stage's own
    ``origin``, in seconds from the earliest origin instead (``time.perf_counter`` is
    one clock for every process of a machine)."""
    start = min(origins)
    return [[(a + origin - start, b + origin - start) for a, b in spans]
            for origin, spans in zip(origins, per_stage, strict=True)]


class ActionLog:
    """The forwards, backwards and updates one stage ran, in order, each with the
    seconds from ``origin`` at which its work began and ended. torch's schedules wait
    for a stage's inputs before they call it, so the waits stay out."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.actions: list[Action] = []
        self.spans: list[tuple[float, float]] = []
        self.minibatch = 0
        self._update_began: float | None = None
        self._forward_ended = False  # the last action logged is a forward

    def watch(self, stage: Any) -> None:
        """Time ``stage``'s forwards and backwards, and mark where the update begins: at
        the gradients' scaling, the last thing torch's step does."""
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk
        reduce = stage.perform_reduce_grad

        def timed(kind: Kind, method: Callable[..., Any]) -> Callable[..., Any]:
            def run(chunk: int, *args: Any, **kwargs: Any) -> Any:
                begin = time.perf_counter() - self.origin
                result = method(chunk, *args, **kwargs)
                self.actions.append(Action(kind, self.minibatch, chunk))
                self.spans.append((begin, time.perf_counter() - self.origin))
                self._forward_ended = kind == "F"
                return result
            return run

        def scale(*args: Any, **kwargs: Any) -> Any:
            self._update_began = time.perf_counter()
            return reduce(*args, **kwargs)

        # Instance attributes shadow the methods the schedule calls.
        setattr(stage, "forward_one_chunk", timed("F", forward))  # noqa: B010
        setattr(stage, "backward_one_chunk", timed("B", backward))  # noqa: B010
        setattr(stage, "perform_reduce_grad", scale)  # noqa: B010

    def timed_loss(self, loss: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """``loss`` counted with the forward it follows (the last stage's). torch also
        calls it once on its own, to infer shapes before the first step: not counted."""

        def run(output: Any, target: Any, **kwargs: Any) -> torch.Tensor:
            value = loss(output, target, **kwargs)
            if self._forward_ended:
                begin, _ = self.spans[-1]
                self.spans[-1] = (begin, time.perf_counter() - self.origin)
                self._forward_ended = False
            return value

        return run

    def update_done(self, step_returned: float, shared_wait: float = 0.0) -> None:
        """The optimizer step of this mini-batch is done: log the update. ``shared_wait``:
        the seconds its shared weights' gradients took to sum (mostly waiting for the
        other stages holding them to reach their update), left out of its work (the
        span starts that much later): the simulator adds that wait itself."""
        began = step_returned if self._update_began is None else self._update_began
        began += shared_wait
        self.actions.append(Action("U", self.minibatch))
        self.spans.append((began - self.origin, time.perf_counter() - self.origin))
        self._update_began = None
        self._forward_ended = False
        self.minibatch += 1

    def matches(self, schedule: Schedule, stage: int) -> str | None:
        """None if the stage ran exactly its list in ``schedule``, else what differs."""
        expected = list(schedule.stages[stage])
        if self.actions == expected:
            return None
        first = next((k for k, (a, b) in enumerate(zip(self.actions, expected, strict=False))
                      if a != b), min(len(self.actions), len(expected)))
        ran = self.actions[first] if first < len(self.actions) else "nothing"
        due = expected[first] if first < len(expected) else "nothing"
        return (f"stage {stage} ran {ran} where dione's {schedule.name} list has {due} "
                f"(action {first}); no timeline kept")
