"""Per-step time of gpipe, 1f1b and xpipe against the no-bubble bound, and per slice.

    python benchmarks/pipeline_throughput.py [--stages 2 4] [--micro 2 4 8] [--steps 48]
                                             [--rounds 3] [--out FILE.json]

Real slices (``run_slice``, the workers the orchestrator uses) of one character GPT
(width 128, 8 blocks, batch 32, AdamW) on K stages with m micro-batches. Within a round
the three techniques of one (K, m) run back to back, in an order that rotates from round
to round (an order effect cancels); the ratios to gpipe are taken within a round and
their median over rounds reported, because this machine's speed drifts between minutes.

From each slice's own log of when every stage worked (each forward, backward and update,
waits left out; every pipeline slice records it) on one clock:

- **per step**: the mean interval between stage 0's successive optimizer updates after
  the first WARMUP steps (the steady state: no fill, no drain; for gpipe and 1f1b the
  steady state holds each step's own fill and drain, which is their bubble);
- **no-bubble bound**: the busiest stage's working time per step over the same steady
  window: what a step would take if no stage ever waited for another (communication,
  bubbles and the wait for the slowest stage all left out). ``bound / per step`` is the
  share of the step the busiest stage works; the schedule's own share (equal stages,
  free links, simulated) is what it would be on ideal hardware;
- **per slice**: the slice's first action to its last, over its S steps (fill and drain
  included), and ``fill + drain = makespan - S * per step``; the orchestrator makes slices
  of at least ``AUTO_SLICE_FLOOR_SECONDS`` (5 minutes), so the last column gives what
  fill and drain add to a step in a slice of that length: ``(fill + drain) / 300 s``.

Process start-up, the checkpoint and the balance measurement are outside the log, so
outside every figure here (``startup.py`` and ``ray_slice_cost.py`` measure them).
With more stages than cores (K = 4 on this 2-core machine) stages share cores: a waiting
stage gives its core to a working one, so bubbles cost less than on devices of their own
and the bound (measured on shared cores) is loose; read K = 4 as a check that the
runtime works, not as a forecast for accelerators.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))

from dione.launch import local_placement, run_slice
from dione.orchestrate.runner import AUTO_SLICE_FLOOR_SECONDS
from dione.schedules import StageTimes, Timeline, simulate
from dione.spec import Node, Task
from dione.spec.devices import available_cores
from dione.techniques import get_technique
from dione.zoo import CharGPT, sequence_cross_entropy, text_train

TECHNIQUES = ("gpipe", "1f1b", "xpipe")
WARMUP = 8


def make_task(steps: int) -> Task:
    return Task(name="chargpt-8", model=functools.partial(CharGPT, width=128, layers=8),
                data=text_train, loss=sequence_cross_entropy,
                optimizer=functools.partial(torch.optim.AdamW, lr=1e-3), batch_size=32,
                steps=steps)


def knobs_of(technique: str, m: int) -> dict[str, Any]:
    if technique == "xpipe":
        return {"micro_batches": m, "prediction": True, "stashing": True, "balance": "time"}
    return {"micro_batches": m, "activation_checkpointing": False, "balance": "time"}


def figures(timeline: Timeline, steps: int) -> dict[str, float]:
    """Per step (steady), the no-bubble bound and the slice's makespan, in seconds."""
    starts = [s.start for stage in timeline.spans for s in stage]
    ends = [s.end for stage in timeline.spans for s in stage]
    updates = [s.end for s in timeline.spans[0] if s.action.kind == "U"]
    # The steady window: from stage 0's update of step WARMUP to its last update.
    begin, end = updates[WARMUP], updates[-1]
    per_step = (end - begin) / (len(updates) - 1 - WARMUP)
    makespan = max(ends) - min(starts)
    # The busiest stage's work in the same window, per step (so never above per_step).
    bound = max(sum(min(s.end, end) - max(s.start, begin) for s in stage
                    if s.end > begin and s.start < end)
                for stage in timeline.spans) / (len(updates) - 1 - WARMUP)
    return {"per_step": per_step, "bound": bound, "makespan": makespan,
            "fill_drain": makespan - steps * per_step}


def ideal_share(technique: str, k: int, m: int, steps: int) -> float:
    """The schedule's own bound / step: equal stages (backward twice the forward, the
    update free) and free links, simulated; what the measured share is to be read against."""
    schedule = get_technique(technique).schedule(k, m, steps)  # type: ignore[attr-defined]
    share = figures(simulate(schedule, StageTimes.uniform(k, 1.0 / m, 2.0 / m)), steps)
    return share["bound"] / share["per_step"]


def run_one(task: Task, technique: str, k: int, m: int, node: Node,
            folder: Path) -> dict[str, float]:
    method = get_technique(technique)
    with tempfile.TemporaryDirectory(dir=folder) as run_dir:
        result = run_slice(task, technique, run_dir, local_placement(node, range(k)),
                           knobs=knobs_of(technique, m), evaluate=False, keep_checkpoints=1)
    timeline = method.real_timeline(result.extra, task.steps)  # type: ignore[attr-defined]
    return figures(timeline, task.steps)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f}"


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| K | m | technique | ms/step | no-bubble bound ms | bound / step | "
             "schedule's own | / gpipe's step, median of rounds (range) | slice makespan / S, ms | "
             "fill + drain, ms | added to a 300 s slice |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    keyed = {(r["k"], r["m"], r["technique"]): r["runs"] for r in rows}
    floor = AUTO_SLICE_FLOOR_SECONDS
    for (k, m, technique), runs in keyed.items():
        gpipe = keyed.get((k, m, "gpipe"))
        ratio = (spread([a["per_step"] / b["per_step"] for a, b in zip(runs, gpipe, strict=False)])
                 if gpipe else "")
        steps = runs[0]["steps"]
        fill = [r["fill_drain"] for r in runs]
        lines.append(
            f"| {k} | {m} | {technique} | {ms([r['per_step'] for r in runs])} | "
            f"{ms([r['bound'] for r in runs])} | "
            f"{statistics.median(r['bound'] / r['per_step'] for r in runs):.2f} | "
            f"{ideal_share(technique, k, m, steps):.2f} | {ratio} | "
            f"{ms([r['makespan'] / steps for r in runs])} | {ms(fill)} | "
            f"{statistics.median(fill) / floor:.2%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--micro", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cores = available_cores()
    task = make_task(args.steps)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, m in itertools.product(args.stages, args.micro):
            node = Node("bench", max(k, len(cores)), "cpu", len(cores))
            order = list(TECHNIQUES)
            runs: dict[str, list[dict[str, float]]] = {t: [] for t in TECHNIQUES}
            refused = {t: get_technique(t).check(task, k, knobs_of(t, m), "cpu")
                       for t in TECHNIQUES}
            for _ in range(args.rounds):
                for technique in order:
                    if refused[technique]:
                        continue
                    figure = run_one(task, technique, k, m, node, Path(tmp))
                    runs[technique].append({**figure, "steps": args.steps})
                    print(f"K={k} m={m} {technique}: {figure['per_step'] * 1e3:.1f} ms/step, "
                          f"bound {figure['bound'] * 1e3:.1f} ms", flush=True)
                order = order[1:] + order[:1]
            for technique in TECHNIQUES:
                if refused[technique]:
                    print(f"K={k} m={m} {technique}: refused: {'; '.join(refused[technique])}")
                    continue
                rows.append({"k": k, "m": m, "technique": technique, "runs": runs[technique]})
    print(f"\n{len(cores)} cores; {args.steps} steps per slice; {args.rounds} rounds\n")
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
