"""The offline proof tool benchmarks/planner/lane_ip.py: its INFEASIBLE answers are
proofs (never given where a plan exists), and ``--timed`` sees what packing cannot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dione.plan import NodeSpec, Option, PlanningProblem, TaskOptions, check_plan
from dione.plan.cpsat import cpsat

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "planner" / "lane_ip.py"
_SPEC = importlib.util.spec_from_file_location("lane_ip", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
lane_ip = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lane_ip)


def answer(problem: PlanningProblem, makespan: float, timed: bool) -> str:
    """CP-SAT's answer to "does anything fit ``makespan``?" (INFEASIBLE: nothing)."""
    model = lane_ip.packing_model(problem, makespan, timed)
    return "INFEASIBLE" if model is None else lane_ip.ask(model, 20, threads=1)


def test_timed_sees_wide_tasks_that_packing_lets_share_devices() -> None:
    # Three tasks on 3 of 5 devices: any two share a device, so they run one after
    # another (30 s), yet their 9 pieces of 10 s fit 5 devices of 20 s as bins.
    problem = PlanningProblem((NodeSpec("n0", 5),), tuple(
        TaskOptions(f"t{i}", (Option("ddp", 3, 10.0),)) for i in range(3)))
    assert answer(problem, 20.0, timed=False) == "OPTIMAL"
    assert answer(problem, 29.9, timed=True) == "INFEASIBLE"
    assert answer(problem, 30.0, timed=True) == "OPTIMAL"


@st.composite
def grid_problems(draw: st.DrawFn, groups: int = 3, copies: int = 3) -> PlanningProblem:
    """A few groups of identical tasks (a grid's variants) on one or two nodes of 4."""
    tasks = []
    for g in range(draw(st.integers(1, groups))):
        base = draw(st.floats(10.0, 100.0))
        counts = draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3,
                               unique=True))
        options = tuple(Option("ddp" if c > 1 else "single", c, base / c**0.8)
                        for c in counts)
        tasks += [TaskOptions(f"g{g}-v{v}", options)
                  for v in range(draw(st.integers(1, copies)))]
    nodes = tuple(NodeSpec(f"n{i}", 4) for i in range(draw(st.integers(1, 2))))
    return PlanningProblem(nodes, tuple(tasks))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grid_problems(), st.booleans())
def test_no_plan_is_ever_ruled_out(problem: PlanningProblem, timed: bool) -> None:
    plan = cpsat(problem, time_limit=2, threads=1)
    assert check_plan(plan, problem) == []
    # Never a proof against a plan that exists (UNKNOWN: no answer within the 20 s a
    # busy machine may need; it rules nothing out).
    assert answer(problem, plan.makespan, timed) != "INFEASIBLE"
    if timed:
        # The whole problem but for lengths floored by a millionth: below a proven
        # bound, nothing fits (packing alone, which forgets time, may still fit).
        assert answer(problem, plan.lower_bound * 0.99, timed) in ("INFEASIBLE", "UNKNOWN")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grid_problems(groups=2, copies=2))
def test_the_case_split_rules_out_no_plan(problem: PlanningProblem) -> None:
    # A limit this short leaves cases open and splits them; at most 4 tasks keep the
    # cases few (each split multiplies them by a task's nodes times widths).
    plan = cpsat(problem, time_limit=2, threads=1)
    verdict, _ = lane_ip.split(problem, plan.makespan, 0.01, threads=1)
    assert verdict != "INFEASIBLE"
    verdict, _ = lane_ip.split(problem, plan.lower_bound * 0.99, 0.01, threads=1)
    assert verdict in ("INFEASIBLE", "UNKNOWN")
