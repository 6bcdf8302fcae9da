"""The trial runner and catalog: shared and cached trials, failures recorded, the problem."""

from __future__ import annotations

import csv
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

from dione.launch.local import LOCAL
from dione.launch.slice import SliceError
from dione.orchestrate.estimates import profile_problem
from dione.orchestrate.options import RunOptions
from dione.orchestrate.plans import read_plans
from dione.orchestrate.runner import Runner
from dione.plan import PlanningProblem, check_plan, load_problem, solve
from dione.profile import (
    Catalog,
    Profile,
    TaskProfile,
    TrialOptions,
    device_counts,
    profile_workload,
)
from dione.profile.catalog import TrialRecord
from dione.profile.choice import choose_options, trial_runs
from dione.profile.simulated import cross_check, is_pipeline, simulated_step_seconds
from dione.profile.trials import evaluation_arguments
from dione.spec.cluster import Cluster
from dione.spec.sameness import same_function
from dione.spec.workload import load_workload
from dione.zoo.digits import digits_accuracy
from helpers import TEST_NODE, digits_task, in_process, train

# The workers cannot import this test module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CLUSTER = Cluster([TEST_NODE])
QUICK = TrialOptions(warmup_steps=1, measure_steps=3, timeout=120)
DATA_PARALLEL = ("single", "ddp")


def test_device_counts() -> None:
    assert device_counts(1) == [1]
    assert device_counts(2) == [1, 2]
    assert device_counts(6) == [1, 2, 4, 6]
    assert device_counts(8) == [1, 2, 4, 8]


def test_an_option_takes_the_fastest_steps_and_the_median_fixed_cost() -> None:
    def trial(technique: str, micro_batches: int, step: float, fixed: float,
              status: str = "ok") -> TrialRecord:
        return TrialRecord(f"{technique}{micro_batches}", technique,
                           {"micro_batches": micro_batches}, 2, "cpu", status,
                           step_seconds=step if status == "ok" else None, fixed_seconds=fixed)

    trials = [trial("gpipe", 2, 0.010, 3.0), trial("gpipe", 4, 0.008, 5.0),
              trial("gpipe", 8, 0.012, 2.0), trial("gpipe", 16, 0.0, 0.0, "oom"),
              trial("ddp", 1, 0.020, 4.0)]
    gpipe, ddp = sorted(choose_options(trials, 100), key=lambda o: o.technique, reverse=True)
    # m=4 has the fastest steps; its own start-up (5 s) was the slowest, and m=8's (2 s)
    # the luckiest: the option's fixed cost is the median of the feasible three.
    assert (gpipe.technique, gpipe.knobs) == ("gpipe", {"micro_batches": 4})
    assert gpipe.record.fixed_seconds == 3.0
    assert gpipe.seconds(100) == pytest.approx(3.0 + 100 * 0.008)
    assert (ddp.technique, ddp.record.fixed_seconds) == ("ddp", 4.0)


def test_the_problem_from_profile_to_run_is_typed_and_round_trips(tmp_path: Path) -> None:
    """The profile's problem and the run's (its remaining work, as re-planning builds it)
    are typed objects; their files read back as equal objects."""
    task = digits_task("a", techniques=DATA_PARALLEL, evaluate=digits_accuracy)
    trials = [TrialRecord("s", "single", {"accumulation": 1}, 1, "cpu", "ok",
                          step_seconds=0.01, fixed_seconds=1.0),
              TrialRecord("d", "ddp", {"accumulation": 1}, 2, "cpu", "ok",
                          step_seconds=0.006, fixed_seconds=1.5)]
    found = TaskProfile("a", "g", 12, options=choose_options(trials, 12), trials=trials,
                        evaluation_seconds=0.5)
    profile = Profile(CLUSTER, [found, TaskProfile("b", "g", 12)])  # b: no option, left out
    problem = profile_problem(profile)
    assert [(t.name, [(o.technique, o.devices) for o in t.options]) for t in problem] == [
        ("a", [("single", 1), ("ddp", 2)])]
    assert problem.task("a").options[0].seconds == pytest.approx(1.0 + 12 * 0.01 + 0.5)
    assert problem.nodes[0].kind == TEST_NODE.model  # an accelerator's name, none here
    assert PlanningProblem.from_json(json.loads(json.dumps(problem.to_json()))) == problem

    runner = Runner([task], CLUSTER, tmp_path / "run", profile, RunOptions(time_limit=2.0),
                    lambda event: None, lambda state: None, LOCAL)
    try:
        remaining, _ = runner.problem()
        assert PlanningProblem.from_json(json.loads(json.dumps(remaining.to_json()))) == remaining
        # `dione profile -o` and a run's first problem are one rule's: the same problem.
        assert remaining == problem
        runner.plan_now()
        (adopted,) = read_plans(tmp_path / "run")
        assert adopted.run_clock == tuple(runner.state.plan)
        assert [a.task for a in adopted.plan.assignments] == ["a"]
        assert check_plan(adopted.plan, adopted.problem) == []
    finally:
        runner.store.close()


def test_a_solver_that_finds_no_plan_leaves_the_run_to_greedy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """saturn-milp returns no plan where its model would be too large; the run was left
    with nothing placed before, and now plans with greedy and says so."""
    import dione.plan.saturn_milp

    monkeypatch.setattr(dione.plan.saturn_milp, "MAX_ROWS", 0)  # any model is too large
    trials = [TrialRecord("s", "single", {"accumulation": 1}, 1, "cpu", "ok",
                          step_seconds=0.01, fixed_seconds=1.0)]
    profile = Profile(CLUSTER, [TaskProfile(name, "g", 12, options=choose_options(trials, 12),
                                            trials=trials) for name in ("a", "b")])
    events: list[tuple[str, str]] = []
    runner = Runner([digits_task("a"), digits_task("b")], CLUSTER, tmp_path / "run", profile,
                    RunOptions(solver="saturn-milp", time_limit=2.0),
                    lambda event: events.append((event.kind, event.message)),
                    lambda state: None, LOCAL)
    try:
        runner.plan_now()
        assert sorted(a.task for a in runner.state.plan) == ["a", "b"]
        (adopted,) = read_plans(tmp_path / "run")
        assert adopted.plan.solver == "greedy"
        assert events[0][0] == "planner_fell_back" and "not built" in events[0][1]
    finally:
        runner.store.close()


def test_a_task_only_a_lost_node_could_hold_fails_alone(tmp_path: Path) -> None:
    """Losing the one node of two devices strands a task profiled on two devices only:
    the others are planned on, and that task is given up with a reason, not the run."""
    from dione.launch.slice import SliceError
    from dione.spec.cluster import Node

    wide, narrow = Node("wide", 2, "cpu"), Node("narrow", 1, "cpu")
    ddp = [TrialRecord("d", "ddp", {"accumulation": 1}, 2, "cpu", "ok", step_seconds=0.006,
                       fixed_seconds=1.5)]
    single = [TrialRecord("s", "single", {"accumulation": 1}, 1, "cpu", "ok",
                          step_seconds=0.01, fixed_seconds=1.0)]
    profile = Profile(Cluster([wide, narrow]), [
        TaskProfile("a", "g", 12, options=choose_options(ddp, 12), trials=ddp),
        TaskProfile("b", "g", 12, options=choose_options(single, 12), trials=single)])
    events: list[str] = []
    runner = Runner([digits_task("a", techniques=DATA_PARALLEL), digits_task("b")],
                    Cluster([wide, narrow]), tmp_path / "run", profile,
                    RunOptions(time_limit=2.0), lambda event: events.append(event.message),
                    lambda state: None, LOCAL)
    try:
        runner.plan_now()
        assert {a.task: a.node for a in runner.state.plan} == {"a": "wide", "b": "narrow"}
        runner._lose_node("wide", runner.state.records["a"], SliceError("node lost",
                                                                         "node_lost"))
        runner.plan_now()  # raised ProblemError before: "a" fits no node left
        assert [(a.task, a.node) for a in runner.state.plan] == [("b", "narrow")]
        assert runner.state.records["a"].status == "pending"  # a node wide enough may join
        assert runner._fail_the_unplaceable()
        assert {r.name: r.status for r in runner.state.records.values()} == {
            "a": "failed", "b": "pending"}
        record = runner.store.task("a")
        assert record is not None and record.status == "failed"
        assert "need at least 2 devices on one node, and the widest node left has 1" in (
            record.error or "")
    finally:
        runner.store.close()


def test_the_simulator_cross_checks_pipeline_trials_only(tmp_path: Path) -> None:
    assert all(is_pipeline(name) for name in ("gpipe", "1f1b", "xpipe"))
    assert not any(is_pipeline(name) for name in ("single", "ddp", "fsdp", "no-such"))
    times = {"forward": [0.01, 0.01], "backward": [0.02, 0.02], "update": [0.001, 0.001]}
    gpipe = TrialRecord("g", "gpipe", {"micro_batches": 2}, 2, "cpu", "ok", step_seconds=0.1,
                        extra={"stage_times": times})
    onefoneb = TrialRecord("o", "1f1b", {"micro_batches": 2}, 2, "cpu", "ok", step_seconds=0.1)
    ddp = TrialRecord("d", "ddp", {"accumulation": 1}, 2, "cpu", "ok", step_seconds=0.1)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        cross_check({"g": gpipe, "o": onefoneb, "d": ddp}, dict.fromkeys("god", "group"),
                    catalog)
    assert gpipe.simulated_step_seconds == simulated_step_seconds("gpipe", times, 2)
    assert "from its own action times" in (gpipe.simulation_note or "")
    # 1f1b logged none: gpipe's, on the same stages and micro-batches, stand in.
    assert onefoneb.simulated_step_seconds == simulated_step_seconds("1f1b", times, 2)
    assert "from gpipe trial action times" in (onefoneb.simulation_note or "")
    assert ddp.simulated_step_seconds is None and ddp.simulation_note is None


def test_the_simulator_makes_xpipe_wait_for_weights_its_stages_share(tmp_path: Path) -> None:
    """A tied weight's gradients are summed across its stages at each xpipe update: the
    last stage waits there for the first's last backward, every mini-batch."""
    times = {"forward": [0.01, 0.01], "backward": [0.02, 0.02], "update": [0.001, 0.001]}
    alone = simulated_step_seconds("xpipe", times, 2)
    tied = simulated_step_seconds("xpipe", times, 2, shared=[[0, 1]])
    assert tied > alone
    knobs = {"micro_batches": 2}
    own = TrialRecord("t", "xpipe", knobs, 2, "cpu", "ok", step_seconds=0.1,
                      extra={"stage_times": times, "shared_stages": [[0, 1]]})
    # No timeline of its own: the tied trial's times, and its shared stages.
    borrows = TrialRecord("b", "xpipe", {**knobs, "prediction": False}, 2, "cpu", "ok",
                          step_seconds=0.1)
    # Made before trials kept their shared stages: simulated as if nothing were shared.
    old = TrialRecord("o", "xpipe", {**knobs, "balance": "time"}, 2, "cpu", "ok",
                      step_seconds=0.1, extra={"stage_times": times})
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        cross_check({"t": own, "b": borrows, "o": old}, dict.fromkeys("tbo", "group"), catalog)
    assert own.simulated_step_seconds == borrows.simulated_step_seconds == tied
    assert old.simulated_step_seconds == alone


def test_shared_cached_and_reprofiled_only_where_changed(tmp_path: Path) -> None:
    a = digits_task("a", techniques=DATA_PARALLEL)
    b = replace(digits_task("b", techniques=DATA_PARALLEL), seed=11,
                optimizer=functools.partial(torch.optim.Adam, lr=3e-2))
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        began = time.monotonic()
        first = profile_workload([a, b], CLUSTER, catalog, options=QUICK)
        wall = time.monotonic() - began
        # Two tasks that differ in learning rate and seed share one set of trials.
        assert first.trials_run == 2
        assert first.task("a").group == first.task("b").group
        assert [r.fingerprint for r in first.task("a").trials] == [
            r.fingerprint for r in first.task("b").trials]
        assert {(o.technique, o.devices) for o in first.task("a").options} == {
            ("single", 1), ("ddp", 2)}
        for record in first.task("a").trials:
            assert record.status == "ok", record.reason
            assert record.step_seconds and record.step_seconds > 0
            assert record.measured_steps == 3
            assert record.peak_memory_bytes and record.peak_memory_bytes > 0
            assert record.load_seconds > 0 and record.save_seconds > 0
            # What the gang measured inside (its steps, save and load) fits in the
            # trial's wall time the launcher measured around it, which fits in this
            # call's own.
            inside = (record.measured_steps * record.step_seconds + record.save_seconds
                      + record.load_seconds)
            assert inside <= record.trial_seconds + 1e-6
            assert record.trial_seconds <= wall

        again = profile_workload([a, b], CLUSTER, catalog, options=QUICK)
        assert again.trials_run == 0 and again.trials_cached == 2
        assert profile_problem(again) == profile_problem(first)

        bigger = replace(b, batch_size=32)
        changed = profile_workload([a, bigger], CLUSTER, catalog, options=QUICK)
        assert changed.trials_run == 2  # b's trials only; a's come from the catalog
        assert changed.task("a").group != changed.task("b").group

        forced = profile_workload([a], CLUSTER, catalog, options=QUICK, reprofile=True)
        assert forced.trials_run == 2


def test_a_trial_timed_beside_another_dione_process_training_is_not_kept(
        tmp_path: Path) -> None:
    """Two profiles sharing the CPU cores stored a task at 4x its speed alone, and every
    later run took it from the catalog (review): a trial timed while another dione
    process trains here is this profile's only, and says so; a process gone is none."""
    from dione.launch.neighbours import others_training

    neighbour = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom dione.launch.neighbours import "
         "training_here\nwith training_here():\n    print('ready', flush=True)\n"
         "    time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert neighbour.stdout is not None and neighbour.stdout.readline() == "ready\n"
        assert neighbour.pid in others_training()
        with Catalog(tmp_path / "catalog.sqlite") as catalog:
            found = profile_workload([digits_task("a", techniques=("single",))], CLUSTER,
                                     catalog, options=QUICK)
            [record] = found.task("a").trials
            assert record.status == "ok" and neighbour.pid in record.extra["beside"]
            assert catalog.get(record.fingerprint) is None  # timed again next time
    finally:
        neighbour.kill()
        neighbour.wait()
    assert neighbour.pid not in others_training()
    # This process's own task slices count too (a task added to a live run is profiled
    # beside them), its trials side by side do not (a profile runs them so).
    from dione.launch.neighbours import training_here

    with training_here():
        assert others_training() == []
    with training_here(slice_of_a_task=True):
        assert others_training() == [os.getpid()]


def test_a_trial_measured_over_fewer_steps_than_asked_is_timed_again(
        tmp_path: Path) -> None:
    """--measure-steps raised was answered with the catalog's rows of fewer steps,
    silently (review); more steps than asked serve, and so does a short task's all."""
    task = digits_task("a", techniques=("single",))
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        runs = [profile_workload([task], CLUSTER, catalog, options=replace(
            QUICK, measure_steps=steps)).trials_run for steps in (3, 6, 6, 3)]
        assert runs == [1, 1, 0, 0]
        short = replace(task, name="short", steps=4)  # 1 warm-up, 3 timed: all it has
        assert profile_workload([short], CLUSTER, catalog, options=replace(
            QUICK, measure_steps=6)).trials_run == 0


def test_a_trial_its_task_diverges_is_timed_again_on_a_task_sharing_it(
        tmp_path: Path) -> None:
    """Tasks that differ in learning rate share trials; where the task a trial ran
    diverged (lr 1e30), the trial runs again as the next task of its group, so one
    diverging rate in a sweep does not leave every rate with no configuration that fits
    (it did, depending on the grid's order)."""
    wild = digits_task("wild", techniques=("single",),
                       optimizer=functools.partial(torch.optim.Adam, lr=1e30))
    tame = digits_task("tame", techniques=("single",))
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        found = profile_workload([wild, tame], CLUSTER, catalog, options=QUICK)
    assert found.trials_run == 2  # the diverged one, then again
    for name in ("wild", "tame"):
        [option] = found.task(name).options
        assert option.technique == "single" and option.record.status == "ok"


def _hangs_in_workers(model):  # travels by value: the workers cannot import tests
    """An evaluate that never returns where training runs (a spawned worker)."""
    if "DIONE_LAUNCHER_PID" in os.environ:
        time.sleep(3600)
    return {"accuracy": 1.0}


def test_an_evaluate_that_hangs_holds_up_one_trial_not_each(tmp_path: Path) -> None:
    """Every trial of the task ran its evaluate, each hung the trial timeout in turn, and
    no task trained for as long (a review). The first hang is the evaluation's failure,
    said; the configuration is timed again without it; the other trials do not run it."""
    task = digits_task("hangs", techniques=("single", "ddp"), evaluate=_hangs_in_workers)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        found = profile_workload([task], Cluster([replace(TEST_NODE, devices=2)]), catalog,
                                 options=replace(QUICK, timeout=14))
    profile = found.task("hangs")
    assert sorted((o.technique, o.devices) for o in profile.options) == [("ddp", 2),
                                                                          ("single", 1)]
    assert found.trials_run == 3  # the hung one, then again without its evaluation
    assert profile.evaluated is not None and profile.evaluated.error is not None and \
        "did not return within the trial's 14 s" in profile.evaluated.error


def _built_slowly():  # travels by value
    """A model whose build takes most of a trial's time where training runs."""
    if "DIONE_LAUNCHER_PID" in os.environ:
        time.sleep(7)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def test_a_trial_out_of_time_after_a_slow_build_does_not_blame_a_quick_evaluate(
        tmp_path: Path) -> None:
    """Its evaluate had begun when the trial's timeout ended it, and was said to hang
    (its failure given to its tasks, a stopping rule's metric then missing) although the
    build and training had taken the time (a regression review); then, so blamed only
    where it ran half the trial's timeout, the task had no option (the next review). It
    had trained: the configuration is timed again without the evaluation, which another
    trial times."""
    task = digits_task("slow", model=_built_slowly, techniques=("single",),
                       evaluate=_hangs_in_workers)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        found = profile_workload([task], CLUSTER, catalog,
                                 options=replace(QUICK, timeout=11))
    profile = found.task("slow")
    assert [(o.technique, o.record.status) for o in profile.options] == [("single", "ok")]
    # The third, run to time the evaluation, ran out of time after the build as well.
    assert found.trials_run == 3 and profile.evaluated is None  # untimed, not failed


def pick(model, metric):  # travels by value (below): the workers cannot import tests
    """An evaluate that returns one metric, named by its partial's argument."""
    from dione.zoo.digits import digits_accuracy

    found = digits_accuracy(model)
    return {metric: found["accuracy" if metric == "acc" else "test_loss"]}


def test_a_run_ends_diverged_only_the_tasks_whose_trials_diverged_and_judges_each_evaluate(
        tmp_path: Path) -> None:
    """Three rates of a group diverged in the trial it shares, so the fourth, a tame one,
    never ran: it read diverged (for good) in a message naming another task. And tasks
    whose evaluate is one function under two partials (metric 'acc', metric 'loss') share
    an evaluation key: the one trial's metrics failed the other before it trained."""
    from dione.orchestrate import run_workload
    from dione.spec.stopping import Patience
    from dione.state.store import RunStore

    wild = [digits_task(f"wild{i}", techniques=("single",),
                        optimizer=functools.partial(torch.optim.Adam, lr=lr))
            for i, lr in enumerate((1e30, 1e29, 1e28))]
    tame = digits_task("tame", techniques=("single",))
    judged = [digits_task(f"by-{m}", batch_size=8, steps=8, techniques=("single",),
                          evaluate=functools.partial(pick, metric=m),
                          stopping=Patience(metric=m, mode="max" if m == "acc" else "min",
                                            min_steps=4, every=4, patience=5,
                                            threshold=-1e9 if m == "acc" else 1e9))
              for m in ("acc", "loss")]
    # A group whose trial diverged as its first task and fit as its second: the first
    # was launched all the same, to diverge again (review).
    alone = [digits_task(name, batch_size=4, steps=8, techniques=("single",),
                         optimizer=functools.partial(torch.optim.Adam, lr=lr))
             for name, lr in (("lone-wild", 1e30), ("calm", 1e-3))]
    result = run_workload([*wild, tame, *judged, *alone], Cluster([TEST_NODE]),
                          tmp_path / "run",
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                                     time_limit=2.0))
    statuses = {t.task: t.status for t in result.tasks}
    assert statuses == {"wild0": "diverged", "wild1": "diverged", "wild2": "diverged",
                        "tame": "failed", "by-acc": "done", "by-loss": "done",
                        "lone-wild": "diverged", "calm": "done"}, statuses
    with RunStore(tmp_path / "run") as store:
        assert store.slices("lone-wild") == [] and "diverged in its profiling trial " \
            "(single x1): task 'lone-wild' diverged" in (store.task("lone-wild").error or "")
        assert "the trial it shares with wild0, wild1, wild2 diverged as each of them " \
            "(their learning rates) and was not run as this task: lower those rates" in \
            (store.task("tame").error or "")
        assert "(single x1, which diverged as each of wild0, wild1, wild2; the last: " \
            "task 'wild2' diverged: its loss was nan" in (store.task("wild1").error or "")
    from dione.report import write_report

    with open(write_report(tmp_path / "run") / "summary.csv") as rows:
        trained = {row["task"]: row["trained"] for row in csv.DictReader(rows)}
    assert trained["lone-wild"] == "" and trained["calm"] == "exact"  # no step: not exact


def own_score(model):  # another evaluate of the same model, another name
    """An evaluate that returns the accuracy as 'score'."""
    from dione.zoo.digits import digits_accuracy

    return {"score": digits_accuracy(model)["accuracy"]}


def scored(model):
    """An evaluate the catalog has not timed."""
    return {"score": 1.0}


def scored_as(name, model):
    """An evaluate whose metric its partial names."""
    return {name: 1.0}


class Evaluator:
    """An evaluate as a method of an object (a held-out split it keeps)."""

    def evaluate(self, model):
        return {"score": 1.0}


def test_one_function_is_told_from_another_as_its_evaluations_need() -> None:
    """A bound method read once per task is a new object each time: each task's was taken
    for an evaluation of its own, and run again (a review: a trial per task)."""

    def made(split):
        return lambda model: {split: 1.0}

    held, other = Evaluator(), Evaluator()
    assert same_function(held.evaluate, held.evaluate)
    assert not same_function(held.evaluate, other.evaluate)
    assert same_function(made("val"), made("val")) and not same_function(made("val"),
                                                                         made("test"))
    assert same_function(functools.partial(scored_as, "a"), functools.partial(scored_as, "a"))
    assert evaluation_arguments(made("val")) != evaluation_arguments(made("test"))
    assert evaluation_arguments(scored_as) == ""  # as catalogs have keyed it


def test_each_evaluate_of_a_speed_group_is_run_by_a_trial_it_shares(tmp_path: Path) -> None:
    """Tasks of one speed group share trials; each evaluate function among them is run
    by one (what it returns, its cost), not only the first task's: a second task's typo'd
    metric was found at its first rung, its evaluation priced at the first's cost. An
    evaluate the catalog never timed, on tasks whose trials it holds, is timed by one
    trial run again."""
    from dione.spec.stopping import Asha

    first = digits_task("first", techniques=("single",), evaluate=digits_accuracy)
    second = digits_task("second", techniques=("single",), evaluate=own_score,
                         optimizer=functools.partial(torch.optim.Adam, lr=3e-2))
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        profile = profile_workload([first, second], CLUSTER, catalog, options=QUICK)
        # One trial times one evaluation: the shared one ran again for the second's.
        assert profile.trials_run == 2
        assert profile.task("first").group == profile.task("second").group
        evaluated = {name: profile.task(name).evaluated for name in ("first", "second")}
        assert evaluated["first"] is not None and evaluated["second"] is not None
        assert evaluated["first"].metrics == ("accuracy", "test_loss")
        assert evaluated["second"].metrics == ("score",)
        # Each priced at its own evaluation's cost, as the catalog keeps it (the second
        # was given the first's: its own was never timed).
        for name in ("first", "second"):
            task = profile.task(name)
            assert task.evaluation_key is not None
            assert task.evaluation_seconds == catalog.evaluation_seconds(task.evaluation_key)
        assert profile.task("first").evaluation_key != profile.task("second").evaluation_key

        # With a trial for each, no trial runs again: a second trial times the second's.
        wider = [replace(t, techniques=DATA_PARALLEL) for t in (first, second)]
        with Catalog(tmp_path / "wider.sqlite") as own:
            both = profile_workload(wider, CLUSTER, own, options=QUICK)
        assert both.trials_run == 2
        said = [both.task(t.name).evaluated for t in wider]
        assert [None if e is None else e.metrics for e in said] == [
            ("accuracy", "test_loss"), ("score",)]

        third = replace(second, name="third", evaluate=scored)
        again = profile_workload([first, second, third], CLUSTER, catalog, options=QUICK)
        assert again.trials_cached == 1 and again.trials_run == 1  # for third's evaluate
        assert again.task("third").evaluated is not None
        assert again.task("third").evaluated.metrics == ("score",)
        assert again.task("second").evaluated is None  # the catalog knows its returns
        assert again.task("second").cached_metrics == ("score",)
        # Runs again for an evaluation alone leave the record as it was (merged, a
        # record grew by a run in every session whose evaluation the catalog lacked).
        [record] = again.task("third").trials
        assert len(trial_runs(record)) == 1 == len(trial_runs(catalog.get(record.fingerprint)))
        # A key the catalog knows is not run again, though these arguments are new.
        fourth = replace(second, name="fourth", evaluate=functools.partial(scored_as, "f"))
        fifth = replace(second, name="fifth", evaluate=functools.partial(scored_as, "g"))
        known = profile_workload([first, fourth], CLUSTER, catalog, options=QUICK)
        assert known.trials_run == 1 and known.task("fourth").evaluated is not None
        later = profile_workload([first, fifth], CLUSTER, catalog, options=QUICK)
        assert later.trials_run == 0 and later.task("fifth").evaluated is None

    # Before any training, in a run: the second's rule names a metric its evaluate lacks.
    typo = replace(second, steps=8, eval_every=4,
                   stopping=Asha(metric="scor", mode="max", min_steps=4, eta=2))
    from dione.orchestrate import run_workload
    from dione.state.store import RunStore

    result = run_workload([first, typo], CLUSTER, tmp_path / "run",
                          RunOptions(catalog=str(tmp_path / "fresh.sqlite"), trial=QUICK,
                                     time_limit=2.0))
    assert {t.task: t.status for t in result.tasks} == {"first": "done", "second": "failed"}
    with RunStore(tmp_path / "run") as store:
        assert store.slices("second") == []
        assert "it returned 'score' in its profiling trial" in (store.task("second").error
                                                                 or "")


OOM_AND_CRASH = '''
import functools, torch
from torch import nn
from dione import Task, Workload, register
from dione.techniques.single import Single
from dione.zoo import digits_mlp, digits_train


class Crashes(Single):
    """single, except that it always fails."""
    name = "crashes"

    def train(self, ctx):
        raise RuntimeError("this technique always crashes")


register(Crashes())


class Unsure(Single):
    """A user's technique whose knob_settings raises: left out for its task alone."""
    name = "unsure"

    def knob_settings(self, task, devices, kind):
        raise ValueError("no settings today")


register(Unsure())


def big_model():
    # About 400 MB with gradients and Adam's two moments, over a 512 MiB cap beside a
    # worker's own ~300 MB (a small model: every trial of it builds it and fails).
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 2048),
                         *(nn.Linear(2048, 2048) for _ in range(6)), nn.Linear(2048, 10))


def task(name, model, techniques):
    return Task(name=name, model=model, data=digits_train,
                loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-3), batch_size=8,
                steps=6, techniques=techniques)


workload = Workload([
    task("big", big_model, ("single", "ddp", "fsdp")),
    task("small", functools.partial(digits_mlp, hidden=16, depth=1),
         ("single", "crashes", "unsure")),
])
'''


def test_repeated_trials_keep_the_median_of_their_runs(tmp_path: Path) -> None:
    task = digits_task("a", techniques=DATA_PARALLEL)
    with pytest.raises(ValueError, match="repeats is 0"):
        replace(QUICK, repeats=0)
    twice = replace(QUICK, repeats=2)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        first = profile_workload([task], CLUSTER, catalog, options=twice)
        # single x1 and ddp x2, each once and then again after the other.
        assert first.trials_run == 4
        for option in first.task("a").options:
            runs = option.record.extra["runs"]
            assert len(runs) == 2 and option.record.measured_steps == 6
            assert option.record.step_seconds == pytest.approx(
                statistics.median(r["step_seconds"] for r in runs))
            assert option.record.fixed_seconds == pytest.approx(
                statistics.median(r["fixed_seconds"] for r in runs))
            assert catalog.get(option.record.fingerprint) == option.record
        # The catalog holds both runs: the same request runs nothing, one more runs each
        # option's setting once more.
        assert profile_workload([task], CLUSTER, catalog, options=twice).trials_run == 0
        thrice = profile_workload([task], CLUSTER, catalog, options=replace(QUICK, repeats=3))
        assert thrice.trials_run == 2
        assert [len(o.record.extra["runs"]) for o in thrice.task("a").options] == [3, 3]


class _OutOfMemoryAdam(torch.optim.Adam):
    """Adam whose step runs out of memory, as a GPU's would."""

    def step(self, closure=None):  # type: ignore[override]
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")


class _MaxNormSGD(torch.optim.SGD):
    """SGD with a max-norm constraint on each row after its step (renorm_, an operator
    DTensor has no sharding strategy for, said bare by torch)."""

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = super().step(closure)
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.ndim == 2:
                    parameter.renorm_(2, 0, 1.0)
        return loss


def test_an_optimizer_that_cannot_step_dtensor_shards_leaves_fsdp_out_saying_why(
        tmp_path: Path) -> None:
    """torch's Adafactor steps plain tensors only: under fsdp its in-place pow_ on a row
    norm failed with a message about DTensor placements alone. The trial is a crash
    naming the optimizer and the fix, and the plan keeps single."""
    task = digits_task("ada", techniques=("single", "fsdp"),
                       optimizer=functools.partial(torch.optim.Adafactor, lr=1e-2))
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        profile = profile_workload([task], CLUSTER, catalog, options=QUICK)
    crashed = next(r for r in profile.task("ada").trials if r.technique == "fsdp")
    assert crashed.status == "crash"
    assert "the optimizer Adafactor failed to step fsdp's parameters" in (crashed.reason or "")
    assert "without 'fsdp'" in (crashed.reason or "")
    assert [o.technique for o in profile.task("ada").options] == ["single"]
    # Out of memory at the step is said as such, not blamed on DTensor (a regression
    # review: every RuntimeError of the update was).
    with pytest.raises(SliceError) as raised:
        train(digits_task("oom", optimizer=functools.partial(_OutOfMemoryAdam, lr=1e-2),
                          steps=2), "fsdp", tmp_path / "oom")
    assert raised.value.error_type == "OutOfMemoryError"
    assert "fsdp's parameters" not in str(raised.value)
    with pytest.raises(SliceError, match="the optimizer _MaxNormSGD failed to step fsdp's "
                       r"parameters.*aten.renorm_.default does not have a sharding strategy"):
        train(digits_task("renorm", optimizer=functools.partial(_MaxNormSGD, lr=0.1),
                          steps=2), "fsdp", tmp_path / "renorm")


def test_out_of_memory_and_crash_are_recorded_and_the_rest_completes(tmp_path: Path) -> None:
    file = tmp_path / "oom_and_crash.py"
    file.write_text(OOM_AND_CRASH)
    tasks = list(load_workload(file))
    options = replace(QUICK, memory_cap_bytes=2**29)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        profile = profile_workload(tasks, CLUSTER, catalog, options=options)
    big, small = profile.task("big"), profile.task("small")
    statuses = {(r.technique, r.devices): r for r in big.trials}
    assert statuses[("single", 1)].status == "oom"
    assert "exceeds the device's memory cap" in (statuses[("single", 1)].reason or "")
    # Out of memory, single tries smaller passes (accumulation) before it gives up.
    assert sorted(r.knobs["accumulation"] for r in big.trials if r.technique == "single") == [
        1, 2, 4]
    # ddp replicates the model: a setting whose passes are no smaller than those single
    # ran out of memory with is not even tried (x2 at accumulation 1 and 2, against single
    # at 2 and 4); x2 at accumulation 4 has smaller ones, and is.
    assert [r.knobs["accumulation"] for r in big.trials if r.technique == "ddp"] == [4]
    skipped = {s.label: s.reason for s in big.skipped if s.technique == "ddp"}
    assert set(skipped) == {"ddp x2", "ddp x2 [accumulation=2]"}
    assert all("ran out of memory" in reason for reason in skipped.values())
    # fsdp shards it over both devices, so it is tried (and fits or not, but is recorded).
    assert any(r.technique == "fsdp" for r in big.trials)
    # A technique's knob_settings that raises took the whole profile down.
    assert any(n.technique == "unsure" and "raised ValueError: no settings today" in n.reason
               for n in small.not_applicable), small.not_applicable
    crashed = next(r for r in small.trials if r.technique == "crashes")
    assert crashed.status == "crash"
    assert "this technique always crashes" in (crashed.reason or "")
    assert [(o.technique, o.devices) for o in small.options] == [("single", 1)]
    # Infeasible results are cached too: profiling again runs nothing.
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        again = profile_workload(tasks, CLUSTER, catalog, options=options)
    assert again.trials_run == 0
    assert again.task("big").trials[0].status == "oom"
    # Out of memory everywhere, said in one line (the closing lines, status and
    # summary.csv show a reason's last line: it was "(see `dione profile`)" alone).
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        only = profile_workload([replace(tasks[0], techniques=("single",))], CLUSTER,
                                catalog, options=options)
    why = only.task("big").why_no_option()
    assert "\n" not in why and why.startswith(
        "no configuration fits: out of memory under every option tried: single x1"), why
    assert "raise the memory cap (--memory-cap)" in why
    # Without the cap, what ran out of memory under it is measured afresh, not served
    # (single alone: ddp and fsdp of this model would only add seconds).
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        uncapped = profile_workload([replace(tasks[0], techniques=("single",))], CLUSTER,
                                    catalog, options=QUICK, parallel=False)
    assert uncapped.trials_run > 0
    record = {(r.technique, r.devices): r for r in uncapped.task("big").trials}[("single", 1)]
    assert record.status == "ok" and record.peak_memory_bytes
    # Under a cap above its peak, its uncapped row serves (every trial was timed again
    # for any cap: review); under one below it, the capped rows stand.
    for cap, runs in ((record.peak_memory_bytes + 2**20, 0), (2**29, 0)):
        with Catalog(tmp_path / "catalog.sqlite") as catalog:
            capped = profile_workload([replace(tasks[0], techniques=("single",))],
                                      CLUSTER, catalog, options=replace(
                                          QUICK, memory_cap_bytes=cap), parallel=False)
        assert capped.trials_run == runs
        first = {(r.technique, r.devices, r.knobs["accumulation"]): r.status
                 for r in capped.task("big").trials}[("single", 1, 1)]
        assert first == ("ok" if cap > 2**29 else "oom"), (cap, first)


def test_budget_skips_trials_and_does_not_cache_the_skips(tmp_path: Path) -> None:
    task = digits_task("a", techniques=DATA_PARALLEL)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        none = profile_workload([task], CLUSTER, catalog, options=QUICK, budget=0.0)
        assert none.trials_run == 0
        skipped = {s.label: s.reason for s in none.task("a").skipped}
        assert skipped["single x1"] == skipped["ddp x2"] == "over the profiling budget of 0 s"
        assert skipped["fsdp"] == "task 'a' allows only single, ddp"
        assert profile_problem(none).tasks == ()
        later = profile_workload([task], CLUSTER, catalog, options=QUICK)
        assert later.trials_run == 2


SMALL = '''
import functools, torch
from dione import Task, Workload, grid
from dione.zoo import digits_mlp, digits_train

def task(lr):
    return Task(name="digits", model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=digits_train, loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.SGD, lr=lr), batch_size=16, steps=40,
                techniques=("single", "ddp"))

workload = grid("digits", task, lr=[0.05, 0.1])
'''


def test_cli_profile_writes_a_problem_the_planner_solves(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "small.py"
    file.write_text(SMALL)
    monkeypatch.setenv("DIONE_CATALOG", str(tmp_path / "catalog.sqlite"))

    def profile() -> tuple[int, str, str]:  # in this process: its spawner is kept
        return in_process(capsys, "profile", str(file), "--devices", "cpu:2",
                          "--warmup-steps", "1", "--measure-steps", "3", "-o",
                          str(tmp_path / "p.json"))

    status, out, err = profile()
    assert status == 0, err
    assert "2 trial(s) run, 0 taken from the catalog" in out
    problem = load_problem(tmp_path / "p.json")
    assert [t.name for t in problem.tasks] == ["digits-lr0.05", "digits-lr0.1"]
    raw = json.loads((tmp_path / "p.json").read_text())
    for task in raw["tasks"]:
        assert {o["technique"] for o in task["options"]} == {"single", "ddp"}
        assert all(o["seconds"] > 0 for o in task["options"])
        # Where each figure comes from (the file said nothing of it: review).
        assert all(o["source"].startswith("profile: trial ") and "3 steps timed" in
                   o["source"] for o in task["options"])
    assert "trials of 1 warm-up and 3 timed steps (2 run now, 0 from the catalog" in \
        raw["sources"]["profile"] and "torch " in raw["sources"]["profile"]
    assert solve(problem, "cpsat", 5.0).assignments
    assert out.count("from the catalog") == 1  # the title's: every row was run now
    status, out, err = profile()
    assert status == 0, err
    assert "0 trial(s) run, 2 taken from the catalog" in out
    assert out.count("│ from the catalog") == 4  # which rows were not run now (review)
    # No task with a feasible option (a budget of 0 runs no trial): no problem file,
    # which `dione plan` would refuse (review).
    status, out, err = in_process(capsys, "profile", str(file), "--devices", "cpu:2",
                                  "--budget", "0", "--reprofile", "-o",
                                  str(tmp_path / "none.json"))
    assert status == 1 and not (tmp_path / "none.json").exists()
    assert "no task has a feasible option" in " ".join(err.split())
    assert "CPU slots on" not in err  # as many slots as cores (this machine: 2 or more)
    # More slots than cores: said, as the plans are then optimistic (review).
    slots = len(os.sched_getaffinity(0)) * 2
    _, _, err = in_process(capsys, "profile", str(file), "--devices", f"cpu:{slots}",
                           "--budget", "0")
    assert f"{slots} CPU slots on {slots // 2} core(s): tasks side by side share cores" in \
        " ".join(err.split())


def test_memory_saving_knobs_are_tried_only_where_memory_ran_out(tmp_path: Path) -> None:
    task = digits_task("a", techniques=("fsdp",))
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        profile = profile_workload([task], CLUSTER, catalog, options=QUICK)
    result = profile.task("a")
    assert [(r.technique, r.knobs["reshard_after_forward"], r.status) for r in result.trials] \
        == [("fsdp", False, "ok")]
    reasons = [s.reason for s in result.skipped if s.label.startswith("fsdp x2")]
    # resharding, then activation checkpointing, then accumulation 2 and 4 on top.
    assert len(reasons) == 4
    assert all("fits in memory" in why and "only trades speed for memory" in why
               for why in reasons)


class _SmoothedLoss:
    """A loss given as a callable object (its class has no repr of its own)."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(output, target,
                                                 label_smoothing=self.smoothing)


def test_a_loss_object_gives_the_same_speed_signature_every_time() -> None:
    """Its default repr holds a memory address: equal tasks must still share trials."""
    from dione.profile.fingerprint import speed_signature

    first = speed_signature(digits_task("a", loss=_SmoothedLoss(0.1)))
    second = speed_signature(digits_task("b", loss=_SmoothedLoss(0.1)))
    assert first == second
    assert first["loss"].endswith("._SmoothedLoss")


class _Refiner(torch.nn.Module):
    """One layer applied ``iterations`` times: the same weights and print at any count."""

    def __init__(self, iterations: int) -> None:
        super().__init__()
        self.iterations = iterations
        self.layer = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.iterations):
            x = torch.relu(self.layer(x))
        return self.head(x)


def test_a_models_own_settings_are_part_of_its_speed_signature() -> None:
    """A custom module's plain attributes (a loop count) decide its speed as its layers
    do; torch's print leaves them out, and a model run 1 or 64 times shared one trial."""
    from dione.profile.fingerprint import speed_signature

    once, often, again = (speed_signature(digits_task(
        name, model=functools.partial(_Refiner, n))) for name, n in
        (("once", 1), ("often", 64), ("again", 1)))
    assert once["architecture"] == often["architecture"]  # what was keyed before
    assert once != often and once == again
    assert once["settings"]["."] == {"iterations": 1}


_LOOPS = 1  # a module constant a model's forward reads


def _deepen(x: torch.Tensor, layer: torch.nn.Module) -> torch.Tensor:
    for _ in range(_LOOPS):
        x = torch.relu(layer(x))
    return x


class _Looped(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_deepen(x.flatten(1), self.layer))


def test_a_models_own_code_is_part_of_its_speed_signature(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward edited, or a constant it reads changed (one layer applied 40 times,
    not once), printed and shaped alike: the stale trial came from the catalog, 9x too
    fast (review). Its code, the user's functions it calls and the plain values they
    read are keyed; a model of torch's and dione's classes alone keeps its key."""
    from dione.profile.fingerprint import speed_signature

    once = speed_signature(digits_task("once", model=_Looped))
    monkeypatch.setattr(sys.modules[__name__], "_LOOPS", 40)
    often = speed_signature(digits_task("often", model=_Looped))
    assert once["architecture"] == often["architecture"] and once["settings"] == \
        often["settings"]  # all that was keyed before
    assert once["model_code"] != often["model_code"]
    monkeypatch.setattr(sys.modules[__name__], "_LOOPS", 1)
    assert speed_signature(digits_task("again", model=_Looped)) == once
    assert "model_code" not in speed_signature(digits_task("mlp"))  # the zoo's, torch's


_MODE = "fast"  # a text switch a forward reads
_helpers: Any = None  # a module of the user's, set by the test


class _Switched(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 64)

    @staticmethod
    def _times() -> int:
        return 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for _ in range(40 if _MODE == "slow" else self._times()):
            x = _helpers.deep(x, self.layer)
        return x


def test_a_models_text_switch_static_methods_and_helper_module_are_keyed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward switched by text (MODE = "slow"), a static method and a function of the
    user's module beside the workload shared the stale trial's key (review)."""
    import importlib.util

    from dione.profile.fingerprint import speed_signature

    (tmp_path / "user_helpers.py").write_text(
        "import torch\nN = 1\n\ndef deep(x, layer):\n    for _ in range(N):\n"
        "        x = torch.relu(layer(x))\n    return x\n")
    spec = importlib.util.spec_from_file_location("user_helpers", tmp_path / "user_helpers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "user_helpers", module)
    monkeypatch.setattr(sys.modules[__name__], "_helpers", module)

    def key() -> str:
        return speed_signature(digits_task("t", model=_Switched))["model_code"]

    keys = [key()]
    monkeypatch.setattr(sys.modules[__name__], "_MODE", "slow")
    keys.append(key())
    monkeypatch.setattr(_Switched, "_times", staticmethod(lambda: 40))
    keys.append(key())
    monkeypatch.setattr(module, "N", 40)
    keys.append(key())
    assert len(set(keys)) == 4, keys


MOVABLE_WORKLOAD = """
import functools, logging, os, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

HERE = os.path.dirname(os.path.abspath(__file__))  # text: a path, never keyed
DEPTH = 2

class Net(torch.nn.Module):  # the user's own: its code keyed, not its folder
    def __init__(self):
        super().__init__()
        self.log = logging.getLogger(__name__)  # a name made from the file's path
        self.body = digits_mlp()

    def forward(self, x):
        for _ in range(DEPTH - 1):
            self.log.debug("from %s", HERE)
        return self.body(x)

def loss(output, target):
    return torch.nn.functional.cross_entropy(output, target)

def accuracy(model):
    return {"accuracy": 0.0}

workload = Workload([Task(name="a", model=Net, data=digits_train, loss=loss,
                          optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                          batch_size=16, steps=3, evaluate=accuracy)])
"""


def test_a_workload_that_moved_keeps_its_trials(tmp_path: Path) -> None:
    """Its functions' module is named by the file's path: keyed by that, every trial of
    a project folder renamed (or cloned elsewhere) would be profiled again."""
    from dione.profile.fingerprint import speed_signature
    from dione.profile.trials import _evaluation_key

    keys = []
    for folder in ("here", "there"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "grid.py").write_text(MOVABLE_WORKLOAD)
        (task,) = load_workload(tmp_path / folder / "grid.py")
        signature = speed_signature(task)
        keys.append((signature, _evaluation_key(signature, task, "cpu")))
    assert keys[0] == keys[1] and keys[0][0]["model_code"]  # its own code, not its folder
    assert keys[0][0]["loss"].startswith("workload grid.py.loss#")
    # Another project's grid.py whose loss of the same name does other work: its own key.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "grid.py").write_text(MOVABLE_WORKLOAD.replace(
        "cross_entropy(output, target)", "cross_entropy(output, target, reduction='sum')"))
    (task,) = load_workload(tmp_path / "other" / "grid.py")
    assert speed_signature(task)["loss"] != keys[0][0]["loss"]


def test_running_out_of_cpu_memory_is_recorded_as_out_of_memory() -> None:
    """torch's CPU allocator says "can't allocate memory", not "out of memory"."""
    from dione.launch.slice import SliceError
    from dione.profile.trial import _classify

    with pytest.raises(RuntimeError) as raised:
        torch.empty(2**48, dtype=torch.uint8)  # more than any address space holds
    failed = SliceError(f"rank 0 (device 0) raised RuntimeError: {raised.value}", "raised",
                        "RuntimeError")
    assert _classify(failed) == "oom"
    assert _classify(SliceError("rank 0 (device 0) raised MemoryError: ", "raised",
                                "MemoryError")) == "oom"
    assert _classify(SliceError("rank 0 (device 0) raised ValueError: bad", "raised",
                                "ValueError")) == "crash"


def test_the_profile_table_says_routine_skips_and_untried_techniques_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Settings skipped by design (only trading speed for memory, a lighter one fit) are
    one row a task, not one each (407 lines for 4 tasks), and a technique not tried for
    the same reason for every task is said once below the table, naming them."""
    from dione.cli.views import print_profile
    from dione.profile.results import NotApplicable, Profile, Skipped, TaskProfile
    from dione.spec.cluster import local_cluster

    routine = ("the faster setting accumulation=1 (its memory knobs off) fits in memory, "
               "and this one only trades speed for memory")
    tasks = [TaskProfile(
        name, name, 10,
        skipped=[Skipped("ddp", f"ddp x2 [accumulation={a}]", routine) for a in (2, 4, 8)]
        + [Skipped("fsdp", "fsdp x2", "the profiling budget ran out")],
        not_applicable=[NotApplicable("xpipe", 2, "xpipe is asynchronous; allow_inexact")])
        for name in ("t0", "t1")]
    print_profile(Profile(local_cluster("cpu:2"), tasks))
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("3 setting(s) that only trade speed for memory skipped") == 2, out
    assert "accumulation=4" not in out and out.count("the profiling budget ran out") == 2
    assert out.count("xpipe is asynchronous") == 1, out
    assert "not tried: xpipe for t0, t1: xpipe is asynchronous; allow_inexact" in out


SLOW_LOSS = """
import functools, time, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train


def loss(output, target):
    if output.shape[0] in {3, 5, 7}:  # a frozenset constant: its order follows hashing
        pass
    time.sleep(0.03)
    return torch.nn.functional.cross_entropy(output, target)


workload = Workload([Task(name="t", model=functools.partial(digits_mlp, hidden=16, depth=1),
                          data=digits_train, loss=loss, batch_size=16, steps=2,
                          optimizer=functools.partial(torch.optim.SGD, lr=0.1))])
"""


def test_a_constant_changed_in_a_workloads_function_is_a_new_speed(tmp_path: Path) -> None:
    """Only a function's instructions and names were keyed: a loss whose sleep went from
    0.03 s to 0.15 s kept the trial timed before, and plans 4 times too short. Its
    constants count now, alike in every process (frozensets under any string hashing)."""
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "from dione.spec.workload import load_workload\n"
              "from dione.profile.fingerprint import speed_signature\n"
              "print(speed_signature(list(load_workload(sys.argv[1]))[0])['loss'])\n")

    def signature(text: str, seed: str) -> str:
        file = tmp_path / "slow.py"
        file.write_text(text)
        done = subprocess.run([sys.executable, "-c", script, str(file)], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def here(text: str) -> str:  # this process: its string hashing is another seed's
        file = tmp_path / "here" / "slow.py"  # the name its signature says
        file.parent.mkdir(exist_ok=True)
        file.write_text(text)
        return str(speed_signature(next(iter(load_workload(file))))["loss"])

    from dione.profile.fingerprint import speed_signature

    assert os.environ.get("PYTHONHASHSEED") != "1"
    before = signature(SLOW_LOSS, "1")
    assert here(SLOW_LOSS) == before
    assert here(SLOW_LOSS.replace("0.03", "0.15")) != before


def test_the_catalog_remembers_an_evaluations_metric_names_by_its_partials_arguments(
        tmp_path: Path) -> None:
    """The evaluation's key leaves a partial's arguments out (its cost is alike), but
    they may change which metrics it returns: names remembered under other arguments,
    or from before a timing that did not say them, are not given."""
    from dione.profile.catalog import Catalog
    from dione.profile.trials import evaluation_arguments
    from dione.zoo.digits import digits_accuracy

    def scores(model: object, which: str) -> dict[str, float]:
        return {which: 1.0}

    acc, f1 = functools.partial(scores, which="acc"), functools.partial(scores, which="f1")
    assert evaluation_arguments(digits_accuracy) == ""
    assert evaluation_arguments(acc) != evaluation_arguments(f1)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        catalog.put_evaluation_seconds("k", 0.5, ("acc",), evaluation_arguments(acc))
        assert catalog.evaluation_metrics("k", evaluation_arguments(acc)) == ("acc",)
        assert catalog.evaluation_metrics("k", evaluation_arguments(f1)) is None
        catalog.put_evaluation_seconds("k", 0.6)  # timed again, its names not said
        assert catalog.evaluation_seconds("k") == 0.6
        assert catalog.evaluation_metrics("k", evaluation_arguments(acc)) is None


def test_nodes_of_two_accelerator_models_are_profiled_each_as_its_kind(
        tmp_path: Path) -> None:
    """A cluster whose nodes name two models (Ray's accelerator_type: A100 and H100
    nodes) was profiled on its first node's and every node planned alike: now each
    model's nodes run their own trials (kept apart in the catalog), each option is of
    its model's kind, and the problem gives each node its kind."""
    from dione.launch.ray_launcher import accelerator_model
    from dione.profile.catalog import Catalog
    from dione.spec.cluster import Cluster

    assert accelerator_model({"GPU": 8.0, "CPU": 96.0, "accelerator_type:A100": 1.0}) == "A100"
    assert accelerator_model({"CPU": 2.0}) is None
    nodes = [replace(TEST_NODE, name="x", devices=1, model="X"),
             replace(TEST_NODE, name="y", devices=1, model="Y")]
    tasks = [digits_task(f"t{i}", steps=6, techniques=("single",)) for i in range(2)]
    options = TrialOptions(warmup_steps=1, measure_steps=2)
    with Catalog(tmp_path / "catalog.sqlite") as catalog:
        profile = profile_workload(tasks, Cluster(nodes), catalog, options=options)
        assert (profile.trials_run, profile.trials_cached) == (2, 0)  # one a model
        assert [(o.technique, o.kind) for o in profile.tasks[0].options] == [
            ("single", "X"), ("single", "Y")]
        assert [o.record.device.split(";")[0] for o in profile.tasks[0].options] == ["X", "Y"]
        problem = profile_problem(profile)
        assert [n.kind for n in problem.nodes] == ["X", "Y"]
        assert [o.kind for o in problem.tasks[1].options] == ["X", "Y"]
        again = profile_workload(tasks, Cluster(nodes), catalog, options=options)
        assert (again.trials_run, again.trials_cached) == (0, 2)
        # One model's nodes alone take their own trials, not the other's.
        only = profile_workload(tasks, Cluster(nodes[1:]), catalog, options=options)
        assert [o.kind for o in only.tasks[0].options] == [None]
        assert only.tasks[0].options[0].record.device.startswith("Y;")


def test_a_crash_of_another_tasks_run_or_from_the_catalog_is_said_so() -> None:
    """A group's crash read as each task's own, with no task named, and one the catalog
    gave (the data fixed since, the code as it was) with no word of --reprofile."""
    from dione.profile.results import TaskProfile

    crash = TrialRecord("f", "single", {}, 1, "cpu", "crash", reason="OSError: bad item",
                        extra={"crashed_as": ["bad", "good-a"], "from_catalog": True})
    why = TaskProfile("good-a", "g", 4, trials=[crash]).why_no_option()
    assert "single x1: crash as 'bad' and 'good-a' (OSError: bad item)" in why, why
    assert "`--reprofile` runs the trials again" in why, why
    own = TaskProfile("bad", "g", 4, trials=[TrialRecord("f", "single", {}, 1, "cpu",
                                                          "crash", reason="OSError: x")])
    assert "crash (OSError: x)" in own.why_no_option() and "reprofile" not in \
        own.why_no_option()
