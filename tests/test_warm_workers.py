"""Warm workers: many slices through the same processes train exactly as fresh ones do,
hold their memory steady, see the launcher's environment as it is now, and a worker
lost between slices is replaced; workers forked by the spawner train exactly as new
interpreters do, which is what the pool falls back to without a spawner."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

from dione.launch import pool as pool_module
from dione.launch.pool import WarmWorker, WorkerPool, local_pool, shutdown_local_pool
from dione.launch.slice import local_placement, run_slice
from dione.launch.spawner import SpawnedProcess, Spawner
from dione.spec.workload import load_workload
from dione.state import load_model_weights
from helpers import TEST_NODE, char_task, digits_task, workload_text

# Three tasks, each always under its own exact technique, that take turns on the same
# two device slots (and so the same two workers).
# Five slices each (two steps a slice, fsdp one): enough for every code path to have
# run on each worker before its memory is watched, over the last nine (it was 50
# slices, then 21: the longest test of the suite, for no more paths).
PLAN = [
    (digits_task("digits-single", steps=10), "single", [0]),
    (digits_task("digits-ddp", steps=10, batch_size=32), "ddp", [0, 1]),
    (char_task("char-fsdp", steps=5, batch_size=8), "fsdp", [0, 1]),
]
SLICES = 15


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _weights(task: object, checkpoint: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = task.model()  # type: ignore[attr-defined]
    load_model_weights(checkpoint, model)
    return model.state_dict()


@pytest.mark.slow
def test_many_slices_through_warm_workers_match_fresh_processes(tmp_path: Path) -> None:
    warm, fresh = tmp_path / "warm", tmp_path / "fresh"
    losses: dict[str, list[float]] = {task.name: [] for task, _, _ in PLAN}
    checkpoints: dict[str, str] = {}
    rss: list[dict[int, int]] = []
    pool = local_pool()
    started = pool.started
    for index in range(SLICES):
        task, technique, devices = PLAN[index % len(PLAN)]
        steps = 2 if technique != "fsdp" else 1
        result = run_slice(task, technique, warm, local_placement(TEST_NODE, devices),
                           steps=steps)
        losses[task.name] += result.losses
        if result.checkpoint is not None:
            checkpoints[task.name] = result.checkpoint
        rss.append({w.process.pid: _rss_bytes(w.process.pid) for w in pool.idle()})
    assert pool.started - started == 2  # one worker per slot for every slice
    # Memory: after a few slices have warmed every code path, no worker keeps growing.
    settled = dict(rss[5])
    for after in rss[6:]:
        for pid, size in after.items():
            assert size <= settled[pid] + 48 * 2**20, (
                f"worker {pid} grew from {settled[pid] / 2**20:.0f} MiB to "
                f"{size / 2**20:.0f} MiB")
    # The same training, each task in one slice on fresh workers of its own.
    for task, technique, devices in PLAN:
        shutdown_local_pool()
        result = run_slice(task, technique, fresh, local_placement(TEST_NODE, devices))
        assert result.losses == losses[task.name], task.name  # bit for bit
        ours, theirs = _weights(task, checkpoints[task.name]), _weights(task, result.checkpoint)
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), task.name


def test_a_worker_killed_between_slices_is_replaced(tmp_path: Path) -> None:
    task = digits_task(steps=6)
    placement = local_placement(TEST_NODE, [0, 1])
    pool = local_pool()
    started = pool.started
    first = run_slice(task, "ddp", tmp_path, placement, steps=2)
    [victim, *_] = pool.idle()
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait()
    second = run_slice(task, "ddp", tmp_path, placement, steps=2)
    assert second.start_step == 2 and len(second.losses) == 2
    assert pool.started - started == 3  # the lost one's slot got a new one; the other stayed
    assert first.losses != second.losses


def test_forked_workers_train_as_new_interpreters_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = char_task("char", steps=3, batch_size=8)
    placement = local_placement(TEST_NODE, [0, 1])
    pool = local_pool()
    forked = run_slice(task, "fsdp", tmp_path / "forked", placement)
    assert all(isinstance(w.process, SpawnedProcess) for w in pool.idle())
    shutdown_local_pool(keep_spawner=True)

    def gone(threads: int) -> Spawner:
        """A spawner that died as it started (its process ran, its socket closed)."""
        ours, theirs = socket.socketpair()
        theirs.close()
        return Spawner(subprocess.Popen(["true"]), ours, threads)

    monkeypatch.setattr(pool, "_current_spawner", gone)
    plain = run_slice(task, "fsdp", tmp_path / "plain", placement)
    assert all(isinstance(w.process, subprocess.Popen) for w in pool.idle())
    assert plain.losses == forked.losses  # bit for bit
    ours, theirs = _weights(task, forked.checkpoint), _weights(task, plain.checkpoint)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_torchs_own_cache_folder_is_no_change_that_replaces_a_spawner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch writes TORCHINDUCTOR_CACHE_DIR into the environment the first time a
    process builds an optimizer: a spawner started before (a slice run straight from
    Python, before any task was validated) was replaced for it, its imports paid twice.
    Its default is no change; any other folder is."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from dione.launch.pool import _import_fingerprint

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    unset = _import_fingerprint()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(default_cache_dir()))
    assert _import_fingerprint() == unset
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    assert _import_fingerprint() != unset


def test_a_replaced_spawner_serves_its_busy_worker_to_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawner replaced (the environment changed) while one of its workers is busy
    keeps it alive, signals it when its gang ends it, reports how it ended, then exits."""
    pool = WorkerPool()
    try:
        [busy] = pool.take("cpu", [0], 1)
        [first] = pool.spawner_pids()
        monkeypatch.setenv("DIONE_TEST_SPAWNER", "changed")
        [other] = pool.take("cpu", [1], 1)
        assert isinstance(busy.process, SpawnedProcess)
        assert isinstance(other.process, SpawnedProcess)
        assert first in pool.spawner_pids() and len(pool.spawner_pids()) == 2
        assert busy.alive()
        busy.wait_ready(120)
        assert busy.ready
        pool.end([busy])  # SIGTERM to its group, through the replaced spawner
        assert busy.process.returncode == -signal.SIGTERM
        deadline = time.monotonic() + 30
        while first in pool.spawner_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first not in pool.spawner_pids()
        pool.give_back([other])
    finally:
        pool.shutdown()
    assert pool.spawner_pids() == []


def test_a_worker_that_dies_as_it_starts_is_reported(tmp_path: Path) -> None:
    """A forked worker that fails at once (its output file cannot be opened) is reported
    with its own exit status, however soon its end follows its start."""
    spawner = Spawner.start(0, dict(os.environ), tmp_path / "spawner.log")
    try:
        for _ in range(5):
            ours, theirs = socket.socketpair()
            worker = spawner.spawn(dict(os.environ), str(tmp_path / "missing" / "log"),
                                   theirs.fileno(), 120)
            theirs.close()
            assert worker is not None
            assert worker.wait(60) == 1 and worker.poll() == 1
            worker.signal_group(signal.SIGTERM)  # reported ended: nothing is signalled
            ours.close()
        assert spawner.idle()
    finally:
        spawner.close(5)
    assert spawner.process.returncode == 0
    assert "FileNotFoundError" in (tmp_path / "spawner.log").read_text()


def test_a_signal_for_an_ended_worker_never_reaches_the_next(tmp_path: Path) -> None:
    """The next worker forked may get an ended worker's pid; a signal sent for the ended
    one before its end was heard (it names the spawn, not the pid) must not reach it."""
    spawner = Spawner.start(0, dict(os.environ), tmp_path / "spawner.log")
    try:
        ours, theirs = socket.socketpair()
        ended = spawner.spawn(dict(os.environ), str(tmp_path / "missing" / "log"),
                              theirs.fileno(), 120)
        theirs.close()
        ours.close()
        assert ended is not None and ended.wait(60) == 1
        ours, theirs = socket.socketpair()
        live = spawner.spawn(dict(os.environ), str(tmp_path / "live.log"), theirs.fileno(), 120)
        theirs.close()
        assert live is not None and live.poll() is None
        # The ended worker as the launcher knew it before its end was reported, holding
        # the live worker's pid: what a pid reused between the two looks like.
        stale = SpawnedProcess(spawner, ended.number, live.pid, None)
        assert spawner.signal(stale, signal.SIGKILL)  # asked of the spawner
        live.signal_group(signal.SIGTERM)  # handled after the first, in order
        assert live.wait(60) == -signal.SIGTERM
        ours.close()
    finally:
        spawner.close(5)


# A task whose loss reads the environment at every step, as a workload's code may.
SCALED_BY_ENVIRONMENT = """
import functools, os
import torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train


def loss(output, target):
    scale = float(os.environ.get("LOSS_SCALE_OF_THIS_TEST", "1"))
    return scale * torch.nn.functional.cross_entropy(output, target)


workload = Workload([Task(name="scaled", model=functools.partial(digits_mlp, hidden=8, depth=1),
                          data=digits_train, loss=loss, optimizer=torch.optim.SGD,
                          batch_size=8, steps=6, seed=1)])
"""


def test_a_slice_sees_the_launchers_environment_as_it_is_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable set after the worker started reaches the next slice; one no import
    reads does not need a new spawner, only a new worker forked with it."""
    file = tmp_path / "scaled.py"
    file.write_text(SCALED_BY_ENVIRONMENT)
    [task] = load_workload(file)
    placement = local_placement(TEST_NODE, [0])
    monkeypatch.delenv("LOSS_SCALE_OF_THIS_TEST", raising=False)
    before = run_slice(task, "single", tmp_path, placement, steps=2)
    pool = local_pool()
    spawners, [first] = pool.spawner_pids(), pool.idle()
    monkeypatch.setenv("LOSS_SCALE_OF_THIS_TEST", "0")  # set after the worker started
    during = run_slice(task, "single", tmp_path, placement, steps=2)
    assert all(loss > 0 for loss in before.losses)
    assert during.losses == [0.0, 0.0]
    [worker] = pool.idle()
    assert isinstance(worker.process, SpawnedProcess) and worker is not first
    assert set(pool.spawner_pids()) <= set(spawners)  # no new one (a replaced one may end)
    # A spawner started while the variable was set: a worker it forks once the variable
    # is unset has none (it takes the launcher's environment, not the spawner's).
    monkeypatch.setenv("DIONE_TEST_SPAWNER", "scaled")  # read at import: a new spawner
    again = tmp_path / "again"  # the task has 6 steps: another run of them
    assert run_slice(task, "single", again, placement, steps=2).losses == [0.0, 0.0]
    spawners, earlier = pool.spawner_pids(), spawners
    assert set(spawners) - set(earlier)
    monkeypatch.delenv("LOSS_SCALE_OF_THIS_TEST")
    after = run_slice(task, "single", again, placement, steps=2)
    assert all(loss > 0 for loss in after.losses)
    assert set(pool.spawner_pids()) <= set(spawners)


# One task flips process-wide switches in its model factory; the other, run next on
# the same worker, refuses to build its model unless it sees a fresh worker's.
MEDDLING = """
import functools, inspect, os, signal, sys, warnings
import torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

IGNORE_ALL = ("ignore", None, Warning, None, 0)


def meddling_model():
    torch.backends.cudnn.conv.fp32_precision = "ieee"  # torch's newer switches, and older
    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    sys.path.append("/no/such/dione/test/folder")
    warnings.simplefilter("ignore")
    os.umask(0o000)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    return digits_mlp(hidden=8, depth=1)


def patching_model():
    # torch's code patched (every task the worker trained after took it: a review)
    linear = torch.nn.Linear.forward

    @functools.wraps(linear)
    def louder(self, x):
        return linear(self, x) * 1.5

    torch.nn.Linear.forward = louder
    torch.nn.functional.relu = lambda x, inplace=False: x
    torch.optim.SGD.step = lambda self, closure=None: None
    return digits_mlp(hidden=8, depth=1)


def checking_model():
    umask = os.umask(0o077)
    os.umask(umask)
    left = {"precision": torch.get_float32_matmul_precision() != "highest",
            "conv": torch.backends.cudnn.conv.fp32_precision != "tf32",
            "matmul": torch.backends.cuda.matmul.fp32_precision != "none",  # as when fresh
            "benchmark": torch.backends.cudnn.benchmark,
            "tf32": torch.backends.cuda.matmul.allow_tf32,
            "sys.path": "/no/such/dione/test/folder" in sys.path,
            "warnings": IGNORE_ALL in warnings.filters,
            "umask": umask == 0,
            "SIGUSR1": signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN,
            "Linear.forward": torch.nn.Linear.forward.__code__.co_name != "forward",
            "relu": torch.nn.functional.relu.__name__ != "relu",
            "SGD.step": "torch" not in inspect.unwrap(torch.optim.SGD.step).__code__.co_filename}
    if any(left.values()):
        raise RuntimeError("left by the slice before: "
                           + ", ".join(k for k, v in left.items() if v))
    return digits_mlp(hidden=8, depth=1)


def task(name, model):
    return Task(name=name, model=model, data=digits_train,
                loss=torch.nn.functional.cross_entropy, optimizer=torch.optim.SGD,
                batch_size=8, steps=2, seed=1)


workload = Workload([task("meddling", meddling_model), task("checking", checking_model),
                     task("patching", patching_model)])
"""


def test_a_slice_finds_the_switches_the_slice_before_flipped_put_back(
        tmp_path: Path) -> None:
    file = tmp_path / "meddling.py"
    file.write_text(MEDDLING)
    meddling, checking, patching = load_workload(file)
    placement = local_placement(TEST_NODE, [0])
    run_slice(meddling, "single", tmp_path, placement)
    [worker] = [w for w in local_pool().idle() if w.slot == ("cpu", 0)]
    run_slice(checking, "single", tmp_path, placement)  # raised SliceError before
    assert [w for w in local_pool().idle() if w.slot == ("cpu", 0)] == [worker]
    # A worker whose job patched torch is replaced: the next task's job finds torch as
    # it is (its losses changed, recorded exact, before: a review).
    run_slice(patching, "single", tmp_path, placement)
    run_slice(checking, "single", tmp_path / "again", placement)
    assert [w for w in local_pool().idle() if w.slot == ("cpu", 0)] != [worker]


# A workload whose helper module patches torch when it is imported: the patch must hold
# in every slice of its task (a worker that put torch back kept the module imported, so
# the next slice trained without the patch, recorded exact: a regression review).
PATCHED_ON_IMPORT = """
import functools
import torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train
import torch_patch  # noqa: F401  (beside this file)


def patched_model():
    if not getattr(torch.nn.ReLU.forward, "patched", False):
        raise RuntimeError("the patch its helper module made on import is gone")
    return digits_mlp(hidden=8, depth=1)


workload = Workload([Task(name="patched", model=patched_model, data=digits_train,
                          loss=torch.nn.functional.cross_entropy, optimizer=torch.optim.SGD,
                          batch_size=8, steps=4, seed=1)])
"""

TORCH_PATCH = """
import torch

relu = torch.nn.ReLU.forward


def forward(self, x):
    return relu(self, x) * 2.0


forward.patched = True
torch.nn.ReLU.forward = forward
"""


def test_a_patch_a_workloads_module_makes_on_import_holds_in_its_every_slice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dione.spec import workload as workloads

    # Loading the workload here patches this process's torch too, and every later job
    # imports each workload file this process loaded: both put back after the test.
    monkeypatch.setattr(torch.nn.ReLU, "forward", torch.nn.ReLU.forward)
    monkeypatch.setattr(workloads, "_LOADED", dict(workloads._LOADED))
    (tmp_path / "torch_patch.py").write_text(TORCH_PATCH)
    file = tmp_path / "patched.py"
    file.write_text(PATCHED_ON_IMPORT)
    monkeypatch.setattr(pool_module, "_REPLACED_SAID", set())  # said once per process
    try:
        (patched,) = load_workload(file)
        placement = local_placement(TEST_NODE, [0])
        # Its worker is replaced after each slice: said once, with why (the reason was
        # in the worker's log alone: a review measured 29 workers for a 2-task run).
        with pytest.warns(UserWarning, match=r"a warm worker is replaced after a job, as "
                          r"it could not be put back as it started \(a job patched "
                          r"torch's ReLU.forward with code of its own"):
            first = run_slice(patched, "single", tmp_path / "run", placement, steps=2)
            rest = run_slice(patched, "single", tmp_path / "run", placement)  # raised before
    finally:
        sys.modules.pop("torch_patch", None)
    assert len(first.losses) == 2 and len(rest.losses) == 2


# Tasks whose model factory swaps torch's registry of global module-registration hooks
# for one that will not let go of its hook: the worker's reset after the slice cannot
# undo that. Asked to, the registry refuses after a pause (long enough that the launcher
# has moved on to its next slice), or never answers.
@pytest.mark.parametrize("reset", ["raises", "hangs"])
def test_a_worker_whose_reset_fails_is_replaced_and_the_next_slice_not_blamed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reset: str) -> None:
    """A worker that cannot put its state back after a slice (its reset raises, or
    never ends) is retired before the next slice on its device, which runs on a fresh
    worker: before, that slice was sent to it and failed (or hung) for the last one."""
    file = tmp_path / "stubborn.py"
    file.write_text(workload_text("stubborn"))
    tasks = {task.name: task for task in load_workload(file)}
    if reset == "hangs":  # the pool waits this long for its word, then retires it
        monkeypatch.setattr(pool_module, "RESTORE_SECONDS", 2.0)
    placement = local_placement(TEST_NODE, [0])
    pool = local_pool()
    run_slice(tasks[reset], "single", tmp_path, placement)  # its own slice succeeds
    [worker] = [w for w in pool.idle() if w.slot == ("cpu", 0)]
    started = pool.started
    innocent = run_slice(tasks["innocent"], "single", tmp_path, placement, timeout=60)
    assert len(innocent.losses) == 2
    assert pool.started == started + 1 and not worker.alive()
    assert [w for w in pool.idle() if w.slot == ("cpu", 0)] != [worker]
    if reset == "raises":  # it said so, and why (in its own log)
        assert worker.unrestored
        assert "this hook cannot be removed" in worker.log.read_text()


# A rank that forks a helper in a session of its own (which the group kill cannot
# reach), then dies: the helper holds the rank's end of the connection open.
_DIES_LEAVING_A_HELPER = '''
import os, sys, time
helper = os.fork()
if helper == 0:
    os.setsid()
    time.sleep(60)
    os._exit(0)
print(helper, flush=True)
os._exit(3)
'''


def test_a_worker_that_died_is_lost_though_its_helper_holds_the_connection(
        tmp_path: Path) -> None:
    from multiprocessing.connection import Connection

    ours, theirs = socket.socketpair()
    process = subprocess.Popen([sys.executable, "-c", _DIES_LEAVING_A_HELPER],
                               pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE)
    theirs.close()
    worker = WarmWorker(("cpu", 0), process, Connection(ours.detach()), tmp_path / "log")
    assert process.stdout is not None
    helper = int(process.stdout.readline())
    try:
        assert process.wait(30) == 3
        assert not worker.connection.poll(0)  # no end of file: the helper holds it
        assert worker.reply() == ("lost", None)
    finally:
        worker.connection.close()
        os.kill(helper, signal.SIGKILL)
        process.stdout.close()


class _SecondStartFails(WorkerPool):
    """A pool whose worker for device 1 cannot start (as with too many open files)."""

    def _start(self, slot: tuple[str, int], threads: int) -> WarmWorker:
        if slot[1] == 1:
            raise OSError(24, "Too many open files")
        return super()._start(slot, threads)


def test_workers_taken_before_one_fails_to_start_are_ended() -> None:
    from helpers import dione_processes

    pool = _SecondStartFails()
    try:
        with pytest.raises(OSError, match="Too many open files"):
            pool.take("cpu", [0, 1], 1)
        assert pool.started == 1 and pool.idle() == []
        spawners = set(pool.spawner_pids())
        assert spawners  # device 0's worker came from this pool's spawner, and is gone
        assert [pid for pid, (_, parent) in dione_processes().items()
                if parent in spawners] == []
    finally:
        pool.shutdown()


def _model_importing(folder: str, module: str) -> torch.nn.Module:
    """The digits MLP, after importing ``module`` from ``folder`` as a lazy package
    loads a model's module the first time its class is named."""
    import importlib

    from dione.zoo import digits_mlp

    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.import_module(module)
    return digits_mlp(hidden=32, depth=2)


def _evaluate_importing(folder: str, module: str, model: torch.nn.Module) -> dict[str, float]:
    if folder not in sys.path:
        sys.path.insert(0, folder)
    __import__(module)
    return {"parameters": float(sum(p.numel() for p in model.parameters()))}


def test_a_slices_lazy_imports_are_counted_apart_from_its_start(tmp_path: Path) -> None:
    """What a worker's first slice imports as it builds the model or evaluates (a
    tiny GPT-2's first trial paid 2 s of transformers' modules) is told apart, as the
    workload's own imports are, so a trial does not count it as every slice's start;
    the next slice on that worker imports nothing and tells nothing."""
    import functools
    import uuid

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    name = f"slow_{uuid.uuid4().hex}"  # new to every warm worker
    for suffix in ("model", "metric"):
        (tmp_path / f"{name}_{suffix}.py").write_text("import time\ntime.sleep(0.5)\n")
    task = digits_task(
        "lazy", steps=4,
        model=functools.partial(_model_importing, str(tmp_path), f"{name}_model"),
        evaluate=functools.partial(_evaluate_importing, str(tmp_path), f"{name}_metric"))
    first = run_slice(task, "single", tmp_path / "run", local_placement(TEST_NODE, [0]),
                      steps=2, evaluate_at_end=True)
    # Both sleeps, whatever else the worker's first slice imported.
    assert first.timings["first_imports"] >= 1.0, first.timings
    assert first.evaluation and first.evaluation_error is None
    again = run_slice(task, "single", tmp_path / "again", local_placement(TEST_NODE, [0]),
                      steps=2, evaluate_at_end=True)
    assert again.timings.get("first_imports", 0.0) < 0.5, again.timings


def _model_noting(note: str, module: str) -> torch.nn.Module:
    """The digits MLP, once it has written to ``note`` whether ``module`` was imported
    before the model was built."""
    from dione.zoo import digits_mlp

    Path(note).write_text(str(module in sys.modules))
    return digits_mlp(hidden=8, depth=1)


def test_a_forked_worker_finds_what_its_launcher_imported_of_transformers(
        tmp_path: Path) -> None:
    """The modules of transformers its launcher imported (validating a task builds its
    model) a spawner imports before it forks, so a new rank does not import them again
    (2-4 s of CPU each on 2 cores, paid by every rank of a gang at once)."""
    import functools

    import cloudpickle
    import transformers.models.gpt2.modeling_gpt2  # noqa: F401 (as validating GPT-2 does)

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    note = tmp_path / "imported"
    task = digits_task("preloaded", steps=1, model=functools.partial(
        _model_noting, str(note), "transformers.models.gpt2.modeling_gpt2"))
    run_slice(task, "single", tmp_path / "run", local_placement(TEST_NODE, [0]), steps=1)
    assert note.read_text() == "True"
    assert local_pool().spawner_pids()  # a forked worker, not a process of its own


def test_a_preload_that_exits_or_sets_cuda_up_is_survived(tmp_path: Path) -> None:
    """A module to preload that raises SystemExit as it imports is left to the worker
    (the spawner forks on); one that sets CUDA up, which no fork could use, stops the
    spawner forking and says so; one that ends the spawner is named as what it was
    importing (its launcher then starts workers of its own, and turns preloading off)."""
    fake = tmp_path / "fake" / "transformers"  # a package the spawner preloads
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "exits.py").write_text("raise SystemExit(3)\n")
    (fake / "poison.py").write_text("import torch\ntorch.cuda.is_initialized = lambda: True\n")
    (fake / "ends.py").write_text("import os\nos._exit(5)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "fake"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    spawner = Spawner.start(0, env, tmp_path / "spawner.log")
    try:
        ours, theirs = socket.socketpair()
        worker = spawner.spawn(dict(os.environ), str(tmp_path / "worker.log"), theirs.fileno(),
                               120, ["transformers", "transformers.exits"])
        theirs.close()
        assert worker is not None and worker.poll() is None and not spawner.poisoned
        worker.signal_group(signal.SIGTERM)
        assert worker.wait(60) == -signal.SIGTERM
        ours.close()
        ours, theirs = socket.socketpair()
        refused = spawner.spawn(dict(os.environ), str(tmp_path / "next.log"), theirs.fileno(),
                                120, ["transformers", "transformers.poison"])
        theirs.close()
        ours.close()
        assert refused is None
        assert "importing transformers set CUDA up in the spawner" in spawner.poisoned
    finally:
        spawner.close(5)
    assert spawner.process.returncode == 0
    ended = Spawner.start(0, env, tmp_path / "ended.log")
    try:
        ours, theirs = socket.socketpair()
        assert ended.spawn(dict(os.environ), str(tmp_path / "never.log"), theirs.fileno(),
                           120, ["transformers", "transformers.ends"]) is None
        theirs.close()
        ours.close()
        assert ended.preloading == "transformers" and not ended.alive()
    finally:
        ended.close(5)


STACKS_AFTER_A_JOB = """
import faulthandler, io, os, signal, sys
from dione.launch.worker import STACKS_SIGNAL, Baseline
faulthandler.register(STACKS_SIGNAL, file=2, all_threads=True)  # as a worker starts
baseline = Baseline()
for job in ("own handler", "save and restore", "unregister", "stderr replaced"):
    if job == "stderr replaced":  # left so by the job: the restore must not fail for it
        sys.stderr = io.StringIO()
    elif job == "own handler":
        signal.signal(STACKS_SIGNAL, lambda *a: None)
    elif job == "save and restore":  # a library's: SIG_DFL put back over faulthandler
        old = signal.signal(STACKS_SIGNAL, lambda *a: None)
        signal.signal(STACKS_SIGNAL, old)
    else:
        faulthandler.unregister(STACKS_SIGNAL)
    baseline.restore()  # after the job
    os.kill(os.getpid(), STACKS_SIGNAL)  # a later job's stall: its stacks, not its death
    print("alive", flush=True)
"""


def test_a_job_that_set_its_own_stack_signal_handler_leaves_the_stacks_to_be_written(
) -> None:
    """The restore after a job put back SIG_DFL where the job had set its own SIGUSR1
    handler (faulthandler's is not seen by signal.getsignal): the next stack request
    killed the warm worker instead of writing its stacks (a regression review)."""
    done = subprocess.run([sys.executable, "-c", STACKS_AFTER_A_JOB], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "alive\n" * 4, (done.returncode,
                                                                   done.stderr)
    assert done.stderr.count("(most recent call first)") == 4


class _SlowSteps(torch.nn.Module):
    """A model whose every forward takes a while: a slice of it is running for seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.3)
        return self.layer(x)


def test_shutdown_beside_a_running_slice_leaves_its_workers_to_it(tmp_path: Path) -> None:
    """dione.shutdown() in a notebook while a run trained in another thread closed the
    spawner, which killed the slice's workers: each kill counted a failure of its task,
    and the slices' logs went (a review). The busy workers are left to their gang."""
    import threading
    import warnings

    import dione

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    task = digits_task("slow", model=_SlowSteps, steps=12)
    done: list[Any] = []
    slice_thread = threading.Thread(target=lambda: done.append(run_slice(
        task, "single", tmp_path, local_placement(TEST_NODE, [0]), timeout=120)))
    slice_thread.start()
    deadline = time.monotonic() + 60
    while not local_pool()._lent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert local_pool()._lent, "the slice never took its worker"
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        dione.shutdown()
    slice_thread.join(120)
    assert len(done) == 1 and len(done[0].losses) == 12
    assert any("are training a run in this process now" in str(w.message) for w in heard)
    dione.shutdown()  # once it has ended: all of it
    assert local_pool()._fork_server is None
