"""``gpipe`` and ``1f1b``: the model cut into one stage per device, micro-batches piped through.

Built on ``torch.distributed.pipelining`` (``ScheduleGPipe``, ``Schedule1F1B``) with
stages made by hand (``dione.techniques.pipeline.stages``): every rank builds the model's
structure with its parameters on the meta device, cuts out its blocks (between the layers
of an ``nn.Sequential`` or the repeated blocks of a GPT-2-, Llama- or BERT-shaped model,
``dione.techniques.pipeline.stage_plan``) and gives only those storage on its device; on a fresh
start rank 0 builds the whole model on the host from the task's seed and sends each rank
its stage's values, so initial weights are single's (``dione.techniques.pipeline.stage_build``).
The stage keeps the original parameter names, so checkpoints stay technique-neutral: a
pipeline writes each stage's part of one state dict, and any technique reads it back.

Every stage gets the whole micro-batch (tensor, tuple or dict) and runs the model's own
forward on it, its input replaced by the previous stage's hidden state at its first
block, so the batch reaches the model and the loss by ``dione.spec.batch``'s
one rule: the task's ``loss`` on the last stage's output, or, with ``loss`` left out,
the model's own (a Hugging Face model given ``labels``).

Each step splits the global batch into ``micro_batches`` equal micro-batches; the loss
of each is its mean, and the schedule divides the accumulated gradients by their
number, so every step applies the global batch's mean gradient, as on one device. A
loss that averages over counted tokens (HF's, with ``-100`` labels) is weighed micro-batch
by micro-batch by its share of the batch's tokens (``dione.spec.batch.ItemShare``), so
the same holds for it.

A weight two stages use (tied embeddings) is kept by both; its gradients are summed on
the first of them, which steps it and sends the new value to the others
(``dione.techniques.pipeline.shared``). ``precision=bf16`` runs each stage's forward and the loss
under autocast; ``clip_grad_norm`` clips by the norm over all stages (each weight once).
``fp16`` is refused: its loss scaler would need an overflow check agreed by all stages
around torch's schedule, which scales no loss. Dropout makes a pipeline statistically,
not bitwise, equivalent to single (said in the outcome's ``extra["exactness"]``);
BatchNorm is refused (``dione.techniques.exactness``).

Every rank logs when each forward, backward and update of its stage ran (the work, not
the waits for inputs), so a slice's outcome holds its real timeline, as xpipe's does:
the report's and the simulator's view of what torch's schedule actually did.

Knobs: ``micro_batches``; ``activation_checkpointing`` (recompute each block of the
stage in backward); ``balance`` (``parameters``: equal parameter counts per stage;
``time``: equal measured time per stage, measured by rank 0; should timing fail, the
cut falls back to parameters and the outcome says so).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from dione.schedules import (
    Partition,
    PartitionError,
    Schedule,
    Timeline,
    gpipe,
    one_f_one_b,
    spans_of,
)
from dione.spec.batch import batch_rows, slice_batch, split_target
from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.techniques.base import Knobs, SliceOutcome, Technique
from dione.techniques.batches import BatchSource
from dione.techniques.context import SliceContext
from dione.techniques.exactness import (
    batch_norm_layers,
    split_batch_exactness,
    split_rounding,
    structure_only,
)
from dione.techniques.pipeline.action_log import ActionLog, on_one_clock
from dione.techniques.pipeline.balance import (
    BALANCES,
    block_times,
    cut_record,
    kept_partition,
    layer_times,
    tensor_starts,
)
from dione.techniques.pipeline.partition import partition_model, pipeline_layers, stage_plan
from dione.techniques.pipeline.shared import SharedGradients
from dione.techniques.pipeline.stage_build import (
    build_structure,
    copy_initial_values,
    device_bytes,
    host_model,
    materialise,
    on_device_for_forward,
    time_each_layer,
)
from dione.techniques.pipeline.stage_plan import StagePlan
from dione.techniques.pipeline.stages import (
    SharedWeight,
    StageModule,
    batch_fields,
    cut_stage,
    shared_weights,
)
from dione.techniques.recompute import checkpoint_activations
from dione.words import modules

__all__ = ["GPipe", "OneFOneB", "PipelineStagePart", "PipelineTechnique", "keep_stage",
           "micro_batch_counts"]

@dataclass
class PipelineStagePart:
    """A rank's stage: the cut model (optimise and checkpoint it), the module a runtime
    runs, the cut, its shared weights, and notes for the outcome."""

    model: nn.Module
    module: StageModule
    partition: Partition
    shared: SharedGradients
    notes: dict[str, Any] = field(default_factory=dict)


def keep_stage(model: nn.Sequential, partition: Partition, stage: int) -> nn.Sequential:
    """An ``nn.Sequential`` with every layer outside ``stage`` replaced by ``nn.Identity``
    (in place): a one-process stand-in for a stage, for references in tests."""
    mine = set(partition.layers(stage))
    for name in partition.names:
        if name not in mine:
            setattr(model, name, nn.Identity())
    return model


def micro_batch_counts(stages: int, batch_size: int) -> list[int]:
    """The micro-batch counts worth a trial on ``stages`` stages: 1, 2 and 4 per stage
    (more shrink the bubble, each doing less work), and where none of those divides the
    batch, its smallest divisor from ``stages`` up (a batch of 15 on 4 stages: 5), so a
    batch no device count divides still pipelines, as validation says it may."""
    counts = [stages, 2 * stages, 4 * stages]
    if isinstance(batch_size, int) and batch_size >= stages and not any(
            batch_size % m == 0 for m in counts):
        counts.append(next(m for m in range(stages, batch_size + 1) if batch_size % m == 0))
    return sorted(counts)


class PipelineTechnique(Technique):
    """One stage per device; subclasses choose the torch schedule and its data twin."""

    shards_memory = True
    memory_knobs: ClassVar[tuple[str, ...]] = ("activation_checkpointing",)
    knobs: ClassVar[Mapping[str, Any]] = {
        "micro_batches": 4, "activation_checkpointing": False, "balance": "parameters"}
    torch_schedule: ClassVar[str]
    # Whether every step's batch must have the first step's shapes (torch's pipeline
    # runtime fixes each stage's input and output shapes once).
    fixed_shapes: ClassVar[bool] = True

    def schedule(self, stages: int, micro_batches: int, minibatches: int = 1) -> Schedule:
        """The schedule as data, for the simulator."""
        raise NotImplementedError

    def real_timeline(self, extra: Mapping[str, Any], minibatches: int) -> Timeline:
        """The timeline a finished slice of ``minibatches`` steps logged (its outcome's
        ``extra``): every action of the schedule, when its work began and ended."""
        if not extra.get("spans"):
            raise ValueError(f"this {self.name} slice logged no timeline"
                             + (f": {extra['timeline_note']}" if "timeline_note" in extra
                                else ""))
        schedule = self.schedule(len(extra["spans"]), int(extra["micro_batches"]), minibatches)
        return spans_of(schedule, extra["spans"])

    def batch_parts(self, devices: int, knobs: Knobs) -> tuple[int, str]:
        return knobs.get("micro_batches", 0), "micro-batches"

    def rank_role(self, rank: int, world: int) -> str:
        return f"pipeline stage {rank} of {world}"

    def check(self, task: Task, devices: int, knobs: Knobs, kind: DeviceKind) -> list[str]:
        reasons = super().check(task, devices, knobs, kind)
        resolved = self.resolve(knobs)
        if devices < 2:
            reasons.append(f"{self.name} needs at least 2 devices, one per stage; on one "
                           "device use single")
        if task.precision == "fp16":
            reasons.append(
                f"{self.name} does not train in fp16: its loss scaler must skip a step on "
                "every stage when any stage's gradients overflow, which a pipeline's stages "
                "do not agree on; use bf16 (float32's range, no scaler)")
        micro = resolved["micro_batches"]
        if isinstance(micro, int) and micro < 1:
            reasons.append(f"{self.name} knob 'micro_batches' must be at least 1, not {micro}")
        if resolved["balance"] not in BALANCES:
            reasons.append(f"{self.name} knob 'balance' is one of {', '.join(BALANCES)}, "
                           f"not {resolved['balance']!r}")
        try:  # the structure only: a model on the meta device costs no memory
            with structure_only():
                model = task.model()
        except Exception:
            try:  # a factory meta cannot run: the stages will be built on the host
                model = build_structure(task).model
            except Exception:
                return reasons  # validation reports a model factory that raises
        norms = batch_norm_layers(model)
        if norms:
            reasons.append(
                f"task {task.name!r}: its model normalises by batch statistics ("
                f"{modules(norms)}), which a "
                f"pipeline computes per micro-batch (and torch's runtime moves once more on "
                f"placeholder inputs before the first step): not single's training; use "
                "single, or a norm without batch statistics (LayerNorm, GroupNorm)")
        if devices >= 2:
            try:
                plan = stage_plan(model, task.name)
                partition = partition_model(model, devices, task.name,
                                            split_points=task.split_points)
                shared = shared_weights(model, plan, partition, task.name)
            except PartitionError as err:
                reasons.append(str(err))
            else:
                reasons.extend(self.shared_problems(task, shared))
        return reasons

    def shared_problems(self, task: Task, shared: Sequence[SharedWeight]) -> list[str]:
        """Why this technique cannot train weights shared by stages (gpipe, 1f1b: it can)."""
        return []

    def knob_settings(self, task: Task, devices: int, kind: DeviceKind) -> list[dict[str, Any]]:
        if devices < 2:
            return []
        counts = micro_batch_counts(devices, task.batch_size)
        settings = [{"micro_batches": micro, "activation_checkpointing": False,
                     "balance": "time"} for micro in counts]
        # Recomputation (tried where the same setting without it ran out of memory) at
        # two micro-batches per stage, or at the batch's own divisor where it has one.
        settings += [{"micro_batches": micro, "activation_checkpointing": True,
                      "balance": "time"} for micro in counts if micro == 2 * devices
                     or micro % devices]
        return [s for s in settings if not self.check(task, devices, s, kind)]

    def _partition(self, model: nn.Module, plan: StagePlan, ctx: SliceContext,
                   sample: Any) -> tuple[Partition, str | None]:
        """The cut every rank agrees on: the task's kept cut into this many stages (its
        first such slice decided it), else one decided now; and a note when
        ``balance=time`` fell back to parameters."""
        task, micro = ctx.task, ctx.knobs["micro_batches"]
        if ctx.spec.cut is not None:
            return kept_partition(ctx.spec.cut, plan, ctx.world, task.name), None
        starts = tensor_starts(model, task, sample) if plan.sequential else None
        if ctx.knobs["balance"] == "parameters":
            return partition_model(model, ctx.world, task.name, split_points=task.split_points,
                                   starts=starts), None
        # By time: rank 0 measures, everyone cuts by its numbers (ranks must agree). The
        # device may not hold the whole model: each layer is put on it only while it runs.
        box: list[Any] = [None]
        if ctx.rank == 0:
            part = slice_batch(sample, 0, max(1, batch_rows(sample) // micro))
            try:
                batch = ctx.to_device(part)
                with ctx.autocast():
                    if plan.sequential:
                        layers = [m for _, m in pipeline_layers(model, task.name)]
                        box[0] = time_each_layer(
                            layers, split_target(task, batch)[0], ctx.device,
                            lambda one, x: layer_times(one, x, ctx.device))
                    else:
                        with on_device_for_forward(model, [*plan.first, *plan.blocks,
                                                           *plan.last], ctx.device):
                            box[0] = block_times(model, plan, task, batch, ctx.device)
            except Exception as err:  # a layer the timer cannot run: cut by parameters
                box[0] = f"balance=time failed ({type(err).__name__}: {err}); cut by parameters"
        dist.broadcast_object_list(box, src=0)
        if isinstance(box[0], str):
            return partition_model(model, ctx.world, task.name, split_points=task.split_points,
                                   starts=starts), box[0]
        return partition_model(model, ctx.world, task.name, costs=box[0],
                               split_points=task.split_points, starts=starts), None

    def build_stage(self, ctx: SliceContext, source: BatchSource) -> PipelineStagePart:
        """This rank's stage on its device, and nothing else there: the model built with
        its parameters on meta, cut to the stage, the stage's tensors materialised, valued
        as single's initial weights (sent by rank 0) or by the checkpoint
        (``dione.techniques.pipeline.stage_build``, which says what each rank holds where)."""
        task = ctx.task
        built = build_structure(task)
        agreed: list[Any] = [None] * ctx.world
        dist.all_gather_object(agreed, built.on_meta)
        if built.on_meta and not all(agreed):  # ranks must agree on where values come from
            built = build_structure(task, meta=False)
        model = built.model
        plan = stage_plan(model, task.name)
        sample = source.global_batch(ctx.spec.start_step)
        partition, note = self._partition(model, plan, ctx, sample)
        shared = shared_weights(model, plan, partition, task.name)
        # The whole model's, before the cut; a data set's own generator has drawn for
        # the sample batch above already (0.028 from single's losses: review).
        exactness = split_batch_exactness(model, task, fetched_in_shares=False) or (
            split_rounding(task) if ctx.knobs["micro_batches"] > 1 else None)
        cut_stage(model, plan, partition, ctx.rank)
        if ctx.knobs.get("activation_checkpointing"):
            for name in partition.layers(ctx.rank):
                checkpoint_activations(model.get_submodule(name))
        materialise(model, ctx.device)
        if built.on_meta and ctx.spec.resume_from is None:
            # A fresh start: single's initial weights, built once, on rank 0's host.
            initial = host_model(task) if ctx.rank == 0 else None
            copy_initial_values(model, initial, ctx.rank, ctx.world, ctx.device)
            del initial
        stage_bytes: list[Any] = [None] * ctx.world
        dist.all_gather_object(stage_bytes, device_bytes(model))
        _, structure = batch_fields(sample)
        module = StageModule(model, ctx.task, plan, partition, ctx.rank, structure,
                             ctx.autocast)
        notes: dict[str, Any] = {
            "stage_build": "meta" if built.on_meta else f"whole model on the host: {built.reason}",
            # Per stage, the bytes of parameters and buffers on its device.
            "stage_bytes": stage_bytes}
        if note:
            notes["balance_note"] = note
        if exactness:
            notes["exactness"] = exactness
        if shared:
            notes["shared_weights"] = [f"{w.name}: stages {list(w.stages)}" for w in shared]
            # The same, as data: the schedule simulator makes these stages' updates wait
            # for each other, as the collective that sums the gradients does.
            notes["shared_stages"] = [list(w.stages) for w in shared]
        return PipelineStagePart(model, module, partition, SharedGradients(shared, model,
                                                                           ctx.rank), notes)

    def train(self, ctx: SliceContext) -> SliceOutcome:
        # Imported here, in the workers only: it is slow to import.
        from torch.distributed import pipelining

        task, spec = ctx.task, ctx.spec
        last = ctx.rank == ctx.world - 1
        source = BatchSource(ctx.dataset, task.batch_size, task.seed, collate=task.collate_fn)
        ctx.timings["data_ready"] = time.perf_counter()
        part = self.build_stage(ctx, source)
        model = part.model
        stage = pipelining.PipelineStage(part.module, ctx.rank, ctx.world, ctx.device)
        log = ActionLog()
        log.watch(stage)
        schedule_class = getattr(pipelining, self.torch_schedule)
        # The last stage's module returns the micro-batch's loss itself.
        runner = schedule_class(stage, n_microbatches=ctx.knobs["micro_batches"],
                                loss_fn=log.timed_loss(_its_own_loss), scale_grads=True)
        optimizer, scheduler = ctx.start_training(model)
        part.shared.forget_state(optimizer)
        part.module.unchecked = 1  # torch's shape inference, on placeholder inputs
        # Sample positions, split like the batch: the target torch hands the loss (unused).
        rows = torch.arange(task.batch_size, device=ctx.device)
        for step in range(spec.start_step, spec.end_step):
            batch = source.global_batch(step)
            part.module.count_items(batch, ctx.knobs["micro_batches"])
            fields, _ = batch_fields(ctx.to_device(batch))
            optimizer.zero_grad(set_to_none=True)
            micro_losses: list[torch.Tensor] = []
            try:
                if last:
                    runner.step(target=rows, losses=micro_losses, return_outputs=False,
                                **fields)
                else:
                    runner.step(**fields)
            except RuntimeError as err:
                # torch wraps the stage's own error in "[Stage k] failed to run ...":
                # report the user's exception, with its traceback, as the cause.
                if "failed to run" in str(err) and isinstance(err.__cause__, Exception):
                    raise err.__cause__ from None
                raise
            part.module.verify = False
            returned = time.perf_counter()
            part.shared.to_owner()
            summed = time.perf_counter()
            ctx.apply_update(optimizer, model.parameters(), group=dist.group.WORLD)
            part.shared.from_owner()
            # Equal micro-batches: the mean of their mean losses is the batch's mean loss.
            ctx.step_done(torch.stack(micro_losses).mean() if last else None, scheduler)
            log.update_done(returned, shared_wait=summed - returned)
        checkpoint = ctx.save(model, optimizer, scheduler)
        outcome = ctx.outcome(checkpoint, loss_ranks=[ctx.world - 1])
        outcome.extra["stages"] = [part.partition.describe(k)
                                   for k in range(part.partition.stages)]
        outcome.extra["cut"] = cut_record(part.partition)
        outcome.extra.update(part.notes)
        steps = spec.end_step - spec.start_step
        mismatch = log.matches(self.schedule(ctx.world, ctx.knobs["micro_batches"], steps),
                               ctx.rank)
        gathered: list[Any] = [None] * ctx.world
        dist.all_gather_object(gathered, (log.origin, log.spans, mismatch))
        notes = [note for _, _, note in gathered if note]
        if notes:  # a torch whose schedule differs from the list: say so, train on
            outcome.extra["timeline_note"] = "; ".join(notes)
        else:
            outcome.extra["micro_batches"] = ctx.knobs["micro_batches"]
            # Per stage, each action's (start, end) of work, from the first stage's start.
            outcome.extra["spans"] = on_one_clock([o for o, _, _ in gathered],
                                                  [s for _, s, _ in gathered])
        ctx.evaluate_stages(outcome, model)
        return outcome


def _its_own_loss(output: torch.Tensor, target: Any) -> torch.Tensor:
    """The loss the last stage's module computed (the task's, or the model's own)."""
    return output


class GPipe(PipelineTechnique):
    name = "gpipe"
    torch_schedule = "ScheduleGPipe"

    def schedule(self, stages: int, micro_batches: int, minibatches: int = 1) -> Schedule:
        return gpipe(stages, micro_batches, minibatches)


class OneFOneB(PipelineTechnique):
    name = "1f1b"
    torch_schedule = "Schedule1F1B"

    def check(self, task: Task, devices: int, knobs: Knobs, kind: DeviceKind) -> list[str]:
        reasons = super().check(task, devices, knobs, kind)
        micro = self.resolve(knobs)["micro_batches"]
        if isinstance(micro, int) and 1 <= micro < devices:
            # torch's Schedule1F1B refuses it at run time; say so before anything starts.
            reasons.append(f"1f1b needs at least as many micro-batches ({micro}) as stages "
                           f"({devices}): its warm-up fills every stage; use gpipe, or "
                           f"micro_batches >= {devices}")
        return reasons

    def schedule(self, stages: int, micro_batches: int, minibatches: int = 1) -> Schedule:
        return one_f_one_b(stages, micro_batches, minibatches)
