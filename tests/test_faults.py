"""Faults end the whole gang cleanly: a clear error, a non-zero exit, nothing left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dione.state import RunStore
from helpers import in_process, interruptible, worker_processes, workload_text


@pytest.fixture(scope="module")
def trained_good_task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A workload file and a run dir in which task `good` has a checkpoint, trained once
    for the module (a 2-rank gang: some 13 s a test)."""
    folder = tmp_path_factory.mktemp("good")
    workload = folder / "workload.py"
    workload.write_text(workload_text("faulty"))
    run_dir = folder / "run"
    from dione.cli import main  # in this process: no interpreter and spawner of its own

    assert main(["train", str(workload), "--task", "good", "--technique", "ddp", "--devices",
                 "2", "--steps", "3", "--out", str(run_dir)]) == 0
    return workload, run_dir


@pytest.fixture
def run_with_good_task(trained_good_task: tuple[Path, Path], tmp_path: Path
                       ) -> tuple[Path, Path]:
    """The module's run dir, copied for one test: each test fails `faulty` in its own
    (the store keeps checkpoints by their path inside the run dir, so the copy's `good`
    names the copy's checkpoint)."""
    workload, original = trained_good_task
    run_dir = tmp_path / "run"
    shutil.copytree(original, run_dir)
    return workload, run_dir


def snapshot(run_dir: Path, task: str):
    """Everything recorded about ``task``: its store rows and its checkpoint files."""
    with RunStore(run_dir) as store:
        rows = (store.task(task), store.slices(task), store.losses(task), store.checkpoints(task))
    files = {p: p.stat().st_mtime_ns for p in (run_dir / "checkpoints" / task).rglob("*")}
    return rows, files


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("raise", "rank 1 (device 1) raised ValueError: injected failure on rank 1"),
        ("kill", "rank 1 (device 1) was killed by SIGKILL"),
        ("kill-forked", "rank 1 (device 1) was killed by SIGKILL"),
        ("hang", "ran past its timeout of 8 s"),
    ],
)
def test_faulty_worker_ends_the_gang(run_with_good_task, fault: str, expected: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`dione train` run by this process (its workers' environment: FAULT), whose kept
    spawner forks the ranks: a process of its own would pay torch's imports twice more
    (its own, its spawner's), some 9 s of CPU a run; what only a process of its own
    shows (Ctrl-C, a killed launcher) the tests below show."""
    workload, run_dir = run_with_good_task
    before = snapshot(run_dir, "good")
    # Only the hang needs a time limit; on the others it could cut a cold start short on a
    # loaded machine and name the wrong cause. A hang ends at the limit however late its
    # gang started, so a short one names the same cause.
    limit = ["--timeout", "8"] if fault == "hang" else []
    train = ["train", str(workload), "--task", "faulty", "--technique", "ddp", "--devices",
             "2", "--out", str(run_dir)]
    status, out, err = in_process(capsys, *train, *limit, env={"FAULT": fault})
    assert status == 1, out + err
    assert expected in err
    assert "task 'faulty', steps 0-6, ddp" in err
    if fault == "raise":  # the traceback of the rank that failed, not of its peer
        assert 'raise ValueError("injected failure on rank 1")' in err
    assert worker_processes() == []
    assert snapshot(run_dir, "good") == before
    with RunStore(run_dir) as store:
        (failed,) = store.slices("faulty")
        assert failed.status == "failed" and expected in failed.error
        assert store.checkpoints("faulty") == [] and store.task("faulty").status == "pending"
    if fault == "hang":  # where it hung, in the log the error names (it was empty: review)
        from dione.state.slice_logs import log_folder

        hung = (log_folder(run_dir, failed.id, "faulty") / "rank1.log").read_text()
        assert "(most recent call first)" in hung and " in loss\n" in hung, hung
        assert "each running rank's stack at the stop is there" in err
    # The fault gone, the same task trains in the same run dir.
    status, out, err = in_process(capsys, *train)
    assert status == 0, err


def test_ctrl_c_stops_the_gang_and_keeps_the_run(run_with_good_task, tmp_path: Path
                                                 ) -> None:
    workload, run_dir = run_with_good_task
    hanging = tmp_path / "hanging"
    process = subprocess.Popen(
        [sys.executable, "-m", "dione.cli", "train", str(workload), "--task", "faulty",
         "--technique", "ddp", "--devices", "2", "--out", str(run_dir)],
        env={**os.environ, "FAULT": "hang", "HANG_MARKER": str(hanging)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 120
        while not hanging.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until rank 1 hangs in the training loop
        assert hanging.exists(), "rank 1 never reached its hang"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()  # its workers die with it: nothing outlives a failed test
        process.wait()
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr
    assert worker_processes() == []
    with RunStore(run_dir) as store:
        assert [s.status for s in store.slices("faulty")] == ["interrupted"]
        assert store.latest_checkpoint("good").step == 3


def test_launcher_killed_takes_its_workers_along(run_with_good_task, tmp_path: Path) -> None:
    """Even SIGKILL of the launcher (no chance to clean up) leaves no worker running, nor
    a helper process a worker forked."""
    workload, run_dir = run_with_good_task
    helper_file = tmp_path / "helper.pid"
    process = subprocess.Popen(
        [sys.executable, "-m", "dione.cli", "train", str(workload), "--task", "faulty",
         "--technique", "ddp", "--devices", "2", "--out", str(run_dir)],
        env={**os.environ, "FAULT": "hang-forked", "HELPER_PID_FILE": str(helper_file)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while (len(worker_processes()) < 3 or not helper_file.is_file()) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    helper = Path(f"/proc/{helper_file.read_text()}")
    # Two ranks, and rank 1's helper (a child of a worker counts as one).
    assert len(worker_processes()) == 3 and int(helper.name) in worker_processes()
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    while (worker_processes() or _alive(helper)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker_processes() == []
    assert not _alive(helper)
    with RunStore(run_dir) as store:  # the next user of the run dir sees what happened
        assert store.recover_interrupted() == [store.slices("faulty")[0].id]
        assert store.slices("faulty")[0].status == "interrupted"


def _alive(process: Path) -> bool:
    """Whether /proc/PID is a process not yet ended (a zombie has ended)."""
    try:
        return (process / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_dead_ranks_log_tail_leaves_out_the_warnings_libraries_printed(
        tmp_path: Path) -> None:
    """What a killed rank printed last is quoted, not torch's deprecation notes."""
    from dione.launch.gang import _log_tail

    log = tmp_path / "rank1.log"
    log.write_text(
        "step 3 loss 2.1\n"
        "/venv/lib/python3.11/site-packages/torch/distributed/c10d.py:410: UserWarning: "
        "barrier is deprecated\n"
        "  warnings.warn(\n"
        "allocating 40 GB for the cache\n"
        "/venv/torch/utils/checkpoint.py:87: FutureWarning: use_reentrant will change\n"
        "  return fn(*args)\n")
    assert _log_tail(log) == "step 3 loss 2.1\nallocating 40 GB for the cache"
    assert _log_tail(log, lines=1) == "allocating 40 GB for the cache"
    assert _log_tail(tmp_path / "absent.log") == ""
    # A warning of frozen code quotes no source line; an error quoting a warning is kept.
    kept = ("<frozen importlib._bootstrap>:241: DeprecationWarning: old\n"
            '  File "w.py", line 3, in <module>\n'
            "RuntimeError: w.py:3: UserWarning: turned into an error")
    log.write_text(kept + "\n")
    assert _log_tail(log) == kept
