"""A run written to TensorBoard and MLflow as it trains (``dione.run(tensorboard=,
mlflow=)``, ``dione report --mlflow``), read back with the tools' own readers."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import dione
from dione.orchestrate.plans import read_plans
from dione.profile import TrialOptions
from dione.report import mlflow_runs
from dione.report.tensorboard import PLANS_RUN
from dione.state.store import RunStore
from dione.zoo.digits import digits_accuracy
from helpers import digits_task
from helpers import dione as dione_cli


def test_a_run_is_in_mlflow_and_tensorboard_with_every_step_and_each_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # MLflow puts a SQLite store's artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tasks = [digits_task(f"lr-{lr}", steps=6, techniques=("single",),
                         optimizer=functools.partial(torch.optim.Adam, lr=lr),
                         evaluate=digits_accuracy, hyperparameters={"lr": lr},
                         lr_scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(
                             opt, step_size=2, gamma=0.5))
             for lr in (0.01, 0.03)]
    # Worked by hand: the rate of step s is lr * 0.5 ** ((s - 1) // 2) (StepLR halves it
    # after every second update).
    rates = {f"lr-{lr}": [lr * 0.5 ** ((s - 1) // 2) for s in range(1, 7)]
             for lr in (0.01, 0.03)}
    run_dir = tmp_path / "run"
    result = dione.run(tasks, devices="cpu:1", run_dir=str(run_dir), quiet=True,
                       tensorboard=str(tmp_path / "tb"), mlflow=uri,
                       catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0,
                       trial=TrialOptions(warmup_steps=1, measure_steps=2))
    assert [t.status for t in result.tasks] == ["done", "done"]
    with RunStore(run_dir) as store:
        steps = {t.name: [s for s, _ in store.losses(t.name)] for t in tasks}
        run_id = store.run_id
    assert all(len(s) == 6 for s in steps.values())

    client = MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)
    experiment = client.get_experiment_by_name("dione")
    (parent,) = mlflow.search_runs([experiment.experiment_id],
                                   f"tags.`dione.run_id` = '{run_id}'", output_format="list")
    children = mlflow.search_runs(
        [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
        output_format="list")
    assert parent.info.status == "FINISHED"
    assert sorted(c.info.run_name for c in children) == ["lr-0.01", "lr-0.03"]

    def contents(run_id: str) -> tuple[list[int], dict[str, str], list[str]]:
        loss = client.get_metric_history(run_id, "loss")
        run = client.get_run(run_id)
        artifacts = [f.path for f in client.list_artifacts(run_id, "model")]
        return sorted(m.step for m in loss), run.data.params, artifacts

    for child in children:
        name = child.info.run_name
        loss_steps, params, artifacts = contents(child.info.run_id)
        assert loss_steps == steps[name]  # every step, once
        assert child.info.status == "FINISHED" and child.data.tags["dione.status"] == "done"
        assert params["lr"] == name.removeprefix("lr-")
        assert params["slice.000000"].startswith("steps 0-6: single")
        assert 0.0 <= child.data.metrics["final/accuracy"] <= 1.0
        assert "model/model.safetensors" in artifacts  # as `dione export` writes it
        history = client.get_metric_history(child.info.run_id, "learning_rate/group_0")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
            rates[name])

    # `dione report --mlflow` on the same store continues the runs, repeating nothing.
    shown = dione_cli("report", str(run_dir), "--mlflow", uri)
    assert shown.returncode == 0, shown.stderr
    again = mlflow.search_runs([experiment.experiment_id], "", output_format="list")
    assert len(again) == 3
    for child in children:
        assert contents(child.info.run_id)[0] == steps[child.info.run_name]

    # TensorBoard, written by the same live thread: each task's loss at every step.
    for task in tasks:
        events = EventAccumulator(str(tmp_path / "tb" / task.name))
        events.Reload()
        assert [e.step for e in events.Scalars("loss")] == steps[task.name]
        assert [e.step for e in events.Scalars("eval/accuracy")] == [6]
        assert [e.value for e in events.Scalars("learning_rate/group_0")] == pytest.approx(
            rates[task.name])
    plans = EventAccumulator(str(tmp_path / "tb" / PLANS_RUN), size_guidance={"images": 0})
    plans.Reload()
    drawn = plans.Images("plan")  # each adopted plan's chart, at its index
    assert [e.step for e in drawn] == list(range(len(read_plans(run_dir))))
    assert all(e.width > 300 and e.height > 100 for e in drawn)

    # A long task's per-step metrics go to MLflow in windows (at most POINTS a task):
    # with 4 points for 6 steps, each point is the mean loss of two steps, at the second.
    monkeypatch.setattr(mlflow_runs, "POINTS", 4)
    windows = mlflow_runs.MlflowExport(run_dir, uri, tasks=tasks, experiment="windows")
    windows.close()
    with RunStore(run_dir) as store:
        for task in tasks:
            losses = [loss for _, loss in store.losses(task.name)]
            history = client.get_metric_history(windows._children[task.name], "loss")
            assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
                (s, pytest.approx((losses[s - 2] + losses[s - 1]) / 2)) for s in (2, 4, 6)]
    # A writer that continues those runs (a resumed run's) knows where each task's metrics
    # ended and its device count, so it repeats neither.
    continued = mlflow_runs.MlflowExport(run_dir, uri, tasks=tasks, experiment="windows")
    assert continued._steps == dict.fromkeys(steps, 6)
    assert continued._widths == dict.fromkeys(steps, 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="a thread's own nice value is Linux's")
def test_the_live_report_writes_at_the_lowest_priority_and_only_its_thread(
        tmp_path: Path) -> None:
    """The thread that keeps the report and the dashboards fresh runs at nice 19, so the
    gangs' steps come first on a machine whose cores they use; the launcher's own
    thread keeps its priority."""
    from dione.report.page import LiveReport

    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: list[int] = []

    class Board:
        def update(self) -> None:
            seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

        def close(self) -> None:
            pass

    live = LiveReport(tmp_path, every=0.05, boards=[Board()])
    live.touch()
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live.close() == []
    assert seen and seen[0] == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


def test_the_live_page_says_when_it_was_written_and_when_it_has_gone_stale(
        tmp_path: Path) -> None:
    """A live run's page gave no time and, left by a killed run, went on saying
    "running" (and reloading) for ever: it now says when it was written, a live run
    rewrites it at least every period with nothing new (so a page older than that is
    a gone launcher's, which its script says), and a finished run's page has no script."""
    import re

    from dione.report.page import LiveReport, write_page
    from dione.state import RunStore

    RunStore(tmp_path).close()
    live = LiveReport(tmp_path, every=0.2)
    live.touch()  # the plan: a first report
    page = tmp_path / "report" / "index.html"
    stamps: set[str] = set()
    deadline = time.monotonic() + 60
    while len(stamps) < 3 and time.monotonic() < deadline:  # no touch after the first
        time.sleep(0.3)
        if page.is_file():
            stamps |= set(re.findall(r"- (\d+);", page.read_text()))
    assert live.close() == []
    assert len(stamps) >= 3  # rewritten, each with its time, with nothing new to say
    text = page.read_text()
    assert "rewritten at least every 1 s while the run's launcher lives" in text
    assert "location.reload" in text and "the run's launcher may be gone" in text
    # The status it names, and how this run goes on (a dione.run's is not `resume`).
    assert f"`dione status {tmp_path}` says; " in text and " continues" in text
    assert '<meta http-equiv="refresh"' not in text.split("<noscript>")[0]
    final = write_page(tmp_path / "report").read_text()  # as a finished run writes it
    assert "Written " in final and "<script>" not in final and "refresh" not in final


def test_an_mlflow_parent_run_ends_as_the_run_exits(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose task failed exits 1; its MLflow parent run read FINISHED (review). A
    killed run's tasks read "running" there, where the report said interrupted."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with RunStore(tmp_path / "run") as store:
        for name, status in (("a", "done"), ("b", "failed")):
            store.register_task(name, 6, 16)
            store.set_task_status(name, status, "RuntimeError: boom" if status == "failed"
                                  else None)
        run_id = store.run_id
    export = mlflow_runs.MlflowExport(tmp_path / "run", uri,
                                      tasks=[digits_task("a"), digits_task("b")])
    export.close()
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("dione")
    (parent,) = client.search_runs([experiment.experiment_id],
                                   f"tags.`dione.run_id` = '{run_id}'")
    assert parent.info.status == "FAILED"
    with RunStore(tmp_path / "run") as store:
        store.set_task_status("b", "running")  # as a kill -9 leaves it
    again = mlflow_runs.MlflowExport(tmp_path / "run", uri,
                                     tasks=[digits_task("a"), digits_task("b")])
    again.close()
    child = client.get_run(again._children["b"])
    assert child.data.tags["dione.status"] == "interrupted"
    assert client.get_run(again.parent).info.status == "KILLED"
    # Closed by the command that ran it, which still holds the run (after Ctrl-C): as
    # the report says it too (it read "pending" there: a review). A task stopped at a
    # rung after its last evaluation failed none (it was tagged so, and the tag stayed
    # once a resume ended it).
    from dione.state.lock import RunLock

    with RunStore(tmp_path / "run") as store:
        store.register_task("c", 6, 16)
        slice_id = store.begin_slice("c", "single", {}, "n0", [0], 0, 4)
        store.finish_slice(slice_id, [1.0] * 4, [0.1] * 4, None, evaluation={"acc": 0.5})
        slice_id = store.begin_slice("c", "single", {}, "n0", [0], 4, 6)
        store.finish_slice(slice_id, [1.0] * 2, [0.1] * 2, None)
        store.set_task_status("c", "stopped", "stopped by ASHA")
    with RunLock(tmp_path / "run"):
        held = mlflow_runs.MlflowExport(tmp_path / "run", uri, tasks=[
            digits_task("a"), digits_task("b"), digits_task("c")])
        held.client.set_tag(held._child("c", {}), "dione.final_evaluation", "failed: ...")
        held.close()
    assert client.get_run(held._children["b"]).data.tags["dione.status"] == "interrupted"
    assert "dione.final_evaluation" not in client.get_run(held._children["c"]).data.tags


def test_an_unfinished_runs_report_says_what_continues_that_kind_of_run(
        tmp_path: Path) -> None:
    """The report of a run that stopped with a task mid-way says so at the top, with
    what continues it: a run from Python is called again (`dione resume` refuses it,
    which the first version named: a regression review), a simulation is redone."""
    from dione.report import write_report
    from dione.state.store import SIMULATED_FILE

    for kind, said in (("train", "`dione train WORKLOAD --task TASK --out "),
                       ("python", "calling dione.run (or dione.optuna.optimize) again with "
                                  "this run directory continues it"),
                       ("simulated", "`dione simulate` again redoes it")):
        run_dir = tmp_path / kind
        with RunStore(run_dir) as store:
            store.register_task("a", 6, 16)
            store.begin_slice("a", "single", {}, "n0", [0], 0, 6)  # as a kill leaves it
        if kind != "train":  # a run's plans (a `dione train` folder has none)
            (run_dir / "plans").mkdir()
        if kind == "simulated":
            (run_dir / SIMULATED_FILE).write_text("{}")
        summary = (write_report(run_dir) / "summary.md").read_text()
        assert "**Not finished**: the run stopped with 1 of its 1 tasks not ended" in summary
        assert said in summary, summary[:800]
