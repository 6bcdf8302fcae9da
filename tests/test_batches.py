"""The task's sample order: seeded, complete per epoch, and shared exactly among ranks."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

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
