"""A cluster written as text (``--cluster 4x8``, ``8,8,4``, ``H100:2x8,A100:2x8``) as the
nodes of a planning problem, for `dione plan` and `dione simulate`."""

from __future__ import annotations

import re

from dione.plan.problem import NodeSpec

__all__ = ["parse_nodes"]


def parse_nodes(text: str) -> tuple[NodeSpec, ...]:
    """``NxD`` (N nodes of D devices each: ``4x8``), or ``D,D,...`` (one node each); each
    part may name its nodes' kind first (``H100:2x8,A100:2x8``: two nodes of each).
    Nodes are named n0, n1, ... ValueError saying how to write it."""
    sizes: list[tuple[str | None, int]] = []
    problem = ""
    for part in text.split(","):
        found = re.fullmatch(r"\s*(?:([A-Za-z][\w.-]*)\s*:)?\s*(?:(\d+)\s*[xX]\s*)?(\d+)\s*",
                             part)
        if not found:
            break
        count, devices = int(found.group(2) or 1), int(found.group(3))
        if count < 1:
            problem = ": at least one node"
            break
        if devices < 1:
            problem = ": a node has at least one device"
            break
        sizes += [(found.group(1), devices)] * count
    else:
        if len({kind is None for kind, _ in sizes}) > 1:  # (H100:4,4: the 4 of no kind)
            problem = ": give every part its nodes' kind, or none"
        else:
            return tuple(NodeSpec(f"n{i}", devices, kind)
                         for i, (kind, devices) in enumerate(sizes))
    raise ValueError(f"--cluster {text!r}: give NODESxDEVICES (4x8: four nodes of 8 devices) "
                     f"or devices per node (8,8,4), each part with its nodes' kind first "
                     f"where options differ by kind (H100:2x8,A100:2x8){problem}")
