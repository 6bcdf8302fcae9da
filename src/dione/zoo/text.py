"""A character corpus from Python's own standard-library sources, cut into windows."""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

__all__ = [
    "VOCAB_SIZE",
    "stdlib_text",
    "text_train",
    "text_validation",
    "text_validation_loss",
]

VOCAB_SIZE = 128  # ASCII; the rare other byte becomes 0
# Pure-Python modules present in every CPython from 3.10 on, in a fixed order.
_MODULES = ("textwrap.py", "heapq.py", "bisect.py", "functools.py", "fractions.py",
            "argparse.py", "difflib.py", "shlex.py", "string.py", "calendar.py")
VALIDATION_FRACTION = 0.1


@functools.cache
def stdlib_text(max_bytes: int = 400_000) -> bytes:
    """Up to ``max_bytes`` of standard-library source, always the same on one Python."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in _MODULES:
        path = root / name
        if path.is_file():
            parts.append(path.read_bytes())
    text = b"\n".join(parts)[:max_bytes]
    if len(text) < 10_000:
        raise FileNotFoundError(f"found too little Python source under {root}")
    return text


@functools.cache
def _windows(context: int, validation: bool) -> TensorDataset:
    data = torch.tensor(list(stdlib_text()), dtype=torch.long)
    data[data >= VOCAB_SIZE] = 0
    cut = int(len(data) * (1 - VALIDATION_FRACTION))
    part = data[cut:] if validation else data[:cut]
    # Windows overlap by half a context: more distinct samples from a small corpus.
    stride = max(1, context // 2)
    starts = torch.arange(0, len(part) - context - 1, stride)
    offsets = torch.arange(context)
    inputs = part[starts[:, None] + offsets]
    return TensorDataset(inputs, part[starts[:, None] + offsets + 1])


def text_train(context: int = 64) -> TensorDataset:
    """(input, next-character target) windows from the first 90% of the corpus."""
    return _windows(context, False)


def text_validation(context: int = 64) -> TensorDataset:
    """Windows from the last 10% of the corpus, never trained on."""
    return _windows(context, True)


@torch.no_grad()  # called by hand on a loaded model too: no graph, no warning
def text_validation_loss(model: nn.Module, context: int = 64, limit: int = 512) -> dict[str, float]:
    """Mean next-character cross-entropy (nats) on up to ``limit`` validation windows."""
    inputs, target = (t[:limit] for t in text_validation(context).tensors)
    device = next(model.parameters()).device
    logits = model(inputs.to(device)).cpu()
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
    return {"val_loss": float(loss)}
