"""The workload spec: tasks, grids, workload files, and validation of every field."""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dione.spec import (
    ClusterError,
    Task,
    Workload,
    WorkloadFileError,
    grid,
    load_workload,
    local_cluster,
    parse_devices,
    split_valid,
    validate_workload,
)
from dione.techniques import technique_names
from dione.zoo import digits_mlp, digits_train
from helpers import digits_task


def problems_of(*tasks: Task, devices: int | None = None) -> list[tuple[str | None, str]]:
    found = validate_workload(Workload(tasks), devices, technique_names())
    return [(p.task, p.field) for p in found]


def test_a_valid_workload_has_no_problems() -> None:
    assert problems_of(digits_task("a"), digits_task("b"), devices=2) == []


def test_grid_names_each_point_and_keeps_its_hyperparameters() -> None:
    def build(lr: float, batch_size: int) -> Task:
        return digits_task(batch_size=batch_size,
                           optimizer=functools.partial(torch.optim.SGD, lr=lr))

    tasks = grid("sweep", build, lr=[1e-3, 0.01], batch_size=[32, 64])
    assert [t.name for t in tasks] == [
        "sweep-lr0.001-batch_size32", "sweep-lr0.001-batch_size64",
        "sweep-lr0.01-batch_size32", "sweep-lr0.01-batch_size64"]
    assert tasks[1].hyperparameters == {"lr": 1e-3, "batch_size": 64}
    assert tasks[2].optimizer.keywords == {"lr": 0.01}
    with pytest.raises(ValueError, match="axis 'lr' must be a non-empty list"):
        grid("sweep", build, lr=[])
    # Values six significant digits cannot tell apart still get names of their own.
    close = grid("close", build, lr=[1e-3, 1.0000001e-3, 3 * 1e-4], batch_size=[32])
    assert [t.name for t in close] == ["close-lr0.001-batch_size32",
                                       "close-lr0.0010000001-batch_size32",
                                       "close-lr0.0003-batch_size32"]  # as it always was
    # Tuples, classes and text a name cannot hold read as names validation takes (the
    # grid's own names were refused, blaming a field the user never wrote).
    def odd(betas: tuple[float, float], act: type, note: str) -> Task:
        return digits_task(optimizer=functools.partial(torch.optim.Adam, betas=betas))

    tasks = grid("g", odd, betas=[(0.9, 0.99)], act=[torch.nn.ReLU, torch.nn.GELU],
                 note=["a b", "a/b"])
    assert [t.name for t in tasks] == ["g-betas0.9_0.99-actReLU-notea_b-1",
                                       "g-betas0.9_0.99-actReLU-notea_b-2",
                                       "g-betas0.9_0.99-actGELU-notea_b-1",
                                       "g-betas0.9_0.99-actGELU-notea_b-2"]
    assert tasks[2].hyperparameters["act"] is torch.nn.GELU
    assert validate_workload(Workload(tasks), None, technique_names()) == []
    # Numbered until none reads alike; a partial by what it holds, an object without
    # its address (a name must read the same on resume); a long one cut to 100.
    tags = grid("r", odd, betas=[(0.9, 0.99)], act=[torch.nn.ReLU],
                note=["x y", "x_y", "x_y-1", functools.partial(max, 1, key=abs), object(),
                      "z" * 120])
    names = [t.name for t in tags]
    assert len(set(names)) == len(names) and max(map(len, names)) == 100
    assert "r-betas0.9_0.99-actReLU-notemax_1_key=abs" in names
    assert "r-betas0.9_0.99-actReLU-noteobject_object" in names
    assert validate_workload(Workload(tags), None, technique_names()) == []


def test_every_problem_is_reported_at_once_with_task_and_field() -> None:
    lock = threading.Lock()

    def broken_model() -> torch.nn.Module:
        raise RuntimeError("out of ideas")

    tasks = [
        digits_task("dup"),
        digits_task("dup"),
        digits_task("odd-batch", batch_size=10, techniques=("fsdp",)),
        digits_task("unpicklable", data=lambda: (lock, digits_task().data())[1]),
        digits_task("raising-model", model=broken_model),
        digits_task("no-length", steps=None),
        digits_task("bad name!"),
        digits_task("unknown-technique", techniques=("zero3",)),
        digits_task("bad-split", split_points=("nowhere",)),
        digits_task("huge-batch", batch_size=4000),
        digits_task("bool-steps", steps=True),  # an int to Python, "steps 0-True" to a run
        # Said in NumPy's words, as the loss's ("Seed must be between 0 and 2**32 - 1").
        digits_task("negative-seed", seed=-1),
    ]
    found = problems_of(*tasks, devices=4)
    assert ("dup", "name") in found
    assert ("odd-batch", "batch_size") in found
    assert ("unpicklable", "data") in found
    assert ("raising-model", "model") in found
    assert ("no-length", "steps") in found
    assert ("bad name!", "name") in found
    assert ("unknown-technique", "techniques") in found
    assert ("bad-split", "split_points") in found
    assert ("huge-batch", "data") in found
    assert ("bool-steps", "steps") in found
    assert ("negative-seed", "seed") in found
    assert len(found) == 11  # the two "dup" tasks share one problem


def test_misspelt_task_fields_are_named_together_with_the_likely_field() -> None:
    """Python's own error named the first unknown keyword only: a misspelt allow_inexact
    (the opt-in itself) went unsaid behind a misspelt steps."""
    with pytest.raises(TypeError) as caught:
        Task(name="t", model=digits_mlp, data=digits_train, optimizer=torch.optim.SGD,
             batch_size=4, step=4, allow_inexcat=True, colour="red")
    said = str(caught.value)
    assert said.startswith("Task(name='t') got 3 unknown field(s): 'step' (did you mean "
                           "'steps'?), "
                           "'allow_inexcat' (did you mean 'allow_inexact'?), 'colour';")
    assert "its fields: name, model, data, optimizer, batch_size," in said
    assert "refused_techniques" not in said
    # A peer tool's keyword (Ray Tune's, Optuna's, a trainer's) with dione's for it; the
    # stopping rules too (they said Python's "unexpected keyword argument" alone).
    from dione import Median, PausingAsha

    with pytest.raises(TypeError) as caught:
        Task(name="t", model=digits_mlp, data=digits_train, optimizer=torch.optim.SGD,
             batch_size=4, steps=4, lr=0.1)
    assert "'lr' (use optimizer=functools.partial(torch.optim.AdamW, lr=...))" in str(
        caught.value)
    with pytest.raises(TypeError) as caught:
        PausingAsha(metric="accuracy", grace_period=2, reduction_factor=3, mdoe="max")
    assert str(caught.value) == (
        "PausingAsha got 3 unknown field(s): 'grace_period' (use min_steps: Ray Tune's "
        "grace_period), 'reduction_factor' (use eta: Ray Tune's and Optuna's "
        "reduction_factor), 'mdoe' (did you mean 'mode'?); its fields: metric, mode, "
        "min_steps, eta, loss_window")
    with pytest.raises(TypeError, match="'n_warmup_steps' \\(use min_steps: Optuna's"):
        Median(n_warmup_steps=2)



def test_a_workload_file_that_raises_while_loading_says_its_line_and_the_task_once(
        tmp_path: Path) -> None:
    """A misspelt field said no task and no line, and the message twice around dione's
    own frames (a review)."""
    from dione.spec.workload import WorkloadFileError, load_workload

    file = tmp_path / "typo.py"
    file.write_text("import torch\nfrom dione import Task, Workload\n"
                    "from dione.zoo import digits_mlp, digits_train\n"
                    "workload = Workload([Task(name='b', model=digits_mlp, data=digits_train,\n"
                    "    optimizer=torch.optim.SGD, batch_size=4, step=4)])\n")
    with pytest.raises(WorkloadFileError) as caught:
        load_workload(file)
    said = str(caught.value)
    assert said.startswith(f"{file}:4: raised TypeError while loading: Task(name='b') got 1 "
                           "unknown field(s): 'step' (did you mean 'steps'?)"), said
    assert said.count("unknown field") == 1 and "keywords.py" not in said, said
    assert f'File "{file}", line 4, in <module>' in said, said


def test_messages_say_what_to_do() -> None:
    def broken_model() -> torch.nn.Module:
        raise RuntimeError("out of ideas")

    messages = [str(p) for p in validate_workload(Workload([
        digits_task("odd", batch_size=10, techniques=("fsdp",)),
        digits_task("single-too", batch_size=10),
        digits_task("ddp-or-pipeline", batch_size=10, techniques=("ddp", "gpipe")),
        digits_task("raising", model=broken_model)]), devices=4)]
    assert any("task 'odd', field 'batch_size': 10 is not divisible by the 4 devices" in m
               and "use a multiple of 4" in m and "allow single, ddp" in m for m in messages)
    # Allowed single, the plan trains it on fewer devices (as `dione run` does); allowed
    # ddp or a pipeline, on fewer devices or as micro-batches that divide the batch.
    assert not any("single-too" in m or "ddp-or-pipeline" in m for m in messages)
    assert any("task 'raising', field 'model': the model factory raised RuntimeError: out of "
               "ideas" in m for m in messages)


def test_a_model_factory_that_does_not_return_is_said_with_its_task(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One task's model() that hung (a download, a lock) held up validation, and so the
    whole run, silent (a review): it is said, naming the task, while validation waits
    (it is not stopped: a thread loses what only the main thread has, an alarm misses
    waits in C code: two regression reviews), on the thread that called it."""
    import warnings

    from dione.spec import waiting

    monkeypatch.setattr(waiting, "SAID_SECONDS", 0.2)
    threads = []

    def slow() -> torch.nn.Module:
        threads.append(threading.current_thread())
        time.sleep(1.0)
        return torch.nn.Linear(64, 10)

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        problems = validate_workload(Workload([digits_task("slow", model=slow),
                                               digits_task("fine")]))
    assert problems == []
    assert threads and all(t is threading.main_thread() for t in threads)
    assert [str(w.message) for w in said] == [
        "task 'slow': its model() has not returned in 0 s (a download? a lock?); "
        "validation waits for it: Ctrl-C stops the command, then fix it or leave the task "
        "out"]


def test_a_workload_item_that_is_not_a_task_is_named_at_once() -> None:
    """None among the tasks (a builder without its return) crashed validation deep
    inside ('NoneType' object has no attribute 'name'), exit 1 (a review)."""
    with pytest.raises(TypeError, match=r"item 2 of the workload's tasks is NoneType, not a "
                       r"dione.Task \(does a function that builds a task lack its `return`"):
        Workload([digits_task("a"), None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="item 1 of the workload's tasks is str"):
        Workload(["a"])  # type: ignore[list-item]


def test_the_common_pytorch_mistakes_are_named_with_their_fix() -> None:
    """A module instance for the model factory was called (its forward ran without an
    input); a DataLoader or a generator for the dataset failed at indexing or len()."""
    from torch.utils.data import DataLoader, WeightedRandomSampler

    from dione.zoo import digits_mlp, digits_train

    def weighted():  # a recipe's balanced sampling: its loader is refused, and its sampler
        data = digits_train()
        return DataLoader(data, batch_size=8,
                          sampler=WeightedRandomSampler([1.0] * len(data), len(data)))

    messages = " ".join(str(p) for p in validate_workload(Workload([
        digits_task("instance", model=digits_mlp()),
        digits_task("loader", data=lambda: DataLoader(digits_train(), batch_size=8)),
        digits_task("weighted", data=weighted),
        digits_task("generator", data=lambda: (x for x in digits_train())),
        digits_task("no-loss", loss=None)])))
    assert "task 'instance', field 'model': is a Sequential instance; give the function " \
        "or class that builds it" in messages
    assert "task 'loader', field 'data': returned a DataLoader; give a function returning " \
        "a map-style dataset" in messages
    assert "task 'generator', field 'data': returned a generator" in messages
    assert messages.count("its sampler goes too") == 1
    assert "not a DataLoader or an iterator; its sampler goes too (dione draws each epoch's " \
        "order from the task's seed): draw a weighted or balanced selection into the data " \
        "set itself" in messages
    # A loss left out reads as a loss left out, not as the data's problem.
    assert "task 'no-loss', field 'loss': none given, so the model gets the whole batch" \
        in messages and "give the task a loss=" in messages


def _detached_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output.detach(), target)


def _masked_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A tagging loss's guard: zero for a batch with no labelled item."""
    kept = target != -100
    if not kept.any():
        return torch.zeros(())
    return torch.nn.functional.cross_entropy(output[kept], target[kept])


def _first_two_unlabelled() -> torch.utils.data.TensorDataset:
    x, y = digits_train().tensors
    y = y.clone()
    y[:2] = -100
    return torch.utils.data.TensorDataset(x, y)


class _MyLoss(torch.nn.Module):
    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(output, target)


def test_the_next_common_mistakes_are_named_with_their_fix() -> None:
    """Each of these was said without its fix, or of another field, or passed (a
    review): an optimizer made already, or named; a data set made already; a loss class
    not made; a loss no gradient flows back from (it failed every trial as "no
    configuration fits"); a float64 model on float32 data (said of the data)."""
    made = torch.optim.Adam(digits_mlp().parameters(), lr=1e-3)
    messages = " ".join(str(p) for p in validate_workload(Workload([
        digits_task("made", optimizer=made),  # type: ignore[arg-type]
        digits_task("named", optimizer="adam"),  # type: ignore[arg-type]
        digits_task("data-made", data=digits_train()),  # type: ignore[arg-type]
        digits_task("class", loss=torch.nn.CrossEntropyLoss),  # type: ignore[arg-type]
        digits_task("detached", loss=_detached_loss),
        digits_task("double", model=lambda: digits_mlp().double())])))
    assert "task 'made', field 'optimizer': must be callable, not Adam: an optimizer made " \
        "already holds one model's parameters" in messages
    assert "optimizer=functools.partial(torch.optim.Adam, lr=1e-3)), not its name" in messages
    assert "task 'data-made', field 'data': must be callable, not TensorDataset: give the " \
        "function that builds the data set" in messages
    assert "task 'class', field 'loss': is the class CrossEntropyLoss, called with the " \
        "output and target as its settings; give an instance " \
        "(loss=torch.nn.CrossEntropyLoss())" in messages
    assert "task 'detached', field 'loss': it follows the model's output, but no " \
        "gradient flows back through it" in messages
    assert "task 'double', field 'model': its parameters are float64 and the batch's " \
        "inputs float32: build the model in float32" in messages
    # What the regression review of these found: a masked loss whose first two items
    # hold no label (its guard's zero) refused; a width error said as the dtypes'; float64
    # data (numpy's) on a float32 model told to make the model float64; a user's loss
    # class named as torch's.
    wide = torch.utils.data.TensorDataset(torch.randn(64, 65, dtype=torch.float64),
                                          torch.zeros(64, dtype=torch.long))
    numpy_made = torch.utils.data.TensorDataset(torch.randn(64, 64, dtype=torch.float64),
                                                torch.zeros(64, dtype=torch.long))
    problems = validate_workload(Workload([
        digits_task("masked", data=_first_two_unlabelled, loss=_masked_loss,
                    techniques=("single",)),
        digits_task("wide", model=lambda: digits_mlp().double(), data=lambda: wide),
        digits_task("numpy", data=lambda: numpy_made),
        digits_task("mine", loss=_MyLoss)]))  # type: ignore[arg-type]
    said = {p.task: str(p) for p in problems}
    assert "masked" not in said, said
    assert "task 'wide', field 'data': the model cannot take a batch" in said["wide"], said
    assert "task 'numpy', field 'data': its inputs are float64 and the model's parameters " \
        "float32: give the data as float32 (numpy makes float64" in said["numpy"], said
    assert "give an instance (loss=_MyLoss())" in said["mine"], said


def test_a_bad_task_does_not_stop_the_others() -> None:
    good, bad = digits_task("good"), digits_task("bad", steps=-1)
    valid, problems = split_valid(Workload([good, bad]), None, technique_names())
    assert [t.name for t in valid] == ["good"]
    assert [(p.task, p.field) for p in problems] == [("bad", "steps")]
    # A name that is no string, and hyperparameters that are no dict, were refused but
    # kept among the valid tasks: the plan's sort, or the store, then crashed the run.
    numbered = replace(digits_task("x"), name=123)
    listed = replace(digits_task("listed"), hyperparameters=[1, 2])
    valid, problems = split_valid(Workload([good, numbered, listed]), None, technique_names())
    assert [t.name for t in valid] == ["good"]
    assert [(p.task, p.field) for p in problems] == [("123", "name"),
                                                     ("listed", "hyperparameters")]


def test_epochs_become_steps() -> None:
    task = digits_task(steps=None, epochs=2.0, batch_size=16)
    assert task.total_steps(1437) == 180  # ceil(2 * 1437 / 16)


def test_workload_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.py"
    with pytest.raises(WorkloadFileError, match="does not exist"):
        load_workload(missing)
    syntax = tmp_path / "syntax.py"
    syntax.write_text("workload = [\n  1 +\n")
    with pytest.raises(WorkloadFileError, match=r"syntax.py:\d+: syntax error"):
        load_workload(syntax)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(WorkloadFileError, match="defines no `workload`"):
        load_workload(empty)
    wrong = tmp_path / "wrong.py"
    wrong.write_text("workload = 42\n")
    with pytest.raises(WorkloadFileError, match="`workload` is a int"):
        load_workload(wrong)
    raising = tmp_path / "raising.py"
    raising.write_text("import nonexistent_module_xyz\n")
    with pytest.raises(WorkloadFileError, match="raised ModuleNotFoundError"):
        load_workload(raising)


def test_workload_file_lambdas_travel_by_value(tmp_path: Path) -> None:
    import cloudpickle

    file = tmp_path / "lambdas.py"
    file.write_text(
        "import torch\nfrom dione import Task, Workload\n"
        "workload = Workload([Task(name='t', model=lambda: torch.nn.Linear(2, 2),"
        " data=lambda: [(torch.zeros(2), torch.zeros(2))] * 4, loss=torch.nn.functional.mse_loss,"
        " optimizer=lambda p: torch.optim.SGD(p, lr=0.1), batch_size=2, steps=1)])\n")
    task = load_workload(file).task("t")
    copy = cloudpickle.loads(cloudpickle.dumps(task))
    assert isinstance(copy.model(), torch.nn.Linear)
    assert problems_of(task) == []


def test_devices_syntax() -> None:
    assert parse_devices("cpu:4") == ("cpu", 4)
    assert parse_devices(" cuda:2 ") == ("cuda", 2)
    for bad in ("gpu:2", "four", "cpu:"):
        with pytest.raises(ClusterError, match=r"write e\.g\. 'cpu:4'"):
            parse_devices(bad)
    with pytest.raises(ClusterError, match=r"the device count must be at least 1$"):
        parse_devices("cpu:0")
    # torch's cuda:0 is a device's index; here it counts them (it read "at least 1" only).
    with pytest.raises(ClusterError, match=r"at least 1; it is a number of devices, not an "
                       r"index: cuda:1 is one GPU"):
        parse_devices("cuda:0")
    cluster = local_cluster("cpu:3")
    assert [(n.kind, n.devices) for n in cluster] == [("cpu", 3)]


def test_a_scheduler_that_cannot_be_built_is_a_problem_of_its_field() -> None:
    no_step_size = functools.partial(torch.optim.lr_scheduler.StepLR)
    good = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=10)
    messages = [str(p) for p in validate_workload(Workload([
        digits_task("broken", lr_scheduler=no_step_size),
        # Stepped by a metric: every trial crashed in step() (validation passed it).
        digits_task("plateau", lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau),
        digits_task("fine", lr_scheduler=good),
        # Sized for fewer steps than the task trains: raised at step 5 of 12 (a review).
        digits_task("short", lr_scheduler=functools.partial(
            torch.optim.lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=4)),
        digits_task("long-enough", lr_scheduler=functools.partial(
            torch.optim.lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=12))]),
        None, technique_names())]
    assert len(messages) == 3
    assert "task 'short', field 'lr_scheduler': OneCycleLR is built for 4 steps, but the " \
        "task trains 12: its step 5 would raise; build it with total_steps=12" in messages[2]
    assert "task 'broken', field 'lr_scheduler': the scheduler factory raised TypeError" in (
        messages[0]) and "step_size=10" in messages[0]
    assert "task 'plateau', field 'lr_scheduler': ReduceLROnPlateau.step() needs metrics" in (
        messages[1]) and "once after every optimizer step" in messages[1]


class _MaskedLinear(torch.nn.Module):
    """A model whose construction reads a tensor's value (impossible on the meta device)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 10)
        self.keep = int((self.linear.weight.abs() > 0).sum().item())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def test_a_model_validation_accepts_can_be_fingerprinted() -> None:
    """Both build it on the meta device, and fall back to the CPU alike."""
    from dione.profile.fingerprint import speed_signature

    task = digits_task("masked", model=_MaskedLinear)
    assert problems_of(task) == []
    assert speed_signature(task)["parameters"] == [["linear.weight", [10, 64], "torch.float32"],
                                                   ["linear.bias", [10], "torch.float32"]]


def test_validation_leaves_the_processs_exception_hook_as_it_was() -> None:
    """Its one-process gloo group installs torch's hook ("[rank0]: " on every line of a
    later traceback); the command's own errors must print as they are."""
    import sys

    hook = sys.excepthook
    assert problems_of(digits_task("a")) == []
    assert sys.excepthook is hook


def test_tasks_alike_share_a_key() -> None:
    """What lets validation try a sweep's model once: partials of one function with equal
    arguments are the same factory; anything else (a lambda per task, a namedtuple of
    another type) is not; a value that cannot be described shares nothing."""
    from collections import namedtuple

    from dione.spec.sameness import task_key

    def sweep(**extra: object) -> Task:
        return digits_task(**{"optimizer": functools.partial(torch.optim.SGD, lr=0.1),
                              **extra})

    fields = ("model", "data", "batch_size", "optimizer")
    at = {lr: sweep(optimizer=functools.partial(torch.optim.SGD, lr=lr)) for lr in (0.1, 0.2)}
    assert task_key(at[0.1], fields) != task_key(at[0.2], fields)
    assert task_key(at[0.1], fields) == task_key(sweep(), fields)  # a new partial, equal
    assert task_key(sweep(batch_size=32), fields) != task_key(sweep(), fields)
    one, other = (sweep(model=lambda: torch.nn.Linear(64, 10)) for _ in range(2))
    assert task_key(one, fields) == task_key(one, fields) != task_key(other, fields)
    first, second = namedtuple("First", "a"), namedtuple("Second", "a")
    assert task_key(sweep(model=functools.partial(torch.nn.Linear, first(1))), fields) != \
        task_key(sweep(model=functools.partial(torch.nn.Linear, second(1))), fields)
    looped: dict[str, object] = {}
    looped["self"] = looped
    held = sweep(model=functools.partial(torch.nn.Linear, looped))
    assert task_key(held, fields) == ("unkeyed", id(held))


def test_a_task_name_is_a_folder_name_and_nothing_more() -> None:
    """It names the task's folders: a trailing newline passed the pattern's "$" (review)."""
    assert validate_workload([digits_task("ok-name_1.2=3+4")]) == []
    for bad in ("a\n", "ünï", "a/b", "../x", ".hidden", "x" * 101, "a b"):
        said = " ".join(str(p) for p in validate_workload([digits_task(bad)]))
        assert "must be 1-100 ASCII letters, digits or ._=+-" in said, (bad, said)


class _Centred(torch.nn.Module):
    """A model whose output for a sample depends on its batch: it subtracts the batch's
    mean (in eval mode too, unlike BatchNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        return out - out.mean(0, keepdim=True)


def _spread_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the outputs less their batch's mean: the loss, not the model,
    ties a sample to its batch."""
    return torch.nn.functional.cross_entropy(output - output.mean(0, keepdim=True), target)


def _digits_by_label() -> torch.utils.data.TensorDataset:
    """The digits sorted by label, as a folder of images per class lists them."""
    data = digits_train()
    x = torch.stack([data[i][0] for i in range(len(data))])
    y = torch.tensor([int(data[i][1]) for i in range(len(data))])
    order = torch.argsort(y, stable=True)
    return torch.utils.data.TensorDataset(x[order], y[order])


def _class_weighted(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    weight = torch.arange(1.0, 11.0, device=output.device)
    return torch.nn.functional.cross_entropy(output, target, weight=weight)


def _tags_longest_first() -> torch.utils.data.TensorDataset:
    """Token tags padded with -100, sorted longest first (length-bucketed text): the
    first samples carry no padding."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 20, (64, 12), generator=generator)
    y = x % 3
    for i, length in enumerate(torch.linspace(12, 2, 64).long().tolist()):
        x[i, length:], y[i, length:] = 0, -100
    return torch.utils.data.TensorDataset(x, y)


class _Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(20, 8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.embedding(x))


def _token_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output.reshape(-1, 3), target.reshape(-1))


def test_a_loss_is_checked_on_samples_spread_over_a_sorted_data_set() -> None:
    """The loss was checked on a data set's first four samples: sorted by class, they
    were alike, and a class-weighted loss (a mean over weights, not samples) passed to
    train differently under ddp and accumulation, recorded exact; sorted longest first,
    none was padded, and a token loss on -100 padding passed, counted by samples
    (review). Samples spread over the data set see both."""
    from dione.spec.validate import check_task

    weighted = digits_task("weighted", data=_digits_by_label, loss=_class_weighted)
    (problem,) = check_task(weighted, 2, kind="cpu")
    assert problem.field == "loss" and "do not combine to the whole batch's loss" in \
        problem.message, problem
    tagged = digits_task("tagged", model=_Tagger, data=_tags_longest_first,
                         loss=_token_cross_entropy)
    (problem,) = check_task(tagged, 2, kind="cpu")
    assert problem.field == "loss_items" and "its targets hold -100" in problem.message
    # Plain cross-entropy on the sorted digits is a mean over samples: it passes.
    assert check_task(digits_task("plain", data=_digits_by_label), 2, kind="cpu") == []


def test_a_batch_tied_model_is_named_as_the_model_and_a_batch_tied_loss_as_the_loss() -> None:
    """A model that couples a sample to its batch was refused as "field 'loss'", its fix
    loss_items, which cannot mend a model (review)."""
    from dione.spec.validate import check_task

    centred = digits_task("centred", model=_Centred)
    (problem,) = check_task(centred, 2, kind="cpu")
    assert problem.field == "model" and "its output for a sample depends on the other " \
        "samples of its batch" in problem.message and "techniques=('single',)" in \
        problem.message, problem
    spread = digits_task("spread", loss=_spread_loss)
    (problem,) = check_task(spread, 2, kind="cpu")
    assert problem.field == "loss" and "do not combine to the whole batch's loss" in \
        problem.message, problem
    assert check_task(replace(centred, techniques=("single",)), 2, kind="cpu") == []
    # Dropout makes two forwards differ in training mode: compared in eval mode, a summed
    # loss is the loss's problem still (it was said as the model's: a review).
    dropped = digits_task("dropped", model=_dropped, loss=_summed)
    (problem,) = check_task(dropped, 2, kind="cpu")
    assert problem.field == "loss", problem


def _dropped() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Dropout(0.5),
                               torch.nn.Linear(32, 10))


def _summed(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output, target, reduction="sum")


def test_a_rule_judging_more_often_than_eval_every_asks_is_said() -> None:
    """Patience's every=1 (its default) over eval_every=10: an evaluation, a rung and a
    slice's end at every step, unsaid (a review)."""
    from dione import Asha, Patience
    from dione.spec.validate import rule_cadence_doubt

    often = digits_task("t", eval_every=10, evaluate=lambda m: {"accuracy": 1.0},
                        stopping=Patience(metric="accuracy", mode="max", patience=2))
    assert rule_cadence_doubt(often) == (
        "its stopping rule judges 'accuracy' every 1 step(s), more often than eval_every=10:"
        " the task is evaluated at each of its rungs, and a slice ends at each; give the "
        "rule every=10 to judge it as often as it is evaluated")
    assert rule_cadence_doubt(replace(often, stopping=Patience(
        metric="accuracy", mode="max", every=10))) is None
    assert rule_cadence_doubt(replace(often, stopping=Patience())) is None  # the loss
    assert rule_cadence_doubt(replace(often, stopping=Asha(metric="accuracy"))) is None
    assert rule_cadence_doubt(replace(often, eval_every=None)) is None


def test_data_of_text_is_said_to_be_the_datas_not_the_models() -> None:
    """Items of ("hello", 0) read as "the model cannot take a batch" alone (a review)."""
    texts = [("hello", 0)] * 32
    (problem,) = validate_workload(Workload([digits_task("text", data=lambda: texts)]))
    assert problem.field == "data" and problem.message.endswith(
        "its inputs hold str, not tensors: give a collate_fn that makes tensors of them (a "
        "tokenizer's), or a data set whose items are tensors"), problem


def test_validation_leaves_the_callers_generators_as_they_were() -> None:
    """dione.validate and dione.run left torch's generator seeded with the task's seed:
    a notebook's every seed drew alike after (a review)."""
    import random

    from dione.techniques.validation import valid_tasks

    for seed in (1, 2):
        torch.manual_seed(seed)
        random.seed(seed)
        expected = (torch.rand(1).item(), random.random())
        torch.manual_seed(seed)
        random.seed(seed)
        valid_tasks([digits_task("t")])
        assert (torch.rand(1).item(), random.random()) == expected


class _Annealed(torch.nn.Module):
    """Scales by a temperature annealed with its count of training calls, kept in a plain
    attribute, a non-persistent buffer or a persistent one."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.calls: int | torch.Tensor
        self.logged = 0  # a plain copy for logging ("mirrored"): no training reads it
        if kind == "attribute":
            self.calls = 0
        elif kind == "tensor":  # a plain tensor attribute, no buffer at all
            self.calls = torch.zeros(())
        else:
            self.register_buffer("calls", torch.zeros((), dtype=torch.long),
                                 persistent=kind in ("persistent", "mirrored"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            self.logged = int(self.calls)
        return x / max(0.3, 1.0 - 0.1 * float(self.calls))


def _annealed_mlp(kind: str) -> torch.nn.Module:
    mlp = digits_mlp(hidden=16, depth=2)
    return torch.nn.Sequential(mlp[0], _Annealed(kind), mlp[1], mlp[2])


@pytest.mark.parametrize("kind", ["attribute", "buffer", "tensor", "persistent", "mirrored"])
def test_state_a_forward_moves_outside_the_state_dict_is_refused(kind: str) -> None:
    """A counter its forward moves in a plain attribute, a non-persistent buffer or a
    plain tensor: no checkpoint keeps it, so a resume (every slice after the first)
    started it anew and trained 7e-2 off single, unmarked (a review); refused with the
    fix. In a persistent buffer it is kept: no problem, even mirrored into a plain
    number for logging (refused: a regression review)."""
    from dione.spec.validate import check_task

    task = digits_task("annealed", model=functools.partial(_annealed_mlp, kind))
    found = check_task(task, 2, kind="cpu")
    if kind in ("persistent", "mirrored"):
        assert found == []
        return
    (problem,) = found
    assert problem.field == "model"
    assert ("1.calls" in problem.message) == (kind != "tensor"), problem.message
    assert "state that its state_dict does not hold" in problem.message
    assert "register_buffer('calls'" in problem.message


class _Diagnosed(torch.nn.Module):
    """Keeps numbers no training reads: the last activation's norm (it moves with dropout
    on every call), a NaN placeholder, and a lock that deepcopy cannot copy."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout = torch.nn.Dropout(0.5)
        self.last_norm = 0.0
        self.placeholder = float("nan")
        self.guard = threading.Lock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dropout(x)
        self.last_norm = float(x.norm())
        return x


def _diagnosed_mlp() -> torch.nn.Module:
    mlp = digits_mlp(hidden=16, depth=2)
    return torch.nn.Sequential(mlp[0], _Diagnosed(), mlp[1], mlp[2])


def _four_kinds() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(64, 8, generator=generator),
                                          torch.arange(64) % 4)


_CENTRES = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))


def _centre_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - _CENTRES.to(output.device)[target]).pow(2).sum(dim=1).mean()


@pytest.mark.parametrize("case", ["diagnostics", "centres"])
def test_state_no_training_reads_and_a_centre_loss_are_not_refused(case: str) -> None:
    """A regression review's false refusals: numbers a forward keeps that change no loss
    (a norm under dropout, a NaN placeholder) and a model deepcopy cannot copy (a lock);
    a centre loss on a 16-wide embedding of 4 classes, taken for 16 classes' logits and
    given labels past its 4 centres."""
    from dione.spec.validate import check_task

    task = (digits_task("diagnosed", model=_diagnosed_mlp) if case == "diagnostics" else
            digits_task("centres", model=functools.partial(torch.nn.Linear, 8, 16),
                        data=_four_kinds, loss=_centre_loss))
    assert check_task(task, 2, kind="cpu") == []


class _NumpyNoise(torch.nn.Module):
    """Adds NumPy noise in training (a checkpoint keeps NumPy's state: a resume is exact)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import numpy

        if self.training:
            x = x + torch.from_numpy(numpy.random.normal(size=x.shape)).to(x.dtype)
        return x


class _ActNorm(torch.nn.Module):
    """Glow's ActNorm: set up from the first batch it sees, the flag a plain bool."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.loc = torch.nn.Parameter(torch.zeros(width))
        self.initialized = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.initialized:
            with torch.no_grad():
                self.loc.copy_(-x.mean(0))
            self.initialized = True
        return x + self.loc


class _WarmUp(torch.nn.Module):
    """Scales its input only from its third training call on, counted in a plain int."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
        return x * (0.5 if self.calls >= 3 else 1.0)


def _with(kind: str) -> torch.nn.Module:
    mlp = digits_mlp(hidden=16, depth=2)
    layer = {"numpy": _NumpyNoise, "actnorm": lambda: _ActNorm(16), "warm-up": _WarmUp}[kind]()
    return torch.nn.Sequential(mlp[0], layer, mlp[1], mlp[2])


@pytest.mark.parametrize("kind", ["numpy", "actnorm", "warm-up"])
def test_a_resume_is_played_with_every_generator_and_on_another_batch(kind: str) -> None:
    """A forward drawing from NumPy was refused (only torch was seeded for the two
    forwards compared); an ActNorm set up from its first batch, its flag unkept, passed
    (compared on the same batch, where a set-up anew looks alike): regression reviews."""
    from dione.spec.validate import check_task

    found = check_task(digits_task(kind, model=functools.partial(_with, kind)), 2, kind="cpu")
    if kind == "numpy":
        assert found == []
        return
    (problem,) = found  # (a warm-up acting from a later call: a fourth review)
    assert problem.field == "model"
    assert ("initialized" if kind == "actnorm" else "calls") in problem.message
