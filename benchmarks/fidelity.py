"""How far each technique's per-step losses are from ``single``'s, for three kinds of task.

    python benchmarks/fidelity.py [--steps 8] [--out FILE.json]
    python benchmarks/fidelity.py --long        # single against gpipe x4 over 300 steps

The contract (``dione.spec.task.Task``): an exact technique trains as ``single`` does, up
to floating-point reduction order. Three tasks, as Hugging Face users write them, each
trained once under ``single`` and once under every other technique on 2 CPU slots of
this machine, one slice each, from the same initial weights and samples:

- ``padded-lm``: a tiny Llama on windows of the bundled text cut to random lengths
  (8 to 32 bytes), right-padded, with ``labels`` -100 on the padding and the model's own
  loss: a mean over the tokens that count, which differ from sample to sample;
- ``packed-lm``: a tiny GPT-2 on full windows (every sample counts as many tokens);
- ``bert``: a tiny BERT sequence classifier with a loss on its logits.

Reported per task and technique: the largest relative difference of a step's loss from
``single``'s, ``max_t |L_t - L_t(single)| / |L_t(single)|``. The figures go into
``benchmarks/RESULTS.md`` ("Fidelity to single"). No timing here: the figures do not
depend on the machine's load.

``--long``: the character GPT of ``benchmarks/xpipe_chargpt.py`` at lr 3e-2 (3x the rate
single trains best), 300 steps, under single and gpipe on 4 stages: the step from which
their losses differ by more than 1e-4 relative, and their final validation losses. An
exact technique matches single up to floating-point reduction order; over hundreds of
steps at a high rate that order alone may let the curves part.

The "before" table (``benchmarks/outputs/fidelity-before-04c4a38.json``) was taken at
commit 04c4a38 with this script's first version, which defined the padded data set and
the tiny Llama itself (the same data and model as ``dione.zoo.hf``'s now).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import tempfile
from typing import Any

import torch

from dione.launch import local_placement, run_slice
from dione.spec import Node, Task
from dione.zoo.hf import (
    bert_tiny,
    gpt2_tiny,
    llama_tiny,
    lm_data,
    logits_cross_entropy,
    module_data,
    padded_lm_data,
)

NODE = Node("bench", 2, "cpu")
TECHNIQUES: list[tuple[str, dict[str, Any], int]] = [
    ("ddp", {}, 2),
    ("fsdp", {}, 2),
    ("single", {"accumulation": 2}, 1),
    ("gpipe", {"micro_batches": 4}, 2),
    ("1f1b", {"micro_batches": 4}, 2),
    ("xpipe", {"micro_batches": 4}, 2),
]


def tasks(steps: int) -> dict[str, Task]:
    adamw = functools.partial(torch.optim.AdamW, lr=3e-3)
    return {
        "padded-lm": Task(name="padded-lm", model=llama_tiny, data=padded_lm_data,
                          optimizer=adamw, batch_size=8, steps=steps, seed=5),
        "packed-lm": Task(name="packed-lm", model=functools.partial(gpt2_tiny, width=32),
                          data=lm_data, optimizer=adamw, batch_size=8, steps=steps, seed=5),
        "bert": Task(name="bert", model=functools.partial(bert_tiny, width=32),
                     data=module_data, loss=logits_cross_entropy, optimizer=adamw,
                     batch_size=8, steps=steps, seed=5),
    }


def losses(task: Task, technique: str, knobs: dict[str, Any], devices: int) -> list[float]:
    if technique == "xpipe" and "allow_inexact" in {f.name for f in dataclasses.fields(Task)}:
        task = dataclasses.replace(task, allow_inexact=True)  # type: ignore[call-arg]
    with tempfile.TemporaryDirectory() as folder:
        result = run_slice(task, technique, folder,
                           local_placement(NODE, list(range(devices))), knobs=knobs)
    return list(result.losses)


def long_run(steps: int = 300) -> None:
    from dione.zoo import CharGPT, sequence_cross_entropy, text_train, text_validation_loss

    task = Task(name="char", model=functools.partial(CharGPT, context=32, width=32, layers=2,
                                                     heads=2),
                data=functools.partial(text_train, 32), loss=sequence_cross_entropy,
                optimizer=functools.partial(torch.optim.AdamW, lr=3e-2), batch_size=16,
                steps=steps, seed=0, evaluate=functools.partial(text_validation_loss,
                                                                context=32))
    runs = {}
    for technique, devices in (("single", 1), ("gpipe", 4)):
        with tempfile.TemporaryDirectory() as folder:
            result = run_slice(task, technique, folder, local_placement(
                Node("bench", 4, "cpu"), list(range(devices))), knobs={})
        runs[technique] = result
    single, gpipe = runs["single"], runs["gpipe"]
    apart = next((i + 1 for i, (a, b) in enumerate(zip(gpipe.losses, single.losses,
                                                       strict=True))
                  if abs(a - b) / abs(b) > 1e-4), None)
    first = max(abs(a - b) / abs(b) for a, b in zip(gpipe.losses[:10], single.losses[:10],
                                                    strict=True))
    print(f"char lr 3e-2, {steps} steps: steps 1-10 within {first:.1e}; apart by more than "
          f"1e-4 from step {apart}; final validation loss single "
          f"{single.evaluation['val_loss']:.4f}, gpipe x4 {gpipe.evaluation['val_loss']:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", help="also write the figures to this JSON file")
    parser.add_argument("--long", action="store_true", help="single against gpipe x4 over "
                        "300 steps of the character GPT at lr 3e-2")
    args = parser.parse_args()
    if args.long:
        long_run()
        return
    table: dict[str, dict[str, float]] = {}
    for name, task in tasks(args.steps).items():
        reference = losses(task, "single", {}, 1)
        row = table.setdefault(name, {})
        for technique, knobs, devices in TECHNIQUES:
            label = technique + "".join(f" {k}={v}" for k, v in knobs.items())
            try:
                other = losses(task, technique, knobs, devices)
            except Exception as err:  # a technique that cannot train the task: say why
                print(f"{name} {label}: {type(err).__name__}: {str(err).splitlines()[0]}")
                row[label] = float("nan")
                continue
            row[label] = max(abs(a - b) / abs(b) for a, b in zip(other, reference, strict=True))
            print(f"{name:10s} {label:22s} max relative difference {row[label]:.2e}",
                  flush=True)
    labels = list(next(iter(table.values())))
    print("\n| task | " + " | ".join(labels) + " |")
    print("| --- |" + " --- |" * len(labels))
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row[label]:.1e}" for label in labels) + " |")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(table, out, indent=1)


if __name__ == "__main__":
    main()
