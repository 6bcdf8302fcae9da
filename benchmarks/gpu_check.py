"""The accelerator check: what only a CUDA machine can show, in one command, within 8 minutes.

    python benchmarks/gpu_check.py [--out benchmarks/outputs] [--budget 450]

On whatever GPUs this machine has (checks needing more are listed as skipped):

- every technique that fits the GPU count trains a character GPT big enough to keep a
  GPU busy, on CUDA: ``single`` (1 GPU); ``ddp``, ``fsdp``, ``fsdp`` with
  ``cpu_offload``, ``gpipe``, ``1f1b`` and ``xpipe`` in its three weight modes (2 GPUs;
  the pipelines also on 4 where there are 4). ``xpipe`` runs dione's own point-to-point
  over NCCL with activations of megabytes, where a crossed send/receive order hangs
  (each run has a timeout, so a hang is reported, not waited out);
- the profiler's trial runner records a real CUDA out-of-memory (a layer whose
  activations need twice the GPU's memory) as infeasible;
- fp16 (gradient scaler), bf16, clipping and accumulation under single, ddp and fsdp;
- each run's CUDA peak memory (largest over ranks) and median step time, and the median
  step time of a plain torch loop on one GPU training the same model on the same batches.

Prints one table and writes it, with the raw numbers as JSON, to
``benchmarks/outputs/gpu_check-<time>.{txt,json}``. Without a CUDA device it says so and
exits (status 0: nothing to check is not a failure of the code).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dione.launch import local_placement, run_slice
from dione.spec import Node
from dione.spec.task import Task
from dione.techniques.batches import BatchSource
from dione.zoo import CharGPT, sequence_cross_entropy, text_train

__all__ = ["main"]

SIZE = {"context": 256, "width": 512, "layers": 6, "heads": 8, "batch": 32}
# --dry-run-on-cpu: the same checks on 2 CPU slots over gloo, a tiny model, the CUDA-only
# ones skipped: proves the script itself before a GPU's time is spent on it.
TINY = {"context": 32, "width": 32, "layers": 2, "heads": 2, "batch": 8}
KIND = "cuda"
STEPS = 24  # the first third is warm-up, left out of the median
RUN_TIMEOUT = 150.0  # seconds per gang: a hung NCCL exchange ends here, as a failure


@dataclass
class Check:
    """One row of the table."""

    name: str
    devices: int
    status: str = "skipped"
    detail: str = ""
    step_ms: float | None = None
    peak_gib: float | None = None
    losses: list[float] = field(default_factory=list)


def busy_task(steps: int = STEPS, **changes: Any) -> Task:
    """A character GPT large enough that a step is GPU work, not launch overhead."""
    return replace(Task(
        name="gpu-check-gpt",
        model=functools.partial(CharGPT, context=SIZE["context"], width=SIZE["width"],
                                layers=SIZE["layers"], heads=SIZE["heads"]),
        data=functools.partial(text_train, SIZE["context"]),
        loss=sequence_cross_entropy,
        optimizer=functools.partial(torch.optim.AdamW, lr=3e-4),
        batch_size=SIZE["batch"],
        steps=steps,
        seed=0,
    ), **changes)


def oom_task(total_bytes: int) -> Task:
    """One hidden layer whose activations (batch x hidden floats) need twice the GPU."""
    batch, width_in = 4096, 8  # few inputs: the weights stay small, the host builds fast
    hidden = math.ceil(2 * total_bytes / (batch * 4))

    # Nested, so cloudpickle ships them to the workers by value.
    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def data() -> torch.utils.data.TensorDataset:
        generator = torch.Generator().manual_seed(0)
        return torch.utils.data.TensorDataset(
            torch.randn(batch, width_in, generator=generator),
            torch.randint(0, 2, (batch,), generator=generator))

    return Task(name="gpu-check-oom", model=model,
                data=data, loss=nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=batch,
                steps=2, techniques=("single",))


def median_ms(seconds: list[float]) -> float:
    return 1000 * statistics.median(seconds[len(seconds) // 3:])


def run_technique(check: Check, technique: str, knobs: dict[str, Any], gpus: int,
                  scratch: Path, changes: dict[str, Any] | None = None) -> None:
    node = Node("gpus", gpus, KIND)
    began = time.perf_counter()
    try:
        result = run_slice(busy_task(**(changes or {})), technique,
                           scratch / check.name.replace(" ", "_"),
                           local_placement(node, list(range(check.devices))), knobs=knobs,
                           timeout=RUN_TIMEOUT, evaluate=False)
    except Exception as err:  # a failure is a finding: record it, run the rest
        check.status = "FAILED"
        check.detail = f"{type(err).__name__}: {str(err)[:300]}"
        if time.perf_counter() - began >= RUN_TIMEOUT - 1:
            check.detail = "timed out (a hang?): " + check.detail
        return
    check.losses = [float(x) for x in result.losses]
    check.step_ms = median_ms(result.step_seconds)
    if result.peak_memory_bytes:
        check.peak_gib = max(result.peak_memory_bytes) / 2**30
    finite = all(math.isfinite(x) for x in check.losses)
    falls = check.losses[-1] < check.losses[0]
    check.status = "ok" if finite and falls else "FAILED"
    check.detail = (f"loss {check.losses[0]:.3f} -> {check.losses[-1]:.3f}"
                    + ("" if finite else ", not finite") + ("" if falls else ", did not fall"))
    if technique == "xpipe":
        backend = "NCCL" if KIND == "cuda" else "gloo"
        check.detail += (f"; {backend} p2p ok, unwaited sends "
                         f"{result.extra['most_unwaited_sends']}, weight copies "
                         f"{result.extra['most_weight_copies']}")


def plain_loop(check: Check) -> None:
    """What a careful user writes by hand on one GPU: the same model, batches and optimizer."""
    task = busy_task()
    torch.manual_seed(task.seed)
    device = torch.device("cuda", 0)
    model = task.model().to(device)
    optimizer = task.optimizer(model.parameters())
    source = BatchSource(task.data(), task.batch_size, task.seed)
    torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    last = time.perf_counter()
    for step in range(STEPS):
        inputs, target = source.global_batch(step)
        loss = task.loss(model(inputs.to(device, non_blocking=True)),
                         target.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))  # synchronises, as dione's per-step loss does
        now = time.perf_counter()
        times.append(now - last)
        last = now
    check.losses = losses
    check.step_ms = median_ms(times)
    check.peak_gib = torch.cuda.max_memory_allocated(device) / 2**30
    check.status = "ok"
    check.detail = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    del model, optimizer
    torch.cuda.empty_cache()


def out_of_memory(check: Check, scratch: Path) -> None:
    from dione.profile.options import TrialOptions
    from dione.profile.trial import TrialSpec, run_trial

    total = torch.cuda.get_device_properties(0).total_memory
    spec = TrialSpec(task=oom_task(total), technique="single", knobs={}, devices=1,
                     fingerprint="gpu-check-oom", device="cuda")
    record, _ = run_trial(spec, Node("gpus", 1, "cuda"), [0], scratch / "oom",
                          TrialOptions(warmup_steps=1, measure_steps=1, timeout=RUN_TIMEOUT))
    infeasible = record.status == "oom" and not record.feasible
    check.status = "ok" if infeasible else "FAILED"
    check.detail = f"trial status {record.status!r}, feasible {record.feasible}" + (
        "" if infeasible else f": {(record.reason or '')[:300]}")


def table(checks: list[Check], header: str) -> str:
    single = next((c.step_ms for c in checks if c.name == "single" and c.step_ms), None)
    lines = [header, "",
             "| check | GPUs | status | median step ms | vs single | peak GiB | detail |",
             "| --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for c in checks:
        ms = f"{c.step_ms:.1f}" if c.step_ms is not None else ""
        ratio = f"{c.step_ms / single:.2f}" if c.step_ms is not None and single else ""
        peak = f"{c.peak_gib:.2f}" if c.peak_gib is not None else ""
        lines.append(f"| {c.name} | {c.devices} | {c.status} | {ms} | {ratio} | {peak} | "
                     f"{c.detail} |")
    return "\n".join(lines)


def plan(gpus: int) -> list[tuple[Check, Callable[[Check, Path], None] | None]]:
    """Every check, with how to run it, or None where this machine has too few GPUs."""
    rows: list[tuple[Check, Callable[[Check, Path], None] | None]] = []

    def technique(name: str, devices: int, tech: str, knobs: dict[str, Any],
                  **changes: Any) -> None:
        check = Check(name, devices)
        if devices > gpus:
            check.detail = f"needs {devices} GPUs, this machine has {gpus}"
            rows.append((check, None))
        elif KIND == "cpu" and (knobs.get("cpu_offload") or changes.get("precision") == "fp16"):
            check.detail = "CUDA only (dry run on CPU)"
            rows.append((check, None))
        else:
            rows.append((check, lambda c, scratch: run_technique(c, tech, knobs, gpus, scratch,
                                                                 changes)))

    cuda = KIND == "cuda"
    rows.append((Check("plain torch loop", 1), (lambda c, scratch: plain_loop(c)) if cuda
                 else None))
    technique("single", 1, "single", {})
    rows.append((Check("CUDA OOM -> profiler infeasible", 1), out_of_memory if cuda else None))
    technique("ddp", 2, "ddp", {})
    technique("fsdp", 2, "fsdp", {})
    technique("fsdp cpu_offload", 2, "fsdp", {"cpu_offload": True})
    # Mixed precision on CUDA (issue 20): fp16's gradient scaler (its unscale and inf check
    # over DDP's averaged and FSDP2's sharded gradients) has never run elsewhere.
    technique("single fp16", 1, "single", {}, precision="fp16")
    technique("ddp fp16 clip", 2, "ddp", {}, precision="fp16", clip_grad_norm=1.0)
    technique("fsdp fp16 clip accumulate", 2, "fsdp", {"accumulation": 2}, precision="fp16",
              clip_grad_norm=1.0)
    technique("fsdp bf16 clip", 2, "fsdp", {}, precision="bf16", clip_grad_norm=1.0)
    for k in (2, 4):
        technique(f"gpipe x{k}", k, "gpipe", {"micro_batches": 2 * k})
        technique(f"1f1b x{k}", k, "1f1b", {"micro_batches": 2 * k})
        technique(f"xpipe x{k}", k, "xpipe", {"micro_batches": k})
    technique("xpipe x2 T=1", 2, "xpipe", {"micro_batches": 1})
    technique("xpipe x2 stashing", 2, "xpipe", {"micro_batches": 2, "prediction": False})
    technique("xpipe x2 no stashing", 2, "xpipe",
              {"micro_batches": 2, "prediction": False, "stashing": False})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "outputs")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds; checks not started by then are skipped (default 450)")
    parser.add_argument("--dry-run-on-cpu", action="store_true",
                        help="run the checks on 2 CPU slots with a tiny model (no GPU needed)")
    args = parser.parse_args(argv)
    global KIND
    if args.dry_run_on_cpu:
        KIND = "cpu"
        SIZE.update(TINY)
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing "
              "to check. Run it on a machine with an NVIDIA GPU.")
        return 0
    began = time.perf_counter()
    if KIND == "cpu":
        gpus, name, nccl = 2, "CPU slot (dry run, gloo)", "none"
    else:
        gpus = torch.cuda.device_count()
        name = torch.cuda.get_device_name(0)
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
        except Exception:  # an unusual build: the table says so instead of failing
            nccl = "unknown"
    header = (f"gpu_check {time.strftime('%Y-%m-%d %H:%M:%S')}: {gpus} x {name}, torch "
              f"{torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}; CharGPT width "
              f"{SIZE['width']}, {SIZE['layers']} blocks, context {SIZE['context']}, batch "
              f"{SIZE['batch']}, {STEPS} steps per run")
    print(header, flush=True)
    checks: list[Check] = []
    with tempfile.TemporaryDirectory() as tmp:
        for check, run in plan(gpus):
            checks.append(check)
            if run is None:
                continue
            if time.perf_counter() - began > args.budget:
                check.detail = f"not started: past the {args.budget:.0f} s budget"
                continue
            started = time.perf_counter()
            run(check, Path(tmp))
            print(f"  {check.name}: {check.status} ({time.perf_counter() - started:.0f} s) "
                  f"{check.detail}", flush=True)
    text = table(checks, header)
    print("\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"gpu_check-{time.strftime('%Y-%m-%d-%H%M%S')}"
    stem.with_suffix(".txt").write_text(text + "\n")
    stem.with_suffix(".json").write_text(json.dumps(
        {"header": header, "seconds": time.perf_counter() - began,
         "checks": [vars(c) for c in checks]}, indent=1))
    print(f"\nwritten: {stem}.txt, {stem}.json")
    return 1 if any(c.status == "FAILED" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
