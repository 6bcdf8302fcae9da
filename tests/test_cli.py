"""The `dione` command: exit status 0 / 1 (training failed) / 2 (bad input), clear words."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BAD_FIELDS = '''
import functools, threading, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

lock = threading.Lock()

def broken():
    raise RuntimeError("no model today")

def task(name, **changes):
    base = dict(name=name, model=digits_mlp, data=digits_train,
                loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=16, steps=3)
    return Task(**{**base, **changes})

workload = Workload([
    task("ok"),
    task("ok"),
    task("odd", batch_size=15),
    task("locked", loss=lambda out, y: (lock, torch.nn.functional.cross_entropy(out, y))[1]),
    task("broken", model=broken),
])
'''


def dione(*args: str, cwd: Path | None = None):
    return subprocess.run([sys.executable, "-m", "dione.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=os.environ, timeout=120)


def test_validate_reports_every_problem(tmp_path: Path) -> None:
    file = tmp_path / "bad.py"
    file.write_text(BAD_FIELDS)
    result = dione("validate", str(file), "--devices", "cpu:2")
    assert result.returncode == 2
    assert "4 problem(s)" in result.stderr
    for expected in ("task 'ok', field 'name': 2 tasks share this name",
                     "task 'odd', field 'batch_size': 15 is not divisible by the 2 devices",
                     "task 'locked', field 'loss': cannot be pickled",
                     "task 'broken', field 'model': the model factory raised RuntimeError"):
        assert expected in result.stderr


def test_syntax_error_and_missing_workload(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("from dione import Workload\nworkload = Workload([)\n")
    result = dione("train", str(broken), "--task", "x", "--technique", "single")
    assert result.returncode == 2
    assert "broken.py:2: syntax error" in result.stderr
    empty = tmp_path / "empty.py"
    empty.write_text("tasks = []\n")
    result = dione("run", str(empty))
    assert result.returncode == 2 and "defines no `workload`" in result.stderr


def test_train_refuses_what_cannot_work(tmp_path: Path) -> None:
    file = tmp_path / "bad.py"
    file.write_text(BAD_FIELDS)
    unknown = dione("train", str(file), "--task", "nope", "--technique", "single")
    assert unknown.returncode == 2 and "no task named 'nope'" in unknown.stderr
    technique = dione("train", str(file), "--task", "odd", "--technique", "zero")
    assert technique.returncode == 2 and "unknown technique 'zero'" in technique.stderr
    split = dione("train", str(file), "--task", "odd", "--technique", "ddp", "--devices", "2")
    assert split.returncode == 2 and "15 of task 'odd' is not divisible by 2 devices" in \
        split.stderr
    knob = dione("train", str(file), "--task", "broken", "--technique", "single",
                 "--knob", "fast=true")
    assert knob.returncode == 2 and "the model factory raised" in knob.stderr


def test_train_prints_losses_and_resumes(tmp_path: Path) -> None:
    file = tmp_path / "good.py"
    file.write_text(BAD_FIELDS.replace("workload = Workload([", "workload = Workload([\n"
                                       "    task('lone', steps=4),\n    #"))
    run_dir = tmp_path / "run"
    first = dione("train", str(file), "--task", "lone", "--technique", "single", "--steps", "3",
                  "--out", str(run_dir))
    assert first.returncode == 0, first.stderr
    assert [line.split()[1] for line in first.stdout.splitlines()
            if line.startswith("step")] == ["1", "2", "3"]
    bad_knob = dione("train", str(file), "--task", "lone", "--technique", "fsdp", "--devices",
                     "2", "--knob", "zero_stage=3", "--out", str(run_dir))
    assert bad_knob.returncode == 2 and "fsdp has no knob 'zero_stage'" in bad_knob.stderr
    second = dione("train", str(file), "--task", "lone", "--technique", "ddp", "--devices", "2",
                   "--out", str(run_dir))
    assert second.returncode == 0, second.stderr
    assert "step      4" in second.stdout and "steps 3-4 under ddp" in second.stdout
    done = dione("train", str(file), "--task", "lone", "--technique", "single",
                 "--out", str(run_dir))
    assert done.returncode == 1 and "already trained to step 4 of 4" in done.stderr


def test_the_demo_workload_is_valid() -> None:
    result = dione("validate", str(ROOT / "examples" / "demo.py"), "--devices", "cpu:2")
    assert result.returncode == 0, result.stderr
    assert "6 task(s), no problems" in result.stdout


def test_version_and_train_devices_as_every_command_takes_them(tmp_path: Path) -> None:
    version = dione("--version")
    assert version.returncode == 0 and version.stdout.startswith("dione 0.")
    file = tmp_path / "one.py"
    file.write_text(BAD_FIELDS.split("workload = ")[0] + "workload = Workload([task('ok')])\n")
    trained = dione("train", str(file), "--task", "ok", "--technique", "ddp", "--devices",
                    "cpu:2", "--out", str(tmp_path / "run"))
    assert trained.returncode == 0, trained.stderr
    assert "under ddp on 2 device(s)" in trained.stdout
    wrong = dione("train", str(file), "--task", "ok", "--technique", "ddp", "--devices",
                  "gpu:2", "--out", str(tmp_path / "run"))
    assert wrong.returncode == 2 and "--devices 'gpu:2' is not understood" in wrong.stderr


PIPELINE_BATCH = '''
import functools, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

workload = Workload([Task(name="b32", model=functools.partial(digits_mlp, depth=3),
                          data=digits_train, loss=torch.nn.functional.cross_entropy,
                          optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                          batch_size=32, steps=3)])
'''


def losses_printed(stdout: str) -> list[float]:
    return [float(line.split("loss")[1].split()[0]) for line in stdout.splitlines()
            if line.lstrip().startswith("step") and "loss" in line]


def test_a_pipeline_splits_a_batch_that_no_device_count_divides(tmp_path: Path) -> None:
    """A batch of 32 on 3 devices: no data-parallel split, but a 3-stage pipeline of 4
    micro-batches of 8 trains it, and follows single (issue 16: one split rule, the
    technique's)."""
    file = tmp_path / "b32.py"
    file.write_text(PIPELINE_BATCH)
    piped = dione("train", str(file), "--task", "b32", "--technique", "gpipe", "--devices",
                  "cpu:3", "--steps", "3", "--out", str(tmp_path / "gpipe"))
    assert piped.returncode == 0, piped.stderr
    single = dione("train", str(file), "--task", "b32", "--technique", "single", "--devices",
                   "cpu:1", "--steps", "3", "--out", str(tmp_path / "single"))
    assert single.returncode == 0, single.stderr
    assert len(losses_printed(piped.stdout)) == 3
    # Within the suite's loss tolerance (test_equivalence): micro-batch means, summed.
    assert losses_printed(piped.stdout) == pytest.approx(losses_printed(single.stdout),
                                                         rel=1e-5)
    # Data parallelism cannot split it, and says so by the technique's rule.
    ddp = dione("train", str(file), "--task", "b32", "--technique", "ddp", "--devices",
                "cpu:3", "--steps", "3", "--out", str(tmp_path / "ddp"))
    assert ddp.returncode == 2 and "32 of task 'b32' is not divisible by 3 devices" in \
        ddp.stderr
