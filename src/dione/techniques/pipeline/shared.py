"""Weights that several pipeline stages hold (tied embeddings): one gradient, one value.

As Megatron does for tied input and output embeddings, the gradients a shared weight
gets on the stages that use it are summed before each update. Two ways:

- ``to_owner`` / ``from_owner`` (synchronous pipelines): the sum goes to the first stage
  holding the weight (its owner), the others drop their gradient, so only the owner's
  optimizer steps it and a global-norm clip counts it once; the owner then sends the
  new value back. The copies are identical by construction.
- ``summed`` (xpipe): every holder gets the sum and steps it with its own optimizer;
  the holders' optimizer states stay equal, which XPipe's weight prediction reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from dione.techniques.pipeline.stages import SharedWeight

__all__ = ["SharedGradients"]


class SharedGradients:
    """This rank's shared weights, each with the process group of its holders. Built by
    every rank of the gang in the same order (creating a group is collective)."""

    def __init__(self, shared: Sequence[SharedWeight], model: nn.Module, rank: int) -> None:
        params = dict(model.named_parameters())
        self.rank = rank
        self.mine: list[tuple[nn.Parameter, dist.ProcessGroup, int]] = []
        for weight in shared:
            group = dist.new_group(list(weight.stages))
            if rank in weight.stages:
                self.mine.append((params[weight.name], group, weight.stages[0]))

    def forget_state(self, optimizer: torch.optim.Optimizer) -> None:
        """After a restore, on the holders that do not step a shared weight: drop the
        optimizer state the checkpoint gave it, which would go stale as the owner steps
        and then be saved beside the owner's under the same name."""
        for param, _, owner in self.mine:
            if self.rank != owner:
                optimizer.state.pop(param, None)

    def _gradient(self, param: nn.Parameter) -> torch.Tensor:
        if param.grad is None:  # a stage whose micro-batches did not reach it
            param.grad = torch.zeros_like(param)
        return param.grad

    def to_owner(self) -> None:
        """Sum each shared weight's gradients on its owner; the other holders drop theirs."""
        for param, group, owner in self.mine:
            dist.reduce(self._gradient(param), dst=owner, group=group)
            if self.rank != owner:
                param.grad = None

    @torch.no_grad()
    def from_owner(self) -> None:
        """Every holder takes the owner's updated value."""
        for param, group, owner in self.mine:
            dist.broadcast(param.data, src=owner, group=group)

    def summed(self) -> None:
        """Every holder gets the sum of the holders' gradients."""
        for param, group, _ in self.mine:
            dist.all_reduce(self._gradient(param), group=group)
