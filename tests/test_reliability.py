"""Faults and hostile input: a diverging task, a corrupt checkpoint, a second launcher, a
planted pickle, a stranger at the gang's door, and bad input caught before anything runs."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
import torch

from dione.cli import main as dione_main
from dione.launch.gang import Lost, Placement, describe_failure
from dione.launch.pool import WarmWorker, local_pool
from dione.launch.scratch import clean_stale_scratch, scratch_dir
from dione.launch.slice import SliceError, local_placement, run_slice
from dione.profile import Catalog, TrialOptions, profile_workload
from dione.spec.cluster import Cluster
from dione.spec.workload import load_workload
from dione.state import RunStore
from dione.techniques import get_technique
from dione.techniques.base import SliceSpec
from helpers import TEST_NODE, digits_task, dione, interruptible, worker_processes

# A model that counts its forward passes in a buffer (so the count survives checkpoints)
# and makes the loss NaN or +inf from the 7th on: trials (3 steps) pass, the run's
# second slice (steps 4-8) diverges at step 7.
DIVERGING = '''
import functools, math
import torch
from torch import nn
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

class Diverging(nn.Module):
    """An MLP whose output turns to ``bad`` (nan or inf) from its seventh call on."""

    def __init__(self, bad):
        super().__init__()
        self.bad = bad
        self.net = digits_mlp(hidden=16, depth=1)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        out = self.net(x)
        if int(self.calls) < 7:
            return out
        if self.bad == "nan":
            return out * math.nan
        # Only class 0 possible: the cross-entropy of every other target is +inf.
        impossible = torch.full_like(out, -math.inf)
        impossible[:, 0] = 0.0
        return out * 0 + impossible

def task(name, model):
    return Task(name=name, model=model, data=digits_train,
                loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16,
                steps=12, techniques=("single",))

workload = Workload([task("good", functools.partial(digits_mlp, hidden=16, depth=1)),
                     task("diverging-nan", functools.partial(Diverging, "nan")),
                     task("diverging-inf", functools.partial(Diverging, "inf"))])
'''

# Rank 1 sleeps in its third step: a gang that stays up long enough to look at.
HANGING = '''
import functools, time
import torch
import torch.distributed as dist
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

calls = 0

def loss(output, target):
    global calls
    calls += 1
    if dist.get_rank() == 1 and calls == 3:
        time.sleep(120)
    return torch.nn.functional.cross_entropy(output, target)

workload = Workload([Task(name="hang", model=functools.partial(digits_mlp, hidden=16, depth=1),
                          data=digits_train, loss=loss,
                          optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
                          batch_size=16, steps=6)])
'''


# -- a rank's error report --------------------------------------------------------------


def test_a_half_written_reply_is_no_report(tmp_path: Path) -> None:
    """A reply cut off by its worker's death (or garbled) must not become a second
    failure: the rank counts as lost, and the slice fails with what is known."""
    ours, theirs = socket.socketpair()
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    worker = WarmWorker(("cpu", 1), process, Connection(ours.detach()), tmp_path / "log")
    try:
        theirs.sendall(struct.pack("!i", 4000) + b"half a pickle")  # then the sender died
        theirs.close()
        assert worker.reply() == ("lost", None)
    finally:
        local_pool().end([worker])
    (tmp_path / "rank1.log").write_text("Traceback ...\nValueError: boom\n")
    spec = SliceSpec(digits_task(), get_technique("ddp"), {}, "cpu", (0, 1), 0, 4, None,
                     str(tmp_path))
    error = describe_failure(tmp_path, {}, {1: Lost("exit", "exited with status 1")}, spec,
                             Placement("n", "cpu", (0, 1), 1))
    assert error.rank == 1 and error.reason == "exit"
    assert "exited with status 1" in str(error) and "ValueError: boom" in str(error)
    # gloo aborting on ranks that ran different collectives (fsdp, a parameter only some
    # batches use: review) is said as such, not only as a signal.
    (tmp_path / "rank0.log").write_text(
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  "
        "[enforce fail at gloo/transport/tcp/pair.cc:510] op.preamble.length <= "
        "op.nbytes. 580 vs 308. Is there a distributed collective mismatch?\n")
    error = describe_failure(tmp_path, {}, {0: Lost("signal", "was killed by SIGABRT")},
                             spec, Placement("n", "cpu", (0, 1), 1))
    assert "Its ranks ran different collectives: a layer or parameter used by some batches " \
        "and not others (a branch on the data) desynchronises ddp" in str(error), str(error)


# -- diverging tasks --------------------------------------------------------------------


NAN_LOSS = """
import functools, os, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

def loss(output, target):  # not finite while the file beside this one says so
    value = torch.nn.functional.cross_entropy(output, target)
    if os.path.exists(os.path.join(os.path.dirname(__file__), "broken-loss")):
        return value * float("nan")
    return value

def task(name, loss, lr=1e-2):
    return Task(name=name, model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=digits_train, loss=loss, batch_size=16, steps=6, techniques=("single",),
                optimizer=functools.partial(torch.optim.Adam, lr=lr))

# "wild" shares its trials with "fine" (one group): its trial diverges, fine's fits.
workload = Workload([task("wild", torch.nn.functional.cross_entropy, lr=1e30),
                     task("fine", torch.nn.functional.cross_entropy), task("nan", loss)])
"""


def test_a_task_that_diverged_in_its_profiling_trial_is_profiled_again_on_resume(
        tmp_path: Path) -> None:
    """It trained no step: fixed (its loss, not a setting the run records) and resumed,
    it was profiled again, its trial passed, and it stayed diverged (review). Now that
    trial judges it: it trains; unfixed, it diverges again as before."""
    (tmp_path / "broken-loss").touch()
    workload = tmp_path / "nan.py"
    workload.write_text(NAN_LOSS)
    common = ["--devices", "cpu:2", "--catalog", str(tmp_path / "catalog.sqlite"),
              "--warmup-steps", "1", "--measure-steps", "2"]
    assert dione_main(["run", str(workload), "--out", str(tmp_path / "run"), *common]) == 1
    ended = {"wild": "diverged", "fine": "done", "nan": "diverged"}
    with RunStore(tmp_path / "run") as store:
        assert {t.name: t.status for t in store.tasks()} == ended
        assert store.slices("nan") == [] == store.slices("wild")
        said = store.task("nan").error or ""
    assert said.startswith("diverged in its profiling trial"), said
    # Its advice once: resume it fixed (the slice's "a resume leaves a diverged task as
    # it is" read beside it, one sentence saying both: a review).
    assert "then resume" in said and "a resume leaves a diverged task" not in said, said
    assert dione_main(["resume", str(tmp_path / "run")]) == 1  # unfixed: as before
    with RunStore(tmp_path / "run") as store:
        assert {t.name: t.status for t in store.tasks()} == ended
        # Its group-mate's trial (from the catalog) says nothing of its own rate: not
        # trained to diverge (a regression review found it trained so, then kept
        # diverged for good).
        assert store.slices("nan") == [] == store.slices("wild")
    (tmp_path / "broken-loss").unlink()
    assert dione_main(["resume", str(tmp_path / "run")]) == 1  # wild still diverged
    with RunStore(tmp_path / "run") as store:
        assert {t.name: t.status for t in store.tasks()} == {**ended, "nan": "done"}
        assert [s.start_step for s in store.slices("nan")][:1] == [0]


BAD_DATA = """
import functools, os, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

class Broken(torch.utils.data.Dataset):
    # A corrupt shard: its items fail where training reads them (validation, here in the
    # launcher, reads them well), as a file on a disk of the workers' would.
    def __init__(self):
        self.inner = digits_train()
    def __len__(self):
        return len(self.inner)
    def __getitem__(self, index):
        if "DIONE_LAUNCHER_PID" in os.environ:
            raise OSError(f"bad data at item {index}")
        return self.inner[index]

def task(name, data):
    return Task(name=name, model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=data, loss=torch.nn.functional.cross_entropy, batch_size=16, steps=4,
                techniques=("single",), optimizer=functools.partial(torch.optim.Adam, lr=1e-2))

# One group: the same model, loss, optimizer and samples; the bad one listed first.
workload = Workload([task("bad", Broken), task("good-a", digits_train),
                     task("good-b", digits_train)])
"""


def test_a_task_whose_data_fails_its_groups_trial_fails_alone(tmp_path: Path) -> None:
    """Its group's trials ran as it, first of the group, crashed on its data, and every
    task of the group ended "no configuration fits" with its error, which named no task
    (a review). A crash runs once again as the next task of the group: the others
    train, and it fails in its own slices with its own error."""
    workload = tmp_path / "bad_data.py"
    workload.write_text(BAD_DATA)
    assert dione_main(["run", str(workload), "--out", str(tmp_path / "run"), "--devices",
                       "cpu:1", "--catalog", str(tmp_path / "catalog.sqlite"),
                       "--warmup-steps", "1", "--measure-steps", "2"]) == 1
    with RunStore(tmp_path / "run") as store:
        assert {t.name: t.status for t in store.tasks()} == {
            "bad": "failed", "good-a": "done", "good-b": "done"}
        said = store.task("bad").error or ""
    assert "OSError: bad data at item" in said and "no configuration fits" not in said, said


def test_diverging_tasks_end_diverged_and_the_others_go_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dione run` and `resume` in the test's process (no interpreter and spawner of
    their own: some 9 s of CPU each)."""
    workload = tmp_path / "diverging.py"
    workload.write_text(DIVERGING)
    run_dir = tmp_path / "run"
    common = ["--devices", "cpu:2", "--catalog", str(tmp_path / "catalog.sqlite")]
    capsys.readouterr()
    status = dione_main(["run", str(workload), "--out", str(run_dir), "--slice-steps", "4",
                         "--warmup-steps", "1", "--measure-steps", "2", "--solver", "greedy",
                         *common])
    ran = capsys.readouterr()
    assert status == 1, ran.out + ran.err
    diverging = {"diverging-nan": math.isnan, "diverging-inf": math.isinf}
    with RunStore(run_dir) as store:
        good = store.task("good")
        assert good is not None and good.status == "done"
        for name, bad in diverging.items():
            assert f"task {name} diverged" in ran.err
            record = store.task(name)
            assert record is not None and record.status == "diverged", name
            assert "at step 7" in (record.error or "")
            assert "last finite checkpoint is step 4" in (record.error or "")
            # How to train it again (a resume leaves it; the message said only "again").
            assert "under a new task name (`dione add RUN_DIR WORKLOAD` for a run) or in a " \
                "new run directory: a resume leaves a diverged task as it is" in \
                " ".join((record.error or "").split())
            latest = store.latest_checkpoint(name)
            assert latest is not None and latest.step == 4  # the last finite one, kept
            losses = dict(store.losses(name))
            assert all(math.isfinite(losses[s]) for s in range(1, 7))
            assert bad(losses[7]), (name, losses[7])
            assert 8 not in losses  # nothing recorded past the divergence
            assert [s.status for s in store.slices(name)] == ["done", "diverged"]
            assert not (run_dir / "checkpoints" / name / "step-00000008").exists()
    # Resuming does not crash, and does not train the diverged tasks again.
    status = dione_main(["resume", str(run_dir)])
    resumed = capsys.readouterr()
    assert status == 1, resumed.out + resumed.err
    assert "Traceback" not in resumed.err
    summary = (run_dir / "report" / "summary.md").read_text()
    with RunStore(run_dir) as store:
        for name in diverging:
            assert [s.status for s in store.slices(name)] == ["done", "diverged"]
            assert f"| {name} | diverged |" in summary
    assert "(diverged)" in summary
    status = dione("status", str(run_dir))
    assert status.returncode == 0 and "diverged" in status.stdout


def test_a_trial_that_diverges_is_recorded_so_and_not_kept(tmp_path: Path) -> None:
    task = digits_task("nan-loss", loss=lambda output, target: output.sum() * math.nan,
                       techniques=("single",))
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        profile = profile_workload([task], Cluster([TEST_NODE]), catalog,
                                   options=TrialOptions(warmup_steps=1, measure_steps=2))
        assert [r.status for r in profile.task("nan-loss").trials] == ["diverged"]
        assert not profile.task("nan-loss").options
        # It depends on the learning rate, which the catalog's key leaves out.
        assert catalog.records() == []


# -- the gang's rendezvous --------------------------------------------------------------


def _listening(pid: int) -> list[str]:
    """The local addresses (hex, as /proc/net shows them) on which ``pid`` listens."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1].split(":")[0])
    return found


_LOOPBACK = ("0100007F", "00000000000000000000000001000000")  # 127.0.0.1, ::1


def test_a_local_gang_listens_on_loopback_only_and_rendezvouses_in_private(
        tmp_path: Path) -> None:
    workload = tmp_path / "hanging.py"
    workload.write_text(HANGING)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dione.cli", "train", str(workload), "--task", "hang",
         "--technique", "ddp", "--devices", "2", "--out", str(tmp_path / "run")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=interruptible)
    try:
        # Wait until both ranks listen (gloo's pairs: the process group is up).
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while time.monotonic() < deadline:
            workers = worker_processes()
            if len(workers) == 2 and all(_listening(pid) for pid in workers):
                break
            time.sleep(0.2)
        assert len(workers) == 2 and all(_listening(pid) for pid in workers)
        addresses = [a for pid in [launcher.pid, *workers] for a in _listening(pid)]
        assert all(a in _LOOPBACK for a in addresses), addresses
        # The rendezvous: the gang's FileStore, in its launcher's private scratch folder.
        [folder] = Path(tempfile.gettempdir()).glob(f"dione-gang-{launcher.pid}-*")
        assert (folder / "store").is_file()
        assert (folder.stat().st_mode & 0o777) == 0o700
        assert folder.stat().st_uid == os.getuid()
        assert not str(folder).startswith(str(tmp_path))  # not in the run directory
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(60)


# -- one launcher per run directory -----------------------------------------------------


def test_a_second_launcher_is_refused_and_status_tells_a_dead_run(tmp_path: Path) -> None:
    workload = tmp_path / "hanging.py"
    workload.write_text(HANGING)
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "dione.cli", "train", str(workload), "--task", "hang",
         "--technique", "ddp", "--devices", "2", "--out", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not list(run_dir.glob("logs/slice-*")):
            time.sleep(0.2)
        live = dione("status", str(run_dir))
        assert f"live: launcher pid {first.pid}" in live.stdout, live.stdout
        for second in (["run", str(workload), "--devices", "cpu:2"],
                       ["train", str(workload), "--task", "hang", "--technique", "single"]):
            refused = dione(*second, "--out", str(run_dir))
            assert refused.returncode == 2, refused.stdout + refused.stderr
            assert f"in use by another dione launcher (pid {first.pid}" in refused.stderr
        first.kill()  # as the OOM killer would: no chance to clean up
        first.wait(30)
        deadline = time.monotonic() + 30
        while worker_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        dead = dione("status", str(run_dir))
        assert dead.returncode == 0
        assert f"dead: its launcher (pid {first.pid}" in dead.stdout, dead.stdout
        assert not re.search(r"steps \d+-\d+ for \d+ s", dead.stdout)  # not "running"
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)


def _no_such_file() -> object:
    raise FileNotFoundError("/data/typo.csv")


def test_a_task_whose_data_cannot_be_read_fails_alone(tmp_path: Path) -> None:
    """Its length in epochs needs its data set: the factory's error fails that task's
    slice, and the next task still trains."""
    from dataclasses import replace

    from dione.orchestrate.sequential import run_sequential

    bad = replace(digits_task("bad"), data=_no_such_file, steps=None, epochs=1.0)
    bad_outcome, good_outcome = run_sequential([bad, digits_task("good", steps=4)],
                                               Cluster([TEST_NODE]), tmp_path,
                                               technique="single")
    assert bad_outcome.error is not None
    assert "FileNotFoundError: /data/typo.csv" in bad_outcome.error
    assert good_outcome.error is None and good_outcome.slices[-1].end_step == 4
    with RunStore(tmp_path) as store:
        assert store.task("good").status == "done"  # type: ignore[union-attr]


# -- checkpoints you can trust ----------------------------------------------------------


def _damage(folder: Path, how: str) -> str:
    """Damage one model shard of a checkpoint (or, ``torn``, empty its progress file, as a
    power cut before the disk had it can); the file's name."""
    if how == "torn":
        (folder / "progress.json").write_text("")
        return "progress.json"
    shard = sorted(folder.glob("*.distcp"))[0]
    if how == "unverified":  # flipped bytes, and the digests that would see them deleted
        _damage(folder, "flip")
        (folder / "digests.json").unlink()
        return "digests.json"
    data = shard.read_bytes()
    if how == "flip":  # same size, other bytes: only a digest sees it
        middle = len(data) // 2
        shard.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64])
                          + data[middle + 64:])
    elif how == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    else:
        shard.unlink()
    return shard.name


@pytest.fixture(scope="module")
def resumed_from_step_4(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """Losses of steps 5-12 of a task resumed from its step-4 checkpoint, undamaged."""
    run_dir = tmp_path_factory.mktemp("reference")
    placement = local_placement(TEST_NODE, [0])
    run_slice(digits_task(), "single", run_dir, placement, steps=4)
    return run_slice(digits_task(), "single", run_dir, placement).losses


@pytest.mark.parametrize("how", ["flip", "truncate", "delete", "torn", "unverified"])
def test_a_damaged_checkpoint_is_quarantined_and_the_previous_one_used(
        tmp_path: Path, how: str, resumed_from_step_4: list[float]) -> None:
    placement = local_placement(TEST_NODE, [0])
    for _ in range(2):
        run_slice(digits_task(), "single", tmp_path, placement, steps=4)
    step_8 = tmp_path / "checkpoints" / "digits" / "step-00000008"
    name = _damage(step_8, how)
    result = run_slice(digits_task(), "single", tmp_path, placement)
    assert result.start_step == 4 and result.end_step == 12
    assert result.losses == resumed_from_step_4  # as if it had resumed from step 4
    [warning] = result.warnings
    assert f"file {name}" in warning and str(step_8) in warning and "from step 4" in warning
    assert step_8.with_name("step-00000008.corrupt").is_dir()


def test_checkpoints_the_store_never_recorded_never_prune_the_one_it_did(
        tmp_path: Path) -> None:
    """Gangs killed before their slices were recorded left later steps on disk; the
    step the store just recorded is what the task resumes from, and must stay."""
    placement = local_placement(TEST_NODE, [0])
    run_slice(digits_task(), "single", tmp_path, placement, steps=4)
    folder = tmp_path / "checkpoints" / "digits"
    for step in (10, 11):  # complete folders, as a killed gang's save leaves them
        shutil.copytree(folder / "step-00000004", folder / f"step-{step:08d}")
    run_slice(digits_task(), "single", tmp_path, placement, steps=2, keep_checkpoints=1)
    with RunStore(tmp_path) as store:
        latest = store.latest_checkpoint("digits")
        assert latest is not None and latest.step == 6
    assert run_slice(digits_task(), "single", tmp_path, placement, steps=2).start_step == 6


def test_a_planted_pickle_in_a_checkpoint_is_not_run(tmp_path: Path) -> None:
    """Even with its digests forged to match (the file's, and progress.json's digest of
    digests.json), an RNG file that would run code on unpickling is refused: it loads
    with weights_only."""
    placement = local_placement(TEST_NODE, [0])
    run_slice(digits_task(), "single", tmp_path, placement, steps=4)
    folder = tmp_path / "checkpoints" / "digits" / "step-00000004"
    marker = tmp_path / "pwned"

    class Planted:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    torch.save({"torch": Planted()}, folder / "rng" / "rank0.pt")
    import hashlib
    digests = json.loads((folder / "digests.json").read_text())
    digests["rng/rank0.pt"] = hashlib.sha256((folder / "rng" / "rank0.pt").read_bytes()
                                             ).hexdigest()
    (folder / "digests.json").write_text(json.dumps(digests))
    progress = json.loads((folder / "progress.json").read_text())  # and its digest too
    progress["digests"] = hashlib.sha256((folder / "digests.json").read_bytes()).hexdigest()
    (folder / "progress.json").write_text(json.dumps(progress))
    with pytest.raises(SliceError, match="cannot be loaded safely"):
        run_slice(digits_task(), "single", tmp_path, placement, steps=2)
    assert not marker.exists()


def test_nothing_a_worker_unpickles_or_imports_lies_in_the_run_directory(
        tmp_path: Path) -> None:
    run_slice(digits_task(), "ddp", tmp_path, local_placement(TEST_NODE, [0, 1]), steps=2)
    [folder] = (tmp_path / "logs").iterdir()
    names = sorted(p.name for p in folder.iterdir())
    assert not [n for n in names if n.endswith((".pkl", ".json")) and "progress" not in n], names
    assert (tmp_path.stat().st_mode & 0o077) == 0  # created private


def test_a_run_directory_others_can_write_is_refused(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "diverging.py"
    workload.write_text(DIVERGING)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    code = dione_main(["train", str(workload), "--task", "good", "--technique", "single",
                       "--out", str(shared)])
    assert code == 2
    assert "writable by others (mode 777)" in capsys.readouterr().err
    assert list(shared.iterdir()) == []  # nothing was written into it


# -- bad input, caught up front ---------------------------------------------------------

BAD_OPTIMIZERS = '''
import functools, math
import torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

def task(name, optimizer, **extra):
    fields = dict(steps=4)
    fields.update(extra)
    return Task(name=name, model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=digits_train, loss=torch.nn.functional.cross_entropy,
                optimizer=optimizer, batch_size=16, **fields)

workload = Workload([
    task("nan-lr", functools.partial(torch.optim.SGD, lr=float("nan"))),
    task("zero-lr", functools.partial(torch.optim.SGD, lr=0.0)),
    task("inf-momentum", functools.partial(torch.optim.SGD, lr=0.1, momentum=math.inf)),
    task("inf-epochs", functools.partial(torch.optim.Adam, lr=1e-3), steps=None,
         epochs=float("inf")),
    task("fine", functools.partial(torch.optim.Adam, lr=1e-3)),
])
'''


def test_bad_hyperparameters_and_lengths_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "bad.py"
    workload.write_text(BAD_OPTIMIZERS)
    assert dione_main(["validate", str(workload)]) == 2
    err = capsys.readouterr().err
    assert "the workload has 4 problem(s)" in err
    assert "task 'nan-lr', field 'optimizer': lr=nan is not a finite number" in err
    assert "task 'zero-lr', field 'optimizer': lr=0.0 must be positive" in err
    assert "task 'inf-momentum', field 'optimizer': momentum=inf is not a finite number" in err
    assert "task 'inf-epochs', field 'epochs': must be a positive, finite number, not inf" in err
    assert "'fine'" not in err


def test_a_failed_start_leaves_run_json_alone_and_bad_run_dirs_say_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = run_dir / "run.json"
    saved.write_text('{"workload": "/somewhere/work.py", "devices": "cpu:2"}\n')
    before = saved.read_bytes()
    workload = tmp_path / "bad.py"
    workload.write_text(BAD_OPTIMIZERS)
    assert dione_main(["run", str(tmp_path / "missing.py"), "--out", str(run_dir)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert dione_main(["run", str(workload), "--devices", "cpu:999", "--out",
                       str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "999 CPU slots is more than this machine runs" in err and "per core" in err
    assert saved.read_bytes() == before
    saved.write_text('{"workload": ')  # damaged
    assert dione_main(["resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "run.json is unreadable or damaged" in err and "Traceback" not in err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for unusable in (blocker / "run", Path("/proc/dione-run")):
        assert dione_main(["train", str(workload), "--task", "fine", "--technique", "single",
                           "--out", str(unusable)]) == 2
        err = capsys.readouterr().err
        assert f"cannot use run directory {unusable}" in err and "Traceback" not in err


def test_a_crash_cached_in_the_catalog_is_tried_again_once_the_code_is_fixed(
        tmp_path: Path) -> None:
    source = '''
import functools, torch
from dione import Task, Workload
from dione.zoo import digits_train

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)

    def forward(self, x):
        BODY

workload = Workload([Task(name="net", model=Net, data=digits_train,
                          loss=torch.nn.functional.cross_entropy,
                          optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
                          batch_size=16, steps=4, techniques=("single",))])
'''
    file = tmp_path / "net.py"
    options = TrialOptions(warmup_steps=1, measure_steps=1)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        file.write_text(source.replace("BODY", 'raise ValueError("a bug in forward")'))
        broken = profile_workload(list(load_workload(file)), Cluster([TEST_NODE]), catalog,
                                  options=options)
        assert [r.status for r in broken.task("net").trials] == ["crash"]
        reason = broken.task("net").why_no_option()
        assert "no configuration fits" in reason and "a bug in forward" in reason
        # Where in the user's code (its traceback was only in the catalog), and no
        # technique the task never allowed beside it (a review).
        assert f"ValueError: a bug in forward (at {file}:" in reason, reason
        assert "allows only single" not in reason, reason
        again = profile_workload(list(load_workload(file)), Cluster([TEST_NODE]), catalog,
                                 options=options)
        assert again.trials_run == 0  # the same code: the cached crash stands
        file.write_text(source.replace("BODY", "return self.layer(x)"))
        fixed = profile_workload(list(load_workload(file)), Cluster([TEST_NODE]), catalog,
                                 options=options)
        assert fixed.trials_run == 1 and fixed.task("net").options


def test_errors_no_retry_can_fix_are_not_retried() -> None:
    assert SliceError("rank 0 raised OSError: [Errno 30] Read-only file system: '/x'",
                      "raised", "OSError").retryable is False
    assert SliceError("rank 1 raised CheckpointException: ... No space left on device",
                      "raised", "CheckpointException").retryable is False
    assert SliceError("rank 0 raised PermissionError: [Errno 13] Permission denied",
                      "raised", "PermissionError").retryable is False
    assert SliceError("diverged", "diverged").retryable is False
    assert SliceError("rank 1 was killed by SIGKILL", "signal").retryable is True


def test_scratch_folders_of_dead_launchers_are_cleaned(tmp_path: Path) -> None:
    """Dione's scratch folders of a dead launcher go; a live launcher's stay, and so does
    a folder of the user's that only looks like one (no marker): `dione-sweep-2024-final`
    with a results file was removed by every `dione profile`."""
    from dione.launch.scratch import MARKER

    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tmp_path / f"dione-trials-{gone.pid}-abc"
    stale.mkdir()
    (stale / MARKER).write_text("x")
    (stale / "leftover").write_text("x")
    live = tmp_path / f"dione-gang-{os.getpid()}-def"
    live.mkdir()
    (live / MARKER).write_text("x")
    users = tmp_path / "dione-sweep-2024-final"
    users.mkdir()
    (users / "results.csv").write_text("lr,loss\n")
    unmarked = tmp_path / f"dione-trials-{gone.pid}-xyz"
    unmarked.mkdir()
    assert clean_stale_scratch(tmp_path) == [stale]
    assert not stale.exists() and live.exists()
    assert (users / "results.csv").is_file() and unmarked.is_dir()
    mine = scratch_dir("gang")
    try:
        assert (mine.stat().st_mode & 0o777) == 0o700 and f"-{os.getpid()}-" in mine.name
        assert (mine / MARKER).is_file()
    finally:
        shutil.rmtree(mine)


def test_runs_sharing_a_storage_keep_their_own_checkpoints(tmp_path: Path) -> None:
    """Two runs of one grid (same task names, other seeds) with one --storage: each
    writes its checkpoints to a folder of its own, so the second never overwrites or
    prunes the first's (it did both, and the first's export was the second's weights)."""
    from dione.state.export import load_trained

    storage = tmp_path / "shared"
    placement = local_placement(TEST_NODE, [0])
    first, second = tmp_path / "first", tmp_path / "second"
    a = run_slice(digits_task(seed=1), "single", first, placement, storage=storage)
    for _ in range(3):  # pruning keeps 2 of the second run's: never touches the first's
        b = run_slice(digits_task(seed=2, steps=36), "single", second, placement, steps=12,
                      storage=storage, keep_checkpoints=1)
    assert Path(a.checkpoint).is_dir() and Path(b.checkpoint).is_dir()
    assert Path(a.checkpoint).parent != Path(b.checkpoint).parent
    assert Path(a.checkpoint).is_relative_to(storage)
    with RunStore(first) as store:
        assert store.latest_checkpoint("digits").path == a.checkpoint
    ours = load_trained(digits_task(seed=1), a.checkpoint).state_dict()
    theirs = load_trained(digits_task(seed=2), b.checkpoint).state_dict()
    assert any(not torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_full_checkpoint_disk_stops_the_run_naming_its_free_space(tmp_path: Path) -> None:
    """A real full disk (a tmpfs of 8 MiB, filled, under --storage): the run stops at the first
    checkpoint that cannot be written, in one sentence naming the folder and its free
    space, every task kept at its last checkpoint; it goes on once space is freed. (It
    failed every task in turn, each after a slice of training, with
    "CheckpointException ranks:dict_keys([0])".)"""
    from dione.orchestrate import RunOptions, run_workload
    from dione.state.disk import DiskFull

    storage = tmp_path / "storage"
    storage.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(storage)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (root only): a real full disk is the test")
    try:
        tasks = [digits_task(f"t{i}", steps=6, techniques=("single",)) for i in range(3)]
        options = RunOptions(catalog=str(tmp_path / "catalog.sqlite"), slice_steps=3,
                             trial=TrialOptions(warmup_steps=1, measure_steps=2, timeout=120),
                             storage=str(storage), time_limit=2.0)
        with Catalog(tmp_path / "catalog.sqlite") as catalog:  # trials first, on a free disk
            profile_workload(tasks, Cluster([TEST_NODE]), catalog, options=options.trial)
        free = shutil.disk_usage(storage).free
        (storage / "filler").write_bytes(b"\0" * (free - 4096))
        # Profiling there stops too, and caches no trial as crashed (it cached every
        # one, and no later profile tried them again).
        with Catalog(tmp_path / "fresh.sqlite") as catalog, pytest.raises(DiskFull) as full:
            profile_workload(tasks, Cluster([TEST_NODE]), catalog, options=options.trial,
                             storage=storage)
        assert f"({storage}: " in str(full.value)  # the folder given, not a trial's own
        with Catalog(tmp_path / "fresh.sqlite") as catalog:
            assert catalog.records() == []
        with pytest.raises(DiskFull) as stopped:
            run_workload(tasks, Cluster([TEST_NODE]), tmp_path / "run", options)
        said = str(stopped.value)
        assert "the disk under the checkpoints is full" in said and "KiB free" in said
        assert str(storage) in said and "dione resume" in said
        with RunStore(tmp_path / "run") as store:
            assert {t.status for t in store.tasks()} == {"pending"}
        (storage / "filler").unlink()
        result = run_workload(tasks, Cluster([TEST_NODE]), tmp_path / "run", options)
        assert [t.status for t in result.tasks] == ["done"] * 3
    finally:
        subprocess.run(["umount", "-l", str(storage)], capture_output=True)


def test_only_a_checkpoint_written_to_a_full_disk_stops_the_run() -> None:
    """A full /dev/shm under a data loader's workers says "No space left on device" too:
    that is the task's own failure, not a disk every task's checkpoints share (it
    stopped the whole run, and every resume again)."""
    shm = SliceError("rank 0 (device 0) raised RuntimeError: DataLoader worker (pid 7) "
                     "is killed\nOSError: [Errno 28] No space left on device", "raised")
    assert shm.disk_full is None and not shm.retryable  # as before: that task fails alone
    written = SliceError("rank 0 (device 0) raised CheckpointException: CheckpointException"
                         " ranks:dict_keys([0])\n  File \".../torch/distributed/checkpoint/"
                         "filesystem.py\", line 520\nOSError: [Errno 28] No space left on "
                         "device", "raised")
    assert written.disk_full == "OSError: [Errno 28] No space left on device"


EDITED = """
import functools, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

def loss(output, target):
    return torch.nn.functional.cross_entropy(output, target) * SCALE

SCALE = 1.0
workload = Workload([Task(name="t", model=functools.partial(digits_mlp, hidden=16, depth=1),
                          data=digits_train, loss=loss, batch_size=16, steps=4, seed=1,
                          optimizer=functools.partial(torch.optim.SGD, lr=0.1))])
"""


def test_a_run_trains_its_tasks_as_their_file_was_when_it_loaded_them(
        tmp_path: Path) -> None:
    """Workers read the workload file from disk at every slice: a user growing the
    sweep's file for `dione add` and saving it half-written failed the slices that
    started meanwhile, and an edit to a function changed the tasks already training
    (a loss scaled 1000 times, recorded exact). They now get the text loaded."""
    file = tmp_path / "edited.py"
    file.write_text(EDITED)
    (task,) = load_workload(file)
    reference = run_slice(task, "ddp", tmp_path / "a", local_placement(TEST_NODE, [0, 1]),
                          steps=2, timeout=300)
    file.write_text(EDITED.replace("SCALE = 1.0", "SCALE = 1000.0"))
    edited = run_slice(task, "ddp", tmp_path / "b", local_placement(TEST_NODE, [0, 1]),
                       steps=2, timeout=300)
    assert edited.losses == reference.losses
    file.write_text(EDITED + "\nthis is not python(\n")  # saved half-written
    again = run_slice(task, "single", tmp_path / "c", local_placement(TEST_NODE, [0]),
                      steps=2, timeout=300)
    assert again.losses == pytest.approx(reference.losses, rel=1e-5)
    # Loaded again, the file's new text is a module of its own: the old task keeps its.
    file.write_text(EDITED.replace("SCALE = 1.0", "SCALE = 1000.0"))
    (scaled,) = load_workload(file)
    assert scaled.loss.__module__ != task.loss.__module__
    grown = run_slice(scaled, "single", tmp_path / "d", local_placement(TEST_NODE, [0]),
                      steps=2, timeout=300)
    assert grown.losses[0] == pytest.approx(1000 * reference.losses[0], rel=1e-4)
    old = run_slice(task, "single", tmp_path / "e", local_placement(TEST_NODE, [0]),
                    steps=2, timeout=300)
    assert old.losses == again.losses


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_python_drops_still_ends_the_command_as_interrupted(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A SIGINT that comes while a weakref callback runs is raised there, where Python
    only prints "Exception ignored": the command went on and exited 0 (a review's Ctrl-C
    as `dione run` wrote its closing report). It ends as interrupted (130), saying the
    command ran to its end."""
    import weakref

    from dione import cli
    from dione.cli.errors import EXIT_INTERRUPTED

    went_on = []

    def dropping(args: object) -> int:
        class Held:
            pass

        held = Held()
        ref = weakref.ref(held, lambda _: signal.raise_signal(signal.SIGINT))
        del held  # the callback runs, and its KeyboardInterrupt is dropped
        went_on.append(ref() is None)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "validate", dropping)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in background
    assert cli.main(["validate", "workload.py"]) == EXIT_INTERRUPTED
    assert went_on == [True]
    said = " ".join(capsys.readouterr().err.split())
    assert "interrupted; it came where Python could not stop the command, which went on " \
        "to its end" in said
    assert signal.getsignal(signal.SIGINT) == before  # the caller's, back
