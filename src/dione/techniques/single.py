"""``single``: the whole task on one device; the reference every exact technique matches."""

from __future__ import annotations

from torch import nn

from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.techniques.base import Knobs
from dione.techniques.context import SliceContext
from dione.techniques.data_parallel import DataParallelTechnique

__all__ = ["Single"]


class Single(DataParallelTechnique):
    name = "single"
    needs_process_group = False

    def check(self, task: Task, devices: int, knobs: Knobs, kind: DeviceKind) -> list[str]:
        reasons = super().check(task, devices, knobs, kind)
        if devices != 1:
            reasons.append(f"{self.name} trains on exactly 1 device, not {devices}; use ddp or "
                           "fsdp")
        return reasons

    def wrap(self, model: nn.Module, ctx: SliceContext) -> nn.Module:
        return model
