"""Every exact technique follows single-device training: same losses, same parameters.

Tolerance. The techniques differ from ``single`` only in reduction order: each of two
ranks (or each micro-batch of a pipeline) takes the mean loss of its part of the batch
and the gradients are summed and divided by the number of parts, where ``single`` takes
one mean over the whole batch. Measured here, the
per-step losses then agree to one or two float32 ulps (about 5e-7 at a loss of 4), so
losses must agree within rtol 1e-5. Adam divides each gradient entry by the root of its
running square, so entries whose gradient is nearly zero turn those ulps into visible
parameter differences: measured worst 1.2e-5 after 8 AdamW steps at lr 3e-3, i.e. under
half a percent of one step. Parameters must agree within atol 1e-5 + rtol 1e-4.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch
from torch import nn

from dione.launch import local_placement, run_slice
from dione.spec.task import Task
from helpers import (
    TEST_NODE,
    assert_same_training,
    char_task,
    digits_task,
    final_parameters,
)

STEPS = 8
# The workers cannot import this test module: its model factories travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    task = char_task(steps=STEPS)
    run_dir = tmp_path_factory.mktemp("single")
    result = run_slice(task, "single", run_dir, local_placement(TEST_NODE, [0]))
    return task, result, final_parameters(task, result.checkpoint)


@pytest.mark.parametrize(
    ("technique", "knobs"),
    [
        ("ddp", {}),
        ("fsdp", {}),
        ("fsdp", {"reshard_after_forward": False}),
        ("fsdp", {"activation_checkpointing": True}),
        ("gpipe", {}),
        ("1f1b", {}),
        ("gpipe", {"micro_batches": 8, "activation_checkpointing": True, "balance": "time"}),
        ("1f1b", {"micro_batches": 2, "balance": "time"}),
    ],
    ids=["ddp", "fsdp", "fsdp-no-reshard", "fsdp-activation-checkpointing", "gpipe", "1f1b",
         "gpipe-8-checkpointed-by-time", "1f1b-2-by-time"],
)
def test_two_devices_match_single(reference, technique, knobs, tmp_path: Path) -> None:
    task, single, single_params = reference
    result = run_slice(task, technique, tmp_path, local_placement(TEST_NODE, [0, 1]),
                       knobs=knobs)
    assert (result.start_step, result.end_step, len(result.losses)) == (0, STEPS, STEPS)
    assert_same_training(result, final_parameters(task, result.checkpoint), single,
                         single_params)


def test_losses_really_fall(reference) -> None:
    """The reference is real training, so agreeing with it means something."""
    _, single, _ = reference
    assert single.losses[-1] < single.losses[0] - 0.5


class ExpertsLayer(nn.Module):
    """A layer holding a ModuleList of its own (mixture-of-experts style)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(width, width) for _ in range(2)])
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + sum(expert(x) for expert in self.experts))


class NestedLists(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(64, width)
        self.layers = nn.ModuleList([ExpertsLayer(width) for _ in range(2)])
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_fsdp_shards_a_model_of_lists_inside_lists(tmp_path: Path) -> None:
    """Only the outer items are units (FSDP2 raised on the experts sharded first), and
    training follows single with activation checkpointing."""
    from dione.techniques.fsdp import shard_units

    model = NestedLists()
    assert shard_units(model) == list(model.layers)
    task = digits_task("nested", steps=4, model=NestedLists,
                       optimizer=functools.partial(torch.optim.AdamW, lr=3e-3))
    single = run_slice(task, "single", tmp_path / "single", local_placement(TEST_NODE, [0]))
    result = run_slice(task, "fsdp", tmp_path / "fsdp", local_placement(TEST_NODE, [0, 1]),
                       knobs={"activation_checkpointing": True})
    assert_same_training(result, final_parameters(task, result.checkpoint), single,
                         final_parameters(task, single.checkpoint))


def _batch_norm_mlp(synced: bool = False) -> nn.Module:
    from dione.zoo import digits_mlp

    model = digits_mlp(hidden=32, depth=2)
    norm = (nn.SyncBatchNorm if synced else nn.BatchNorm1d)(32)
    return nn.Sequential(model[0], norm, *list(model)[1:])


def test_batch_norm_under_a_split_batch_is_inexact_and_trains_only_by_opt_in(
        tmp_path: Path) -> None:
    """BatchNorm normalises each share (ddp, fsdp) or accumulation part by its own
    statistics: different training, not rounding. It was trained so without opt-in and
    called exact; now every split of the batch is refused unless the task opts in (one
    device, one part: single's training), and a slice trained so by opt-in says how."""
    from dataclasses import replace

    from dione.state.store import RunStore
    from dione.techniques import get_technique

    task = digits_task("bn", steps=2, model=_batch_norm_mlp)
    ddp, fsdp, single = (get_technique(n) for n in ("ddp", "fsdp", "single"))
    for technique, devices, knobs in ((ddp, 2, {}), (fsdp, 2, {}),
                                      (single, 1, {"accumulation": 2})):
        reasons = technique.check(task, devices, knobs, "cpu")
        assert any("the batch statistics in module '1' are each of the batch's" in r
                   and "allow_inexact=True" in r for r in reasons), reasons
    assert ddp.check(task, 1, {}, "cpu") == [] and single.check(task, 1, {}, "cpu") == []
    # torch's SyncBatchNorm shares the statistics over the ranks: only parts split them.
    synced = replace(task, model=functools.partial(_batch_norm_mlp, synced=True))
    assert ddp.check(synced, 2, {}, "cuda") == []
    assert ddp.check(synced, 2, {"accumulation": 2}, "cuda")
    # Its batch goes through the CPU in validation with a plain norm in its place
    # (torch's SyncBatchNorm refuses a CPU tensor under validation's one-process group:
    # every such task was refused, "the model cannot take a batch of this data"); on CPU
    # devices, where torch cannot train it once a slice's group exists, every technique
    # refuses it, saying so, judged by the kind of the nodes (a Ray run's launcher may
    # have no GPU): review.
    from dione.spec.validate import check_task
    from dione.techniques.validation import trained_by_none

    assert check_task(synced, 2, kind="cuda") == [] == check_task(synced, 2, kind="cpu")
    kept, (problem,) = trained_by_none([synced], 2, "cpu")
    assert kept == [] and problem.field == "model" and "its SyncBatchNorm layers (1) " \
        "train on GPUs only in torch (a slice runs under torch.distributed, where it " \
        "refuses a CPU tensor), and these nodes' devices are CPUs: for them use " \
        "torch.nn.BatchNorm" in problem.message
    assert trained_by_none([synced], 2, "cuda") == ([synced], [])
    # An instance norm tracking running statistics averages each share's into them.
    tracking = replace(task, model=lambda: nn.Sequential(
        nn.Unflatten(1, (1, 64)), nn.InstanceNorm1d(1, track_running_stats=True),
        nn.Flatten(), nn.Linear(64, 10)))
    assert ddp.check(tracking, 2, {}, "cpu") and not ddp.check(tracking, 1, {}, "cpu")
    # A factory that cannot run on the meta device (it reads a weight) is built on the
    # host instead: refused alike (it shared an opted-in twin's ddp trial, and failed).
    def reads_a_weight() -> nn.Module:
        model = _batch_norm_mlp()
        first = next(m for m in model.modules() if isinstance(m, nn.Linear))
        with torch.no_grad():  # a value read: the meta device has none
            first.weight.mul_(float(first.weight.abs().max()))
        return model

    assert ddp.check(replace(task, model=reads_a_weight), 2, {}, "cpu")
    # Opted in: it trains, and the slice is recorded as inexact, with why.
    opted = replace(task, allow_inexact=True)
    assert ddp.check(opted, 2, {}, "cpu") == []
    run_slice(opted, "ddp", tmp_path / "run", local_placement(TEST_NODE, [0, 1]))
    with RunStore(tmp_path / "run") as store:
        [record] = store.slices()
    assert record.inexactness and "batch statistics in module '1'" in record.inexactness


def _tied_mlp() -> nn.Module:
    """A Sequential whose two middle layers share one weight."""
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 10))
    model[4].weight = model[2].weight
    return model


def test_fsdp_trains_a_sequential_whose_layers_share_a_weight(tmp_path: Path) -> None:
    """FSDP2 manages a parameter in one group only: the two layers sharing it go to the
    root's group (it crashed with FSDP's "shared with a parameter already managed by
    another FSDP group"), and the training is single's."""
    from dione.techniques.fsdp import shard_units

    model = _tied_mlp()
    assert [id(u) for u in shard_units(model)] == [id(model[0]), id(model[6])]
    task = digits_task("tied", steps=4, model=_tied_mlp)
    one = run_slice(task, "single", tmp_path / "single", local_placement(TEST_NODE, [0]))
    two = run_slice(task, "fsdp", tmp_path / "fsdp", local_placement(TEST_NODE, [0, 1]))
    torch.testing.assert_close(torch.tensor(two.losses), torch.tensor(one.losses),
                               rtol=1e-5, atol=1e-6)


def _with_an_empty_sample() -> torch.utils.data.TensorDataset:
    """Sequences whose padded targets (-100) end at varying places, one all padding."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 10, (64, 6), generator=g)
    y = (x + 1) % 10
    for i in range(64):
        y[i, (i * 7) % 6 + 1:] = -100
    y[5] = -100
    return torch.utils.data.TensorDataset(x, y)


def _token_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output.reshape(-1, 10), target.reshape(-1))


def _assert_eight_parts_train_as_one(task: Task, tmp_path: Path) -> None:
    """Single's losses on the whole batch, and on it accumulated in 8 parts of one
    sample each: the same, and finite."""
    one = run_slice(task, "single", tmp_path / "one", local_placement(TEST_NODE, [0]))
    parts = run_slice(task, "single", tmp_path / "parts", local_placement(TEST_NODE, [0]),
                      knobs={"accumulation": 8})
    torch.testing.assert_close(torch.tensor(parts.losses), torch.tensor(one.losses),
                               rtol=1e-5, atol=1e-6)
    assert all(math.isfinite(x) for x in parts.losses)


def test_a_part_with_no_counted_token_adds_nothing_as_in_single(tmp_path: Path) -> None:
    """A token-averaged loss whose batch holds an all-padding sample: a part (an
    accumulation part, a micro-batch) with no counted token has a NaN mean of its own;
    it failed the slice, so a plan's knob decided whether the task trained at all. It
    adds nothing to the global mean, as in single: the same losses (8 steps of 8: the
    whole epoch, the empty sample in one of them)."""
    import dione

    task = digits_task("padded", steps=8, batch_size=8, data=_with_an_empty_sample,
                       loss=_token_loss, loss_items=dione.tokens,
                       model=lambda: nn.Sequential(nn.Embedding(10, 16), nn.Linear(16, 16),
                                                   nn.Tanh(), nn.Linear(16, 10)))
    _assert_eight_parts_train_as_one(task, tmp_path)


class _OwnTokenLoss(nn.Module):
    """A model that returns its own token-averaged loss beside its logits, as a Hugging
    Face model given ``labels`` does (NaN over a part with no counted token)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Embedding(10, 16), nn.Linear(16, 16), nn.Tanh(),
                                 nn.Linear(16, 10))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(input_ids)
        return {"loss": _token_loss(logits, labels), "logits": logits}


def _dict_with_an_empty_sample() -> Any:
    from dione.zoo.hf import DictDataset

    x, y = _with_an_empty_sample().tensors
    return DictDataset({"input_ids": x, "labels": y})


def test_a_part_with_no_counted_token_adds_nothing_with_the_model_s_own_loss(
        tmp_path: Path) -> None:
    """The same with the model's own loss (a masked-LM collator leaves a sample with no
    masked token now and then): its NaN mean over none was summed into the zero meant
    to stand for the part, so gpipe with 8 micro-batches diverged where single trained."""
    import dione

    task = digits_task("own-padded", steps=8, batch_size=8, data=_dict_with_an_empty_sample,
                       loss=None, loss_items=dione.tokens, model=_OwnTokenLoss)
    _assert_eight_parts_train_as_one(task, tmp_path)
