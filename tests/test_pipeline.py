"""Pipeline techniques in real gangs: a dying stage ends the gang and is named; models that
cannot be cut are refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from dione.launch import local_placement, run_slice
from dione.spec import Node
from dione.spec.workload import load_workload
from dione.techniques import get_technique
from helpers import (
    TEST_NODE,
    assert_same_training,
    char_task,
    check_real_timeline,
    final_parameters,
    in_process,
)

WORKLOAD = '''
import functools, os, signal, time
import torch
from torch import nn
from dione import Task, Workload
from dione.zoo import digits_train

FAULT = os.environ.get("FAULT", "none")


class Faulty(nn.Linear):
    """The last layer: fails in its third forward that trains in a gang, i.e. inside
    step 1 on stage 1 (validation's forwards run in the launcher, with no gang of two:
    validation compares gradients, and a one-process group another test left in this
    process read as a gang, and the test process killed itself)."""

    calls = 0

    def forward(self, x):
        Faulty.calls += (torch.is_grad_enabled() and torch.distributed.is_initialized()
                         and torch.distributed.get_world_size() > 1)
        if Faulty.calls == 3:
            if FAULT == "raise":
                raise ValueError("injected failure in the last stage")
            if FAULT == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x)


def model():
    return nn.Sequential(nn.Sequential(nn.Linear(64, 16), nn.ReLU()), Faulty(16, 10))


class NotSequential(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = model()

    def forward(self, x):
        return self.body(x)


def task(name, factory):
    return Task(name=name, model=factory, data=digits_train,
                loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16, steps=4)

workload = Workload([task("pipe", model), task("opaque", NotSequential)])
'''


@pytest.mark.parametrize(
    ("technique", "fault", "expected"),
    [
        ("gpipe", "raise", "rank 1 (device 1, pipeline stage 1 of 2) raised ValueError: "
         "injected failure in the last stage"),
        ("1f1b", "kill", "rank 1 (device 1, pipeline stage 1 of 2) was killed by SIGKILL"),
    ],
)
def test_a_dying_stage_ends_the_gang_and_is_named(
        technique, fault, expected, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "workload.py"
    workload.write_text(WORKLOAD)
    status, _, err = in_process(capsys, "train", str(workload), "--task", "pipe",
                                "--technique", technique, "--devices", "2", "--knob",
                                "micro_batches=2", "--out", str(tmp_path / "run"),
                                env={"FAULT": fault})  # its ranks' environment
    assert status == 1
    assert expected in err
    # The same slice without the fault trains: the failure was the stage's, not the setup's
    # (its ranks' environment has no FAULT now).
    pipe = next(t for t in load_workload(workload) if t.name == "pipe")
    healthy = run_slice(pipe, technique, tmp_path / "ok", local_placement(TEST_NODE, [0, 1]),
                        knobs={"micro_batches": 2})
    assert healthy.end_step == 4 and len(healthy.losses) == 4


def test_a_model_that_cannot_be_cut_is_refused_before_starting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "workload.py"
    workload.write_text(WORKLOAD)
    status, _, err = in_process(capsys, "train", str(workload), "--task", "opaque",
                                "--technique", "gpipe", "--devices", "2", "--out",
                                str(tmp_path / "run"))
    assert status == 2
    assert ("task 'opaque': pipelines cut a model between its blocks, and its model is a "
            "NotSequential, neither an nn.Sequential nor a model with an nn.ModuleList (or "
            "nn.Sequential) of repeated blocks") in " ".join(err.split())
    assert not (tmp_path / "run" / "logs").exists()  # no gang was started


def test_stages_are_reported(tmp_path: Path) -> None:
    task = char_task(steps=2)
    result = run_slice(task, "gpipe", tmp_path, local_placement(TEST_NODE, [0, 1]))
    assert result.extra["stages"] == ["layers 0-1", "layers 2-3"]


@pytest.mark.parametrize("technique", ["gpipe", "1f1b"])
def test_torch_runs_the_schedule_lists_and_the_run_logs_its_timeline(technique: str,
                                                                     tmp_path: Path) -> None:
    """Each stage ran exactly the actions of dione's list for the technique, in order (the
    simulator's model of torch's schedule), and logged when each one worked."""
    steps, micro = 3, 4
    result = run_slice(char_task(steps=steps), technique, tmp_path,
                       local_placement(TEST_NODE, [0, 1]), knobs={"micro_batches": micro})
    assert "timeline_note" not in result.extra
    timeline = get_technique(technique).real_timeline(result.extra, steps)  # type: ignore[attr-defined]
    check_real_timeline(timeline)
    assert [len(spans) for spans in timeline.spans] == [steps * (2 * micro + 1)] * 2


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory):
    task = char_task(steps=8)
    result = run_slice(task, "single", tmp_path_factory.mktemp("single"),
                       local_placement(TEST_NODE, [0]))
    return task, result, final_parameters(task, result.checkpoint)


@pytest.mark.parametrize("stages", [3, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("technique", ["gpipe", "1f1b"])
def test_deeper_pipelines_match_single(single_run, technique: str, stages: int,
                                       tmp_path: Path) -> None:
    """3 and 4 stages (the char GPT's embedding, two blocks and head, one per stage at 4),
    with the suite's tolerance for reduction order (see test_equivalence.py)."""
    task, single, single_params = single_run
    node = Node(f"n{stages}", stages, "cpu")
    result = run_slice(task, technique, tmp_path, local_placement(node, list(range(stages))),
                       knobs={"micro_batches": 4}, timeout=300)
    assert len(result.extra["stages"]) == stages
    assert_same_training(result, final_parameters(task, result.checkpoint), single,
                         single_params)
