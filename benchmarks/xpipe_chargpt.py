"""XPipe's convergence on the character GPT: prediction, stashing and no stashing, 5 seeds.

    python benchmarks/xpipe_chargpt.py [--steps 300] [--seeds 5] [--out FILE.json]

The character GPT of ``dione.zoo`` (embedding, 2 blocks, head: 4 stages) on the bundled
text (Python's own standard-library source), batch 16, AdamW. First ``single`` over a
small learning-rate grid picks the rate single trains best (lowest mean validation loss
over the seeds); then at that rate and at 3x it, xpipe on 4 stages with T = 1 (one
micro-batch per mini-batch, the stalest setting) and T = K = 4, each way:

- ``prediction``: XPipe, the bellwether's weights predicted s updates ahead;
- ``stashing``: PipeDream's weight stashing, the bellwether's weights as they are;
- ``none``: no stashing, each forward and backward on the weights the stage holds then.

Per seed the samples and their order are the same under every technique, and single's
curve is gpipe's and 1f1b's too (they are exact; ``tests/test_equivalence.py``). Each
run is one slice of real worker processes (4 CPU slots on this machine's cores), so the
pipeline never drains in between. Reported: the final validation loss (512 held-out
windows), mean and sample sd over seeds, and the mean training loss over windows of
steps, mean and sd over seeds.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dione.launch import local_placement, run_slice
from dione.spec import Node, Task
from dione.zoo import CharGPT, sequence_cross_entropy, text_train, text_validation_loss

CONTEXT = 32
SINGLE_LRS = (1e-3, 3e-3, 1e-2)
WAYS = {"prediction": {"prediction": True, "stashing": True},
        "stashing": {"prediction": False, "stashing": True},
        "none": {"prediction": False, "stashing": False}}


def task(seed: int, lr: float, steps: int) -> Task:
    return Task(name=f"char-{seed}", model=functools.partial(CharGPT, context=CONTEXT,
                                                             width=32, layers=2, heads=2),
                data=functools.partial(text_train, CONTEXT), loss=sequence_cross_entropy,
                optimizer=functools.partial(torch.optim.AdamW, lr=lr), batch_size=16,
                steps=steps, seed=seed,
                evaluate=functools.partial(text_validation_loss, context=CONTEXT))


def train(seed: int, lr: float, steps: int, technique: str,
          knobs: dict[str, Any]) -> dict[str, Any]:
    devices = 1 if technique == "single" else 4
    with tempfile.TemporaryDirectory() as folder:
        result = run_slice(task(seed, lr, steps), technique, folder,
                           local_placement(Node("bench", devices, "cpu"), range(devices)),
                           knobs=knobs)
    return {"losses": result.losses, "val_loss": result.evaluation["val_loss"]}


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def windows(runs: list[dict[str, Any]], steps: int, size: int) -> list[str]:
    cells = []
    for begin in range(0, steps, size):
        per_seed = [statistics.mean(r["losses"][begin:begin + size]) for r in runs]
        cells.append(mean_sd(per_seed))
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--window", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/outputs/xpipe_chargpt.json"))
    args = parser.parse_args()
    seeds = range(args.seeds)
    began = time.time()
    results: dict[str, list[dict[str, Any]]] = {}
    for lr in SINGLE_LRS:
        runs = [train(s, lr, args.steps, "single", {}) for s in seeds]
        results[f"single lr={lr:g}"] = runs
        print(f"single lr={lr:g}: val {mean_sd([r['val_loss'] for r in runs])}", flush=True)
    best = min(SINGLE_LRS, key=lambda lr: statistics.mean(
        r["val_loss"] for r in results[f"single lr={lr:g}"]))
    for lr in (best, 3 * best):
        if f"single lr={lr:g}" not in results:
            results[f"single lr={lr:g}"] = [train(s, lr, args.steps, "single", {})
                                            for s in seeds]
        for micro in (1, 4):
            for way, knobs in WAYS.items():
                key = f"xpipe {way} T={micro} lr={lr:g}"
                results[key] = [train(s, lr, args.steps, "xpipe",
                                      {**knobs, "micro_batches": micro}) for s in seeds]
                print(f"{key}: val {mean_sd([r['val_loss'] for r in results[key]])}",
                      flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"best_single_lr": best, "steps": args.steps,
                                    "results": results}) + "\n")
    header = [f"steps {b + 1}-{min(args.steps, b + args.window)}"
              for b in range(0, args.steps, args.window)]
    print(f"\nbest single lr {best:g}; {args.seeds} seeds; {time.time() - began:.0f} s\n")
    print("| run | final val loss | " + " | ".join(f"train loss, {h}" for h in header) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in header) + " |")
    for key, runs in results.items():
        print(f"| {key} | {mean_sd([r['val_loss'] for r in runs])} | "
              + " | ".join(windows(runs, args.steps, args.window)) + " |")


if __name__ == "__main__":
    main()
