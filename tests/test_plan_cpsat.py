"""cpsat's promises: never worse than greedy, symmetry breaking loses no optimum, the
deterministic-time search repeats itself, the search around a plan only improves it,
and the lower bounds stay bounds."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dione.plan import (
    Busy,
    NodeSpec,
    Option,
    PlanningProblem,
    TaskOptions,
    check_plan,
    lower_bound,
    solve,
)
from dione.plan import cpsat as cpsat_module
from dione.plan import lns as lns_module
from dione.plan.bounds import energetic_bound, work_within_bound
from dione.plan.budget import Budget, cp_solver
from dione.plan.cpsat import build_model, cpsat, identical_groups
from dione.plan.greedy import greedy, greedy_placements, placements_plan
from dione.plan.lanes import lane_bound, lanes_needed
from dione.plan.lns import LnsStats, improve
from dione.plan.options import Placement


def grid_problem(groups: list[tuple[int, list[tuple[int, float]]]], nodes: list[int]
                 ) -> PlanningProblem:
    """``count`` identical tasks per group (the variants of a grid), on nodes of the
    given sizes."""
    tasks = []
    for g, (count, options) in enumerate(groups):
        for v in range(count):
            tasks.append(TaskOptions(f"g{g}-v{v}", tuple(
                Option("ddp" if d > 1 else "single", d, s) for d, s in options)))
    return PlanningProblem(tuple(NodeSpec(f"n{i}", d) for i, d in enumerate(nodes)),
                           tuple(tasks))


@st.composite
def wide_problems(draw: st.DrawFn) -> PlanningProblem:
    """Few tasks, some wide and long, some repeated, on one to three nodes."""
    nodes = draw(st.lists(st.sampled_from([4, 8]), min_size=1, max_size=3))
    widest = max(nodes)
    groups = []
    for _ in range(draw(st.integers(1, 5))):
        base = draw(st.floats(10.0, 1000.0))
        counts = draw(st.lists(st.sampled_from([c for c in (1, 2, 4, 8) if c <= widest]),
                               min_size=1, max_size=3, unique=True))
        # Sublinear speed-up, as measured trials show: d devices run d^0.8 as fast.
        options = [(c, base / c**0.8) for c in counts]
        groups.append((draw(st.integers(1, 3)), options))
    return grid_problem(groups, nodes)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wide_problems(), st.sampled_from([0.1, 1.0]))
def test_cpsat_is_never_worse_than_greedy_on_one_thread(problem: PlanningProblem,
                                                         limit: float) -> None:
    plan = solve(problem, "cpsat", time_limit=limit, threads=1)
    assert check_plan(plan, problem) == []
    assert plan.makespan <= greedy(problem, limit).makespan + 1e-6
    assert plan.lower_bound <= plan.makespan + 1e-6


PAIRS = grid_problem([(3, [(1, 50.0), (2, 30.0), (4, 18.0)]), (2, [(2, 40.0), (4, 22.0)]),
                      (1, [(4, 35.0)])], [4, 4])


def nothing_better(problem: PlanningProblem, placed: list[Placement], *args: object,
                   **kwargs: object) -> tuple[list[Placement], LnsStats]:
    """A search around the incumbent that finds nothing better."""
    return list(placed), LnsStats()


def test_cpsat_returns_greedys_plan_and_says_so_when_cpsat_finds_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpsat_module, "_solve", lambda *args, **kwargs: (None, "UNKNOWN", 0.0))
    monkeypatch.setattr(cpsat_module, "improve", nothing_better)
    plan = cpsat(PAIRS, time_limit=1, threads=1)
    assert check_plan(plan, PAIRS) == []
    assert plan.makespan == pytest.approx(greedy(PAIRS).makespan)
    assert plan.notes["plan_from"] == "greedy"
    assert plan.notes["whole_model"] == "CP-SAT found no plan (UNKNOWN)"
    assert "nothing shorter than greedy's plan" in str(plan.notes["why"])


def test_cpsat_returns_greedys_plan_when_cpsats_is_longer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def everything_in_a_row(problem: PlanningProblem, *args: object, **kwargs: object
                            ) -> tuple[list[tuple[str, Option, str, float]], str, float]:
        placed, clock = [], 0.0
        for task in problem.tasks:
            option = task.options[0]
            placed.append((task.name, option, problem.nodes[0].name, clock))
            clock += option.seconds
        return placed, "FEASIBLE", 0.0

    monkeypatch.setattr(cpsat_module, "_solve", everything_in_a_row)
    monkeypatch.setattr(cpsat_module, "improve", nothing_better)
    plan = cpsat(PAIRS, time_limit=1, threads=1)
    assert plan.makespan == pytest.approx(greedy(PAIRS).makespan)
    assert plan.notes["plan_from"] == "greedy"


def test_identical_tasks_are_grouped_in_problem_order() -> None:
    assert identical_groups(PAIRS) == [["g0-v0", "g0-v1", "g0-v2"], ["g1-v0", "g1-v1"]]


# Grids where greedy falls short of the optimum, so CP-SAT must search, small enough to
# prove on one thread with or without the symmetry constraints.
SYMMETRIC = [
    grid_problem([(3, [(2, 17.0), (4, 10.0), (8, 6.0)]), (2, [(4, 33.0), (8, 19.0)])], [8]),
    grid_problem([(3, [(2, 17.0)]), (2, [(1, 75.0), (2, 43.0)]),
                  (4, [(1, 30.0), (2, 17.0), (4, 10.0)])], [4, 4]),
    grid_problem([(3, [(2, 34.0), (4, 20.0), (8, 11.0)]), (3, [(1, 100.0), (4, 33.0)])],
                 [8, 4]),
    grid_problem([(2, [(1, 45.0), (8, 9.0)]), (3, [(1, 60.0), (4, 20.0), (8, 11.0)])], [8]),
]
IDS = ["5x8", "9x4+4", "6x8+4", "5x8b"]


@pytest.mark.parametrize("problem", SYMMETRIC, ids=IDS)
def test_symmetry_breaking_keeps_the_optimum(problem: PlanningProblem) -> None:
    broken = cpsat(problem, time_limit=20, threads=1, symmetry=True)
    plain = cpsat(problem, time_limit=20, threads=1, symmetry=False)
    assert broken.notes["cpsat_status"] == plain.notes["cpsat_status"] == "OPTIMAL"
    assert broken.makespan < greedy(problem).makespan  # CP-SAT searched and did better
    assert check_plan(broken, problem) == []
    assert broken.makespan == pytest.approx(plain.makespan, rel=1e-3)


# Whole-node options beside a running task: the whole-node tasks go last, after it.
WITH_RUNNING = PlanningProblem(
    (NodeSpec("n0", 8), NodeSpec("n1", 4)),
    grid_problem([(2, [(2, 30.0), (8, 9.0)]), (3, [(1, 40.0), (4, 12.0)])], [8, 4]).tasks,
    (Busy("running", "n0", (0, 1, 2), 25.0),))


def test_whole_node_tasks_last_keeps_the_optimum_beside_a_running_task() -> None:
    broken = cpsat(WITH_RUNNING, time_limit=20, threads=1, symmetry=True)
    plain = cpsat(WITH_RUNNING, time_limit=20, threads=1, symmetry=False)
    assert broken.notes["cpsat_status"] == plain.notes["cpsat_status"] == "OPTIMAL"
    assert check_plan(broken, WITH_RUNNING) == []
    assert broken.makespan == pytest.approx(plain.makespan, rel=1e-3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wide_problems(), st.booleans())
# Found by fuzzing: tails closed up in ticks moved a whole-node task past its identical
# twin on another node, against the twins' start order.
@example(grid_problem([(3, [(1, 825.33), (4, 272.26)]),
                       (1, [(4, 208.68), (2, 363.33), (8, 119.85)]),
                       (2, [(8, 51.70), (1, 272.90)])], [4, 8, 8]), False)
def test_the_hint_is_a_plan_of_the_model(problem: PlanningProblem, running: bool) -> None:
    # A hint the model's own constraints reject is lost: greedy's plan, re-arranged for
    # the symmetry and whole-node constraints, must satisfy every one of them.
    if running:
        node = problem.nodes[-1]
        problem = PlanningProblem(problem.nodes, problem.tasks,
                                  (Busy("running", node.name, (0,), 50.0),))
    start = greedy_placements(problem, None)
    spase = build_model(problem, start.makespan)
    cpsat_module.add_plan_hint(spase, problem, start.placed, symmetry=True)
    solver = cp_solver(Budget(10, deterministic=False), 10, 1)
    solver.parameters.fix_variables_to_their_hinted_value = True
    status = solver.solve(spase.model)
    assert solver.status_name(status) in ("OPTIMAL", "FEASIBLE")


def test_deterministic_time_gives_the_same_plan_twice() -> None:
    problem = SYMMETRIC[1]
    first = solve(problem, "cpsat", threads=2, deterministic_time=0.5)
    second = solve(problem, "cpsat", threads=2, deterministic_time=0.5)
    assert check_plan(first, problem) == []
    assert first.assignments == second.assignments
    assert first.notes["deterministic_time"] == 0.5


def test_deterministic_time_is_checked() -> None:
    with pytest.raises(ValueError, match="deterministic time applies to the cpsat solver only"):
        solve(PAIRS, "greedy", deterministic_time=1.0)
    with pytest.raises(ValueError, match="deterministic time must be positive"):
        solve(PAIRS, "cpsat", deterministic_time=0.0)


def test_work_within_bound_charges_long_tasks_for_faster_options() -> None:
    # One task: 100 s on one device or 30 s on four. The plain area bound says 25 s;
    # a 25 s plan cannot run it on one device, so it must pay 4 x 30 = 120: 30 s.
    option_sets = [[Option("single", 1, 100.0), Option("ddp", 4, 30.0)]]
    assert work_within_bound(option_sets, capacity=4) == pytest.approx(30.0)
    # Two devices' worth of cheap work beside it fits within 30 s still: 30 s.
    option_sets.append([Option("single", 1, 1.0)])
    assert work_within_bound(option_sets, capacity=4) == pytest.approx(30.25)


@pytest.mark.parametrize("problem", SYMMETRIC, ids=IDS)
def test_the_lower_bound_stays_below_the_proven_optimum(problem: PlanningProblem) -> None:
    plan = cpsat(problem, time_limit=20, threads=1)
    assert plan.status == "optimal"
    assert lower_bound(problem) <= plan.makespan + 1e-6


def test_plan_command_takes_a_deterministic_time(tmp_path: Path) -> None:
    problem_file = tmp_path / "problem.json"
    problem_file.write_text(json.dumps(SYMMETRIC[2].to_json()))
    plans = []
    for run in range(2):
        out = tmp_path / f"plan-{run}.json"
        result = subprocess.run(
            [sys.executable, "-m", "dione.cli", "plan", str(problem_file), "--threads", "2",
             "--deterministic-time", "0.5", "-o", str(out)],
            capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        plans.append(json.loads(out.read_text())["assignments"])
    assert plans[0] == plans[1]


def test_the_energetic_bound_sees_tasks_that_cannot_overlap() -> None:
    # Two tasks on 3 of 4 devices: the area says 15 s, but they cannot run side by side,
    # and both would have to cover the middle of any plan shorter than 20 s.
    problem = grid_problem([(2, [(3, 10.0)])], [4])
    assert lower_bound(problem) == pytest.approx(15.0)
    assert energetic_bound(problem, 15.0, 30.0) == pytest.approx(20.0, rel=1e-4)
    assert cpsat(problem, time_limit=5, threads=1).makespan == pytest.approx(20.0)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wide_problems())
def test_the_energetic_bound_stays_below_every_plan(problem: PlanningProblem) -> None:
    simple = lower_bound(problem)
    plan = cpsat(problem, time_limit=2, threads=1)
    bound = energetic_bound(problem, simple, 2 * plan.makespan)
    assert simple <= bound <= plan.makespan + 1e-6


# Two 12 s and three 6 s tasks on one device each, two devices: the area says 21 s, and
# no window is overloaded, but split over two devices the pieces leave one with 24 s.
# With a running task, its device is one of the pieces.
SHARED_DEVICES = [
    grid_problem([(2, [(1, 12.0)]), (3, [(1, 6.0)])], [2]),
    PlanningProblem((NodeSpec("n0", 2),), grid_problem([(1, [(1, 12.0)]), (3, [(1, 6.0)])],
                                                       [2]).tasks,
                    (Busy("running", "n0", (0,), 12.0),)),
]


@pytest.mark.parametrize("problem", SHARED_DEVICES, ids=["free", "running"])
def test_the_lane_bound_sees_pieces_that_cannot_share_a_device(problem: PlanningProblem
                                                                ) -> None:
    simple = lower_bound(problem)
    assert simple == pytest.approx(21.0)
    assert energetic_bound(problem, simple, 40.0) == pytest.approx(21.0)
    # Lengths are floored to 1/2000 of the makespan in the pricing: 0.2% of slack.
    assert lane_bound(problem, simple, 40.0) == pytest.approx(24.0, rel=2e-3)
    assert lane_bound(problem, simple, 40.0) <= 24.0
    plan = cpsat(problem, time_limit=5, threads=1)
    assert plan.makespan == pytest.approx(24.0)
    assert plan.lower_bound == pytest.approx(24.0, rel=2e-3)


def test_the_lane_bound_counts_each_held_device_once_and_alone() -> None:
    # Devices 0 and 1 held until 6 s, two 12 s tasks on one device each, 3 devices: a
    # device holds one running task, so one 12 s task waits: 18 s.
    held = PlanningProblem((NodeSpec("n0", 3),), grid_problem([(2, [(1, 12.0)])], [3]).tasks,
                           (Busy("running", "n0", (0, 1), 6.0),))
    assert lane_bound(held, lower_bound(held), 40.0) == pytest.approx(18.0, rel=2e-3)
    # Four 10 s tasks, two devices, 15 s: each device holds one piece, 4 are needed.
    four = grid_problem([(4, [(1, 10.0)])], [2])
    assert lanes_needed(four, 15.0) == pytest.approx(4.0)
    assert lanes_needed(four, 9.0) == math.inf  # no option that short


# Nodes of 4, 1 and 1 devices. "wide": a 2-device 8 s task and a 4-device 4 s task both
# fit only the node of 4, so one after the other, 12 s; the area of the tasks that need
# more than one device over that node's 4 devices says 8 s, and lanes all alike 8 s (six
# pieces, six lanes). "held": one device of the node of 2 held until 6 s, a 2-device
# 6 s task waits for it, 12 s; the area of that node says 9 s.
MIXED_NODES = [
    grid_problem([(1, [(2, 8.0)]), (1, [(4, 4.0)])], [4, 1, 1]),
    PlanningProblem((NodeSpec("n0", 2), NodeSpec("n1", 1)),
                    grid_problem([(1, [(2, 6.0)])], [2, 1]).tasks,
                    (Busy("running", "n0", (0,), 6.0),)),
]


@pytest.mark.parametrize("problem", MIXED_NODES, ids=["wide", "held"])
def test_the_lane_bound_keeps_pieces_on_lanes_of_nodes_that_fit_their_task(
        problem: PlanningProblem) -> None:
    assert lower_bound(problem) <= 9.0
    assert lane_bound(problem, lower_bound(problem), 40.0) == pytest.approx(12.0, rel=2e-3)
    assert lane_bound(problem, lower_bound(problem), 40.0) <= 12.0
    plan = cpsat(problem, time_limit=5, threads=1)
    assert plan.makespan == pytest.approx(12.0)
    assert plan.lower_bound == pytest.approx(12.0, rel=2e-3)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wide_problems(), st.booleans())
def test_the_lane_bound_stays_below_every_plan(problem: PlanningProblem, running: bool
                                               ) -> None:
    if running:
        node = problem.nodes[0]
        problem = PlanningProblem(problem.nodes, problem.tasks,
                                  (Busy("running", node.name, (0, 1), 40.0),))
    simple = lower_bound(problem)
    plan = cpsat(problem, time_limit=2, threads=1)
    assert check_plan(plan, problem) == []
    # Searched up to twice the plan: a bound above the plan would be found.
    bound = lane_bound(problem, simple, 2 * plan.makespan)
    assert simple <= bound <= plan.makespan + 1e-6
    assert lane_bound(problem, simple, 2 * plan.makespan) == bound  # no clock in it


@pytest.mark.parametrize("problem", SYMMETRIC, ids=IDS)
def test_the_search_around_a_plan_only_improves_it(problem: PlanningProblem) -> None:
    # From the worst start: every task in a row on the first node, at its first option.
    placed: list[Placement] = []
    clock = 0.0
    for task in problem.tasks:
        option = task.options[0]
        placed.append((task.name, option, problem.nodes[0].name, clock))
        clock += option.seconds
    budget = Budget(0.3, deterministic=True)
    found, stats = improve(problem, placed, budget, threads=1)
    plan = placements_plan("lns", "feasible", problem, found, 0.0)
    assert check_plan(plan, problem) == []
    assert plan.makespan < clock
    assert sum(stats.improvements.values()) >= 1
    # and from greedy's plan it never ends later
    start = greedy_placements(problem, None)
    again, _ = improve(problem, start.placed, Budget(0.2, deterministic=True), threads=1)
    assert placements_plan("lns", "feasible", problem, again, 0.0).makespan <= \
        start.makespan + 1e-6


def test_on_many_nodes_a_round_looks_at_a_few_and_still_improves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 nodes: every round sees SCOPE_NODES of them, the last- and first-ending among
    # them; the plan only improves, and stays valid.
    problem = grid_problem([(20, [(1, 40.0), (2, 22.0), (4, 12.0)]),
                            (20, [(2, 30.0), (4, 16.0)])], [4] * 20)
    assert len(problem.nodes) > lns_module.MANY_NODES
    scopes: list[set[str] | None] = []
    real_round = lns_module._round

    def round_seen(*args: object) -> object:
        scopes.append(args[-1])  # type: ignore[arg-type]
        return real_round(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(lns_module, "_round", round_seen)
    placed: list[Placement] = []
    clock = 0.0
    for task in problem.tasks:  # the worst start: all in a row on n0
        placed.append((task.name, task.options[0], "n0", clock))
        clock += task.options[0].seconds
    found, stats = improve(problem, placed, Budget(0.5, deterministic=True), threads=1)
    plan = placements_plan("lns", "feasible", problem, found, 0.0)
    assert check_plan(plan, problem) == []
    assert plan.makespan < clock and sum(stats.improvements.values()) >= 1
    assert scopes and all(s is not None and len(s) == lns_module.SCOPE_NODES for s in scopes)
    assert all("n0" in s for s in scopes if s is not None)  # where the plan ended last


def test_a_round_keeps_tasks_that_start_together_before_its_window() -> None:
    # a and b end before the window (c) opens, so both are fixed at tick 0: one constant
    # of CP-SAT's, which, hinted twice, made the round's model invalid (no plan found).
    problem = grid_problem([(3, [(1, 10.0)])], [1, 1])
    a, b, c = (t.options[0] for t in problem.tasks)
    placed: list[Placement] = [("g0-v0", a, "n0", 0.0), ("g0-v1", b, "n1", 0.0),
                               ("g0-v2", c, "n0", 10.0)]
    found, proven, _ = lns_module._round(problem, placed, {"g0-v2"},
                                         Budget(1.0, deterministic=True), 1.0, 1)
    assert found is not None and proven
    assert max(start + o.seconds for _, o, _, start in found) == pytest.approx(20.0, rel=0.01)


def test_greedy_counts_its_work_and_builds_fewer_targets_only_where_they_cost_too_much(
        ) -> None:
    from dione.plan import greedy as greedy_module

    small = SYMMETRIC[0]
    assert greedy_module._affordable_targets(small, greedy_module.GREEDY_WORK) == \
        greedy_module.TARGETS
    large = grid_problem([(1000, [(1, 40.0), (8, 6.0)])], [8] * 64)
    targets = greedy_module._affordable_targets(large, greedy_module.GREEDY_WORK)
    assert targets[0] == greedy_module.TARGETS[0] and targets[-1] == math.inf
    assert 1 < len(targets) < len(greedy_module.TARGETS)
    # What a simulation charges a solve: CP-SAT's deterministic time and greedy's work.
    plan = cpsat(small, time_limit=10, threads=1, deterministic_time=0.2)
    assert plan.notes["greedy_units"] > 0
    assert plan.notes["deterministic_spent"] >= plan.notes["greedy_units"]


def test_no_plan_ends_before_a_running_task() -> None:
    problem = PlanningProblem((NodeSpec("n0", 2),),
                              (TaskOptions("short", (Option("single", 1, 5.0),)),),
                              (Busy("running", "n0", (0,), 300.0),))
    assert lower_bound(problem) == 300.0
    plan = cpsat(problem, time_limit=1, threads=1)
    assert plan.status == "optimal" and plan.makespan == 300.0
    assert plan.assignment("short").start == 0.0  # on the free device, at once


def test_a_plan_that_meets_a_bound_found_on_the_way_is_called_optimal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole model finds no plan but proves greedy's makespan a bound: greedy's plan
    # is then optimal, and says why.
    greedy_makespan = greedy(PAIRS).makespan
    monkeypatch.setattr(cpsat_module, "_solve",
                        lambda *args, **kwargs: (None, "UNKNOWN", greedy_makespan))
    monkeypatch.setattr(cpsat_module, "improve", nothing_better)
    plan = cpsat(PAIRS, time_limit=1, threads=1)
    assert check_plan(plan, PAIRS) == []
    assert plan.status == "optimal"
    assert plan.makespan == pytest.approx(greedy_makespan)
    assert plan.notes["plan_from"] == "greedy"
    assert plan.notes["why_optimal"] == "the plan meets the bound"


@pytest.mark.parametrize("gap", [0.001, 0.2])
def test_a_plan_near_its_bound_gets_a_second_whole_model_run_to_prove_it(
        monkeypatch: pytest.MonkeyPatch, gap: float) -> None:
    # The first whole-model run is cut short (its plan kept, its proof dropped, its bound
    # ``gap`` below the plan); near the bound the rest of the time goes to a second run,
    # which proves the plan, while far from it the search around the plan runs instead.
    real_solve = cpsat_module._solve
    calls: list[str] = []

    def cut_short(*args: object, **kwargs: object) -> tuple[list[Placement] | None, str, float]:
        found, status, bound = real_solve(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(status)
        if len(calls) == 1:
            assert found is not None
            end = max(a + o.seconds for _, o, _, a in found)
            return found, "FEASIBLE", end * (1 - gap)
        return found, status, bound

    monkeypatch.setattr(cpsat_module, "_solve", cut_short)
    # The lane bound alone comes within 0.5% of this plan: leave it out, so that the
    # first run's bound is the one that decides.
    monkeypatch.setattr(cpsat_module, "lane_bound", lambda problem, low, high: low)
    problem = SYMMETRIC[0]
    plan = cpsat(problem, time_limit=20, threads=1)
    assert check_plan(plan, problem) == []
    if gap < cpsat_module.PROOF_GAP:
        assert len(calls) == 2 and plan.notes["second_whole_model"] is True
        assert plan.status == "optimal" and plan.notes["cpsat_status"] == "OPTIMAL"
    else:
        assert len(calls) == 1 and "second_whole_model" not in plan.notes
        assert "lns_rounds" in plan.notes


def test_solving_leaves_the_processs_interrupt_handler_alone() -> None:
    """CP-SAT took SIGINT over and left the default handler behind, so that after a
    run's first plan Ctrl-C killed the launcher (and a notebook's kernel) outright."""
    import signal

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not called")

    before = signal.signal(signal.SIGINT, mine)
    try:
        plan = solve(SYMMETRIC[1], "cpsat", threads=2, time_limit=0.5)
        assert plan.assignments and signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)
