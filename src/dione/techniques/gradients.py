"""Gradient clipping by the global norm, over a whole model or over pipeline stages."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["clip_gradients"]


def clip_gradients(parameters: Iterable[nn.Parameter], max_norm: float,
                   group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Scale the gradients so that their global L2 norm is at most ``max_norm``; the
    norm before clipping.

    Without ``group`` the parameters are the whole model on this rank (single, DDP's
    averaged replica, or FSDP's DTensor shards, whose norm torch reduces itself). With
    ``group``, each rank holds a disjoint part of the model (a pipeline stage): the
    squared norms are summed over the group first, so every stage clips by the same
    global norm, as one device would.
    """
    params = [p for p in parameters if p.grad is not None]
    if group is None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    grads = [p.grad for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    local = (torch.nn.utils.get_total_norm(grads).to(torch.float32) if grads
             else torch.zeros((), device=device))
    squared = local.square()
    dist.all_reduce(squared, group=group)
    total = squared.sqrt()
    if grads:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
