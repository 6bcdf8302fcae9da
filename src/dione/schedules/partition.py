"""Cut a model into K contiguous stages of about equal cost (pure: no devices, no timing).

A pipeline cuts between a model's blocks (``dione.schedules.stage_plan``): the top-level
layers of an ``nn.Sequential``, or the repeated blocks of an embeddings → blocks → head
model, with the embeddings' cost counted in the first block and the head's in the last.
Each block has a cost (its parameter count, or its measured time, as torchgpipe's
``balance_by_time`` does); the cut minimises the most expensive stage, exactly, by
dynamic programming. A task's ``split_points`` (full names of blocks a stage may begin
at: ``"2"`` for a Sequential, ``"transformer.h.2"`` for GPT-2) and the runtime (a stage
sends tensors only) restrict where the cuts may go. Every stage gets a block with
trainable parameters, so every stage has something to optimise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from dione.schedules.stage_plan import StagePlan, find_stage_plan

__all__ = ["Partition", "PartitionError", "balance", "parameter_costs", "partition_model",
           "pipeline_layers"]


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


def stage_plan(model: nn.Module, task: str) -> StagePlan:
    """The model's stage plan, or a PartitionError naming the task and the way out."""
    try:
        return find_stage_plan(model)
    except ValueError as err:
        raise PartitionError(f"task {task!r}: pipelines cut a model between its blocks, and "
                             f"{err}") from None


def pipeline_layers(model: nn.Module, task: str) -> list[tuple[str, nn.Module]]:
    """The blocks stages are made of, by full name, in order."""
    modules = dict(model.named_modules())
    return [(name, modules[name]) for name in stage_plan(model, task).blocks]


def parameter_costs(layers: Sequence[nn.Module], model: nn.Module | None = None) -> list[float]:
    """Each block's number of trainable parameter elements; with ``model``, the first
    block also counts the parameters outside the blocks that run before them, the last
    those that run after (a weight shared by both counts once, in the first)."""
    costs = [float(sum(p.numel() for p in m.parameters() if p.requires_grad)) for m in layers]
    if model is None or isinstance(model, nn.Sequential) or not costs:
        return costs
    plan = find_stage_plan(model)
    modules = dict(model.named_modules())
    counted = {id(p) for m in layers for p in m.parameters()}
    for index, paths in ((0, plan.first), (-1, plan.last)):
        for path in paths:
            for p in modules[path].parameters():
                if p.requires_grad and id(p) not in counted:
                    counted.add(id(p))
                    costs[index] += p.numel()
    return costs


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


def partition_model(
    model: nn.Module,
    stages: int,
    task: str,
    costs: Sequence[float] | None = None,
    split_points: Sequence[str] | None = None,
    starts: set[int] | None = None,
) -> Partition:
    """Cut ``model`` into ``stages`` stages by ``costs`` (default: parameter counts);
    ``starts``: the block indices a stage may begin at for the runtime (None: any)."""
    layers = pipeline_layers(model, task)
    names = tuple(name for name, _ in layers)
    if stages > len(layers):
        raise PartitionError(
            f"task {task!r}: its model has {len(layers)} blocks ({', '.join(names)}), "
            f"too few for {stages} pipeline stages; use at most {len(layers)} devices for a "
            "pipeline, or write the model as more, smaller blocks")
    cuts = None
    if split_points:
        unknown = [p for p in split_points if p not in names]
        if unknown:
            raise PartitionError(
                f"task {task!r}: split points {unknown} are not blocks of its "
                f"model ({', '.join(names)}); name the blocks a stage may begin at")
        cuts = {names.index(p) for p in split_points} - {0}
        if len(cuts) < stages - 1:
            raise PartitionError(
                f"task {task!r} lets a pipeline cut only before {sorted(split_points)}: "
                f"at most {len(cuts) + 1} stages, not {stages}; add split points or use "
                "fewer devices")
    if starts is not None:
        cuts = (set(range(1, len(names))) if cuts is None else cuts) & starts
    modules = [m for _, m in layers]
    weights = list(costs) if costs is not None else parameter_costs(modules, model)
    if len(weights) != len(modules):
        raise ValueError(f"{len(weights)} costs for {len(modules)} layers")
    trainable = [any(p.requires_grad for p in m.parameters()) for m in modules]
    try:
        bounds = balance(weights, stages, cuts=cuts, needs=trainable)
    except ValueError:
        raise PartitionError(
            f"task {task!r}: no cut of its layers ({', '.join(names)}) into {stages} stages "
            "gives every stage trainable parameters"
            + (f" within its split points {sorted(split_points)}" if split_points else "")
            + (" where the previous block hands on a single tensor (a stage sends only "
               "tensors)" if starts is not None else "")
            + "; use fewer devices for a pipeline") from None
    return Partition(names, bounds)
