"""The schedule simulator's time per mini-batch against real `gpipe`, `1f1b`, `xpipe` slices.

    python benchmarks/pipeline_sim.py [--model chargpt-wide] [--steps 40] [--repeats 3]

Two stages on two CPU slots of this machine, m in {2, 4, 8} micro-batches. The
prediction uses only measurements taken apart from any pipeline, in this process on
one core and one thread, as a worker has: each stage's forward (the last one with the
loss) and backward per micro-batch and its optimizer step, the median of 20 runs each;
and the one-way time of one activation between two gloo processes (half a ping-pong).
The measured figure is the median step time of real slices after a warm-up; each
(technique, m) runs ``--repeats`` times, interleaved with the others, and the median is
taken. Both sides use the same statistic: the median interval between stage 0's
successive optimizer steps (for xpipe, the steady state without fill and drain).
Error = predicted / measured - 1.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
from models import MODELS

from dione.launch import local_placement, run_slice
from dione.schedules import StageTimes, Timeline, partition_model, simulate
from dione.spec import Node, Task
from dione.techniques import get_technique
from dione.techniques.batches import BatchSource
from dione.techniques.pipeline import keep_stage

WARMUP = 8
SAMPLES = 20


def update_interval(timeline: Timeline) -> float:
    """The median time between stage 0's successive optimizer steps."""
    ends = [span.end for span in timeline.spans[0] if span.action.kind == "U"]
    return statistics.median(b - a for a, b in itertools.pairwise(ends))


def median_seconds(run: Any, samples: int = SAMPLES) -> float:
    run()  # warm-up
    times = []
    for _ in range(samples):
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def stage_times(task: Task, micro_batches: int) -> tuple[StageTimes, tuple[int, ...]]:
    """Per-stage forward/backward per micro-batch and update, measured on one thread."""
    stages = []
    model = task.model()
    partition = partition_model(model, 2, task.name)
    inputs, target = BatchSource(task.data(), task.batch_size, task.seed).global_batch(0)
    size = task.batch_size // micro_batches
    x, y = inputs[:size], target[:size]
    forward, backward, update = [], [], []
    activation_shape: tuple[int, ...] = ()
    for k in range(2):
        torch.manual_seed(task.seed)
        stage = keep_stage(task.model(), partition, k)
        optimizer = task.optimizer(stage.parameters())
        if k == 0:
            def run_forward(stage: Any = stage) -> Any:
                return stage(x)
        else:
            incoming = torch.randn(activation_shape, requires_grad=True)

            def run_forward(stage: Any = stage, incoming: Any = incoming) -> Any:
                return task.loss(stage(incoming), y)
        out = run_forward()
        if k == 0:
            activation_shape = tuple(out.shape)
        forward.append(median_seconds(run_forward))
        gradient = torch.ones_like(out)

        def run_both(run_forward: Any = run_forward, gradient: Any = gradient) -> None:
            run_forward().backward(gradient)
        backward.append(max(0.0, median_seconds(run_both) - forward[-1]))
        optimizer.step()  # Adam's state exists from here on, as in training
        update.append(median_seconds(optimizer.step))
        stages.append(stage)
    transfer = one_way_transfer(activation_shape)
    return StageTimes(tuple(forward), tuple(backward), tuple(update), transfer), activation_shape


def _ping_pong(rank: int, shape: tuple[int, ...], port: int, out: str) -> None:
    os.sched_setaffinity(0, {rank % os.cpu_count()})  # type: ignore[operator]
    torch.set_num_threads(1)
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
    if rank == 0:
        Path(out).write_text(str(statistics.median(times[10:]) / 2))
    dist.destroy_process_group()


def one_way_transfer(shape: tuple[int, ...]) -> float:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.NamedTemporaryFile(suffix=".txt") as out:
        mp.start_processes(_ping_pong, args=(shape, port, out.name), nprocs=2,
                           start_method="spawn")
        return float(Path(out.name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="chargpt-wide")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    setup = MODELS[args.model]
    task = Task(name=args.model, model=setup.model, data=setup.data, loss=setup.loss,
                optimizer=setup.optimizer, batch_size=setup.batch_size, steps=args.steps)
    node = Node("bench", 2, "cpu")
    placement = local_placement(node, [0, 1])
    affinity = os.sched_getaffinity(0)
    threads = torch.get_num_threads()
    os.sched_setaffinity(0, {min(affinity)})
    torch.set_num_threads(1)
    predictions = {}
    for m in args.micro_batches:
        times, shape = stage_times(task, m)
        for name in ("gpipe", "1f1b", "xpipe"):
            schedule = get_technique(name).schedule(2, m, args.steps)  # type: ignore[attr-defined]
            predictions[(name, m)] = (simulate(schedule, times), times, shape)
    os.sched_setaffinity(0, affinity)
    torch.set_num_threads(threads)
    measured: dict[tuple[str, int], list[float]] = {key: [] for key in predictions}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, m in predictions:
                result = run_slice(task, name, Path(tmp) / f"{name}-{m}-{repeat}", placement,
                                   knobs={"micro_batches": m}, evaluate=False)
                measured[(name, m)].append(statistics.median(result.step_seconds[WARMUP:]))
                print(f"{name} m={m} repeat {repeat}: {measured[(name, m)][-1] * 1000:.1f} ms",
                      flush=True)
    print()
    print(f"model {args.model}, global batch {task.batch_size}, 2 stages, {args.steps} steps "
          f"per slice, {args.repeats} slices each\n")
    print("| technique | micro-batches | stage F / B ms per micro-batch (0; 1) | update ms "
          "(0; 1) | transfer ms | predicted ms/step | bubble | measured ms/step (range) | "
          "error |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    errors = []
    for (name, m), (timeline, times, _) in predictions.items():
        real = measured[(name, m)]
        mid = statistics.median(real)
        predicted = update_interval(timeline)
        error = predicted / mid - 1
        errors.append(abs(error))
        ms = [f"{t * 1000:.1f}" for t in (*times.forward, *times.backward, *times.update)]
        print(f"| {name} | {m} | {ms[0]} / {ms[2]}; {ms[1]} / {ms[3]} | {ms[4]}; {ms[5]} | "
              f"{times.transfer * 1000:.2f} | {predicted * 1000:.1f} | "
              f"{timeline.bubble_fraction:.0%} | {mid * 1000:.1f} ({min(real) * 1000:.1f}-"
              f"{max(real) * 1000:.1f}) | {error:+.1%} |")
    print(f"\nlargest |error| {max(errors):.1%}, median {statistics.median(errors):.1%}")
    for name in ("1f1b", "xpipe"):
        example = predictions[(name, args.micro_batches[0])][0]
        print(f"\nsimulated {name} timeline, m={args.micro_batches[0]}, first 3 mini-batches, "
              "one cell = 5 ms:\n")
        print(example.render(0.005, until=3 * update_interval(example)))


if __name__ == "__main__":
    main()
