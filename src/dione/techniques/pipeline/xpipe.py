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
there. Autograd never sees a weight change under it. Memory: one copy of the stage's
weights (and, once its backwards ran, their gradients) per mini-batch in flight on the
stage, ``Schedule.minibatches_in_flight_peak`` (at most ``ceil(K / T) + 1``), plus,
with ``log_prediction``, one more per mini-batch for the stale weights.

Point-to-point follows each stage's plan (``dione.schedules.messages``): both ends of
a link post its messages in one order, so NCCL's in-order pairing cannot cross, and a
stage keeps a send unwaited only until a later receive on the same link arrives (at
most its in-flight micro-batches' activations plus one gradient, and the activations'
data is the output the stage keeps for their backwards anyway).

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

import math
import time
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.func import functional_call

from dione.schedules import Schedule, xpipe
from dione.schedules.messages import LinkOp, Message, link_plan
from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.techniques.base import Knobs, SliceOutcome
from dione.techniques.batches import BatchSource, slice_batch
from dione.techniques.context import SliceContext
from dione.techniques.pipeline.action_log import on_one_clock
from dione.techniques.pipeline.balance import cut_record
from dione.techniques.pipeline.gpipe import PipelineTechnique
from dione.techniques.pipeline.prediction import (
    future_rates,
    predict_weights,
    prediction_problem,
    scheduler_problem,
)
from dione.techniques.pipeline.stage_build import build_structure
from dione.techniques.pipeline.stages import batch_fields

__all__ = ["XPipe"]

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
           torch.int32]
_HEADER = 10  # dtype code, number of dimensions, up to 8 sizes


class _Links:
    """This stage's point-to-point traffic, operation by operation as its plan says
    (``dione.schedules.messages``): activations forward, gradients back.

    An activation travels as a small header (dtype and shape) and its data, posted back
    to back, so the receiver can allocate it; a gradient has the shape of the activation
    it answers, so its receive is posted ahead into a buffer of that shape. No tags: NCCL
    ignores them and pairs each link's messages in the order they are posted, and gloo
    pairs untagged messages between two ranks in that order too, so a CPU run depends on
    the plan's link order exactly as a CUDA run does. A send is kept (with its buffers)
    until the plan says it has arrived.
    """

    def __init__(self, rank: int, device: torch.device) -> None:
        self.rank = rank
        self.device = device
        self.unwaited: dict[Message, list[tuple[Any, torch.Tensor]]] = {}
        self.posted: dict[Message, tuple[Any, torch.Tensor]] = {}
        self.most_unwaited = 0  # the most sends kept at once (a header and data: one)

    def _peer(self, message: Message) -> int:
        return message.link + 1 if message.link == self.rank else message.link

    def send(self, message: Message, tensor: torch.Tensor) -> None:
        tensor = tensor.detach().contiguous()
        peer = self._peer(message)
        works = []
        if message.kind == "activation":
            header = torch.zeros(_HEADER, dtype=torch.int64)
            header[0], header[1] = _DTYPES.index(tensor.dtype), tensor.dim()
            header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape)
            header = header.to(self.device)
            works.append((dist.isend(header, peer), header))
            works.append((dist.isend(tensor, peer), tensor))
        else:
            works.append((dist.isend(tensor, peer), tensor))
        self.unwaited[message] = works
        self.most_unwaited = max(self.most_unwaited, len(self.unwaited))

    def post_receive(self, message: Message, like: torch.Tensor | None) -> None:
        """Post the receive of a gradient into a buffer shaped ``like``, or of an
        activation's header (its data is posted once the header says its shape)."""
        peer = self._peer(message)
        if message.kind == "gradient":
            assert like is not None
            # Contiguous, as the sender sends it: ``empty_like`` would keep the strides of
            # a channels_last activation, and NCCL would fill it in the wrong order.
            buffer = torch.empty(like.shape, dtype=like.dtype, device=like.device)
        else:
            buffer = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        self.posted[message] = (dist.irecv(buffer, peer), buffer)

    def wait(self, message: Message) -> torch.Tensor:
        work, buffer = self.posted.pop(message)
        work.wait()
        if message.kind == "gradient":
            return buffer
        values = buffer.tolist()
        shape = values[2 : 2 + values[1]]
        tensor = torch.empty(shape, dtype=_DTYPES[values[0]], device=self.device)
        dist.recv(tensor, self._peer(message))
        return tensor

    def done(self, message: Message) -> None:
        for work, _ in self.unwaited.pop(message):
            work.wait()


def _norm(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((a[n].detach() - b[n].detach()).pow(2).sum()) for n in a))


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
        settings = [{"micro_batches": m, "prediction": True, "stashing": True,
                     "balance": "time", "log_prediction": False}
                    for m in sorted({devices, 2 * devices, 4 * devices})]
        return [s for s in settings if not self.check(task, devices, s, kind)]

    def train(self, ctx: SliceContext) -> SliceOutcome:
        task, spec, knobs = ctx.task, ctx.spec, ctx.knobs
        stage, stages = ctx.rank, ctx.world
        first, last = stage == 0, stage == stages - 1
        micro_batches = int(knobs["micro_batches"])
        minibatches = spec.end_step - spec.start_step
        source = BatchSource(ctx.dataset, task.batch_size, task.seed, collate=task.collate_fn)
        ctx.timings["data_ready"] = time.perf_counter()
        part = self.build_stage(ctx, source)
        model, partition, module = part.model, part.partition, part.module
        optimizer, scheduler = ctx.start_training(model)
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        schedule = xpipe(stages, micro_batches, minibatches)
        staleness = schedule.staleness()
        plan = link_plan(schedule, stage)
        links = _Links(stage, ctx.device)
        predicting, stashing = bool(knobs["prediction"]), bool(knobs["stashing"])

        # Per mini-batch in flight: the weights its forwards and backwards run on. Stashed,
        # a copy (predicted or not) taken at its bellwether; not stashed, aliases of the
        # real parameters (``.data`` shares their storage but not their version counter),
        # so a backward sees whatever the stage holds by then and autograd lets it.
        weights: dict[int, dict[str, torch.Tensor]] = {}
        copies: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()  # one tensor per copy
        stale: dict[int, dict[str, torch.Tensor]] = {}
        saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        outgoing: dict[Message, torch.Tensor] = {}
        arrived: dict[Message, torch.Tensor] = {}
        chunks: dict[int, list[dict[str, torch.Tensor]]] = {}
        totals: dict[int, int] = {}  # each mini-batch's counted items (a counted loss)
        micro_losses: dict[int, list[torch.Tensor]] = {}
        versions: list[tuple[int, int, int]] = []  # (mini-batch, version seen, s predicted)
        prediction_log: list[tuple[int, int, float, float]] = []
        spans: list[tuple[float, float]] = []
        most_copies = 0
        updates = 0

        def chunk(i: int) -> list[dict[str, torch.Tensor]]:
            """Mini-batch i's micro-batches, as the fields every stage's module takes."""
            if i not in chunks:
                batch = source.global_batch(spec.start_step + i)
                if module.counting is not None:
                    module.count_items(batch, micro_batches)
                    totals[i] = module.items_total
                batch = ctx.to_device(batch)
                size = task.batch_size // micro_batches
                chunks[i] = [batch_fields(slice_batch(batch, j * size, (j + 1) * size))[0]
                             for j in range(micro_batches)]
            return chunks[i]

        def play(ops: tuple[LinkOp, ...]) -> None:
            for op in ops:
                m = op.message
                if op.verb == "send":
                    links.send(m, outgoing.pop(m))
                elif op.verb == "recv":
                    links.post_receive(m, saved[m.micro][1] if m.kind == "gradient" else None)
                elif op.verb == "wait":
                    arrived[m] = links.wait(m)
                else:
                    links.done(m)

        # Each action's work is a function, so nothing it made (a weight copy, a graph
        # that holds one) outlives it in a local variable.
        def forward(i: int, j: int) -> None:
            u = i * micro_batches + j
            if j == 0:  # the bellwether: this mini-batch's weights are fixed now
                s = staleness[(i, stage)]
                versions.append((i, updates, s))
                if stashing:
                    ahead = s if predicting else 0
                    rates = (future_rates(optimizer, scheduler, task.lr_scheduler, ahead)
                             if ahead > 1 and scheduler is not None else None)
                    weights[i] = predict_weights(optimizer, params, ahead, rates)
                    copies.add(next(iter(weights[i].values())))
                else:
                    weights[i] = {n: p.data.requires_grad_(True) for n, p in params.items()}
                if knobs["log_prediction"]:
                    stale[i] = {n: p.detach().clone() for n, p in params.items()}
            received: torch.Tensor | None = None
            args: tuple[torch.Tensor, ...] = ()
            if not first:
                received = arrived.pop(Message("activation", u, stage - 1))
                args = (received.requires_grad_(received.is_floating_point()),)
            fields = chunk(i)[j]
            if i in totals:  # the micro-batch's mean weighed within its own mini-batch
                module.items_total = totals[i]
            # The module holds the cut model as "model": its weights by those names.
            out = functional_call(module, {f"model.{n}": w for n, w in weights[i].items()},
                                  args, fields)
            if last:  # the module returned the micro-batch's loss
                loss = out
                micro_losses.setdefault(i, []).append(loss.detach().float())
                saved[u] = (received, loss / micro_batches)  # mean over the mini-batch
            else:
                outgoing[Message("activation", u, stage)] = out
                saved[u] = (received, out)

        def backward(i: int, j: int) -> None:
            u = i * micro_batches + j
            received, out = saved.pop(u)
            if last:
                out.backward()  # type: ignore[no-untyped-call]
            else:
                out.backward(arrived.pop(Message("gradient", u, stage)))  # type: ignore[no-untyped-call]
            if received is not None:
                if received.grad is None:  # the previous stage waits for it: say why not
                    raise RuntimeError(
                        f"xpipe stage {stage}: the input of micro-batch {u} got no gradient "
                        f"(a {received.dtype} activation, or one the stage's output does not "
                        "depend on); xpipe needs a floating activation between stages")
                outgoing[Message("gradient", u, stage - 1)] = received.grad

        def update(i: int) -> float:
            """Mini-batch i's update; the moment its work began: once the gradients of
            the weights other stages hold too are summed, so the span leaves out the
            wait for those stages (the simulator adds it from ``shared_stages``)."""
            nonlocal updates
            mine = weights.pop(i)
            for name, param in params.items():
                param.grad = mine[name].grad
            part.shared.summed()  # a weight other stages hold too: the sum of their gradients
            began = time.perf_counter()
            if knobs["log_prediction"]:
                seen = stale.pop(i)
                s = staleness[(i, stage)]
                if s:
                    prediction_log.append((i, s, _norm(mine, params), _norm(seen, params)))
            optimizer.step()
            module.verify = False
            # Drops the gradients; the copy itself goes when ``mine`` does, on return.
            optimizer.zero_grad(set_to_none=True)
            updates += 1
            chunks.pop(i, None)
            totals.pop(i, None)
            ctx.step_done(torch.stack(micro_losses.pop(i)).mean() if last else None, scheduler)
            return began

        origin = time.perf_counter()
        for index, action in enumerate(schedule.stages[stage]):
            play(plan.before[index])  # the receives this work waits for
            begin = time.perf_counter()  # the span is the work, not the wait
            if action.kind == "F":
                assert action.micro is not None
                forward(action.minibatch, action.micro)
            elif action.kind == "B":
                assert action.micro is not None
                backward(action.minibatch, action.micro)
            else:  # the update of mini-batch i, on version i of the real weights
                begin = update(action.minibatch)
            spans.append((begin - origin, time.perf_counter() - origin))
            play(plan.after[index])  # its results sent on, receives posted ahead
            most_copies = max(most_copies, len(copies))
        play(plan.final)
        checkpoint = ctx.save(model, optimizer, scheduler)
        outcome = ctx.outcome(checkpoint, loss_ranks=[stages - 1])
        # Every stage's record, gathered on rank 0 (whose outcome the launcher keeps).
        record = {"versions": versions, "prediction": prediction_log, "spans": spans,
                  "origin": origin, "most_unwaited": links.most_unwaited,
                  "most_copies": most_copies}
        gathered: list[Any] = [None] * stages
        dist.all_gather_object(gathered, record)
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
        return outcome
