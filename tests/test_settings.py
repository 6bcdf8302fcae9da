"""A task's training settings: the same text in any process and after an edit elsewhere
in its file, other text for another learning rate."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dione.spec import Task, load_workload
from dione.spec.settings import described, model_shapes, training_settings
from dione.zoo import digits_mlp
from helpers import digits_task

SWEEP = '''
import functools, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

def smoothed(output, target):
    return torch.nn.functional.cross_entropy(output, target, label_smoothing=SMOOTHING)

def task(lr, betas):
    # a closure, as a loop or a sampler's callback makes them
    return Task(name=f"d{lr}", model=digits_mlp, data=digits_train, loss=smoothed,
                optimizer=lambda params: torch.optim.Adam(params, lr=lr, betas=betas),
                lr_scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=5),
                batch_size=16, steps=4)

workload = Workload([task(RATE, (0.9, 0.99))])
'''

SETTINGS = ("import sys; from dione.spec import load_workload; "
            "from dione.spec.settings import training_settings; "
            "print(repr(training_settings(list(load_workload(sys.argv[1]))[0])))")


def test_settings_are_the_same_in_another_process_and_after_an_unrelated_edit(
        tmp_path: Path) -> None:
    file = tmp_path / "sweep.py"
    file.write_text(SWEEP.replace("RATE", "0.001").replace("SMOOTHING", "0.1"))
    here = training_settings(_first(file))
    assert here["optimizer"] == "<lambda>[betas=(0.9, 0.99), lr=0.001]"
    assert here["lr_scheduler"] == "StepLR(step_size=5)"
    # The workload's own loss with a digest of its code (one edited between sessions
    # trained the steps left, unsaid: a review).
    assert re.fullmatch(r"smoothed \(code \w{16}\)", here["loss code"]), here["loss code"]
    there = subprocess.run([sys.executable, "-c", SETTINGS, str(file)], capture_output=True,
                           text=True, timeout=120, check=True).stdout.strip()
    assert there == repr(here)  # no memory address, no module named by the file's digest
    file.write_text("# a comment\n" + SWEEP.replace("RATE", "0.001").replace(
        "SMOOTHING", "0.1"))
    assert training_settings(_first(file)) == here
    file.write_text(SWEEP.replace("RATE", "0.003").replace("SMOOTHING", "0.1"))
    assert training_settings(_first(file))["optimizer"] != \
        here["optimizer"]
    file.write_text(SWEEP.replace("RATE", "0.001").replace("SMOOTHING", "0.2"))
    assert {k for k, v in training_settings(_first(file)).items() if v != here[k]} == {
        "loss code"}


def _first(file: Path) -> Task:
    return next(iter(load_workload(str(file))))


def _tanh_mlp() -> torch.nn.Module:
    model = digits_mlp()
    model[0][1] = torch.nn.Tanh()
    return model


def test_settings_name_what_sets_the_training() -> None:
    task = digits_task(optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
                       clip_grad_norm=1.0, seed=7)
    settings = training_settings(task)
    assert settings == {"optimizer": "SGD(lr=0.1, momentum=0.9)", "lr_scheduler": "None",
                        "seed": "7", "precision": "'fp32'", "clip_grad_norm": "1.0",
                        "loss": "cross_entropy[defaults=None, None, -100, None, 'mean', 0.0]",
                        "loss_items": "None", "collate_fn": "None", "data": "digits_train",
                        "loss code": "cross_entropy[defaults=None, None, -100, None, 'mean', "
                        "0.0]", "loss_items code": "None", "collate_fn code": "None",
                        "data code": "digits_train",
                        "optimizer reads": "", "lr_scheduler reads": ""}
    # The model by its parameters' shapes (the run records it beside them): a narrower
    # one is another (a finished task's edited model was given the old one's results: a
    # review); a new factory object of the same model, the same.
    assert model_shapes(task).startswith("Sequential of 3,466 parameters (shapes ")
    narrow = digits_task(model=functools.partial(digits_mlp, hidden=16, depth=1))
    assert model_shapes(narrow).startswith("Sequential of 1,210 parameters (shapes ")
    assert model_shapes(digits_task(model=functools.partial(digits_mlp, hidden=32, depth=2))
                        ) == model_shapes(task)
    # A layer changed, its shapes alike (a ReLU made a Tanh between sessions trained the
    # steps left unsaid: a review).
    assert model_shapes(digits_task(model=_tanh_mlp)) != model_shapes(task)
    # An object without a repr of its own is named by its type, not its address.
    holder = functools.partial(torch.optim.SGD, lr=0.1, foreach=object())
    assert "foreach=object" in training_settings(digits_task(optimizer=holder))["optimizer"]


LEARNING_RATE = 0.01  # a notebook's (or a module's) number, read by the lambda below


class OptimizerFactory:
    """A callable object as an optimizer factory (its own numbers set the training)."""

    def __init__(self, lr: float, run_name: str) -> None:
        self.lr, self.run_name = lr, run_name

    def __call__(self, params: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr)


def test_what_a_function_or_an_object_reads_counts_and_what_changes_per_run_does_not(
        ) -> None:
    """A notebook's lr read by a lambda, a callable object's lr, a partial held by a
    closure: each was described by its name alone (a changed rate passed). A config dict
    holding a run's name and time, or the name of the function that made the lambda,
    refused a resume that changed nothing. What a factory reads from its module or its
    object is kept apart ("optimizer reads": said on resume, not refused: a time or a pid
    may be there)."""
    import time

    global LEARNING_RATE

    def reads(optimizer: Any) -> str:
        return training_settings(digits_task(optimizer=optimizer))["optimizer reads"]

    notebook = lambda params: torch.optim.Adam(params, lr=LEARNING_RATE)  # noqa: E731
    assert described(notebook) == "<lambda>" and reads(notebook) == "LEARNING_RATE=0.01"
    LEARNING_RATE = 5.0
    assert reads(notebook) == "LEARNING_RATE=5.0"
    LEARNING_RATE = 0.01
    assert reads(OptimizerFactory(0.1, "a")) == "lr=0.1"  # its name, a string, left out
    assert reads(OptimizerFactory(0.1, "b")) != reads(OptimizerFactory(0.2, "b"))
    base = functools.partial(torch.optim.AdamW, lr=0.02)
    assert described(lambda params: base(params)) == "<lambda>[base=AdamW(lr=0.02)]"

    def made(config):
        return lambda params: torch.optim.AdamW(params, lr=config["lr"])

    def renamed(config):
        return lambda params: torch.optim.AdamW(params, lr=config["lr"])

    now = {"lr": 0.01, "run": time.strftime("%H%M%S"), "started": time.time()}
    later = {**now, "run": "later", "started": now["started"] + 1}
    assert described(made(now)) == described(made(later)) == described(renamed(now))


SET_HEADS = """
import torch
from dione.spec.settings import model_shapes
from dione.spec.task import Task

def heads():
    return torch.nn.ModuleDict({k: torch.nn.Linear(4, 2) for k in {"alpha", "beta", "gamma"}})

print(model_shapes(Task(name="t", model=heads, data=list, optimizer=list, batch_size=1,
                        steps=1)))
"""

HIDDEN = 32  # a notebook's global, read by the factory below


def _reads_hidden() -> torch.nn.Module:
    return digits_mlp(hidden=HIDDEN, depth=1)


def _random_width() -> torch.nn.Module:
    return torch.nn.Linear(8, int(torch.randint(4, 64, ())))


def test_a_models_shapes_are_the_same_wherever_the_same_model_is_built(
        monkeypatch: Any) -> None:
    """A resume in a new process refused an unchanged model whose names came from a set
    (another order each process), or whose width a worker draws from the task's seed
    (built here from the caller's generator); and a notebook's edited global went unseen
    by a cache (a regression review)."""
    said = {subprocess.run([sys.executable, "-c", SET_HEADS], capture_output=True,
                           text=True, env={**os.environ, "PYTHONHASHSEED": seed},
                           check=True).stdout for seed in ("1", "2", "3")}
    assert len(said) == 1 and "ModuleDict of 30 parameters" in said.pop()
    drawn = digits_task(model=_random_width, seed=5)
    torch.manual_seed(0)
    first = model_shapes(drawn)
    torch.manual_seed(1)
    assert model_shapes(replace(drawn, model=lambda: _random_width())) == first
    wide = model_shapes(digits_task(model=_reads_hidden))
    monkeypatch.setattr(sys.modules[__name__], "HIDDEN", 16)
    assert model_shapes(digits_task(model=_reads_hidden)) != wide


class _CountingLoss:
    """A loss object that counts its calls, and says so in its repr."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.nn.functional.cross_entropy(output, target)

    def __repr__(self) -> str:
        return f"CountingLoss(calls={self.calls})"


def _load_from(path: Any) -> Any:
    return path


def test_a_loss_and_data_are_recorded_by_what_they_compute_not_their_state_or_place(
) -> None:
    """A regression review: a loss object whose repr counts its calls read as a changed
    loss at every resume in one process (validation calls it); torch's loss modules read
    without their settings (label smoothing changed unsaid); a data factory holding a
    path refused a moved workload's resume."""
    counting = _CountingLoss()
    task = digits_task(loss=counting)
    before = training_settings(task)
    counting(torch.zeros(2, 10), torch.zeros(2, dtype=torch.long))
    # What refuses a resume is its code; what it holds (its count) is said only.
    assert {k for k, v in training_settings(task).items() if v != before[k]} == {"loss"}
    smoothed = training_settings(digits_task(loss=torch.nn.CrossEntropyLoss(
        label_smoothing=0.5)))["loss code"]
    assert "label_smoothing=0.5" in smoothed and smoothed != training_settings(
        digits_task(loss=torch.nn.CrossEntropyLoss()))["loss code"]
    weighed = [training_settings(digits_task(loss=torch.nn.CrossEntropyLoss(
        weight=torch.full((10,), w, dtype=torch.bfloat16))))["loss code"] for w in (1.0, 2.0)]
    assert weighed[0] != weighed[1]
    here, there = (training_settings(digits_task(data=functools.partial(
        _load_from, Path(folder) / "digits"))) for folder in ("/data/a", "/srv/b"))
    assert here["data code"] == there["data code"] and "<path>" in here["data code"]
    assert "/data/a/digits" in here["data"] and "/srv/b/digits" in there["data"]  # said


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 10), torch.nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class _EditedNet(torch.nn.Module):  # the cell run again: the same shapes, a Tanh
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 10), torch.nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _build_net() -> torch.nn.Module:
    return _Net()


def test_a_model_class_edited_in_place_is_seen_by_a_factory_left_as_it_was(
        monkeypatch: Any) -> None:
    """A notebook's model class edited and its cell run again, the factory's cell not:
    the process's cache gave the old class's shapes and layers, and a finished task the
    old model's results, unsaid (a review)."""
    task = digits_task(model=_build_net)
    before = model_shapes(task)
    monkeypatch.setattr(sys.modules[__name__], "_Net", _EditedNet)
    assert model_shapes(task) != before
