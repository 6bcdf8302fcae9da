"""One entry point for every planner: ``solve(problem, solver=...)``."""

from __future__ import annotations

from collections.abc import Callable

from dione.plan.plan import Plan
from dione.plan.problem import PlanningProblem

__all__ = ["SOLVERS", "solve"]


def _cpsat(problem: PlanningProblem, time_limit: float, threads: int | None) -> Plan:
    from dione.plan.cpsat import cpsat

    return cpsat(problem, time_limit, threads)


def _greedy(problem: PlanningProblem, time_limit: float, threads: int | None) -> Plan:
    from dione.plan.greedy import greedy

    return greedy(problem, time_limit)


def _sequential(problem: PlanningProblem, time_limit: float, threads: int | None) -> Plan:
    from dione.plan.greedy import sequential

    return sequential(problem)


def _saturn_milp(problem: PlanningProblem, time_limit: float, threads: int | None) -> Plan:
    from dione.plan.saturn_milp import saturn_milp

    return saturn_milp(problem, time_limit, threads)


SOLVERS: dict[str, Callable[[PlanningProblem, float, int | None], Plan]] = {
    "cpsat": _cpsat,
    "greedy": _greedy,
    "sequential": _sequential,
    "saturn-milp": _saturn_milp,
}


def solve(problem: PlanningProblem, solver: str = "cpsat", time_limit: float = 10.0,
          threads: int | None = None) -> Plan:
    """Plan ``problem`` with ``solver`` within ``time_limit`` seconds on ``threads``."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if time_limit <= 0:
        raise ValueError(f"the time limit must be positive, not {time_limit}")
    return SOLVERS[solver](problem, time_limit, threads)
