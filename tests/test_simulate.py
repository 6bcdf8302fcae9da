"""The virtual cluster: the real orchestrator on a simulated clock (``dione simulate``)."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from dione import clock
from dione.launch.slice import SliceError
from dione.orchestrate.launching import launchable
from dione.orchestrate.options import RunEvent, RunOptions
from dione.orchestrate.plans import read_plans
from dione.orchestrate.replanning import PlanCandidate, solve_or_fall_back
from dione.orchestrate.runner import VIRTUAL_SECONDS_PER_UNIT, Runner
from dione.plan import NodeSpec, Option, PlanningProblem, TaskOptions, check_plan, solve
from dione.simulate import (
    Scenario,
    ScenarioError,
    VirtualClock,
    current_practice,
    load_scenario,
    parse_cluster,
    simulate,
)
from dione.simulate.launching import SimulatedLaunching, VirtualCluster
from dione.simulate.workload import problem_cluster, problem_workload
from dione.spec.cluster import Cluster
from dione.state.store import RunStore
from helpers import dione, in_process, small_problem

OPTIONS = RunOptions(solver="cpsat", time_limit=2.0, replan_time_limit=0.5,
                     slice_seconds=60.0, replan_interval=600.0)


@contextmanager
def virtual_runner(run_dir: Path, options: RunOptions = OPTIONS,
                   scenario: Scenario = Scenario()  # noqa: B008 (frozen)
                   ) -> Iterator[tuple[Runner, VirtualClock]]:
    """A runner of ``small_problem(4)`` (20 steps a task) on a virtual clock, for a test
    to drive by hand, its store closed at the end."""
    problem = small_problem(4)
    cluster = problem_cluster(problem)
    tasks, profile = problem_workload(problem, 20, cluster, None)
    virtual = VirtualClock()
    with clock.using(virtual):
        machines = VirtualCluster(virtual, scenario)
        launching = SimulatedLaunching(run_dir, profile, virtual, scenario, machines)
        runner = Runner(tasks, cluster, run_dir, profile, options, lambda e: None,
                        lambda s: None, machines, launching=launching, virtual=True)
        try:
            yield runner, virtual
        finally:
            runner.store.close()


def test_the_virtual_clock_runs_events_in_time_order_and_jumps_to_them() -> None:
    virtual = VirtualClock()
    ran: list[str] = []
    first: Future[str] = Future()
    virtual.at(30.0, lambda: ran.append("b"))
    virtual.at(10.0, lambda: ran.append("a"))
    virtual.at(30.0, lambda: (ran.append("c"), first.set_result("c")))
    assert virtual.wait_any([first], 5.0) == set() and virtual.now() == 5.0  # nothing due
    assert virtual.wait_any([first], 100.0) == {first}
    assert ran == ["a", "b", "c"] and virtual.now() == 30.0  # ties in the order scheduled
    virtual.at(1.0, lambda: ran.append("late"))  # in the past: at once, not back in time
    virtual.wait_any([], 0.0)
    assert ran[-1] == "late" and virtual.now() == 30.0


def test_a_simulation_reads_no_wall_clock_and_repeats_exactly(tmp_path: Path,
                                                              monkeypatch) -> None:
    def refuse() -> float:
        raise AssertionError("the simulation read the wall clock through dione.clock")

    monkeypatch.setattr(clock.WallClock, "now", lambda self: refuse())
    scenario = Scenario(task_slowdown={"t1": 3.0}, node_slowdown={"n1": 1.3}, spread=0.2,
                        seed=5)
    runs = [simulate(small_problem(), tmp_path / f"run{k}", scenario=scenario, steps=40,
                     options=OPTIONS) for k in range(2)]
    assert all(s == "done" for s in runs[0].statuses.values())
    assert runs[0].makespan == runs[1].makespan and runs[0].slices == runs[1].slices
    plans = [[(p.at, [a.to_json() for a in p.run_clock]) for p in read_plans(r.run_dir)]
             for r in runs]
    assert plans[0] == plans[1] and len(plans[0]) >= 2  # the slow task was re-planned
    slices = []
    for r in runs:
        with RunStore(r.run_dir) as store:
            slices.append([(s.task, s.node, s.device_ids, s.start_step, s.started_at,
                            s.ended_at) for s in store.slices()])
    assert slices[0] == slices[1]
    # Every time is virtual: the run starts at 0 and ends at its makespan.
    assert min(s[4] for s in slices[0]) == pytest.approx(0.0)
    assert max(s[5] for s in slices[0]) == pytest.approx(runs[0].makespan)


def test_a_lost_node_leaves_every_task_done_on_the_others(tmp_path: Path) -> None:
    events = []
    result = simulate(small_problem(), tmp_path / "run",
                      scenario=Scenario(node_losses={"n1": 150.0}), steps=40, options=OPTIONS,
                      on_event=events.append)
    assert set(result.statuses.values()) == {"done"}
    assert any(e.kind == "node_lost" for e in events)
    with RunStore(tmp_path / "run") as store:
        later = [s for s in store.slices() if s.started_at >= 150.0]
        lost = [s for s in store.slices() if s.node == "n1" and s.status == "failed"]
    assert later and all(s.node == "n0" for s in later)
    assert lost and all("was lost" in (s.error or "") for s in lost)


def test_a_node_lost_at_the_start_is_never_planned(tmp_path: Path) -> None:
    """A node the scenario loses at 0 s was planned, each slice there failing at once
    (review): the run starts without it."""
    result = simulate(small_problem(), tmp_path / "run",
                      scenario=Scenario(node_losses={"n1": 0.0}), steps=20, options=OPTIONS,
                      report=False)
    assert set(result.statuses.values()) == {"done"}
    with RunStore(tmp_path / "run") as store:
        assert {s.node for s in store.slices()} == {"n0"}
        assert all(s.status == "done" for s in store.slices())


def test_current_practice_loses_what_a_lost_node_held_since_its_last_checkpoint(
        tmp_path: Path) -> None:
    """The baseline kept every second a lost node had trained, while the run loses its
    slice: the `sequential` solver's own simulated run (current practice, planned)
    ended after it, and re-planning was shown worse than doing nothing (review). Both
    now lose the same work, at the run's slice length."""
    problem = PlanningProblem((NodeSpec("n0", 4), NodeSpec("n1", 4)), tuple(
        TaskOptions(name, (Option("ddp", 4, 1000.0),)) for name in ("A", "B")))
    scenario = Scenario(node_losses={"n1": 500.0})
    for slice_seconds in (None, 1000.0):
        options = replace(OPTIONS, solver="sequential", slice_seconds=slice_seconds)
        result = simulate(problem, tmp_path / f"run-{slice_seconds}", scenario=scenario,
                          steps=100, options=options, report=False)
        # B's slice from step 30 (300 s slices) or from its start is lost at 500 s.
        assert result.makespan == pytest.approx(1700.0 if slice_seconds is None else 2000.0)
        assert result.current_practice == pytest.approx(result.makespan)


def test_injected_failures_are_retried_and_a_hopeless_task_fails_alone(tmp_path: Path) -> None:
    result = simulate(small_problem(4), tmp_path / "run",
                      scenario=Scenario(failures={"t0": 1, "t2": 5}), steps=20,
                      options=OPTIONS)
    assert result.statuses == {"t0": "done", "t1": "done", "t2": "failed", "t3": "done"}
    # Current practice trains every task to its end: the report says the two do not
    # compare, as the command does (it gave the figure alone: review).
    assert "(not comparable: 1 task(s) did not finish here" in " ".join(
        (tmp_path / "run" / "report" / "summary.md").read_text().split())


def test_a_task_far_slower_than_profiled_is_cancelled_as_a_run_cancels_it(
        tmp_path: Path) -> None:
    """A simulated slice was never cancelled as stalled: a task 20 times slower than
    profiled ran to its end, where a run cancels it past 10 times its prediction, retries
    it and fails it (review). The stall rule now plays as in a run, and says why."""
    slow = Scenario(task_slowdown={"t1": 20.0})
    result = simulate(small_problem(4), tmp_path / "run", scenario=slow, steps=20,
                      options=OPTIONS, report=False)
    assert result.statuses == {"t0": "done", "t1": "failed", "t2": "done", "t3": "done"}
    assert "stalled, cancelled" in result.errors["t1"]
    with RunStore(tmp_path / "run") as store:
        tried = [s for s in store.slices("t1") if s.status == "interrupted"]
        from dione.state.summaries import summaries

        (failed,) = [t for t in summaries(store) if t.task == "t1"]
    assert len(tried) == OPTIONS.max_failures
    # Its devices' time is in its row (it read 0.0 s on no device: a review).
    assert failed.seconds == pytest.approx(sum(s.ended_at - s.started_at for s in tried))
    assert failed.seconds > 0 and failed.devices
    # A higher bound lets it run to its end, as --stall-factor does a run.
    tolerant = replace(OPTIONS, stall_factor=30.0)
    result = simulate(small_problem(4), tmp_path / "tolerant", scenario=slow, steps=20,
                      options=tolerant, report=False)
    assert set(result.statuses.values()) == {"done"} and result.errors == {}


def test_a_node_on_which_two_tasks_stall_is_left_and_the_others_train_them(
        tmp_path: Path) -> None:
    """A node a thousand times slow stalls every slice: each task there was cancelled
    and retried there until it failed, as no exception showed the node at fault (a
    simulate review). Two tasks stalled on a node that trained nothing since now show
    it, as two alike exceptions do: it is left, and the other node trains them all."""
    events: list[RunEvent] = []
    result = simulate(small_problem(4), tmp_path / "run", steps=20, options=OPTIONS,
                      scenario=Scenario(node_slowdown={"n1": 1000.0}), report=False,
                      on_event=events.append)
    assert set(result.statuses.values()) == {"done"}, result.errors
    assert any("stalled as another task on node n1, which has trained nothing since: the "
               "node is at fault" in e.message for e in events)
    with RunStore(tmp_path / "run") as store:
        assert {s.node for s in store.slices() if s.status == "done"} == {"n0"}
    # Two tasks slow everywhere (their own doing) on healthy nodes: once each stalls on
    # a second node its stalls are taken back, and none is forgiven (they kept healthy
    # nodes out to the end, with two tries more each: a regression review).
    slow = Scenario(task_slowdown={"t1": 30.0, "t2": 30.0})
    result = simulate(small_problem(6), tmp_path / "slow", steps=20, options=OPTIONS,
                      scenario=slow, report=False)
    assert {t for t, s in result.statuses.items() if s != "done"} == {"t1", "t2"}
    with RunStore(tmp_path / "slow") as store:
        slices = store.slices()
    for task in ("t1", "t2"):
        assert sum(s.task == task and s.status == "interrupted" for s in slices) == \
            OPTIONS.max_failures
    last_stall = max(s.ended_at or 0.0 for s in slices if s.status == "interrupted")
    assert {s.node for s in slices if s.status == "done" and s.started_at < last_stall} \
        == {"n0", "n1"}


def test_a_task_that_stalled_on_two_nodes_never_counts_against_a_node_again(
        tmp_path: Path) -> None:
    """Its stalls were taken back when it stalled on a second node, but a stall back on
    the first counted anew: two tasks that had each stalled on both nodes showed n0 at
    fault (a regression review). Such a task's stalls are its own for good."""
    options = replace(OPTIONS, max_failures=6)
    with virtual_runner(tmp_path, options) as (runner, _):
        for task, node in (("t0", "n0"), ("t1", "n1"), ("t0", "n1"), ("t1", "n0"),
                           ("t0", "n0"), ("t1", "n0")):
            runner._failed(runner.state.records[task],
                           SliceError(f"{task}: stalled", "stalled"), 0, node)
            assert runner._shunned() == frozenset(), (task, node)
        assert runner.stalls_own == {"t0", "t1"}
        assert [runner.state.records[t].failures for t in ("t0", "t1")] == [3, 3]


def test_faulty_nodes_are_found_and_left_and_a_healthy_one_trains_every_task(
        tmp_path: Path) -> None:
    """A broken node raises the same error for every slice it is given. Two tasks
    failing alike on a node that trained nothing since show it at fault: no task is
    planned there while another node holds it, and the failures there are not counted
    against the tasks. Before, a task's retry went back where it failed (its old
    assignment still in the plan), a node was left only once one task had failed there
    twice, and with two faulty nodes of three the same error on both read as the
    task's own bug: tasks failed for good that the healthy node could train (reviews)."""
    problem = PlanningProblem(
        (NodeSpec("n0", 2), NodeSpec("n1", 2), NodeSpec("n2", 2)),
        tuple(TaskOptions(f"t{i}", (Option("single", 1, 100.0 + 20.0 * i),
                                    Option("ddp", 2, 60.0 + 12.0 * i))) for i in range(6)))
    for faulty in (["n1"], ["n1", "n2"], ["n0", "n1"]):
        events: list[RunEvent] = []
        run_dir = tmp_path / "-".join(faulty)
        result = simulate(problem, run_dir, scenario=Scenario(faulty_nodes=faulty),
                          steps=20, options=OPTIONS, on_event=events.append)
        assert set(result.statuses.values()) == {"done"}, (faulty, result.statuses)
        with RunStore(run_dir) as store:
            slices = store.slices()
        failed = [s for s in slices if s.status == "failed"]
        assert failed and all(s.node in faulty and "ECC" in (s.error or "") for s in failed)
        # Its first line, which the timeline shows, says why (it read "...: failed").
        assert all("on a faulty node (simulated)" in (s.error or "").splitlines()[0]
                   for s in failed)
        said = [e.message for e in events if "the node is at fault" in e.message]
        assert len(said) == len(faulty), said
        # Once found, a faulty node is given nothing more.
        for node in faulty:
            found = next(i for i, e in enumerate(events) if "the node is at fault" in
                         e.message and f"node {node}," in e.message)
            later = [e for e in events[found + 1:] if e.kind == "slice_started"
                     and f" on {node} devices" in e.message]
            assert not later, later

def test_a_problems_avoid_lists_are_not_simulated_and_said_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A problem's avoid lists (where a run's tasks failed) bound current practice and
    the tasks left out but not the simulated run, unsaid, and under --cluster, whose
    nodes they do not name, the file was refused (review): now left out of both, said."""
    problem = small_problem(4).to_json()
    problem["tasks"][0]["avoid"] = ["n0"]
    file = tmp_path / "avoid.json"
    file.write_text(json.dumps(problem))
    for extra in ([], ["--cluster", "3x2"]):
        status, shown, err = in_process(capsys, "simulate", str(file), "--steps", "20",
                                        "--out", str(tmp_path / f"run{len(extra)}"), *extra)
        assert status == 0, err
        said = " ".join((shown + err).split())
        assert "the avoid lists of 1 task(s) (t0) in the problem are not simulated" in said


def test_the_simulated_report_is_marked_simulated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    file = tmp_path / "problem.json"
    file.write_text(json.dumps(small_problem(4).to_json()))
    status, shown, err = in_process(capsys, "simulate", str(file), "--cluster", "2x2",
                                    "--steps", "20", "--out", str(out), "--time-limit", "2")
    assert status == 0, err
    assert "SIMULATED" in shown and "current practice" in shown
    summary = (out / "report" / "summary.md").read_text()
    assert summary.startswith("# dione run report: SIMULATED")
    # What the figures were simulated under, and what they compare with, as stdout says.
    assert "Cluster: n0 (2 devices), n1 (2 devices)." in summary and "Scenario: " in summary
    assert "Current practice (each task in turn" in summary
    assert "<title>dione run report: SIMULATED</title>" in \
        (out / "report" / "index.html").read_text()
    assert (out / "report" / "gantt.png").is_file()
    status = dione("status", str(out))
    assert status.returncode == 0 and "SIMULATED" in status.stdout
    assert "exact" not in status.stdout  # nothing trained: no how (it said exact)


def test_a_simulation_says_where_it_stands_while_a_plan_is_solved(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its line came only with events: a solve of minutes printed nothing."""
    import time

    from dione.cli.commands import simulate as command

    monkeypatch.setattr(command, "PROGRESS_SECONDS", 0.05)
    progress = command._Progress()  # and no event comes
    deadline = time.monotonic() + 30
    said = ""
    while "still working" not in said and time.monotonic() < deadline:
        time.sleep(0.1)
        said += capsys.readouterr().out
    progress.close()
    assert "0 slices ended, 0 plan(s) adopted (still working)" in \
        " ".join(said.split())


def test_a_simulation_says_what_it_left_out_and_what_its_baseline_leaves_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A task no node holds vanished from everything past one warning (a real run lists
    it as invalid); the baseline, which plays no failure or spread, was said to share
    the scenario; the Python API wrote no report though its docstring promised one."""
    problem = replace(small_problem(2), nodes=(NodeSpec("n0", 2, "A100"), NodeSpec("n1", 2)))
    wide = TaskOptions("wide", (Option("fsdp", 4, 50.0),))
    file = tmp_path / "problem.json"
    file.write_text(json.dumps(replace(problem, tasks=(*problem.tasks, wide)).to_json()))
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"failures": {"t0": 1}}))
    out = tmp_path / "run"
    # Where it stands, as it goes (every event here; every 15 s of wall time by default).
    monkeypatch.setattr("dione.cli.commands.simulate.PROGRESS_SECONDS", 0.0)
    status, shown, err = in_process(capsys, "simulate", str(file), "--steps", "10",
                                    "--scenario", str(scenario), "--out", str(out),
                                    "--time-limit", "2")
    assert status == 1, err  # a sweep this cluster cannot finish (it exited 0)
    said = " ".join(shown.split())
    assert "slices ended, 1 plan(s) adopted" in said
    assert "3 tasks, 2 done, 1 left out (no node holds them)" in said
    with open(out / "report" / "summary.csv") as rows:  # a script sees it too
        invalid = [row for row in csv.DictReader(rows) if row["status"] == "invalid"]
    # Its hyperparameters are not known: blank ("{}" read as a task of none).
    assert invalid and all(row["hyperparameters"] == "" for row in invalid)
    assert "not its failures, faulty nodes, spread or stopping rules" in said
    # A task that failed for good: its work was never done, so the makespan is no saving
    # against current practice, which trains it (it read 0.20 of it, and exited 0).
    scenario.write_text(json.dumps({"failures": {"t0": 3}}))
    status, shown, err = in_process(capsys, "simulate", str(file), "--steps", "10",
                                    "--scenario", str(scenario), "--out", str(out),
                                    "--time-limit", "2")
    said = " ".join(shown.split())
    assert status == 1, said
    assert "3 tasks, 1 done, 1 left out" in said and "t0: failed" in said
    assert "(not comparable: 1 task(s) did not finish here)" in said and " of it)" not in said
    status, shown, err = in_process(capsys, "simulate", str(file), "--steps", "10",
                                    "--scenario", str(scenario), "--out", str(out),
                                    "--time-limit", "2", "--max-failures", "4")
    assert status == 1 and "3 tasks, 2 done" in " ".join(shown.split()), shown + err
    scenario.write_text(json.dumps({"failures": {"t0": 1}}))
    summary = (out / "report" / "summary.md").read_text()
    assert "wide" in summary and "Tasks left out, never started" in summary
    assert "without the scenario's failures, faulty nodes and spread, and no stopping " \
        "rule" in summary
    assert "n0 (2 A100 devices), n1 (2 devices)" in summary
    # The Python API writes the report as the command does, and names a wrong argument.
    result = simulate(problem, tmp_path / "api", steps=10)
    assert result.statuses == {"t0": "done", "t1": "done"}
    assert (tmp_path / "api" / "report" / "index.html").is_file()
    with pytest.raises(TypeError, match=r"cluster=parse_cluster\('4x8'\)"):
        simulate(problem, tmp_path / "bad", cluster="4x8")  # type: ignore[arg-type]
    for wrong, said in (({"problem": "problem.json"}, "takes a PlanningProblem"),
                        ({"steps": "10"}, "steps must be a whole number"),
                        ({"options": {"time_limit": 1}}, "options must be a RunOptions")):
        with pytest.raises(TypeError, match=said):
            simulate(**{"problem": problem, "run_dir": tmp_path / "bad", **wrong})
    # A wrong scenario is named as the scenario, not blamed on cluster=None (review);
    # steps=0 is a bad value, not a bad type.
    with pytest.raises(TypeError, match=r"scenario=Scenario\(\.\.\.\) or load_scenario"
                       r"\(path\), not dict"):
        simulate(problem, tmp_path / "bad", scenario={"spread": 0.1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps must be a whole number >= 1, not 0"):
        simulate(problem, tmp_path / "bad", steps=0)


def test_current_practice_runs_each_task_on_a_whole_node_in_turn() -> None:
    work = small_problem(4)  # on 2 devices: t0 90, t1 82.5, t2 180, t3 137.5 (ddp x2 each)
    cluster = parse_cluster("2x2")
    # t0 on n0 and t1 on n1; t2 to n1 (free first, at 82.5), t3 to n0 (at 90).
    assert current_practice(work, cluster, Scenario()) == pytest.approx(82.5 + 180)
    slow = Scenario(task_slowdown={"t2": 2.0})
    assert current_practice(work, cluster, slow) == pytest.approx(82.5 + 360)


def test_bad_scenarios_and_clusters_are_named() -> None:
    with pytest.raises(ScenarioError, match=r"task_slowdown\['t1'\].*positive"):
        Scenario(task_slowdown={"t1": 0.0})
    with pytest.raises(ScenarioError, match="curve: must be one of"):
        Scenario(curve="zigzag")
    with pytest.raises(ScenarioError, match=r"task_slowdown: must be an object of names"):
        Scenario(task_slowdown=[])  # type: ignore[arg-type]  # a JSON list, say
    with pytest.raises(ScenarioError, match="a lost node never comes back"):
        Scenario(node_losses={"n0": 10.0}, node_joins={"n0": 20.0})
    with pytest.raises(ValueError, match="NODESxDEVICES"):
        parse_cluster("four by eight")
    with pytest.raises(ValueError, match="NODESxDEVICES"):
        parse_cluster("")  # `--cluster ""` took the problem's own cluster, unsaid
    assert [n.devices for n in parse_cluster("2X8")] == [8, 8]
    assert [(n.name, n.devices, n.model) for n in parse_cluster("H100:2x8, A100:4")] \
        == [("n0", 8, "H100"), ("n1", 8, "H100"), ("n2", 4, "A100")]
    with pytest.raises(ValueError, match=r"kind first where options differ by kind"):
        parse_cluster("2xH100")
    with pytest.raises(ValueError, match="at least one node"):
        parse_cluster("H100:0x8")
    with pytest.raises(ValueError, match="a node has at least one device"):
        parse_cluster("4x0")
    with pytest.raises(ScenarioError, match=r"seed: must be a number or text"):
        Scenario(seed=[1, 2])  # type: ignore[arg-type]  # a traceback mid-run, before
    with pytest.raises(ScenarioError, match=r"curves: must be the path"):
        Scenario(curves=5)  # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match=r"faulty_nodes: must be a list of node names"):
        Scenario(faulty_nodes="n1")
    with pytest.raises(ScenarioError, match=r"faulty_nodes\['n7'\]: the cluster has no such "
                       r"node"):
        Scenario(faulty_nodes=["n7"]).check(["n0", "n1"], [])
    with pytest.raises(ScenarioError, match=r"every node is faulty"):
        Scenario(faulty_nodes=["n0", "n1"]).check(["n0", "n1"], [])
    with pytest.raises(ScenarioError, match=r"every node there at the start is faulty"):
        Scenario(faulty_nodes=["n0"], node_joins={"n1": 200.0}).check(["n0", "n1"], [])


def test_a_curves_file_with_a_bad_curve_names_it(tmp_path: Path) -> None:
    """It was dropped without a word, and its task took another's curve."""
    curves = tmp_path / "curves.json"
    curves.write_text(json.dumps({"a": [1, 0.5, "x"], "b": [2, 1]}))
    with pytest.raises(ScenarioError, match="the curve of a is not a list of finite losses"):
        Scenario(curves=str(curves))


def test_the_report_page_holds_the_tables_and_both_figures(tmp_path: Path) -> None:
    """report/index.html is one file: the summary's tables, the Gantt chart and the
    learning curves inlined (a stopped task's line is marked where it stopped)."""
    from html.parser import HTMLParser

    from dione.report import write_report
    from dione.spec.stopping import Asha

    simulate(small_problem(6), tmp_path / "run", steps=30, options=OPTIONS,
             stopping=Asha(min_steps=5, eta=2))
    folder = write_report(tmp_path / "run")
    assert (folder / "curves.png").is_file()

    class Page(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.images: list[str] = []
            self.cells: list[str] = []
            self.headings: list[str] = []
            self._in: str | None = None

        def handle_starttag(self, tag: str, attrs: list) -> None:
            if tag == "img":
                self.images.append(dict(attrs)["src"])
            self._in = tag

        def handle_data(self, data: str) -> None:
            if self._in in ("td", "th"):
                self.cells.append(data.strip())
            if self._in in ("h1", "h2"):
                self.headings.append(data.strip())

    page = Page()
    page.feed((folder / "index.html").read_text())
    assert len(page.images) == 2 and all(src.startswith("data:image/png;base64,")
                                         for src in page.images)
    assert "stopped" in page.cells and "t0" in page.cells
    assert "dione run report: SIMULATED" in page.headings and "Stopped early" in page.headings
    assert '<a href="timeline.csv">' in (folder / "index.html").read_text()  # and the rest
    # Every row of every CSV says it was simulated (read beside a real run's files; this
    # run evaluates nothing, so evaluations.csv has its header only).
    for name in ("timeline.csv", "metrics.csv", "evaluations.csv", "summary.csv"):
        with open(folder / name) as file:
            reader = csv.DictReader(file)
            rows = list(reader)
        assert reader.fieldnames and reader.fieldnames[-1] == "simulated", name
        assert {row["simulated"] for row in rows} == ({"true"} if name != "evaluations.csv"
                                                      else set()), name
        if name == "summary.csv":  # nothing trained: no "exact" (a failed one said so)
            assert {row["trained"] for row in rows} == {""}, rows


def test_tensorboard_holds_every_step_evaluation_and_the_hparams(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Read back with TensorBoard's own reader: per task its loss at every step it
    trained, the devices it ran on, its status, and its HParams summary with the
    session's status (torch's own writes success for a failed task too)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    out = tmp_path / "run"
    simulate(small_problem(4), out, steps=20, options=OPTIONS,
             scenario=Scenario(failures={"t3": 5}))
    for _ in range(2):  # again into the same folder: each step once (it was twice)
        status, _, err = in_process(capsys, "report", str(out), "--tensorboard",
                                    str(tmp_path / "tb"))
        assert status == 0, err
    for task in ("t0", "t1", "t2", "t3"):
        events = EventAccumulator(str(tmp_path / "tb" / task))
        events.Reload()
        if task != "t3":  # t3 failed every slice: no step kept
            assert [e.step for e in events.Scalars("loss")] == list(range(1, 21))
            assert {e.value for e in events.Scalars("devices")} <= {1.0, 2.0}
        hparams = events.PluginTagToContent("hparams")
        assert "_hparams_/session_start_info" in hparams
        end = HParamsPluginData.FromString(hparams["_hparams_/session_end_info"])
        assert Status.Name(end.session_end_info.status) == (
            "STATUS_FAILURE" if task == "t3" else "STATUS_SUCCESS")


@pytest.mark.timeout(120)
def test_an_interrupted_simulation_stops_at_once(tmp_path: Path) -> None:
    """Ctrl-C (or SIGTERM) mid-simulation: its slices end only as the virtual clock
    moves, so the run must not wait for them as it waits for gangs (it hung)."""

    def interrupt(event) -> None:
        if event.kind == "slice_finished":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        simulate(small_problem(4), tmp_path / "run", steps=20, options=OPTIONS,
                 on_event=interrupt)


def test_a_plan_solved_before_a_node_was_lost_is_adopted_without_that_node(
        tmp_path: Path) -> None:
    """A re-plan solves beside execution: a node lost while it solved must not come back
    with it (a Ray run launched onto the lost node and died). Its tasks are then owed a
    plan of their own."""
    with virtual_runner(tmp_path) as (runner, _):
        runner.plan_now()
        taken = runner._snapshot()
        assert taken is not None
        solved, _ = solve_or_fall_back(taken[0], "cpsat", 1.0, 1, True)
        assert {a.node for a in solved.assignments} == {"n0", "n1"}
        runner._lose_node("n1", runner.state.records["t0"],
                          SliceError("n1 was lost", "node_lost"))
        runner._adopt(PlanCandidate(solved, taken[0], taken[1]), first=True)
        assert runner.state.plan and {a.node for a in runner.state.plan} == {"n0"}
        assert runner._uncovered()  # n1's tasks wait for a plan of their own
        # A second slice of n1's ends (its loss seen again) after a plan adopted
        # meanwhile kept that slice's continuation there: it leaves the plan too.
        kept = next(a for a in solved.assignments if a.node == "n1")
        runner.state.plan.append(kept)
        runner._lose_node("n1", runner.state.records[kept.task],
                          SliceError("n1 was lost", "node_lost"))
        assert {a.node for a in runner.state.plan} == {"n0"}


def test_a_real_sweeps_curves_drive_the_simulated_losses(tmp_path: Path) -> None:
    """``Scenario(curves=...)``: a run directory's per-step losses (here an earlier
    simulation's), each task by its name; or a JSON file, stretched to a task's length
    and shared in turn among tasks it does not name."""
    first = tmp_path / "first"
    simulate(small_problem(), first, scenario=Scenario(seed=2), steps=30, options=OPTIONS)
    again = tmp_path / "again"
    simulate(small_problem(), again, scenario=Scenario(seed=9, curves=str(first)), steps=30,
             options=OPTIONS)
    with RunStore(first) as one, RunStore(again) as two:
        names = [t.name for t in one.tasks()]
        assert len(names) > 1
        for name in names:
            assert [m[1] for m in two.metrics(name)] == [m[1] for m in one.metrics(name)]
        assert len({tuple(m[1] for m in one.metrics(n)) for n in names}) == len(names)
    file = tmp_path / "curves.json"
    file.write_text(json.dumps({"a": [3.0, 2.0, 1.0], "b": [5.0]}))
    scenario = Scenario(curves=str(file))
    given = scenario.assigned_curves(["a", "x", "y", "z"])
    assert given == {"a": [3.0, 2.0, 1.0], "x": [5.0], "y": [5.0], "z": [5.0]}
    assert scenario.losses("a", 6, 0, 6, given["a"]) == [3.0, 3.0, 2.5, 2.0, 1.5, 1.0]
    assert scenario.losses("a", 6, 2, 4, given["a"]) == [2.5, 2.0]  # a slice of it
    file.write_text(json.dumps(["not", "an", "object"]))
    with pytest.raises(ScenarioError, match=r"curves: .* must be a JSON object"):
        Scenario(curves=str(file))
    with pytest.raises(ScenarioError, match=r"curves: .* is not a dione run directory"):
        Scenario(curves=str(tmp_path))


def test_the_live_report_appends_metrics_and_ends_with_the_whole_file(
        tmp_path: Path) -> None:
    """The live report appends each task's new steps to metrics.csv (a long run's file is
    not rewritten every time); what it holds is what one whole write holds."""
    from dione.report.files import MetricsWritten, write_report

    run_dir = tmp_path / "run"
    simulate(small_problem(), run_dir, steps=30, options=OPTIONS)
    metrics = write_report(run_dir) / "metrics.csv"
    whole = metrics.read_text()
    written = MetricsWritten()
    write_report(run_dir, written=written)
    assert metrics.read_text() == whole and set(written.steps.values()) == {30}
    write_report(run_dir, written=written)  # nothing new: nothing appended
    assert metrics.read_text() == whole
    # As a live report left it earlier: each task's first 12 steps only.
    lines = whole.splitlines(keepends=True)
    metrics.write_text("".join(lines[:1] + [ln for ln in lines[1:]
                                            if int(ln.split(",")[1]) <= 12]))
    written.steps = dict.fromkeys(written.steps, 12)
    written.signature = os.stat(metrics).st_ino, os.stat(metrics).st_size, \
        os.stat(metrics).st_mtime_ns
    write_report(run_dir, written=written)
    assert sorted(metrics.read_text().splitlines()) == sorted(whole.splitlines())
    # The live report had written up to step 12 when another writer (``dione report``)
    # rewrote the file whole: the live report's next write is a whole one, no row twice.
    written.steps = dict.fromkeys(written.steps, 12)
    write_report(run_dir)
    write_report(run_dir, written=written)
    assert metrics.read_text() == whole
    assert set(written.steps.values()) == {30}


def test_a_node_that_joins_later_is_planned_from_then_on(tmp_path: Path) -> None:
    """``node_joins``: n1 is absent for the first 150 s, then the plan uses it; current
    practice counts it free from then; a scenario naming a node the cluster lacks, or
    with every node joining late, is refused by name."""
    events: list[RunEvent] = []
    scenario = Scenario(node_joins={"n1": 150.0})
    run = simulate(small_problem(), tmp_path / "run", scenario=scenario, steps=40,
                   options=OPTIONS, on_event=events.append)
    assert all(s == "done" for s in run.statuses.values())
    with RunStore(run.run_dir) as store:
        on = {s.node: min(x.started_at for x in store.slices() if x.node == s.node)
              for s in store.slices()}
        zero = min(on.values())
    assert set(on) == {"n0", "n1"} and on["n1"] - zero >= 150.0
    assert any(e.kind == "node_joined" and "n1" in e.message for e in events)
    alone = simulate(small_problem(), tmp_path / "alone", steps=40, options=OPTIONS,
                     cluster=parse_cluster("1x2"))
    assert run.makespan < alone.makespan  # the node that joined took work
    assert current_practice(small_problem(4), parse_cluster("2x2"), scenario) > \
        current_practice(small_problem(4), parse_cluster("2x2"), Scenario())
    with pytest.raises(ScenarioError, match=r"node_joins\['n7'\]: the cluster has no such"):
        simulate(small_problem(), tmp_path / "bad", steps=40, options=OPTIONS,
                 scenario=Scenario(node_joins={"n7": 10.0}))
    with pytest.raises(ScenarioError, match="every node joins after the start"):
        simulate(small_problem(), tmp_path / "late", steps=40, options=OPTIONS,
                 scenario=Scenario(node_joins={"n0": 10.0, "n1": 10.0}))
    with pytest.raises(ScenarioError, match=r"no node is left at 100\.0 s, before a node joins"):
        simulate(small_problem(), tmp_path / "gap", steps=40, options=OPTIONS,
                 scenario=Scenario(node_joins={"n1": 200.0}, node_losses={"n0": 100.0}))
    with pytest.raises(ScenarioError, match=r"every node is lost \(the last at 200 s\)"):
        simulate(small_problem(), tmp_path / "gone", steps=40, options=OPTIONS,
                 scenario=Scenario(node_losses={"n0": 100.0, "n1": 200.0}))
    # A task the workload lacks (a misspelt name) is refused as a node is.
    with pytest.raises(ScenarioError, match=r"task_slowdown\['nosuch'\]: no task has this "
                       r"name \(the tasks: t0, t1"):
        simulate(small_problem(), tmp_path / "typo", steps=40, options=OPTIONS,
                 scenario=Scenario(task_slowdown={"nosuch": 4.0}))
    # Nodes and tasks said at once (they came in two rounds), and a file's unknown
    # fields with its bad values (two more).
    with pytest.raises(ScenarioError) as both:
        simulate(small_problem(), tmp_path / "typos", steps=40, options=OPTIONS,
                 scenario=Scenario(task_slowdown={"nosuch": 4.0}, node_losses={"n9": 1.0}))
    assert len(both.value.reasons) == 2, both.value.reasons
    file = tmp_path / "scenario.json"
    file.write_text(json.dumps({"typo_field": 1, "spread": -1, "curve": "wavy",
                                "failures": {"t0": -2}}))
    with pytest.raises(ScenarioError) as every:
        load_scenario(file)
    assert [r.split(":")[0] for r in every.value.reasons] == [
        "typo_field", "spread", "failures['t0']", "curve"], every.value.reasons


def test_a_task_only_a_later_node_can_hold_waits_for_it(tmp_path: Path) -> None:
    """With nothing else to run, a task too wide for the nodes there are waits for the
    node the scenario has join (a real cluster cannot know one will: there it fails,
    to be resumed)."""
    problem = PlanningProblem(
        (NodeSpec("n0", 2), NodeSpec("n1", 4)),
        (TaskOptions("narrow", (Option("single", 1, 50.0),)),
         TaskOptions("wide", (Option("ddp", 4, 80.0),))))
    run = simulate(problem, tmp_path / "run", steps=20, options=OPTIONS,
                   scenario=Scenario(node_joins={"n1": 300.0}))
    assert run.statuses == {"narrow": "done", "wide": "done"}
    with RunStore(run.run_dir) as store:
        wide = store.slices("wide")
    assert {s.node for s in wide} == {"n1"} and min(s.started_at for s in wide) >= 300.0
    # The first plan placed only "narrow", and the report says so (its 50 s against the
    # run's 380 s read as drift).
    assert "it placed 1 of the 2 tasks; the others were planned later" in \
        (run.run_dir / "report" / "summary.md").read_text()
    # And the command's closing line, from the same plan (it said the first plan's 50 s
    # alone: review).
    from dione.cli.commands.simulate import _first_placed

    assert _first_placed(run.run_dir) == 1


def test_no_replan_keeps_the_nodes_the_run_started_with(tmp_path: Path) -> None:
    """``--no-replan`` leaves a node that joins later unused, as its help says (it took
    a task the first plan could not place, and a lost node's work: a review), and the
    task only that node could hold fails naming the flag; re-planning uses it."""
    problem = PlanningProblem(
        (NodeSpec("n0", 2), NodeSpec("n1", 4)),
        (TaskOptions("narrow", (Option("single", 1, 50.0),)),
         TaskOptions("wide", (Option("ddp", 4, 80.0),))))
    events: list[RunEvent] = []
    kept = simulate(problem, tmp_path / "kept", steps=20, on_event=events.append,
                    options=replace(OPTIONS, replan=False),
                    scenario=Scenario(node_joins={"n1": 30.0}))
    assert kept.statuses == {"narrow": "done", "wide": "failed"}
    assert "a node that joins later would hold it, and is not used under --no-replan" in \
        kept.errors["wide"]
    assert any(e.kind == "node_joined" and "not used: --no-replan" in e.message
               for e in events)
    with RunStore(kept.run_dir) as store:
        assert {s.node for s in store.slices()} == {"n0"}
    # A lost node's work goes to the nodes there from the start, not the one that joined.
    lost = simulate(small_problem(), tmp_path / "lost", steps=40,
                    options=replace(OPTIONS, replan=False), cluster=parse_cluster("3x2"),
                    scenario=Scenario(node_joins={"n2": 10.0}, node_losses={"n1": 100.0}))
    assert all(s == "done" for s in lost.statuses.values())
    with RunStore(lost.run_dir) as store:
        assert "n2" not in {s.node for s in store.slices()}
    replanned = simulate(problem, tmp_path / "replanned", steps=20, options=OPTIONS,
                         scenario=Scenario(node_joins={"n1": 30.0}))
    assert replanned.statuses == {"narrow": "done", "wide": "done"}
    # The flag is named only where a node it leaves unused would hold the task (it was
    # for one no node can hold: a regression review).
    narrow_join = PlanningProblem((NodeSpec("n0", 2), NodeSpec("n1", 2)), problem.tasks)
    none_holds = simulate(narrow_join, tmp_path / "none", steps=20,
                          options=replace(OPTIONS, replan=False),
                          scenario=Scenario(node_joins={"n1": 30.0}))
    assert none_holds.statuses["wide"] == "failed"
    assert "--no-replan" not in none_holds.errors["wide"], none_holds.errors


def test_no_replan_still_takes_the_runs_own_nodes_busy_at_its_start(tmp_path: Path) -> None:
    """A node of the run's own cluster whose devices another job held at the start
    (``node_busy``: it joins once free) joins under --no-replan too; only a node new to
    the run is left unused (a regression review: the busy node never joined)."""
    problem = small_problem(4)
    full = problem_cluster(problem)
    tasks, profile = problem_workload(problem, 20, full, None)
    for awaited in ((), ("n1",)):
        virtual = VirtualClock()
        scenario = Scenario(node_joins={"n1": 50.0})
        events: list[RunEvent] = []
        run_dir = tmp_path / f"run{len(awaited)}"
        with clock.using(virtual):
            machines = VirtualCluster(virtual, scenario, list(full))
            launching = SimulatedLaunching(run_dir, profile, virtual, scenario, machines)
            runner = Runner(tasks, Cluster(list(full)[:1]), run_dir, profile,
                            replace(OPTIONS, replan=False), events.append, lambda s: None,
                            machines, launching=launching, virtual=True, awaited=awaited)
            try:
                virtual.wait_any([], 60.0)
                runner._join_new_nodes()
                assert [n.name for n in runner.cluster] == (["n0", "n1"] if awaited
                                                            else ["n0"])
                assert any(("not used" in e.message) != bool(awaited) for e in events
                           if e.kind == "node_joined"), events
            finally:
                runner.store.close()


def test_a_stall_factor_at_or_below_one_is_refused_everywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A slice cancelled as stalled at 0.5 times its prediction failed every good task of
    a simulation (a review): the option is refused, from Python and from each command
    that takes it, and simulate takes --stall-grace, which its stall message names."""
    for factor, grace in ((0.5, 60.0), (1.0, 0.0)):
        with pytest.raises(ValueError, match=r"stall_factor must be at least 1, and above "
                           r"1 with no stall_grace"):
            RunOptions(stall_factor=factor, stall_grace=grace)
    RunOptions(stall_factor=1.0, stall_grace=600.0)  # the prediction and 10 minutes
    problem = tmp_path / "problem.json"
    problem.write_text(json.dumps(small_problem().to_json()))
    for command in (["simulate", str(problem)], ["run", "nosuch.py"]):
        with pytest.raises(SystemExit) as exit_:  # argparse's
            in_process(capsys, *command, "--stall-factor", "0.5")
        assert exit_.value.code == 2 and "0.5 is below 1" in capsys.readouterr().err
    # The one pair the flags' own checks let through: said, not a traceback (review).
    status, _, err = in_process(capsys, "simulate", str(problem), "--stall-factor", "1",
                                "--stall-grace", "0", "--out", str(tmp_path / "pair"))
    assert status == 2 and "(--stall-factor, --stall-grace" in err, err
    slow = simulate(small_problem(), tmp_path / "slow", steps=40,
                    options=replace(OPTIONS, stall_grace=0.0, max_failures=1),
                    scenario=Scenario(task_slowdown={"t0": 30.0}))
    assert slow.statuses["t0"] == "failed"
    status, out, _ = in_process(capsys, "simulate", str(problem), "--out", str(tmp_path / "cli"),
                                "--scenario", str(_scenario_file(tmp_path, {
                                    "task_slowdown": {"t0": 30.0}})),
                                "--stall-grace", "0", "--max-failures", "1")
    assert status == 1 and "t0: failed" in out and "--stall-grace" in out, out


def _scenario_file(tmp_path: Path, scenario: dict[str, object]) -> Path:
    file = tmp_path / "scenario.json"
    file.write_text(json.dumps(scenario))
    return file


def test_simulate_says_what_a_scenario_set_past_the_end_and_what_is_no_problem_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A node loss set past the run's end never played, said (a digit's slip read as a
    loss that cost nothing); a workload .py given for a problem names `dione profile`;
    a problem's name keeps its dots in the default folder (sweep.v1 and sweep.v2 shared
    one, the second replacing the first: a review)."""
    assert Scenario(node_losses={"n1": 5e8, "n0": 10.0}).unplayed(100.0) == [
        "node_losses['n1'] at 5e+08 s"]
    monkeypatch.chdir(tmp_path)
    problem = tmp_path / "sweep.v1.json"
    problem.write_text(json.dumps(small_problem().to_json()))
    status, out, err = in_process(capsys, "simulate", str(problem), "--scenario", str(
        _scenario_file(tmp_path, {"node_losses": {"n1": 1e9}})))
    assert status == 0, err
    assert "node_losses['n1'] at 1e+09 s: at or after the run's end" in err + out
    assert "current practice, which ran to" not in err + out  # nor did it play it
    # Past dione's end but not current practice's: said to have played there (review).
    status, out, err = in_process(capsys, "simulate", str(problem), "--scenario", str(
        _scenario_file(tmp_path, {"node_losses": {"n1": 400}})), "--out", "late")
    assert "never played in it; current practice, which ran to" in err + out, err + out
    assert (tmp_path / "runs" / "simulate-sweep.v1" / "report").is_dir()
    workload = tmp_path / "sweep.py"
    workload.write_text("WORKLOAD = []\n")
    for command in ("simulate", "plan"):
        status, _, err = in_process(capsys, command, str(workload))
        assert status == 2 and "is a workload, not a problem file: `dione profile" in err, err
        status, _, err = in_process(capsys, command, "nosuch.py")  # what it said before
        assert status == 2 and "is a workload" not in err, err


def test_owed_replans_are_solved_past_the_budget_and_not_counted_in_it(
        tmp_path: Path) -> None:
    """A re-plan a stop or a lost node owes is solved whatever re-planning has cost, and
    is not counted in ``replan_share``: on a 50-task ASHA sweep, counting them spent the
    budget, and the survivors' slice-end re-plans (the ones that may widen them) were
    then refused (1 of 202 asked was solved)."""
    options = RunOptions(**{**OPTIONS.__dict__, "replan_share": 0.01})
    with virtual_runner(tmp_path, options) as (runner, virtual):
        replanner = runner.replanner
        runner.plan_now()
        for _ in range(3):  # owed: each solved at once, though no time has passed
            runner.ask_replan(owed=True)
            assert replanner.ready() is not None
        assert replanner.solves == 3 and replanner.owed_units == replanner.units > 0
        runner.ask_replan()  # budgeted: refused, for 1% of no time is nothing
        assert replanner.ready() is None and replanner.solves == 3
        # Time passes until the budget holds two solves: counted, the owed ones
        # would take it all; they leave it whole.
        one_solve = runner.expected_solve_seconds()
        assert VIRTUAL_SECONDS_PER_UNIT * replanner.owed_units + one_solve > 2 * one_solve
        virtual.wait_any([], 2 * one_solve / 0.01)
        runner.ask_replan()
        assert replanner.ready() is not None and replanner.solves == 4
        assert replanner.owed_units < replanner.units
        # Requests made while a solve is in flight are served by one solve, owed if
        # any of them was.
        solves = replanner.solves
        replanner.ask(runner._snapshot)  # solved at once (on a virtual clock)
        replanner.ask(runner._snapshot, owed=True)
        replanner.ask(runner._snapshot)
        owed_before = replanner.owed_units
        assert replanner.ready() is not None  # the first; the merged one starts
        assert replanner.ready() is not None and replanner.owed_units > owed_before
        assert replanner.solves == solves + 2
        # Budgeted asks stop once they alone would pass it.
        while VIRTUAL_SECONDS_PER_UNIT * (replanner.units - replanner.owed_units) \
                + runner.expected_solve_seconds() <= 0.01 * runner.now():
            runner.ask_replan()
            assert replanner.ready() is not None
        solves = replanner.solves
        runner.ask_replan()
        assert replanner.ready() is None and replanner.solves == solves


def test_a_running_tasks_later_steps_are_planned_free_from_its_slice_end(
        tmp_path: Path) -> None:
    """A re-plan's problem: each running task holds its devices until its slice ends,
    and its steps after it are a task of the problem released then (any technique,
    width or node), not pinned to its devices for the rest of the task."""
    options = RunOptions(**{**OPTIONS.__dict__, "slice_steps": 5})
    with virtual_runner(tmp_path, options) as (runner, virtual):
        runner.plan_now()
        started = [runner.launch(a)
                   for a in launchable(runner.state.plan, runner.state.records)]
        assert started
        virtual.wait_any([], 1.0)
        remaining, _ = runner.problem()
        planned = {t.name: t for t in remaining.tasks}
        running = [r for r in runner.state.records.values() if r.running]
        assert running and len(remaining.busy) == len(running)
        for busy in remaining.busy:
            record = runner.state.records[busy.task]
            assert record.running is not None
            ends = runner.predicted_slice_end(record) - runner.now()
            assert busy.until == pytest.approx(ends, abs=1e-3)
            later = planned[busy.task]  # 15 steps after its first 5
            assert later.release == busy.until > 0
            assert {(o.technique, o.devices) for o in later.options} == \
                {("single", 1), ("ddp", 2)}
        plan = solve(remaining, "cpsat", 2.0, threads=1)
        assert check_plan(plan, remaining) == []
        assert all(plan.assignment(b.task).start >= b.until - 1e-6
                   for b in remaining.busy)


def test_a_slice_past_its_prediction_with_no_pace_heard_is_not_expected_to_end_at_once(
        tmp_path: Path) -> None:
    """Two-step slices tell no pace (a rank tells it from its second step). One ten times
    slower than predicted, past its predicted end, is expected to run late as long again
    as it has so far: a plan that queued work behind it as if it ended at once left a
    device idle while a held slice kept the other (a flaky test on a busy machine)."""
    options = RunOptions(**{**OPTIONS.__dict__, "slice_steps": 2})
    with virtual_runner(tmp_path, options, Scenario(task_slowdown={"t0": 10.0})) as (
            runner, virtual):
        runner.plan_now()
        for a in launchable(runner.state.plan, runner.state.records):
            runner.launch(a)
        record = runner.state.records["t0"]
        running = record.running
        assert running is not None and running.end_step - running.start_step == 2
        predicted = running.predicted_end - running.began
        virtual.wait_any([], 2 * predicted - (runner.now() - running.began))  # twice it
        assert runner._progress(record) is None and record.running is running
        elapsed = runner.now() - running.began
        assert elapsed == pytest.approx(2 * predicted)
        late = elapsed - predicted  # as long as predicted, past its predicted end
        assert runner.predicted_slice_end(record) == pytest.approx(runner.now() + late)
        problem, _ = runner.problem()
        busy = next(b for b in problem.busy if b.task == "t0")
        assert busy.until == pytest.approx(late)


def test_a_slice_stalled_in_its_evaluation_is_said_so(tmp_path: Path) -> None:
    """A slice whose rank 0 said it trained and saved, now past its prediction: the
    warning and the cancel say its evaluation stalls and that its training is kept
    (they said it would be retried, as a slice stalled in training is)."""
    options = RunOptions(**{**OPTIONS.__dict__, "stall_grace": 0.0})
    events: list[RunEvent] = []
    with virtual_runner(tmp_path, options, Scenario(task_slowdown={"t0": 100.0})) as (
            runner, virtual):
        runner.emit = events.append  # type: ignore[method-assign]
        runner.plan_now()
        for a in launchable(runner.state.plan, runner.state.records):
            runner.launch(a)
        running = runner.state.records["t0"].running
        assert running is not None
        running.in_evaluation = True  # as SliceLaunching hears it from rank 0
        predicted = running.predicted_seconds
        virtual.wait_any([], options.stall_warning * predicted * 1.01)
        runner.check_stalls()
        virtual.wait_any([], options.stall_factor * predicted)
        runner.check_stalls()
        virtual.wait_any([], 1.0)
        # Its training is kept and its evaluation owed, as a real slice's (the
        # simulation failed it whole, to train it again: a regression review).
        (kept,) = runner.store.slices("t0")
        assert kept.status == "done" and kept.end_step == running.end_step
        # Its error reads as a real slice's, whose evaluation failed (it lacked the
        # first line that `dione evaluate` and the views look for).
        assert (kept.error or "").startswith("evaluation failed:\nthe evaluation was "
                                             "cancelled as stalled"), kept.error
    said = [e.message for e in events if e.task == "t0"
            and e.kind in ("slice_slow", "slice_cancelled")]
    assert len(said) == 2, said
    assert "in its evaluation (trained and saved): stalled? (at 10 times it and 0 s the " \
        "evaluation is cancelled and owed, the training kept)" in said[0]
    assert "(--stall-factor and --stall-grace change the bound)" in said[1]  # a review
    assert "stalled in its evaluation, cancelled: its training is kept, its evaluation " \
        "owed" in said[1]


def test_a_pausing_rules_promoted_tasks_come_first_in_the_problem_best_first(
        tmp_path: Path) -> None:
    """Li et al.'s ASHA hands out promotions before new configurations, from the highest
    rung down: each re-plan's problem says so in its tasks' priorities (lower first), a
    promoted task's rank at its last rung breaking ties within that rung."""
    from dione.spec.stopping import PausingAsha

    rule = PausingAsha(min_steps=5, eta=2)  # rungs at 5 and 10 of 20 steps
    with virtual_runner(tmp_path) as (runner, _):
        records = runner.state.records
        for name, done in (("t0", 5), ("t1", 5), ("t2", 10), ("t3", 0)):
            records[name].task = replace(records[name].task, stopping=rule)
            records[name].done_steps = done
        runner.judged[(runner._rule_key(rule), 5)] = {"t0": 2.0, "t1": 1.0, "t2": 1.5, "x": 3.0}
        runner.judged[(runner._rule_key(rule), 10)] = {"t2": 0.9}
        problem, _ = runner.problem()
        priority = {t.name: t.priority for t in problem.tasks}
        assert priority["t2"] == -2.0  # past two rungs, the best at the second
        assert priority["t1"] == -1.0  # past one, the best there
        assert priority["t0"] == pytest.approx(-1.0 + 0.999 * 2 / 4)  # two better
        assert priority["t3"] == 0.0  # a new configuration
        assert sorted(priority, key=lambda n: priority[n]) == ["t2", "t1", "t0", "t3"]


def test_a_rule_that_compares_with_ended_tasks_has_its_begun_tasks_planned_first(
        tmp_path: Path) -> None:
    """dione.optuna's rule (Optuna's pruners count completed trials): a resume planned
    new trials beside half-trained ones, which then had none completed to compare with,
    and the worst trained to its end (review). Begun tasks come first, the furthest
    first, and a plan starts them before the new ones where its makespan allows."""
    from dione.spec.stopping import Median

    class BegunFirst(Median):
        begun_first = True

    rule = BegunFirst(min_steps=5)
    with virtual_runner(tmp_path) as (runner, _):
        records = runner.state.records
        for name, done in (("t0", 0), ("t1", 0), ("t2", 4), ("t3", 10)):
            records[name].task = replace(records[name].task, stopping=rule)
            records[name].done_steps = done
        problem, _ = runner.problem()
        priority = {t.name: t.priority for t in problem.tasks}
        assert priority == {"t0": 0.0, "t1": 0.0, "t2": -1.2, "t3": -1.5}
        # On one node of two devices, one device each, the begun two start first.
        one_node = replace(problem, nodes=problem.nodes[:1], tasks=tuple(
            replace(t, options=tuple(o for o in t.options if o.devices == 1))
            for t in problem.tasks))
        plan, _ = solve_or_fall_back(one_node, "cpsat", 1.0, 1, True, hasten=True)
        starts = {a.task: a.start for a in plan.assignments}
        assert max(starts["t2"], starts["t3"]) < min(starts["t0"], starts["t1"])


def test_a_simulation_into_the_directory_of_an_earlier_one_starts_afresh(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same problem again into one directory found every task done and reported a
    makespan of 0 s; another problem's tasks were mixed into the report. Now an earlier
    simulation's files go first; a directory where a run trained is refused."""
    from dione.orchestrate.options import RunDirError
    from dione.state.store import RunStore

    first = simulate(small_problem(4), tmp_path / "run", steps=20, options=OPTIONS)
    again = simulate(small_problem(4), tmp_path / "run", steps=20, options=OPTIONS)
    assert again.makespan == first.makespan > 0 and again.slices == first.slices
    other = simulate(small_problem(2), tmp_path / "run", steps=20, options=OPTIONS)
    with RunStore(tmp_path / "run") as store:
        assert [t.name for t in store.tasks()] == ["t0", "t1"]
        assert len(store.slices()) == other.slices
    with RunStore(tmp_path / "real") as store:
        store.register_task("t0", 20, 8)
    with pytest.raises(RunDirError, match="holds a run that trained"):
        simulate(small_problem(2), tmp_path / "real", steps=20, options=OPTIONS)
    # A project folder given as --out is refused, not adopted (a simulation redone there
    # cleared the project's files with its own); a file put beside a simulation since
    # stays when it is redone.
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "NOTES.md").write_text("mine")
    with pytest.raises(RunDirError, match=r"not a dione run directory and is not empty "
                       r"\(it holds NOTES.md, src\): give a new or empty folder"):
        simulate(small_problem(2), project, steps=20, options=OPTIONS)
    (tmp_path / "run" / "notes.txt").write_text("mine")
    simulate(small_problem(2), tmp_path / "run", steps=20, options=OPTIONS)
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in project.iterdir()) == ["NOTES.md", "src"]
    # Hidden files (a Finder visit, NFS) and dione's own half-written ones are no one's.
    (tmp_path / "hidden").mkdir()
    for name in (".DS_Store", ".nfs0001", "run.json.partial"):
        (tmp_path / "hidden" / name).write_text("")
    simulate(small_problem(2), tmp_path / "hidden", steps=20, options=OPTIONS)
    # Nothing trained in a simulated run: resume and export say so.
    from dione.cli import main

    assert main(["resume", str(tmp_path / "run")]) == 2
    assert main(["export", str(tmp_path / "run"), "t0", "-o", str(tmp_path / "x")]) == 2
    assert main(["resume", str(tmp_path / "nowhere")]) == 2
    # A run that trains, into a simulation's folder: refused (its real slices read as
    # simulated, and its weights could not be exported); a task added to it too (it was
    # asked, and no resume could ever take it).
    import dione as package
    from helpers import digits_task

    with pytest.raises(RunDirError, match=r"holds a simulation .* a run that trains would "
                       r"mix with it"):
        package.run([digits_task("t0")], run_dir=str(tmp_path / "run"), quiet=True)
    capsys.readouterr()
    assert main(["add", str(tmp_path / "run"), str(tmp_path / "more.py")]) == 2
    assert "is a simulated run (`dione simulate`): no task is added to it" in " ".join(
        capsys.readouterr().err.split())
    with RunStore(tmp_path / "run") as store:
        assert [t.name for t in store.tasks()] == ["t0", "t1"] and not store.additions()


def test_current_practice_counts_node_sizes_losses_and_joins() -> None:
    """A task that does not fit the first free node goes to the next that holds it (it
    was left out: the baseline ended at 100 s of 1,100); a node lost under a task moves
    the rest of it to another node; a node that joins after the last task ends changes
    nothing (it set the baseline's end)."""
    from dione.spec.cluster import Cluster

    def task(name: str, *options: tuple[int, float]) -> TaskOptions:
        return TaskOptions(name, [Option("ddp", d, s) for d, s in options])

    nodes = [NodeSpec("big", 8), NodeSpec("small", 4)]
    work = PlanningProblem(nodes, [task("a", (1, 100.0)), task("w", (8, 1000.0))])
    cluster = parse_cluster("8,4")
    # a on small (both free at 0, it ends as early there), w on big: 1000.
    assert current_practice(work, cluster, Scenario()) == pytest.approx(1000.0)
    held = PlanningProblem(nodes, [task("a", (8, 100.0)), task("w", (8, 1000.0))])
    # w waits for big, the only node that holds it: 100 + 1000.
    assert current_practice(held, cluster, Scenario()) == pytest.approx(1100.0)
    work = PlanningProblem(nodes, [task("w", (8, 1000.0)), task("a", (1, 100.0))])
    assert current_practice(work, cluster, Scenario()) == pytest.approx(1000.0)
    two = parse_cluster("2x4")  # n0, n1
    work = PlanningProblem([NodeSpec("n0", 4), NodeSpec("n1", 4)],
                           [task("x", (4, 400.0)), task("y", (4, 100.0))])
    assert current_practice(work, two, Scenario()) == pytest.approx(400.0)  # x n0, y n1
    # n0 lost at 200 under x: what it trained since its last checkpoint is lost with
    # it, then the rest on n1 from 200 (not from when n1 was free), then y after it
    # there. Checkpoints every 25 of 100 steps (100 s): at 200 s, half of it stands.
    lost = Scenario(node_losses={"n0": 200.0})
    every = RunOptions(slice_steps=25)
    assert current_practice(work, two, lost, 100, every) == pytest.approx(200 + 200 + 100)
    # ... every 30 steps: of the 50 trained, 30 stand; 70 (280 s) again on n1.
    assert current_practice(work, two, lost, 100, RunOptions(slice_steps=30)) \
        == pytest.approx(200 + 280 + 100)
    # ... the run's default slices (300 s): none ended, all of it again.
    assert current_practice(work, two, lost) == pytest.approx(200 + 400 + 100)
    late = Scenario(node_joins={"n1": 100000.0})  # both on n0; n1 sets no end
    assert current_practice(work, two, late) == pytest.approx(500.0)
    # The `sequential` solver is the same baseline: it put every task at the widest
    # node's width, so on nodes of 8 and 4 both ran on the 8 (2,000 s, against the
    # baseline's 1,100), and simulate printed a ratio to one and planned the other.
    both = PlanningProblem(nodes, [task(n, (8, 1000.0), (4, 1100.0)) for n in ("t1", "t2")])
    for problem, cluster_of in ((both, cluster), (held, cluster), (work, two)):
        plan = solve(problem, "sequential")
        assert plan.makespan == pytest.approx(current_practice(problem, cluster_of,
                                                               Scenario()))
    assert solve(both, "sequential").makespan == pytest.approx(1100.0)
    # Of nodes free as early, where the task ends first, then the cluster's order: not
    # the names' (renaming a node moved the baseline).
    slow = Scenario(node_slowdown={"z0": 1.5})
    renamed = Cluster([replace(parse_cluster("2x4").nodes[0], name="z0"),
                       parse_cluster("2x4").nodes[1]])
    work = PlanningProblem([NodeSpec("z0", 4), NodeSpec("n1", 4)],
                           [task("x", (4, 400.0)), task("y", (4, 100.0))])
    # x on n1 (ends at 400, not 600 on the slow z0), y on z0 (150).
    assert current_practice(work, renamed, slow) == pytest.approx(400.0)


def test_simulate_says_it_leaves_out_a_problem_s_release_times_and_busy_devices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A problem saved mid-run holds release times and busy devices, which `dione plan`
    honours and a simulation (every task from 0 s on idle devices) does not: said."""
    from dione.cli import main
    from dione.plan.problem import Busy

    problem = small_problem(2)
    problem = replace(problem, tasks=(replace(problem.tasks[0], release=50.0),
                                      *problem.tasks[1:]),
                      busy=(Busy("t1", "n0", (0,), 30.0),))
    file = tmp_path / "problem.json"
    file.write_text(json.dumps(problem.to_json()))
    assert main(["simulate", str(file), "--out", str(tmp_path / "run"), "--steps", "10"]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "the release times of 1 task(s) (t0); 1 busy device range(s) in the problem are " \
        "not simulated" in said, said


def test_an_untried_option_is_estimated_as_slow_as_the_task_ran_under_its_others() -> None:
    """A task measured twice as slow as profiled under single is expected twice as slow
    under ddp, which it has not run (a re-plan took ddp at its profiled speed, and a
    slowed task hopped from option to option); an option it ran keeps its own measure;
    a task that ran nowhere, or within the slices' spread of its profile, keeps the
    profile's."""
    from dione.orchestrate.estimates import Estimates

    problem = small_problem(2)
    _, profile = problem_workload(problem, 10, problem_cluster(problem))
    estimates = Estimates(profile)
    single = profile.task("t0").option("single", 1)
    ddp = profile.task("t0").option("ddp", 2)
    single_1, ddp_1 = profile.task("t1").option("single", 1), profile.task("t1").option("ddp", 2)
    assert single is not None and ddp is not None
    assert single.record.step_seconds and ddp.record.step_seconds
    estimates.measured_slice("t0", "single", 1, [9.9] + [2 * single.record.step_seconds] * 4)
    assert estimates.expected_step("t0", "single", 1) == pytest.approx(
        2 * single.record.step_seconds)
    assert estimates.expected_step("t0", "ddp", 2) == pytest.approx(
        2 * ddp.record.step_seconds)
    assert estimates.expected_step("t1", "ddp", 2) is None
    # Within a slice's own spread (here 10% slower) a task is not taken to be slower
    # elsewhere: its untried options keep the profile (taken so, a sweep's plans moved
    # with every slice's noise: RESULTS, "A task's slowdown carried ...").
    assert single_1 is not None and ddp_1 is not None
    estimates.measured_slice("t1", "single", 1, [9.9] + [1.1 * single_1.record.step_seconds] * 4)
    assert estimates.expected_step("t1", "ddp", 2) is None
    planned = estimates.task_options("t0", 10, resumed=True, evaluations=0)
    assert {o.technique: o.seconds for o in planned.options}["ddp"] == pytest.approx(
        2 * 10 * ddp.record.step_seconds, rel=0.01)


def test_the_gantt_chart_of_a_large_cluster_stays_a_readable_size(tmp_path: Path) -> None:
    """720 devices drew a 79,000-pixel-tall image (past what image readers open by
    default, and most of a minute of drawing): past 64 devices a row is a node."""
    from PIL import Image

    from dione.report.gantt import MAX_HEIGHT, draw_gantt
    from dione.state.store import SliceRecord

    slices = [SliceRecord(i, f"t{i}", "ddp", {}, f"n{i // 4}", [2 * (i % 4), 2 * (i % 4) + 1],
                          0, 10, "done" if i % 7 else "failed", float(i % 5), 6.0 + i % 5,
                          None, None, {}, None) for i in range(400)]  # 100 nodes of 8
    draw_gantt(None, slices, 0.0, tmp_path / "gantt.png", ended={"t8": "stopped"})
    width, height = Image.open(tmp_path / "gantt.png").size
    assert width == 1210 and height <= MAX_HEIGHT * 110
    from dione.report.gantt import _Layout

    by_device = _Layout([(s.node, d, s.task, "", 0.0, 1.0, "") for s in slices[:8]
                         for d in s.device_ids])  # 2 nodes: a row a device, as before
    assert not by_device.by_node and by_device.rows[:3] == ["n0:0", "n0:1", "n0:2"]


def test_a_gantt_chart_with_nothing_to_draw_says_so(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose every task failed before training (an Optuna study's broken
    trials) drew a chart that warned of a singular axis, and showed two blank panels."""
    import warnings

    from matplotlib.axes import Axes

    from dione.report.gantt import draw_gantt

    written: list[str] = []
    text = Axes.text
    monkeypatch.setattr(Axes, "text", lambda ax, x, y, s, *a, **k: (
        written.append(s), text(ax, x, y, s, *a, **k))[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draw_gantt(None, [], 0.0, tmp_path / "gantt.png")
    assert written == ["no plan was adopted", "no slice ran"]
    assert (tmp_path / "gantt.png").stat().st_size > 0


def test_a_diverged_task_keeps_the_loss_axis_logarithmic_and_is_marked_at_its_last_loss(
        tmp_path: Path) -> None:
    """A loss of 1.6e10 then NaN (review): the NaN kept the axis linear, every healthy
    line flat at 0, and the diverged mark was drawn at NaN, nowhere."""
    from dione.report.curves import draw_curves, log_scaled
    from dione.state.summaries import TaskSummary

    losses = {"wild": [(1, 2.3), (2, 1.57e10), (3, float("nan"))],
              "calm": [(s, 2.3 - s / 10) for s in range(1, 4)]}
    assert log_scaled({t: [(s, v) for s, v in p if v == v] for t, p in losses.items()})
    assert log_scaled(losses)  # the NaN is no reason against it
    assert not log_scaled({"calm": losses["calm"]})
    draw_curves([TaskSummary("wild", "diverged", 2, 3), TaskSummary("calm", "done", 3, 3)],
                losses, {}, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_task_has_one_colour_in_the_gantt_chart_and_the_learning_curves(
        tmp_path: Path) -> None:
    """The Gantt chart coloured tasks alphabetically, the curves in the workload's
    order: one page showed a task in two colours, and most short bars have no label."""
    import matplotlib
    import numpy as np
    from PIL import Image

    from dione.report.curves import draw_curves
    from dione.report.gantt import draw_gantt
    from dione.state.store import SliceRecord
    from dione.state.summaries import TaskSummary

    order = ["failed-first", "zeta", "alpha"]  # the workload's; the first never ran
    slices = [SliceRecord(i, task, "single", {}, "n", [i], 0, 10, "done", 0.0, 5.0, None,
                          None, {}, None) for i, task in enumerate(order[1:])]
    draw_gantt(None, slices, 0.0, tmp_path / "gantt.png", order=order)
    draw_curves([TaskSummary(t, "done", 10, 10) for t in order],
                {"zeta": [(s, 3.0 - s / 10) for s in range(1, 11)],
                 "alpha": [(s, 2.0) for s in range(1, 11)]}, {}, tmp_path / "curves.png")

    def colours(image: str) -> list[int]:
        """tab20's first four colours (by index) found in ``image`` (its greys are in
        every chart's grid)."""
        pixels = np.asarray(Image.open(tmp_path / image).convert("RGB")).reshape(-1, 3)
        palette = np.round(np.array([matplotlib.colormaps["tab20"](i)[:3]
                                     for i in range(4)]) * 255)
        return [i for i, rgb in enumerate(palette)
                if (np.abs(pixels - rgb).max(axis=1) <= 1).any()]

    # zeta is tab20's second in both, alpha its third (the chart had alpha first).
    assert colours("gantt.png") == colours("curves.png") == [1, 2]


def test_the_gantt_chart_marks_where_a_run_was_resumed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill and a resume left a gap in the chart only the summary explained; and the
    time the run stood still took the chart's width (a run resumed the next day was a
    sliver of bars at each end: a review). The line marks the resume, and the actual
    panel's axis leaves the time stood still out, saying so."""
    from matplotlib.axes import Axes

    from dione.report.gantt import draw_gantt
    from dione.state.store import SliceRecord

    lines: list[float] = []
    limits: list[tuple[float, float]] = []
    labels: list[str] = []
    axvline, set_xlim, set_xlabel = Axes.axvline, Axes.set_xlim, Axes.set_xlabel
    monkeypatch.setattr(Axes, "axvline", lambda ax, x=0, *a, **k: (
        lines.append(x), axvline(ax, x, *a, **k))[1])
    monkeypatch.setattr(Axes, "set_xlim", lambda ax, *a, **k: (
        limits.append(a), set_xlim(ax, *a, **k))[1])
    monkeypatch.setattr(Axes, "set_xlabel", lambda ax, text, *a, **k: (
        labels.append(text), set_xlabel(ax, text, *a, **k))[1])
    slices = [SliceRecord(i, "t", "single", {}, "n", [0], 0, 10, status, start, end, None,
                          None, {}, None)
              for i, (status, start, end) in enumerate((("interrupted", 0.0, 4.0),
                                                         ("done", 86_400.0, 86_410.0)))]
    draw_gantt(None, slices, 0.0, tmp_path / "gantt.png", resumed=[(86_400.0, 86_396.0)])
    assert lines == [4.0]  # where the second session's bars begin
    assert limits[-1] == (0, pytest.approx(14.0 * 1.01))
    assert labels[-1] == ("seconds from the run's start, the 86396 s it stood still "
                          "between sessions left out")
    # A session killed before any slice ended: its gap is from its own start, not
    # counted again from the first session's last slice (180 s were said where 100 s
    # passed, and the third session's bars fell before the axis: a regression review).
    from types import SimpleNamespace

    from dione.report.files import _stood_still

    plans = [SimpleNamespace(clock_zero=at) for at in (0.0, 100.0, 200.0)]
    done = [SimpleNamespace(started_at=1.0, ended_at=20.0),
            SimpleNamespace(started_at=201.0, ended_at=210.0)]
    assert _stood_still(plans, done) == [(100.0, 80.0), (200.0, 100.0)]


def test_learning_curves_of_a_sweep_name_each_panels_best(tmp_path: Path) -> None:
    """57 tasks in twenty colours, no legend: no curve could be told from another."""
    import matplotlib

    from dione.report.curves import NAMED, _best, _named_colour, draw_curves
    from dione.state.summaries import TaskSummary

    lines = {f"t{i}": [(1, 5.0), (2, float(i))] for i in range(30)}
    lines["nan"] = [(1, float("nan"))]
    assert _best(lines, lower=True) == [f"t{i}" for i in range(NAMED)]
    assert _best(lines, lower=False)[:2] == ["t29", "t28"]
    grey = matplotlib.colormaps["tab10"](7)  # the 8th best was drawn among the grey lines
    assert len({_named_colour(i) for i in range(NAMED)}) == NAMED and \
        grey not in {_named_colour(i) for i in range(NAMED)}
    tasks = [TaskSummary(name, "stopped" if name == "t3" else "done", 2, 2) for name in lines]
    draw_curves(tasks, lines, {n: {"accuracy": p} for n, p in lines.items()},
                tmp_path / "curves.png", lower={"loss": True, "accuracy": False})
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_plan_counts_the_slice_starts_slice_steps_makes(tmp_path: Path) -> None:
    """A task cut every --slice-steps pays a slice's start at each cut: the plan of 12
    slices was the plan of one (3.4 s planned, 8.9 s taken: review)."""
    with virtual_runner(tmp_path / "one") as (runner, _):
        record = next(iter(runner.state.records.values()))
        assert runner.planned_restarts(record, 0) == 0  # 20 steps, no forced end
    with virtual_runner(tmp_path / "cut", replace(OPTIONS, slice_steps=3)) as (runner, _):
        record = next(iter(runner.state.records.values()))
        assert runner.planned_restarts(record, 0) == 6  # slices 0-3 ... 18-20
        assert runner.planned_restarts(record, 10) == 3  # 10-13, 13-16, 16-19, 19-20


def test_a_gantt_chart_of_more_tasks_than_colours_numbers_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """48 tasks: colours repeated, no legend, one bar labelled. Each task has a number,
    on the bars that have room and in a list under the chart, in the workload's order."""
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from dione.report.gantt import draw_gantt
    from dione.state.store import SliceRecord

    order = [f"d-lr{i}" for i in range(48)]
    slices = [SliceRecord(i, task, "single", {}, "n", [i % 2], 0, 10, "done", float(i // 2),
                          float(i // 2 + 1), None, None, {}, None)
              for i, task in enumerate(order)]
    said: list[str] = []
    for cls in (Axes, Figure):
        text = cls.text
        monkeypatch.setattr(cls, "text", lambda self, x, y, s, *a, _text=text, **k: (
            said.append(str(s)), _text(self, x, y, s, *a, **k))[1])
    draw_gantt(None, slices, 0.0, tmp_path / "gantt.png", order=order)
    listed = "\n".join(s for s in said if "d-lr" in s).splitlines()
    assert listed[:2] == ["1 d-lr0", "2 d-lr1"] and len(listed) == 48, listed
    assert {str(n) for n in range(1, 49)} <= set(said)  # each bar has room for its number


def test_a_cluster_of_two_kinds_runs_each_task_at_its_kinds_times(tmp_path: Path) -> None:
    """Options per node kind (a problem profiled on H100 and on A100 nodes): every slice
    runs on a node of its option's kind at that kind's pace (its steps' times are that
    option's), current practice counts the kinds too, the report says each node's kind,
    and when the only A100 node is lost a task with A100 options alone fails with the
    kind named while the others finish on the H100."""
    def task(name: str, h100: float | None, a100: float) -> TaskOptions:
        return TaskOptions(name, tuple(
            [Option("ddp", 2, h100, kind="H100")] * (h100 is not None)
            + [Option("ddp", 2, a100, kind="A100")]))

    problem = PlanningProblem(
        (NodeSpec("h", 2, "H100"), NodeSpec("a", 2, "A100")),
        (task("fast-on-h", 100.0, 300.0), task("alike", 120.0, 130.0),
         task("a-only", None, 200.0))).check()
    result = simulate(problem, tmp_path / "run", steps=20, options=OPTIONS)
    assert set(result.statuses.values()) == {"done"}
    seconds = {(t.name, o.kind): o.seconds for t in problem.tasks for o in t.options}
    with RunStore(tmp_path / "run") as store:
        slices = store.slices()
        for s in slices:
            kind = {"h": "H100", "a": "A100"}[s.node]
            assert (s.task, kind) in seconds, (s.task, s.node)
            step = seconds[(s.task, kind)] / 20
            assert store.slice_step_seconds(s.id) == pytest.approx(
                [step] * (s.end_step - s.start_step))
    assert {s.node for s in slices if s.task == "a-only"} == {"a"}
    # Current practice, each task in turn on a whole node where it ends first:
    # fast-on-h on h (100), alike on a (130), a-only on a after it (330).
    assert current_practice(problem, problem_cluster(problem), Scenario()) == \
        pytest.approx(330.0)
    assert result.current_practice == pytest.approx(330.0)
    simulated = json.loads((tmp_path / "run" / "simulated.json").read_text())
    assert [n.get("kind") for n in simulated["cluster"]] == ["H100", "A100"]
    lost = simulate(problem, tmp_path / "lost", steps=20, options=OPTIONS,
                    scenario=Scenario(node_losses={"a": 1.0}))
    assert lost.statuses == {"fast-on-h": "done", "alike": "done", "a-only": "failed"}
    with RunStore(tmp_path / "lost") as store:
        error = next(t.error for t in store.tasks() if t.name == "a-only")
    assert error is not None and "need at least 2 devices on a node of kind A100, and " \
        "none is left" in error


def test_simulate_on_a_cluster_of_kinds_given_on_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--cluster H100:1x2,A100:1x2` gives nodes their kinds; a cluster of no kind
    leaves every kinded task out, said once for all of them with the fix."""
    def task(name: str) -> dict[str, object]:
        return {"name": name, "options": [
            {"technique": "ddp", "devices": 2, "seconds": 100.0, "kind": "H100"},
            {"technique": "ddp", "devices": 2, "seconds": 300.0, "kind": "A100"}]}

    problem = tmp_path / "p.json"
    problem.write_text(json.dumps({"cluster": {"nodes": [{"name": "x", "devices": 2}]},
                                   "tasks": [task(f"t{i}") for i in range(5)]}))
    code, out, _ = in_process(capsys, "simulate", str(problem), "--cluster",
                              "H100:1x2,A100:1x2", "--steps", "10", "--out",
                              str(tmp_path / "run"), "--no-replan")
    assert code == 0 and "5 tasks, 5 done" in out
    with RunStore(tmp_path / "run") as store:
        assert {s.node for s in store.slices()} == {"n0", "n1"}
    code, _, err = in_process(capsys, "simulate", str(problem), "--cluster", "1x2", "--out",
                              str(tmp_path / "none"))
    assert code == 2
    assert err.count("no option fits any node") == 1
    assert "5 tasks ('t0', 't1', 't2' and 2 more): no option fits any node: its options " \
        "are for nodes of kind A100, H100" in err and "--cluster H100:2x8,A100:2x8" in err
