"""``ddp``: a full replica per device, gradients averaged by DistributedDataParallel."""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.techniques.context import SliceContext
from dione.techniques.data_parallel import DataParallelTechnique

__all__ = ["DDP"]


class DDP(DataParallelTechnique):
    name = "ddp"

    def knob_settings(self, task: Task, devices: int, kind: DeviceKind) -> list[dict[str, Any]]:
        # On one device DDP is single with extra work: not worth a trial, unless the task
        # allows no single (it then trains alone only so; a task of ddp alone failed
        # with "ddp proposes no setting" where ddp on one device trains it exactly).
        if devices < 2 and task.allows("single"):
            return []
        return super().knob_settings(task, devices, kind)

    def wrap(self, model: nn.Module, ctx: SliceContext) -> nn.Module:
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        # Parameters a step leaves without a gradient (a head only evaluation uses)
        # make DDP wait for their gradients for ever, unless told to look for them (a
        # traversal of the graph each step: only where validation saw such parameters).
        return DistributedDataParallel(model, device_ids=device_ids,
                                       find_unused_parameters=any(ctx.task.unused_parameters))

    def without_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return model.no_sync()  # type: ignore[operator,no-any-return]
