"""The training loop shared by the data-parallel techniques (single, DDP, FSDP).

Each rank runs the whole model on its equal share of the global batch; the wrapper a
technique puts around the model averages gradients over ranks, so each optimizer
step sees the global batch's mean gradient, as on one device.
"""

from __future__ import annotations

import time
from abc import abstractmethod

import torch
from torch import nn

from dione.techniques.base import SliceContext, SliceOutcome, Technique
from dione.techniques.batches import BatchSource

__all__ = ["DataParallelTechnique"]


class DataParallelTechnique(Technique):
    """A technique that differs from the others only in how it wraps the model."""

    @abstractmethod
    def wrap(self, model: nn.Module, ctx: SliceContext) -> nn.Module:
        """The model as this technique trains it (the original module's FQNs kept)."""

    def train(self, ctx: SliceContext) -> SliceOutcome:
        task, spec = ctx.task, ctx.spec
        source = BatchSource(ctx.dataset, task.batch_size, task.seed, ctx.rank, ctx.world)
        ctx.timings["data_ready"] = time.perf_counter()
        model = self.wrap(ctx.build_model(), ctx)
        optimizer, scheduler = ctx.start_training(model)
        losses: list[torch.Tensor] = []
        step_seconds: list[float] = []
        last = time.perf_counter()
        for step in range(spec.start_step, spec.end_step):
            inputs, target = source.batch(step)
            loss = task.loss(model(ctx.to_device(inputs)), ctx.to_device(target))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            losses.append(loss.detach())
            ctx.step_done(losses[-1])
            now = time.perf_counter()
            step_seconds.append(now - last)
            last = now
        checkpoint = ctx.save(model, optimizer, scheduler)
        return ctx.outcome(losses, step_seconds, checkpoint)
