"""The task's sample order: seeded, complete per epoch, and shared exactly among ranks."""

from __future__ import annotations

import random

import numpy
import pytest
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from dione.techniques.batches import BatchSource, SampleOrder


def dataset(size: int = 50) -> TensorDataset:
    return TensorDataset(torch.arange(size).float()[:, None], torch.arange(size))


def test_each_epoch_is_a_permutation_and_epochs_differ() -> None:
    order = SampleOrder(50, seed=1)
    first, second = order.indices(0, 50), order.indices(50, 50)
    assert sorted(first.tolist()) == list(range(50)) == sorted(second.tolist())
    assert not torch.equal(first, second)


def test_order_depends_on_the_seed_alone() -> None:
    assert torch.equal(SampleOrder(50, 1).indices(30, 40), SampleOrder(50, 1).indices(30, 40))
    assert not torch.equal(SampleOrder(50, 1).indices(0, 50), SampleOrder(50, 2).indices(0, 50))


def test_a_batch_can_straddle_two_epochs() -> None:
    order = SampleOrder(50, 1)
    straddle = order.indices(45, 10)
    assert torch.equal(straddle, torch.cat([order.indices(45, 5), order.indices(50, 5)]))


def test_rank_shares_make_up_the_global_batch() -> None:
    data = dataset()
    whole = BatchSource(data, batch_size=12, seed=4)
    for world in (1, 2, 3, 4):
        ranks = [BatchSource(data, 12, 4, rank, world) for rank in range(world)]
        for step in (0, 3, 4, 9):  # step 4 straddles the first epoch's end
            inputs = torch.cat([r.batch(step)[0] for r in ranks])
            targets = torch.cat([r.batch(step)[1] for r in ranks])
            expected_inputs, expected_targets = whole.global_batch(step)
            assert torch.equal(inputs, expected_inputs)
            assert torch.equal(targets, expected_targets)


def test_generic_datasets_are_collated() -> None:
    items = [(torch.full((2,), float(i)), i) for i in range(20)]
    source = BatchSource(items, batch_size=4, seed=0)  # type: ignore[arg-type]
    inputs, target = source.batch(0)
    assert inputs.shape == (4, 2) and torch.equal(inputs[:, 0].long(), target)


class Augmented(Dataset[tuple[torch.Tensor, int]]):
    """Items with noise from torch's, Python's and NumPy's global generators, as
    augmentation draws it."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        noise = [torch.rand(()).item(), random.random(), float(numpy.random.rand())]
        return torch.tensor([float(index), *noise]), index


@pytest.mark.parametrize("subset", [False, True], ids=["dataset", "subset"])
def test_an_item_draws_the_same_augmentation_on_any_rank_count_and_again(subset: bool) -> None:
    data: Dataset[tuple[torch.Tensor, int]] = Subset(Augmented(), range(30)) if subset \
        else Augmented()
    whole = BatchSource(data, batch_size=12, seed=4)
    expected = [whole.global_batch(step)[0] for step in (0, 2, 3)]  # step 2 straddles
    for world in (1, 2, 3):
        ranks = [BatchSource(data, 12, 4, rank, world) for rank in range(world)]
        for step, want in zip((0, 2, 3), expected, strict=True):
            assert torch.equal(torch.cat([r.batch(step)[0] for r in ranks]), want)
            parts = [ranks[0].batch(step, part, 2)[0] for part in range(2)]  # accumulation
            assert torch.equal(torch.cat(parts), ranks[0].batch(step)[0])
    noise = expected[0][:, 1:]
    assert len({tuple(row.tolist()) for row in noise}) == 12  # every item draws its own
    # The same item in another epoch (another stream position) draws anew.
    first = {int(row[0]): row[1:] for batch in expected[:1] for row in batch}
    later = {int(row[0]): row[1:] for row in BatchSource(data, 30, 4).global_batch(1)[0]}
    assert all(not torch.equal(first[i], later[i]) for i in first)


def test_fetching_leaves_the_global_generators_as_they_were() -> None:
    torch.manual_seed(0)
    random.seed(0)
    numpy.random.seed(0)
    BatchSource(Augmented(), batch_size=6, seed=1).batch(0)
    after = (torch.rand(()).item(), random.random(), float(numpy.random.rand()))
    torch.manual_seed(0)
    random.seed(0)
    numpy.random.seed(0)
    assert after == (torch.rand(()).item(), random.random(), float(numpy.random.rand()))


class PaddedTogether(Dataset[torch.Tensor]):
    """Items of different lengths that only a batch-level transform makes equal (as a
    tokenizer with padding does in a Hugging Face data set's ``__getitems__``)."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        longest = max(i % 5 + 1 for i in indices)
        return [torch.tensor([float(i)] * (i % 5 + 1) + [0.0] * (longest - i % 5 - 1))
                for i in indices]


def test_a_data_set_that_fetches_a_batch_at_once_is_asked_for_the_batch() -> None:
    batch = BatchSource(PaddedTogether(), batch_size=8, seed=2).batch(0)
    assert batch.shape[0] == 8 and batch.shape[1] == max(int(row[0]) % 5 + 1 for row in batch)


def test_the_loss_items_a_message_names_are_dione_s_own() -> None:
    """Validation's fix for a padded loss names dione.tokens and dione.samples: both
    must be there (dione.samples was not: an AttributeError for following the advice)."""
    import dione
    from dione.spec import batch

    assert dione.tokens is batch.tokens and dione.samples is batch.samples
    assert "samples" in dione.__all__


def _pairs(items):
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def _rarely_masked(items):
    """Masks a target with probability 1e-4: on a few items, almost surely none."""
    x, y = _pairs(items)
    return x, y.masked_fill(torch.rand(y.shape) < 1e-4, -100)


class _OwnGenerator:
    """Masks from a generator of its own, seeded once (Hugging Face's ``seed=``): each
    call draws on from the last."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)

    def __call__(self, items):
        x, y = _pairs(items)
        return x, y.masked_fill(torch.rand(y.shape, generator=self.generator) < 0.5, -100)


@pytest.mark.parametrize(("collate", "draws"), [
    (_pairs, False), (_rarely_masked, True), (_OwnGenerator(), True)],
    ids=["deterministic", "rarely-masked", "own-generator"])
def test_a_collate_that_draws_is_seen_even_where_its_draws_change_nothing(
        collate, draws: bool) -> None:
    """Two seeds' collations of two items were compared: a low masking rate masked
    nothing under either, and a collate with a generator of its own was not looked at
    twice, so a split batch was recorded exact (review)."""
    from dione.spec.batch import collate_draws
    from helpers import digits_task

    items = [dataset()[i] for i in range(2)]
    assert collate_draws(digits_task(collate_fn=collate), items) is draws


def test_a_part_with_no_counted_item_is_zero_without_gradients_too() -> None:
    """Validation's forwards run without gradients: the zero standing for a part with no
    counted token found no tensor to pass through and raised, refusing a masked-LM task
    whose probe batch had an unmasked half (review)."""
    from dione.spec.batch import ItemShare, loss_of
    from helpers import digits_task

    class OwnLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(1, 3)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = self.fc(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    task = digits_task(loss=None)
    batch = {"x": torch.ones(2, 1), "labels": torch.full((2,), -100)}
    with torch.no_grad():
        assert float(loss_of(OwnLoss(), task, batch, ItemShare(0, 4, 2, False))) == 0.0
