"""The schedule simulator's time per mini-batch against real `gpipe`, `1f1b`, `xpipe` slices.

    python benchmarks/pipeline_sim.py [--model chargpt-wide] [--steps 40] [--repeats 5]

Two stages on two CPU slots of this machine, m in {2, 4, 8} micro-batches. The
prediction uses only measurements taken apart from any pipeline: each stage's forward
(the last one with the loss) and backward per micro-batch and its optimizer step, in
GPipe's pattern over m distinct micro-batches (10 rounds after a warm-up, medians),
measured in two processes at once, each on its own core with one thread as a worker
has; and the one-way time of one activation between two gloo processes (half a
ping-pong). The runtime's own cost per forward or backward (Python, posting sends and
receives, waking up when one arrives) is measured with a real slice of each technique
on a model with next to no compute, and added to every action. This machine's speed
drifts by tens of percent over minutes, so each round measures the stages and the
overheads, then runs one real slice of every (technique, m) right after, and the error
is the median over rounds of predicted / measured - 1.
Both sides use the same statistic: the median interval between stage 0's successive
optimizer steps (for xpipe, the steady state without fill and drain; the real side
skips the first steps as warm-up).

A second table simulates xpipe again from the action times its own run logged (work
only, after each input arrived): if that matches, the schedule model is right and any
error lies in the stage times fed to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
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
from dione.techniques.xpipe import real_timeline

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


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))


def tiny_data() -> Any:
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(1024, 16, generator=generator),
                                          torch.randn(1024, 16, generator=generator))


def action_overhead(name: str, m: int, steps: int, placement: Any, folder: Path) -> float:
    """Seconds the runtime of ``name`` spends per forward or backward beyond the work:
    a real slice of a model with next to no compute (two 16x16 layers), divided by
    what the schedule makes of one second per action."""
    task = Task(name="tiny", model=tiny_model, data=tiny_data,
                loss=torch.nn.functional.mse_loss,
                optimizer=functools.partial(torch.optim.SGD, lr=1e-3, momentum=0.9),
                batch_size=32, steps=steps)
    result = run_slice(task, name, folder, placement, knobs={"micro_batches": m},
                       evaluate=False)
    schedule = get_technique(name).schedule(2, m, steps)  # type: ignore[attr-defined]
    unit = update_interval(simulate(schedule, StageTimes((0.0,) * 2, (0.0,) * 2, (0.0,) * 2,
                                                         overhead=1.0)))
    return statistics.median(result.step_seconds[WARMUP:]) / unit


def make_task(model: str, steps: int) -> Task:
    setup = MODELS[model]
    return Task(name=model, model=setup.model, data=setup.data, loss=setup.loss,
                optimizer=setup.optimizer, batch_size=setup.batch_size, steps=steps)


def _measure_stage(rank: int, model: str, micro_batches: list[int], out: str) -> None:
    """Stage ``rank``'s forward, backward and update per m, on core ``rank``, one thread,
    while the other stage is measured on the other core at the same time (as in a real
    pipeline, where both cores are busy: measured alone, a stage ran up to 2x faster)."""
    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    task = make_task(model, 1)
    partition = partition_model(task.model(), 2, task.name)
    inputs, target = BatchSource(task.data(), task.batch_size, task.seed).global_batch(0)
    found = {}
    for m in micro_batches:
        size = task.batch_size // m
        torch.manual_seed(task.seed)
        whole = task.model()
        chunks = [(inputs[j * size:(j + 1) * size], target[j * size:(j + 1) * size])
                  for j in range(m)]
        with torch.no_grad():  # stage 0's outputs: stage 1's inputs
            activations = []
            for x, _ in chunks:
                for layer in list(whole)[: partition.bounds[0][1]]:
                    x = layer(x)
                activations.append(x)
        stage = keep_stage(whole, partition, rank)
        optimizer = task.optimizer(stage.parameters())
        forwards: list[float] = []
        backwards: list[float] = []
        updates: list[float] = []
        # GPipe's pattern on distinct micro-batches: every forward, then every backward,
        # then the update; round 0 is a warm-up.
        for round_ in range(1 + SAMPLES // 2):
            outs = []
            for j, (x, y) in enumerate(chunks):
                begin = time.perf_counter()
                if rank == 0:
                    outs.append(stage(x))
                else:
                    incoming = activations[j].clone().requires_grad_(True)
                    outs.append(task.loss(stage(incoming), y))
                if round_:
                    forwards.append(time.perf_counter() - begin)
            for out_tensor in outs:
                begin = time.perf_counter()
                out_tensor.backward(torch.ones_like(out_tensor))
                if round_:
                    backwards.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if round_:
                updates.append(time.perf_counter() - begin)
        found[m] = (statistics.median(forwards), statistics.median(backwards),
                    statistics.median(updates), tuple(activations[0].shape))
    Path(f"{out}.{rank}").write_text(json.dumps(found))


def stage_times(model: str, micro_batches: list[int]) -> dict[int, StageTimes]:
    """Per m: each stage's forward/backward per micro-batch and update, both stages
    measured at once on their own cores, and the one-way transfer of an activation."""
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "stage")
        mp.start_processes(_measure_stage, args=(model, micro_batches, out), nprocs=2,
                           start_method="spawn")
        per_rank = [json.loads(Path(f"{out}.{k}").read_text()) for k in range(2)]
    times = {}
    for m in micro_batches:
        (f0, b0, u0, shape), (f1, b1, u1, _) = per_rank[0][str(m)], per_rank[1][str(m)]
        times[m] = StageTimes((f0, f1), (b0, b1), (u0, u1), one_way_transfer(tuple(shape)))
    return times


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
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    task = make_task(args.model, args.steps)
    node = Node("bench", 2, "cpu")
    placement = local_placement(node, [0, 1])
    configs = [(name, m) for m in args.micro_batches for name in ("gpipe", "1f1b", "xpipe")]
    predicted: dict[tuple[str, int], list[float]] = {key: [] for key in configs}
    measured: dict[tuple[str, int], list[float]] = {key: [] for key in configs}
    last_times: dict[int, StageTimes] = {}
    timelines: dict[tuple[str, int], Timeline] = {}
    xpipe_runs: dict[int, Any] = {}
    overheads: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            # This machine's speed drifts by tens of percent over minutes: measure the
            # stages again right before each round of real slices, and compare in pairs.
            last_times = stage_times(args.model, args.micro_batches)
            for name, m in configs:
                overheads[(name, m)] = action_overhead(
                    name, m, args.steps, placement, Path(tmp) / f"tiny-{name}-{m}-{repeat}")
            for name, m in configs:
                schedule = get_technique(name).schedule(2, m, args.steps)  # type: ignore[attr-defined]
                times = dataclasses.replace(last_times[m], overhead=overheads[(name, m)])
                timelines[(name, m)] = simulate(schedule, times)
                predicted[(name, m)].append(update_interval(timelines[(name, m)]))
                result = run_slice(task, name, Path(tmp) / f"{name}-{m}-{repeat}", placement,
                                   knobs={"micro_batches": m}, evaluate=False)
                measured[(name, m)].append(statistics.median(result.step_seconds[WARMUP:]))
                if name == "xpipe":
                    xpipe_runs[m] = result
                print(f"{name} m={m} repeat {repeat}: predicted "
                      f"{predicted[(name, m)][-1] * 1000:.1f} ms, measured "
                      f"{measured[(name, m)][-1] * 1000:.1f} ms", flush=True)
    print()
    print(f"model {args.model}, global batch {task.batch_size}, 2 stages, {args.steps} steps "
          f"per slice, {args.repeats} rounds (stage times measured, then one slice each)\n")
    print("| technique | micro-batches | stage F / B ms per micro-batch (0; 1), last round | "
          "update ms (0; 1) | transfer ms | overhead ms per action | predicted ms/step | "
          "bubble | measured ms/step | error, median of rounds (range) |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    errors = []
    for name, m in configs:
        times = last_times[m]
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
    # Is the error in the schedule model or in its inputs? Simulate xpipe again from the
    # action times its own run logged (work only, after inputs arrived).
    print("\n| xpipe, micro-batches | F / B ms inside the run (0; 1) | predicted from isolated "
          "times | predicted from in-run times | measured (last run) |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for m, result in xpipe_runs.items():
        inside = real_timeline(result.extra, args.steps).action_times(
            transfer=last_times[m].transfer)
        again = update_interval(simulate(get_technique("xpipe").schedule(2, m, args.steps),  # type: ignore[attr-defined]
                                         inside))
        ms = [f"{t * 1000:.1f}" for t in (*inside.forward, *inside.backward)]
        print(f"| {m} | {ms[0]} / {ms[2]}; {ms[1]} / {ms[3]} | "
              f"{predicted[('xpipe', m)][-1] * 1000:.1f} | "
              f"{again * 1000:.1f} | "
              f"{statistics.median(result.step_seconds[WARMUP:]) * 1000:.1f} |")
    m = args.micro_batches[len(args.micro_batches) // 2]
    real = real_timeline(xpipe_runs[m].extra, args.steps)
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
