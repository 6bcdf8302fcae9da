"""The `dione` command: exit status 0 / 1 (training failed) / 2 (bad input), clear words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import dione, in_process

ROOT = Path(__file__).resolve().parent.parent

# A workload file's task of the digits MLP, changed as each test's workload needs.
TASK = '''
def task(name, **changes):
    base = dict(name=name, model=digits_mlp, data=digits_train,
                loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=16, steps=3)
    return Task(**{**base, **changes})
'''

BAD_FIELDS = '''
import functools, threading, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

lock = threading.Lock()

def broken():
    raise RuntimeError("no model today")
''' + TASK + '''
workload = Workload([
    task("ok"),
    task("ok"),
    # No single, ddp or pipeline to fall back on (fsdp on one CPU device shards nothing).
    task("odd", batch_size=15, techniques=("fsdp",)),
    task("locked", loss=lambda out, y: (lock, torch.nn.functional.cross_entropy(out, y))[1]),
    task("broken", model=broken),
])
'''


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`dione ARGS` run by this process: its exit status and what it wrote to stderr.
    For commands refused before any training, and tests of what a command trains rather
    than of the command line (which ``dione`` above runs as a user does); each would pay
    torch's import in an interpreter of its own."""
    status, _, err = in_process(capsys, *args)
    return status, err


def test_validate_reports_every_problem(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "bad.py"
    file.write_text(BAD_FIELDS)
    status, err = refused(capsys, "validate", str(file), "--devices", "cpu:2")
    assert status == 2
    said = " ".join(err.split())
    assert "4 problem(s)" in said
    for expected in ("task 'ok', field 'name': 2 tasks share this name",
                     "task 'odd', field 'batch_size': 15 is not divisible by the 2 devices",
                     "task 'locked', field 'loss': cannot be pickled",
                     "task 'broken', field 'model': the model factory raised RuntimeError"):
        assert expected in said


NO_TECHNIQUE_TRAINS = '''
import functools, torch
from torch import nn
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

class OneLayer(nn.Module):  # no blocks to cut between
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 10)

    def forward(self, x):
        return self.linear(x.flatten(1))

def with_batch_norm():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(),
                         nn.Linear(32, 10))
''' + TASK + '''
workload = Workload([
    task("uncut", model=OneLayer, techniques=("gpipe", "1f1b")),
    task("batch-norm-ddp", model=with_batch_norm, techniques=("ddp",)),
    task("plain-sgd-xpipe", techniques=("xpipe",), allow_inexact=True),
    task("odd-pipeline", batch_size=15, techniques=("gpipe",)),
])
'''


def test_validate_fails_a_task_no_technique_it_allows_trains(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every technique a task allows refusing it was "no problems" to validate, and the
    run failed it after profiling; where a technique can train it some other way (ddp on
    one device where single is not allowed, xpipe with weight stashing alone for an
    optimizer it cannot predict, micro-batches that divide an odd batch), it was refused
    too."""
    from dione.spec.workload import load_workload
    from dione.techniques import get_technique
    from dione.techniques.pipeline.gpipe import micro_batch_counts

    file = tmp_path / "workload.py"
    file.write_text(NO_TECHNIQUE_TRAINS)
    status, err = refused(capsys, "validate", str(file), "--devices", "cpu:4")
    said = " ".join(err.split())
    assert status == 2 and "1 problem(s)" in said, said
    assert ("task 'uncut', field 'techniques': no technique it allows (gpipe, 1f1b) will "
            "train it" in said and "gpipe, 1f1b: pipelines cut a model between its blocks"
            in said and "allow single" in said)
    tasks = {t.name: t for t in load_workload(file)}
    # A run refuses it as validate does, before profiling (it failed after: review).
    import dione

    with pytest.raises(ValueError, match="no technique it allows"):
        dione.run([tasks["uncut"]], devices="cpu:2", run_dir=str(tmp_path / "run"))
    assert get_technique("ddp").knob_settings(tasks["batch-norm-ddp"], 1, "cpu")
    assert not get_technique("ddp").knob_settings(tasks["uncut"], 1, "cpu")  # single's
    settings = get_technique("xpipe").knob_settings(tasks["plain-sgd-xpipe"], 2, "cpu")
    assert settings and not any(s["prediction"] for s in settings)
    assert micro_batch_counts(4, 15) == [4, 5, 8, 16]
    assert {s["micro_batches"] for s in get_technique("gpipe").knob_settings(
        tasks["odd-pipeline"], 2, "cpu")} == {3}


def test_syntax_error_and_missing_workload(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("from dione import Workload\nworkload = Workload([)\n")
    status, stderr = refused(capsys, "train", str(broken), "--task", "x", "--technique",
                             "single")
    assert status == 2 and "broken.py:2: syntax error" in stderr
    empty = tmp_path / "empty.py"
    empty.write_text("tasks = []\n")
    status, stderr = refused(capsys, "run", str(empty), "--out", str(tmp_path / "run"))
    assert status == 2 and "defines no `workload`" in stderr


def test_train_refuses_what_cannot_work(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "bad.py"
    file.write_text(BAD_FIELDS)
    train = ("train", str(file), "--out", str(tmp_path / "run"))
    status, stderr = refused(capsys, *train, "--task", "nope", "--technique", "single")
    assert status == 2 and "no task named 'nope'" in stderr
    status, stderr = refused(capsys, *train, "--task", "odd", "--technique", "zero")
    assert status == 2 and "unknown technique 'zero'" in stderr
    status, stderr = refused(capsys, *train, "--task", "odd", "--technique", "ddp",
                             "--devices", "2")
    assert status == 2 and "15 of task 'odd' is not divisible by 2 devices" in stderr
    status, stderr = refused(capsys, *train, "--task", "broken", "--technique", "single",
                             "--knob", "fast=true")
    assert status == 2 and "the model factory raised" in stderr


def test_train_beats_as_it_trains(tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`dione train` never told the store it lived: a slice a kill -9 cut short ended at
    its own start (0 s) in status and the report, where a run's ends at its last beat."""
    from dione.state.store import RunStore

    file = tmp_path / "long.py"
    file.write_text(BAD_FIELDS.replace("workload = Workload([", "workload = Workload([\n"
                                       "    task('long', steps=60),\n    #"))
    status, _, err = in_process(capsys, "train", str(file), "--task", "long", "--technique",
                                "single", "--out", str(tmp_path / "run"))
    assert status == 0, err
    with RunStore(tmp_path / "run") as store:
        [trained] = store.slices("long")
        assert trained.started_at < store._run_value("heard")["at"] <= trained.ended_at


def test_train_prints_losses_and_resumes(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "good.py"
    file.write_text(BAD_FIELDS.replace("workload = Workload([", "workload = Workload([\n"
                                       "    task('lone', steps=4, eval_every=2, evaluate="
                                       "lambda m: {'x': 1.0}),\n    #"))
    run_dir = tmp_path / "run"
    # A killed launcher's scratch folder: `dione train` removes it, as every launcher does.
    from dione.launch.scratch import MARKER

    gone = subprocess.Popen(["true"])
    gone.wait()
    temp = tmp_path / "tmp"
    stale = temp / f"dione-gang-{gone.pid}-abc"
    stale.mkdir(parents=True)
    (stale / MARKER).write_text("x")
    first = dione("train", str(file), "--task", "lone", "--technique", "single", "--steps", "3",
                  "--out", str(run_dir), env={"TMPDIR": str(temp)})
    assert first.returncode == 0, first.stderr
    assert not stale.exists()
    assert [line.split()[1] for line in first.stdout.splitlines()
            if line.startswith("step")] == ["1", "2", "3"]
    # One slice: the task's eval_every is `dione run`'s (it was ignored without a word).
    assert "note: lone's eval_every is `dione run`'s" in " ".join(first.stdout.split())
    # Part of a task trained as asked is pending, not "interrupted" (review).
    status, out, _ = in_process(capsys, "status", str(run_dir))
    said = " ".join(out.split())
    assert status == 0 and "lone pending 3/4" in said.replace("│", "").replace("  ", " ") \
        and "interrupted" not in said and "a `dione train` folder" in said, said
    # Resume, status and export name the command that goes on (they named dione.run).
    status, stderr = refused(capsys, "resume", str(run_dir))
    assert status == 2 and "it is a `dione train` folder" in " ".join(stderr.split())
    status, stderr = refused(capsys, "train", str(file), "--task", "lone", "--technique",
                             "fsdp", "--devices", "2", "--knob", "zero_stage=3", "--out",
                             str(run_dir))
    assert status == 2 and "fsdp has no knob 'zero_stage'" in stderr
    status, out, err = in_process(capsys, "train", str(file), "--task", "lone", "--technique",
                                  "ddp", "--devices", "2", "--out", str(run_dir))
    assert status == 0, err
    assert "step      4" in out and "steps 3-4 under ddp" in out
    assert "trained exact (as single would)" in out  # as dione run's table says it
    # A task trained to its end: said, not a failure (exit 1 read "training failed").
    status, out, _ = in_process(capsys, "train", str(file), "--task", "lone", "--technique",
                                "single", "--out", str(run_dir))
    assert status == 0 and "already trained to step 4 of 4" in out
    assert "--out DIR trains it anew" in " ".join(out.split())
    # Trained otherwise there (another rate): refused as bad input, not said to be a
    # slice that "failed outside its gang".
    file.write_text(file.read_text().replace("lr=0.1", "lr=0.2"))
    status, stderr = refused(capsys, "train", str(file), "--task", "lone", "--technique",
                             "single", "--out", str(run_dir))
    said = " ".join(stderr.split())
    assert status == 2 and "with other training (optimizer: SGD(lr=0.1) -> SGD(lr=0.2))" \
        in said and "outside its gang" not in said, said


def test_the_demo_workload_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = in_process(capsys, "validate", str(ROOT / "examples" / "demo.py"),
                                  "--devices", "cpu:2")
    assert status == 0, err
    assert "6 task(s), no problems" in out


def test_version_and_train_devices_as_every_command_takes_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    version = dione("--version")
    assert version.returncode == 0 and version.stdout.startswith("dione 0.")
    file = tmp_path / "one.py"
    file.write_text(BAD_FIELDS.split("workload = ")[0] + "workload = Workload([task('ok')])\n")
    status, out, err = in_process(capsys, "train", str(file), "--task", "ok", "--technique",
                                  "ddp", "--devices", "cpu:2", "--out", str(tmp_path / "run"))
    assert status == 0, err
    assert "under ddp on 2 device(s)" in out
    status, stderr = refused(capsys, "train", str(file), "--task", "ok", "--technique", "ddp",
                             "--devices", "gpu:2", "--out", str(tmp_path / "run"))
    assert status == 2 and "--devices 'gpu:2' is not understood" in stderr
    # A slice that diverges prints its steps as one that ends does (only the store had
    # them: the lines that show how the loss blew up).
    wild = tmp_path / "wild.py"
    wild.write_text(BAD_FIELDS.split("workload = ")[0] + "workload = Workload([task('wild', "
                    "optimizer=functools.partial(torch.optim.SGD, lr=1e30), steps=6)])\n")
    status, out, err = in_process(capsys, "train", str(wild), "--task", "wild", "--technique",
                                  "single", "--out", str(tmp_path / "wild"))
    assert status == 1 and "diverged" in err, err
    shown = [line.split() for line in out.splitlines() if line.startswith("step ")]
    assert shown and shown[-1][3] == "nan" and [int(s[1]) for s in shown] == list(
        range(1, len(shown) + 1)), out


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


def test_a_pipeline_splits_a_batch_that_no_device_count_divides(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A batch of 32 on 3 devices: no data-parallel split, but a 3-stage pipeline of 4
    micro-batches of 8 trains it, and follows single (issue 16: one split rule, the
    technique's)."""
    file = tmp_path / "b32.py"
    file.write_text(PIPELINE_BATCH)
    train = ("train", str(file), "--task", "b32", "--steps", "3")
    status, piped, err = in_process(capsys, *train, "--technique", "gpipe", "--devices",
                                    "cpu:3", "--out", str(tmp_path / "gpipe"))
    assert status == 0, err
    status, single, err = in_process(capsys, *train, "--technique", "single", "--devices",
                                     "cpu:1", "--out", str(tmp_path / "single"))
    assert status == 0, err
    assert len(losses_printed(piped)) == 3
    # Within the suite's loss tolerance (test_equivalence): micro-batch means, summed.
    assert losses_printed(piped) == pytest.approx(losses_printed(single), rel=1e-5)
    # Data parallelism cannot split it, and says so by the technique's rule.
    status, err = refused(capsys, *train, "--technique", "ddp", "--devices", "cpu:3",
                          "--out", str(tmp_path / "ddp"))
    assert status == 2 and "32 of task 'b32' is not divisible by 3 devices" in err


def test_the_parser_writes_no_default_that_the_options_own() -> None:
    """Option flags take their defaults from RunOptions/TrialOptions (issue 16): a default
    written into the parser as well would show here as a flag that is not None unset."""
    import inspect

    from dione.cli.parser import OPTION_FLAGS, build_parser, run_options
    from dione.orchestrate import RunOptions
    from dione.plan import solve

    parser = build_parser()
    for argv in (["run", "w.py"], ["resume", "runs/w"], ["profile", "w.py"]):
        values = vars(parser.parse_args(argv))
        unset = {f.name: values[f.dest] for f in OPTION_FLAGS if f.dest in values}
        assert unset and set(unset.values()) == {None}, (argv, unset)
    assert run_options(vars(parser.parse_args(["run", "w.py"]))) == RunOptions()
    for flag in OPTION_FLAGS:  # every flag names a field that exists
        owner: object = RunOptions()
        for name in flag.field.split("."):
            owner = getattr(owner, name)
    # A slice's length is steps or seconds: both refused; at resume the one given
    # replaces the saved run's other.
    from dione.cli.errors import BadInput

    with pytest.raises(BadInput, match=r"--slice-steps 4 and --slice-seconds 3\.0: a "
                       r"slice's length is one or the other"):
        run_options(vars(parser.parse_args(["run", "w.py", "--slice-steps", "4",
                                            "--slice-seconds", "3"])))
    # Re-planning off, its interval given: it did nothing, unsaid (a review).
    with pytest.raises(BadInput, match=r"--no-replan and --replan-interval 5\.0: a run "
                       r"that keeps its first plan re-plans at no interval"):
        run_options(vars(parser.parse_args(["run", "w.py", "--no-replan",
                                            "--replan-interval", "5"])))
    saved = RunOptions(slice_steps=4)
    resumed = run_options(vars(parser.parse_args(["resume", "r", "--slice-seconds", "3"])),
                          base=saved)
    assert (resumed.slice_steps, resumed.slice_seconds) == (None, 3.0)
    plan = parser.parse_args(["plan", "problem.json"])
    defaults = inspect.signature(solve).parameters
    assert (plan.solver, plan.time_limit) == (defaults["solver"].default,
                                              defaults["time_limit"].default)


def test_help_shows_the_defaults_of_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    from dione.cli.parser import build_parser
    from dione.orchestrate import RunOptions

    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    options = RunOptions()
    for shown in (f"steps not timed (default: {options.trial.warmup_steps})",
                  f"seconds for the first plan (default: {options.time_limit})",
                  f"this often is failed (default: {options.max_failures})"):
        assert shown in text


def test_dione_warnings_are_said_as_the_command_says_warnings(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A warning of dione's own (a Ray node's devices waited for) printed in Python's
    form, with a file, a line number and a line of dione's source."""
    import warnings

    import dione.launch.ray_launcher as where
    from dione.cli import _say_own_warnings

    with warnings.catch_warnings(record=True) as elsewhere:  # Python's own way
        warnings.simplefilter("always")
        _say_own_warnings()
        warnings.warn_explicit("waiting for node n1", UserWarning, where.__file__, 1)
        warnings.warn_explicit("a library's", UserWarning, "/elsewhere/lib.py", 7)
    said = capsys.readouterr().err
    assert said == "warning: waiting for node n1\n", said
    assert [str(w.message) for w in elsewhere] == ["a library's"]


def test_simulates_help_names_every_field_of_a_scenario(
        capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from dione.cli.parser import build_parser
    from dione.simulate import Scenario

    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    said = text.split("--scenario SCENARIO a JSON file", 1)[1].split("--steps", 1)[0]
    missing = [f.name for f in dataclasses.fields(Scenario) if f.name not in said]
    assert not missing, said  # faulty_nodes was left out (a review)


def test_resume_keeps_the_saved_options_and_applies_the_flags_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from dione.cli import main
    from dione.cli.commands import resume
    from dione.cli.saved_run import SavedRun, load_saved_run
    from dione.orchestrate import RunOptions
    from dione.profile import TrialOptions

    # The workload beside the run directory: a folder of other files is not a run's.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    started = SavedRun(str(tmp_path / "w.py"), RunOptions(
        solver="greedy", time_limit=3.0, replan=False, slice_steps=4, timeout=50.0,
        trial=TrialOptions(warmup_steps=1, measure_steps=3, memory_cap_bytes=2**30)),
        devices="cpu:2", ray_env=("DIONE_A=1", "HOME"))
    started.write(run_dir)
    (tmp_path / "w.py").write_text("")  # resume refuses a workload that is not there
    assert load_saved_run(run_dir) == started
    resumed: list[SavedRun] = []
    monkeypatch.setattr(resume, "execute",
                        lambda workload, run, run_dir, **_: resumed.append(run) or 0)
    assert main(["resume", str(run_dir), "--timeout", "9", "--replan",
                 "--measure-steps", "7"]) == 0
    assert resumed == [dataclasses.replace(started, options=dataclasses.replace(
        started.options, timeout=9.0, replan=True,
        trial=dataclasses.replace(started.options.trial, measure_steps=7)))]
    assert main(["resume", str(run_dir)]) == 0
    assert resumed[-1] == started
    assert main(["resume", str(run_dir), "--ray-env", "DIONE_B=2"]) == 0  # in their place
    assert resumed[-1] == dataclasses.replace(started, ray_env=("DIONE_B=2",))
    # Recorded by a dione that took a variable it sets itself (and replaced it unsaid):
    # left out and said, not refused with no flag to clear it (a regression review).
    dataclasses.replace(started, ray_env=("OMP_NUM_THREADS=8", "DIONE_A=1")).write(run_dir)
    assert main(["resume", str(run_dir)]) == 0
    assert resumed[-1].ray_env == ("DIONE_A=1",)


def test_ray_env_passes_variables_to_ray_workers_and_is_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's workers start with their node's environment, not the launcher's: a
    variable the workload reads had to be set where each node was started."""
    import dione
    from dione.cli.errors import BadInput
    from dione.cli.inputs import ray_environment

    monkeypatch.setenv("DIONE_SIZE", "64")
    monkeypatch.delenv("DIONE_ABSENT", raising=False)
    assert ray_environment(["DIONE_LR=0.1=x", "DIONE_SIZE"]) == {
        "DIONE_LR": "0.1=x", "DIONE_SIZE": "64"}
    with pytest.raises(BadInput, match="DIONE_ABSENT is not set in this shell; export it, "
                       "or give --ray-env DIONE_ABSENT=VALUE"):
        ray_environment(["DIONE_ABSENT"])
    with pytest.raises(BadInput, match="give NAME=VALUE or NAME"):
        ray_environment(["1X=2"])
    # dione sets these in each actor: a value given was replaced unsaid (review).
    for name in ("OMP_NUM_THREADS=4", "GLOO_SOCKET_IFNAME=eth0"):
        with pytest.raises(BadInput, match=f"dione sets {name.split('=')[0]} in its Ray "
                           "workers itself"):
            ray_environment([name])
    status, err = refused(capsys, "run", str(ROOT / "examples" / "demo.py"), "--ray-env",
                          "DIONE_SIZE", "--out", str(tmp_path / "r"))
    assert status == 2 and "--ray-env sets variables in a Ray cluster's workers: add " \
        "--ray" in " ".join(err.split())
    assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="ray_env sets variables in a Ray cluster's"):
        dione.run(str(ROOT / "examples" / "demo.py"), ray_env={"A": "1"},
                  run_dir=str(tmp_path / "p"))
    with pytest.raises(ValueError, match="ray_env must map variable names to text"):
        dione.run(str(ROOT / "examples" / "demo.py"), ray="auto", ray_env={"A": 1},
                  run_dir=str(tmp_path / "p"))
    with pytest.raises(ValueError, match="ray_env DIONE_ABSENT: DIONE_ABSENT is not set"):
        dione.run(str(ROOT / "examples" / "demo.py"), ray="auto",  # a generator, read once
                  ray_env=(n for n in ["DIONE_SIZE", "DIONE_ABSENT"]),
                  run_dir=str(tmp_path / "p"))
    assert not (tmp_path / "p").exists()


def test_resume_reads_the_flags_an_older_dione_saved(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    import json

    from dione.cli.saved_run import load_saved_run

    # run.json as `dione run` wrote it before the options were saved whole: its flags.
    (tmp_path / "run.json").write_text(json.dumps({
        "command": "run", "workload": "/w.py", "devices": "cpu:2", "out": None, "ray": None,
        "storage": None, "solver": "greedy", "time_limit": 5.0, "no_replan": True,
        "replan_interval": 60.0, "slice_steps": 4, "slice_seconds": None, "max_failures": 3,
        "timeout": None, "current_practice": False, "technique": None, "catalog": None,
        "reprofile": False, "budget": 30.0, "memory_cap": "1GiB", "warmup_steps": 1,
        "measure_steps": 3, "trial_repeats": 1, "trial_timeout": 300.0, "serial": False}))
    old = load_saved_run(tmp_path)
    assert (old.workload, old.devices, old.ray) == ("/w.py", "cpu:2", None)
    options = old.options
    assert (options.solver, options.time_limit, options.replan, options.slice_steps,
            options.profile_budget) == ("greedy", 5.0, False, 4, 30.0)
    assert (options.trial.memory_cap_bytes, options.trial.warmup_steps,
            options.trial.measure_steps) == (2**30, 1, 3)
    # A field this dione does not know is named and left out, not a damaged file.
    (tmp_path / "run.json").write_text(json.dumps(
        {"workload": "/w.py", "options": {"solver": "greedy", "gone": 1,
                                          "trial": {"warmup_steps": 2, "old": 0}}}))
    options = load_saved_run(tmp_path).options
    assert (options.solver, options.trial.warmup_steps) == ("greedy", 2)
    err = capsys.readouterr().err
    assert "gone is not an option" in err and "trial.old is not an option" in err


def test_light_commands_do_not_import_torch(tmp_path: Path) -> None:
    """`dione --help`, `plan`, `status` and `report` start without torch (issue 16)."""
    from dione.state.store import RunStore

    with RunStore(tmp_path / "run"):
        pass
    problem = ROOT / "benchmarks" / "planner" / "instances" / "small-1.json"
    script = f'''
import contextlib, sys
from dione.cli import main
with contextlib.suppress(SystemExit):
    main(["--help"])
codes = [main(["plan", {str(problem)!r}, "--solver", "greedy", "--cluster", "2x8", "-o",
               {str(tmp_path / "p.json")!r}]),
         main(["status", {str(tmp_path / "run")!r}]), main(["report", {str(tmp_path / "run")!r}])]
print("exit", codes, "torch" in sys.modules)
'''
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=os.environ, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "exit [0, 0, 0] False"


def test_bad_numbers_and_files_are_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo = str(ROOT / "examples" / "demo.py")
    for flag, value in (("--time-limit", "-1"), ("--slice-steps", "0"), ("--timeout", "nan"),
                        ("--replan-interval", "0")):
        with pytest.raises(SystemExit) as exit_:
            in_process(capsys, "run", demo, flag, value, "--out", str(tmp_path / "r"))
        assert exit_.value.code == 2
        assert f"argument {flag}" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    # An empty folder named the current one (a run, a simulation, an export there).
    for args in (("run", demo, "--out", ""), ("export", str(tmp_path), "t", "-o", "")):
        with pytest.raises(SystemExit) as exit_:
            in_process(capsys, *args)
        assert exit_.value.code == 2 and "an empty path" in capsys.readouterr().err
    status, err = refused(capsys, "resume", str(tmp_path / "r"), "--workload", "")
    assert status == 2 and "an empty path" in err
    # Sizes and places: a traceback, 0 bytes, or found only once profiling had started
    # (run.json already naming the bad catalog, so every resume failed).
    file = tmp_path / "a-file"
    file.write_text("")
    for flag, value, said in (("--memory-cap", "nan", "a finite size of at least one byte"),
                              ("--memory-cap", "0.1", "a finite size of at least one byte"),
                              ("--storage", str(file / "sub"), "is a file, not a folder"),
                              ("--catalog", str(tmp_path), "is a folder; give a file"),
                              ("--catalog", "", "an empty path")):
        status, err = refused(capsys, "run", demo, flag, value, "--out", str(tmp_path / "r"))
        assert status == 2 and flag in err and said in " ".join(err.split()), err
    assert not (tmp_path / "r").exists()
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(bytes(range(128, 256)))
    status, err = refused(capsys, "plan", str(garbage))
    assert status == 2 and "not JSON text (byte 0 is not UTF-8)" in err
    status, err = refused(capsys, "run", demo, "--current-practice", "--technique", "bogus",
                          "--out", str(tmp_path / "r"))
    assert status == 2 and "'bogus' is not a technique" in err
    status, err = refused(capsys, "run", demo, "--current-practice", "--ray")
    assert status == 2 and "drop --ray" in err
    # An output that cannot be written is refused before the work, not after it.
    status, err = refused(capsys, "profile", demo, "-o", str(tmp_path / "nodir" / "p.json"))
    assert status == 2 and "the folder" in err and "does not exist" in err
    status, err = refused(capsys, "plan", str(garbage), "-o", str(tmp_path))
    assert status == 2 and "is a folder; give a file name" in err
    status, err = refused(capsys, "export", str(tmp_path), "t", "-o", str(garbage))
    assert status == 2 and "is a file; give a folder" in err
    # Dashboards it cannot write are refused before training, and not recorded.
    status, err = refused(capsys, "run", demo, "--out", str(tmp_path / "tb"),
                          "--tensorboard", str(garbage / "tb"))
    assert status == 2 and "the folder cannot be made" in err
    status, err = refused(capsys, "run", demo, "--out", str(tmp_path / "ml"),
                          "--mlflow", "bogus://x")
    assert status == 2 and "--mlflow bogus://x: MLflow cannot use it" in " ".join(err.split())
    assert not (tmp_path / "tb" / "run.json").exists()
    assert not (tmp_path / "ml" / "run.json").exists()


RULED = """
import functools
import torch
from dione import Asha, Task, Workload
from dione.zoo import digits_mlp, digits_train

workload = Workload([Task(name=f"ruled-{i}", model=functools.partial(digits_mlp, hidden=8,
                          depth=1), data=digits_train, loss=torch.nn.functional.cross_entropy,
                          optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=8,
                          steps=4, techniques=("single",), stopping=Asha(min_steps=2, eta=2))
                     for i in range(2)]
                    + [Task(name="bad", model=functools.partial(digits_mlp, hidden=8, depth=1),
                            data=digits_train, loss=torch.nn.functional.cross_entropy,
                            optimizer=functools.partial(torch.optim.SGD, lr=-1.0),
                            batch_size=8, steps=4)])
"""


def test_current_practice_says_it_applies_no_stopping_rule(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The baseline trains every task to its end, and says so where tasks have rules;
    like a planned run it keeps the tasks validation refused (status said "2 of 2 done"
    for a run that exited 1), writes its report and says how each task trained."""
    from dione.state.store import RunStore

    workload = tmp_path / "ruled.py"
    workload.write_text(RULED)
    status, out, err = in_process(capsys, "run", str(workload), "--current-practice",
                                  "--devices", "cpu:1", "--out", str(tmp_path / "r"),
                                  "--time-limit", "5")
    assert status == 1, err  # the invalid task, said last (only before training was)
    assert "task bad not trained (invalid): " in " ".join(err.split()), err
    assert "--time-limit do(es) nothing here" in " ".join(err.split())
    assert ("--current-practice trains every task to its end; the stopping rules of 2 "
            "task(s) (ruled-0, ruled-1) are not applied") in " ".join(err.split())
    with RunStore(tmp_path / "r") as store:
        assert [store.task(f"ruled-{i}").status for i in range(2)] == ["done", "done"]
        assert list(store.invalid()) == ["bad"]
    assert "trained" in out and "exact" in out
    assert (tmp_path / "r" / "report" / "summary.md").is_file()
    shown = dione("status", str(tmp_path / "r"))
    assert "2 of 2 task(s) done, 1 invalid (never started)" in " ".join(shown.stdout.split())
    # Its run.json names the workload (export said "trained from Python with task
    # objects"), and resume names the command that continues it.
    status, out, _ = in_process(capsys, "export", str(tmp_path / "r"), "ruled-0", "-o",
                                str(tmp_path / "out"))
    assert status == 0 and (tmp_path / "out" / "model.safetensors").is_file(), out
    # A file of the user's beside it stays, and is not said to be written (a review).
    (tmp_path / "out" / "tokenizer.json").write_text("{}")
    status, out, _ = in_process(capsys, "export", str(tmp_path / "r"), "ruled-0", "-o",
                                str(tmp_path / "out"))
    assert status == 0 and (tmp_path / "out" / "tokenizer.json").read_text() == "{}", out
    assert "(dione.json, model.safetensors)" in out and "tokenizer" not in out, out
    # Again over it, a symlink put at its dione.json: replaced, not followed (its target
    # was written over); a folder of other files is refused (written over as well).
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "out" / "dione.json").unlink()
    (tmp_path / "out" / "dione.json").symlink_to(victim)
    status, out, _ = in_process(capsys, "export", str(tmp_path / "r"), "ruled-0", "-o",
                                str(tmp_path / "out"))
    assert status == 0 and victim.read_text() == "mine", out
    assert not (tmp_path / "out" / "dione.json").is_symlink()
    assert json.loads((tmp_path / "out" / "dione.json").read_text())["task"] == "ruled-0"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    status, err = refused(capsys, "export", str(tmp_path / "r"), "ruled-0", "-o",
                          str(tmp_path / "other"))
    assert status == 2 and "is not empty and holds no earlier export" in " ".join(err.split())
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["notes.txt"]
    status, err = refused(capsys, "resume", str(tmp_path / "r"))
    assert status == 2 and "is a current-practice run" in err
    assert f"--current-practice --devices cpu:1 --out {tmp_path / 'r'}` continues it" in \
        " ".join(err.split())
    # A run killed while profiling recorded nothing: said, not only the path blamed (a
    # review).
    status, err = refused(capsys, "resume", str(tmp_path / "never"))
    assert status == 2 and "a `dione run` stopped before it recorded anything (while " \
        "profiling) left none: run it again" in " ".join(err.split()), err
    # What status and the report name as what continues it: the same (they named the
    # resume refused here).
    from dione.state.store import how_to_continue

    assert how_to_continue(tmp_path / "r").endswith(
        f"--current-practice --devices cpu:1 --out {tmp_path / 'r'}`")


def test_run_refuses_a_run_directory_another_workload_started(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its run.json must stay: resume and export read the workload from it."""
    from dione.cli.saved_run import SavedRun
    from dione.orchestrate.options import RunOptions

    run_dir = tmp_path / "my run"  # a space: the command it suggests quotes it
    run_dir.mkdir()
    SavedRun(str(tmp_path / "first.py"), RunOptions()).write(run_dir)
    before = (run_dir / "run.json").read_text()
    status, err = refused(capsys, "run", str(ROOT / "examples" / "demo.py"), "--out",
                          str(run_dir))
    assert status == 2 and "holds a run of" in err
    assert f"`dione resume '{run_dir}'`" in " ".join(err.split())
    assert (run_dir / "run.json").read_text() == before


def test_a_damaged_run_json_does_not_lock_its_run_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dione run writes it anew (the way out its error names), with a warning."""
    from dione.cli.saved_run import same_workload

    (tmp_path / "run.json").write_text("{not json")
    capsys.readouterr()
    same_workload(tmp_path, str(ROOT / "examples" / "demo.py"))
    assert "it is written anew for" in capsys.readouterr().err


def test_a_task_no_node_holds_is_left_out_of_plan_and_simulate_and_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One task too wide for the cluster refused the whole problem; a problem file
    without a cluster was refused although --cluster gave one."""
    import json

    problem = tmp_path / "p.json"
    problem.write_text(json.dumps({
        "cluster": {"nodes": [{"name": "n0", "devices": 2}]},
        "tasks": [{"name": "wide", "options": [{"technique": "ddp", "devices": 16,
                                                "seconds": 10}]},
                  {"name": "b", "options": [{"technique": "single", "devices": 1,
                                             "seconds": 10}]}]}))
    status, out, err = in_process(capsys, "plan", str(problem), "-o",
                                  str(tmp_path / "plan.json"))
    # Written, and exit 1 as a run that fails the task (0 read as a plan of everything).
    assert status == 1 and "1 task(s) no node holds are not in it" in out + err, err
    assert "task 'wide': no option fits any node (the widest has 2 devices, the narrowest " \
        "option needs 16): left out" in " ".join(err.split())
    written = json.loads((tmp_path / "plan.json").read_text())
    assert [a["task"] for a in written["assignments"]] == ["b"]
    assert "task 'wide'" in written["notes"]["left_out"][0]  # the plan says what it lacks
    # ... and checked against the same file, it passes (the check refused the file).
    status, out, err = in_process(capsys, "plan", "--check", str(tmp_path / "plan.json"),
                                  str(problem))
    assert status == 1 and "left out" in err, err
    assert "a valid plan" in out and "without the 1 task(s) no node holds" in out
    status, out, err = in_process(capsys, "simulate", str(problem), "--out",
                                  str(tmp_path / "sim"))
    assert status == 1 and "left out" in err and "2 tasks, 1 done, 1 left out" in out
    bare = tmp_path / "bare.json"  # no cluster: --cluster gives it
    bare.write_text(json.dumps({"tasks": json.loads(problem.read_text())["tasks"]}))
    status, out, err = in_process(capsys, "simulate", str(bare), "--cluster", "1x16",
                                  "--out", str(tmp_path / "sim16"))
    assert status == 0 and "2 tasks, 2 done" in out, err
    status, out, err = in_process(capsys, "simulate", str(bare), "--cluster", "1x1",
                                  "--out", str(tmp_path / "sim1"))
    assert status == 1 and "left out" in err and "2 tasks, 1 done, 1 left out" in out
    status, err = refused(capsys, "plan", str(bare))  # plan reads the file's own cluster
    assert status == 2 and "cluster: must be" in err and "or give the cluster as --cluster" \
        in " ".join(err.split())
    # ... or the one --cluster gives (simulate had it; plan did not): both tasks fit there,
    # and the plan is checked on that cluster too.
    status, out, err = in_process(capsys, "plan", str(bare), "--cluster", "1x16", "-o",
                                  str(tmp_path / "plan16.json"))
    assert status == 0, err
    planned = json.loads((tmp_path / "plan16.json").read_text())["assignments"]
    assert sorted((a["task"], a["node"]) for a in planned) == [("b", "n0"), ("wide", "n0")]
    status, out, err = in_process(capsys, "plan", "--check", str(tmp_path / "plan16.json"),
                                  str(problem), "--cluster", "1x16")
    assert status == 0 and "a valid plan" in out, err
    status, err = refused(capsys, "plan", str(bare), "--cluster", "4x0")
    assert status == 2 and "a node has at least one device" in err, err
    status, out, err = in_process(capsys, "plan", "--check", str(tmp_path / "plan16.json"),
                                  str(problem))  # without the --cluster it was made on
    assert status == 1 and "a plan made with --cluster is checked with the same --cluster" \
        in " ".join(err.split()), err
    # A scenario may name the task left out (it read "the workload has no such task").
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"task_slowdown": {"wide": 2, "b": 2}}))
    status, out, err = in_process(capsys, "simulate", str(problem), "--scenario",
                                  str(scenario), "--out", str(tmp_path / "sim"))
    assert status == 1 and "2 tasks, 1 done, 1 left out" in out, err
    scenario.write_text(json.dumps({"task_slowdown": {"c": 2}}))
    status, err = refused(capsys, "simulate", str(problem), "--scenario", str(scenario),
                          "--out", str(tmp_path / "sim"))
    assert status == 2 and "task_slowdown['c']: no task has this name (the tasks: b, " \
        "wide)" in err, err
    # The files of --check swapped: said as such (it listed the plan's fields as a
    # problem's mistakes).
    status, err = refused(capsys, "plan", "--check", str(problem), str(tmp_path / "plan.json"))
    assert status == 2 and "plan.json is a plan, not a problem: --check takes the plan " \
        "first" in " ".join(err.split()), err


def test_a_folder_is_named_as_what_it_is_and_an_invalid_task_as_never_trained(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dione validate FOLDER` said the folder did not exist; `dione simulate --out FILE`
    advised resuming a run; exporting a task validation refused said the run had no
    such task."""
    from dione.state.store import RunStore

    status, err = refused(capsys, "validate", str(tmp_path))
    assert status == 2 and "is a folder, not a workload file" in err, err
    (tmp_path / "file.txt").write_text("mine")
    status, err = refused(capsys, "simulate", str(Path(__file__).parent.parent / "benchmarks"
                                                  / "cluster_tables" / "llama2-sweep.json"),
                          "--out", str(tmp_path / "file.txt"))
    assert status == 2 and "give a directory you can write (--out)" in " ".join(
        err.split()) and "resume" not in err, err
    assert (tmp_path / "file.txt").read_text() == "mine"
    with RunStore(tmp_path / "run") as store:  # as a run leaves one task it refused
        store.register_task("good", 8, 16)
        store.set_invalid({"bad": ["optimizer: lr must be > 0, not -1"]})
    status, err = refused(capsys, "export", str(tmp_path / "run"), "bad", "-o",
                          str(tmp_path / "out"))
    assert status == 2 and "task 'bad' of run" in err and "was invalid and never trained " \
        "(optimizer: lr must be > 0, not -1): fix it, then `dione resume` the run" in " ".join(
            err.split()), err


def test_a_plan_of_deterministic_time_is_the_same_on_any_machine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dione plan --deterministic-time` solved on every core: its plan depended on the
    machine's cores, and was not the first plan `dione simulate` adopts on the same
    inputs, solved on one thread (review). It takes one thread unless told more."""
    problem = str(ROOT / "benchmarks" / "cluster_tables" / "llama2-sweep.json")
    plans = []
    for threads in ((), ("--threads", "1")):
        out = tmp_path / f"plan{len(threads)}.json"
        status, _, _ = in_process(capsys, "plan", problem, "--cluster", "4x8",
                                  "--deterministic-time", "1", *threads, "-o", str(out))
        assert status == 0
        plans.append(json.loads(out.read_text())["assignments"])
    assert plans[0] == plans[1]


def test_a_cluster_of_another_kind_than_the_files_is_noted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--cluster A100:2x8` on a problem of H100 nodes whose options name no kind
    planned A100 nodes with H100 seconds, unsaid (review)."""
    problem = str(ROOT / "benchmarks" / "cluster_tables" / "llama2-sweep.json")
    for cluster, noted in (("A100:2x8", True), ("2x8", False)):
        status, _, err = in_process(capsys, "plan", problem, "--cluster", cluster,
                                    "--time-limit", "1", "-o", str(tmp_path / "plan.json"))
        said = " ".join(err.split())
        assert status == 0 and ("were measured on the file's H100 nodes: on --cluster's "
                                "A100 nodes they take the same seconds" in said) == noted


DOUBTFUL_RULE = '''
import functools, torch
from dione import Asha, Task, Workload
from dione.zoo import digits_mlp, digits_train
from dione.zoo.digits import digits_accuracy

def task(name, rule):
    return Task(name=name, model=digits_mlp, data=digits_train,
                loss=torch.nn.functional.cross_entropy, evaluate=digits_accuracy,
                optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=16,
                steps=8, stopping=rule)

workload = Workload([task("a", Asha(metric="accuracy", min_steps=2)),
                     task("b", Asha(metric="accuracy", min_steps=2)),
                     task("c", Asha(metric="accuracy", min_steps=2, mode="max"))])
'''


def test_validate_warns_of_a_rule_judging_its_metric_the_other_way(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`accuracy` under the default mode="min" stops the most accurate tasks: valid (a
    user may mean it), but said once for the tasks it applies to, with the fix."""
    from dione.spec.metrics import direction_by_name, doubtful_direction

    file = tmp_path / "rule.py"
    file.write_text(DOUBTFUL_RULE)
    status, out, _ = in_process(capsys, "validate", str(file))
    said = " ".join(out.split())
    assert status == 0 and "no problems" in said, said
    assert said.count("with mode=") == 1 and "warning: a, b: its stopping rule judges " \
        "'accuracy' with mode='min'" in said and "Set mode='max'" in said, said
    # c, alone under its ASHA, is never stopped by it: said too.
    assert "warning: c: its stopping rule compares a task with those before it" in said
    assert doubtful_direction("val_loss", "max") and not doubtful_direction("val_loss", "min")
    assert direction_by_name("throughput") is None and not doubtful_direction("x", "max")
    # An eval_every at or past the last step does nothing (accepted silently).
    file.write_text(DOUBTFUL_RULE.replace('mode="max"))', 'mode="max"), eval_every=8)')
                    .replace("steps=8, stopping=rule)", "steps=8, stopping=rule, **extra)")
                    .replace("def task(name, rule):", "def task(name, rule, **extra):"))
    status, out, _ = in_process(capsys, "validate", str(file))
    said = " ".join(out.split())
    assert status == 0 and "warning: c: eval_every=8 is at or past its last step (8): it " \
        "evaluates only at its stopping rule's rungs (2, 6) and its end" in said, said
    # A Patience that needs more rungs than the task has: said, not refused.
    file.write_text(DOUBTFUL_RULE.replace("from dione import Asha,", "from dione import Asha, "
                                          "Patience,")
                    .replace('task("c", Asha(metric="accuracy", min_steps=2, mode="max"))',
                             'task("c", Patience(min_steps=4, every=4, patience=3))'))
    status, out, _ = in_process(capsys, "validate", str(file))
    said = " ".join(out.split())
    assert status == 0 and "warning: c: it judges at 1 rung(s) before the task's last step " \
        "(8)" in said, said
    # Beside a problem of another task, the warnings are said too (they waited until
    # every problem was fixed: a review).
    file.write_text(DOUBTFUL_RULE.replace('task("c", Asha(metric="accuracy", min_steps=2, '
                                          'mode="max"))', 'task("c", Asha(metric="accuracy", '
                                          'min_steps=0, mode="max"))'))
    status, out, err = in_process(capsys, "validate", str(file))
    said = " ".join(out.split())
    assert status == 2 and "min_steps must be a whole number >= 1" in err, err
    assert "besides the problems below:" in said and "warning: a, b: its stopping rule " \
        "judges 'accuracy' with mode='min'" in said, said


MISNAMED_METRICS = '''
import functools, torch
from dione import Asha, Task, Workload
from dione.zoo import digits_mlp, digits_train
from dione.zoo.digits import digits_accuracy

calls = []

def counted(model):
    calls.append(1)
    print("evaluated", len(calls))
    return digits_accuracy(model)

def broken(model):
    return {"accuracy": "high"}

def task(name, **extra):
    return Task(**{"name": name, "model": digits_mlp, "data": digits_train,
                   "loss": torch.nn.functional.cross_entropy, "evaluate": counted,
                   "optimizer": functools.partial(torch.optim.SGD, lr=0.1),
                   "batch_size": 16, "steps": 8, **extra})

workload = Workload([task("a", stopping=Asha(metric="acuracy", min_steps=2, mode="max")),
                     task("b", keep_best="val_loss", keep_best_mode="min"),
                     task("c", keep_best="accuracy"),
                     task("d", evaluate=broken, eval_every=4),
                     task("e", evaluate=broken, stopping=Asha(metric="accuracy", min_steps=2,
                                                              mode="max"))])
'''


def test_validate_runs_each_evaluate_once_and_names_a_metric_it_does_not_return(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stopping rule's or keep_best's metric evaluate does not return was found by the
    run's profiling trial, not by `dione validate`: now each evaluate function runs once
    on an untrained model there, a misnamed metric is the task's problem (with the name
    it likely meant), an evaluate that fails a warning (a run trains the task)."""
    import dione

    file = tmp_path / "metrics.py"
    file.write_text(MISNAMED_METRICS)
    status, out, err = in_process(capsys, "validate", str(file))
    said = " ".join(err.split())
    assert status == 2 and "4 problem(s)" in said, said  # d's and e's: below
    assert "task 'a', field 'stopping': its stopping rule judges 'acuracy', which its " \
        "evaluate does not return (it returned 'accuracy', 'test_loss' on its untrained " \
        "model): did you mean 'accuracy'? Else name one of those as the rule's metric, " \
        "or return it from evaluate" in said, said
    assert "task 'b', field 'keep_best': keep_best names 'val_loss', which its evaluate " \
        "does not return" in said and "'c'" not in said, said
    assert out.count("evaluated") == 1, out  # a, b and c share one evaluate function
    file.write_text(MISNAMED_METRICS.replace('metric="acuracy"', 'metric="accuracy"')
                    .replace('keep_best="val_loss"', 'keep_best="test_loss"'))
    status, out, err = in_process(capsys, "validate", str(file))
    said = " ".join((out + err).split())
    assert "evaluate of a, b and 1 more returned 'accuracy', 'test_loss' on an untrained " \
        "model" in said, said
    # What it returned, not as an exception it raised (it was dione's check: a review),
    # and a problem of each task whose evaluate returns it: no device makes a text a
    # number (a warning let the run train them, each evaluation failing, exit 0: a
    # review).
    assert status == 2 and "2 problem(s)" in said and "task 'd', field 'evaluate': " \
        "returned 'accuracy': 'high', which is not a number" in said and "task 'e', field " \
        "'evaluate': returned 'accuracy'" in said and "(at " not in said, said
    found = dione.validate(str(file))  # from Python: the same
    assert not found.ok and found.evaluated and {p.task for p in found.problems} == {
        "d", "e"}, found
    # An evaluate that raises here is a warning: it may need what only the run's devices
    # have (a GPU: a regression review); for a task whose rule judges what it returns, a
    # run fails it before training where it raises there too.
    file.write_text(MISNAMED_METRICS.replace('metric="acuracy"', 'metric="accuracy"')
                    .replace('keep_best="val_loss"', 'keep_best="test_loss"')
                    .replace('return {"accuracy": "high"}', 'raise OSError("no held-out '
                             'split here")'))
    status, out, _ = in_process(capsys, "validate", str(file))
    said = " ".join(out.split())
    assert status == 0 and "5 task(s), no problems" in said, said
    assert "warning: d: evaluate raised OSError: no held-out split here" in said and \
        "a run trains it but its evaluations fail" in said, said
    assert "warning: e: evaluate raised OSError" in said and "a run fails it before it " \
        "trains (its stopping rule judges what evaluate returns)" in said, said


EXPLODING = '''
import functools, torch
from torch import nn
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

class Exploding(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.calls = digits_mlp(hidden=16, depth=1), 0

    def forward(self, x):
        self.calls += 1
        if self.training and self.calls > 6:  # past validation's and profiling's batches
            raise RuntimeError(f"forward exploded at call {self.calls}")
        return self.inner(x)

def task(name, model):
    return Task(name=name, model=model, data=digits_train, techniques=("single",),
                loss=torch.nn.functional.cross_entropy, batch_size=16, steps=10,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2))

workload = Workload([task("fine", functools.partial(digits_mlp, hidden=16, depth=1)),
                     task("bomb", Exploding)])
'''


def test_a_failed_task_names_the_log_that_holds_its_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A task failing in its worker was said with "(its traceback: above, and in the
    report)", and neither held it: only the slice's rank log does, which names the
    user's line. The closing line and the report name that log."""
    from dione.state.store import RunStore

    file = tmp_path / "exploding.py"
    file.write_text(EXPLODING)
    run = tmp_path / "run"
    status, out, err = in_process(capsys, "run", str(file), "--out", str(run), "--devices",
                                  "cpu:2", "--catalog", str(tmp_path / "catalog.sqlite"),
                                  "--warmup-steps", "1", "--measure-steps", "2")
    said = " ".join(err.split())
    assert status == 1 and "task bomb failed" in said, out + err
    assert "above, and in the report" not in said
    log = Path(said.split("(its traceback: ")[1].split(")")[0])
    assert log.is_file() and log.parent.parent == run / "logs", log
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "exploding.py" in text
    assert "RuntimeError: forward exploded" in text
    summary = (run / "report" / "summary.md").read_text()
    failed = summary.split("## Failed and diverged tasks")[1]
    assert f"(traceback: `{log.relative_to(run)}`)" in failed, failed
    # Its row shows what its attempts held (it read 0.0 s on no device).
    (row,) = [r for r in summary.splitlines() if r.startswith("| bomb | failed |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] != "-" and float(cells[5]) > 0, row
    with RunStore(run) as store:
        assert {t.name: t.status for t in store.tasks()} == {"fine": "done", "bomb": "failed"}


def test_a_mistyped_flag_is_named_by_its_command_with_the_nearest_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    """It printed the top-level usage ("dione: error: unrecognized arguments")."""
    from dione.cli import main

    for argv, said in ((["run", "w.py", "--stoping-horizon", "rung"],
                        "dione run: error: unrecognized arguments: --stoping-horizon rung; "
                        "--stoping-horizon: did you mean --stopping-horizon?"),
                       (["resume", "runs/w", "--devices", "cpu:1"],
                        "--devices: a resumed run keeps the cluster it started with")):
        with pytest.raises(SystemExit) as ended:
            main(argv)
        err = capsys.readouterr().err
        assert ended.value.code == 2 and said in " ".join(err.split()), err
        assert f"usage: dione {argv[0]}" in err


BATCH_NORM_WORKLOAD = '''
import functools, torch
from torch import nn
from dione import Task, Workload
from dione.zoo import digits_train

def model():
    return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))

workload = Workload([Task("bn", model, digits_train, loss=nn.functional.cross_entropy,
                          optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
                          batch_size=16, steps=4)])
'''


def test_validate_names_what_will_not_train_a_task_for_its_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A technique's own refusals (BatchNorm under a split batch or a pipeline) are said
    before profiling, as the pipelines' probe refusals are (only those were)."""
    file = tmp_path / "bn.py"
    file.write_text(BATCH_NORM_WORKLOAD)
    status, out, _ = in_process(capsys, "validate", str(file), "--devices", "cpu:2")
    said = " ".join(out.split())
    assert status == 0 and "no problems" in said, said
    for technique in ("ddp", "fsdp", "gpipe", "1f1b"):
        assert f"{technique} will not train bn: " in said, said
    assert "unless it sets allow_inexact=True" in said
    assert "single will not train" not in said and "xpipe will not train" not in said


def test_status_says_a_run_is_profiling(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Before profiling ends the store knows no task: status showed an empty run ("0 of
    0 task(s) done") for the first minute a user watches."""
    from dione.orchestrate.options import claim_run_dir
    from dione.state.store import RunStore

    run_dir = tmp_path / "run"
    with claim_run_dir(run_dir):
        with RunStore(run_dir) as store:
            store.set_profiling(3)
        status, out, _ = in_process(capsys, "status", str(run_dir))
        assert status == 0 and "profiling 3 task(s) for" in " ".join(out.split()), out
        with RunStore(run_dir) as store:
            store.set_profiling(None)
        status, out, _ = in_process(capsys, "status", str(run_dir))
        assert "profiling" not in out


def test_current_practice_never_writes_a_live_runs_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It wrote run.json before claiming the directory: pointed at a live planned run,
    it was refused, but the planned run's record said "current practice" (its resume
    refused). It claims first now; its directory is private, as every run's."""
    from dione.orchestrate.options import claim_run_dir

    workload = tmp_path / "ruled.py"
    workload.write_text(RULED)
    run_dir = tmp_path / "live"
    with claim_run_dir(run_dir):  # made as a run makes it; then a live launcher holds it
        planned = json.dumps({"workload": str(workload.resolve())})  # the same workload
        (run_dir / "run.json").write_text(planned)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom dione.orchestrate.options import "
         f"claim_run_dir\nlock = claim_run_dir({str(run_dir)!r})\nprint('held', "
         "flush=True)\ntime.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        status, err = refused(capsys, "run", str(workload), "--current-practice",
                              "--devices", "cpu:1", "--out", str(run_dir))
    finally:
        holder.kill()
        holder.wait()
    assert status == 2 and "another dione launcher" in " ".join(err.split()), err
    assert (run_dir / "run.json").read_text() == planned
    fresh = tmp_path / "fresh"
    assert in_process(capsys, "run", str(workload), "--current-practice", "--devices",
                      "cpu:1", "--out", str(fresh))[0] == 1  # its one invalid task
    assert fresh.stat().st_mode & 0o077 == 0


def test_techniques_lists_the_built_ins_and_those_a_workload_registers(tmp_path: Path) -> None:
    from test_profile import OOM_AND_CRASH  # registers "crashes" as it loads

    (tmp_path / "workload.py").write_text(OOM_AND_CRASH)
    listed = dione("techniques", str(tmp_path / "workload.py"))
    assert listed.returncode == 0, listed.stderr
    names = {t["name"]: t["exact"] for t in json.loads(listed.stdout)}
    assert {"single", "ddp", "fsdp", "gpipe", "1f1b", "xpipe", "crashes"} <= set(names)
    assert names["xpipe"] is False and names["crashes"] is True


def test_run_refuses_a_folder_that_is_not_a_runs_and_keeps_its_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A project folder given as --out was adopted: its run.json replaced, its lock and
    report/ written over."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "run.json").write_text('{"my": "experiment config"}')
    (project / "notes.txt").write_text("mine")
    demo = Path(__file__).parent.parent / "examples" / "demo.py"
    status, err = refused(capsys, "run", str(demo), "--devices", "cpu:1", "--out", str(project))
    assert status == 2
    assert "is not a dione run directory and is not empty (it holds notes.txt)" in err
    assert (project / "run.json").read_text() == '{"my": "experiment config"}'
    assert sorted(p.name for p in project.iterdir()) == ["notes.txt", "run.json"]


def test_a_run_directory_given_through_a_symlink_is_refused_naming_its_real_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dione add and export gave UnsafePathError's traceback (status and report a
    sentence that did not say what to give instead)."""
    from dione.state import RunStore

    with RunStore(tmp_path / "real") as store:
        store.register_task("t", 10, 8)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    demo = str(Path(__file__).parent.parent / "examples" / "demo.py")
    for args in (("add", str(tmp_path / "link"), demo),
                 ("export", str(tmp_path / "link"), "t", "-o", str(tmp_path / "out")),
                 ("status", str(tmp_path / "link"))):
        status, err = refused(capsys, *args)
        assert status == 2 and "Traceback" not in err, (args, err)
        # (the console folds long lines: compared without their spaces)
        said = "".join(err.split())
        assert "giveitsrealpath:" + str((tmp_path / "real").resolve()) in said, (args, err)


@pytest.mark.timeout(60)
def test_a_fifo_or_folder_where_the_lock_is_neither_hangs_nor_fails_a_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Reading RUN_DIR/lock opened a FIFO there and waited for a writer for ever (status,
    resume); a folder there gave IsADirectoryError's traceback."""
    from dione.state import RunStore
    from dione.state.lock import RunLock

    for run, make in ((tmp_path / "fifo", os.mkfifo), (tmp_path / "dir", os.mkdir)):
        with RunStore(run) as store:
            store.register_task("t", 10, 8)
        make(run / "lock")
        status, _, err = in_process(capsys, "status", str(run))
        assert status == 0 and "Traceback" not in err, err
        with RunLock(run):  # a launcher takes it, writing its record there
            assert json.loads((run / "lock").read_text())["pid"] == os.getpid()


def test_dione_report_prints_each_table_of_the_summary_cut_short() -> None:
    """A sweep's 720-row table buried the line saying where the report went."""
    from dione.cli.commands.report import shortened

    table = ["| task | loss |", "| --- | --- |", *(f"| t{i} | {i} |" for i in range(25))]
    summary = "\n".join(["# report", "", *table, "", "## Board", *table[:5], "end"])
    lines = shortened(summary, rows=20).splitlines()
    assert lines[:4] == ["# report", "", "| task | loss |", "| --- | --- |"]
    assert lines[4:24] == table[2:22] and lines[24] == "(5 more row(s) in summary.md)"
    assert lines[25:] == ["", "## Board", *table[:5], "end"]  # a short table whole
    assert shortened(summary + "\n" + "\n".join(table), rows=20).endswith(
        "(5 more row(s) in summary.md)")


def test_the_live_step_line_says_a_gang_rank_s_loss_is_its_part_of_the_batch(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Under ddp the line showed rank 0's share of the batch as "loss 4.6624 (rank 0)"
    beside single's 4.8491 at the same step: someone checking equivalence saw a
    difference that is none."""
    from dione.cli.views import live_steps

    show = live_steps()
    show(0, {"step": 1, "loss": 4.6624, "seconds_per_step": None, "world": 2})
    alone = live_steps()
    alone(0, {"step": 1, "loss": 4.8491, "seconds_per_step": None, "world": 1})
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert lines == ["... step 1, loss 4.6624 (rank 0 of 2: its part of the batch; the "
                     "batch's loss follows)", "... step 1, loss 4.8491"]


def test_status_of_a_run_stopped_while_profiling_says_why_it_holds_no_task(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped before its profile ended (tasks are recorded once profiled) showed
    '0 of 0 task(s) done' and an empty table, and no word of how it goes on."""
    from dione.state import RunStore

    with RunStore(tmp_path) as store:  # as dione.run leaves it, stopped while profiling
        store.set_profiling(2)
        store.set_profiling(None)
    status, out, _ = in_process(capsys, "status", str(tmp_path))
    said = " ".join(out.split())
    assert status == 0 and "no task recorded: the run stopped before its profile ended" \
        in said and "calling dione.run (or dione.optuna.optimize) again" in said, said


def test_resume_takes_a_ray_clusters_new_address(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A Ray head started again on another port: resume had no --ray (read as
    --ray-env), and its own error advised --ray HOST:PORT; run.json had to be edited by
    hand (review). A run of this machine's devices is not moved to Ray."""
    import json
    import socket

    file = tmp_path / "w.py"
    file.write_text(BAD_FIELDS.replace("workload = Workload([", "workload = Workload([\n"
                                       "    task('lone', steps=2),\n    #"))
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    for name, ray in (("ray", "127.0.0.1:9"), ("local", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps(
            {"workload": str(file), "devices": None, "ray": ray, "options": {}}))
    status, err = refused(capsys, "resume", str(tmp_path / "ray"), "--ray",
                          f"127.0.0.1:{port}")
    assert status == 2 and f"cannot reach a Ray cluster at '127.0.0.1:{port}'" in err, err
    status, err = refused(capsys, "resume", str(tmp_path / "local"), "--ray", "auto")
    assert status == 2 and "trained on this machine's devices, not on a Ray cluster" in err
