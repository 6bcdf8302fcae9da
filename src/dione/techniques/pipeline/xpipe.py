"""``xpipe``: asynchronous pipelining with weight prediction (Guan, Yin, Li, Lu 2019).

Our own runtime over ``torch.distributed`` point-to-point (gloo on CPU, NCCL on CUDA),
one stage per device, the stages cut as for ``gpipe``. Each rank walks its list of the
XPipe schedule (``dione.schedules.xpipe``): micro-batches of successive mini-batches
flow without a flush, and each stage applies its optimizer step as soon as the last
micro-batch of a mini-batch is back.

When the first micro-batch of mini-batch i (the bellwether) reaches stage k, the stage
makes a separate copy of its weights for i, predicted ``s`` updates ahead (``s``
counted from the schedule; see ``dione.techniques.pipeline.prediction``). All micro-batches of
i run forward and backward on that copy through ``torch.func.functional_call``; its
gradients are moved onto the real parameters at i's update, and the copy is dropped
there. Autograd never sees a weight change under it. The stage's runtime, its memory
bound and its point-to-point order are ``dione.techniques.pipeline.xpipe_stage``'s.

Stages are cut as ``gpipe``'s (``dione.techniques.pipeline.stages``): any batch shape, the task's
loss or the model's own, ``precision=bf16`` under autocast. A weight two stages share
(tied embeddings) gets the sum of their gradients at its update on each of them (a
collective between those stages: the later one waits for the earlier's update of the
same mini-batch), and both optimizers step it alike, so its copies stay identical and
both predict from the same optimizer state. ``clip_grad_norm`` is refused: the stages
update at different times, so there is no one global norm to clip by; ``fp16`` too.

Knobs: ``micro_batches`` (T); which weights a mini-batch runs on, three ways:

- ``prediction=true`` (default): XPipe, the bellwether's copy predicted ``s`` ahead;
- ``prediction=false``: weight stashing (PipeDream): the bellwether's copy as it is,
  used by all of the mini-batch's forwards and backwards, with no prediction;
- ``prediction=false, stashing=false``: no stashing, plain staleness: each forward and
  each backward runs on the weights the stage holds at that moment (no copy at all);

``balance`` (as ``gpipe``), ``log_prediction`` (record the prediction error at each
update; needs stashing).

A slice boundary drains the pipeline: the slice's mini-batches all finish, so the
checkpoint holds the real weights after the last update and any technique can resume
from it. The next slice starts with an empty pipeline, so its first mini-batches see
less staleness than steady state (as at the start of training).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from dione.schedules import Schedule, xpipe
from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.techniques.base import Knobs, SliceOutcome
from dione.techniques.batches import BatchSource
from dione.techniques.context import SliceContext
from dione.techniques.pipeline.action_log import on_one_clock
from dione.techniques.pipeline.balance import cut_record
from dione.techniques.pipeline.gpipe import PipelineTechnique, micro_batch_counts
from dione.techniques.pipeline.prediction import prediction_problem, scheduler_problem
from dione.techniques.pipeline.stage_build import build_structure
from dione.techniques.pipeline.xpipe_stage import XPipeStage

__all__ = ["XPipe"]


class XPipe(PipelineTechnique):
    name = "xpipe"
    exact = False
    # Each activation travels with its shape: mini-batches may differ in shape.
    fixed_shapes = False
    knobs: ClassVar[Mapping[str, Any]] = {
        "micro_batches": 4, "prediction": True, "stashing": True, "balance": "parameters",
        "log_prediction": False}

    def schedule(self, stages: int, micro_batches: int, minibatches: int = 1) -> Schedule:
        return xpipe(stages, micro_batches, minibatches)

    def rank_role(self, rank: int, world: int) -> str:
        return f"xpipe stage {rank} of {world}"

    def inexactness(self, knobs: Knobs) -> str | None:
        if knobs.get("prediction", True):
            how = ("each mini-batch runs on weights predicted from the optimizer's state, "
                   "not on those synchronous training would use (XPipe weight prediction)")
        elif knobs.get("stashing", True):
            how = "each mini-batch runs on weights up to s updates stale (weight stashing)"
        else:
            how = "each forward and backward runs on the stage's weights of the moment (stale)"
        return f"xpipe is asynchronous: {how}"

    def check(self, task: Task, devices: int, knobs: Knobs, kind: DeviceKind) -> list[str]:
        reasons = super().check(task, devices, knobs, kind)
        resolved = self.resolve(knobs)
        if not resolved["stashing"] and resolved["prediction"]:
            reasons.append("xpipe predicts weights into the copy it stashes: prediction=true "
                           "needs stashing=true (for no stashing, set prediction=false too)")
        if task.clip_grad_norm is not None:
            reasons.append(
                f"task {task.name!r} clips gradients by their global norm, and xpipe's stages "
                "update at different times: no moment holds one mini-batch's gradients on "
                "every stage to take the norm of (per-stage clipping would be different "
                "training); use gpipe or 1f1b, or leave clip_grad_norm out")
        if not resolved["stashing"] and resolved["log_prediction"]:
            reasons.append("xpipe logs the prediction error of a stashed copy: "
                           "log_prediction=true needs stashing=true")
        if resolved["prediction"]:
            try:
                with torch.device("meta"):
                    optimizer = task.optimizer(task.model().parameters())
            except Exception:
                try:  # a model meta cannot build: the stages will be built on the host
                    optimizer = task.optimizer(build_structure(task).model.parameters())
                except Exception:
                    return reasons  # validation reports factories that raise
            problem = prediction_problem(optimizer)
            if problem is None and task.lr_scheduler is not None:
                problem = scheduler_problem(optimizer, task.lr_scheduler)
            if problem:
                reasons.append(f"task {task.name!r}: {problem}")
        return reasons

    def knob_settings(self, task: Task, devices: int, kind: DeviceKind) -> list[dict[str, Any]]:
        if devices < 2:
            return []
        counts = micro_batch_counts(devices, task.batch_size)
        for prediction in (True, False):
            settings = [{"micro_batches": m, "prediction": prediction, "stashing": True,
                         "balance": "time", "log_prediction": False} for m in counts]
            fitting = [s for s in settings if not self.check(task, devices, s, kind)]
            # An optimizer xpipe cannot predict for (SGD without momentum): the task
            # opted in to inexact training, so weight stashing alone (PipeDream's) is
            # tried; its slices say so ("weight stashing").
            if fitting or not task.allow_inexact:
                return fitting
        return []

    def train(self, ctx: SliceContext) -> SliceOutcome:
        micro_batches = int(ctx.knobs["micro_batches"])
        task = ctx.task
        source = BatchSource(ctx.dataset, task.batch_size, task.seed, collate=task.collate_fn)
        ctx.timings["data_ready"] = time.perf_counter()
        part = self.build_stage(ctx, source)
        stage = XPipeStage(ctx, part, source, micro_batches)
        stage.walk()
        checkpoint = ctx.save(part.model, stage.optimizer, stage.scheduler)
        outcome = ctx.outcome(checkpoint, loss_ranks=[ctx.world - 1])
        # Every stage's record, gathered on rank 0 (whose outcome the launcher keeps).
        gathered: list[Any] = [None] * ctx.world
        dist.all_gather_object(gathered, stage.record())
        partition = part.partition
        outcome.extra.update(part.notes)
        outcome.extra.update(
            stages=[partition.describe(k) for k in range(partition.stages)],
            cut=cut_record(partition),
            micro_batches=micro_batches,
            versions=[r["versions"] for r in gathered],
            prediction=[r["prediction"] for r in gathered],
            # Per stage, the most sends kept unwaited at once and the most weight copies
            # alive at once (between actions): the bounds the tests hold them to.
            most_unwaited_sends=[r["most_unwaited"] for r in gathered],
            most_weight_copies=[r["most_copies"] for r in gathered],
            # Per stage, each action's (start, end) of work, after its input arrived (an
            # update's, after its shared weights' gradients are summed), in seconds from
            # the first stage's start.
            spans=on_one_clock([r["origin"] for r in gathered], [r["spans"] for r in gathered]),
        )
        # The real weights (after the last update), not a prediction of them.
        ctx.evaluate_stages(outcome, part.model)
        return outcome
