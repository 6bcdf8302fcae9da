"""``fsdp``: parameters, gradients and optimizer state sharded over devices (FSDP2).

Knobs: ``reshard_after_forward`` (free gathered parameters after forward, re-gather in
backward: less memory, more communication), ``activation_checkpointing`` (recompute
each block's activations in backward), ``cpu_offload`` (keep shards and optimizer state
in host memory; CUDA only).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.techniques.base import Knobs
from dione.techniques.context import SliceContext
from dione.techniques.data_parallel import DataParallelTechnique
from dione.techniques.marks import marks_by_name, put_marks
from dione.techniques.recompute import checkpoint_activations

__all__ = ["FSDP", "shard_units"]


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks sharded (and checkpointed) one by one: a Sequential's children, else the
    items of every ModuleList not inside another such item (experts inside a layer go
    with their layer: FSDP2 cannot shard a module after one around it, and checkpointing
    both would recompute the inner one twice); each with trainable parameters."""
    if isinstance(model, nn.Sequential):
        candidates = list(model)
    else:
        candidates = [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]
    units = [m for m in candidates if any(p.requires_grad for p in m.parameters())]
    inside = {id(sub) for unit in units for sub in unit.modules() if sub is not unit}
    return _untied([m for m in units if id(m) not in inside], model)


def _untied(units: list[nn.Module], model: nn.Module) -> list[nn.Module]:
    """``units`` less those holding a weight another unit or the root also holds (a
    Sequential whose output layer shares the embedding's weight): FSDP2 manages a
    parameter in one group only, so those go to the root's group with what it holds."""
    while True:
        owner: dict[int, int] = {}  # a module's id -> the index of its unit (-1: the root)
        for index, unit in enumerate(units):
            owner.update({id(sub): index for sub in unit.modules()})
        holders: dict[int, set[int]] = {}  # a parameter's id -> the units holding it
        for module in model.modules():
            for param in module.parameters(recurse=False):
                holders.setdefault(id(param), set()).add(owner.get(id(module), -1))
        tied = {i for held in holders.values() if len(held) > 1 for i in held if i >= 0}
        if not tied:
            return units
        units = [u for i, u in enumerate(units) if i not in tied]


# What torch's errors about a DTensor say (its sharding propagation, placements, a mix
# of plain tensors and DTensors, an operator with no sharding strategy).
_DTENSOR_WORDS = ("DTensor", "placement", "Sharding propagation", "sharding strategy",
                  "DeviceMesh")


def _about_dtensor(err: BaseException) -> bool:
    """Whether ``err`` is torch's about a DTensor: raised in its DTensor code, or saying
    so (some leave it bare: "aten.renorm_.default does not have a sharding strategy")."""
    import traceback

    where = os.path.join("torch", "distributed", "tensor", "")
    return any(where in frame.filename for frame in traceback.extract_tb(err.__traceback__)
               ) or any(word in str(err) for word in _DTENSOR_WORDS)


class FSDP(DataParallelTechnique):
    name = "fsdp"
    shards_memory = True
    replaces_parameters = True
    memory_knobs = ("reshard_after_forward", "activation_checkpointing", "cpu_offload")
    knobs: ClassVar[Mapping[str, Any]] = {
        "reshard_after_forward": True, "activation_checkpointing": False, "cpu_offload": False,
        "accumulation": 1}

    def check(self, task: Task, devices: int, knobs: Knobs, kind: DeviceKind) -> list[str]:
        reasons = super().check(task, devices, knobs, kind)
        if knobs.get("cpu_offload") and kind != "cuda":
            reasons.append("fsdp cpu_offload moves state from GPU to host memory; "
                           "on CPU devices there is nothing to offload: drop the knob")
        return reasons

    def knob_settings(self, task: Task, devices: int, kind: DeviceKind) -> list[dict[str, Any]]:
        if devices < 2 and kind != "cuda":
            return []  # one CPU device: nothing to shard, nothing to offload to
        settings = [
            {"reshard_after_forward": False, "activation_checkpointing": False,
             "cpu_offload": False, "accumulation": 1},
            {"reshard_after_forward": True, "activation_checkpointing": False,
             "cpu_offload": False, "accumulation": 1},
            {"reshard_after_forward": True, "activation_checkpointing": True,
             "cpu_offload": False, "accumulation": 1},
        ]
        if kind == "cuda":
            settings.append({"reshard_after_forward": True, "activation_checkpointing": True,
                             "cpu_offload": True, "accumulation": 1})
        # Accumulation after the other memory knobs: on the lightest setting so far.
        lightest = settings[-1]
        settings += [{**lightest, "accumulation": parts} for parts in (2, 4)]
        return [s for s in settings if not self.check(task, devices, s, kind)]

    def without_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        @contextlib.contextmanager
        def unsynced() -> Iterator[None]:
            # FSDP2: keep the part's gradients unreduced (and parameters gathered).
            model.set_requires_gradient_sync(False)  # type: ignore[operator]
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)  # type: ignore[operator]
        return unsynced()

    def update(self, ctx: SliceContext, optimizer: torch.optim.Optimizer,
               model: nn.Module) -> None:
        try:
            super().update(ctx, optimizer, model)
        except (RuntimeError, NotImplementedError) as err:
            # An optimizer written for plain tensors (Adafactor's in-place pow_ on a row
            # norm) fails on DTensor shards with a message about placements only. Any
            # other error (out of memory, the user's own) is said as it was.
            if isinstance(err, torch.OutOfMemoryError) or not _about_dtensor(err):
                raise
            name = type(optimizer).__name__
            raise RuntimeError(
                f"the optimizer {name} failed to step fsdp's parameters, which are DTensor "
                f"shards of each weight ({type(err).__name__}: {err}). If it steps under "
                f"single, {name} does not support DTensor: leave fsdp out of the task's "
                "techniques (techniques=(...) without 'fsdp'), or pick an optimizer that "
                "does (torch's Adam, AdamW, SGD)") from err

    def wrap(self, model: nn.Module, ctx: SliceContext) -> nn.Module:
        mesh = init_device_mesh(ctx.device.type, (ctx.world,))
        offload: OffloadPolicy = (CPUOffloadPolicy() if ctx.knobs["cpu_offload"]
                                  else OffloadPolicy())
        reshard = bool(ctx.knobs["reshard_after_forward"])
        # What the user set on a parameter (a tag its optimizer factory groups by: no
        # weight decay for biases) is set on the shard that replaces it too.
        marks = marks_by_name(model)
        for unit in shard_units(model):
            if ctx.knobs["activation_checkpointing"]:
                checkpoint_activations(unit)
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, offload_policy=offload)
        # The root's parameters are needed again at once in backward: never reshard them.
        fully_shard(model, mesh=mesh, reshard_after_forward=False, offload_policy=offload)
        put_marks(model, marks)
        if ctx.knobs["cpu_offload"]:
            torch.cuda.synchronize(ctx.device)
        return model
