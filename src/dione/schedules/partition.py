"""Cut a sequence of blocks into K contiguous stages of about equal cost (pure data: no
torch, no devices, no timing).

Each block has a cost (its parameter count, or its measured time, as torchgpipe's
``balance_by_time`` does); the cut minimises the most expensive stage, exactly, by
dynamic programming, where cuts are allowed (a task's split points, the runtime's
tensor-only hand-offs) and giving every stage a block that needs one (trainable
parameters). Finding a model's blocks and costing them is the pipeline wing's
(``dione.techniques.pipeline.partition``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Partition", "PartitionError", "balance"]


class PartitionError(ValueError):
    """A model that cannot be cut into the stages asked for; says what to do instead."""


@dataclass(frozen=True)
class Partition:
    """Layer names in order and each stage's layers ``[start, end)``."""

    names: tuple[str, ...]
    bounds: tuple[tuple[int, int], ...]

    @property
    def stages(self) -> int:
        return len(self.bounds)

    def layers(self, stage: int) -> tuple[str, ...]:
        start, end = self.bounds[stage]
        return self.names[start:end]

    def describe(self, stage: int) -> str:
        names = self.layers(stage)
        return f"layers {names[0]}" + (f"-{names[-1]}" if len(names) > 1 else "")


def balance(
    costs: Sequence[float],
    stages: int,
    *,
    cuts: set[int] | None = None,
    needs: Sequence[bool] | None = None,
) -> tuple[tuple[int, int], ...]:
    """Contiguous ``[start, end)`` per stage minimising the largest stage cost.

    ``cuts``: the layer indices a stage may start at (None: any); ``needs``: layers of
    which each stage must hold at least one (None: no such rule). Ties go to the cut
    that puts less work in the last stages (which wait longest in a pipeline).
    """
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} layers into {stages} non-empty stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    marks = [0]
    for flag in needs if needs is not None else [True] * n:
        marks.append(marks[-1] + int(flag))

    def allowed(start: int, end: int) -> bool:
        cut_ok = start == 0 or cuts is None or start in cuts
        return cut_ok and marks[end] > marks[start]

    inf = float("inf")
    # best[k][i]: the smallest largest-stage cost of layers [0, i) in k stages.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    choice = [[-1] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for end in range(k, n + 1):
            for start in range(k - 1, end):
                if best[k - 1][start] == inf or not allowed(start, end):
                    continue
                value = max(best[k - 1][start], prefix[end] - prefix[start])
                if value < best[k][end] or (value == best[k][end] and start > choice[k][end]):
                    best[k][end], choice[k][end] = value, start
    if best[stages][n] == inf:
        raise ValueError("no cut satisfies the allowed cut points and gives every stage a "
                         "layer it needs")
    bounds = []
    end = n
    for k in range(stages, 0, -1):
        start = choice[k][end]
        bounds.append((start, end))
        end = start
    return tuple(reversed(bounds))
