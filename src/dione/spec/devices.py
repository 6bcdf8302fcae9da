"""The one place that says what a device is here: a CUDA GPU, or a CPU worker slot."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

__all__ = [
    "DeviceKind",
    "available_cores",
    "backend_for",
    "cores_for_slot",
    "device_counts",
    "local_device_count",
    "local_device_kind",
    "max_cpu_slots",
    "threads_per_slot",
    "torch_device",
]

DeviceKind = Literal["cpu", "cuda"]


def local_device_kind() -> DeviceKind:
    """``cuda`` where this machine has a usable GPU, else ``cpu`` (worker slots)."""
    import torch  # here, not at the top: the planner and the store ask nothing of torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "cpu"


def shared_cores(kind: str, slots: int) -> str | None:
    """A warning where ``slots`` CPU devices outnumber this machine's cores (None: they
    do not): a trial is timed with its slot's core to itself, and tasks side by side
    then share cores, so they run slower than planned (2 tasks on cpu:2 ran 2.3x their
    plan on 2 busy cores; cpu:4 on 2 cores shares the catalog rows of cpu:2)."""
    cores = len(available_cores())
    if kind != "cpu" or slots <= cores:
        return None
    return (f"{slots} CPU slots on {cores} core(s): tasks side by side share cores and run "
            "slower than their trials (each timed with a core to itself), so plans are "
            f"optimistic until re-planning sees the slices' pace; devices cpu:{cores} plans "
            "what this machine runs")


def available_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity mask, not the machine's total)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def local_device_count(kind: DeviceKind) -> int:
    """Default device count: every GPU, or one CPU slot per available core."""
    if kind == "cuda":
        import torch

        return torch.cuda.device_count()
    return len(available_cores())


# CPU slots beyond the cores share them: a few per core still test a gang's logic; far
# more only queue dozens of processes on each core (cpu:999 on 2 cores would start
# 999-rank gangs).
CPU_SLOTS_PER_CORE = 4


def max_cpu_slots() -> int:
    """The most CPU worker slots this machine takes: ``CPU_SLOTS_PER_CORE`` per core."""
    return CPU_SLOTS_PER_CORE * len(available_cores())


def backend_for(kind: DeviceKind) -> str:
    """The collective backend a gang on ``kind`` devices talks over."""
    return "nccl" if kind == "cuda" else "gloo"


def torch_device(kind: DeviceKind, device_id: int) -> torch.device:
    """The torch device a worker bound to ``device_id`` computes on."""
    import torch

    return torch.device("cuda", device_id) if kind == "cuda" else torch.device("cpu")


def threads_per_slot(slots: int, cores: int) -> int:
    """Intra-op threads for one worker when ``slots`` devices share ``cores`` cores.

    Workers that each take every core oversubscribe the machine and slow every gang
    down, so each takes its share (at least one).
    """
    return max(1, cores // max(1, slots))


def cores_for_slot(slot: int, slots: int, cores: list[int]) -> list[int] | None:
    """The cores CPU slot ``slot`` is pinned to, or None when slots outnumber cores."""
    share = len(cores) // slots if slots else 0
    if share < 1:
        return None
    return cores[slot * share : (slot + 1) * share]


def device_counts(devices: int) -> list[int]:
    """1, 2, 4, ... up to ``devices``, and ``devices`` itself: the widths profiling tries."""
    counts, count = [], 1
    while count < devices:
        counts.append(count)
        count *= 2
    return [*counts, devices]
