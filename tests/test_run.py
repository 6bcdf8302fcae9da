"""`dione run` end to end: plan, execute in slices, re-plan, report, survive kills and crashes."""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from dione.orchestrate import RunOptions, run_workload
from dione.plan import check_plan, load_plan
from dione.plan.problem import PlanningProblem
from dione.profile import TrialOptions
from dione.spec.cluster import Cluster, Node
from dione.spec.workload import load_workload
from dione.state.checkpoint import load_model_weights
from dione.state.store import RunStore
from helpers import in_process, started_dione, wait_until_training

QUICK = TrialOptions(warmup_steps=1, measure_steps=3, timeout=120)

WORKLOAD = '''
import functools, json, os, time
from pathlib import Path
import torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train


def waits_behind(name, plans):
    """The task the run's first plan queues after task ``name`` on one of its devices
    (None if no task waits for it)."""
    plan = json.loads((Path(plans) / "plan-000.json").read_text())
    queues = {}
    for a in sorted(plan["assignments"], key=lambda a: a["start"]):
        for device in a["device_ids"]:
            queues.setdefault((a["node"], device), []).append(a["task"])
    return next((queue[1] for queue in queues.values()
                 if len(queue) > 1 and queue[0] == name), None)


def loss(name, output, target):
    # Tests inject trouble through the environment, which the trials do not see.
    plans, marks = os.environ.get("HOLD_FIRST_OF_SHARED"), os.environ.get("STARTED_MARKS")
    if plans and marks:
        # A task another waits for holds its steps until that one has started (at most
        # 30 s): a plan that keeps it waiting is worse by the whole hold, on any machine.
        Path(marks, name).touch()
        waiting, deadline = waits_behind(name, plans), time.monotonic() + 30
        while waiting and not Path(marks, waiting).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    hold = os.environ.get("HOLD_FILE")
    if hold and Path(hold).exists():  # a test holds training here until it lets go
        # HOLD_MIDWAY (a run directory): only a task midway, once two checkpoints exist.
        saved = Path(os.environ["HOLD_MIDWAY"], "checkpoints") \
            if os.environ.get("HOLD_MIDWAY") else None
        if saved is None or (len(list(saved.glob("*/step-*"))) >= 2
                             and any((saved / name).glob("step-*"))):
            Path(hold + ".held").touch()
            while Path(hold).exists():
                time.sleep(0.05)
    marker = os.environ.get("FLAKY_MARKER")
    if name == "flaky" and marker and not Path(marker).exists():
        loss.calls = getattr(loss, "calls", 0) + 1
        if loss.calls > 5:
            Path(marker).touch()
            raise RuntimeError("flaky failure, once")
    if name == "broken" and os.environ.get("BREAK"):
        loss.calls = getattr(loss, "calls", 0) + 1
        if loss.calls > 5:
            raise RuntimeError("broken task fails after five steps, always")
    return torch.nn.functional.cross_entropy(output, target)


def task(name, lr, steps=12):
    return Task(name=name, model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=digits_train, loss=functools.partial(loss, name),
                optimizer=functools.partial(torch.optim.Adam, lr=lr), batch_size=16,
                steps=steps, seed=5, hyperparameters={"lr": lr},
                techniques=tuple(os.environ.get("TECHNIQUES", "single").split()))


workload = Workload([task(os.environ.get("TASK_PREFIX", "") + name, lr, steps)
                     for name, lr, steps in (("a", 1e-2, 12), ("b", 3e-2, 12),
                                             ("c", 1e-1, 12), ("flaky", 1e-2, 12),
                                             ("broken", 1e-2, 12))
                     if name in os.environ.get("TASKS", "a b c").split()])
'''


def write_workload(folder: Path) -> Path:
    file = folder / "workload.py"
    file.write_text(WORKLOAD)
    return file


def final_parameters(run_dir: Path, task: object) -> dict[str, torch.Tensor]:
    with RunStore(run_dir) as store:
        latest = store.latest_checkpoint(task.name)  # type: ignore[attr-defined]
    assert latest is not None
    model = task.model()  # type: ignore[attr-defined]
    load_model_weights(latest.path, model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_run_plans_executes_and_reports(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TASKS", "a b c")
    tasks = list(load_workload(write_workload(tmp_path)))
    cluster = Cluster([Node("test", 2, "cpu")])
    run_dir = tmp_path / "run"
    events = []
    result = run_workload(tasks, cluster, run_dir,
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                                     slice_steps=6, time_limit=5.0),
                          on_event=events.append)
    assert [t.status for t in result.tasks] == ["done"] * 3
    from dione.report import write_report  # the CLI and dione.run() draw it after a run

    write_report(run_dir, tasks)
    for t in result.tasks:
        assert t.steps == t.total_steps == 12
        assert t.techniques == ["single"] and t.final_loss is not None
        assert t.checkpoint and Path(t.checkpoint).is_dir()
    # Two single-device tasks at a time on two devices: some slices overlap in time.
    with RunStore(run_dir) as store:
        slices = [s for s in store.slices() if s.status == "done"]
    assert len(slices) == 6  # 12 steps in slices of 6
    overlaps = sum(1 for x in slices for y in slices if x.id < y.id
                   and x.started_at < (y.ended_at or 0) and y.started_at < (x.ended_at or 0))
    assert overlaps > 0
    assert {tuple(s.device_ids) for s in slices} == {(0,), (1,)}
    # Every plan adopted is a valid plan of the problem it was made for.
    for path in sorted((run_dir / "plans").glob("plan-*.json")):
        body = json.loads(path.read_text())
        problem = PlanningProblem.from_json(body["problem"])
        assert check_plan(load_plan(path), problem) == []
    report = run_dir / "report"
    for name in ("summary.md", "summary.csv", "timeline.csv", "metrics.csv", "gantt.png"):
        assert (report / name).is_file(), name
    metrics = (report / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 1 + 3 * 12
    assert metrics[0].endswith(",simulated") and all(m.endswith(",false") for m in metrics[1:])
    assert {e.kind for e in events} >= {"profiled", "planned", "slice_started",
                                        "slice_finished", "finished"}
    # The tasks table: every row as many cells as its header (no evaluation here).
    summary = (report / "summary.md").read_text().split("## Tasks")[1].strip().splitlines()
    assert len({row.count("|") for row in summary[:5]}) == 1, summary[:5]
    # A plan file cut short (a launcher killed mid-write, before plans were written
    # whole) is left out of the report with a warning naming it; the rest still reports.
    last = sorted((run_dir / "plans").glob("plan-*.json"))[-1]
    last.write_text(last.read_text()[:200])
    from dione.report import write_report

    with pytest.warns(UserWarning, match=f"{last.name} cannot be read"):
        write_report(run_dir)
    assert (report / "summary.md").is_file()


@pytest.mark.timeout(900)  # three `dione` runs (whole, killed, resumed)
def test_killed_run_resumes_to_the_parameters_of_an_uninterrupted_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = write_workload(tmp_path)
    env = {"DIONE_CATALOG": str(tmp_path / "catalog.sqlite"), "TASKS": "a b c"}
    common = ["--devices", "cpu:2", "--slice-steps", "4", "--warmup-steps", "1",
              "--measure-steps", "3", "--time-limit", "5"]

    def here(*args: str) -> str:
        """`dione ARGS` in this process (only the run killed needs a process of its own)."""
        status, out, err = in_process(capsys, *args, env=env)
        assert status == 0, out + err
        return out

    here("run", str(file), "--out", str(tmp_path / "whole"), *common)

    killed_dir = tmp_path / "killed"
    # Training holds at its next step while this file exists (the workload's loss): the
    # state looked at is still the state when the kill lands (a quick machine once
    # finished the midway task between the look and the kill).
    hold, held = tmp_path / "hold", tmp_path / "hold.held"
    # Training holds once a task is midway with two checkpoints written: the run is
    # killed in that state on any machine (looking for it from here, a quick machine
    # once finished the run between the looks).
    hold.touch()
    killed = started_dione("run", str(file), "--out", str(killed_dir), *common,
                           env={**env, "HOLD_FILE": str(hold),
                                "HOLD_MIDWAY": str(killed_dir)})

    def ready_to_kill() -> bool:
        """A slice runs (between slices nothing is left to mark interrupted) and a task
        is midway (to see it resume from its checkpoint)."""
        if not (killed_dir / "dione.sqlite").is_file():
            return False
        with RunStore(killed_dir) as store:
            checkpoints = sum(len(store.checkpoints(t.name)) for t in store.tasks())
            running = any(s.status == "running" for s in store.slices())
            midway = any(t.status != "done" and store.checkpoints(t.name)
                         for t in store.tasks())
        return checkpoints >= 2 and running and midway

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and killed.poll() is None and not (
            held.exists() and ready_to_kill()):  # held mid-slice, its checkpoint recorded
        time.sleep(0.1)
    assert killed.poll() is None, "the run ended before it could be killed"
    assert held.exists() and ready_to_kill()
    os.kill(killed.pid, signal.SIGKILL)
    killed_at = time.time()
    killed.communicate(timeout=60)
    hold.unlink(missing_ok=True)
    with RunStore(killed_dir) as store:
        assert any(t.status != "done" for t in store.tasks())
        # The slices the kill cut short (a slice may still have ended between the last
        # look and the kill, so the set is read now, from the dead run's record).
        cut_short = {s.id for s in store.slices() if s.status == "running"}
        saved = {t.name: c.step for t in store.tasks() if t.status != "done"
                 and (c := store.latest_checkpoint(t.name)) is not None}
        last_slice = max(s.id for s in store.slices())
    assert saved, "no task was midway when the run was killed"
    # Its report says what the kill left: those slices interrupted, with an end.
    from dione.report import write_report

    with open(write_report(killed_dir) / "timeline.csv") as timeline:
        rows = {int(r["slice"]): r for r in csv.DictReader(timeline)}
    assert cut_short and all(rows[i]["status"] == "interrupted" and rows[i]["end_s"]
                             for i in cut_short)
    # ... ended at the last step it kept (none: a kill keeps a slice's steps only at its
    # end), not at its planned end.
    assert all(rows[i]["end_step"] == rows[i]["start_step"] for i in cut_short), rows
    summary = (killed_dir / "report" / "summary.md").read_text()
    assert "## Slices cut short" in summary
    assert "not trained again yet (`dione resume` trains it)" in summary
    # It says at the top that the run did not finish and what continues it (it read as
    # a finished run's page, its leaders as the sweep's: a review).
    assert "**Not finished**: the run stopped with" in summary and \
        f"`dione resume {killed_dir}` continues it" in summary, summary[:600]

    # Resumed from elsewhere: a run directory can move (to shared storage, say).
    moved_dir = tmp_path / "moved"
    killed_dir.rename(moved_dir)
    killed_dir = moved_dir
    here("resume", str(killed_dir))
    tasks = list(load_workload(file))
    for task in tasks:
        ours, theirs = (final_parameters(tmp_path / d, task) for d in ("moved", "whole"))
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), (task.name, name)
    with RunStore(killed_dir) as store:
        assert all(t.status == "done" for t in store.tasks())
        statuses = {s.id: s.status for s in store.slices()}
        # Each task went on from its checkpoint, found where the directory is now.
        for task_name, step in saved.items():
            assert min(s.start_step for s in store.slices(task_name) if s.id > last_slice) \
                == step, task_name
    # The killed run's slices are on record as such, and only those, each ended before
    # the kill (when the store last heard from it), not when the resume found it.
    assert {i for i, status in statuses.items() if status == "interrupted"} == cut_short
    with RunStore(killed_dir) as store:
        assert all((store.slice(i).ended_at or 0.0) <= killed_at for i in cut_short)

    status = subprocess.run([sys.executable, "-m", "dione.cli", "status", str(killed_dir)],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "3 of 3 task(s) done" in status.stdout
    report = here("report", str(killed_dir))
    assert "Leaderboard" not in report  # no metric defined
    assert "| a | done | 12/12 |" in report
    # It says the run was resumed; the slices the kill cut short end where they began
    # in every report, the resuming launcher's too (it drew them to their planned end).
    assert "Resumed 1 time(s), at " in report
    with open(killed_dir / "report" / "timeline.csv") as timeline:
        rows = {int(r["slice"]): r for r in csv.DictReader(timeline)}
    assert all(rows[i]["end_step"] == rows[i]["start_step"] for i in cut_short), rows
    summary = (killed_dir / "report" / "summary.md").read_text()
    # In the past tense now: each was trained again ("when the run resumes", it said).
    assert "## Slices cut short" in summary and "; trained again from step" in summary
    assert "not trained again yet" not in summary


def test_a_crash_is_retried_and_an_always_failing_task_is_reported(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TASKS", "a flaky broken")
    monkeypatch.setenv("FLAKY_MARKER", str(tmp_path / "flaked"))
    monkeypatch.setenv("BREAK", "1")
    tasks = list(load_workload(write_workload(tmp_path)))
    cluster = Cluster([Node("test", 2, "cpu")])
    run_dir = tmp_path / "run"
    result = run_workload(tasks, cluster, run_dir,
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                                     max_failures=3, time_limit=5.0))
    assert result.task("a").status == "done"
    assert result.task("flaky").status == "done"
    broken = result.task("broken")
    assert broken.status == "failed"
    assert "broken task fails after five steps, always" in (broken.error or "")
    # Its second failure, the same exception from the same step, ends it: a third try
    # (of max_failures=3) would raise it again.
    with RunStore(run_dir) as store:
        flaky = [s.status for s in store.slices("flaky")]
        assert flaky == ["failed", "done"]
        assert [s.status for s in store.slices("broken")] == ["failed", "failed"]
    from dione.report import write_report

    summary = write_report(run_dir) / "summary.md"
    assert "broken" in summary.read_text().split("## Failed")[1]


def test_replanning_adopts_a_new_plan_when_a_task_runs_slow(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TASKS", "a b c")
    tasks = list(load_workload(write_workload(tmp_path)))
    cluster = Cluster([Node("test", 2, "cpu")])
    catalog = str(tmp_path / "catalog.sqlite")
    options = RunOptions(catalog=catalog, trial=QUICK, slice_steps=4, time_limit=5.0,
                         replan_share=1.0)  # a short run: every re-plan may run
    # Profile without the slowdown, then hold the task the first plan runs before another
    # on its device until that other one has started: only a plan that moves the waiting
    # task to the other device lets it start, whichever tasks the plan paired.
    run_workload(tasks, cluster, tmp_path / "warm", options)
    monkeypatch.setenv("HOLD_FIRST_OF_SHARED", str(tmp_path / "slow" / "plans"))
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv("STARTED_MARKS", str(tmp_path / "marks"))
    events = []
    result = run_workload(tasks, cluster, tmp_path / "slow", options, on_event=events.append)
    assert all(t.status == "done" for t in result.tasks), result.tasks
    assert any(e.kind == "replanned" for e in events)
    assert len(list((tmp_path / "slow" / "plans").glob("plan-*.json"))) >= 2
    # The task that waited for the held one started on the other device instead, while
    # the held one still ran (after that both devices are alike to the planner).
    first = json.loads((tmp_path / "slow" / "plans" / "plan-000.json").read_text())
    queues: dict[int, list[str]] = {}
    for a in sorted(first["assignments"], key=lambda a: a["start"]):
        queues.setdefault(a["device_ids"][0], []).append(a["task"])
    device, (held, waiting, *_) = next((d, q) for d, q in queues.items() if len(q) > 1)
    with RunStore(tmp_path / "slow") as store:
        moved = store.slices(waiting)[0]
        assert moved.device_ids == [1 - device], store.slices()
        assert moved.started_at < store.slices(held)[0].ended_at, store.slices()


@pytest.mark.timeout(900)  # a run, then its resume
@pytest.mark.parametrize(("signum", "code", "said"), [
    (signal.SIGINT, 130, "interrupted; every gang was stopped, checkpoints kept"),
    (signal.SIGTERM, 143, "terminated (SIGTERM); every gang was stopped, checkpoints kept"),
], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_every_gang_and_leaves_a_resumable_run(
        tmp_path: Path, signum: int, code: int, said: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """After the plans (CP-SAT's, of tasks with more than one option) the signal still
    stops the run cleanly: CP-SAT no longer takes SIGINT over, and SIGTERM is handled as
    Ctrl-C is (it killed the launcher with no message)."""
    file = write_workload(tmp_path)
    hold = tmp_path / "hold"
    env = {"DIONE_CATALOG": str(tmp_path / "catalog.sqlite"), "TASKS": "a b",
           "HOLD_FILE": str(hold), "TECHNIQUES": "single ddp"}
    run_dir = tmp_path / "run"
    run = started_dione("run", str(file), "--out", str(run_dir), "--devices", "cpu:2",
                "--slice-steps", "4", "--warmup-steps", "1", "--measure-steps", "3", env=env)
    deadline = time.monotonic() + 300
    wait_until_training(run, run_dir, deadline)
    # Training is under way (trials done): hold the next step any slice takes, so that a
    # slice is surely running when the interrupt lands (between slices none would be).
    hold.touch()
    held = Path(f"{hold}.held")
    while time.monotonic() < deadline and run.poll() is None and not held.exists():
        time.sleep(0.05)
    assert run.poll() is None and held.exists(), "the run ended before it could be interrupted"
    os.kill(run.pid, signum)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == code, out
    assert said in out
    # ... and what continues it (it named nothing to do next: review).
    assert f"checkpoints kept; `dione resume {run_dir}` continues it" in " ".join(out.split())
    with RunStore(run_dir) as store:
        statuses = [s.status for s in store.slices()]
        cut = {s.task for s in store.slices() if s.status == "interrupted"}
    assert "running" not in statuses and "interrupted" in statuses
    # `dione status` reads a stopped run as it reads a killed one: the task cut short is
    # interrupted (not pending), and resume is named.
    status = subprocess.run([sys.executable, "-m", "dione.cli", "status", str(run_dir)],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "stopped before its end" in status.stdout, status
    rows = {line.split("│")[1].strip(): line for line in status.stdout.splitlines()
            if line.count("│") > 3}
    assert cut and all("interrupted" in rows[task] for task in cut), status.stdout
    # The report, written as the run stopped, says the same (it kept the live page's last
    # rewrite, up to 30 s old: tasks done since read pending).
    summary = (run_dir / "report" / "summary.md").read_text()
    for line in status.stdout.splitlines():
        if line.count("│") > 3 and line.split("│")[1].strip() in ("a", "b"):
            name, state = (c.strip() for c in line.split("│")[1:3])
            assert f"| {name} | {state} |" in summary, (line, summary)

    hold.unlink()
    if signum != signal.SIGINT:
        return
    # The resumes in this process (a process of their own is what the run above shows).
    def resume(*args: str, **extra: str) -> tuple[int, str]:
        status, out, err = in_process(capsys, "resume", str(run_dir), *args,
                                      env={**env, **extra})
        return status, " ".join((out + err).split())

    # The workload moves before the resume (a project folder renamed): named, not lost.
    moved = file.rename(tmp_path / "moved.py")
    status, out = resume()
    assert status == 2 and "--workload NEW.py" in out, out
    # Another workload (none of the run's tasks) is not taken for it moved: its tasks
    # would be mixed into the run.
    status, out = resume("--workload", str(moved), TASK_PREFIX="other-")
    assert status == 2 and "holds none of the tasks of the run" in out, out
    status, out = resume("--workload", str(moved))
    assert status == 0, out
    assert json.loads((run_dir / "run.json").read_text())["workload"] == str(moved)


def test_dione_run_from_python_leaves_out_invalid_tasks(tmp_path: Path, monkeypatch) -> None:
    import dione

    monkeypatch.setenv("TASKS", "a b")
    workload = list(load_workload(write_workload(tmp_path)))
    bad = dataclasses.replace(workload[1], name="odd", steps=0)
    result = dione.run([*workload, bad], devices="cpu:2", run_dir=str(tmp_path / "run"),
                       catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK, time_limit=5.0)
    assert [(t.task, t.status) for t in result.tasks] == [("a", "done"), ("b", "done")]
    assert all(t.final_loss is not None and t.checkpoint for t in result.tasks)
    assert len(result.invalid) == 1 and "odd" in result.invalid[0]
    # Kept with the run: its report and status say the sweep was not whole.
    with RunStore(tmp_path / "run") as store:
        assert list(store.invalid()) == ["odd"] and "steps" in store.invalid()["odd"][0]
    summary = (tmp_path / "run" / "report" / "summary.md").read_text()
    assert "## Invalid tasks, never started" in summary and "- odd: steps: " in summary
    # A run dione.run started has no run.json: `dione resume` refuses it (review).
    assert "fix them, then calling dione.run (or dione.optuna.optimize) again with this " \
        "run directory trains them" in " ".join(summary.split())


def test_replanning_never_holds_a_launch_back(tmp_path: Path, monkeypatch) -> None:
    """Every re-plan's solve is held until the run ends: the run still trains every task
    to its end on the plan it has, since re-planning runs beside execution (it blocked
    the loop for the whole solve: 200 five-step tasks took 147 s against 6.5 s)."""
    import threading

    import dione.orchestrate.replanning as replanning

    released = threading.Event()
    real = replanning.solve
    asked: list[str] = []

    def held(problem, solver, limit, threads=None):
        if threading.current_thread().name.startswith("dione-replan"):
            asked.append(solver)
            released.wait(300)
        return real(problem, solver, limit, threads)

    monkeypatch.setattr(replanning, "solve", held)
    monkeypatch.setenv("TASKS", "a b c")
    tasks = list(load_workload(write_workload(tmp_path)))
    try:
        result = run_workload(tasks, Cluster([Node("test", 2, "cpu")]), tmp_path / "run",
                              RunOptions(catalog=str(tmp_path / "catalog.sqlite"),
                                         trial=QUICK, slice_steps=3, time_limit=5.0,
                                         replan_share=1.0))
    finally:
        released.set()
    assert [t.status for t in result.tasks] == ["done"] * 3
    assert asked  # slices ended and asked for plans, none of which came in time


def test_a_running_tasks_next_slice_keeps_its_place_on_the_devices_planned(
        tmp_path: Path, monkeypatch) -> None:
    """A re-plan moved a running task's next slice to device 1, before another task
    there: that task (b) does not take device 1 first although the running task is not
    pending yet (the plan's order on a device holds through slice boundaries)."""
    from dione.orchestrate.launching import launchable
    from dione.orchestrate.records import RunningSlice, TaskRecord, TaskStatus
    from dione.plan.plan import Assignment

    monkeypatch.setenv("TASKS", "a b c")
    a, b, c = load_workload(write_workload(tmp_path))

    def on(task: str, device: int, start: float) -> Assignment:
        return Assignment(task, "single", {}, "test", (device,), start, start + 10.0)

    records = {t.name: TaskRecord(t, 12, 4, TaskStatus.PENDING) for t in (a, b, c)}
    records["a"].status = TaskStatus.RUNNING
    records["a"].running = RunningSlice(on("a", 0, 0.0), 0.0, 4, 8, 5.0, 5.0)
    plan = [on("a", 1, 5.0), on("b", 1, 15.0), on("c", 0, 5.0)]
    assert [x.task for x in launchable(plan, records)] == []  # c waits for device 0
    records["a"].running, records["a"].status = None, TaskStatus.PENDING
    assert [x.task for x in launchable(plan, records)] == ["a", "c"]


def test_a_stalled_slice_is_cancelled_and_retried(tmp_path: Path, monkeypatch) -> None:
    """A slice past its prediction's multiple (and the grace) is cancelled, recorded as
    such, and retried (a hang stalled the run for ever by default)."""
    hold = tmp_path / "hold"
    monkeypatch.setenv("TASKS", "a")
    monkeypatch.setenv("HOLD_FILE", str(hold))
    tasks = list(load_workload(write_workload(tmp_path)))
    events = []

    def heard(event) -> None:
        events.append(event)
        if event.kind == "planned":  # after the trials: the first slice hangs
            hold.touch()
        if event.kind == "slice_cancelled":
            hold.unlink(missing_ok=True)  # the retry goes through

    run_dir = tmp_path / "run"
    # A grace of seconds, not the default minute, yet enough that the retry (a slice's
    # start-up on a loaded machine) is not taken for a stall too: 0.3 s alone, but past
    # 6 s once, beside a Ray test and a gang on two cores.
    result = run_workload(tasks, Cluster([Node("test", 1, "cpu")]), run_dir,
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                                     time_limit=2.0, stall_factor=2.0, stall_grace=15.0),
                          on_event=heard)
    assert result.task("a").status == "done"
    assert [e.kind for e in events].count("slice_cancelled") == 1
    with RunStore(run_dir) as store:
        first, second = store.slices("a")
    assert first.status == "interrupted" and "stalled" in (first.error or "")
    assert second.status == "done" and second.start_step == 0


def test_the_live_table_says_how_each_task_trained_only_once_it_trained(
        tmp_path: Path, monkeypatch) -> None:
    """The live table's "trained" column: '-' for a task with no step yet (it read
    "exact" before its first slice, although its plan may be an opted-in xpipe)."""
    from rich.console import Console

    from dione.orchestrate.progress import LiveProgress
    from dione.orchestrate.records import RunState, TaskRecord, TaskStatus

    monkeypatch.setenv("TASKS", "a b c")
    a, b, c = load_workload(write_workload(tmp_path))
    state = RunState({"a": TaskRecord(a, 12, 0, TaskStatus.PENDING),
                      "b": TaskRecord(b, 12, 4, TaskStatus.PENDING),
                      "c": TaskRecord(c, 12, 4, TaskStatus.PENDING, inexact=True)}, [])
    console = Console(record=True, width=120)
    console.print(LiveProgress.render(state))
    rows = {line.split()[0]: line.split()[-1] for line in console.export_text().splitlines()
            if line.split()[0:1] in (["a"], ["b"], ["c"])}
    assert rows == {"a": "-", "b": "exact", "c": "INEXACT"}


def test_the_live_table_keeps_names_apart_and_figures_whole_on_a_narrow_terminal() -> None:
    """On 80 columns grid names read "gpt2-lr0…" all alike and figures "0.…"; an ended
    task showed the devices of a stale plan; the last frame said "estimated finish at
    0 s"."""
    from rich.console import Console

    from dione.orchestrate.progress import LiveProgress
    from dione.orchestrate.records import RunState, TaskRecord, TaskStatus
    from dione.plan.plan import Assignment
    from helpers import digits_task

    names = [f"gpt2-lr{lr}-batch_size16" for lr in ("0.01", "0.003", "0.0001")]
    records = {n: TaskRecord(digits_task(n), 60, 20, status) for n, status in
               zip(names, (TaskStatus.PENDING, TaskStatus.DONE, TaskStatus.STOPPED),
                   strict=True)}
    for record in records.values():
        record.last_loss = 1.23456
    plan = [Assignment(n, "single", {}, "vm", (i,), 0.0, 100.0) for i, n in enumerate(names)]
    console = Console(record=True, width=80)
    console.print(LiveProgress.render(RunState(records, plan)))
    text = console.export_text()
    cells = ["".join(line.split("│")[0].strip() for line in text.splitlines()[3:]
                     if "│" in line)]
    for name in names:  # folded onto lines, whole
        assert name in cells[0], text
    assert text.count("1.2346") == 3 and text.count("20/60") == 3, text
    assert text.count("vm:") == 1, text  # the pending one's plan only
    assert "estimated finish" in text
    ended = {n: records[n] for n in names[1:]}
    console = Console(record=True, width=80)
    console.print(LiveProgress.render(RunState(ended, plan)))
    assert "nothing left to train" in console.export_text()


def test_the_live_table_left_on_screen_is_the_runs_end() -> None:
    """An update within 0.4 s of the last drawn one is skipped, and none was drawn at the
    end: the run's last frame showed a task "pending 80/90" after "[finished]" (review)."""
    import io

    from rich.console import Console

    from dione.orchestrate.progress import LiveProgress
    from dione.orchestrate.records import RunState, TaskRecord, TaskStatus
    from helpers import digits_task

    record = TaskRecord(digits_task("t"), 90, 80, TaskStatus.PENDING)
    state = RunState({"t": record}, [])
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100, height=30)
    with LiveProgress(console) as live:
        live.update(state)  # drawn
        record.done_steps, record.status = 90, TaskStatus.DONE
        live.update(state)  # within 0.4 s: skipped
    last = screen.getvalue().rsplit("task", 1)[-1]  # the last frame drawn
    assert "90/90" in last and "80/90" not in last, screen.getvalue()


def test_the_live_table_of_a_sweep_shows_what_runs_first_and_fits_the_terminal() -> None:
    """48 tasks on 24 lines: rich cropped the table from the bottom, so the first tasks
    by name showed all run long, never the running ones nor the finish estimate, which
    came after the table."""
    from rich.console import Console

    from dione.orchestrate.progress import LiveProgress
    from dione.orchestrate.records import RunningSlice, RunState, TaskRecord, TaskStatus
    from dione.plan.plan import Assignment
    from helpers import digits_task

    names = [f"t{i:02d}" for i in range(48)]
    records = {n: TaskRecord(digits_task(n), 60, 60 if i < 20 else 0,
                             TaskStatus.DONE if i < 20 else TaskStatus.PENDING)
               for i, n in enumerate(names)}
    plan = [Assignment(n, "single", {}, "vm", (0,), float(100 - i), float(101 - i))
            for i, n in enumerate(names[20:])]
    for n in ("t40", "t41"):
        records[n].status = TaskStatus.RUNNING
        records[n].running = RunningSlice(Assignment(n, "ddp", {}, "vm", (0, 1), 0.0, 9.0),
                                          0.0, 0, 10, 9.0, 9.0)
    console = Console(record=True, width=100)
    console.print(LiveProgress.render(RunState(records, plan), rows=10))
    lines = console.export_text().splitlines()
    assert lines[0].startswith("elapsed") and "2 running, 26 pending, 20 done" in lines[0]
    shown = [line.split("│")[0].strip() for line in lines[3:] if "│" in line]
    # Running first, then pending by planned start (the later-listed start sooner); the
    # last row says what it stands for in the name's column (in status it took the
    # width the names needed on 80 columns: review).
    assert shown == ["t40", "t41", "t47", "t46", "t45", "t44", "t43", "t42", "t39",
                     "... 39 more: 19 pending, 20 done"], lines


def test_the_live_table_of_a_grid_on_80_by_24_names_its_tasks_and_fits(tmp_path) -> None:
    """A grid's long names on 80 columns: the last row's counts took the status column's
    width and left the names none; each row folded over lines, so the table ran off the
    screen. Each shown name is whole, the last column whole, and it fits the height."""
    import io
    import re

    from rich.console import Console

    from dione.orchestrate.progress import LiveProgress
    from dione.orchestrate.records import RunState, TaskRecord, TaskStatus
    from dione.plan.plan import Assignment
    from helpers import digits_task

    names = [f"d-lr0.0001-width128-batch_size64-seed{i}" for i in range(48)]
    records = {n: TaskRecord(digits_task(n), 1200, 0, TaskStatus.PENDING) for n in names}
    plan = [Assignment(n, "single", {}, "vm", (0,), float(i), float(i + 1))
            for i, n in enumerate(names)]
    out = io.StringIO()
    console = Console(file=out, width=80, height=24, force_terminal=True)
    with LiveProgress(console) as live:
        live.update(RunState(records, plan))
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).splitlines()
    table = [line for line in drawn if "│" in line]
    assert table and len(drawn) <= 24 - 8 + 2, drawn
    assert all(line.rstrip().endswith(("-", "trained", "│")) or "exact" in line
               for line in table), drawn
    cells = "".join(line.split("│")[0].strip() for line in table[1:])
    assert names[0] in cells and "more:" in cells, drawn
    # Narrower: the least needed columns go, the figures stay whole (cropped, 72 columns
    # read "tr" for "trained", 60 lost the ETAs).
    for width, header in ((72, ["task", "status", "technique", "devices", "step", "loss",
                                "ETA s"]),
                          (64, ["task", "status", "devices", "step", "loss", "ETA s"])):
        out = io.StringIO()
        console = Console(file=out, width=width, height=24, force_terminal=True)
        with LiveProgress(console) as live:
            live.update(RunState(records, plan))
        drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).splitlines()
        heads = next(line for line in drawn if "status" in line)
        assert [h.strip() for h in heads.split("│")] == header, drawn
        assert max(len(line) for line in drawn) <= width


def test_a_results_table_too_wide_for_the_terminal_reads_as_lines(monkeypatch) -> None:
    """Squeezed into 80 columns the closing table folded each name one or two letters a
    line and kept no figure readable."""
    from rich.console import Console

    import dione.cli.views as views

    columns = ["task", "status", "techniques", "devices", "seconds", "final loss",
               "accuracy", "test_loss", "trained"]
    rows = [[f"digits-mlp-lr{lr}-batch_size16", "done", "single", "1", "0.2", "2.2736",
             "0.2444", "2.2829", "exact"] for lr in ("0.001", "0.0001")]
    for width, table in ((80, False), (140, True)):
        console = Console(record=True, width=width)
        monkeypatch.setattr(views, "console", console)
        views._print_rows("results", columns, rows, left=("status",))
        text = " ".join(console.export_text().split())  # a line wraps at the width
        assert ("┃ task" in text) == table, text
        assert ("digits-mlp-lr0.0001-batch_size16: status done, techniques single, devices "
                "1, seconds 0.2, final loss 2.2736, accuracy 0.2444, test_loss 2.2829, "
                "trained exact" in text) != table, text


def test_the_same_error_twice_on_one_node_of_several_is_retried_not_failed() -> None:
    """A Ray node that failed every slice it got: the task's retry landed there again
    and the task was failed as its own bug ("fix the task"), though a resume then
    trained it on the other node unchanged (review). Twice on one node of several is
    retried, said as the node's doing; twice on two nodes, or where no other node can
    hold the task, is the task's."""
    from types import SimpleNamespace

    from dione.launch.slice import SliceError
    from dione.orchestrate.options import RunEvent
    from dione.orchestrate.records import TaskRecord, TaskStatus
    from dione.orchestrate.runner import Runner
    from helpers import digits_task

    events: list[RunEvent] = []
    given_up: list[str] = []

    def runner(nodes: list[Node]) -> Any:
        fake = SimpleNamespace(options=RunOptions(max_failures=5), cluster=Cluster(nodes),
                               emit=events.append, _fewest_devices=lambda name: {None: 1},
                               _give_up=lambda record, error, said: given_up.append(said),
                               raised_on={}, trained_on={}, now=lambda: 0.0,
                               state=SimpleNamespace(records={}, plan=[]))
        for method in ("_holds", "_elsewhere", "_note_raised", "_shunned", "_at_fault",
                       "_steer_off", "_avoided"):
            setattr(fake, method, functools.partial(getattr(Runner, method), fake))
        return fake

    def fail(fake: Any, record: TaskRecord, node: str) -> None:
        Runner._failed(fake, record, SliceError("rank 0 raised OSError: bad disk", "raised",
                                                "OSError"), 0, node)

    two = runner([Node("a", 2, "cpu"), Node("b", 2, "cpu")])
    record = two.state.records["t"] = TaskRecord(digits_task("t"), 10, 0, TaskStatus.PENDING)
    fail(two, record, "a")
    fail(two, record, "a")
    assert not given_up and record.status == TaskStatus.PENDING
    assert "the same error on node a again: the node may be at fault" in events[-1].message
    fail(two, record, "b")  # the same on another node: the task's own
    assert len(given_up) == 1 and "failed twice in a slice from step 0" in given_up[0]
    alone = runner([Node("a", 2, "cpu")])
    record = alone.state.records["u"] = TaskRecord(digits_task("u"), 10, 0,
                                                   TaskStatus.PENDING)
    fail(alone, record, "a")
    fail(alone, record, "a")  # no other node to blame: the task's
    assert len(given_up) == 2
    # Two tasks raising the same error on a node that trained nothing since: the node is
    # at fault, their failures there forgiven, and the same error again on another node
    # is not read as a task's own bug (with two faulty nodes of three, tasks failed for
    # good that the third could train: review).
    three = runner([Node("a", 2, "cpu"), Node("b", 2, "cpu"), Node("c", 2, "cpu")])
    first, second = (TaskRecord(digits_task(n), 10, 0, TaskStatus.PENDING) for n in "vw")
    three.state.records.update(v=first, w=second)
    fail(three, first, "a")
    fail(three, second, "a")
    assert "the node is at fault" in events[-1].message
    assert (first.failures, second.failures) == (0, 0)
    fail(three, first, "b")
    fail(three, first, "b")  # twice on b: b may be at fault, retried (a is known bad)
    assert len(given_up) == 2 and first.status == TaskStatus.PENDING
    # A task's own error on a node that trains others well: twice there is retried
    # (another node holds it), then once elsewhere is the task's.
    three.trained_on["c"] = 1.0
    three.now = lambda: 2.0
    fail(three, second, "c")
    fail(three, second, "c")
    assert len(given_up) == 2 and "the same error on node c again" in events[-1].message
