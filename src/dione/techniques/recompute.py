"""Activation checkpointing of one module, kept apart so every technique that offers it
(``fsdp``, the pipelines) imports it without importing another technique."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["checkpoint_activations"]


def checkpoint_activations(module: nn.Module) -> None:
    """Recompute ``module``'s activations in backward; its parameter names stay the same
    (a wrapper module would add a prefix to every name in the checkpoint)."""
    forward: Callable[..., Any] = module.forward

    def recomputed_forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = recomputed_forward
