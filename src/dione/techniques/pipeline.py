"""``gpipe`` and ``1f1b``: the model cut into one stage per device, micro-batches piped through.

Built on ``torch.distributed.pipelining`` (``ScheduleGPipe``, ``Schedule1F1B``) with
stages made by hand: every rank builds the whole model from the task's seed (so its
initial weights are single's), keeps its own layers and replaces the others with
``nn.Identity``. The stage keeps the original parameter names, so checkpoints stay
technique-neutral: a pipeline writes each stage's part of one state dict, and any
technique reads it back.

Each step splits the global batch into ``micro_batches`` equal micro-batches; the loss
of each is its mean, and the schedule divides the accumulated gradients by their
number, so every step applies the global batch's mean gradient, as on one device.

Every rank logs when each forward, backward and update of its stage ran (the work, not
the waits for inputs), so a slice's outcome holds its real timeline, as xpipe's does:
the report's and the simulator's view of what torch's schedule actually did.

Knobs: ``micro_batches``; ``activation_checkpointing`` (recompute each layer of the
stage in backward); ``balance`` (``parameters``: equal parameter counts per stage;
``time``: equal measured forward+backward time per stage, measured by rank 0).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from dione.schedules import (
    Action,
    Partition,
    PartitionError,
    Schedule,
    Timeline,
    gpipe,
    one_f_one_b,
    spans_of,
)
from dione.schedules.actions import Kind
from dione.schedules.partition import partition_model, pipeline_layers
from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.techniques.base import Knobs, SliceContext, SliceOutcome, Technique
from dione.techniques.batches import BatchSource
from dione.techniques.fsdp import checkpoint_activations

__all__ = ["ActionLog", "GPipe", "OneFOneB", "PipelineTechnique", "keep_stage", "layer_times",
           "on_one_clock"]

BALANCES = ("parameters", "time")


def keep_stage(model: nn.Module, partition: Partition, stage: int) -> nn.Module:
    """``model`` with every layer outside ``stage`` replaced by ``nn.Identity`` (in place):
    the stage's parameters keep the names they have in the whole model."""
    mine = set(partition.layers(stage))
    for name in partition.names:
        if name not in mine:
            setattr(model, name, nn.Identity())
    return model


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def layer_times(layers: Sequence[nn.Module], sample: torch.Tensor, device: torch.device,
                repeats: int = 3) -> list[float]:
    """Median seconds of each layer's forward plus backward on ``sample`` (after one
    warm-up), each layer fed the previous one's output."""
    measured: list[list[float]] = [[] for _ in layers]
    for repeat in range(repeats + 1):
        x = sample
        for index, layer in enumerate(layers):
            x = x.detach().requires_grad_(x.is_floating_point())
            _synchronize(device)
            begin = time.perf_counter()
            out = layer(x)
            out.backward(torch.ones_like(out))
            _synchronize(device)
            if repeat:
                measured[index].append(time.perf_counter() - begin)
            x = out
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return [statistics.median(m) for m in measured]


def on_one_clock(
    origins: Sequence[float], per_stage: Sequence[Sequence[tuple[float, float]]],
) -> list[list[tuple[float, float]]]:
    """Each stage's (start, end) spans, logged in seconds from that stage's own
    ``origin``, in seconds from the earliest origin instead (``time.perf_counter`` is
    one clock for every process of a machine)."""
    start = min(origins)
    return [[(a + origin - start, b + origin - start) for a, b in spans]
            for origin, spans in zip(origins, per_stage, strict=True)]


class ActionLog:
    """The forwards, backwards and updates one stage ran, in order, each with the
    seconds from ``origin`` at which its work began and ended. torch's schedules wait
    for a stage's inputs before they call it, so the waits stay out."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.actions: list[Action] = []
        self.spans: list[tuple[float, float]] = []
        self.minibatch = 0
        self._update_began: float | None = None
        self._forward_ended = False  # the last action logged is a forward

    def watch(self, stage: Any) -> None:
        """Time ``stage``'s forwards and backwards, and mark where the update begins: at
        the gradients' scaling, the last thing torch's step does."""
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk
        reduce = stage.perform_reduce_grad

        def timed(kind: Kind, method: Callable[..., Any]) -> Callable[..., Any]:
            def run(chunk: int, *args: Any, **kwargs: Any) -> Any:
                begin = time.perf_counter() - self.origin
                result = method(chunk, *args, **kwargs)
                self.actions.append(Action(kind, self.minibatch, chunk))
                self.spans.append((begin, time.perf_counter() - self.origin))
                self._forward_ended = kind == "F"
                return result
            return run

        def scale(*args: Any, **kwargs: Any) -> Any:
            self._update_began = time.perf_counter()
            return reduce(*args, **kwargs)

        # Instance attributes shadow the methods the schedule calls.
        setattr(stage, "forward_one_chunk", timed("F", forward))  # noqa: B010
        setattr(stage, "backward_one_chunk", timed("B", backward))  # noqa: B010
        setattr(stage, "perform_reduce_grad", scale)  # noqa: B010

    def timed_loss(self, loss: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """``loss`` counted with the forward it follows (the last stage's). torch also
        calls it once on its own, to infer shapes before the first step: not counted."""

        def run(output: Any, target: Any, **kwargs: Any) -> torch.Tensor:
            value = loss(output, target, **kwargs)
            if self._forward_ended:
                begin, _ = self.spans[-1]
                self.spans[-1] = (begin, time.perf_counter() - self.origin)
                self._forward_ended = False
            return value

        return run

    def update_done(self, step_returned: float) -> None:
        """The optimizer step of this mini-batch is done: log the update."""
        began = step_returned if self._update_began is None else self._update_began
        self.actions.append(Action("U", self.minibatch))
        self.spans.append((began - self.origin, time.perf_counter() - self.origin))
        self._update_began = None
        self._forward_ended = False
        self.minibatch += 1

    def matches(self, schedule: Schedule, stage: int) -> str | None:
        """None if the stage ran exactly its list in ``schedule``, else what differs."""
        expected = list(schedule.stages[stage])
        if self.actions == expected:
            return None
        first = next((k for k, (a, b) in enumerate(zip(self.actions, expected, strict=False))
                      if a != b), min(len(self.actions), len(expected)))
        ran = self.actions[first] if first < len(self.actions) else "nothing"
        due = expected[first] if first < len(expected) else "nothing"
        return (f"stage {stage} ran {ran} where dione's {schedule.name} list has {due} "
                f"(action {first}); no timeline kept")


class PipelineTechnique(Technique):
    """One stage per device; subclasses choose the torch schedule and its data twin."""

    shards_memory = True
    memory_knobs: ClassVar[tuple[str, ...]] = ("activation_checkpointing",)
    knobs: ClassVar[Mapping[str, Any]] = {
        "micro_batches": 4, "activation_checkpointing": False, "balance": "parameters"}
    torch_schedule: ClassVar[str]

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
        if task.loss is None:
            reasons.append(f"{self.name} needs the task's loss (its last stage computes it on "
                           "the model's output); this task's model computes its own")
        micro = resolved["micro_batches"]
        if isinstance(micro, int) and micro < 1:
            reasons.append(f"{self.name} knob 'micro_batches' must be at least 1, not {micro}")
        if resolved["balance"] not in BALANCES:
            reasons.append(f"{self.name} knob 'balance' is one of {', '.join(BALANCES)}, "
                           f"not {resolved['balance']!r}")
        if devices >= 2:
            try:  # the structure only: a model on the meta device costs no memory
                with torch.device("meta"):
                    model = task.model()
            except Exception:
                return reasons  # validation reports a model factory that raises
            try:
                partition_model(model, devices, task.name, split_points=task.split_points)
            except PartitionError as err:
                reasons.append(str(err))
        return reasons

    def knob_settings(self, task: Task, devices: int, kind: DeviceKind) -> list[dict[str, Any]]:
        if devices < 2:
            return []
        settings = []
        # More micro-batches shrink the bubble but each does less work; try a few.
        for micro in sorted({devices, 2 * devices, 4 * devices}):
            settings.append({"micro_batches": micro, "activation_checkpointing": False,
                             "balance": "time"})
        settings.append({"micro_batches": 2 * devices, "activation_checkpointing": True,
                         "balance": "time"})
        return [s for s in settings if not self.check(task, devices, s, kind)]

    def stage_loss(self, task: Task) -> Callable[[Any, Any], torch.Tensor]:
        """The loss the last stage computes (``check`` refuses a task without one)."""
        if task.loss is None:
            raise RuntimeError(f"{self.name} needs the task's loss")
        return task.loss

    def _partition(self, model: nn.Module, ctx: SliceContext, source: BatchSource) -> Partition:
        if ctx.knobs["balance"] == "parameters":
            return partition_model(model, ctx.world, ctx.task.name,
                                   split_points=ctx.task.split_points)
        # By time: rank 0 measures, everyone cuts by its numbers (ranks must agree).
        box: list[Any] = [None]
        if ctx.rank == 0:
            inputs, _ = source.global_batch(ctx.spec.start_step)
            sample = inputs[: max(1, len(inputs) // ctx.knobs["micro_batches"])]
            layers = [m for _, m in pipeline_layers(model, ctx.task.name)]
            # Timing runs the layers: put back any buffer it moves (batch-norm statistics).
            buffers = {name: b.clone() for name, b in model.named_buffers()}
            model.to(ctx.device)
            box[0] = layer_times(layers, ctx.to_device(sample), ctx.device)
            model.to("cpu")
            with torch.no_grad():
                for name, b in model.named_buffers():
                    b.copy_(buffers[name])
        dist.broadcast_object_list(box, src=0)
        return partition_model(model, ctx.world, ctx.task.name, costs=box[0],
                               split_points=ctx.task.split_points)

    def build_stage(self, ctx: SliceContext, source: BatchSource) -> tuple[nn.Module, Partition]:
        """This rank's stage on its device, cut from the whole model built from the seed
        on the host (so every stage starts from single's weights), and the partition."""
        model = ctx.build_model(on_device=False)
        partition = self._partition(model, ctx, source)
        keep_stage(model, partition, ctx.rank)
        if ctx.knobs.get("activation_checkpointing"):
            for name in partition.layers(ctx.rank):
                checkpoint_activations(getattr(model, name))
        return model.to(ctx.device), partition

    def train(self, ctx: SliceContext) -> SliceOutcome:
        # Imported here, in the workers only: it is slow to import.
        from torch.distributed import pipelining

        task, spec = ctx.task, ctx.spec
        first, last = ctx.rank == 0, ctx.rank == ctx.world - 1
        source = BatchSource(ctx.dataset, task.batch_size, task.seed)
        ctx.timings["data_ready"] = time.perf_counter()
        model, partition = self.build_stage(ctx, source)
        stage = pipelining.PipelineStage(model, ctx.rank, ctx.world, ctx.device)
        log = ActionLog()
        log.watch(stage)
        schedule_class = getattr(pipelining, self.torch_schedule)
        runner = schedule_class(stage, n_microbatches=ctx.knobs["micro_batches"],
                                loss_fn=log.timed_loss(self.stage_loss(task)),
                                scale_grads=True)
        optimizer, scheduler = ctx.start_training(model)
        losses: list[torch.Tensor] = []
        step_seconds: list[float] = []
        last_time = time.perf_counter()
        for step in range(spec.start_step, spec.end_step):
            inputs, target = source.global_batch(step)
            optimizer.zero_grad(set_to_none=True)
            micro_losses: list[torch.Tensor] = []
            try:
                if first:
                    runner.step(ctx.to_device(inputs))
                elif last:
                    runner.step(target=ctx.to_device(target), losses=micro_losses,
                                return_outputs=False)
                else:
                    runner.step()
            except RuntimeError as err:
                # torch wraps the stage's own error in "[Stage k] failed to run ...":
                # report the user's exception, with its traceback, as the cause.
                if "failed to run" in str(err) and isinstance(err.__cause__, Exception):
                    raise err.__cause__ from None
                raise
            returned = time.perf_counter()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            # Equal micro-batches: the mean of their mean losses is the batch's mean loss.
            losses.append(torch.stack(micro_losses).mean().detach() if last
                          else torch.zeros((), device=ctx.device))
            ctx.step_done(losses[-1] if last else None)
            log.update_done(returned)
            now = time.perf_counter()
            step_seconds.append(now - last_time)
            last_time = now
        checkpoint = ctx.save(model, optimizer, scheduler)
        outcome = ctx.outcome(losses, step_seconds, checkpoint, loss_ranks=[ctx.world - 1])
        outcome.extra["stages"] = [partition.describe(k) for k in range(partition.stages)]
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
        return outcome


class GPipe(PipelineTechnique):
    name = "gpipe"
    torch_schedule = "ScheduleGPipe"

    def schedule(self, stages: int, micro_batches: int, minibatches: int = 1) -> Schedule:
        return gpipe(stages, micro_batches, minibatches)


class OneFOneB(PipelineTechnique):
    name = "1f1b"
    torch_schedule = "Schedule1F1B"

    def schedule(self, stages: int, micro_batches: int, minibatches: int = 1) -> Schedule:
        return one_f_one_b(stages, micro_batches, minibatches)
