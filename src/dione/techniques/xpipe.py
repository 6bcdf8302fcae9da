"""``xpipe``: asynchronous pipelining with weight prediction (Guan, Yin, Li, Lu 2019).

Our own runtime over ``torch.distributed`` point-to-point (gloo on CPU, NCCL on CUDA),
one stage per device, the stages cut as for ``gpipe``. Each rank walks its list of the
XPipe schedule (``dione.schedules.xpipe``): micro-batches of successive mini-batches
flow without a flush, and each stage applies its optimizer step as soon as the last
micro-batch of a mini-batch is back.

When the first micro-batch of mini-batch i reaches stage k, the stage makes a separate
copy of its weights for i, predicted ``s`` updates ahead (``s`` counted from the
schedule; see ``dione.techniques.prediction``). All micro-batches of i run forward and
backward on that copy through ``torch.func.functional_call``; its gradients are moved
onto the real parameters at i's update. Autograd never sees a weight change under it.
Memory: one copy of the stage's weights per mini-batch in flight on the stage (at most
``ceil(K / T) + 1``), plus, with ``log_prediction``, one more for the stale weights.

Knobs: ``micro_batches`` (T), ``prediction`` (off: the ``async`` ablation, plain
staleness on the same schedule), ``balance`` (as ``gpipe``), ``log_prediction``
(record the prediction error at each update).

A slice boundary drains the pipeline: the slice's mini-batches all finish, so the
checkpoint holds the real weights after the last update and any technique can resume
from it. The next slice starts with an empty pipeline, so its first mini-batches see
less staleness than steady state (as at the start of training).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.func import functional_call

from dione.schedules import Schedule, xpipe
from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.techniques.base import Knobs, SliceContext, SliceOutcome
from dione.techniques.batches import BatchSource
from dione.techniques.pipeline import PipelineTechnique, on_one_clock
from dione.techniques.prediction import predict_weights, prediction_problem

__all__ = ["XPipe"]

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
           torch.int32]
_HEADER = 10  # dtype code, number of dimensions, up to 8 sizes


class _Links:
    """Point-to-point traffic of one stage: activations forward, gradients back.

    An activation travels with a small header (dtype and shape) so the receiver can
    allocate it; a gradient has the shape of the activation it answers. Tags keep the
    messages of different micro-batches apart. Sends are asynchronous; their buffers
    are kept until they complete.
    """

    def __init__(self, rank: int, device: torch.device, kept: int) -> None:
        self.rank = rank
        self.device = device
        self.kept = kept  # sends left unwaited; see _send
        self.pending: list[tuple[Any, torch.Tensor]] = []
        self.most_pending = 0  # the longest the list of unwaited sends grew

    def _send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        self.pending.append((dist.isend(tensor, peer, tag=tag), tensor))
        self.most_pending = max(self.most_pending, len(self.pending))
        if len(self.pending) > 2 * self.kept:
            # A gloo send never reports itself completed until waited on, so the list
            # (and every buffer in it) used to grow all slice long, and filtering it made
            # each send slower than the last. A gloo send's wait lasts until the peer
            # receives, so only sends the peer has surely received are waited on: a stage
            # cannot get ``kept`` sends past a message before the peer has taken it (see
            # ``_sends_kept``), so the wait returns at once and cannot deadlock.
            for work, _ in self.pending[: -self.kept]:
                work.wait()
            del self.pending[: -self.kept]

    def send_activation(self, tensor: torch.Tensor, micro: int) -> None:
        tensor = tensor.detach().contiguous()
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0], header[1] = _DTYPES.index(tensor.dtype), tensor.dim()
        header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape)
        self._send(header.to(self.device), self.rank + 1, 4 * micro)
        self._send(tensor, self.rank + 1, 4 * micro + 1)

    def receive_activation(self, micro: int) -> torch.Tensor:
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        dist.recv(header, self.rank - 1, tag=4 * micro)
        values = header.tolist()
        shape = values[2 : 2 + values[1]]
        tensor = torch.empty(shape, dtype=_DTYPES[values[0]], device=self.device)
        dist.recv(tensor, self.rank - 1, tag=4 * micro + 1)
        return tensor

    def send_gradient(self, tensor: torch.Tensor, micro: int) -> None:
        self._send(tensor.contiguous(), self.rank - 1, 4 * micro + 2)

    def receive_gradient(self, like: torch.Tensor, micro: int) -> torch.Tensor:
        gradient = torch.empty_like(like)
        dist.recv(gradient, self.rank + 1, tag=4 * micro + 2)
        return gradient

    def drain(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


def _sends_kept(schedule: Schedule) -> int:
    """More sends than a stage can make between sending a message and its peer taking
    it. An activation sent at F(u) is taken before the gradient of u comes back, which
    the stage awaits at B(u); a gradient sent at B(u) is taken at the previous stage's
    B(u), before which that stage sends at most its in-flight micro-batches' activations
    on, and so bounds this stage's progress. Each micro-batch makes at most three sends
    (a header and an activation forward, a gradient back): three per micro-batch in
    flight, plus one, at the busiest stage, with room to spare."""
    peak = max(schedule.in_flight_peak(k) for k in range(len(schedule.stages)))
    return 2 * 3 * (peak + 1)


def _norm(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((a[n].detach() - b[n].detach()).pow(2).sum()) for n in a))


class XPipe(PipelineTechnique):
    name = "xpipe"
    exact = False
    knobs: ClassVar[Mapping[str, Any]] = {
        "micro_batches": 4, "prediction": True, "balance": "parameters",
        "log_prediction": False}

    def schedule(self, stages: int, micro_batches: int, minibatches: int = 1) -> Schedule:
        return xpipe(stages, micro_batches, minibatches)

    def rank_role(self, rank: int, world: int) -> str:
        return f"xpipe stage {rank} of {world}"

    def check(self, task: Task, devices: int, knobs: Knobs, kind: DeviceKind) -> list[str]:
        reasons = super().check(task, devices, knobs, kind)
        if self.resolve(knobs)["prediction"]:
            try:
                with torch.device("meta"):
                    optimizer = task.optimizer(task.model().parameters())
            except Exception:
                return reasons  # validation reports factories that raise
            problem = prediction_problem(optimizer)
            if problem:
                reasons.append(f"task {task.name!r}: {problem}")
        return reasons

    def knob_settings(self, task: Task, devices: int, kind: DeviceKind) -> list[dict[str, Any]]:
        if devices < 2:
            return []
        settings = [{"micro_batches": m, "prediction": True, "balance": "time",
                     "log_prediction": False}
                    for m in sorted({devices, 2 * devices, 4 * devices})]
        return [s for s in settings if not self.check(task, devices, s, kind)]

    def train(self, ctx: SliceContext) -> SliceOutcome:
        task, spec, knobs = ctx.task, ctx.spec, ctx.knobs
        stage, stages = ctx.rank, ctx.world
        first, last = stage == 0, stage == stages - 1
        micro_batches = int(knobs["micro_batches"])
        minibatches = spec.end_step - spec.start_step
        source = BatchSource(ctx.dataset, task.batch_size, task.seed)
        ctx.timings["data_ready"] = time.perf_counter()
        model, partition = self.build_stage(ctx, source)
        optimizer, scheduler = ctx.start_training(model)
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        schedule = xpipe(stages, micro_batches, minibatches)
        staleness = schedule.staleness()
        links = _Links(stage, ctx.device, _sends_kept(schedule))

        weights: dict[int, dict[str, torch.Tensor]] = {}  # per mini-batch in flight
        stale: dict[int, dict[str, torch.Tensor]] = {}
        saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        chunks: dict[int, tuple[Any, Any]] = {}
        micro_losses: dict[int, list[torch.Tensor]] = {}
        losses: list[torch.Tensor] = []
        step_seconds: list[float] = []
        versions: list[tuple[int, int, int]] = []  # (mini-batch, version seen, s predicted)
        prediction_log: list[tuple[int, int, float, float]] = []
        spans: list[tuple[float, float]] = []
        updates = 0

        def chunk(i: int) -> tuple[Any, Any]:
            if i not in chunks:
                inputs, target = source.global_batch(spec.start_step + i)
                chunks[i] = (inputs.chunk(micro_batches), target.chunk(micro_batches))
            return chunks[i]

        origin = last_update = time.perf_counter()
        for action in schedule.stages[stage]:
            begin = time.perf_counter()
            finish = None  # the work's end, before its result is sent on
            i, j = action.minibatch, action.micro
            if action.kind == "F":
                assert j is not None
                u = i * micro_batches + j
                if j == 0:  # the bellwether: this mini-batch's weights are fixed now
                    s = staleness[(i, stage)]
                    versions.append((i, updates, s))
                    weights[i] = predict_weights(optimizer, params,
                                                 s if knobs["prediction"] else 0)
                    if knobs["log_prediction"]:
                        stale[i] = {n: p.detach().clone() for n, p in params.items()}
                if first:
                    x = ctx.to_device(chunk(i)[0][j])
                    received = None
                else:
                    received = links.receive_activation(u)
                    x = received.requires_grad_(received.is_floating_point())
                    begin = time.perf_counter()  # the span is the work, not the wait
                out = functional_call(model, weights[i], (x,))
                if last:
                    loss = task.loss(out, ctx.to_device(chunk(i)[1][j]))
                    micro_losses.setdefault(i, []).append(loss.detach())
                    saved[u] = (received, loss / micro_batches)  # mean over the mini-batch
                else:
                    finish = time.perf_counter()
                    links.send_activation(out, u)
                    saved[u] = (received, out)
            elif action.kind == "B":
                assert j is not None
                u = i * micro_batches + j
                received, out = saved.pop(u)
                if last:
                    out.backward()  # type: ignore[no-untyped-call]
                else:
                    gradient = links.receive_gradient(out, u)
                    begin = time.perf_counter()
                    out.backward(gradient)  # type: ignore[no-untyped-call]
                if received is not None and received.grad is not None:
                    finish = time.perf_counter()
                    links.send_gradient(received.grad, u)
            else:  # the update of mini-batch i, on version i of the real weights
                mine = weights.pop(i)
                if knobs["log_prediction"]:
                    seen = stale.pop(i)
                    s = staleness[(i, stage)]
                    if s:
                        prediction_log.append((i, s, _norm(mine, params), _norm(seen, params)))
                for name, param in params.items():
                    param.grad = mine[name].grad
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                updates += 1
                chunks.pop(i, None)
                losses.append(torch.stack(micro_losses.pop(i)).mean() if last
                              else torch.zeros((), device=ctx.device))
                ctx.step_done(losses[-1] if last else None)
                now = time.perf_counter()
                step_seconds.append(now - last_update)
                last_update = now
            end = time.perf_counter() if finish is None else finish
            spans.append((begin - origin, end - origin))
        links.drain()
        checkpoint = ctx.save(model, optimizer, scheduler)
        outcome = ctx.outcome(losses, step_seconds, checkpoint, loss_ranks=[stages - 1])
        # Every stage's record, gathered on rank 0 (whose outcome the launcher keeps).
        record = {"versions": versions, "prediction": prediction_log, "spans": spans,
                  "origin": origin, "most_pending": links.most_pending}
        gathered: list[Any] = [None] * stages
        dist.all_gather_object(gathered, record)
        outcome.extra.update(
            stages=[partition.describe(k) for k in range(partition.stages)],
            micro_batches=micro_batches,
            versions=[r["versions"] for r in gathered],
            prediction=[r["prediction"] for r in gathered],
            most_pending_sends=[r["most_pending"] for r in gathered],
            # Per stage, each action's (start, end) of work, after its input arrived, in
            # seconds from the first stage's start.
            spans=on_one_clock([r["origin"] for r in gathered], [r["spans"] for r in gathered]),
        )
        return outcome
