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
called once per share, its draws seeded by the share's first position: the same on
resume, not across rank counts.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from dione.spec.batch import split_problem

__all__ = ["Batch", "BatchSource", "SampleOrder", "batch_map", "batch_rows", "draws_kept",
           "slice_batch"]

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


def item_seed(seed: int, position: int) -> int:
    """The seed of the random draws for the item at stream ``position`` (a 63-bit mix, so
    neighbouring positions and seeds do not share streams)."""
    return (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) % 2**63


@contextlib.contextmanager
def draws_kept() -> Iterator[None]:
    """Python's and (if loaded) NumPy's global generators as they were before the
    block: the caller's draws go on as if it had not run (torch's: ``fork_rng``)."""
    numpy = sys.modules.get("numpy")
    python_state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)


@contextlib.contextmanager
def _seeded_generators() -> Iterator[Callable[[int], None]]:
    """A function that seeds torch's CPU, Python's and (if loaded) NumPy's global
    generators; all three put back as they were on exit."""
    numpy = sys.modules.get("numpy")

    def seed_all(seed: int) -> None:
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        if numpy is not None:  # all 63 bits, as two 32-bit words
            numpy.random.seed([seed & 0xFFFFFFFF, seed >> 32])

    with draws_kept(), torch.random.fork_rng(devices=[]):
        yield seed_all


def _fetch(dataset: Dataset[Any], indices: torch.Tensor, seed: int, first: int,
           collate: Callable[[list[Any]], Batch] | None = None) -> Batch:
    """The items at ``indices`` (stream positions ``first``, ``first + 1``, ...), collated
    (by ``collate``, default torch's ``default_collate``)."""
    if isinstance(dataset, TensorDataset) and collate is None:  # no draws: one gather
        return tuple(t[indices] for t in dataset.tensors)
    getitems = getattr(dataset, "__getitems__", None)
    if isinstance(dataset, Subset) and not hasattr(dataset.dataset, "__getitems__"):
        getitems = None  # torch's Subset fetches item by item itself
    with _seeded_generators() as seed_all:
        if getitems is not None:  # several at once, as the data set asks (see above)
            seed_all(item_seed(seed, first))
            items = getitems(indices.tolist())
        else:  # one at a time: an item's draws must not depend on its batch mates
            items = []
            for offset, index in enumerate(indices.tolist()):
                seed_all(item_seed(seed, first + offset))
                items.append(dataset[index])
    if collate is not None:
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
