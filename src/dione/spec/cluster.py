"""The cluster: named nodes of devices, the local default and the ``--devices`` syntax."""

from __future__ import annotations

import re
import socket
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import cast

from dione.spec.devices import (
    CPU_SLOTS_PER_CORE,
    DeviceKind,
    available_cores,
    local_device_count,
    local_device_kind,
    max_cpu_slots,
)

__all__ = ["Cluster", "ClusterError", "Node", "NodeBusyError", "check_cpu_slots",
           "local_cluster", "parse_devices"]


class ClusterError(ValueError):
    """A cluster description that cannot be used; the message says how to fix it."""


class NodeBusyError(ClusterError):
    """A node whose devices another job holds: the launcher could not reserve them in
    time (a run goes on without it where other nodes are free)."""

    def __init__(self, message: str, node: str) -> None:
        super().__init__(message)
        self.node = node


@dataclass(frozen=True)
class Node:
    """One machine: ``devices`` devices of one kind; ``cores`` CPU cores they share;
    ``model``: its accelerators' name ("H100"), where a (simulated) cluster mixes them:
    a planning problem's node kind, which options measured on one kind must match."""

    name: str
    devices: int
    kind: DeviceKind = "cpu"
    cores: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ClusterError("a node needs a name")
        if not isinstance(self.devices, int) or self.devices < 1:
            raise ClusterError(f"node {self.name!r}: devices must be a positive integer")
        if self.kind not in ("cpu", "cuda"):
            raise ClusterError(
                f"node {self.name!r}: kind must be 'cpu' or 'cuda', not {self.kind!r}")


@dataclass(frozen=True)
class Cluster:
    """The nodes dione may use; a task never spans nodes."""

    nodes: tuple[Node, ...]

    def __init__(self, nodes: Iterable[Node]) -> None:
        nodes = tuple(nodes)
        if not nodes:
            raise ClusterError("a cluster needs at least one node")
        names = [n.name for n in nodes]
        dupes = sorted(n for n, times in Counter(names).items() if times > 1)
        if dupes:
            raise ClusterError(f"node names must be unique; repeated: {', '.join(dupes)}")
        object.__setattr__(self, "nodes", nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        names = ", ".join(n.name for n in self)
        raise ClusterError(f"no node named {name!r}; the cluster has: {names}")

    @property
    def max_devices(self) -> int:
        return max(n.devices for n in self.nodes)



_DEVICES = re.compile(r"^(?:(cpu|cuda):)?(\d+)$")


def parse_devices(text: str) -> tuple[DeviceKind, int]:
    """Parse ``cpu:4``, ``cuda:2`` or ``4`` (the local kind) into (kind, count)."""
    match = _DEVICES.match(text.strip())
    if not match:
        raise ClusterError(
            f"--devices {text!r} is not understood; write e.g. 'cpu:4', 'cuda:2' or '4'"
        )
    if int(match.group(2)) < 1:
        raise ClusterError(f"--devices {text!r}: the device count must be at least 1"
                           # torch's cuda:0 names a device; here the number counts them
                           + ("; it is a number of devices, not an index: cuda:1 is one "
                              "GPU (CUDA_VISIBLE_DEVICES picks which)"
                              if match.group(1) == "cuda" else ""))
    kind = cast(DeviceKind, match.group(1) or local_device_kind())
    return kind, int(match.group(2))


def check_cpu_slots(kind: DeviceKind, count: int, what: str) -> None:
    """Refuse far more CPU slots than this machine's cores can run, saying the limit."""
    if kind == "cpu" and count > max_cpu_slots():
        raise ClusterError(
            f"{what}: {count} CPU slots is more than this machine runs ({max_cpu_slots()}: "
            f"{CPU_SLOTS_PER_CORE} per core on {len(available_cores())} core(s)); each slot "
            "is a worker process, so ask for fewer")


def local_cluster(devices: str | None = None) -> Cluster:
    """This machine as a one-node cluster: its GPUs, else one CPU slot per core."""
    if devices is None:
        kind: DeviceKind = local_device_kind()
        count = local_device_count(kind)
    else:
        kind, count = parse_devices(devices)
        if kind == "cuda" and count > local_device_count("cuda"):
            raise ClusterError(
                f"--devices {devices}: this machine has {local_device_count('cuda')} CUDA "
                "devices; ask for fewer, or for cpu slots (cpu:N)"
            )
        check_cpu_slots(kind, count, f"--devices {devices}")
    return Cluster([Node(socket.gethostname() or "local", count, kind, len(available_cores()))])
