"""Cut a model into K contiguous stages of about equal cost.

A pipeline cuts between a model's blocks (``dione.techniques.pipeline.stage_plan``): the
top-level layers of an ``nn.Sequential``, or the repeated blocks of an embeddings →
blocks → head model, with the embeddings' cost counted in the first block and the
head's in the last. Each block costs its parameter count, or its measured time
(``dione.techniques.pipeline.balance``); ``dione.schedules.partition.balance`` makes the
cut. A task's ``split_points`` (full names of blocks a stage may begin at: ``"2"`` for a
Sequential, ``"transformer.h.2"`` for GPT-2) and the runtime (a stage sends tensors
only) restrict where the cuts may go. Every stage gets a block with trainable
parameters, so every stage has something to optimise.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from dione.schedules.partition import Partition, PartitionError, balance
from dione.techniques.pipeline.stage_plan import StagePlan, find_stage_plan

__all__ = ["parameter_costs", "partition_model", "pipeline_layers", "stage_plan"]


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
