"""What a new user hits first: sibling modules, a silent Python API, a finished run's
makespan, exported hyperparameters, a tuple loss, and lines the CLI need not print."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch
from torch import nn

import dione
from dione.profile import TrialOptions
from dione.spec.batch import own_loss
from dione.state import RunStore
from helpers import digits_task

# The workers cannot import this test module: its model classes travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SIBLING = '''
import functools, torch
from dione.zoo import digits_mlp

def model():
    return digits_mlp(hidden=16, depth=1)

optimizer = functools.partial(torch.optim.Adam, lr=1e-2)
'''

USES_SIBLING = '''
import torch
from dione import Task, Workload
from dione.zoo import digits_train
import my_models  # beside this file, not installed: as `python workload.py` finds it

workload = Workload([Task(name="d", model=my_models.model, data=digits_train,
                          loss=torch.nn.functional.cross_entropy,
                          optimizer=my_models.optimizer, batch_size=16, steps=4,
                          techniques=("single", "ddp"))])
'''


def test_a_workload_imports_its_sibling_modules_in_the_launcher_and_every_worker(
        tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_models.py").write_text(SIBLING)
    (project / "workload.py").write_text(USES_SIBLING)
    done = subprocess.run([sys.executable, "-m", "dione.cli", "train", "project/workload.py",
                           "--task", "d", "--technique", "ddp", "--devices", "2", "--out",
                           str(tmp_path / "run")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "steps 0-4 under ddp" in done.stdout


NOTEBOOK_LR = 0.01  # a notebook's number, read by a task's optimizer lambda


def test_the_python_api_says_what_it_does_and_a_finished_run_keeps_its_makespan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dione.run() printed nothing for the whole profile; run again once done, it said
    'makespan 0.0019'."""
    heard: list[Any] = []
    options = {"catalog": str(tmp_path / "catalog.sqlite"), "time_limit": 2.0,
               "trial": TrialOptions(warmup_steps=1, measure_steps=2)}
    tasks = [digits_task(steps=6, techniques=("single",))]
    first = dione.run(tasks, devices="cpu:1", run_dir=str(tmp_path / "run"),
                      on_event=heard.append, **options)
    printed = capsys.readouterr().out
    assert "trial single x1" in printed and "[planned]" in printed
    assert "[finished]" in printed
    assert {type(e).__name__ for e in heard} == {"ProfileEvent", "RunEvent"}
    # One callback reads both (a ProfileEvent had no message: the README's callback,
    # `lambda e: e.message`, ended every run in profiling: review).
    trials = [e for e in heard if type(e).__name__ == "ProfileEvent"]
    assert all(e.message.startswith(("trial ", "not tried: ")) for e in trials), trials
    assert any(e.data.get("status") == "ok" and e.data["step_seconds"] > 0 for e in trials)
    # A callback's numbers as numbers (it had only the message's text to parse: review).
    [finished] = [e for e in heard if e.kind == "slice_finished"]
    assert finished.data["end_step"] == 6 and finished.data["done"] is True
    assert finished.data["loss"] == first.tasks[0].final_loss and finished.data["seconds"] > 0
    assert [e.data["finish"] > 0 for e in heard if e.kind == "planned"] == [True]
    again = dione.run(tasks, devices="cpu:1", run_dir=str(tmp_path / "run"), quiet=True,
                      **options)
    assert capsys.readouterr().out == ""
    # From the run's start to its last slice's end, as the first session measured it.
    assert again.makespan == pytest.approx(first.makespan, rel=0.2, abs=0.5)
    # A notebook cell run again with another learning rate returned the first rate's
    # results as its own: the run directory now says the task was trained otherwise.
    faster = [digits_task(steps=6, techniques=("single",),
                          optimizer=functools.partial(torch.optim.Adam, lr=0.1))]
    with pytest.raises(ValueError, match=r"other training \(optimizer: Adam\(lr=0.01\) "
                       r"-> Adam\(lr=0.1\)\): use a new run directory"):
        dione.run(faster, devices="cpu:1", run_dir=str(tmp_path / "run"), quiet=True,
                  **options)
    # A notebook's rate, read by a lambda: said, not refused (what a module holds may be
    # a time or a pid, which would refuse every resume).
    global NOTEBOOK_LR
    cell = [digits_task("cell", steps=4, techniques=("single",),
                        optimizer=lambda params: torch.optim.Adam(params, lr=NOTEBOOK_LR))]
    dione.run(cell, devices="cpu:1", run_dir=str(tmp_path / "cell"), quiet=True, **options)
    NOTEBOOK_LR = 5.0
    heard.clear()
    with pytest.warns(UserWarning, match="training_changed"):
        dione.run(cell, devices="cpu:1", run_dir=str(tmp_path / "cell"), quiet=True,
                  on_event=heard.append, **options)
    changed = [e.message for e in heard if e.kind == "training_changed"]
    assert changed and changed[0].startswith(
        "cell: optimizer reads: NOTEBOOK_LR=0.01 -> NOTEBOOK_LR=5.0 since the run recorded it")
    # The task is done: no step read the new rate, so its results are the old one's,
    # said so, and said again next time (the new value was recorded, and the next call
    # said nothing); quiet, as a Python warning (it was said to on_event only: review).
    assert "the task has ended (done), every step of it trained with the recorded value" \
        in changed[0]
    with pytest.warns(UserWarning, match=r"\[training_changed\] cell: optimizer reads: "
                      r"NOTEBOOK_LR=0.01 -> NOTEBOOK_LR=5.0") as said:
        dione.run(cell, devices="cpu:1", run_dir=str(tmp_path / "cell"), quiet=True,
                  **options)
    assert said[0].filename == __file__  # the line that ran it, not dione's
    NOTEBOOK_LR = 0.01
    # The warm workers the runs left go when asked, their starter thread too (a
    # notebook had no public way: review); the next run starts new ones.
    import threading

    from dione.launch.pool import local_pool

    dione.shutdown()
    pool = local_pool()
    assert not pool._idle and pool._fork_server is None
    for thread in threading.enumerate():
        if thread.name.startswith("dione-starter"):
            thread.join(10)
            assert not thread.is_alive()


def test_exported_hyperparameters_keep_their_json_types(tmp_path: Path) -> None:
    from dione.launch import local_placement, run_slice
    from dione.spec.cluster import Node
    from dione.state.export import export_model, load_trained
    from dione.zoo import digits_accuracy

    task = digits_task(steps=2, hyperparameters={"lr": 0.001, "batch_size": 16,
                                                 "name": "x", "betas": (0.9, 0.99)},
                       evaluate=digits_accuracy)
    result = run_slice(task, "single", tmp_path / "run", local_placement(Node("n", 1, "cpu"),
                                                                         [0]))
    folder = export_model(load_trained(task, result.checkpoint), tmp_path / "out", task,
                          result.checkpoint, tmp_path / "run")
    saved = json.loads((folder / "dione.json").read_text())
    assert saved["hyperparameters"] == {"lr": 0.001, "batch_size": 16, "name": "x",
                                        "betas": "(0.9, 0.99)"}
    # How it trained, from the run store (it named only the last slice's technique).
    assert saved["trained"] == {"techniques": ["single"], "exactness": "exact",
                                "inexact": [], "statistical": [],
                                "spans": [{"steps": [0, 2], "technique": "single",
                                           "devices": 1, "knobs": {"accumulation": 1}}]}
    # And what its weights measured there (it was not written: a user had to find the
    # step in the run's tables).
    with RunStore(tmp_path / "run") as store:
        assert saved["evaluation"] == store.evaluation(task.name) != {}
        assert store.latest_evaluation(task.name)[0] == saved["step"] == 2


class _Vocabulary(torch.nn.Module):
    """A model whose extra state is a dict (a tokenizer's vocabulary, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        self.vocab = {"a": 1, "b": 2}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def get_extra_state(self) -> dict[str, int]:
        return dict(self.vocab)

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.vocab = dict(state)


def test_a_model_with_extra_state_that_is_no_tensor_is_exported(tmp_path: Path) -> None:
    """safetensors holds tensors only: the export failed with an AttributeError."""
    from safetensors.torch import load_file

    from dione.launch import local_placement, run_slice
    from dione.spec.cluster import Node
    from dione.state.export import export_model, load_trained

    task = digits_task(steps=2, model=_Vocabulary)
    result = run_slice(task, "single", tmp_path / "run", local_placement(Node("n", 1, "cpu"),
                                                                         [0]))
    trained = load_trained(task, result.checkpoint)
    trained.vocab["c"] = 3  # as if training had grown it
    folder = export_model(trained, tmp_path / "out", task, result.checkpoint)
    saved = json.loads((folder / "dione.json").read_text())
    assert (saved["extra_state"], saved["extra_state_keys"]) == ("extra_state.pt",
                                                                 ["_extra_state"])
    # Read back as the README says (safetensors' load_model asks the model for a state
    # of tensors only, and so cannot load this one).
    plain = _Vocabulary()
    plain.load_state_dict({**load_file(folder / "model.safetensors"),
                           **torch.load(folder / "extra_state.pt", weights_only=True)})
    assert plain.vocab == {"a": 1, "b": 2, "c": 3}
    for name, value in plain.state_dict().items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(value, trained.state_dict()[name], rtol=0, atol=0)


def test_an_export_whose_save_fails_leaves_the_earlier_export_as_it_was(
        tmp_path: Path) -> None:
    """The earlier export's files were deleted before the new save, which could fail
    (a full disk, a save_pretrained raising): the folder then held no model at all."""
    from safetensors.torch import load_file

    from dione.launch import local_placement, run_slice
    from dione.spec.cluster import Node
    from dione.state.export import export_model, load_trained

    task = digits_task(steps=2)
    result = run_slice(task, "single", tmp_path / "run", local_placement(Node("n", 1, "cpu"),
                                                                         [0]))
    trained = load_trained(task, result.checkpoint)
    folder = export_model(trained, tmp_path / "out", task, result.checkpoint)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    class Failing(torch.nn.Module):
        def save_pretrained(self, where: str) -> None:
            Path(where, "config.json").write_text("{}")
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        export_model(Failing(), folder, task, result.checkpoint)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    weights = load_file(folder / "model.safetensors")
    for name, value in trained.state_dict().items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0)
    # An export killed part way leaves its staging folder: the next export takes it
    # away, and into an otherwise empty folder one is not refused for it.
    (folder / ".dione-export-killed").mkdir()
    export_model(trained, folder, task, result.checkpoint)
    assert sorted(p.name for p in folder.iterdir()) == sorted(before)
    (tmp_path / "fresh" / ".dione-export-killed").mkdir(parents=True)
    export_model(trained, tmp_path / "fresh", task, result.checkpoint)
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == sorted(before)


def test_a_tuple_output_gives_its_first_item_as_the_loss_and_a_missing_one_says_why(
) -> None:
    task = digits_task(loss=None)
    assert own_loss(task, (torch.tensor(2.5), torch.zeros(3, 4))) == 2.5
    with pytest.raises(ValueError, match="although the batch has 'labels'"):
        own_loss(task, (torch.zeros(3, 4),), {"x": torch.zeros(3), "labels": torch.zeros(3)})
    with pytest.raises(ValueError, match="or labels in the batch"):
        own_loss(task, torch.zeros(3, 4), (torch.zeros(3), torch.zeros(3)))


def test_routine_skips_are_said_once_per_technique() -> None:
    from dione.cli.views import profile_lines
    from dione.profile.results import ProfileEvent

    printed: list[str] = []
    show = profile_lines()
    import dione.cli.views as views

    original = views.console.print
    views.console.print = lambda text, *a, **k: printed.append(str(text))  # type: ignore
    try:
        reason = ("the faster setting activation_checkpointing=False (its memory knobs off) "
                  "fits in memory, and "
                  "this one only trades speed for memory")
        for label in ("fsdp x2 a", "fsdp x2 b", "gpipe x2 c", "fsdp x1 d"):
            show(ProfileEvent("skipped", label, ("t",), reason=reason))
        show(ProfileEvent("skipped", "ddp x2", ("t",), reason="over the profiling budget"))
    finally:
        views.console.print = original  # type: ignore[method-assign]
    assert len(printed) == 3
    assert sum("only trade speed for memory" in line for line in printed) == 2
    assert "over the profiling budget" in printed[-1]
    # A notebook's next run says them no more (six lines at every call: review).
    said: set[str] = set()
    printed.clear()
    views.console.print = lambda text, *a, **k: printed.append(str(text))  # type: ignore
    try:
        for _ in range(2):
            show = profile_lines(said)
            show(ProfileEvent("skipped", "fsdp x2 a", ("t",), reason=reason))
    finally:
        views.console.print = original  # type: ignore[method-assign]
    assert len(printed) == 1 and said == {"fsdp"}


def test_the_hf_example_names_tasks_that_exist() -> None:
    from dione.spec.workload import load_workload

    example = Path(__file__).resolve().parent.parent / "examples" / "hf.py"
    names = {t.name for t in load_workload(example)}
    exported = [line.split()[3] for line in example.read_text().splitlines()
                if "dione export" in line]
    assert exported and set(exported) <= names


class _ReturnsTuple(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x)
        return nn.functional.cross_entropy(logits, y), logits


def test_a_model_returning_its_loss_first_in_a_tuple_trains(tmp_path: Path) -> None:
    from dione.launch import local_placement, run_slice
    from dione.spec.cluster import Node

    task = digits_task(steps=3, loss=None, model=_ReturnsTuple,
                       optimizer=functools.partial(torch.optim.Adam, lr=1e-2))
    result = run_slice(task, "single", tmp_path, local_placement(Node("n", 1, "cpu"), [0]))
    assert len(result.losses) == 3


ONE_TASK = """
import functools
import torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

workload = Workload([Task(name="one", model=functools.partial(digits_mlp, hidden=8, depth=1),
                          data=digits_train, loss=torch.nn.functional.cross_entropy,
                          optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=8,
                          steps=4, techniques=("single",))])
"""


def test_a_run_of_a_workload_file_by_the_python_api_can_be_exported_and_resumed(
        tmp_path: Path) -> None:
    """dione.run(path) wrote no run.json: dione.load, `dione export` and `dione resume`
    could not tell its workload."""
    from dione.cli.saved_run import load_saved_run

    file = tmp_path / "one.py"
    file.write_text(ONE_TASK)
    run_dir = tmp_path / "run"
    options = {"catalog": str(tmp_path / "catalog.sqlite"), "time_limit": 2.0,
               "trial": TrialOptions(warmup_steps=1, measure_steps=2)}
    result = dione.run(str(file), devices="cpu:1", run_dir=str(run_dir), quiet=True,
                       **options)
    assert [t.status for t in result.tasks] == ["done"]
    saved = load_saved_run(run_dir)  # what `dione resume` reads
    assert saved.workload == str(file.resolve()) and saved.devices == "cpu:1"
    assert saved.options.time_limit == 2.0
    model = dione.load(str(run_dir), "one")
    assert sum(p.numel() for p in model.parameters()) > 0
    other = tmp_path / "other.py"
    other.write_text(ONE_TASK)
    with pytest.raises(ValueError, match=f"holds a run of {file.resolve()}, not "):
        dione.run(str(other), devices="cpu:1", run_dir=str(run_dir), quiet=True, **options)


RETURNS_NOTHING = """
import functools, torch
from dione import Task, Workload, register
from dione.techniques.single import Single
from dione.zoo import digits_mlp, digits_train


class Forgetful(Single):
    name = "forgetful"

    def train(self, ctx):
        outcome = super().train(ctx)
        return None if ctx.task.name == "none" else \\
            type(outcome)(outcome.losses, outcome.step_seconds, None)


register(Forgetful())
workload = Workload([Task(name=name, model=functools.partial(digits_mlp, hidden=8, depth=1),
                          data=digits_train, loss=torch.nn.functional.cross_entropy,
                          optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                          batch_size=8, steps=2) for name in ("none", "unsaved")])
"""


def test_a_techniques_train_returning_what_no_slice_records_is_said_in_a_sentence(
        tmp_path: Path) -> None:
    """None gave "'NoneType' object has no attribute 'timings'"; no checkpoint gave a
    slice recorded done whose training was lost."""
    from dione.launch import local_placement, run_slice
    from dione.launch.slice import SliceError
    from dione.spec.cluster import Node
    from dione.spec.workload import load_workload
    from dione.techniques.registry import _REGISTRY

    file = tmp_path / "forgetful.py"
    file.write_text(RETURNS_NOTHING)
    try:
        none, unsaved = load_workload(file)
        placement = local_placement(Node("n", 1, "cpu"), [0])
        with pytest.raises(SliceError, match="its train\\(\\) returned NoneType, not a "
                           "SliceOutcome"):
            run_slice(none, "forgetful", tmp_path / "a", placement)
        with pytest.raises(SliceError, match="its train\\(\\) saved no checkpoint, so "
                           "the slice's training would be lost"):
            run_slice(unsaved, "forgetful", tmp_path / "b", placement)
    finally:  # the registry is the process's: no later test profiles it
        _REGISTRY.pop("forgetful", None)


def test_a_notebook_s_mistakes_and_a_raising_callback_leave_the_process_clean(
        tmp_path: Path) -> None:
    """An on_event that raised stopped the run, but the live page's thread went on
    rewriting a page that said the run was live for as long as the notebook lived; one
    task (not a list) failed deep inside ('Task' object is not iterable), a dict with an
    AttributeError, a misspelt option naming RunOptions.__init__ (review)."""
    import threading

    options = {"catalog": str(tmp_path / "catalog.sqlite"), "time_limit": 2.0,
               "trial": TrialOptions(warmup_steps=1, measure_steps=2)}
    task = digits_task(steps=6, techniques=("single",), evaluate=None,
                       hyperparameters={"lr": 0.01})
    with pytest.raises(TypeError, match=r"item 0 is a str; a dict's tasks are "
                       r"list\(d.values\(\)\)"):
        dione.run({"a": task}, devices="cpu:1", run_dir=str(tmp_path / "x"), **options)
    with pytest.raises(TypeError, match=r"unknown option\(s\) 'slice_step' \(did you mean "
                       r"'slice_steps'\?\)"):
        dione.run(task, devices="cpu:1", run_dir=str(tmp_path / "x"), slice_step=3)
    with pytest.raises(TypeError, match="quiet must be True or False"):
        dione.run(task, devices="cpu:1", run_dir=str(tmp_path / "x"), quiet="no")
    # In this call's words, not the command line's (--devices, --out).
    from dione.orchestrate.options import RunDirError
    from dione.spec import ClusterError

    with pytest.raises(ClusterError, match=r"^devices=") as bad:
        dione.run(task, devices="cpu:4096", run_dir=str(tmp_path / "x"), **options)
    assert "--devices" not in str(bad.value)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match=r"\(run_dir=\)") as bad:
        dione.run(task, devices="cpu:1", run_dir=str(tmp_path / "mine"), quiet=True,
                  **options)
    assert "--out" not in str(bad.value)

    def stop(event: Any) -> None:
        if event.kind == "slice_finished":
            raise RuntimeError("my callback")

    with pytest.raises(RuntimeError, match="my callback"):
        dione.run(task, devices="cpu:1", run_dir=str(tmp_path / "run"), quiet=True,
                  on_event=stop, slice_steps=2, **options)  # one task, not a list
    assert "dione-live-report" not in [t.name for t in threading.enumerate()]
    page = (tmp_path / "run" / "report" / "index.html").read_text()
    assert "location.reload" not in page  # a stopped run's page, not a live one
    result = dione.run(task, devices="cpu:1", run_dir=str(tmp_path / "run"), quiet=True,
                       slice_steps=2, **options)
    assert result.tasks[0].status == "done" and isinstance(result, dione.RunResult)
    # A results table's columns without parsing names; a path a notebook's chdir keeps.
    assert result.tasks[0].hyperparameters == {"lr": 0.01} and result.run_dir.is_absolute()


def test_loading_from_a_run_that_has_not_got_there_yet_says_so(tmp_path: Path) -> None:
    """dione.load polled while a run starts said "its tasks: none" (read as a wrong
    name) and "no checkpoint on disk"; a file or a folder of runs given as the run
    directory read as missing, or as a run without run.json (review)."""
    from dione.orchestrate.run import RunResult, TaskResult
    from dione.state.export import ExportError, trained_checkpoint, workload_of_task
    from dione.state.store import RunStore

    run = tmp_path / "run"
    with RunStore(run):
        pass
    with pytest.raises(ExportError, match=r"its tasks: none yet \(a run records its tasks "
                       "once it has profiled them"):
        trained_checkpoint(run, "t", latest=True)
    with RunStore(run) as store:
        store.register_task("t", 10, 4)
    with pytest.raises(ExportError, match="has no checkpoint yet: none of its slices has "
                       "ended"):
        trained_checkpoint(run, "t", latest=True)
    (tmp_path / "file.py").write_text("")
    with pytest.raises(ExportError, match=r"file\.py is a file, not a folder"):
        workload_of_task(tmp_path / "file.py", "t")
    with pytest.raises(ExportError, match="is not a dione run directory"):
        workload_of_task(tmp_path, "t")
    with pytest.raises(KeyError, match="the run has no task 'u'; its tasks: t"):
        RunResult(run, [TaskResult("t", "done")], 0.0, 0.0, 0, 0.0).task("u")


def test_a_workload_is_checked_from_python_as_dione_validate_checks_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A notebook had no way to check a sweep without training it (review): validate
    returns what `dione validate` prints, problems with their task and field."""
    from dione.spec.stopping import Patience

    found = dione.validate([digits_task("good", steps=4),
                            digits_task("bad", steps=4, batch_size=0),
                            digits_task("idle", steps=4, stopping=Patience(patience=9))],
                           devices="cpu:2")
    assert not found.ok and found.tasks == ["good", "idle"]
    assert [(p.task, p.field) for p in found.problems] == [("bad", "batch_size")]
    assert any("idle" in names for names in found.warnings.values())
    assert any(line.startswith("warning: idle: it judges at") for line in found.lines())
    assert found.lines()[0] == "problem: task 'bad', field 'batch_size': must be a positive " \
        "integer, not 0"  # printed, an invalid workload's lines said nothing of it
    with pytest.raises(TypeError, match="item 0 is a str"):
        dione.validate({"a": digits_task("a")})  # type: ignore[arg-type]
    # In this call's words, not the command line's (a notebook review).
    with pytest.raises(ValueError, match=r"^devices=cpu:999: "):
        dione.validate([digits_task("a")], devices="cpu:999")
    # A technique of the user's whose knob_settings raises is said, as profiling says
    # it, not a crash of the whole check (another test's left in the registry did so).
    from dione.techniques.ddp import DDP
    from dione.techniques.registry import _REGISTRY

    class Broken(DDP):
        name = "broken-ddp"

        def check(self, task: Any, devices: int, knobs: Any, kind: Any) -> list[str]:
            raise ValueError("no settings today")

    dione.register(Broken())
    try:
        found = dione.validate([digits_task("good", steps=4)], devices="cpu:2")
    finally:
        _REGISTRY.pop("broken-ddp", None)
    assert found.ok and any(
        technique == "broken-ddp" and "knob_settings or check raised ValueError: no settings "
        "today" in why for technique, why in found.refused)


OWN_DDP = """
import functools, torch
from dione import Task, Workload, register
from dione.techniques.ddp import DDP


class Quiet(DDP):
    '''A data-parallel loop of the user's that says nothing of how it trained.'''
    name = "quiet-ddp"

    def train(self, ctx):
        outcome = super().train(ctx)
        outcome.extra.pop("exactness", None)
        return outcome


class Plain(DDP):
    '''A built-in's loop under a name of the user's: it says how it trained itself.'''
    name = "plain-ddp"


register(Quiet())
register(Plain())
workload = Workload([Task(name="dropped", model=lambda: torch.nn.Sequential(
    torch.nn.Linear(64, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 10)),
    data=__import__("dione.zoo", fromlist=["digits_train"]).digits_train,
    loss=torch.nn.functional.cross_entropy, optimizer=functools.partial(torch.optim.SGD,
                                                                        lr=0.1),
    batch_size=8, steps=2)])
"""


def test_a_users_technique_is_labelled_keyed_and_reloaded_as_its_own(tmp_path: Path) -> None:
    """A review's technique of its own: a loop that said nothing of dropout was recorded
    exact (built-in ddp says statistical); the catalog keyed its trials by name alone
    (an edited technique, or one registered as a built-in's name, was served other
    trials); and its workload file, edited, could not be loaded again in the process."""
    from dione.launch import local_placement, run_slice
    from dione.profile.fingerprint import technique_identity
    from dione.spec.cluster import Node
    from dione.spec.workload import load_workload
    from dione.techniques.registry import _REGISTRY, get_technique

    file = tmp_path / "own.py"
    file.write_text(OWN_DDP)
    try:
        [task] = load_workload(file)
        mine = get_technique("quiet-ddp")
        before = technique_identity(mine)
        assert technique_identity(get_technique("ddp")) == "ddp"  # catalogs keep their keys
        assert before.startswith("quiet-ddp (workload own.py.Quiet, ")
        result = run_slice(task, "quiet-ddp", tmp_path / "run",
                           local_placement(Node("n", 2, "cpu"), [0, 1]))
        assert result.extra["exactness"].startswith(
            "statistical, not bitwise: dropout in module '1'")
        # A built-in's loop kept (a subclass that does not write its own): its word
        # stands, not dione's guess (the review's own-generator data read statistical).
        plain = run_slice(dataclasses.replace(task, model=digits_task().model,
                                              stateful_items=True), "plain-ddp",
                          tmp_path / "plain", local_placement(Node("n", 1, "cpu"), [0]),
                          knobs={"accumulation": 2})
        assert "exactness" not in plain.extra
        file.write_text(OWN_DDP + "\n# edited: a comment, not the technique\n")
        load_workload(file)  # it raised "a technique named 'quiet-ddp' is registered"
        assert get_technique("quiet-ddp") is not mine
        assert technique_identity(get_technique("quiet-ddp")) == before  # trials kept
        file.write_text(OWN_DDP.replace("outcome.extra.pop", "outcome.extra.pop  # !\n"
                                        "        outcome.extra.pop"))
        load_workload(file)
        assert technique_identity(get_technique("quiet-ddp")) != before  # timed anew
    finally:  # the registry is the process's: no later test profiles it
        _REGISTRY.pop("quiet-ddp", None)
        _REGISTRY.pop("plain-ddp", None)


DRAWS_AFTER_A_RUN = """
import random, sys, numpy, torch
import dione
from helpers import digits_task

random.seed(3); torch.manual_seed(3); numpy.random.seed(3)
expected = (random.random(), torch.rand(1).item(), numpy.random.rand())
random.seed(3); torch.manual_seed(3); numpy.random.seed(3)
dione.run([digits_task("t", steps=2)], devices="cpu:1", run_dir=sys.argv[1], quiet=True,
          catalog=sys.argv[2])
print((random.random(), torch.rand(1).item(), numpy.random.rand()) == expected)
"""


def test_a_run_leaves_a_notebooks_generators_as_they_were(tmp_path: Path) -> None:
    """A notebook's draws after dione.run went on from elsewhere: validation seeded
    torch's generator, and the first run's imports drew from Python's (a review). A
    process of its own: the imports' draw comes once a process."""
    done = subprocess.run(
        [sys.executable, "-c", DRAWS_AFTER_A_RUN, str(tmp_path / "run"),
         str(tmp_path / "catalog.sqlite")], capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True", done.stdout + done.stderr


ACTIVATION = nn.ReLU  # a workload's global its model reads: a notebook edits it


def _activated_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), ACTIVATION(), nn.Linear(16, 10))


def test_a_model_edited_since_its_run_is_said_on_load_and_refused_by_evaluate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ReLU made a Tanh after the run: dione.load gave the ReLU-trained weights in the
    Tanh model, unsaid, and `dione evaluate` recorded the edited model's figures as the
    run's, on its leaderboards (a review)."""
    from dione.orchestrate.evaluate_again import evaluate_again
    from dione.zoo import digits_accuracy

    task = digits_task("act", steps=4, techniques=("single",), model=_activated_model,
                       evaluate=digits_accuracy)
    run = tmp_path / "run"
    dione.run([task], devices="cpu:1", run_dir=str(run), quiet=True,
              catalog=str(tmp_path / "catalog.sqlite"),
              trial=TrialOptions(warmup_steps=1, measure_steps=2))
    with RunStore(run) as store:
        before = store.evaluations("act")
    monkeypatch.setattr(sys.modules[__name__], "ACTIVATION", nn.Tanh)
    with pytest.warns(UserWarning, match="task 'act''s model is not the one the run trained"):
        dione.load(run, "act", workload=[task])
    [outcome] = evaluate_again(run, [task])
    assert outcome.error and "is not the one the run trained" in outcome.error
    with RunStore(run) as store:
        assert store.evaluations("act") == before
    monkeypatch.setattr(sys.modules[__name__], "ACTIVATION", nn.ReLU)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dione.load(run, "act", workload=[task])  # as it was: nothing said
