"""The task's sample order, and each rank's share of a global batch.

Samples form one stream over epochs: epoch ``e`` is a permutation of the data set
drawn from ``(seed, e)`` alone, and global batch ``t`` is stream positions
``[t*B, (t+1)*B)``. So the data position is just the step, it survives any change of
technique or device count, and no RNG state is needed to continue it::

    stream:  | epoch 0 permutation        | epoch 1 permutation        | ...
    batches: [ t=0 ][ t=1 ][ t=2 ][ t=3 ][ t=4 ] ...     (a batch may straddle epochs)
    ranks:   [r0|r1]                                     (equal, contiguous shares)

A batch is whatever the data set's items collate to: an ``(inputs, target)`` pair, a
tuple of tensors, or a dict of tensors (a tokenizer's output). Every split here is of
sample positions, so it does not care which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from dione.spec.batch import split_problem

__all__ = ["Batch", "BatchSource", "SampleOrder", "batch_map", "batch_rows", "slice_batch"]

# A collated batch: tensors, possibly in (nested) tuples, lists and dicts.
Batch = Any


def batch_map(fn: Callable[[torch.Tensor], Any], batch: Batch) -> Batch:
    """``batch`` with ``fn`` applied to each of its tensors, its structure kept."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: batch_map(fn, v) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple):
        return tuple(batch_map(fn, v) for v in batch)
    if isinstance(batch, list):
        return [batch_map(fn, v) for v in batch]
    return batch


def batch_rows(batch: Batch) -> int:
    """The number of samples in ``batch`` (its tensors' first dimension)."""
    rows: list[int] = []
    batch_map(lambda t: rows.append(t.shape[0] if t.dim() else 1), batch)
    if not rows:
        raise ValueError("a batch holds no tensor")
    return rows[0]


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Samples ``[start, stop)`` of ``batch``."""
    return batch_map(lambda t: t[start:stop] if t.dim() else t, batch)


class SampleOrder:
    """Stream positions to data-set indices, one seeded permutation per epoch."""

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("an empty data set has no sample order")
        self.size = size
        self.seed = seed
        self._cache: dict[int, torch.Tensor] = {}

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch not in self._cache:
            if len(self._cache) > 2:  # a batch touches at most two epochs
                self._cache.pop(min(self._cache))
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._cache[epoch] = torch.randperm(self.size, generator=generator)
        return self._cache[epoch]

    def indices(self, start: int, count: int) -> torch.Tensor:
        """Data-set indices at stream positions ``[start, start + count)``."""
        parts = []
        position, end = start, start + count
        while position < end:
            epoch, offset = divmod(position, self.size)
            take = min(end - position, self.size - offset)
            parts.append(self.permutation(epoch)[offset : offset + take])
            position += take
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _fetch(dataset: Dataset[Any], indices: torch.Tensor) -> Batch:
    if isinstance(dataset, TensorDataset):
        return tuple(t[indices] for t in dataset.tensors)
    getitems = getattr(dataset, "__getitems__", None)
    items = getitems(indices.tolist()) if getitems else [dataset[i] for i in indices.tolist()]
    return default_collate(items)  # type: ignore[no-untyped-call]


class BatchSource:
    """Rank ``rank``'s contiguous share of each global batch of a task."""

    def __init__(
        self, dataset: Dataset[Any], batch_size: int, seed: int, rank: int = 0, world: int = 1
    ) -> None:
        problem = split_problem(batch_size, world, "ranks")
        if problem is not None:
            raise ValueError(problem)
        self.dataset = dataset
        self.batch_size = batch_size
        self.share = batch_size // world
        self.rank = rank
        self.order = SampleOrder(len(dataset), seed)  # type: ignore[arg-type]

    def batch(self, step: int, part: int = 0, parts: int = 1) -> Batch:
        """This rank's share of global batch ``step``, or part ``part`` of ``parts``
        equal, contiguous parts of it (gradient accumulation)."""
        problem = split_problem(self.share, parts, "accumulation parts")
        if problem is not None:
            raise ValueError(f"rank {self.rank}'s share: {problem}")
        size = self.share // parts
        start = step * self.batch_size + self.rank * self.share + part * size
        return _fetch(self.dataset, self.order.indices(start, size))

    def global_batch(self, step: int) -> Batch:
        """The whole global batch ``step`` (what single-device training sees)."""
        return _fetch(self.dataset, self.order.indices(step * self.batch_size, self.batch_size))
