"""A run that grows: tasks added while it trains (Python's TaskInbox, `dione add`) are
validated, profiled from the catalog where it knows their speed, planned and trained;
bad ones are refused without harm to the others; a request a stopped run missed is
trained by its resume."""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dione.cli import main
from dione.orchestrate import RunOptions, run_workload
from dione.orchestrate.additions import TaskInbox
from dione.profile import TrialOptions
from dione.spec.cluster import Cluster
from dione.spec.stopping import Asha
from dione.spec.workload import load_workload
from dione.state.store import RunStore
from helpers import (
    TEST_NODE,
    digits_task,
    dione,
    in_process,
    started_dione,
    wait_until_training,
    workload_text,
)

QUICK = TrialOptions(warmup_steps=1, measure_steps=3, timeout=120)


def growing(folder: Path, rates: list[float]) -> Path:
    """The growing sweep's workload file in ``folder``, with these learning rates."""
    (folder / "rates.json").write_text(json.dumps(rates))
    file = folder / "growing.py"
    file.write_text(workload_text("growing"))
    return file


def _batch_normed() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16),
                               torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 10))


def test_tasks_added_from_python_are_trained_and_bad_ones_refused(tmp_path: Path) -> None:
    tasks = list(load_workload(growing(tmp_path, [1e-2, 3e-2])))
    first = tasks[0]

    def rate(lr: float, name: str | None = None):  # a task of the sweep's own functions
        return replace(first, name=name or f"lr-{lr:g}", hyperparameters={"lr": lr},
                       optimizer=functools.partial(torch.optim.Adam, lr=lr))

    inbox = TaskInbox()
    events = []
    done: set[str] = set()
    ended = threading.Event()

    def heard(event) -> None:
        events.append(event)
        if event.kind == "slice_finished" and not hasattr(heard, "asked"):
            heard.asked = True  # mid-run: a good one, a name taken, an invalid one
            inbox.add(rate(1e-1), rate(5e-2, name="lr-0.01"),
                      replace(rate(2e-2), name="bad", batch_size=0),
                      # No technique it allows trains it (fsdp refuses BatchNorm, and
                      # proposes nothing on one CPU device): refused at once (review).
                      replace(rate(4e-2), name="untrainable", model=_batch_normed,
                              techniques=("fsdp",)))
        if event.kind == "slice_finished" and event.message.endswith("done"):
            done.add(event.task)
            if done == {"lr-0.01", "lr-0.03", "lr-0.1"}:
                ended.set()

    def late() -> None:
        # Once everything it had is done, the run still waits for the open inbox: a task
        # added then is trained too, and the run ends once the inbox is closed.
        ended.wait(300)
        # A speed the catalog does not know; a rule no other task shares, said as at a
        # run's start (an addition said nothing: a review).
        inbox.add(replace(rate(3e-1), batch_size=8, stopping=Asha(min_steps=4)))
        inbox.close()

    closer = threading.Thread(target=late)
    closer.start()
    result = run_workload(tasks, Cluster([TEST_NODE]), tmp_path / "run",
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                                     slice_steps=4),
                          on_event=heard, inbox=inbox)
    closer.join()
    assert [t.task for t in result.tasks] == ["lr-0.01", "lr-0.03", "lr-0.1", "lr-0.3"]
    assert all(t.status == "done" and t.steps == 8 for t in result.tasks), result.tasks
    assert set(inbox.refused) == {"lr-0.01", "bad", "untrainable"}
    assert "no technique it allows (fsdp)" in inbox.refused["untrainable"]
    assert "already has a task named 'lr-0.01'" in inbox.refused["lr-0.01"]
    assert "batch_size" in inbox.refused["bad"]
    added = [e for e in events if e.kind == "task_added"]
    assert [e.task for e in added] == ["lr-0.1", "lr-0.3"]
    # The catalog knew the speed of a new learning rate: no trial ran for it; another
    # batch size got its trials first.
    assert "(0 trial(s) run, 1 taken from the catalog)" in added[0].message, added
    assert "(0 trial(s)" not in added[1].message, added
    [lonely] = [e for e in events if e.kind == "stopping_rule_doubtful"]
    assert lonely.message.startswith("lr-0.3 (added to the run): its stopping rule compares")
    kinds = [e.kind for e in events]
    assert "replanned" in kinds[kinds.index("task_added"):] or \
        "planned" in kinds[kinds.index("task_added"):]
    with RunStore(tmp_path / "run") as store:
        assert {t.name for t in store.tasks()} == {"lr-0.01", "lr-0.03", "lr-0.1", "lr-0.3"}
        assert [s.end_step for s in store.slices("lr-0.1")] == [4, 8]
        assert store.latest_checkpoint("lr-0.3").step == 8
        # The added task trained as its own run would: its hyperparameters recorded.
        assert store.task("lr-0.1").hyperparameters == {"lr": 0.1}


def test_a_name_an_add_took_is_not_the_inbox_s_and_a_task_diverging_in_profiling_diverged(
        tmp_path: Path) -> None:
    """An Optuna trial whose name `dione add` took first waited for ever, the run with it:
    the add's task was recorded as the inbox's, so the searcher never heard its own was
    refused. A task whose every trial diverged ended failed (a searcher proposed it
    again), said before it was said added."""
    file = growing(tmp_path, [1e-2, 3e-2])
    tasks = list(load_workload(file))
    with RunStore(tmp_path / "run") as store:
        store.add_tasks(str(file), ["lr-0.03"])  # a `dione add` before the run's start
    inbox = TaskInbox()
    refused: list[str] = []
    inbox.on_refused = lambda name, why: refused.append(name)
    events = []

    def heard(event) -> None:
        events.append(event)
        if event.kind == "slice_finished" and not hasattr(heard, "asked"):
            heard.asked = True  # the searcher's own task of that name; one diverging
            inbox.add(replace(tasks[0], name="lr-0.03", hyperparameters={"lr": 0.5},
                              optimizer=functools.partial(torch.optim.Adam, lr=0.5)),
                      replace(tasks[0], name="huge", hyperparameters={"lr": 1e30}, batch_size=8,
                              optimizer=functools.partial(torch.optim.Adam, lr=1e30)))
            inbox.close()

    result = run_workload(tasks[:1], Cluster([TEST_NODE]), tmp_path / "run",
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                                     slice_steps=4),
                          on_event=heard, inbox=inbox)
    assert refused == ["lr-0.03"] and "already has a task named" in inbox.refused["lr-0.03"]
    assert set(inbox.taken) == {"huge"}  # not the add's lr-0.03
    statuses = {t.task: t.status for t in result.tasks}
    assert statuses == {"lr-0.01": "done", "lr-0.03": "done", "huge": "diverged"}
    kinds = [(e.kind, e.task) for e in events if e.task == "huge"]
    assert kinds.index(("task_added", "huge")) < kinds.index(("task_diverged", "huge"))
    with RunStore(tmp_path / "run") as store:
        assert store.task("huge").status == "diverged"
        assert "diverged in its profiling trial" in (store.task("huge").error or "")


def test_a_run_with_an_inbox_may_start_with_no_task(tmp_path: Path) -> None:
    """dione.run([], inbox=...) refused ("the workload has no tasks"), though a run with
    an open inbox waits for its tasks: a searcher whose first proposals come later."""
    import dione

    tasks = list(load_workload(growing(tmp_path, [1e-2])))
    inbox = TaskInbox()

    def later() -> None:
        time.sleep(1.0)
        inbox.add(tasks[0])
        inbox.close()

    feeder = threading.Thread(target=later)
    feeder.start()
    result = dione.run([], devices="cpu:1", run_dir=str(tmp_path / "run"), quiet=True,
                       inbox=inbox, catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK)
    feeder.join()
    assert [(t.task, t.status) for t in result.tasks] == [(tasks[0].name, "done")]
    with pytest.raises(ValueError, match="devices must be text as --devices takes it"):
        dione.run(tasks, devices=2, run_dir=str(tmp_path / "other"))  # type: ignore[arg-type]
    # A wrong type is named by its argument, not met deep inside ("'int' object is not
    # iterable"); a bad device text is refused before run.json records it.
    with pytest.raises(TypeError, match="workload must be a workload file's path"):
        dione.run(3, run_dir=str(tmp_path / "other"))
    with pytest.raises(TypeError, match="run_dir must be a folder's path"):
        dione.run(tasks, run_dir=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="latest must be True or False"):
        dione.load(tmp_path / "run", tasks[0].name, workload=tasks,
                   latest="no")  # type: ignore[arg-type]
    (tmp_path / "f").mkdir()
    file = growing(tmp_path / "f", [1e-2])
    with pytest.raises(Exception, match="devices"):
        dione.run(str(file), devices="foo", run_dir=str(tmp_path / "bad"))
    assert not (tmp_path / "bad" / "run.json").exists()


def add(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`dione add ARGS` in this process (torch's import paid once): status, its output."""
    capsys.readouterr()
    status = main(["add", *args])
    out, err = capsys.readouterr()
    return status, out + err


def test_dione_add_reaches_a_live_run_and_a_stopped_one_trains_it_on_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = growing(tmp_path, [1e-2, 3e-2])
    hold = tmp_path / "hold"
    env = {"DIONE_CATALOG": str(tmp_path / "catalog.sqlite"), "HOLD_FILE": str(hold)}
    run_dir = tmp_path / "run"
    run = started_dione("run", str(file), "--out", str(run_dir), "--devices", "cpu:2",
                        "--slice-steps", "4", "--warmup-steps", "1", "--measure-steps", "3",
                        env=env)
    try:
        wait_until_training(run, run_dir, time.monotonic() + 300)
        hold.touch()  # training is under way: the run stays live until the hold goes
        # The user grows the sweep's file by one rate and adds what is new to the run.
        (tmp_path / "rates.json").write_text(json.dumps([1e-2, 3e-2, 1e-1]))
        status, said = add(capsys, str(run_dir), str(file))
        assert status == 0 and "the run took them: added lr-0.1" in said, said
        # A name the run has is refused, naming the fix; the run is untouched.
        status, said = add(capsys, str(run_dir), str(file), "--task", "lr-0.01")
        assert status == 2 and "already has task(s) lr-0.01" in said, said
        hold.unlink()
        out, _ = run.communicate(timeout=300)
    finally:
        hold.unlink(missing_ok=True)
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out
    assert "lr-0.1" in out
    with RunStore(run_dir) as store:
        assert store.latest_checkpoint("lr-0.1").step == 8
        assert [a.state for a in store.additions()] == ["taken"]
    # A stopped run takes the request when resumed.
    (tmp_path / "rates.json").write_text(json.dumps([1e-2, 3e-2, 1e-1, 3e-1]))
    status, said = add(capsys, str(run_dir), str(file))
    assert status == 0 and "no launcher runs it now" in said, said
    waiting = dione("status", str(run_dir))
    assert "asked to add lr-0.3" in waiting.stdout and "not taken yet" in waiting.stdout

    def resume() -> str:
        """`dione resume` in this process (no interpreter and spawner of its own)."""
        status, out, err = in_process(capsys, "resume", str(run_dir), env=env)
        assert status == 0, out + err
        return out + err

    resumed = resume()
    with RunStore(run_dir) as store:
        assert store.latest_checkpoint("lr-0.3").step == 8
        assert [a.state for a in store.additions()] == ["taken", "taken"]
        slices = store.slices("lr-0.1")
    assert [s.end_step for s in slices] == [4, 8]  # not trained again by the resume
    status = dione("status", str(run_dir))
    assert "lr-0.3" in status.stdout
    # A resume takes the earlier requests again, quietly: it said "(workload): not
    # added: the workload has no tasks" and rewrote what each request's record says.
    assert "(workload)" not in resumed
    with RunStore(run_dir) as store:
        said_before = [a.message for a in store.additions()]
    assert said_before[0].startswith("added lr-0.1"), said_before
    again = resume()
    assert "not added" not in again
    assert "added to the run" not in again
    # Nothing left to train: no session figures ("first plan 0.0 s") beside the run's.
    assert "nothing trained this session" in " ".join(again.split())
    with RunStore(run_dir) as store:
        assert [a.message for a in store.additions()] == said_before


def test_dione_add_names_what_is_wrong(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    file = growing(tmp_path, [1e-2])
    status, said = add(capsys, str(tmp_path / "nothing"), str(file))
    # A folder that is not there is said so (it read as one that is not a run's).
    assert status == 2 and f"{tmp_path / 'nothing'} does not exist; start a run" in said, said
    status, _, err = in_process(capsys, "status", str(tmp_path / "nothing"))
    assert status == 2 and "nothing does not exist: give the folder `dione run --out` " \
        "wrote" in " ".join(err.split()), err
    status, said = add(capsys, str(tmp_path), str(file))
    assert status == 2 and "is not a dione run directory" in said, said
    run_dir = tmp_path / "run"
    with RunStore(run_dir) as store:
        store.register_task("lr-0.01", 8, 16)
    status, said = add(capsys, str(run_dir), str(file), "--task", "lr-9")
    assert status == 2 and "defines no task 'lr-9'" in said, said
    status, said = add(capsys, str(run_dir), str(file))
    assert status == 2 and "in the run already;" in said, said  # the same training
    # A task of the file changed since, under the same name: said, not "already in".
    other = tmp_path / "other"
    with RunStore(other) as store:
        store.register_task("lr-0.01", 20, 16, settings={"optimizer": "Adam(lr=0.5)"})
    status, said = add(capsys, str(other), str(file))
    assert status == 2 and "in the run already by name, though the file trains lr-0.01 " \
        "(optimizer: Adam(lr=0.5) -> Adam(lr=0.01); steps: 20 -> 8) otherwise than the " \
        "run does" in " ".join(said.split()), said
    with RunStore(run_dir) as store:
        assert store.additions() == []  # nothing asked of the run
    # Some of the file's tasks invalid: the others asked for, and the exit status says
    # one was left out (it was 0, as if every task had been taken).
    growing(tmp_path, [1e-2, 3e-2, -1.0])
    status, said = add(capsys, str(run_dir), str(file))
    assert status == 1 and "invalid: task 'lr--1'" in said, said
    with RunStore(run_dir) as store:
        assert [a.names for a in store.additions()] == [["lr-0.03"]]
        [request] = store.additions()
    # A run that ends while `dione add` waits for it: said at once (it waited its whole
    # 60 s and guessed the run was profiling them: a review).
    from dione.cli.commands.add import _wait_for

    # "ended", not None: None is what the whole wait's end gives.
    assert _wait_for(run_dir, request.id, 60.0) == ("ended", None)


def test_two_adds_of_one_file_add_its_tasks_once_and_say_so_to_each(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two `dione add`s of one file at once: both requests were settled refused while
    their tasks trained (the refusal was kept by task name, so the request that added
    them read it too), and the live log said "not added" after "added"."""
    from dione.orchestrate.additions import _intake, request_message
    from dione.state.store import AlreadyInRun

    file = growing(tmp_path, [-1.0, -2.0])  # refused by validation: nothing to profile
    with RunStore(tmp_path / "run") as store:
        first = store.add_tasks(str(file), ["lr--1", "lr--2"])
        # What the second `dione add` now meets, checked as the request is recorded.
        with pytest.raises(AlreadyInRun, match="the run already has task"):
            store.add_tasks(str(file), ["lr--1"], unless_present=True)
        second = store.add_tasks(str(file), ["lr--1"])  # as one that slipped past before
        requests = store.additions("waiting")
    arrival = _intake([], requests, set(), None, None)  # type: ignore[arg-type]
    state, said = request_message(requests[0], arrival)
    assert requests[0].id == first and state == "refused" and "learning rate" in said, said
    state, said = request_message(requests[1], arrival)
    assert requests[1].id == second and state == "refused"
    assert said == f"lr--1: request {first} asks for it as well: it is that request's"
    assert set(arrival.refused) == {"lr--1", "lr--2"}  # each task's own refusal, once


def test_a_file_defining_a_name_twice_is_refused_by_dione_add_and_by_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Which of the two was asked for no one can tell: the last was trained silently
    (`dione validate` refuses such a file; `dione add` took it)."""
    from dione.orchestrate.additions import _intake

    file = growing(tmp_path, [1e-2, 3e-2])
    run_dir = tmp_path / "run"
    with RunStore(run_dir) as store:
        store.register_task("other", 8, 16)
        request = store.add_tasks(str(file), ["lr-0.03"])  # before the file changed
    growing(tmp_path, [1e-2, 3e-2, 3e-2])
    status, said = add(capsys, str(run_dir), str(file))
    assert status == 2 and "defines more than one task named 'lr-0.03'" in said, said
    with RunStore(run_dir) as store:
        requests = store.additions("waiting")
    assert [r.id for r in requests] == [request]  # nothing more asked of the run
    arrival = _intake([], requests, {"other"}, None, None)  # type: ignore[arg-type]
    assert "defines more than one task named 'lr-0.03'" in arrival.requests_refused[request]


def test_a_task_changed_since_the_run_recorded_it_is_left_out_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One task edited between a run and its resume (another learning rate) refused the
    whole resume, and the others stayed untrained (a review). That task alone is left as
    it was, invalid this session, and said so; the others train."""
    import dione

    run, catalog = str(tmp_path / "run"), str(tmp_path / "catalog.sqlite")
    first = [digits_task("a", steps=2), digits_task("b", steps=2)]
    dione.run(first, devices="cpu:1", run_dir=run, quiet=True, catalog=catalog, trial=QUICK)
    edited = [replace(first[0], optimizer=functools.partial(torch.optim.Adam, lr=0.1)),
              first[1], digits_task("c", steps=2)]
    events: list = []
    result = dione.run(edited, devices="cpu:1", run_dir=run, quiet=True, catalog=catalog,
                       trial=QUICK, on_event=events.append)
    assert {t.task: t.status for t in result.tasks if t.task != "a"} == {"b": "done",
                                                                          "c": "done"}
    with RunStore(run) as store:
        (why,) = store.invalid()["a"]
        assert store.task("a").status == "done"  # its record stands, as it was
    assert "with other training (optimizer: Adam(lr=0.01) -> Adam(lr=0.1))" in why, why
    refused = [e.message for e in events if e.kind == "task_refused"]
    assert len(refused) == 1 and refused[0].startswith("a: not trained this session: "), refused
    # Given, if invalid: not "not in the workload given" (a review).
    assert not any(e.kind == "task_left_out" for e in events)
    assert result.invalid == [why]
    # Status and the report say it trained before and is left as it was, not "never
    # started".
    status, out, _ = in_process(capsys, "status", run)
    said = " ".join(out.split())
    assert status == 0 and "3 of 3 task(s) done, 1 left as it was (changed since the run " \
        "recorded it, or invalid now)" in said and "a (invalid, left as it was): task 'a' was " \
        "recorded" in said and "never started" not in said and "invalid (" not in said, said
    summary = (Path(run) / "report" / "summary.md").read_text()
    assert "## Tasks left as they were" in summary and "never started" not in summary
    assert "- a (done at step 2): task 'a' was recorded" in summary
    # A finished task whose model was edited (a notebook cell run again) was given the
    # old model's results, unsaid: no slice ran to find its checkpoint did not fit (a
    # review). Its model's shapes are recorded, and a change is said (not refused: a
    # false change must not keep a task from its resume).
    from dione.zoo import digits_mlp

    narrow = replace(first[1], model=functools.partial(digits_mlp, hidden=16, depth=1))
    with pytest.warns(UserWarning, match="training_changed") as caught:
        again = dione.run([first[0], narrow, edited[2]], devices="cpu:1", run_dir=run,
                          quiet=True, catalog=catalog, trial=QUICK)
    (said,) = [str(w.message) for w in caught if "model:" in str(w.message)]
    assert re.search(r"b: model: Sequential of 3,466 parameters \(shapes \w+, layers \w+\) "
                     r"-> Sequential of 1,210 parameters \(shapes \w+, layers \w+\) since the "
                     r"run recorded "
                     r"it: the task has ended \(done\)", said), said
    assert again.invalid == []


def test_the_problems_of_a_task_with_no_name_are_not_a_task_named_workload() -> None:
    """A task named "" was listed as "workload", beside a task of that name (a review)."""
    from dione.orchestrate.run import invalid_by_task
    from dione.spec.validate import Problem

    assert invalid_by_task([Problem("", "name", "must be ..."), Problem(None, "tasks", "x"),
                            Problem("workload", "steps", "y")]) == {
        "(a task with no name)": ["name: must be ..."], "(the workload)": ["tasks: x"],
        "workload": ["steps: y"]}
