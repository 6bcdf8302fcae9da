"""Costing a model's blocks for a pipeline's cut: each block's measured time (forward
within the model's own forward; or forward plus backward of an ``nn.Sequential``'s
layers), where a stage may begin (a stage sends tensors only), and a cut kept in the
run store, so that every later slice at K stages cuts as the first did."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from dione.schedules import Partition, PartitionError
from dione.spec.batch import loss_of, plain_batch, split_target
from dione.spec.task import Task
from dione.techniques.pipeline.stage_plan import StagePlan
from dione.techniques.pipeline.stages import meta_twin

__all__ = ["BALANCES", "block_times", "cut_record", "kept_partition", "layer_times",
           "tensor_starts"]

BALANCES = ("parameters", "time")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def layer_times(layers: Sequence[nn.Module], sample: Any, device: torch.device,
                repeats: int = 3) -> list[float]:
    """Median seconds of each layer's forward plus backward on ``sample`` (after one
    warm-up), each layer fed the previous one's output. A layer may take and return a
    tuple (an ``nn.LSTM`` returns ``(output, (h, c))``): its backward runs from every
    floating tensor in its output."""
    measured: list[list[float]] = [[] for _ in layers]
    for repeat in range(repeats + 1):
        x = sample
        for index, layer in enumerate(layers):
            x = tree_map(lambda t: t.detach().requires_grad_(t.is_floating_point())
                         if isinstance(t, torch.Tensor) else t, x)
            _synchronize(device)
            begin = time.perf_counter()
            out = layer(x)
            roots = [t for t in _tensors(out) if t.requires_grad]
            if roots:
                torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])
            _synchronize(device)
            if repeat:
                measured[index].append(time.perf_counter() - begin)
            x = out
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return [statistics.median(m) for m in measured]


def block_times(model: nn.Module, plan: StagePlan, task: Task, batch: Any,
                device: torch.device, repeats: int = 3) -> list[float]:
    """Median seconds of each block's forward within the model's own forward on
    ``batch``; the time before the first block (embeddings) counts in it, the time after
    the last (head, loss) in the last. Backward is left out: it scales with the forward
    block for block, so the cut is the same."""
    blocks = [model.get_submodule(name) for name in plan.blocks]
    marks: list[float] = []

    def mark(*_: Any) -> None:
        _synchronize(device)
        marks.append(time.perf_counter())

    handles = [h for block in blocks for h in (block.register_forward_pre_hook(mark),
                                               block.register_forward_hook(mark))]
    measured: list[list[float]] = [[] for _ in blocks]
    try:
        for repeat in range(repeats + 1):
            marks.clear()
            with torch.no_grad():
                _synchronize(device)
                begin = time.perf_counter()
                loss_of(model, task, batch)
                _synchronize(device)
                end = time.perf_counter()
            if len(marks) != 2 * len(blocks):
                raise RuntimeError("the model's forward did not call each block once")
            if repeat:
                for index in range(len(blocks)):
                    measured[index].append(marks[2 * index + 1] - marks[2 * index])
                measured[0][-1] += marks[0] - begin
                measured[-1][-1] += end - marks[-1]
    finally:
        for handle in handles:
            handle.remove()
    return [statistics.median(m) for m in measured]


def tensor_starts(model: nn.Module, task: Task, batch: Any) -> set[int] | None:
    """The layers of an ``nn.Sequential`` a stage may begin at: those whose previous
    layer returns a single tensor (a stage sends tensors only). Traced on the meta
    device; None (no restriction) if the trace fails (the stage then says so at run
    time rather than train wrong)."""
    twin = meta_twin(model)
    inputs, _ = split_target(task, batch)
    x = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t,
                 plain_batch(inputs))
    starts = set()
    try:
        with torch.no_grad():
            for index, layer in enumerate(twin.children()):
                x = layer(x)
                if isinstance(x, torch.Tensor):
                    starts.add(index + 1)
    except Exception:
        return None
    return starts


def kept_partition(cut: Mapping[str, Any], plan: StagePlan, stages: int,
                   task: str) -> Partition:
    """A cut kept in the run store, checked against the model it is to cut now."""
    partition = Partition(tuple(cut["names"]), tuple(tuple(b) for b in cut["bounds"]))
    if partition.names != tuple(plan.blocks) or partition.stages != stages:
        raise PartitionError(
            f"task {task!r}: its kept cut into {partition.stages} stages is of the blocks "
            f"{', '.join(partition.names)}, but its model now has {', '.join(plan.blocks)}: "
            "the model changed since its first slice; train the changed model in a new run "
            "directory")
    return partition


def cut_record(partition: Partition) -> dict[str, Any]:
    """A cut as the run store keeps it (``RunStore.keep_cut``)."""
    return {"names": list(partition.names), "bounds": [list(b) for b in partition.bounds]}
