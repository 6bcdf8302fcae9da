"""Planner benchmark instances from a documented cost model; fixed seeds, committed output.

    python benchmarks/planner/generate.py        # rewrites benchmarks/planner/instances/

Cost model (every figure a stated assumption, chosen to look like Saturn's workloads of
fine-tuning GPT-style models on nodes of 8 A100-80GB GPUs):

* A task fine-tunes a decoder of P parameters (GPT-3 sizes, 125M to 13B) on T tokens
  (lognormal, median 300M, clipped to 30M-3B). Its work is 6 P T FLOPs (Kaplan et al.,
  2020). One GPU delivers 125 TFLOP/s (312 TFLOP/s bf16 peak at 40% utilisation).
* Memory per GPU, 80 GB available: model states take 16 bytes per parameter (bf16
  weights and gradients, fp32 master weights and two Adam moments); activations of the
  task's batch take 6 GB x (P / 1B)^0.6 on one GPU and shrink with the share of the
  batch (or of the layers) a GPU holds.
* Communication per doubling of devices costs a fraction c(P) = 0.15 (1B / P)^0.35 of
  the compute for DDP (small models scale worst: their gradients are all-reduced as
  often while each GPU computes little; 125M on 8 GPUs runs 4.1x as fast as on one,
  13B 6.8x), and 1.5 c(P) for FSDP (it all-gathers parameters twice and
  reduce-scatters gradients).
* Options, on g in {1, 2, 4, 8} GPUs of one node (time = work / (g x 125 TFLOP/s) /
  efficiency; an option exists only if it fits in memory):
    - single (g = 1):       states + activations;                       efficiency 1
    - ddp:                  states + activations / g;                   1 / (1 + c log2 g)
    - fsdp:                 states / g + activations / g;               1 / (1 + 1.5 c log2 g)
      with activation checkpointing: activations / 5, compute x 4/3;
      with CPU offload: states / g moved to host (2 bytes/param stay), compute x 1.6
    - gpipe (g >= 2, 8 micro-batches): states / g + activations / g;    0.97 x 8 / (8 + g - 1)
    - 1f1b  (g >= 2, 8 micro-batches): states / g + activations / g x g / 8 (at most g
      micro-batches in flight);                                          same bubble as gpipe
* Each option's seconds get a lognormal factor (sigma 0.05): profiled runtimes are
  measurements, not formulas.

The ``hard`` family (issue 22) has fewer, longer and wider tasks per node, where the
plain area bound is loose and list scheduling leaves holes:

* tasks come in grids: one base fine-tune (model, tokens) and 1-4 learning-rate
  variants with *identical* options (a grid's variants share every profiled runtime);
* a fifth to a third of the tasks are long-context fine-tunes of 6.7B-13B models whose
  activations fit only when sharded over at least half a node: their options below
  4 GPUs are dropped; the others fine-tune 125M-2.7B models;
* tokens are heavy-tailed (Pareto, shape 1.1: from 30M, clipped at 600M; long-context
  ones from 10M, clipped at 120M), so a few tasks run 10-30 times longer than the
  median; a task whose fastest option is longer than 0.7 x the area bound (total
  least device-time over all devices) is re-drawn, so that no instance is trivially
  bound by one task;
* 12 to 200 tasks on 1 to 16 nodes of 8 GPUs: 4 to 12 tasks per node.

The mixed family puts the hard family's tasks on clusters of 8-, 4- and 2-GPU nodes
(24 to 60 tasks on 3 to 7 nodes): options wider than a node fit only the larger ones.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path
from typing import Any

GPU_MEMORY_GB = 80.0
GPU_FLOPS = 125e12
SIZES_B = [0.125, 0.35, 0.76, 1.3, 2.7, 6.7, 13.0]
SIZE_WEIGHTS = [3, 4, 4, 4, 3, 2, 1]
DEVICE_COUNTS = [1, 2, 4, 8]
MICROBATCHES = 8

FAMILIES: dict[str, list[tuple[int, int]]] = {
    # (tasks, nodes) per instance
    "small": [(4, 1), (8, 1), (12, 1), (16, 1), (8, 2), (16, 2)],
    "medium": [(50, 8), (75, 8), (100, 8)],
    "large": [(1000, 64), (1200, 64)],
}


def options_for(params_b: float, tokens: float, rng: random.Random) -> list[dict[str, Any]]:
    """Every option of one task that fits in memory, with its seconds."""
    params = params_b * 1e9
    work = 6 * params * tokens
    states = 16 * params / 1e9  # GB
    activations = 6.0 * params_b**0.6
    options = []

    def add(technique: str, g: int, memory: float, efficiency: float,
            knobs: dict[str, Any] | None = None) -> None:
        if memory <= GPU_MEMORY_GB:
            seconds = work / (g * GPU_FLOPS) / efficiency * math.exp(rng.gauss(0, 0.05))
            options.append({"technique": technique, "knobs": knobs or {}, "devices": g,
                            "seconds": round(seconds, 1)})

    communication = 0.15 * (1.0 / params_b) ** 0.35
    for g in DEVICE_COUNTS:
        log_g = math.log2(g)
        if g == 1:
            add("single", 1, states + activations, 1.0)
        else:
            add("ddp", g, states + activations / g, 1 / (1 + communication * log_g))
            bubble = 0.97 * MICROBATCHES / (MICROBATCHES + g - 1)
            add("gpipe", g, states / g + activations / g, bubble,
                {"micro_batches": MICROBATCHES})
            add("1f1b", g, states / g + activations / g * min(g, MICROBATCHES) / MICROBATCHES,
                bubble, {"micro_batches": MICROBATCHES})
        fsdp = 1 / (1 + 1.5 * communication * log_g)
        add("fsdp", g, states / g + activations / g, fsdp,
            {"activation_checkpointing": False, "cpu_offload": False})
        add("fsdp", g, states / g + activations / g / 5, fsdp * 0.75,
            {"activation_checkpointing": True, "cpu_offload": False})
        add("fsdp", g, 2 * params / 1e9 / g + activations / g / 5, fsdp * 0.75 / 1.6,
            {"activation_checkpointing": True, "cpu_offload": True})
    return options


def instance(tasks: int, nodes: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    entries = []
    while len(entries) < tasks:
        size = rng.choices(SIZES_B, SIZE_WEIGHTS)[0]
        tokens = min(3e9, max(3e7, math.exp(rng.gauss(math.log(3e8), 0.8))))
        options = options_for(size, tokens, rng)
        if options:
            lr = rng.choice(["1e-5", "3e-5", "1e-4"])
            name = f"gpt{size:g}b-{len(entries):04d}-lr{lr}"
            entries.append({"name": name, "options": options})
    return {"cluster": {"nodes": [{"name": f"n{i}", "devices": 8} for i in range(nodes)]},
            "tasks": entries}


# (tasks, nodes) per hard instance: two small, three medium, three large.
HARD: list[tuple[int, int]] = [(12, 1), (24, 2), (40, 4), (60, 6), (80, 8), (120, 12),
                               (160, 14), (200, 16)]
WIDE_SIZES_B = [6.7, 13.0]
WIDE_DEVICES = 4
DOMINANT_SHARE = 0.7  # no task's fastest option longer than this share of the area bound


def heavy_tailed_tokens(rng: random.Random, least: float, most: float) -> float:
    """Pareto(1.1) tokens from ``least``, clipped at ``most``: most tasks short, a few long."""
    return min(most, least * (1.0 - rng.random()) ** (-1 / 1.1))


def _hard_options(size: float, is_wide: bool, rng: random.Random) -> list[dict[str, Any]]:
    tokens = heavy_tailed_tokens(rng, 1e7, 1.2e8) if is_wide else \
        heavy_tailed_tokens(rng, 3e7, 6e8)
    options = options_for(size, tokens, rng)
    return [o for o in options if o["devices"] >= WIDE_DEVICES] if is_wide else options


# (tasks, node sizes) per mixed instance: the hard family's tasks on nodes of 8, 4 and
# 2 GPUs, as clusters bought over the years are (no probe of mixed sizes existed).
MIXED: list[tuple[int, list[int]]] = [(24, [8, 4, 4]), (40, [8, 8, 4, 4]),
                                      (60, [8, 8, 8, 4, 4, 2, 2])]


def hard_instance(tasks: int, nodes: int | list[int], seed: int) -> dict[str, Any]:
    """``tasks`` tasks of the hard family on ``nodes`` nodes of 8 GPUs, or on nodes of the
    sizes listed."""
    sizes = [8] * nodes if isinstance(nodes, int) else list(nodes)
    rng = random.Random(seed)
    wide_target = round(tasks * rng.uniform(0.2, 1 / 3))
    groups: list[dict[str, Any]] = []  # one base fine-tune and its variants
    count = wide = 0
    while count < tasks:
        is_wide = wide < wide_target
        size = rng.choice(WIDE_SIZES_B) if is_wide else \
            rng.choices(SIZES_B[:5], SIZE_WEIGHTS[:5])[0]
        options = _hard_options(size, is_wide, rng)
        if not options:
            continue
        variants = min(rng.randint(1, 4), tasks - count)
        if is_wide:
            variants = min(variants, wide_target - wide)
            wide += variants
        groups.append({"base": f"{'long-' if is_wide else ''}gpt{size:g}b-{count:04d}",
                       "size": size, "wide": is_wide, "options": options,
                       "variants": variants})
        count += variants
    # A task longer than most of the per-node work would make the instance bound by that
    # one task (trivial for every planner): re-draw its tokens until none is.
    for _ in range(1000):
        area = sum(g["variants"] * min(o["devices"] * o["seconds"] for o in g["options"])
                   for g in groups) / sum(sizes)
        longest = max(groups, key=lambda g: min(o["seconds"] for o in g["options"]))
        if min(o["seconds"] for o in longest["options"]) <= DOMINANT_SHARE * area:
            break
        longest["options"] = _hard_options(longest["size"], longest["wide"], rng) \
            or longest["options"]
    entries = [{"name": f"{g['base']}-lr{lr}", "options": g["options"]}
               for g in groups for lr in ["1e-5", "3e-5", "1e-4", "3e-4"][:g["variants"]]]
    rng.shuffle(entries)  # grids are not submitted in one block
    return {"cluster": {"nodes": [{"name": f"n{i}", "devices": d} for i, d in enumerate(sizes)]},
            "tasks": entries}


def write(data: dict[str, Any], path: Path) -> None:
    """One task per line, diffable; the large family gzip-compressed (2 MB -> 0.2 MB)."""
    lines = ["{", f' "cluster": {json.dumps(data["cluster"])},', ' "tasks": [']
    lines += [f"  {json.dumps(t)}," for t in data["tasks"]]
    lines[-1] = lines[-1].rstrip(",")
    lines += [" ]", "}"]
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)


def main() -> None:
    folder = Path(__file__).with_name("instances")
    folder.mkdir(exist_ok=True)
    for number, (family, shapes) in enumerate(FAMILIES.items(), start=1):
        for index, (tasks, nodes) in enumerate(shapes, start=1):
            seed = 1000 * number + index  # fixed: the instances never change
            suffix = ".json.gz" if family == "large" else ".json"
            write(instance(tasks, nodes, seed), folder / f"{family}-{index}{suffix}")
    for index, (tasks, nodes) in enumerate(HARD, start=1):
        write(hard_instance(tasks, nodes, 9000 + index), folder / f"hard-{index}.json")
    for index, (tasks, sizes) in enumerate(MIXED, start=1):
        write(hard_instance(tasks, sizes, 9100 + index), folder / f"mixed-{index}.json")


if __name__ == "__main__":
    main()
