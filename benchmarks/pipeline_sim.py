"""The schedule simulator's time per mini-batch against real `gpipe`, `1f1b`, `xpipe` slices.

    python benchmarks/pipeline_sim.py [--model chargpt-wide] [--steps 40] [--repeats 5]
    python benchmarks/pipeline_sim.py --pool OUTPUT...   # the rounds of saved runs together

Two stages on two CPU slots of this machine, m in {2, 4, 8} micro-batches. Each round
runs a real slice of every technique and m, and predicts its time per mini-batch with
the simulator from two sources of stage times:

- **Logged by another run**: every pipeline slice logs when each stage's forwards,
  backwards and updates worked (waits for inputs left out). The prediction for round r
  takes the per-stage medians that the same configuration's slice logged in round r-1,
  minutes earlier in other processes. Nothing of the slice being predicted goes into it.
- **Measured apart**, from first principles: each stage's forward (the last one with
  the loss) and backward per micro-batch and its update, running the stage's own action
  list from the technique's schedule on distinct micro-batches (30 mini-batches after a
  warm-up, medians; xpipe's on predicted weights through ``functional_call``, its
  prediction counted with the update), measured in two processes at once, each on its
  own core with one thread as a worker has.

Both add what a stage time leaves out, measured next to the slice: the one-way time of
one activation between the two processes over gloo (half a ping-pong), and the
runtime's own cost per forward or backward (Python, posting sends and receives and
copying their tensors, waking up when one arrives, the loss's bookkeeping, fetching
the batch). That cost comes from a real slice (200 steps) of the same technique and m
on the task hollowed out: its real data, loss and optimizer, but each stage one layer
that hands on a tensor of the real activation's (or output's) shape at next to no
compute; its time per step over the schedule's number of actions is added to every
action.

This machine's speed drifts by tens of percent over minutes, so the overhead and the
stage times apart are measured again next to every real slice (right before it in
even rounds, right after it in odd ones, so that an order effect cancels), and each
error is the median over rounds of predicted / measured - 1. Both sides use the same
statistic: the median interval between stage 0's successive optimizer steps (for
xpipe, the steady state without fill and drain; the real side skips the first steps
as warm-up).

The second table also gives each stage's forward plus backward inside the run against
the same stage measured apart, and the prediction from the run's own logged times.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.func import functional_call
from torch.nn import functional

sys.path.insert(0, os.path.dirname(__file__))
from models import MODELS

from dione.launch import local_placement, run_slice
from dione.schedules import Partition, Schedule, StageTimes, Timeline, simulate
from dione.spec import Node, Task
from dione.techniques import get_technique
from dione.techniques.batches import BatchSource
from dione.techniques.pipeline.gpipe import keep_stage
from dione.techniques.pipeline.partition import partition_model
from dione.techniques.pipeline.prediction import predict_weights

WARMUP = 8
# Short measurements caught this machine's slow spells whole: with 10 mini-batches per
# stage measurement and 40-step hollow slices, the predictions varied twice as much
# between rounds as the real slices did.
STAGE_MINIBATCHES = 30
HOLLOW_STEPS = 200


def update_interval(timeline: Timeline) -> float:
    """The median time between stage 0's successive optimizer steps."""
    ends = [span.end for span in timeline.spans[0] if span.action.kind == "U"]
    return statistics.median(b - a for a, b in itertools.pairwise(ends))


class Boundary(nn.Module):
    """Any input to a tensor of ``shape`` per sample at next to no compute: a scaled copy,
    padded or cut to size, so a stage hands on the real model's shape, with a gradient."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(len(x), -1).to(torch.float32)
        size = math.prod(self.shape)
        if flat.shape[1] != size:
            flat = functional.pad(flat, (0, size - flat.shape[1]))  # negative: cuts
        return (flat * self.scale).reshape(len(x), *self.shape)


def hollow_model(activation: tuple[int, ...], output: tuple[int, ...]) -> nn.Module:
    return nn.Sequential(Boundary(activation), Boundary(output))


def action_overhead(name: str, m: int, placement: Any, folder: Path, task: Task,
                    shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> float:
    """Seconds the runtime of ``name`` spends per forward or backward beyond the work:
    a real slice of the task hollowed out (its data, loss and optimizer, but each stage
    one ``Boundary`` that hands on the real activation and output shapes, so sends,
    receives and their copies cost what they really cost), divided by what the schedule
    makes of one second per action. It also counts what the stage times hold already:
    the hollow layers' own work (a copy per action), the loss and an update of two
    scalars, together 1-4 ms a step on this machine (m=2 to 8), a small overcount."""
    activation, output = shapes
    hollow = dataclasses.replace(
        task, name=f"{task.name}-hollow", steps=HOLLOW_STEPS,
        model=functools.partial(hollow_model, activation, output))
    result = run_slice(hollow, name, folder, placement, knobs={"micro_batches": m},
                       evaluate=False)
    schedule = get_technique(name).schedule(2, m, HOLLOW_STEPS)  # type: ignore[attr-defined]
    unit = update_interval(simulate(schedule, StageTimes((0.0,) * 2, (0.0,) * 2, (0.0,) * 2,
                                                         overhead=1.0)))
    return statistics.median(result.step_seconds[WARMUP:]) / unit


def first_stage_output(model: nn.Module, partition: Partition, x: torch.Tensor) -> torch.Tensor:
    """What stage 0 of ``model`` hands on for input ``x`` (no gradient)."""
    with torch.no_grad():
        for layer in list(model)[: partition.bounds[0][1]]:
            x = layer(x)
    return x


def boundary_shapes(task: Task) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per sample: the activation between the two stages, and the model's output."""
    model = task.model()
    partition = partition_model(model, 2, task.name)
    inputs, _ = BatchSource(task.data(), task.batch_size, task.seed).global_batch(0)
    sample = inputs[:1]
    activation = first_stage_output(model, partition, sample)
    with torch.no_grad():
        output = model(sample)
    return tuple(activation.shape[1:]), tuple(output.shape[1:])


def make_task(model: str, steps: int) -> Task:
    setup = MODELS[model]
    return Task(name=model, model=setup.model, data=setup.data, loss=setup.loss,
                optimizer=setup.optimizer, batch_size=setup.batch_size, steps=steps)


def _measure_stage(rank: int, model: str, technique: str, m: int, port: int, out: str) -> None:
    """Stage ``rank``'s forward, backward and update for ``technique`` with ``m``
    micro-batches, on core ``rank``, one thread, while the other stage is measured on
    the other core at the same time (as in a real pipeline, where both cores are busy:
    measured alone, a stage ran up to 2x faster); then the one-way time of one
    activation between the two (half a gloo ping-pong).

    The stage runs its own action list from the technique's schedule, as the technique
    runs it, on distinct micro-batches, with the other stage's activations (or
    gradients: ones) made up front: ``gpipe``/``1f1b`` call the stage module and scale
    the gradients by 1/m before the update as torch's schedules do; ``xpipe`` predicts
    each mini-batch's weights at its first forward (counted with the update: both are
    once per mini-batch) and runs the stage on them with ``functional_call``. The first
    two mini-batches are a warm-up."""
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    task = make_task(model, 1)
    inputs, target = BatchSource(task.data(), task.batch_size, task.seed).global_batch(0)
    size = task.batch_size // m
    torch.manual_seed(task.seed)
    whole = task.model()
    partition = partition_model(whole, 2, task.name)
    chunks = [(inputs[j * size:(j + 1) * size], target[j * size:(j + 1) * size])
              for j in range(m)]
    # Stage 0's outputs: stage 1's inputs.
    activations = [first_stage_output(whole, partition, x) for x, _ in chunks]
    stage = keep_stage(whole, partition, rank)
    optimizer = task.optimizer(stage.parameters())
    params = dict(stage.named_parameters())
    predicting = technique == "xpipe"
    warmup = 2
    schedule = get_technique(technique).schedule(2, m, warmup + STAGE_MINIBATCHES)  # type: ignore[attr-defined]
    spent: dict[str, list[float]] = {"F": [], "B": [], "U": [], "P": []}
    weights: dict[int, dict[str, torch.Tensor]] = {}
    outs: dict[tuple[int, int], torch.Tensor] = {}
    for action in schedule.stages[rank]:
        i, j = action.minibatch, action.micro
        begin = time.perf_counter()
        if action.kind == "F":
            assert j is not None
            if predicting and j == 0:
                weights[i] = predict_weights(optimizer, params, 1)
                if i >= warmup:
                    spent["P"].append(time.perf_counter() - begin)
                begin = time.perf_counter()
            x, y = chunks[j]
            if rank == 1:
                x = activations[j].clone().requires_grad_(True)
            result = functional_call(stage, weights[i], (x,)) if predicting else stage(x)
            outs[(i, j)] = task.loss(result, y) if rank == 1 else result
        elif action.kind == "B":
            assert j is not None
            result = outs.pop((i, j))
            result.backward(torch.ones_like(result))
        else:
            if predicting:
                mine = weights.pop(i)
                for name, param in params.items():
                    param.grad = mine[name].grad
            else:
                for param in params.values():
                    if param.grad is not None:
                        param.grad.div_(m)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            spent[action.kind].append(time.perf_counter() - begin)
    found = [statistics.median(spent[kind]) for kind in "FBU"]
    if predicting:
        found[2] += statistics.median(spent["P"])
    transfer = _ping_pong(rank, tuple(activations[0].shape), port)
    Path(f"{out}.{rank}").write_text(json.dumps([*found, transfer]))


def stage_times(model: str, technique: str, m: int) -> StageTimes:
    """Each stage's forward/backward per micro-batch and update for ``technique`` with
    ``m`` micro-batches, both stages measured at once on their own cores, and the
    one-way transfer of an activation."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "stage")
        mp.start_processes(_measure_stage, args=(model, technique, m, port, out), nprocs=2,
                           start_method="spawn")
        (f0, b0, u0, transfer), (f1, b1, u1, _) = (
            json.loads(Path(f"{out}.{k}").read_text()) for k in range(2))
    return StageTimes((f0, f1), (b0, b1), (u0, u1), transfer)


def _ping_pong(rank: int, shape: tuple[int, ...], port: int) -> float:
    """Half the median round trip of a tensor of ``shape`` between ranks 0 and 1."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    tensor = torch.randn(shape)
    times = []
    for _ in range(60):
        begin = time.perf_counter()
        if rank == 0:
            dist.send(tensor, 1)
            dist.recv(tensor, 1)
        else:
            dist.recv(tensor, 0)
            dist.send(tensor, 0)
        times.append(time.perf_counter() - begin)
    dist.destroy_process_group()
    return statistics.median(times[10:]) / 2


ROUND_LINE = re.compile(r"(\S+) m=(\d+) repeat (\d+): predicted ([\d.]+) ms, "
                        r"measured ([\d.]+) ms")
LAST_RUN_LINE = re.compile(r"(\S+) m=(\d+) repeat (\d+): from the last round's logged "
                           r"action times ([\d.]+) ms")


def pool(outputs: list[str]) -> None:
    """The errors' table over every round in the saved outputs of earlier runs."""
    errors: dict[tuple[str, int], list[float]] = {}
    last_errors: dict[tuple[str, int], list[float]] = {}
    for output in outputs:
        measured: dict[tuple[str, int, int], float] = {}
        for line in Path(output).read_text().splitlines():
            found = ROUND_LINE.fullmatch(line.strip())
            if found:
                key = (found[1], int(found[2]))
                measured[(*key, int(found[3]))] = float(found[5])
                errors.setdefault(key, []).append(float(found[4]) / float(found[5]) - 1)
            found = LAST_RUN_LINE.fullmatch(line.strip())
            if found:
                key = (found[1], int(found[2]))
                last_errors.setdefault(key, []).append(
                    float(found[4]) / measured[(*key, int(found[3]))] - 1)
    if not errors:
        raise SystemExit(f"no per-round lines in {', '.join(outputs)}: pass the saved "
                         "output of a run of this script")
    print(f"{len(outputs)} runs pooled: {', '.join(outputs)}\n")
    print("| technique | micro-batches | rounds | error from stage times measured apart, "
          "median of rounds (range) | rounds | error from the last round's run's action "
          "times, median of rounds (range) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")

    def summary(ratios: list[float]) -> str:
        if not ratios:
            return "0 | - |"
        return (f"{len(ratios)} | {statistics.median(ratios):+.1%} "
                f"({min(ratios):+.1%} to {max(ratios):+.1%}) |")

    for (name, m), ratios in errors.items():
        print(f"| {name} | {m} | {summary(ratios)} {summary(last_errors.get((name, m), []))}")
    for label, table in (("measured apart", errors), ("the last round's run", last_errors)):
        medians = [abs(statistics.median(r)) for r in table.values() if r]
        if medians:
            print(f"\nfrom {label}: largest |error| {max(medians):.1%}, median "
                  f"{statistics.median(medians):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pool", nargs="+", metavar="OUTPUT",
                        help="only summarise the rounds in these saved outputs of earlier "
                        "runs together")
    parser.add_argument("--model", default="chargpt-wide")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    if args.pool:
        pool(args.pool)
        return
    task = make_task(args.model, args.steps)
    node = Node("bench", 2, "cpu")
    placement = local_placement(node, [0, 1])
    configs = [(name, m) for m in args.micro_batches for name in ("gpipe", "1f1b", "xpipe")]
    predicted: dict[tuple[str, int], list[float]] = {key: [] for key in configs}
    measured: dict[tuple[str, int], list[float]] = {key: [] for key in configs}
    last_times: dict[tuple[str, int], StageTimes] = {}
    shapes = boundary_shapes(task)
    timelines: dict[tuple[str, int], Timeline] = {}
    real_timelines: dict[tuple[str, int], Timeline] = {}
    overheads: dict[tuple[str, int], float] = {}
    # Per round: each stage's F+B in the run over the same measured apart, and the
    # prediction from the run's own action times with the same overhead.
    inside_ratios: dict[tuple[str, int], list[tuple[float, float]]] = {key: [] for key in configs}
    from_inside: dict[tuple[str, int], list[float]] = {key: [] for key in configs}
    # ... and from the action times the previous round's run of the configuration logged:
    # a prediction of this run from another one.
    logged: dict[tuple[str, int], StageTimes] = {}
    from_last_run: dict[tuple[str, int], list[tuple[float, float]]] = {key: [] for key in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            # This machine's speed drifts by tens of percent over minutes: measure the
            # stages and the runtime's overhead again next to each real slice, and
            # compare in pairs.
            for name, m in configs:
                key = (name, m)
                technique = get_technique(name)
                schedule = technique.schedule(2, m, args.steps)  # type: ignore[attr-defined]

                def simulated(times: StageTimes, key: tuple[str, int] = key,
                              schedule: Schedule = schedule) -> Timeline:
                    # This round's transfer and overhead: measured next to this slice.
                    return simulate(schedule, dataclasses.replace(
                        times, transfer=last_times[key].transfer, overhead=overheads[key]))

                def predict(name: str = name, m: int = m, repeat: int = repeat,
                            key: tuple[str, int] = key) -> None:
                    last_times[key] = stage_times(args.model, name, m)
                    overheads[key] = action_overhead(
                        name, m, placement, Path(tmp) / f"hollow-{name}-{m}-{repeat}",
                        task, shapes)
                    timelines[key] = simulated(last_times[key])
                    predicted[key].append(update_interval(timelines[key]))

                # Odd rounds run the real slice first: whatever follows a slice (its
                # processes ending, its checkpoint written back) or drifts in one
                # direction then weighs on both sides alike.
                if repeat % 2 == 0:
                    predict()
                result = run_slice(task, name, Path(tmp) / f"{name}-{m}-{repeat}", placement,
                                   knobs={"micro_batches": m}, evaluate=False)
                measured[key].append(statistics.median(result.step_seconds[WARMUP:]))
                if repeat % 2 == 1:
                    predict()
                real = technique.real_timeline(result.extra, args.steps)  # type: ignore[attr-defined]
                real_timelines[key] = real
                inside, apart = real.action_times(), last_times[key]
                work_inside, work_apart = ([t.forward[k] + t.backward[k] for k in range(2)]
                                           for t in (inside, apart))
                inside_ratios[key].append(
                    (work_inside[0] / work_apart[0], work_inside[1] / work_apart[1]))
                from_inside[key].append(update_interval(simulated(inside)))
                print(f"{name} m={m} repeat {repeat}: predicted "
                      f"{predicted[key][-1] * 1000:.1f} ms, measured "
                      f"{measured[key][-1] * 1000:.1f} ms", flush=True)
                if key in logged:
                    from_last = update_interval(simulated(logged[key]))
                    from_last_run[key].append((from_last, measured[key][-1]))
                    print(f"{name} m={m} repeat {repeat}: from the last round's logged action "
                          f"times {from_last * 1000:.1f} ms", flush=True)
                logged[key] = inside
    print()
    print(f"model {args.model}, global batch {task.batch_size}, 2 stages, {args.steps} steps "
          f"per slice, {args.repeats} rounds (stage times and overhead measured next to each "
          "slice: before it in even rounds, after it in odd ones)\n")
    print("| technique | micro-batches | stage F / B ms per micro-batch (0; 1), last round | "
          "update ms (0; 1) | transfer ms | overhead ms per action | predicted ms/step | "
          "bubble | measured ms/step | error, median of rounds (range) |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    errors = []
    for name, m in configs:
        times = last_times[(name, m)]
        ratios = [a / b - 1 for a, b in zip(predicted[(name, m)], measured[(name, m)],
                                            strict=True)]
        error = statistics.median(ratios)
        errors.append(abs(error))
        ms = [f"{t * 1000:.1f}" for t in (*times.forward, *times.backward, *times.update)]
        print(f"| {name} | {m} | {ms[0]} / {ms[2]}; {ms[1]} / {ms[3]} | {ms[4]}; {ms[5]} | "
              f"{times.transfer * 1000:.2f} | {overheads[(name, m)] * 1000:.2f} | "
              f"{statistics.median(predicted[(name, m)]) * 1000:.1f} | "
              f"{timelines[(name, m)].bubble_fraction:.0%} | "
              f"{statistics.median(measured[(name, m)]) * 1000:.1f} | {error:+.1%} "
              f"({min(ratios):+.1%} to {max(ratios):+.1%}) |")
    print(f"\nlargest |error| {max(errors):.1%}, median {statistics.median(errors):.1%}")
    if args.repeats > 1:
        # Does it matter whether the prediction's measurements come before or after?
        for parity, when in ((0, "before"), (1, "after")):
            ratios = [a / b - 1 for key in configs
                      for a, b in itertools.islice(zip(predicted[key], measured[key],
                                                       strict=True), parity, None, 2)]
            print(f"measured {when} the slice: median error {statistics.median(ratios):+.1%} "
                  f"over {len(ratios)} rounds of every configuration")
    # Is the error in the schedule model or in its inputs? Each run logged when its
    # stages worked (after their inputs arrived): how long, against the same stage
    # measured apart; and what the simulator predicts from such logged action times, the
    # previous round's run's (a prediction of this run from another one) and this run's.
    print("\n| technique | micro-batches | F+B in the run / measured apart (stage 0; 1), "
          "median of rounds | error predicted from the last round's run's action times, "
          "median of rounds (range) | the same from this run's own |")
    print("| --- | ---: | ---: | ---: | ---: |")
    last_errors = []
    for name, m in configs:
        own = [a / b - 1 for a, b in zip(from_inside[(name, m)], measured[(name, m)],
                                         strict=True)]
        last = [a / b - 1 for a, b in from_last_run[(name, m)]]
        stage_ratios = [statistics.median(r[k] for r in inside_ratios[(name, m)])
                        for k in range(2)]
        if last:
            last_errors.append(abs(statistics.median(last)))
        print(f"| {name} | {m} | {stage_ratios[0]:.2f}; {stage_ratios[1]:.2f} | "
              + (f"{statistics.median(last):+.1%} ({min(last):+.1%} to {max(last):+.1%}) | "
                 if last else "- | ")
              + f"{statistics.median(own):+.1%} ({min(own):+.1%} to {max(own):+.1%}) |")
    if last_errors:
        print(f"\nfrom the last round's run: largest |error| {max(last_errors):.1%}, median "
              f"{statistics.median(last_errors):.1%}")
    m = args.micro_batches[len(args.micro_batches) // 2]
    real = real_timelines[("xpipe", m)]
    simulated = timelines[("xpipe", m)]
    for label, timeline in (("real", real), ("simulated", simulated)):
        ends = [s.end for s in timeline.spans[0] if s.action.kind == "U"]
        since = ends[WARMUP]
        print(f"\n{label} xpipe timeline, m={m}, from stage 0's update {WARMUP} on, one cell "
              "= 2 ms:\n")
        print(timeline.render(0.002, until=since + 2.5 * update_interval(timeline),
                              since=since))
    for name in ("1f1b", "xpipe"):
        example = timelines[(name, args.micro_batches[0])]
        print(f"\nsimulated {name} timeline, m={args.micro_batches[0]}, first 3 mini-batches, "
              "one cell = 5 ms:\n")
        print(example.render(0.005, until=3 * update_interval(example)))


if __name__ == "__main__":
    main()
