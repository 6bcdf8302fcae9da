"""State files a user or a fault damaged, a lock bypassed, a full disk, files others may
read: each one sentence and exit 2, nothing lost, nothing followed that is not ours."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from dione.cli import main as dione_main
from dione.launch import local_placement, run_slice
from dione.launch.slice import SliceError
from dione.state.lock import RunDirBusy, RunLock, lock_holder
from dione.state.sqlite import StateFileError
from dione.state.store import RunStore
from helpers import TEST_NODE, digits_task, read_only

WORKLOAD = '''
import functools, os, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

hidden = int(os.environ.get("HIDDEN", "16"))
workload = Workload([Task(name="d", model=functools.partial(digits_mlp, hidden=hidden, depth=1),
                          data=digits_train, loss=torch.nn.functional.cross_entropy,
                          optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
                          batch_size=16, steps=8, techniques=("single",))])
'''


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = dione_main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def trained(tmp_path: Path) -> tuple[Path, Path]:
    """A workload file and a run directory that `dione train` trained 4 steps in."""
    workload = tmp_path / "workload.py"
    workload.write_text(WORKLOAD)
    run_dir = tmp_path / "run"
    assert dione_main(["train", str(workload), "--task", "d", "--technique", "single",
                       "--steps", "4", "--out", str(run_dir)]) == 0
    return workload, run_dir


def test_a_read_only_run_directory_is_read_where_it_is(
        trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    """An archived run (a read-only mount, another user's folder) could not even be
    looked at: SQLite writes beside a WAL file to read it."""
    import tempfile

    workload, run_dir = trained
    capsys.readouterr()
    copies = set(Path(tempfile.gettempdir()).glob("dione-read-*"))
    with read_only(run_dir) as archived:
        code, said = run(capsys, "status", str(archived))
        assert code == 0 and "4/" in said and "Traceback" not in said, said
        code, said = run(capsys, "export", str(archived), "d", "--latest", "-o",
                         str(tmp_path / "out"), "--workload", str(workload))
        assert code == 0 and (tmp_path / "out" / "model.safetensors").is_file(), said
        code, said = run(capsys, "train", str(workload), "--task", "d", "--technique",
                         "single", "--out", str(archived))
        assert code == 2 and "Traceback" not in said, said
        assert "give a directory you can write" in said, said
        # Its report: written elsewhere where asked, the way there named where not.
        code, said = run(capsys, "report", str(archived))
        assert code == 2 and "give --out DIR to write it elsewhere" in said, said
        code, said = run(capsys, "report", str(archived), "--out", str(tmp_path / "report"))
        assert code == 0 and (tmp_path / "report" / "gantt.png").is_file(), said
        code, said = run(capsys, "report", str(archived), "--out", str(tmp_path / "report"))
        assert code == 0, said  # a report's folder is written again
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "index.html").write_text("my page")
        code, said = run(capsys, "report", str(archived), "--out", str(tmp_path / "mine"))
        assert code == 2 and "holds files that are not a dione report" in said, said
        assert (tmp_path / "mine" / "index.html").read_text() == "my page"
        assert not (archived / "report").exists()
        with RunStore(archived) as store:  # read from a copy; a write says where it is
            assert store.read_only and [t.name for t in store.tasks()] == ["d"]
            with pytest.raises(StateFileError, match=r"cannot be written here .*it is not "
                               r"damaged, and is read where it is"):
                store.register_task("e", 10, 8)
    assert set(Path(tempfile.gettempdir()).glob("dione-read-*")) == copies


def test_a_store_cut_to_nothing_is_refused_not_taken_for_a_new_run(
        trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """It silently restarted every task from step 0 over the checkpoints it held."""
    workload, run_dir = trained
    capsys.readouterr()
    before = sorted((run_dir / "checkpoints" / "d").iterdir())
    (run_dir / "dione.sqlite").write_bytes(b"")
    for leftover in ("dione.sqlite-wal", "dione.sqlite-shm"):
        (run_dir / leftover).unlink(missing_ok=True)
    code, said = run(capsys, "train", str(workload), "--task", "d", "--technique", "single",
                     "--out", str(run_dir))
    assert code == 2 and "is empty, yet" in said and "Traceback" not in said
    assert sorted((run_dir / "checkpoints" / "d").iterdir()) == before
    code, said = run(capsys, "status", str(run_dir))
    assert code == 2 and "is empty" in said


def test_a_store_being_created_is_never_seen_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader (``dione status``, a test polling a starting run) that opened the store
    while the launcher was creating it found an empty file beside run.json and took the
    run for one cut to nothing (CI). Here the reader opens it at the worst moment: as the
    creator connects to its new file."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{}")
    connect = sqlite3.connect
    seen: list[list[str]] = []

    def reader_cuts_in(path: object, *args: object, **kwargs: object) -> sqlite3.Connection:
        if not seen:
            seen.append([])  # once: the reader's own open goes straight through
            with RunStore(run_dir) as store:
                seen[0] = [t.name for t in store.tasks()]
        return connect(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite3, "connect", reader_cuts_in)
    with RunStore(run_dir) as store:
        store.register_task("t", 4, 2)
    monkeypatch.setattr(sqlite3, "connect", connect)
    assert seen == [[]]
    with RunStore(run_dir) as store:
        assert [t.name for t in store.tasks()] == ["t"]
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("damage", ["not a database", "cut in half", "garbage row"])
def test_a_damaged_store_is_one_sentence_and_exit_2(
        trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str], damage: str) -> None:
    _, run_dir = trained
    capsys.readouterr()
    store = run_dir / "dione.sqlite"
    if damage == "garbage row":
        with sqlite3.connect(store) as db:
            db.execute("UPDATE slices SET knobs = '{not json'")
    else:
        with sqlite3.connect(store) as db:  # everything in the main file first
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        data = store.read_bytes()
        store.write_bytes(b"not a database at all" * 64 if damage == "not a database"
                          else data[: len(data) // 2])
    code, said = run(capsys, "status", str(run_dir))
    assert code == 2 and "Traceback" not in said
    assert str(store) in said and "cannot be used as dione's run store" in said
    assert said.count("\n") <= 3


def test_a_catalog_record_with_an_impossible_time_is_a_trial_to_run_again(
        tmp_path: Path) -> None:
    """A catalog edited or copied by hand with a negative time made every slice end
    before it began: every task of every run looked stalled."""
    from dione.profile.catalog import Catalog, TrialRecord

    good = TrialRecord("f" * 64, "single", {}, 1, "cpu", "ok", step_seconds=0.01,
                       fixed_seconds=0.5)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        catalog.put(good)
        catalog.put_evaluation_seconds("k", 0.2)
        assert catalog.get(good.fingerprint) == good and \
            catalog.evaluation_seconds("k") == 0.2
        for bad in ({"fixed_seconds": -40.0}, {"step_seconds": float("nan")},
                    {"step_seconds": None}, {"load_seconds": "1"}):
            catalog.put(dataclasses.replace(good, **bad))
            assert catalog.get(good.fingerprint) is None, bad
            assert catalog.records() == []
        catalog.put_evaluation_seconds("k", -3.0)
        assert catalog.evaluation_seconds("k") is None
        catalog.put(dataclasses.replace(good, status="oom", step_seconds=None))
        assert catalog.get(good.fingerprint).status == "oom"  # no time: none to doubt


def test_a_damaged_or_misplaced_catalog_is_one_sentence_and_exit_2(
        trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    workload, run_dir = trained
    capsys.readouterr()
    catalog = run_dir.parent / "catalog.sqlite"
    catalog.write_bytes(b"garbage" * 100)
    code, said = run(capsys, "profile", str(workload), "--catalog", str(catalog))
    assert code == 2 and "cannot be used as dione's catalog" in said
    assert "Traceback" not in said
    monkeypatch.setenv("DIONE_CATALOG", str(run_dir))  # a folder, not a file
    code, said = run(capsys, "profile", str(workload))
    assert code == 2 and "is not a file" in said
    # A garbage row is a trial to run again: the profile goes on.
    from dione.profile.catalog import Catalog

    catalog.unlink()
    with Catalog(catalog) as fresh:
        fresh._db.execute("INSERT INTO trials VALUES ('x', '{not json', 0)")
        assert fresh.get("x") is None and fresh.records() == []


def test_a_run_json_out_of_range_or_of_the_wrong_type_is_refused(
        trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    workload, run_dir = trained
    from dione.cli.saved_run import SavedRun
    from dione.orchestrate import RunOptions

    SavedRun(str(workload), RunOptions()).write(run_dir)
    saved = json.loads((run_dir / "run.json").read_text())
    for field, value in (("timeout", -1), ("max_failures", "3"), ("slice_steps", 2.5)):
        broken = {**saved, "options": {**saved["options"], field: value}}
        (run_dir / "run.json").write_text(json.dumps(broken))
        capsys.readouterr()
        code, said = run(capsys, "resume", str(run_dir))
        assert code == 2 and f"run option {field}=" in said, said


@contextmanager
def held_by_another_process(run_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """``run_dir``'s lock held by another live process (a launcher, as far as the lock
    tells) while the block runs; the process, whose pid the block may name."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from dione.state.lock import RunLock\n"
         "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)",
         str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_resume_of_a_run_a_live_launcher_holds_is_refused_with_its_pid(
        trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """`dione resume` on a directory another launcher is running: refused before it
    loads anything (exit 2, the holder's pid named), the run's files untouched."""
    workload, run_dir = trained
    from dione.cli.saved_run import SavedRun
    from dione.orchestrate import RunOptions

    SavedRun(str(workload), RunOptions()).write(run_dir)
    store_before = (run_dir / "dione.sqlite").read_bytes()
    with held_by_another_process(run_dir) as holder:
        capsys.readouterr()
        code, said = run(capsys, "resume", str(run_dir))
    assert code == 2 and "in use by another dione launcher" in said, said
    assert f"pid {holder.pid}" in said and "Traceback" not in said
    assert (run_dir / "dione.sqlite").read_bytes() == store_before


def test_the_lock_cannot_be_bypassed_by_deleting_it_nor_followed_through_a_symlink(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    second = [sys.executable, "-c", "import sys; from dione.state.lock import RunLock, "
              "RunDirBusy\ntry:\n    RunLock(sys.argv[1]).acquire()\nexcept RunDirBusy as e:\n"
              "    print(e); sys.exit(3)", str(run_dir)]
    with RunLock(run_dir):
        (run_dir / "lock").unlink()  # a careless `rm`: the lock is the directory's
        refused = subprocess.run(second, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 3 and "in use by another dione launcher" in refused.stdout
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    (run_dir / "lock").unlink(missing_ok=True)
    (run_dir / "lock").symlink_to(victim)
    with RunLock(run_dir):
        assert victim.read_text() == "the user's own file\n"
        assert not (run_dir / "lock").is_symlink()
        assert json.loads((run_dir / "lock").read_text())["pid"] == os.getpid()
    with held_by_another_process(run_dir) as holder:
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):
            RunLock(run_dir).acquire()
        found = lock_holder(run_dir)
        assert found is not None and found.alive and found.pid == holder.pid
    found = lock_holder(run_dir)
    assert found is not None and not found.alive
    # As every command and dione.run take it: held in the block, free after it (it was
    # held until the process ended).
    from dione.orchestrate.options import claim_run_dir

    with claim_run_dir(run_dir):
        found = lock_holder(run_dir)
        assert found is not None and found.alive and found.pid == os.getpid()
    found = lock_holder(run_dir)
    assert found is not None and not found.alive


def test_another_thread_of_the_process_is_refused_the_run_directory(tmp_path: Path) -> None:
    """The lock is re-entrant within a thread only: a second `dione.run` on the folder
    from another thread of the process is refused, naming the thread (both trained the
    same tasks into the same checkpoints, then one ended with a bare KeyError: a
    review); once the first lets go, it is taken."""
    import threading

    import dione
    from dione.orchestrate.options import RunDirError, claim_run_dir

    run_dir = tmp_path / "run"
    held, done = threading.Event(), threading.Event()

    def first() -> None:
        with claim_run_dir(run_dir), claim_run_dir(run_dir):  # nested in its thread
            held.set()
            done.wait(60)

    thread = threading.Thread(target=first, name="the-first-run")
    thread.start()
    try:
        assert held.wait(60)
        with pytest.raises(RunDirError, match="in use by another call in this process "
                           r"\(thread the-first-run\); wait for it"):
            claim_run_dir(run_dir)
        with pytest.raises((RunDirError, ValueError), match="another call in this process"):
            dione.run([digits_task("a", steps=2)], devices="cpu:1", run_dir=str(run_dir),
                      quiet=True)
    finally:
        done.set()
        thread.join(60)
    with claim_run_dir(run_dir):
        found = lock_holder(run_dir)
        assert found is not None and found.alive and found.pid == os.getpid()
    # A thread that ended holding it (never released) does not hold it for ever: the
    # folder was refused for the rest of the process, "wait for it to finish" (review).
    leaked = threading.Thread(target=lambda: RunLock(run_dir).acquire(), name="leaks")
    leaked.start()
    leaked.join(60)
    with claim_run_dir(run_dir):
        found = lock_holder(run_dir)
        assert found is not None and found.alive
    # ... and let go once the thread that took it over is done (the dead thread's hold
    # and descriptor stayed: the folder was locked to every other process, a review).
    found = lock_holder(run_dir)
    assert found is not None and not found.alive

    def alive() -> bool:
        found = lock_holder(run_dir)
        return found is not None and found.alive

    # A stale take's release (its thread ended, the folder taken over since) lets go of
    # nothing; a `with` of an object already entered takes it again (third review).
    stale = RunLock(run_dir)
    ended = threading.Thread(target=stale.acquire)
    ended.start()
    ended.join(60)
    with claim_run_dir(run_dir):
        stale.release()
        assert alive()
    lock = RunLock(run_dir)
    with lock:
        with lock:
            pass
        assert alive()
    assert not alive()
    # A forked child holds nothing of its parent's: the folder is another's to it.
    with RunLock(run_dir):
        child = os.fork()
        if child == 0:  # pragma: no cover (the child)
            try:
                RunLock(run_dir).acquire()
            except RunDirBusy:
                os._exit(3)
            os._exit(0)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 3
        assert alive()
    assert not alive()


def test_a_full_store_stops_with_a_sentence_and_a_full_disk_is_not_retried(
        tmp_path: Path) -> None:
    """SQLite's 'database or disk is full' (here: the file may not grow) is a
    StateFileError that says to free space; run_slice lets it stop the run, where it
    was taken for a task's retryable failure. torch's short write on a full disk
    ('unexpected pos') is a failure no retry can mend."""
    with RunStore(tmp_path) as store:
        store.register_task("t", 10_000, 8)
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages + 1}")
        slice_id = store.begin_slice("t", "single", {}, "n", [0], 0, 10_000)
        with pytest.raises(StateFileError, match="free space on that disk"):
            store.finish_slice(slice_id, [1.0] * 10_000, [0.1] * 10_000, None)
    error = SliceError("rank 0 raised RuntimeError: [enforce fail at inline_container.cc:"
                       "626] . unexpected pos 2496 vs 2384", "raised", "RuntimeError")
    assert not error.retryable


def test_files_a_run_writes_are_private(tmp_path: Path) -> None:
    """run.json, plans, the report, the rank logs and the store's -wal and -shm files
    were created 0644/0755."""
    from dione.orchestrate import RunOptions, run_workload
    from dione.profile import TrialOptions
    from dione.spec.cluster import Cluster, Node

    run_dir = tmp_path / "run"
    os.umask(0o022)
    run_workload([digits_task(steps=4, techniques=("single",))],
                 Cluster([Node("test", 2, "cpu")]), run_dir,
                 RunOptions(catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0,
                            trial=TrialOptions(warmup_steps=1, measure_steps=2)))
    from dione.cli.saved_run import SavedRun
    from dione.report import write_report

    write_report(run_dir)
    SavedRun("w.py", RunOptions()).write(run_dir)
    seen = {p.relative_to(run_dir).parts[0] for p in run_dir.rglob("*")}
    assert {"run.json", "plans", "report", "logs", "dione.sqlite"} <= seen
    loose = [str(p.relative_to(run_dir)) for p in [run_dir, *run_dir.rglob("*")]
             if not p.is_symlink() and stat.S_IMODE(p.stat().st_mode) & 0o077]
    assert loose == []


def test_a_model_changed_between_slices_is_named_and_not_retried(tmp_path: Path) -> None:
    placement = local_placement(TEST_NODE, [0])
    run_slice(digits_task(steps=8), "single", tmp_path, placement, steps=4)
    import functools

    from dione.zoo import digits_mlp

    changed = digits_task(steps=8, model=functools.partial(digits_mlp, hidden=48, depth=2))
    with pytest.raises(SliceError) as caught:
        run_slice(changed, "single", tmp_path, placement)
    assert "does not fit the task's model or optimizer as they are now" in str(caught.value)
    assert not caught.value.retryable


def test_an_unreachable_ray_address_is_refused_in_seconds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    workload = tmp_path / "workload.py"
    workload.write_text(WORKLOAD)
    began = time.monotonic()
    code, said = run(capsys, "run", str(workload), "--ray", "127.0.0.1:1", "--out",
                     str(tmp_path / "run"))
    assert code == 2 and "cannot reach a Ray cluster at '127.0.0.1:1'" in said
    assert time.monotonic() - began < 60  # it waited over five minutes
    # A Ray Client address too (33 s of Ray's retries: review).
    code, said = run(capsys, "run", str(workload), "--ray", "ray://127.0.0.1:1", "--out",
                     str(tmp_path / "run"))
    assert code == 2 and "cannot reach a Ray cluster at 'ray://127.0.0.1:1'" in said, said
    assert "Ray Client server answers on port 10001" in " ".join(said.split())


@pytest.mark.parametrize("ending", ["import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n"])
def test_a_workload_that_ends_the_process_at_import_is_refused(
        tmp_path: Path, ending: str) -> None:
    workload = tmp_path / "workload.py"
    workload.write_text(ending)
    for command in ("validate", "run"):
        done = subprocess.run([sys.executable, "-m", "dione.cli", command, str(workload),
                               "--out" if command == "run" else "--devices",
                               str(tmp_path / "run") if command == "run" else "cpu:1"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "while loading" in done.stderr


def test_loading_takes_one_task_keeps_the_caller_s_random_state_and_names_a_changed_model(
        trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """dione.load of one Task (a TypeError before); the caller's torch draws go on as
    they would have (a load reseeded them from the task's seed); a model that changed
    since the run is a CheckpointMismatch naming the fix, from dione.load (torch's
    CheckpointException, a BaseException, slipped past `except Exception`) and from
    export (exit 2, not a traceback)."""
    import dione
    from dione.spec.workload import load_workload
    from dione.state.checkpoint import CheckpointMismatch

    workload, run_dir = trained
    (task,) = list(load_workload(workload))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    model = dione.load(run_dir, "d", workload=task, latest=True)
    assert torch.equal(torch.rand(3), expected) and not model.training
    monkeypatch.setenv("HIDDEN", "32")
    (wider,) = list(load_workload(workload))
    with pytest.raises(CheckpointMismatch, match="does not fit the task's model"):
        dione.load(run_dir, "d", workload=wider, latest=True)
    code, said = run(capsys, "export", str(run_dir), "d", "--latest", "--workload",
                     str(workload), "-o", str(run_dir.parent / "out"))
    assert code == 2 and "does not fit the task's model" in said and "Traceback" not in said


def test_a_done_task_whose_final_checkpoint_is_lost_trains_its_last_steps_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A done task's final checkpoint deleted: export gave the one before as the trained
    model, unsaid, and resume left it so; changed on disk: export said resume would set
    it aside and train again, and resume did nothing. Now export refuses with the way
    out, and resume trains the last steps again, from the newest intact checkpoint, to
    the same weights."""
    import shutil

    workload = tmp_path / "workload.py"
    workload.write_text(WORKLOAD)
    run_dir = tmp_path / "run"
    catalog = str(tmp_path / "catalog.sqlite")
    code, said = run(capsys, "run", str(workload), "--devices", "cpu:1", "--out",
                     str(run_dir), "--slice-steps", "4", "--catalog", catalog,
                     "--warmup-steps", "1", "--measure-steps", "2")
    assert code == 0, said
    final = run_dir / "checkpoints" / "d" / "step-00000008"
    weights = sorted(p.read_bytes() for p in final.glob("*.distcp"))
    for damage in ("deleted", "changed"):
        copy = tmp_path / damage
        shutil.copytree(run_dir, copy)
        lost = copy / "checkpoints" / "d" / "step-00000008"
        if damage == "deleted":
            shutil.rmtree(lost)
        else:
            payload = next(lost.glob("*.distcp"))
            payload.write_bytes(payload.read_bytes()[:-8] + b"\0" * 8)
        if damage == "deleted":  # said where the run is looked at, too
            code, said = run(capsys, "status", str(copy))
            assert "its final checkpoint (step 8) is not on disk; its newest is at step 4: " \
                "`dione resume` trains its last steps again" in said, said
        code, said = run(capsys, "export", str(copy), "d", "-o", str(tmp_path / f"x-{damage}"))
        assert code == 2, said
        assert ("is done, but its final checkpoint (step 8) is no longer on disk; its "
                "newest is at step 4" in said if damage == "deleted"
                else "does not match the digest" in said), said
        code, said = run(capsys, "resume", str(copy), "--catalog", catalog)
        assert code == 0, said
        assert "d: done, but its final checkpoint (step 8) is " in said, said
        assert "its steps from 4 train again" in said, said
        with RunStore(copy) as store:
            assert store.task("d").status == "done"
            assert store.latest_checkpoint("d").step == 8
        assert sorted(p.read_bytes() for p in lost.glob("*.distcp")) == weights
    # Every checkpoint gone (a --storage not mounted looks so): kept done, and said.
    bare = tmp_path / "bare"
    shutil.copytree(run_dir, bare)
    shutil.rmtree(bare / "checkpoints" / "d")
    code, said = run(capsys, "resume", str(bare), "--catalog", catalog)
    assert code == 0 and "d: done, but none of its checkpoints is on disk (deleted)" in said, said
    code, said = run(capsys, "export", str(bare), "d", "-o", str(tmp_path / "x-bare"))
    assert code == 2 and "deleted; its weights are gone: train the task anew" in said, said
    # Read whole once: a resume after finds it unchanged by its files' sizes and times
    # and reads it no more (every resume read every done task's final checkpoint whole).
    import dione.orchestrate.runner as runner_module

    read: list[str] = []
    verify = runner_module.verify_checkpoint
    runner_module.verify_checkpoint = lambda path: (read.append(str(path)), verify(path))[1]
    try:
        code, said = run(capsys, "resume", str(tmp_path / "changed"), "--catalog", catalog)
        assert code == 0 and read == [], (said, read)
        payload = next(lost.glob("*.distcp"))  # changed since: read again, and set aside
        payload.write_bytes(payload.read_bytes()[:-8] + b"\1" * 8)
        code, said = run(capsys, "resume", str(tmp_path / "changed"), "--catalog", catalog)
        assert code == 0 and len(read) == 1 and "not to be trusted" in said, said
    finally:
        runner_module.verify_checkpoint = verify


def test_a_resume_with_a_workload_lacking_a_task_says_so_and_reports_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run resumed with a workload file that no longer defines one of its tasks (not
    ended) left that task out unsaid, exit 0, and out of the report it wrote."""
    workload = tmp_path / "workload.py"
    workload.write_text(WORKLOAD)
    both = tmp_path / "both.py"  # "d" and "other", each trained a slice of 4 steps
    both.write_text(WORKLOAD + 'workload = Workload([*workload, Task(name="other", '
                    'model=functools.partial(digits_mlp, hidden=hidden, depth=1), '
                    'data=digits_train, loss=torch.nn.functional.cross_entropy, '
                    'optimizer=functools.partial(torch.optim.Adam, lr=1e-2), '
                    'batch_size=16, steps=8, techniques=("single",))])\n')
    run_dir = tmp_path / "run"
    catalog = str(tmp_path / "catalog.sqlite")
    code, said = run(capsys, "run", str(both), "--devices", "cpu:1", "--out",
                     str(run_dir), "--catalog", catalog, "--warmup-steps", "1",
                     "--measure-steps", "2", "--slice-steps", "4")
    assert code == 0, said
    with RunStore(run_dir) as store:  # stopped mid-way, its slices recorded
        store.set_task_status("other", "pending")
    code, said = run(capsys, "resume", str(run_dir), "--catalog", catalog, "--workload",
                     str(workload))
    assert code == 0, said
    assert "1 task(s) of the run are not in the workload given and are left as they are, " \
        "untrained: other (pending)" in said, said
    # The file given, beside the run's own still there: for this resume only.
    assert json.loads((run_dir / "run.json").read_text())["workload"] == str(both.resolve())
    assert "other" in (run_dir / "report" / "summary.csv").read_text()
    # What a Ctrl-C says it left: before anything trained, nothing (it said gangs were
    # stopped and checkpoints kept); once every task ended, a report cut short.
    import argparse

    from dione.cli import _left

    with RunStore(run_dir) as store:
        store.set_task_status("other", "failed", "left out")
    assert _left(argparse.Namespace(command="resume", run_dir=str(run_dir))) == (
        f"every task had ended; the stop cut the report short: `dione report {run_dir}` "
        "writes it")
    assert _left(argparse.Namespace(command="run", out=str(tmp_path / "new"),
                                    workload=str(workload))) == \
        "it stopped before any task trained: nothing to keep"
    RunStore(tmp_path / "profiling").close()  # a run stopped while profiling: no task yet
    assert _left(argparse.Namespace(command="run", out=str(tmp_path / "profiling"),
                                    workload=str(workload))).startswith(
        "it stopped while profiling, before any task trained")
    # A run.json edited by hand: said as its value, not as a --devices never given.
    saved = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**saved, "devices": "cpu:zz"}))
    code, said = run(capsys, "resume", str(run_dir))
    assert code == 2 and "run.json records devices 'cpu:zz', which dione cannot read" in \
        said, said


def test_a_store_on_a_full_disk_is_said_full_not_damaged(tmp_path: Path) -> None:
    """On a disk still full, SQLite cannot create its journal beside the store and says
    "disk I/O error": that was read as damage (restore the file from a copy, or train
    again: the run thrown away, its file intact). A real full disk: a small tmpfs."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (root only): a real full disk is the test")
    try:
        with RunStore(disk / "run") as store:
            store.register_task("a", 8, 16, {}, {})
        with open(disk / "filler", "wb") as filler, pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 65536)
        with pytest.raises(StateFileError) as said, RunStore(disk / "run") as store:
            store.register_task("b", 8, 16, {}, {})
        assert "its disk is full, the file likely intact: free space on that disk" in \
            str(said.value)
        assert "restore the file from a copy" not in str(said.value)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
