"""Stopping rules: ASHA's decisions, a stopped task that never trains again, its devices
planned again at once, and a store that keeps the decisions."""

from __future__ import annotations

import dataclasses
import functools
import os
import sqlite3
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import cloudpickle
import pytest
import torch

from dione.launch import local_placement, run_slice
from dione.launch.slice import SliceError
from dione.orchestrate import RunOptions, run_workload
from dione.orchestrate.options import RunEvent
from dione.orchestrate.plans import read_plans
from dione.orchestrate.runner import Runner
from dione.profile import TrialOptions
from dione.report import write_report
from dione.simulate import Scenario, simulate
from dione.spec.cluster import Cluster
from dione.spec.stopping import (
    Asha,
    Decision,
    Median,
    Patience,
    PausingAsha,
    StoppingRule,
    SuccessiveHalving,
    attribute_key,
    legacy_rule_key,
    rule_key,
    too_few_sharing,
)
from dione.spec.validate import validate_workload
from dione.state.export import ExportError, status_in_run, trained_checkpoint
from dione.state.store import RunStore
from dione.state.summaries import summaries
from helpers import TEST_NODE, digits_task, small_problem

QUICK = TrialOptions(warmup_steps=1, measure_steps=2)
# The simulated sweeps' run: short solves, minute slices, re-planned at each end.
SIMULATED = RunOptions(time_limit=0.5, replan_time_limit=0.1, slice_seconds=60.0,
                       replan_interval=600.0)


class OwnAsha(Asha):
    """A rule of the user's own class with no repr of its own: its default repr holds the
    object's address, another in each process and for each instance."""

    __repr__ = object.__repr__


class _Learning(Asha):
    """ASHA that records the tasks that ended (the ``ended`` hook), in an attribute: its
    fields change as the run goes on, the rule does not."""

    def __init__(self, **fields: object) -> None:
        super().__init__(**fields)  # type: ignore[arg-type]
        object.__setattr__(self, "ends", [])

    def ended(self, task: str, status: str, loss: float | None,
              evaluation: Mapping[str, float]) -> None:
        self.ends.append(task)  # type: ignore[attr-defined]


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # its class, in the workers


def test_asha_decides_as_worked_by_hand() -> None:
    """Rungs at 2, 4, 8 of 16 steps (eta 2); at a rung a task goes on only if its loss is
    at most the median (the 1/eta quantile, interpolated) of those recorded before it."""
    rule = Asha(min_steps=2, eta=2)
    assert rule.rungs(16) == [2, 4, 8] and rule.next_rung(4, 16) == 8
    assert rule.next_rung(8, 16) is None
    recorded: list[float] = []
    table = [(1.0, False), (2.0, True), (0.5, False), (1.6, True), (1.0, False)]
    # Worked: [] first: on; [1] cutoff 1: 2 > 1 stops; [1, 2] cutoff 1.5: 0.5 on;
    # [0.5, 1, 2] cutoff 1: 1.6 stops; [0.5, 1, 1.6, 2] cutoff 1.3: 1.0 on.
    for value, stops in table:
        assert rule.decide(2, value, recorded).stop is stops, (value, recorded)
        recorded.append(value)
    third = Asha(min_steps=1, eta=3, mode="max")  # keep the top third of accuracies
    assert third.rungs(27) == [1, 3, 9]
    # [0.5, 1, 2]: the 2/3 quantile is 1.333...
    assert third.decide(3, 1.3, [2.0, 0.5, 1.0]).stop
    assert not third.decide(3, 1.4, [2.0, 0.5, 1.0]).stop
    assert Asha().decide(1, float("nan"), []).stop  # a loss that is not finite stops


def test_rules_judge_ties_nan_and_fractional_rates_as_ray_does() -> None:
    """A value the cutoff equals in exact arithmetic goes on (0.3 between 0.1 and 0.5
    came out 0.30000000000000004, and the reason read "0.3 is outside ... cutoff 0.3");
    a NaN recorded before (a loser) is left out of a cutoff or a median whatever its
    place (it made the cutoff NaN or order-dependent); rungs are the first step at or
    past each r * eta**k (Ray judges at 1, 3, 7, 16, 40, 98 for eta 2.5; round() gave
    1, 2, 6, 16, 39, 98); 'loss' judged with mode='max' is refused (it stopped the
    best tasks)."""
    nan = float("nan")
    tie = Asha(eta=2, mode="max").decide(1, 0.3, [0.1, 0.5])
    assert not tie.stop and "cutoff 0.3)" in tie.reason
    for recorded in ([nan, 0.5, 0.6], [0.5, 0.6, nan]):
        judged = Asha(eta=2).decide(1, 10.0, recorded)
        assert judged.stop and "of the 2 before it (cutoff 0.55)" in judged.reason
        assert Median(min_tasks=2).decide(1, 10.0, recorded).stop
        assert not Median(min_tasks=3).decide(1, 10.0, recorded).stop  # two count
    assert Asha(min_steps=1, eta=2.5).rungs(100) == [1, 3, 7, 16, 40, 98]
    assert Asha(min_steps=3, eta=1.5).rungs(20) == [3, 5, 7, 11, 16]
    assert Asha(min_steps=2, eta=3).rungs(100) == [2, 6, 18, 54]  # whole rates as before
    for rule in (Asha(mode="max"), Median(mode="max"), Patience(mode="max"),
                 PausingAsha(mode="max"), SuccessiveHalving(mode="max")):
        assert any("mode='max' on metric 'loss'" in m for m in rule.mistakes()), rule
    assert Asha(metric="accuracy", mode="max").mistakes() == []


def test_the_median_rule_decides_as_worked_by_hand() -> None:
    """Judged at 4, 6, 8 (of 10); a task stops when its best value so far is worse than
    the median of those recorded before it at the rung, once three have recorded."""
    rule = Median(min_steps=4, every=2, min_tasks=3)
    assert rule.rungs(10) == [4, 6, 8]
    assert not rule.decide(4, 9.0, [1.0, 2.0]).stop  # two before it: too few to judge
    assert not rule.decide(4, 2.0, [1.0, 2.0, 3.0]).stop  # the median itself goes on
    assert rule.decide(4, 2.5, [1.0, 2.0, 3.0]).stop  # worse than the median 2
    # Its best so far counts: 2.5 now, but 1.5 at an earlier rung (median of 4: 2.5).
    assert not rule.decide(6, 2.6, [1.0, 2.0, 3.0, 4.0], history=[1.5]).stop
    assert rule.decide(6, 2.6, [1.0, 2.0, 3.0, 4.0], history=[2.7]).stop
    accuracy = Median(metric="accuracy", mode="max", min_tasks=1)
    assert accuracy.decide(1, 0.4, [0.5]).stop and not accuracy.decide(1, 0.6, [0.5]).stop
    assert rule.decide(4, float("inf"), []).stop


def test_patience_decides_as_worked_by_hand() -> None:
    """Patience 2, min_delta 0.1: a task stops when the best of its last two rungs does
    not beat its best before them by more than 0.1; a threshold stops at once."""
    rule = Patience(patience=2, min_delta=0.1)
    curve = [3.0, 2.0, 1.95, 1.5, 1.45, 1.42]
    # Worked: [3, 2] too short; [3 | 2, 1.95] 1.95 beats 3: on; [3, 2 | 1.95, 1.5]: on;
    # [3, 2, 1.95 | 1.5, 1.45] 1.45 beats 1.95: on; [.., 1.5 | 1.45, 1.42] 1.42 beats
    # 1.5 by 0.08 only: stopped.
    stops = [rule.decide(k + 1, v, [], history=curve[:k]).stop for k, v in enumerate(curve)]
    assert stops == [False, False, False, False, False, True]
    rising = Patience(metric="accuracy", mode="max", patience=1)
    assert rising.decide(2, 0.5, [], history=[0.6]).stop
    assert not rising.decide(2, 0.7, [], history=[0.6]).stop
    capped = Patience(patience=5, threshold=2.0)
    assert capped.decide(1, 2.5, []).stop and not capped.decide(1, 1.5, []).stop
    assert "threshold" in capped.decide(1, 2.5, []).reason


@pytest.mark.parametrize("rule", [Median(min_steps=10, every=20, min_tasks=2),
                                  Patience(min_steps=10, every=10, patience=2, min_delta=0.2),
                                  # Its key kept as its attributes change: each end changed
                                  # it, and later tasks were judged as the first at their
                                  # rungs (a review).
                                  _Learning(min_steps=10, eta=3)],
                         ids=["median", "patience", "learning"])
def test_a_simulated_sweep_decides_as_its_rule_from_what_the_store_holds(
        tmp_path: Path, rule: StoppingRule) -> None:
    """The runner hands each rule the values recorded before at the rung and the task's
    own earlier rungs: its decisions, replayed from the store in order, are the rule's."""
    run = simulate(small_problem(8), tmp_path / "run", scenario=Scenario(seed=5), steps=90,
                   options=SIMULATED,
                   stopping=rule)
    with RunStore(run.run_dir) as store:
        decisions = store.decisions()
    raw = sqlite3.connect(run.run_dir / "dione.sqlite")
    assert len(raw.execute("SELECT DISTINCT rule FROM decisions").fetchall()) == 1
    raw.close()
    recorded: dict[int, list[float]] = {}
    curves: dict[str, list[float]] = {}
    for task, step, value, stop, _ in decisions:
        assert step in rule.rungs(90)
        assert rule.decide(step, value, recorded.get(step, []), task,
                           curves.get(task, [])).stop is stop, (task, step)
        recorded.setdefault(step, []).append(value)
        curves.setdefault(task, []).append(value)
    stopped = {t for t, *_, stop, _ in decisions if stop}
    assert stopped and stopped == {t for t, s in run.statuses.items() if s == "stopped"}
    assert len(stopped) < 8  # some went to the end


def test_successive_halving_decides_as_worked_by_hand() -> None:
    """Of the n that reached a rung, the best max(1, floor(n / eta)) go on, whatever
    order they arrived in; a value that is not finite stops."""
    rule = SuccessiveHalving(min_steps=2, eta=2)
    assert rule.rungs(16) == [2, 4, 8]
    cohort = {"d": 4.0, "b": 2.0, "e": float("nan"), "a": 1.0, "c": 3.0}
    # Worked: n = 5, keep floor(5 / 2) = 2: a (1.0) and b (2.0); c, d and e stop.
    decided = rule.decide_together(2, cohort)
    assert {t for t, d in decided.items() if not d.stop} == {"a", "b"}
    assert "ranks 3 of the 5" in decided["c"].reason
    assert [d.stop for d in SuccessiveHalving(eta=3).decide_together(
        1, {"x": 1.0, "y": 2.0}).values()] == [False, True]  # keep at least one
    tied = SuccessiveHalving(eta=2, mode="max").decide_together(1, {"q": 0.5, "p": 0.5})
    assert not tied["p"].stop and tied["q"].stop  # a tie goes by name


def test_pausing_asha_promotes_and_stops_as_worked_by_hand() -> None:
    """Li et al.'s rule: a paused task goes on once it ranks among the best floor(n/eta)
    of the n at its rung; it stops once it cannot, counting those still to come."""
    rule = PausingAsha(min_steps=1, eta=3)
    # The first at a rung is not promoted for being first: floor(1/3) = 0 go on.
    assert rule.decide_paused(1, {"a": 1.0}, ["a"], to_come=5) == {}
    # Three there: the best floor(3/3) = 1 goes on; with 5 to come at most
    # floor(8/3) = 2 ever will, so the third (c) stops now and b waits.
    three = rule.decide_paused(1, {"a": 1.0, "b": 2.0, "c": 3.0}, ["a", "b", "c"], 5)
    assert not three["a"].stop and "promoted" in three["a"].reason
    assert three["c"].stop and "it cannot be among the best 2 of" in three["c"].reason
    assert "b" not in three
    # a went on before; d arrives: 4 there, 1 goes on (a, already); with 5 to come at
    # most floor(9/3) = 3 ever will: b (2nd) and d (3rd) wait; with 4, d (3rd) stops.
    values = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 2.5}
    assert rule.decide_paused(1, values, ["b", "d"], 5) == {}
    assert list(rule.decide_paused(1, values, ["b", "d"], 4)) == ["d"]
    # Nobody left to come: the best max(1, floor(4/3)) = 1 (a) went on; b and d stop.
    last = rule.decide_paused(1, values, ["b", "d"], 0)
    assert last["b"].stop and last["d"].stop
    # Alone at the last rung with nobody to come: a finite sweep keeps one.
    assert not rule.decide_paused(9, {"z": 5.0}, ["z"], 0)["z"].stop
    # A value that is not finite stops at once; mode "max" ranks the highest first.
    assert rule.decide_paused(1, {"n": float("nan")}, ["n"], 3)["n"].stop
    high = PausingAsha(eta=2, mode="max").decide_paused(1, {"p": 0.9, "q": 0.1}, ["p", "q"], 0)
    assert not high["p"].stop and high["q"].stop
    assert rule.mistakes() == [] and PausingAsha(eta=1).mistakes()


def test_a_simulated_sweep_with_pausing_asha_promotes_as_the_paper_says(tmp_path: Path) -> None:
    """Every promotion at a rung came when the task ranked among the best floor(n/eta)
    of the n that had reached it (or, the last, max(1, ...) of all); no task trained
    past a rung before its promotion; one task at least trained to its end."""
    rule = PausingAsha(min_steps=10, eta=3)
    events: list[RunEvent] = []
    shown: dict[str, str] = {}  # what `dione status` said of a task as it paused

    def heard(event: RunEvent) -> None:
        events.append(event)
        if event.kind == "rung_waiting" and event.task not in shown:
            with RunStore(tmp_path / "run") as store:
                shown[event.task] = next(t.status for t in summaries(store)
                                         if t.task == event.task)

    run = simulate(small_problem(9), tmp_path / "run", scenario=Scenario(seed=3), steps=90,
                   options=SIMULATED, stopping=rule, on_event=heard)
    assert shown and set(shown.values()) == {"paused"}  # not "pending"
    with RunStore(run.run_dir) as store:
        assert store.paused() == {}  # each wait ended with its decision
        decisions = store.decisions()
        trained = {t.name: max([s.end_step for s in store.slices(t.name)
                                if s.status == "done"] or [0]) for t in store.tasks()}
    for rung in rule.rungs(90):
        at = [(t, v, stop) for t, step, v, stop, _ in decisions if step == rung]
        for k, (task, value, stop) in enumerate(at):
            if stop:
                assert trained[task] == rung  # stopped there, never trained past it
                continue
            # Among those decided so far at this rung, its place within the best share.
            before = sorted(v for _, v, _ in at[: k + 1])
            assert before.index(value) < max(1, len(at) // 3) or len(before) == len(at)
            assert trained[task] > rung
    done = {t for t, s in run.statuses.items() if s == "done"}
    assert done and all(trained[t] == 90 for t in done)
    assert any(e.kind == "rung_waiting" for e in events)
    assert set(run.statuses.values()) <= {"done", "stopped"}


def test_the_expected_horizon_counts_each_stretch_at_its_chance_to_be_trained() -> None:
    """Under ``stopping_horizon="expected"`` a halving rule's task is planned for the
    steps it is expected to train: each stretch after a rung at (1/eta) per rung passed
    before it. Worked by hand for rungs 27, 81, 243 of 729 steps, eta 3."""
    rule = Asha(min_steps=27, eta=3)
    assert rule.rungs(729) == [27, 81, 243]
    # 27 + 54/3 + 162/9 + 486/27 = 27 + 18 + 18 + 18
    assert rule.expected_steps(0, 729) == pytest.approx(81.0)
    # Past the second rung: 162 to the third, then 486/3.
    assert rule.expected_steps(81, 729) == pytest.approx(324.0)
    assert rule.expected_steps(300, 729) == pytest.approx(429.0)  # no rung is left
    assert SuccessiveHalving(min_steps=27, eta=3).expected_steps(0, 729) == \
        pytest.approx(81.0)
    # A rule that says nothing of how many go on is planned at full length.
    assert Median(min_steps=10, every=10).expected_steps(0, 100) == pytest.approx(100.0)
    assert Patience(min_steps=10, every=10).expected_steps(20, 100) == pytest.approx(80.0)


def test_a_malformed_rule_is_named_by_validation() -> None:
    task = digits_task("t", steps=8, stopping=Asha(eta=1.0, metric="accuracy"))
    problems = validate_workload([task])
    said = " ".join(str(p) for p in problems)
    assert "eta must be a number above 1" in said and "evaluate()" in said
    # A rule whose first rung is not before the task's end never judges it: said, not
    # refused (a grid of lengths under one rule lost its short tasks: review).
    assert validate_workload([digits_task("l", steps=8, stopping=Asha(min_steps=8))]) == []
    assert "no rung before the task's last step (8): it trains to its end unjudged" in \
        (Asha(min_steps=8).never_stops(8) or "")
    assert Asha(min_steps=7).never_stops(8) is None
    # Patience that needs more rungs than the task has, with no threshold, stops it only
    # for a value that is not finite: accepted silently, it judged "fewer than 4 rungs to
    # judge by" once. Said (dione validate, a run's stopping_rule_doubtful), not refused:
    # a run may have started with it, and a resume must take it.
    idle = Patience(min_steps=50, every=50, patience=3)
    assert validate_workload([digits_task("p", steps=100, stopping=idle)]) == []
    assert "judges at 1 rung(s) before the task's last step (100), and a want of patience " \
        "shows only from 4: it stops the task only where its value is not finite" in \
        (idle.never_stops(100) or "")
    for fine in (Patience(min_steps=50, every=50, patience=3, threshold=2.0),
                 Patience(min_steps=10, every=10, patience=3)):
        assert fine.never_stops(100) is None


def test_stopped_tasks_never_train_again_and_the_survivors_finish(tmp_path: Path,
                                                                   monkeypatch, capsys) -> None:
    rule = Asha(metric="loss", min_steps=6, eta=2, loss_window=3)
    rates = {"fast": 3e-2, "slow": 1e-6, "mid": 3e-3, "stuck": 1e-7}
    tasks = [replace(digits_task(name, steps=24, stopping=rule),
                     optimizer=functools.partial(torch.optim.Adam, lr=lr),
                     hyperparameters={"lr": lr})
             for name, lr in rates.items()]
    events: list[RunEvent] = []
    asked_owed: list[int] = []  # after which event a re-plan was asked past the budget
    asked = Runner.ask_replan

    def ask(self: Runner, owed: bool = False) -> None:
        if owed:
            asked_owed.append(len(events) - 1)
        asked(self, owed)

    monkeypatch.setattr(Runner, "ask_replan", ask)
    result = run_workload(tasks, Cluster([TEST_NODE]), tmp_path / "run",
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                                     slice_steps=12, time_limit=5.0),
                          on_event=events.append)
    statuses = {t.task: t.status for t in result.tasks}
    assert set(statuses.values()) == {"done", "stopped"}
    with RunStore(tmp_path / "run") as store:
        decisions = store.decisions()
        # Each decision is the rule's, given the values recorded before it at its rung.
        recorded: dict[int, list[float]] = {}
        for _, step, value, stop, _ in decisions:
            assert rule.decide(step, value, recorded.get(step, [])).stop is stop
            recorded.setdefault(step, []).append(value)
        for name, status in statuses.items():
            slices = store.slices(name)
            # Slices end at every rung of the task's way (6, 12: at most slice_steps).
            assert all(s.end_step in (6, 12, 24) for s in slices), name
            if status == "stopped":
                stop = next(d for d in decisions if d[0] == name and d[3])
                assert max(s.end_step for s in slices) == stop[1]  # nothing after it
                assert store.task(name).status == "stopped"
                assert store.latest_checkpoint(name).step == stop[1]  # kept
                # Exported as it is; resuming would not train it, so it is not offered.
                with pytest.raises(ExportError, match="will not train again: take its "
                                   "newest checkpoint") as refused:
                    trained_checkpoint(tmp_path / "run", name)
                assert "resume" not in str(refused.value)
                assert trained_checkpoint(tmp_path / "run", name, latest=True).name == \
                    f"step-{stop[1]:08d}"
                # Its export's dione.json says where it stopped and why.
                said = status_in_run(tmp_path / "run", name)
                assert said["status"] == "stopped" and said["total_steps"] == 24
                assert said["stopped"] == {"step": stop[1], "value": stop[2],
                                           "reason": stop[4]}
                # Nor does a slice by hand: it trained on, and a resume finished it
                # as done, the rule's decision gone from every table (review).
                stopped_task = next(t for t in tasks if t.name == name)
                with pytest.raises(SliceError, match="was stopped by its stopping rule at "
                                   f"step {stop[1]}.*never trains again") as by_hand:
                    run_slice(stopped_task, "single", tmp_path / "run",
                              local_placement(TEST_NODE, [0]), steps=2)
                assert by_hand.value.reason == "refused"
                assert store.task(name).status == "stopped"
    # Each stop asked for a plan at once, past the re-planning budget: its devices go
    # to the others as soon as the solve is done.
    stops = [k for k, e in enumerate(events) if e.kind == "task_stopped"]
    assert stops and all(k in asked_owed for k in stops)
    # Its rung, metric and value as numbers, as the store records the decision.
    with RunStore(tmp_path / "run") as store:
        for k in stops:
            data = events[k].data
            assert data["metric"] and (events[k].task, data["step"], data["value"], True) \
                in {d[:4] for d in store.decisions()}
    with RunStore(tmp_path / "run") as store:  # as `dione run` keeps validation's
        store.set_invalid({"bad": ["lr: must be > 0"]})
    report = write_report(tmp_path / "run")
    summary = (report / "summary.md").read_text()
    assert "## Stopped early" in summary and "stopped by ASHA" in summary
    # Each stopped task's rung, value and reason, once each: in the report (it said the
    # step twice) and in `dione status` (only the report had them: a review).
    from dione.cli import main

    capsys.readouterr()
    assert main(["status", str(tmp_path / "run")]) == 0
    listed = " ".join(capsys.readouterr().out.split())
    for name in (n for n, status in statuses.items() if status == "stopped"):
        assert f"- {name}: " in summary and f"- {name} at step" not in summary, summary
        assert f"{name} (stopped): loss " in listed and "stopped by ASHA" in listed, listed
    # summary.csv: a rule's reason is no error, and a task left out has its row (a
    # script reading the file saw a clean run, and counted losers as errors).
    import csv

    with open(report / "summary.csv") as rows:
        found = {row["task"]: row for row in csv.DictReader(rows)}
    for name, status in statuses.items():
        row = found[name]
        assert row["error"] == "" and ("stopped by ASHA" in row["stop_reason"]) == (
            status == "stopped"), row
        assert float(row["config/lr"]) == rates[name]  # each axis a column, as Ray Tune's
    assert found["bad"]["status"] == "invalid" and found["bad"]["error"] == "lr: must be > 0"
    # Resumed with the rule edited (eta 2 -> 3): refused whole, naming the change (a
    # resume judged its rungs anew from nothing and stopped the sweep's best: a review).
    from dione.orchestrate.options import RunDirError

    edited = [replace(t, stopping=replace(rule, eta=3)) for t in tasks]
    again = RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK)
    refused = (r"the stopping rule changed since the run judged by it \(fast, slow, mid, "
               r"stuck: Asha\(.*eta=2.*\) -> Asha\(.*eta=3.*\)\): .*put the rule back")
    with pytest.raises(RunDirError, match=refused):
        run_workload(edited, Cluster([TEST_NODE]), tmp_path / "run", again)
    # Taken off ("let the survivors finish") it judges nothing anew: not refused (it was:
    # a regression review); the stopped stay stopped; put back edited, still refused
    # (the decisions say under which rule they were made: a review took the rule off
    # once to pass the check).
    off = run_workload([replace(t, stopping=None) for t in tasks], Cluster([TEST_NODE]),
                       tmp_path / "run", again)
    assert {t.task: t.status for t in off.tasks} == statuses
    with pytest.raises(RunDirError, match=refused):
        run_workload(edited, Cluster([TEST_NODE]), tmp_path / "run", again)
    # The same rule of a workload file's own class, the file's text edited (its module's
    # name follows the text) or in another process (an address): no edit.
    assert rule_key("<dione_workload_9aa2f7013ef7.Plain object at 0x7f01>") == \
        rule_key("<dione_workload_6cd12b488e6a.Plain object at 0x7e99>")


def test_a_simulated_sweep_with_asha_stops_the_same_tasks_twice(tmp_path: Path) -> None:
    rule = Asha(min_steps=10, eta=3)
    runs = [simulate(small_problem(9), tmp_path / f"r{k}", scenario=Scenario(seed=3), steps=90,
                     options=SIMULATED,
                     stopping=rule) for k in range(2)]
    assert runs[0].statuses == runs[1].statuses and runs[0].makespan == runs[1].makespan
    assert list(runs[0].statuses.values()).count("stopped") >= 3
    with RunStore(runs[0].run_dir) as store:
        assert [d[:4] for d in store.decisions()] == [
            d[:4] for d in RunStore(runs[1].run_dir).decisions()]


def test_the_expected_horizon_plans_each_task_at_its_expected_length(tmp_path: Path) -> None:
    """The first plan's problem counts a task under ASHA at the steps its rule leaves
    expected (rungs 10 and 30 of 90, eta 3: 10 + 20/3 + 60/9 = 23.3, so 23 steps), or
    those to its next rung (10), where the full horizon counts all 90; every run still
    ends each task done or stopped."""
    rule = Asha(min_steps=10, eta=3)
    runs = {horizon: simulate(
        small_problem(6), tmp_path / horizon, scenario=Scenario(seed=3), steps=90,
        options=replace(SIMULATED, stopping_horizon=horizon),
        stopping=rule) for horizon in ("full", "expected", "rung")}
    first = {h: read_plans(r.run_dir)[0].problem for h, r in runs.items()}
    for horizon, steps in (("expected", 23), ("rung", 10)):
        for full, short in zip(first["full"].tasks, first[horizon].tasks, strict=True):
            for a, b in zip(full.options, short.options, strict=True):
                assert b.seconds == pytest.approx(a.seconds * steps / 90, rel=0.02), horizon
    assert all(s in ("done", "stopped") for r in runs.values() for s in r.statuses.values())


def test_the_default_horizon_plans_a_pausing_rule_to_the_next_rung(tmp_path: Path) -> None:
    """``"auto"`` (the default) plans a task under a rule that pauses at its rungs up to
    its next rung (nothing trains past one before a promotion), and a task under any
    other rule at its full length."""
    assert RunOptions().stopping_horizon == "auto"
    first = {}
    for name, rule in (("pausing", PausingAsha(min_steps=10, eta=3)),
                       ("stopping", Asha(min_steps=10, eta=3)), ("none", None)):
        run = simulate(small_problem(6), tmp_path / name, scenario=Scenario(seed=3),
                       steps=90, options=SIMULATED, stopping=rule)
        first[name] = read_plans(run.run_dir)[0].problem
        # Its makespan is said to cover what it planned: "planned 300 s, ended 2,000 s"
        # read as a miss where the plan reached only the first rungs (review).
        assert read_plans(run.run_dir)[0].horizon == ("rung" if name == "pausing" else "full")
        summary = (run.run_dir / "report" / "summary.md").read_text()
        assert ("planned to each task's next rung, where its stopping rule decides, not to "
                "the sweep's end" in summary) == (name == "pausing"), summary[:600]
    for whole, stopping, pausing in zip(first["none"].tasks, first["stopping"].tasks,
                                        first["pausing"].tasks, strict=True):
        for a, b, c in zip(whole.options, stopping.options, pausing.options, strict=True):
            assert b.seconds == pytest.approx(a.seconds, rel=0.02)
            assert c.seconds == pytest.approx(a.seconds * 10 / 90, rel=0.02)


def test_a_simulated_sweep_with_successive_halving_judges_each_rung_together(
        tmp_path: Path) -> None:
    """Each rung is judged once every task has reached it: its cohort is the tasks that
    went on from the rung before, the best max(1, floor(n / eta)) of them go on, and no
    task trains past a rung before its cohort is judged (ASHA's first arrivals would)."""
    rule = SuccessiveHalving(min_steps=10, eta=2)
    events: list[RunEvent] = []
    run = simulate(small_problem(8), tmp_path / "run", scenario=Scenario(seed=4), steps=90,
                   options=SIMULATED,
                   stopping=rule, on_event=events.append)
    with RunStore(run.run_dir) as store:
        decisions = store.decisions()
    going = {f"t{i}" for i in range(8)}
    for rung in rule.rungs(90):
        at = {t: (value, stop) for t, step, value, stop, _ in decisions if step == rung}
        assert set(at) == going, rung
        kept = {t for t, (_, stop) in at.items() if not stop}
        assert len(kept) == max(1, len(going) // 2)
        assert max(at[t][0] for t in kept) <= min(
            (v for v, stop in at.values() if stop), default=float("inf"))
        going = kept
    assert {t for t, s in run.statuses.items() if s == "done"} == going
    # Judged together: the first decision at a rung comes after every task's slice
    # that ends there has finished.
    for rung in rule.rungs(90):
        first = next(k for k, e in enumerate(events)
                     if e.kind in ("rung_passed", "task_stopped") and f"step {rung} " in e.message)
        waited = [k for k, e in enumerate(events)
                  if e.kind == "rung_waiting" and f"at step {rung};" in e.message]
        assert waited and max(waited) < first


def test_a_store_of_the_version_before_takes_stopped_tasks(tmp_path: Path) -> None:
    """A run directory an older dione wrote (no 'stopped' status) keeps its rows and
    takes the new status."""
    with RunStore(tmp_path) as store:
        store.register_task("t", 10, 4, {"lr": 0.1})
    db = sqlite3.connect(tmp_path / "dione.sqlite")
    sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'tasks'").fetchone()[0]
    db.executescript(
        "PRAGMA foreign_keys=OFF; PRAGMA legacy_alter_table=ON; BEGIN;"
        "ALTER TABLE tasks RENAME TO t_old;"
        + sql.replace(", 'stopped'", "") + ";"
        "INSERT INTO tasks SELECT * FROM t_old; DROP TABLE t_old; COMMIT;"
        "PRAGMA user_version=2;")
    db.close()
    with RunStore(tmp_path) as store:
        store.record_decision("t", "rule", 4, "loss", 2.0, True, "stopped by hand")
        assert store.task("t").status == "stopped"
        assert store.task("t").hyperparameters == {"lr": 0.1}
    raw = sqlite3.connect(tmp_path / "dione.sqlite")
    with pytest.raises(sqlite3.IntegrityError):
        raw.execute("UPDATE tasks SET status = 'nonsense'")
    raw.close()


@pytest.mark.parametrize(("rule", "killed_at"), [
    (Asha(metric="loss", min_steps=6, eta=2, loss_window=3), 1),
    # Killed once the cohort's first decision is written: the rest are judged as the
    # whole cohort was.
    (SuccessiveHalving(metric="loss", min_steps=6, eta=2, loss_window=3), 2),
    # Killed at the first promotion, which comes once two tasks have reached the rung.
    (PausingAsha(metric="loss", min_steps=6, eta=2, loss_window=3), 1),
    # A rule of the user's own class, built anew for the resume (as another process
    # would): the decisions made before are found under it (they were keyed by its
    # address, and a resume judged the rung anew without them).
    (OwnAsha(metric="loss", min_steps=6, eta=2, loss_window=3), 2),
], ids=["asha", "successive-halving", "pausing-asha", "own-class"])
def test_a_rung_a_killed_run_left_undecided_is_judged_before_anything_trains_past_it(
        tmp_path: Path, monkeypatch, rule: StoppingRule, killed_at: int) -> None:
    """The launcher dies after a slice ended at a rung and before the decision was
    recorded (here: the decision's write interrupts it, as a kill would). The resumed run
    judges that rung first, once, from the store's losses, as the rule says."""
    rates = {"fast": 3e-2, "slow": 1e-6, "mid": 3e-3, "stuck": 1e-7}
    tasks = [replace(digits_task(name, steps=24, stopping=rule),
                     optimizer=functools.partial(torch.optim.Adam, lr=lr))
             for name, lr in rates.items()]
    run_dir = tmp_path / "run"
    options = RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                         slice_steps=12, time_limit=5.0)

    record_decision = RunStore.record_decision
    calls: list[int] = []

    def killed(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == killed_at:
            raise KeyboardInterrupt  # the launcher dies between the slice's end and this
        record_decision(*args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patched:
        patched.setattr(RunStore, "record_decision", killed)
        with pytest.raises(KeyboardInterrupt):
            run_workload(tasks, Cluster([TEST_NODE]), run_dir, options)
    with RunStore(run_dir) as store:
        assert len(store.decisions()) == killed_at - 1
        decided_before = {d[0] for d in store.decisions()}
        undecided = {t.name: c.step for t in store.tasks()
                     if (c := store.latest_checkpoint(t.name)) is not None
                     and c.step in rule.rungs(24) and t.name not in decided_before}
        before = {s.id for s in store.slices()}
    assert undecided, "no slice ended at a rung before the interruption"

    if isinstance(rule, OwnAsha):  # each task its own instance, as a grid builds them
        tasks = [replace(t, stopping=OwnAsha(metric="loss", min_steps=6, eta=2,
                                             loss_window=3)) for t in tasks]
        # As the version before recorded them: the raw repr, an address in it (a
        # regression review: such a run could not be resumed).
        raw = sqlite3.connect(run_dir / "dione.sqlite")
        raw.execute("UPDATE decisions SET rule = ?", (repr(rule),))
        raw.commit()
        raw.close()
    events: list[RunEvent] = []
    result = run_workload(tasks, Cluster([TEST_NODE]), run_dir, options,
                          on_event=events.append)
    statuses = {t.task: t.status for t in result.tasks}
    assert set(statuses.values()) <= {"done", "stopped"}
    with RunStore(run_dir) as store:
        decisions = store.decisions()
        assert store.decisions({rule_key(tasks[0].stopping),  # one rule
                                legacy_rule_key(tasks[0].stopping)}) == decisions
        recorded: dict[int, list[float]] = {}
        for name, step, value, stop, _ in decisions:
            if rule.synchronous:  # each rung's cohort judged together
                cohort = {t: v for t, at, v, *_ in decisions if at == step}
                assert rule.decide_together(step, cohort)[name].stop is stop
            elif rule.pausing:  # a promoted task ranks among the best of all there
                there = sorted(v for _, at, v, *_ in decisions if at == step)
                if not stop:
                    assert there.index(value) < max(1, len(there) // 2)
            else:
                assert rule.decide(step, value, recorded.get(step, [])).stop is stop
            recorded.setdefault(step, []).append(value)
            window = [loss for at, loss in store.losses(name) if at <= step][-3:]
            assert value == pytest.approx(sum(window) / len(window))
        for name, step in undecided.items():
            assert [d[1] for d in decisions if d[0] == name].count(step) == 1
            # Judged before its first slice of this session: nothing ran past the rung
            # unjudged.
            judged = next(k for k, e in enumerate(events) if e.task == name
                          and e.kind in ("rung_passed", "task_stopped"))
            started = [k for k, e in enumerate(events)
                       if e.task == name and e.kind == "slice_started"]
            assert all(judged < k for k in started)
        for name, status in statuses.items():
            if status == "stopped":
                stop = next(d for d in decisions if d[0] == name and d[3])
                after = [s for s in store.slices(name)
                         if s.id not in before and s.start_step >= stop[1]]
                assert not after  # never trained after its stop


def test_the_leaderboard_ranks_tasks_stopped_early_after_those_that_ended() -> None:
    """A stopped task's value is from its rung, not comparable with a final one: it was
    ranked among the finished ones, unmarked."""
    from dione.report.files import _markdown
    from dione.state.summaries import TaskSummary, leaderboard

    tasks = [TaskSummary("a", "done", 40, 40, evaluation={"accuracy": 0.8}),
             TaskSummary("b", "stopped", 10, 40, evaluation={"accuracy": 0.9}),
             TaskSummary("c", "done", 40, 40, evaluation={"accuracy": 0.7}),
             TaskSummary("d", "stopped", 10, 40, evaluation={"accuracy": 0.95})]
    assert [t.task for t in leaderboard(tasks, "accuracy")] == ["a", "c", "d", "b"]
    assert [t.task for t in leaderboard(tasks, "loss")] == []
    board = _markdown(tasks, ["accuracy"], [], [], 0.0).split("## Leaderboard")[1]
    assert "| 1 | a | 0.8000 |" in board
    assert "| 3 | d | 0.9500 (stopped at step 10 of 40) |" in board
    # The page shows the report's lists (stopped, failed tasks) as lists, not "- " text.
    from dione.report.page import _markdown_tables

    assert _markdown_tables("## Stopped early\n- b at step 10: <x>\n- d") == \
        "<h2>Stopped early</h2>\n<ul><li>b at step 10: &lt;x&gt;</li><li>d</li></ul>"
    # ... and its `code` and **bold** as such (they showed as backticks and asterisks).
    assert _markdown_tables("use `dione export --latest` on **b**") == \
        "<p>use <code>dione export --latest</code> on <b>b</b></p>"


def test_a_task_that_trained_no_step_is_not_said_to_have_trained_exactly() -> None:
    from dione.report.files import _markdown
    from dione.state.summaries import TaskSummary

    table = _markdown([TaskSummary("never", "failed", 0, 12),
                       TaskSummary("some", "done", 12, 12)], [], [], [], 0.0)
    assert "| never | failed | 0/12 | - | - | 0.0 | - | - |" in table
    assert "| some | done | 12/12 | - | - | 0.0 | - | exact |" in table


def test_a_run_records_each_judged_metric_s_direction_and_questions_a_doubtful_one(
        tmp_path: Path) -> None:
    """The store keeps the direction the rule judges its metric by (the leaderboards
    rank by it), and a rule judging `val_accuracy` with mode="min" is questioned once
    for the tasks that share it, as the run starts."""
    events: list[RunEvent] = []
    simulate(small_problem(3), tmp_path / "run", scenario=Scenario(seed=3), steps=30,
             options=SIMULATED, stopping=Asha(metric="val_accuracy", min_steps=10),
             on_event=events.append)
    doubts = [e for e in events if e.kind == "stopping_rule_doubtful"]
    assert len(doubts) == 1 and "Set mode='max'" in doubts[0].message, doubts
    with RunStore(tmp_path / "run") as store:
        assert store.directions() == {"val_accuracy": "min"}


def test_a_rule_that_compares_tasks_shared_by_too_few_is_questioned(tmp_path: Path) -> None:
    """ASHA alone at a rung lets its task on, and the median rule judges none until
    ``min_tasks`` recorded before: a rule shared by fewer stops nothing while each rung
    cuts a slice (a review's one-task sweep), said by validate and as a run starts."""
    import dione
    from dione.spec.stopping import too_few_to_compare

    assert too_few_to_compare(Asha(min_steps=5), 1) is not None
    assert too_few_to_compare(Asha(min_steps=5), 2) is None
    assert too_few_to_compare(Median(min_steps=5), 3) is not None  # 3 before the judged
    assert too_few_to_compare(Median(min_steps=5, min_tasks=1), 2) is None
    assert too_few_to_compare(Patience(min_steps=5), 1) is None  # judges a task alone
    assert too_few_to_compare(PausingAsha(min_steps=5), 1) is not None
    assert too_few_to_compare(SuccessiveHalving(min_steps=5), 1) is not None
    events: list[RunEvent] = []
    simulate(small_problem(1), tmp_path / "run", steps=30, options=SIMULATED,
             stopping=Asha(min_steps=10), on_event=events.append)
    said = [e.message for e in events if e.kind == "stopping_rule_doubtful"]
    assert len(said) == 1 and said[0].startswith("t0: its stopping rule compares a task "
                                                 "with those before it"), said
    found = dione.validate([digits_task(n, steps=40, stopping=rule) for n, rule in (
        ("a", Median(min_steps=10)), ("b", Median(min_steps=10)),
        ("c", Asha(min_steps=10)), ("d", Asha(min_steps=10)))])
    [(doubt, names)] = [(d, n) for d, n in found.warnings.items() if "compares" in d]
    assert names == ["a", "b"] and "4 or more tasks share it" in doubt


def test_a_rule_of_the_user_s_own_class_is_keyed_by_its_class_and_fields() -> None:
    """Instances alike in every field share a key (one rule: their tasks are compared),
    whatever their addresses; another field value is another rule; a class with a repr
    of its own is keyed by it, less a workload module's name."""
    one, two = OwnAsha(min_steps=6, eta=2), OwnAsha(min_steps=6, eta=2)
    assert repr(one) != repr(two) and rule_key(one) == rule_key(two)
    assert rule_key(OwnAsha(min_steps=6, eta=3)) != rule_key(one)
    assert rule_key(Asha(min_steps=6)) == rule_key(Asha(min_steps=6)) != rule_key(Asha())
    # A run of the version before recorded the repr: found by legacy_rule_key.
    assert legacy_rule_key(Asha(min_steps=6)) == repr(Asha(min_steps=6))
    tasks = [digits_task(f"t{k}", steps=24, stopping=OwnAsha(min_steps=6, eta=2))
             for k in range(3)]
    assert too_few_sharing(tasks) == []  # each was a rule of its own, alone
    assert len(too_few_sharing(tasks[:1])) == 1
    # A knob a subclass adds beside its base's repr, a rule of __slots__, a set's order
    # (a review: each knob value judged together, every instance alike, another key in
    # each process).
    knob = [_Knob(grace=g, min_steps=6) for g in (0.0, 0.5)]
    assert repr(knob[0]) == repr(knob[1]) and rule_key(knob[0]) != rule_key(knob[1])
    assert rule_key(_Slotted(1, {"b", "a"})) != rule_key(_Slotted(2, {"a", "b"}))
    assert rule_key(_Slotted(1, {"b", "a", "c"})).endswith("_Slotted(held={'a', 'b', 'c'}, "
                                                           "window=1.0)")
    # Sets inside other values (a dataclass's, a dict filled from a set): the same key
    # under any hash seed (regression reviews: a nested set's order followed the seed).
    import subprocess

    code = ("from dione.spec.stopping import Asha, rule_key\n"
            "from dataclasses import dataclass\n"
            "@dataclass(frozen=True)\nclass Held:\n    names: frozenset\n"
            "@dataclass(frozen=True)\nclass Tagged(Asha):\n    tags: object = None\n"
            "print(rule_key(Tagged(tags=({'b', 'a', 'c'}, {k: 1 for k in {'x', 'y', 'z'}},"
            " [Held(frozenset({'q', 'r', 's'}))]))))")
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}, check=True,
                           timeout=120).stdout for seed in ("1", "2", "3", "4")}
    assert len(keys) == 1 and "{'a', 'b', 'c'}" in keys.pop()
    # Values whose repr hides a difference: a closure's cell, a tensor cut with "...", an
    # object of no repr; a number written 3 or 3.0 is one value (a regression review).
    assert rule_key(_Knob(grace=_scaled(1), min_steps=6)) != rule_key(
        _Knob(grace=_scaled(-1), min_steps=6))
    big = torch.zeros(2000)
    other = big.clone()
    other[1000] = 1.0
    assert repr(big) == repr(other)
    assert rule_key(_Knob(grace=big, min_steps=6)) != rule_key(_Knob(grace=other, min_steps=6))
    assert rule_key(_Knob(grace=_Plain(1), min_steps=6)) != rule_key(
        _Knob(grace=_Plain(2), min_steps=6))
    assert rule_key(Asha(eta=3)) == rule_key(Asha(eta=3.0))
    # Functions by their code too, bound methods by their object; NumPy's numbers as
    # Python's (a third regression review).
    import numpy

    assert rule_key(_Knob(grace=lambda v: v, min_steps=6)) != rule_key(
        _Knob(grace=lambda v: -v, min_steps=6))
    assert rule_key(_Knob(grace=lambda v: v.mean(), min_steps=6)) != rule_key(
        _Knob(grace=lambda v: v.max(), min_steps=6))  # a name only (a fourth review)
    assert rule_key(_Knob(grace=_Scorer(1).score, min_steps=6)) != rule_key(
        _Knob(grace=_Scorer(-1).score, min_steps=6))
    assert rule_key(_Knob(grace=numpy.int64(3), min_steps=6)) == rule_key(
        _Knob(grace=3, min_steps=6))
    # An edit to the same object between two runs of one process is seen (a key kept per
    # object for the process missed it: a regression review).
    edited = _Plain(1)
    before = rule_key(edited)
    edited.size = 2
    assert rule_key(edited) != before
    # What a rule learns in attributes changes its key: a run fixes it as it first sees
    # it (the simulated sweep above); a rule resumed in the same process leaves it out of
    # its key() (StoppingRule.key), or is taken for an edited one.
    learning = _Learning(min_steps=6)
    first = rule_key(learning)
    learning.ended("t0", "done", 1.0, {})
    assert rule_key(learning) != first
    assert rule_key(_KeyedLearning(min_steps=6)) == rule_key(_KeyedLearning(min_steps=6))
    keyed = _KeyedLearning(min_steps=6)
    keyed.ended("t0", "done", 1.0, {})
    assert rule_key(keyed) == rule_key(_KeyedLearning(min_steps=6))


class _Knob(Asha):
    """ASHA with a knob of its own, its repr Asha's (which leaves the knob out)."""

    def __init__(self, grace: float, **fields: object) -> None:
        super().__init__(**fields)  # type: ignore[arg-type]
        object.__setattr__(self, "grace", grace)


def _scaled(factor: float) -> Callable[[float], float]:
    return lambda value: factor * value


class _Scorer:
    def __init__(self, sign: int) -> None:
        self.sign = sign

    def score(self, value: float) -> float:
        return self.sign * value


class _Plain:
    """A value of no repr of its own."""

    def __init__(self, size: int) -> None:
        self.size = size


class _KeyedLearning(_Learning):
    """``_Learning`` that leaves what it learns out of its key."""

    def key(self) -> str:
        return attribute_key(Asha(**{f.name: getattr(self, f.name)
                                     for f in dataclasses.fields(Asha)}))


class _Slotted:
    """A rule's fields in __slots__ (no __dict__), one a set."""

    __slots__ = ("held", "window")

    def __init__(self, window: int, held: set[str]) -> None:
        self.window, self.held = window, held


@dataclass(frozen=True)
class _AshaRaising(Asha):
    """ASHA that raises judging task ``culprit`` (a user's rule with a bug)."""

    culprit: str = "t3"

    def decide(self, rung: int, value: float, recorded: Sequence[float], task: str = "",
               history: Sequence[float] = ()) -> Decision:
        if task == self.culprit:
            raise ValueError("a bug in the rule")
        return super().decide(rung, value, recorded, task, history)


@dataclass(frozen=True)
class _HalvingRaising(SuccessiveHalving):
    """Successive halving that raises judging its second rung's cohort."""

    def decide_together(self, rung: int, values: Mapping[str, float]) -> dict[str, Decision]:
        if rung > self.min_steps:
            raise ValueError("a bug in the rule")
        return super().decide_together(rung, values)


@dataclass(frozen=True)
class _PausingRaising(PausingAsha):
    """Pausing ASHA that raises deciding its second rung's paused tasks."""

    def decide_paused(self, rung: int, values: Mapping[str, float],
                      waiting: Collection[str], to_come: int) -> dict[str, Decision]:
        if rung > self.min_steps:
            raise ValueError("a bug in the rule")
        return super().decide_paused(rung, values, waiting, to_come)


@pytest.mark.parametrize("rule", [_AshaRaising(min_steps=10, eta=3),
                                  _HalvingRaising(min_steps=10, eta=3),
                                  _PausingRaising(min_steps=10, eta=3)],
                         ids=["decide", "decide_together", "decide_paused"])
def test_a_rule_that_raises_fails_the_tasks_it_judged_and_the_run_goes_on(
        tmp_path: Path, rule: StoppingRule) -> None:
    """A stopping rule of the user's own that raises: the tasks it was judging fail,
    saying the rule raised and how to go on; every other task ends as its rule says (it
    ended the whole run with a traceback, an unrelated task's slice lost: a review)."""
    run = simulate(small_problem(8), tmp_path / "run", scenario=Scenario(seed=5), steps=90,
                   options=SIMULATED, stopping=rule)
    failed = {t for t, s in run.statuses.items() if s == "failed"}
    assert failed and set(run.statuses.values()) <= {"done", "stopped", "failed"}
    assert "done" in run.statuses.values() or "stopped" in run.statuses.values()
    with RunStore(run.run_dir) as store:
        for name in failed:
            error = store.task(name).error or ""
            assert "its stopping rule" in error and "raised judging it at step" in error
            assert "ValueError: a bug in the rule; fix the rule, then `dione resume`" in error
