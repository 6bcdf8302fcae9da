"""The run store: one transaction per change, consistent after any crash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dione.state import RunStore


def test_a_finished_slice_is_recorded_whole(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "progress.json").write_text("{}")
    with RunStore(tmp_path) as store:
        store.register_task("t", 4, 8, {"lr": 0.1})
        slice_id = store.begin_slice("t", "ddp", {}, "n0", [0, 1], 0, 2)
        assert store.task("t").status == "running"
        store.finish_slice(slice_id, [1.0, 0.5], [0.1, 0.1], str(tmp_path / "ck"),
                           {"wall": 2.0}, 123, {"accuracy": 0.9})
        assert store.losses("t") == [(1, 1.0), (2, 0.5)]
        assert store.latest_checkpoint("t").step == 2
        assert store.evaluation("t") == {"accuracy": 0.9}
        assert store.task("t").status == "pending"  # 2 of 4 steps


def test_a_failing_record_changes_nothing(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        store.register_task("t", 4, 8)
        slice_id = store.begin_slice("t", "single", {}, "n0", [0], 0, 2)
        with pytest.raises(ValueError):  # two losses, one step time: rejected mid-way
            store.finish_slice(slice_id, [1.0, 0.5], [0.1], "ck")
        assert store.losses("t") == [] and store.checkpoints("t") == []
        assert store.slice(slice_id).status == "running"


def test_changed_training_is_refused(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        store.register_task("t", 4, 8)
        with pytest.raises(ValueError, match="use a new run directory"):
            store.register_task("t", 4, 16)


def test_a_checkpoint_whose_folder_is_gone_is_skipped(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "progress.json").write_text("{}")
    with RunStore(tmp_path) as store:
        store.register_task("t", 4, 8)
        first = store.begin_slice("t", "single", {}, "n0", [0], 0, 2)
        store.finish_slice(first, [1, 1], [0, 0], str(good))
        second = store.begin_slice("t", "single", {}, "n0", [0], 2, 4)
        store.finish_slice(second, [1, 1], [0, 0], str(tmp_path / "deleted"))
        assert store.latest_checkpoint("t").path == str(good)


def test_slices_of_a_dead_launcher_become_interrupted(tmp_path: Path) -> None:
    script = (f"from dione.state import RunStore\ns = RunStore({str(tmp_path)!r})\n"
              "s.register_task('t', 4, 8)\ns.begin_slice('t', 'single', {}, 'n0', [0], 0, 4)\n")
    subprocess.run([sys.executable, "-c", script], check=True)  # exits without finishing
    with RunStore(tmp_path) as store:
        (stale,) = store.slices("t")
        assert stale.status == "running"
        assert store.recover_interrupted() == [stale.id]
        assert store.slice(stale.id).status == "interrupted"
        assert store.task("t").status == "pending"
