"""The model setups the benchmarks train: the demo's two families, as plain pieces."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.functional import cross_entropy

from dione.zoo import CharGPT, digits_mlp, digits_train, sequence_cross_entropy, text_train


@dataclass(frozen=True)
class Setup:
    model: Callable[[], torch.nn.Module]
    data: Callable[[], Any]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    batch_size: int


MODELS = {
    # The demo's character GPT: width 64, 2 blocks, context 64.
    "chargpt": Setup(CharGPT, text_train, sequence_cross_entropy,
                     functools.partial(torch.optim.AdamW, lr=1e-3), 16),
    # A wider, deeper one: steps long enough that per-step overhead is small in proportion.
    "chargpt-wide": Setup(functools.partial(CharGPT, width=128, layers=4), text_train,
                          sequence_cross_entropy, functools.partial(torch.optim.AdamW, lr=1e-3),
                          32),
    # The demo's digits MLP: steps of about a millisecond, the worst case for overhead.
    "digits": Setup(digits_mlp, digits_train, cross_entropy,
                    functools.partial(torch.optim.AdamW, lr=1e-3), 64),
}
