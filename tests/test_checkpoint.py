"""Checkpoint folders: complete or absent, refusing changed training, pruned on request."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dione.state import (
    CheckpointError,
    CorruptCheckpoint,
    Progress,
    RunStore,
    checkpoint_path,
    latest_on_disk,
    load_checkpoint,
    prune_checkpoints,
    quarantine,
    save_checkpoint,
    verify_checkpoint,
)
from dione.state.export import ExportError, trained_checkpoint


def model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def save(run_dir: Path, step: int, model, optimizer) -> Path:
    progress = Progress(task="t", step=step, samples_seen=step * 8, batch_size=8,
                        technique="single")
    return save_checkpoint(checkpoint_path(run_dir, "t", step), model, optimizer, progress)


def test_round_trip_restores_model_optimizer_and_rng(tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer(0)
    torch.manual_seed(99)
    folder = save(tmp_path, 5, model, optimizer)
    expected_draw = torch.rand(3)
    other, other_optimizer = model_and_optimizer(1)
    progress = load_checkpoint(folder, other, other_optimizer, batch_size=8, seed=0)
    assert progress.step == 5 and progress.samples_seen == 40
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(optimizer.state[a]["exp_avg"], other_optimizer.state[b]["exp_avg"])
    assert torch.equal(torch.rand(3), expected_draw)


def test_changed_batch_size_is_refused(tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer(0)
    folder = save(tmp_path, 5, model, optimizer)
    with pytest.raises(CheckpointError, match="global batch size 8, but the task now says 16"):
        load_checkpoint(folder, model, optimizer, batch_size=16, seed=0)


def test_partial_folders_are_never_the_latest(tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer(0)
    save(tmp_path, 5, model, optimizer)
    half_written = checkpoint_path(tmp_path, "t", 9).with_name("step-00000009.partial")
    half_written.mkdir()
    (half_written / "progress.json").write_text("{}")
    assert latest_on_disk(tmp_path, "t") == checkpoint_path(tmp_path, "t", 5)


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer(0)
    for step in (1, 2, 3):
        save(tmp_path, step, model, optimizer)
    gone = prune_checkpoints(tmp_path, "t", keep=2)
    assert gone == [checkpoint_path(tmp_path, "t", 1)]
    assert latest_on_disk(tmp_path, "t") == checkpoint_path(tmp_path, "t", 3)


def test_quarantined_folders_are_never_the_latest_nor_pruned(tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer(0)
    for step in (5, 9):
        save(tmp_path, step, model, optimizer)
    set_aside = quarantine(checkpoint_path(tmp_path, "t", 9))
    assert latest_on_disk(tmp_path, "t") == checkpoint_path(tmp_path, "t", 5)
    assert prune_checkpoints(tmp_path, "t", keep=1) == []
    assert set_aside.is_dir()


def test_prune_counts_only_the_checkpoints_the_store_recorded(tmp_path: Path) -> None:
    """Steps 4 and 5 were saved by gangs killed before their slices were recorded; the
    store's newest, step 3, is what the task resumes from and must stay."""
    model, optimizer = model_and_optimizer(0)
    for step in (1, 2, 3, 4, 5):
        save(tmp_path, step, model, optimizer)
    recorded = [str(checkpoint_path(tmp_path, "t", step)) for step in (1, 2, 3)]
    gone = prune_checkpoints(tmp_path, "t", keep=2, recorded=recorded)
    assert gone == [checkpoint_path(tmp_path, "t", 1)]
    assert all(checkpoint_path(tmp_path, "t", step).is_dir() for step in (2, 3, 4, 5))


def test_a_model_that_lost_layers_since_its_checkpoint_is_refused(tmp_path: Path) -> None:
    """DCP loads only what the model asks for: a model edited to fewer layers would train
    on, and be exported, from the bigger one's checkpoint without a word."""
    from dione.state.checkpoint import CheckpointMismatch, load_model_weights

    model, optimizer = model_and_optimizer(0)
    folder = save(tmp_path, 5, model, optimizer)
    smaller = torch.nn.Sequential(torch.nn.Linear(4, 8))  # its "0" is the first layer
    with pytest.raises(CheckpointMismatch, match=r"holds 2 weight\(s\) the task's model no "
                       r"longer has \(2.bias, 2.weight\)"):
        load_checkpoint(folder, smaller, torch.optim.AdamW(smaller.parameters()),
                        batch_size=8, seed=0)
    with pytest.raises(CheckpointMismatch, match=r"\(2.bias, 2.weight\).*put the code back"):
        load_model_weights(folder, smaller)
    # The same model loads (every name it has, none left over).
    load_model_weights(folder, model_and_optimizer(1)[0])


def test_a_checkpoint_whose_index_is_gone_is_refused_as_it_was(tmp_path: Path) -> None:
    """Reading the checkpoint's index before loading it (for the parameters it holds no
    optimizer state for) raised a bare FileNotFoundError where the index was gone:
    the load says what it said before, a permanent mismatch naming the folder."""
    from dione.state.checkpoint import CheckpointMismatch

    model, optimizer = model_and_optimizer(0)
    folder = save(tmp_path, 5, model, optimizer)
    (folder / ".metadata").unlink()
    with pytest.raises(CheckpointMismatch, match=f"checkpoint {folder} does not fit"):
        load_checkpoint(folder, model, optimizer, batch_size=8, seed=0)


def _load_on_rank_zero(rank: int, folder: str, rendezvous: str) -> None:
    """One of two ranks of a user's script: only rank 0 loads weights (dione.load)."""
    from datetime import timedelta

    import torch.distributed as dist

    from dione.state.checkpoint import load_model_weights

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=30))
    if rank == 0:
        load_model_weights(folder, model_and_optimizer(1)[0])
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_weights_load_in_one_rank_of_a_users_process_group(tmp_path: Path) -> None:
    """The check for weights the model lost gathered every rank's names wherever a group
    was up: rank 0 of a torchrun script calling dione.load waited for ranks that never
    came, until the group timed out."""
    import torch.multiprocessing as mp

    model, optimizer = model_and_optimizer(0)
    folder = save(tmp_path, 5, model, optimizer)
    mp.spawn(_load_on_rank_zero, args=(str(folder), str(tmp_path / "rendezvous")), nprocs=2)


def test_export_refuses_a_checkpoint_whose_files_do_not_match(tmp_path: Path) -> None:
    model, optimizer = model_and_optimizer(0)
    folder = save(tmp_path, 5, model, optimizer)
    assert trained_checkpoint(tmp_path, "t") == folder
    shard = sorted(folder.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(ExportError, match=f"file {shard.name} does not match.*cannot be trusted"):
        trained_checkpoint(tmp_path, "t")


def test_a_checkpoint_that_is_not_there_is_not_called_corrupt(tmp_path: Path) -> None:
    """Only what was torn is set aside; a folder gone (storage unmounted) is not."""
    with pytest.raises(CheckpointError, match="is not there") as raised:
        verify_checkpoint(tmp_path / "checkpoints" / "t" / "step-00000004")
    assert not isinstance(raised.value, CorruptCheckpoint)


def test_slice_logs_hold_no_one_process_warning_and_only_the_last_two_stay(
        tmp_path: Path) -> None:
    """torch's "torch.distributed is disabled ... assuming the intent is to save in a
    single process" was each one-device slice's whole log (its save, then its load)."""
    from dione.launch import local_placement, run_slice
    from dione.spec.cluster import Node
    from helpers import digits_task

    task = digits_task(steps=6)
    for _ in range(3):  # a save, then a load and a save
        run_slice(task, "single", tmp_path, local_placement(Node("n", 1, "cpu"), [0]), steps=2)
    logs = sorted((tmp_path / "logs").glob("*/rank0.log"))
    assert not any("torch.distributed is disabled" in log.read_text() for log in logs)
    # Only the last two done slices' logs stay (a folder a slice piled up for ever), as
    # their checkpoints do.
    assert [log.parent.name for log in logs] == ["slice-000002-digits", "slice-000003-digits"]


def test_a_task_that_diverged_before_its_first_checkpoint_is_not_offered_latest(
        tmp_path: Path) -> None:
    """Nothing to export: it never saved weights, and --latest would find none."""
    with RunStore(tmp_path) as store:
        store.register_task("t", 4, 8)
        slice_id = store.begin_slice("t", "single", {}, "n0", [0], 0, 2)
        store.diverge_slice(slice_id, [float("nan")], [0.1], "loss is nan")
    for latest in (False, True):
        with pytest.raises(ExportError, match="diverged and was never checkpointed: it "
                           r"holds no weights .* change what made it diverge") as refused:
            trained_checkpoint(tmp_path, "t", latest=latest)
        assert "--latest" not in str(refused.value)


def test_an_export_says_what_its_weights_measured_at_their_step_only(tmp_path: Path) -> None:
    """dione.json's evaluation: the metrics recorded at the exported step, none from an
    earlier one (a step the task was not evaluated at, a later evaluation that failed)."""
    from dione.state.export import evaluation_at

    (tmp_path / "ck").mkdir()
    with RunStore(tmp_path) as store:
        store.register_task("t", 6, 8)
        for start, metrics in ((0, {"accuracy": 0.9}), (2, {}), (4, {"accuracy": 0.95})):
            slice_id = store.begin_slice("t", "single", {}, "n0", [0], start, start + 2)
            store.finish_slice(slice_id, [1.0, 0.5], [0.1, 0.1], str(tmp_path / "ck"),
                               {"wall": 2.0}, 123, metrics)
    assert [evaluation_at(tmp_path, "t", step) for step in (2, 4, 6, 3)] == [
        {"accuracy": 0.9}, {}, {"accuracy": 0.95}, {}]
    assert evaluation_at(tmp_path / "no-store", "t", 2) == {}


def test_an_interrupted_task_is_called_so_by_export_as_by_status(tmp_path: Path) -> None:
    """`dione status` said "interrupted" of a task a stopped run left mid-way, while
    export's refusal and dione.json said "pending" (a review)."""
    from dione.orchestrate import RunOptions, run_workload
    from dione.profile import TrialOptions
    from dione.spec.cluster import Cluster
    from dione.state.export import status_in_run
    from helpers import TEST_NODE, digits_task

    def stop_after_a_slice(event) -> None:
        if event.kind == "slice_finished":
            raise KeyboardInterrupt

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_workload([digits_task(steps=8, techniques=("single",))], Cluster([TEST_NODE]),
                     run, RunOptions(catalog=str(tmp_path / "catalog.sqlite"), slice_steps=4,
                                     trial=TrialOptions(warmup_steps=1, measure_steps=2)),
                     on_event=stop_after_a_slice)
    with pytest.raises(ExportError, match="task 'digits' is interrupted, not done; its "
                       "newest checkpoint is at step 4"):
        trained_checkpoint(run, "digits")
    assert status_in_run(run, "digits")["status"] == "interrupted"
    # While a launcher holds the run: said so, and no `dione resume` offered (a review:
    # it is refused while the run is live).
    from dione.state.lock import RunLock

    with RunLock(run), pytest.raises(ExportError, match=r"task 'digits' is pending, not "
                                      r"done; its newest checkpoint is at step 4: a dione "
                                      r"launcher is training the run now; wait for it") as live:
        trained_checkpoint(run, "digits")
    assert "dione resume" not in str(live.value)


def test_a_task_that_never_saved_a_checkpoint_is_said_so_not_deleted(tmp_path: Path) -> None:
    """A task that failed before its first checkpoint: export --latest said its weights
    were "deleted; gone" (a review)."""
    with RunStore(tmp_path) as store:
        store.register_task("t", 6, 8)
        store.set_task_status("t", "failed", "its data could not be read")
    with pytest.raises(ExportError, match=r"task 't' of run .* is failed and never saved a "
                       r"checkpoint: it has no weights to give$"):
        trained_checkpoint(tmp_path, "t", latest=True)
