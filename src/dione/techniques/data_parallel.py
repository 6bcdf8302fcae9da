"""The training loop shared by the data-parallel techniques (single, DDP, FSDP).

Each rank runs the whole model on its equal share of the global batch; the wrapper a
technique puts around the model averages gradients over ranks, so each optimizer
step sees the global batch's mean gradient, as on one device.

Knob ``accumulation``: the share goes through the model in that many equal parts, one
after the other, their gradients summed (each part's loss divided by the number of
parts), and the ranks synchronise gradients only after the last part. The global
batch, and so the training, is unchanged; activations are held for one part at a
time, so memory falls as the knob rises.

A loss averaged over counted items (tokens) is weighed part by part
(``dione.spec.batch.ItemShare``): each rank counts the items of its parts, one
all-reduce of a number per step gives the global batch's count, and each part's mean is
scaled by its share of it, so the averaged gradient is the global batch's, as on one
device.
"""

from __future__ import annotations

import contextlib
import time
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from dione.spec.batch import ItemCounting, ItemShare, item_counting, loss_of, whole_if_whole
from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.techniques.base import Knobs, SliceOutcome, Technique
from dione.techniques.batches import BatchSource
from dione.techniques.context import SliceContext
from dione.techniques.exactness import (
    drew_since,
    generator_states,
    model_generator_states,
    own_generator_draws,
    resumed_draws,
    split_batch_exactness,
    split_inexactness,
    split_rounding,
)

__all__ = ["DataParallelTechnique"]


class DataParallelTechnique(Technique):
    """A technique that differs from the others only in how it wraps the model."""

    knobs: ClassVar[Mapping[str, Any]] = {"accumulation": 1}
    # Whether wrap puts new parameter objects in the model (fsdp's DTensor shards): the
    # optimizer factory then sees other objects than on the model as built.
    replaces_parameters: ClassVar[bool] = False

    @abstractmethod
    def wrap(self, model: nn.Module, ctx: SliceContext) -> nn.Module:
        """The model as this technique trains it (the original module's FQNs kept)."""

    def without_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """A context in which backward leaves gradients unsynchronised across ranks
        (every part of an accumulated step but the last)."""
        return contextlib.nullcontext()

    def update(self, ctx: SliceContext, optimizer: torch.optim.Optimizer,
               model: nn.Module) -> None:
        """One optimizer step on the wrapped model's gradients."""
        ctx.apply_update(optimizer, model.parameters())

    def batch_parts(self, devices: int, knobs: Knobs) -> tuple[int, str]:
        parts = knobs.get("accumulation", 1)
        if isinstance(parts, int) and parts > 1:
            return devices * parts, f"parts ({devices} device(s) x accumulation {parts})"
        return devices, "devices"

    def task_inexactness(self, task: Task, devices: int, knobs: Knobs) -> str | None:
        parts = knobs.get("accumulation", 1)
        if not isinstance(parts, int):
            return super().task_inexactness(task, devices, knobs)
        return (super().task_inexactness(task, devices, knobs)
                or split_inexactness(task, devices, parts))

    def check(self, task: Task, devices: int, knobs: Knobs, kind: DeviceKind) -> list[str]:
        reasons = super().check(task, devices, knobs, kind)
        parts = self.resolve(knobs).get("accumulation", 1)
        if isinstance(parts, int) and parts < 1:
            reasons.append(f"{self.name} knob 'accumulation' must be at least 1, not {parts}")
        return reasons

    def knob_settings(self, task: Task, devices: int, kind: DeviceKind) -> list[dict[str, Any]]:
        """The defaults, then accumulation 2 and 4 (tried only where fewer parts ran out
        of memory) where the share divides."""
        base = super().knob_settings(task, devices, kind)
        settings = list(base)
        for setting in base:
            settings += [{**setting, "accumulation": parts} for parts in (2, 4)
                         if not self.check(task, devices, {**setting, "accumulation": parts},
                                           kind)]
        return settings

    def lighter(self, knobs: Knobs) -> list[dict[str, Any]]:
        lighter = super().lighter(knobs)
        parts = knobs.get("accumulation", 1)
        if isinstance(parts, int) and parts > 1:
            lighter.append({**knobs, "accumulation": parts // 2})
        return lighter

    @staticmethod
    def item_shares(ctx: SliceContext, counting: ItemCounting | None, batches: list[Any],
                    parts: int) -> list[ItemShare | None]:
        """Each part's share of the global batch's counted items (None each: the loss
        counts samples); the count is summed over ranks."""
        if counting is None:
            return [None] * len(batches)
        counts = [counting.count(batch) for batch in batches]
        total = torch.tensor(float(sum(counts)), dtype=torch.float64, device=ctx.device)
        if ctx.world > 1:
            dist.all_reduce(total)
        return [ItemShare(n, whole_if_whole(float(total)), ctx.world * parts,
                          counting.keyword) for n in counts]

    def train(self, ctx: SliceContext) -> SliceOutcome:
        task, spec = ctx.task, ctx.spec
        parts = int(ctx.knobs.get("accumulation", 1))
        source = BatchSource(ctx.dataset, task.batch_size, task.seed, ctx.rank, ctx.world,
                             task.collate_fn)
        ctx.timings["data_ready"] = time.perf_counter()
        bare = ctx.build_model()
        statistics = split_inexactness(task, ctx.world, parts, bare)
        if statistics is not None and not task.allow_inexact:  # not seen on the meta device
            raise ValueError(f"task {task.name!r}: {statistics}; it trains only as single "
                             "would unless it sets allow_inexact=True")
        counting = item_counting(task, bare) if ctx.world * parts > 1 else None
        built = (groups_by_name(task.optimizer(bare.parameters()), bare)
                 if self.replaces_parameters else None)
        model = self.wrap(bare, ctx)
        optimizer, scheduler = ctx.start_training(model)
        if built is not None:
            refuse_regrouped(task, self.name, built, groups_by_name(optimizer, model))
        # Whether the forward draws random numbers, seen in the slice's first: a split
        # batch draws per share then, whatever the layer (validation's probe sees only
        # models it can build, of tasks that allow more than single).
        drew, watched = False, ctx.world * parts == 1
        # The generators the model keeps of its own: whether the slice drew from them
        # (one that only initialised the weights leaves training exact).
        own_before = model_generator_states(bare)
        for step in range(spec.start_step, spec.end_step):
            optimizer.zero_grad(set_to_none=True)
            total = torch.zeros((), device=ctx.device)
            batches = [source.batch(step, part, parts) for part in range(parts)]
            shares = self.item_shares(ctx, counting, batches, parts)
            for part, batch in enumerate(batches):
                batch = ctx.to_device(batch)
                sync = part == parts - 1
                before = None if watched else generator_states(ctx.device)
                with (contextlib.nullcontext() if sync else self.without_sync(model)):
                    with ctx.autocast():
                        loss = loss_of(model, task, batch, shares[part])
                    if before is not None:
                        drew, watched = drew_since(before, ctx.device), True
                    ctx.backward(loss / parts if parts > 1 else loss)
                total = total + loss.detach().float()
            self.update(ctx, optimizer, model)
            ctx.step_done(total / parts if parts > 1 else total, scheduler)
        own_drew = model_generator_states(bare) != own_before
        if own_before and ctx.world > 1:  # any rank's draw (rank 0's outcome is kept)
            drawn = torch.tensor(float(own_drew), device=ctx.device)
            dist.all_reduce(drawn, op=dist.ReduceOp.MAX)
            own_drew = bool(drawn.item())
        checkpoint = ctx.save(model, optimizer, scheduler)
        outcome = ctx.outcome(checkpoint)
        if ctx.world > 1 or parts > 1:  # the user's names, not the wrapper's
            note = split_batch_exactness(
                bare, task, drew=drew,
                # One process fetching single's items in single's order (accumulation from
                # the first step): a generator its data set keeps draws as single's.
                single_items=ctx.world == 1 and spec.start_step == 0,
                own_drew=own_drew) or split_rounding(task)
        else:  # a resumed slice fetches from a new data set, builds a new model: their
            # own generators anew
            note = (resumed_draws(task) or own_generator_draws(bare, own_drew)
                    if spec.start_step > 0 else None)
        if note:
            outcome.extra["exactness"] = note
        if self.shards_memory:  # no rank holds it whole: all evaluate it together
            ctx.evaluate_sharded(outcome, model)
        else:  # every rank holds the whole model, unwrapped: rank 0 evaluates it
            ctx.evaluate(outcome, bare if ctx.rank == 0 else None)
        return outcome


def groups_by_name(optimizer: torch.optim.Optimizer, model: nn.Module) -> dict[str, int]:
    """The parameter group each of ``model``'s parameters is in, by name (none: not
    optimised)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: i for i, group in enumerate(optimizer.param_groups)
            for p in group["params"] if id(p) in names}


def refuse_regrouped(task: Task, technique: str, built: Mapping[str, int],
                     wrapped: Mapping[str, int]) -> None:
    """ValueError where the optimizer factory groups the wrapped model's parameters
    otherwise than the model's as built: it picks them by what the wrapper's new
    parameter objects do not keep (their identity, an attribute of the user's that the
    wrapper did not carry over), and would train them at other settings unnoticed."""
    moved = sorted(n for n in built.keys() | wrapped.keys() if built.get(n) != wrapped.get(n))
    if moved:
        def where(groups: Mapping[str, int], name: str) -> str:
            return f"group {groups[name]}" if name in groups else "no group"

        said = ", ".join(f"{n} ({where(built, n)} as built, {where(wrapped, n)} under "
                         f"{technique})" for n in moved[:3])
        more = ", ..." if len(moved) > 3 else ""
        raise ValueError(
            f"task {task.name!r}: its optimizer factory puts {said}{more} "
            f"in other parameter groups under {technique} than on the model as built: "
            f"{technique} replaces each parameter with a shard of it, and the factory picks "
            "them by something the shard does not keep (the parameter objects themselves?); "
            "choose each group's parameters by what they are (p.dim(), their shape), or "
            "leave the technique out")
