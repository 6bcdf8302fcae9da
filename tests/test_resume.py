"""Stopping and resuming loses nothing: exact on the same technique, close across them."""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch

from dione.launch import local_placement, run_slice
from dione.state import RunStore, load_checkpoint
from dione.zoo import digits_train
from helpers import (
    TEST_NODE,
    assert_same_training,
    char_task,
    digits_task,
    final_parameters,
)

STEPS, FIRST = 8, 3
ONE, TWO = [0], [0, 1]
# The workers cannot import this test module: its classes travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def train_in_slices(task, plan, run_dir: Path):
    """Run ``plan``'s slices [(technique, device ids, steps), ...] one after another."""
    results = [run_slice(task, technique, run_dir, local_placement(TEST_NODE, devices),
                         steps=steps) for technique, devices, steps in plan]
    return results


def joined(results):
    """The slices' losses as one trajectory, with the last slice's checkpoint."""
    last = results[-1]
    losses = [loss for r in results for loss in r.losses]
    return type(last)(**{**last.__dict__, "losses": losses})


@pytest.mark.parametrize(("technique", "devices"), [("single", ONE), ("ddp", TWO),
                                                    ("fsdp", TWO), ("1f1b", TWO)])
def test_same_technique_resumes_bit_identically(technique, devices, tmp_path: Path) -> None:
    task = char_task(steps=STEPS)
    whole = train_in_slices(task, [(technique, devices, STEPS)], tmp_path / "whole")[0]
    parts = train_in_slices(task, [(technique, devices, FIRST), (technique, devices, None)],
                            tmp_path / "parts")
    assert [(p.start_step, p.end_step) for p in parts] == [(0, FIRST), (FIRST, STEPS)]
    assert joined(parts).losses == whole.losses  # bit for bit
    resumed = final_parameters(task, parts[-1].checkpoint)
    for name, value in final_parameters(task, whole.checkpoint).items():
        assert torch.equal(resumed[name], value), name


@pytest.mark.parametrize(
    "plan",
    [
        [("ddp", TWO, FIRST), ("single", ONE, None)],
        [("single", ONE, FIRST), ("fsdp", TWO, None)],
        [("fsdp", TWO, 2), ("ddp", TWO, 3), ("single", ONE, None)],
        [("1f1b", TWO, 2), ("fsdp", TWO, 3), ("single", ONE, None)],
        [("single", ONE, 3), ("gpipe", TWO, None)],
    ],
    ids=["ddp2-single", "single-fsdp2", "fsdp2-ddp2-single", "1f1b2-fsdp2-single",
         "single-gpipe2"],
)
def test_resume_under_another_technique(plan, tmp_path: Path) -> None:
    task = char_task(steps=STEPS)
    whole = train_in_slices(task, [("single", ONE, STEPS)], tmp_path / "whole")[0]
    parts = joined(train_in_slices(task, plan, tmp_path / "parts"))
    assert_same_training(parts, final_parameters(task, parts.checkpoint), whole,
                         final_parameters(task, whole.checkpoint))


class _WithEvaluationHead(torch.nn.Module):
    """The digits MLP and a head only evaluation would use: its parameters never get a
    gradient, so the optimizer keeps no state for them."""

    def __init__(self) -> None:
        super().__init__()
        from dione.zoo import digits_mlp

        self.net = digits_mlp(hidden=32, depth=2)
        self.head = torch.nn.Linear(10, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_parameter_that_never_gets_a_gradient_resumes_under_every_technique(
        tmp_path: Path) -> None:
    """Every resume of such a model failed as "the model or optimizer changed since the
    slice that wrote it": a fresh optimizer's state for the head, which the checkpoint
    never held (a review)."""
    from dione.techniques.validation import valid_task

    task, problems = valid_task(digits_task(model=_WithEvaluationHead, steps=6))
    assert problems == [] and task.unused_parameters[0]  # ddp is told to look for them
    whole = train_in_slices(task, [("single", ONE, 6)], tmp_path / "whole")[0]
    parts = joined(train_in_slices(
        task, [("single", ONE, 2), ("ddp", TWO, 2), ("fsdp", TWO, 1), ("single", ONE, 1)],
        tmp_path / "parts"))
    assert_same_training(parts, final_parameters(task, parts.checkpoint), whole,
                         final_parameters(task, whole.checkpoint))
    # Without state, as training left it (not a step at learning rate 0's).
    model = task.model()
    optimizer = task.optimizer(model.parameters())
    load_checkpoint(parts.checkpoint, model, optimizer, batch_size=task.batch_size,
                    seed=task.seed)
    assert not optimizer.state.get(model.head.weight)
    assert float(optimizer.state[model.net[0][0].weight]["step"]) == 6


def _bias_free_first() -> torch.nn.Module:
    """An MLP whose first pipeline stage holds no bias (its first layer has none)."""
    return torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.ReLU()),
        torch.nn.Linear(32, 10))


def _no_decay_for_biases(parameters):
    kept = list(parameters)
    return torch.optim.AdamW([{"params": [p for p in kept if p.ndim >= 2], "weight_decay": 0.1},
                              {"params": [p for p in kept if p.ndim < 2], "weight_decay": 0.0,
                               "lr": 5e-3}], lr=1e-2)


def test_a_stage_whose_share_of_a_parameter_group_is_empty_resumes(tmp_path: Path) -> None:
    """The usual no-weight-decay recipe on a cut whose first stage holds no bias: that
    stage's optimizer has an empty group, and every resume into it raised a bare
    IndexError in torch's loader (a review)."""
    task = digits_task(model=_bias_free_first, optimizer=_no_decay_for_biases, steps=4)
    whole = train_in_slices(task, [("single", ONE, 4)], tmp_path / "whole")[0]
    parts = joined([run_slice(task, technique, tmp_path / "parts",
                              local_placement(TEST_NODE, devices), steps=2, knobs=knobs)
                    for technique, devices, knobs in (("single", ONE, {}),
                                                      ("1f1b", TWO, {"micro_batches": 2}))])
    assert_same_training(parts, final_parameters(task, parts.checkpoint), whole,
                         final_parameters(task, whole.checkpoint))


def _adam_state(task, checkpoint: str) -> dict[str, dict[str, torch.Tensor]]:
    """The optimizer state in a checkpoint, as a plain one-process model sees it, by name."""
    model = task.model()
    optimizer = task.optimizer(model.parameters())
    load_checkpoint(checkpoint, model, optimizer, batch_size=task.batch_size, seed=task.seed)
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: dict(optimizer.state[p]) for p in model.parameters()}


def test_adam_moments_survive_a_move(tmp_path: Path) -> None:
    """A ddp x2 checkpoint read by a one-device AdamW holds the moments single would have."""
    task = char_task(steps=STEPS)
    moved = train_in_slices(task, [("ddp", TWO, FIRST)], tmp_path / "ddp")[0]
    single = train_in_slices(task, [("single", ONE, FIRST)], tmp_path / "single")[0]
    got, want = _adam_state(task, moved.checkpoint), _adam_state(task, single.checkpoint)
    assert got.keys() == want.keys() and len(got) == len(list(task.model().parameters()))
    for name in want:
        assert float(got[name]["step"]) == FIRST
        for moment in ("exp_avg", "exp_avg_sq"):
            assert want[name][moment].abs().sum() > 0, "the reference moment must be non-zero"
            torch.testing.assert_close(got[name][moment], want[name][moment],
                                       rtol=1e-4, atol=1e-7)


def test_store_records_every_slice_and_step(tmp_path: Path) -> None:
    task = char_task(steps=STEPS)
    train_in_slices(task, [("single", ONE, FIRST), ("ddp", TWO, None)], tmp_path)
    with RunStore(tmp_path) as store:
        slices = store.slices(task.name)
        assert [(s.technique, s.start_step, s.end_step, s.status) for s in slices] == [
            ("single", 0, FIRST, "done"), ("ddp", FIRST, STEPS, "done")]
        assert [step for step, _ in store.losses(task.name)] == list(range(1, STEPS + 1))
        assert store.task(task.name).status == "done"
        assert store.latest_checkpoint(task.name).step == STEPS


def test_learning_rate_schedule_continues_across_slices(tmp_path: Path) -> None:
    schedule = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5)
    task = char_task(steps=STEPS, lr_scheduler=schedule)
    whole = train_in_slices(task, [("single", ONE, STEPS)], tmp_path / "whole")[0]
    parts = train_in_slices(task, [("single", ONE, FIRST), ("ddp", TWO, None)],
                            tmp_path / "parts")
    torch.testing.assert_close(torch.tensor(joined(parts).losses), torch.tensor(whole.losses),
                               rtol=1e-5, atol=1e-6)
    # The schedule visibly changes the losses, so matching `whole` above means its state
    # (not a restart at the full rate) carried over into the second slice.
    constant = train_in_slices(char_task(steps=STEPS), [("single", ONE, STEPS)],
                               tmp_path / "constant")[0]
    assert abs(constant.losses[-1] - whole.losses[-1]) > 1e-3


def test_checkpoints_go_to_the_storage_and_the_store_stays_in_the_run(tmp_path: Path) -> None:
    task = digits_task("stored", steps=9)
    run_dir, shared = tmp_path / "run", tmp_path / "shared"
    placement = local_placement(TEST_NODE, [0])
    slices = [run_slice(task, "single", run_dir, placement, steps=3, storage=shared,
                        keep_checkpoints=2) for _ in range(3)]
    assert [s.start_step for s in slices] == [0, 3, 6]  # each resumed from the storage
    assert all(Path(str(s.checkpoint)).is_relative_to(shared) for s in slices)
    assert not (run_dir / "checkpoints").exists() and (run_dir / "dione.sqlite").exists()
    # Pruning keeps the newest two, in the storage, and the store forgets the oldest.
    with RunStore(run_dir) as store:  # in this run's own folder of the storage
        ours = shared / "runs" / store.run_id
    kept = sorted(p.name for p in (ours / "checkpoints" / "stored").iterdir())
    assert kept == ["step-00000006", "step-00000009"]
    with RunStore(run_dir) as store:
        latest = store.latest_checkpoint("stored")
        assert latest is not None and Path(latest.path).is_relative_to(shared.resolve())
    # The storage moved away (not mounted): the run is refused, not begun again in an
    # empty storage made anew (a later move back nested the checkpoints under it).
    from dione.orchestrate import RunOptions, run_workload
    from dione.orchestrate.options import RunDirError
    from dione.spec.cluster import Cluster

    shared.rename(tmp_path / "away")
    with pytest.raises(RunDirError, match=r"its storage .* which is not there"):
        run_workload([task], Cluster([TEST_NODE]), run_dir,
                     RunOptions(catalog=str(tmp_path / "catalog.sqlite"), storage=str(shared)))
    assert not shared.exists()



def test_augmented_data_resumes_bit_identically_and_splits_exactly(tmp_path: Path) -> None:
    """An item's draws follow its stream position: the same after a resume, and on two
    ranks as on one."""

    class NoisyDigits(torch.utils.data.Dataset):  # local: workers get it by value
        """The digits with augmentation drawn from the global generators: torch's noise
        on the pixels, Python's random brightness."""

        def __init__(self) -> None:
            self.images, self.labels = digits_train().tensors

        def __len__(self) -> int:
            return len(self.labels)

        def __getitem__(self, index: int):
            image = self.images[index] * random.uniform(0.8, 1.2)
            return image + 0.1 * torch.randn_like(image), self.labels[index]

    task = digits_task("noisy", steps=STEPS, data=NoisyDigits)
    whole = train_in_slices(task, [("single", ONE, STEPS)], tmp_path / "whole")[0]
    parts = train_in_slices(task, [("single", ONE, FIRST), ("single", ONE, None)],
                            tmp_path / "parts")
    assert joined(parts).losses == whole.losses  # bit for bit
    ddp = train_in_slices(task, [("ddp", TWO, STEPS)], tmp_path / "ddp")[0]
    torch.testing.assert_close(torch.tensor(ddp.losses), torch.tensor(whole.losses),
                               rtol=1e-5, atol=1e-6)


def test_a_collate_that_masks_at_random_resumes_bit_identically(tmp_path: Path) -> None:
    """A collate function that masks tokens at random (as Hugging Face's
    DataCollatorForLanguageModeling): validation refused it (each half of a batch masked
    otherwise than the whole, blamed on the loss), and it drew from the worker's own
    generator, so a resume masked otherwise. Now seeded per share: the same after a
    resume, and a split batch recorded statistical."""
    from torch import nn

    import dione
    from dione.techniques.validation import valid_task

    def sequences() -> torch.utils.data.TensorDataset:
        x = torch.randint(0, 10, (64, 6), generator=torch.Generator().manual_seed(0))
        return torch.utils.data.TensorDataset(x, (x + 1) % 10)

    def mask_at_random(items):
        x = torch.stack([i for i, _ in items])
        y = torch.stack([t for _, t in items])
        return x, y.masked_fill(torch.rand(y.shape) < 0.5, -100)

    def token_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output.reshape(-1, 10), target.reshape(-1))

    task, problems = valid_task(digits_task(
        "masked", steps=STEPS, batch_size=8, data=sequences, collate_fn=mask_at_random,
        loss=token_loss, loss_items=dione.tokens,
        model=lambda: nn.Sequential(nn.Embedding(10, 16), nn.Linear(16, 10))))
    assert problems == [] and task.fetch_draws
    whole = train_in_slices(task, [("single", ONE, STEPS)], tmp_path / "whole")[0]
    parts = train_in_slices(task, [("single", ONE, FIRST), ("single", ONE, None)],
                            tmp_path / "parts")
    assert joined(parts).losses == whole.losses  # bit for bit
    ddp = train_in_slices(task, [("ddp", TWO, STEPS)], tmp_path / "ddp")[0]
    assert "the task's collate_fn) draws random numbers" in ddp.extra["exactness"]
    assert all(math.isfinite(loss) for loss in ddp.losses)


class _Noise(torch.nn.Module):
    """Gaussian noise in training, in no layer named dropout (a drop path's rate is
    kept as drop_prob, which no name check reads)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.5 * torch.randn_like(x) if self.training else x


class _OwnGenerator(torch.utils.data.Dataset):
    """Augmentation from a generator the data set keeps (``np.random.default_rng``)."""

    def __init__(self) -> None:
        import numpy as np

        self.inner = digits_train()
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        x, y = self.inner[index]
        return x + float(self.rng.normal()) * 0.5, y


def test_random_draws_a_name_check_misses_are_recorded_statistical(tmp_path: Path) -> None:
    """Noise in a forward, and a data set's own generator, trained under ddp, were
    recorded exact (as single would) with per-step losses 0.1-0.25 off single's
    (review): randomness was found by a layer's name only. The probe now sees the
    forward draw, and an item that differs when fetched again; a single slice resumed
    from a data set of its own generator is no longer single's uninterrupted either."""
    from torch import nn

    from dione.techniques.validation import valid_task

    noisy, problems = valid_task(digits_task(
        "noisy", steps=STEPS, model=lambda: nn.Sequential(
            nn.Linear(64, 16), _Noise(), nn.ReLU(), nn.Linear(16, 10))))
    assert problems == [] and noisy.forward_draws and not noisy.stateful_items
    plain, _ = valid_task(digits_task("plain", steps=STEPS))
    assert not (plain.forward_draws or plain.stateful_items or plain.fetch_draws)
    ddp = train_in_slices(noisy, [("ddp", TWO, STEPS)], tmp_path / "noisy")[0]
    assert "its training forward draws random numbers" in ddp.extra["exactness"]
    gpipe = train_in_slices(noisy, [("gpipe", TWO, STEPS)], tmp_path / "gpipe")[0]
    assert "its training forward draws random numbers" in gpipe.extra["exactness"]
    # Where the probe did not look (a task only single trains, a model too large to
    # probe), the slice sees its forward draw: single's accumulation too.
    unprobed = dataclasses.replace(noisy, techniques=("single",), forward_draws=False)
    parted = run_slice(unprobed, "single", tmp_path / "parted",
                       local_placement(TEST_NODE, ONE), knobs={"accumulation": 2}, steps=STEPS)
    assert "its training forward draws random numbers" in parted.extra["exactness"]
    plain_parted = run_slice(plain, "single", tmp_path / "plain-parted",
                             local_placement(TEST_NODE, ONE), knobs={"accumulation": 2},
                             steps=STEPS)
    assert "exactness" not in plain_parted.extra

    own, problems = valid_task(digits_task("own", steps=STEPS, data=_OwnGenerator))
    assert problems == [] and own.stateful_items
    whole = train_in_slices(own, [("single", ONE, STEPS)], tmp_path / "whole")[0]
    assert "exactness" not in whole.extra  # single, uninterrupted: itself
    parts = train_in_slices(own, [("single", ONE, FIRST), ("single", ONE, None)],
                            tmp_path / "parts")
    assert joined(parts).losses != whole.losses  # its draws started again
    assert "exactness" not in parts[0].extra
    assert "a generator of its own" in parts[1].extra["exactness"]
    ddp = train_in_slices(own, [("ddp", TWO, STEPS)], tmp_path / "own-ddp")[0]
    assert "a generator of its own" in ddp.extra["exactness"]
    # A pipeline draws for a sample batch before it trains: not single's from step 0.
    gpipe = train_in_slices(own, [("gpipe", TWO, STEPS)], tmp_path / "own-gpipe")[0]
    assert "a generator of its own" in gpipe.extra["exactness"]
    # One process from the first step fetches single's items in single's order.
    accumulated = run_slice(own, "single", tmp_path / "own-parted",
                            local_placement(TEST_NODE, ONE), knobs={"accumulation": 2},
                            steps=STEPS)
    assert "exactness" not in accumulated.extra


NOTEBOOK_LR = 0.05  # a notebook's rate, read by a task's optimizer lambda


def _notebook_sgd(params):
    return torch.optim.SGD(params, lr=NOTEBOOK_LR)


def test_a_rate_edited_between_slices_is_said_to_stay_as_the_checkpoint_holds_it(
        tmp_path: Path) -> None:
    """A notebook's rate edited between two slices was said to be read by "steps trained
    from now", and recorded, while the checkpoint's optimizer state put the old rate back:
    the run said a rate the task never trained with (a review)."""
    global NOTEBOOK_LR
    task = digits_task(steps=STEPS, optimizer=_notebook_sgd)
    (reference,) = train_in_slices(task, [("single", ONE, None)], tmp_path / "once")
    try:
        first = run_slice(task, "single", tmp_path / "edited", local_placement(TEST_NODE, ONE),
                          steps=FIRST)
        NOTEBOOK_LR = 5.0
        rest = run_slice(task, "single", tmp_path / "edited", local_placement(TEST_NODE, ONE))
    finally:
        NOTEBOOK_LR = 0.05
    (said,) = [w for w in rest.warnings if "optimizer reads" in w]
    assert "NOTEBOOK_LR=0.05 -> NOTEBOOK_LR=5.0" in said and "the steps left train with it, " \
        "as recorded" in said and "read the new value" not in said, said
    # What it says is what it trained: the old rate to the end, and the store says so.
    assert_same_training(joined([first, rest]),
                         final_parameters(task, rest.checkpoint), reference,
                         final_parameters(task, reference.checkpoint))
    with RunStore(tmp_path / "edited") as store:
        assert store.training_settings(task.name)["optimizer reads"] == "NOTEBOOK_LR=0.05"


def test_a_loss_edited_between_slices_is_refused_naming_it(tmp_path: Path) -> None:
    """A loss swapped for a label-smoothed one between sessions trained the steps left on
    the other objective, unsaid, and the task was recorded done and exact (a review)."""
    from dione.launch.slice import SliceError

    task = digits_task(steps=STEPS)
    run_slice(task, "single", tmp_path, local_placement(TEST_NODE, ONE), steps=FIRST)
    smoothed = dataclasses.replace(task, loss=functools.partial(
        torch.nn.functional.cross_entropy, label_smoothing=0.3))
    with pytest.raises(SliceError, match=r"other training \(loss code: cross_entropy.* -> "
                       r"cross_entropy.*\(label_smoothing=0.3\)\).* or put the task back"):
        run_slice(smoothed, "single", tmp_path, local_placement(TEST_NODE, ONE))
    with RunStore(tmp_path) as store:
        assert store.latest_checkpoint(task.name).step == FIRST


class _Smooth:
    """A loss object with a setting of its own."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(output, target,
                                                 label_smoothing=self.smoothing)


def test_a_loss_objects_setting_edited_between_slices_is_said(tmp_path: Path) -> None:
    """Its settings are said, not refused (an object may count its calls), under `dione
    train`'s slices as under `dione run` (they refused it there, and passed it unsaid
    where the record held only the object's type: regression reviews)."""
    task = digits_task(steps=STEPS, loss=_Smooth(0.1))
    run_slice(task, "single", tmp_path, local_placement(TEST_NODE, ONE), steps=FIRST)
    rest = run_slice(dataclasses.replace(task, loss=_Smooth(0.9)), "single", tmp_path,
                     local_placement(TEST_NODE, ONE))
    (said,) = [w for w in rest.warnings if w.startswith(f"{task.name}: loss: ")]
    assert "_Smooth(smoothing=0.1) -> _Smooth(smoothing=0.9)" in said and \
        "steps trained from now read the new value" in said, said
