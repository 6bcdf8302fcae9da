"""What an evaluation under fsdp costs rank 0: its seconds and its process's peak
resident memory, for the way this checkout evaluates (compare two commits by running
this file under each, e.g. with ``PYTHONPATH=<worktree>/src``).

    python benchmarks/fsdp_evaluation.py [--width 512] [--layers 8] [--rounds 3]

One slice of 2 steps of the character GPT under fsdp on 2 CPU devices, evaluated at
its end on held-out text (``val_loss``). The evaluation reads its own process's peak
resident memory (VmHWM, which covers the slice's training too) when it ends, so rank
0's figure is the higher of training's and evaluation's peaks: an evaluation that puts
the whole model together on rank 0 shows there once it needs more than training did.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

WORKLOAD = '''
import functools
import torch
from dione import Task, Workload
from dione.zoo import CharGPT, sequence_cross_entropy, text_train, text_validation_loss


def evaluate(model):
    found = text_validation_loss(model, context=32, limit=64)
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    return {{**found, "peak_mib": peak / 1024}}


workload = Workload([Task(
    name="big", model=functools.partial(CharGPT, context=32, width={width},
                                        layers={layers}, heads=8),
    data=functools.partial(text_train, 32), loss=sequence_cross_entropy,
    optimizer=functools.partial(torch.optim.AdamW, lr=1e-3), batch_size=4, steps=2,
    evaluate=evaluate, techniques=("fsdp",))])
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import dione
    from dione.launch import local_placement, run_slice
    from dione.spec.cluster import Node
    from dione.spec.workload import load_workload

    print(f"dione from {Path(dione.__file__).parent}")
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "big.py"
        file.write_text(WORKLOAD.format(width=args.width, layers=args.layers))
        [task] = list(load_workload(file))
        params = sum(p.numel() for p in task.model().parameters())
        print(f"character GPT width {args.width}, {args.layers} blocks: "
              f"{params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB in fp32)")
        seconds, peaks, losses = [], [], []
        for round_ in range(args.rounds):
            result = run_slice(task, "fsdp", Path(tmp) / f"run{round_}",
                               local_placement(Node("cpu", 2, "cpu"), [0, 1]),
                               evaluate=True, timeout=600)
            assert result.evaluation_error is None, result.evaluation_error
            seconds.append(result.timings["evaluate_seconds"])
            peaks.append(result.evaluation["peak_mib"])
            losses.append(result.evaluation["val_loss"])
            print(f"round {round_}: evaluation {seconds[-1]:.2f} s, rank 0's peak "
                  f"{peaks[-1]:.0f} MiB, val_loss {losses[-1]:.6f}")
        print(f"median: evaluation {statistics.median(seconds):.2f} s, rank 0's peak "
              f"{statistics.median(peaks):.0f} MiB")


if __name__ == "__main__":
    main()
