"""One XPipe stage's runtime over a slice: the weights of each mini-batch in flight, its
point-to-point messages, its updates, and the record the tests and the simulator read.

Point-to-point follows the stage's plan (``dione.schedules.messages``): both ends of a
link post its messages in one order, so NCCL's in-order pairing cannot cross, and a
stage keeps a send unwaited only until a later receive on the same link arrives (at
most its in-flight micro-batches' activations plus one gradient, and the activations'
data is the output the stage keeps for their backwards anyway).

Memory: one copy of the stage's weights (and, once its backwards ran, their gradients)
per mini-batch in flight on the stage, ``Schedule.minibatches_in_flight_peak`` (at most
``ceil(K / T) + 1``), plus, with ``log_prediction``, one more per mini-batch for the
stale weights.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.func import functional_call

from dione.schedules import xpipe
from dione.schedules.messages import LinkOp, Message, link_plan
from dione.spec.batch import slice_batch
from dione.techniques.batches import BatchSource
from dione.techniques.context import SliceContext
from dione.techniques.pipeline.gpipe import PipelineStagePart
from dione.techniques.pipeline.prediction import future_rates, predict_weights
from dione.techniques.pipeline.stages import batch_fields

__all__ = ["XPipeStage"]

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




class XPipeStage:
    """This rank's stage walking its list of the XPipe schedule for one slice.

    Each action's work is a method, so nothing it made (a weight copy, a graph that holds
    one) outlives it in a local variable; what must outlive it is kept here by mini-batch
    or message and dropped where the schedule says it is done with."""

    def __init__(self, ctx: SliceContext, part: PipelineStagePart, source: BatchSource,
                 micro_batches: int) -> None:
        self.ctx, self.part, self.source = ctx, part, source
        self.module = part.module
        self.stage, stages = ctx.rank, ctx.world
        self.first, self.last = self.stage == 0, self.stage == stages - 1
        self.micro_batches = micro_batches
        self.optimizer, self.scheduler = ctx.start_training(part.model)
        self.params = {n: p for n, p in part.model.named_parameters() if p.requires_grad}
        self.schedule = xpipe(stages, micro_batches, ctx.spec.end_step - ctx.spec.start_step)
        self.staleness = self.schedule.staleness()
        self.plan = link_plan(self.schedule, self.stage)
        self.links = _Links(self.stage, ctx.device)
        knobs = ctx.knobs
        self.predicting, self.stashing = bool(knobs["prediction"]), bool(knobs["stashing"])
        self.log_prediction = bool(knobs["log_prediction"])

        # Per mini-batch in flight: the weights its forwards and backwards run on. Stashed,
        # a copy (predicted or not) taken at its bellwether; not stashed, aliases of the
        # real parameters (``.data`` shares their storage but not their version counter),
        # so a backward sees whatever the stage holds by then and autograd lets it.
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.copies: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()  # one per copy
        self.stale: dict[int, dict[str, torch.Tensor]] = {}
        # Per micro-batch: its received input and its output (the loss, on the last stage).
        self.saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        self.outgoing: dict[Message, torch.Tensor] = {}
        self.arrived: dict[Message, torch.Tensor] = {}
        self.chunks: dict[int, list[dict[str, torch.Tensor]]] = {}
        self.totals: dict[int, float] = {}  # each mini-batch's counted items (a counted loss)
        self.micro_losses: dict[int, list[torch.Tensor]] = {}
        # The record: (mini-batch, version seen, s predicted); prediction errors; spans.
        self.versions: list[tuple[int, int, int]] = []
        self.prediction_log: list[tuple[int, int, float, float]] = []
        self.spans: list[tuple[float, float]] = []
        self.most_copies = 0
        self.updates = 0
        self.origin = 0.0

    def walk(self) -> None:
        """Every action of this stage's list, each between the messages the plan puts
        before it (the receives it waits for) and after it (its results sent on, receives
        posted ahead); the slice's last messages after the last."""
        self.origin = time.perf_counter()
        for index, action in enumerate(self.schedule.stages[self.stage]):
            self._play(self.plan.before[index])
            begin = time.perf_counter()  # the span is the work, not the wait
            if action.kind == "F":
                assert action.micro is not None
                self._forward(action.minibatch, action.micro)
            elif action.kind == "B":
                assert action.micro is not None
                self._backward(action.minibatch, action.micro)
            else:  # the update of mini-batch i, on version i of the real weights
                begin = self._update(action.minibatch)
            self.spans.append((begin - self.origin, time.perf_counter() - self.origin))
            self._play(self.plan.after[index])
            self.most_copies = max(self.most_copies, len(self.copies))
        self._play(self.plan.final)

    def record(self) -> dict[str, Any]:
        """What this stage saw, for rank 0 to gather."""
        return {"versions": self.versions, "prediction": self.prediction_log,
                "spans": self.spans, "origin": self.origin,
                "most_unwaited": self.links.most_unwaited, "most_copies": self.most_copies}

    def _chunk(self, i: int) -> list[dict[str, torch.Tensor]]:
        """Mini-batch i's micro-batches, as the fields every stage's module takes."""
        if i not in self.chunks:
            batch = self.source.global_batch(self.ctx.spec.start_step + i)
            if self.module.counting is not None:
                self.module.count_items(batch, self.micro_batches)
                self.totals[i] = self.module.items_total
            batch = self.ctx.to_device(batch)
            size = self.ctx.task.batch_size // self.micro_batches
            self.chunks[i] = [batch_fields(slice_batch(batch, j * size, (j + 1) * size))[0]
                              for j in range(self.micro_batches)]
        return self.chunks[i]

    def _play(self, ops: tuple[LinkOp, ...]) -> None:
        for op in ops:
            m = op.message
            if op.verb == "send":
                self.links.send(m, self.outgoing.pop(m))
            elif op.verb == "recv":
                like = self.saved[m.micro][1] if m.kind == "gradient" else None
                self.links.post_receive(m, like)
            elif op.verb == "wait":
                self.arrived[m] = self.links.wait(m)
            else:
                self.links.done(m)

    def _bellwether(self, i: int) -> None:
        """Mini-batch i's first micro-batch is here: fix the weights all of i runs on."""
        s = self.staleness[(i, self.stage)]
        self.versions.append((i, self.updates, s))
        if self.stashing:
            ahead = s if self.predicting else 0
            rates = (future_rates(self.optimizer, self.scheduler, self.ctx.task.lr_scheduler,
                                  ahead)
                     if ahead > 1 and self.scheduler is not None else None)
            self.weights[i] = predict_weights(self.optimizer, self.params, ahead, rates)
            self.copies.add(next(iter(self.weights[i].values())))
        else:
            self.weights[i] = {n: p.data.requires_grad_(True) for n, p in self.params.items()}
        if self.log_prediction:
            self.stale[i] = {n: p.detach().clone() for n, p in self.params.items()}

    def _forward(self, i: int, j: int) -> None:
        u = i * self.micro_batches + j
        if j == 0:
            self._bellwether(i)
        received: torch.Tensor | None = None
        args: tuple[torch.Tensor, ...] = ()
        if not self.first:
            received = self.arrived.pop(Message("activation", u, self.stage - 1))
            args = (received.requires_grad_(received.is_floating_point()),)
        fields = self._chunk(i)[j]
        if i in self.totals:  # the micro-batch's mean weighed within its own mini-batch
            self.module.items_total = self.totals[i]
        # The module holds the cut model as "model": its weights by those names.
        out = functional_call(self.module,
                              {f"model.{n}": w for n, w in self.weights[i].items()},
                              args, fields)
        if self.last:  # the module returned the micro-batch's loss
            self.micro_losses.setdefault(i, []).append(out.detach().float())
            self.saved[u] = (received, out / self.micro_batches)  # mean over the mini-batch
        else:
            self.outgoing[Message("activation", u, self.stage)] = out
            self.saved[u] = (received, out)

    def _backward(self, i: int, j: int) -> None:
        u = i * self.micro_batches + j
        received, out = self.saved.pop(u)
        if self.last:
            out.backward()  # type: ignore[no-untyped-call]
        else:
            gradient = self.arrived.pop(Message("gradient", u, self.stage))
            out.backward(gradient)  # type: ignore[no-untyped-call]
        if received is not None:
            if received.grad is None:  # the previous stage waits for it: say why not
                raise RuntimeError(
                    f"xpipe stage {self.stage}: the input of micro-batch {u} got no gradient "
                    f"(a {received.dtype} activation, or one the stage's output does not "
                    "depend on); xpipe needs a floating activation between stages")
            self.outgoing[Message("gradient", u, self.stage - 1)] = received.grad

    def _update(self, i: int) -> float:
        """Mini-batch i's update; the moment its work began: once the gradients of the
        weights other stages hold too are summed, so the span leaves out the wait for
        those stages (the simulator adds it from ``shared_stages``)."""
        mine = self.weights.pop(i)
        for name, param in self.params.items():
            param.grad = mine[name].grad
        self.part.shared.summed()  # a weight other stages hold too: their gradients' sum
        began = time.perf_counter()
        if self.log_prediction:
            seen = self.stale.pop(i)
            s = self.staleness[(i, self.stage)]
            if s:
                self.prediction_log.append((i, s, _norm(mine, self.params),
                                            _norm(seen, self.params)))
        self.optimizer.step()
        self.module.verify = False
        # Drops the gradients; the copy itself goes when ``mine`` does, on return.
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        self.chunks.pop(i, None)
        self.totals.pop(i, None)
        losses = self.micro_losses.pop(i) if self.last else None
        self.ctx.step_done(torch.stack(losses).mean() if losses else None, self.scheduler)
        return began


def _norm(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((a[n].detach() - b[n].detach()).pow(2).sum()) for n in a))
