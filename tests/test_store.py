"""The run store: one transaction per change, consistent after any crash."""

from __future__ import annotations

import shutil
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


def test_changed_training_settings_are_refused_and_older_records_adopted(
        tmp_path: Path) -> None:
    first = {"optimizer": "Adam(lr=0.01)", "seed": "0", "optimizer reads": "lr=0.01"}
    with RunStore(tmp_path) as store:
        store.register_task("t", 4, 8, settings=first)
        store.begin_slice("t", "single", {}, "n0", [0], 0, 2)  # it trained
        store.register_task("t", 4, 8, settings=first)  # the same: resumed
        with pytest.raises(ValueError, match=r"other training \(optimizer: Adam\(lr=0.01\) "
                           r"-> Adam\(lr=0.1\)\)"):
            store.register_task("t", 4, 8, settings={**first, "optimizer": "Adam(lr=0.1)"})
        # What its factory reads from its module: the caller says it; recorded anew.
        moved = {**first, "optimizer reads": "lr=5.0"}
        assert store.changed_settings("t", moved) == ["optimizer reads: lr=0.01 -> lr=5.0"]
        store.register_task("t", 4, 8, settings=moved, said_only=("optimizer reads",))
        assert store.training_settings("t") == moved
        # Recorded by a dione that kept no settings: taken as they are now, then held.
        store.register_task("old", 4, 8)
        store.register_task("old", 4, 8, settings=first)
        store.begin_slice("old", "single", {}, "n0", [0], 0, 2)
        with pytest.raises(ValueError, match="seed: 0 -> 1"):
            store.register_task("old", 4, 8, settings={**first, "seed": "1"})
        # A task that never trained a step (its profiling trial diverged): changed, it is
        # taken anew, pending (a lowered rate was refused, and it stayed diverged).
        store.register_task("wild", 4, 8, settings=first)
        store.set_task_status("wild", "diverged", "its loss was nan")
        again = store.register_task("wild", 4, 8, settings={**first, "seed": "1"})
        assert again.status == "pending" and store.task("wild").status == "pending"
        # One that diverged in training: put back, it diverges again, so that is not
        # offered (it was: a review).
        store.begin_slice("wild", "single", {}, "n0", [0], 0, 2)
        store.set_task_status("wild", "diverged", "its loss was nan at step 2")
        with pytest.raises(ValueError, match=r"seed: 1 -> 2\): use a new run directory \(or "
                           r"another task name\) for changed training: a diverged task "
                           r"trains again under a new name only$"):
            store.register_task("wild", 4, 8, settings={**first, "seed": "2"})


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


def test_a_moved_run_directory_keeps_its_checkpoints(tmp_path: Path) -> None:
    """Checkpoints inside the run directory are found where it is now; one kept
    elsewhere (``--storage``) still by its absolute path."""
    run, elsewhere = tmp_path / "run", tmp_path / "storage" / "step-4"
    inside = run / "checkpoints" / "t" / "step-2"
    for folder in (inside, elsewhere):
        folder.mkdir(parents=True)
        (folder / "progress.json").write_text("{}")
    with RunStore(run) as store:
        store.register_task("t", 6, 8)
        first = store.begin_slice("t", "single", {}, "n0", [0], 0, 2)
        store.finish_slice(first, [1, 1], [0, 0], str(inside))
        second = store.begin_slice("t", "single", {}, "n0", [0], 2, 4)
        store.finish_slice(second, [1, 1], [0, 0], str(elsewhere))
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    now = moved / "checkpoints" / "t" / "step-2"
    with RunStore(moved) as store:
        assert [c.path for c in store.checkpoints("t")] == [str(now), str(elsewhere)]
        assert store.slice(first).checkpoint == str(now)
        store.forget_checkpoints("t", [str(elsewhere)])
        assert store.latest_checkpoint("t").path == str(now)
        store.forget_checkpoints("t", [str(now)])
        assert store.checkpoints("t") == []


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
    # A launcher's beat after the slice's start is when the store last heard of it: a
    # slice a kill cut short ends there, not at its own start (a sliver of no seconds).
    # (beat_every: what a current-practice run hands its slices as on_progress; the
    # first call beats, one within its interval does not write again)
    script = script.replace("s.register_task('t', 4, 8)\n", "") + (
        "import time\ntime.sleep(0.2)\nb = s.beat_every(3600)\nb(0, {})\n"
        "heard = s.last_heard()\ntime.sleep(0.1)\nb(0, {})\nassert s.last_heard() == heard\n")
    subprocess.run([sys.executable, "-c", script], check=True)
    with RunStore(tmp_path) as store:
        second = max(store.slices("t"), key=lambda s: s.id)
        store.recover_interrupted()
        ended = store.slice(second.id)
        assert ended.ended_at is not None and ended.ended_at >= second.started_at + 0.2


def test_a_store_of_an_older_dione_is_rebuilt_with_every_row(tmp_path: Path) -> None:
    """A run directory written before `diverged` existed (status CHECKs without it, a
    loss that could not be NULL) opens, keeps its rows, and takes a NaN and a divergence."""
    import math
    import sqlite3

    old = sqlite3.connect(tmp_path / "dione.sqlite")
    old.executescript("""
        CREATE TABLE tasks (name TEXT PRIMARY KEY, total_steps INTEGER NOT NULL,
            batch_size INTEGER NOT NULL, hyperparameters TEXT NOT NULL DEFAULT '{}',
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'running', 'done', 'failed')),
            error TEXT, updated_at REAL NOT NULL);
        CREATE TABLE slices (id INTEGER PRIMARY KEY AUTOINCREMENT,
            task TEXT NOT NULL REFERENCES tasks(name), technique TEXT NOT NULL,
            knobs TEXT NOT NULL, node TEXT NOT NULL, device_ids TEXT NOT NULL,
            start_step INTEGER NOT NULL, end_step INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed', 'interrupted')),
            started_at REAL NOT NULL, ended_at REAL, error TEXT, checkpoint TEXT,
            host TEXT NOT NULL, owner_pid INTEGER NOT NULL, timings TEXT,
            peak_memory_bytes INTEGER);
        CREATE TABLE metrics (task TEXT NOT NULL, step INTEGER NOT NULL,
            slice_id INTEGER NOT NULL REFERENCES slices(id), loss REAL NOT NULL,
            seconds REAL NOT NULL, PRIMARY KEY (task, step));
        INSERT INTO tasks VALUES ('t', 4, 8, '{}', 'pending', NULL, 0);
        INSERT INTO slices VALUES (1, 't', 'single', '{}', 'n0', '[0]', 0, 1, 'done', 0, 1,
            NULL, NULL, 'h', 1, '{}', NULL);
        INSERT INTO metrics VALUES ('t', 1, 1, 2.5, 0.1);
    """)
    old.close()
    with RunStore(tmp_path) as store:
        assert store.losses("t") == [(1, 2.5)] and store.slice(1).status == "done"
        slice_id = store.begin_slice("t", "single", {}, "n0", [0], 1, 3)
        store.diverge_slice(slice_id, [1.0, math.nan], [0.1, 0.1], "loss nan at step 3")
        assert store.task("t").status == "diverged"
        assert math.isnan(store.losses("t")[-1][1])
    with RunStore(tmp_path) as store:  # opening it again changes nothing
        assert [s for s, _ in store.losses("t")] == [1, 2, 3]


def test_a_store_from_before_exactness_was_recorded_marks_its_xpipe_slices(
        tmp_path: Path) -> None:
    """Version 1 kept no slice's exactness: opened now, its xpipe slices (the only
    technique that was inexact then) are recorded as inexact, the others as exact."""
    import sqlite3

    with RunStore(tmp_path) as store:
        store.register_task("t", 4, 8)
        for technique, start in (("xpipe", 0), ("ddp", 1)):
            store.begin_slice("t", technique, {}, "n0", [0, 1], start, start + 1)
    old = sqlite3.connect(tmp_path / "dione.sqlite")
    old.executescript("ALTER TABLE slices DROP COLUMN inexactness; DROP TABLE cuts;"
                      "PRAGMA user_version=1;")
    old.close()
    with RunStore(tmp_path) as store:
        xpipe, ddp = store.slices("t")
        assert xpipe.inexactness is not None and "xpipe is asynchronous" in xpipe.inexactness
        assert ddp.inexactness is None
        assert store.cut("t", 2) is None


def test_a_task_that_diverged_under_an_inexact_technique_reads_inexact(
        tmp_path: Path) -> None:
    """A diverged slice trained its steps too: under xpipe (opted in) the task is
    inexact (it read "exact": only finished slices counted)."""
    from dione.state.summaries import summaries

    with RunStore(tmp_path) as store:
        store.register_task("t", 4, 8)
        slice_id = store.begin_slice("t", "xpipe", {}, "n0", [0, 1], 0, 4,
                                     "xpipe is asynchronous")
        store.diverge_slice(slice_id, [1.0, float("nan")], [0.1, 0.1], "loss nan at step 2")
        [summary] = summaries(store)
    assert summary.status == "diverged" and summary.exactness == "INEXACT"
    assert summary.inexact == ["steps 0-4, xpipe is asynchronous"]


def test_a_long_curve_is_read_in_windows_and_its_last_loss_alone(tmp_path: Path) -> None:
    losses = [float(k % 7) for k in range(1, 101)]
    losses[42] = float("nan")  # step 43: its window's mean is NaN, as the step was
    with RunStore(tmp_path) as store:
        store.register_task("t", 100, 8)
        assert store.last_loss("t") is None and store.loss_curve("t", 10) == []
        slice_id = store.begin_slice("t", "single", {}, "n0", [0], 0, 100)
        store.finish_slice(slice_id, losses, [0.1] * 100, None)
        assert store.last_loss("t") == losses[-1]
        assert store.loss_curve("t", 100) == store.losses("t")  # no more points: as is
        curve = store.loss_curve("t", 10)
        assert [step for step, _ in curve] == list(range(10, 101, 10))
        for (step, mean), window in zip(curve, range(0, 100, 10), strict=True):
            values = losses[window:window + 10]
            if step == 50:
                assert mean != mean  # NaN
            else:
                assert mean == pytest.approx(sum(values) / 10)
        assert store.metrics("t", after=97) == [(98, losses[97], 0.1), (99, losses[98], 0.1),
                                                (100, losses[99], 0.1)]


def test_a_task_diverged_in_its_first_slice_shows_what_it_trained_under(tmp_path: Path) -> None:
    """Its only slice diverged: the summary (status, report) names that slice's technique
    and devices, not '-'."""
    import math

    from dione.state.summaries import summaries

    with RunStore(tmp_path) as store:
        store.register_task("t", 4, 8)
        slice_id = store.begin_slice("t", "ddp", {}, "n0", [0, 1], 0, 4)
        store.diverge_slice(slice_id, [1.0, math.nan], [0.1, 0.1], "loss nan at step 2")
        (summary,) = summaries(store)
    assert summary.status == "diverged" and summary.techniques == ["ddp"]
    assert summary.devices == ["n0:0,1"]


def test_leaderboards_rank_as_the_stopping_rules_judge_else_by_the_metric_s_name(
        tmp_path: Path) -> None:
    """`val_nll` under a rule with mode="min" was ranked highest first (its name is no
    loss/error/mse): the run records each judged metric's direction and the board
    follows it; a metric no rule judges is guessed from its name, and says so. Values
    that read alike share a rank (d, 2e-8 from c: exact techniques' reduction order)."""
    from dione.report import lower_is_better, write_report

    with RunStore(tmp_path) as store:
        for name, nll in (("a", 0.27), ("b", 0.31), ("c", 0.25), ("d", 0.25000002)):
            store.register_task(name, 2, 8)
            slice_id = store.begin_slice(name, "single", {}, "n0", [0], 0, 2)
            store.finish_slice(slice_id, [1.0, 0.9], [0.1, 0.1], None,
                               evaluation={"val_nll": nll, "top1_err": nll, "score": nll})
        # A task that failed on the way, its last value the best: listed, unranked.
        store.register_task("e", 2, 8)
        slice_id = store.begin_slice("e", "single", {}, "n0", [0], 0, 1)
        store.finish_slice(slice_id, [1.0], [0.1], None,
                           evaluation={"val_nll": 0.1, "top1_err": 0.1, "score": 0.1})
        store.set_task_status("e", "failed", "RuntimeError: boom")
        store.add_directions({"val_nll": "min", "score": "min"})
        store.add_directions({"val_nll": "max"})  # the first direction recorded stands
        assert store.directions() == {"score": "min", "val_nll": "min"}
    write_report(tmp_path)
    summary = (tmp_path / "report" / "summary.md").read_text()
    for metric, why in (("val_nll", "as the run's stopping rule judges it"),
                        ("score", "as the run's stopping rule judges it"),
                        ("top1_err", "guessed from its name")):
        board = summary.split(f"## Leaderboard by {metric} (lower is better, ")[1]
        assert board.startswith(why), summary
        ranks = [(line.split("|")[1].strip(), line.split("|")[2].strip())
                 for line in board.split("##")[0].splitlines() if line[:3] in ("| 1", "| 3",
                                                                               "| 4")]
        assert ranks == [("1", "c"), ("1", "d"), ("3", "a"), ("4", "b")], (metric, ranks)
        assert "| - | e | 0.1000 (failed at step 1 of 2) |" in board, board
    assert not lower_is_better("answer_accuracy") and not lower_is_better("f1")
    assert lower_is_better("val_wer") and lower_is_better("eval/loss")
    assert not lower_is_better("val_nll", {"val_nll": "max"})


def test_status_counts_each_way_a_task_ended(capsys: pytest.CaptureFixture[str]) -> None:
    """A finished sweep read "3 of 6 task(s) done", its stopped tasks unsaid."""
    from dione.cli.views import print_status
    from dione.state.summaries import TaskSummary

    tasks = [TaskSummary(f"t{i}", status, 4, 8) for i, status in enumerate(
        ["done", "done", "stopped", "stopped", "stopped", "diverged"])]
    print_status(Path("run"), tasks, 2, [], "no launcher running")
    said = " ".join(capsys.readouterr().out.split())
    assert "2 of 6 task(s) done, 3 stopped, 1 diverged, 2 plan(s) adopted" in said, said
    from dione.state.summaries import figure

    assert (figure(4.377e-06), figure(0.5), figure(0.0)) == ("4.377e-06", "0.5000", "0.0000")
    # A count as a count (it read 242.0000); a small whole value keeps its decimals,
    # as losses and accuracies of 1.0 beside others of four.
    assert (figure(242.0), figure(1.0), figure(242.5)) == ("242", "1.0000", "242.5000")
    assert figure(242) == "242"  # an int (int.is_integer is Python 3.12's)
    # Two CUDA errors end with one note: the exception's own line tells them apart (a
    # task failed "twice with the same error" on two different faults: review).
    from dione.state.summaries import exception_line

    cuda = ("Traceback ...\nRuntimeError: CUDA error: {}\nCUDA kernel errors might be "
            "asynchronously reported\nCompile with `TORCH_USE_CUDA_DSA` to enable it.")
    assert exception_line(cuda.format("an illegal memory access")) != \
        exception_line(cuda.format("unspecified launch failure"))
    assert exception_line("Traceback ...\nValueError: boom") == "ValueError: boom"
    # A grid's long names on 80 columns: a line per task, each name whole (the table
    # cut all 48 to "d-lr0.…", and piped to a file at their varying ends).
    from rich.console import Console

    from dione.cli import views

    names = [f"d-lr0.0001-width128-batch_size64-seed{i}" for i in range(3)]
    narrow = Console(record=True, width=80)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(views, "console", narrow)
        print_status(Path("run"), [TaskSummary(n, "done", 8, 8, evaluation={
            "accuracy": 0.9, "test_loss": 0.3}) for n in names], 1, [], "no launcher running")
    lines = narrow.export_text().splitlines()
    for name in names:
        assert any(line.startswith(f"{name}: status done") for line in lines), lines


def test_an_unreadable_add_request_is_refused_and_the_others_go_on(tmp_path: Path) -> None:
    """A damaged row in the inbox crashed the live run at its next poll, and every resume
    and `dione add` after it, with a traceback."""
    import sqlite3

    from dione.orchestrate.additions import _intake

    with RunStore(tmp_path) as store:
        bad = store.add_tasks(str(tmp_path / "w.py"), ["a"])
        good = store.add_tasks(str(tmp_path / "absent.py"), ["b"])
    db = sqlite3.connect(tmp_path / "dione.sqlite")
    db.execute("UPDATE additions SET names = 'not json[' WHERE id = ?", (bad,))
    db.commit()
    db.close()
    with RunStore(tmp_path) as store:
        requests = store.additions("waiting")
        assert [(r.id, r.names) for r in requests] == [(bad, []), (good, ["b"])]
        assert store.addition_of("a") is None
        arrival = _intake([], requests, set(), None, None)  # type: ignore[arg-type]
    assert arrival.requests_refused[bad].startswith("its record is unreadable")
    assert "absent.py could not be loaded" in arrival.requests_refused[good]


def test_status_says_why_a_request_was_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A workload file that raised on loading: `dione add` prints its traceback; the
    status table gave the whole traceback under every later status too."""
    from dione.cli.views import print_status
    from dione.orchestrate.additions import _intake

    (tmp_path / "w.py").write_text("raise RuntimeError('boom in my file')\n")
    with RunStore(tmp_path) as store:
        request = store.add_tasks(str(tmp_path / "w.py"), ["a"])
        arrival = _intake([], store.additions("waiting"), set(), None,
                          None)  # type: ignore[arg-type]
        assert "Traceback" in arrival.requests_refused[request]
        store.settle_addition(request, "refused", arrival.requests_refused[request])
        print_status(tmp_path, [], 0, [], "no launcher running",
                     store.additions("waiting", "refused"))
    said = capsys.readouterr().out
    assert "w.py:1: raised RuntimeError while loading: boom in my file (its traceback: " \
        "the launcher's output)" in " ".join(said.split()), said
    assert "Traceback" not in said


def test_a_store_of_a_newer_dione_is_refused_saying_so(tmp_path: Path) -> None:
    import sqlite3

    from dione.state.sqlite import StateFileError

    with RunStore(tmp_path) as store:
        store.register_task("t", 10, 8)
    db = sqlite3.connect(tmp_path / "dione.sqlite")
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StateFileError, match=r"written by a newer dione \(store schema 99; "
                       r"this dione knows \d+\): upgrade dione"):
        RunStore(tmp_path)


def test_a_done_task_whose_last_evaluation_failed_is_not_ranked_by_an_earlier_one(
        tmp_path: Path) -> None:
    """Its step-2 metrics were reported as its final ones, ranked on the leaderboard
    beside weights trained to step 4 that measure otherwise; each is now marked with its
    step, and the board lists it after the ranked, saying why."""
    from dione.report import write_report
    from dione.state.summaries import summaries

    with RunStore(tmp_path) as store:
        for name in ("flaky", "steady"):
            store.register_task(name, 4, 8)
            first = store.begin_slice(name, "single", {}, "n0", [0], 0, 2)
            store.finish_slice(first, [1.0, 0.5], [0.1, 0.1], None,
                               evaluation={"accuracy": 0.5 if name == "flaky" else 0.4})
            last = store.begin_slice(name, "single", {}, "n0", [0], 2, 4)
            store.finish_slice(last, [0.4, 0.3], [0.1, 0.1], None,
                               evaluation={"accuracy": 0.6} if name == "steady" else None,
                               evaluation_error=None if name == "steady" else "OSError: x")
        assert store.latest_evaluation("flaky") == (2, {"accuracy": 0.5})
        flaky, steady = summaries(store)
    assert (flaky.status, flaky.steps, flaky.evaluated_at, flaky.evaluated_before) == (
        "done", 4, 2, True)
    assert (steady.evaluated_at, steady.evaluated_before) == (4, False)
    summary = (write_report(tmp_path) / "summary.md").read_text()
    assert "| 1 | steady | 0.6000 |" in summary
    assert ("| - | flaky | not ranked: nothing recorded at step 4, its evaluation failed or "
            "gave no finite value (step 2's: 0.5000) |" in summary)
    assert "| flaky | done | 4/4 |" in summary and "0.5000 (step 2)" in summary



def test_equal_values_share_a_rank(tmp_path: Path) -> None:
    from dione.report import write_report

    with RunStore(tmp_path) as store:
        for name, accuracy in (("a", 0.9), ("b", 0.9), ("c", 0.8)):
            store.register_task(name, 2, 8)
            slice_id = store.begin_slice(name, "single", {}, "n0", [0], 0, 2)
            store.finish_slice(slice_id, [1.0, 0.5], [0.1, 0.1], None,
                               evaluation={"accuracy": accuracy})
    summary = (write_report(tmp_path) / "summary.md").read_text()
    assert "| 1 | a | 0.9000 |" in summary and "| 1 | b | 0.9000 |" in summary
    assert "| 3 | c | 0.8000 |" in summary


def test_the_summary_tells_a_task_s_gangs_apart(tmp_path: Path) -> None:
    """A task on one device, then on a gang of two, read 'vm:0, vm:0,1': the gangs and
    their devices shared a comma (review)."""
    from dione.report import write_report

    with RunStore(tmp_path) as store:
        store.register_task("moved", 4, 8)
        for start, devices in ((0, [0]), (2, [0, 1])):
            slice_id = store.begin_slice("moved", "single" if start == 0 else "ddp", {}, "n0",
                                         devices, start, start + 2)
            store.finish_slice(slice_id, [1.0, 0.9], [0.1, 0.1], None)
    summary = (write_report(tmp_path) / "summary.md").read_text()
    assert "| single, ddp | n0:0; n0:0,1 |" in summary, summary


def test_the_best_of_a_run_result_is_the_report_s_rank_one(tmp_path: Path) -> None:
    """best() gave a failed task the report lists unranked, where no task trained to
    its end (review)."""
    from dione.orchestrate import RunResult, TaskResult

    tasks = [TaskResult("failed", "failed", steps=10, total_steps=40,
                        evaluation={"accuracy": 0.9}),
             TaskResult("stopped", "stopped", steps=10, total_steps=40,
                        evaluation={"accuracy": 0.8})]
    result = RunResult(tmp_path, tasks, 1.0, 1.0, 1, 0.0)
    assert [t.task for t in result.leaderboard("accuracy")] == ["failed", "stopped"]
    best = result.best("accuracy")
    assert best is not None and best.task == "stopped"


def test_a_hyperparameter_cell_is_json_where_it_is_not_text_or_a_number() -> None:
    """summary.csv's config/NAME: a dict read as Python's repr beside the JSON column, a
    None as a missing value (review)."""
    from dione.report.files import _cell

    assert [_cell(v) for v in ({"name": "adam"}, [1, 2], True, None, 0.1, 3, "x")] == [
        '{"name": "adam"}', "[1, 2]", "true", "null", 0.1, 3, "x"]


def test_dashboards_close_with_the_statuses_and_final_values_the_report_shows(
        tmp_path: Path) -> None:
    """After a kill the dashboards said "running" and "pending" where the report said
    "interrupted"; a task whose last evaluation failed had its earlier value logged as
    final (ranked against the others' final ones); an error's first line alone read
    "evaluation failed:" (review)."""
    from dione.state.summaries import (
        TaskSummary,
        closing_summaries,
        final_results,
        short_error,
    )

    with RunStore(tmp_path / "run") as store:  # a launcher killed mid-slice leaves this
        store.register_task("a", 8, 16)
        store.set_task_status("a", "running")
        store.register_task("b", 8, 16)
        store.set_task_status("b", "done")
        assert [(t.task, t.status) for t in closing_summaries(store)] == [
            ("a", "interrupted"), ("b", "done")]
    earlier = TaskSummary("c", "done", 8, 8, final_loss=0.5, evaluation={"accuracy": 0.7},
                          evaluated_at=4)
    assert final_results(earlier) == {"final/loss": 0.5}
    last = TaskSummary("d", "done", 8, 8, final_loss=0.5, evaluation={"accuracy": 0.7},
                       evaluated_at=8)
    assert final_results(last) == {"final/accuracy": 0.7, "final/loss": 0.5}
    assert short_error("evaluation failed:\nTraceback (most recent call last):\n  File "
                       "\"w.py\", line 3, in evaluate\nValueError: no split") == \
        "evaluation failed: ValueError: no split"
    assert short_error("task 'x' failed: boom\nmore") == "task 'x' failed: boom"


def test_a_pipe_in_a_cell_stays_in_its_cell_in_the_summary_and_the_page() -> None:
    """A hyperparameter "cosine|warmup" split its leaderboard row into one more cell, in
    summary.md and on the page (review)."""
    from dione.report.files import _row
    from dione.report.page import _markdown_tables

    row = _row(["1", "t", '{"schedule": "cosine|warmup"}', "exact"])
    assert row == '| 1 | t | {"schedule": "cosine\\|warmup"} | exact |'
    page = _markdown_tables("| rank | task | hyperparameters | trained |\n"
                            "| --- | --- | --- | --- |\n" + row)
    assert page.count("<td>") == 4 and "cosine|warmup" in page, page


def test_status_gives_the_first_stopped_tasks_reasons_and_counts_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stopped task's reason was the report's alone (a review); a line each made a
    100-task sweep's status 90 lines longer (the regression review): the first five,
    then a count pointing at the report."""
    from dione.cli.views import print_status
    from dione.state.summaries import TaskSummary

    tasks = [TaskSummary(f"t{i}", "stopped", 4, 12, error=f"loss {i} at step 4 ranks {i} "
                         "of 12: stopped by ASHA") for i in range(12)]
    print_status(tmp_path, tasks, 1, [], "no launcher running")
    said = capsys.readouterr().out
    assert [f"t{i} (stopped): loss {i} at step 4" in said for i in range(12)] == \
        [True] * 5 + [False] * 7, said
    assert "... and 7 more stopped: each one's reason is in the report" in said
