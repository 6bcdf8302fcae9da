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

A data set that draws random numbers for an item (augmentation: a random crop, noise)
draws them from torch's CPU, Python's and NumPy's generators seeded by ``(seed, the
item's stream position)``, then put back as they were: an item is the same on every rank
count, technique and resume, as its position is. A data set that fetches several items
at once (``__getitems__``, where a batch-level transform may pad them together) is
called once per share, its draws seeded by the share's first position, and so is the
task's collate function (random masking): the same on resume, not across rank counts
(validation records such a task's split batches as statistical, as dropout's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from dione.spec.batch import Batch, split_problem
from dione.spec.draws import seeded_draws

__all__ = ["Batch", "BatchSource", "SampleOrder"]


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


def item_seed(seed: int, position: int) -> int:
    """The seed of the random draws for the item at stream ``position`` (a 63-bit mix, so
    neighbouring positions and seeds do not share streams)."""
    return (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) % 2**63


def collate_seed(seed: int, first: int) -> int:
    """The seed of the random draws of a collate function (random masking, as Hugging
    Face's ``DataCollatorForLanguageModeling``) on the items from stream position
    ``first``: a position before the stream's start, so no item's stream."""
    return item_seed(seed, -1 - first)


def _fetch(dataset: Dataset[Any], indices: torch.Tensor, seed: int, first: int,
           collate: Callable[[list[Any]], Batch] | None = None) -> Batch:
    """The items at ``indices`` (stream positions ``first``, ``first + 1``, ...), collated
    (by ``collate``, its draws seeded by ``collate_seed``; default torch's
    ``default_collate``)."""
    if isinstance(dataset, TensorDataset) and collate is None:  # no draws: one gather
        return tuple(t[indices] for t in dataset.tensors)
    getitems = getattr(dataset, "__getitems__", None)
    if isinstance(dataset, Subset) and not hasattr(dataset.dataset, "__getitems__"):
        getitems = None  # torch's Subset fetches item by item itself
    with seeded_draws() as seed_all:
        if getitems is not None:  # several at once, as the data set asks (see above)
            seed_all(item_seed(seed, first))
            items = getitems(indices.tolist())
        else:  # one at a time: an item's draws must not depend on its batch mates
            items = []
            for offset, index in enumerate(indices.tolist()):
                seed_all(item_seed(seed, first + offset))
                items.append(dataset[index])
        if collate is not None:
            seed_all(collate_seed(seed, first))
            return collate(items)
    return default_collate(items)  # type: ignore[no-untyped-call]


class BatchSource:
    """Rank ``rank``'s contiguous share of each global batch of a task."""

    def __init__(
        self, dataset: Dataset[Any], batch_size: int, seed: int, rank: int = 0, world: int = 1,
        collate: Callable[[list[Any]], Batch] | None = None,
    ) -> None:
        problem = split_problem(batch_size, world, "ranks")
        if problem is not None:
            raise ValueError(problem)
        self.dataset = dataset
        self.batch_size = batch_size
        self.share = batch_size // world
        self.rank = rank
        self.collate = collate  # a task's collate_fn (None: torch's default_collate)
        self.order = SampleOrder(len(dataset), seed)  # type: ignore[arg-type]

    def batch(self, step: int, part: int = 0, parts: int = 1) -> Batch:
        """This rank's share of global batch ``step``, or part ``part`` of ``parts``
        equal, contiguous parts of it (gradient accumulation)."""
        problem = split_problem(self.share, parts, "accumulation parts")
        if problem is not None:
            raise ValueError(f"rank {self.rank}'s share: {problem}")
        size = self.share // parts
        start = step * self.batch_size + self.rank * self.share + part * size
        return _fetch(self.dataset, self.order.indices(start, size), self.order.seed, start,
                      self.collate)

    def global_batch(self, step: int) -> Batch:
        """The whole global batch ``step`` (what single-device training sees)."""
        start = step * self.batch_size
        return _fetch(self.dataset, self.order.indices(start, self.batch_size),
                      self.order.seed, start, self.collate)
