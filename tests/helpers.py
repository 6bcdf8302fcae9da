"""What several test modules share: small real tasks, the two-slot CPU node, training one
slice, the CLI as a user runs it, this session's worker processes, workload files, and the
tolerances the techniques are held to against ``single``.

Test modules import from here, never from each other or from ``conftest``."""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dione.launch import local_placement, run_slice
from dione.launch.pool import local_pool
from dione.launch.slice import SliceResult
from dione.plan.problem import NodeSpec, Option, PlanningProblem, TaskOptions
from dione.schedules import Timeline
from dione.spec.cluster import Node
from dione.spec.task import Task
from dione.state import load_model_weights
from dione.state.store import RunStore
from dione.zoo import CharGPT, digits_mlp, digits_train, sequence_cross_entropy, text_train

# Two CPU slots whatever the machine: the gangs in tests are the gangs CI runs.
TEST_NODE = Node("test", 2, "cpu")


def char_task(name: str = "char", steps: int = 8, batch_size: int = 8, lr: float = 3e-3,
              **extra: object) -> Task:
    """A 2-block character GPT on stdlib text: attention, layer norm, embeddings, AdamW."""
    task = Task(
        name=name,
        model=functools.partial(CharGPT, context=32, width=32, layers=2, heads=2),
        data=functools.partial(text_train, 32),
        loss=sequence_cross_entropy,
        optimizer=functools.partial(torch.optim.AdamW, lr=lr, weight_decay=0.1),
        batch_size=batch_size,
        steps=steps,
        seed=7,
    )
    return replace(task, **extra)


def digits_task(name: str = "digits", steps: int = 12, batch_size: int = 16,
                **extra: object) -> Task:
    task = Task(
        name=name,
        model=functools.partial(digits_mlp, hidden=32, depth=2),
        data=digits_train,
        loss=torch.nn.functional.cross_entropy,
        optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
        batch_size=batch_size,
        steps=steps,
        seed=3,
    )
    return replace(task, **extra)


# A three-slot node, for pipelines of three stages.
THREE = Node("n3", 3, "cpu")

# The techniques differ from ``single`` only in reduction order (see test_equivalence.py
# for the measurements behind these).
LOSS_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
PARAMETER_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def train(task: Task, technique: str, run_dir: Path, devices: int | None = None,
          steps: int | None = None, **knobs: object) -> SliceResult:
    """One slice of ``task`` under ``technique`` on local CPU slots (default: one for
    single, else two; three on THREE). Under xpipe the task opts in to training
    inexactly: the tests compare it under tolerances of their own."""
    count = devices or (1 if technique == "single" else 2)
    node = THREE if count == 3 else TEST_NODE
    if technique == "xpipe":
        task = replace(task, allow_inexact=True)
    return run_slice(task, technique, run_dir, local_placement(node, list(range(count))),
                     knobs=knobs, steps=steps, timeout=300)


def final_parameters(task: Task, checkpoint: str) -> dict[str, torch.Tensor]:
    """The parameters in a checkpoint, loaded into a plain model of the task."""
    model = task.model()
    load_model_weights(checkpoint, model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_training(result, params, reference, reference_params) -> None:
    torch.testing.assert_close(torch.tensor(result.losses), torch.tensor(reference.losses),
                               **LOSS_TOLERANCE)
    assert params.keys() == reference_params.keys()
    for name, value in params.items():
        torch.testing.assert_close(value, reference_params[name], **PARAMETER_TOLERANCE,
                                   msg=lambda m, name=name: f"{name}: {m}")


def dione(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
          cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``dione ARGS`` as a user runs it, in a process of its own (``env`` added)."""
    return subprocess.run([sys.executable, "-m", "dione.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=timeout,
                          cwd=cwd)


def in_process(capsys: pytest.CaptureFixture[str], *args: str,
               env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`dione ARGS` run by this process (``env`` set while it runs: its workers get it
    too): exit status, stdout, stderr. For what a command does rather than how a process
    of its own ends: that pays torch's imports again, and a spawner's for a command that
    trains (some 9 s of CPU in all)."""
    from dione.cli import main

    with pytest.MonkeyPatch.context() as environ:
        for name, value in (env or {}).items():
            environ.setenv(name, value)
        capsys.readouterr()
        status = main(list(args))
        out, err = capsys.readouterr()
    return status, out, err


def started_dione(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``dione ARGS`` started in a session of its own (``env`` added), its output in one
    pipe; Ctrl-C can reach it (see ``interruptible``)."""
    return subprocess.Popen([sys.executable, "-m", "dione.cli", *args], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=interruptible)


def wait_until_training(run: subprocess.Popen[str], run_dir: Path, deadline: float) -> None:
    """Until a started run's store holds a checkpoint of some task (its trials are done
    and it trains), it ends, or ``deadline`` (``time.monotonic()``) passes."""
    while time.monotonic() < deadline and run.poll() is None:
        if (run_dir / "dione.sqlite").is_file():
            with RunStore(run_dir) as store:
                if any(store.checkpoints(t.name) for t in store.tasks()):
                    return
        time.sleep(0.05)


def small_problem(tasks: int = 6) -> PlanningProblem:
    """Two nodes of two devices; tasks of 100-350 s on one device that scale well or
    badly to two (the planner has choices to make)."""
    return PlanningProblem(
        (NodeSpec("n0", 2), NodeSpec("n1", 2)),
        tuple(TaskOptions(f"t{i}", (
            Option("single", 1, 100.0 + 50.0 * i),
            Option("ddp", 2, (100.0 + 50.0 * i) * (0.55 if i % 2 else 0.9)),
        )) for i in range(tasks)))


WORKLOADS = Path(__file__).parent / "workloads"


def workload_text(name: str) -> str:
    """The text of ``tests/workloads/NAME.py``, for a test to write where it runs."""
    return (WORKLOADS / f"{name}.py").read_text()


# Every process this test session starts inherits the marker, so the leak check counts
# this session's workers only (another suite or benchmark may run on the machine).
SESSION_MARKER = f"DIONE_TEST_SESSION={uuid.uuid4().hex}".encode()
os.environ["DIONE_TEST_SESSION"] = SESSION_MARKER.split(b"=", 1)[1].decode()
# Each pytest worker's processes mark their training apart: the suite's two workers
# share the cores, and each would find its trials timed beside the other's, never kept
# in a catalog that its tests read back.
os.environ["DIONE_TRAINING_MARKS"] = os.path.join(
    tempfile.gettempdir(), f"dione-test-marks-{os.environ['DIONE_TEST_SESSION']}")
atexit.register(shutil.rmtree, os.environ["DIONE_TRAINING_MARKS"], ignore_errors=True)


def dione_processes() -> dict[int, tuple[bytes, int]]:
    """This test session's live worker and spawner processes: pid -> (cmdline, ppid)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            if b"dione.launch.worker" not in cmdline and b"dione.launch.spawner" not in cmdline:
                continue
            fields = (entry / "stat").read_text().split(") ")[1].split()
            ours = SESSION_MARKER in (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ours and fields[0] != "Z":
            found[int(entry.name)] = (cmdline, int(fields[1]))
    return found


def worker_processes() -> list[int]:
    """Pids of this test session's live dione worker processes (zombies excluded): plain
    ones, and those a spawner forked (which carry its command line)."""
    found = dione_processes()
    return sorted(pid for pid, (cmdline, parent) in found.items()
                  if b"dione.launch.worker" in cmdline or parent in found)


def spawner_processes() -> list[int]:
    """Pids of this test session's live spawners, other than this process's own."""
    found = dione_processes()
    own = set(local_pool().spawner_pids())
    return sorted(pid for pid, (cmdline, parent) in found.items()
                  if b"dione.launch.spawner" in cmdline and parent not in found
                  and pid not in own)


def interruptible() -> None:
    """In a child process about to start: let SIGINT interrupt it, as Ctrl-C does a
    command in a terminal. A shell starts background jobs with SIGINT ignored, children
    inherit that, and Python then installs no KeyboardInterrupt at all, so a test that
    sends SIGINT would hang whenever the suite itself runs in the background."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def check_real_timeline(timeline: Timeline) -> None:
    """A real run's timeline: each stage's actions in its list's order without overlap,
    each one's work only after its input arrived from the neighbouring stage."""
    for spans in timeline.spans:
        assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(spans))
    ends = {(k, span.action): span.end for k, spans in enumerate(timeline.spans)
            for span in spans}
    for k, spans in enumerate(timeline.spans):
        for span in spans:
            if span.action.kind == "F" and k > 0:
                assert span.start >= ends[(k - 1, span.action)]
            if span.action.kind == "B" and k < len(timeline.spans) - 1:
                assert span.start >= ends[(k + 1, span.action)]
    assert timeline.render(timeline.makespan / 60).count("\n") == len(timeline.spans) - 1


@contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` where nothing can be written: a read-only bind mount of it as root (who
    may write whatever its permissions), its permissions taken away otherwise."""
    if os.geteuid() != 0:
        entries = [folder, *folder.rglob("*")]
        modes = {p: p.stat().st_mode for p in entries}
        for p in entries:
            p.chmod(modes[p] & ~0o222)
        try:
            yield folder
        finally:
            for p in entries:
                p.chmod(modes[p])
        return
    view = folder.with_name(folder.name + "-read-only")
    view.mkdir()
    try:
        for command in (["mount", "--bind", str(folder), str(view)],
                        ["mount", "-o", "remount,bind,ro", str(view)]):
            if subprocess.run(command, capture_output=True).returncode != 0:
                subprocess.run(["umount", str(view)], capture_output=True)
                pytest.skip("root who may not mount: no folder here is read-only to root")
        try:
            yield view
        finally:
            subprocess.run(["umount", str(view)], check=True)
    finally:
        view.rmdir()
