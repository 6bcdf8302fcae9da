"""The accelerator check: that dione trains on CUDA as it does on the CPU, one command.

    python benchmarks/gpu_check.py [--out benchmarks/outputs] [--budget 450]
    python benchmarks/gpu_check.py --dry-run-on-cpu     # the script itself, on 4 CPU slots

What it proves, in this order (so that the check most likely to hang runs while there
is time to read why):

1. **NCCL point-to-point and all-reduce** (2 GPUs): ``xpipe`` runs dione's own sends and
   receives over NCCL, which pairs a link's messages in the order they are posted (a
   crossed order hangs), and ``ddp`` its gradient all-reduce;
2. **CUDA against the CPU** (1 GPU): ``single`` on a small character GPT, its per-step
   losses against the same run on the CPU (float32, TF32 off, as torch's default);
3. **every technique against single on CUDA**: ``ddp``, ``fsdp`` (and ``cpu_offload``),
   accumulation, ``gpipe`` and ``1f1b`` on 2 GPUs (and 4 where there are 4) must give
   CUDA single's per-step losses within reduction order; a padded, token-averaged LM
   too (the global token count all-reduced over NCCL); ``bf16`` and ``fp16`` (gradient
   scaler) within their precision; ``xpipe`` (not exact) its first step exactly and a
   final loss near single's;
4. the profiler records a real CUDA out-of-memory as infeasible;
5. speed: median step time of single, ddp and xpipe on a model big enough to keep a GPU
   busy, and of a plain torch loop training the same model on one GPU.

Each comparison states its tolerance (``TOLERANCES``): the relative difference allowed
per step from its reference. A check that needs more GPUs than the machine has is listed
as ``not run: needs N GPUs`` (NCCL cannot put two ranks of a gang on one GPU), as is one
the time budget did not reach.

Every gang runs with ``NCCL_DEBUG=WARN``, a collective timeout shorter than the gang's
(``DIONE_COLLECTIVE_TIMEOUT``) and ``TORCH_NCCL_DUMP_ON_TIMEOUT``, so a hang ends in NCCL's
own flight-recorder dump (``<out>/nccl-trace-*``) before dione stops the gang; a failed
check's rank logs are kept in ``<out>/gpu_check-<time>-logs/``.

Exit status: 0 every check ran and passed; 1 a check failed; 3 none failed but some were
not run (too few GPUs, or the budget). Without a CUDA device (and without
``--dry-run-on-cpu``) it says so and exits 4. Writes the table, and the raw numbers as
JSON, to ``<out>/gpu_check-<time>.{txt,json}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import shutil
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

EXIT_FAILED, EXIT_PARTLY, EXIT_NO_GPU = 1, 3, 4
# The comparisons' task: small enough that the CPU reference takes seconds.
SMALL = {"context": 64, "width": 128, "layers": 4, "heads": 4, "batch": 16, "steps": 10}
# The speed rows' task: a step is GPU work, not launch overhead.
BUSY = {"context": 256, "width": 512, "layers": 6, "heads": 8, "batch": 32, "steps": 24}
# --dry-run-on-cpu: every size tiny.
TINY = {"context": 32, "width": 32, "layers": 2, "heads": 2, "batch": 8, "steps": 4}
RUN_TIMEOUT = 150.0  # seconds per gang
COLLECTIVE_TIMEOUT = 90  # seconds: NCCL's watchdog fires (and dumps) before the gang ends

# Relative difference allowed per step from the reference. Exact techniques differ from
# single only in reduction order (1-2 float32 ulps a step on the CPU, tests/test_
# equivalence.py), which AdamW magnifies over the steps; CUDA's kernels reduce in other
# orders than the CPU's; bf16 rounds every matmul input to 8 bits of mantissa and the
# split batch's shapes pick other kernels; fp16 has a loss scaler and 11 bits.
TOLERANCES = {"cpu": 1e-3, "exact": 1e-4, "bf16": 1e-2, "fp16": 2e-2,
              "xpipe-first": 1e-4, "xpipe-final": 5e-2}


@dataclass
class Check:
    """One row of the table."""

    name: str
    devices: int
    status: str = "not run"
    detail: str = ""
    step_ms: float | None = None
    peak_gib: float | None = None
    losses: list[float] = field(default_factory=list)
    worst: float | None = None  # largest relative difference from its reference


@dataclass
class Setup:
    """What every check of one invocation shares."""

    kind: str  # cuda, or cpu for the dry run
    gpus: int
    sizes: dict[str, dict[str, int]]
    scratch: Path
    logs: Path
    references: dict[str, list[float]] = field(default_factory=dict)


def char_task(size: dict[str, int], **changes: Any) -> Task:
    return replace(Task(
        name="gpu-check-gpt",
        model=functools.partial(CharGPT, context=size["context"], width=size["width"],
                                layers=size["layers"], heads=size["heads"]),
        data=functools.partial(text_train, size["context"]),
        loss=sequence_cross_entropy,
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
        batch_size=size["batch"], steps=size["steps"], seed=0), **changes)


def padded_lm_task(size: dict[str, int]) -> Task:
    """A Llama on windows of random lengths, labels -100 on the padding (its own loss)."""
    from dione.zoo.hf import llama_tiny, padded_lm_data

    return Task(name="gpu-check-padded-lm", model=functools.partial(llama_tiny, width=64),
                data=padded_lm_data, optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
                batch_size=size["batch"], steps=size["steps"], seed=0)


def oom_task(total_bytes: int) -> Task:
    """One hidden layer whose activations (batch x hidden floats) need twice the GPU."""
    batch, width_in = 4096, 8
    hidden = math.ceil(2 * total_bytes / (batch * 4))

    def model() -> nn.Module:  # nested: cloudpickle ships it to the workers by value
        return nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def data() -> torch.utils.data.TensorDataset:
        generator = torch.Generator().manual_seed(0)
        return torch.utils.data.TensorDataset(
            torch.randn(batch, width_in, generator=generator),
            torch.randint(0, 2, (batch,), generator=generator))

    return Task(name="gpu-check-oom", model=model, data=data,
                loss=nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=batch,
                steps=2, techniques=("single",))


def median_ms(seconds: list[float]) -> float:
    return 1000 * statistics.median(seconds[len(seconds) // 3:])


def worst_difference(losses: list[float], reference: list[float]) -> float:
    return max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference,
                                                               strict=True)), default=0.0)


def train(setup: Setup, check: Check, task: Task, technique: str, knobs: dict[str, Any],
          kind: str | None = None) -> Any:
    """One slice of ``task``; its result, or None with the check marked FAILED (and its
    rank logs kept)."""
    kind = kind or setup.kind
    node = Node("gpus", max(setup.gpus, check.devices), kind)
    run_dir = setup.scratch / check.name.replace(" ", "_")
    began = time.perf_counter()
    try:
        return run_slice(task, technique, run_dir, local_placement(node, list(range(
            check.devices))), knobs=knobs, timeout=RUN_TIMEOUT, evaluate=False)
    except Exception as err:  # a failure is a finding: record it, run the rest
        check.status = "FAILED"
        check.detail = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        if time.perf_counter() - began >= RUN_TIMEOUT - 1:
            check.detail = "timed out (a hang? see the NCCL trace): " + check.detail
        if (run_dir / "logs").is_dir():
            shutil.copytree(run_dir / "logs", setup.logs / run_dir.name, dirs_exist_ok=True)
            check.detail += f"; rank logs in {setup.logs / run_dir.name}"
        return None


def compare(setup: Setup, check: Check, result: Any, reference: str, tolerance: str) -> None:
    """Mark ``check`` by its losses against the reference run ``reference``."""
    check.losses = [float(x) for x in result.losses]
    check.step_ms = median_ms(result.step_seconds)
    if result.peak_memory_bytes:
        check.peak_gib = max(result.peak_memory_bytes) / 2**30
    expected = setup.references.get(reference)
    if expected is None:
        check.status, check.detail = "FAILED", f"its reference ({reference}) did not run"
        return
    check.worst = worst_difference(check.losses, expected)
    bound = TOLERANCES[tolerance]
    finite = all(math.isfinite(x) for x in check.losses)
    check.status = "ok" if finite and check.worst <= bound else "FAILED"
    check.detail = (f"vs {reference}: worst step {check.worst:.1e} (allowed {bound:.0e})"
                    + ("" if finite else ", not finite"))


def reference(name: str, task: Task, kind: str | None = None) -> Callable[[Setup, Check], None]:
    """A run every later check of its family is compared with."""

    def run(setup: Setup, check: Check) -> None:
        result = train(setup, check, task, "single", {}, kind)
        if result is None:
            return
        setup.references[name] = [float(x) for x in result.losses]
        check.losses, check.step_ms = setup.references[name], median_ms(result.step_seconds)
        check.status, check.detail = "ok", f"reference {name}"
        if kind is None and "cpu" in setup.references and name == "single":
            compare(setup, check, result, "cpu", "cpu")

    return run


def against(task: Task, technique: str, knobs: dict[str, Any], ref: str,
            tolerance: str) -> Callable[[Setup, Check], None]:
    def run(setup: Setup, check: Check) -> None:
        result = train(setup, check, task, technique, knobs)
        if result is not None:
            compare(setup, check, result, ref, tolerance)

    return run


def xpipe_run(task: Task, knobs: dict[str, Any]) -> Callable[[Setup, Check], None]:
    """xpipe is not exact: its first step (every stage on the initial weights) must be
    single's, and its last near single's."""

    def run(setup: Setup, check: Check) -> None:
        result = train(setup, check, replace(task, allow_inexact=True), "xpipe", knobs)
        if result is None:
            return
        compare(setup, check, result, "single", "xpipe-first")
        single = setup.references.get("single")
        if single is None:
            return
        first = worst_difference(check.losses[:1], single[:1])
        final = worst_difference(check.losses[-1:], single[-1:])
        passed = first <= TOLERANCES["xpipe-first"] and final <= TOLERANCES["xpipe-final"]
        check.status = "ok" if passed else "FAILED"
        check.detail = (f"first step vs single {first:.1e} (allowed "
                        f"{TOLERANCES['xpipe-first']:.0e}), final {final:.1e} (allowed "
                        f"{TOLERANCES['xpipe-final']:.0e}); "
                        f"{'NCCL' if setup.kind == 'cuda' else 'gloo'} p2p: unwaited sends "
                        f"{result.extra['most_unwaited_sends']}, weight copies "
                        f"{result.extra['most_weight_copies']}")

    return run


def speed(task: Task, technique: str, knobs: dict[str, Any]) -> Callable[[Setup, Check], None]:
    def run(setup: Setup, check: Check) -> None:
        changes = {"allow_inexact": True} if technique == "xpipe" else {}
        result = train(setup, check, replace(task, **changes), technique, knobs)
        if result is None:
            return
        check.losses = [float(x) for x in result.losses]
        check.step_ms = median_ms(result.step_seconds)
        check.peak_gib = max(result.peak_memory_bytes) / 2**30
        falls = check.losses[-1] < check.losses[0]
        check.status = "ok" if falls and all(map(math.isfinite, check.losses)) else "FAILED"
        check.detail = f"loss {check.losses[0]:.3f} -> {check.losses[-1]:.3f}"

    return run


def plain_loop(task: Task) -> Callable[[Setup, Check], None]:
    """What a careful user writes by hand on one GPU: the same model, batches, optimizer."""

    def run(setup: Setup, check: Check) -> None:
        torch.manual_seed(task.seed)
        device = torch.device("cuda", 0)
        model = task.model().to(device)
        optimizer = task.optimizer(model.parameters())
        source = BatchSource(task.data(), task.batch_size, task.seed)
        assert task.loss is not None and task.steps is not None
        torch.cuda.reset_peak_memory_stats(device)
        times, losses = [], []
        last = time.perf_counter()
        for step in range(task.steps):
            inputs, target = source.global_batch(step)
            loss = task.loss(model(inputs.to(device)), target.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            losses.append(float(loss))  # synchronises, as dione's per-step loss does
            now = time.perf_counter()
            times.append(now - last)
            last = now
        check.losses, check.step_ms = losses, median_ms(times)
        check.peak_gib = torch.cuda.max_memory_allocated(device) / 2**30
        check.status, check.detail = "ok", f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
        del model, optimizer
        torch.cuda.empty_cache()

    return run


def out_of_memory(setup: Setup, check: Check) -> None:
    from dione.profile.options import TrialOptions
    from dione.profile.trial import TrialSpec, run_trial

    total = torch.cuda.get_device_properties(0).total_memory
    spec = TrialSpec(task=oom_task(total), technique="single", knobs={}, devices=1,
                     fingerprint="gpu-check-oom", device="cuda")
    record, _ = run_trial(spec, Node("gpus", 1, "cuda"), [0], setup.scratch / "oom",
                          TrialOptions(warmup_steps=1, measure_steps=1, timeout=RUN_TIMEOUT))
    infeasible = record.status == "oom" and not record.feasible
    check.status = "ok" if infeasible else "FAILED"
    check.detail = f"trial status {record.status!r}, feasible {record.feasible}" + (
        "" if infeasible else f": {(record.reason or '')[:300]}")


Row = tuple[Check, Callable[[Setup, Check], None] | None]


def plan(setup: Setup) -> list[Row]:
    """Every check in the order it runs, with how, or None and why it cannot here."""
    small, busy = setup.sizes["small"], setup.sizes["busy"]
    cuda = setup.kind == "cuda"
    task = char_task(small)
    rows: list[Row] = []

    def add(name: str, devices: int, run: Callable[[Setup, Check], None],
            cuda_only: bool = False) -> None:
        check = Check(name, devices)
        if devices > setup.gpus:
            check.detail = (f"not run: needs {devices} GPUs, this machine has {setup.gpus} "
                            "(NCCL puts one rank of a gang on each GPU)")
            rows.append((check, None))
        elif cuda_only and not cuda:
            check.status, check.detail = "skipped", "CUDA only (dry run on CPU)"
            rows.append((check, None))
        else:
            rows.append((check, run))

    # References first (cheap): the CPU's, then CUDA single's, which the rest compare to.
    if cuda:
        add("single on the CPU (reference)", 1, reference("cpu", task, kind="cpu"))
    add("single", 1, reference("single", task))
    # 1. The collectives most likely to hang, while there is time to read why.
    add("xpipe x2 (NCCL point-to-point)", 2, xpipe_run(task, {"micro_batches": 2}))
    add("ddp x2 (NCCL all-reduce)", 2, against(task, "ddp", {}, "single", "exact"))
    # 3. Every technique against single.
    add("fsdp x2", 2, against(task, "fsdp", {}, "single", "exact"))
    add("fsdp x2 cpu_offload", 2, against(task, "fsdp", {"cpu_offload": True}, "single",
                                          "exact"), cuda_only=True)
    add("single accumulation 2", 1, against(task, "single", {"accumulation": 2}, "single",
                                            "exact"))
    for k in (2, 4):
        add(f"gpipe x{k}", k, against(task, "gpipe", {"micro_batches": 2 * k}, "single",
                                      "exact"))
        add(f"1f1b x{k}", k, against(task, "1f1b", {"micro_batches": 2 * k}, "single",
                                     "exact"))
    add("xpipe x4", 4, xpipe_run(task, {"micro_batches": 4}))
    add("xpipe x2 stashing", 2, xpipe_run(task, {"micro_batches": 2, "prediction": False}))
    padded = padded_lm_task(small)
    add("padded LM single", 1, reference("padded", padded))
    add("padded LM ddp x2 (token count all-reduced)", 2,
        against(padded, "ddp", {}, "padded", "exact"))
    add("padded LM gpipe x2", 2, against(padded, "gpipe", {"micro_batches": 4}, "padded",
                                         "exact"))
    bf16 = replace(task, precision="bf16", clip_grad_norm=1.0)
    add("single bf16 clip", 1, reference("bf16", bf16))
    add("ddp x2 bf16 clip", 2, against(bf16, "ddp", {}, "bf16", "bf16"))
    add("fsdp x2 bf16 clip", 2, against(bf16, "fsdp", {}, "bf16", "bf16"))
    add("gpipe x2 bf16 clip", 2, against(bf16, "gpipe", {"micro_batches": 4}, "bf16", "bf16"))
    fp16 = replace(task, precision="fp16", clip_grad_norm=1.0)
    add("single fp16 clip", 1, against(fp16, "single", {}, "single", "fp16"), cuda_only=True)
    add("ddp x2 fp16 clip", 2, against(fp16, "ddp", {}, "single", "fp16"), cuda_only=True)
    add("fsdp x2 fp16 clip accumulation 2", 2, against(fp16, "fsdp", {"accumulation": 2},
                                                       "single", "fp16"), cuda_only=True)
    # 4. and 5.
    add("CUDA OOM -> profiler infeasible", 1, out_of_memory, cuda_only=True)
    big = char_task(busy)
    add("speed: plain torch loop", 1, plain_loop(big), cuda_only=True)
    add("speed: single", 1, speed(big, "single", {}), cuda_only=True)
    add("speed: ddp x2", 2, speed(big, "ddp", {}), cuda_only=True)
    add("speed: xpipe x2", 2, speed(big, "xpipe", {"micro_batches": 2}), cuda_only=True)
    return rows


def table(checks: list[Check], header: str) -> str:
    plain = next((c.step_ms for c in checks if c.name == "speed: plain torch loop"
                  and c.step_ms), None)
    lines = [header, "",
             "| check | GPUs | status | worst step vs reference | median step ms | vs plain "
             "loop | peak GiB | detail |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for c in checks:
        worst = f"{c.worst:.1e}" if c.worst is not None else ""
        ms = f"{c.step_ms:.1f}" if c.step_ms is not None else ""
        ratio = (f"{c.step_ms / plain:.2f}" if c.step_ms is not None and plain
                 and c.name.startswith("speed") else "")
        peak = f"{c.peak_gib:.2f}" if c.peak_gib is not None else ""
        lines.append(f"| {c.name} | {c.devices} | {c.status} | {worst} | {ms} | {ratio} | "
                     f"{peak} | {c.detail} |")
    return "\n".join(lines)


def _environment(out: Path) -> None:
    """NCCL's warnings, and its flight recorder dumped when a collective times out,
    which it does before dione's gang timeout (the workers read these at start)."""
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    os.environ["DIONE_COLLECTIVE_TIMEOUT"] = str(COLLECTIVE_TIMEOUT)
    os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "20000"
    os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = str(out / "nccl-trace-rank-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "outputs")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds; checks not started by then are not run (default 450)")
    parser.add_argument("--dry-run-on-cpu", action="store_true",
                        help="run the checks on 4 CPU slots with tiny models (no GPU needed)")
    args = parser.parse_args(argv)
    if args.dry_run_on_cpu:  # 4 slots, so that the 4-stage checks run too
        kind, gpus = "cpu", 4
        sizes = {"small": TINY, "busy": TINY}
        name, nccl = "CPU slot (dry run, gloo)", "none"
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing "
              "was checked. Run it on a machine with an NVIDIA GPU, or with --dry-run-on-cpu.")
        return EXIT_NO_GPU
    else:
        kind, gpus = "cuda", torch.cuda.device_count()
        sizes = {"small": SMALL, "busy": BUSY}
        name = torch.cuda.get_device_name(0)
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
        except Exception:  # an unusual build: the table says so instead of failing
            nccl = "unknown"
    began = time.perf_counter()
    stamp = time.strftime("%Y-%m-%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    _environment(args.out)
    header = (f"gpu_check {stamp}: {gpus} x {name}, torch {torch.__version__}, CUDA "
              f"{torch.version.cuda}, NCCL {nccl}; comparisons on CharGPT width "
              f"{sizes['small']['width']} x {sizes['small']['layers']} blocks, "
              f"{sizes['small']['steps']} steps; tolerances {TOLERANCES}")
    print(header, flush=True)
    checks: list[Check] = []
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(kind, gpus, sizes, Path(tmp), args.out / f"gpu_check-{stamp}-logs")
        for check, run in plan(setup):
            checks.append(check)
            if run is None:
                continue
            if time.perf_counter() - began > args.budget:
                check.detail = f"not run: past the {args.budget:.0f} s budget"
                continue
            started = time.perf_counter()
            run(setup, check)
            print(f"  {check.name}: {check.status} ({time.perf_counter() - started:.0f} s) "
                  f"{check.detail}", flush=True)
    text = table(checks, header)
    print("\n" + text)
    stem = args.out / f"gpu_check-{stamp}"
    stem.with_suffix(".txt").write_text(text + "\n")
    stem.with_suffix(".json").write_text(json.dumps(
        {"header": header, "seconds": time.perf_counter() - began, "tolerances": TOLERANCES,
         "checks": [dataclasses.asdict(c) for c in checks]}, indent=1))
    print(f"\nwritten: {stem}.txt, {stem}.json")
    if any(c.status == "FAILED" for c in checks):
        return EXIT_FAILED
    return EXIT_PARTLY if any(c.status == "not run" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
